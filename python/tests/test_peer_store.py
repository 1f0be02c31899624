"""`mooring.store` against a peer cluster (``peer://``): the calls SGLang's HiCache makes, from
a store that runs a peer in its own process and from one that has no pool (a guest), every
value checked; and the calls a peer cluster cannot serve, refused with -1011."""

from __future__ import annotations

import numpy as np
import pytest
from mooring.store import MooncakeDistributedStore, ReplicateConfig

UNAVAILABLE = -1011
NOT_FOUND = -704


def pattern(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def joined(peers, segment) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    code = store.setup("127.0.0.1", "P2PHANDSHAKE", segment, "64MB", "tcp", "", peers.address)
    assert code == 0, code
    return store


@pytest.fixture(params=["32MB", 0], ids=["member", "guest"])
def store(request, peers):
    store = joined(peers, request.param)
    yield store
    store.close()


def test_copying_calls_round_trip(store, key):
    value = pattern(300_000, 1)
    assert store.put(key, value) == 0
    assert store.get(key) == value
    assert store.get_size(key) == len(value)
    assert store.is_exist(key) == 1
    # The newest write wins in a peer cluster: a put replaces.
    assert store.put(key, b"second") == 0
    assert store.get(key) == b"second"
    keys = [f"{key}-{i}" for i in range(5)]
    values = [pattern(1000 + i, i) for i in range(5)]
    assert store.put_batch(keys, values) == 0
    assert store.get_batch([*keys, f"{key}-missing"]) == [*values, b""]
    assert store.batch_is_exist([keys[0], f"{key}-missing"]) == [1, 0]
    assert store.remove(key) == 0
    assert store.is_exist(key) == 0
    assert store.get(key) == b""
    assert store.remove(key) == NOT_FOUND


def test_zero_copy_batches_round_trip(store, key):
    buf = np.zeros(1 << 20, dtype=np.uint8)
    base = buf.ctypes.data
    assert store.register_buffer(base, buf.nbytes) == 0
    page = 64 << 10
    buf[: 4 * page] = np.frombuffer(pattern(4 * page, 7), dtype=np.uint8)
    keys = [f"{key}-{i}" for i in range(4)]
    assert store.batch_put_from(keys, [base + i * page for i in range(4)], [page] * 4) == [0] * 4
    # Two halves of one page, as SGLang's MHA pages are given (K, then V).
    half = page // 2
    assert store.batch_put_from_multi_buffers(
        [f"{key}-kv"], [[base, base + 3 * page + half]], [[half, half]]
    ) == [0]
    into = base + 8 * page
    got = store.batch_get_into(
        [*keys, f"{key}-missing"], [into + i * page for i in range(5)], [page] * 5
    )
    assert got[:4] == [page] * 4 and got[4] < 0
    assert (buf[8 * page : 12 * page] == buf[: 4 * page]).all()
    assert store.batch_get_into_multi_buffers(
        [f"{key}-kv"], [[base + 14 * page, base + 14 * page + half]], [[half, half]]
    ) == [page]
    assert (buf[14 * page : 14 * page + half] == buf[:half]).all()
    assert (buf[14 * page + half : 15 * page] == buf[3 * page + half : 4 * page]).all()
    # A value larger than the buffer given is refused, and nothing is written past it.
    assert store.get_into(keys[0], into, 100) == -10
    assert store.unregister_buffer(base) == 0


def test_a_guest_reads_what_a_member_wrote(peers, key):
    member, guest = joined(peers, "16MB"), joined(peers, 0)
    try:
        value = pattern(200_000, 3)
        assert member.put(key, value) == 0
        assert guest.get(key) == value
        assert guest.remove(key) == 0
        assert member.is_exist(key) == 0
    finally:
        member.close()
        guest.close()


def test_what_needs_a_master_is_refused(store, key):
    assert store.remove_all() == UNAVAILABLE
    assert store.remove_by_regex(".*") == UNAVAILABLE
    assert store.get_replica_desc(key) == []
    two = ReplicateConfig()
    two.replica_num = 2
    assert store.put(key, b"x", two) == UNAVAILABLE
    assert store.is_exist(key) == 0
    assert store.health_check() == 0


def test_setup_against_no_peer_fails(peers):
    store = MooncakeDistributedStore()
    for segment in ("16MB", 0):
        assert (
            store.setup(
                "127.0.0.1", "P2PHANDSHAKE", segment, "16MB", "tcp", "", "peer://127.0.0.1:1"
            )
            < 0
        )
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, "16MB", "rdma", "", peers.address) == (
        UNAVAILABLE
    )


def test_device_memory_round_trips(store, gpu, key):
    """Values stored from device memory and read back into it, on a peer cluster as on a
    master's: on the software device model (whose memory the CPU cannot touch) and on a real
    GPU where one is present."""
    from devices import registered

    size = 1 << 20
    base = registered(store, gpu, size)
    page = 64 << 10
    values = [pattern(page, 20 + i) for i in range(3)]
    for i, value in enumerate(values):
        gpu.write(base + i * page, value)
    keys = [f"{key}-{i}" for i in range(3)]
    assert store.batch_put_from(keys, [base + i * page for i in range(3)], [page] * 3) == [0] * 3
    into = base + 8 * page
    # Two parts for the first value, one each for the others; and a key with no value.
    got = store.batch_get_into_multi_buffers(
        [*keys, f"{key}-missing"],
        [[into, into + page // 2], [into + page], [into + 2 * page], [into + 3 * page]],
        [[page // 2, page // 2], [page], [page], [page]],
    )
    assert got[:3] == [page] * 3 and got[3] < 0
    assert gpu.read(into, 3 * page) == b"".join(values)
    assert store.get(keys[1]) == values[1]
    # Too small a buffer: refused, nothing written past it.
    assert store.get_into(keys[0], into, 100) == -10
    assert store.stat()["device_bytes_put"] == 3 * page


def test_device_batches_span_many_waves_on_a_peer_cluster(peers, gpu, key, monkeypatch):
    """A batch larger than the staging pool moves in waves, one wave's device copy beside the
    next one's transfer, on a peer cluster as on a master's."""
    from devices import registered

    monkeypatch.setenv("MOORING_DEVICE_STAGING_SIZE", "4MB")  # 1 MiB slabs
    store = joined(peers, "32MB")
    try:
        count, size = 12, 300_000  # three per slab: several waves
        src = registered(store, gpu, count * size)
        dst = registered(store, gpu, count * size)
        for i in range(count):
            gpu.write(src + i * size, pattern(size, 40 + i))
        keys = [f"{key}-{i}" for i in range(count)]
        ptrs = [src + i * size for i in range(count)]
        assert store.batch_put_from(keys, ptrs, [size] * count) == [0] * count
        got = store.batch_get_into(
            keys[::-1], [dst + i * size for i in range(count)], [size] * count
        )
        assert got == [size] * count
        for i in range(count):
            assert gpu.read(dst + i * size, size) == pattern(size, 40 + count - 1 - i), i
        stat = store.stat()
        assert stat["device_bytes_put"] == stat["device_bytes_got"] == count * size
    finally:
        store.close()
