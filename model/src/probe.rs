//! A short measurement of this machine with the CPU backend's own code,
//! from which the preflight predicts a model's step time before loading it:
//! - the rate at which the LM's linear kernel streams a weight matrix far
//!   larger than the caches at one row — a stream's LM step at batch 1
//!   reads every weight once, so it is bound by this rate
//!   ([`weight_stream_rate`]);
//! - a few real frames of the checkpoint's own Mimi, encode and decode, at
//!   batch 1 ([`mimi_step_ms`]): Mimi is small (its weights are loaded for
//!   this, a fraction of the model) but its convolutions at one stream are
//!   far from any arithmetic peak, so it is timed rather than estimated.
//!
//! Figures are medians, so a busy machine is judged as it is, not by its
//! luckiest moment. The whole probe takes well under a second on a real
//! Mimi; its buffers go through the fallible path.

use crate::alloc::{self, AllocError};
use crate::checkpoint::{CheckpointDir, DirError};
use crate::mimi::Mimi;
use crate::weights::Weights;
use std::time::Instant;

/// Side of the streamed matrix: 4096² float32 values, 64 MiB.
const STREAM_DIM: usize = 4096;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn timed(runs: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm: pages touched, code and caches loaded
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// Bytes of float32 weights per second the LM kernel reads at one row (one
/// thread, the calling one).
pub fn weight_stream_rate() -> Result<f64, AllocError> {
    let n = STREAM_DIM;
    let mut w: Vec<f32> = alloc::zeroed(n * n, || "the host probe's 64 MiB matrix".into())?;
    // Values that are neither zero nor denormal, so nothing takes a fast path.
    for (i, v) in w.iter_mut().enumerate() {
        *v = ((i % 97) as f32 - 48.0) * 1e-3;
    }
    let x = vec![0.5f32; n];
    let mut y = vec![0.0f32; n];
    let t = timed(5, || crate::lm::linear(&x, 1, &w, n, n, &mut y));
    std::hint::black_box(&y);
    Ok((n * n * 4) as f64 / t)
}

/// Milliseconds of one frame of the checkpoint's Mimi (encode + decode) for
/// one stream: the median of `frames` frames after two of warm-up.
pub fn mimi_step_ms(dir: &CheckpointDir, frames: usize) -> Result<f64, DirError> {
    let mut w = Weights::open(&dir.mimi_weights)?;
    let mimi = Mimi::load(&dir.mimi, &mut w, dir.mimi_codebooks())?;
    drop(w);
    let mut state = mimi.try_new_state(1)?;
    let fs = mimi.frame_samples();
    let pcm: Vec<f32> = (0..fs).map(|i| (i as f32 * 0.05).sin() * 0.1).collect();
    let mut codes = vec![0u32; mimi.num_codebooks()];
    let mut out = vec![0.0f32; fs];
    let mut step = || {
        mimi.encode_step(&mut state, &pcm, &[true], &mut codes);
        mimi.decode_step(&mut state, &codes, &[true], &mut out);
    };
    step();
    let t = timed(frames.max(1), &mut step);
    std::hint::black_box(&out);
    Ok(t * 1e3)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_probe_measures_plausible_figures() {
        let r = super::weight_stream_rate().unwrap();
        // Any machine that builds this: between 0.1 GB/s and 1 TB/s.
        assert!((1e8..1e12).contains(&r), "{r}");
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("demo");
        crate::demo::write_demo(&d, 3).unwrap();
        let dir = super::CheckpointDir::open(&d).unwrap();
        let ms = super::mimi_step_ms(&dir, 3).unwrap();
        assert!(ms > 0.0 && ms < 1000.0, "{ms}");
    }
}
