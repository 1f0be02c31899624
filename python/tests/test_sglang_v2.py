"""The SGLang backend's hybrid-model (v2) calls, against a real master, driven by SGLang
0.5.23's own types: PoolTransfer, PoolHitPolicy and PoolName, its host pools built in CPU
memory (MHATokenToKVPoolHost for the KV, draft and sliding-window pools, MambaPoolHost for
Mamba state), and its hybrid cache controller's own backup, hit-query and prefetch code."""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from mooring.integrations import sglang as adapter
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer
from sglang.srt.mem_cache.hybrid_cache import hybrid_cache_controller as hcc
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from test_sglang import sglang_config, sglang_mha_host_pool

PAGE = 16  # tokens per page of the MHA pools
ALL = PoolHitPolicy.ALL_PAGES
TRAILING = PoolHitPolicy.TRAILING_PAGES


def mamba_host_pool(slots=16, layers=2):
    """SGLang's Mamba state host pool (one slot per page) over CPU state tensors."""
    info = MambaStateBufferInfo(
        temporal=torch.zeros(layers, slots, 2, 4, 4, dtype=torch.float32),
        conv=(torch.zeros(layers, slots, 8, 3, dtype=torch.bfloat16),),
    )
    return MambaPoolHost(
        info, 2.0, 0, device_capacity=slots, pin_memory=False, device="cpu", layout="page_first"
    )


class Pools:
    """One rank's host pools of a hybrid model: KV, a draft KV pool and a sliding-window pool
    (SGLang's MHA host pool each), and Mamba state."""

    def __init__(self) -> None:
        self.kv = sglang_mha_host_pool()[0]
        self.draft = sglang_mha_host_pool()[0]
        self.swa = sglang_mha_host_pool()[0]
        self.mamba = mamba_host_pool()
        self.by_name = {
            PoolName.KV: self.kv,
            PoolName.DRAFT: self.draft,
            PoolName.SWA: self.swa,
            PoolName.MAMBA: self.mamba,
        }

    def register(self, backend) -> None:
        """As SGLang's hybrid controller does: the KV pool, then each pool by name."""
        backend.register_mem_pool_host(self.kv)
        for name, pool in self.by_name.items():
            backend.register_mem_host_pool_v2(pool, name)
        backend.on_host_pools_registered()


def kv_indices(pages):
    """Host token indices of the MHA pools' pages."""
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE, dtype=torch.int64) for p in pages])


def slot(name, page):
    """Where page ``page`` starts in pool ``name``: a token index, or a Mamba slot."""
    return page if name == PoolName.MAMBA else page * PAGE


def fill(pool, index, value):
    """Sets every byte of the page at ``index`` to ``value`` (through SGLang's page calls)."""
    page = pool.get_data_page(index, flat=True)
    data = torch.full((page.numel() * page.element_size(),), value, dtype=torch.uint8)
    pool.set_from_flat_data_page(index, data.view(page.dtype))


def page_bytes(pool, index):
    return pool.get_data_page(index, flat=True).contiguous().view(torch.uint8)


def uniform(pool, index):
    """The one value every byte of the page holds, or None if they differ."""
    data = page_bytes(pool, index)
    return int(data[0]) if bool(torch.all(data == data[0])) else None


def connect(master, model, pools=None):
    config = sglang_config(
        model, interface_v1=1, master_server_address=master.address, global_segment_size="16MB"
    )
    backend = adapter.MooringStore(config, {})
    if pools is not None:
        pools.register(backend)
    return backend


def transfers(keys, src_page=0, mamba_slot=0, swa_window=2, mamba_pages=1, kv=True):
    """One write (or read) of ``keys``' pages at ``src_page`` on: KV and draft for every page,
    sliding-window state for the last ``swa_window``, Mamba state for the last
    ``mamba_pages`` (Mamba slots from ``mamba_slot``)."""
    n = len(keys)
    pages = list(range(src_page, src_page + n))
    out = [
        PoolTransfer(name=PoolName.DRAFT, host_indices=kv_indices(pages), keys=list(keys)),
    ]
    if kv:
        out.insert(0, PoolTransfer(name=PoolName.KV, host_indices=kv_indices(pages), keys=keys))
    if swa_window:
        out.append(
            PoolTransfer(
                name=PoolName.SWA,
                host_indices=kv_indices(pages[-swa_window:]),
                keys=list(keys[-swa_window:]),
                hit_policy=TRAILING,
            )
        )
    if mamba_pages:
        out.append(
            PoolTransfer(
                name=PoolName.MAMBA,
                host_indices=torch.arange(mamba_slot, mamba_slot + mamba_pages, dtype=torch.int64),
                keys=list(keys[-mamba_pages:]),
                hit_policy=TRAILING,
            )
        )
    return out


