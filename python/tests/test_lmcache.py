"""LMCache's server (MP mode) storing into a real Mooring cluster through its L2 adapters.

Every adapter here is made the way ``lmcache server --l2-adapter JSON`` makes it: the JSON
parsed by LMCache's ``parse_args_to_l2_adapters_config``, the adapter built by its factory
(``create_l2_adapter``: LMCache's ``native_plugin`` wrapper around ``MooringConnector``, or
its ``plugin`` loader building ``MooringL2Adapter``), and driven through LMCache's own L2
adapter test helpers (``lmcache.v1.check.check_mode_test_l2_adapter``: the memory objects,
the store, lookup-and-lock and load phases, each waiting on the adapter's eventfd). The last
test starts a real ``lmcache server`` process with the adapter and checks that it comes up
serving with Mooring as its L2.

LMCache 0.5.6 wants numpy<=2.2.6 and CUDA packages this machine does not need, so
scripts/test-python.sh installs it with --no-deps in a directory of its own and runs this
file in a second pytest with that directory on ``PYTHONPATH``. Without LMCache the tests are
skipped, with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import Master, Node, free_port

try:
    import torch
    from lmcache.v1.check.check_mode_test_l2_adapter import (
        _create_l1_memory_desc,
        _create_memory_obj,
        _run_load_phase,
        _run_lookup_phase,
        _run_store_phase,
    )
    from lmcache.v1.distributed.api import ObjectKey
    from lmcache.v1.distributed.l2_adapters import create_l2_adapter
    from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config
except Exception as e:  # noqa: BLE001 - any failure to import LMCache means: skip, saying why
    pytest.skip(
        f"LMCache is not importable ({e}); scripts/test-python.sh installs it",
        allow_module_level=True,
    )

from lmcache_objects import keys_for
from mooring.integrations.lmcache import MooringL2Adapter

MODEL = "mooring-test/model"
# 256 KiB objects: a chunk of 16 tokens of a small model's KV cache.
OBJ = 64 * 1024
DTYPE = torch.float32


def adapter_json(kind: str, master: Master, **params) -> str:
    names = {"native_plugin": "MooringConnector", "plugin": "MooringL2Adapter"}
    return json.dumps(
        {
            "type": kind,
            "module_path": "mooring.integrations.lmcache",
            "class_name": names[kind],
            "adapter_params": {"master": master.address, **params},
        }
    )


def make_adapter(kind: str, master: Master, l1: torch.Tensor, **params):
    """The adapter LMCache's server builds for ``--l2-adapter JSON``."""
    config = parse_args_to_l2_adapters_config(
        argparse.Namespace(l2_adapter=[adapter_json(kind, master, **params)])
    )
    assert len(config.adapters) == 1
    adapter = create_l2_adapter(config.adapters[0], l1_memory_desc=_create_l1_memory_desc(l1))
    assert isinstance(adapter, MooringL2Adapter) == (kind == "plugin")
    return adapter


def objects(l1: torch.Tensor, first: int, n: int, seed: int | None = None):
    """``n`` of LMCache's memory objects over slots ``first..first+n`` of the L1 buffer,
    filled with random bytes from ``seed`` (zeros without one)."""
    flat = l1.view(-1)
    objs = [
        _create_memory_obj(
            raw_data=flat[(first + i) * OBJ : (first + i + 1) * OBJ], obj_size=OBJ, dtype=DTYPE
        )
        for i in range(n)
    ]
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        for o in objs:
            o.tensor.view(torch.int32).copy_(
                torch.randint(-(2**31), 2**31 - 1, (OBJ,), generator=g, dtype=torch.int32)
            )
    return objs


def same(a, b) -> bool:
    """Whether two memory objects hold the same bytes (random bits include NaNs, so the
    tensors are compared as integers)."""
    return torch.equal(a.tensor.view(torch.int32), b.tensor.view(torch.int32))


def bits(bitmap, n: int) -> list[bool]:
    return [bitmap.test(i) for i in range(n)]


