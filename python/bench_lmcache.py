"""LMCache's server storing into Mooring, against LMCache's local CPU tier, in one run.

    python python/bench_lmcache.py                    # starts a master and a node for the run
    python python/bench_lmcache.py --sizes 1MiB,4MiB --keys 16 --rounds 8

Each row is one of LMCache's L2 adapters, built by LMCache's own factory from the JSON that
``lmcache server --l2-adapter`` takes, and driven through LMCache's L2 adapter test helpers
(store, lookup-and-lock, load: one submit of ``--keys`` memory objects, waited for on the
adapter's eventfd) exactly as LMCache's server would drive it:

- ``mooring plugin`` / ``mooring native_plugin``: ``mooring.integrations.lmcache`` against
  the cluster (the values live on a ``mooring node`` process on this host, reached through
  its shared memory, as a node on the server's host is);
- ``lmcache fs (/dev/shm)``: LMCache's own file-system L2 adapter on tmpfs, so in this
  machine's memory: the same adapter path into local RAM.

and the last row is LMCache's local CPU tier itself: a chunk stored in L1 is a copy into an
L1 memory object, a chunk loaded from it a copy out (``torch`` copies between the same
memory objects, no adapter). Store and load GB/s count the bytes of a submit over the time
from submit to completion (after one uncounted round that warms up connections and pages);
every value loaded is checked byte for byte.

Needs LMCache (``pip install lmcache``, or scripts/test-python.sh's directory on
``PYTHONPATH``), the package (``pip install ./python``) and the ``mooring`` binary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from lmcache.v1.check.check_mode_test_l2_adapter import (
    _create_l1_memory_desc,
    _create_memory_obj,
    _run_load_phase,
    _run_lookup_phase,
    _run_store_phase,
)
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config
from mooring.store import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))
from conftest import Master, Node
from lmcache_objects import keys_for

MODEL = "bench/model"


def adapter(spec: dict, l1: torch.Tensor):
    config = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[json.dumps(spec)]))
    return create_l2_adapter(config.adapters[0], l1_memory_desc=_create_l1_memory_desc(l1))


def memory_objects(l1: torch.Tensor, first: int, n: int, words: int):
    flat = l1.view(-1)
    return [
        _create_memory_obj(
            raw_data=flat[(first + i) * words : (first + i + 1) * words],
            obj_size=words,
            dtype=torch.int32,
        )
        for i in range(n)
    ]


def fill(objs, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for o in objs:
        o.tensor.copy_(torch.randint(-(2**31), 2**31 - 1, o.tensor.shape, generator=g))


def run_adapter(name: str, spec: dict, size: int, keys: int, rounds: int) -> dict:
    words = size // 4
    l1 = torch.empty(2 * keys * words, dtype=torch.int32)
    a = adapter(spec, l1)
    stored = memory_objects(l1, 0, keys, words)
    loaded = memory_objects(l1, keys, keys, words)
    store_s = load_s = lookup_s = 0.0
    try:
        # Round 0 warms up (connections, first touches of the pages) and is not counted.
        for r in range(rounds + 1):
            if r == 1:
                store_s = load_s = lookup_s = 0.0
            fill(stored, r)
            ks = keys_for(f"{name}-{size}-{r}-{time.monotonic_ns()}", keys, MODEL)
            t = time.perf_counter()
            _, ok = _run_store_phase(a, ks, stored)
            store_s += time.perf_counter() - t
            if not ok:
                raise SystemExit(f"{name}: store of round {r} failed")
            t = time.perf_counter()
            _, found = _run_lookup_phase(a, ks)
            lookup_s += time.perf_counter() - t
            if not all(found.test(i) for i in range(keys)):
                raise SystemExit(f"{name}: lookup of round {r} missed keys just stored")
            for o in loaded:
                o.tensor.zero_()
            t = time.perf_counter()
            _, got = _run_load_phase(a, ks, loaded)
            load_s += time.perf_counter() - t
            a.submit_unlock(ks)
            for i in range(keys):
                if not got.test(i) or not torch.equal(stored[i].tensor, loaded[i].tensor):
                    raise SystemExit(f"{name}: key {i} of round {r} did not load byte for byte")
    finally:
        a.close()
    total = size * keys * rounds
    return row(name, size, keys, total / store_s, total / load_s, lookup_s / rounds)


def run_l1_copy(size: int, keys: int, rounds: int) -> dict:
    """LMCache's local CPU tier: copies into and out of L1 memory objects."""
    words = size // 4
    l1 = torch.empty(2 * keys * words, dtype=torch.int32)
    source = torch.empty(keys * words, dtype=torch.int32)
    objs = memory_objects(l1, 0, keys, words)
    back = memory_objects(l1, keys, keys, words)
    l1.zero_()
    store_s = load_s = 0.0
    for r in range(rounds + 1):
        if r == 1:
            store_s = load_s = 0.0
        source.random_(generator=torch.Generator().manual_seed(r))
        t = time.perf_counter()
        for i, o in enumerate(objs):
            o.tensor.copy_(source[i * words : (i + 1) * words])
        store_s += time.perf_counter() - t
        t = time.perf_counter()
        for o, b in zip(objs, back, strict=True):
            b.tensor.copy_(o.tensor)
        load_s += time.perf_counter() - t
        if not torch.equal(l1[: keys * words], l1[keys * words :]):
            raise SystemExit("L1 copy: bytes differ")
    total = size * keys * rounds
    return row("lmcache L1 (local CPU tier)", size, keys, total / store_s, total / load_s, None)


