//! The engine's only view of a model: [`StreamingModel`] steps a [`Batch`] of
//! slots, one 80 ms frame per slot per step.
//!
//! Invariants: a `Batch` is made once for `max_slots` and reused for every
//! step (nothing in it is resized by a step); a slot's outputs depend only on
//! that slot's inputs since its last reset, never on what else is batched; a
//! slot whose `exec` flag is false does not advance and its outputs are left
//! as they were.

use crate::lm::prefill::Replay;
use crate::lm::GenParams;
use std::sync::Arc;

/// Per-session parameters given when a slot is (re)assigned.
#[derive(Debug, Clone, Default)]
pub struct SessionParams {
    /// Decoding parameters (temperatures, top-k, seed, guidance, conditions).
    pub gen: GenParams,
    /// The session's prompt (models with a prompt prefill; ignored by the
    /// others).
    pub prompt: Prompt,
}

/// Why a step failed for one slot (the others are unaffected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotFault {
    /// The model produced non-finite values for this slot.
    NonFinite,
    /// The model needs a prompt prefill before the slot can step (see
    /// [`StreamingModel::begin_prompt`]); nothing was computed.
    NoPrompt,
}

impl std::fmt::Display for SlotFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotFault::NonFinite => f.write_str("the model produced non-finite values"),
            SlotFault::NoPrompt => f.write_str("the slot's prompt has not been run"),
        }
    }
}

/// A model error that is not about one slot.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A slot index outside `0..max_slots`.
    #[error("slot {slot} out of range (max_slots {max_slots})")]
    SlotOutOfRange {
        /// The slot.
        slot: usize,
        /// The model's capacity.
        max_slots: usize,
    },
    /// Parameters the model cannot use.
    #[error("invalid session parameters: {0}")]
    Params(String),
    /// A batch made for another shape.
    #[error("batch shape mismatch: {0}")]
    BatchShape(String),
    /// The backend's device failed (every slot of the step is affected).
    #[error("device error: {0}")]
    Device(String),
}

/// A session's voice prompt, ready for the model.
#[derive(Debug, Clone, Default)]
pub enum VoiceInput {
    /// No voice prompt.
    #[default]
    None,
    /// 24 kHz audio already normalised and padded to whole frames (a WAV
    /// voice, see [`crate::persona::wav::prepare_voice`]): the model encodes
    /// it with the slot's Mimi.
    Pcm(Arc<[f32]>),
    /// A `.pt` voice's stored embeddings and token ring.
    Replay(Arc<Replay>),
}

/// A session's prompt (models with a prompt prefill: PersonaPlex).
#[derive(Debug, Clone, Default)]
pub struct Prompt {
    /// The voice.
    pub voice: VoiceInput,
    /// The role text's token ids (wrapped and tokenized as the model's
    /// server does).
    pub text_tokens: Vec<u32>,
    /// What identifies this prompt for a cache of prefilled states (equal
    /// keys must mean equal prompts); `None`: never cached.
    pub cache_key: Option<String>,
}

/// Where a slot's prompt stands after [`StreamingModel::prompt_chunk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptProgress {
    /// More work remains: about this many frames (Mimi encodes and
    /// transformer positions).
    Pending {
        /// Frames of work left.
        frames_left: usize,
    },
    /// The prefill is done: the slot steps like the official session after
    /// its prompt (Mimi reset, the handshake may be sent).
    Done,
}

/// A copy of one slot's state after its prompt, from which other slots
/// start (see [`StreamingModel::snapshot_slot`]). Cheap to clone; the
/// backend that made it reads it back.
#[derive(Clone)]
pub struct SlotSnapshot {
    /// The backend's own state.
    pub state: Arc<dyn std::any::Any + Send + Sync>,
    /// Bytes it holds (for the cache's accounting).
    pub bytes: usize,
}

impl std::fmt::Debug for SlotSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SlotSnapshot({} bytes)", self.bytes)
    }
}

fn no_prompts() -> ModelError {
    ModelError::Params("this model takes no prompts".into())
}

/// Inputs and outputs of one step for every slot, allocated once.
#[derive(Debug, Clone)]
pub struct Batch {
    max_slots: usize,
    frame_samples: usize,
    audio_codebooks: usize,
    /// Input PCM, `max_slots × frame_samples`, 24 kHz mono in [-1, 1].
    pub input_pcm: Vec<f32>,
    /// Which slots take a step.
    pub exec: Vec<bool>,
    /// Slots whose input has ended: this step feeds the model's end-of-stream
    /// input instead of `input_pcm` (Hibiki; see `lm::EndOfStream`).
    pub end_of_input: Vec<bool>,
    /// Output PCM, `max_slots × frame_samples`; valid where `has_output`.
    pub output_pcm: Vec<f32>,
    /// Whether the slot produced an output frame this step (the first
    /// `max_delay` steps of a stream produce none).
    pub has_output: Vec<bool>,
    /// The text token generated this step, where `has_output`.
    pub text_token: Vec<u32>,
    /// Generated audio codes, `max_slots × audio_codebooks`, where `has_output`.
    pub audio_codes: Vec<u32>,
    /// A per-slot failure of this step.
    pub fault: Vec<Option<SlotFault>>,
}

