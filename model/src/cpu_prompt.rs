//! Prompt prefills on the CPU backend (PersonaPlex): the work of
//! [`StreamingModel::begin_prompt`](crate::streaming::StreamingModel::begin_prompt)
//! and `prompt_chunk`, and slot snapshots.
//!
//! A prompt runs in stages, each bounded per call: (1) a WAV voice's frames
//! are encoded by the slot's own streaming Mimi (reset at the session's
//! start, as the official server's), one frame per unit of work; (2) the
//! prefill frames are assembled ([`crate::persona::prefill_frames`]) and
//! their token-ring bookkeeping simulated; (3) the transformer positions run
//! in causal passes of at most [`PREFILL_CHUNK_POSITIONS`]; (4) the slot
//! gets the ring, flags and offset, and Mimi is reset again. The slot is
//! then exactly where a frame-by-frame prefill leaves it.
//!
//! A snapshot holds the LM state only: after a prompt Mimi is fresh.

use crate::cpu::CpuModel;
use crate::lm::prefill::{LmSnapshot, Replay, Simulated};
use crate::lm::{Lm, PREFILL_CHUNK_POSITIONS};
use crate::mimi::Mimi;
use crate::persona::{prefill_frames, Voice, STREAM_CODEBOOKS};
use crate::streaming::{ModelError, Prompt, PromptProgress, SlotSnapshot, VoiceInput};
use std::sync::Arc;

/// One slot's prompt in progress.
struct Job {
    pcm: Option<Arc<[f32]>>,
    replay: Option<Arc<Replay>>,
    text_tokens: Vec<u32>,
    /// Voice frames encoded so far, their codes.
    encoded: usize,
    codes: Vec<u32>,
    sim: Option<Simulated>,
    /// Transformer positions done.
    done: usize,
}

/// Prompt state of every slot.
pub(crate) struct PromptSlots {
    needed: bool,
    jobs: Vec<Option<Job>>,
    ready: Vec<bool>,
    /// One frame per slot for the slot's Mimi encode.
    pcm: Vec<f32>,
    active: Vec<bool>,
    codes: Vec<u32>,
}

impl PromptSlots {
    pub(crate) fn new(lm: &Lm, mimi: &Mimi, max_slots: usize) -> Self {
        let needed = crate::lm::prefill_headroom(lm.config()) > 0;
        let n = if needed { max_slots } else { 0 };
        PromptSlots {
            needed,
            jobs: (0..max_slots).map(|_| None).collect(),
            ready: vec![!needed; max_slots],
            pcm: vec![0.0; n * mimi.frame_samples()],
            active: vec![false; n],
            codes: vec![0; n * mimi.num_codebooks()],
        }
    }

    pub(crate) fn needed(&self) -> bool {
        self.needed
    }

    pub(crate) fn ready(&self, slot: usize) -> bool {
        self.ready[slot]
    }

    pub(crate) fn reset(&mut self, slot: usize) {
        self.jobs[slot] = None;
        self.ready[slot] = !self.needed;
    }
}

fn params(why: impl Into<String>) -> ModelError {
    ModelError::Params(why.into())
}

