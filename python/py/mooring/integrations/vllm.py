"""``MooringConnector``: a vLLM KV connector (v1) that keeps KV-cache blocks in a Mooring cluster.

Load it with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "MooringConnector",
        "kv_connector_module_path": "mooring.integrations.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"master": "HOST:50051"}}'

What it does, per engine step:

- **Lookup (scheduler).** For a new request, the keys of its full prompt blocks (vLLM's block
  hashes, which chain over the whole prefix) are probed in one call,
  ``batch_is_exist(keys, prefetch=True)``: a block whose only copy is on a node's SSD is
  brought back into memory during the probe, so the load that follows reads memory. The
  longest run of blocks present on every tensor-parallel rank is the hit. At least one
  prompt token is always left to compute (vLLM needs it to sample).
- **Load (worker).** Synchronously, before the forward pass: one
  ``batch_get_into_multi_buffers`` per step straight into the KV-cache tensors (registered
  with ``register_buffer``; CUDA memory is staged through pinned host memory by
  ``mooring.store``). A block that cannot be read (missing, damaged: every value is
  checksummed end to end) is reported through ``get_block_ids_with_load_errors``, and vLLM
  recomputes from it.
- **Save (worker).** After the forward pass, on a thread of its own: the step's newly full
  prompt blocks, deduplicated with ``batch_is_exist`` and written with
  ``batch_put_from_multi_buffers``. The next step waits for it before its forward pass
  runs, so a block is never rewritten while it is being read. A put refused with -200 (the
  pool is full of what may not be evicted) pauses storing for a back-off (200 ms, doubling
  up to 5 s while refusals go on); a put that succeeds ends it.
- **Stats.** Per request: blocks looked up and hit, loaded, failed, saved, deduplicated,
  refused, skipped while backing off, bytes and seconds; through ``get_kv_connector_stats``
  (vLLM's ``KVConnectorStats``), summed by ``reduce()`` for vLLM's stats logger.

On the same host as a node, ``mooring.store`` moves bytes through the node's shared memory
(no socket copy); elsewhere over TCP (or RDMA where configured).

Settings (``kv_connector_extra_config``): ``master`` (``host:port``; else
``MOORING_MASTER``, else the ``master_server_address`` of the JSON file
``MOONCAKE_CONFIG_PATH`` names, as vLLM's Mooncake connectors read it), ``token_file``,
``segment_size`` (memory each worker contributes to the pool: ``0`` by default, as vLLM's
``standalone-store`` mode), ``local_buffer_size`` (``"16MB"``), ``prefetch`` (``true``),
``replica_num`` (``1``), ``cache_prefix`` (``""``: a namespace for keys), ``backoff_ms``
(``200``), ``layer_groups`` (``1``; see below).

**Layer-wise loads** (``layer_groups`` = *G* > 1). A block is then stored as *G* values,
one per group of consecutive layers, and a load runs beside the forward pass: the loading
thread reads group after group, and ``wait_for_layer_load`` waits only for the group holding
its layer, so the first layers compute while the last ones still arrive. It costs *G* keys per
block in the master (and *G* probes per block at lookup); blocks stored with another *G* are
other keys, never mixed. With one group (the default) a block is one value, loaded before the
forward pass.

vLLM is imported by this module only: ``import mooring`` never needs it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.utils.network_utils import get_ip

from mooring.codes import ErrorCode
from mooring.store import MooncakeDistributedStore, ReplicateConfig

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

__all__ = ["MooringConnector", "MooringConnectorMetadata", "MooringConnectorStats"]

_COUNTERS = (
    "lookup_blocks",
    "hit_blocks",
    "loaded_blocks",
    "load_failed_blocks",
    "saved_blocks",
    "deduplicated_blocks",
    "refused_blocks",
    "failed_blocks",
    "backoff_skipped_blocks",
    "loaded_bytes",
    "saved_bytes",
)
_TIMERS = ("load_seconds", "save_seconds")


@dataclass
class _Transfer:
    """Blocks of one request to load or save this step: ``hashes[i]`` (a vLLM block hash, in
    hex) goes to or from KV-cache block ``block_ids[i]``."""

    req_id: str
    hashes: list[str]
    block_ids: list[int]
    lookup_blocks: int = 0  # loads: how many blocks the scheduler's lookup probed


@dataclass
class MooringConnectorMetadata(KVConnectorMetadata):
    """What the scheduler tells the workers to move in one step."""

    loads: list[_Transfer] = field(default_factory=list)
    saves: list[_Transfer] = field(default_factory=list)


@dataclass
class MooringConnectorStats(KVConnectorStats):
    """Per-request transfer counts: ``data["requests"][req_id][counter]``. ``reduce()`` sums
    them over requests for vLLM's stats logger."""

    def __post_init__(self) -> None:
        self.data.setdefault("requests", {})

    def record(self, req_id: str, **counts: float) -> None:
        """Adds ``counts`` to ``req_id``'s counters."""
        entry = self.data["requests"].setdefault(req_id, {})
        for name, value in counts.items():
            entry[name] = entry.get(name, 0) + value

    def reset(self) -> None:
        """Forgets every count."""
        self.data = {"requests": {}}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        """Adds ``other``'s counts (another step's, or another worker's) to these."""
        for req_id, counts in other.data.get("requests", {}).items():
            self.record(req_id, **counts)
        return self

    def reduce(self) -> dict[str, int | float]:
        """Totals over all requests, one number per counter."""
        totals: dict[str, int | float] = {name: 0 for name in _COUNTERS + _TIMERS}
        for counts in self.data["requests"].values():
            for name, value in counts.items():
                totals[name] = totals.get(name, 0) + value
        totals["requests"] = len(self.data["requests"])
        return totals

    def is_empty(self) -> bool:
        """Whether nothing was counted."""
        return not self.data["requests"]


