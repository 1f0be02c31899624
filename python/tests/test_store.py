"""`mooring.store` against a real master: every method, its return conventions and codes."""

from __future__ import annotations

import array
import ctypes
import os
import threading
import time

import numpy as np
import pytest
from conftest import Master, Node, connect
from mooring import _native
from mooring.store import (
    BufferHandle,
    ErrorCode,
    MooncakeDistributedStore,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    TaskStatus,
    TaskType,
    parse_size,
)

MIB = 1 << 20


def registered(store, nbytes: int) -> np.ndarray:
    buf = np.zeros(nbytes, dtype=np.uint8)
    assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    return buf


def pattern(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


# ---- setup -------------------------------------------------------------------------------------


def test_sizes_read_as_mooncake_reads_them():
    assert parse_size("16MB") == 16 * MIB
    assert parse_size("16 MB") == 16 * MIB
    assert parse_size("1.5 GB") == 3 * (1 << 29)
    assert parse_size("4096") == 4096
    assert parse_size(4096) == 4096
    assert parse_size("2 MiB") == 2 * MIB
    for bad in ["50%", "-1", "lots", "", "3 parsecs"]:
        with pytest.raises(ValueError):
            parse_size(bad)
    with pytest.raises(TypeError):
        parse_size(1.5)


def test_error_codes_match_the_native_table():
    native = _native.error_codes()
    for code in ErrorCode:
        assert native[code.name][0] == code.value, code


def test_setup_positional_and_dict_and_hostname(master):
    store = MooncakeDistributedStore()
    assert store.health_check() == 1
    assert (
        store.setup(
            "127.0.0.1", "http://meta:8080/metadata", "16 MB", "16MB", "tcp", "", master.address
        )
        == 0
    )
    host, port = store.get_hostname().rsplit(":", 1)
    assert host == "127.0.0.1" and 12300 <= int(port) <= 14300
    assert store.health_check() == 0
    assert store.close() == 0
    assert store.health_check() == 1
    # Mooncake's later keyword options, at their defaults, are taken.
    defaults = {"engine": None, "enable_ssd_offload": False, "ssd_offload_path": ""}
    defaults |= {"tenant_id": "default", "enable_client_http_server": False}
    assert (
        store.setup("127.0.0.1", "P2PHANDSHAKE", 0, "16MB", "tcp", "", master.address, **defaults)
        == 0
    )
    assert store.close() == 0

    config = {
        "local_hostname": "127.0.0.1",
        "metadata_server": "etcd://127.0.0.1:2379",
        "global_segment_size": "32MB",
        "local_buffer_size": 16 * MIB,
        "protocol": "tcp",
        "master_server_addr": master.address,
    }
    assert store.setup(config) == 0
    assert store.put("dict-setup", b"v") == 0
    assert store.get("dict-setup") == b"v"
    assert store.close() == 0


def test_setup_refusals_return_codes(master):
    store = MooncakeDistributedStore()
    bad = int(ErrorCode.INVALID_PARAMS)
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", "50%", "16MB", "tcp", "", master.address) == bad
    assert (
        store.setup({"metadata_server": "P2PHANDSHAKE", "master_server_addr": master.address})
        == bad
    )
    assert store.setup({"local_hostname": "127.0.0.1", "master_server_addr": master.address}) == bad
    assert (
        store.setup("127.0.0.1", "P2PHANDSHAKE", 0, "16MB", "carrier-pigeon", "", master.address)
        == bad
    )
    assert (
        store.setup("127.0.0.1", "P2PHANDSHAKE", 0, "16MB", "tcp", "", f"http://{master.address}")
        == bad
    )
    # etcd:// is where etcd finds the masters: a master's own port answers no etcd question,
    # and setup says so at once.
    assert store.setup(
        "127.0.0.1", "P2PHANDSHAKE", 0, "16MB", "tcp", "", f"etcd://{master.address}"
    ) == int(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS)
    # Mooncake's options Mooring does not carry out are refused, not silently dropped.
    for option in (
        {"tenant_id": "no spaces"},
        {"enable_ssd_offload": True},
        {"enable_client_http_server": True},
    ):
        args = ("127.0.0.1", "P2PHANDSHAKE", 0, "16MB", "tcp", "", master.address)
        assert store.setup(*args, **option) == bad, option
        config = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE"}
        as_string = {k: str(v).lower() for k, v in option.items()}
        assert store.setup({**config, "master_server_addr": master.address, **as_string}) == bad
    with pytest.raises(TypeError):
        store.setup("127.0.0.1", "P2PHANDSHAKE", tennant_id="x")  # a typo is an error
    # Nothing listens on port 1.
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, "16MB", "tcp", "", "127.0.0.1:1") < 0
    if not os.path.exists("/sys/class/infiniband"):
        # RDMA asked for on a machine without it: refused with the code, not carried on.
        unavailable = int(ErrorCode.UNAVAILABLE_IN_CURRENT_MODE)
        assert (
            store.setup("127.0.0.1", "P2PHANDSHAKE", 0, "16MB", "rdma", "mlx5_0", master.address)
            == unavailable
        )
    assert store.health_check() == 1
    assert store.get("anything") == b""
    assert store.put("anything", b"x") == bad


