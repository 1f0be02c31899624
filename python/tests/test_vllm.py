"""vLLM's KV connectors against a real Mooring cluster: vLLM's own ``MooncakeStoreConnector``
(through the opt-in ``mooncake.store`` name, python/mooncake-compat) and ours,
``mooring.integrations.vllm.MooringConnector``.

Each test runs two engines, A and B, as vLLM runs them: vLLM's real ``Scheduler`` (which
creates the scheduler-side connector through vLLM's connector factory, looks up prefixes,
allocates blocks and builds the connector metadata) and a worker-side connector made by the
same factory, driven through vLLM's public connector calls in the order vLLM's model runner
makes them (``bind_connector_metadata``, ``start_load_kv``, ``wait_for_layer_load``,
``save_kv_layer``, ``wait_for_save``, ``get_transfer_results``/``get_finished``,
``get_block_ids_with_load_errors``, ``get_kv_connector_stats``,
``build_connector_worker_meta``, ``clear_connector_metadata``). The KV cache is CPU tensors,
and the forward pass writes, for every token it computes, bytes that depend only on the
prompt up to that token: so a block B loaded from the store must equal, byte for byte, the
block A computed, and a block B loaded wrongly cannot pass for one.

The seams, and why (nothing that is tested is replaced):

- ``VLLM_TARGET_DEVICE=cpu``: vLLM's own switch for its CPU platform. PyPI's vLLM is a CUDA
  build, so on a machine without a GPU it finds no platform; this picks vLLM's CPU platform
  object, with which ``VllmConfig`` accepts CPU tensors as the KV cache.
- ``torch.cuda.Event``, for vLLM's ``MooncakeStoreConnector`` only: its ``wait_for_save``
  records a CUDA event after the forward pass and its sending thread waits on it before
  reading the KV blocks, which needs a GPU. The forward pass here writes CPU tensors
  synchronously, so there is nothing to wait for: the stand-in's ``record`` and
  ``synchronize`` return at once. On a GPU machine no stand-in is installed (the test
  checks ``torch.cuda.is_available()``).

Every other piece is vLLM's: config objects, scheduler, block pool, request hashing,
connector factory, and for the built-in connector its scheduler, worker, lookup server (ZMQ
on an IPC socket), sending and receiving threads.

vLLM itself needs a torch other than the one in the venv and an ``openai`` newer than
SGLang's pin, so scripts/test-python.sh installs it in a directory of its own and runs this
file in a second pytest with that directory on ``PYTHONPATH``. Where vLLM cannot be
imported, the tests are skipped with the reason printed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

try:
    import torch
    import vllm  # noqa: F401
    from vllm.distributed.kv_transfer.kv_connector.v1 import mooncake  # noqa: F401
except Exception as e:  # noqa: BLE001 - any failure to import vLLM means: skip, saying why
    reason = (
        f"vLLM is not importable here ({type(e).__name__}: {e}); scripts/test-python.sh "
        "installs it in a directory of its own and runs this file with it on PYTHONPATH"
    )
    print(f"SKIPPED: {reason}")
    pytest.skip(reason, allow_module_level=True)

if importlib.util.find_spec("mooncake") is None:
    reason = (
        "the mooncake.store name is not installed: pip install ./python/mooncake-compat "
        "(scripts/test-python.sh puts it beside vLLM)"
    )
    print(f"SKIPPED: {reason}")
    pytest.skip(reason, allow_module_level=True)

from conftest import Master, Node, connect, free_port, mooring_binary
from mooring.store import ReplicateConfig
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.forward_context import set_forward_context
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK = 16  # tokens per block
LAYERS = 2
KV_HEADS = 2
HEAD_DIM = 16
NUM_BLOCKS = 64
NO_AVAILABLE_HANDLE = -200

CONNECTORS = ["MooncakeStoreConnector", "MooringConnector"]


# ---- vLLM's configuration --------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A model vLLM can configure without a hub: a two-layer Llama's config.json (no weights
    are ever loaded: nothing here runs the model)."""
    d = tmp_path_factory.mktemp("model")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": KV_HEADS * 2 * HEAD_DIM,
        "intermediate_size": 128,
        "num_attention_heads": KV_HEADS * 2,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": LAYERS,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
        "torch_dtype": "float32",
    }
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.fixture(scope="module")
def model_config(model_dir) -> ModelConfig:
    return ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, dtype="float32", max_model_len=1024
    )


