#!/bin/sh
# Added latency against streams for 1 group, 4 groups and auto, measured side
# by side in one run (same build, same machine, one after another under the
# bench lock, $MOSHID_BENCH_LOCK or /tmp/moshid-bench.lock).
#   bench/phase-groups.sh [RAMP] [STEP_SECONDS]
# Environment (all optional):
#   MOSHID_GROUPS      settings to run, in order (default "1 4 auto")
#   MOSHID_BIN         the daemon binary (default target/release/moshid; a
#                      second build, e.g. the previous commit's, to compare)
#   MOSHID_BENCH_OUT   report folder (default bench/reports/<UTC date>-phase);
#                      each setting writes OUT/<setting>/ and OUT/<setting>.log
# Build first:
#   cargo build --release -p moshid -p moshid-bench --bin moshid --bin moshid-loadgen
set -eu
ramp=${1:-1,8,16}
step=${2:-10}
out=${MOSHID_BENCH_OUT:-bench/reports/$(date -u +%F)-phase}
bin=${MOSHID_BIN:-target/release/moshid}
cache=${MOSHID_CACHE:-/tmp/moshid-cache}
lock=${MOSHID_BENCH_LOCK:-/tmp/moshid-bench.lock}
mkdir -p "$out"
for groups in ${MOSHID_GROUPS:-1 4 auto}; do
    flock "$lock" target/release/moshid-loadgen \
        --spawn "$bin" \
        --serve-args "--phase-groups $groups --max-slots 64 --cache-dir $cache" \
        --ramp "$ramp" --stop-on none --step-seconds "$step" \
        --floor-seconds 2 --idle-seconds 1 --out "$out/$groups" \
        2>&1 | tee "$out/$groups.log"
done
