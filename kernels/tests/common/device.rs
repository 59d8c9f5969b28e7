//! The device a test runs on, chosen when it runs: the emulator (what CI
//! runs), or with `MOSHID_TEST_DEVICE=cuda` CUDA device 0, opened as every
//! GPU test opens it (`CudaOpenOptions::from_test_env`: the run's kernel
//! cache, and with `MOSHID_CUDA_DEBUG_SYNC=1` a sync after every launch and
//! GEMM, so that a failure names its kernel). `MOSHID_TEST_DEVICE=emu`
//! forces the emulator. The very same test code runs on either:
//! `scripts/gpu-check` runs the per-kernel tests on the GPU, one process per
//! kernel family, and the golden tests on it.

#![allow(dead_code)]

use moshid_kernels::device::cuda::{CudaDevice, CudaOpenOptions};
use moshid_kernels::device::emu::EmuDevice;
use moshid_kernels::device::Device;

/// Which device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The host emulator of the kernels.
    Emu,
    /// CUDA device 0.
    Cuda,
}

/// `MOSHID_TEST_DEVICE`, or `default` when it is not set.
pub fn kind(default: Kind) -> Kind {
    match std::env::var("MOSHID_TEST_DEVICE").as_deref() {
        Ok("cuda") => Kind::Cuda,
        Ok("emu") => Kind::Emu,
        Ok(other) => panic!("MOSHID_TEST_DEVICE={other}: `emu` or `cuda`"),
        Err(_) => default,
    }
}

/// Opens the device: `fmad` false compiles the kernels without FMA
/// contraction (the exactness tests; nothing changes on the emulator, which
/// never contracts).
pub fn open(default: Kind, fmad: bool) -> Box<dyn Device> {
    match kind(default) {
        Kind::Emu => Box::new(EmuDevice::new()),
        Kind::Cuda => {
            let opts = CudaOpenOptions {
                fmad,
                ..CudaOpenOptions::from_test_env()
            };
            let d =
                CudaDevice::open(0, &opts).unwrap_or_else(|e| panic!("opening CUDA device 0: {e}"));
            Box::new(d)
        }
    }
}