def test_mooring_transport_chooses_how_a_store_reaches_nodes(monkeypatch, key):
    # A node without shared memory: `shm` must fail where `auto` would quietly take TCP.
    master = Master()
    node = Node(master, "--size", "16MiB", "--no-prefault", "--transports", "tcp")
    try:
        monkeypatch.setenv("MOORING_TRANSPORT", "tcp")
        over_tcp = connect(master, segment=0)
        assert over_tcp.put(key, b"over tcp") == 0
        assert over_tcp.get(key) == b"over tcp"
        over_tcp.close()
        monkeypatch.setenv("MOORING_TRANSPORT", "SHM")
        over_shm = connect(master, segment=0)
        assert over_shm.get(key) == b""
        assert over_shm.put(f"{key}-shm", b"x") < 0
        over_shm.close()
        monkeypatch.setenv("MOORING_TRANSPORT", "carrier-pigeon")
        store = MooncakeDistributedStore()
        args = ("127.0.0.1", "P2PHANDSHAKE", 0, "16MB", "tcp", "", master.address)
        assert store.setup(*args) == int(ErrorCode.INVALID_PARAMS)
    finally:
        node.stop()
        master.stop()


def test_calls_before_setup_answer_codes():
    store = MooncakeDistributedStore()
    bad = int(ErrorCode.INVALID_PARAMS)
    assert store.put("k", b"v") == bad
    assert store.get("k") == b""
    assert store.get_size("k") == bad
    assert store.is_exist("k") == bad
    assert store.batch_is_exist(["a", "b"]) == [bad, bad]
    assert store.get_batch(["a", "b"]) == [b"", b""]
    assert store.get_buffer("k") is None
    assert store.get_hostname() == ""
    assert store.close() == 0


# ---- put, get, exist, size, remove -------------------------------------------------------------


def test_put_get_and_friends(shared, key):
    assert shared.put(key, b"hello") == 0
    # Mooncake's put convention: an existing key keeps its value, and the put answers 0.
    assert shared.put(key, b"again") == 0
    assert shared.get(key) == b"hello"
    assert shared.get(key + "-missing") == b""
    assert shared.get_size(key) == 5
    assert shared.get_size(key + "-missing") == ErrorCode.OBJECT_NOT_FOUND
    assert shared.is_exist(key) == 1
    assert shared.is_exist(key + "-missing") == 0
    assert shared.batch_is_exist([key, key + "-missing", key]) == [1, 0, 1]
    assert shared.batch_is_exist([]) == []
    assert shared.put("", b"x") == ErrorCode.INVALID_PARAMS
    # As Mooncake's: a put of nothing stores nothing and answers 0 (with a warning).
    assert shared.put(key + "-empty", b"") == 0
    assert shared.put_parts(key + "-empty", b"", bytearray()) == 0
    assert shared.is_exist(key + "-empty") == 0


def test_values_of_every_bytes_like_kind(shared, key):
    values = {
        "bytes": b"\x00\x01\x02" * 100,
        "bytearray": bytearray(b"abc" * 50),
        "memoryview": memoryview(b"xyz" * 70),
        "numpy": np.arange(1000, dtype=np.float32),
        "array": array.array("i", range(64)),
    }
    for kind, value in values.items():
        assert shared.put(f"{key}-{kind}", value) == 0, kind
        assert shared.get(f"{key}-{kind}") == memoryview(value).tobytes(), kind
    with pytest.raises(TypeError):
        shared.put(f"{key}-str", "not bytes")
    strided = np.arange(100, dtype=np.uint8)[::2]
    with pytest.raises(BufferError):
        shared.put(f"{key}-strided", strided)


