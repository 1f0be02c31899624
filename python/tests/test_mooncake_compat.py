"""The opt-in `mooncake.store` import name (python/mooncake-compat): built and installed as a
user would, into a directory of its own, then imported the way engines written against
Mooncake import it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import install_compat


def test_pip_install_of_mooring_alone_provides_no_mooncake():
    assert importlib.util.find_spec("mooncake") is None


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    return install_compat(tmp_path_factory)


def run(installed: Path, code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(installed))
    env.pop("MOORING_TOKEN_FILE", None)
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_mooncake_store_is_mooring_store(installed, master):
    code = f"""
import mooring.store
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
assert MooncakeDistributedStore is mooring.store.MooncakeDistributedStore
store = MooncakeDistributedStore()
assert store.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", "{master.address}") == 0
config = ReplicateConfig()
config.replica_num = 1
assert store.put("compat-key", b"through mooncake.store", config) == 0
assert store.get("compat-key") == b"through mooncake.store"
store.close()
print("ok")
"""
    done = run(installed, code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_rest_of_mooncake_is_refused_with_a_reason(installed):
    done = run(installed, "import mooncake.engine")
    assert done.returncode != 0
    assert "part of Mooncake, not Mooring" in done.stderr, done.stderr
    done = run(installed, "from mooncake.store import NoSuchThing")
    assert done.returncode != 0
    assert "cannot import name" in done.stderr, done.stderr
