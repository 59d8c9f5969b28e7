//! Whole-buffer resampling to the model's 24 kHz: a file's audio (the
//! client's WAV input, a voice prompt's WAV) converted once, off the frame
//! path, with rubato's FFT resampler (synchronous, band-limited).
//!
//! Invariants: the output has `round(frames * 24000 / rate)` samples and is
//! aligned with the input (the resampler's delay is removed); audio already
//! at 24 kHz is copied unchanged.

use super::SAMPLE_RATE_HZ;
use rubato::{FftFixedInOut, Resampler};

/// Input frames per resampler chunk (rubato rounds it to its FFT size).
const RESAMPLER_CHUNK_FRAMES: usize = 1024;

/// Number of samples `frames` input frames at `rate_hz` become at 24 kHz.
pub fn resampled_len(frames: usize, rate_hz: u32) -> usize {
    let rate = u128::from(rate_hz.max(1));
    ((frames as u128 * u128::from(SAMPLE_RATE_HZ) + rate / 2) / rate) as usize
}

/// Resamples mono audio from `rate_hz` to 24 kHz; the output has
/// [`resampled_len`] samples and no delay.
pub fn whole_to_24k(input: &[f32], rate_hz: u32) -> Result<Vec<f32>, String> {
    if rate_hz == SAMPLE_RATE_HZ || input.is_empty() {
        return Ok(input.to_vec());
    }
    let resample_error =
        |e: &dyn std::fmt::Display| format!("resampling {rate_hz} Hz to {SAMPLE_RATE_HZ} Hz: {e}");
    let out_len = resampled_len(input.len(), rate_hz);
    let mut resampler = FftFixedInOut::<f32>::new(
        rate_hz as usize,
        SAMPLE_RATE_HZ as usize,
        RESAMPLER_CHUNK_FRAMES,
        1,
    )
    .map_err(|e| resample_error(&e))?;
    let delay = resampler.output_delay();
    let mut out = Vec::with_capacity(delay + out_len + resampler.output_frames_max());
    let mut pos = 0;
    while out.len() < delay + out_len {
        let chunk_in = resampler.input_frames_next();
        let chunk = if pos + chunk_in <= input.len() {
            resampler.process(&[&input[pos..pos + chunk_in]], None)
        } else if pos < input.len() {
            // The last partial chunk, padded with silence.
            resampler.process_partial(Some(&[&input[pos..]]), None)
        } else {
            // Silence, to flush the resampler's delay.
            resampler.process_partial(None::<&[&[f32]]>, None)
        }
        .map_err(|e| resample_error(&e))?;
        if chunk[0].is_empty() {
            return Err(resample_error(&"resampler produced no output"));
        }
        out.extend_from_slice(&chunk[0]);
        pos += chunk_in;
    }
    out.drain(..delay);
    out.truncate(out_len);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resampling_keeps_length_level_and_alignment() {
        // A 440 Hz tone starting after 0.25 s of silence, at 48 kHz and 8 kHz.
        for rate in [8_000u32, 22_050, 44_100, 48_000] {
            let n = rate as usize;
            let onset = n / 4;
            let input: Vec<f32> = (0..n)
                .map(|i| {
                    if i < onset {
                        0.0
                    } else {
                        0.5 * (2.0 * std::f32::consts::PI * 440.0 * i as f32 / rate as f32).sin()
                    }
                })
                .collect();
            let out = whole_to_24k(&input, rate).unwrap();
            assert_eq!(out.len(), 24_000, "rate {rate}");
            let rms = |s: &[f32]| (s.iter().map(|x| x * x).sum::<f32>() / s.len() as f32).sqrt();
            // Silence stays silent (no delay shifted the tone into it)...
            assert!(rms(&out[..5_500]) < 0.01, "rate {rate}");
            // ...and the tone keeps its level (0.5 / sqrt(2)).
            let level = rms(&out[7_000..23_000]);
            assert!((level - 0.3536).abs() < 0.01, "rate {rate}: rms {level}");
        }
    }

    #[test]
    fn resampled_len_rounds() {
        assert_eq!(resampled_len(16_000, 16_000), 24_000);
        assert_eq!(resampled_len(44_100, 44_100), 24_000);
        assert_eq!(resampled_len(1, 48_000), 1); // 0.5 rounds up
        assert_eq!(resampled_len(0, 8_000), 0);
    }
}
