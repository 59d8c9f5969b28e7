"""The runbook's phases in order of value, their time boxes, and the exit
status (see scripts/gpu-check for what each phase does and the settings).

Order: env (always) → device and kernels → golden → profile (the previous
build and this one) → torch (the official implementation) → serve (and
the RTP call) → compile. Each phase's box is its share of TIME_BUDGET
(`BOXES`, seconds at the default budget of 540, scaled with it; `BOXES=`
overrides some, e.g. `BOXES=serve=300`); a phase ends at its box or at
the deadline, whichever comes first, and a failing step never stops the
next ones. The exit status is 0 when every step passed or was skipped.
"""

import json
import os
import shutil
import signal
import sys
import tempfile
import time

from . import checks, cuda_env, profile, serve
from .bundle import Bundle, cargo_available, open_bundles, stop_leftovers, unpack_dir
from .runner import Runner
from . import summary as summary_mod

DEFAULT_BUDGET_S = 540
# Seconds per phase at DEFAULT_BUDGET_S.
BOXES = {"device": 40, "golden": 40, "profile": 120, "torch": 100, "serve": 210, "compile": 20}
PHASES = ("device", "golden", "profile", "torch", "serve", "compile")
# A rehearsal's budget and the boxes it fixes: the golden tests take minutes
# on the emulator.
REHEARSAL_BUDGET_S = 900
REHEARSAL_BOXES = {"device": 120, "golden": 360, "compile": 120}


class Settings:
    """What the environment asks for (see scripts/gpu-check)."""

    def __init__(self, env):
        self.rehearsal = env.get("REHEARSAL", "0") == "1"
        self.budget = int(env.get("TIME_BUDGET", REHEARSAL_BUDGET_S if self.rehearsal
                                  else DEFAULT_BUDGET_S))
        self.steps = int(env.get("STEPS", 3 if self.rehearsal else 30))
        self.warmup = int(env.get("WARMUP", 1 if self.rehearsal else 5))
        self.profile_steps = int(env.get("PROFILE_STEPS", 2 if self.rehearsal else 10))
        self.use_bundle = env.get("USE_BUNDLE", "1") != "0"
        self.env_only = env.get("ENV_ONLY", "0") == "1"
        phases = [p for p in env.get("PHASES", ",".join(PHASES)).split(",") if p]
        unknown = [p for p in phases if p not in PHASES]
        if unknown:
            raise ValueError("PHASES: unknown phase(s) %s (known: %s)" % (unknown, ",".join(PHASES)))
        if env.get("BENCH", "1") == "0":
            phases = [p for p in phases if p not in ("profile", "torch")]
        if env.get("SERVE", "1") == "0":
            phases = [p for p in phases if p != "serve"]
        self.phases = phases
        self.boxes = boxes(self.budget, env.get("BOXES", ""),
                           REHEARSAL_BOXES if self.rehearsal else {})
        # The emulator is many times slower than a GPU: steps get longer limits.
        self.limit_scale = 4 if self.rehearsal else 1
        self.serve_shape = env.get("SERVE_SHAPE", "moshi-tiny" if self.rehearsal else "moshi-7b")
        self.serve_backend = env.get("SERVE_BACKEND", "emu" if self.rehearsal else "cuda")
        self.serve_step_seconds = float(env.get("SERVE_STEP_SECONDS",
                                                2.0 if self.rehearsal else serve.STEP_SECONDS))
        self.bundle = env.get("GPU_BUNDLE", ".gpu-bundle")
        # The machine's temporary folder (the run's own scratch replaces TMPDIR).
        self.tmp = env.get("TMPDIR") or "/tmp"

    def bundle_dir(self, repo):
        return os.path.join(repo, self.bundle)


def boxes(budget, override, fixed=None):
    """Each phase's box: its share of the default budget, scaled (or as
    `fixed` gives it); then the `name=seconds` pairs of `override`."""
    out = {k: v * budget / DEFAULT_BUDGET_S for k, v in BOXES.items()}
    out.update(fixed or {})
    for pair in filter(None, override.split(",")):
        k, _, v = pair.partition("=")
        if k not in out:
            raise ValueError("BOXES: unknown phase %r" % k)
        out[k] = float(v)
    return out


class Stopped(Exception):
    """A signal asked the run to stop."""


def _stop(signum, _frame):
    raise Stopped("signal %d" % signum)


def env_phase(r, s, bundle, mode):
    """The environment: env.txt, the summary's header; the CUDA env exported."""
    r.phase = "env"
    cuda = cuda_env.CudaEnv(r.scratch)
    if s.rehearsal:
        cuda.gpu = "emulator (REHEARSAL=1: no GPU used)"
        r.header.append("gpu: " + cuda.gpu)
        cuda.rehearse(r.repo)
    else:
        if not shutil.which("nvidia-smi"):
            raise SystemExit("gpu-check: nvidia-smi not found: this script is for a machine with an "
                             "NVIDIA GPU (REHEARSAL=1 rehearses it on the emulator)")
        q = cuda.read_gpu(r.raw)
        r.header.append("gpu: %s; driver %s (CUDA %s)" % (q or "nvidia-smi gave nothing",
                                                          cuda.driver_version, cuda.driver_cuda or "?"))
        cuda.discover(r.repo)
        cuda.run_probe()
    glibc = cuda_env.glibc_version()
    text = cuda.text(mode, bundle.manifest if bundle.present else None, glibc)
    r.write("env.txt", "date: %s UTC\n" % _now() + text)
    print(text, flush=True)
    r.header.append("libraries: %s; headers %s" % (cuda.probe_headline(), cuda.include or "none"))
    if bundle.present:
        with open(os.path.join(r.raw, "bundle-MANIFEST.txt"), "w") as f:
            f.write(open(os.path.join(bundle.root, "MANIFEST")).read())
    r.record("env", "PASS", r.elapsed(), "env.txt")
    return cuda, glibc