def test_v2_calls_are_there_for_sglangs_dynamic_loader():
    for method in (
        "register_mem_host_pool_v2",
        "on_host_pools_registered",
        "batch_exists_v2",
        "batch_get_v2",
        "batch_set_v2",
    ):
        assert callable(getattr(adapter.MooringStore, method)), method
    # Not SGLang's NotImplementedError stubs: the backend's own.
    assert adapter.MooringStore.batch_set_v2 is not adapter._Base.batch_set_v2


def test_a_hybrid_page_round_trips_across_every_pool(master):
    """KV, draft, sliding-window and Mamba parts of four pages, written in one batch_set_v2
    and read back byte for byte into other places of SGLang's host pools."""
    pools = Pools()
    backend = connect(master, "hybrid-round-trip", pools)
    try:
        keys = ["rt0", "rt1", "rt2", "rt3"]
        for p in range(4):
            for pool in (pools.kv, pools.draft, pools.swa):
                # A different byte per position, so a part landing in the wrong place shows.
                page = pool.get_data_page(p * PAGE, flat=True)
                n = page.numel() * page.element_size()
                data = (torch.arange(n) * 7 + p * 13 + id(pool) % 97).remainder(251)
                pool.set_from_flat_data_page(p * PAGE, data.to(torch.uint8).view(page.dtype))
        fill(pools.mamba, 0, 201)
        written = transfers(keys)
        assert backend.batch_set_v2(written) == {
            "kv": [True] * 4,
            "draft": [True] * 4,
            "swa": [True, True],
            "mamba": [True],
        }
        # Read into pages 8..11 and Mamba slot 5.
        got = backend.batch_get_v2(transfers(keys, src_page=8, mamba_slot=5))
        assert got == {"kv": [True] * 4, "draft": [True] * 4, "swa": [True] * 2, "mamba": [True]}
        for p in range(4):
            for pool in (pools.kv, pools.draft):
                assert torch.equal(page_bytes(pool, p * PAGE), page_bytes(pool, (8 + p) * PAGE))
        for p in (2, 3):
            assert torch.equal(
                page_bytes(pools.swa, p * PAGE), page_bytes(pools.swa, (8 + p) * PAGE)
            )
        assert torch.equal(page_bytes(pools.mamba, 0), page_bytes(pools.mamba, 5))
        assert not torch.equal(page_bytes(pools.swa, 0), page_bytes(pools.swa, 8 * PAGE))

        # A second write of the same pages is already stored: it succeeds without a rewrite.
        assert all(all(v) for v in backend.batch_set_v2(written).values())
        stats = backend.get_stats()
        assert stats.backup_pgs == [4, 4] and stats.prefetch_pgs == [4]

        # Mamba state the page's write does not hold is not read.
        fill(pools.mamba, 6, 0)
        miss = PoolTransfer(
            name=PoolName.MAMBA, host_indices=torch.tensor([6]), keys=["rt1"], hit_policy=TRAILING
        )
        assert backend.batch_get_v2([miss]) == {"mamba": [False]}
        assert uniform(pools.mamba, 6) == 0
    finally:
        backend.close()


