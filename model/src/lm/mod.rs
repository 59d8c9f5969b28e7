//! The Moshi/Hibiki LM step on the CPU in float32, batched over independent
//! streams ("slots"): the temporal transformer, the depformer and the
//! streaming semantics of the official `LMGen.step` (moshi 0.2.13).
//!
//! One call to [`Lm::step`] advances every active slot by one frame (80 ms):
//! it writes the slot's user codes into its delayed token cache, embeds the
//! tokens due at this offset (initial tokens while `offset <= delay`), runs the
//! temporal transformer, samples the text token, runs the depformer codebook
//! by codebook, writes the new tokens into the cache and, once the slot has run
//! more than `max_delay` steps, reads back the undelayed frame
//! (`offset − max_delay + delay[k]`) as [`LmStepOutput::tokens`].
//!
//! Invariants:
//! - slots are independent: a slot's outputs depend only on its own inputs,
//!   parameters and seed, never on which other slots share the batch (every
//!   per-row computation reads only its own row, caches and RNG);
//! - every linear layer runs once per step over the gathered rows of all
//!   active slots (two rows for a slot with classifier-free guidance);
//! - an inactive slot is not computed and its state is untouched;
//! - [`Lm::step`] does not allocate: [`Lm::new_state`] sizes every cache and
//!   scratch buffer for `max_slots`;
//! - a slot reset with [`Lm::reset_slot`] behaves exactly like a slot of a
//!   fresh state (its offset, token cache, RNG and condition rows are
//!   rewritten; old KV entries are never read because attention only reads
//!   positions written since the reset).
//!
//! Differences from the official code, all deliberate: the official `LMGen`
//! keeps one batch-wide `offset_cpu` and returns `None` for the *whole batch*
//! during the `max_delay` steps after *any* slot reset; here only the reset
//! slot has no output during its own first `max_delay` steps. Sampling uses a
//! per-slot xoshiro256++ generator instead of torch's (same distribution, not
//! the same draws); greedy decoding is exact.
//!
//! Starting and ending a stream as `run_inference.py` does (the daemon's part):
//! the official script steps the *first* frame twice (otherwise the delay-0
//! user codebook of frame 0 is replaced by the initial token), and a Hibiki
//! stream is drained at end of input as described by [`EndOfStream`].

mod conditioner;
mod depformer;
mod embeddings;
mod gen;
mod linear;
pub mod prefill;
/// The linear kernel, for the host probe ([`crate::probe`]).
pub(crate) use linear::linear;
mod sampling;
mod setup;
pub mod text_rules;
mod transformer;

/// Tensors of the norm before depformer head `k` (`depformer_norms.{k}`).
pub use depformer::head_norm_specs as depformer_head_norm_specs;
/// `depformer_in` index of each depformer step, and how many projections exist.
pub use depformer::in_indices as depformer_in_indices;
/// The depformer stack's shape for a config.
pub use depformer::stack_shape as depformer_shape;
pub use gen::LmState;
pub use sampling::{sample_top_k, slot_rng, Sampler, SlotRng};
pub use setup::{Conditioning, SlotSetup};
/// Hidden width of an official `ActivationGating` (note the `4 · dim` case).
pub use transformer::gating_hidden;
pub use transformer::StackShape;

use crate::config::{LmConfig, ModelType};
use crate::weights::{CheckpointError, TensorSpec, Weights};
use depformer::Depformer;
use embeddings::Embedding;
use transformer::Stack;

