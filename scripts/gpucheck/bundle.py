"""The executables the runbook runs: `.gpu-bundle/` (made by
scripts/gpu-pack on a machine with cargo and carried to the GPU machine,
which has no Rust), or, where cargo is here and there is no bundle, one
made now by scripts/gpu-pack (its build is not counted in the budget).

Layout (see scripts/gpu-pack): bin/ (check-kernels, gpu-bench, moshid,
moshid-loadgen), tests/ (the kernels crate's test executables), golden/
(the fixtures), MANIFEST; and baseline/ (bin/gpu-bench and tests/ of a
previous commit, with its own MANIFEST) when gpu-pack was given one.
"""

import os
import shutil
import signal
import subprocess


class Bundle:
    """One bundle folder (the current build's, or its baseline/)."""

    def __init__(self, root):
        self.root = root
        self.manifest = read_manifest(os.path.join(root, "MANIFEST"))

    @property
    def present(self):
        return bool(self.manifest)

    def bin(self, name):
        return os.path.join(self.root, "bin", name)

    def test(self, name):
        return os.path.join(self.root, "tests", name)

    def has_bin(self, name):
        return os.access(self.bin(name), os.X_OK)

    def golden_dirs(self):
        g = os.path.join(self.root, "golden")
        if not os.path.isdir(g):
            return []
        return sorted(os.path.join(g, d) for d in os.listdir(g)
                      if os.path.isdir(os.path.join(g, d)))

    def describe(self):
        m = self.manifest
        return "%s, built %s, glibc_needed %s" % (m.get("commit", "?"), m.get("built", "?"),
                                                  m.get("glibc_needed", "?"))

    def starts(self):
        """(True, "") when the bundle's executables start on this machine,
        else (False, why)."""
        try:
            p = subprocess.run([self.bin("check-kernels"), "--help"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=20)
            out = p.stdout.decode(errors="replace")
        except (OSError, subprocess.TimeoutExpired) as e:
            out = str(e)
        if "usage: check-kernels" in out:
            return True, ""
        return False, " ".join(out.splitlines()[:3])


def read_manifest(path):
    """MANIFEST's `key: value` lines (the file list excepted)."""
    m = {}
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(" ") or ": " not in line:
                    continue
                k, v = line.rstrip("\n").split(": ", 1)
                m.setdefault(k, v)
    except OSError:
        return {}
    return m


def cargo_available():
    return shutil.which("cargo") is not None


def stop_leftovers(root):
    """Kills what an earlier run cut short left running from this bundle (a
    daemon or a bench holding GPU memory: they run in their own sessions,
    which the lease's end of a command does not reach); returns their pids."""
    root = os.path.realpath(root) + os.sep
    killed = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            exe = os.path.realpath(os.readlink("/proc/%s/exe" % pid))
        except OSError:
            continue
        if exe.startswith(root):
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
            except OSError:
                pass
    return killed
