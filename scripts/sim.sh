#!/usr/bin/env bash
# Seeded whole-cluster simulations under madsim (sim-tests/). Builds with --cfg madsim in its
# own target directory ($CARGO_TARGET_DIR/madsim, or MOORING_SIM_TARGET_DIR).
#
#   scripts/sim.sh run [--seeds N] [--from S] [--jobs J] [--transport tcp|sim|rdma|shm] [--ops N]
#   MADSIM_TEST_SEED=N scripts/sim.sh replay        one seed again, with logs (RUST_LOG)
#   scripts/sim.sh determinism [--seeds N]          each seed twice, runs must be identical
#   scripts/sim.sh ci                               regression lists, 200 seeds, 60 more TCP
#                                                   seeds, 50 RDMA seeds, 60 shm seeds, 200
#                                                   peer worlds and 4 of 64 peers, determinism
#   scripts/sim.sh overnight                        10,000 seeds
#   scripts/sim.sh teeth [SEEDS]                    every planted bug (sim-tests/teeth.py): seeds
#                                                   caught and the first failing seed, as a table
#   scripts/sim.sh help                             every option
set -euo pipefail
cd "$(dirname "$0")/.."
base="${CARGO_TARGET_DIR:-$PWD/target}"
export CARGO_TARGET_DIR="${MOORING_SIM_TARGET_DIR:-$base/madsim}"
export RUSTFLAGS="--cfg madsim"
cargo build --release --locked -q -p mooring-sim-tests --bin mooring-sim
sim="$CARGO_TARGET_DIR/release/mooring-sim"

command="${1:-run}"
[ $# -gt 0 ] && shift
case "$command" in
    ci)
        echo "--- regression seeds (sim-tests/regressions.txt)"
        "$sim" run --list sim-tests/regressions.txt
        echo "--- ${MOORING_SIM_SEEDS:-200} seeds"
        "$sim" run --seeds "${MOORING_SIM_SEEDS:-200}"
        echo "--- regression seeds found on TCP runs (sim-tests/regressions-tcp.txt)"
        "$sim" run --transport tcp --list sim-tests/regressions-tcp.txt
        echo "--- regression seeds found on transport-sim runs (sim-tests/regressions-sim.txt)"
        "$sim" run --transport sim --list sim-tests/regressions-sim.txt
        echo "--- regression seeds found on RDMA runs (sim-tests/regressions-rdma.txt)"
        "$sim" run --transport rdma --list sim-tests/regressions-rdma.txt
        echo "--- regression seeds found on shared-memory runs (sim-tests/regressions-shm.txt)"
        "$sim" run --transport shm --list sim-tests/regressions-shm.txt
        echo "--- ${MOORING_SIM_TCP_SEEDS:-60} more seeds over TCP (a sixth run two masters on a simulated etcd and kill the leader)"
        "$sim" run --seeds "${MOORING_SIM_TCP_SEEDS:-60}" --from 1000 --transport tcp
        echo "--- ${MOORING_SIM_RDMA_SEEDS:-50} seeds over RDMA (the software HCA, with its faults)"
        "$sim" run --seeds "${MOORING_SIM_RDMA_SEEDS:-50}" --from 100 --transport rdma
        echo "--- ${MOORING_SIM_SHM_SEEDS:-60} seeds over same-host shared memory (two hosts; the rest as sim)"
        "$sim" run --seeds "${MOORING_SIM_SHM_SEEDS:-60}" --from 2000 --transport shm
        echo "--- peer worlds: regression seeds (sim-tests/regressions-peer.txt)"
        "$sim" peer --list sim-tests/regressions-peer.txt
        echo "--- ${MOORING_SIM_PEER_SEEDS:-200} peer worlds (kills, goodbyes, joins, restarts, partitions, failing disks; coverage floors)"
        "$sim" peer --seeds "${MOORING_SIM_PEER_SEEDS:-200}" --floors
        echo "--- 4 peer worlds of 64 peers"
        "$sim" peer --seeds 4 --from 500 --peers 64 --ops 40
        echo "--- determinism"
        "$sim" peer --seeds 2 --determinism
        "$sim" determinism --seeds 4
        "$sim" determinism --seeds 2 --from 100 --transport rdma
        "$sim" determinism --seeds 2 --from 2000 --transport shm
        # Seed 2 on TCP runs a group of masters on the simulated etcd.
        "$sim" determinism --seeds 2 --from 2 --transport tcp
        # A group of masters (seed 2 on TCP): two replays, each in a fresh process, must agree.
        first=$(MADSIM_TEST_SEED=2 RUST_LOG=error "$sim" replay --transport tcp 2>&1)
        second=$(MADSIM_TEST_SEED=2 RUST_LOG=error "$sim" replay --transport tcp 2>&1)
        if [ "$first" != "$second" ]; then
            echo "seed 2 (a group of masters) replays differently:"
            diff <(echo "$first") <(echo "$second") | head -20
            exit 1
        fi
        echo "seed 2 (a group of masters): two replays agree"
        ;;
    overnight) exec "$sim" run --seeds 10000 "$@" ;;
    teeth) exec python3 sim-tests/teeth.py all "${1:-200}" ;;
    help) exec "$sim" help "$@" ;;
    *) exec "$sim" "$command" "$@" ;;
esac
