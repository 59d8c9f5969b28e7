"""The speed phases: where a step's time goes, in the previous build and in
this one, and the official PyTorch implementation on the same GPU.

profile: `gpu-bench --profile --json OUT` (CUDA events at phase boundaries,
per model, KV type and batch size) of this build and of the baseline
bundle (scripts/gpu-pack --baseline COMMIT), run for run, most valuable
first, at full context on random weights. A gpu-bench without `--profile`
(any build before it existed — the baseline, usually) is timed with its
step-time mode instead (p50/p99 per batch size, graphs on), so the two
builds still stand side by side. A run with no time left is not started.

torch: `bench/torch_step.py` (the official `LMGen` of PyPI `moshi` with
random weights at Moshi 7B's shape, bf16, CUDA graphs), its wheels
(`.cache/torch-side-wheels/*.whl`, which pin nothing the machine lacks)
installed with `pip install --no-deps --no-index --target` into the scratch
folder and put first on PYTHONPATH, over the machine's own PyTorch. (A
`venv --system-site-packages` would not see that PyTorch where python3 is
itself a venv, as on the GPU machine: it inherits the base interpreter's
site-packages.) Its step per batch size is printed beside moshid's from
the profile phase, with the ratio. Either half missing: the phase says so
and is skipped.
"""

import glob
import json
import os
import subprocess
import sys

from . import summary

# (model, KV type, batch sizes of this build, batch sizes of the
# baseline, context), in order of value; each run time-boxed.
# The first run of a build includes its kernels' NVRTC compile (about 20 s;
# this build's are cached by the device phase) and the profile's rate
# calibration.
PROFILE_RUNS = [
    ("moshi7b", "bf16", [1, 8, 32, 64], [1, 64], 3000, 45),
    ("moshi7b", "fp8", [64, 128], [64, 128], 3000, 30),
    ("hibiki2b", "bf16", [1, 64, 128], [], 1500, 25),
    ("hibiki-zero-3b", "bf16", [1, 64], [], 3000, 25),
]
TORCH_BATCHES = [1, 8, 32, 64]
TORCH_CONTEXT = 3000
TORCH_STEPS, TORCH_WARMUP = 30, 5


def gpu_bench_help(exe):
    try:
        p = subprocess.run([exe, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=20)
        return p.stdout.decode(errors="replace")
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)


def bench_argv(exe, profile, model, kv, batches, context, out_dir, cache, s):
    """gpu-bench's arguments for one run: the profile, or the step times."""
    argv = [exe]
    json_path = os.path.join(out_dir, "profile-%s-kv%s.json" % (os.path.basename(model), kv))
    if profile:
        argv += ["--profile", "--profile-steps", str(s.profile_steps), "--json", json_path]
    argv += ["--model", model, "--batch", ",".join(str(b) for b in batches), "--kv", kv]
    if context:
        argv += ["--context", str(context)]
    if not profile:
        argv += ["--graphs", "on"]
    argv += ["--steps", str(s.steps), "--warmup", str(s.warmup), "--out", out_dir,
             "--ptx-cache", cache]
    if s.rehearsal:
        argv += ["--device", "emu", "--reserve-gib", "0"]
    if not profile:
        json_path = os.path.join(out_dir, "gpu-bench-%s-kv%s.json" % (os.path.basename(model), kv))
    return argv, json_path


def kernel_cache():
    """The tests' kernel cache ($TMPDIR/moshid-kernel-cache), shared."""
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), "moshid-kernel-cache")


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def rehearsal_runs(bundle):
    """On the emulator: a fixture's shape, two batch sizes, both builds."""
    fixture = next((d for d in bundle.golden_dirs()
                    if os.path.isfile(os.path.join(d, "lm_config.json"))), None)
    if not fixture:
        return []
    return [(fixture, "bf16", [1, 3], [1, 3], None, 120)]


def profile_phase(r, builds, s, results, save):
    """`builds`: [(label, Bundle)], this build first. Fills results["profile"]."""
    prof = results.setdefault("profile", {})
    supports = {}
    for label, b in builds:
        help_text = gpu_bench_help(b.bin("gpu-bench"))
        supports[label] = "--profile" in help_text
        prof.setdefault(label, [])
        if not supports[label]:
            msg = ("%s build (%s): its gpu-bench has no --profile: timing its steps instead"
                   % (label, b.manifest.get("commit", "?")[:12]))
            r.append("bench.log", "\n" + msg + "\n")
            print(msg, flush=True)
    if len(builds) < 2:
        r.record("profile-baseline", "SKIPPED", 0,
                 "no .gpu-bundle/baseline (scripts/gpu-pack --baseline COMMIT)")
    runs = rehearsal_runs(builds[0][1]) if s.rehearsal else PROFILE_RUNS
    for model, kv, cur_b, base_b, context, limit in runs:
        for label, b in builds:
            batches = cur_b if label == "current" else base_b
            if not batches:
                continue
            out_dir = os.path.join(r.raw, "profile", label)
            os.makedirs(out_dir, exist_ok=True)
            # One kernel cache for every build and the tests (keyed by source
            # and options): each build's kernels compile once.
            cache = kernel_cache()
            argv, json_path = bench_argv(b.bin("gpu-bench"), supports[label], model, kv, batches,
                                         context, out_dir, cache, s)
            name = "%s-%s-%s" % ("profile" if supports[label] else "steps",
                                 label, os.path.basename(model) + "-" + kv)
            r.step("bench.log", name, limit, argv)
            report = _read_json(json_path)
            if report is not None:
                prof[label].append({"model": os.path.basename(model), "kv": kv,
                                    "batches": batches, "context": context,
                                    "mode": "profile" if supports[label] else "steps",
                                    "report": report})
                save()
    r.pack()


