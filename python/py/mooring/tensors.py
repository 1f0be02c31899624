"""Torch tensors as values, in Mooncake's tensor object format.

``put_tensor`` stores a tensor as a 304-byte header and then its bytes, laid out as Mooncake's
``TensorMetadata`` (little-endian), so a program reads back what it wrote through either
store's ``get_tensor``:

- header, 40 bytes: magic ``u32`` (``0x4d4f4f4e``), version ``u16`` (1), header size ``u16``
  (304), dtype code ``i32``, dimensions ``i32`` (at most 8), layout ``u32`` (0: the whole
  tensor, 1: a shard of one), flags ``u32``, data offset ``u64``, data bytes ``u64``;
- layout, 264 bytes: the global and the local shape (eight ``i64`` each, unused dimensions
  -1), an axis count ``u32`` and a reserved ``u32``, and four 32-byte axis records (a shard's
  parallelism axes; zeros for a whole tensor).

A tensor-parallel shard (``put_tensor_with_tp``) is one of equal slices along a split
dimension: its header keeps the whole tensor's shape as the global shape, the slice's as the
local one, and one axis record (kind 1, tensor parallel; the shard's rank, the shard count,
the split dimension, and the slice's extent along it in the last field).

Torch is imported only where a tensor is made: storing one needs torch already imported by
the caller, who holds the tensor.
"""

from __future__ import annotations

import ctypes
import struct
import sys
import warnings
from typing import Any

_MAGIC = 0x4D4F4F4E
_VERSION = 1
_MAX_DIMS = 8
_MAX_AXES = 4
_HEAD = struct.Struct("<IHHiiIIQQ")
_SHAPE = struct.Struct(f"<{_MAX_DIMS}q")
_AXIS_COUNT = struct.Struct("<II")
# kind, axis index, shard rank, shard count, split dimension, two reserved fields.
_AXIS = struct.Struct("<6iq")
HEADER_SIZE = _HEAD.size + 2 * _SHAPE.size + _AXIS_COUNT.size + _MAX_AXES * _AXIS.size
_LAYOUTS = (0, 1)
# Mooncake's axis kinds: data, tensor, expert and pipeline parallel, reserved.
_AXIS_KINDS = range(5)
_TP_AXIS = 1

# Mooncake's dtype codes: each one's torch name and element size.
_DTYPES = (
    ("float32", 4),
    ("float64", 8),
    ("int8", 1),
    ("uint8", 1),
    ("int16", 2),
    ("uint16", 2),
    ("int32", 4),
    ("uint32", 4),
    ("int64", 8),
    ("uint64", 8),
    ("bool", 1),
    ("float16", 2),
    ("bfloat16", 2),
    ("float8_e4m3fn", 1),
    ("float8_e5m2", 1),
)


def encode(tensor: Any) -> tuple[bytes, Any, Any]:
    """The header and a view of the bytes of ``tensor`` (a host copy if it lives on a device,
    a contiguous copy if it is not contiguous), and what keeps that view's memory alive.

    Raises ``ValueError`` saying what is wrong if ``tensor`` cannot be stored."""
    code, host = _host(tensor)
    return _encoded(code, host, list(host.shape), None)


def encode_shards(tensor: Any, count: int, split_dim: int) -> list[tuple[bytes, Any, Any]]:
    """``tensor`` cut into ``count`` equal shards along dimension ``split_dim``, each encoded
    as ``encode`` does but with Mooncake's shard header: the whole tensor's shape beside the
    shard's, and one tensor-parallel axis (the shard's rank, ``count``, ``split_dim``).

    Raises ``ValueError`` if the tensor cannot be stored or does not split evenly."""
    code, host = _host(tensor)
    shape = list(host.shape)
    if not 0 <= split_dim < len(shape):
        raise ValueError(f"split_dim {split_dim} is not a dimension of a {shape} tensor")
    if count <= 0 or shape[split_dim] % count:
        raise ValueError(
            f"dimension {split_dim} of a {shape} tensor does not split into {count} equal "
            "shards (Mooncake's tensor-parallel layout has only equal ones)"
        )
    extent = shape[split_dim] // count
    return [
        _encoded(
            code,
            host.narrow(split_dim, rank * extent, extent).contiguous(),
            shape,
            (rank, count, split_dim),
        )
        for rank in range(count)
    ]


