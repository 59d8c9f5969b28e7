"""The serve phase: the daemon serving real-time callers from the GPU.

For each KV cache type (bf16, then fp8): `moshid serve --backend cuda
--random-weights SHAPE` (Moshi 7B's shape, weights generated on the
device) is started pinned to the first half of the CPUs (the engine thread
on the first, the I/O cores on the next ones), and once it prints that it
listens (after its warm-up), `moshid-loadgen` — pinned to the other half —
runs a ramp of real-time Ogg Opus callers at random phases (1, 32, 64, 96,
… up to the daemon's slots) until a step breaks (a deadline miss, a
refusal, an error or p99 over the budget). Meanwhile a sampler reads, every
second, the GPU's utilisation, memory and power (nvidia-smi), the daemon's
resident size and its `/metrics` (the engine's measured step times by
batch size, active sessions). Then the daemon is stopped (after one RTP
call answered from the GPU, on the last daemon: see `rtp_peer`).

Everything goes to a folder per KV type — loadgen's report.json, its
timeline and SVG plots, the daemon's log, the samples, and serve.json (the
figures this phase adds to loadgen's) — packed into OUT_DIR/serve.tar.gz
after each one, so that a cut keeps the KV types before it. The headline:
the largest load with zero misses and its added latency.

A rehearsal (REHEARSAL=1) runs the same on the emulator (`--backend emu`)
with the tiny shape and a few callers, unpinned, without nvidia-smi.
"""

import json
import os
import re
import subprocess
import threading
import time
import urllib.request

from . import rtp_peer
from .runner import kill_group

READY_LINE = "moshid listening on http://"
# Seconds of audio each caller sends per ramp step.
STEP_SECONDS = 8.0
SAMPLE_PERIOD_S = 1.0


def plan_cpus(ncpu):
    """(daemon CPUs, engine CPU, I/O CPUs, load generator CPUs): the
    daemon on the first half (engine on the first, I/O cores on all but
    the last of the rest, which is left to the daemon's other threads),
    the load generator on the second half. None where there are too few
    CPUs to pin anything (under 4)."""
    if ncpu < 4:
        return None
    half = ncpu // 2
    daemon = list(range(half))
    io = daemon[1:-1] if half >= 4 else daemon[1:]
    return daemon, daemon[0], io, list(range(half, ncpu))


def ramp_for(slots, rehearsal):
    """The numbers of callers to try: 1, then every 32 below the slots, then
    the slots themselves (a rehearsal: 1, 2, up to 4)."""
    if rehearsal:
        return [n for n in (1, 2, 4) if n <= max(slots, 1)] or [1]
    steps = [1] + list(range(32, slots, 32))
    if slots > 1 and steps[-1] != slots:
        steps.append(slots)
    return steps


# What a ramp step costs beyond its audio (connecting, draining, the idle
# wait), and the ramp beyond its steps (idle CPU, the bare-Opus floor), in s.
STEP_OVERHEAD_S = 4.0
RAMP_OVERHEAD_S = 8.0


