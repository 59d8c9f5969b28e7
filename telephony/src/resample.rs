//! Fixed-chunk resampling between a codec's rate and the model's 24 kHz.
//!
//! Built on rubato's `FftFixedInOut` (synchronous, FFT-based): every call
//! converts exactly one 20 ms chunk, and a model frame (80 ms) is four
//! chunks, so the sizes on both sides are constant for the whole session and
//! nothing is allocated after [`FrameResampler::new`]. The FFT resampler
//! delays its output by half an output chunk (10 ms); [`FrameResampler::delay_ms`]
//! reports it so that the session can account for it in its latency.
//!
//! Invariants: `process` takes exactly `in_frame()` samples and writes
//! exactly `out_frame()`; equal rates are a copy with no delay.

use rubato::{FftFixedInOut, Resampler};

/// Chunk processed per resampler call, in milliseconds.
pub const CHUNK_MS: u32 = 20;

/// A resampler failure (construction only: the sizes are fixed afterwards).
#[derive(Debug, Clone, thiserror::Error)]
#[error("resampler {from_hz} Hz → {to_hz} Hz: {why}")]
pub struct ResampleError {
    /// Input rate.
    pub from_hz: u32,
    /// Output rate.
    pub to_hz: u32,
    /// What failed.
    pub why: String,
}

/// Converts whole frames of `frame_ms` from one rate to another.
pub struct FrameResampler {
    inner: Option<FftFixedInOut<f32>>,
    from_hz: u32,
    to_hz: u32,
    chunk_in: usize,
    chunk_out: usize,
    chunks: usize,
}

impl FrameResampler {
    /// A resampler for frames of `frame_ms` (a multiple of [`CHUNK_MS`]).
    pub fn new(from_hz: u32, to_hz: u32, frame_ms: u32) -> Result<Self, ResampleError> {
        let err = |why: String| ResampleError {
            from_hz,
            to_hz,
            why,
        };
        if frame_ms == 0 || !frame_ms.is_multiple_of(CHUNK_MS) {
            return Err(err(format!(
                "frame of {frame_ms} ms is not a multiple of {CHUNK_MS} ms"
            )));
        }
        let chunk_in = (from_hz as u64 * CHUNK_MS as u64 / 1000) as usize;
        let chunk_out = (to_hz as u64 * CHUNK_MS as u64 / 1000) as usize;
        if chunk_in as u64 * 1000 != from_hz as u64 * CHUNK_MS as u64
            || chunk_out as u64 * 1000 != to_hz as u64 * CHUNK_MS as u64
        {
            return Err(err(format!(
                "{CHUNK_MS} ms is not a whole number of samples"
            )));
        }
        let inner = if from_hz == to_hz {
            None
        } else {
            let r = FftFixedInOut::<f32>::new(from_hz as usize, to_hz as usize, chunk_in, 1)
                .map_err(|e| err(e.to_string()))?;
            if r.input_frames_next() != chunk_in || r.output_frames_next() != chunk_out {
                return Err(err(format!(
                    "rubato chose chunks {}→{} instead of {chunk_in}→{chunk_out}",
                    r.input_frames_next(),
                    r.output_frames_next()
                )));
            }
            Some(r)
        };
        Ok(FrameResampler {
            inner,
            from_hz,
            to_hz,
            chunk_in,
            chunk_out,
            chunks: (frame_ms / CHUNK_MS) as usize,
        })
    }

    /// Input samples per frame.
    pub fn in_frame(&self) -> usize {
        self.chunk_in * self.chunks
    }

    /// Output samples per frame.
    pub fn out_frame(&self) -> usize {
        self.chunk_out * self.chunks
    }

    /// The delay the resampler adds, in milliseconds.
    pub fn delay_ms(&self) -> f64 {
        match &self.inner {
            Some(r) => r.output_delay() as f64 * 1000.0 / self.to_hz as f64,
            None => 0.0,
        }
    }

    /// Input and output rates.
    pub fn rates_hz(&self) -> (u32, u32) {
        (self.from_hz, self.to_hz)
    }

    /// Converts one frame: `input.len() == in_frame()`, `output.len() == out_frame()`.
    pub fn process(&mut self, input: &[f32], output: &mut [f32]) {
        debug_assert_eq!(input.len(), self.in_frame());
        debug_assert_eq!(output.len(), self.out_frame());
        let Some(r) = self.inner.as_mut() else {
            output.copy_from_slice(input);
            return;
        };
        for (cin, cout) in input
            .chunks_exact(self.chunk_in)
            .zip(output.chunks_exact_mut(self.chunk_out))
        {
            let wave_in = [cin];
            let mut wave_out = [cout];
            // Sizes are fixed at construction, so this cannot fail.
            let _ = r.process_into_buffer(&wave_in, &mut wave_out, Some(&[true]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(rate: u32, n: usize, hz: f32) -> Vec<f32> {
        (0..n)
            .map(|i| (2.0 * std::f32::consts::PI * hz * i as f32 / rate as f32).sin() * 0.5)
            .collect()
    }

    #[test]
    fn sizes_and_delays() {
        for (from, to) in [
            (8_000, 24_000),
            (16_000, 24_000),
            (48_000, 24_000),
            (24_000, 8_000),
            (44_100, 24_000),
            (24_000, 24_000),
        ] {
            let r = FrameResampler::new(from, to, 80).unwrap();
            assert_eq!(r.in_frame(), from as usize * 80 / 1000);
            assert_eq!(r.out_frame(), to as usize * 80 / 1000);
            assert!(r.delay_ms() <= 10.0, "{from}→{to}: {}", r.delay_ms());
        }
    }

    #[test]
    fn a_tone_keeps_its_level() {
        let mut r = FrameResampler::new(8_000, 24_000, 80).unwrap();
        let input = tone(8_000, 640 * 4, 440.0);
        let mut out = vec![0f32; 1920 * 4];
        for (i, o) in input.chunks(640).zip(out.chunks_mut(1920)) {
            r.process(i, o);
        }
        // Skip the start (delay, filter warm-up); the level is that of the tone.
        let tail = &out[1920..];
        let rms = (tail.iter().map(|x| x * x).sum::<f32>() / tail.len() as f32).sqrt();
        assert!((rms - 0.5 / 2f32.sqrt()).abs() < 0.02, "rms {rms}");
    }
}