def test_remove_while_leased_then_after(master, key):
    store = connect(master)
    try:
        assert store.put(key, b"v") == 0
        assert store.get(key) == b"v"  # takes a 5 s lease
        assert store.remove(key) == ErrorCode.OBJECT_HAS_LEASE
        assert store.remove(key + "-missing") == ErrorCode.OBJECT_NOT_FOUND
        assert store.put(key + "-unread", b"v") == 0
        assert store.remove(key + "-unread") == 0
        assert store.is_exist(key + "-unread") == 0
    finally:
        store.close()


def test_remove_by_regex_all_and_batch(master):
    store = connect(master)
    try:
        for i in range(5):
            assert store.put(f"rx-{i}", b"v") == 0
            assert store.put(f"other-{i}", b"v") == 0
        assert store.remove_by_regex("^rx-[0-2]$") == 3
        assert store.batch_is_exist([f"rx-{i}" for i in range(5)]) == [0, 0, 0, 1, 1]
        assert store.remove_by_regex("([unclosed") == ErrorCode.INVALID_PARAMS
        # is_exist, like get, leases what it finds: a key nobody asked about goes at once.
        assert store.put("rx-unasked", b"v") == 0
        assert store.batch_remove(["rx-unasked", "rx-3", "rx-missing"]) == [
            0,
            ErrorCode.OBJECT_HAS_LEASE,
            ErrorCode.OBJECT_NOT_FOUND,
        ]
        assert store.batch_remove([]) == []
        # remove_all takes what no reader holds: the five "other" keys at least.
        assert store.remove_all() >= 5
        assert store.is_exist("other-0") == 0
    finally:
        store.close()


# ---- upsert and replicate configs ----------------------------------------------------------------


def test_upsert_replaces_and_checks_soft_pin_ttl(shared, key):
    assert shared.upsert(key, b"one") == 0
    assert shared.upsert(key, b"two!") == 0
    assert shared.get(key) == b"two!"
    for action in (SoftPinAction.PRESERVE, SoftPinAction.DISABLE):
        config = ReplicateConfig()
        config.soft_pin_action = action
        config.soft_pin_ttl_ms = 1000
        assert shared.upsert(key, b"three", config) == ErrorCode.INVALID_PARAMS
        assert shared.put(key + "-new", b"x", config) == ErrorCode.INVALID_PARAMS
    config = ReplicateConfig()
    config.soft_pin_action = SoftPinAction.ENABLE
    config.soft_pin_ttl_ms = 1000
    assert shared.upsert(key, b"three", config) == 0
    assert shared.get(key) == b"three"
    config.soft_pin_ttl_ms = 2**64 - 1  # a valid uint64 the master refuses: too long
    assert shared.upsert(key, b"four", config) == ErrorCode.INVALID_PARAMS


def test_replicate_config_fields():
    config = ReplicateConfig()
    assert config.replica_num == 1
    assert config.soft_pin_action == SoftPinAction.PRESERVE
    assert config.soft_pin_ttl_ms is None
    for bad in (-1, 2**64, 1.5, "10"):
        with pytest.raises(TypeError):
            config.soft_pin_ttl_ms = bad
    config.soft_pin_ttl_ms = 2**64 - 1
    config.soft_pin_ttl_ms = None
    config.with_soft_pin = True
    assert config.soft_pin_action == SoftPinAction.ENABLE and config.with_soft_pin
    config.with_hard_pin = True
    config.preferred_segment = "127.0.0.1:12345"
    config.replica_num = 2
    text = str(config)
    for part in ("replica_num=2", "ENABLE", "with_hard_pin=True", "127.0.0.1:12345"):
        assert part in text, text
    assert [a.name for a in SoftPinAction] == ["PRESERVE", "ENABLE", "DISABLE"]


def test_pins_and_preferred_segment(shared, key):
    config = ReplicateConfig()
    config.with_hard_pin = True
    config.preferred_segment = shared.get_hostname()
    assert shared.put(key, b"pinned", config) == 0
    [replica] = shared.get_replica_desc(key)
    assert replica.transport_endpoint == shared.get_hostname()
    assert replica.is_memory_replica() and not replica.is_disk_replica()
    assert replica.status == ReplicaStatus.COMPLETE and replica.size == 6
    descs = shared.batch_get_replica_desc([key, key + "-missing"])
    assert list(descs) == [key]
    assert shared.get_replica_desc(key + "-missing") == []