/// Generation parameters of one slot. Defaults are the official `LMGen`
/// defaults (sampling on, temperatures 0.8 / 0.7, top-k 250 / 25, no CFG).
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// Sample (true) or decode greedily (false).
    pub use_sampling: bool,
    /// Audio temperature (≤ 0: greedy).
    pub temp: f32,
    /// Text temperature (≤ 0: greedy).
    pub temp_text: f32,
    /// Audio top-k (0: no limit).
    pub top_k: usize,
    /// Text top-k (0: no limit).
    pub top_k_text: usize,
    /// Seed of the slot's random generator.
    pub seed: u64,
    /// Classifier-free guidance coefficient; 1 disables guidance. Another
    /// value runs a second (null-condition) row for the slot and mixes the
    /// logits as `null + (cond − null) · cfg_coef`.
    pub cfg_coef: f32,
    /// `(conditioner, value)` pairs for the conditioned row. A conditioner
    /// not named uses its learnt padding (the official `None` value).
    pub conditions: Vec<(String, String)>,
    /// `(conditioner, value)` pairs for the guidance (null) row, used when
    /// `cfg_coef != 1`; unnamed conditioners use their learnt padding.
    pub null_conditions: Vec<(String, String)>,
    /// Kyutai's `pad_mult`: the text padding token's probability is
    /// multiplied by `exp(pad_mult)` (0: off; see [`text_rules`]).
    pub pad_mult: f32,
    /// Kyutai's repetition penalty `(context, penalty)` on text tokens.
    pub repetition_penalty: Option<(usize, f32)>,
}

impl Default for GenParams {
    fn default() -> Self {
        GenParams {
            use_sampling: true,
            temp: 0.8,
            temp_text: 0.7,
            top_k: 250,
            top_k_text: 25,
            seed: 0,
            cfg_coef: 1.0,
            conditions: Vec::new(),
            null_conditions: Vec::new(),
            pad_mult: 0.0,
            repetition_penalty: None,
        }
    }
}

impl GenParams {
    /// Greedy decoding (argmax), otherwise the defaults.
    pub fn greedy() -> Self {
        GenParams {
            use_sampling: false,
            ..Self::default()
        }
    }

    /// The conditions `run_inference.py` gives Hibiki: `description =
    /// very_good`, and `very_bad` for the guidance row, with `cfg_coef`.
    pub fn with_hibiki_conditions(mut self, cfg_coef: f32) -> Self {
        self.cfg_coef = cfg_coef;
        self.conditions = vec![("description".into(), "very_good".into())];
        self.null_conditions = vec![("description".into(), "very_bad".into())];
        self
    }
}

/// Parameters a slot cannot run with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParamError {
    /// The slot index is outside the state.
    #[error("slot {slot} does not exist (the state has {max_slots} slots)")]
    NoSuchSlot {
        /// The slot asked for.
        slot: usize,
        /// Slots in the state.
        max_slots: usize,
    },
    /// A condition names no conditioner of the model.
    #[error("unknown condition `{0}` (the model's conditioners: {1:?})")]
    UnknownCondition(String, Vec<String>),
    /// A condition is given twice.
    #[error("condition `{0}` is given more than once")]
    DuplicateCondition(String),
    /// A condition value the conditioner does not know.
    #[error("condition `{condition}` has no value `{value}` (allowed: {allowed:?})")]
    UnknownConditionValue {
        /// The conditioner.
        condition: String,
        /// The value given.
        value: String,
        /// The values it knows.
        allowed: Vec<String>,
    },
    /// Guidance asked of a model without conditioners.
    #[error("cfg_coef {0} needs a model with conditioners; this one has none")]
    CfgWithoutConditioners(f32),
    /// A number that is NaN or infinite.
    #[error("parameter `{0}` must be finite, got {1}")]
    NotFinite(&'static str, f32),
    /// A value outside what the parameter allows.
    #[error("parameter `{0}`: {1}")]
    OutOfRange(&'static str, String),
}

/// How a stream ends, following `run_inference.py`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndOfStream {
    /// Moshi: the stream ends with its input; nothing is fed after the last frame.
    WithInput,
    /// Hibiki: after the last input frame, feed ONE frame whose user codes are
    /// all `eos_user_code` (the audio "initial" id, i.e. Mimi's cardinality),
    /// then frames of Mimi-encoded silence (the same Mimi encoder stream fed
    /// 1920 zero samples per frame), until the output text token is
    /// `text_eos_id` (`</s>`); that frame is still emitted, then the stream
    /// ends. A `text_eos_id` output before the end-of-stream frame was fed is
    /// "sampled too early": the official code warns and carries on. The
    /// official loop has no bound; the daemon should cap the drain.
    DrainUntilText {
        /// The value of every user codebook in the end-of-stream frame.
        eos_user_code: u32,
        /// The text token that ends the stream.
        text_eos_id: u32,
    },
}

