"""Python and Rust clients side by side, in one run, on the same cluster and the same calls.

    python python/bench.py                 # starts a master on loopback for the run
    python python/bench.py --master HOST:PORT --sizes 4KiB,1MiB,4MiB --count 300

Both sides are measured the way ``mooring bench`` measures: a writer process puts objects
into its own segment, this process reads them back one operation at a time (over shared
memory, which both clients choose by default on one host), and only the time inside the
store's calls counts. The Rust figures come from ``mooring bench
--json`` run first; the Python writer and reader then repeat the phases through
``mooring.store`` with registered buffers (``put_from``, ``get_into``, ``batch_get_into``)
and, for small values, the copying ``get``. Every value read is checked.

``--transport tcp`` (or ``shm``) makes both readers use that transport (the Python one
through ``MOORING_TRANSPORT``) instead of shared memory.

With ``--device cuda`` (or ``--device model``, the software device model, anywhere) it
measures device rows instead: the same batch calls from and into registered host memory and
registered device memory, on one store in one run, and the device path's share of the host
path's throughput (the staging pipeline's target is 80% at 1-4 MiB):

    python python/bench.py --device cuda --sizes 1MiB,4MiB --count 256

Needs the ``mooring`` binary ($MOORING_BIN, $CARGO_TARGET_DIR/release/mooring,
./target/release/mooring, or PATH) and the package (``pip install ./python``).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Self

import numpy as np
from mooring.store import MooncakeDistributedStore, ReplicateConfig, parse_size

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES_PER_SIZE = 512 << 20


def mooring_binary() -> str:
    if os.environ.get("MOORING_BIN"):
        return os.environ["MOORING_BIN"]
    for target in (os.environ.get("CARGO_TARGET_DIR"), ROOT / "target"):
        if target and (Path(target) / "release" / "mooring").exists():
            return str(Path(target) / "release" / "mooring")
    found = shutil.which("mooring")
    if not found:
        sys.exit("no mooring binary: run `cargo build --release` or set MOORING_BIN")
    return found


def objects_for(size: int, count: int) -> int:
    """How many objects of `size` a phase uses (as `mooring bench` decides)."""
    return min(count, max(16, MAX_BYTES_PER_SIZE // size))


def value(size: int, i: int) -> np.ndarray:
    """Object `i` of `size` bytes, as `mooring bench-writer` writes it."""
    mask = (1 << 64) - 1
    seed = (size ^ ((i * 0x9E3779B97F4A7C15) & mask)) | 1
    words = np.arange(1, (size + 7) // 8 + 1, dtype=np.uint64) * np.uint64(seed)
    words = (words << np.uint64(17)) | (words >> np.uint64(47))
    return words.astype("<u8").view(np.uint8)[:size]


def ramp(words: int) -> np.ndarray:
    """1, 2, ..., `words` as uint64: the word counter every value multiplies by its seed."""
    global _RAMP
    if len(_RAMP) < words:
        _RAMP = np.arange(1, words + 1, dtype=np.uint64)
    return _RAMP[:words]


_RAMP = np.empty(0, dtype=np.uint64)

# Words handled per numpy call when making or checking a value: large enough that the calls'
# own overhead is small, small enough that the scratch stays in L2 (measured here: 150 µs to
# make 1 MiB in 32 Ki-word chunks, 190 µs in 8 Ki-word ones).
CHUNK_WORDS = 32768


def fill_value(dest: np.ndarray, size: int, i: int) -> None:
    """Writes object `i`'s value into `dest[:size]` in place, without value-sized temporaries
    (arrays made and dropped per value leave several MiB of freshly written memory in the
    caches, which slowed the calls measured after them)."""
    if size % 8 or dest.ctypes.data % 8:
        dest[:size] = value(size, i)
        return
    mask = (1 << 64) - 1
    seed = np.uint64((size ^ ((i * 0x9E3779B97F4A7C15) & mask)) | 1)
    words = dest[:size].view(np.uint64)
    counter = ramp(len(words))
    spare = np.empty(min(CHUNK_WORDS, len(words)), dtype=np.uint64)
    for start in range(0, len(words), CHUNK_WORDS):
        w = words[start : start + CHUNK_WORDS]
        tmp = spare[: len(w)]
        np.multiply(counter[start : start + len(w)], seed, out=w)
        np.left_shift(w, np.uint64(17), out=tmp)
        np.right_shift(w, np.uint64(47), out=w)
        np.bitwise_or(w, tmp, out=w)


class Values:
    """Every object's value of one size, made before the timed loop, as `mooring bench` makes
    them: the writers put each from where it was made, one after another, and the
    readers check what they read against them with a comparison that only reads (as memcmp
    does). The gaps a benchmark leaves between calls decide whether the servers are still
    busy-polling when the next call comes (on two cores, a parked server costs tens of µs), so
    both sides leave the same ones. Measured here before this: checking against a value made
    between calls took 2.2 ms per MiB (the Rust reader's memcmp, well under 0.2 ms), and the
    Python reads were measured slower than the calls are."""

    def __init__(self, size: int, n: int) -> None:
        self.size = size
        # Page-aligned and in huge pages, as the Rust side's values are (its allocator asks
        # for them); numpy's own arrays start 16 bytes past a page, in 4 KiB pages.
        self.made = page_aligned(n * size).reshape(n, size)
        for i in range(n):
            fill_value(self.made[i], size, i)
        self.mask = np.empty(CHUNK_WORDS, dtype=bool)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.made[i]

    def matches(self, got: np.ndarray, i: int) -> bool:
        """Whether `got` holds object `i`'s value, compared a chunk at a time into a small
        reused mask (no value-sized temporaries)."""
        want = self.made[i]
        if self.size % 8 or got.ctypes.data % 8 or want.ctypes.data % 8:
            return bool(np.array_equal(got[: self.size], want))
        got_words, want_words = got[: self.size].view(np.uint64), want.view(np.uint64)
        for start in range(0, len(want_words), CHUNK_WORDS):
            g = got_words[start : start + CHUNK_WORDS]
            mask = self.mask[: len(g)]
            np.equal(g, want_words[start : start + CHUNK_WORDS], out=mask)
            if not mask.all():
                return False
        return True


def page_aligned(nbytes: int) -> np.ndarray:
    """A zeroed buffer starting on a page boundary and backed by transparent huge pages where
    the kernel allows, like the Rust benchmark's buffers (the `mooring` binary's allocator
    asks for huge pages) and engines' pinned host pools. Two things measured here: reads into
    a buffer 16 bytes past a page boundary, where malloc puts large numpy arrays, ran 2.5x
    slower (the kernel's copy out of the socket stalls on 4K aliasing), and reads into 4 KiB
    pages about a fifth slower than into huge pages."""
    # Private: a shared anonymous mapping is shmem, which gets huge pages only where the
    # host's shmem_enabled allows (here it does not).
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(region, dtype=np.uint8)


def summary(phase: str, size: int, keys_per_call: int, latencies: list[float]) -> dict:
    lat = sorted(latencies)

    def pick(q: float) -> float:
        return lat[min(int(len(lat) * q), len(lat) - 1)] * 1e6

    calls = len(lat)
    return {
        "phase": phase,
        "size": size,
        "calls": calls,
        "keys": calls * keys_per_call,
        "bytes": calls * keys_per_call * size,
        "seconds": sum(lat),
        "p50_us": pick(0.5),
        "p99_us": pick(0.99),
    }


def setup(store: MooncakeDistributedStore, master: str, segment: int, local: int) -> None:
    code = store.setup("127.0.0.1", "P2PHANDSHAKE", segment, local, "tcp", "", master)
    if code != 0:
        sys.exit(f"setup failed with code {code}")


# ---- the writer process ------------------------------------------------------------------------


def writer(args: argparse.Namespace) -> None:
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    footprint = sum(objects_for(s, args.count) * s for s in sizes)
    store = MooncakeDistributedStore()
    setup(store, args.master, footprint + footprint // 4 + (64 << 20), 64 << 20)
    config = ReplicateConfig()
    config.preferred_segment = store.get_hostname()
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] != ["put"]:
            break
        size = int(words[1])
        lat = []
        n = objects_for(size, args.count)
        # As the Rust writer does: every value made first, then put back to back from where
        # it was made (one registered region, as an engine registers its host pool).
        # Each value's address is the region's plus its offset, as an engine addresses the
        # pages of its pool (numpy's `.ctypes` helper costs microseconds a call).
        made = Values(size, n)
        base = made.made.ctypes.data
        store.register_buffer(base, made.made.nbytes)
        for i in range(n):
            t = time.perf_counter()
            code = store.put_from(f"py/{args.run}/{size}/{i}", base + i * size, size, config)
            lat.append(time.perf_counter() - t)
            if code != 0:
                sys.exit(f"put_from failed with code {code}")
        store.unregister_buffer(base)
        print(json.dumps(summary("put_from", size, 1, lat)), flush=True)
    store.close()


# ---- the reader (this process) -----------------------------------------------------------------


def python_phases(
    master: str, sizes: list[int], count: int, batch: int, buffer: str = "aligned"
) -> list[dict]:
    """The Python client's phases. Puts: a Python writer into its own segment. Reads: the
    objects a Rust `mooring bench-writer` put into its segment, so the node serving the
    reads is the one `mooring bench` reads from."""
    run = f"pybench-{uuid.uuid4().hex[:8]}"
    phases = []
    with Child(
        [
            sys.executable,
            __file__,
            "--writer",
            "--master",
            master,
            "--run",
            run,
            "--sizes",
            ",".join(map(str, sizes)),
            "--count",
            str(count),
        ]
    ) as child:
        for size in sizes:
            phases.append(json.loads(child.ask(f"put {size}")))
    reader = MooncakeDistributedStore()
    setup(reader, master, 0, 64 << 20)
    if buffer == "malloc":
        # As a program written for Mooncake registers an ordinary numpy array: malloc puts a
        # large one 16 bytes past a page boundary, in 4 KiB pages.
        buf = np.zeros(batch * max(sizes), dtype=np.uint8)
    else:
        buf = page_aligned(batch * max(sizes))
    reader.register_buffer(buf.ctypes.data, buf.nbytes)
    base = buf.ctypes.data
    try:
        with Child(
            [
                mooring_binary(),
                "bench-writer",
                "--master",
                master,
                "--run",
                run,
                "--sizes",
                ",".join(map(str, sizes)),
                "--count",
                str(count),
            ]
        ) as child:
            for size in sizes:
                child.ask(f"put {size}")
                phases += read_phases(reader, base, buf, run, size, count, batch)
    finally:
        reader.close()
    return phases


def read_phases(reader, base, buf, run, size, count, batch) -> list[dict]:
    """The reads, call for call as `mooring bench` makes them: `count` gets cycling over the
    objects, then `count / batch` batches (rounded up) cycling the same way."""
    keys = [f"bench/{run}/{size}/{i:07}" for i in range(objects_for(size, count))]
    expected = Values(size, len(keys))
    expected_bytes = [expected[i].tobytes() for i in range(len(keys))] if size <= 64 * 1024 else []
    phases = []
    lat = []
    for n in range(count):
        i = n % len(keys)
        t = time.perf_counter()
        got = reader.get_into(keys[i], base, size)
        lat.append(time.perf_counter() - t)
        if got != size or not expected.matches(buf, i):
            sys.exit(f"get_into {keys[i]}: {got}")
    phases.append(summary("get_into", size, 1, lat))
    if size <= 64 * 1024:
        lat = []
        for n in range(count):
            i = n % len(keys)
            t = time.perf_counter()
            got = reader.get(keys[i])
            lat.append(time.perf_counter() - t)
            if got != expected_bytes[i]:
                sys.exit(f"get {keys[i]} returned the wrong bytes")
        phases.append(summary("get", size, 1, lat))
    lat = []
    batch = min(batch, len(keys))
    ptrs = [base + j * size for j in range(batch)]
    sizes = [size] * batch
    for round_ in range(-(-count // batch)):
        first = (round_ * batch) % len(keys)
        ids = [(first + j) % len(keys) for j in range(batch)]
        names = [keys[i] for i in ids]
        t = time.perf_counter()
        got = reader.batch_get_into(names, ptrs, sizes)
        lat.append(time.perf_counter() - t)
        if got != sizes:
            sys.exit(f"batch_get_into: {got}")
        for j, i in enumerate(ids):
            if not expected.matches(buf[j * size : (j + 1) * size], i):
                sys.exit(f"batch_get_into {keys[i]} returned the wrong bytes")
    phases.append(summary(f"batch{batch}-get_into", size, batch, lat))
    return phases


class Child:
    """A writer process speaking the bench-writer line protocol: "ready", then one result
    line per "put SIZE"."""

    def __init__(self, argv: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if k != "MOORING_TOKEN_FILE"}
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def __enter__(self) -> Self:
        line = self.process.stdout.readline().strip()
        if line != "ready":
            sys.exit(f"the writer did not start: {line!r}")
        return self

    def ask(self, command: str) -> str:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip().removeprefix("result ")

    def __exit__(self, *exc) -> None:
        self.process.stdin.write("exit\n")
        self.process.stdin.close()
        self.process.wait()


def rust_phases(master: str, sizes: list[int], count: int, batch: int) -> list[dict]:
    # The reader's transport, as MOORING_TRANSPORT sets it for the Python side.
    transport = os.environ.get("MOORING_TRANSPORT", "auto")
    out = subprocess.run(
        [
            mooring_binary(),
            "bench",
            "--master",
            master,
            "--json",
            "--sizes",
            ",".join(map(str, sizes)),
            "--count",
            str(count),
            "--batch",
            str(batch),
            "--transport",
            transport,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)["phases"]


# ---- device rows -------------------------------------------------------------------------------


class DeviceBuffer:
    """``nbytes`` of device memory: a CUDA tensor, or the software model's memory."""

    def __init__(self, kind: str, nbytes: int) -> None:
        self.kind = kind
        if kind == "cuda":
            import torch

            self.torch = torch
            self.tensor = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            self.addr = self.tensor.data_ptr()
        else:
            from mooring import _native

            self.model = _native.DeviceModel()
            self.addr = self.model.alloc(nbytes)

    def fill(self, host: np.ndarray) -> None:
        if self.kind == "cuda":
            self.tensor.copy_(self.torch.from_numpy(host))
            self.torch.cuda.synchronize()
        else:
            self.model.write(self.addr, host.tobytes())

    def read(self, offset: int, size: int) -> bytes:
        if self.kind == "cuda":
            self.torch.cuda.synchronize()
            return bytes(self.tensor[offset : offset + size].cpu().numpy())
        return self.model.read(self.addr + offset, size)


def device_rows(master: str, kind: str, sizes: list[int], count: int, batch: int, rounds: int):
    """Batch puts and gets of the same values from host and from device memory, alternating
    round by round; per size and call, the best round of each."""
    # Room for every value of every round from both memories, so nothing is evicted.
    footprint = sum(objects_for(s, count) * s for s in sizes) * 2 * rounds
    node = subprocess.Popen(
        [mooring_binary(), "node", "--master", master, "--listen", "127.0.0.1:0"]
        + ["--size", str(footprint + footprint // 4 + (256 << 20))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    if "serving" not in node.stdout.readline():
        node.kill()
        sys.exit("the node did not start")
    store = MooncakeDistributedStore()
    setup(store, master, 0, 64 << 20)
    run = uuid.uuid4().hex[:8]
    best: dict[tuple[str, str, int], float] = {}
    try:
        for size in sizes:
            n = objects_for(size, count) // batch * batch
            values = np.concatenate([value(size, i) for i in range(n)])
            host_src, host_dst = page_aligned(n * size), page_aligned(n * size)
            host_src[:] = values
            dev_src, dev_dst = DeviceBuffer(kind, n * size), DeviceBuffer(kind, n * size)
            dev_src.fill(values)
            memories = {
                "host": (host_src.ctypes.data, host_dst.ctypes.data),
                "device": (dev_src.addr, dev_dst.addr),
            }
            for src, dst in memories.values():
                for addr in (src, dst):
                    assert store.register_buffer(addr, n * size) == 0
            for r in range(rounds):
                for memory, (src, dst) in memories.items():
                    keys = [f"devbench/{run}/{memory}/{size}/{r}/{i}" for i in range(n)]
                    for call in ("batch_put_from", "batch_get_into"):
                        started = time.perf_counter()
                        for b in range(0, n, batch):
                            ptrs = [
                                (src if call == "batch_put_from" else dst) + i * size
                                for i in range(b, b + batch)
                            ]
                            codes = getattr(store, call)(keys[b : b + batch], ptrs, [size] * batch)
                            want = 0 if call == "batch_put_from" else size
                            if codes != [want] * batch:
                                sys.exit(f"{call} of {size}-byte values, {memory} memory: {codes}")
                        rate = n * size / (time.perf_counter() - started)
                        best[(call, memory, size)] = max(best.get((call, memory, size), 0), rate)
            # Every value read into device memory is checked.
            for i in (0, n // 2, n - 1):
                assert dev_dst.read(i * size, size) == value(size, i).tobytes(), i
            for src, dst in memories.values():
                for addr in (src, dst):
                    store.unregister_buffer(addr)
    finally:
        store.close()
        node.kill()
    rows = []
    for size in sizes:
        for call in ("batch_put_from", "batch_get_into"):
            host, device = best[(call, "host", size)], best[(call, "device", size)]
            rows.append(
                {
                    "call": call,
                    "size": size,
                    "host_gbps": host / 1e9,
                    "device_gbps": device / 1e9,
                    "device_share": device / host,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--master", help="a running master (default: start one for the run)")
    parser.add_argument("--sizes", default="4KiB,1MiB,4MiB", help="value sizes")
    parser.add_argument("--count", type=int, default=500, help="objects per size")
    parser.add_argument("--batch", type=int, default=8, help="keys per batch")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="rounds of Rust then Python; each phase reports its best round",
    )
    parser.add_argument("--json", action="store_true", help="print the phases as JSON")
    parser.add_argument(
        "--buffer",
        choices=("aligned", "malloc"),
        default="aligned",
        help="the Python reader's registered buffer: page-aligned with huge pages (default), "
        "or an ordinary numpy array (malloc's placement, 16 bytes past a page)",
    )
    parser.add_argument(
        "--transport",
        choices=("auto", "tcp", "shm"),
        help="how both readers reach the writer (default auto: shared memory on one host)",
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "model"),
        help="device rows instead: host vs device memory (cuda: a GPU through torch; model: "
        "the software device model)",
    )
    parser.add_argument("--writer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        return writer(args)

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.transport:
        # Read by mooring.store's setup, here and in the writer process.
        os.environ["MOORING_TRANSPORT"] = args.transport
    master_process = None
    master = args.master
    if master is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            master = f"127.0.0.1:{s.getsockname()[1]}"
        env = {k: v for k, v in os.environ.items() if k != "MOORING_TOKEN_FILE"}
        master_process = subprocess.Popen(
            [mooring_binary(), "master", "--listen", master],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)
    if args.device:
        try:
            rows = device_rows(master, args.device, sizes, args.count, args.batch, args.rounds)
        finally:
            if master_process is not None:
                master_process.kill()
        if args.json:
            print(json.dumps(rows, indent=2))
            return
        print(f"{'call':<16} {'size':>8} {'host GB/s':>10} {'device GB/s':>12} {'device/host':>12}")
        for r in rows:
            print(
                f"{r['call']:<16} {r['size']:>8} {r['host_gbps']:>10.3f} "
                f"{r['device_gbps']:>12.3f} {r['device_share']:>12.2f}"
            )
        return
    rust: list[dict] = []
    python: list[dict] = []
    try:
        # Alternate, so drift in the machine's load hits both sides alike.
        for _ in range(args.rounds):
            rust += rust_phases(master, sizes, args.count, args.batch)
            python += python_phases(master, sizes, args.count, args.batch, args.buffer)
    finally:
        if master_process is not None:
            master_process.kill()
    report(rust, python, args.batch, args.json)


def report(rust: list[dict], python: list[dict], batch: int, as_json: bool) -> None:
    def find(phases: list[dict], name: str, size: int):
        # The best round: the highest throughput (and its latency).
        rounds = [p for p in phases if p["phase"] == name and p["size"] == size]
        return max(rounds, key=lambda p: p["bytes"] / p["seconds"], default=None)

    # (python phase, rust phase): the same call on both sides.
    pairs = [
        ("put_from", "put"),
        ("get_into", "get"),
        (f"batch{batch}-get_into", f"batch{batch}-get"),
        ("get", "get"),
    ]
    rows = []
    for size in sorted({p["size"] for p in python}):
        for py_name, rs_name in pairs:
            py, rs = find(python, py_name, size), find(rust, rs_name, size)
            if py is None or rs is None:
                continue
            py_rate, rs_rate = py["bytes"] / py["seconds"], rs["bytes"] / rs["seconds"]
            rows.append(
                {
                    "call": py_name,
                    "size": size,
                    "python_gbps": py_rate / 1e9,
                    "rust_gbps": rs_rate / 1e9,
                    "python_p50_us": py["p50_us"],
                    "rust_p50_us": rs["p50_us"],
                    "throughput_ratio": py_rate / rs_rate,
                    "latency_ratio": py["p50_us"] / rs["p50_us"],
                }
            )
    if as_json:
        print(json.dumps({"rust": rust, "python": python, "compared": rows}, indent=2))
        return
    print(
        f"{'call':<18} {'size':>8} {'py GB/s':>9} {'rust GB/s':>10} {'py/rust':>8} "
        f"{'py p50 µs':>10} {'rust p50 µs':>12} {'p50 ratio':>10}"
    )
    for r in rows:
        print(
            f"{r['call']:<18} {r['size']:>8} {r['python_gbps']:>9.3f} {r['rust_gbps']:>10.3f} "
            f"{r['throughput_ratio']:>8.2f} {r['python_p50_us']:>10.1f} {r['rust_p50_us']:>12.1f} "
            f"{r['latency_ratio']:>10.2f}"
        )


if __name__ == "__main__":
    main()
