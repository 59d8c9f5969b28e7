//! One slot's prompt prefill in progress, the same on every backend: the
//! stages and their bounded work per call, over the backend's primitives
//! ([`PrefillOps`]).
//!
//! Stages: (1) a WAV voice's frames are encoded by the slot's own streaming
//! Mimi (reset at the session's start, as the official server's), one frame
//! per unit of work; (2) the prefill frames are assembled
//! ([`crate::persona::prefill_frames`]) and their token-ring bookkeeping
//! simulated; (3) the transformer positions run in causal passes of at
//! most [`PREFILL_CHUNK_POSITIONS`]; (4) the backend gives the slot the
//! ring, flags and offset and resets its Mimi. The slot is then exactly
//! where a frame-by-frame prefill leaves it.

use crate::config::LmConfig;
use crate::lm::prefill::{Replay, Simulated};
use crate::lm::PREFILL_CHUNK_POSITIONS;
use crate::persona::{prefill_frames, Voice, SILENCE_FRAMES, STREAM_CODEBOOKS};
use crate::streaming::{ModelError, Prompt, PromptProgress, VoiceInput};
use std::sync::Arc;

/// What a backend provides to run a prefill.
pub trait PrefillOps {
    /// The LM's configuration.
    fn lm_config(&self) -> &LmConfig;
    /// Samples per frame.
    fn frame_samples(&self) -> usize;
    /// Encodes one voice frame with `slot`'s streaming Mimi; writes the
    /// first [`STREAM_CODEBOOKS`] codes into `codes`.
    fn encode_voice_frame(
        &mut self,
        slot: usize,
        pcm: &[f32],
        codes: &mut [u32],
    ) -> Result<(), ModelError>;
    /// Runs prefill positions `t0..t0 + n` of `slot`.
    fn prefill_pass(
        &mut self,
        slot: usize,
        sim: &Simulated,
        replay: Option<&Replay>,
        t0: usize,
        n: usize,
    ) -> Result<(), ModelError>;
    /// Gives `slot` the ring, flags and offset of `sim` and resets its Mimi.
    fn finish_prefill(&mut self, slot: usize, sim: &Simulated) -> Result<(), ModelError>;
}

fn params(why: impl Into<String>) -> ModelError {
    ModelError::Params(why.into())
}

/// The ring length of NVIDIA's `LMGen` (`max_delay + 3`).
pub fn persona_ring_len(cfg: &LmConfig) -> usize {
    cfg.max_delay() + 3
}

/// Checks a replayed voice against the model: embedding width, ring shape
/// and token ranges.
pub fn check_replay(cfg: &LmConfig, r: &Replay) -> Result<(), ModelError> {
    let (k, ct) = (cfg.num_codebooks(), persona_ring_len(cfg));
    if r.frames == 0 || r.embeddings.len() != (r.frames - 1) * cfg.dim {
        return Err(params(format!(
            "the voice's embeddings are not {} wide (this model's dim)",
            cfg.dim
        )));
    }
    if r.cache.len() != k * ct {
        return Err(params(format!(
            "the voice's token ring is not [{k}, {ct}] (this model's)"
        )));
    }
    let text_ok = r.cache[..ct].iter().all(|&t| t as usize <= cfg.text_card);
    let audio_ok = r.cache[ct..].iter().all(|&t| t as usize <= cfg.card);
    if !text_ok || !audio_ok || r.embeddings.iter().any(|x| !x.is_finite()) {
        return Err(params("the voice's values are out of range"));
    }
    Ok(())
}

/// One slot's prompt in progress.
#[derive(Debug)]
pub struct PromptJob {
    pcm: Option<Arc<[f32]>>,
    replay: Option<Arc<Replay>>,
    text_tokens: Vec<u32>,
    encoded: usize,
    codes: Vec<u32>,
    sim: Option<Simulated>,
    done: usize,
}

