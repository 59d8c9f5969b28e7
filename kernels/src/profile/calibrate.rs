//! The device's rates, measured in the run that profiles it: device-memory
//! bandwidth (a device-to-device copy: every byte read and written), the
//! host link (pinned copies both ways, the slower counted), and the GEMM
//! rates of bf16 (f32 accumulation) and f32 through the device's own GEMM.
//!
//! Each figure is the best of a few timed repetitions after one untimed,
//! timed by the device's events. Buffers are allocated on the device given
//! and live as long as it does (devices do not free): calibrate on a device
//! opened for it.

use super::roofline::Rates;
use crate::device::{DType, Device, DeviceResult, Gemm};

/// How big the calibration's work is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Bytes of the device-to-device copy.
    pub copy_bytes: usize,
    /// Bytes of each host copy.
    pub host_bytes: usize,
    /// `m = n` and `k` of the bf16 GEMM.
    pub bf16_mn_k: (usize, usize),
    /// `m = n = k` of the f32 GEMM.
    pub f32_mnk: usize,
    /// Timed repetitions.
    pub repeats: usize,
}

impl Sizes {
    /// For a GPU: a 256 MiB copy, 64 MiB host copies, an 8192² × 4096 bf16
    /// GEMM and a 4096³ f32 GEMM (512 MiB of device memory in all).
    pub const GPU: Sizes = Sizes {
        copy_bytes: 256 << 20,
        host_bytes: 64 << 20,
        bf16_mn_k: (8192, 4096),
        f32_mnk: 4096,
        repeats: 5,
    };
    /// For the emulator: small enough to run in a test.
    pub const SMALL: Sizes = Sizes {
        copy_bytes: 1 << 20,
        host_bytes: 64 << 10,
        bf16_mn_k: (64, 64),
        f32_mnk: 64,
        repeats: 2,
    };
}

/// Best time of `repeats` runs of `f` (after one untimed), in seconds.
fn best<D: Device>(
    dev: &mut D,
    repeats: usize,
    mut f: impl FnMut(&mut D) -> DeviceResult<()>,
) -> DeviceResult<f64> {
    let (a, b) = (dev.event_create()?, dev.event_create()?);
    f(dev)?;
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        dev.event_record(a)?;
        f(dev)?;
        dev.event_record(b)?;
        dev.synchronize()?;
        let ms = f64::from(dev.event_elapsed_ms(a, b)?);
        best = best.min(ms.max(1e-6) / 1e3);
    }
    Ok(best)
}

/// Measures the rates of `dev` with work of `sizes`.
pub fn measure<D: Device>(dev: &mut D, sizes: &Sizes) -> DeviceResult<Rates> {
    let (mn, k) = sizes.bf16_mn_k;
    let f = sizes.f32_mnk;
    let ab_bytes = (2 * mn * k * 2).max(2 * f * f * 4);
    let c_bytes = (mn * mn * 4).max(f * f * 4);
    let src = dev.alloc(sizes.copy_bytes.max(ab_bytes))?;
    let dst = dev.alloc(sizes.copy_bytes.max(c_bytes))?;
    // Operands of small normal numbers (0x3c3c: 0.0115 as bf16 and f32),
    // not zeros, which some hardware multiplies faster.
    dev.upload(src, &vec![0x3c_u8; sizes.copy_bytes.max(ab_bytes)])?;
    let host = dev.alloc_host(sizes.host_bytes)?;

    let copy = sizes.copy_bytes;
    let t = best(dev, sizes.repeats, |d| d.copy_on_device(dst, src, copy))?;
    let hbm_bytes_per_s = 2.0 * copy as f64 / t;

    let hb = sizes.host_bytes;
    let up = best(dev, sizes.repeats, |d| d.copy_to_device(dst, &host, 0, hb))?;
    let down = best(dev, sizes.repeats, |d| d.copy_to_host(&host, 0, src, hb))?;
    let host_bytes_per_s = hb as f64 / up.max(down);

    let gemm = |m: usize, k: usize, t: DType| Gemm {
        m,
        n: m,
        k,
        a: src,
        a_type: t,
        lda: k,
        b: src + (m * k * t.bytes()) as u64,
        b_type: t,
        ldb: k,
        c: dst,
        c_type: DType::F32,
        ldc: m,
        alpha: 1.0,
        beta: 0.0,
    };
    let g16 = gemm(mn, k, DType::Bf16);
    let t16 = best(dev, sizes.repeats, |d| d.gemm(&g16))?;
    let g32 = gemm(f, f, DType::F32);
    let t32 = best(dev, sizes.repeats, |d| d.gemm(&g32))?;
    Ok(Rates {
        hbm_bytes_per_s,
        host_bytes_per_s,
        bf16_flops_per_s: 2.0 * (mn * mn * k) as f64 / t16,
        f32_flops_per_s: 2.0 * (f * f * f) as f64 / t32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::emu::EmuDevice;

    #[test]
    fn the_emulator_has_rates() {
        let mut dev = EmuDevice::new();
        let r = measure(&mut dev, &Sizes::SMALL).unwrap();
        for v in [
            r.hbm_bytes_per_s,
            r.host_bytes_per_s,
            r.bf16_flops_per_s,
            r.f32_flops_per_s,
        ] {
            assert!(v.is_finite() && v > 0.0, "{r:?}");
        }
    }
}