def test_hit_policies_count_only_pages_with_every_pool_they_need(master):
    pools = Pools()
    backend = connect(master, "hybrid-policies", pools)
    try:
        keys = [f"hp{i}" for i in range(6)]
        # One write of six pages, carrying Mamba state at pages 2 and 5 (two backups ending
        # there) and sliding-window state at 4 and 5; the draft pool lacks page 3.
        write = [
            PoolTransfer(name=PoolName.KV, host_indices=kv_indices(range(6)), keys=keys),
            PoolTransfer(
                name=PoolName.DRAFT,
                host_indices=kv_indices([0, 1, 2, 4, 5]),
                keys=[keys[i] for i in (0, 1, 2, 4, 5)],
            ),
            PoolTransfer(name=PoolName.SWA, host_indices=kv_indices([4, 5]), keys=keys[4:]),
            PoolTransfer(
                name=PoolName.MAMBA,
                host_indices=torch.tensor([0, 1]),
                keys=[keys[2], keys[5]],
            ),
        ]
        assert all(all(v) for v in backend.batch_set_v2(write).values())

        def exists(n, *pool_transfers):
            return backend.batch_exists_v2(keys[:n] + ["hp-missing"], list(pool_transfers))

        mamba = PoolTransfer(name=PoolName.MAMBA, keys=["last"], hit_policy=TRAILING)
        draft = PoolTransfer(name=PoolName.DRAFT, keys=keys, hit_policy=ALL)
        swa = PoolTransfer(name=PoolName.SWA, keys=["a", "b"], hit_policy=TRAILING)

        # KV alone: the six pages, not the missing seventh.
        r = exists(6)
        assert (r.kv_hit_pages, r.restorable_prefix_pages) == (6, [1, 2, 3, 4, 5, 6])
        assert backend.batch_exists(keys + ["hp-missing"]) == 6
        # TRAILING_PAGES, window 1: prefixes ending where Mamba state is (3 and 6 pages).
        r = exists(6, mamba)
        assert r.kv_hit_pages == 6 and r.restorable_prefix_pages == [3, 6]
        assert r.extra_pool_hit_pages == {"kv": 6, "mamba": 6}
        # A prefix ending on a page without its Mamba state is not a hit: back to 3.
        r = backend.batch_exists_v2(keys[:5], [mamba])
        assert r.kv_hit_pages == 3 and r.restorable_prefix_pages == [3]
        # ALL_PAGES: every page up to the hit; the draft hole at page 3 cuts it to 3 pages.
        r = exists(6, draft)
        assert r.kv_hit_pages == 3 and r.extra_pool_hit_pages["draft"] == 3
        # TRAILING_PAGES, window 2: both of the last two pages; only the 6-page prefix.
        r = exists(6, swa)
        assert r.kv_hit_pages == 6 and r.restorable_prefix_pages == [6]
        # Every pool at once: the prefixes all of them allow.
        r = exists(6, draft, mamba)
        assert r.kv_hit_pages == 3 and r.restorable_prefix_pages == [3]
        r = exists(6, draft, swa)
        assert r.kv_hit_pages == 0 and r.restorable_prefix_pages == []
        # No KV page, no hit, whatever the other pools hold.
        r = backend.batch_exists_v2(["hp-missing", *keys], [mamba])
        assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (0, {})

        # A part gone from the cluster (evicted) makes its page miss that pool, though the
        # page's marker still names it.
        version = backend._versions([("hp5", backend._shard("mamba"))])[("hp5", "@tp0of1")]
        part = backend._part_key(("hp5", "@tp0of1"), "mamba", version.write)
        # The hit queries above leased it for a while (every existence check does).
        deadline = time.monotonic() + 30
        while backend.store.remove(part) != 0:
            assert time.monotonic() < deadline, "the part stayed leased"
            time.sleep(0.5)
        r = exists(6, mamba)
        assert r.restorable_prefix_pages == [3]
        got = backend.batch_get_v2(
            [PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([7]), keys=["hp5"])]
        )
        assert got == {"mamba": [False]}

        with pytest.raises(ValueError, match="-600"):
            backend.batch_exists_v2(
                keys, [PoolTransfer(name=PoolName.DRAFT, hit_policy=PoolHitPolicy.BLOCK_GROUPS)]
            )
    finally:
        backend.close()


