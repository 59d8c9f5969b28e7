"""The runbook's clock, its steps and its output folder.

A run has one deadline (TIME_BUDGET seconds after its start). Each phase
has a box: it ends at most that many seconds after it starts, and never
after the deadline. Each step (a child process) gets its own limit,
clipped to what is left of its phase; with under `MIN_STEP_S` left it is
recorded as NO-TIME and not started. A step runs in its own process group,
which is killed whole at the limit (SIGTERM, then SIGKILL after 5 s). Its
output goes to a log in OUT_DIR (at most `STEP_OUTPUT_CAP` bytes per
step), its last lines to stdout, its verdict to the results; then the
summary is rewritten.

Invariants: OUT_DIR holds only the names in `OUT_FILES` (the device
machine sends back at most 8 files); every one of them is written beside
itself (`NAME.part`) and renamed into place, so a run cut short — by its
budget, a signal or the end of the lease — keeps whole files of every
phase before the cut. Logs are appended to, everything else replaced.
Nothing is written outside OUT_DIR but the scratch folder, which the
caller removes.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time

from . import summary

# Every file OUT_DIR may hold.
OUT_FILES = (
    "summary.txt",
    "env.txt",
    "tests.log",
    "golden.log",
    "bench.log",
    "results.json",
    "serve.tar.gz",
    "logs.tar.gz",
)
LOG_FILES = ("tests.log", "golden.log", "bench.log")
# A step's output beyond this many bytes is dropped (a runaway test must
# not fill OUT_DIR).
STEP_OUTPUT_CAP = 2_000_000
# A step with less time than this left is not started.
MIN_STEP_S = 5
# Lines of a step's output echoed to stdout.
ECHO_LINES = 15

_ERROR_LINE = re.compile(
    r"CUDA_ERROR|debug_sync|^error|^Error|^gpu-bench: |^check-kernels: |"
    r"NOT LOADED|cannot open|TIMEOUT|^Traceback|^\w*Error: "
)


class Outcome:
    """What one step did: its exit status, verdict and (capped) output."""

    def __init__(self, rc, verdict, output, secs):
        self.rc = rc
        self.verdict = verdict
        self.output = output
        self.secs = secs

    @property
    def ok(self):
        return self.verdict == "PASS"


def failure_lines(output):
    """The lines that say why a step failed: a panic as one line (location
    and message), errors the tools print, the names of failed tests; at
    most 4, each at most 240 characters, each once."""
    lines = output.splitlines()
    found, failed = [], []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "panicked at" in line:
            loc = line.split("panicked at ", 1)[1].rstrip(":")
            msg = lines[i + 1] if i + 1 < len(lines) else ""
            found.append("panic at %s: %s" % (loc, msg))
            i += 2
            continue
        m = re.match(r"^test (\S+) \.\.\. FAILED$", line)
        if m:
            failed.append(m.group(1))
        elif _ERROR_LINE.search(line):
            found.append(line)
        i += 1
    if failed:
        found.append("failed: " + " ".join(failed))
    out = []
    for f in found:
        f = f[:240]
        if f not in out:
            out.append(f)
    return out[:4]


class Runner:
    """The clock, the results and the output folder of one run."""

    def __init__(self, out_dir, budget_s, repo, scratch, clock=time.monotonic):
        self.out = out_dir
        self.repo = repo
        self.scratch = scratch
        self.raw = os.path.join(scratch, "raw")
        os.makedirs(self.raw, exist_ok=True)
        self.clock = clock
        self.t0 = clock()
        self.budget_s = budget_s
        self.deadline = self.t0 + budget_s
        self.phase = "setup"
        self.phase_end = self.deadline
        self.header = []
        self.results = []
        self.failures = []
        # (title, function returning lines, most lines): summary sections.
        self.sections = []
        self.min_step_s = MIN_STEP_S
        # Every step's own limit is multiplied by this (a rehearsal's
        # emulator is slow); the phase still bounds it.
        self.limit_scale = 1
        for name in LOG_FILES:
            self.write(name, "")
        for name in OUT_FILES:
            if name not in LOG_FILES and name != "summary.txt":
                self.remove(name)

    # ---- the clock

    def elapsed(self):
        """Seconds since the start, whole."""
        return int(self.clock() - self.t0)

    def left(self):
        """Seconds left in the current phase (0 when over)."""
        return max(0.0, min(self.phase_end, self.deadline) - self.clock())

    def restart_clock(self):
        """The budget counts again from now (after a build, which is not
        part of the runbook's time)."""
        self.t0 = self.clock()
        self.deadline = self.t0 + self.budget_s
        self.phase_end = self.deadline

    def start_phase(self, name, box_s):
        """Starts phase `name`, which ends at most `box_s` from now."""
        self.phase = name
        self.phase_end = min(self.clock() + box_s, self.deadline)
        print(
            "\n##### phase %s (until %ds of the run, %ds at most)"
            % (name, self.phase_end - self.t0, self.budget_s),
            flush=True,
        )

    # ---- the output folder

    def path(self, name):
        assert name in OUT_FILES, name
        return os.path.join(self.out, name)

    def write(self, name, data):
        """Replaces OUT_DIR/name whole with `data` (str or bytes)."""
        part = self.path(name) + ".part"
        mode = "wb" if isinstance(data, bytes) else "w"
        with open(part, mode) as f:
            f.write(data)
        os.replace(part, self.path(name))

    def append(self, name, text):
        """Appends to a log of OUT_DIR."""
        assert name in LOG_FILES, name
        with open(self.path(name), "a", errors="replace") as f:
            f.write(text)

    def remove(self, name):
        for p in (self.path(name), self.path(name) + ".part"):
            if os.path.exists(p):
                os.remove(p)

    def pack_folder(self, name, folder, arcname):
        """OUT_DIR/name: a gzipped tar of `folder` (written whole or not at all)."""
        tmp = os.path.join(self.scratch, name + ".tmp")
        with tarfile.open(tmp, "w:gz") as t:
            t.add(folder, arcname=arcname)
        part = self.path(name) + ".part"
        shutil.copyfile(tmp, part)
        os.replace(part, self.path(name))
        os.remove(tmp)

    def pack(self):
        """logs.tar.gz: the raw files so far."""
        try:
            self.pack_folder("logs.tar.gz", self.raw, "raw")
        except OSError as e:
            print("gpu-check: packing logs.tar.gz: %s" % e, flush=True)

    # ---- results and the summary

    def record(self, name, verdict, secs, note=""):
        """One step's verdict; rewrites the summary."""
        self.results.append((self.phase, name, verdict, int(secs), note))
        self.write_summary()

    def add_failure(self, name, verdict, lines):
        seen = {l for _, _, ls in self.failures for l in ls}
        self.failures.append((name, verdict, [l for l in lines if l not in seen] or
                              (["(as above)"] if lines else [])))

    def add_section(self, title, lines_fn, most=24):
        """A section of the summary: `lines_fn()` gives its lines."""
        self.sections.append((title, lines_fn, most))

    def summary_text(self):
        sections = []
        for title, fn, most in self.sections:
            try:
                lines = fn()
            except Exception as e:  # a summary must never stop the run
                lines = ["(this section failed: %r)" % e]
            sections.append((title, lines[:most]))
        return summary.compose(
            stamp=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            elapsed=self.elapsed(),
            budget=self.budget_s,
            phase=self.phase,
            header=self.header,
            results=self.results,
            sections=sections,
            failures=self.failures,
        )

    def write_summary(self):
        self.write("summary.txt", self.summary_text())

    # ---- steps

    def step(self, log, name, limit, argv, cwd=None, env=None, note=None):
        """Runs `argv` as a step (see the module doc); returns its Outcome,
        or None when there was no time to start it."""
        limit = min(limit * self.limit_scale, self.left())
        if limit < self.min_step_s:
            self.record(name, "NO-TIME", 0, "no time left in phase %s" % self.phase)
            return None
        cmd = " ".join(argv)
        head = "\n=== %s (limit %ds): %s\n" % (name, limit, cmd)
        self.append(log, head)
        print(head, end="", flush=True)
        t0 = self.clock()
        rc, killed, output = run_capped(argv, limit, cwd or self.repo, env, self.path(log))
        secs = self.clock() - t0
        print("\n".join(output.splitlines()[-ECHO_LINES:]), flush=True)
        if killed:
            verdict = "TIMEOUT"
        elif rc != 0:
            verdict = "FAIL(%d)" % rc
        else:
            verdict = "PASS"
        if verdict != "PASS":
            lines = failure_lines(output)
            self.add_failure(name, verdict, lines or ["(no error line; see %s)" % log])
        shown = note if note is not None else cmd
        shown = shown.replace(self.repo + "/", "").replace(self.scratch, "$SCRATCH")
        self.record(name, verdict, secs, shown[:120])
        return Outcome(rc, verdict, output, secs)


def run_capped(argv, limit, cwd, env, log_path):
    """Runs `argv` for at most `limit` seconds in its own process group,
    its output appended to `log_path` as it comes (capped). Returns
    (exit status, whether it was killed, the output kept)."""
    try:
        p = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
    except OSError as e:
        text = "gpu-check: cannot start %s: %s\n" % (argv[0], e)
        with open(log_path, "a") as log:
            log.write(text)
        return 127, False, text
    kept = []
    reader = threading.Thread(target=_drain, args=(p.stdout, log_path, kept), daemon=True)
    reader.start()
    killed = False
    try:
        p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        killed = True
        kill_group(p)
    except BaseException:
        # A signal stopping the run: the step's group goes with it.
        kill_group(p, grace_s=2)
        raise
    reader.join(timeout=10)
    return p.returncode, killed, "".join(kept)


def kill_group(p, grace_s=5):
    """Ends a child started with start_new_session and everything it started."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5)):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _drain(stream, log_path, kept):
    size = 0
    truncated = False
    with open(log_path, "a", errors="replace") as log:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            size += len(raw)
            if size > STEP_OUTPUT_CAP:
                if not truncated:
                    truncated = True
                    line = "[gpu-check: output truncated at 2 MB]\n"
                else:
                    continue
            kept.append(line)
            log.write(line)
            log.flush()
    stream.close()


def eprint(*args):
    print(*args, file=sys.stderr, flush=True)