def _host(tensor: Any) -> tuple[int, Any]:
    """The dtype code of ``tensor`` and its contiguous copy in host memory (itself if it is
    one already)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(tensor, torch.Tensor):
        raise ValueError(f"a {type(tensor).__name__} is not a torch.Tensor")
    codes = {getattr(torch, name, None): code for code, (name, _) in enumerate(_DTYPES)}
    code = codes.get(tensor.dtype)
    if code is None:
        supported = ", ".join(name for name, _ in _DTYPES)
        raise ValueError(f"tensors of {tensor.dtype} cannot be stored (supported: {supported})")
    if tensor.dim() > _MAX_DIMS:
        raise ValueError(f"a tensor of {tensor.dim()} dimensions: at most {_MAX_DIMS} are stored")
    if tensor.layout != torch.strided or tensor.is_meta:
        raise ValueError(f"a {tensor.layout} tensor on {tensor.device} has no bytes to store")
    try:
        return code, tensor.detach().to("cpu").contiguous()
    except (RuntimeError, NotImplementedError, TypeError) as e:
        raise ValueError(f"torch cannot copy the tensor to host memory: {e}") from None


def _encoded(
    code: int, host: Any, global_shape: list[int], tp_axis: tuple[int, int, int] | None
) -> tuple[bytes, Any, Any]:
    """The header of ``host`` (a whole tensor, or with ``tp_axis`` = (rank, count, split
    dimension) a shard of one shaped ``global_shape``), a view of its bytes, and ``host``."""
    shape = list(host.shape)
    nbytes = host.numel() * host.element_size()

    def padded(dims: list[int]) -> list[int]:
        return dims + [-1] * (_MAX_DIMS - len(dims))

    if tp_axis is None:
        layout, axes = 0, b""
    else:
        rank, count, split_dim = tp_axis
        # Mooncake keeps the shard's extent along the split in the axis's last field.
        layout, axes = 1, _AXIS.pack(_TP_AXIS, 0, rank, count, split_dim, 0, shape[split_dim])
    header = (
        _HEAD.pack(_MAGIC, _VERSION, HEADER_SIZE, code, len(shape), layout, 0, HEADER_SIZE, nbytes)
        + _SHAPE.pack(*padded(global_shape))
        + _SHAPE.pack(*padded(shape))
        + _AXIS_COUNT.pack(len(axes) // _AXIS.size, 0)
        + axes.ljust(_MAX_AXES * _AXIS.size, b"\0")
    )
    # The tensor's memory as bytes, without a copy (`host` must outlive them).
    data = memoryview((ctypes.c_uint8 * nbytes).from_address(host.data_ptr())).cast("B")
    return header, data, host


def decode(buffer: Any) -> Any:
    """The tensor stored in ``buffer`` (a new tensor in host memory).

    Raises ``ValueError`` saying what is wrong if the bytes are not a stored tensor."""
    view = memoryview(buffer).cast("B")
    dtype_code, shape, offset, nbytes = _parse(view)
    torch, dtype = _torch_dtype(dtype_code)
    out = torch.empty(shape, dtype=dtype)
    if nbytes:
        with warnings.catch_warnings():
            # The source is read-only; it is only copied from.
            warnings.simplefilter("ignore", UserWarning)
            src = torch.frombuffer(view, dtype=torch.uint8, count=nbytes, offset=offset)
        out.view(-1).view(torch.uint8).copy_(src)
    return out


def view_at(address: int, length: int, header: bytes, device: tuple[str, int] | None) -> Any:
    """The tensor stored in the ``length`` bytes at ``address`` (registered memory whose
    first bytes are ``header``; on ``device``, a name and CUDA ordinal, or in host memory for
    ``None``), as a view of that memory: no copy, valid while the memory is.

    Raises ``ValueError`` saying what is wrong if the bytes are not a stored tensor, or are
    in memory no tensor can view (the software device model's)."""
    dtype_code, shape, offset, nbytes = _parse(memoryview(header).cast("B"), length)
    torch, dtype = _torch_dtype(dtype_code)
    if device is None:
        if not nbytes:
            return torch.empty(shape, dtype=dtype)
        memory = memoryview((ctypes.c_uint8 * length).from_address(address)).cast("B")
        flat = torch.frombuffer(memory, dtype=torch.uint8, count=nbytes, offset=offset)
        return flat.view(dtype).view(shape)
    name, ordinal = device
    if ordinal < 0:
        raise ValueError(f"memory of the {name} cannot be viewed as a tensor")
    where = f"cuda:{ordinal}"
    if not nbytes:
        return torch.empty(shape, dtype=dtype, device=where)
    flat = torch.as_tensor(_DeviceBytes(address + offset, nbytes), device=where)
    return flat.view(dtype).view(shape)


class _DeviceBytes:
    """``nbytes`` bytes of CUDA memory at ``address``, described by CUDA's array interface so
    that torch views them without a copy."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
        }


def check_header(header: bytes, length: int) -> None:
    """Checks, as Mooncake does before storing them, that a registered value of ``length``
    bytes starting with ``header`` holds a tensor header and the bytes it describes. Raises
    ``ValueError`` saying what is wrong."""
    _parse(memoryview(header).cast("B"), length)


def _torch_dtype(dtype_code: int) -> tuple[Any, Any]:
    """Torch, and its dtype for a stored dtype code."""
    try:
        import torch
    except ImportError:
        raise ValueError("torch is not installed: pip install torch") from None
    dtype = getattr(torch, _DTYPES[dtype_code][0], None)
    if dtype is None:
        raise ValueError(f"this torch ({torch.__version__}) has no {_DTYPES[dtype_code][0]}")
    return torch, dtype


def _parse(view: memoryview, total: int | None = None) -> tuple[int, list[int], int, int]:
    """Checks a stored tensor's header as Mooncake does, for a value of ``total`` bytes (all
    of ``view``, or the value whose header ``view`` is); its dtype code, (local) shape, and
    where its bytes are."""
    total = len(view) if total is None else total
    if total < HEADER_SIZE:
        raise ValueError(
            f"{total} bytes are fewer than a tensor's {HEADER_SIZE}-byte header: "
            "the value was not stored with put_tensor"
        )
    magic, version, header_size, dtype, ndim, layout, _, offset, nbytes = _HEAD.unpack_from(view)
    if (magic, version, header_size) != (_MAGIC, _VERSION, HEADER_SIZE):
        raise ValueError("the value does not start with a tensor header (stored with put?)")
    if not 0 <= dtype < len(_DTYPES):
        raise ValueError(f"unknown dtype code {dtype}")
    if not 0 <= ndim <= _MAX_DIMS or layout not in _LAYOUTS:
        raise ValueError(f"a header with {ndim} dimensions and layout {layout}")
    global_shape = _SHAPE.unpack_from(view, _HEAD.size)
    local_shape = _SHAPE.unpack_from(view, _HEAD.size + _SHAPE.size)
    for dims in (global_shape, local_shape):
        if any(d < 0 for d in dims[:ndim]) or any(d != -1 for d in dims[ndim:]):
            raise ValueError(f"a header with the shape {list(dims)} for {ndim} dimensions")
    axis_count, _ = _AXIS_COUNT.unpack_from(view, _HEAD.size + 2 * _SHAPE.size)
    if axis_count > _MAX_AXES:
        raise ValueError(f"a header with {axis_count} layout axes (at most {_MAX_AXES})")
    first_axis = _HEAD.size + 2 * _SHAPE.size + _AXIS_COUNT.size
    for i in range(axis_count):
        kind, _, rank, count, split, _, _ = _AXIS.unpack_from(view, first_axis + i * _AXIS.size)
        if kind not in _AXIS_KINDS or not 0 <= rank < count or not -1 <= split < ndim:
            raise ValueError(f"layout axis {i} is malformed")
    if not HEADER_SIZE <= offset <= total or nbytes != total - offset:
        raise ValueError(f"{nbytes} bytes at {offset} do not fill the {total}-byte value")
    shape = list(local_shape[:ndim])
    expected = _DTYPES[dtype][1]
    for d in shape:
        expected *= d
    if nbytes != expected:
        raise ValueError(f"{nbytes} bytes of data for a {shape} tensor of {_DTYPES[dtype][0]}")
    return dtype, shape, offset, nbytes