/// Checks a replayed voice against the model: embedding width, ring shape
/// and token ranges.
pub fn check_replay(lm: &Lm, r: &Replay) -> Result<(), ModelError> {
    let cfg = lm.config();
    let (k, ct) = (cfg.num_codebooks(), lm.cache_len());
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

impl CpuModel {
    fn check_slot(&self, slot: usize) -> Result<(), ModelError> {
        if slot >= self.prompts.jobs.len() {
            return Err(ModelError::SlotOutOfRange {
                slot,
                max_slots: self.prompts.jobs.len(),
            });
        }
        if !self.prompts.needed {
            return Err(params("this model takes no prompts"));
        }
        Ok(())
    }

    pub(crate) fn begin_prompt_impl(&mut self, slot: usize, p: &Prompt) -> Result<(), ModelError> {
        self.check_slot(slot)?;
        let cfg = self.lm().config();
        if let Some(&t) = p.text_tokens.iter().find(|&&t| t as usize >= cfg.text_card) {
            return Err(params(format!(
                "text prompt token {t} is not below text_card {}",
                cfg.text_card
            )));
        }
        let fs = self.mimi().frame_samples();
        let (pcm, replay) = match &p.voice {
            VoiceInput::None => (None, None),
            VoiceInput::Pcm(a) => {
                if a.is_empty() || a.len() % fs != 0 {
                    return Err(params("the voice audio is not a whole number of frames"));
                }
                (Some(a.clone()), None)
            }
            VoiceInput::Replay(r) => {
                check_replay(self.lm(), r)?;
                (None, Some(r.clone()))
            }
        };
        self.prompts.ready[slot] = false;
        self.prompts.jobs[slot] = Some(Job {
            pcm,
            replay,
            text_tokens: p.text_tokens.clone(),
            encoded: 0,
            codes: Vec::new(),
            sim: None,
            done: 0,
        });
        Ok(())
    }

    pub(crate) fn prompt_chunk_impl(
        &mut self,
        slot: usize,
        max_frames: usize,
    ) -> Result<PromptProgress, ModelError> {
        self.check_slot(slot)?;
        if self.prompts.ready[slot] {
            return Ok(PromptProgress::Done);
        }
        let Some(mut job) = self.prompts.jobs[slot].take() else {
            return Err(params("no prompt was begun for this slot"));
        };
        let mut budget = max_frames.max(1);
        let fs = self.mimi().frame_samples();
        let nq = self.mimi().num_codebooks();
        // (1) Voice frames through the slot's Mimi.
        if let Some(pcm) = job.pcm.clone() {
            let frames = pcm.len() / fs;
            while job.encoded < frames && budget > 0 {
                let f = job.encoded;
                let (mimi, state, p) = self.prompt_parts();
                p.pcm[slot * fs..(slot + 1) * fs].copy_from_slice(&pcm[f * fs..(f + 1) * fs]);
                p.active.fill(false);
                p.active[slot] = true;
                mimi.encode_step(state, &p.pcm, &p.active, &mut p.codes);
                job.codes
                    .extend_from_slice(&p.codes[slot * nq..slot * nq + STREAM_CODEBOOKS]);
                job.encoded += 1;
                budget -= 1;
            }
            if job.encoded < frames {
                let left = frames - job.encoded + job.text_tokens.len() + 12;
                self.prompts.jobs[slot] = Some(job);
                return Ok(PromptProgress::Pending { frames_left: left });
            }
        }
        // (2) The frames and their bookkeeping.
        if job.sim.is_none() {
            let voice = match (&job.pcm, &job.replay) {
                (Some(_), _) => Voice::Codes(std::mem::take(&mut job.codes)),
                (None, Some(r)) => Voice::Replay((**r).clone()),
                (None, None) => Voice::None,
            };
            let lm = self.lm();
            let cfg = lm.config();
            let frames = prefill_frames(voice, &job.text_tokens, cfg.card as u32);
            let initial: Vec<u32> = (0..cfg.num_codebooks())
                .map(|k| {
                    if k == 0 {
                        cfg.text_card as u32
                    } else {
                        cfg.card as u32
                    }
                })
                .collect();
            job.sim = Some(frames.simulate(&cfg.delays, &initial, lm.cache_len()));
        }
        // (3) Transformer positions.
        let sim = job.sim.as_ref().expect("simulated above");
        let total = sim.positions();
        while job.done < total && budget > 0 {
            let n = (total - job.done).min(PREFILL_CHUNK_POSITIONS).min(budget);
            let (lm, state) = self.lm_parts();
            lm.prefill_pass(state, slot, sim, job.replay.as_deref(), job.done, n, None);
            job.done += n;
            budget -= n;
        }
        if job.done < total {
            let left = total - job.done;
            self.prompts.jobs[slot] = Some(job);
            return Ok(PromptProgress::Pending { frames_left: left });
        }
        // (4) The slot's ring; Mimi reset as the server does after the prompt.
        let (lm, state) = self.lm_parts();
        lm.install_prefill(state, slot, sim);
        self.after_prompt(slot);
        Ok(PromptProgress::Done)
    }

    fn after_prompt(&mut self, slot: usize) {
        let (mimi, state) = self.mimi_parts();
        mimi.reset_slot(state, slot);
        self.set_first_frame(slot, false);
        self.prompts.ready[slot] = true;
        self.prompts.jobs[slot] = None;
    }

    pub(crate) fn snapshot_impl(&mut self, slot: usize) -> Result<SlotSnapshot, ModelError> {
        self.check_slot(slot)?;
        if !self.prompts.ready[slot] {
            return Err(params("the slot's prompt has not finished"));
        }
        let (lm, state) = self.lm_parts();
        let snap = lm.snapshot_slot(state, slot);
        Ok(SlotSnapshot {
            bytes: snap.bytes(),
            state: Arc::new(snap),
        })
    }

    pub(crate) fn restore_impl(
        &mut self,
        slot: usize,
        snap: &SlotSnapshot,
    ) -> Result<(), ModelError> {
        self.check_slot(slot)?;
        let s = snap
            .state
            .downcast_ref::<LmSnapshot>()
            .ok_or_else(|| params("a snapshot of another backend"))?;
        let (lm, state) = self.lm_parts();
        lm.restore_slot(state, slot, s);
        self.after_prompt(slot);
        Ok(())
    }
}