@pytest.fixture(scope="module", autouse=True)
def distributed(model_config):
    """vLLM's process groups for one rank (gloo, on loopback): the connectors ask them for
    their tensor-parallel rank."""
    from vllm.distributed import (
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )

    config = make_vllm_config(model_config, "MooncakeStoreConnector", {})
    with set_current_vllm_config(config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
            local_rank=0,
            backend="gloo",
        )
        ensure_model_parallel_initialized(1, 1)
    yield


def make_vllm_config(model_config: ModelConfig, connector: str, extra: dict) -> VllmConfig:
    transfer = {"kv_connector": connector, "kv_role": "kv_both", "kv_connector_extra_config": extra}
    if connector == "MooringConnector":
        transfer["kv_connector_module_path"] = "mooring.integrations.vllm"
    transfer["kv_load_failure_policy"] = "recompute"
    return VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(block_size=BLOCK),
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=1024,
            max_num_seqs=8,
            max_model_len=1024,
            is_encoder_decoder=False,
        ),
        kv_transfer_config=KVTransferConfig(**transfer),
        device_config=DeviceConfig("cpu"),
    )


def kv_cache_config() -> KVCacheConfig:
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    spec = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_DIM, dtype=torch.float32
    )
    per_block = 2 * BLOCK * KV_HEADS * HEAD_DIM * 4
    return KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[
            KVCacheTensor(
                size=per_block * NUM_BLOCKS, layers=[n], layer_stride=0, block_stride=per_block
            )
            for n in layers
        ],
        kv_cache_groups=[KVCacheGroupSpec(layers, spec)],
    )


