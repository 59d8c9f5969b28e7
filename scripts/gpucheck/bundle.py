"""The executables the runbook runs: `.gpu-bundle/` (made by
scripts/gpu-pack on a machine with cargo and carried to the GPU machine,
which has no Rust), or, where cargo is here and there is no bundle, one
made now by scripts/gpu-pack (its build is not counted in the budget).

Layout (see scripts/gpu-pack): golden/ (the fixtures), MANIFEST,
baseline/MANIFEST when gpu-pack was given a previous commit, and
executables.tar.gz holding bin/ (check-kernels, gpu-bench, moshid,
moshid-loadgen), tests/ (the kernels crate's test executables) and the
baseline's bin/gpu-bench and tests/ — unpacked here into a folder of the
machine's temporary space (`unpack_dir`). A bundle of loose executables
(an older gpu-pack's) is run where it is.
"""

import hashlib
import os
import shutil
import signal
import subprocess
import tarfile


ARCHIVE = "executables.tar.gz"


class Bundle:
    """One bundle folder (the current build's, or its baseline/): its
    MANIFEST and golden fixtures in `root`, its executables in `exe_root`
    (where they were unpacked)."""

    def __init__(self, root, exe_root=None):
        self.root = root
        self.exe_root = exe_root or root
        self.manifest = read_manifest(os.path.join(root, "MANIFEST"))

    @property
    def present(self):
        return bool(self.manifest)

    def bin(self, name):
        return os.path.join(self.exe_root, "bin", name)

    def test(self, name):
        return os.path.join(self.exe_root, "tests", name)

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


def unpack_dir(root, tmp):
    """Where the executables of the bundle at `root` are unpacked: a folder
    of `tmp` named after the bundle's path (outside the carried tree, and
    the same for every run, so that an earlier run's leftovers are found)."""
    key = hashlib.sha1(os.path.realpath(root).encode()).hexdigest()[:12]
    return os.path.join(tmp, "moshid-gpu-bundle-%d-%s" % (os.getuid(), key))


def open_bundles(root, exe_dir):
    """(this build's Bundle, the baseline's or None), the executables
    unpacked from executables.tar.gz into `exe_dir` first (again when the
    archive is newer than what was unpacked there)."""
    archive = os.path.join(root, ARCHIVE)
    exe_root = root
    if os.path.isfile(archive):
        exe_root = exe_dir
        stamp = os.path.join(exe_root, ".from-archive")
        if not (os.path.exists(stamp) and os.path.getmtime(stamp) >= os.path.getmtime(archive)):
            shutil.rmtree(exe_root, ignore_errors=True)
            os.makedirs(exe_root)
            with tarfile.open(archive) as t:
                t.extractall(exe_root)
            open(stamp, "w").close()
    current = Bundle(root, exe_root)
    base = Bundle(os.path.join(root, "baseline"), os.path.join(exe_root, "baseline"))
    return current, (base if base.present else None)


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
