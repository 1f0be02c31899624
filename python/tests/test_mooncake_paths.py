"""What vLLM's, SGLang's and LMCache's built-in Mooncake paths call beyond the basic calls:
replica descriptors by tier, ``batch_replica_clear``, newer ``ReplicateConfig`` fields, vLLM's
``standalone-store`` mode (``global_segment_size=0``), the master's ``/get_all_segments`` that
SGLang's ``check_server`` polls, and ``-200`` as the signal to back off under memory pressure.

Every test runs against a real ``mooring master`` (and ``mooring node`` where one is named)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import Master, Node, connect, free_port
from mooring.store import (
    Descriptor,
    DiskDescriptor,
    ErrorCode,
    LocalDiskDescriptor,
    MemoryDescriptor,
    MooncakeDistributedStore,
    ObjectDataType,
    ReplicaStatus,
    ReplicateConfig,
)

MIB = 1 << 20


def pattern(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def registered(store, nbytes: int) -> np.ndarray:
    buf = np.zeros(nbytes, dtype=np.uint8)
    assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    return buf


def wait_for(condition, seconds: float = 20.0, what: str = "the condition"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"{what} did not hold within {seconds} s")


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# ---- ReplicateConfig ---------------------------------------------------------------------------

# Every field Mooncake's binding gives ReplicateConfig, with its default there.
MOONCAKE_FIELDS = {
    "replica_num": 1,
    "nof_replica_num": 0,
    "dfs_replica_num": 0,
    "with_hard_pin": False,
    "preferred_segments": [],
    "preferred_nof_segments": [],
    "preferred_segment": "",
    "prefer_alloc_in_same_node": False,
    "data_type": ObjectDataType.UNKNOWN,
    "group_ids": None,
    "soft_pin_ttl_ms": None,
}


def test_replicate_config_has_every_mooncake_field_with_its_default():
    config = ReplicateConfig()
    for name, default in MOONCAKE_FIELDS.items():
        # SGLang probes the class and an instance with hasattr before it sets a field.
        assert hasattr(ReplicateConfig, name), name
        assert getattr(config, name) == default, name
    assert [t.name for t in ObjectDataType][:2] == ["UNKNOWN", "KVCACHE"]
    assert int(ObjectDataType.GENERAL) == 9
    config.data_type = ObjectDataType.KVCACHE
    config.group_ids = ["", ""]
    config.nof_replica_num = 0
    text = str(config)
    for part in ("nof_replica_num=0", "dfs_replica_num=0", "KVCACHE", "group_ids=['', '']"):
        assert part in text, text


def test_replicate_config_fields_mooring_cannot_honour_are_refused_on_use(shared, key, capfd):
    buf = registered(shared, 2 * MIB)
    try:
        buf[: 64 << 10] = np.frombuffer(pattern(64 << 10, seed=1), dtype=np.uint8)
        ptr = buf.ctypes.data

        def refused(**fields):
            config = ReplicateConfig()
            for name, value in fields.items():
                setattr(config, name, value)
            return config

        for n, config in enumerate(
            [
                refused(nof_replica_num=1),
                refused(preferred_nof_segments=["nof-0"]),
                refused(dfs_replica_num=2),
                refused(group_ids=["g", "g"]),
                refused(data_type=77),
            ]
        ):
            k = f"{key}/{n}"
            # Every write answers INVALID_PARAMS, one code per key in batches; nothing stored.
            assert shared.put(k, b"value", config) == ErrorCode.INVALID_PARAMS
            assert shared.upsert(k, b"value", config) == ErrorCode.INVALID_PARAMS
            assert shared.put_parts(k, b"a", b"b", config=config) == ErrorCode.INVALID_PARAMS
            assert shared.put_batch([k, k + "b"], [b"1", b"2"], config) == ErrorCode.INVALID_PARAMS
            assert shared.put_from(k, ptr, 4096, config) == ErrorCode.INVALID_PARAMS
            assert (
                shared.batch_put_from([k, k + "b"], [ptr, ptr], [8, 8], config)
                == [ErrorCode.INVALID_PARAMS] * 2
            )
            assert (
                shared.batch_put_from_multi_buffers(
                    [k, k + "b"], [[ptr, ptr + 8]] * 2, [[8, 8]] * 2, config
                )
                == [ErrorCode.INVALID_PARAMS] * 2
            )
            assert shared.batch_is_exist([k, k + "b"]) == [0, 0]

        # The log (stderr; a few lines a second, so after a pause) says what to do instead.
        time.sleep(1.1)
        capfd.readouterr()
        assert shared.put(key, b"v", refused(dfs_replica_num=1)) == ErrorCode.INVALID_PARAMS
        logged = capfd.readouterr().err
        assert "dfs_replica_num" in logged and "leave it at 0" in logged, logged
        # A wrong type is a programming error, raised as Mooncake's binding raises it.
        with pytest.raises(TypeError):
            shared.put(key, b"v", refused(nof_replica_num="1"))

        # Values Mooring can honour are taken: the defaults spelled out, a data label, and
        # group ids that name no group.
        config = refused(
            nof_replica_num=0,
            dfs_replica_num=0,
            preferred_nof_segments=[],
            data_type=ObjectDataType.KVCACHE,
            group_ids=["", ""],
        )
        keys = [f"{key}/ok0", f"{key}/ok1"]
        assert shared.batch_put_from_multi_buffers(
            keys, [[ptr, ptr + 4096]] * 2, [[4096, 4096]] * 2, config
        ) == [0, 0]
        assert shared.get(keys[1]) == bytes(buf[:8192])
    finally:
        shared.unregister_buffer(buf.ctypes.data)


# ---- replica descriptors -----------------------------------------------------------------------


def test_replica_descriptors_tell_memory_from_local_disk(tmp_path, key):
    # Write-through: the node copies every value to its SSD, so a value soon has a memory
    # replica and a local-disk one.
    master = Master("--offload-write-through")
    node = Node(master, "--size", "16MiB", "--no-prefault", "--disk-dir", str(tmp_path))
    store = connect(master, segment=0)
    try:
        value = pattern(300_000, seed=3)
        assert store.put(key, value) == 0

        def both():
            replicas = store.get_replica_desc(key)
            return replicas if len(replicas) == 2 else None

        replicas = wait_for(both, what="a disk copy beside the memory replica")
        [memory] = [r for r in replicas if r.is_memory_replica()]
        [disk] = [r for r in replicas if r.is_local_disk_replica()]
        for r in replicas:
            assert r.status == ReplicaStatus.COMPLETE
            # Mooring has no file (DISK) replicas: what vLLM's tier log counts as disk is the
            # local-disk predicate.
            assert not r.is_disk_replica()
            with pytest.raises(RuntimeError, match="is_local_disk_replica"):
                r.get_disk_descriptor()
        assert not memory.is_local_disk_replica() and not disk.is_memory_replica()

        described = memory.get_memory_descriptor()
        assert isinstance(described, MemoryDescriptor)
        buffer = described.buffer_descriptor
        assert isinstance(buffer, Descriptor)
        assert buffer.size == len(value)
        # The node's data server: the only segment here is the node's (the store has none).
        assert buffer.transport_endpoint == memory.transport_endpoint == disk.transport_endpoint
        assert buffer.transport_endpoint.startswith("127.0.0.1:")
        assert buffer.buffer_address == memory.buffer_address
        with pytest.raises(RuntimeError, match="is_memory_replica"):
            disk.get_memory_descriptor()

        local = disk.get_local_disk_descriptor()
        assert isinstance(local, LocalDiskDescriptor)
        assert (local.object_size, local.transport_endpoint) == (
            len(value),
            disk.transport_endpoint,
        )
        with pytest.raises(RuntimeError, match="is_local_disk_replica"):
            memory.get_local_disk_descriptor()
        assert DiskDescriptor().file_path == ""  # the class exists for programs that name it

        # The batch form: missing keys are left out, as Mooncake leaves them out.
        described = store.batch_get_replica_desc([key, key + "-missing"])
        assert list(described) == [key]
        assert {r.is_memory_replica() for r in described[key]} == {True, False}
        assert store.get(key) == value
    finally:
        store.close()
        node.stop()
        master.stop()


# ---- batch_replica_clear -----------------------------------------------------------------------


def test_batch_replica_clear_clears_only_own_unleased_objects(key):
    master = Master("--lease-ttl", "300ms")
    a = connect(master, segment="16MB")
    b = connect(master, segment="16MB")
    try:
        assert a.batch_replica_clear([]) == []
        two = ReplicateConfig()
        two.replica_num = 2
        mine, pair, theirs = f"{key}/mine", f"{key}/pair", f"{key}/theirs"
        assert a.put(mine, b"m" * 1000) == 0
        assert a.put(pair, b"p" * 1000, two) == 0
        assert b.put(theirs, b"t" * 1000) == 0

        # Another store's object and a missing key are skipped; the store's own goes whole.
        assert a.batch_replica_clear([mine, theirs, key + "-missing"]) == [mine]
        assert a.is_exist(mine) == 0
        assert b.batch_is_exist([theirs]) == [1]

        # Describing the object leases it, and a leased object is not cleared...
        endpoints = {r.transport_endpoint for r in a.get_replica_desc(pair)}
        assert endpoints == {a.get_hostname(), b.get_hostname()}
        assert a.batch_replica_clear([pair], b.get_hostname()) == []
        # ...until the lease runs out. With a segment, only the replica there goes.
        time.sleep(0.5)
        assert a.batch_replica_clear([pair], b.get_hostname()) == [pair]
        assert [r.transport_endpoint for r in a.get_replica_desc(pair)] == [a.get_hostname()]
        assert b.get(pair) == b"p" * 1000
        # A segment holding no replica of it clears nothing; the last replica takes the object.
        time.sleep(0.5)
        assert a.batch_replica_clear([pair], b.get_hostname()) == []
        assert a.batch_replica_clear([pair], a.get_hostname()) == [pair]
        assert a.is_exist(pair) == 0

        # Before setup (or after close): nothing cleared, no exception.
        assert MooncakeDistributedStore().batch_replica_clear([theirs]) == []
        assert b.is_exist(theirs) == 1
    finally:
        a.close()
        b.close()
        master.stop()


# ---- vLLM's standalone-store mode ----------------------------------------------------------------


def test_standalone_store_mode_keeps_blocks_in_the_external_node(key):
    # vLLM's `mode: standalone-store`: each worker contributes nothing
    # (global_segment_size=0) and names the external store's segment as preferred_segment;
    # here that store is a `mooring node`.
    port = free_port()
    master = Master("--metrics-listen", f"127.0.0.1:{port}")
    node = Node(master, "--name", "kv-pool", "--size", "64MiB", "--no-prefault")
    spare = Node(master, "--name", "spare", "--size", "64MiB", "--no-prefault")
    writer, reader = MooncakeDistributedStore(), MooncakeDistributedStore()
    try:
        # vLLM's positional setup: hostname, metadata server, segment 0, local buffer,
        # protocol, device name, master.
        assert (
            writer.setup("127.0.0.1", "P2PHANDSHAKE", 0, 64 * MIB, "tcp", "", master.address) == 0
        )
        config = {
            "local_hostname": "127.0.0.1",
            "metadata_server": "",
            "global_segment_size": "0",
            "local_buffer_size": "64MB",
            "protocol": "tcp",
            "master_server_addr": master.address,
        }
        assert reader.setup(config) == 0
        assert writer.get_hostname() == "127.0.0.1"
        # Only the external store's memory is in the cluster.
        status, body = http_get(port, "/get_all_segments")
        assert (status, sorted(body.splitlines())) == (200, ["kv-pool", "spare"])

        preferred = ReplicateConfig()
        preferred.preferred_segment = "kv-pool"
        source, target = registered(writer, 4 * MIB), registered(reader, 4 * MIB)
        source[:] = np.frombuffer(pattern(4 * MIB, seed=5), dtype=np.uint8)
        keys = [f"{key}/block{i}" for i in range(8)]
        half = 128 << 10
        # K and V halves of each block, from two places in the registered cache.
        ptrs = [
            [source.ctypes.data + i * half, source.ctypes.data + (2 * MIB) + i * half]
            for i in range(8)
        ]
        sizes = [[half, half]] * 8
        assert writer.batch_put_from_multi_buffers(keys, ptrs, sizes, preferred) == [0] * 8
        # Every block went to the preferred store (whose data server a replica names), and
        # a block preferring the other node goes there instead.
        pool = {r.transport_endpoint for k in keys for r in writer.get_replica_desc(k)}
        assert len(pool) == 1, pool
        other = ReplicateConfig()
        other.preferred_segment = "spare"
        assert writer.put_from(f"{key}/elsewhere", source.ctypes.data, half, other) == 0
        [elsewhere] = writer.get_replica_desc(f"{key}/elsewhere")
        assert elsewhere.transport_endpoint not in pool | {writer.get_hostname()}

        out = [
            [target.ctypes.data + i * half, target.ctypes.data + (2 * MIB) + i * half]
            for i in range(8)
        ]
        assert reader.batch_get_into_multi_buffers(keys, out, sizes) == [2 * half] * 8
        assert bytes(target[: 8 * half]) == bytes(source[: 8 * half])
        assert bytes(target[2 * MIB : 2 * MIB + 8 * half]) == bytes(
            source[2 * MIB : 2 * MIB + 8 * half]
        )
    finally:
        writer.close()
        reader.close()
        node.stop()
        spare.stop()
        master.stop()


# ---- /get_all_segments and SGLang's check_server ------------------------------------------------


def test_get_all_segments_is_what_sglang_check_server_waits_for():
    port = free_port()
    own = Master("--metrics-listen", f"127.0.0.1:{port}")
    try:
        # Empty while no memory is mounted: SGLang keeps waiting on an empty answer.
        assert http_get(port, "/get_all_segments") == (200, "")
        store = connect(own, segment="16MB")
        try:
            status, body = http_get(port, "/get_all_segments")
            assert (status, body.splitlines()) == (200, [store.get_hostname()])
        finally:
            store.close()
        assert http_get(port, "/get_all_segments") == (200, "")

        # SGLang's own check_server, against the real master: it waits while nothing is
        # mounted, and returns once a segment is.
        backend = pytest.importorskip("sglang.srt.mem_cache.storage.mooncake_store.mooncake_store")
        probe = SimpleNamespace(
            config=SimpleNamespace(master_server_address=own.address, master_metrics_port=port)
        )
        outcome: list = []

        def check():
            try:
                backend.MooncakeStore.check_server(probe)
                outcome.append("ready")
            except Exception as e:  # noqa: BLE001 - reported below
                outcome.append(e)

        checker = threading.Thread(target=check, daemon=True)
        checker.start()
        checker.join(1.5)
        assert checker.is_alive() and not outcome, outcome
        store = connect(own, segment="16MB")
        try:
            checker.join(15)
            assert outcome == ["ready"], outcome
        finally:
            store.close()
    finally:
        own.stop()


# ---- -200 under memory pressure ----------------------------------------------------------------

NO_AVAILABLE_HANDLE = -200  # the constant vLLM's MooncakeStoreConnector compares put codes with


def test_no_available_handle_means_back_off_and_the_next_batch_succeeds(key):
    """vLLM's sending thread reads a -200 among a batch's codes as "CPU/disk offloading
    pressure: skip storing this request", and clears the pressure after a batch that stores
    everything. So -200 must come exactly when the pool cannot take the block (and for each
    key refused), nothing else may stand in for it, and puts must succeed again once room is
    made."""
    master = Master("--lease-ttl", "200ms")
    node = Node(master, "--size", "4MiB", "--no-prefault")
    store = connect(master, segment=0)
    try:
        block = 512 << 10
        buf = registered(store, 8 * block)
        buf[:] = np.frombuffer(pattern(8 * block, seed=9), dtype=np.uint8)
        ptr = buf.ctypes.data

        # Memory full of values nobody may evict (hard-pinned: model weights, say).
        pinned = ReplicateConfig()
        pinned.with_hard_pin = True
        held = []
        for i in range(64):
            code = store.put_from(f"{key}/pinned{i}", ptr, block, pinned)
            if code == NO_AVAILABLE_HANDLE:
                break
            assert code == 0
            held.append(f"{key}/pinned{i}")
        else:
            pytest.fail("a 4 MiB node took 64 pinned 512 KiB values")
        assert len(held) >= 5, held

        # A KV batch now: every key answers -200 and nothing else, and none is stored.
        keys = [f"{key}/kv{i}" for i in range(4)]
        ptrs = [[ptr + i * block, ptr + i * block + block // 2] for i in range(4)]
        sizes = [[block // 2, block // 2]] * 4
        codes = store.batch_put_from_multi_buffers(keys, ptrs, sizes)
        assert codes == [NO_AVAILABLE_HANDLE] * 4, codes
        assert store.batch_is_exist(keys) == [0] * 4

        # Room is made (weights unloaded): the same batch goes through whole, byte for byte.
        assert store.batch_remove(held[:5]) == [0] * 5
        assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0] * 4
        for i, k in enumerate(keys):
            assert store.get(k) == bytes(buf[i * block : (i + 1) * block])

        # Unpinned values never cause -200: once the reads' leases ran out, the master evicts
        # the least recently used ones to make room.
        time.sleep(0.3)
        for i in range(16):
            assert store.put_from(f"{key}/more{i}", ptr + (i % 8) * block, block) == 0, i
    finally:
        store.close()
        node.stop()
        master.stop()
