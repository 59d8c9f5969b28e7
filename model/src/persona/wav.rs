//! Voice prompt WAV files, read as `sphn.read` reads them (first channel;
//! 8-bit unsigned, 16/24/32-bit signed integer, 32/64-bit float PCM, scaled
//! to [-1, 1): 16-bit `x / 32768`), and prepared as NVIDIA's
//! `load_voice_prompt` prepares them: normalised to −24 LUFS
//! ([`super::loudness`]; the gain applied in float64, rounded to float32)
//! and cut into frames, the last one zero-padded.
//!
//! Resampling to 24 kHz is the caller's (the daemon's resampler; not
//! bit-identical to `sphn.resample`, which the golden fixture does not
//! cover): [`prepare_voice`] takes 24 kHz audio.
//!
//! Invariants: the header parser never panics on any input and refuses
//! what it does not read (compressed formats, absurd sizes), naming it.

use super::loudness::{gain_to, integrated_loudness, LoudnessError};

/// Largest WAV file read (10 minutes of 48 kHz stereo float).
pub const MAX_WAV_BYTES: usize = 256 << 20;
/// The loudness NVIDIA's server normalises voice prompts to.
pub const TARGET_LUFS: f64 = -24.0;

/// Why a WAV voice prompt was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WavError {
    /// Not a WAV file this reader reads.
    #[error("not a usable WAV file: {0}")]
    Format(String),
    /// The audio cannot be normalised.
    #[error("voice prompt: {0}")]
    Loudness(#[from] LoudnessError),
}

fn bad<T>(why: impl Into<String>) -> Result<T, WavError> {
    Err(WavError::Format(why.into()))
}

/// A WAV file's first channel.
#[derive(Debug, Clone, PartialEq)]
pub struct Wav {
    /// Sample rate in Hz.
    pub rate: u32,
    /// Channels in the file.
    pub channels: u16,
    /// The first channel, as float32 in [-1, 1).
    pub samples: Vec<f32>,
}

/// Reads a WAV file's first channel.
pub fn read_wav(bytes: &[u8]) -> Result<Wav, WavError> {
    if bytes.len() > MAX_WAV_BYTES {
        return bad(format!("larger than {MAX_WAV_BYTES} bytes"));
    }
    if bytes.len() < 12 || &bytes[..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return bad("no RIFF/WAVE header");
    }
    let mut at = 12usize;
    let mut fmt: Option<(u16, u16, u32, u16)> = None;
    while at + 8 <= bytes.len() {
        let id = &bytes[at..at + 4];
        let len = u32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]])
            as usize;
        let body = at + 8;
        let end = body.saturating_add(len);
        if id == b"fmt " {
            let f = bytes.get(body..end).filter(|f| f.len() >= 16);
            let Some(f) = f else {
                return bad("truncated fmt chunk");
            };
            let mut format = u16::from_le_bytes([f[0], f[1]]);
            let channels = u16::from_le_bytes([f[2], f[3]]);
            let rate = u32::from_le_bytes([f[4], f[5], f[6], f[7]]);
            let bits = u16::from_le_bytes([f[14], f[15]]);
            if format == 0xFFFE {
                // WAVE_FORMAT_EXTENSIBLE: the sub-format GUID starts with the tag.
                let Some(g) = f.get(24..26) else {
                    return bad("truncated extensible fmt chunk");
                };
                format = u16::from_le_bytes([g[0], g[1]]);
            }
            fmt = Some((format, channels, rate, bits));
        } else if id == b"data" {
            let Some((format, channels, rate, bits)) = fmt else {
                return bad("data before fmt");
            };
            // A streamed WAV may claim more data than it holds: read what is there.
            let data = &bytes[body.min(bytes.len())..end.min(bytes.len())];
            return decode(data, format, channels, rate, bits);
        }
        at = end.saturating_add(len & 1);
    }
    bad("no data chunk")
}

fn decode(data: &[u8], format: u16, channels: u16, rate: u32, bits: u16) -> Result<Wav, WavError> {
    if channels == 0 || rate == 0 || rate > 384_000 {
        return bad(format!("{channels} channels at {rate} Hz"));
    }
    let width = match (format, bits) {
        (1, 8 | 16 | 24 | 32) | (3, 32 | 64) => bits as usize / 8,
        _ => {
            return bad(format!(
                "sample format {format} with {bits} bits (PCM or float only)"
            ))
        }
    };
    let frame = width * channels as usize;
    let samples = data
        .chunks_exact(frame)
        .map(|f| {
            let s = &f[..width];
            match (format, width) {
                (1, 1) => (s[0] as f32 - 128.0) / 128.0,
                (1, 2) => i16::from_le_bytes([s[0], s[1]]) as f32 / 32768.0,
                (1, 3) => (i32::from_le_bytes([0, s[0], s[1], s[2]]) >> 8) as f32 / 8_388_608.0,
                (1, _) => i32::from_le_bytes([s[0], s[1], s[2], s[3]]) as f32 / 2_147_483_648.0,
                (_, 4) => f32::from_le_bytes([s[0], s[1], s[2], s[3]]),
                _ => f64::from_le_bytes(s.try_into().unwrap_or([0; 8])) as f32,
            }
        })
        .collect::<Vec<f32>>();
    if samples.iter().any(|x| !x.is_finite()) {
        return bad("non-finite samples");
    }
    Ok(Wav {
        rate,
        channels,
        samples,
    })
}

/// What Mimi is fed for a 24 kHz voice: normalised to −24 LUFS and padded
/// with zeros to whole frames of `frame_samples`. Also returns the measured
/// loudness and the gain.
pub fn prepare_voice(
    samples_24k: &[f32],
    frame_samples: usize,
) -> Result<(Vec<f32>, f64, f64), WavError> {
    let loudness = integrated_loudness(samples_24k, 24_000)?;
    let gain = gain_to(loudness, TARGET_LUFS);
    let frames = samples_24k.len().div_ceil(frame_samples.max(1));
    let mut out = vec![0.0f32; frames * frame_samples];
    for (o, &x) in out.iter_mut().zip(samples_24k) {
        *o = (gain * x as f64) as f32;
    }
    Ok((out, loudness, gain))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_that_lie_are_errors() {
        assert!(read_wav(b"RIFF\0\0\0\0WAVE").is_err());
        let mut w = b"RIFF\0\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0\xc0\x5d\0\0\0\0\0\0\x02\0\x10\0data\xff\xff\xff\xff\x01\x02".to_vec();
        let r = read_wav(&w).unwrap();
        assert_eq!((r.rate, r.samples.len()), (24_000, 1));
        w[20] = 2; // ADPCM
        assert!(read_wav(&w).is_err());
    }

    #[test]
    fn silence_and_short_audio_are_refused() {
        assert!(matches!(
            prepare_voice(&[0.0; 24_000], 1920),
            Err(WavError::Loudness(LoudnessError::Silent))
        ));
        assert!(matches!(
            prepare_voice(&[0.1; 100], 1920),
            Err(WavError::Loudness(LoudnessError::TooShort))
        ));
    }
}
