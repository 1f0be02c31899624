"""SGLang's built-in ``mooncake`` HiCache storage backend (``--hicache-storage-backend mooncake``,
``sglang/srt/mem_cache/storage/mooncake_store/``), unchanged, against a real Mooring master and
node through the ``mooncake.store`` name that ``python/mooncake-compat`` provides.

The compat package is installed as a user would, from a copy, into a directory of its own. The
SGLang part runs in a subprocess with only that directory added to ``PYTHONPATH`` (this file,
run as a script), so ``mooncake`` is importable there and nowhere else in the pytest process,
and the ``MOONCAKE_*`` environment variables SGLang reads are set for it alone.

Each scenario configures the backend the way SGLang's users do (its ``MOONCAKE_*`` environment
variables, its ``--hicache-storage-backend-extra-config`` dict, or the JSON file named by
``SGLANG_HICACHE_MOONCAKE_CONFIG_PATH``), with ``check_server`` on: before ``setup`` SGLang
polls the master's HTTP ``/get_all_segments`` (served on ``--metrics-listen``) until a segment
is listed, which is why a ``mooring node`` is started first. Backends are created by SGLang's
own ``StorageBackendFactory`` and given SGLang's own host pool with
``register_mem_pool_host``, as SGLang's cache controller does; pages written by one backend
(a store of its own) are found by ``batch_exists`` and read back byte for byte by another
(a second store, with a pool of its own). SGLang's backend moves pages only between its
registered host pool and the store, through the zero-copy calls (``batch_put_from`` /
``batch_get_into`` for an MHA pool in ``page_first`` layout, ``batch_put_from_multi_buffers`` /
``batch_get_into_multi_buffers`` for an MLA pool in ``layer_first`` layout); the tests record
which of them SGLang called (the recording passes every call through to Mooring's store) and
check each was used.

No GPU is needed: SGLang's host pools are built over device pools in CPU memory (SGLang's PyPI
build runs without a GPU). The copies between the GPU's KV cache and the host pool are SGLang's
own kernels in its cache controller, not part of the storage backend, and are not exercised
here; everything between the host pool and Mooring is.

Not covered: SGLang's ``standalone_storage`` mode (``MOONCAKE_STANDALONE_STORAGE``), which
needs Mooncake's ``MooncakeHostMemAllocator`` and ``setup_dummy`` (a client in another
process sharing memory with SGLang); Mooring's ``mooncake.store`` has neither.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Master, Node, free_port, install_compat

SEGMENT = 32 << 20  # each backend's contribution (SGLang reads an int, or "<n>gb")
ZERO_COPY_CALLS = (
    "batch_put_from",
    "batch_get_into",
    "batch_put_from_multi_buffers",
    "batch_get_into_multi_buffers",
)


# ---- the pytest side -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def compat_site(tmp_path_factory):
    """python/mooncake-compat installed into a directory of its own, from a copy."""
    if importlib.util.find_spec("sglang") is None:
        print("SKIPPED: SGLang is not installed (scripts/test-python.sh installs sglang==0.5.23)")
        pytest.skip("SGLang is not installed")
    return install_compat(tmp_path_factory)


@pytest.fixture(scope="module")
def cluster():
    """A master serving /get_all_segments, and a node whose segment check_server waits for."""
    metrics = free_port()
    master = Master("--metrics-listen", f"127.0.0.1:{metrics}")
    node = Node(master, "--size", "64MB")
    yield master, metrics
    node.stop()
    master.stop()


def run_scenario(scenario: str, compat_site: Path, env: dict) -> dict:
    """Runs ``scenario`` of this file in a subprocess that sees mooncake-compat; answers the
    JSON it reports."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MOONCAKE_")
        and k not in ("MOORING_TOKEN_FILE", "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH")
    }
    paths = [str(compat_site), clean.get("PYTHONPATH", "")]
    clean["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), scenario],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"{scenario} failed:\n{done.stdout}\n{done.stderr}"
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert len(reports) == 1, done.stdout
    return json.loads(reports[0].removeprefix("REPORT "))


def test_mha_pages_written_by_one_backend_are_read_by_another(compat_site, cluster):
    """MHA model, page_first host pool: the writer configured by MOONCAKE_* environment
    variables, the reader by SGLang's extra config."""
    master, metrics = cluster
    report = run_scenario(
        "mha",
        compat_site,
        {
            "MOONCAKE_MASTER": master.address,
            "MOONCAKE_PROTOCOL": "tcp",
            "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(SEGMENT),
            "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
            "MOONCAKE_CHECK_SERVER": "1",
            "MOONCAKE_MASTER_METRICS_PORT": str(metrics),
            "SCENARIO_METRICS_PORT": str(metrics),
        },
    )
    assert {"batch_put_from", "batch_get_into"} <= set(report["calls"]), report


def test_mla_layer_first_pages_move_through_the_multi_buffer_calls(compat_site, cluster, tmp_path):
    """MLA model, layer_first host pool (one object per page gathered from every layer):
    both backends configured by SGLang's config file."""
    master, metrics = cluster
    config = tmp_path / "mooncake.json"
    config.write_text(
        json.dumps(
            {
                "local_hostname": "127.0.0.1",
                "metadata_server": "P2PHANDSHAKE",
                "master_server_address": master.address,
                "protocol": "tcp",
                "global_segment_size": SEGMENT,
                "check_server": True,
                "master_metrics_port": metrics,
            }
        )
    )
    report = run_scenario("mla", compat_site, {"SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": str(config)})
    assert {"batch_put_from_multi_buffers", "batch_get_into_multi_buffers"} <= set(
        report["calls"]
    ), report


# ---- the subprocess side: SGLang, through mooncake.store ------------------------------------


def page_keys(prefix: str, n: int) -> list[str]:
    """Keys shaped like SGLang's (hex digests of the token prefix)."""
    return [hashlib.sha256(f"{prefix}-{i}".encode()).hexdigest() for i in range(n)]


def storage_config(model_name: str, mla: bool, extra: dict | None = None):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=True,
        is_page_first_layout=not mla,
        model_name=model_name,
        extra_config=extra,
    )


