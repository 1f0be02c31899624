"""The tensor calls (put_tensor, get_tensor, their batches, upsert and pub variants, the
registered-memory and tensor-parallel calls) against a real master, with real torch tensors
(the README's test command installs torch; PyPI's build runs on a machine without a GPU)."""

from __future__ import annotations

import struct

import pytest
import torch
from mooring.store import ErrorCode, ReplicateConfig

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
    assert shared.batch_put_tensor(keys[:2], tensors[2:]) == [0, 0]  # stored ones are kept
    got = shared.batch_get_tensor([keys[0], key + "-missing", keys[3]])
    assert torch.equal(got[0], tensors[0]) and got[1] is None and torch.equal(got[2], tensors[3])
    invalid = int(ErrorCode.INVALID_PARAMS)
    assert shared.batch_put_tensor(keys, tensors[:3]) == [invalid] * 4
    assert shared.batch_put_tensor([key + "-x", key + "-y"], [tensors[0], "x"]) == [0, invalid]
    assert shared.batch_put_tensor([], []) == []
    assert shared.batch_get_tensor([]) == []


def test_upsert_and_pub_calls_replace_and_take_a_config(shared, key):
    invalid = int(ErrorCode.INVALID_PARAMS)
    first, second = sample(torch.float32, (4, 4), seed=1), sample(torch.float32, (2, 3), seed=2)
    assert shared.put_tensor(key, first) == 0
    assert shared.put_tensor(key, second) == 0  # Mooncake's convention: the first is kept
    assert torch.equal(shared.get_tensor(key), first)
    assert shared.upsert_tensor(key, second) == 0
    assert torch.equal(shared.get_tensor(key), second)

    config = ReplicateConfig()
    config.with_hard_pin = True
    assert shared.pub_tensor(key + "-pub", first, config) == 0
    assert torch.equal(shared.get_tensor(key + "-pub"), first)
    assert shared.upsert_pub_tensor(key + "-pub", second, config) == 0
    assert torch.equal(shared.get_tensor(key + "-pub"), second)
    refused = ReplicateConfig()
    refused.soft_pin_ttl_ms = 1000  # a TTL without ENABLE: the config reaches the master
    assert shared.pub_tensor(key + "-ttl", first, refused) == invalid
    assert shared.is_exist(key + "-ttl") == 0

    keys = [f"{key}/{i}" for i in range(3)]
    values = [sample(torch.int16, (i + 2,), seed=i) for i in range(3)]
    assert shared.batch_pub_tensor(keys[:2], values[:2], config) == [0, 0]
    assert shared.batch_upsert_tensor(keys, values[::-1]) == [0, 0, 0]
    assert shared.batch_upsert_pub_tensor(keys, values, config) == [0, 0, 0]
    assert all(torch.equal(g, v) for g, v in zip(shared.batch_get_tensor(keys), values))
    assert shared.batch_upsert_tensor(keys, values[:2]) == [invalid] * 3


@pytest.fixture
def pool(shared):
    """A registered 1 MiB buffer of the shared store (unregistered afterwards)."""
    memory = torch.zeros(1 << 20, dtype=torch.uint8)
    assert shared.register_buffer(memory.data_ptr(), memory.numel()) == 0
    yield memory
    assert shared.unregister_buffer(memory.data_ptr()) == 0


def test_get_tensor_into_answers_a_view_of_the_registered_memory(shared, key, pool):
    tensor = sample(torch.bfloat16, (8, 16))
    assert shared.put_tensor(key, tensor) == 0
    base = pool.data_ptr()
    got = shared.get_tensor_into(key, base + 4096, 8192)
    assert got.dtype == torch.bfloat16 and torch.equal(got, tensor)
    assert got.data_ptr() == base + 4096 + 304  # no copy: the data sits after the header
    pool[4096 + 304 : 4096 + 306] = 0  # the buffer changes, and the tensor with it
    assert got[0, 0] == 0

    assert shared.get_tensor_into(key, base, 304 + 255) is None  # too small: -10
    assert shared.get_tensor_into(key + "-missing", base, 8192) is None
    outside = torch.zeros(8192, dtype=torch.uint8)
    assert shared.get_tensor_into(key, outside.data_ptr(), 8192) is None  # not registered
    assert shared.put(key + "-bytes", b"x" * 400) == 0
    assert shared.get_tensor_into(key + "-bytes", base, 8192) is None  # not a tensor

    keys = [key, key + "-missing", key]
    got = shared.batch_get_tensor_into(keys, [base, base + 8192, base + 16384], [8192] * 3)
    assert torch.equal(got[0], tensor) and got[1] is None and torch.equal(got[2], tensor)
    assert got[0].data_ptr() == base + 304 and got[2].data_ptr() == base + 16384 + 304
    assert shared.batch_get_tensor_into(keys, [base], [8192]) == [int(ErrorCode.INVALID_PARAMS)] * 3
    assert shared.batch_get_tensor_into([], [], []) == []