def test_a_write_cut_short_is_never_seen(master, monkeypatch):
    """Parts stored without their marker (a writer dying between them) are invisible; a page
    whose Mamba part could not be written is a hit only for readers not needing it there."""
    pools = Pools()
    backend = connect(master, "hybrid-cut-short", pools)
    try:
        keys = ["cs0", "cs1"]
        fill(pools.kv, 0, 1)
        # The marker never lands: every part was stored, none may be used.
        monkeypatch.setattr(backend.store, "put_batch", lambda keys, values, config=None: -500)
        assert backend.batch_set_v2(transfers(keys)) == {
            "kv": [False, False],
            "draft": [False, False],
            "swa": [False, False],
            "mamba": [False],
        }
        monkeypatch.undo()
        mamba = PoolTransfer(name=PoolName.MAMBA, keys=["x"], hit_policy=TRAILING)
        assert backend.batch_exists_v2(keys, [mamba]).kv_hit_pages == 0
        assert backend.batch_exists(keys) == 0
        fill(pools.kv, 8 * PAGE, 0)
        assert backend.batch_get_v2(transfers(keys, src_page=8, mamba_slot=5))["kv"] == [
            False,
            False,
        ]
        assert uniform(pools.kv, 8 * PAGE) == 0

        # A write whose Mamba transfer is broken (indices for two pages, one key) stores
        # the other pools of the page and says the Mamba part failed.
        broken = transfers(keys)
        broken[-1].host_indices = torch.tensor([0, 1])
        assert backend.batch_set_v2(broken) == {
            "kv": [True, True],
            "draft": [True, True],
            "swa": [True, True],
            "mamba": [False],
        }
        assert backend.batch_exists(keys) == 2
        r = backend.batch_exists_v2(keys, [mamba])
        assert r.kv_hit_pages == 0 and r.restorable_prefix_pages == []

        # A later write holding every pool replaces it; now the page is whole.
        assert all(all(v) for v in backend.batch_set_v2(transfers(keys)).values())
        r = backend.batch_exists_v2(keys, [mamba])
        assert r.kv_hit_pages == 2 and r.restorable_prefix_pages == [2]
    finally:
        backend.close()


def test_hybrid_attach_without_interface_v1_is_refused(master):
    config = sglang_config(
        "no-v1", master_server_address=master.address, global_segment_size="16MB"
    )
    backend = adapter.MooringStore(config, {})
    try:
        pools = Pools()
        with pytest.raises(ValueError, match="interface_v1"):
            pools.register(backend)
    finally:
        backend.close()


def test_sidecar_reads_after_a_kv_read_stay_on_its_write(master):
    """A page replaced between a thread's KV read and its sidecar read (SGLang reads KV with
    batch_get_v1, the other pools with batch_get_v2 after): the sidecars still come from
    the write the KV came from."""
    reader_pools, first_pools, second_pools = Pools(), Pools(), Pools()
    reader = connect(master, "pinned", reader_pools)
    first = connect(master, "pinned", first_pools)
    second = connect(master, "pinned", second_pools)
    try:
        keys = ["pin0"]
        for pools, byte in ((first_pools, 11), (second_pools, 22)):
            for pool in (pools.kv, pools.draft):
                fill(pool, 0, byte)
            fill(pools.mamba, 0, byte)
        # A backup passing through the page: KV and draft.
        assert all(
            all(v)
            for v in first.batch_set_v2(transfers(keys, swa_window=0, mamba_pages=0)).values()
        )
        assert reader.batch_get_v1(keys, kv_indices([4])) == [True]
        assert uniform(reader_pools.kv, 4 * PAGE) == 11
        # A backup ending there, with Mamba state too, replaces it.
        assert all(all(v) for v in second.batch_set_v2(transfers(keys, swa_window=0)).values())
        draft = PoolTransfer(name=PoolName.DRAFT, host_indices=kv_indices([4]), keys=keys)
        mamba = PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([4]), keys=keys)
        # The draft pages of the write the KV came from, and no Mamba state: it had none.
        assert reader.batch_get_v2([draft, mamba]) == {"draft": [True], "mamba": [False]}
        assert uniform(reader_pools.draft, 4 * PAGE) == 11
        # A new KV read moves to the new write, and its sidecars with it.
        assert reader.batch_get_v1(keys, kv_indices([5])) == [True]
        draft.host_indices = kv_indices([5])
        assert reader.batch_get_v2([draft, mamba]) == {"draft": [True], "mamba": [True]}
        assert uniform(reader_pools.kv, 5 * PAGE) == 22
        assert uniform(reader_pools.draft, 5 * PAGE) == 22
        assert uniform(reader_pools.mamba, 4) == 22
    finally:
        for backend in (reader, first, second):
            backend.close()


