"""A probe, run as a child process (`python3 probe.py ARCH [INCLUDE_DIR…]`):
loads the CUDA libraries by the names cudarc uses (libcuda.so, libnvrtc.so,
libcublas.so, found through LD_LIBRARY_PATH as the runbook set it up),
prints their versions and the files mapped, and compiles CUDA's bf16 and
fp8 headers with NVRTC for ARCH.

A child process because a broken library can crash or hang whoever loads
it; the runbook gives it a time limit.
"""

import ctypes
import sys
from ctypes import byref, c_char_p, c_int, c_size_t, c_void_p


def load(name):
    try:
        return ctypes.CDLL(name)
    except OSError as e:
        print("  %s: NOT LOADED: %s" % (name, e))
        return None


def probe_driver():
    cuda = load("libcuda.so")
    if not cuda:
        return
    v = c_int()
    cuda.cuDriverGetVersion(byref(v))
    r = cuda.cuInit(0)
    n = c_int()
    if r == 0:
        cuda.cuDeviceGetCount(byref(n))
    print("  libcuda.so: driver CUDA %d.%d; cuInit -> %d; %d device(s)"
          % (v.value // 1000, v.value % 1000 // 10, r, n.value))


def compile_headers(nvrtc, arch, incs):
    src = (b"#include <cuda_bf16.h>\n#include <cuda_fp8.h>\n"
           b"extern \"C\" __global__ void k(__nv_bfloat16 *x) { x[0] = __float2bfloat16(1.0f); }\n")
    prog = c_void_p()
    nvrtc.nvrtcCreateProgram(byref(prog), src, b"probe.cu", 0, None, None)
    opts = [b"--std=c++17", ("--gpu-architecture=%s" % arch).encode()]
    opts += [("--include-path=%s" % i).encode() for i in incs]
    r = nvrtc.nvrtcCompileProgram(prog, len(opts), (c_char_p * len(opts))(*opts))
    size = c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, byref(size))
    log = ctypes.create_string_buffer(max(size.value, 1))
    nvrtc.nvrtcGetProgramLog(prog, log)
    cubin = c_size_t()
    if r == 0:
        nvrtc.nvrtcGetCUBINSize(prog, byref(cubin))
    nvrtc.nvrtcDestroyProgram(byref(prog))
    verdict = "ok (%d bytes of cubin)" % cubin.value if r == 0 else "FAILED (status %d)" % r
    print("  NVRTC compile of cuda_bf16.h + cuda_fp8.h for %s with %s: %s"
          % (arch, " ".join(incs), verdict))
    if r != 0:
        for line in log.value.decode(errors="replace").splitlines()[:12]:
            print("    " + line)


def probe_nvrtc(arch, incs):
    nvrtc = load("libnvrtc.so")
    if not nvrtc:
        return
    a, b = c_int(), c_int()
    nvrtc.nvrtcVersion(byref(a), byref(b))
    print("  libnvrtc.so: NVRTC %d.%d" % (a.value, b.value))
    if incs:
        compile_headers(nvrtc, arch, incs)


def probe_cublas():
    cublas = load("libcublas.so")
    if not cublas:
        return
    p = [c_int(), c_int(), c_int()]
    for i in range(3):
        cublas.cublasGetProperty(i, byref(p[i]))
    print("  libcublas.so: cuBLAS %d.%d.%d" % (p[0].value, p[1].value, p[2].value))


def mapped_files():
    names = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and any(k in line for k in ("libcuda", "libnvrtc", "libcublas")):
                names.add(parts[5].strip())
    print("  files mapped:" + "".join("\n    " + m for m in sorted(names)))


def main(argv):
    arch, incs = argv[0], argv[1:]
    probe_driver()
    probe_nvrtc(arch, incs)
    probe_cublas()
    mapped_files()


if __name__ == "__main__":
    main(sys.argv[1:])
