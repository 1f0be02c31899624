"""The devices the device-memory tests run on: the software device model everywhere, and a real
GPU where one is present, its memory allocated by torch, CuPy or JAX (the three frameworks whose
device pointers `register_buffer` is documented to take).

Every device offers the same four calls: ``alloc`` (a registered-to-be device address),
``write`` and ``read`` (bytes to and from device memory, through the framework, never through
the store), and ``registrations`` (what a test registered, unregistered after it).
"""

from __future__ import annotations

import os

from mooring import _native
from mooring.store import MooncakeDistributedStore


class ModelGpu:
    """The software device model: host memory the CPU cannot touch, with its own copy engine."""

    name = "model"

    def __init__(self) -> None:
        self.model = _native.DeviceModel()
        self.registrations: list[tuple[MooncakeDistributedStore, int]] = []

    def alloc(self, size: int) -> int:
        return self.model.alloc(size)

    def write(self, addr: int, data: bytes) -> None:
        self.model.write(addr, data)

    def read(self, addr: int, size: int) -> bytes:
        return self.model.read(addr, size)

    def release(self) -> None:
        self.model.set_lost(False)
        self.model.set_delay_ms(0)
        unregister(self)


class CudaGpu:
    """A real GPU. Memory is allocated by ``framework`` (torch, cupy or jax) and written and
    read through a torch view of it (DLPack), so the test checks what that framework's
    allocation holds."""

    def __init__(self, framework: str = "torch") -> None:
        import torch

        self.name = "cuda" if framework == "torch" else framework
        self.framework = framework
        self.torch = torch
        # Each allocation: (start, torch view, the framework's own array kept alive).
        self.allocations: list[tuple[int, object, object]] = []
        self.registrations: list[tuple[MooncakeDistributedStore, int]] = []

    def alloc(self, size: int) -> int:
        torch = self.torch
        if self.framework == "torch":
            owner = torch.zeros(size, dtype=torch.uint8, device="cuda")
            view = owner
        elif self.framework == "cupy":
            import cupy

            owner = cupy.zeros(size, dtype=cupy.uint8)
            view = torch.from_dlpack(owner)
        else:
            import jax.numpy as jnp

            owner = jnp.zeros(size, dtype=jnp.uint8)
            owner.block_until_ready()
            view = torch.from_dlpack(owner)
        self.allocations.append((view.data_ptr(), view, owner))
        return view.data_ptr()

    def _at(self, addr: int, size: int):
        for start, view, _owner in self.allocations:
            if start <= addr and addr + size <= start + view.numel():
                return view[addr - start : addr - start + size]
        raise KeyError(hex(addr))

    def write(self, addr: int, data: bytes) -> None:
        source = self.torch.frombuffer(bytearray(data), dtype=self.torch.uint8)
        self._at(addr, len(data)).copy_(source)
        self.torch.cuda.synchronize()

    def read(self, addr: int, size: int) -> bytes:
        self.torch.cuda.synchronize()
        return bytes(self._at(addr, size).cpu().numpy())

    def release(self) -> None:
        unregister(self)


def unregister(device) -> None:
    """Unregisters what a test registered: frameworks reuse freed device memory for the next
    test's arrays, which must not land inside a region still registered."""
    for store, addr in device.registrations:
        store.unregister_buffer(addr)


def cuda_reason(framework: str = "torch") -> str | None:
    """Why the GPU run of a test cannot run here (None when it can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no GPU here (torch.cuda.is_available() is False)"
    if framework == "cupy":
        try:
            import cupy  # noqa: F401
        except ImportError:
            return "CuPy is not installed"
    if framework == "jax":
        # JAX takes most of the GPU's memory at its first allocation unless told not to.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        try:
            import jax

            if not any(d.platform == "gpu" for d in jax.devices()):
                return "JAX sees no GPU (its CUDA plugin is not installed)"
        except Exception as e:  # noqa: BLE001 - any failure to start JAX means: skip, saying why
            return f"JAX cannot be used: {e}"
    return None


def gpu_for(kind: str, pytest):
    """The device of kind ``kind`` (model, cuda, cupy, jax), or the test skipped with the reason
    printed."""
    if kind == "model":
        return ModelGpu()
    reason = cuda_reason("torch" if kind == "cuda" else kind)
    if reason is not None:
        print(f"SKIPPED: the {kind} run of this test: {reason}")
        pytest.skip(f"the {kind} run: {reason}")
    return CudaGpu("torch" if kind == "cuda" else kind)


def registered(store: MooncakeDistributedStore, gpu, size: int) -> int:
    """``size`` bytes of ``gpu``'s memory, registered with ``store``."""
    addr = gpu.alloc(size)
    assert store.register_buffer(addr, size) == 0
    gpu.registrations.append((store, addr))
    return addr