def profile_lines(results):
    """The summary's lines: previous → this build per model and KV type,
    then the slowest phases of this build's first profile."""
    prof = results.get("profile", {})
    cur, base = prof.get("current", []), prof.get("baseline", [])
    lines = []
    for c in cur:
        b = next((x for x in base if (x["model"], x["kv"]) == (c["model"], c["kv"])), None)
        label = "%s %s" % (c["model"], c["kv"])
        batches = sorted(set(c["batches"]) | set(b["batches"] if b else []))
        line = summary.compare_line(label, batches, c["report"], b["report"] if b else None)
        lines += [line] if line else summary.step_line(label, c["report"])
    for c in cur:
        if c["mode"] == "profile":
            lines += ["%s %s, this build's slowest phases: %s" % (c["model"], c["kv"], l)
                      for l in summary.profile_phases(c["report"])[:3]]
            break
    return lines


# ---- the official PyTorch implementation

def torch_phase(r, s, results, save):
    script = os.path.join(r.repo, "bench", "torch_step.py")
    if not os.path.isfile(script):
        r.record("torch", "SKIPPED", 0, "bench/torch_step.py is not in this tree")
        return
    env = dict(os.environ)
    wheels = sorted(glob.glob(os.path.join(r.repo, ".cache", "torch-side-wheels", "*.whl")))
    if wheels:
        site = os.path.join(r.scratch, "torch-site")
        out = r.step("bench.log", "torch-wheels", 60, [
            sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
            "--no-cache-dir", "--disable-pip-version-check", "--target", site] + wheels,
            note="pip install --no-deps --target $SCRATCH/torch-site %d wheel(s)" % len(wheels))
        if not out or not out.ok:
            return
        env["PYTHONPATH"] = site + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    check = subprocess.run([sys.executable, "-c", "import torch, moshi"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    if check.returncode != 0:
        why = (check.stdout.decode(errors="replace").strip().splitlines() or ["?"])[-1]
        r.record("torch", "SKIPPED", 0, "no torch+moshi here (%s); carry .cache/torch-side-wheels"
                 % why[:80])
        return
    out_json = os.path.join(r.raw, "torch", "torch-step.json")
    os.makedirs(os.path.dirname(out_json), exist_ok=True)
    argv = [sys.executable, script] + torch_args(script_help(script, env), out_json, s.rehearsal)
    r.step("bench.log", "torch-step", r.left(), argv, env=env)
    report = _read_json(out_json)
    if report is not None:
        results["torch"] = {"batches": TORCH_BATCHES, "context": TORCH_CONTEXT, "report": report}
        save()


def script_help(script, env):
    try:
        p = subprocess.run([sys.executable, script, "--help"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60)
        return p.stdout.decode(errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return ""


def torch_args(help_text, out_json, rehearsal=False):
    """bench/torch_step.py's arguments, as far as its --help offers them:
    the batch sizes (a list or comma-separated), steps, the JSON's path; a
    rehearsal's tiny shape on the CPU."""
    args = []
    batches = [1, 2] if rehearsal else TORCH_BATCHES
    if "--batch" in help_text:
        many = "--batch BATCH [BATCH" in help_text or "--batch B [B" in help_text
        args += ["--batch"] + ([str(b) for b in batches] if many
                               else [",".join(str(b) for b in batches)])
    for flag, value in (("--steps", TORCH_STEPS), ("--warmup", TORCH_WARMUP)):
        if flag in help_text:
            args += [flag, str(value)]
    if "--context" in help_text:
        args += ["--context", str(TORCH_CONTEXT)]
    for flag in ("--json", "--out"):
        if flag in help_text:
            args += [flag, out_json]
            break
    if rehearsal and "--tiny" in help_text:
        args += ["--device", "cpu", "--tiny"]
    return args


def torch_lines(results):
    """moshid's step (this build's profile, Moshi 7B bf16) beside PyTorch's."""
    t = results.get("torch")
    if not t:
        return []
    ours = next((c for c in results.get("profile", {}).get("current", [])
                 if (c["model"], c["kv"]) == ("moshi7b", "bf16")), None)
    cells = []
    for b in t["batches"]:
        theirs = summary.best_p50(t["report"], b)
        mine = summary.best_p50(ours["report"], b) if ours else None
        if theirs is None:
            continue
        if mine is None:
            cells.append("b%d %.1f vs -" % (b, theirs))
        else:
            cells.append("b%d %.1f vs %.1f ms (%.2f×)" % (b, theirs, mine, theirs / mine))
    if not cells:
        return ["official PyTorch: nothing measured (see bench.log)"]
    return ["official PyTorch vs moshid, Moshi 7B bf16 at context %d, p50 (× = how much faster "
            "moshid is): %s" % (t["context"], " ".join(cells))]