def test_put_tensor_from_stores_a_header_and_data_from_registered_memory(shared, key, pool):
    invalid = int(ErrorCode.INVALID_PARAMS)
    tensor = sample(torch.int32, (5, 7))
    assert shared.put_tensor(key, tensor) == 0
    base = pool.data_ptr()
    length = 304 + tensor.numel() * 4
    assert shared.get_into(key, base, 8192) == length
    assert shared.put_tensor_from(key + "-copy", base, length) == 0
    assert torch.equal(shared.get_tensor(key + "-copy"), tensor)
    assert shared.put_tensor_from(key + "-copy", base, length) == 0  # already stored: kept
    # The header is checked before anything is stored: its length must describe the bytes.
    assert shared.put_tensor_from(key + "-long", base, length + 4) == invalid
    assert shared.put_tensor_from(key + "-short", base, 100) == invalid
    assert shared.is_exist(key + "-long") == 0 and shared.is_exist(key + "-short") == 0
    outside = torch.zeros(8192, dtype=torch.uint8)
    assert shared.put_tensor_from(key + "-outside", outside.data_ptr(), length) == invalid

    other = sample(torch.int32, (5, 7), seed=9)
    assert shared.put_tensor(key + "-other", other) == 0
    assert shared.get_into(key + "-other", base + 8192, 8192) == length
    assert shared.upsert_tensor_from(key + "-copy", base + 8192, length) == 0
    assert torch.equal(shared.get_tensor(key + "-copy"), other)

    pool[16384 : 16384 + length] = 7  # not a tensor header
    keys = [f"{key}/{i}" for i in range(3)]
    ptrs, sizes = [base, base + 16384, base + 8192], [length] * 3
    assert shared.batch_put_tensor_from(keys, ptrs, sizes) == [0, invalid, 0]
    assert shared.is_exist(keys[1]) == 0
    assert torch.equal(shared.get_tensor(keys[2]), other)
    assert shared.batch_upsert_tensor_from(keys, ptrs, sizes) == [0, invalid, 0]
    assert shared.batch_put_tensor_from(keys, ptrs[:2], sizes) == [invalid] * 3
    assert shared.batch_put_tensor_from([], [], []) == []


def test_tensor_parallel_shards_are_stored_per_rank_in_mooncakes_layout(shared, key):
    tensor = sample(torch.float32, (4, 6))
    assert shared.put_tensor_with_tp(key, tensor, tp_rank=1, tp_size=2, split_dim=1) == 0
    assert shared.is_exist(key) == 0  # only the shards are stored
    for rank, part in enumerate(tensor.chunk(2, dim=1)):
        got = shared.get_tensor_with_tp(key, tp_rank=rank, tp_size=2, split_dim=1)
        assert torch.equal(got, part)
        assert torch.equal(shared.get_tensor(f"{key}_tp_{rank}"), part)

    raw = shared.get(f"{key}_tp_1")
    assert struct.unpack_from("<iiIIQQ", raw, 8) == (0, 2, 1, 0, 304, 4 * 3 * 4)
    assert struct.unpack_from("<8q", raw, 40)[:3] == (4, 6, -1)  # the whole tensor's shape
    assert struct.unpack_from("<8q", raw, 104)[:3] == (4, 3, -1)  # the shard's
    assert struct.unpack_from("<II", raw, 168) == (1, 0)
    # Tensor parallel, axis 0, rank 1 of 2, split along dimension 1, 3 wide there.
    assert struct.unpack_from("<6iq", raw, 176) == (1, 0, 1, 2, 1, 0, 3)
    assert raw[208:304] == bytes(96)
    assert raw[304:] == tensor[:, 3:].contiguous().numpy().tobytes()

    invalid = int(ErrorCode.INVALID_PARAMS)
    assert shared.put_tensor_with_tp(key + "-uneven", tensor, tp_size=4, split_dim=1) == invalid
    assert shared.put_tensor_with_tp(key + "-dim", tensor, tp_size=2, split_dim=2) == invalid
    assert shared.put_tensor_with_tp(key + "-neg", tensor, tp_size=2, split_dim=-1) == invalid
    assert shared.is_exist(f"{key}-uneven_tp_0") == 0
    assert shared.put_tensor_with_tp(key + "-one", tensor, tp_size=1) == 0
    assert torch.equal(shared.get_tensor(key + "-one"), tensor)
    assert torch.equal(shared.get_tensor_with_tp(key + "-one", tp_rank=0, tp_size=1), tensor)
    # Shards already stored are kept, as Mooncake's put keeps an existing key.
    assert shared.put_tensor_with_tp(key, torch.zeros(4, 6), tp_size=2, split_dim=1) == 0
    assert torch.equal(shared.get_tensor_with_tp(key, tp_rank=0, tp_size=2), tensor[:, :3])

    config = ReplicateConfig()
    config.with_hard_pin = True
    assert shared.pub_tensor_with_tp(key + "-pub", tensor, config, tp_size=3, split_dim=1) == 0
    assert torch.equal(shared.get_tensor(key + "-pub_tp_2"), tensor[:, 4:])


