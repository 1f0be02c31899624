#!/usr/bin/env bash
# The Python package's checks: builds the wheel with `pip install ./python` into a venv kept
# outside the clone, lints with ruff, and runs the pytest suite against a real `mooring
# master` on loopback. Safe on a fresh machine: it creates the venv and installs what it needs.
#
#   scripts/test-python.sh [pytest args]
#
# The venv: $MOORING_PY_VENV (default $CARGO_TARGET_DIR/../pyvenv, or ./target/pyvenv).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${CARGO_TARGET_DIR:-}" ]; then
    VENV="${MOORING_PY_VENV:-$(dirname "$CARGO_TARGET_DIR")/pyvenv}"
else
    # Inside the clone's own (ignored) target directory, never beside its sources.
    export CARGO_TARGET_DIR="$PWD/target"
    VENV="${MOORING_PY_VENV:-$CARGO_TARGET_DIR/pyvenv}"
fi

python=$(command -v python3 || true)
if [ -z "$python" ] || ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "Python 3.11 or newer is needed for the Python package (python3 not found or too old)" >&2
    exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$python" -m venv "$VENV" || {
        echo "could not create a venv at $VENV: install python3-venv (Debian: apt-get install python3-venv)" >&2
        exit 1
    }
fi
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet "maturin>=1.9,<2" "pytest>=7" numpy "ruff>=0.6"
# The tensor helpers and the SGLang backend are tested with real torch and SGLang (the
# version the backend was written against): PyPI's builds, with CUDA's libraries (about
# 10 GB the first time), run on machines without a GPU.
"$VENV/bin/pip" install --quiet torch safetensors "sglang==0.5.23"

# vLLM 0.33.0, for its KV connectors' tests (python/tests/test_vllm.py): vLLM's own
# MooncakeStoreConnector through the mooncake.store name, and ours. vLLM pins torch 2.14.0
# and an openai newer than SGLang's pin, so it goes into a directory of its own with
# --no-deps: the venv's torch, numpy and transformers serve it (its connector path loads no
# compiled vLLM extension), and only the pure-Python packages that path imports and the venv
# lacks come with it (pinned). About 340 MB downloaded, 830 MB installed, once.
VLLM_SITE="$(dirname "$VENV")/$(basename "$VENV")-vllm"
if ! PYTHONPATH="$VLLM_SITE" "$VENV/bin/python" -c '
import importlib.metadata as m, sys
sys.exit(m.version("vllm") != "0.33.0" or m.version("openai") != "3.57.0")' 2>/dev/null; then
    rm -rf "$VLLM_SITE"
    "$VENV/bin/pip" install --quiet --no-deps --target "$VLLM_SITE" "vllm==0.33.0" \
        "cbor2==6.3.0" "cachetools==8.0.2" "py-cpuinfo==9.0.0" "openai==3.57.0"
fi

# LMCache 0.5.6, for its L2 adapters' tests (python/tests/test_lmcache.py): LMCache's server
# loading mooring.integrations.lmcache. LMCache pins numpy<=2.2.6 and pulls CUDA packages
# (cupy, cufile, nvtx) its CPU server path does not load, so it goes into a directory of its
# own with --no-deps: the venv's torch and numpy serve it, and only the packages its server
# and L2 adapter test helpers import and the venv lacks come with it (pinned). About 20 MB
# downloaded, once.
LMCACHE_SITE="$(dirname "$VENV")/$(basename "$VENV")-lmcache"
if ! PYTHONPATH="$LMCACHE_SITE" "$VENV/bin/python" -c '
import importlib.metadata as m, sys
sys.exit(m.version("lmcache") != "0.5.6" or m.version("aiofiles") != "25.1.0")' 2>/dev/null; then
    rm -rf "$LMCACHE_SITE"
    "$VENV/bin/pip" install --quiet --no-deps --target "$LMCACHE_SITE" "lmcache==0.5.6" \
        "sortedcontainers==2.4.0" "py-cpuinfo==9.0.0" "cachetools==8.0.2" "blake3==1.0.11" \
        "caio==0.12.10" "aiofile==3.12.3" "aiofiles==25.1.0"
fi

# The master the tests start.
cargo build --release --locked -p mooring --bin mooring

# What the README tells users to run.
"$VENV/bin/pip" install --quiet --force-reinstall --no-deps ./python
"$VENV/bin/ruff" check python
"$VENV/bin/ruff" format --check python

# The opt-in mooncake.store name, for vLLM's built-in connector: installed as a user would,
# from a copy (setuptools leaves build directories beside the sources), afresh every run.
COMPAT_SITE="$(dirname "$VENV")/$(basename "$VENV")-mooncake-compat"
compat_src=$(mktemp -d)
trap 'rm -rf "$compat_src"' EXIT
cp -r python/mooncake-compat "$compat_src/"
rm -rf "$COMPAT_SITE"
"$VENV/bin/pip" install --quiet --no-deps --target "$COMPAT_SITE" "$compat_src/mooncake-compat"

cd python
# Exit code 5 from one of the three runs: "$@" (-k ...) selected none of its tests; from all
# three, none at all.
ran=0
rc=0
"$VENV/bin/python" -m pytest -q -rs --ignore=tests/test_vllm.py --ignore=tests/test_lmcache.py "$@" || rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
    exit "$rc"
fi
[ "$rc" -eq 0 ] && ran=1
# vLLM's tests, with vLLM's directory first on the path (in a process of their own, so the
# SGLang tests above keep the venv's openai).
rc=0
PYTHONPATH="$VLLM_SITE:$COMPAT_SITE" "$VENV/bin/python" -m pytest -q -rs tests/test_vllm.py "$@" || rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
    exit "$rc"
fi
[ "$rc" -eq 0 ] && ran=1
# LMCache's, likewise in a process of their own (LMCache's directory first on the path).
rc=0
PYTHONPATH="$LMCACHE_SITE" "$VENV/bin/python" -m pytest -q -rs tests/test_lmcache.py "$@" || rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
    exit "$rc"
fi
[ "$rc" -eq 0 ] && ran=1
if [ "$ran" -eq 0 ]; then
    echo "no test matched: $*" >&2
    exit 5
fi
