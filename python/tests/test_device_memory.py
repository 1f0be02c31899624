"""Registered device (GPU) memory: values stored from it and read back into it through the
staging pool, against a real master.

Every test runs on the software device model, whose memory the CPU cannot touch (a path that
read it directly would crash the test), and the same tests run on a real GPU where torch sees
one; there they are skipped with the reason printed. The fault tests (a failed copy, a lost
device, a slow one) need the model's switches and run on it alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import connect
from devices import ModelGpu, cuda_reason, gpu_for, registered
from mooring.codes import ErrorCode


@pytest.fixture(params=["cupy", "jax"])
def foreign_gpu(request):
    """A GPU whose memory another framework than torch allocated."""
    device = gpu_for(request.param, pytest)
    yield device
    device.release()


@pytest.fixture
def model():
    device = ModelGpu()
    yield device
    device.release()


@pytest.fixture
def small_slabs(master, monkeypatch):
    """A store whose staging pool is 4 MiB: 1 MiB slabs, so batches take several waves."""
    monkeypatch.setenv("MOORING_DEVICE_STAGING_SIZE", "4MB")
    store = connect(master)
    yield store
    store.close()


def pattern(seed: int, size: int) -> bytes:
    return bytes((i * 31 + seed * 131) % 251 for i in range(size))


def test_a_value_goes_from_device_memory_to_the_store_and_back(shared, gpu, key):
    size = 3 << 20
    src = registered(shared, gpu, size)
    dst = registered(shared, gpu, size)
    gpu.write(src, pattern(1, size))
    assert shared.put_from(key, src, size) == 0
    # What the store holds is the device's bytes (read on the host, checksummed there).
    assert shared.get(key) == pattern(1, size)
    assert shared.get_into(key, dst, size) == size
    assert gpu.read(dst, size) == pattern(1, size)
    # upsert_from replaces it from device memory too.
    gpu.write(src, pattern(2, size))
    assert shared.upsert_from(key, src, size) == 0
    assert shared.get(key) == pattern(2, size)
    stat = shared.stat()
    assert stat["device_bytes_put"] >= 2 * size and stat["device_bytes_got"] >= size
    (device,) = [d for d in stat["devices"] if d["registered_bytes"] >= 2 * size]
    assert device["path"] == "staging through pinned host memory"
    for addr in (src, dst):
        assert shared.unregister_buffer(addr) == 0


def test_batches_span_many_waves_of_the_staging_pool(small_slabs, gpu, key):
    store = small_slabs
    count, size = 20, 300_000  # three per 1 MiB slab: seven waves
    src = registered(store, gpu, count * size)
    dst = registered(store, gpu, count * size)
    for i in range(count):
        gpu.write(src + i * size, pattern(i, size))
    keys = [f"{key}-{i}" for i in range(count)]
    ptrs = [src + i * size for i in range(count)]
    assert store.batch_put_from(keys, ptrs, [size] * count) == [0] * count
    assert (
        store.batch_get_into(keys[::-1], [dst + i * size for i in range(count)], [size] * count)
        == [size] * count
    )
    for i in range(count):
        assert gpu.read(dst + i * size, size) == pattern(count - 1 - i, size), i


def test_multi_buffer_values_gather_and_scatter_on_the_device(shared, gpu, key):
    layers, block = 6, 64 << 10
    src = registered(shared, gpu, layers * block * 2)
    dst = registered(shared, gpu, layers * block * 2)
    for layer in range(layers * 2):
        gpu.write(src + layer * block, pattern(layer, block))
    keys = [f"{key}-a", f"{key}-b"]
    parts = [[src + (2 * layer + k) * block for layer in range(layers)] for k in range(2)]
    sizes = [[block] * layers, [block] * layers]
    assert shared.batch_put_from_multi_buffers(keys, parts, sizes) == [0, 0]
    expected_a = b"".join(pattern(2 * layer, block) for layer in range(layers))
    assert shared.get(keys[0]) == expected_a
    into = [[dst + (k * layers + layer) * block for layer in range(layers)] for k in range(2)]
    assert shared.batch_get_into_multi_buffers(keys, into, sizes) == [layers * block] * 2
    assert gpu.read(dst, layers * block) == expected_a
    for layer in range(layers):
        got = gpu.read(dst + (layers + layer) * block, block)
        assert got == pattern(2 * layer + 1, block)


def test_get_into_ranges_writes_fragments_onto_the_device(shared, gpu, key):
    value = pattern(7, 10_000)
    assert shared.put(key, value) == 0
    dst = registered(shared, gpu, 8192)
    got = shared.get_into_ranges([dst], [[key]], [[[0, 4096]]], [[[100, 5000]]], [[[1000, 2000]]])
    assert got == [[[1000, 2000]]]
    assert gpu.read(dst, 1000) == value[100:1100]
    assert gpu.read(dst + 4096, 2000) == value[5000:7000]


def test_one_batch_mixes_host_and_device_keys(shared, gpu, key):
    import ctypes

    host = ctypes.create_string_buffer(pattern(3, 5000), 5000)
    host_addr = ctypes.addressof(host)
    assert shared.register_buffer(host_addr, 5000) == 0
    dev = registered(shared, gpu, 5000)
    gpu.write(dev, pattern(4, 5000))
    keys = [f"{key}-host", f"{key}-dev", f"{key}-split"]
    codes = shared.batch_put_from_multi_buffers(
        keys, [[host_addr], [dev], [host_addr, dev]], [[5000], [5000], [100, 100]]
    )
    # A value split between host and device memory is refused alone, with what to do.
    assert codes == [0, 0, int(ErrorCode.INVALID_PARAMS)]
    assert shared.get(keys[0]) == pattern(3, 5000)
    assert shared.get(keys[1]) == pattern(4, 5000)
    assert shared.is_exist(keys[2]) == 0
    assert shared.unregister_buffer(host_addr) == 0


def test_a_value_larger_than_a_slab_is_refused_alone(small_slabs, gpu, key):
    store = small_slabs
    big = (1 << 20) + 1
    src = registered(store, gpu, big + 4096)
    codes = store.batch_put_from([f"{key}-big", f"{key}-small"], [src, src + big], [big, 4096])
    assert codes == [int(ErrorCode.INVALID_PARAMS), 0]
    assert store.is_exist(f"{key}-big") == 0


def test_device_memory_of_another_range_must_be_registered(shared, gpu, key):
    addr = gpu.alloc(4096)
    assert shared.put_from(key, addr, 4096) == int(ErrorCode.INVALID_PARAMS)
    assert shared.register_buffer(addr, 4096) == 0
    # Running past the registered range is refused before any copy.
    assert shared.put_from(key, addr, 8192) == int(ErrorCode.INVALID_PARAMS)
    assert shared.unregister_buffer(addr) == 0


def test_tensor_headers_in_device_memory_are_read_through_the_device(shared, gpu, key):
    torch = pytest.importorskip("torch")
    from mooring import tensors

    tensor = torch.arange(1000, dtype=torch.float32)
    header, data, _keep = tensors.encode(tensor)
    blob = bytes(header) + bytes(data)
    addr = registered(shared, gpu, len(blob))
    gpu.write(addr, blob)
    assert shared.put_tensor_from(key, addr, len(blob)) == 0
    assert torch.equal(shared.get_tensor(key), tensor)
    # A damaged header is refused, read through the device like a sound one.
    gpu.write(addr, b"\0" * 8)
    assert shared.put_tensor_from(key + "-bad", addr, len(blob)) == int(ErrorCode.INVALID_PARAMS)
    viewed = shared.get_tensor_into(key, addr, len(blob))
    if gpu.name == "model":
        assert viewed is None  # the model's memory cannot be viewed as a tensor
    else:
        assert viewed.device.type == "cuda" and torch.equal(viewed.cpu(), tensor)


def test_memory_cupy_or_jax_allocated_round_trips(shared, foreign_gpu, key):
    """CuPy's and JAX's device pointers register as torch's do: the driver, not the framework,
    says which device and context the memory belongs to."""
    count, size = 4, 1 << 20
    src = registered(shared, foreign_gpu, count * size)
    dst = registered(shared, foreign_gpu, count * size)
    for i in range(count):
        foreign_gpu.write(src + i * size, pattern(10 + i, size))
    keys = [f"{key}-{i}" for i in range(count)]
    assert (
        shared.batch_put_from(keys, [src + i * size for i in range(count)], [size] * count)
        == [0] * count
    )
    assert shared.get(keys[2]) == pattern(12, size)
    got = shared.batch_get_into(keys, [dst + i * size for i in range(count)], [size] * count)
    assert got == [size] * count
    for i in range(count):
        assert foreign_gpu.read(dst + i * size, size) == pattern(10 + i, size), i


EXPANDABLE_CHILD = """
import sys
import torch
from mooring.store import MooncakeDistributedStore

