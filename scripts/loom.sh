#!/usr/bin/env bash
# Loom model checks (proto/tests/loom.rs): every interleaving of the export table's concurrent
# export, resolve and unexport. Builds proto with --cfg mooring_loom, which swaps loom's lock and
# atomics in (proto/src/sync.rs), in its own target directory ($CARGO_TARGET_DIR/loom, or
# MOORING_LOOM_TARGET_DIR). Extra arguments go to the test binary (e.g. a test name filter,
# --nocapture); LOOM_LOG=info prints how many interleavings each model explored.
#
#   scripts/loom.sh [TEST_FILTER] [--nocapture ...]
set -euo pipefail
cd "$(dirname "$0")/.."
base="${CARGO_TARGET_DIR:-$PWD/target}"
export CARGO_TARGET_DIR="${MOORING_LOOM_TARGET_DIR:-$base/loom}"
export RUSTFLAGS="--cfg mooring_loom"
exec cargo test --release --locked -p mooring-proto --test loom -- "$@"
