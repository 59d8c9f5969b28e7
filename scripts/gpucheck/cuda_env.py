"""What the GPU machine offers: the GPU (nvidia-smi), the CUDA libraries
under the names cudarc loads, CUDA's headers for NVRTC and ptxas — and
env.txt, which says what was found and chosen.

cudarc dlopens `libcuda.so`, `libnvrtc.so`, `libcublas.so` (never `.so.13`):
a folder in the scratch space gets links of those names to the files
chosen, first on LD_LIBRARY_PATH. Libraries are looked for in the CUDA
toolkits (CUDA_HOME, CUDA_PATH, /usr/local/cuda*, nvcc's), in the pip
`nvidia-*` wheels of every site-packages, in the repository's
`.cache/cuda-wheels*` and through `ldconfig -p`; of several, the first not
newer than the driver's CUDA is chosen (a newer NVRTC's PTX may not load).

In a rehearsal (no GPU) only the pip wheels that `scripts/check-kernels`
installs are linked, for the compile gate.
"""

import glob
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(argv, timeout=20):
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        return p.stdout.decode(errors="replace")
    except (OSError, subprocess.TimeoutExpired) as e:
        return "(%s: %s)" % (argv[0], e)


def _mm(v):
    m = re.match(r"^(\d+)\.(\d+)", v or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


class CudaEnv:
    """The GPU, the libraries chosen, and the environment the steps get."""

    def __init__(self, scratch):
        self.gpu = ""
        self.cap = ""
        self.driver_version = ""
        self.driver_cuda = ""
        self.roots = []
        self.nvidia_dirs = []
        self.libdirs = []
        self.candidates = {"nvrtc": [], "cublas": []}
        self.chosen = {}
        self.cuda_lib = ""
        self.cuda_in_ldconfig = False
        self.nvcc = ""
        self.include = os.environ.get("MOSHID_CUDA_INCLUDE", "")
        self.ptxas = os.environ.get("PTXAS", "")
        self.libdir = os.path.join(scratch, "libs")
        os.makedirs(self.libdir, exist_ok=True)
        self.ld_path = []
        self.probe = "  (rehearsal: no probe)"

    # ---- the GPU

    def read_gpu(self, raw):
        """nvidia-smi's view; its full output goes to raw/."""
        smi = _run(["nvidia-smi"])
        with open(os.path.join(raw, "nvidia-smi.txt"), "w") as f:
            f.write(smi)
        with open(os.path.join(raw, "nvidia-smi-q.txt"), "w") as f:
            f.write(_run(["nvidia-smi", "-q"]))
        q = _run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total,"
                  "memory.free,clocks.max.sm,power.limit", "--format=csv,noheader"])
        q = q.splitlines()[0] if q.strip() else ""
        cells = [c.strip() for c in q.split(",")]
        if len(cells) >= 3:
            self.gpu, self.cap, self.driver_version = cells[0], cells[1].replace(".", ""), cells[2]
        m = re.search(r"CUDA Version: *([0-9][0-9.]*)", smi)
        self.driver_cuda = m.group(1) if m else ""
        return q

    # ---- where to look

    def _add(self, lst, d):
        if d and os.path.isdir(d):
            r = os.path.realpath(d)
            if r not in lst:
                lst.append(r)

    def find_roots(self, repo):
        for d in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            self._add(self.roots, d)
        for d in sorted(glob.glob("/usr/local/cuda-13*")) + sorted(glob.glob("/usr/local/cuda-12*")):
            self._add(self.roots, d)
        self.nvcc = shutil.which("nvcc") or ""
        if not self.nvcc:
            for r in self.roots:
                if os.access(os.path.join(r, "bin", "nvcc"), os.X_OK):
                    self.nvcc = os.path.join(r, "bin", "nvcc")
                    break
        if self.nvcc:
            self._add(self.roots, os.path.join(os.path.dirname(os.path.realpath(self.nvcc)), ".."))
        # `nvidia` is a namespace package in the CUDA 13 wheels (no __file__):
        # asked of the machine's python3 (the one with PyTorch), not of ours.
        code = ("import os, site, sys\npaths = []\ntry:\n import nvidia\n"
                " paths += list(getattr(nvidia, '__path__', []))\nexcept Exception:\n pass\n"
                "sp = []\ntry:\n sp += site.getsitepackages()\nexcept Exception:\n pass\n"
                "paths += [os.path.join(p, 'nvidia') for p in sp + sys.path if p]\n"
                "print('\\n'.join(p for p in paths if os.path.isdir(p)))\n")
        for d in _run(["python3", "-c", code]).splitlines():
            self._add(self.nvidia_dirs, d.strip())
        for d in (".cache/cuda-wheels-13/nvidia", ".cache/cuda-wheels/nvidia"):
            self._add(self.nvidia_dirs, os.path.join(repo, d))
        for r in self.roots:
            for d in ("lib64", "lib", "targets/x86_64-linux/lib"):
                if os.path.isdir(os.path.join(r, d)):
                    self.libdirs.append(os.path.join(r, d))
        for n in self.nvidia_dirs:
            for d in [os.path.join(n, "cu13/lib"), os.path.join(n, "cu12/lib")] + sorted(
                    glob.glob(os.path.join(n, "*/lib"))):
                if os.path.isdir(d) and d not in self.libdirs:
                    self.libdirs.append(d)

    # ---- choosing libraries

    def lib_version(self, path, name):
        """"13.0.88" from the file's real name or from the wheel's dist-info
        beside site-packages/nvidia; else the soname's major."""
        base = os.path.basename(os.path.realpath(path))
        v = base[len("lib%s.so." % name):] if base.startswith("lib%s.so." % name) else ""
        if _mm(v):
            return v
        major = path.rsplit(".so.", 1)[-1]
        if "/nvidia/" in path:
            sp = path.split("/nvidia/")[0]
            pkg = {"nvrtc": "nvidia_cuda_nvrtc", "cublas": "nvidia_cublas"}.get(name, "nvidia_" + name)
            for di in sorted(glob.glob("%s/%s-[0-9]*.dist-info" % (sp, pkg)) +
                             glob.glob("%s/%s_cu1[0-9]-[0-9]*.dist-info" % (sp, pkg))):
                ver = os.path.basename(di)[: -len(".dist-info")].rsplit("-", 1)[-1]
                if ver.startswith(major + "."):
                    return ver
        return major if major.isdigit() else ""

    def not_newer(self, v):
        """Whether version `v` is at most the driver's CUDA (unknown driver: yes)."""
        if not self.driver_cuda:
            return True
        a, b = _mm(v), _mm(self.driver_cuda)
        return a is not None and b is not None and a <= b

    def pick(self, name):
        files = []
        for d in self.libdirs:
            for so in ("13", "12"):
                f = os.path.join(d, "lib%s.so.%s" % (name, so))
                if os.path.exists(f):
                    files.append(f)
        pat = re.compile(r"\slib%s\.so\.1[23] \(.*x86-64.*=> (\S+)" % re.escape(name))
        for line in ldconfig_p().splitlines():
            m = pat.search(line)
            if m and os.path.exists(m.group(1)):
                files.append(m.group(1))
        seen, first, best = set(), None, None
        for f in files:
            real = os.path.realpath(f)
            if real in seen:
                continue
            seen.add(real)
            v = self.lib_version(f, name)
            self.candidates[name].append("    %s (%s)" % (f, v or "version unknown"))
            first = first or (f, v)
            if best is None and self.not_newer(v):
                best = f
        if name == "nvrtc" and best is None and first:
            self.candidates[name].append(
                "    note: none is known to be at most the driver's CUDA %s; using %s (%s): the "
                "device loads its cubins; its PTX (the fallback) may not load"
                % (self.driver_cuda or "?", first[0], first[1] or "version unknown"))
        return best or (first[0] if first else "")

    def find_libcuda(self):
        self.cuda_lib = os.environ.get("LIBCUDA", "")
        if self.cuda_lib:
            return
        for line in ldconfig_p().splitlines():
            m = re.search(r"\slibcuda\.so\.1 \(.*x86-64.*=> (\S+)", line)
            if m and "/stubs/" not in m.group(1) and "/compat/" not in m.group(1):
                self.cuda_lib, self.cuda_in_ldconfig = m.group(1), True
                return
        for d in ("/usr/lib/x86_64-linux-gnu", "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib",
                  "/usr/lib64", "/usr/lib/wsl/lib"):
            if os.path.exists(os.path.join(d, "libcuda.so.1")):
                self.cuda_lib = os.path.join(d, "libcuda.so.1")
                return

    def _link(self, target, name):
        p = os.path.join(self.libdir, name)
        if os.path.lexists(p):
            os.remove(p)
        os.symlink(target, p)

    def link_libraries(self):
        """The names cudarc looks for, first on LD_LIBRARY_PATH."""
        self.ld_path = [self.libdir]
        if self.cuda_lib:
            self._link(self.cuda_lib, "libcuda.so")
            if not self.cuda_in_ldconfig:
                self.ld_path.append(os.path.dirname(self.cuda_lib))
        nvrtc = self.chosen.get("nvrtc")
        if nvrtc:
            d = os.path.dirname(nvrtc)
            self._link(nvrtc, "libnvrtc.so")
            self._link(nvrtc, os.path.basename(nvrtc))
            # libnvrtc dlopens its builtins (libnvrtc-builtins.so.13.0) by name.
            for f in glob.glob(os.path.join(d, "libnvrtc-builtins.so*")):
                self._link(f, os.path.basename(f))
            self.ld_path.append(d)
        cublas = self.chosen.get("cublas")
        if cublas:
            d, so = os.path.dirname(cublas), cublas.rsplit(".so.", 1)[-1]
            self._link(cublas, "libcublas.so")
            self._link(cublas, "libcublas.so." + so)
            lt = os.path.join(d, "libcublasLt.so." + so)
            if os.path.exists(lt):
                self._link(lt, "libcublasLt.so")
                self._link(lt, "libcublasLt.so." + so)
            else:
                print("gpu-check: no libcublasLt.so.%s next to %s: cuBLAS will not load"
                      % (so, cublas), file=sys.stderr)
            self.ld_path.append(d)

    # ---- headers and ptxas

    def find_headers(self):
        if self.include:
            return
        cands = []
        nvrtc = self.chosen.get("nvrtc", "")
        d = os.path.dirname(nvrtc)
        if re.search(r"/nvidia/cu1[0-9]/lib$", d):
            cands.append(d[: -len("/lib")] + "/include")
        elif d.endswith("/nvidia/cuda_nvrtc/lib"):
            cands.append(d[: -len("/cuda_nvrtc/lib")] + "/cuda_runtime/include")
        elif "/targets/" in d:
            cands += [d[: -len("/lib")] + "/include", d.split("/targets/")[0] + "/include"]
        elif d:
            root = re.sub(r"/lib(64)?$", "", d)
            cands += [root + "/include", root + "/targets/x86_64-linux/include"]
        for r in self.roots:
            cands += [r + "/include", r + "/targets/x86_64-linux/include"]
        for n in self.nvidia_dirs:
            cands += [n + "/cu13/include", n + "/cu12/include", n + "/cuda_runtime/include"]
        for c in cands:
            if os.path.isfile(os.path.join(c, "cuda_bf16.h")):
                self.include = os.path.realpath(c)
                return

    def find_ptxas(self):
        if self.ptxas:
            return
        cands = []
        d = os.path.dirname(self.chosen.get("nvrtc", ""))
        if re.search(r"/nvidia/cu1[0-9]/lib$", d):
            cands.append(d[: -len("/lib")] + "/bin/ptxas")
        elif d.endswith("/nvidia/cuda_nvrtc/lib"):
            cands.append(d[: -len("/cuda_nvrtc/lib")] + "/cuda_nvcc/bin/ptxas")
        elif "/targets/" in d:
            cands.append(d.split("/targets/")[0] + "/bin/ptxas")
        elif d:
            cands.append(re.sub(r"/lib(64)?$", "", d) + "/bin/ptxas")
        if self.nvcc:
            cands.append(os.path.join(os.path.dirname(os.path.realpath(self.nvcc)), "ptxas"))
        cands.append(shutil.which("ptxas") or "")
        cands += [r + "/bin/ptxas" for r in self.roots]
        for n in self.nvidia_dirs:
            cands += [n + "/cu13/bin/ptxas", n + "/cuda_nvcc/bin/ptxas"]
        for c in cands:
            if c and os.access(c, os.X_OK):
                self.ptxas = c
                return

    # ---- the whole discovery

    def discover(self, repo):
        """Everything above, on a GPU machine; sets os.environ for the steps."""
        self.find_roots(repo)
        self.chosen["nvrtc"] = self.pick("nvrtc")
        self.chosen["cublas"] = self.pick("cublas")
        self.find_libcuda()
        self.link_libraries()
        self.find_headers()
        self.find_ptxas()
        self.export()

    def rehearse(self, repo):
        """A rehearsal compiles with the wheels scripts/check-kernels installs, when there."""
        w = os.path.join(repo, ".cache/cuda-wheels/nvidia")
        nvrtc = os.path.join(w, "cuda_nvrtc/lib/libnvrtc.so.12")
        if os.path.exists(nvrtc):
            self._link(nvrtc, "libnvrtc.so")
            self.ld_path = [self.libdir, os.path.dirname(nvrtc)]
            self.include = self.include or os.path.join(w, "cuda_runtime/include")
            self.ptxas = self.ptxas or os.path.join(w, "cuda_nvcc/bin/ptxas")
        self.export()

    def export(self):
        if self.ld_path:
            old = os.environ.get("LD_LIBRARY_PATH", "")
            seen = []
            for p in self.ld_path:
                if p not in seen:
                    seen.append(p)
            os.environ["LD_LIBRARY_PATH"] = ":".join(seen) + (":" + old if old else "")
        if self.include:
            os.environ["MOSHID_CUDA_INCLUDE"] = self.include
        self.ptxas = self.ptxas or "ptxas"

    def run_probe(self):
        incs = []
        if self.include:
            incs = [self.include]
            if os.path.isdir(os.path.join(self.include, "cccl")):
                incs.append(os.path.join(self.include, "cccl"))
        self.probe = _run([sys.executable, os.path.join(HERE, "probe.py"),
                           "sm_" + (self.cap or "90")] + incs, timeout=40).rstrip("\n")

    def probe_headline(self):
        keep = [l.strip()[:120] for l in self.probe.splitlines()
                if re.search(r"libcuda.so:|NVRTC [0-9]|cuBLAS [0-9]|NOT LOADED|FAILED", l)]
        return ";".join(keep)

    def text(self, mode, manifest, glibc):
        """env.txt."""
        links = []
        for f in sorted(os.listdir(self.libdir)):
            p = os.path.join(self.libdir, f)
            if os.path.islink(p):
                links.append("    %s -> %s" % (f, os.readlink(p)))
        ptxas_v = _run([self.ptxas, "--version"]).strip().splitlines()
        lines = [
            "gpu: %s (sm_%s); driver %s, CUDA %s" % (self.gpu, self.cap or "?",
                                                    self.driver_version, self.driver_cuda or "unknown"),
            "glibc: %s; kernel: %s; CPUs: %s; mode: %s" % (
                glibc or "unknown", " ".join(os.uname()[2:4]), os.cpu_count(), mode),
        ]
        if manifest:
            lines.append("bundle: %s; built %s; %s; glibc_needed %s" % (
                manifest.get("commit"), manifest.get("built"), manifest.get("rustc"),
                manifest.get("glibc_needed")))
        lines += [
            "CUDA toolkits: %s; nvcc: %s" % (" ".join(self.roots) or "none", self.nvcc or "none"),
            "python nvidia packages: %s" % (" ".join(self.nvidia_dirs) or "none"),
            "libnvrtc candidates:", "\n".join(self.candidates["nvrtc"]) or "    none",
            "libcublas candidates:", "\n".join(self.candidates["cublas"]) or "    none",
            "libcuda: %s%s" % (self.cuda_lib or "NOT FOUND", " (ldconfig)" if self.cuda_in_ldconfig else ""),
            "linked (first on LD_LIBRARY_PATH):", "\n".join(links),
            "LD_LIBRARY_PATH: %s" % os.environ.get("LD_LIBRARY_PATH", ""),
            "MOSHID_CUDA_INCLUDE: %s" % (self.include or "<none found: the daemon looks in its default places>"),
            "ptxas: %s (%s)" % (self.ptxas, ptxas_v[-1] if ptxas_v else ""),
            "probe (the libraries as cudarc loads them):", self.probe,
        ]
        return "\n".join(lines) + "\n"


def ldconfig_p():
    for exe in ("ldconfig", "/sbin/ldconfig"):
        out = _run([exe, "-p"])
        if not out.startswith("("):
            return out
    return ""


def glibc_version():
    out = _run(["getconf", "GNU_LIBC_VERSION"]).split()
    return out[1] if len(out) == 2 else ""