impl Batch {
    /// A batch for `max_slots` slots.
    pub fn new(max_slots: usize, frame_samples: usize, audio_codebooks: usize) -> Self {
        Batch {
            max_slots,
            frame_samples,
            audio_codebooks,
            input_pcm: vec![0.0; max_slots * frame_samples],
            exec: vec![false; max_slots],
            end_of_input: vec![false; max_slots],
            output_pcm: vec![0.0; max_slots * frame_samples],
            has_output: vec![false; max_slots],
            text_token: vec![0; max_slots],
            audio_codes: vec![0; max_slots * audio_codebooks],
            fault: vec![None; max_slots],
        }
    }

    /// Slots in the batch.
    pub fn max_slots(&self) -> usize {
        self.max_slots
    }

    /// Samples per frame.
    pub fn frame_samples(&self) -> usize {
        self.frame_samples
    }

    /// Generated audio codebooks per slot.
    pub fn audio_codebooks(&self) -> usize {
        self.audio_codebooks
    }

    /// The input frame of a slot.
    pub fn input_mut(&mut self, slot: usize) -> &mut [f32] {
        let n = self.frame_samples;
        &mut self.input_pcm[slot * n..(slot + 1) * n]
    }

    /// The output frame of a slot.
    pub fn output(&self, slot: usize) -> &[f32] {
        let n = self.frame_samples;
        &self.output_pcm[slot * n..(slot + 1) * n]
    }

    /// The generated audio codes of a slot.
    pub fn codes(&self, slot: usize) -> &[u32] {
        let n = self.audio_codebooks;
        &self.audio_codes[slot * n..(slot + 1) * n]
    }

    /// Number of slots taking a step.
    pub fn active_count(&self) -> usize {
        self.exec.iter().filter(|e| **e).count()
    }
}

/// A model the engine can drive: fixed capacity, per-slot reset, one batched
/// step per frame.
pub trait StreamingModel: Send {
    /// Slots (concurrent streams) the model was built for.
    fn max_slots(&self) -> usize;

    /// Samples per frame (1920 at 24 kHz).
    fn frame_samples(&self) -> usize;

    /// Generated audio codebooks per frame.
    fn audio_codebooks(&self) -> usize;

    /// A batch shaped for this model.
    fn new_batch(&self) -> Batch {
        Batch::new(
            self.max_slots(),
            self.frame_samples(),
            self.audio_codebooks(),
        )
    }

    /// Makes a slot as good as new for a new session.
    fn reset_slot(&mut self, slot: usize, params: &SessionParams) -> Result<(), ModelError>;

    /// Steps every slot whose `exec` flag is set. Must not allocate.
    fn step(&mut self, batch: &mut Batch) -> Result<(), ModelError>;

    /// Moves `slot` (just reset) to where a conversation older than the
    /// model's context is — every later step attending over the whole
    /// window — without running the steps in between, so that timing it
    /// prices the worst case (the engine's warm-up, which admission reads).
    /// The slot's outputs are meaningless until it is reset again. `false`,
    /// and nothing done, where the backend cannot (its warm-up then times
    /// fresh streams).
    fn fill_context_for_timing(&mut self, _slot: usize) -> bool {
        false
    }

    /// Whether every session of this model starts with a prompt prefill
    /// (PersonaPlex). Its slots step only after [`Self::prompt_chunk`]
    /// returned [`PromptProgress::Done`] or [`Self::restore_slot`].
    fn takes_prompts(&self) -> bool {
        false
    }

    /// Starts `slot`'s prompt (after [`Self::reset_slot`]); the work is
    /// done by [`Self::prompt_chunk`]. A prompt the model cannot use is
    /// refused here, the slot left as the reset made it.
    fn begin_prompt(&mut self, slot: usize, prompt: &Prompt) -> Result<(), ModelError> {
        let _ = (slot, prompt);
        Err(no_prompts())
    }

    /// Does at most `max_frames` frames of `slot`'s prompt work (Mimi
    /// encodes of a WAV voice, then transformer positions), so that a tick
    /// of other streams is never held up by a whole prompt.
    fn prompt_chunk(
        &mut self,
        slot: usize,
        max_frames: usize,
    ) -> Result<PromptProgress, ModelError> {
        let _ = (slot, max_frames);
        Err(no_prompts())
    }

    /// A copy of `slot`'s state after its prompt is done.
    fn snapshot_slot(&mut self, slot: usize) -> Result<SlotSnapshot, ModelError> {
        let _ = slot;
        Err(no_prompts())
    }

    /// Gives `slot` (reset with its session's parameters) the state of
    /// `snap`: it then steps exactly like the slot the snapshot was taken
    /// from after its prompt.
    fn restore_slot(&mut self, slot: usize, snap: &SlotSnapshot) -> Result<(), ModelError> {
        let _ = (slot, snap);
        Err(no_prompts())
    }
}