def row(name, size, keys, store_bps, load_bps, lookup_s) -> dict:
    return {
        "backend": name,
        "size": size,
        "keys_per_submit": keys,
        "store_gbps": store_bps / 1e9,
        "load_gbps": load_bps / 1e9,
        "lookup_ms": None if lookup_s is None else lookup_s * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--master", help="a running master (default: start one and a node)")
    parser.add_argument("--sizes", default="256KiB,1MiB,4MiB", help="memory object sizes")
    parser.add_argument("--keys", type=int, default=16, help="memory objects per submit")
    parser.add_argument("--rounds", type=int, default=8, help="submits per size and backend")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    # One intra-op thread: torch's threaded copy of an L1-sized chunk is 100x slower here
    # (its threads spin against each other and the runtime's), which would flatter Mooring.
    torch.set_num_threads(1)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    started = []
    master = args.master
    if master is None:
        m = Master()
        # Room for everything the Mooring rows store (nothing is deleted), and some.
        room = 2 * (args.rounds + 1) * args.keys * sum(sizes) + (256 << 20)
        started += [m, Node(m, "--size", f"{room >> 20}MiB")]
        master = m.address
    shm = tempfile.mkdtemp(prefix="lmcache-bench-", dir="/dev/shm")
    backends = {
        "mooring plugin": {
            "type": "plugin",
            "module_path": "mooring.integrations.lmcache",
            "class_name": "MooringL2Adapter",
            "adapter_params": {"master": master},
        },
        "mooring native_plugin": {
            "type": "native_plugin",
            "module_path": "mooring.integrations.lmcache",
            "class_name": "MooringConnector",
            "adapter_params": {"master": master},
        },
        "lmcache fs (/dev/shm)": {"type": "fs", "base_path": shm},
    }
    rows = []
    try:
        for size in sizes:
            for name, spec in backends.items():
                rows.append(run_adapter(name, spec, size, args.keys, args.rounds))
            rows.append(run_l1_copy(size, args.keys, args.rounds))
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        for p in reversed(started):
            p.stop()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{args.keys} memory objects per submit, {args.rounds} submits; cpus={os.cpu_count()}")
    print(f"{'backend':30} {'size':>8} {'store GB/s':>11} {'load GB/s':>10} {'lookup ms':>10}")
    for r in rows:
        lookup = "-" if r["lookup_ms"] is None else f"{r['lookup_ms']:.2f}"
        print(
            f"{r['backend']:30} {r['size'] >> 10:>6}Ki {r['store_gbps']:>11.2f} "
            f"{r['load_gbps']:>10.2f} {lookup:>10}"
        )


if __name__ == "__main__":
    main()
