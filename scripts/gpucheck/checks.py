"""The correctness phases: the device and its kernels, the GPU model against
the CPU reference on every golden fixture, and the compile gate with this
machine's NVRTC and ptxas.

- device: open it (NVRTC compile, cubin or PTX per module, cuBLAS), the
  CUDA device's own tests (GEMMs against a host product, a graph replay),
  then the per-kernel tests — the very tests CI runs on the emulator — on
  the GPU, one process per kernel family (a sticky CUDA error sinks only
  its family), with debug-sync on so that a failure names its kernel, grid,
  block and arguments (tests.log);
- golden: agreement rates, errors and slot reuse of the GPU model against
  the CPU backend (the f32 model exact, compiled with --fmad=false), one
  process per test, debug-sync on (golden.log);
- compile: check-kernels for sm_80, sm_90 and the device's own architecture
  (tests.log; its PTX and report in logs.tar.gz).

The test executables run as cargo runs them: from the kernels crate's
folder, the fixtures named through MOSHID_GOLDEN (their compiled-in path is
the packing machine's). In a rehearsal they run on the emulator
(MOSHID_TEST_DEVICE=emu) and the device's own tests are skipped.
"""

import os
import re
import subprocess


def test_env(bundle, repo, rehearsal):
    """The environment of the test executables."""
    env = dict(os.environ)
    env["MOSHID_GOLDEN"] = ":".join(bundle.golden_dirs())
    env["CARGO_MANIFEST_DIR"] = os.path.join(repo, "kernels")
    env["RUST_BACKTRACE"] = "1"
    if rehearsal:
        env["MOSHID_TEST_DEVICE"] = "emu"
    else:
        env["MOSHID_TEST_DEVICE"] = "cuda"
        env["MOSHID_CUDA_DEBUG_SYNC"] = "1"
    return env


def _list(argv, env, cwd):
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                           cwd=cwd, timeout=30)
        return p.stdout.decode(errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return ""


def kernel_families(listing):
    """The test families of `emu_kernels --list`, in order (the emulator's own
    scheduler and error tests excepted)."""
    fams = []
    for line in listing.splitlines():
        m = re.match(r"^([a-z_0-9]+)::.*: test$", line)
        if m and m.group(1) not in fams and m.group(1) not in ("scheduler", "errors"):
            fams.append(m.group(1))
    return fams


def device_phase(r, bundle, env, rehearsal):
    cwd = os.path.join(r.repo, "kernels")
    lib = bundle.test("lib")
    if rehearsal:
        r.record("device-open", "SKIPPED", 0, "rehearsal: no CUDA device")
    else:
        r.step("tests.log", "device-open", 60, [lib, "--ignored", "--exact",
               "device::cuda::tests::the_device_opens_and_reports", "--nocapture"], cwd=cwd, env=env)
        r.step("tests.log", "cuda-device-tests", 40, [lib, "--ignored", "--skip",
               "device::cuda::tests::the_device_opens_and_reports"], cwd=cwd, env=env)
    emu = bundle.test("emu_kernels")
    fams = kernel_families(_list([emu, "--list"], env, cwd))
    if not fams:
        r.record("kernels", "FAIL", 0, "the per-kernel test executable lists no family")
    for f in fams:
        r.step("tests.log", "kernels-" + f, 30, [emu, f + "::", "--test-threads", "4"],
               cwd=cwd, env=env)
    r.pack()


def golden_phase(r, bundle, env):
    cwd = os.path.join(r.repo, "kernels")
    exe = bundle.test("gpu_golden")
    names = [l[: -len(": test")] for l in _list([exe, "--list", "--ignored"], env, cwd).splitlines()
             if l.endswith(": test")]
    if not names:
        r.record("golden", "FAIL", 0, "the golden test executable lists no test")
    for t in names:
        short = t[len("cuda_"):] if t.startswith("cuda_") else t
        r.step("golden.log", "golden-" + short, 75, [exe, "--ignored", "--exact", t, "--nocapture"],
               cwd=cwd, env=env)
    r.pack()


def compile_phase(r, bundle, cuda, env):
    archs = ["--arch", "sm_80", "--arch", "sm_90"]
    if cuda.cap and cuda.cap not in ("80", "90"):
        archs += ["--arch", "sm_" + cuda.cap]
    argv = [bundle.bin("check-kernels")] + archs
    if cuda.include:
        argv += ["--include", cuda.include]
    argv += ["--ptxas", cuda.ptxas, "--out", os.path.join(r.raw, "check-kernels")]
    r.step("tests.log", "check-kernels", 45, argv, cwd=os.path.join(r.repo, "kernels"), env=env)
    r.pack()
