"""Mooring as an SGLang HiCache storage backend (the L3 tier under HiCache's host memory).

Load it through SGLang's dynamic storage backend::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "mooring",
            "module_path": "mooring.integrations.sglang", "class_name": "MooringStore",
            "interface_v1": 1, "master_server_address": "10.0.0.1:50051"}'

``interface_v1`` makes SGLang call the zero-copy page calls (``batch_set_v1`` /
``batch_get_v1``); without it SGLang 0.5 calls ``batch_set`` / ``batch_get`` with a tensor
per page, which work too, with a copy each way.

Configuration, from ``extra_config`` first, then the environment:

====================== ================================ ====================================
key                    environment                      default
====================== ================================ ====================================
master_server_address  MOORING_MASTER, MOONCAKE_MASTER  127.0.0.1:50051
local_hostname         MOORING_LOCAL_HOSTNAME           127.0.0.1
global_segment_size    MOORING_GLOBAL_SEGMENT_SIZE      0 (contribute no memory)
local_buffer_size      MOORING_LOCAL_BUFFER_SIZE        16MB
token_file             MOORING_TOKEN_FILE               none
====================== ================================ ====================================

Each page is one object whose value is the page's buffers (its K and V halves, or its one MLA
buffer) back to back, moved straight between the registered host pool and the nodes
(``batch_put_from_multi_buffers`` / ``batch_get_into_multi_buffers``). Keys carry the model
name and, for models whose ranks hold different shards (MHA), the tensor-parallel rank.

Hybrid models (Mamba, sliding-window, DSA indexer, draft and other extra pools) use SGLang's
v2 calls: ``register_mem_host_pool_v2`` for each pool, ``batch_set_v2`` / ``batch_get_v2`` /
``batch_exists_v2`` across the pools of a page. Once a pool other than the KV pool is
registered, every page (the KV pages of the v1 calls included) is stored as versions:

- each write of a page puts one object per pool under a key naming the write
  (``{page}/{pool}.{write id}``), then the page's marker (``{page}/page``), whose value names
  the write and the pools it holds. The marker is written only after every part of the write
  is stored; a marker already naming another write is kept, unless this write holds a
  superset of its pools, which replaces it;
- a reader resolves the marker once per page and reads only that write's parts, so what it
  loads for one page always comes from one write. The KV pages a thread reads with
  ``batch_get_v1`` pin their write for the sidecar reads that follow on the same thread
  (SGLang's prefetch reads KV first and the sidecar pools after);
- SGLang writes the sidecar pools (``batch_set_v2``) and then the KV pages
  (``batch_set_v1``) of one backup on one thread: those calls form one write, which the KV
  call completes. A new write starts at the next sidecar call after a KV call.

Parts of writes that lost the marker are left for the cluster's LRU eviction, not removed:
a reader may have pinned that write.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..store import ErrorCode, MooncakeDistributedStore

logger = logging.getLogger(__name__)

try:  # SGLang's base class and metrics type, when SGLang is installed.
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # noqa: BLE001 - SGLang (or torch) missing or broken: use the stand-in

    class _Base:  # type: ignore[no-redef]
        """Stand-in for SGLang's ``HiCacheStorage`` where SGLang is not installed."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
            pass

        def on_host_pools_registered(self) -> None:
            pass

        def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
            for i, key in enumerate(keys):
                if not self.exists(key):
                    return i
            return len(keys)

        def clear(self) -> None:
            pass

        def get_stats(self) -> Any:
            return None


try:  # What batch_exists_v2 answers.
    from sglang.srt.mem_cache.hicache_storage import PoolTransferResult
except Exception:  # noqa: BLE001

    @dataclass
    class PoolTransferResult:  # type: ignore[no-redef]
        """The fields of SGLang's ``PoolTransferResult``."""

        kv_hit_pages: int
        extra_pool_hit_pages: dict[str, int]
        restorable_prefix_pages: list[int] | None = None


try:
    from sglang.srt.observability.metrics_collector import StorageMetrics
except Exception:  # noqa: BLE001

    @dataclass
    class StorageMetrics:  # type: ignore[no-redef]
        """The fields of SGLang's ``StorageMetrics``."""

        prefetch_pgs: list[int] = field(default_factory=list)
        backup_pgs: list[int] = field(default_factory=list)
        prefetch_bandwidth: list[float] = field(default_factory=list)
        backup_bandwidth: list[float] = field(default_factory=list)


