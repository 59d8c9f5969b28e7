//! The float32 CPU backend: Mimi encode → LM step → Mimi decode for every
//! active slot, as the official server chains them for one stream.
//!
//! The first frame of a stream is handled as the official server does: it is
//! encoded and stepped, then the slot's Mimi state is reset, because the
//! first encoded frame carries the encoder's left padding (from the model's
//! point of view that frame is in the past).
//!
//! Invariants: every buffer is made in [`CpuModel::load`] for `max_slots`;
//! [`StreamingModel::step`] allocates nothing. A slot's output frame exists
//! only once the LM has produced tokens for it (after its first `max_delay`
//! steps); until then the decoder does not advance for that slot, as in the
//! official server, which skips decoding while `LMGen.step` returns `None`.

use crate::alloc::AllocError;
use crate::checkpoint::{CheckpointDir, DirError};
use crate::config::ConfigError;
use crate::lm::{Lm, LmState, LmStepOutput};
use crate::mimi::{Mimi, MimiState};
use crate::streaming::{Batch, ModelError, SessionParams, SlotFault, StreamingModel};
use crate::weights::Weights;

/// Mimi + LM on the CPU, for `max_slots` concurrent streams.
pub struct CpuModel {
    mimi: Mimi,
    lm: Lm,
    mimi_state: MimiState,
    lm_state: LmState,
    lm_out: LmStepOutput,
    max_slots: usize,
    /// Encoded input codes, `max_slots × mimi codebooks`.
    codes: Vec<u32>,
    /// User codes fed to the LM, `max_slots × user codebooks`.
    user_codes: Vec<u32>,
    /// Generated codes to decode, `max_slots × mimi codebooks`.
    gen_codes: Vec<u32>,
    encode_active: Vec<bool>,
    decode_active: Vec<bool>,
    eos_codes: Vec<u32>,
    /// Slots that have not stepped since their reset.
    first_frame: Vec<bool>,
    /// Which slots step this time (`exec`, less slots still owing a prompt).
    exec: Vec<bool>,
    /// Prompt work per slot (see `cpu_prompt.rs`).
    pub(crate) prompts: crate::cpu_prompt::PromptSlots,
}

impl CpuModel {
    /// Loads a checkpoint folder for `max_slots` streams.
    pub fn load(dir: &CheckpointDir, max_slots: usize) -> Result<Self, DirError> {
        let nq = dir.mimi_codebooks();
        if dir.lm.dep_q != nq {
            return Err(DirError::Config(ConfigError::BadValue {
                key: "dep_q".into(),
                why: format!(
                    "generated and user codebooks must match for decoding ({} vs {nq})",
                    dir.lm.dep_q
                ),
            }));
        }
        let mut mw = Weights::open(&dir.mimi_weights)?;
        let mimi = Mimi::load(&dir.mimi, &mut mw, nq)?;
        mw.finish()?;
        let mut lw = dir.open_lm_weights()?;
        let lm = Lm::load(&dir.lm, &mut lw)?;
        lw.finish()?;
        Ok(Self::try_from_parts(mimi, lm, max_slots)?)
    }

    /// A backend over already loaded models. Panics when the state's memory
    /// cannot be had (see [`CpuModel::try_from_parts`]).
    pub fn from_parts(mimi: Mimi, lm: Lm, max_slots: usize) -> Self {
        Self::try_from_parts(mimi, lm, max_slots)
            .unwrap_or_else(|e| panic!("CPU model for {max_slots} slots: {e}"))
    }

    /// [`CpuModel::from_parts`], with the caches allocated fallibly.
    pub fn try_from_parts(mimi: Mimi, lm: Lm, max_slots: usize) -> Result<Self, AllocError> {
        let nq = mimi.num_codebooks();
        let n_user = lm.config().num_user_codebooks();
        let mut eos_codes = vec![0; n_user];
        lm.end_of_stream_user_codes(&mut eos_codes);
        Ok(CpuModel {
            mimi_state: mimi.try_new_state(max_slots)?,
            lm_state: lm.try_new_state(max_slots)?,
            lm_out: lm.new_output(max_slots),
            codes: vec![0; max_slots * nq],
            user_codes: vec![0; max_slots * n_user],
            gen_codes: vec![0; max_slots * nq],
            encode_active: vec![false; max_slots],
            decode_active: vec![false; max_slots],
            eos_codes,
            first_frame: vec![true; max_slots],
            exec: vec![false; max_slots],
            prompts: crate::cpu_prompt::PromptSlots::new(&lm, &mimi, max_slots),
            mimi,
            lm,
            max_slots,
        })
    }

    /// The LM.
    pub fn lm(&self) -> &Lm {
        &self.lm
    }

    /// The codec.
    pub fn mimi(&self) -> &Mimi {
        &self.mimi
    }

    pub(crate) fn mimi_parts(&mut self) -> (&Mimi, &mut MimiState) {
        (&self.mimi, &mut self.mimi_state)
    }

    pub(crate) fn prompt_parts(
        &mut self,
    ) -> (&Mimi, &mut MimiState, &mut crate::cpu_prompt::PromptSlots) {
        (&self.mimi, &mut self.mimi_state, &mut self.prompts)
    }

    pub(crate) fn lm_state(&self) -> &LmState {
        &self.lm_state
    }

    pub(crate) fn lm_parts(&mut self) -> (&Lm, &mut LmState) {
        (&self.lm, &mut self.lm_state)
    }

