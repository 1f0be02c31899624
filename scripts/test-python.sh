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

# The master the tests start.
cargo build --release --locked -p mooring --bin mooring

# What the README tells users to run.
"$VENV/bin/pip" install --quiet --force-reinstall --no-deps ./python
"$VENV/bin/ruff" check python
"$VENV/bin/ruff" format --check python

cd python
"$VENV/bin/python" -m pytest -q -rs "$@"