def test_interleaved_split_backups_end_as_one_write(master):
    """Two backups of a page in SGLang's order (sidecars with batch_set_v2, then KV with
    batch_set_v1), interleaved: X's sidecars, Y's sidecars and KV, X's KV. The page ends
    as Y's write in every pool, and both backups report success."""
    x_pools, y_pools, reader_pools = Pools(), Pools(), Pools()
    x = connect(master, "interleaved", x_pools)
    y = connect(master, "interleaved", y_pools)
    reader = connect(master, "interleaved", reader_pools)
    try:
        keys = ["il0", "il1"]
        for pools, byte in ((x_pools, 44), (y_pools, 55)):
            for p in range(2):
                fill(pools.kv, p * PAGE, byte)
                fill(pools.draft, p * PAGE, byte)
            fill(pools.mamba, 0, byte)
        sidecars_only = transfers(keys, swa_window=0, kv=False)
        assert x.batch_set_v2(sidecars_only) == {"draft": [True, True], "mamba": [True]}
        # X's KV has not come: the pages are no hit yet.
        assert reader.batch_exists(keys) == 0
        assert y.batch_set_v2(sidecars_only) == {"draft": [True, True], "mamba": [True]}
        assert y.batch_set_v1(keys, kv_indices([0, 1])) == [True, True]
        assert x.batch_set_v1(keys, kv_indices([0, 1])) == [True, True]
        mamba = PoolTransfer(name=PoolName.MAMBA, keys=["last"], hit_policy=TRAILING)
        assert reader.batch_exists_v2(keys, [mamba]).kv_hit_pages == 2
        got = reader.batch_get_v2(transfers(keys, src_page=6, mamba_slot=6, swa_window=0))
        assert got == {"kv": [True, True], "draft": [True, True], "mamba": [True]}
        for p in (6, 7):
            assert uniform(reader_pools.kv, p * PAGE) == 55
            assert uniform(reader_pools.draft, p * PAGE) == 55
        assert uniform(reader_pools.mamba, 6) == 55
    finally:
        for backend in (x, y, reader):
            backend.close()


# ---- SGLang's own hybrid cache controller --------------------------------------------------


def controller(backend, pools):
    """SGLang's HybridCacheController with only what its storage paths use: its own backup,
    hit-query and prefetch methods run unchanged against ``backend``."""
    ctrl = object.__new__(hcc.HybridCacheController)
    ctrl.page_size = PAGE
    ctrl.storage_backend = backend
    ctrl.storage_backend_type = "dynamic"
    # Its backup_skip reads this: every MHA rank writes its own shard.
    ctrl.storage_config = backend.storage_config
    # As attach_storage_backend picks them with interface_v1.
    ctrl.page_set_func = ctrl._page_set_zero_copy
    ctrl.page_get_func = ctrl._page_get_zero_copy
    ctrl.prefetch_sync_queue = queue.Queue()
    ctrl.mem_pool_host = SimpleNamespace(
        entry_map={name: SimpleNamespace(host_pool=pool) for name, pool in pools.by_name.items()}
    )
    return ctrl


def sidecars(mamba_slot):
    """The sidecar transfers of a Qwen3-Next-like model with a draft pool: draft KV riding
    on the KV pages, Mamba state for the last page."""
    return [
        PoolTransfer(name=PoolName.DRAFT, indices_from_pool=PoolName.KV, hit_policy=ALL),
        PoolTransfer(
            name=PoolName.MAMBA,
            host_indices=torch.tensor([mamba_slot]),
            keys=["placeholder"],
            hit_policy=TRAILING,
        ),
    ]


