#!/usr/bin/env bash
# Every check and test Mooring has, in the order CI runs them. Safe on a fresh machine: it
# installs the rustup components and cargo tools it needs.
#
#   scripts/test-all.sh            everything
#   MOORING_FUZZ_RUNS=0 ...        skip the cargo-fuzz smoke run (the corpus replay still runs)
#   MOORING_SIM_SEEDS=N ...         simulate N seeds instead of 200
#
# Build caches: CARGO_TARGET_DIR (default ./target). The fuzz, madsim and loom builds use
# $CARGO_TARGET_DIR/{fuzz,madsim,loom}: each is built with its own flags.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
FUZZ_RUNS="${MOORING_FUZZ_RUNS:-500}"

step() { printf '\n==> %s\n' "$*"; }
elapsed() { printf '    (%ss)\n' "$((SECONDS - $1))"; }

step "toolchain"
command -v cargo >/dev/null || { echo "cargo not found: install Rust from https://rustup.rs" >&2; exit 1; }
cargo --version
for component in rustfmt clippy; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
        rustup component add "$component"
    fi
done

# The dashboard test drives a real browser (Debian's chromium); without one it says so and
# skips.
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    step "installing chromium for the dashboard test"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
        || echo "    could not install chromium: the dashboard test will be skipped" >&2
fi

# The RDMA transport's ibverbs implementation builds against Debian's rdma-core headers
# (bindgen needs clang); without them it says so and only the software-model build is tested.
rdma_packages="libibverbs-dev librdmacm-dev clang libclang-dev"
if ! dpkg -s $rdma_packages >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    step "installing $rdma_packages for the RDMA transport's ibverbs build"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $rdma_packages >/dev/null \
        || echo "    could not install them: the ibverbs build will be skipped" >&2
fi

# Standby masters (`--features etcd`): building the etcd client needs protoc, and the test
# starts a real etcd on loopback (Debian's protobuf-compiler and etcd-server).
etcd_packages="protobuf-compiler etcd-server"
if ! dpkg -s $etcd_packages >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    step "installing $etcd_packages for the standby-master build and its etcd test"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $etcd_packages >/dev/null \
        || echo "    could not install them: the etcd build and test will be skipped" >&2
fi

t=$SECONDS; step "tracked files (no build outputs in git)"
scripts/check-tracked-files.sh
elapsed $t

t=$SECONDS; step "planted bugs still apply (sim-tests/teeth.py check)"
python3 sim-tests/teeth.py check
elapsed $t

t=$SECONDS; step "format"
cargo fmt --all -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
elapsed $t

t=$SECONDS; step "clippy (-D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings
elapsed $t

t=$SECONDS; step "tests (release: model test, scenario tests, footprint, fuzz corpus replay)"
cargo test --workspace --release --locked
elapsed $t

t=$SECONDS; step "RDMA transport on ibverbs (rdma-sys): clippy, and the device test (skips without a device)"
if dpkg -s $rdma_packages >/dev/null 2>&1; then
    cargo clippy --locked -p mooring-transport-rdma --features ibverbs --all-targets -- -D warnings
    cargo clippy --locked -p mooring --features rdma --lib --bins -- -D warnings
    cargo test --release --locked -p mooring-transport-rdma --features ibverbs --test device -- --nocapture
    cargo test --release --locked -p mooring --features rdma --test rdma_device -- --nocapture
else
    echo "    SKIPPED: $rdma_packages not installed (run as root to have them installed)"
fi
elapsed $t

t=$SECONDS; step "standby masters on etcd (--features etcd): clippy, and the failover test against a real etcd"
if command -v protoc >/dev/null && command -v etcd >/dev/null; then
    cargo clippy --locked -p mooring --features etcd --all-targets -- -D warnings
    cargo test --release --locked -p mooring --features etcd --test ha -- --nocapture
else
    echo "    SKIPPED: protoc or etcd missing (install $etcd_packages, or run as root to have them installed)"
fi
elapsed $t

t=$SECONDS; step "simulation build: clippy and unit tests under madsim (own target dir)"
sim_target="$TARGET_DIR/madsim"
RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR="$sim_target" \
    cargo clippy --release --locked -p mooring-transport-sim -p mooring-sim-tests --all-targets -- -D warnings
RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR="$sim_target" \
    cargo clippy --release --locked -p mooring -p mooring-transport-tcp -p mooring-core -p mooring-proto --lib -- -D warnings
RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR="$sim_target" \
    cargo test --release --locked -p mooring-transport-sim -p mooring-sim-tests
elapsed $t

t=$SECONDS; step "seeded simulations: regression seeds, ${MOORING_SIM_SEEDS:-200} seeds, determinism"
MOORING_SIM_TARGET_DIR="$sim_target" scripts/sim.sh ci
elapsed $t

t=$SECONDS; step "loom model checks (own target dir)"
RUSTFLAGS="--cfg mooring_loom" CARGO_TARGET_DIR="$TARGET_DIR/loom" \
    cargo clippy --release --locked -p mooring-proto --tests -- -D warnings
MOORING_LOOM_TARGET_DIR="$TARGET_DIR/loom" scripts/loom.sh
elapsed $t

t=$SECONDS; step "python package: wheel, ruff, pytest against a real master"
scripts/test-python.sh
elapsed $t

t=$SECONDS; step "benches compile"
cargo bench --workspace --locked --no-run
elapsed $t

if [ "$FUZZ_RUNS" != "0" ]; then
    t=$SECONDS; step "cargo-fuzz smoke run ($FUZZ_RUNS runs per target after the corpus)"
    if ! command -v cargo-fuzz >/dev/null; then
        cargo install cargo-fuzz --locked
    fi
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    # Every target fuzz/Cargo.toml declares.
    targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^mooring-fuzz$')
    for target in $targets; do
        mkdir -p "$scratch/$target"
        # New inputs go to the scratch dir; the committed corpus is only read.
        log="$scratch/$target.log"
        if ! (cd fuzz && RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$TARGET_DIR/fuzz" \
            cargo fuzz run "$target" "$scratch/$target" "corpus/$target" -- \
            -runs="$FUZZ_RUNS" -rss_limit_mb=2048 -print_final_stats=1) >"$log" 2>&1; then
            tail -60 "$log" >&2
            echo "cargo-fuzz failed for $target (failing inputs, if any, are in fuzz/artifacts/$target)" >&2
            exit 1
        fi
        grep -E "^(Done|stat::number_of_executed_units)" "$log" || true
    done
    elapsed $t
fi

step "all checks passed"