def fit_ramp(ramp, seconds, step_seconds):
    """The ramp cut to what `seconds` hold: loadgen writes its report only
    at the end, so a ramp cut by its time limit would leave nothing. Keeps
    the first and the last load and spreads the others evenly."""
    fits = int((seconds - RAMP_OVERHEAD_S) // (step_seconds + STEP_OVERHEAD_S))
    if fits >= len(ramp):
        return list(ramp)
    if fits <= 1:
        return ramp[:1]
    picks = sorted({round(i * (len(ramp) - 1) / (fits - 1)) for i in range(fits)})
    return [ramp[i] for i in picks]


def parse_ready(stderr_text):
    """The `<6>ready:` line's figures: slots, groups and predicted steps."""
    m = re.search(r"ready: (\d+) slots, (\S+) phase group\(s\), budget ([\d.]+|inf) ms, "
                  r"predicted step ([\d.]+) ms at batch 1, ([\d.]+) ms at batch (\d+)", stderr_text)
    if not m:
        return None
    return {"slots": int(m.group(1)), "phase_groups": m.group(2),
            "budget_ms": None if m.group(3) == "inf" else float(m.group(3)),
            "predicted_step_ms_b1": float(m.group(4)), "predicted_step_ms_max": float(m.group(5)),
            "line": m.group(0)}


class Daemon:
    """One `moshid serve` child: started, waited for, stopped."""

    def __init__(self, argv, env, folder):
        self.folder = folder
        self.err_path = os.path.join(folder, "daemon.log")
        self.out_lines = []
        self.addr = None
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self._ready = threading.Event()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stdout(self):
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.out_lines.append(line)
            if line.startswith(READY_LINE) and self.addr is None:
                self.addr = line[len(READY_LINE):].strip().rstrip("/")
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout):
        """True once it listens; False when it exited or the time ran out."""
        self._ready.wait(timeout)
        return self.addr is not None and self.proc.poll() is None

    def stderr(self):
        try:
            with open(self.err_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def tail(self, n=6):
        return [l for l in self.stderr().splitlines() if l.strip()][-n:]

    def stop(self):
        """SIGTERM to the group, SIGKILL after a grace."""
        if self.proc.poll() is None:
            kill_group(self.proc, grace_s=15)
        with open(os.path.join(self.folder, "daemon.out"), "w") as f:
            f.write("\n".join(self.out_lines) + "\n")


def get(url, timeout=3):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode(errors="replace")


def parse_metrics(text):
    """From `/metrics`: active sessions, and the engine's model steps
    (count and seconds, over every group and batch) with their histogram
    buckets (upper bound in s → cumulative count)."""
    out = {"active": None, "steps": 0, "step_s": 0.0, "buckets": {}}
    for line in text.splitlines():
        if line.startswith("moshid_active_sessions "):
            out["active"] = int(float(line.split()[-1]))
        elif 'stage="model_step",core="all"' in line:
            name, value = line.rsplit(" ", 1)
            if name.startswith("moshid_stage_duration_seconds_count"):
                out["steps"] = int(float(value))
            elif name.startswith("moshid_stage_duration_seconds_sum"):
                out["step_s"] = float(value)
            elif name.startswith("moshid_stage_duration_seconds_bucket"):
                m = re.search(r'le="([^"]+)"', name)
                if m:
                    out["buckets"][m.group(1)] = int(float(value))
    return out


class Sampler(threading.Thread):
    """Every SAMPLE_PERIOD_S: nvidia-smi, the daemon's RSS and /metrics,
    one JSON line each into samples.jsonl."""

    def __init__(self, folder, pid, addr, gpu):
        super().__init__(daemon=True)
        self.path = os.path.join(folder, "samples.jsonl")
        self.pid, self.addr, self.gpu = pid, addr, gpu
        self.stop_flag = threading.Event()
        self.samples = []

    def sample(self):
        s = {"t": time.time()}
        if self.gpu:
            try:
                q = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,power.draw",
                                    "--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, timeout=5).stdout.decode()
                util, mem, power = [c.strip() for c in q.splitlines()[0].split(",")][:3]
                s.update(gpu_util=float(util), gpu_mem_mib=float(mem), gpu_power_w=float(power))
            except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
                pass
        try:
            with open("/proc/%d/status" % self.pid) as f:
                m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
                if m:
                    s["rss_mib"] = int(m.group(1)) / 1024.0
        except OSError:
            pass
        try:
            s.update(parse_metrics(get("http://%s/metrics" % self.addr)))
        except OSError:
            pass
        return s

    def run(self):
        with open(self.path, "w") as f:
            while not self.stop_flag.is_set():
                s = self.sample()
                self.samples.append(s)
                f.write(json.dumps(s) + "\n")
                f.flush()
                self.stop_flag.wait(SAMPLE_PERIOD_S)

    def finish(self):
        self.stop_flag.set()
        self.join(timeout=10)
        return self.samples


def _quantile_from_buckets(b0, b1, q):
    """The upper bound (ms) of the bucket holding quantile q of the steps
    between two cumulative histograms."""
    bounds = sorted((float(k) if k != "+Inf" else float("inf"), k) for k in b1)
    total = b1.get("+Inf", 0) - b0.get("+Inf", 0)
    if total <= 0:
        return None
    for bound, k in bounds:
        if b1[k] - b0.get(k, 0) >= q * total:
            return bound * 1000.0 if bound != float("inf") else None
    return None


def per_load(samples):
    """The sampled figures grouped by the active sessions they saw: GPU
    utilisation (mean, max), device memory and RSS (max), and the engine's
    steps between the first and last sample of each group (mean step ms,
    p99 bucket bound, steps per second)."""
    groups = {}
    for s in samples:
        if s.get("active") is not None:
            groups.setdefault(s["active"], []).append(s)
    out = {}
    for n, ss in sorted(groups.items()):
        row = {"samples": len(ss)}
        util = [s["gpu_util"] for s in ss if "gpu_util" in s]
        if util:
            row["gpu_util_mean"] = sum(util) / len(util)
            row["gpu_util_max"] = max(util)
        for key, name in (("gpu_mem_mib", "gpu_mem_mib_max"), ("rss_mib", "rss_mib_max")):
            vals = [s[key] for s in ss if key in s]
            if vals:
                row[name] = max(vals)
        first, last = ss[0], ss[-1]
        steps = last.get("steps", 0) - first.get("steps", 0)
        if steps > 0:
            row["step_ms_mean"] = (last["step_s"] - first["step_s"]) * 1000.0 / steps
            row["step_ms_p99_bucket"] = _quantile_from_buckets(
                first.get("buckets", {}), last.get("buckets", {}), 0.99)
            row["steps_per_s"] = steps / max(last["t"] - first["t"], 1e-9)
        out[n] = row
    return out


def clean(step):
    """Whether a ramp step had no deadline miss, refusal or error."""
    return (step.get("deadline_misses", 1) == 0 and step.get("refused", 1) == 0
            and step.get("errors", 0) == 0 and step.get("sessions", 0) > 0)


def headline(kv, report, loads, ready):
    """One line: the largest load with zero misses and its latency."""
    steps = (report or {}).get("steps", [])
    held = max((s["streams"] for s in steps if clean(s)), default=None)
    broke = min((s["streams"] for s in steps if not clean(s)), default=None)
    pred = ("; ready predicted %.1f ms at batch 1" % ready["predicted_step_ms_b1"]) if ready else ""
    if not held:
        step = next((s for s in steps if s.get("streams") == broke), None)
        why = ""
        if step:
            why = ": " + ("; ".join(step.get("broke", [])) or "%d deadline misses, %d refused" % (
                step.get("deadline_misses", 0), step.get("refused", 0)))
        return "%s KV: no load without misses (first miss at %s%s)%s" % (kv, broke, why, pred)
    step = next(s for s in report["steps"] if s["streams"] == held)
    lat = step.get("latency_ms") or {}
    extra = loads.get(held, {})
    cells = ["%s KV: %d callers with zero misses" % (kv, held),
             "added latency p50 %.1f p99 %.1f max %.1f ms" % (lat.get("p50", 0), lat.get("p99", 0),
                                                             lat.get("max", 0))]
    if "step_ms_mean" in extra:
        cells.append("step %.1f ms mean" % extra["step_ms_mean"])
    if step.get("mean_batch"):
        cells.append("batch %.1f" % step["mean_batch"])
    if "gpu_util_mean" in extra:
        cells.append("GPU %.0f %%" % extra["gpu_util_mean"])
    if step.get("cpu_ms_per_stream_s_excl_engine") is not None:
        cells.append("I/O CPU %.2f ms/stream-s (%sx Opus)" % (
            step["cpu_ms_per_stream_s_excl_engine"],
            "%.2f" % step["ratio_to_bare_opus_excl_engine"]
            if step.get("ratio_to_bare_opus_excl_engine") else "-"))
    tail = " (misses from %s)" % broke if broke else " (no step missed)"
    return ", ".join(cells) + tail + pred


def step_lines(kv, report, loads):
    """One line per ramp step."""
    lines = []
    for s in (report or {}).get("steps", []):
        lat = s.get("latency_ms") or {}
        x = loads.get(s.get("sessions"), {})
        lines.append(
            "%s N=%d: p50/p99/max %s/%s/%s ms, misses %d, refused %d, batch %s, step %s ms, GPU %s %%, "
            "RSS %s MiB, GPU mem %s MiB, %s" % (
                kv, s["streams"], _f(lat.get("p50")), _f(lat.get("p99")), _f(lat.get("max")),
                s.get("deadline_misses", 0), s.get("refused", 0), _f(s.get("mean_batch")),
                _f(x.get("step_ms_mean")), _f(x.get("gpu_util_mean"), 0), _f(x.get("rss_mib_max"), 0),
                _f(x.get("gpu_mem_mib_max"), 0), "held" if s.get("held") else "BROKE"))
    return lines


def _f(v, digits=1):
    return "-" if v is None else "%.*f" % (digits, v)


def daemon_config(path, cpus, kv, cache, rehearsal):
    """The daemon's config file: pinning, the KV cache, caches, metrics."""
    cfg = {
        "model": {"cache_dir": os.path.join(cache, "model-cache"),
                  # The tests' and gpu-bench's kernel cache: compiled once.
                  "cuda": {"kv_cache": kv, "ptx_cache_dir": os.path.join(
                      os.environ.get("TMPDIR", "/tmp"), "moshid-kernel-cache")}},
        "metrics": {"enabled": True},
    }
    if rehearsal:
        # The emulator steps far slower than real time: a few slots.
        cfg["model"]["max_slots"] = 4
    if cpus:
        _, engine, io, _ = cpus
        cfg["runtime"] = {"io_cores": len(io), "io_cpus": io, "engine_cpu": engine}
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)