def backup(ctrl, keys, src_page=0, mamba_slot=0):
    """SGLang's backup of one node: sidecar pools with batch_set_v2, then KV with
    batch_set_v1, from its hybrid controller."""
    transfers = sidecars(mamba_slot)
    transfers[1].keys = keys[-1:]
    op = hcc.StorageOperation(
        kv_indices(range(src_page, src_page + len(keys))),
        list(range(len(keys) * PAGE)),
        hash_value=list(keys),
        prefix_keys=[],
        pool_transfers=transfers,
    )
    ctrl._page_backup_with_stable_layout(op)
    return op


def prefetch(ctrl, keys, dst_page, mamba_slot, monkeypatch_hash):
    """SGLang's prefetch of ``keys``: its hit query, then its transfer (KV with batch_get_v1,
    draft with batch_get_v2 per batch, Mamba after). Answers the hit in pages and the
    pools' hit counts the transfer acknowledged."""
    monkeypatch_hash(keys)
    op = hcc.PrefetchOperation(
        CacheRequestHandle(f"req-{dst_page}", 0),
        list(range(len(keys) * PAGE)),
        prefix_keys=[],
        pool_transfers=sidecars(mamba_slot),
    )
    op.pool_transfers[1].keys = keys[-1:]
    hashes, hit_tokens = ctrl._storage_hit_query(op)
    pages = hit_tokens // PAGE
    if pages == 0:
        return 0, {}
    op.hash_value = hashes
    op.host_indices = kv_indices(range(dst_page, dst_page + pages))
    ctrl._page_transfer_with_stable_layout(op)
    acks = []
    while not ctrl.prefetch_sync_queue.empty():
        acks.append(ctrl.prefetch_sync_queue.get())
    loaded = max(a.completed_tokens or 0 for a in acks) // PAGE
    pool_hits = next((a.pool_hits for a in acks if a.pool_hits is not None), {})
    return loaded, pool_hits


@pytest.fixture
def hash_as(monkeypatch):
    """Makes SGLang's page hashing (a C++ extension it would compile) answer given keys."""

    def set_keys(keys):
        monkeypatch.setattr(
            hcc, "get_storage_hash_str", lambda tokens, last, page_size=None: list(keys)
        )

    return set_keys


def test_sglangs_hybrid_controller_backs_up_and_prefetches_through_the_backend(master, hash_as):
    pools = Pools()
    backend = connect(master, "controller", pools)
    try:
        ctrl = controller(backend, pools)
        keys = [f"ctl{i}" for i in range(3)]
        for p in range(3):
            fill(pools.kv, p * PAGE, 10 + p)
            fill(pools.draft, p * PAGE, 20 + p)
        fill(pools.mamba, 0, 33)
        op = backup(ctrl, keys)
        assert op.completed_tokens == 3 * PAGE
        assert op.pool_storage_result.extra_pool_hit_pages == {"draft": 3, "mamba": 1}

        loaded, pool_hits = prefetch(
            ctrl, keys, dst_page=10, mamba_slot=4, monkeypatch_hash=hash_as
        )
        assert loaded == 3 and pool_hits == {"mamba": 1}
        for p in range(3):
            assert uniform(pools.kv, (10 + p) * PAGE) == 10 + p
            assert uniform(pools.draft, (10 + p) * PAGE) == 20 + p
        assert uniform(pools.mamba, 4) == 33

        # The first two pages alone end where no Mamba state was written: no hit.
        assert prefetch(ctrl, keys[:2], 20, 5, hash_as) == (0, {})
    finally:
        backend.close()


# ---- concurrent writers ----------------------------------------------------------------------

WRITERS = 3
ROUNDS = 12
PAGES = 3


def value(writer, rnd, page):
    """The byte every pool of a page holds in ``writer``'s write of round ``rnd``."""
    return 1 + (writer + WRITERS * (rnd * PAGES + page)) % 250


def check_page(loaded):
    """Loaded (pool, host pool, index) of one page: None if their bytes are one write's, else
    what was seen."""
    seen = [(name, uniform(pool, index)) for name, pool, index in loaded]
    values = {v for _, v in seen}
    return None if len(values) == 1 and None not in values else seen