/// How a stream of a model of `cfg` ends (see [`EndOfStream`]), whatever
/// backend runs it.
pub fn end_of_stream_of(cfg: &LmConfig) -> EndOfStream {
    match cfg.model_type {
        ModelType::Moshi | ModelType::PersonaPlex => EndOfStream::WithInput,
        ModelType::Hibiki => EndOfStream::DrainUntilText {
            eos_user_code: cfg.card as u32,
            text_eos_id: HIBIKI_TEXT_EOS as u32,
        },
    }
}

/// The text id the Hibiki loader treats as end of text: it copies the
/// padding row (3) over this row of `text_emb` after loading.
const HIBIKI_TEXT_EOS: usize = 2;
const HIBIKI_TEXT_PAD: usize = 3;

/// The LM: weights and configuration, immutable after [`Lm::load`].
pub struct Lm {
    cfg: LmConfig,
    emb: Vec<Embedding>,
    text_emb: Embedding,
    temporal: Stack,
    out_norm: Vec<f32>,
    text_linear: Vec<f32>,
    depformer: Depformer,
    /// Conditioners in the fuser's `sum` order.
    conditioning: Conditioning,
}

/// Extra ring KV entries of a model with a prompt prefill beyond its
/// `context`, so that a chunk of up to this many prefill positions can run
/// in one causal pass without overwriting keys its first queries still see.
pub fn prefill_headroom(cfg: &LmConfig) -> usize {
    if cfg.model_type == ModelType::PersonaPlex {
        PREFILL_CHUNK_POSITIONS
    } else {
        0
    }
}

/// The most prefill positions one causal pass runs (a prompt longer than
/// this runs in several passes, with the same results).
pub const PREFILL_CHUNK_POSITIONS: usize = 32;

/// The temporal transformer's shape for `cfg`.
pub fn temporal_shape(cfg: &LmConfig) -> StackShape {
    StackShape {
        dim: cfg.dim,
        heads: cfg.num_heads,
        kv_heads: cfg.num_heads / cfg.kv_repeat,
        layers: cfg.num_layers,
        hidden: cfg.ffn_hidden(),
        sets: 1,
        gating_list: false,
        capacity: cfg.context + prefill_headroom(cfg),
        context: cfg.attention_window(),
        rope: cfg.pos_emb.rope(cfg.max_period),
        eps: cfg.norm.eps(),
    }
}

impl Lm {
    /// Every tensor the checkpoint must hold (split attention names).
    pub fn tensor_specs(cfg: &LmConfig) -> Vec<TensorSpec> {
        let mut out = Self::tensor_specs_used(cfg);
        out.extend(Self::tensor_specs_unused(cfg));
        out
    }

    /// The tensors a checkpoint stores but the model never computes
    /// (PersonaPlex's depformer steps for the user's audio).
    pub fn tensor_specs_unused(cfg: &LmConfig) -> Vec<TensorSpec> {
        depformer::unused_step_specs(cfg)
    }

    /// The tensors the model reads.
    pub fn tensor_specs_used(cfg: &LmConfig) -> Vec<TensorSpec> {
        let mut out = Vec::new();
        for k in 0..cfg.n_q {
            Embedding::specs(&format!("emb.{k}"), cfg.card + 1, cfg.dim, None, &mut out);
        }
        Embedding::specs("text_emb", cfg.text_card + 1, cfg.dim, None, &mut out);
        Stack::specs("transformer", &temporal_shape(cfg), &mut out);
        out.push(TensorSpec::new("out_norm.alpha", &[1, 1, cfg.dim]));
        out.push(TensorSpec::new(
            "text_linear.weight",
            &[cfg.text_card, cfg.dim],
        ));
        Depformer::specs(cfg, &mut out);
        Conditioning::specs(cfg, &mut out);
        out
    }

