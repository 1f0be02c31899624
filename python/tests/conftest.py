"""Fixtures: a real `mooring master` (or a cluster of `mooring peer`s) on loopback, and stores
connected to it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mooring.store import MooncakeDistributedStore

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / "python" / "mooncake-compat"


def mooring_binary() -> str:
    """The `mooring` binary: $MOORING_BIN, the release build, or one on PATH."""
    if os.environ.get("MOORING_BIN"):
        return os.environ["MOORING_BIN"]
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    built = target / "release" / "mooring"
    if built.exists():
        return str(built)
    found = shutil.which("mooring")
    if found:
        return found
    pytest.exit("no mooring binary: run `cargo build --release` or set MOORING_BIN", 2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Master:
    """A `mooring master` process on a loopback port."""

    def __init__(self, *flags: str) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "MOORING_TOKEN_FILE"}
        self.process = subprocess.Popen(
            [mooring_binary(), "master", "--listen", self.address, *flags],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(self.process.stderr.read().decode())
                time.sleep(0.05)
        raise RuntimeError("the master did not start listening within 20 s")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


class Node:
    """A `mooring node` process joined to `master`, serving once its segment is mounted."""

    def __init__(self, master: Master, *flags: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "MOORING_TOKEN_FILE"}
        self.process = subprocess.Popen(
            [mooring_binary(), "node", "--master", master.address, "--listen", "127.0.0.1:0"]
            + list(flags),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        # The CLI prints one line once the segment is mounted.
        line = self.process.stdout.readline()
        if "serving" not in line:
            self.stop()
            raise RuntimeError(f"the node did not start: {line!r}")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


class PeerCluster:
    """Three `mooring peer` processes on loopback, the later two seeded with the first; its
    ``address`` (``peer://a,b,c``) is what a store takes where it takes a master's."""

    def __init__(self, peers: int = 3, size: str = "64MB") -> None:
        env = {k: v for k, v in os.environ.items() if k != "MOORING_TOKEN_FILE"}
        self.processes: list[subprocess.Popen] = []
        self.addresses: list[str] = []
        try:
            for i in range(peers):
                address = f"127.0.0.1:{free_port()}"
                seeds = ["--seeds", self.addresses[0]] if self.addresses else []
                process = subprocess.Popen(
                    [mooring_binary(), "peer", "--listen", address, "--size", size, *seeds],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
                self.processes.append(process)
                # The CLI prints one line once the peer serves.
                line = process.stdout.readline()
                if "serving" not in line:
                    raise RuntimeError(f"peer {i} did not start: {line!r}")
                self.addresses.append(address)
        except BaseException:
            self.stop()
            raise
        self.address = "peer://" + ",".join(self.addresses)

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def master():
    m = Master()
    yield m
    m.stop()


@pytest.fixture(scope="session")
def peers():
    """A peer cluster of three `mooring peer` processes."""
    cluster = PeerCluster()
    yield cluster
    cluster.stop()


@pytest.fixture(autouse=True)
def no_token(monkeypatch):
    monkeypatch.delenv("MOORING_TOKEN_FILE", raising=False)


def connect(master: Master, segment="64MB", local="64MB") -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    code = store.setup("127.0.0.1", "P2PHANDSHAKE", segment, local, "tcp", "", master.address)
    assert code == 0, code
    return store


@pytest.fixture(scope="session")
def shared(master):
    """One store contributing 64 MB, shared by the tests that need no store of their own."""
    store = connect(master)
    yield store
    store.close()


@pytest.fixture(params=["model", "cuda"])
def gpu(request):
    """Device memory: the software device model, and a real GPU through torch where one is
    present (skipped with the reason printed where none is)."""
    from devices import gpu_for

    device = gpu_for(request.param, pytest)
    yield device
    device.release()


@pytest.fixture
def key(request):
    """A key unique to the test."""
    return f"{request.node.name}-{time.monotonic_ns()}"


def install_compat(tmp_path_factory) -> Path:
    """python/mooncake-compat pip-installed into a directory of its own (for PYTHONPATH), as a
    user would, from a copy: setuptools leaves its build directories beside the sources."""
    target = tmp_path_factory.mktemp("compat-site")
    source = tmp_path_factory.mktemp("compat-source") / "mooncake-compat"
    shutil.copytree(COMPAT, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
    )
    return target
