"""The SGLang HiCache backend end to end, with a host memory pool shaped like SGLang's and
with SGLang's own MHA host pool, and loaded by SGLang's own backend factory: each test runs
against a real master, and again against a real peer cluster (``peer://``, three `mooring
peer` processes), as SGLang would be pointed at either."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from mooring.integrations import sglang as adapter


@dataclass
class StorageConfig:
    """The fields of SGLang's HiCacheStorageConfig the backend reads."""

    tp_rank: int = 0
    tp_size: int = 1
    is_mla_model: bool = False
    enable_storage_metrics: bool = True
    model_name: str | None = "org/model-7b"
    extra_config: dict | None = None


class HostPool:
    """An MHA host KV pool in SGLang's page_first layout: ``kv_buffer[page]`` holds the page's
    K half then its V half, and ``get_page_buffer_meta`` answers two (address, size) pairs per
    page, as SGLang's MHATokenToKVPoolHost does."""

    def __init__(self, pages: int, page_size: int, half_bytes: int) -> None:
        self.page_size = page_size
        self.layout = "page_first"
        self.half = half_bytes
        self.kv_buffer = np.zeros((pages, 2 * half_bytes), dtype=np.uint8)

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for page in np.asarray(indices)[:: self.page_size] // self.page_size:
            start = self.kv_buffer[int(page)].ctypes.data
            ptrs += [start, start + self.half]
            sizes += [self.half, self.half]
        return ptrs, sizes

    def get_ksize_per_token(self):
        return 2 * self.half // self.page_size


def indices(pages, page_size):
    return np.concatenate([np.arange(p * page_size, (p + 1) * page_size) for p in pages])


@pytest.fixture(params=["master", "peers"])
def cluster(request):
    """The address of a master, or of a peer cluster."""
    return request.getfixturevalue(request.param).address


@pytest.fixture
def backend(cluster):
    config = StorageConfig(
        extra_config={"master_server_address": cluster, "global_segment_size": "32MB"}
    )
    # As SGLang's dynamic loader builds it: (storage_config, kwargs).
    store = adapter.MooringStore(config, {})
    yield store
    store.close()


def test_loadable_by_module_path_and_class_name():
    # SGLang's dynamic backend imports extra_config's module_path and takes class_name.
    module = importlib.import_module("mooring.integrations.sglang")
    cls = module.MooringStore
    for method in (
        "get",
        "batch_get",
        "set",
        "batch_set",
        "exists",
        "batch_exists",
        "clear",
        "get_stats",
        "batch_get_v1",
        "batch_set_v1",
        "register_mem_pool_host",
    ):
        assert callable(getattr(cls, method)), method


def sglang_config(model_name: str, **extra):
    """SGLang's own storage config for one rank of an MHA model, with ``extra`` as the
    backend's extra config."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=True,
        is_page_first_layout=True,
        model_name=model_name,
        extra_config=extra,
    )


def test_loaded_and_driven_by_sglang_itself(cluster):
    """SGLang's own factory (sglang 0.5.23, which the test command installs) loads the adapter
    as `--hicache-storage-backend dynamic` does, and its cache controller's generic page calls
    (a tensor per page) work through SGLang's base class."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    config = sglang_config(
        "org/sglang-itself",
        backend_name="mooring",
        module_path="mooring.integrations.sglang",
        class_name="MooringStore",
        interface_v1=1,
        master_server_address=cluster,
        global_segment_size="16MB",
    )
    backend = StorageBackendFactory.create_backend("dynamic", config, None)
    try:
        assert isinstance(backend, adapter.MooringStore) and isinstance(backend, HiCacheStorage)
        pages = [torch.randn(512, generator=torch.Generator().manual_seed(i)) for i in range(3)]
        keys = ["s0", "s1", "s2"]
        assert backend.batch_set(keys, [p.bfloat16() for p in pages])
        assert backend.batch_exists([*keys, "missing"]) == 3
        targets = [torch.empty(512, dtype=torch.bfloat16) for _ in range(4)]
        got = backend.batch_get([*keys, "missing"], targets)
        assert all(torch.equal(g, p.bfloat16()) for g, p in zip(got[:3], pages))
        assert got[3] is None
        assert backend.store.is_exist("org-sglang-itself/s0@tp0of1") == 1
    finally:
        backend.close()


