//! The LM configuration's types (Moshi, Hibiki, PersonaPlex), its derived
//! sizes, and the built-in family presets (Moshi 7B, PersonaPlex 7B).
//!
//! Invariants: the presets are the official loaders' settings key for key and
//! go through [`LmConfig::from_json`] like any file, so they pass the same
//! validation; `personaplex_7b_from` only relabels a Moshi-shaped config.

use super::{bad, read_json, ConfigError, Gating, KvWindow, NormKind, PosEmb};
use serde_json::Value;
use std::path::Path;

/// Which family a checkpoint belongs to; it changes loading and end-of-stream rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelType {
    /// Full-duplex dialogue (moshiko, moshika).
    Moshi,
    /// Simultaneous speech translation.
    Hibiki,
    /// NVIDIA PersonaPlex: the Moshi network steered by a voice prompt and a
    /// text role prompt, with NVIDIA's `LMGen` (forced prefill, user audio
    /// one frame later) and ring KV caches that see `context − 1` keys.
    PersonaPlex,
}

/// A LoRA adapter's settings (moshi-finetune's `config.json` keys).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraConfig {
    /// `lora_rank` (the official loader's default 128 when absent).
    pub rank: usize,
    /// `lora_scaling`, applied as it is (not divided by the rank; default 2.0).
    pub scaling: f32,
}

/// The depformer: the small transformer that predicts codebooks one by one.
#[derive(Debug, Clone, PartialEq)]
pub struct DepformerConfig {
    /// Model width.
    pub dim: usize,
    /// Configured feed-forward width (before the 2/3 of gating); the
    /// official default `int(hidden_scale · depformer_dim)` when the config
    /// gives none (or `null`).
    pub dim_feedforward: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Query heads per key/value head (`depformer_kv_repeat`, which
    /// inherits the temporal `kv_repeat` when absent, as every un-prefixed
    /// transformer key does in the official `LMModel`).
    pub kv_repeat: usize,
    /// Layers.
    pub num_layers: usize,
    /// One input projection per codebook step.
    pub multi_linear: bool,
    /// RoPE period (only used with a rotary `pos_emb`).
    pub max_period: f32,
    /// Feed-forward kind.
    pub gating: Gating,
    /// Positional encoding.
    pub pos_emb: PosEmb,
    /// One weight set per codebook step.
    pub weights_per_step: bool,
    /// Which weight set each step uses (`None`: step i uses set i).
    pub weights_per_step_schedule: Option<Vec<usize>>,
    /// Rank of the factorised depformer embeddings, when used.
    pub low_rank_embeddings: Option<usize>,
    /// The norm before each output head (`depformer_norms.{k}`), if any.
    pub norm: Option<NormKind>,
}

impl DepformerConfig {
    /// Number of distinct weight sets in the per-step layers.
    pub fn num_weight_sets(&self, dep_q: usize) -> usize {
        if !self.weights_per_step {
            1
        } else if let Some(s) = &self.weights_per_step_schedule {
            s.iter().copied().max().map_or(0, |m| m + 1)
        } else {
            dep_q
        }
    }

    /// The weight set used at depformer step `step`.
    pub fn weight_set(&self, step: usize) -> usize {
        if !self.weights_per_step {
            0
        } else if let Some(s) = &self.weights_per_step_schedule {
            s[step]
        } else {
            step
        }
    }
}

/// A lookup-table conditioner (`type: lut`): one learnt vector per possible value.
#[derive(Debug, Clone, PartialEq)]
pub struct LutConditionerConfig {
    /// Name of the condition (e.g. `description`).
    pub name: String,
    /// Embedding rows (`n_bins + 1` rows are stored).
    pub n_bins: usize,
    /// Embedding width.
    pub dim: usize,
    /// Output width after the projection (the LM's `dim`).
    pub output_dim: usize,
    /// The values, in the order that gives their ids.
    pub possible_values: Vec<String>,
}

/// File names a checkpoint folder may override.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointFiles {
    /// LM weights.
    pub lm: String,
    /// Mimi weights.
    pub mimi: String,
    /// SentencePiece model.
    pub tokenizer: String,
    /// Mimi config, when the checkpoint ships one.
    pub mimi_config: Option<String>,
}

impl Default for CheckpointFiles {
    fn default() -> Self {
        CheckpointFiles {
            lm: "model.safetensors".into(),
            mimi: "tokenizer-e351c8d8-checkpoint125.safetensors".into(),
            tokenizer: "tokenizer_spm_32k_3.model".into(),
            mimi_config: None,
        }
    }
}