def test_a_failed_shard_does_not_stop_the_other_ranks(shared, key, monkeypatch):
    # Rank 0's write fails (as one finding no room would); the others are still stored, and
    # the answer is rank 0's code, as Mooncake's batch of shards answers.
    put_encoded = shared._put_encoded

    def rank_0_fails(call, shard, encoded, config, upsert):
        if shard.endswith("_tp_0"):
            return int(ErrorCode.NO_AVAILABLE_HANDLE)
        return put_encoded(call, shard, encoded, config, upsert)

    monkeypatch.setattr(shared, "_put_encoded", rank_0_fails)
    tensor = sample(torch.int32, (6, 2))
    assert shared.put_tensor_with_tp(key, tensor, tp_size=3) == int(ErrorCode.NO_AVAILABLE_HANDLE)
    assert shared.is_exist(f"{key}_tp_0") == 0
    assert torch.equal(shared.get_tensor(f"{key}_tp_1"), tensor[2:4])
    assert torch.equal(shared.get_tensor(f"{key}_tp_2"), tensor[4:])


def test_tensors_without_bytes_to_store_are_refused_not_raised(shared, key):
    invalid = int(ErrorCode.INVALID_PARAMS)
    assert shared.put_tensor(key, torch.empty(4, device="meta")) == invalid
    assert shared.put_tensor(key, torch.eye(3).to_sparse()) == invalid
    assert shared.batch_put_tensor(
        [key, key + "-ok"], [torch.eye(2).to_sparse(), torch.ones(2)]
    ) == [
        invalid,
        0,
    ]
    assert shared.is_exist(key) == 0


def test_tensor_parallel_batches_and_registered_memory(shared, key, pool):
    invalid = int(ErrorCode.INVALID_PARAMS)
    keys = [f"{key}/{i}" for i in range(3)]
    values = [sample(torch.float16, (4, 2 * (i + 1)), seed=i) for i in range(3)]
    assert shared.batch_put_tensor_with_tp(keys, values, tp_size=2, split_dim=0) == [0, 0, 0]
    shards = shared.batch_get_tensor_with_tp(keys + [key + "-missing"], tp_rank=1, tp_size=2)
    assert all(torch.equal(s, v[2:]) for s, v in zip(shards, values)) and shards[3] is None
    assert shared.batch_pub_tensor_with_tp(
        [key + "-a", key + "-b"], [values[0], torch.ones(3, 3)], None, tp_size=2, split_dim=1
    ) == [0, invalid]
    assert shared.batch_put_tensor_with_tp(keys, values[:1], tp_size=2) == [invalid] * 3

    base = pool.data_ptr()
    got = shared.get_tensor_with_tp_into(keys[2], base, 4096, tp_rank=0, tp_size=2)
    assert torch.equal(got, values[2][:2]) and got.data_ptr() == base + 304
    got = shared.batch_get_tensor_with_tp_into(
        keys, [base + 4096 * i for i in range(3)], [4096] * 3, tp_rank=1, tp_size=2
    )
    assert all(torch.equal(g, v[2:]) for g, v in zip(got, values))

    # A whole tensor in registered memory, stored as shards.
    whole = sample(torch.int64, (2, 8), seed=5)
    assert shared.put_tensor(key + "-whole", whole) == 0
    length = shared.get_into(key + "-whole", base + 65536, 4096)
    assert length == 304 + 16 * 8
    assert shared.put_tensor_with_tp_from(key + "-from", base + 65536, length, 0, 4, 1) == 0
    for rank in range(4):
        part = shared.get_tensor_with_tp(key + "-from", tp_rank=rank, tp_size=4)
        assert torch.equal(part, whole[:, 2 * rank : 2 * rank + 2])
    pool[131072 : 131072 + length] = 3  # not a tensor
    assert shared.batch_put_tensor_with_tp_from(
        [key + "-f0", key + "-f1"], [base + 65536, base + 131072], [length, length], 0, 2, 1
    ) == [0, invalid]
    assert torch.equal(shared.get_tensor(key + "-f0_tp_1"), whole[:, 4:])
    assert shared.put_tensor_with_tp_from(key + "-f2", base + 65536, length, 0, 1) == 0
    assert torch.equal(shared.get_tensor(key + "-f2"), whole)