    /// Loads the weights (converting to float32) and applies the official
    /// loader rules (Hibiki: `text_emb` row 3 copied over row 2).
    pub fn load(cfg: &LmConfig, weights: &mut Weights) -> Result<Lm, CheckpointError> {
        let emb = (0..cfg.n_q)
            .map(|k| Embedding::load(weights, &format!("emb.{k}"), cfg.card + 1, cfg.dim, None))
            .collect::<Result<Vec<_>, _>>()?;
        let mut text_emb = Embedding::load(weights, "text_emb", cfg.text_card + 1, cfg.dim, None)?;
        if cfg.model_type == ModelType::Hibiki && text_emb.rows() > HIBIKI_TEXT_PAD {
            let pad = text_emb.row(HIBIKI_TEXT_PAD as u32).to_vec();
            text_emb.row_mut(HIBIKI_TEXT_EOS).copy_from_slice(&pad);
        }
        let temporal = Stack::load(weights, "transformer", temporal_shape(cfg))?;
        let out_norm = weights.take("out_norm.alpha", &[1, 1, cfg.dim])?;
        let text_linear = weights.take("text_linear.weight", &[cfg.text_card, cfg.dim])?;
        let depformer = Depformer::load(cfg, weights)?;
        for spec in depformer::unused_step_specs(cfg) {
            weights.skip(&spec.name, &spec.shape)?;
        }
        let conditioning = Conditioning::load(cfg, weights)?;
        Ok(Lm {
            cfg: cfg.clone(),
            emb,
            text_emb,
            temporal,
            out_norm,
            text_linear,
            depformer,
            conditioning,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LmConfig {
        &self.cfg
    }

    /// How a stream of this model ends (see [`EndOfStream`]).
    pub fn end_of_stream(&self) -> EndOfStream {
        end_of_stream_of(&self.cfg)
    }

    /// Fills `out` (`num_user_codebooks` values) with the user codes of the
    /// end-of-stream frame (every codebook = `card`, the official
    /// `mimi.cardinality`). Meaningful for Hibiki (see [`EndOfStream`]).
    pub fn end_of_stream_user_codes(&self, out: &mut [u32]) {
        out.fill(self.cfg.card as u32);
    }

    /// An output buffer for a state of `max_slots` slots.
    pub fn new_output(&self, max_slots: usize) -> LmStepOutput {
        LmStepOutput::new(&self.cfg, max_slots)
    }
}

/// What one [`Lm::step`] produced, per slot; allocated once.
#[derive(Debug, Clone)]
pub struct LmStepOutput {
    max_slots: usize,
    width: usize,
    text_card: usize,
    stepped: Vec<bool>,
    ready: Vec<bool>,
    tokens: Vec<u32>,
    text_logits: Vec<f32>,
}

impl LmStepOutput {
    /// Buffers for `max_slots` slots of a model.
    pub fn new(cfg: &LmConfig, max_slots: usize) -> Self {
        let width = 1 + cfg.dep_q;
        LmStepOutput {
            max_slots,
            width,
            text_card: cfg.text_card,
            stepped: vec![false; max_slots],
            ready: vec![false; max_slots],
            tokens: vec![0; max_slots * width],
            text_logits: vec![0.0; max_slots * cfg.text_card],
        }
    }

    /// Slots the buffers are sized for.
    pub fn max_slots(&self) -> usize {
        self.max_slots
    }

    /// Whether the slot ran in the last step.
    pub fn stepped(&self, slot: usize) -> bool {
        self.stepped[slot]
    }

    /// The slot's undelayed frame: the text token then the `dep_q` audio
    /// codes; `None` when the slot did not run or during its first
    /// `max_delay` steps (where the official `LMGen.step` returns `None`).
    pub fn tokens(&self, slot: usize) -> Option<&[u32]> {
        (self.stepped[slot] && self.ready[slot])
            .then(|| &self.tokens[slot * self.width..(slot + 1) * self.width])
    }

    /// The text token of [`tokens`](Self::tokens).
    pub fn text_token(&self, slot: usize) -> Option<u32> {
        self.tokens(slot).map(|t| t[0])
    }

    /// The audio codes of [`tokens`](Self::tokens).
    pub fn audio_codes(&self, slot: usize) -> Option<&[u32]> {
        self.tokens(slot).map(|t| &t[1..])
    }

    /// The text logits of the slot's last step (after guidance; what the
    /// text token of *this* step was sampled from, before the delay).
    /// Meaningful only if [`stepped`](Self::stepped).
    pub fn text_logits(&self, slot: usize) -> &[f32] {
        &self.text_logits[slot * self.text_card..(slot + 1) * self.text_card]
    }
}

#[cfg(test)]
mod tests;
