//! PersonaPlex prompts, as NVIDIA's server builds them
//! (`LMGen.step_system_prompts`, lm.py:1123-1127; `server.py:79-107`).
//!
//! A session starts with a forced prefill, frame by frame:
//! 1. the voice prompt, `N` frames: text [`PAD_TEXT`], the model's audio =
//!    the voice's Mimi codes of that frame, the user's audio
//!    [`SINE_TOKENS`] (a `.pt` voice instead replays its stored embeddings,
//!    see [`crate::lm::prefill::Replay`]);
//! 2. [`SILENCE_FRAMES`] frames: text [`PAD_TEXT`], model [`SILENCE_TOKENS`],
//!    user [`SINE_TOKENS`];
//! 3. one frame per token of the role text wrapped by
//!    [`wrap_with_system_tags`]: that token, [`SILENCE_TOKENS`],
//!    [`SINE_TOKENS`];
//! 4. [`SILENCE_FRAMES`] frames again.
//!
//! Then Mimi is reset and the conversation starts. Where the official server
//! fails, this module does what a user expects: an empty role text gives no
//! text frames (the server raises iterating `None`), no voice gives no voice
//! frames (the server needs one).
//!
//! Submodules read the voice prompt files: [`wav`] (a WAV as `sphn.read`
//! and `sphn.resample` give it, normalised to −24 LUFS as pyloudnorm does,
//! [`loudness`]) and [`pt`] (NVIDIA's `.pt` embeddings, a PyTorch zip
//! pickle read without executing anything).

pub mod loudness;
pub mod pt;
pub mod wav;

use crate::config::LmConfig;
use crate::lm::prefill::{PrefillFrames, Replay};
use crate::streaming::{ModelError, VoiceInput};
use std::sync::Arc;

/// The model audio of a silent frame (Mimi codes of the real codec,
/// hard-coded in lm.py:56).
pub const SILENCE_TOKENS: [u32; 8] = [948, 243, 1178, 546, 1736, 1030, 1978, 2008];
/// The user audio of every prefill frame (lm.py:57).
pub const SINE_TOKENS: [u32; 8] = [430, 1268, 381, 1611, 1095, 1495, 56, 472];
/// The text of a prefill frame without a prompt token (`zero_text_code`,
/// also the text padding id).
pub const PAD_TEXT: u32 = 3;
/// Silence frames before and after the role text: `int(0.5 · 12.5)`.
pub const SILENCE_FRAMES: usize = 6;
/// Audio codebooks per stream in PersonaPlex (`AUDIO_TOKENS_PER_STREAM`).
pub const STREAM_CODEBOOKS: usize = 8;

/// The role text as the official server tokenizes it (`server.py:79-86`):
/// stripped; kept as it is when it already starts and ends with
/// `<system>`, else `"<system> " + text + " <system>"`.
pub fn wrap_with_system_tags(text: &str) -> String {
    let t = text.trim();
    const TAG: &str = "<system>";
    if t.starts_with(TAG) && t.ends_with(TAG) {
        t.to_string()
    } else {
        format!("{TAG} {t} {TAG}")
    }
}