class HostEvent:
    """Stands in for ``torch.cuda.Event`` where there is no GPU (see the module's doc): the
    forward pass wrote CPU tensors before returning, so there is nothing to wait for."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


# ---- an engine: vLLM's scheduler, a worker-side connector, CPU KV tensors ---------------------


def token_kv(prompt: tuple[int, ...], position: int, layer: int) -> np.ndarray:
    """The K and V a model would write for ``prompt[position]``: a function of the prompt up
    to and including that token, and of the layer, only."""
    seed = hash((prompt[: position + 1], layer)) & 0xFFFFFFFF
    rng = np.random.default_rng(seed)
    return rng.standard_normal((2, KV_HEADS, HEAD_DIM), dtype=np.float32)


class Engine:
    """One vLLM instance: its scheduler (with the scheduler-side connector that vLLM's factory
    makes from the kv-transfer config) and one worker (the worker-side connector and its KV
    cache), stepped as vLLM's engine core and model runner step them."""

    def __init__(self, model_config: ModelConfig, connector: str, extra: dict) -> None:
        self.config = make_vllm_config(model_config, connector, extra)
        self.config.cache_config.num_gpu_blocks = NUM_BLOCKS
        kv_config = kv_cache_config()
        self.hasher = get_request_block_hasher(BLOCK, sha256)
        init_none_hash(sha256)
        with set_current_vllm_config(self.config):
            self.scheduler = Scheduler(
                vllm_config=self.config,
                kv_cache_config=kv_config,
                structured_output_manager=StructuredOutputManager(self.config),
                block_size=BLOCK,
                log_stats=True,
            )
            self.worker = KVConnectorFactory.create_connector(
                config=self.config, role=KVConnectorRole.WORKER, kv_cache_config=kv_config
            )
        # Blocks first, as vLLM's attention backends lay a layer's cache out; NaN until
        # written, so a block nobody wrote never matches.
        self.kv = {
            name: torch.full((NUM_BLOCKS, 2, BLOCK, KV_HEADS, HEAD_DIM), float("nan"))
            for name in kv_config.kv_cache_groups[0].layer_names
        }
        self.worker.register_kv_caches(self.kv)
        self.prompts: dict[str, tuple[int, ...]] = {}
        self.blocks: dict[str, list[int]] = {}
        self.invalid_block_ids: set[int] = set()
        self.stats = []
        self.computed: dict[str, list[int]] = {}  # positions the forward pass computed

    def add(self, req_id: str, prompt: list[int]) -> Request:
        request = Request(
            request_id=req_id,
            prompt_token_ids=list(prompt),
            sampling_params=SamplingParams(max_tokens=1, temperature=0.0),
            pooling_params=None,
            block_hasher=self.hasher,
        )
        self.prompts[req_id] = tuple(prompt)
        self.computed[req_id] = []
        self.scheduler.add_request(request)
        return request

    def forward(self, output) -> dict[str, list[int]]:
        """Writes the KV of every token scheduled this step; answers the sampled tokens of
        requests whose prompt is now complete."""
        for new in output.scheduled_new_reqs:
            self.blocks[new.req_id] = list(new.block_ids[0])
        cached = output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if cached.new_block_ids[i] is not None:
                if req_id in cached.resumed_req_ids:
                    self.blocks[req_id] = list(cached.new_block_ids[i][0])
                else:
                    self.blocks[req_id].extend(cached.new_block_ids[i][0])
        computed_before = {n.req_id: n.num_computed_tokens for n in output.scheduled_new_reqs}
        for i, req_id in enumerate(cached.req_ids):
            computed_before[req_id] = cached.num_computed_tokens[i]
        sampled = {}
        for req_id, count in output.num_scheduled_tokens.items():
            prompt = self.prompts[req_id]
            start = computed_before[req_id]
            for layer, name in enumerate(self.kv):
                for position in range(start, min(start + count, len(prompt))):
                    block = self.blocks[req_id][position // BLOCK]
                    value = torch.from_numpy(token_kv(prompt, position, layer))
                    self.kv[name][block, :, position % BLOCK] = value
            self.computed[req_id].extend(range(start, min(start + count, len(prompt))))
            if start + count >= len(prompt):
                sampled[req_id] = [7]
        return sampled

    def step(self, between=None) -> None:
        """One engine step: schedule, run the worker (connector calls in vLLM's model
        runner's order around the forward pass), hand the output back to the scheduler.
        ``between(scheduler_output)`` runs after scheduling and before the worker."""
        with set_current_vllm_config(self.config):
            output = self.scheduler.schedule()
            if between is not None:
                between(output)
            worker = self.worker
            connector_output = KVConnectorOutput()
            with set_forward_context(None, self.config):
                worker.bind_connector_metadata(output.kv_connector_metadata)
                if output.has_sync_kv_loads:
                    worker.start_load_kv(None)
                for name in self.kv:
                    worker.wait_for_layer_load(name)
                sampled = self.forward(output)
                for name in self.kv:
                    worker.save_kv_layer(name, self.kv[name], None)
                if not output.has_sync_kv_loads:
                    worker.start_load_kv(None)
                worker.wait_for_save()
                results = worker.get_transfer_results(output.finished_req_ids)
                connector_output.finished_sending = results.finished_sending
                connector_output.finished_recving = results.finished_recving
                connector_output.failed_recving = results.failed_recving
                connector_output.invalid_block_ids = worker.get_block_ids_with_load_errors()
                connector_output.kv_connector_stats = worker.get_kv_connector_stats()
                connector_output.kv_cache_events = worker.get_kv_connector_kv_cache_events()
                connector_output.kv_connector_worker_meta = worker.build_connector_worker_meta()
                worker.clear_connector_metadata()
            self.invalid_block_ids |= connector_output.invalid_block_ids
            if connector_output.kv_connector_stats is not None:
                self.stats.append(connector_output.kv_connector_stats)
            req_ids = list(output.num_scheduled_tokens)
            runner_output = ModelRunnerOutput(
                req_ids=req_ids,
                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=[sampled.get(r, []) for r in req_ids],
                kv_connector_output=connector_output,
            )
            self.scheduler.update_from_output(output, runner_output)

    def busy(self) -> bool:
        connector = self.scheduler.connector
        return self.scheduler.has_requests() or connector.has_pending_push_work()

    def run(self, timeout: float = 30.0, between=None) -> None:
        """Steps until every request finished and the connector has no store job in flight
        (vLLM's engine keeps stepping for those too)."""
        deadline = time.monotonic() + timeout
        first = True
        while self.busy() or first:
            assert time.monotonic() < deadline, "the engine did not finish its requests"
            self.step(between if first else None)
            first = False
            time.sleep(0.01)

    def block_bytes(self, req_id: str, index: int) -> bytes:
        """The bytes of the request's ``index``-th block, every layer, K and V."""
        block = self.blocks[req_id][index]
        return b"".join(self.kv[name][block].numpy().tobytes() for name in self.kv)

    def expected_block_bytes(self, req_id: str, index: int) -> bytes:
        prompt = self.prompts[req_id]
        parts = []
        for layer in range(LAYERS):
            block = np.empty((2, BLOCK, KV_HEADS, HEAD_DIM), dtype=np.float32)
            for offset in range(BLOCK):
                block[:, offset] = token_kv(prompt, index * BLOCK + offset, layer)
            parts.append(block.tobytes())
        return b"".join(parts)

    def close(self) -> None:
        self.worker.shutdown()
        self.scheduler.shutdown()


# ---- the cluster ------------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path, request):
    """A master and one node holding the pool (8 MiB); engines contribute no memory, as
    vLLM's ``standalone-store`` mode has it. Parametrized ``"disk"``: a 4 MiB node with an SSD
    tier behind it, every value written through to it."""
    if getattr(request, "param", "memory") == "disk":
        master = Master("--lease-ttl", "200ms", "--offload-write-through")
        disk = tmp_path / "disk"
        disk.mkdir()
        node = Node(master, "--size", "4MiB", "--no-prefault", "--disk-dir", str(disk))
    else:
        master = Master("--lease-ttl", "200ms")
        node = Node(master, "--size", "8MiB", "--no-prefault")
    yield master, node
    node.stop()
    master.stop()


@pytest.fixture
def engines(cluster, model_config, tmp_path, monkeypatch, request):
    """Two engines (A saves, B loads) of the connector under test, against ``cluster``."""
    connector = request.param
    master, _ = cluster
    config = {
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": master.address,
        "protocol": "tcp",
        "device_name": "",
        "mode": "standalone-store",
        "global_segment_size": 0,
        "local_buffer_size": "16MB",
    }
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    monkeypatch.setenv("MOORING_MASTER", master.address)
    # vLLM's lookup socket (built-in connector) is an IPC path, which must stay under the
    # 107 bytes a Unix socket's name may have: a short directory, not pytest's tmp_path.
    rpc_dir = tempfile.mkdtemp(prefix="vllm-rpc-")
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", rpc_dir)
    if connector == "MooncakeStoreConnector" and not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "Event", HostEvent)
    made = []

    def make(**extra) -> Engine:
        # Each engine's lookup channel (built-in connector) gets its own socket.
        extra.setdefault("lookup_rpc_port", len(made) + 1)
        engine = Engine(request.getfixturevalue("model_config"), connector, extra)
        made.append(engine)
        return engine

    yield connector, make
    for engine in made:
        engine.close()
    shutil.rmtree(rpc_dir, ignore_errors=True)