def _settings(vllm_config: VllmConfig) -> dict[str, Any]:
    transfer = vllm_config.kv_transfer_config
    extra = dict(transfer.kv_connector_extra_config or {}) if transfer is not None else {}
    if "master" not in extra:
        master = os.environ.get("MOORING_MASTER")
        path = os.environ.get("MOONCAKE_CONFIG_PATH")
        if not master and path:
            with open(path) as f:
                master = json.load(f).get("master_server_address")
        if not master:
            raise ValueError(
                "MooringConnector needs the master's address: set "
                '"kv_connector_extra_config": {"master": "HOST:PORT"}, or MOORING_MASTER'
            )
        extra["master"] = master
    return extra


def _connect(settings: dict[str, Any], segment_size: Any, what: str) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    code = store.setup(
        {
            "local_hostname": settings.get("local_hostname") or get_ip(),
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": segment_size,
            "local_buffer_size": settings.get("local_buffer_size", "16MB"),
            "protocol": settings.get("protocol", "tcp"),
            "rdma_devices": settings.get("device_name", ""),
            "master_server_addr": settings["master"],
            "token_file": settings.get("token_file"),
        }
    )
    if code != 0:
        raise RuntimeError(
            f"MooringConnector ({what}) could not join the Mooring cluster at "
            f"{settings['master']}: code {code} ({_code_name(code)}); the log above says why"
        )
    return store


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return "unknown code"


