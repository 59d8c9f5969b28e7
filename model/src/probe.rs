//! A short measurement of this machine with the CPU backend's own kernels,
//! from which the preflight predicts a model's step time before loading it.
//!
//! Two figures, each the best of a few runs of a few milliseconds:
//! - how fast the LM's linear kernel streams a weight matrix far larger
//!   than the caches at one row (a stream's step at batch 1 reads every LM
//!   weight once: it is bound by this rate, not by arithmetic);
//! - how many multiply-adds per second Mimi's packed product does on a
//!   cache-resident problem of many rows (Mimi's convolutions and
//!   transformers are products of this kind).
//!
//! The whole probe takes well under a second and allocates 64 MiB (through
//! the fallible path: a machine without them gets an error, not an abort).

use crate::alloc::{self, AllocError};
use std::time::Instant;

/// What the probe measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostRates {
    /// Bytes of float32 weights per second the LM kernel reads at one row.
    pub weight_bytes_per_s: f64,
    /// Floating-point operations per second (a multiply-add is two) of
    /// Mimi's packed product.
    pub flops_per_s: f64,
}

/// Side of the streamed matrix: 4096² float32 values, 64 MiB.
const STREAM_DIM: usize = 4096;

fn best_of(runs: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm: pages touched, code and caches loaded
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Measures this machine (one thread, the calling one).
pub fn measure() -> Result<HostRates, AllocError> {
    let n = STREAM_DIM;
    let mut w: Vec<f32> = alloc::zeroed(n * n, || "the host probe's 64 MiB matrix".into())?;
    // Values that are neither zero nor denormal, so nothing takes a fast path.
    for (i, v) in w.iter_mut().enumerate() {
        *v = ((i % 97) as f32 - 48.0) * 1e-3;
    }
    let x = vec![0.5f32; n];
    let mut y = vec![0.0f32; n];
    let t = best_of(3, || crate::lm::linear(&x, 1, &w, n, n, &mut y));
    let weight_bytes_per_s = (n * n * 4) as f64 / t;
    drop(w);

    // Mimi-like: 512 wide, 128 rows; 32 MFLOP per call, about 1 MiB of panels.
    let (m, k, cols) = (128, 512, 512);
    let lin = crate::mimi::PackedLinear::from_fn(cols, k, |o, i| ((o + i) % 13) as f32 * 1e-2);
    let xs: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
    let mut ys = vec![0.0f32; m * cols];
    let t = best_of(5, || lin.forward(&xs, m, &mut ys));
    let flops_per_s = (2 * m * k * cols) as f64 / t;
    std::hint::black_box((&y, &ys));
    Ok(HostRates {
        weight_bytes_per_s,
        flops_per_s,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_probe_measures_plausible_rates() {
        let r = super::measure().unwrap();
        // Any machine that builds this: between 0.1 GB/s and 1 TB/s, and
        // between 0.1 and 10,000 GFLOP/s on one thread.
        assert!((1e8..1e12).contains(&r.weight_bytes_per_s), "{r:?}");
        assert!((1e8..1e13).contains(&r.flops_per_s), "{r:?}");
    }
}