# ---- the phase

KV_TYPES = ("bf16", "fp8")
# Seconds kept for the RTP call on the last daemon.
RTP_SECONDS = 4
RTP_RESERVE_S = 15


def _pinned(argv, cpus):
    """`argv` under `taskset -c CPUS` (unchanged where taskset is missing)."""
    if not cpus or not _which("taskset"):
        return argv
    return ["taskset", "-c", ",".join(str(c) for c in cpus)] + argv


def _which(name):
    return any(os.access(os.path.join(d, name), os.X_OK)
               for d in os.environ.get("PATH", "").split(os.pathsep) if d)


def serve_phase(r, bundle, s, results, save):
    """Both KV types in turn, each with an equal share of what is left."""
    if not (bundle.has_bin("moshid") and bundle.has_bin("moshid-loadgen")):
        r.record("serve", "SKIPPED", 0, "the bundle has no moshid or moshid-loadgen (rebuild it "
                 "with scripts/gpu-pack)")
        return
    folder = os.path.join(r.scratch, "serve")
    os.makedirs(folder, exist_ok=True)
    cpus = None if s.rehearsal else plan_cpus(os.cpu_count() or 1)
    serve = results.setdefault("serve", {"shape": s.serve_shape, "backend": s.serve_backend,
                                         "runs": {}})
    serve["cpus"] = None if not cpus else {"daemon": cpus[0], "engine": cpus[1], "io": cpus[2],
                                           "loadgen": cpus[3]}
    for i, kv in enumerate(KV_TYPES):
        last = i == len(KV_TYPES) - 1
        share = (r.left() - (0 if last else RTP_RESERVE_S)) / (len(KV_TYPES) - i)
        one_kv(r, bundle, s, cpus, kv, folder, share, serve, with_rtp=last)
        save()
        r.pack_folder("serve.tar.gz", folder, "serve")


