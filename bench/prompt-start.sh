#!/bin/sh
# Session start (connect → handshake) of prompted sessions on a model with
# prompts (PersonaPlex), cold and from the prompt cache, with 0 and STREAMS
# other streams running, and those streams' added latency with and without
# prompted sessions arriving: one daemon, one run, one after another.
#   bench/prompt-start.sh MODEL_DIR VOICE_DIR VOICE [STREAMS] [STEP_SECONDS]
# VOICE is a file name in VOICE_DIR (a .wav or NVIDIA's .pt). Environment
# (all optional):
#   MOSHID_BIN         the daemon binary (default target/release/moshid)
#   MOSHID_BACKEND     model.backend (default cpu)
#   MOSHID_BENCH_OUT   report folder (default bench/reports/<UTC date>-prompt-start)
#   MOSHID_BENCH_PORT  the daemon's port on 127.0.0.1 (default 18998)
#   MOSHID_BENCH_LOCK  the bench lock (default /tmp/moshid-bench.lock)
#   MOSHID_MODEL_DELAY frames the model answers late (default 0: PersonaPlex
#                      answers from the first frame, its prompt filled the delay)
# Writes OUT/config.json, OUT/daemon.log, OUT/idle.json (start times alone),
# OUT/load/ (the streams alone), OUT/load-prompts/ and OUT/under-load.json
# (the streams while prompted sessions start), OUT/summary.txt.
# Build first:
#   cargo build --release -p moshid -p moshid-bench --bin moshid --bin moshid-loadgen --bin prompt-start
set -eu
[ $# -ge 3 ] || { sed -n '2,8p' "$0"; exit 2; }
model=$(realpath "$1")
voices=$(realpath "$2")
voice=$3
streams=${4:-16}
step=${5:-20}
out=${MOSHID_BENCH_OUT:-bench/reports/$(date -u +%F)-prompt-start}
bin=${MOSHID_BIN:-target/release/moshid}
port=${MOSHID_BENCH_PORT:-18998}
lock=${MOSHID_BENCH_LOCK:-/tmp/moshid-bench.lock}
url="ws://127.0.0.1:$port/api/chat"
mkdir -p "$out"
cat > "$out/config.json" <<EOF
{"listen": {"address": "127.0.0.1:$port"},
 "model": {"dir": "$model", "backend": "${MOSHID_BACKEND:-cpu}",
           "max_slots": $((streams + 2)), "voice_dir": "$voices"},
 "engine": {"prompt_frames_per_tick": 8, "prompt_cache_entries": 16}}
EOF
exec 9>"$lock"
flock 9
"$bin" serve --config "$out/config.json" >"$out/daemon.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT INT TERM
tries=0
until grep -qs 'ready:' "$out/daemon.log"; do
    tries=$((tries + 1))
    if [ $tries -gt 600 ] || ! kill -0 $pid 2>/dev/null; then
        echo "the daemon did not become ready:" >&2
        tail -20 "$out/daemon.log" >&2
        exit 1
    fi
    sleep 0.5
done
start="target/release/prompt-start --url $url --voice $voice"
loadgen="target/release/moshid-loadgen --url $url --pid $pid --streams $streams
    --step-seconds $step --stop-on none --floor-seconds 2 --idle-seconds 1
    --model-delay-frames ${MOSHID_MODEL_DELAY:-0}"
echo "== start times, no other stream"
$start --rounds 10 --gap-ms 200 --out "$out/idle.json"
echo "== $streams streams, no prompted session"
$loadgen --out "$out/load"
echo "== $streams streams, prompted sessions starting"
# The prompted sessions begin once the callers are in, and end before them.
rounds=$(( (step - 4) / 2 ))
( sleep 3; $start --rounds $rounds --gap-ms 1500 --out "$out/under-load.json" ) &
starter=$!
$loadgen --out "$out/load-prompts"
wait $starter
python3 - "$out" <<'EOF' | tee "$out/summary.txt"
import json, sys, os
out = sys.argv[1]
def starts(name):
    r = json.load(open(os.path.join(out, name)))
    return "cold p50 %.1f ms (max %.1f, n %d), warm p50 %.1f ms (max %.1f, n %d), failed %d" % (
        r["cold"]["p50_ms"], r["cold"]["max_ms"], r["cold"]["n"],
        r["warm"]["p50_ms"], r["warm"]["max_ms"], r["warm"]["n"], r["failed"])
def load(name):
    r = json.load(open(os.path.join(out, name, "report.json")))
    s = r["steps"][0]
    return json.dumps({k: s[k] for k in s if k in (
        "streams", "latency_ms", "deadline_misses", "late_ticks", "refused", "errors")})
print("start times, idle daemon:      ", starts("idle.json"))
print("start times, under load:       ", starts("under-load.json"))
print("streams alone:                 ", load("load"))
print("streams, prompts arriving:     ", load("load-prompts"))
EOF