impl PromptJob {
    /// A job for `p`, checked against the model (`cfg`, `frame_samples`).
    pub fn new(p: &Prompt, cfg: &LmConfig, frame_samples: usize) -> Result<Self, ModelError> {
        if let Some(&t) = p.text_tokens.iter().find(|&&t| t as usize >= cfg.text_card) {
            return Err(params(format!(
                "text prompt token {t} is not below text_card {}",
                cfg.text_card
            )));
        }
        let (pcm, replay) = match &p.voice {
            VoiceInput::None => (None, None),
            VoiceInput::Pcm(a) => {
                if a.is_empty() || a.len() % frame_samples != 0 {
                    return Err(params("the voice audio is not a whole number of frames"));
                }
                (Some(a.clone()), None)
            }
            VoiceInput::Replay(r) => {
                check_replay(cfg, r)?;
                (None, Some(r.clone()))
            }
        };
        Ok(PromptJob {
            pcm,
            replay,
            text_tokens: p.text_tokens.clone(),
            encoded: 0,
            codes: Vec::new(),
            sim: None,
            done: 0,
        })
    }

    fn frames_left(&self, fs: usize) -> usize {
        let voice = self.pcm.as_ref().map_or(0, |p| p.len() / fs - self.encoded);
        let positions = match &self.sim {
            Some(s) => s.positions() - self.done,
            None => {
                let v = self.replay.as_ref().map_or(0, |r| r.frames);
                let voice_frames = self.pcm.as_ref().map_or(v, |p| p.len() / fs);
                voice_frames + self.text_tokens.len() + 2 * SILENCE_FRAMES - 1
            }
        };
        voice + positions
    }

    /// Does at most `budget` frames of work (at least one).
    pub fn advance<B: PrefillOps + ?Sized>(
        &mut self,
        b: &mut B,
        slot: usize,
        budget: usize,
    ) -> Result<PromptProgress, ModelError> {
        let mut budget = budget.max(1);
        let fs = b.frame_samples();
        if let Some(pcm) = self.pcm.clone() {
            let frames = pcm.len() / fs;
            let mut codes = [0u32; STREAM_CODEBOOKS];
            while self.encoded < frames && budget > 0 {
                let f = self.encoded;
                b.encode_voice_frame(slot, &pcm[f * fs..(f + 1) * fs], &mut codes)?;
                self.codes.extend_from_slice(&codes);
                self.encoded += 1;
                budget -= 1;
            }
            if self.encoded < frames {
                return Ok(PromptProgress::Pending {
                    frames_left: self.frames_left(fs),
                });
            }
        }
        if self.sim.is_none() {
            let voice = match (&self.pcm, &self.replay) {
                (Some(_), _) => Voice::Codes(std::mem::take(&mut self.codes)),
                (None, Some(r)) => Voice::Replay((**r).clone()),
                (None, None) => Voice::None,
            };
            let cfg = b.lm_config();
            let frames = prefill_frames(voice, &self.text_tokens, cfg.card as u32);
            let initial: Vec<u32> = (0..cfg.num_codebooks())
                .map(|k| {
                    if k == 0 {
                        cfg.text_card as u32
                    } else {
                        cfg.card as u32
                    }
                })
                .collect();
            self.sim = Some(frames.simulate(&cfg.delays, &initial, persona_ring_len(cfg)));
        }
        let sim = self.sim.as_ref().expect("simulated above");
        let total = sim.positions();
        while self.done < total && budget > 0 {
            let n = (total - self.done).min(PREFILL_CHUNK_POSITIONS).min(budget);
            b.prefill_pass(slot, sim, self.replay.as_deref(), self.done, n)?;
            self.done += n;
            budget -= n;
        }
        if self.done < total {
            return Ok(PromptProgress::Pending {
                frames_left: total - self.done,
            });
        }
        b.finish_prefill(slot, sim)?;
        Ok(PromptProgress::Done)
    }
}