class _Namespace:
    """Key names: one namespace per model, KV layout and parallel rank, so that engines of
    different models, block sizes, dtypes or tensor-parallel ranks never read each other's
    blocks. A key is ``<namespace>/<block hash in hex>``."""

    def __init__(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> None:
        transfer = vllm_config.kv_transfer_config
        extra = transfer.kv_connector_extra_config if transfer is not None else {}
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise ValueError(
                "MooringConnector stores models with one KV-cache group (full attention in "
                f"every layer); this model has {len(kv_cache_config.kv_cache_groups)} groups "
                "(sliding-window or hybrid layers): use vLLM's MooncakeStoreConnector for it"
            )
        group = kv_cache_config.kv_cache_groups[0]
        spec = group.kv_cache_spec
        model = vllm_config.model_config.model.rstrip("/").split("/")[-1]
        parallel = vllm_config.parallel_config
        self.tp_size = parallel.tensor_parallel_size
        self.pp_size = parallel.pipeline_parallel_size
        self.block_size = spec.block_size
        layers = len(group.layer_names)
        self.layer_groups = int((extra or {}).get("layer_groups", 1))
        if not 1 <= self.layer_groups <= layers:
            raise ValueError(
                f"MooringConnector: layer_groups is {self.layer_groups}; give 1 (a block is "
                f"one value) up to the model's {layers} layers"
            )
        layout = f"bs{spec.block_size}-{spec.page_size_bytes}B-x{layers}"
        if self.layer_groups > 1:
            # Blocks split by layer group are other values than whole blocks: never mixed.
            layout += f"-g{self.layer_groups}"
        prefix = str(extra.get("cache_prefix", "") or "")
        self.base = f"{prefix}mooring-vllm/{model}/{layout}"

    def rank(self, tp_rank: int, pp_rank: int) -> str:
        """The namespace of one worker's blocks."""
        return f"{self.base}/tp{tp_rank}of{self.tp_size}/pp{pp_rank}of{self.pp_size}"

    def every_rank(self) -> list[str]:
        """The namespaces of all the workers of one engine."""
        return [self.rank(t, p) for p in range(self.pp_size) for t in range(self.tp_size)]

    def block_keys(self, namespace: str, block_hash: str) -> list[str]:
        """A block's keys in ``namespace``: one, or one per layer group (``/<group>``)."""
        key = f"{namespace}/{block_hash}"
        if self.layer_groups == 1:
            return [key]
        return [f"{key}/{g}" for g in range(self.layer_groups)]


# ---- scheduler side ----------------------------------------------------------------------------


class _Scheduler:
    def __init__(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> None:
        settings = _settings(vllm_config)
        self.names = _Namespace(vllm_config, kv_cache_config)
        self.block_size = self.names.block_size
        self.prefetch = bool(settings.get("prefetch", True))
        transfer = vllm_config.kv_transfer_config
        self.can_save = transfer is not None and transfer.kv_role in ("kv_producer", "kv_both")
        self.can_load = transfer is not None and transfer.kv_role in ("kv_consumer", "kv_both")
        # The scheduler asks the cluster itself (no round trip through a worker); it
        # contributes no memory.
        self.store = _connect(settings, 0, "scheduler")
        self.requests: dict[str, Request] = {}
        # req_id -> (first block to load, blocks to load, blocks probed)
        self.pending_loads: dict[str, tuple[int, int, int]] = {}
        self.loads: list[_Transfer] = []
        self.saved_blocks: dict[str, int] = {}  # req_id -> full prompt blocks handed to save

    def lookup(self, request: Request, num_computed_tokens: int) -> int:
        if not self.can_load:
            return 0
        # vLLM must compute at least the last prompt token to sample the next one.
        full = (request.num_tokens - 1) // self.block_size
        first = num_computed_tokens // self.block_size
        hashes = [bytes(h).hex() for h in request.block_hashes[first:full]]
        if not hashes:
            return 0
        namespaces = self.names.every_rank()
        keys = [k for h in hashes for ns in namespaces for k in self.names.block_keys(ns, h)]
        per_block = len(keys) // len(hashes)
        found = self.store.batch_is_exist(keys, prefetch=self.prefetch)
        hits = 0
        for i in range(len(hashes)):
            if all(code == 1 for code in found[i * per_block : (i + 1) * per_block]):
                hits += 1
            else:
                break
        if any(code < 0 for code in found):
            logger.warning(
                "MooringConnector: lookup of %s probed %d keys, some failed (codes %s); "
                "counting the blocks before the first failure",
                request.request_id,
                len(keys),
                sorted({c for c in found if c < 0}),
            )
        self.requests[request.request_id] = request
        self.pending_loads[request.request_id] = (first, hits, len(hashes))
        return hits * self.block_size

    def after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external: int) -> None:
        self.requests[request.request_id] = request
        pending = self.pending_loads.pop(request.request_id, None)
        if pending is None or num_external == 0:
            return
        first, count, probed = pending
        block_ids = blocks.get_block_ids()[0][first : first + count]
        hashes = [bytes(h).hex() for h in request.block_hashes[first : first + count]]
        self.loads.append(_Transfer(request.request_id, hashes, list(block_ids), probed))

    def build_meta(self, output: SchedulerOutput) -> MooringConnectorMetadata:
        meta = MooringConnectorMetadata(loads=self.loads)
        self.loads = []
        for req_id in output.finished_req_ids:
            self.requests.pop(req_id, None)
            self.saved_blocks.pop(req_id, None)
            self.pending_loads.pop(req_id, None)
        if not self.can_save:
            return meta
        computed = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
        cached = output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            computed[req_id] = cached.num_computed_tokens[i]
            if req_id in cached.resumed_req_ids:
                # Preempted and back: its blocks are new; save from the start again
                # (what is already stored is deduplicated by the worker).
                self.saved_blocks.pop(req_id, None)
        state = output.kv_connector_block_state
        for req_id, scheduled in output.num_scheduled_tokens.items():
            request = self.requests.get(req_id)
            if request is None or state is None:
                continue
            done = min(computed[req_id] + scheduled, request.num_prompt_tokens)
            full = min(done // self.block_size, len(request.block_hashes))
            start = self.saved_blocks.get(req_id, 0)
            if full <= start:
                continue
            block_ids = state.get_block_ids(req_id)
            if block_ids is None:
                continue
            hashes = [bytes(h).hex() for h in request.block_hashes[start:full]]
            meta.saves.append(_Transfer(req_id, hashes, list(block_ids[0][start:full])))
            self.saved_blocks[req_id] = full
        return meta

    def close(self) -> None:
        self.store.close()


# ---- worker side -------------------------------------------------------------------------------


def _regions(tensor: torch.Tensor) -> list[tuple[int, int, int]]:
    """``(address of block 0, bytes between blocks, bytes per block)`` for each contiguous
    piece of a block in a layer's cache whose first dimension is the block."""
    first = tensor[0]
    if first.is_contiguous():
        return [(tensor.data_ptr(), tensor.stride(0) * tensor.element_size(), first.nbytes)]
    if tensor.dim() < 3:
        raise ValueError(
            f"MooringConnector cannot lay out a KV-cache block of shape {tuple(first.shape)} "
            f"and strides {first.stride()} as contiguous pieces"
        )
    pieces = []
    for j in range(tensor.shape[1]):
        pieces.extend(_regions(tensor[:, j]))
    return pieces


class _Worker:
    def __init__(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> None:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        settings = _settings(vllm_config)
        self.names = _Namespace(vllm_config, kv_cache_config)
        tp_rank = get_tp_group().rank_in_group
        pp_rank = get_pp_group().rank_in_group
        self.namespace = self.names.rank(tp_rank, pp_rank)
        self.num_blocks = kv_cache_config.num_blocks
        self.layers = list(kv_cache_config.kv_cache_groups[0].layer_names)
        self.store = _connect(settings, settings.get("segment_size", 0), "worker")
        self.config = ReplicateConfig()
        self.config.replica_num = int(settings.get("replica_num", 1))
        self.backoff_base = float(settings.get("backoff_ms", 200)) / 1000
        self.backoff = self.backoff_base
        self.backoff_until = 0.0
        # Per layer group (one group unless layer_groups is set): the regions of a block.
        self.groups: list[list[tuple[int, int, int]]] = []
        self.group_of_layer: dict[str, int] = {}
        self.registered: list[int] = []
        self.block_bytes = 0
        # Layer-group loads under way: one event per group, set once it has landed.
        self.loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mooring-vllm-load")
        self.loading: Future | None = None
        self.landed: list[threading.Event] = []
        self.on_gpu = False
        self.invalid: set[int] = set()
        self.lock = threading.Lock()
        self.stats = MooringConnectorStats()
        self.sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mooring-vllm-save")
        self.in_flight: Future | None = None

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.v1.kv_cache_interface import group_kernel_blocks

        seen: set[int] = set()
        count = self.names.layer_groups
        self.groups = [[] for _ in range(count)]
        for index, name in enumerate(self.layers):
            # Contiguous groups of layers, as even as the count allows.
            group = index * count // len(self.layers)
            self.group_of_layer[name] = group
            cache = kv_caches[name]
            if isinstance(cache, list):
                cache = cache[0]
            cache = group_kernel_blocks(cache, self.num_blocks)
            storage = cache.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                code = self.store.register_buffer(storage.data_ptr(), storage.nbytes())
                if code != 0:
                    raise RuntimeError(
                        f"MooringConnector could not register the KV cache of {name} "
                        f"({storage.nbytes()} bytes on {cache.device}): code {code} "
                        f"({_code_name(code)}); the log above says why"
                    )
                self.registered.append(storage.data_ptr())
            self.groups[group].extend(_regions(cache))
            self.on_gpu = self.on_gpu or cache.is_cuda
        self.group_bytes = [sum(size for _, _, size in regions) for regions in self.groups]
        self.block_bytes = sum(self.group_bytes)
        logger.info(
            "MooringConnector: %d layers registered, %d bytes per block in %d pieces and %d "
            "value(s), on %s",
            len(self.layers),
            self.block_bytes,
            sum(len(regions) for regions in self.groups),
            count,
            "GPU (staged through pinned host memory)" if self.on_gpu else "host memory",
        )

    def _buffers(self, block_id: int, group: int) -> tuple[list[int], list[int]]:
        regions = self.groups[group]
        return (
            [base + block_id * stride for base, stride, _ in regions],
            [size for _, _, size in regions],
        )

    def _keys(self, transfer: _Transfer, group: int) -> list[str]:
        return [self.names.block_keys(self.namespace, h)[group] for h in transfer.hashes]

    def wait_for_previous_save(self) -> None:
        """Blocks until the last step's save has read its blocks: the forward pass about to
        run may write them."""
        future, self.in_flight = self.in_flight, None
        if future is not None:
            future.result()

    def load(self, loads: list[_Transfer]) -> None:
        """Loads this step's blocks: at once with one layer group; with several, on the
        loading thread, group after group, each announced as it lands (see
        :meth:`wait_for_layer`)."""
        if len(self.groups) == 1 or not loads:
            self._load(loads, [])
            return
        self.landed = [threading.Event() for _ in self.groups]
        self.loading = self.loader.submit(self._load, loads, self.landed)

    def wait_for_layer(self, layer_name: str) -> None:
        """Blocks until the layer group holding ``layer_name`` has landed."""
        group = self.group_of_layer.get(layer_name)
        if self.landed and group is not None:
            self.landed[group].wait()

    def wait_for_load(self) -> None:
        """Blocks until this step's loads are all done (their failures counted)."""
        future, self.loading = self.loading, None
        if future is not None:
            future.result()

    def _load(self, loads: list[_Transfer], landed: list[threading.Event]) -> None:
        started = time.perf_counter()
        # (transfer, block position) -> the first failing code.
        failures: dict[tuple[int, int], int] = {}
        try:
            for group, bytes_per_block in enumerate(self.group_bytes):
                for t, transfer in enumerate(loads):
                    ptrs, sizes = [], []
                    for block_id in transfer.block_ids:
                        p, s = self._buffers(block_id, group)
                        ptrs.append(p)
                        sizes.append(s)
                    codes = self.store.batch_get_into_multi_buffers(
                        self._keys(transfer, group), ptrs, sizes
                    )
                    for i, code in enumerate(codes):
                        if code != bytes_per_block:
                            failures.setdefault((t, i), code)
                if landed:
                    landed[group].set()
        finally:
            for event in landed:
                event.set()
        elapsed = time.perf_counter() - started
        for t, transfer in enumerate(loads):
            failed = [
                (block_id, failures[(t, i)])
                for i, block_id in enumerate(transfer.block_ids)
                if (t, i) in failures
            ]
            if failed:
                logger.warning(
                    "MooringConnector: %d of %d blocks of %s could not be loaded (codes %s); "
                    "vLLM recomputes them",
                    len(failed),
                    len(transfer.block_ids),
                    transfer.req_id,
                    sorted({_code_name(c) if c < 0 else f"{c} bytes" for _, c in failed}),
                )
            loaded = len(transfer.block_ids) - len(failed)
            with self.lock:
                self.invalid.update(block_id for block_id, _ in failed)
                self.stats.record(
                    transfer.req_id,
                    lookup_blocks=transfer.lookup_blocks,
                    hit_blocks=len(transfer.block_ids),
                    loaded_blocks=loaded,
                    load_failed_blocks=len(failed),
                    loaded_bytes=loaded * self.block_bytes,
                    load_seconds=elapsed / max(len(loads), 1),
                )

    def save(self, saves: list[_Transfer]) -> None:
        if not saves:
            return
        event = None
        if self.on_gpu:
            event = torch.cuda.Event()
            event.record()
        self.in_flight = self.sender.submit(self._save, saves, event)

    def _save(self, saves: list[_Transfer], event: Any) -> None:
        if event is not None:
            event.synchronize()  # the forward pass has written the blocks
        for transfer in saves:
            try:
                self._save_one(transfer)
            except Exception:
                logger.exception("MooringConnector: saving %s failed", transfer.req_id)

    def _save_one(self, transfer: _Transfer) -> None:
        started = time.perf_counter()
        if time.monotonic() < self.backoff_until:
            with self.lock:
                self.stats.record(transfer.req_id, backoff_skipped_blocks=len(transfer.hashes))
            return
        groups = len(self.groups)
        # Block i's keys are keys[i * groups : (i + 1) * groups], one per layer group.
        keys = [k for h in transfer.hashes for k in self.names.block_keys(self.namespace, h)]
        exist = self.store.batch_is_exist(keys)
        missing = [
            i
            for i in range(len(transfer.hashes))
            if any(code != 1 for code in exist[i * groups : (i + 1) * groups])
        ]
        deduplicated = len(transfer.hashes) - len(missing)
        # One code per missing block: its first failure, else 0.
        codes: list[int] = []
        if missing:
            ptrs, sizes = [], []
            for i in missing:
                for group in range(groups):
                    p, s = self._buffers(transfer.block_ids[i], group)
                    ptrs.append(p)
                    sizes.append(s)
            put = self.store.batch_put_from_multi_buffers(
                [keys[i * groups + g] for i in missing for g in range(groups)],
                ptrs,
                sizes,
                self.config,
            )
            codes = [
                next((c for c in put[j * groups : (j + 1) * groups] if c < 0), 0)
                for j in range(len(missing))
            ]
        refused = sum(1 for c in codes if c == ErrorCode.NO_AVAILABLE_HANDLE)
        failed = sum(1 for c in codes if c < 0) - refused
        saved = len(codes) - refused - failed
        if refused:
            self.backoff_until = time.monotonic() + self.backoff
            logger.warning(
                "MooringConnector: the pool refused %d blocks of %s with -200 "
                "(NO_AVAILABLE_HANDLE: full of what may not be evicted); storing pauses "
                "for %.0f ms",
                refused,
                transfer.req_id,
                self.backoff * 1000,
            )
            self.backoff = min(self.backoff * 2, 5.0)
        elif saved:
            self.backoff = self.backoff_base
        if failed:
            logger.warning(
                "MooringConnector: %d blocks of %s were not stored (codes %s)",
                failed,
                transfer.req_id,
                sorted({_code_name(c) for c in codes if c < 0 and c != -200}),
            )
        with self.lock:
            self.stats.record(
                transfer.req_id,
                saved_blocks=saved,
                deduplicated_blocks=deduplicated,
                refused_blocks=refused,
                failed_blocks=failed,
                saved_bytes=saved * self.block_bytes,
                save_seconds=time.perf_counter() - started,
            )

    def take_invalid(self) -> set[int]:
        with self.lock:
            invalid, self.invalid = self.invalid, set()
        return invalid

    def take_stats(self) -> MooringConnectorStats | None:
        with self.lock:
            if self.stats.is_empty():
                return None
            stats, self.stats = self.stats, MooringConnectorStats()
        return stats

    def close(self) -> None:
        try:
            self.wait_for_load()
            self.wait_for_previous_save()
        finally:
            self.loader.shutdown(wait=True)
            self.sender.shutdown(wait=True)
            for address in self.registered:
                self.store.unregister_buffer(address)
            self.registered = []
            self.store.close()


# ---- the connector -----------------------------------------------------------------------------


class MooringConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's KV connector interface over a Mooring cluster (see the module's doc)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if kv_cache_config is None:
            raise ValueError("MooringConnector needs vLLM's KV-cache config (vLLM ≥ 0.33)")
        self._scheduler: _Scheduler | None = None
        self._worker: _Worker | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = _Scheduler(vllm_config, kv_cache_config)
        else:
            self._worker = _Worker(vllm_config, kv_cache_config)

    # ---- scheduler side ----

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """Tokens beyond ``num_computed_tokens`` whose blocks the cluster holds (loaded
        synchronously, before the forward pass that needs them)."""
        assert self._scheduler is not None
        hit = self._scheduler.lookup(request, num_computed_tokens)
        return max(0, hit - num_computed_tokens % self._scheduler.block_size), False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Plans the load of the blocks found, into the blocks vLLM allocated."""
        assert self._scheduler is not None
        self._scheduler.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """This step's loads, and the prompt blocks its forward pass fills (to save)."""
        assert self._scheduler is not None
        return self._scheduler.build_meta(scheduler_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Blocks may be freed at once: a save has read them before the next step runs."""
        return False, None

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """As :meth:`request_finished` (one KV-cache group is all this connector stores)."""
        return False, None

    # ---- worker side ----

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Registers the KV-cache tensors (host or CUDA memory) with the store."""
        assert self._worker is not None
        self._worker.register(kv_caches)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """Takes this step's plan, once the last step's save is done with its blocks."""
        if self._worker is not None:
            self._worker.wait_for_previous_save()
        super().bind_connector_metadata(connector_metadata)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Loads this step's blocks into the KV cache: before the forward pass, or, with
        ``layer_groups``, beside it, one layer group after another."""
        assert self._worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, MooringConnectorMetadata)
        self._worker.load(meta.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Waits for the layer's group to land (nothing to wait for with one group: every
        layer was loaded in :meth:`start_load_kv`)."""
        if self._worker is not None:
            self._worker.wait_for_layer(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        """Nothing per layer: the step's blocks are saved whole in :meth:`wait_for_save`."""

    def wait_for_save(self) -> None:
        """Starts saving the blocks this step filled, on the saving thread (once this
        step's loads are done)."""
        assert self._worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, MooringConnectorMetadata)
        self._worker.wait_for_load()
        self._worker.save(meta.saves)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Nothing is ever held past a step: loads are synchronous, and saves done before
        the next step's forward pass."""
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks that were to be loaded and could not be (missing, damaged, unreachable)."""
        assert self._worker is not None
        self._worker.wait_for_load()
        return self._worker.take_invalid()

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """Per-request counts since the last call (``None`` if nothing happened)."""
        if self._worker is None:
            return None
        self._worker.wait_for_load()
        return self._worker.take_stats()

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats:
        """vLLM rebuilds a worker's stats from their ``data`` with this."""
        return MooringConnectorStats(data=data if data is not None else {})

    def shutdown(self) -> None:
        """Waits for a save in flight, unregisters the KV cache and leaves the cluster."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.close()