def prompt(seed: int, length: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1, 1000, length)]


def stored_keys(master: Master) -> list[str]:
    """Every key in the cluster, as ``mooring ls`` lists them."""
    done = subprocess.run(
        [mooring_binary(), "ls", "--master", master.address, ""],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return [line.split()[-1] for line in done.stdout.splitlines()[:-1]]


def block_key(master: Master, request: Request, index: int) -> str:
    """The store key of the request's ``index``-th block: both connectors name a block by
    its vLLM block hash (in hex)."""
    digest = bytes(request.block_hashes[index]).hex()
    found = [k for k in stored_keys(master) if digest in k]
    assert len(found) == 1, (digest, found)
    return found[0]


def damage(node: Node, store, key: str) -> None:
    """Flips the first byte of ``key``'s replica in the node's memory (the segment is the
    node process's memory; root may write it through /proc), as a memory fault would."""
    replica = store.get_replica_desc(key)[0]
    with open(f"/proc/{node.process.pid}/mem", "r+b") as mem:
        mem.seek(replica.buffer_address)
        first = mem.read(1)
        mem.seek(replica.buffer_address)
        mem.write(bytes([first[0] ^ 0xFF]))


def fill_with_pinned(store, prefix: str) -> list[str]:
    """Fills the pool with hard-pinned values (model weights, say) until it refuses one with
    -200; answers their keys."""
    pinned = ReplicateConfig()
    pinned.with_hard_pin = True
    held = []
    for size in (512 << 10, 4 << 10):
        for i in range(4096):
            key = f"{prefix}/{size}/{i}"
            code = store.put(key, bytes(size), pinned)
            if code == NO_AVAILABLE_HANDLE:
                break
            assert code == 0, code
            held.append(key)
    return held


def merged(stats) -> dict[str, dict[str, float]]:
    """MooringConnector's per-request counts, summed over the steps' stats."""
    total: dict[str, dict[str, float]] = {}
    for step in stats:
        for req_id, counts in step.data["requests"].items():
            entry = total.setdefault(req_id, {})
            for name, value in counts.items():
                entry[name] = entry.get(name, 0) + value
    return total


# ---- the tests --------------------------------------------------------------------------------


@pytest.mark.parametrize("engines", CONNECTORS, indirect=True)
def test_blocks_saved_by_one_engine_are_found_and_loaded_byte_for_byte_by_another(engines):
    _connector, make = engines
    a = make()
    b = make()
    tokens = prompt(1, 4 * BLOCK + 5)  # four full blocks and a partial one

    a.add("r1", tokens)
    a.run()
    assert a.computed["r1"] == list(range(len(tokens)))
    for i in range(4):
        assert a.block_bytes("r1", i) == a.expected_block_bytes("r1", i)

    b.add("r1", tokens)
    b.run()
    # B's scheduler found the four full blocks through the store; B's forward pass computed
    # only what follows them, so the blocks' bytes came from A through the store.
    assert b.computed["r1"] == list(range(4 * BLOCK, len(tokens)))
    for i in range(4):
        assert b.block_bytes("r1", i) == a.block_bytes("r1", i), i
    assert b.invalid_block_ids == set()

    # A prompt sharing only the first two blocks: two are found, the rest computed.
    other = tokens[: 2 * BLOCK] + prompt(2, 2 * BLOCK + 3)
    b.add("r2", other)
    b.run()
    assert b.computed["r2"] == list(range(2 * BLOCK, len(other)))
    for i in range(2):
        assert b.block_bytes("r2", i) == a.expected_block_bytes("r1", i)
    for i in range(2, 4):
        assert b.block_bytes("r2", i) == b.expected_block_bytes("r2", i)


@pytest.mark.parametrize("engines", CONNECTORS, indirect=True)
def test_a_full_pool_answers_minus_200_storing_pauses_and_resumes(engines, cluster, caplog):
    connector, make = engines
    master, _ = cluster
    a = make()
    b = make()
    holder = connect(master, segment=0, local="1MB")
    try:
        held = fill_with_pinned(holder, "weights")
        assert held

        first = prompt(3, 3 * BLOCK + 1)
        a.add("r1", first)
        a.run()
        # The put was refused with -200 and the engine went on: its request finished, and
        # nothing of it is in the store.
        assert any("-200" in r.getMessage() for r in caplog.records), caplog.text
        assert a.computed["r1"] == list(range(len(first)))
        b.add("r1", first)
        b.run()
        assert b.computed["r1"] == list(range(len(first)))

        if connector == "MooringConnector":
            # Storing pauses: a request right after the refusal does not even try.
            a.stats.clear()
            a.add("r1b", prompt(6, 3 * BLOCK + 1))
            a.run()
            counts = merged(a.stats)["r1b"]
            assert counts["backoff_skipped_blocks"] == 3, counts
            assert counts.get("refused_blocks", 0) == 0, counts

        # Room is made, and once the back-off is over (MooringConnector's: 200 ms; vLLM's
        # connector tries again on the next request) the next request's blocks are stored
        # and found.
        assert holder.batch_remove(held) == [0] * len(held)
        time.sleep(0.5)
        second = prompt(4, 3 * BLOCK + 1)
        a.add("r2", second)
        a.run()
        b.add("r2", second)
        b.run()
        assert b.computed["r2"] == list(range(3 * BLOCK, len(second)))
        for i in range(3):
            assert b.block_bytes("r2", i) == a.block_bytes("r2", i)
    finally:
        holder.close()


@pytest.mark.parametrize("engines", CONNECTORS, indirect=True)
@pytest.mark.parametrize("fault", ["missing", "damaged"])
def test_a_missing_or_damaged_block_is_reported_and_recomputed(engines, cluster, fault):
    _connector, make = engines
    master, node = cluster
    a = make()
    b = make()
    tokens = prompt(5, 4 * BLOCK + 2)
    a.add("r1", tokens)
    a.run()

    holder = connect(master, segment=0, local="1MB")
    request = b.add("r1", tokens)
    hurt = []

    def after_lookup(output) -> None:
        # B's scheduler found all four blocks and allocated blocks to load them into; now,
        # before B's worker reads them, the third one goes missing or is damaged.
        key = block_key(master, request, 2)
        if fault == "missing":
            deadline = time.monotonic() + 5
            while (code := holder.remove(key)) != 0:
                assert time.monotonic() < deadline, code
                time.sleep(0.05)
        else:
            damage(node, holder, key)
        hurt.append(b.scheduler.kv_cache_manager.get_block_ids("r1")[0][2])

    try:
        b.run(between=after_lookup)
    finally:
        holder.close()
    # vLLM was told which block failed, and recomputed from it (policy "recompute"); the
    # blocks before it were loaded, never computed.
    assert b.invalid_block_ids == set(hurt)
    assert min(b.computed["r1"]) == 2 * BLOCK
    assert set(b.computed["r1"]) == set(range(2 * BLOCK, len(tokens)))
    for i in range(4):
        assert b.block_bytes("r1", i) == a.block_bytes("r1", i), i


# ---- MooringConnector only -------------------------------------------------------------------

BLOCK_BYTES = LAYERS * 2 * BLOCK * KV_HEADS * HEAD_DIM * 4


@pytest.mark.parametrize("engines", ["MooringConnector"], indirect=True)
def test_mooring_connector_counts_per_request_and_deduplicates_puts(engines):
    _, make = engines
    a = make()
    b = make()
    tokens = prompt(7, 4 * BLOCK + 3)
    a.add("r1", tokens)
    a.run()
    b.add("r1", tokens)
    b.run()
    saved = merged(a.stats)["r1"]
    assert saved["saved_blocks"] == 4 and saved["saved_bytes"] == 4 * BLOCK_BYTES, saved
    assert saved["deduplicated_blocks"] == 0, saved
    loaded = merged(b.stats)["r1"]
    assert loaded["lookup_blocks"] == 4 and loaded["hit_blocks"] == 4, loaded
    assert loaded["loaded_blocks"] == 4 and loaded["loaded_bytes"] == 4 * BLOCK_BYTES, loaded
    assert loaded["load_failed_blocks"] == 0, loaded
    # B's forward pass filled the same four prompt blocks (by loading them): its save found
    # them in the store and put none.
    assert loaded["deduplicated_blocks"] == 4 and loaded["saved_blocks"] == 0, loaded
    # vLLM's stats logger sums a step's stats with reduce().
    total = b.stats[0]
    for step in b.stats[1:]:
        total = total.aggregate(step)
    reduced = total.reduce()
    assert reduced["loaded_blocks"] == 4 and reduced["requests"] == 1, reduced


@pytest.mark.parametrize("engines", ["MooringConnector"], indirect=True)
def test_mooring_connector_loads_layer_groups_beside_the_forward_pass(engines, cluster):
    """With ``layer_groups``, a block is one value per group of layers, and a layer's wait
    returns once its own group has landed: the first layer computes while the next group is
    still being read."""
    _, make = engines
    master, _ = cluster
    a = make(layer_groups=2)
    b = make(layer_groups=2)
    tokens = prompt(11, 4 * BLOCK + 3)
    request = a.add("r1", tokens)
    a.run()
    digest = bytes(request.block_hashes[0]).hex()
    grouped = sorted(k.rsplit("/", 1)[-1] for k in stored_keys(master) if digest in k)
    assert grouped == ["0", "1"], grouped

    # B reads the second group only once the first layer's wait has returned: were the
    # wait to need every group, the read would time out.
    layers = list(b.kv)
    store = b.worker._worker.store
    real_get = store.batch_get_into_multi_buffers
    first_layer_ready = threading.Event()
    seen: list[str] = []

    def get(keys, ptrs, sizes):
        if keys and keys[0].endswith("/1"):
            ready = first_layer_ready.wait(10)
            seen.append("group 1 read after layer 0 was ready" if ready else "timed out")
        return real_get(keys, ptrs, sizes)

    real_wait = b.worker.wait_for_layer_load

    def wait(name: str) -> None:
        real_wait(name)
        if name == layers[0]:
            first_layer_ready.set()

    store.batch_get_into_multi_buffers = get
    b.worker.wait_for_layer_load = wait
    b.add("r1", tokens)
    b.run()
    assert seen == ["group 1 read after layer 0 was ready"], seen
    assert b.computed["r1"] == list(range(4 * BLOCK, len(tokens)))
    for i in range(4):
        assert b.block_bytes("r1", i) == a.block_bytes("r1", i), i
    assert b.invalid_block_ids == set()
    loaded = merged(b.stats)["r1"]
    assert loaded["loaded_blocks"] == 4 and loaded["loaded_bytes"] == 4 * BLOCK_BYTES, loaded

    # An engine storing whole blocks never reads grouped ones: it computes everything.
    c = make()
    c.add("r1", tokens)
    c.run()
    assert c.computed["r1"] == list(range(len(tokens)))


@pytest.mark.parametrize("cluster", ["disk"], indirect=True)
@pytest.mark.parametrize("engines", ["MooringConnector"], indirect=True)
def test_mooring_connector_lookup_prefetches_disk_held_blocks_into_memory(engines, cluster):
    _, make = engines
    master, _ = cluster
    a = make()
    b = make()
    tokens = prompt(8, 4 * BLOCK + 3)
    request = a.add("r1", tokens)
    a.run()
    holder = connect(master, segment=0, local="1MB")
    try:
        keys = [block_key(master, request, i) for i in range(4)]

        def on_disk_only(key: str) -> bool:
            replicas = holder.get_replica_desc(key)
            return bool(replicas) and all(r.is_local_disk_replica() for r in replicas)

        # Other values push the blocks out of the node's memory; write-through left each a
        # copy on the node's SSD. (A put finding memory full of values still waiting for
        # their disk copy is refused with -200 until the node copied them.) Probing a key
        # leases it, and a leased value is not evicted: probe only after a round of puts
        # and once the leases (200 ms) ran out.
        deadline = time.monotonic() + 30
        filler = 0
        while True:
            for _ in range(20):
                while (code := holder.put(f"filler/{filler}", bytes(256 << 10))) == -200:
                    assert time.monotonic() < deadline, "the node never copied values to disk"
                    time.sleep(0.02)
                assert code == 0, code
                filler += 1
            time.sleep(0.3)
            if all(on_disk_only(k) for k in keys):
                break
            assert time.monotonic() < deadline, [holder.get_replica_desc(k) for k in keys]
            time.sleep(0.3)

        in_memory_after_lookup = []

        def after_lookup(output) -> None:
            # B's scheduler has looked the prompt up (with prefetch), and its worker has not
            # read anything yet.
            in_memory_after_lookup.extend(
                any(r.is_memory_replica() for r in holder.get_replica_desc(k)) for k in keys
            )

        b.add("r1", tokens)
        b.run(between=after_lookup)
    finally:
        holder.close()
    assert in_memory_after_lookup == [True] * 4
    assert b.computed["r1"] == list(range(4 * BLOCK, len(tokens)))
    for i in range(4):
        assert b.block_bytes("r1", i) == a.block_bytes("r1", i), i
