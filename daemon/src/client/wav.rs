//! WAV input and output of the client, and resampling to the model's rate.
//!
//! - [`read_wav_24k_mono`]: any PCM WAV that hound reads (integer 8 to 32 bits
//!   or 32-bit float, any rate, any channel count) becomes 24 kHz mono f32 in
//!   [-1, 1]: channels are averaged, then the signal is resampled with rubato's
//!   FFT resampler (synchronous, band-limited). The result has
//!   `round(frames * 24000 / rate)` samples and is aligned with the input (the
//!   resampler's delay is removed).
//! - [`frames_from_samples`]: cuts 24 kHz audio into [`FRAME_SAMPLES`] frames,
//!   padding the last one with silence.
//! - [`WavOutput`]: a 24 kHz mono WAV written as audio arrives; its header is
//!   brought up to date every second of audio so that an interrupted run
//!   leaves a readable file.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use super::ClientError;
use crate::codec::{resample, FRAME_SAMPLES, SAMPLE_RATE_HZ};

/// A WAV file after conversion to 24 kHz mono.
#[derive(Debug, Clone)]
pub struct LoadedAudio {
    /// 24 kHz mono samples.
    pub samples: Vec<f32>,
    /// The file's sample rate.
    pub source_rate_hz: u32,
    /// The file's channel count.
    pub source_channels: u16,
    /// The file's length in frames (samples per channel).
    pub source_frames: usize,
}

impl LoadedAudio {
    /// Duration of the audio in seconds.
    pub fn seconds(&self) -> f64 {
        self.samples.len() as f64 / f64::from(SAMPLE_RATE_HZ)
    }
}

/// Reads a WAV file and converts it to 24 kHz mono (see the module docs).
pub fn read_wav_24k_mono(path: &Path) -> Result<LoadedAudio, ClientError> {
    let wav_error = |source| ClientError::Wav {
        path: path.to_path_buf(),
        source,
    };
    let mut reader = hound::WavReader::open(path).map_err(wav_error)?;
    let spec = reader.spec();
    if spec.channels == 0 || spec.sample_rate == 0 {
        return Err(ClientError::Audio(format!(
            "{}: WAV header says {} channels at {} Hz",
            path.display(),
            spec.channels,
            spec.sample_rate
        )));
    }
    let interleaved: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Float => reader
            .samples::<f32>()
            .collect::<Result<_, _>>()
            .map_err(wav_error)?,
        hound::SampleFormat::Int => {
            let scale = 1.0 / (1u64 << (spec.bits_per_sample.clamp(1, 32) - 1)) as f64;
            reader
                .samples::<i32>()
                .map(|s| s.map(|v| (f64::from(v) * scale) as f32))
                .collect::<Result<_, _>>()
                .map_err(wav_error)?
        }
    };
    let mono = downmix(&interleaved, usize::from(spec.channels));
    let source_frames = mono.len();
    let samples = resample_to_24k(&mono, spec.sample_rate)?;
    Ok(LoadedAudio {
        samples,
        source_rate_hz: spec.sample_rate,
        source_channels: spec.channels,
        source_frames,
    })
}

/// Averages interleaved channels into one (an incomplete last frame is dropped).
pub fn downmix(interleaved: &[f32], channels: usize) -> Vec<f32> {
    if channels <= 1 {
        return interleaved.to_vec();
    }
    let gain = 1.0 / channels as f32;
    interleaved
        .chunks_exact(channels)
        .map(|frame| frame.iter().sum::<f32>() * gain)
        .collect()
}

/// Resamples mono audio from `rate_hz` to 24 kHz (see
/// [`crate::codec::resample`]).
fn resample_to_24k(input: &[f32], rate_hz: u32) -> Result<Vec<f32>, ClientError> {
    resample::whole_to_24k(input, rate_hz).map_err(ClientError::Audio)
}

/// Cuts 24 kHz audio into model frames; the last frame is padded with silence.
pub fn frames_from_samples(samples: &[f32]) -> Vec<[f32; FRAME_SAMPLES]> {
    samples
        .chunks(FRAME_SAMPLES)
        .map(|chunk| {
            let mut frame = [0f32; FRAME_SAMPLES];
            frame[..chunk.len()].copy_from_slice(chunk);
            frame
        })
        .collect()
}

/// Sample format of the output WAV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// 16-bit signed integer PCM (clipped to [-1, 1]).
    #[default]
    Pcm16,
    /// 32-bit IEEE float.
    F32,
}

/// A 24 kHz mono WAV file written as audio arrives.
pub struct WavOutput {
    path: PathBuf,
    writer: Option<hound::WavWriter<BufWriter<File>>>,
    format: OutputFormat,
    samples: u64,
    samples_at_last_flush: u64,
}

impl WavOutput {
    /// Creates (truncates) the file and writes its header.
    pub fn create(path: &Path, format: OutputFormat) -> Result<Self, ClientError> {
        let spec = match format {
            OutputFormat::Pcm16 => hound::WavSpec {
                channels: 1,
                sample_rate: SAMPLE_RATE_HZ,
                bits_per_sample: 16,
                sample_format: hound::SampleFormat::Int,
            },
            OutputFormat::F32 => hound::WavSpec {
                channels: 1,
                sample_rate: SAMPLE_RATE_HZ,
                bits_per_sample: 32,
                sample_format: hound::SampleFormat::Float,
            },
        };
        let writer = hound::WavWriter::create(path, spec).map_err(|source| ClientError::Wav {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            writer: Some(writer),
            format,
            samples: 0,
            samples_at_last_flush: 0,
        })
    }

    /// Samples written so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Appends samples; updates the header after every second of audio.
    pub fn write(&mut self, pcm: &[f32]) -> Result<(), ClientError> {
        let path = &self.path;
        let wav_error = |source| ClientError::Wav {
            path: path.clone(),
            source,
        };
        let Some(writer) = self.writer.as_mut() else {
            return Ok(());
        };
        for &sample in pcm {
            let sample = if sample.is_finite() { sample } else { 0.0 };
            match self.format {
                OutputFormat::Pcm16 => {
                    let value = (sample.clamp(-1.0, 1.0) * f32::from(i16::MAX)).round() as i16;
                    writer.write_sample(value)
                }
                OutputFormat::F32 => writer.write_sample(sample),
            }
            .map_err(wav_error)?;
        }
        self.samples += pcm.len() as u64;
        if self.samples - self.samples_at_last_flush >= u64::from(SAMPLE_RATE_HZ) {
            writer.flush().map_err(wav_error)?;
            self.samples_at_last_flush = self.samples;
        }
        Ok(())
    }

    /// Writes the final header and closes the file.
    pub fn finalize(mut self) -> Result<(), ClientError> {
        match self.writer.take() {
            Some(writer) => writer.finalize().map_err(|source| ClientError::Wav {
                path: self.path.clone(),
                source,
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_pad_with_silence() {
        let frames = frames_from_samples(&vec![0.5; FRAME_SAMPLES + 10]);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1][9], 0.5);
        assert_eq!(frames[1][10], 0.0);
        assert!(frames_from_samples(&[]).is_empty());
    }

    #[test]
    fn downmix_averages() {
        assert_eq!(downmix(&[1.0, 0.0, 0.5, 0.5, 9.0], 2), vec![0.5, 0.5]);
    }
}