def run_concurrently(writer_fn, reader_fn, readers=2):
    """Writers write rounds of the same keys at once (a barrier per round) while readers
    read them; answers the readers' (pages checked, mixes found)."""
    stop = threading.Event()
    barrier = threading.Barrier(WRITERS)
    reads: list[tuple[int, list]] = []
    errors: list[BaseException] = []

    def write(w):
        try:
            for rnd in range(ROUNDS):
                barrier.wait(timeout=60)
                writer_fn(w, rnd)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()

    def read(r):
        try:
            checked, mixes = 0, []
            while not stop.is_set():
                c, m = reader_fn(r)
                checked += c
                mixes += m
            reads.append((checked, mixes))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=read, args=(r,)) for r in range(readers)]
    for t in threads:
        t.start()
    writers = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    for t in writers:
        t.start()
    for t in writers:
        t.join(timeout=300)
    time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return sum(c for c, _ in reads), [m for _, ms in reads for m in ms]


def test_concurrent_writers_never_show_a_reader_a_mix(master):
    """Writers store the same pages with different bytes at the same moment; some write KV
    and draft only (a backup passing through), others every pool (a backup ending there),
    which replaces the former. Readers check each page they load holds one write's bytes in
    every pool, and that a hit the query promised loads whole."""
    writers = [(Pools(), None) for _ in range(WRITERS)]
    writers = [(p, connect(master, "mix", p)) for p, _ in writers]
    readers = [(Pools(), None) for _ in range(2)]
    readers = [(p, connect(master, "mix", p)) for p, _ in readers]
    rounds_done = [0]
    broken_hits = []
    try:

        def write(w, rnd):
            pools, backend = writers[w]
            keys = [f"mix{rnd}-{p}" for p in range(PAGES)]
            for p in range(PAGES):
                for pool in (pools.kv, pools.draft, pools.swa):
                    fill(pool, p * PAGE, value(w, rnd, p))
            fill(pools.mamba, 0, value(w, rnd, PAGES - 1))
            through = (w + rnd) % 3 == 0
            write = transfers(keys, mamba_pages=0 if through else 1, swa_window=0 if through else 2)
            result = backend.batch_set_v2(write)
            assert all(result["kv"]), result
            rounds_done[0] = max(rounds_done[0], rnd)

        def read(r):
            pools, backend = readers[r]
            rnd = rounds_done[0]
            keys = [f"mix{rnd}-{p}" for p in range(PAGES)]
            mamba = PoolTransfer(name=PoolName.MAMBA, keys=keys[-1:], hit_policy=TRAILING)
            swa = PoolTransfer(name=PoolName.SWA, keys=keys[-2:], hit_policy=TRAILING)
            draft = PoolTransfer(name=PoolName.DRAFT, keys=keys, hit_policy=ALL)
            hit = backend.batch_exists_v2(keys, [draft, swa, mamba])
            for p in range(PAGES):
                for pool in (pools.kv, pools.draft, pools.swa):
                    fill(pool, (10 + p) * PAGE, 0)
            fill(pools.mamba, 3, 0)
            want = transfers(keys, src_page=10, mamba_slot=3)
            got = backend.batch_get_v2(want)
            if hit.kv_hit_pages == PAGES and not all(all(v) for v in got.values()):
                broken_hits.append((keys, got))
            checked, mixes = 0, []
            for p in range(PAGES):
                loaded = []
                if got["kv"][p]:
                    loaded.append(("kv", pools.kv, (10 + p) * PAGE))
                if got["draft"][p]:
                    loaded.append(("draft", pools.draft, (10 + p) * PAGE))
                if p >= PAGES - 2 and got["swa"][p - (PAGES - 2)]:
                    loaded.append(("swa", pools.swa, (10 + p) * PAGE))
                if p == PAGES - 1 and got["mamba"][0]:
                    loaded.append(("mamba", pools.mamba, 3))
                if loaded:
                    checked += 1
                    bad = check_page(loaded)
                    if bad is not None:
                        mixes.append((keys[p], bad))
            return checked, mixes

        checked, mixes = run_concurrently(write, read)
        assert mixes == []
        assert broken_hits == []
        assert checked > 0
        # Every round ends whole: every pool of every page from one writer.
        pools, backend = readers[0]
        for rnd in range(ROUNDS):
            keys = [f"mix{rnd}-{p}" for p in range(PAGES)]
            got = backend.batch_get_v2(transfers(keys, src_page=10, mamba_slot=3))
            assert all(all(v) for v in got.values()), (rnd, got)
            for p in range(PAGES):
                loaded = [
                    ("kv", pools.kv, (10 + p) * PAGE),
                    ("draft", pools.draft, (10 + p) * PAGE),
                ]
                if p >= PAGES - 2:
                    loaded.append(("swa", pools.swa, (10 + p) * PAGE))
                if p == PAGES - 1:
                    loaded.append(("mamba", pools.mamba, 3))
                assert check_page(loaded) is None, (rnd, p)
                assert uniform(pools.kv, (10 + p) * PAGE) in {
                    value(w, rnd, p) for w in range(WRITERS)
                }
    finally:
        for _, backend in writers + readers:
            backend.close()


