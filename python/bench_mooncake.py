"""Mooring against Mooncake Store, in Mooncake's benchmark shape, alternated in one run.

    python python/bench_mooncake.py                  # 3 rounds, a table of ratios
    python python/bench_mooncake.py --rounds 5 --json results.json

One Python program drives both stores through the same ``MooncakeDistributedStore`` calls:
Mooncake's ``mooncake.store`` from PyPI (``mooncake-transfer-engine-non-cuda``, installed on
first use into its own virtual environment, ``--mooncake-venv``) and Mooring's
``mooring.store``. For each store a round starts its master, a writer process that contributes
a segment and puts every object into it (``preferred_segment``, so every get crosses from the
reader's process to the writer's), and a reader process that contributes none and reads them
back. One thread each; every value read is checked against what was written; only the time
inside the store's calls counts. Rounds alternate which store goes first, and each row's
figure is the median over rounds.

Rows: single ``get`` (4 KiB latency, 64 KiB-4 MiB throughput), ``is_exist`` and
``batch_is_exist`` (32 keys), and the zero-copy batch calls of 32 keys from and into one
registered buffer: ``batch_put_from`` (a local copy into the writer's own segment, shown
beside this machine's one-thread memcpy measured in the same process) and ``batch_get_into``.

Mooncake's master and clients listen on wildcard addresses, so the whole run happens in a
private network namespace with only loopback (``unshare -n``; ``--no-netns`` runs on the
host's network instead). Mooring's reader takes shared memory to the writer by default, as on
any one host; ``--mooring-transport tcp`` makes it use TCP like Mooncake's ``"tcp"``
protocol. Needs the ``mooring`` binary (as ``python/bench.py`` finds it) and the ``mooring``
package and numpy in the Python that runs this.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MOONCAKE_PACKAGE = "mooncake-transfer-engine-non-cuda==0.3.13.post1"
DEFAULT_VENV = Path.home() / ".cache" / "mooring-bench" / "mooncake-venv"
BATCH = 32
KIB, MIB = 1 << 10, 1 << 20
# (size, objects): the single-get rows read these; the batch rows use their own keys.
GET_OBJECTS = [(4 * KIB, 2000), (64 * KIB, 1000), (1 * MIB, 256), (4 * MIB, 128)]
BATCH_OBJECTS = [(1 * MIB, 256), (4 * MIB, 128)]
EXIST_CALLS = 4000
BATCH_GET_PASSES = 3
SEGMENT = 3 << 30
PATTERN = 1 << 16


# ---- values ------------------------------------------------------------------------------------


def pattern(size: int) -> np.ndarray:
    """Bytes from which every value of `size` is cut (the same in every process)."""
    return np.random.default_rng(size).integers(0, 256, size + PATTERN, dtype=np.uint8)


def offset(i: int) -> int:
    """Where value `i` starts in its pattern: distinct for the object counts used here."""
    return (i * 4099) % PATTERN


def key(run: str, kind: str, size: int, i: int) -> str:
    return f"{run}/{kind}/{size}/{i}"


# ---- the worker processes ----------------------------------------------------------------------


def open_store(args: argparse.Namespace, segment: int):
    if args.store == "mooncake":
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    else:
        from mooring.store import MooncakeDistributedStore, ReplicateConfig
    store = MooncakeDistributedStore()
    code = store.setup("127.0.0.1", "P2PHANDSHAKE", segment, 512 * MIB, "tcp", "", args.master)
    if code != 0:
        sys.exit(f"{args.store} {args.role}: setup failed with code {code}")
    return store, ReplicateConfig


def timed(call, *args):
    start = time.perf_counter()
    result = call(*args)
    return result, time.perf_counter() - start


def writer(args: argparse.Namespace) -> None:
    store, replicate_config = open_store(args, SEGMENT)
    config = replicate_config()
    config.preferred_segment = store.get_hostname()
    # One registered region per size holding every value of that size back to back, as an
    # engine registers its host pool once.
    made: dict[int, np.ndarray] = {}
    counts = dict(GET_OBJECTS)
    for size, n in BATCH_OBJECTS:
        counts[size] = max(counts.get(size, 0), n)
    for size, n in counts.items():
        base = pattern(size)
        region = np.empty(n * size, dtype=np.uint8)
        for i in range(n):
            region[i * size : (i + 1) * size] = base[offset(i) : offset(i) + size]
        made[size] = region
        if store.register_buffer(region.ctypes.data, region.nbytes) != 0:
            sys.exit(f"{args.store} writer: register_buffer failed")
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["fill"]:
            # The single-get rows' objects, one put_from each: a local copy, timed too.
            gbps = {}
            for size, n in GET_OBJECTS:
                address = made[size].ctypes.data
                seconds = 0.0
                for i in range(n):
                    k = key(args.run, "get", size, i)
                    code, took = timed(store.put_from, k, address + i * size, size, config)
                    seconds += took
                    if code != 0:
                        sys.exit(f"{args.store} writer: put_from failed with code {code}")
                gbps[size] = n * size / seconds / 1e9
            print(json.dumps(gbps), flush=True)
        elif words[:1] == ["batch_put"]:
            size = int(words[1])
            n = dict(BATCH_OBJECTS)[size]
            address = made[size].ctypes.data
            seconds = 0.0
            for first in range(0, n, BATCH):
                keys = [key(args.run, "batch", size, i) for i in range(first, first + BATCH)]
                pointers = [address + i * size for i in range(first, first + BATCH)]
                codes, took = timed(store.batch_put_from, keys, pointers, [size] * BATCH, config)
                seconds += took
                if any(code != 0 for code in codes):
                    sys.exit(f"{args.store} writer: batch_put_from answered {codes}")
            # This machine's one-thread memcpy over the same bytes, for scale.
            target = np.empty(BATCH * size, dtype=np.uint8)
            np.copyto(target, made[size][: BATCH * size])  # its pages faulted in, untimed
            copy_seconds = 0.0
            for first in range(0, n, BATCH):
                source = made[size][first * size : (first + BATCH) * size]
                _, took = timed(np.copyto, target, source)
                copy_seconds += took
            print(
                json.dumps(
                    {"gbps": n * size / seconds / 1e9, "memcpy_gbps": n * size / copy_seconds / 1e9}
                ),
                flush=True,
            )
        else:
            break
    store.close()


def reader(args: argparse.Namespace) -> None:
    store, _ = open_store(args, 0)
    largest = max(size for size, _ in BATCH_OBJECTS)
    target = np.empty(BATCH * largest, dtype=np.uint8)
    if store.register_buffer(target.ctypes.data, target.nbytes) != 0:
        sys.exit(f"{args.store} reader: register_buffer failed")
    patterns: dict[int, np.ndarray] = {}

    def check(got, size: int, i: int, what: str) -> None:
        base = patterns.setdefault(size, pattern(size))
        want = base[offset(i) : offset(i) + size]
        if len(got) != size or not np.array_equal(np.frombuffer(got, dtype=np.uint8), want):
            sys.exit(f"{args.store} reader: {what} of value {i} ({size} bytes) read wrong bytes")

    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["get"]:
            size = int(words[1])
            n = dict(GET_OBJECTS)[size]
            latencies = []
            for i in range(n):
                got, took = timed(store.get, key(args.run, "get", size, i))
                latencies.append(took)
                check(got, size, i, "get")
            print(
                json.dumps(
                    {
                        "p50_us": statistics.median(latencies) * 1e6,
                        "gbps": n * size / sum(latencies) / 1e9,
                    }
                ),
                flush=True,
            )
        elif words[:1] == ["exist"]:
            size, n = GET_OBJECTS[0]
            keys = [key(args.run, "get", size, i % n) for i in range(EXIST_CALLS)]
            seconds = 0.0
            for k in keys:
                found, took = timed(store.is_exist, k)
                seconds += took
                if found != 1:
                    sys.exit(f"{args.store} reader: is_exist({k!r}) answered {found}")
            single = EXIST_CALLS / seconds
            seconds = 0.0
            for first in range(0, EXIST_CALLS, BATCH):
                found, took = timed(store.batch_is_exist, keys[first : first + BATCH])
                seconds += took
                if list(found) != [1] * len(found):
                    sys.exit(f"{args.store} reader: batch_is_exist answered {found}")
            print(
                json.dumps({"calls_per_s": single, "keys_per_s": EXIST_CALLS / seconds}), flush=True
            )
        elif words[:1] == ["batch_get"]:
            size = int(words[1])
            n = dict(BATCH_OBJECTS)[size]
            seconds = 0.0
            for _ in range(BATCH_GET_PASSES):
                for first in range(0, n, BATCH):
                    keys = [key(args.run, "batch", size, i) for i in range(first, first + BATCH)]
                    pointers = [target.ctypes.data + j * size for j in range(BATCH)]
                    got, took = timed(store.batch_get_into, keys, pointers, [size] * BATCH)
                    seconds += took
                    if list(got) != [size] * BATCH:
                        sys.exit(f"{args.store} reader: batch_get_into answered {got}")
                    for j in range(BATCH):
                        check(target[j * size : (j + 1) * size], size, first + j, "batch_get_into")
            print(json.dumps({"gbps": BATCH_GET_PASSES * n * size / seconds / 1e9}), flush=True)
        else:
            break
    store.unregister_buffer(target.ctypes.data)
    store.close()


# ---- the driver --------------------------------------------------------------------------------


class Worker:
    """A writer or reader process: "ready" once set up, then one JSON line per command."""

    def __init__(
        self, python: str, store: str, role: str, master: str, run: str, env: dict, log: Path
    ):
        self.name = f"{store} {role}"
        self.log = log
        self.process = subprocess.Popen(
            [python, __file__, "--role", role, "--store", store, "--master", master, "--run", run],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
            env=env,
        )
        self.expect("ready")

    def expect(self, want: str | None) -> str:
        line = self.process.stdout.readline().strip()
        if not line or (want is not None and line != want):
            self.process.kill()
            tail = self.log.read_text(errors="replace").splitlines()[-15:]
            sys.exit(f"the {self.name} failed ({line!r}); the end of its log:\n" + "\n".join(tail))
        return line

    def ask(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return json.loads(self.expect(None))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.write("exit\n")
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def wait_for_port(port: int, process: subprocess.Popen, name: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"the {name} master exited with code {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"the {name} master did not listen on port {port} within 30 s")


def one_round(store: str, args: argparse.Namespace, logs: Path, round_no: int) -> dict:
    """Starts `store`'s master, writer and reader; returns each row's figure."""
    port = 50051 + round_no * 2 + (store == "mooring")
    master = f"127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "MOORING_TOKEN_FILE"}
    if store == "mooncake":
        python = str(args.mooncake_venv / "bin" / "python")
        command = [
            str(args.mooncake_venv / "bin" / "mooncake_master"),
            f"--rpc_port={port}",
            "--enable_metric_reporting=false",
            f"--metrics_port={port + 1000}",
        ]
    else:
        from bench import mooring_binary

        python = sys.executable
        command = [mooring_binary(), "master", "--listen", master]
        if args.mooring_transport:
            env["MOORING_TRANSPORT"] = args.mooring_transport
    run = uuid.uuid4().hex[:8]
    master_log = (logs / f"{store}-{round_no}-master.log").open("w")
    master_process = subprocess.Popen(command, stdout=master_log, stderr=master_log, env=env)
    workers: list[Worker] = []
    try:
        wait_for_port(port, master_process, store)
        writer_process = Worker(
            python, store, "writer", master, run, env, logs / f"{store}-{round_no}-writer.log"
        )
        workers.append(writer_process)
        reader_process = Worker(
            python, store, "reader", master, run, env, logs / f"{store}-{round_no}-reader.log"
        )
        workers.append(reader_process)
        rows: dict[str, float] = {}
        put = writer_process.ask("fill")
        for size, label in ((MIB, "1 MiB"), (4 * MIB, "4 MiB")):
            rows[f"put_from {label} (GB/s)"] = put[str(size)]
        got = reader_process.ask(f"get {4 * KIB}")
        rows["get 4 KiB p50 (µs)"] = got["p50_us"]
        for size, label in ((64 * KIB, "64 KiB"), (MIB, "1 MiB"), (4 * MIB, "4 MiB")):
            rows[f"get {label} (GB/s)"] = reader_process.ask(f"get {size}")["gbps"]
        got = reader_process.ask("exist")
        rows["is_exist (k calls/s)"] = got["calls_per_s"] / 1e3
        rows["batch_is_exist, 32 keys (M keys/s)"] = got["keys_per_s"] / 1e6
        for size, label in ((MIB, "1 MiB"), (4 * MIB, "4 MiB")):
            got = writer_process.ask(f"batch_put {size}")
            rows[f"batch_put_from 32 x {label} (GB/s)"] = got["gbps"]
            rows[f"memcpy 32 x {label}, writer (GB/s)"] = got["memcpy_gbps"]
        for size, label in ((MIB, "1 MiB"), (4 * MIB, "4 MiB")):
            rows[f"batch_get_into 32 x {label} (GB/s)"] = reader_process.ask(f"batch_get {size}")[
                "gbps"
            ]
        return rows
    finally:
        for worker in workers:
            worker.close()
        master_process.kill()
        master_process.wait()


def ensure_mooncake(venv: Path) -> None:
    if (venv / "bin" / "mooncake_master").exists():
        return
    print(f"installing {MOONCAKE_PACKAGE} into {venv} (once) ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", MOONCAKE_PACKAGE, "numpy"], check=True
    )


def enter_netns(argv: list[str]) -> None:
    """Runs this program again in a private network namespace with only loopback up."""
    if os.environ.get("MOORING_BENCH_NETNS") == "1":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        return
    unshare = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    env = dict(os.environ, MOORING_BENCH_NETNS="1")
    try:
        code = subprocess.run(
            [*unshare, sys.executable, __file__, *argv], check=False, env=env
        ).returncode
    except FileNotFoundError:
        sys.exit("no `unshare` here: install util-linux, or run with --no-netns")
    sys.exit(code)


def report(rounds: list[dict[str, dict[str, float]]], as_json: Path | None) -> None:
    names = list(rounds[0]["mooncake"])
    table = []
    for name in names:
        mooncake = statistics.median(r["mooncake"][name] for r in rounds)
        mooring = statistics.median(r["mooring"][name] for r in rounds)
        lower_is_better = "(µs)" in name
        if name.startswith("memcpy"):
            ratio = None
        else:
            ratio = mooncake / mooring if lower_is_better else mooring / mooncake
        per_round = [
            (r["mooncake"][name] / r["mooring"][name])
            if lower_is_better
            else r["mooring"][name] / r["mooncake"][name]
            for r in rounds
        ]
        table.append(
            {
                "row": name,
                "mooncake": mooncake,
                "mooring": mooring,
                "ratio": ratio,
                "rounds": per_round,
            }
        )
    width = max(len(n) for n in names)
    print(f"{'row':<{width}}  {'Mooncake':>9}  {'Mooring':>9}  {'ratio':>6}  ratio per round")
    for row in table:
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        rounds_text = "" if row["ratio"] is None else ", ".join(f"{r:.2f}" for r in row["rounds"])
        print(
            f"{row['row']:<{width}}  {row['mooncake']:>9.2f}  {row['mooring']:>9.2f}  {ratio:>6}  {rounds_text}"
        )
    rows = {r["row"]: r for r in table}
    for size in ("1 MiB", "4 MiB"):
        copy = rows[f"memcpy 32 x {size}, writer (GB/s)"]
        for put in (f"put_from {size} (GB/s)", f"batch_put_from 32 x {size} (GB/s)"):
            print(
                f"{put.removesuffix(' (GB/s)')} over one-thread memcpy: Mooncake "
                f"{rows[put]['mooncake'] / copy['mooncake']:.2f}, "
                f"Mooring {rows[put]['mooring'] / copy['mooring']:.2f}"
            )
    print(
        "ratio: how many times Mooring is ahead (throughput over throughput; latency: Mooncake's over Mooring's)"
    )
    if as_json:
        as_json.write_text(json.dumps({"rows": table, "rounds": rounds}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternations of the two stores (default 3)"
    )
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    parser.add_argument(
        "--mooncake-venv",
        type=Path,
        default=DEFAULT_VENV,
        help=f"where Mooncake is installed (created on first use; default {DEFAULT_VENV})",
    )
    parser.add_argument(
        "--mooring-transport",
        choices=["auto", "tcp", "shm"],
        help="how Mooring's reader reaches the writer (default auto: shared memory on one host)",
    )
    parser.add_argument("--no-netns", action="store_true", help="run on the host's network")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs here")
    parser.add_argument("--role", choices=["writer", "reader"], help=argparse.SUPPRESS)
    parser.add_argument("--store", choices=["mooncake", "mooring"], help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "writer":
        return writer(args)
    if args.role == "reader":
        return reader(args)

    args.mooncake_venv = args.mooncake_venv.expanduser().resolve()
    ensure_mooncake(args.mooncake_venv)
    if not args.no_netns:
        enter_netns(sys.argv[1:])
    logs = args.logs or Path(f"/tmp/mooring-bench-mooncake-{os.getpid()}")
    logs.mkdir(parents=True, exist_ok=True)
    rounds = []
    for round_no in range(args.rounds):
        # Alternate who goes first, so drift in the machine's load hits both alike.
        order = ["mooncake", "mooring"] if round_no % 2 == 0 else ["mooring", "mooncake"]
        figures = {}
        for store in order:
            print(f"round {round_no + 1}/{args.rounds}: {store} ...", file=sys.stderr, flush=True)
            figures[store] = one_round(store, args, logs, round_no)
        rounds.append(figures)
    report(rounds, args.json)
    print(f"logs: {logs}", file=sys.stderr)


if __name__ == "__main__":
    main()