def sglang_mha_host_pool(layers=2, tokens=256, heads=2, dim=16, page=16):
    """SGLang's own MHA host pool (page-first layout) over a device pool in CPU memory."""
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    def layer_buffers():
        return tuple(
            torch.zeros(tokens + page, heads, dim, dtype=torch.bfloat16) for _ in range(layers)
        )

    def pointers(buffers):
        return torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)

    k, v = layer_buffers(), layer_buffers()
    device = MHABufferInfo(
        buffers=KVBuffers(
            k=k, v=v, k_data_ptrs=pointers(k), v_data_ptrs=pointers(v), layout=KVBufferLayout.NHD
        ),
        page_size=page,
        head_num=heads,
        head_dim=dim,
        v_head_dim=dim,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    return MHATokenToKVPoolHost(
        device,
        2.0,
        0,
        page,
        "page_first",
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=tokens,
        start_layer=0,
        end_layer=layers,
    ), (k, v)


def test_pages_move_through_sglangs_own_host_pool(cluster):
    """The zero-copy page calls against SGLang's MHATokenToKVPoolHost: pages written from
    one place in the pool come back, byte for byte, into another."""
    pool, _device = sglang_mha_host_pool()
    config = sglang_config("own-pool", master_server_address=cluster, global_segment_size="16MB")
    backend = adapter.MooringStore(config, {})
    try:
        backend.register_mem_pool_host(pool)
        raw = pool.kv_buffer.view(torch.uint8)
        raw.view(-1)[:] = (
            torch.arange(raw.numel(), dtype=torch.int64).remainder(251).to(torch.uint8)
        )
        page = pool.page_size
        written = torch.arange(0, 2 * page, dtype=torch.int64)
        read = torch.arange(4 * page, 6 * page, dtype=torch.int64)
        assert backend.batch_set_v1(["q0", "q1"], written) == [True, True]
        assert backend.batch_exists(["q0", "q1", "q2"]) == 2
        assert not torch.equal(raw[:, 0 : 2 * page], raw[:, 4 * page : 6 * page])
        assert backend.batch_get_v1(["q0", "q1"], read) == [True, True]
        assert torch.equal(raw[:, 0 : 2 * page], raw[:, 4 * page : 6 * page])  # K and V halves
    finally:
        backend.close()


def test_pages_round_trip_through_the_host_pool(backend):
    page_size, half = 16, 32 * 1024
    pool = HostPool(pages=32, page_size=page_size, half_bytes=half)
    backend.register_mem_pool_host(pool)
    rng = np.random.default_rng(1)
    pool.kv_buffer[:8] = rng.integers(0, 256, pool.kv_buffer[:8].shape, dtype=np.uint8)
    written = pool.kv_buffer[:8].copy()
    keys = [f"hash-{i}" for i in range(8)]

    assert backend.batch_set_v1(keys, indices(range(8), page_size)) == [True] * 8
    # Writing pages already stored succeeds without rewriting them.
    assert backend.batch_set_v1(keys[:2], indices(range(2), page_size)) == [True] * 2
    assert backend.batch_exists(keys + ["hash-missing"]) == 8
    assert backend.batch_exists(["hash-missing"] + keys) == 0
    assert backend.exists("hash-3") and not backend.exists("hash-missing")

    # Read them into other pages of the pool.
    got = backend.batch_get_v1(keys + ["hash-missing"], indices(range(16, 25), page_size))
    assert got == [True] * 8 + [False]
    assert (pool.kv_buffer[16:24] == written).all()

    stats = backend.get_stats()
    assert stats.backup_pgs == [8, 2] and stats.prefetch_pgs == [9]
    assert all(b > 0 for b in stats.backup_bandwidth + stats.prefetch_bandwidth)
    assert backend.get_stats().backup_pgs == []  # reset by reading


def test_keys_are_isolated_by_model_and_rank(cluster):
    stores = []
    try:
        for rank in (0, 1):
            config = StorageConfig(
                tp_rank=rank,
                tp_size=2,
                extra_config={
                    "master_server_address": cluster,
                    "global_segment_size": "32MB",
                },
            )
            stores.append(adapter.MooringStore(config, {}))
        assert stores[0].set("page", b"rank zero's heads")
        assert not stores[1].exists("page")
        assert stores[1].set("page", b"rank one's heads")
        assert stores[0].get("page") == b"rank zero's heads"
        assert stores[1].get("page") == b"rank one's heads"
        mla = adapter.MooringStore(
            StorageConfig(
                is_mla_model=True,
                extra_config={
                    "master_server_address": cluster,
                    "global_segment_size": "32MB",
                },
            ),
            {},
        )
        stores.append(mla)
        assert mla.set("latent", b"shared by every rank")
        assert mla.exists("latent")
        assert mla.store.is_exist("org-model-7b/latent") == 1
    finally:
        for s in stores:
            s.close()


def test_older_calls_with_targets(backend):
    buf = np.zeros(1 << 16, dtype=np.uint8)
    base = buf.ctypes.data
    assert backend.store.register_buffer(base, buf.nbytes) == 0
    buf[:1000] = 7
    assert backend.set("t0", target_location=base, target_sizes=1000)
    assert backend.set("t0", target_location=base, target_sizes=1000)  # already there: fine
    assert backend.batch_set(["t1", "t2"], target_locations=[base, base], target_sizes=[1000, 1000])
    assert backend.get("t0", base + 4096, 1000) is True
    assert (buf[4096:5096] == 7).all()
    targets = [base + 8192, base + 9216, base + 10240, base + 11264]
    assert backend.batch_get(["t1", "t2", "nope", "t0"], targets, [1000] * 4) == 2
    assert backend.get("nope") is None
    assert backend.set("plain", b"bytes value") and backend.get("plain") == b"bytes value"
    backend.store.unregister_buffer(base)


def test_generic_page_calls_with_tensors(backend):
    """SGLang 0.5 calls batch_set/batch_get with a tensor per page when its extra config
    lacks interface_v1 (its cache controller's generic path)."""
    pages = [
        torch.randn(64, generator=torch.Generator().manual_seed(i)).bfloat16() for i in range(3)
    ]
    keys = ["g0", "g1", "g2"]
    assert backend.batch_set(keys, pages)
    targets = [torch.empty(64, dtype=torch.bfloat16) for _ in range(4)]
    got = backend.batch_get([*keys, "missing"], targets)
    assert got[0] is targets[0] and got[3] is None
    assert all(torch.equal(g, p) for g, p in zip(got[:3], pages))
    assert backend.get("g1", torch.zeros(64, dtype=torch.bfloat16)).equal(pages[1])
    assert backend.get("g1", torch.zeros(32, dtype=torch.bfloat16)) is None  # wrong size
    assert backend.get("g1", torch.zeros(64, 2, dtype=torch.bfloat16)[:, 0]) is None  # strided


def test_clear_removes_what_it_can(backend, cluster):
    assert backend.set("to-clear", b"x")
    backend.clear()
    if cluster.startswith("peer://"):
        # A peer cluster has no list of every key to remove: the call says so, nothing goes.
        assert backend.store.remove_all() == -1011
        assert backend.exists("to-clear")
    else:
        assert not backend.exists("to-clear")


@pytest.mark.parametrize("unreachable", ["127.0.0.1:1", "peer://127.0.0.1:1"])
def test_setup_failure_says_so(unreachable):
    config = StorageConfig(extra_config={"master_server_address": unreachable})
    with pytest.raises(RuntimeError, match="setup failed"):
        adapter.MooringStore(config, {})