store = MooncakeDistributedStore()
assert store.setup("127.0.0.1", "P2PHANDSHAKE", "64MB", "64MB", "tcp", "", sys.argv[1]) == 0
size = 3 << 20
src = torch.arange(size, dtype=torch.int64, device="cuda").remainder(251).to(torch.uint8)
dst = torch.zeros(size, dtype=torch.uint8, device="cuda")
for t in (src, dst):
    assert store.register_buffer(t.data_ptr(), size) == 0
assert store.put_from(sys.argv[2], src.data_ptr(), size) == 0
assert store.get_into(sys.argv[2], dst.data_ptr(), size) == size
assert torch.equal(src, dst)
store.close()
print("round trip from expandable segments: ok")
"""


def test_torch_expandable_segments_round_trip(master, key):
    """Memory that belongs to no CUDA context (torch's expandable segments map it through
    CUDA's virtual memory calls, as vLLM's sleep-mode allocator does) is copied in its
    device's primary context. The setting is read when torch starts, hence a child process."""
    reason = cuda_reason()
    if reason is not None:
        print(f"SKIPPED: expandable segments: {reason}")
        pytest.skip(f"expandable segments: {reason}")
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    child = subprocess.run(
        [sys.executable, "-c", EXPANDABLE_CHILD, master.address, key],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert "round trip from expandable segments: ok" in child.stdout


# ---- the model's faults ----------------------------------------------------------------------


def test_a_failed_copy_stores_nothing_and_answers_transfer_fail(shared, model, key):
    size = 100_000
    src = registered(shared, model, size)
    model.write(src, pattern(5, size))
    model.model.fail_copy(0)
    assert shared.put_from(key, src, size) == int(ErrorCode.TRANSFER_FAIL)
    assert shared.is_exist(key) == 0
    assert shared.put_from(key, src, size) == 0
    dst = registered(shared, model, size)
    model.model.fail_copy(0)
    assert shared.get_into(key, dst, size) == int(ErrorCode.TRANSFER_FAIL)
    assert shared.get_into(key, dst, size) == size
    assert model.read(dst, size) == pattern(5, size)


def test_a_device_lost_mid_batch_fails_what_was_still_on_it(small_slabs, model, key):
    store = small_slabs
    count, size = 12, 500_000  # two per slab: six waves
    src = registered(store, model, count * size)
    keys = [f"{key}-{i}" for i in range(count)]
    model.model.set_delay_ms(150)
    threading.Timer(0.25, model.model.set_lost, args=(True,)).start()
    codes = store.batch_put_from(keys, [src + i * size for i in range(count)], [size] * count)
    model.model.set_lost(False)
    # The first wave's copy ended before the loss; everything after it failed, and nothing
    # that failed was stored.
    assert codes[:2] == [0, 0]
    assert set(codes[2:]) == {int(ErrorCode.TRANSFER_FAIL)}
    assert store.batch_is_exist(keys) == [1, 1] + [0] * (count - 2)


def test_unregister_waits_for_the_transfer_using_the_buffer(shared, model, key):
    size = 200_000
    src = registered(shared, model, size)
    assert shared.put_from(key, src, size) == 0
    dst = registered(shared, model, size)
    model.model.set_delay_ms(400)
    ended: dict[str, float] = {}

    def read() -> None:
        ended["code"] = shared.get_into(key, dst, size)
        ended["get"] = time.monotonic()

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.1)
    assert shared.unregister_buffer(dst) == 0
    ended["unregister"] = time.monotonic()
    reader.join()
    assert ended["code"] == size
    assert ended["unregister"] >= ended["get"]
    # Once unregistered, the buffer is refused.
    assert shared.get_into(key, dst, size) == int(ErrorCode.INVALID_PARAMS)


def test_threads_share_a_bounded_pool(master, model, key, monkeypatch):
    monkeypatch.setenv("MOORING_DEVICE_STAGING_SIZE", "4MB")
    store = connect(master)
    try:
        before = model.model.host_buffers()
        size = 200_000
        src = registered(store, model, 8 * size)
        failures: list[object] = []

        def work(t: int) -> None:
            for round_ in range(2):
                keys = [f"{key}-{t}-{round_}-{i}" for i in range(8)]
                codes = store.batch_put_from(keys, [src + i * size for i in range(8)], [size] * 8)
                if codes != [0] * 8:
                    failures.append(codes)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert model.model.host_buffers() - before <= 4
    finally:
        store.close()
