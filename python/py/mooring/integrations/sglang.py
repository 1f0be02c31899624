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
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ..store import ErrorCode, MooncakeDistributedStore

logger = logging.getLogger(__name__)

try:  # SGLang's base class and metrics type, when SGLang is installed.
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # noqa: BLE001 - SGLang (or torch) missing or broken: use the stand-in

    class _Base:  # type: ignore[no-redef]
        """Stand-in for SGLang's ``HiCacheStorage`` where SGLang is not installed."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host

        def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
            for i, key in enumerate(keys):
                if not self.exists(key):
                    return i
            return len(keys)

        def clear(self) -> None:
            pass

        def get_stats(self) -> Any:
            return None


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


class MooringStore(_Base):
    """SGLang's ``HiCacheStorage`` on a Mooring cluster (see the module docs)."""

    def __init__(self, storage_config: Any = None, mem_pool_or_kwargs: Any = None) -> None:
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.storage_config = storage_config
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        self.enable_storage_metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self.mem_pool_host: Any = None
        self._registered: list[int] = []
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
        shard = ""
        if not self.is_mla and self.storage_config is not None:
            shard = f"@tp{self.storage_config.tp_rank}of{self.storage_config.tp_size}"
        return f"{self.prefix}/{key}{shard}" if self.prefix else f"{key}{shard}"

    # ---- host memory -------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Registers the host pool's buffers for zero-copy page transfers."""
        super().register_mem_pool_host(mem_pool_host)
        self.mem_pool_host = mem_pool_host
        for buffer in _host_buffers(mem_pool_host):
            ptr, size = _region(buffer)
            code = self.store.register_buffer(ptr, size)
            if code != 0:
                raise RuntimeError(f"registering the host pool buffer failed with code {code}")
            self._registered.append(ptr)

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
        ptrs, sizes = self._page_meta(keys, host_indices)
        started = time.perf_counter()
        lengths = self.store.batch_get_into_multi_buffers([self._key(k) for k in keys], ptrs, sizes)
        if self.enable_storage_metrics:
            self._record(
                self._metrics.prefetch_pgs, self._metrics.prefetch_bandwidth, keys, sizes, started
            )
        return [n == sum(s) for n, s in zip(lengths, sizes)]

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
        """Whether ``key`` is stored."""
        return self.store.is_exist(self._key(key)) == 1

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many leading ``keys`` are stored (SGLang loads that prefix)."""
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
        for ptr in self._registered:
            self.store.unregister_buffer(ptr)
        self._registered.clear()
        self.store.close()


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "data_ptr") and hasattr(value, "is_contiguous")


def _bytes_like(value: Any) -> Any:
    """A CPU tensor's bytes as a numpy array sharing its memory (of any dtype: numpy has no
    bfloat16, so the bytes are viewed as uint8 first); anything else as it is."""
    if _is_tensor(value):
        torch = sys.modules["torch"]  # imported by whoever made the tensor
        return value.detach().contiguous().view(-1).view(torch.uint8).numpy()
    return value
