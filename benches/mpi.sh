#!/usr/bin/env bash
# The multi-process bench (docs/PERFORMANCE.md, "Processes"): the seed sharding step and the big
# MLP step on 1 process x 8 devices and on 2 processes x 4 devices, alternating, three rounds;
# then one all-reduce between 2 processes of one device each (1 float: latency; 1,835,008
# floats, 7.3 MB: bandwidth). Needs Open MPI (bash scripts/system-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release -p tessera-mpirun --bin scaling
bin=target/release/scaling
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
grep -m1 "model name" /proc/cpuinfo || true
for round in 1 2 3; do
    for what in seed big; do
        echo "round $round, 1 x 8, $what: $(TESSERA_DEVICES=8 $bin $what)"
        echo "round $round, 2 x 4, $what: $(mpirun --oversubscribe -np 2 -x TESSERA_DEVICES=4 $bin $what)"
    done
    for n in 1 1835008; do
        echo "round $round, 1 x 2, allreduce $n: $(TESSERA_DEVICES=2 $bin allreduce $n)"
        echo "round $round, 2 x 1, allreduce $n: $(mpirun --oversubscribe -np 2 -x TESSERA_DEVICES=1 $bin allreduce $n)"
    done
done