def start_daemon(r, bundle, s, cpus, kv, kvdir, limit):
    """The daemon, started and ready; None (recorded) when it is not."""
    cfg = os.path.join(kvdir, "config.json")
    daemon_config(cfg, cpus, kv, os.path.join(r.scratch, "daemon"), s.rehearsal)
    argv = _pinned([bundle.bin("moshid"), "serve", "-c", cfg, "--listen", "127.0.0.1:0",
                    "--backend", s.serve_backend, "--random-weights", s.serve_shape],
                   cpus and cpus[0])
    t0 = time.monotonic()
    d = Daemon(argv, dict(os.environ), kvdir)
    name = "serve-%s-start" % kv
    if not d.wait_ready(min(limit, 180)):
        d.stop()
        why = "exited (%s)" % d.proc.returncode if d.proc.poll() is not None else "no ready line"
        tail = d.tail(4)
        if os.uname()[2].startswith("4.4.0"):
            # gVisor reports kernel 4.4.0; the daemon's I/O cores need io_uring.
            tail.append("(this kernel reports 4.4.0, gVisor's: the daemon's I/O cores (glommio) "
                        "need io_uring, which gVisor may not offer)")
        r.add_failure(name, "FAIL", tail)
        r.record(name, "FAIL", time.monotonic() - t0, "%s: %s" % (why, " ".join(argv)[-100:]))
        return None, None
    ready = parse_ready(d.stderr())
    r.record(name, "PASS", time.monotonic() - t0,
             ready["line"] if ready else "ready (no ready line parsed)")
    return d, ready


