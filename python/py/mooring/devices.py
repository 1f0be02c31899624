"""Whether an address is GPU memory, which Mooring's client cannot register: it copies and
checksums registered bytes with the CPU, and a GPU address would fault the process.

CUDA is asked only when this process already uses it through torch (its CUDA runtime loaded
and initialized), so a process without a GPU, or one that never touched it, pays nothing and
starts no CUDA context.
"""

from __future__ import annotations

import ctypes
import os
import sys

# The CUDA runtime's names, newest first (torch's wheels load one of them).
_RUNTIMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")
# cudaMemoryTypeDevice in cudaPointerAttributes.type.
_DEVICE = 2


class _PointerAttributes(ctypes.Structure):
    """CUDA's cudaPointerAttributes (CUDA 11 and later)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("device", ctypes.c_int),
        ("device_pointer", ctypes.c_void_p),
        ("host_pointer", ctypes.c_void_p),
    ]


def _loaded_runtime() -> ctypes.CDLL | None:
    """The CUDA runtime this process has loaded, without loading one."""
    for name in _RUNTIMES:
        try:
            return ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
    return None


def is_device_memory(address: int) -> bool:
    """True if CUDA, in use in this process, says ``address`` is device memory."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return False
    runtime = _loaded_runtime()
    if runtime is None:
        return False
    attributes = _PointerAttributes()
    error = runtime.cudaPointerGetAttributes(ctypes.byref(attributes), ctypes.c_void_p(address))
    if error != 0:
        # Not an address CUDA knows; clear the error it left for the next CUDA call.
        runtime.cudaGetLastError()
        return False
    return attributes.type == _DEVICE