def test_prefer_alloc_in_same_node_places_the_replica_in_this_process(master, key):
    stores = [connect(master, segment="16MB") for _ in range(3)]
    try:
        config = ReplicateConfig()
        config.prefer_alloc_in_same_node = True
        # Each store's puts land in its own segment, though others (these and the session's
        # shared store's) have room.
        for n, store in enumerate(stores):
            assert store.put(f"{key}-{n}", b"here", config) == 0
            [replica] = store.get_replica_desc(f"{key}-{n}")
            assert replica.transport_endpoint == store.get_hostname()
        # A store without a segment has no own node to prefer: the put still lands.
        reader = connect(master, segment=0)
        try:
            assert reader.put(f"{key}-reader", b"anywhere", config) == 0
            [replica] = reader.get_replica_desc(f"{key}-reader")
            assert replica.status == ReplicaStatus.COMPLETE
        finally:
            reader.close()
    finally:
        for store in stores:
            store.close()


def test_copy_and_move_tasks_run_in_the_background_and_are_queried(master, key):
    stores = [connect(master, segment="16MB") for _ in range(3)]
    a, b, c = stores
    try:
        config = ReplicateConfig()
        config.preferred_segment = a.get_hostname()
        value = pattern(3 * MIB)
        assert a.put(key, value, config) == 0

        def finished(task_id):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                report, code = a.query_task(task_id)
                assert code == 0 and report is not None
                if report.status != TaskStatus.PROCESSING:
                    return report
                time.sleep(0.005)
            raise AssertionError(f"task {task_id} still running")

        task_id, code = a.create_copy_task(key, [b.get_hostname()])
        assert code == 0 and task_id[1] > 0
        report = finished(task_id)
        assert report.status == TaskStatus.SUCCESS and report.message == ""
        assert report.type == TaskType.REPLICA_COPY and report.key == key
        assert report.id == task_id
        assert report.created_at_ms_epoch <= report.last_updated_at_ms_epoch
        assert abs(report.created_at_ms_epoch - time.time() * 1000) < 60_000
        endpoints = {r.transport_endpoint for r in a.get_replica_desc(key)}
        assert endpoints == {a.get_hostname(), b.get_hostname()}

        task_id, code = b.create_move_task(key, a.get_hostname(), c.get_hostname())
        assert code == 0
        report = finished(task_id)
        assert report.status == TaskStatus.SUCCESS and report.type == TaskType.REPLICA_MOVE
        endpoints = {r.transport_endpoint for r in a.get_replica_desc(key)}
        assert endpoints == {b.get_hostname(), c.get_hostname()}
        assert a.get(key) == value

        # Refused before anything runs, and tasks the master never started.
        assert a.create_copy_task(key, [b.get_hostname()]) == (
            (0, 0),
            ErrorCode.REPLICA_ALREADY_EXISTS,
        )
        assert a.create_move_task(key + "-missing", "x", "y")[1] == ErrorCode.OBJECT_NOT_FOUND
        assert a.query_task((0, 987_654)) == (None, ErrorCode.OBJECT_NO_REPLICATION_TASK)
        assert a.query_task(task_id[1])[0].status == TaskStatus.SUCCESS
    finally:
        for store in stores:
            store.close()