def _setting(extra: dict, key: str, env: tuple[str, ...], default: Any) -> Any:
    if extra.get(key) is not None:
        return extra[key]
    for name in env:
        if os.environ.get(name):
            return os.environ[name]
    return default


def _region(buffer: Any) -> tuple[int, int]:
    """(address, bytes) of a torch tensor or a numpy array."""
    if hasattr(buffer, "data_ptr"):
        return buffer.data_ptr(), buffer.numel() * buffer.element_size()
    if hasattr(buffer, "ctypes"):
        return buffer.ctypes.data, buffer.nbytes
    raise TypeError(f"cannot register a host buffer of type {type(buffer).__name__}")


def _host_buffers(pool: Any) -> list:
    get = getattr(pool, "get_hybrid_pool_buffer", None)
    buffers = get() if get is not None else [getattr(pool, "kv_buffer", None)]
    return [b for b in buffers if b is not None]


# Pool names and hit policies as SGLang spells them (the values of its PoolName and
# PoolHitPolicy).
_KV = "kv"
_MAMBA = "mamba"
_ALL_PAGES = "all_pages"
_TRAILING_PAGES = "trailing_pages"
# How many pages' writes one thread's KV reads keep pinned for the sidecar reads after them.
_PINNED_PAGES = 16384


def _name(value: Any) -> str:
    """A pool name or hit policy (SGLang's string enums, or plain strings) as a string."""
    return str(getattr(value, "value", value))


class _Version(NamedTuple):
    """One write of a page, as its marker records it: the write's id and its pools."""

    write: str
    pools: frozenset[str]

    def encode(self) -> bytes:
        return f"{self.write} {','.join(sorted(self.pools))}".encode("ascii")

    @staticmethod
    def decode(raw: Any) -> _Version | None:
        """The version in a marker's value; None for no marker (or one not written by us)."""
        try:
            text = bytes(raw).decode("ascii")
        except (TypeError, UnicodeDecodeError):
            return None
        write, _, pools = text.partition(" ")
        names = frozenset(p for p in pools.split(",") if p)
        return _Version(write, names) if write and names else None


class _Part(NamedTuple):
    """One pool's share of one page in a call: the page (its key and shard), the pool, and
    where the bytes lie in the host pool."""

    page: tuple[str, str]
    pool: str
    ptrs: list[int]
    sizes: list[int]


class _ThreadState(threading.local):
    """One thread's open write (the sidecar and KV calls of one backup) and pinned reads."""

    def __init__(self) -> None:
        self.write: str | None = None
        # The pools whose parts the open write has stored, by page.
        self.parts: dict[tuple[str, str], set[str]] = {}
        self.kv_called = False
        # The write each page's KV was last read from, newest last.
        self.pins: OrderedDict[tuple[str, str], str] = OrderedDict()

    def open(self) -> None:
        self.write, self.parts, self.kv_called = secrets.token_hex(8), {}, False

    def close(self) -> None:
        self.write, self.parts, self.kv_called = None, {}, False

    def pin(self, page: tuple[str, str], write: str) -> None:
        self.pins[page] = write
        self.pins.move_to_end(page)
        while len(self.pins) > _PINNED_PAGES:
            self.pins.popitem(last=False)