/// The LM (Moshi or Hibiki) configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct LmConfig {
    /// Moshi or Hibiki.
    pub model_type: ModelType,
    /// Temporal transformer width.
    pub dim: usize,
    /// Text vocabulary size (the embedding has one more row, the "ungenerated" id).
    pub text_card: usize,
    /// The text padding id.
    pub existing_text_padding_id: u32,
    /// Audio codebooks in the token stream (generated + user).
    pub n_q: usize,
    /// Audio codebooks the depformer generates (PersonaPlex: the model's
    /// own 8, although its file stores weight sets for 16 steps).
    pub dep_q: usize,
    /// Depformer steps whose weights the file stores: `dep_q`, except
    /// PersonaPlex (16: steps `dep_q..` predict the user's audio, which the
    /// real input always overwrites, so they are never computed).
    pub dep_q_stored: usize,
    /// What the temporal transformer's ring KV cache shows a query.
    pub kv_window: KvWindow,
    /// A LoRA adapter to merge at load (`lora: true`), with its settings.
    pub lora: Option<LoraConfig>,
    /// Entries per audio codebook.
    pub card: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Query heads per key/value head (grouped-query attention: the
    /// temporal transformer keeps `num_heads / kv_repeat` key/value heads).
    pub kv_repeat: usize,
    /// Layers.
    pub num_layers: usize,
    /// Feed-forward width as a multiple of `dim` (before the 2/3 of gating).
    pub hidden_scale: f64,
    /// Attention context (ring KV cache length) in steps.
    pub context: usize,
    /// RoPE period.
    pub max_period: f32,
    /// The temporal transformer's rotary embedding (`rope` or `rope_concat`).
    pub pos_emb: PosEmb,
    /// Norm kind.
    pub norm: NormKind,
    /// Feed-forward kind.
    pub gating: Gating,
    /// Per-stream delays: text first, then the `n_q` audio codebooks.
    pub delays: Vec<usize>,
    /// Depformer hyper-parameters.
    pub depformer: DepformerConfig,
    /// Lookup-table conditioners.
    pub conditioners: Vec<LutConditionerConfig>,
    /// Conditions summed into the input embedding.
    pub fuser_sum: Vec<String>,
    /// File names.
    pub files: CheckpointFiles,
}

impl LmConfig {
    /// Reads and validates an LM `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_json(&read_json(path)?)
    }

    /// Total number of token streams: text plus `n_q` audio codebooks.
    pub fn num_codebooks(&self) -> usize {
        self.n_q + 1
    }

    /// Audio codebooks that come from the user (the input stream).
    pub fn num_user_codebooks(&self) -> usize {
        self.n_q - self.dep_q
    }

    /// The largest delay.
    pub fn max_delay(&self) -> usize {
        self.delays.iter().copied().max().unwrap_or(0)
    }

    /// Feed-forward hidden width of the temporal transformer.
    pub fn ffn_hidden(&self) -> usize {
        self.gating
            .hidden_dim(self.dim, (self.hidden_scale * self.dim as f64) as usize)
    }

    /// Feed-forward hidden width of the depformer.
    pub fn depformer_ffn_hidden(&self) -> usize {
        self.depformer
            .gating
            .hidden_dim(self.depformer.dim, self.depformer.dim_feedforward)
    }

    /// Width of the temporal transformer's keys (and values) per position:
    /// `num_heads / kv_repeat` heads of `dim / num_heads`.
    pub fn kv_dim(&self) -> usize {
        self.dim / self.kv_repeat
    }

    /// Bytes of KV cache per stream for the temporal transformer at full
    /// context, with `bytes_per_value` per stored number (2 for bf16): keys
    /// and values of `kv_dim` for each layer and position.
    pub fn kv_bytes_per_stream(&self, bytes_per_value: usize) -> usize {
        2 * self.num_layers * self.context * self.kv_dim() * bytes_per_value
    }

    /// Whether classifier-free guidance has something to condition on.
    pub fn has_conditioners(&self) -> bool {
        !self.conditioners.is_empty()
    }

    /// The built-in Moshi 7B configuration (moshiko / moshika ship no
    /// config.json): the official loader's `_lm_kwargs` (moshi 0.2.13,
    /// `moshi/models/loaders.py`), key for key, its depformer feed-forward
    /// `int(4.125 · 1024)` written out.
    pub fn moshi_7b() -> Self {
        Self::from_json(&Self::moshi_7b_json()).expect("the built-in Moshi 7B config is valid")
    }

    fn moshi_7b_json() -> Value {
        serde_json::json!({
            "dim": 4096, "text_card": 32000, "existing_text_padding_id": 3,
            "n_q": 16, "dep_q": 8, "card": 2048, "num_heads": 32, "num_layers": 32,
            "hidden_scale": 4.125, "causal": true, "layer_scale": null, "context": 3000,
            "max_period": 10000, "gating": "silu", "norm": "rms_norm_f32",
            "positional_embedding": "rope", "depformer_dim": 1024,
            "depformer_dim_feedforward": 4224, "depformer_num_heads": 16,
            "depformer_num_layers": 6, "depformer_layer_scale": null,
            "depformer_multi_linear": true, "depformer_context": 8,
            "depformer_max_period": 10000, "depformer_gating": "silu",
            "depformer_pos_emb": "none", "depformer_weights_per_step": true,
            "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]
        })
    }

    /// The built-in PersonaPlex 7B configuration: NVIDIA's loader hard-codes
    /// Moshi 7B's `_lm_kwargs` with `dep_q = 16` (its `config.json` is never
    /// read).
    pub fn personaplex_7b() -> Self {
        let mut v = Self::moshi_7b_json();
        v["dep_q"] = 16.into();
        v["model_type"] = "personaplex".into();
        Self::from_json(&v).expect("the built-in PersonaPlex 7B config is valid")
    }

    /// `base` (a Moshi-shaped config) read as PersonaPlex: its depformer
    /// stores a step per audio codebook (an explicit family setting).
    pub fn personaplex_7b_from(base: &LmConfig) -> Result<Self, ConfigError> {
        if base.n_q != 2 * base.dep_q || base.lora.is_some() {
            return Err(bad(
                "model_type",
                "only a Moshi-shaped LM without LoRA (n_q = 2 · dep_q) can be read as PersonaPlex",
            ));
        }
        let mut c = base.clone();
        c.model_type = ModelType::PersonaPlex;
        c.dep_q_stored = c.n_q;
        c.kv_window = KvWindow::ContextMinusOne;
        Ok(c)
    }

    /// Attention window of the temporal transformer in steps (the current
    /// one included): `context`, one less for [`KvWindow::ContextMinusOne`].
    pub fn attention_window(&self) -> usize {
        self.kv_window.window(self.context)
    }
}
