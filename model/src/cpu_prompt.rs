//! Prompt prefills on the CPU backend (PersonaPlex): the CPU's
//! [`PrefillOps`] for the shared [`PromptJob`] stages, and slot snapshots.
//! A snapshot holds the LM state only: after a prompt Mimi is fresh.

use crate::config::LmConfig;
use crate::cpu::CpuModel;
use crate::lm::prefill::{LmSnapshot, Replay, Simulated};
use crate::lm::Lm;
use crate::mimi::Mimi;
use crate::persona::STREAM_CODEBOOKS;
use crate::prompt_job::{PrefillOps, PromptJob};
use crate::streaming::{ModelError, Prompt, PromptProgress, PromptWork, SlotSnapshot};
use std::sync::Arc;

/// Prompt state of every slot.
pub(crate) struct PromptSlots {
    needed: bool,
    jobs: Vec<Option<PromptJob>>,
    ready: Vec<bool>,
    /// One frame per slot for the slot's Mimi encode.
    pub(crate) pcm: Vec<f32>,
    pub(crate) active: Vec<bool>,
    pub(crate) codes: Vec<u32>,
    /// Prompt work done since the model was built.
    pub(crate) work: PromptWork,
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
            work: PromptWork::default(),
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

impl PrefillOps for CpuModel {
    fn lm_config(&self) -> &LmConfig {
        self.lm().config()
    }

    fn frame_samples(&self) -> usize {
        self.mimi().frame_samples()
    }

    fn encode_voice_frame(
        &mut self,
        slot: usize,
        pcm: &[f32],
        codes: &mut [u32],
    ) -> Result<(), ModelError> {
        let fs = pcm.len();
        let (mimi, state, p) = self.prompt_parts();
        let nq = mimi.num_codebooks();
        p.pcm[slot * fs..(slot + 1) * fs].copy_from_slice(pcm);
        p.active.fill(false);
        p.active[slot] = true;
        mimi.encode_step(state, &p.pcm, &p.active, &mut p.codes);
        codes[..STREAM_CODEBOOKS]
            .copy_from_slice(&p.codes[slot * nq..slot * nq + STREAM_CODEBOOKS]);
        p.work.frames += 1;
        Ok(())
    }

    fn prefill_pass(
        &mut self,
        slot: usize,
        sim: &Simulated,
        replay: Option<&Replay>,
        t0: usize,
        n: usize,
    ) -> Result<(), ModelError> {
        let (lm, state) = self.lm_parts();
        lm.prefill_pass(state, slot, sim, replay, t0, n, None);
        self.prompts.work.frames += n as u64;
        self.prompts.work.passes += 1;
        Ok(())
    }

    fn finish_prefill(&mut self, slot: usize, sim: &Simulated) -> Result<(), ModelError> {
        let (lm, state) = self.lm_parts();
        lm.install_prefill(state, slot, sim);
        self.after_prompt(slot);
        Ok(())
    }
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
        let job = PromptJob::new(p, self.lm().config(), self.mimi().frame_samples())?;
        self.prompts.ready[slot] = false;
        self.prompts.jobs[slot] = Some(job);
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
        let progress = job.advance(self, slot, max_frames)?;
        if progress != PromptProgress::Done {
            self.prompts.jobs[slot] = Some(job);
        }
        Ok(progress)
    }

    fn after_prompt(&mut self, slot: usize) {
        let (mimi, state) = self.mimi_parts();
        mimi.reset_slot(state, slot);
        self.set_first_frame(slot, false);
        self.prompts.ready[slot] = true;
        self.prompts.jobs[slot] = None;
    }

    pub(crate) fn snapshot_bytes_impl(&self, slot: usize) -> Result<usize, ModelError> {
        self.check_slot(slot)?;
        Ok(self.lm().snapshot_bytes(self.lm_state(), slot))
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