    pub(crate) fn set_first_frame(&mut self, slot: usize, first: bool) {
        self.first_frame[slot] = first;
    }

    /// The text logits of `slot`'s last step (after guidance), as the
    /// sampler saw them; meaningful when the slot stepped.
    pub fn lm_text_logits(&self, slot: usize) -> &[f32] {
        self.lm_out.text_logits(slot)
    }
}

impl StreamingModel for CpuModel {
    fn max_slots(&self) -> usize {
        self.max_slots
    }

    fn frame_samples(&self) -> usize {
        self.mimi.frame_samples()
    }

    fn audio_codebooks(&self) -> usize {
        self.lm.config().dep_q
    }

    fn reset_slot(&mut self, slot: usize, params: &SessionParams) -> Result<(), ModelError> {
        if slot >= self.max_slots {
            return Err(ModelError::SlotOutOfRange {
                slot,
                max_slots: self.max_slots,
            });
        }
        self.lm
            .reset_slot(&mut self.lm_state, slot, &params.gen)
            .map_err(|e| ModelError::Params(e.to_string()))?;
        self.mimi.reset_slot(&mut self.mimi_state, slot);
        self.first_frame[slot] = true;
        self.prompts.reset(slot);
        Ok(())
    }

    fn takes_prompts(&self) -> bool {
        self.prompts.needed()
    }

    fn begin_prompt(
        &mut self,
        slot: usize,
        prompt: &crate::streaming::Prompt,
    ) -> Result<(), ModelError> {
        self.begin_prompt_impl(slot, prompt)
    }

    fn prompt_chunk(
        &mut self,
        slot: usize,
        max_frames: usize,
    ) -> Result<crate::streaming::PromptProgress, ModelError> {
        self.prompt_chunk_impl(slot, max_frames)
    }

    fn prompt_work(&self) -> crate::streaming::PromptWork {
        self.prompts.work
    }

    fn snapshot_bytes(&self, slot: usize) -> Result<usize, ModelError> {
        self.snapshot_bytes_impl(slot)
    }

    fn snapshot_slot(&mut self, slot: usize) -> Result<crate::streaming::SlotSnapshot, ModelError> {
        self.snapshot_impl(slot)
    }

    fn restore_slot(
        &mut self,
        slot: usize,
        snap: &crate::streaming::SlotSnapshot,
    ) -> Result<(), ModelError> {
        self.restore_impl(slot, snap)
    }

    fn step(&mut self, batch: &mut Batch) -> Result<(), ModelError> {
        let fs = self.mimi.frame_samples();
        if batch.max_slots() != self.max_slots || batch.frame_samples() != fs {
            return Err(ModelError::BatchShape(format!(
                "batch of {} slots × {} samples for a model of {} × {fs}",
                batch.max_slots(),
                batch.frame_samples(),
                self.max_slots
            )));
        }
        let nq = self.mimi.num_codebooks();
        let n_user = self.user_codes.len() / self.max_slots.max(1);
        for s in 0..self.max_slots {
            batch.fault[s] = None;
            let owes_prompt = batch.exec[s] && !self.prompts.ready(s);
            if owes_prompt {
                batch.fault[s] = Some(SlotFault::NoPrompt);
                batch.has_output[s] = false;
            }
            self.exec[s] = batch.exec[s] && !owes_prompt;
            self.encode_active[s] = self.exec[s] && !batch.end_of_input[s];
        }
        self.mimi.encode_step(
            &mut self.mimi_state,
            &batch.input_pcm,
            &self.encode_active,
            &mut self.codes,
        );
        for s in 0..self.max_slots {
            if !self.exec[s] {
                continue;
            }
            if std::mem::take(&mut self.first_frame[s]) {
                self.mimi.reset_slot(&mut self.mimi_state, s);
            }
            let user = &mut self.user_codes[s * n_user..(s + 1) * n_user];
            if batch.end_of_input[s] {
                user.copy_from_slice(&self.eos_codes);
            } else {
                user.copy_from_slice(&self.codes[s * nq..s * nq + n_user]);
            }
        }
        self.lm.step(
            &mut self.lm_state,
            &self.user_codes,
            &self.exec,
            &mut self.lm_out,
        );
        for s in 0..self.max_slots {
            if !self.exec[s] {
                if batch.fault[s].is_none() {
                    batch.has_output[s] = false;
                }
                self.decode_active[s] = false;
                continue;
            }
            let ready = self.lm_out.tokens(s).is_some();
            self.decode_active[s] = ready;
            batch.has_output[s] = ready;
            if let Some(t) = self.lm_out.tokens(s) {
                batch.text_token[s] = t[0];
                let audio = &t[1..];
                self.gen_codes[s * nq..s * nq + audio.len()].copy_from_slice(audio);
                let n = batch.audio_codebooks();
                batch.audio_codes[s * n..(s + 1) * n].copy_from_slice(&audio[..n]);
            }
        }
        self.mimi.decode_step(
            &mut self.mimi_state,
            &self.gen_codes,
            &self.decode_active,
            &mut batch.output_pcm,
        );
        for s in 0..self.max_slots {
            if batch.has_output[s]
                && !batch.output_pcm[s * fs..(s + 1) * fs]
                    .iter()
                    .all(|x| x.is_finite())
            {
                batch.fault[s] = Some(SlotFault::NonFinite);
                batch.has_output[s] = false;
            }
        }
        Ok(())
    }
}
