#!/usr/bin/env bash
# One program with and without an environment setting, in alternating processes: a switch's
# effect on a shared machine whose load moves from minute to minute (each pair's two
# processes run one after the other, so a change in the load moves both). Prints each pair's
# loop times and the geometric mean of off / on over the pairs.
#
# Usage: bash benches/ab.sh PAIRS SETTING WORKLOAD DEVICES STEPS
#   e.g. bash benches/ab.sh 16 TESSERA_NO_SGEMM=1 big 1 10
# SETTING is what the second process of each pair runs with; the workloads are
# examples/side_by_side.rs's.
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=$1 setting=$2 prog=$3 dev=$4 steps=$5
cargo build -q --release --example side_by_side
bin=target/release/examples/side_by_side
loop_ms() { sed -n 's/.*loop_ms=\([0-9.]*\).*/\1/p'; }
grep -m1 'model name' /proc/cpuinfo || true
echo "pair  as built (ms)  with $setting (ms)"
for ((p = 1; p <= pairs; p++)); do
    a=$(TESSERA_DEVICES=$dev "$bin" "$prog" "$steps" | loop_ms)
    b=$(env "$setting" TESSERA_DEVICES="$dev" "$bin" "$prog" "$steps" | loop_ms)
    echo "$p $a $b"
done | awk '{ printf "%4d  %13.2f  %s\n", $1, $2, $3; s += log($3 / $2); n++ }
    END { printf "geomean (with %s) / (as built): %.3f over %d pairs\n", "'"$setting"'", exp(s / n), n }'
