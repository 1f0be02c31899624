"""put_tensor, get_tensor and their batches against a real master, with real torch tensors
(the README's test command installs torch; PyPI's build runs on a machine without a GPU)."""

from __future__ import annotations

import struct

import pytest
import torch
from mooring.store import ErrorCode

DTYPES = [
    torch.float32,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.float16,
    torch.bfloat16,
]


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randint(-100, 100, shape, generator=generator)
    if dtype == torch.bool:
        return values > 0
    if dtype == torch.uint8:
        return values.abs().to(dtype)
    if dtype.is_floating_point:
        return values.to(dtype) / 3
    return values.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_tensor_comes_back_with_its_dtype_shape_and_values(shared, key, dtype):
    tensor = sample(dtype, (3, 5, 7))
    assert shared.put_tensor(key, tensor) == 0
    got = shared.get_tensor(key)
    assert got.dtype == dtype and got.shape == tensor.shape
    assert torch.equal(got, tensor)
    got[0, 0, 0] = 1  # a tensor of its own, writable
    assert shared.get_tensor(key)[0, 0, 0] == tensor[0, 0, 0]


@pytest.mark.parametrize(
    "tensor",
    [
        torch.tensor(2.5),  # no dimensions
        torch.empty(0, 4),  # no elements
        torch.arange(24, dtype=torch.int64).reshape(2, 3, 4).transpose(0, 2),  # not contiguous
        torch.ones(1, 1, 1, 1, 1, 1, 1, 2),  # eight dimensions
        torch.linspace(0, 1, 5, requires_grad=True),  # part of a graph
    ],
    ids=["scalar", "empty", "transposed", "eight-dims", "requires-grad"],
)
def test_unusual_tensors_come_back_equal(shared, key, tensor):
    assert shared.put_tensor(key, tensor) == 0
    got = shared.get_tensor(key)
    assert got.shape == tensor.shape and got.dtype == tensor.dtype
    assert torch.equal(got, tensor.detach())


def test_the_stored_value_has_mooncakes_tensor_layout(shared, key):
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert shared.put_tensor(key, tensor) == 0
    raw = shared.get(key)
    assert len(raw) == 304 + 24
    magic, version, header_size, dtype, ndim, layout, flags, offset, nbytes = struct.unpack_from(
        "<IHHiiIIQQ", raw
    )
    assert (magic, version, header_size) == (0x4D4F4F4E, 1, 304)
    assert (dtype, ndim, layout, flags, offset, nbytes) == (0, 2, 0, 0, 304, 24)
    global_shape = struct.unpack_from("<8q", raw, 40)
    local_shape = struct.unpack_from("<8q", raw, 104)
    assert global_shape == local_shape == (2, 3, -1, -1, -1, -1, -1, -1)
    assert struct.unpack_from("<II", raw, 168) == (0, 0)  # no parallelism axes
    assert raw[176:304] == bytes(128)
    assert raw[304:] == tensor.numpy().tobytes()


@pytest.mark.parametrize(
    ("dtype", "code"),
    [(torch.float64, 1), (torch.uint8, 3), (torch.int64, 8), (torch.bool, 10)]
    + [(torch.float16, 11), (torch.bfloat16, 12), (torch.float8_e4m3fn, 13)],
    ids=str,
)
def test_dtypes_are_stored_under_mooncakes_codes(shared, key, dtype, code):
    tensor = torch.zeros(4, dtype=dtype)
    assert shared.put_tensor(key, tensor) == 0
    assert struct.unpack_from("<i", shared.get(key), 8) == (code,)
    assert shared.get_tensor(key).dtype == dtype


def test_what_is_not_a_storable_tensor_is_refused(shared, key):
    invalid = int(ErrorCode.INVALID_PARAMS)
    assert shared.put_tensor(key, [1.0, 2.0]) == invalid
    assert shared.put_tensor(key, torch.ones((1,) * 9)) == invalid
    assert shared.put_tensor(key, torch.ones(2, dtype=torch.complex64)) == invalid
    assert shared.is_exist(key) == 0


def test_what_is_not_a_stored_tensor_reads_as_none(shared, key):
    assert shared.get_tensor(key) is None  # missing
    assert shared.put(key + "-bytes", b"not a tensor") == 0
    assert shared.get_tensor(key + "-bytes") is None
    assert shared.put_tensor(key, torch.arange(4, dtype=torch.int32)) == 0
    raw = bytearray(shared.get(key))
    assert shared.put(key + "-short", bytes(raw[:-1])) == 0  # data cut short
    assert shared.get_tensor(key + "-short") is None
    raw[16:20] = struct.pack("<i", 99)  # dimensions
    assert shared.put(key + "-dims", bytes(raw)) == 0
    assert shared.get_tensor(key + "-dims") is None


def test_batches_answer_per_key(shared, key):
    keys = [f"{key}/{i}" for i in range(4)]
    tensors = [sample(torch.float16, (i + 1, 8), seed=i) for i in range(4)]
    assert shared.batch_put_tensor(keys, tensors) == [0, 0, 0, 0]
    assert (
        shared.batch_put_tensor(keys[:2], tensors[:2]) == [int(ErrorCode.OBJECT_ALREADY_EXISTS)] * 2
    )
    got = shared.batch_get_tensor([keys[0], key + "-missing", keys[3]])
    assert torch.equal(got[0], tensors[0]) and got[1] is None and torch.equal(got[2], tensors[3])
    invalid = int(ErrorCode.INVALID_PARAMS)
    assert shared.batch_put_tensor(keys, tensors[:3]) == [invalid] * 4
    assert shared.batch_put_tensor([key + "-x", key + "-y"], [tensors[0], "x"]) == [0, invalid]
    assert shared.batch_put_tensor([], []) == []
    assert shared.batch_get_tensor([]) == []