@pytest.fixture
def cluster():
    """A master (read leases of 300 ms) and one 32 MiB node, the values' only home (the
    server contributes none)."""
    master = Master("--lease-ttl", "300ms")
    node = Node(master, "--size", "32MiB", "--no-prefault")
    yield master, node
    node.stop()
    master.stop()


@pytest.mark.parametrize(
    "kind, params",
    [("native_plugin", {}), ("plugin", {}), ("plugin", {"segment_size": "16MB"})],
    ids=["native_plugin", "plugin", "plugin-contributing"],
)
def test_store_lookup_load_unlock_round_trip_byte_for_byte(cluster, kind, params):
    """With ``segment_size``, the server contributes memory from an in-process node too, and
    values are placed there or on the node process."""
    master, _ = cluster
    n = 16
    l1 = torch.empty(3 * n * OBJ, dtype=DTYPE)
    adapter = make_adapter(kind, master, l1, **params)
    try:
        keys = keys_for(f"round-trip-{kind}", n, MODEL)
        stored = objects(l1, 0, n, seed=1)

        _, found = _run_lookup_phase(adapter, keys)
        assert bits(found, n) == [False] * n
        adapter.submit_unlock(keys)

        _, ok = _run_store_phase(adapter, keys, stored)
        assert ok

        # Half present, half never stored: the bitmap says which.
        absent = keys_for(f"absent-{kind}", n // 2, MODEL)
        _, found = _run_lookup_phase(adapter, keys[: n // 2] + absent)
        assert bits(found, n) == [True] * (n // 2) + [False] * (n // 2)

        loaded = objects(l1, n, n)
        _, got = _run_load_phase(adapter, keys, loaded)
        assert bits(got, n) == [True] * n
        for a, b in zip(stored, loaded, strict=True):
            assert same(a, b)

        # A load of keys never stored fails them and writes nothing.
        empty = objects(l1, 2 * n, n // 2)
        _, got = _run_load_phase(adapter, absent, empty)
        assert bits(got, n // 2) == [False] * (n // 2)
        assert all(int(o.tensor.view(torch.int32).abs().sum()) == 0 for o in empty)
        adapter.submit_unlock(keys[: n // 2] + absent)
    finally:
        adapter.close()


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_plugin_lookup_holds_what_it_finds_and_unlock_releases_it(cluster):
    master, _ = cluster
    l1 = torch.empty(8 * OBJ, dtype=DTYPE)
    adapter = make_adapter("plugin", master, l1)
    connector = adapter._client
    try:
        keys = keys_for("holds", 4, MODEL)
        _, ok = _run_store_phase(adapter, keys, objects(l1, 0, 4, seed=2))
        assert ok
        # Two lookups of the first two keys, one of all four plus a missing one.
        _run_lookup_phase(adapter, keys[:2])
        _, found = _run_lookup_phase(adapter, keys + keys_for("holds-missing", 1, MODEL))
        assert bits(found, 5) == [True] * 4 + [False]
        assert connector.held() == 6
        # A held key cannot be deleted; LMCache's eviction delete leaves it be.
        adapter.delete(keys[:1])
        _, found = _run_lookup_phase(adapter, keys[:1])
        assert bits(found, 1) == [True]
        assert connector.held() == 7
        adapter.submit_unlock(keys[:1])
        adapter.submit_unlock(keys[:1])
        assert connector.held() == 5
        adapter.submit_unlock(keys + keys_for("holds-missing", 1, MODEL))
        adapter.submit_unlock(keys[:2])
        adapter.submit_unlock(keys[:1])
        assert connector.held() == 0
        # Released on the master too: once the lookup's read lease is over, a delete goes
        # through.
        time.sleep(0.5)
        adapter.delete(keys[:1])
        _, found = _run_lookup_phase(adapter, keys[:1])
        assert bits(found, 1) == [False]
    finally:
        adapter.close()


def test_plugin_lists_lmcache_keys_by_model_in_pages(cluster):
    master, _ = cluster
    l1 = torch.empty(8 * OBJ, dtype=DTYPE)
    adapter = make_adapter("plugin", master, l1)
    try:
        keys = keys_for("listing", 5, MODEL)
        _, ok = _run_store_phase(adapter, keys, objects(l1, 0, 5, seed=6))
        assert ok
        other = [ObjectKey(chunk_hash=b"\x01\x02", model_name="other/model", kv_rank=3)]
        _, ok = _run_store_phase(adapter, other, objects(l1, 5, 1, seed=7))
        assert ok
        seen, cursor = [], None
        while True:
            page = adapter.list_l2_keys(model_name=MODEL, page_size=2, cursor=cursor)
            assert len(page.entries) <= 2
            seen += page.entries
            cursor = page.next_page_token
            if cursor is None:
                break
        assert sorted(e.key.chunk_hash_hex for e in seen) == sorted(
            k.chunk_hash.hex() for k in keys
        )
        assert {e.size_bytes for e in seen} == {OBJ * 4}
        everything = adapter.list_l2_keys(page_size=100).entries
        assert {(e.key.model_name, e.key.kv_rank) for e in everything} == {
            (MODEL, 0),
            ("other/model", 3),
        }
    finally:
        adapter.close()


def test_eviction_cannot_take_a_locked_object(cluster):
    """The node holds 32 MiB; 40 MiB more are stored after two lookups of objects stored
    together: one through ``plugin`` (locked: held), one through ``native_plugin`` (a read
    lease only, over after 300 ms). The locked object survives and loads byte for byte; the
    other one, and the objects stored with them, are evicted."""
    master, _ = cluster
    l1 = torch.empty(24 * OBJ, dtype=DTYPE)
    adapter = make_adapter("plugin", master, l1)
    plain = make_adapter("native_plugin", master, l1)
    try:
        keys = keys_for("evict-first", 8, MODEL)
        first = objects(l1, 0, 8, seed=3)
        _, ok = _run_store_phase(adapter, keys, first)
        assert ok
        _, found = _run_lookup_phase(adapter, keys[:1])
        assert bits(found, 1) == [True]
        _, found = _run_lookup_phase(plain, keys[1:2])
        assert bits(found, 1) == [True]
        time.sleep(0.5)

        flood = objects(l1, 8, 8, seed=4)
        for round_ in range(40 * 1024 * 1024 // (8 * OBJ * 4)):
            _, ok = _run_store_phase(adapter, keys_for(f"evict-flood-{round_}", 8, MODEL), flood)
            assert ok, f"flood store {round_} refused"

        _, found = _run_lookup_phase(plain, keys)
        found = bits(found, 8)
        assert found[0], "the locked object was evicted"
        assert found[1:] == [False] * 7, "objects not locked survived a flood of 40 MiB"
        loaded = objects(l1, 16, 1)
        _, got = _run_load_phase(adapter, keys[:1], loaded)
        assert bits(got, 1) == [True]
        assert same(first[0], loaded[0])
        adapter.submit_unlock(keys[:1])
        assert adapter._client.held() == 0
    finally:
        plain.close()
        adapter.close()


def test_a_node_killed_mid_load_fails_its_keys_never_answers_wrong_bytes():
    """The node serves over TCP only, as to a server on another host (on the same host its
    memory would be mapped, and outlive it)."""
    master = Master()
    node = Node(master, "--size", "128MiB", "--no-prefault", "--transports", "tcp")
    n = 256  # 64 MiB per load
    l1 = torch.empty(2 * n * OBJ, dtype=DTYPE)
    adapter = make_adapter("plugin", master, l1)
    try:
        keys = keys_for("killed", n, MODEL)
        stored = objects(l1, 0, n, seed=5)
        _, ok = _run_store_phase(adapter, keys, stored)
        assert ok
        _, found = _run_lookup_phase(adapter, keys)
        assert bits(found, n) == [True] * n

        loaded = objects(l1, n, n)
        for o in loaded:
            o.tensor.fill_(-1.0)
        efd = adapter.get_load_event_fd()
        task = adapter.submit_load_task(keys, loaded)
        # Killed once the first bytes have landed in LMCache's buffers: mid-load.
        deadline = time.monotonic() + 30
        while all(float(o.tensor[-1]) == -1.0 for o in loaded) and time.monotonic() < deadline:
            pass
        os.kill(node.process.pid, signal.SIGKILL)
        node.process.wait()
        assert select.select([efd], [], [], 60)[0], "the load never completed"
        os.read(efd, 8)
        got = bits(adapter.query_load_result(task), n)
        for i, ok in enumerate(got):
            if ok:
                assert same(stored[i], loaded[i]), f"key {i}: wrong bytes"
        print(f"killed mid-load: {sum(got)} of {n} keys had arrived whole")

        # With the node gone every key fails, and none reports success.
        again = objects(l1, n, n)
        _, got = _run_load_phase(adapter, keys, again)
        assert bits(got, n) == [False] * n
        adapter.submit_unlock(keys)
    finally:
        adapter.close()
        master.stop()


class Server:
    """A real ``lmcache server`` process (engine-driven transfers, as on a CPU) with
    ``--l2-adapter`` ``spec``, answering HTTP on ``self.http``."""

    def __init__(self, spec: str, log) -> None:
        self.port, self.http = free_port(), free_port()
        self.log = log
        env = {**os.environ, "LMCACHE_DISABLE_BANNER": "1", "PYTHONUNBUFFERED": "1"}
        cmd = [
            sys.executable,
            "-c",
            "import sys; from lmcache.cli.main import main; sys.exit(main())",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(self.http),
            "--l1-size-gb",
            "0.0625",
            "--eviction-policy",
            "LRU",
            "--chunk-size",
            str(CHUNK),
            "--supported-transfer-mode",
            "engine_driven",
            "--disable-metrics",
            "--l2-adapter",
            spec,
        ]
        with open(log, "w") as out:
            self.process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.status = None
        wait_for(self._answered, timeout=120)
        text = log.read_text()
        assert self.process.poll() is None, f"lmcache server exited:\n{text[-4000:]}"
        assert self.status is not None, f"lmcache server did not answer in 120 s:\n{text[-4000:]}"

    def _answered(self) -> bool:
        if self.process.poll() is not None:
            return True
        try:
            self.status = self.get("/status")
            return True
        except OSError:
            return False

    def get(self, path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}{path}", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# The engines' KV cache: vLLM's per-layer [2, blocks, block size, heads, head size] (NHD).
CHUNK = 16
LAYERS, BLOCKS, HEADS, HEAD_SIZE = 2, 32, 4, 64


def test_lmcache_server_process_runs_with_mooring_as_its_l2(cluster, tmp_path):
    """``lmcache server --l2-adapter '{"type": "native_plugin", ...}'`` (and the ``plugin``
    form), a real process, comes up with Mooring as its L2 adapter: its ``/status`` reports
    the adapter healthy, and (``plugin``) its ``/cache/objects`` lists the chunks another
    LMCache instance stored into the cluster."""
    master, _ = cluster
    l1 = torch.empty(3 * OBJ, dtype=DTYPE)
    writer = make_adapter("plugin", master, l1)
    stored_keys = [
        ObjectKey(chunk_hash=bytes([i]) * 16, model_name="server/model", kv_rank=0)
        for i in range(3)
    ]
    try:
        _, ok = _run_store_phase(writer, stored_keys, objects(l1, 0, 3, seed=8))
        assert ok
    finally:
        writer.close()
    for kind, type_name in (("native_plugin", "MooringConnector"), ("plugin", "mooring")):
        server = Server(adapter_json(kind, master), tmp_path / f"server-{kind}.log")
        try:
            adapters = [a for a in find_dicts(server.status) if a.get("type") == type_name]
            assert adapters, f"no {type_name} L2 adapter in /status: {server.status}"
            assert all(a["is_healthy"] for a in adapters), adapters
            if kind == "plugin":
                # The server lists what another LMCache instance stored into Mooring.
                listed = server.get("/cache/objects?tier=l2&model_name=server%2Fmodel")
                hashes = sorted(e["key"]["chunk_hash_hex"] for e in listed["entries"])
                assert hashes == sorted(k.chunk_hash.hex() for k in stored_keys), listed
        finally:
            server.stop()


@pytest.mark.parametrize("kind", ["plugin", "native_plugin"])
def test_two_lmcache_servers_share_kv_through_mooring(cluster, tmp_path, kind):
    """Two ``lmcache server`` processes on one Mooring cluster, each with an engine driving it
    through LMCache's own vLLM-side MP adapters (``LMCacheMPWorkerAdapter``,
    ``LMCacheMPSchedulerAdapter``: what vLLM's ``LMCacheMPConnector`` runs) with CPU tensors
    as the KV cache. Engine A stores a prompt's blocks through server A, which stores them
    into L1 and from there into Mooring; engine B's lookup through server B (its L1 empty)
    finds them in Mooring (lookup-and-lock), server B loads them into its L1, and engine B
    retrieves them into other blocks of its own KV cache: byte for byte A's."""
    import zmq
    from lmcache.integration.vllm.vllm_multi_process_adapter import (
        LMCacheMPSchedulerAdapter,
        LMCacheMPWorkerAdapter,
        LoadStoreOp,
        ParallelStrategy,
    )

    master, _ = cluster
    context = zmq.Context()
    strategy = ParallelStrategy(
        mla_only=False, vllm_world_size=1, vllm_worker_id=0, tp_size=1, pp_size=1, n_servers=1
    )
    servers, engines = [], []

    def engine(server):
        url = f"tcp://127.0.0.1:{server.port}"
        worker = LMCacheMPWorkerAdapter(url, context, "shared/model", CHUNK, strategy)
        kv = {
            f"layer.{i}": torch.zeros(2, BLOCKS, CHUNK, HEADS, HEAD_SIZE, dtype=torch.float16)
            for i in range(LAYERS)
        }
        worker.register_kv_caches(kv, layout_hints={"kv_layout": "NHD"})
        scheduler = LMCacheMPSchedulerAdapter([url], context, "shared/model", CHUNK, strategy)
        engines.append((worker, scheduler))
        return worker, scheduler, kv

    try:
        for name in ("a", "b"):
            servers.append(Server(adapter_json(kind, master), tmp_path / f"server-{name}.log"))
        worker_a, _, kv_a = engine(servers[0])
        worker_b, scheduler_b, kv_b = engine(servers[1])

        tokens = list(range(1000, 1000 + 4 * CHUNK))
        g = torch.Generator().manual_seed(9)
        for t in kv_a.values():
            t.copy_(torch.randn(t.shape, generator=g).half())
        blocks_a, blocks_b = [3, 7, 11, 20], [30, 2, 17, 9]
        op = LoadStoreOp(token_ids=tokens, block_ids=[blocks_a], start=0, end=len(tokens))
        worker_a.submit_store_request("req-a", op, None)

        # Server A stores into Mooring in the background; B's lookups find more as it goes.
        hit, attempt = 0, 0

        def looked_up() -> bool:
            nonlocal hit, attempt
            attempt += 1
            scheduler_b.maybe_submit_lookup_request(f"req-b-{attempt}", tokens)
            result = None
            deadline = time.monotonic() + 10
            while result is None and time.monotonic() < deadline:
                result = scheduler_b.check_lookup_result(f"req-b-{attempt}")
                time.sleep(0.02)
            hit = result or 0
            return hit == len(tokens)

        assert wait_for(looked_up, timeout=60), f"server B found {hit} of {len(tokens)} tokens"
        op = LoadStoreOp(token_ids=tokens, block_ids=[blocks_b], start=0, end=hit)
        worker_b.submit_retrieve_request(f"req-b-{attempt}", op, None)
        assert wait_for(lambda: f"req-b-{attempt}" in (worker_b.get_finished(set())[1] or ()))
        assert not worker_b.error_block_ids
        for name in kv_a:
            a, b = kv_a[name][:, blocks_a], kv_b[name][:, blocks_b]
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), name
    finally:
        for worker, scheduler in engines:
            worker.shutdown()
            scheduler.shutdown()
        for server in servers:
            server.stop()
        context.term()


def find_dicts(tree) -> list[dict]:
    """Every dict inside a JSON tree."""
    found = []
    if isinstance(tree, dict):
        found.append(tree)
        tree = list(tree.values())
    if isinstance(tree, list):
        for item in tree:
            found.extend(find_dicts(item))
    return found