def mha_host_pool(layers=2, tokens=128, heads=2, dim=32, page=16):
    """SGLang's MHATokenToKVPoolHost, page_first, over a device pool in CPU memory."""
    import torch
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    def per_layer():
        return tuple(
            torch.zeros(tokens + page, heads, dim, dtype=torch.bfloat16) for _ in range(layers)
        )

    k, v = per_layer(), per_layer()
    ptrs = [torch.tensor([t.data_ptr() for t in side], dtype=torch.uint64) for side in (k, v)]
    device = MHABufferInfo(
        buffers=KVBuffers(
            k=k, v=v, k_data_ptrs=ptrs[0], v_data_ptrs=ptrs[1], layout=KVBufferLayout.NHD
        ),
        page_size=page,
        head_num=heads,
        head_dim=dim,
        v_head_dim=dim,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    pool = MHATokenToKVPoolHost(
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
    )
    return pool, (k, v)


def mla_host_pool(layers=3, tokens=128, lora=64, rope=16, page=16):
    """SGLang's MLATokenToKVPoolHost, layer_first, over a device pool in CPU memory."""
    import torch
    from sglang.srt.mem_cache.device_pool_info import MLABufferInfo
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    buffers = tuple(
        torch.zeros(tokens + page, 1, lora + rope, dtype=torch.bfloat16) for _ in range(layers)
    )
    device = MLABufferInfo(
        buffers=buffers,
        data_ptrs=torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64),
        layer_indices=tuple(range(layers)),
        device_layer_num=layers,
        page_size=page,
        kv_lora_rank=lora,
        qk_rope_head_dim=rope,
        kv_cache_dim=lora + rope,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    pool = MLATokenToKVPoolHost(
        device,
        2.0,
        0,
        page,
        "layer_first",
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=tokens,
        start_layer=0,
        end_layer=layers,
        target_layer_num=layers,
    )
    return pool, buffers


def tokens(pages, page_size):
    """Host pool indices of whole pages, as SGLang's cache controller passes them."""
    import torch

    return torch.cat(
        [torch.arange(p * page_size, (p + 1) * page_size, dtype=torch.int64) for p in pages]
    )


def token_bytes(pool, pages):
    """The bytes of ``pages`` in ``pool``: every K/V half or layer, tokens on dimension 1 of
    both layouts used here."""
    import torch

    page = pool.page_size
    raw = pool.kv_buffer.view(torch.uint8)
    return [raw[:, p * page : (p + 1) * page].clone() for p in pages]


def sglang_backend(config, pool, calls: list):
    """A backend made by SGLang's factory for ``--hicache-storage-backend mooncake``, with
    ``pool`` registered as SGLang's cache controller registers it. ``calls`` records the
    zero-copy calls SGLang makes on the store (each passed through unchanged)."""
    import mooncake.store
    import mooring.store
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    backend = StorageBackendFactory.create_backend("mooncake", config, pool)
    assert type(backend) is MooncakeStore, type(backend)
    # SGLang's store is Mooring's, through the compat package's name.
    assert mooncake.store.MooncakeDistributedStore is mooring.store.MooncakeDistributedStore
    assert type(backend.store) is mooring.store.MooncakeDistributedStore
    backend.register_mem_pool_host(pool)
    for name in ZERO_COPY_CALLS:
        real = getattr(backend.store, name)

        def recorded(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        setattr(backend.store, name, recorded)
    return backend


def fill(pool, seed: int) -> None:
    import torch

    raw = pool.kv_buffer.view(torch.uint8).view(-1)
    raw[:] = torch.randint(0, 256, raw.shape, generator=torch.Generator().manual_seed(seed)).to(
        torch.uint8
    )


def scenario_mha() -> dict:
    import torch

    calls: list[str] = []
    model = "org/mha-model"
    writer_pool, _ = mha_host_pool()
    writer = sglang_backend(storage_config(model, mla=False), writer_pool, calls)
    assert writer.config.master_server_address == os.environ["MOONCAKE_MASTER"]  # from env
    page = writer_pool.page_size

    reader_pool, _ = mha_host_pool()
    reader = sglang_backend(
        storage_config(
            model,
            mla=False,
            extra={
                "master_server_address": os.environ["MOONCAKE_MASTER"],
                "protocol": "tcp",
                "global_segment_size": SEGMENT,
                "check_server": True,
                "master_metrics_port": int(os.environ["SCENARIO_METRICS_PORT"]),
            },
        ),
        reader_pool,
        calls,
    )
    assert reader.store.get_hostname() != writer.store.get_hostname()  # two stores

    fill(writer_pool, seed=1)
    keys = page_keys("mha", 6)
    stored = keys[:5]
    # The writer backs up host pages 0..4 (SGLang's batch_set_v1: one K and one V object per
    # page, only those not stored yet, with batch_put_from from the registered pool).
    assert writer.batch_set_v1(stored, tokens(range(5), page)) == [True] * 5
    assert writer.get_stats().backup_pgs == [2 * 5]  # SGLang counts objects here
    # Written again: found by batch_is_exist, not put again.
    before = len(calls)
    assert writer.batch_set_v1(stored[:2], tokens(range(2), page)) == [True, True]
    assert calls[before:] == [] and writer.get_stats().backup_pgs == []
    # The objects, as Mooring holds them: "<model>_<key>_<tp rank>_k|v", a K or V half each.
    half = writer_pool.get_ksize_per_token() * page
    for key in stored:
        for part in ("k", "v"):
            assert writer.store.get_size(f"org-mha-model_{key}_0_{part}") == half
    # Page 4 loses its V half: a page counts only with both halves.
    assert writer.store.remove(f"org-mha-model_{stored[4]}_0_v") == 0

    # The reader finds the leading stored pages, and no more.
    assert reader.batch_exists(keys) == 4
    assert reader.batch_exists(stored[:2] + [keys[5]] + stored[2:]) == 2
    assert reader.batch_exists([keys[5]] + stored) == 0

    # ... and loads them into other pages of its own pool, byte for byte.
    reader_pool.kv_buffer.view(torch.uint8).fill_(0xEE)
    untouched = token_bytes(reader_pool, [6])[0]
    got = reader.batch_get_v1(keys[:4] + [keys[5]], tokens([2, 3, 4, 5, 6], page))
    assert got == [True, True, True, True, False], got
    for want, have in zip(
        token_bytes(writer_pool, range(4)), token_bytes(reader_pool, [2, 3, 4, 5])
    ):
        assert torch.equal(want, have)
    assert torch.equal(token_bytes(reader_pool, [6])[0], untouched)  # the missing page
    # The half-stored page is reported failed.
    assert reader.batch_get_v1([stored[4]], tokens([7], page)) == [False]
    assert reader.get_stats().prefetch_pgs == [5, 1]
    return {"calls": sorted(set(calls))}


def scenario_mla() -> dict:
    import torch

    calls: list[str] = []
    model = "org/mla-model"
    writer_pool, _ = mla_host_pool()
    writer = sglang_backend(storage_config(model, mla=True), writer_pool, calls)
    reader_pool, _ = mla_host_pool()
    reader = sglang_backend(storage_config(model, mla=True), reader_pool, calls)
    assert reader.store.get_hostname() != writer.store.get_hostname()
    assert writer.config.master_server_address == reader.config.master_server_address
    page = writer_pool.page_size

    fill(writer_pool, seed=2)
    reader_pool.kv_buffer.view(torch.uint8).fill_(0xEE)
    keys = page_keys("mla", 4)
    stored = keys[:3]
    assert writer.batch_set_v1(stored, tokens([1, 3, 5], page)) == [True] * 3
    # One object per page, gathered from every layer.
    per_page = writer_pool.layer_num * page * writer_pool.kv_cache_dim * 2
    assert writer.store.get_size(f"org-mla-model_{stored[0]}__k") == per_page

    assert reader.batch_exists(keys) == 3
    assert reader.batch_exists([keys[3]] + stored) == 0
    untouched = token_bytes(reader_pool, [7])[0]
    got = reader.batch_get_v1(keys, tokens([0, 2, 4, 7], page))
    assert got == [True, True, True, False], got
    for want, have in zip(token_bytes(writer_pool, [1, 3, 5]), token_bytes(reader_pool, [0, 2, 4])):
        assert torch.equal(want, have)
    assert torch.equal(token_bytes(reader_pool, [7])[0], untouched)
    return {"calls": sorted(set(calls))}


if __name__ == "__main__":
    scenarios = {"mha": scenario_mha, "mla": scenario_mla}
    print("REPORT " + json.dumps(scenarios[sys.argv[1]]()), flush=True)