def test_concurrent_sglang_backups_never_show_a_prefetch_a_mix(master, monkeypatch):
    """SGLang's own controller code on every side: writers back the same nodes up at once
    (Mamba and draft with batch_set_v2, then KV with batch_set_v1), readers run its hit
    query and prefetch (KV with batch_get_v1, then draft and Mamba with batch_get_v2), and
    check the KV, draft and Mamba they load for a page are one write's."""
    writers = []
    for _ in range(WRITERS):
        pools = Pools()
        backend = connect(master, "ctl-mix", pools)
        writers.append((pools, backend, controller(backend, pools)))
    readers = []
    for _ in range(2):
        pools = Pools()
        backend = connect(master, "ctl-mix", pools)
        readers.append((pools, backend, controller(backend, pools)))
    rounds_done = [0]
    # The hit query hashes tokens; each reader thread says which keys it is asking for.
    asked = threading.local()
    monkeypatch.setattr(
        hcc, "get_storage_hash_str", lambda tokens, last, page_size=None: list(asked.keys)
    )

    def set_keys(keys):
        asked.keys = keys

    try:

        def write(w, rnd):
            pools, _, ctrl = writers[w]
            keys = [f"cm{rnd}-{p}" for p in range(PAGES)]
            for p in range(PAGES):
                fill(pools.kv, p * PAGE, value(w, rnd, p))
                fill(pools.draft, p * PAGE, value(w, rnd, p))
            fill(pools.mamba, 0, value(w, rnd, PAGES - 1))
            backup(ctrl, keys)
            rounds_done[0] = max(rounds_done[0], rnd)

        def read(r):
            pools, _, ctrl = readers[r]
            keys = [f"cm{rounds_done[0]}-{p}" for p in range(PAGES)]
            for p in range(PAGES):
                fill(pools.kv, (10 + p) * PAGE, 0)
                fill(pools.draft, (10 + p) * PAGE, 0)
            fill(pools.mamba, 3, 0)
            loaded, pool_hits = prefetch(ctrl, keys, 10, 3, set_keys)
            checked, mixes = 0, []
            for p in range(loaded):
                page = [("kv", pools.kv, (10 + p) * PAGE), ("draft", pools.draft, (10 + p) * PAGE)]
                if p == PAGES - 1 and pool_hits.get("mamba") == 1:
                    page.append(("mamba", pools.mamba, 3))
                checked += 1
                bad = check_page(page)
                if bad is not None:
                    mixes.append((keys[p], bad))
            return checked, mixes

        checked, mixes = run_concurrently(write, read)
        assert mixes == []
        assert checked > 0
        # Every node ends whole, and a prefetch of it loads one write's bytes everywhere.
        pools, _, ctrl = readers[0]
        for rnd in range(ROUNDS):
            keys = [f"cm{rnd}-{p}" for p in range(PAGES)]
            loaded, pool_hits = prefetch(ctrl, keys, 10, 3, set_keys)
            assert (loaded, pool_hits) == (PAGES, {"mamba": 1}), rnd
            page = [("kv", pools.kv, (12) * PAGE), ("draft", pools.draft, 12 * PAGE)]
            assert check_page([*page, ("mamba", pools.mamba, 3)]) is None, rnd
    finally:
        for _, backend, _ in writers + readers:
            backend.close()