def test_is_exist_with_prefetch_brings_a_disk_only_value_back_into_memory(tmp_path, key):
    # Write-through: every value gets its disk copy, whatever evicts it from memory.
    master = Master("--lease-ttl", "200ms", "--offload-write-through")
    node = Node(master, "--size", "4MiB", "--no-prefault", "--disk-dir", str(tmp_path))
    store = connect(master, segment=0)
    try:
        # 40 values of 256 KiB through a 4 MiB segment: most end up only on the node's disk.
        # A put that finds memory full of values still waiting for their disk copy is refused
        # (-200) rather than dropping one of them; it goes through once the node copied them.
        values = {f"{key}/{i}": pattern(256 << 10, seed=i) for i in range(40)}
        refused = 0
        for k, v in values.items():
            deadline = time.monotonic() + 20
            while (code := store.put(k, v)) == ErrorCode.NO_AVAILABLE_HANDLE:
                assert time.monotonic() < deadline, "the node never copied the values to disk"
                refused += 1
                time.sleep(0.02)
            assert code == 0

        def on_disk_only(k):
            replicas = store.get_replica_desc(k)
            return bool(replicas) and all(r.is_local_disk_replica() for r in replicas)

        deadline = time.monotonic() + 20
        while not on_disk_only(f"{key}/0") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert on_disk_only(f"{key}/0"), store.get_replica_desc(f"{key}/0")
        assert store.is_exist(f"{key}/0") == 1  # a plain probe leaves it where it is
        assert on_disk_only(f"{key}/0")

        def promoted(probe, k):
            """Probes with prefetch until `k` has a memory replica beside its disk copy: the
            promotion is best effort, and is skipped while memory is full of values still
            waiting for their disk copies."""
            deadline = time.monotonic() + 20
            while True:
                probe()
                media = {r.is_memory_replica() for r in store.get_replica_desc(k)}
                if media == {True, False}:
                    return
                assert time.monotonic() < deadline, store.get_replica_desc(k)
                time.sleep(0.05)

        def probe():
            assert store.is_exist(f"{key}/0", prefetch=True) == 1

        promoted(probe, f"{key}/0")
        assert store.get(f"{key}/0") == values[f"{key}/0"]

        assert store.is_exist(key + "-absent", prefetch=True) == 0
        disk_only = next(k for k in list(values)[1:] if on_disk_only(k))

        def batch_probe():
            assert store.batch_is_exist([disk_only, key + "-absent"], prefetch=True) == [1, 0]

        promoted(batch_probe, disk_only)
        # Nothing was lost to the burst.
        assert all(store.get(k) == v for k, v in values.items())
        assert refused > 0, "the burst never filled memory: the test proves nothing about it"
    finally:
        store.close()
        node.stop()
        master.stop()


# ---- batches ---------------------------------------------------------------------------------


def test_put_batch_get_batch_upsert_batch(shared, key):
    keys = [f"{key}-{i}" for i in range(10)]
    values = [pattern(1000 + i, i) for i in range(10)]
    assert shared.put_batch(keys, values) == 0
    assert shared.get_batch(keys + [key + "-missing"]) == values + [b""]
    assert shared.put_batch(keys[:2], [b"x", b"y"]) == 0  # existing keys keep their values
    assert shared.get_batch(keys[:2]) == values[:2]
    assert shared.upsert_batch(keys[:2], [b"a", b"b"]) == 0
    assert shared.get_batch(keys[:2]) == [b"a", b"b"]
    assert shared.put_batch(keys, values[:3]) == ErrorCode.INVALID_PARAMS
    assert shared.put_batch([], []) == 0
    assert shared.get_batch([]) == []


def test_put_parts_and_upsert_parts(shared, key):
    assert shared.put_parts(key, b"ab", bytearray(b"cd"), np.frombuffer(b"ef", dtype=np.uint8)) == 0
    assert shared.get(key) == b"abcdef"
    assert shared.upsert_parts(key, b"x", b"yz") == 0
    assert shared.get(key) == b"xyz"


def test_buffer_handles(shared, key):
    value = pattern(100_000, 7)
    assert shared.put(key, value) == 0
    handle = shared.get_buffer(key)
    assert isinstance(handle, BufferHandle)
    assert handle.size() == len(handle) == len(value)
    assert bytes(memoryview(handle)) == value
    assert ctypes.string_at(handle.ptr(), 16) == value[:16]
    assert np.frombuffer(handle, dtype=np.uint8).tobytes() == value
    with pytest.raises(TypeError):
        memoryview(handle)[0] = 1  # read-only
    assert shared.get_buffer(key + "-missing") is None
    handles = shared.batch_get_buffer([key, key + "-missing"])
    assert bytes(memoryview(handles[0])) == value and handles[1] is None


# ---- registered memory, zero-copy calls ----------------------------------------------------------