def test_safetensors_files_round_trip_through_the_store(shared, key, tmp_path):
    from safetensors.torch import load_file, save_file

    tensor = sample(torch.bfloat16, (3, 4))
    assert shared.put_tensor(key, tensor) == 0
    path = str(tmp_path / "saved.safetensors")
    assert shared.save_tensor_to_safetensor(key, path) == 0
    assert list(load_file(path)) == [key] and torch.equal(load_file(path)[key], tensor)

    with pytest.warns(UserWarning, match="no tensor named"):  # not in the file: its first
        got = shared.load_tensor_from_safetensor(key + "-loaded", path)
    assert torch.equal(got, tensor)
    assert torch.equal(shared.get_tensor(key + "-loaded"), tensor)
    with pytest.warns(UserWarning, match="no tensor named"):
        again = shared.load_tensor_from_safetensor(key + "-loaded", path)
    assert torch.equal(again, tensor)  # already stored: kept, and answered

    named = str(tmp_path / "named.safetensors")
    save_file({"a": torch.zeros(2), key + "-b": torch.ones(3)}, named)
    assert torch.equal(shared.load_tensor_from_safetensor(key + "-b", named), torch.ones(3))
    assert torch.equal(shared.get_tensor(key + "-b"), torch.ones(3))
    # With no key, the tensor is stored under the file's name.
    assert torch.equal(shared.load_tensor_from_safetensor(file_name=named), torch.zeros(2))
    assert torch.equal(shared.get_tensor(named), torch.zeros(2))

    assert shared.save_tensor_to_safetensor(key + "-missing", path) == int(ErrorCode.FILE_NOT_FOUND)
    unwritable = str(tmp_path / "no-such-dir" / "x.safetensors")
    assert shared.save_tensor_to_safetensor(key, unwritable) == int(ErrorCode.FILE_WRITE_FAIL)
    assert shared.load_tensor_from_safetensor(key + "-x", unwritable) is None
    assert shared.load_tensor_from_safetensor(key + "-x") is None  # no file named
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    assert shared.load_tensor_from_safetensor(key + "-x", str(garbage)) is None
    assert shared.is_exist(key + "-x") == 0


def test_host_memory_registers_as_host_memory(shared):
    """Only device memory is staged: host memory, pinned or not, is read in place (the GPU
    paths are in test_device_memory.py)."""
    host = torch.zeros(4096, dtype=torch.uint8)
    assert shared.register_buffer(host.data_ptr(), 4096) == 0
    assert shared._client.check_registered(host.data_ptr(), 4096) is None
    assert shared.unregister_buffer(host.data_ptr()) == 0
    if not torch.cuda.is_available():
        print("SKIPPED: pinned host memory needs a GPU (torch.cuda.is_available() is False)")
        pytest.skip("no GPU here: pinned host memory cannot be allocated")
    pinned = torch.zeros(4096, dtype=torch.uint8).pin_memory()
    assert shared.register_buffer(pinned.data_ptr(), 4096) == 0
    assert shared._client.check_registered(pinned.data_ptr(), 4096) is None
    assert shared.unregister_buffer(pinned.data_ptr()) == 0
