"""The library discovery on a fake machine: versions from file names and
wheels' dist-info, the choice against the driver's CUDA, the links cudarc
loads, the headers and ptxas found beside the chosen NVRTC."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from gpucheck import cuda_env  # noqa: E402


def touch(path, target=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if target:
        os.symlink(target, path)
    else:
        open(path, "w").close()


class CudaEnvTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp()
        self.scratch = tempfile.mkdtemp()
        # A toolkit with NVRTC 13.0.88 and cuBLAS 13.1.0.3, and a pip wheel
        # (site-packages/nvidia/cu13) with NVRTC 13.2.
        tk = os.path.join(self.root, "cuda-13.0")
        touch(os.path.join(tk, "lib64", "libnvrtc.so.13.0.88"))
        touch(os.path.join(tk, "lib64", "libnvrtc.so.13"), "libnvrtc.so.13.0.88")
        touch(os.path.join(tk, "lib64", "libnvrtc-builtins.so.13.0"))
        touch(os.path.join(tk, "lib64", "libcublas.so.13.1.0.3"))
        touch(os.path.join(tk, "lib64", "libcublas.so.13"), "libcublas.so.13.1.0.3")
        touch(os.path.join(tk, "lib64", "libcublasLt.so.13"))
        touch(os.path.join(tk, "include", "cuda_bf16.h"))
        touch(os.path.join(tk, "bin", "ptxas"))
        os.chmod(os.path.join(tk, "bin", "ptxas"), 0o755)
        sp = os.path.join(self.root, "site-packages")
        touch(os.path.join(sp, "nvidia", "cu13", "lib", "libnvrtc.so.13"))
        os.makedirs(os.path.join(sp, "nvidia_cuda_nvrtc-13.2.51.dist-info"))
        self.tk, self.sp = tk, sp

    def env(self, driver):
        e = cuda_env.CudaEnv(self.scratch)
        e.driver_cuda = driver
        e.libdirs = [os.path.join(self.sp, "nvidia", "cu13", "lib"), os.path.join(self.tk, "lib64")]
        e.roots = [self.tk]
        return e

    def test_versions_from_names_and_dist_info(self):
        e = self.env("13.0")
        self.assertEqual(e.lib_version(os.path.join(self.tk, "lib64", "libnvrtc.so.13"), "nvrtc"),
                         "13.0.88")
        wheel = os.path.join(self.sp, "nvidia", "cu13", "lib", "libnvrtc.so.13")
        self.assertEqual(e.lib_version(wheel, "nvrtc"), "13.2.51")

    def test_the_first_not_newer_than_the_driver_is_chosen(self):
        e = self.env("13.0")
        chosen = e.pick("nvrtc")
        self.assertEqual(chosen, os.path.join(self.tk, "lib64", "libnvrtc.so.13"))
        self.assertGreaterEqual(len(e.candidates["nvrtc"]), 2)

    def test_a_newer_nvrtc_is_used_with_a_note_when_nothing_else_is_there(self):
        e = self.env("12.4")
        e.pick("nvrtc")
        self.assertIn("none is known to be at most the driver's CUDA 12.4", e.candidates["nvrtc"][-1])

    def test_links_headers_and_ptxas_beside_the_chosen_nvrtc(self):
        e = self.env("13.0")
        e.chosen["nvrtc"] = e.pick("nvrtc")
        e.chosen["cublas"] = e.pick("cublas")
        e.link_libraries()
        names = sorted(os.listdir(e.libdir))
        for want in ("libnvrtc.so", "libnvrtc-builtins.so.13.0", "libcublas.so", "libcublasLt.so",
                     "libcublas.so.13"):
            self.assertIn(want, names)
        e.include = ""
        e.find_headers()
        self.assertEqual(e.include, os.path.realpath(os.path.join(self.tk, "include")))
        e.ptxas = ""
        e.find_ptxas()
        self.assertEqual(e.ptxas, os.path.join(self.tk, "bin", "ptxas"))


if __name__ == "__main__":
    unittest.main()