def test_put_from_and_get_into(shared, key):
    buf = registered(shared, 4 * MIB)
    buf[:MIB] = np.frombuffer(pattern(MIB, 1), dtype=np.uint8)
    base = buf.ctypes.data
    assert shared.put_from(key, base, MIB) == 0
    assert shared.get(key) == pattern(MIB, 1)
    assert shared.put_from(key, base + 1, MIB) == 0  # already stored: kept, as Mooncake's
    assert shared.get(key) == pattern(MIB, 1)
    assert shared.get_into(key, base + MIB, MIB) == MIB
    assert buf[MIB : 2 * MIB].tobytes() == pattern(MIB, 1)
    assert shared.get_into(key, base + MIB, MIB - 1) == ErrorCode.BUFFER_OVERFLOW
    assert shared.get_into(key + "-missing", base, MIB) == ErrorCode.OBJECT_NOT_FOUND
    # Outside any registered buffer, or running past its end: refused, never dereferenced.
    stray = np.zeros(MIB, dtype=np.uint8)
    assert shared.put_from(key + "-stray", stray.ctypes.data, MIB) == ErrorCode.INVALID_PARAMS
    assert shared.get_into(key, stray.ctypes.data, MIB) == ErrorCode.INVALID_PARAMS
    assert shared.get_into(key, base + 3 * MIB + 1, MIB) == ErrorCode.INVALID_PARAMS
    assert shared.upsert_from(key, base + 2 * MIB, MIB) == 0
    assert shared.get_size(key) == MIB
    assert shared.unregister_buffer(base) == 0
    assert shared.unregister_buffer(base) == ErrorCode.INVALID_PARAMS
    assert shared.get_into(key, base, MIB) == ErrorCode.INVALID_PARAMS


def test_register_refuses_overlaps(shared):
    buf = np.zeros(8192, dtype=np.uint8)
    base = buf.ctypes.data
    assert shared.register_buffer(base, 4096) == 0
    assert shared.register_buffer(base, 4096) == 0  # the same region again is fine
    assert shared.register_buffer(base + 100, 8000) == ErrorCode.INVALID_PARAMS
    assert shared.register_buffer(0, 10) == ErrorCode.INVALID_PARAMS
    assert shared.unregister_buffer(base) == 0


def test_batch_put_from_and_get_into(shared, key):
    buf = registered(shared, 2 * MIB)
    base = buf.ctypes.data
    n, size = 8, 64 * 1024
    keys = [f"{key}-{i}" for i in range(n)]
    for i in range(n):
        buf[i * size : (i + 1) * size] = i + 1
    ptrs = [base + i * size for i in range(n)]
    assert shared.batch_put_from(keys, ptrs, [size] * n) == [0] * n
    assert shared.batch_put_from(keys[:2], ptrs[2:4], [size] * 2) == [0, 0]  # kept as stored
    out = [base + MIB + i * size for i in range(n)]
    assert shared.batch_get_into(keys, out, [size] * n) == [size] * n
    assert (buf[MIB : MIB + n * size] == buf[: n * size]).all()
    # One result per key, and one bad key fails alone.
    got = shared.batch_get_into(keys[:2] + [key + "-missing"], out[:3], [size, size - 1, size])
    assert got == [size, ErrorCode.BUFFER_OVERFLOW, ErrorCode.OBJECT_NOT_FOUND]
    # Mismatched lengths: a negative code for every key; empty lists: [].
    assert shared.batch_put_from(keys, ptrs[:3], [size] * n) == [ErrorCode.INVALID_PARAMS] * n
    assert shared.batch_get_into(keys, out, [size]) == [ErrorCode.INVALID_PARAMS] * n
    assert shared.batch_put_from([], [], []) == []
    assert shared.batch_get_into([], [], []) == []
    # Two keys read into overlapping bytes: refused rather than raced.
    assert (
        shared.batch_get_into(keys[:2], [out[0], out[0] + 10], [size, size])
        == [ErrorCode.INVALID_PARAMS] * 2
    )
    assert shared.batch_upsert_from(keys[:1], ptrs[1:2], [size]) == [0]
    assert shared.get(keys[0]) == buf[size : 2 * size].tobytes()
    shared.unregister_buffer(base)


def test_multi_buffer_batches(shared, key):
    buf = registered(shared, MIB)
    base = buf.ctypes.data
    buf[:3000] = np.frombuffer(pattern(3000, 3), dtype=np.uint8)
    keys = [f"{key}-a", f"{key}-b"]
    ptrs = [[base, base + 1000], [base + 2000]]
    sizes = [[1000, 1000], [1000]]
    assert shared.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0, 0]
    assert shared.get(keys[0]) == pattern(3000, 3)[:2000]
    out = [[base + 10_000, base + 20_000], [base + 30_000]]
    assert shared.batch_get_into_multi_buffers(keys, out, sizes) == [2000, 1000]
    assert buf[10_000:11_000].tobytes() == pattern(3000, 3)[:1000]
    assert buf[20_000:21_000].tobytes() == pattern(3000, 3)[1000:2000]
    assert buf[30_000:31_000].tobytes() == pattern(3000, 3)[2000:3000]
    assert (
        shared.batch_put_from_multi_buffers(keys, ptrs[:1], sizes) == [ErrorCode.INVALID_PARAMS] * 2
    )
    shared.unregister_buffer(base)


