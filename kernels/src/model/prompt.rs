//! Prompt prefills on the CUDA backend (PersonaPlex): the device's
//! [`PrefillOps`] for the shared [`PromptJob`] stages (voice frames through
//! the slot's Mimi as a one-step bucket, prefill passes, the ring), and
//! slot snapshots (LM state copied into the device's snapshot arena, see
//! [`super::arena`]; Mimi is fresh after a prompt).
//!
//! Invariants: prompt work runs between steps, never inside a captured
//! graph; it touches only its slot's state.

use super::arena::SnapshotArena;
use super::lm::prefill::GpuLmSnapshot;
use super::streaming::GpuModel;
use super::GpuError;
use crate::device::{as_bytes, as_bytes_mut, DevPtr, Device, NULL};
use crate::ops::types::SlotStep;
use moshid_model::config::LmConfig;
use moshid_model::lm::prefill::{Replay, Simulated};
use moshid_model::persona::STREAM_CODEBOOKS;
use moshid_model::prompt_job::{PrefillOps, PromptJob};
use moshid_model::streaming::{ModelError, Prompt, PromptProgress, PromptWork, SlotSnapshot};
use std::sync::Arc;

/// Prompt state of every slot and the voice encode's device buffers.
pub(super) struct GpuPrompts {
    needed: bool,
    jobs: Vec<Option<PromptJob>>,
    ready: Vec<bool>,
    /// `SlotStep[1]`, one frame of PCM, its codes.
    steps: DevPtr,
    pcm: DevPtr,
    codes: DevPtr,
    host_codes: Vec<u32>,
    /// Where snapshots live (empty for a model without prompts).
    arena: Arc<SnapshotArena>,
    /// Prompt work done since the model was built.
    pub(super) work: PromptWork,
}

impl GpuPrompts {
    pub(super) fn new<D: Device + ?Sized>(
        dev: &mut D,
        cfg: &LmConfig,
        frame_samples: usize,
        nq: usize,
        max_slots: usize,
        cache_bytes: usize,
    ) -> Result<Self, GpuError> {
        let needed = moshid_model::lm::prefill_headroom(cfg) > 0;
        let arena = SnapshotArena::new(dev, if needed { cache_bytes } else { 0 })?;
        let (steps, pcm, codes) = if needed {
            (
                dev.alloc(std::mem::size_of::<SlotStep>())?,
                dev.alloc(frame_samples * 4)?,
                dev.alloc(nq * 4)?,
            )
        } else {
            (NULL, NULL, NULL)
        };
        Ok(GpuPrompts {
            needed,
            jobs: (0..max_slots).map(|_| None).collect(),
            ready: vec![!needed; max_slots],
            steps,
            pcm,
            codes,
            host_codes: vec![0; nq],
            arena,
            work: PromptWork::default(),
        })
    }

    pub(super) fn needed(&self) -> bool {
        self.needed
    }

    pub(super) fn ready(&self, slot: usize) -> bool {
        self.ready[slot]
    }

    pub(super) fn reset(&mut self, slot: usize) {
        self.jobs[slot] = None;
        self.ready[slot] = !self.needed;
    }
}

fn device(e: impl std::fmt::Display) -> ModelError {
    ModelError::Device(e.to_string())
}

fn params(why: impl Into<String>) -> ModelError {
    ModelError::Params(why.into())
}

impl<D: Device> PrefillOps for GpuModel<D> {
    fn lm_config(&self) -> &LmConfig {
        self.lm.config()
    }

    fn frame_samples(&self) -> usize {
        self.frame_samples
    }

    fn encode_voice_frame(
        &mut self,
        slot: usize,
        pcm: &[f32],
        codes: &mut [u32],
    ) -> Result<(), ModelError> {
        let p = &mut self.prompts;
        let step = SlotStep {
            slot: slot as i32,
            active: 1,
            row_cond: 0,
            row_null: -1,
        };
        let dev = &mut self.dev;
        dev.upload(p.steps, as_bytes(&[step])).map_err(device)?;
        dev.upload(p.pcm, as_bytes(pcm)).map_err(device)?;
        self.mimi
            .encode(dev, 1, p.steps, p.pcm, p.codes, self.nq)
            .map_err(device)?;
        dev.download(p.codes, as_bytes_mut(&mut p.host_codes))
            .map_err(device)?;
        codes[..STREAM_CODEBOOKS].copy_from_slice(&p.host_codes[..STREAM_CODEBOOKS]);
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
        self.lm
            .prefill_pass(&mut self.dev, &self.k, slot, sim, replay, t0, n)
            .map_err(device)?;
        self.prompts.work.frames += n as u64;
        self.prompts.work.passes += 1;
        Ok(())
    }