def one_kv(r, bundle, s, cpus, kv, folder, share, serve, with_rtp):
    """One KV type: daemon, ramp, samples, (RTP call), serve.json."""
    t_end = time.monotonic() + share
    kvdir = os.path.join(folder, kv)
    os.makedirs(kvdir, exist_ok=True)
    if share < 20:
        r.record("serve-%s" % kv, "NO-TIME", 0, "%.0f s left for it" % share)
        return
    d, ready = start_daemon(r, bundle, s, cpus, kv, kvdir, share)
    run = {"kv": kv, "ready": ready}
    serve["runs"][kv] = run
    if d is None:
        return
    out = os.path.join(kvdir, "loadgen")
    samples = []
    try:
        reserve = RTP_RESERVE_S if with_rtp else 0
        ramp = fit_ramp(ramp_for(ready["slots"] if ready else 1, s.rehearsal),
                        t_end - time.monotonic() - reserve, s.serve_step_seconds)
        run["ramp"] = ramp
        sampler = Sampler(kvdir, d.proc.pid, d.addr, gpu=not s.rehearsal)
        sampler.start()
        lg = _pinned([bundle.bin("moshid-loadgen"), "--url", "ws://%s/api/chat" % d.addr,
                      "--pid", str(d.proc.pid), "--ramp", ",".join(str(n) for n in ramp),
                      "--step-seconds", str(s.serve_step_seconds), "--out", out,
                      "--idle-seconds", "2", "--floor-seconds", "5", "--drain-seconds", "2",
                      "--connect-timeout", "10"]
                     # On the emulator every step misses: the whole ramp runs all the same.
                     + (["--stop-on", "error"] if s.rehearsal else []), cpus and cpus[3])
        r.step("bench.log", "serve-%s-ramp" % kv, t_end - time.monotonic() - reserve, lg,
               note="loadgen --ramp %s --step-seconds %s" % (",".join(map(str, ramp)),
                                                              s.serve_step_seconds))
        samples = sampler.finish()
        if with_rtp:
            rtp_call(r, d, kvdir, run)
    finally:
        d.stop()
    report = _read_json(os.path.join(out, "report.json"))
    loads = per_load(samples)
    run["loads"] = {str(k): v for k, v in loads.items()}
    run["headline"] = headline(kv, report, loads, ready)
    run["steps"] = step_lines(kv, report, loads)
    with open(os.path.join(kvdir, "serve.json"), "w") as f:
        json.dump(run, f, indent=1)


def rtp_call(r, d, kvdir, run):
    t0 = time.monotonic()
    try:
        res = rtp_peer.call(d.addr, RTP_SECONDS, kvdir)
    except (OSError, ValueError, KeyError) as e:
        r.add_failure("serve-rtp", "FAIL", [str(e)[:240]])
        r.record("serve-rtp", "FAIL", time.monotonic() - t0, str(e)[:120])
        return
    run["rtp"] = res
    ok = res.get("engine_wait_ms") is not None and res["packets_received"] > 0
    r.record("serve-rtp", "PASS" if ok else "FAIL", time.monotonic() - t0, rtp_peer.line(res)[:120])
    if not ok:
        r.add_failure("serve-rtp", "FAIL", [rtp_peer.line(res)])


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def serve_lines(results):
    """The summary's lines: the headline per KV type, its steps, the RTP call."""
    runs = results.get("serve", {}).get("runs", {})
    lines = [run["headline"] for run in runs.values() if run.get("headline")]
    for run in runs.values():
        lines += run.get("steps", [])[:8]
    for run in runs.values():
        if run.get("rtp"):
            lines.append(rtp_peer.line(run["rtp"]))
    return lines