class MooringStore(_Base):
    """SGLang's ``HiCacheStorage`` on a Mooring cluster (see the module docs)."""

    def __init__(self, storage_config: Any = None, mem_pool_or_kwargs: Any = None) -> None:
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.storage_config = storage_config
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        self.enable_storage_metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self.mem_pool_host: Any = None
        self._extra = extra
        # Host pools by SGLang's pool name (register_mem_host_pool_v2).
        self.registered_pools: dict[str, Any] = {}
        # Registered host memory: (address, bytes).
        self._regions: list[tuple[int, int]] = []
        self._thread = _ThreadState()
        self.store = MooncakeDistributedStore()
        code = self.store.setup(
            {
                "local_hostname": _setting(
                    extra, "local_hostname", ("MOORING_LOCAL_HOSTNAME",), "127.0.0.1"
                ),
                "metadata_server": "P2PHANDSHAKE",
                "master_server_addr": _setting(
                    extra,
                    "master_server_address",
                    ("MOORING_MASTER", "MOONCAKE_MASTER"),
                    "127.0.0.1:50051",
                ),
                "global_segment_size": _setting(
                    extra, "global_segment_size", ("MOORING_GLOBAL_SEGMENT_SIZE",), 0
                ),
                "local_buffer_size": _setting(
                    extra, "local_buffer_size", ("MOORING_LOCAL_BUFFER_SIZE",), "16MB"
                ),
                "token_file": _setting(extra, "token_file", ("MOORING_TOKEN_FILE",), None),
            }
        )
        if code != 0:
            raise RuntimeError(
                f"Mooring store setup failed with code {code} ({ErrorCode(code).name}); "
                "the log above says why"
            )
        self.prefix = self._key_prefix(storage_config, extra)
        self._metrics = StorageMetrics()
        # SGLang's dynamic loader passes its kwargs; its built-in loaders the host pool.
        if hasattr(mem_pool_or_kwargs, "get_page_buffer_meta"):
            self.register_mem_pool_host(mem_pool_or_kwargs)

    @staticmethod
    def _key_prefix(config: Any, extra: dict) -> str:
        parts = []
        if extra.get("extra_backend_tag") is not None:
            parts.append(str(extra["extra_backend_tag"]))
        model = getattr(config, "model_name", None)
        if model:
            parts.append(str(model).replace("/", "-"))
        return "/".join(parts)

    def _key(self, key: str) -> str:
        # MHA ranks hold different heads of a page; MLA ranks hold the same page.
        return self._object(key, "" if self.is_mla else self._rank())

    def _object(self, name: str, shard: str) -> str:
        return f"{self.prefix}/{name}{shard}" if self.prefix else f"{name}{shard}"

    def _rank(self) -> str:
        if self.storage_config is None:
            return ""
        return f"@tp{self.storage_config.tp_rank}of{self.storage_config.tp_size}"

    def _shard(self, pool: str) -> str:
        """The key suffix of a pool's pages: the rank's, unless every rank holds the same
        bytes (the MLA KV pool and its MLA-shaped side pools). Mamba state is split over
        ranks even when the KV is MLA, and an MHA-shaped pool (K and V) always is."""
        if not self.is_mla or pool == _MAMBA:
            return self._rank()
        if pool == _KV:
            return ""
        host = self.registered_pools.get(pool)
        return self._rank() if host is not None and hasattr(host, "v_buffer") else ""

    # ---- host memory -------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Registers the host KV pool's buffers for zero-copy page transfers."""
        super().register_mem_pool_host(mem_pool_host)
        self.mem_pool_host = mem_pool_host
        self._register_buffers(mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Registers one of a hybrid model's host pools (``PoolName``: kv, mamba, swa,
        indexer, draft, ...) for the v2 calls. Memory already registered (a pool sharing the
        KV pool's buffers) is not registered again."""
        name = _name(host_pool_name)
        self.registered_pools[name] = host_pool
        if name == _KV and self.mem_pool_host is None:
            self.mem_pool_host = host_pool
        self._register_buffers(host_pool)

    def on_host_pools_registered(self) -> None:
        """Checks the pools SGLang registered: hybrid pages need the zero-copy calls, since
        the per-page tensor calls know nothing of the other pools."""
        if self._hybrid() and self.storage_config is not None:
            wanted = str(self._extra.get("interface_v1", "")).strip().lower()
            if wanted not in ("1", "true", "yes", "on"):
                others = ", ".join(sorted(p for p in self.registered_pools if p != _KV))
                raise ValueError(
                    f"mooring: this model has host pools besides the KV pool ({others}), "
                    'which need the zero-copy page calls: add "interface_v1": 1 to '
                    "--hicache-storage-backend-extra-config "
                    f"(error {int(ErrorCode.INVALID_PARAMS)})"
                )

    def _register_buffers(self, pool: Any) -> None:
        for buffer in _host_buffers(pool):
            ptr, size = _region(buffer)
            if size == 0 or any(s <= ptr and ptr + size <= s + n for s, n in self._regions):
                continue
            code = self.store.register_buffer(ptr, size)
            if code != 0:
                raise RuntimeError(
                    f"mooring: registering {size} bytes of host pool memory at {ptr:#x} failed "
                    f"with code {code} ({ErrorCode(code).name}); the log above says why"
                )
            self._regions.append((ptr, size))

    def _hybrid(self) -> bool:
        return any(name != _KV for name in self.registered_pools)

    def _pool(self, name: str) -> Any:
        pool = self.registered_pools.get(name)
        return self.mem_pool_host if pool is None and name == _KV else pool

    def _kv_is_logical(self) -> bool:
        """Whether the KV pool only hands out indices and holds no bytes (DeepSeek V4's
        anchor): then its pages are neither stored nor required."""
        pool = self._pool(_KV)
        return pool is not None and getattr(pool, "kv_buffer", True) is None

    def _page_meta(self, keys: list[str], host_indices: Any) -> tuple[list, list]:
        """Per key, the page's buffer addresses and sizes."""
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if not keys or len(ptrs) % len(keys) != 0:
            raise ValueError(f"{len(ptrs)} page buffers do not split over {len(keys)} keys")
        per = len(ptrs) // len(keys)
        return (
            [list(ptrs[i : i + per]) for i in range(0, len(ptrs), per)],
            [list(sizes[i : i + per]) for i in range(0, len(sizes), per)],
        )

    # ---- the zero-copy page calls ------------------------------------------------------------

    def batch_set_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        """Writes the pages at ``host_indices`` under ``keys``; one success flag per key. A
        page already stored counts as written (pages are immutable under their hash)."""
        if not keys:
            return []
        if self._hybrid():
            return self._kv_pages_v1(keys, host_indices, write=True)
        ptrs, sizes = self._page_meta(keys, host_indices)
        started = time.perf_counter()
        codes = self.store.batch_put_from_multi_buffers([self._key(k) for k in keys], ptrs, sizes)
        if self.enable_storage_metrics:
            self._record(
                self._metrics.backup_pgs, self._metrics.backup_bandwidth, keys, sizes, started
            )
        return [c == 0 for c in codes]

    def batch_get_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        """Reads ``keys`` into the pages at ``host_indices``; one success flag per key."""
        if not keys:
            return []
        if self._hybrid():
            return self._kv_pages_v1(keys, host_indices, write=False)
        ptrs, sizes = self._page_meta(keys, host_indices)
        started = time.perf_counter()
        lengths = self.store.batch_get_into_multi_buffers([self._key(k) for k in keys], ptrs, sizes)
        if self.enable_storage_metrics:
            self._record(
                self._metrics.prefetch_pgs, self._metrics.prefetch_bandwidth, keys, sizes, started
            )
        return [n == sum(s) for n, s in zip(lengths, sizes)]

    def _kv_pages_v1(self, keys: list[str], host_indices: Any, write: bool) -> list[bool]:
        """The v1 calls of a hybrid model: its KV pages as the KV parts of page versions."""
        call = "batch_set_v1" if write else "batch_get_v1"
        if self._kv_is_logical():
            return [True] * len(keys)
        parts = self._parts(_KV, keys, host_indices, call)
        if parts is None:
            return [False] * len(keys)
        started = time.perf_counter()
        done = self._store(parts, "kv") if write else self._load(parts)
        self._record_parts(write, parts, started)
        return done

    # ---- the hybrid (v2) calls ---------------------------------------------------------------

    def batch_set_v2(self, transfers: list, extra_info: Any = None) -> dict[str, list[bool]]:
        """Writes each transfer's pages (``PoolTransfer``: a pool, its keys, the host indices
        of its pages) from its host pool. The pools of one page in one call are one write,
        visible to readers once all of them are stored (see the module docs). Answers, per
        pool, one flag per key: whether the page's stored write holds that pool (a page
        already stored by another write with the pool counts)."""
        results, parts, slots = self._gather(transfers, "batch_set_v2")
        carries_kv = any(_name(t.name) == _KV for t in transfers)
        started = time.perf_counter()
        done = self._store(parts, "alone" if carries_kv else "sidecars") if parts else []
        for (name, i), ok in zip(slots, done):
            results[name][i] = ok
        self._record_parts(True, parts, started)
        return results

    def batch_get_v2(self, transfers: list, extra_info: Any = None) -> dict[str, list[bool]]:
        """Reads each transfer's pages into its host pool; per pool, one flag per key. All
        the pools read for one page come from one write: the one its marker names, or the
        one this thread's KV read of the page pinned."""
        results, parts, slots = self._gather(transfers, "batch_get_v2")
        started = time.perf_counter()
        done = self._load(parts) if parts else []
        for (name, i), ok in zip(slots, done):
            results[name][i] = ok
        self._record_parts(False, parts, started)
        return results

    def batch_exists_v2(
        self, keys: list[str], pool_transfers: list | None = None, extra_info: Any = None
    ) -> Any:
        """Which prefixes of ``keys`` can be loaded with every pool they need
        (``PoolTransferResult``). KV pages count from the start while stored. A pool with
        ``ALL_PAGES`` needs each page of the prefix; one with ``TRAILING_PAGES`` needs the last
        ``len(keys)`` pages of the transfer (its window) before the prefix's end. A pool of a
        page counts only when the page's stored write holds it and its part is still
        stored."""
        transfers = list(pool_transfers or [])
        policies = [_name(t.hit_policy) for t in transfers]
        for t, policy in zip(transfers, policies):
            if policy not in (_ALL_PAGES, _TRAILING_PAGES):
                raise ValueError(
                    f"mooring: pool {_name(t.name)!r} asks for hit policy {policy!r}; this "
                    f"backend answers {_ALL_PAGES!r} and {_TRAILING_PAGES!r} "
                    f"(error {int(ErrorCode.INVALID_PARAMS)})"
                )
        names = [_name(t.name) for t in transfers]
        logical = self._kv_is_logical()
        wanted = ([] if logical else [_KV]) + [n for n in names if n != _KV]
        present = self._present(keys, list(dict.fromkeys(wanted)))
        kv = [True] * len(keys) if logical else present[_KV]
        kv_pages = _leading(kv)
        hits: dict[str, int] = {_KV: kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for t, name, policy in zip(transfers, names, policies):
            if name == _KV:
                continue
            has = present[name][:kv_pages]
            if policy == _ALL_PAGES:
                boundary = _leading(has)
                usable = set(range(1, boundary + 1))
            else:
                window = max(1, len(t.keys or []))
                usable = {n for n in range(1, kv_pages + 1) if all(has[max(0, n - window) : n])}
                boundary = max(usable, default=0)
            if boundary:
                hits[name] = boundary
            restorable &= usable
        ordered = sorted(restorable)
        return PoolTransferResult(ordered[-1] if ordered else 0, hits, ordered)

    def _gather(self, transfers: list, call: str) -> tuple[dict, list[_Part], list]:
        """Each transfer's pages as parts, with a result slot (all False) per key; pools
        repeated in one call answer in one list, in order."""
        results: dict[str, list[bool]] = {}
        parts: list[_Part] = []
        slots: list[tuple[str, int]] = []
        for t in transfers:
            name, keys = _name(t.name), list(t.keys or [])
            out = results.setdefault(name, [])
            start = len(out)
            out.extend([False] * len(keys))
            if not keys:
                continue
            if name == _KV and self._kv_is_logical():
                out[start:] = [True] * len(keys)
                continue
            pages = self._parts(name, keys, t.host_indices, call)
            for i, part in enumerate(pages or []):
                parts.append(part)
                slots.append((name, start + i))
        return results, parts, slots

    def _parts(self, pool_name: str, keys: list[str], host_indices: Any, call: str):
        """The parts of ``keys``' pages in pool ``pool_name`` at ``host_indices``; None (and
        an error logged) if they cannot be described."""
        pool = self._pool(pool_name)
        code = int(ErrorCode.INVALID_PARAMS)
        if pool is None:
            logger.error(
                "mooring: %s: no host pool is registered as %r; register it with "
                "register_mem_host_pool_v2 (error %d)",
                call,
                pool_name,
                code,
            )
            return None
        slots = int(getattr(pool, "page_size", 1) or 1)
        count = 0 if host_indices is None else len(host_indices)
        if count != len(keys) * slots:
            logger.error(
                "mooring: %s: pool %r got %d host indices for %d keys; give %d per key (error %d)",
                call,
                pool_name,
                count,
                len(keys),
                slots,
                code,
            )
            return None
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        if len(ptrs) % len(keys) != 0 or len(sizes) != len(ptrs):
            logger.error(
                "mooring: %s: pool %r described %d buffers for %d pages (error %d)",
                call,
                pool_name,
                len(ptrs),
                len(keys),
                code,
            )
            return None
        per = len(ptrs) // len(keys)
        shard = self._shard(pool_name)
        return [
            _Part(
                (key, shard),
                pool_name,
                list(ptrs[i * per : (i + 1) * per]),
                list(sizes[i * per : (i + 1) * per]),
            )
            for i, key in enumerate(keys)
        ]

    # ---- page versions -----------------------------------------------------------------------

    def _marker(self, page: tuple[str, str]) -> str:
        return self._object(f"{page[0]}/page", page[1])

    def _part_key(self, page: tuple[str, str], pool: str, write: str) -> str:
        return self._object(f"{page[0]}/{pool}.{write}", page[1])

    def _versions(self, pages: list) -> dict[tuple[str, str], _Version | None]:
        """Each page's stored version (None: no marker)."""
        if not pages:
            return {}
        keys = [self._marker(p) for p in pages]
        raw = self._get_markers(keys)
        # A marker being replaced reads as not ready until the replacement lands: wait for
        # it a little, as the page is stored either way.
        delay = 0.002
        for _ in range(6):
            busy = [i for i, r in enumerate(raw) if r == ErrorCode.REPLICA_IS_NOT_READY]
            if not busy:
                break
            time.sleep(delay)
            delay *= 2
            for i, r in zip(busy, self._get_markers([keys[i] for i in busy])):
                raw[i] = r
        return {p: _Version.decode(r) if isinstance(r, bytes) else None for p, r in zip(pages, raw)}

    def _get_markers(self, keys: list[str]) -> list:
        """The markers' values, or per key its error code (``get_batch`` answers b"" for
        both a missing marker and one being written)."""
        return self.store._run(
            "get_batch", lambda c: c.get_batch(keys), lambda code: [code] * len(keys)
        )

    def _store(self, parts: list[_Part], mode: str) -> list[bool]:
        """Writes ``parts`` as page versions; whether each part's page now holds its pool.

        ``mode``: "alone", a call that is a write of its own (it carries the KV pool);
        "sidecars", the sidecar pools of a write whose KV pages follow on this thread; "kv",
        those KV pages (joining the thread's open write for the pages it wrote).
        """
        state = self._thread
        pages: dict[tuple[str, str], dict[str, _Part]] = {}
        for part in parts:
            pages.setdefault(part.page, {})[part.pool] = part
        if mode == "alone":
            state.close()
            fresh = secrets.token_hex(8)
        elif mode == "sidecars":
            # A sidecar call after the KV pages, or one writing a pool of a page the open
            # write already holds, belongs to the next backup.
            if (
                state.write is None
                or state.kv_called
                or any(
                    pool in state.parts.get(page, ()) for page, new in pages.items() for pool in new
                )
            ):
                state.open()
            fresh = state.write
        else:
            state.kv_called = True
            fresh = secrets.token_hex(8)

        def write_of(page: tuple[str, str]) -> str:
            if mode == "kv" and state.write is not None and page in state.parts:
                return state.write
            return fresh

        logical = self._kv_is_logical()
        current = self._versions(list(pages))
        final: dict[tuple[str, str], _Version | None] = {}
        plans: dict[tuple[str, str], tuple[str, frozenset[str] | None, _Version | None]] = {}
        to_put: list[tuple[tuple[str, str], str, str, _Part]] = []
        for page, new in pages.items():
            write, found = write_of(page), current[page]
            wanted = set(new)
            own = state.parts.get(page, set()) if write == state.write else set()
            if found is not None and found.write != write and found.pools >= wanted:
                # Stored by another write. A sidecar write still stores its own parts while
                # that write lacks its KV pages: should they never come, this write's KV call
                # can replace it.
                if not (mode == "sidecars" and _KV not in found.pools and not logical):
                    final[page] = found
                    continue
                target = None
            elif found is not None and found.write == write:
                target = found.pools | own | wanted
            elif found is None or (own | wanted) >= found.pools:
                target = frozenset(own | wanted)
            else:
                # Another write holds pools this one lacks: keep it, and with it what it
                # holds. Within an open write the parts are still stored, for its later calls.
                logger.debug(
                    "mooring: page %s holds %s from another write; kept it over this write's %s",
                    page[0],
                    sorted(found.pools),
                    sorted(wanted),
                )
                final[page] = found
                if write != state.write:
                    continue
                target = None
            to_put += [(page, pool, write, new[pool]) for pool in sorted(wanted - own)]
            plans[page] = (write, frozenset(target) if target is not None else None, found)

        codes = (
            self.store.batch_put_from_multi_buffers(
                [self._part_key(page, pool, write) for page, pool, write, _ in to_put],
                [p.ptrs for *_, p in to_put],
                [p.sizes for *_, p in to_put],
            )
            if to_put
            else []
        )
        failed = set()
        for (page, pool, write, _), code in zip(to_put, codes):
            if code != 0:
                failed.add(page)
            elif write == state.write:
                state.parts.setdefault(page, set()).add(pool)

        pending = {}
        for page, (write, target, found) in plans.items():
            if page in failed or target is None:
                final.setdefault(page, found)
            else:
                pending[page] = (_Version(write, target), found)
        self._commit(pending, final)

        done = [
            final.get(part.page) is not None and part.pool in final[part.page].pools
            for part in parts
        ]
        if mode == "kv" and not all(done):
            # The backup stops at a failed batch; its later KV calls are not this write's.
            state.close()
        return done

    def _commit(
        self,
        pending: dict[tuple[str, str], tuple[_Version, _Version | None]],
        final: dict[tuple[str, str], _Version | None],
    ) -> None:
        """Writes the markers of ``pending`` pages (their new version, and the version last
        seen stored), and records in ``final`` each page's version after it.

        A page without a marker gets one unless another write puts one first; a marker of
        another write is replaced only by a version holding all its pools and more (one of
        this write's own is extended). A write that loses the race to a version it holds a
        superset of tries again, a bounded number of times.
        """
        for _ in range(3):
            creates, replaces = [], []
            for page, (mine, seen) in pending.items():
                if seen is None:
                    creates.append((page, mine))
                elif seen.write == mine.write or mine.pools > seen.pools:
                    if seen != mine:
                        replaces.append((page, mine))
                    else:
                        final[page] = seen
                else:
                    final[page] = seen
            if not creates and not replaces:
                return
            if creates:
                self.store.put_batch(
                    [self._marker(p) for p, _ in creates], [v.encode() for _, v in creates]
                )
            if replaces:
                self.store.upsert_batch(
                    [self._marker(p) for p, _ in replaces], [v.encode() for _, v in replaces]
                )
            after = self._versions([p for p, _ in creates + replaces])
            final.update(after)
            pending = {
                page: (mine, after[page])
                for page, (mine, _) in pending.items()
                if page in after
                and after[page] != mine
                and (after[page] is None or mine.pools > after[page].pools)
            }
            if not pending:
                return

    def _load(self, parts: list[_Part]) -> list[bool]:
        """Reads ``parts`` from their pages' versions; whether each was read whole.

        A page read with its KV part resolves its marker and pins the write for this
        thread; a page read without it uses the write this thread pinned, if any.
        """
        state = self._thread
        with_kv = {p.page for p in parts if p.pool == _KV}
        unpinned = [
            page
            for page in dict.fromkeys(p.page for p in parts)
            if page in with_kv or page not in state.pins
        ]
        versions = self._versions(unpinned)
        chosen: dict[tuple[str, str], tuple[str, frozenset[str] | None] | None] = {}
        for page in dict.fromkeys(p.page for p in parts):
            if page in versions:
                v = versions[page]
                chosen[page] = (v.write, v.pools) if v is not None else None
            else:
                chosen[page] = (state.pins[page], None)
        reads = []
        for i, part in enumerate(parts):
            pick = chosen[part.page]
            if pick is not None and (pick[1] is None or part.pool in pick[1]):
                reads.append((i, self._part_key(part.page, part.pool, pick[0]), part))
        done = [False] * len(parts)
        if reads:
            lengths = self.store.batch_get_into_multi_buffers(
                [key for _, key, _ in reads],
                [p.ptrs for *_, p in reads],
                [p.sizes for *_, p in reads],
            )
            for (i, _, part), n in zip(reads, lengths):
                done[i] = n == sum(part.sizes)
        for page in with_kv:
            if chosen[page] is not None:
                state.pin(page, chosen[page][0])
        return done

    def _present(self, keys: list[str], pools: list[str]) -> dict[str, list[bool]]:
        """Per pool, per key: whether the page's stored version holds the pool and its part
        is still stored."""
        pages = {pool: [(k, self._shard(pool)) for k in keys] for pool in pools}
        versions = self._versions(list(dict.fromkeys(p for ps in pages.values() for p in ps)))
        present = {pool: [False] * len(keys) for pool in pools}
        checks = []
        for pool, ps in pages.items():
            for i, page in enumerate(ps):
                v = versions[page]
                if v is not None and pool in v.pools:
                    checks.append((pool, i, self._part_key(page, pool, v.write)))
        if checks:
            found = self.store.batch_is_exist([key for *_, key in checks])
            for (pool, i, _), f in zip(checks, found):
                present[pool][i] = f == 1
        return present

    def _record_parts(self, write: bool, parts: list[_Part], started: float) -> None:
        if not self.enable_storage_metrics or not parts:
            return
        pages = list({p.page[0] for p in parts})
        if write:
            target = (self._metrics.backup_pgs, self._metrics.backup_bandwidth)
        else:
            target = (self._metrics.prefetch_pgs, self._metrics.prefetch_bandwidth)
        self._record(*target, pages, [p.sizes for p in parts], started)

    def _record(
        self, pages: list, bandwidth: list, keys: list, sizes: list, started: float
    ) -> None:
        elapsed = max(time.perf_counter() - started, 1e-9)
        pages.append(len(keys))
        bandwidth.append(sum(map(sum, sizes)) / elapsed / (1 << 30))

    # ---- the older calls ---------------------------------------------------------------------

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """With a tensor target (SGLang's page-sized buffer): reads into it and answers it, or
        None. With an address and size (registered memory): reads there and answers
        success. Without a target: the value as bytes, or None."""
        if target_location is None:
            value = self.store.get(self._key(key))
            return value if value else None
        if _is_tensor(target_location):
            return self._read_into(key, target_location)
        return self.store.get_into(self._key(key), target_location, target_sizes) >= 0

    def _read_into(self, key: str, tensor: Any) -> Any:
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            logger.warning("mooring: %s: the target tensor must be contiguous, in CPU memory", key)
            return None
        handle = self.store.get_buffer(self._key(key))
        dest = memoryview(_bytes_like(tensor))
        if handle is None or len(handle) != dest.nbytes:
            return None
        dest[:] = memoryview(handle)
        return tensor

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> Any:
        """With tensor targets: ``get`` of each (the tensor, or None). With addresses and
        sizes: reads into them and answers how many leading keys were read. Without: the
        values (bytes or None)."""
        if target_locations is None:
            return [self.get(k) for k in keys]
        if any(_is_tensor(t) for t in target_locations):
            return [self.get(k, t) for k, t in zip(keys, target_locations)]
        lengths = self.store.batch_get_into(
            [self._key(k) for k in keys], list(target_locations), list(target_sizes)
        )
        for i, n in enumerate(lengths):
            if n < 0:
                return i
        return len(keys)

    def set(
        self,
        key: str,
        value: Any = None,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Stores ``value`` (bytes-like, or a CPU tensor), or the ``target_sizes`` bytes at
        ``target_location`` (registered memory). A key already stored counts as stored."""
        if target_location is not None:
            code = self.store.put_from(self._key(key), target_location, target_sizes)
        else:
            code = self.store.put(self._key(key), _bytes_like(value))
        return code == 0

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """``set`` for many keys; True if every one is stored."""
        if not keys:
            return False
        if target_locations is not None:
            codes = self.store.batch_put_from(
                [self._key(k) for k in keys], list(target_locations), list(target_sizes)
            )
        else:
            codes = [self.store.put(self._key(k), _bytes_like(v)) for k, v in zip(keys, values)]
        return all(c == 0 for c in codes)

    def exists(self, key: str) -> bool:
        """Whether ``key`` is stored (for a hybrid model: its KV page)."""
        if self._hybrid():
            return self.batch_exists([key]) == 1
        return self.store.is_exist(self._key(key)) == 1

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many leading ``keys`` are stored (SGLang loads that prefix)."""
        if self._hybrid():
            if self._kv_is_logical():
                return len(keys)
            return _leading(self._present(keys, [_KV])[_KV])
        found = self.store.batch_is_exist([self._key(k) for k in keys])
        for i, f in enumerate(found):
            if f != 1:
                return i
        return len(keys)

    def clear(self) -> None:
        """Removes everything this cluster stores that can be removed now."""
        self.store.remove_all()

    def get_stats(self) -> Any | None:
        """Pages and bandwidth since the last call (with storage metrics enabled)."""
        if not self.enable_storage_metrics:
            return None
        stats, self._metrics = self._metrics, StorageMetrics()
        return stats

    def close(self) -> None:
        """Unregisters the host pool and leaves the cluster."""
        for ptr, _ in self._regions:
            self.store.unregister_buffer(ptr)
        self._regions.clear()
        self.store.close()


def _leading(flags: list[bool]) -> int:
    """How many leading flags are true."""
    for i, flag in enumerate(flags):
        if not flag:
            return i
    return len(flags)


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "data_ptr") and hasattr(value, "is_contiguous")


def _bytes_like(value: Any) -> Any:
    """A CPU tensor's bytes as a numpy array sharing its memory (of any dtype: numpy has no
    bfloat16, so the bytes are viewed as uint8 first); anything else as it is."""
    if _is_tensor(value):
        torch = sys.modules["torch"]  # imported by whoever made the tensor
        return value.detach().contiguous().view(-1).view(torch.uint8).numpy()
    return value