    fn finish_prefill(&mut self, slot: usize, sim: &Simulated) -> Result<(), ModelError> {
        self.lm
            .install_prefill(&mut self.dev, slot, sim)
            .map_err(device)?;
        self.after_prompt(slot, sim.positions())
    }
}

impl<D: Device> GpuModel<D> {
    fn check_prompt_slot(&self, slot: usize) -> Result<(), ModelError> {
        if slot >= self.max_slots {
            return Err(ModelError::SlotOutOfRange {
                slot,
                max_slots: self.max_slots,
            });
        }
        if !self.prompts.needed {
            return Err(params("this model takes no prompts"));
        }
        Ok(())
    }

    fn after_prompt(&mut self, slot: usize, offset: usize) -> Result<(), ModelError> {
        self.mimi.reset_slot(&mut self.dev, slot).map_err(device)?;
        self.dev.synchronize().map_err(device)?;
        self.offset[slot] = offset;
        self.first_frame[slot] = false;
        self.prompts.ready[slot] = true;
        self.prompts.jobs[slot] = None;
        Ok(())
    }

    pub(super) fn begin_prompt_impl(&mut self, slot: usize, p: &Prompt) -> Result<(), ModelError> {
        self.check_prompt_slot(slot)?;
        let job = PromptJob::new(p, self.lm.config(), self.frame_samples)?;
        self.prompts.ready[slot] = false;
        self.prompts.jobs[slot] = Some(job);
        Ok(())
    }

    pub(super) fn prompt_chunk_impl(
        &mut self,
        slot: usize,
        max_frames: usize,
    ) -> Result<PromptProgress, ModelError> {
        self.check_prompt_slot(slot)?;
        if self.prompts.ready[slot] {
            return Ok(PromptProgress::Done);
        }
        let Some(mut job) = self.prompts.jobs[slot].take() else {
            return Err(params("no prompt was begun for this slot"));
        };
        let progress = job.advance(self, slot, max_frames)?;
        self.dev.synchronize().map_err(device)?;
        if progress != PromptProgress::Done {
            self.prompts.jobs[slot] = Some(job);
        }
        Ok(progress)
    }

    pub(super) fn snapshot_bytes_impl(&self, slot: usize) -> Result<usize, ModelError> {
        self.check_prompt_slot(slot)?;
        Ok(self.lm.snapshot_bytes(self.offset[slot]))
    }

    pub(super) fn snapshot_impl(&mut self, slot: usize) -> Result<SlotSnapshot, ModelError> {
        self.check_prompt_slot(slot)?;
        if !self.prompts.ready[slot] {
            return Err(params("the slot's prompt has not finished"));
        }
        let snap = self
            .lm
            .snapshot_slot(&mut self.dev, &self.prompts.arena, slot, self.offset[slot])
            .map_err(device)?
            .ok_or_else(|| {
                params(format!(
                    "the snapshot memory ({} MiB) has no room for this prompt's {} MiB",
                    self.prompts.arena.bytes() >> 20,
                    self.lm.snapshot_bytes(self.offset[slot]).div_ceil(1 << 20)
                ))
            })?;
        Ok(SlotSnapshot {
            bytes: snap.bytes(),
            state: Arc::new(snap),
        })
    }

    pub(super) fn restore_impl(
        &mut self,
        slot: usize,
        snap: &SlotSnapshot,
    ) -> Result<(), ModelError> {
        self.check_prompt_slot(slot)?;
        let s = snap
            .state
            .downcast_ref::<GpuLmSnapshot>()
            .ok_or_else(|| params("a snapshot of another backend"))?;
        if !s.is_in(&self.prompts.arena) {
            return Err(params("a snapshot of another model"));
        }
        self.lm
            .restore_slot(&mut self.dev, slot, s)
            .map_err(device)?;
        self.after_prompt(slot, s.offset)
    }
}
