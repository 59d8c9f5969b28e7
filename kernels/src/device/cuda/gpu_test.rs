//! Helpers shared by the `#[ignore]`d GPU tests of `cublas.rs` and
//! `capture.rs` (run by `scripts/gpu-check`): opening device 0 as every GPU
//! test does ([`CudaOpenOptions::from_test_env`]), deterministic data, and
//! f32 to and from bytes.

use super::{CudaDevice, CudaOpenOptions};

pub(super) fn open() -> CudaDevice {
    CudaDevice::open(0, &CudaOpenOptions::from_test_env()).expect("a GPU")
}

pub(super) fn det(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + seed) * 0.7137).sin()).collect()
}

pub(super) fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

pub(super) fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