def test_get_into_ranges(shared, key):
    value = pattern(10_000, 9)
    assert shared.put(key, value) == 0
    buf = registered(shared, 64 * 1024)
    base = buf.ctypes.data
    result = shared.get_into_ranges(
        [base],
        [[key, key + "-missing"]],
        [[[0, 100, 60_000], [0]]],
        [[[0, 5000, 0], [0]]],
        [[[100, 200, 10_000], [10]]],
    )
    # Buffer-major: [buffer][key][fragment]. The third fragment runs past the buffer.
    assert result == [[[100, 200, ErrorCode.INVALID_PARAMS], [ErrorCode.OBJECT_NOT_FOUND]]]
    assert buf[:100].tobytes() == value[:100]
    assert buf[100:300].tobytes() == value[5000:5200]
    past = shared.get_into_ranges([base], [[key]], [[[0]]], [[[9_990]]], [[[20]]])
    assert past == [[[ErrorCode.INVALID_PARAMS]]]
    # A key whose lists differ in length fails alone, shaped by its destination offsets (the
    # case of Mooncake's own test); a key with no fragments answers none.
    mismatched = shared.get_into_ranges(
        [base], [[key, key]], [[[0], []]], [[[0, 1], []]], [[[], []]]
    )
    assert mismatched == [[[ErrorCode.INVALID_PARAMS], []]]
    # A buffer whose lists do not give one entry per key fails whole, in the same shape.
    uneven = shared.get_into_ranges([base], [[key, key]], [[[0], [0, 8]]], [[[0]]], [[[4]]])
    assert uneven == [[[ErrorCode.INVALID_PARAMS], [ErrorCode.INVALID_PARAMS] * 2]]
    shared.unregister_buffer(base)


# ---- the local buffer --------------------------------------------------------------------------


def test_local_buffer_bounds_copying_calls(master, key):
    store = connect(master, segment="16MB", local=0)
    try:
        assert store.put(key, b"v") == ErrorCode.INVALID_PARAMS
        buf = registered(store, 4096)
        assert store.put_from(key, buf.ctypes.data, 4096) == 0
        assert store.get(key) == b""
        assert store.get_into(key, buf.ctypes.data, 4096) == 4096
    finally:
        store.close()
    store = connect(master, segment=0, local="1MB")
    try:
        assert store.put(key + "-big", b"x" * (MIB + 1)) == ErrorCode.INVALID_PARAMS
        assert store.put(key + "-fits", b"x" * MIB) == 0
    finally:
        store.close()


# ---- close, re-setup, threads ------------------------------------------------------------------


def test_close_unmounts_and_setup_works_again(master, key):
    owner = connect(master, segment="16MB")
    reader = connect(master, segment=0)
    try:
        config = ReplicateConfig()
        config.preferred_segment = owner.get_hostname()
        assert owner.put(key, b"only here", config) == 0
        assert reader.get(key) == b"only here"
        assert owner.close() == 0
        assert reader.is_exist(key) == 0
        assert reader.get(key) == b""
        assert (
            owner.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", master.address) == 0
        )
        assert owner.put(key, b"back") == 0
        assert reader.get(key) == b"back"
    finally:
        owner.close()
        reader.close()


def test_eight_threads_share_one_client(shared):
    errors: list[str] = []

    def work(t: int) -> None:
        for i in range(6):
            k = f"thread-{t}-{i}"
            value = pattern(MIB, t * 100 + i)
            if shared.put(k, value) != 0:
                errors.append(f"put {k}")
            elif shared.get(k) != value:
                errors.append(f"get {k}")
            if shared.remove(k) not in (0, ErrorCode.OBJECT_HAS_LEASE):
                errors.append(f"remove {k}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_health_check_sees_a_dead_master():
    m = Master()
    store = connect(m, segment=0)
    try:
        assert store.health_check() == 0
        m.stop()
        assert store.health_check() == 2
        assert store.put("after-death", b"v") < 0
    finally:
        store.close()