/// Why a voice prompt file was refused.
#[derive(Debug, thiserror::Error)]
pub enum VoiceError {
    /// A `.pt` file that is not NVIDIA's voice embeddings.
    #[error("{0}")]
    Pt(#[from] pt::PtError),
    /// A WAV file that cannot be used.
    #[error("{0}")]
    Wav(#[from] wav::WavError),
    /// A voice that does not fit this model.
    #[error("{0}")]
    Model(#[from] ModelError),
}

/// The replayed voice of a `.pt` file's bytes, checked against the model.
pub fn replay_from_pt(bytes: &[u8], cfg: &LmConfig) -> Result<Replay, VoiceError> {
    let v = pt::read_pt(bytes)?;
    let dim = cfg.dim;
    let e = &v.embeddings;
    let shape_ok =
        e.shape.last() == Some(&dim) && e.shape.iter().skip(1).rev().skip(1).all(|&d| d == 1);
    if !shape_ok || e.shape.len() < 2 {
        return Err(pt::PtError(format!(
            "`embeddings` has shape {:?}, expected [frames, 1, 1, {dim}]",
            e.shape
        ))
        .into());
    }
    let cache = v
        .cache
        .values
        .iter()
        .map(|&x| u32::try_from(x).map_err(|_| pt::PtError(format!("`cache` holds {x}"))))
        .collect::<Result<Vec<u32>, _>>()?;
    let r = Replay {
        frames: e.shape[0] + 1,
        embeddings: v.embeddings.values,
        cache,
    };
    crate::prompt_job::check_replay(cfg, &r)?;
    Ok(r)
}

/// The voice input of a WAV voice already at 24 kHz (normalised and
/// padded as the official server does).
pub fn voice_from_pcm_24k(samples: &[f32], frame_samples: usize) -> Result<VoiceInput, VoiceError> {
    let (pcm, _, _) = wav::prepare_voice(samples, frame_samples)?;
    Ok(VoiceInput::Pcm(pcm.into()))
}

/// The voice input of a `.pt` voice.
pub fn voice_from_pt(bytes: &[u8], cfg: &LmConfig) -> Result<VoiceInput, VoiceError> {
    Ok(VoiceInput::Replay(Arc::new(replay_from_pt(bytes, cfg)?)))
}

/// The role text's tokens as the official server makes them; an empty or
/// blank text gives none (the official server fails on it).
pub fn text_prompt_tokens(enc: &crate::spm_encode::Encoder, text: &str) -> Vec<u32> {
    if text.trim().is_empty() {
        Vec::new()
    } else {
        enc.encode(&wrap_with_system_tags(text))
    }
}

/// A voice prompt, ready to feed.
#[derive(Debug, Clone, PartialEq)]
pub enum Voice {
    /// No voice prompt.
    None,
    /// Mimi codes of the voice, `[frames][STREAM_CODEBOOKS]` (a WAV encoded
    /// by the session's Mimi).
    Codes(Vec<u32>),
    /// Replayed from a `.pt` file.
    Replay(Replay),
}

impl Voice {
    /// Prefill frames the voice takes.
    pub fn frames(&self) -> usize {
        match self {
            Voice::None => 0,
            Voice::Codes(c) => c.len() / STREAM_CODEBOOKS,
            Voice::Replay(r) => r.frames,
        }
    }
}

/// Every frame of a prefill, given the voice and the role text's tokens.
/// `card` is the audio cardinality (the dummy token of a replayed frame).
pub fn prefill_frames(voice: Voice, text_tokens: &[u32], card: u32) -> PrefillFrames {
    const K: usize = 1 + 2 * STREAM_CODEBOOKS;
    let n = voice.frames() + 2 * SILENCE_FRAMES + text_tokens.len();
    let mut given = Vec::with_capacity(n * K);
    let mut frame = |text: u32, model: &[u32]| {
        given.push(text);
        given.extend_from_slice(model);
        given.extend_from_slice(&SINE_TOKENS);
    };
    let replay = match voice {
        Voice::None => None,
        Voice::Codes(codes) => {
            for f in codes.chunks_exact(STREAM_CODEBOOKS) {
                frame(PAD_TEXT, f);
            }
            None
        }
        Voice::Replay(r) => {
            // `step_embeddings`' dummy tokens: text pad, every audio row `card`.
            for _ in 0..r.frames {
                given.push(PAD_TEXT);
                given.extend(std::iter::repeat_n(card, 2 * STREAM_CODEBOOKS));
            }
            Some(r)
        }
    };
    let mut frame = |text: u32, model: &[u32]| {
        given.push(text);
        given.extend_from_slice(model);
        given.extend_from_slice(&SINE_TOKENS);
    };
    for _ in 0..SILENCE_FRAMES {
        frame(PAD_TEXT, &SILENCE_TOKENS);
    }
    for &t in text_tokens {
        frame(t, &SILENCE_TOKENS);
    }
    for _ in 0..SILENCE_FRAMES {
        frame(PAD_TEXT, &SILENCE_TOKENS);
    }
    PrefillFrames {
        codebooks: K,
        given,
        replay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_tags_wrap_as_the_server_does() {
        assert_eq!(wrap_with_system_tags("  hi  "), "<system> hi <system>");
        assert_eq!(
            wrap_with_system_tags("<system> hi <system>"),
            "<system> hi <system>"
        );
        assert_eq!(
            wrap_with_system_tags("<system> hi"),
            "<system> <system> hi <system>"
        );
        assert_eq!(wrap_with_system_tags(""), "<system>  <system>");
    }

    #[test]
    fn frames_are_voice_silence_text_silence() {
        let f = prefill_frames(Voice::Codes(vec![7; 16]), &[40, 41], 2048);
        assert_eq!(f.frames(), 2 + 6 + 2 + 6);
        let row = |i: usize| &f.given[i * 17..(i + 1) * 17];
        assert_eq!(row(0)[..9], [3, 7, 7, 7, 7, 7, 7, 7, 7]);
        assert_eq!(row(2)[1..9], SILENCE_TOKENS);
        assert_eq!(row(8)[0], 40);
        assert_eq!(row(9)[0], 41);
        assert_eq!(row(15)[9..], SINE_TOKENS);
    }
}