def _now():
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


def get_bundles(r, s):
    """This build's bundle and the baseline's (or None), made by gpu-pack
    when cargo is here and there is no bundle, and unpacked."""
    root = s.bundle_dir(r.repo)
    if (not s.use_bundle or not Bundle(root).present) and cargo_available():
        r.phase = "build"
        r.phase_end = r.clock() + 3600
        r.step("tests.log", "gpu-pack", 3600, [os.path.join(r.repo, "scripts", "gpu-pack")])
        r.restart_clock()
    if not Bundle(root).present:
        return Bundle(root), None
    return open_bundles(root, unpack_dir(root, s.tmp))


def run_phases(r, s):
    bundle = Bundle(s.bundle_dir(r.repo))
    mode = "bundle" if (s.use_bundle and bundle.present) else "cargo"
    cuda, glibc = env_phase(r, s, bundle, mode)
    if s.env_only:
        print("gpu-check: ENV_ONLY=1: stopping after the environment")
        return 0
    bundle, baseline = get_bundles(r, s)
    ok, why = bundle.starts() if bundle.present else (False, "no bundle")
    if not ok:
        msg = "gpu-check: THE BUNDLED EXECUTABLES DO NOT START HERE: %s" % why
        if bundle.present:
            msg += ("\ngpu-check: they need glibc %s; this machine has %s: rebuild them "
                    "(scripts/gpu-pack) on a system with glibc <= %s"
                    % (bundle.manifest.get("glibc_needed"), glibc or "?", glibc or "?"))
        r.append("tests.log", msg + "\n")
        print(msg, flush=True)
        r.record("executables", "NOSTART", 0, "no bundle that starts here and no cargo to make one")
        return 1
    # On the GPU machine only (a rehearsal's machine may be running others').
    left = [] if s.rehearsal else stop_leftovers(bundle.exe_root)
    if left:
        r.header.append("stopped %d process(es) an earlier run left (pids %s)"
                        % (len(left), " ".join(map(str, left))))
    r.header.append("bundle: %s (here glibc %s)" % (bundle.describe(), glibc or "?"))
    if baseline:
        r.header.append("baseline: %s" % baseline.describe())
    results = {}
    save = lambda: r.write("results.json", json.dumps(results, indent=1) + "\n")
    r.add_section("the GPU model against the CPU reference (golden fixtures)",
                  lambda: summary_mod.golden_lines(open(r.path("golden.log"), errors="replace").read()))
    r.add_section("step times, ms p50 (gpu-bench, full context, random weights)",
                  lambda: profile.profile_lines(results) + profile.torch_lines(results), most=14)
    r.add_section("serving from the GPU (moshid-loadgen, real-time callers)",
                  lambda: serve.serve_lines(results), most=16)
    env = checks.test_env(bundle, r.repo, s.rehearsal)
    for phase in s.phases:
        r.start_phase(phase, s.boxes[phase])
        if phase == "device":
            checks.device_phase(r, bundle, env, s.rehearsal)
        elif phase == "golden":
            checks.golden_phase(r, bundle, env)
        elif phase == "profile":
            builds = [("current", bundle)] + ([("baseline", baseline)] if baseline else [])
            profile.profile_phase(r, builds, s, results, save)
        elif phase == "torch":
            profile.torch_phase(r, s, results, save)
        elif phase == "serve":
            serve.serve_phase(r, bundle, s, results, save)
        elif phase == "compile":
            checks.compile_phase(r, bundle, cuda, env)
    r.phase = "done"
    bad = [x for x in r.results if x[2] not in ("PASS", "SKIPPED")]
    return 1 if bad else 0


def main(argv):
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: scripts/gpu-check OUT_DIR", file=sys.stderr)
        return 2
    try:
        s = Settings(os.environ)
    except ValueError as e:
        print("gpu-check: %s" % e, file=sys.stderr)
        return 2
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = os.path.abspath(argv[0])
    os.makedirs(out, exist_ok=True)
    if os.listdir(out):
        print("gpu-check: %s is not empty: its files will be replaced" % out, file=sys.stderr)
    scratch = tempfile.mkdtemp(prefix="moshid-gpu-check.",
                               dir=os.environ.get("TMPDIR") or None)
    os.makedirs(os.path.join(scratch, "tmp"))
    # The tests' kernel cache and any other temporary file go to the scratch folder.
    os.environ["TMPDIR"] = os.path.join(scratch, "tmp")
    r = Runner(out, s.budget, repo, scratch)
    r.limit_scale = s.limit_scale
    signal.signal(signal.SIGTERM, _stop)
    rc = 1
    try:
        rc = run_phases(r, s)
    except (Stopped, KeyboardInterrupt) as e:
        r.record("stopped", "STOPPED", 0, str(e) or "interrupted")
    finally:
        r.write_summary()
        r.pack()
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print(r.summary_text(), end="")
    return rc
