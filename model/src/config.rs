//! Model configurations: the official LM `config.json` and Mimi config key
//! sets, parsed strictly.
//!
//! Invariants: a parsed config has been validated as a whole (dimensions
//! divide, lengths agree, every value is one this implementation computes
//! exactly). A key we do not know, or a value we would have to guess the
//! meaning of, is refused with an error that names the key. Keys that only
//! name files or carry generation defaults are kept or ignored, never refused.
//! An absent key means what it means to the official code (moshi 0.2.13):
//! the `LMModel` / `StreamingTransformer` default, and for a `depformer_*`
//! transformer key the temporal key it inherits (see [`LmConfig::from_json`]).

use serde_json::{Map, Value};
use std::path::Path;

/// A configuration that cannot be used, with the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The text is not JSON.
    #[error("{path}: not valid JSON: {source}")]
    Json {
        /// The file.
        path: String,
        /// The cause.
        source: serde_json::Error,
    },
    /// A key that this implementation does not know.
    #[error("unknown key `{0}`")]
    UnknownKey(String),
    /// A required key is absent.
    #[error("missing key `{0}`")]
    MissingKey(String),
    /// A key whose value is of the wrong type or outside what is supported.
    #[error("key `{key}`: {why}")]
    BadValue {
        /// The key (dotted path for nested keys).
        key: String,
        /// What is wrong with it.
        why: String,
    },
}

fn bad(key: &str, why: impl Into<String>) -> ConfigError {
    ConfigError::BadValue {
        key: key.to_string(),
        why: why.into(),
    }
}

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

/// What a streaming attention's ring KV cache shows a query once the ring
/// is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvWindow {
    /// Kyutai's `RingKVCache` (moshi 0.2.13): the last `context` keys.
    #[default]
    Context,
    /// NVIDIA's fork (PersonaPlex): the slot the next write will overwrite
    /// is labelled as a future position, so a query sees `context − 1` keys
    /// (all keys at positions ≥ `end − context + 1`, `end` counting the keys
    /// written so far, the current call's included).
    ContextMinusOne,
}

/// A LoRA adapter's settings (moshi-finetune's `config.json` keys).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraConfig {
    /// `lora_rank` (the official loader's default 128 when absent).
    pub rank: usize,
    /// `lora_scaling`, applied as it is (not divided by the rank; default 2.0).
    pub scaling: f32,
}

/// Normalisation layers the official code offers and we compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// RMSNorm with eps 1e-8, computed in float32.
    RmsNormF32,
    /// RMSNorm with eps 1e-5.
    RmsNorm,
    /// LayerNorm with eps 1e-5, affine (weight and bias).
    LayerNorm,
    /// LayerNorm with eps 1e-8 computed in float32 (`LayerNormF32`), affine.
    LayerNormF32,
}

impl NormKind {
    fn parse(key: &str, v: &str) -> Result<Self, ConfigError> {
        Ok(match v {
            "rms_norm_f32" => NormKind::RmsNormF32,
            "rms_norm" => NormKind::RmsNorm,
            "layer_norm" => NormKind::LayerNorm,
            "layer_norm_f32" => NormKind::LayerNormF32,
            other => return Err(bad(key, format!("unsupported norm `{other}`"))),
        })
    }

    /// The epsilon the official implementation uses for this norm.
    pub fn eps(self) -> f32 {
        match self {
            NormKind::RmsNormF32 | NormKind::LayerNormF32 => 1e-8,
            NormKind::RmsNorm | NormKind::LayerNorm => 1e-5,
        }
    }

    /// Whether the norm is a LayerNorm (weight and bias) rather than an
    /// RMSNorm (`alpha`).
    pub fn is_layer_norm(self) -> bool {
        matches!(self, NormKind::LayerNorm | NormKind::LayerNormF32)
    }
}

/// Feed-forward block kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// Plain two-layer MLP with GELU (Mimi's transformers).
    None,
    /// SiLU-gated linear unit (the LMs).
    Silu,
}

impl Gating {
    fn parse(key: &str, v: &str) -> Result<Self, ConfigError> {
        Ok(match v {
            "none" => Gating::None,
            "silu" => Gating::Silu,
            other => return Err(bad(key, format!("unsupported gating `{other}`"))),
        })
    }

    /// Hidden width of the feed-forward block of a layer of width `dim` for a
    /// configured `dim_feedforward`. Gated blocks follow the official
    /// `ActivationGating`: `21 · dim / 8` when `dim_feedforward` is exactly
    /// `4 · dim`, two thirds of it otherwise.
    pub fn hidden_dim(self, dim: usize, dim_feedforward: usize) -> usize {
        match self {
            Gating::None => dim_feedforward,
            Gating::Silu if dim_feedforward == 4 * dim => 21 * dim / 8,
            Gating::Silu => 2 * dim_feedforward / 3,
        }
    }
}

/// Positional encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PosEmb {
    /// No positional information.
    None,
    /// Rotary embedding over interleaved pairs (`[r0, i0, r1, i1, …]`).
    Rope,
    /// Rotary embedding over the two halves of each head (`[r…, i…]`, the
    /// official `rope_concat`, `RotaryEmbedding(interleave=False)`).
    RopeConcat,
}

impl PosEmb {
    fn parse(key: &str, v: &str) -> Result<Self, ConfigError> {
        Ok(match v {
            "none" => PosEmb::None,
            "rope" => PosEmb::Rope,
            "rope_concat" => PosEmb::RopeConcat,
            other => {
                return Err(bad(
                    key,
                    format!("unsupported positional embedding `{other}`"),
                ))
            }
        })
    }

    /// The rotary embedding this encoding applies with `period`, if any.
    pub fn rope(self, period: f32) -> Option<Rope> {
        match self {
            PosEmb::None => None,
            PosEmb::Rope => Some(Rope {
                period,
                interleaved: true,
            }),
            PosEmb::RopeConcat => Some(Rope {
                period,
                interleaved: false,
            }),
        }
    }
}

/// A rotary positional embedding as a transformer stack applies it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    /// `max_period` of the rotation frequencies.
    pub period: f32,
    /// Pairs `(2i, 2i + 1)` of each head (`rope`), or `(i, i + head_dim/2)`
    /// (`rope_concat`).
    pub interleaved: bool,
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

/// Keys that only carry information irrelevant to the computation.
const LM_INERT_KEYS: &[&str] = &["lm_gen_config", "model_id", "stt_config", "tts_config"];

fn obj<'a>(v: &'a Value, key: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    v.as_object().ok_or_else(|| bad(key, "expected an object"))
}

/// A JSON object read key by key; `finish` refuses what was not read.
struct Reader<'a> {
    prefix: String,
    map: &'a Map<String, Value>,
    seen: Vec<&'a str>,
}

impl<'a> Reader<'a> {
    fn new(prefix: &str, map: &'a Map<String, Value>) -> Self {
        Reader {
            prefix: prefix.to_string(),
            map,
            seen: Vec::new(),
        }
    }

    fn key(&self, k: &str) -> String {
        if self.prefix.is_empty() {
            k.to_string()
        } else {
            format!("{}.{k}", self.prefix)
        }
    }

    fn get(&mut self, k: &str) -> Option<&'a Value> {
        let (name, v) = self.map.get_key_value(k)?;
        self.seen.push(name.as_str());
        if v.is_null() {
            None
        } else {
            Some(v)
        }
    }

    fn req(&mut self, k: &str) -> Result<&'a Value, ConfigError> {
        self.get(k)
            .ok_or_else(|| ConfigError::MissingKey(self.key(k)))
    }

    fn usize(&mut self, k: &str) -> Result<usize, ConfigError> {
        let key = self.key(k);
        self.req(k)?
            .as_u64()
            .map(|x| x as usize)
            .ok_or_else(|| bad(&key, "expected a non-negative integer"))
    }

    fn opt_usize(&mut self, k: &str) -> Result<Option<usize>, ConfigError> {
        let key = self.key(k);
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| bad(&key, "expected a non-negative integer")),
        }
    }

    fn f64(&mut self, k: &str) -> Result<f64, ConfigError> {
        let key = self.key(k);
        self.req(k)?
            .as_f64()
            .ok_or_else(|| bad(&key, "expected a number"))
    }

    fn opt_f64(&mut self, k: &str) -> Result<Option<f64>, ConfigError> {
        let key = self.key(k);
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| bad(&key, "expected a number")),
        }
    }

    fn bool_or(&mut self, k: &str, default: bool) -> Result<bool, ConfigError> {
        let key = self.key(k);
        match self.get(k) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| bad(&key, "expected true or false")),
        }
    }

    fn str_or(&mut self, k: &str, default: &str) -> Result<String, ConfigError> {
        let key = self.key(k);
        match self.get(k) {
            None => Ok(default.to_string()),
            Some(v) => v
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(&key, "expected a string")),
        }
    }

    fn usize_list(&mut self, k: &str) -> Result<Option<Vec<usize>>, ConfigError> {
        let key = self.key(k);
        let Some(v) = self.get(k) else {
            return Ok(None);
        };
        let arr = v
            .as_array()
            .ok_or_else(|| bad(&key, "expected a list of integers"))?;
        arr.iter()
            .map(|x| {
                x.as_u64()
                    .map(|x| x as usize)
                    .ok_or_else(|| bad(&key, "expected a list of non-negative integers"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A key that must hold its default value (the computation depends on it).
    fn expect(
        &mut self,
        k: &str,
        ok: impl Fn(&Value) -> bool,
        what: &str,
    ) -> Result<(), ConfigError> {
        let key = self.key(k);
        match self.get(k) {
            None => Ok(()),
            Some(v) if ok(v) => Ok(()),
            Some(v) => Err(bad(&key, format!("only {what} is supported, got {v}"))),
        }
    }

    fn skip(&mut self, k: &str) {
        let _ = self.get(k);
    }

    fn finish(self) -> Result<(), ConfigError> {
        for k in self.map.keys() {
            if !self.seen.contains(&k.as_str()) {
                return Err(ConfigError::UnknownKey(self.key(k)));
            }
        }
        Ok(())
    }
}

fn is_false(v: &Value) -> bool {
    v.as_bool() == Some(false)
}

fn is_zero(v: &Value) -> bool {
    v.as_u64() == Some(0)
}

fn read_json(path: &Path) -> Result<Value, ConfigError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: p.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ConfigError::Json { path: p, source })
}

impl LmConfig {
    /// Reads and validates an LM `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_json(&read_json(path)?)
    }

    /// Validates an LM config given as JSON.
    pub fn from_json(v: &Value) -> Result<Self, ConfigError> {
        let mut r = Reader::new("", obj(v, "<root>")?);
        let model_type = match r.str_or("model_type", "moshi")?.as_str() {
            "moshi" => ModelType::Moshi,
            "hibiki" => ModelType::Hibiki,
            "personaplex" => ModelType::PersonaPlex,
            other => {
                return Err(bad(
                    "model_type",
                    format!("unsupported model type `{other}`"),
                ))
            }
        };
        let defaults = CheckpointFiles::default();
        let files = CheckpointFiles {
            lm: r.str_or("moshi_name", &defaults.lm)?,
            mimi: r.str_or("mimi_name", &defaults.mimi)?,
            tokenizer: r.str_or("tokenizer_name", &defaults.tokenizer)?,
            mimi_config: r
                .get("mimi_config_name")
                .and_then(Value::as_str)
                .map(str::to_string),
        };
        for k in LM_INERT_KEYS {
            r.skip(k);
        }
        let dim = r.usize("dim")?;
        let text_card = r.usize("text_card")?;
        let existing_text_padding_id = r.opt_usize("existing_text_padding_id")?.unwrap_or(3) as u32;
        let n_q = r.usize("n_q")?;
        let dep_q_stored = r.usize("dep_q")?;
        let persona = model_type == ModelType::PersonaPlex;
        if persona && (dep_q_stored != n_q || !n_q.is_multiple_of(2)) {
            return Err(bad(
                "dep_q",
                format!("PersonaPlex stores a depformer step per audio codebook (n_q {n_q}, even), got {dep_q_stored}"),
            ));
        }
        // PersonaPlex's depformer predicts both streams; only the model's
        // own half is ever used (NVIDIA's `AUDIO_TOKENS_PER_STREAM`).
        let dep_q = if persona { n_q / 2 } else { dep_q_stored };
        let card = r.usize("card")?;
        let num_heads = r.usize("num_heads")?;
        let num_layers = r.usize("num_layers")?;
        // Defaults are the official `LMModel` / `StreamingTransformer` ones.
        let hidden_scale = r.opt_f64("hidden_scale")?.unwrap_or(4.0);
        let context = r.usize("context")?;
        let max_period = r.opt_f64("max_period")?.unwrap_or(10_000.0);
        let norm = NormKind::parse("norm", &r.str_or("norm", "layer_norm")?)?;
        let gating_name = r.str_or("gating", "none")?;
        let gating = Gating::parse("gating", &gating_name)?;
        let pos_emb = PosEmb::parse(
            "positional_embedding",
            &r.str_or("positional_embedding", "sin")?,
        )?;
        if pos_emb.rope(0.0).is_none() {
            return Err(bad(
                "positional_embedding",
                "the LM must use `rope` or `rope_concat`",
            ));
        }
        let kv_repeat = r.opt_usize("kv_repeat")?.unwrap_or(1);
        let delays = r
            .usize_list("delays")?
            .ok_or_else(|| ConfigError::MissingKey("delays".into()))?;
        r.expect("causal", |v| v.as_bool() == Some(true), "true")?;
        r.expect("layer_scale", |_| false, "null")?;
        r.expect("depformer_layer_scale", |_| false, "null")?;
        r.expect(
            "text_card_out",
            |v| v.as_u64() == Some(text_card as u64),
            "text_card",
        )?;
        r.expect("demux_second_stream", is_false, "false")?;
        r.expect("demux_second_text_stream", is_false, "false")?;
        r.expect("norm_emb", is_false, "false")?;
        r.expect("bias_proj", is_false, "false")?;
        r.expect("extra_heads_num_heads", is_zero, "0")?;
        r.skip("extra_heads_dim");
        r.expect("existing_text_end_padding_id", is_zero, "0")?;
        r.expect("cross_attention", is_false, "false")?;
        r.expect("quantize", is_false, "false")?;
        let lora = if r.bool_or("lora", false)? {
            let rank = r.opt_usize("lora_rank")?.unwrap_or(128);
            let scaling = r.opt_f64("lora_scaling")?.unwrap_or(2.0) as f32;
            if rank == 0 || !scaling.is_finite() {
                return Err(bad(
                    "lora_rank",
                    "a LoRA needs a positive rank and a finite scaling",
                ));
            }
            Some(LoraConfig { rank, scaling })
        } else {
            r.skip("lora_rank");
            r.skip("lora_scaling");
            None
        };
        r.skip("depformer_causal");
        r.expect("bias_ff", is_false, "false")?;
        r.expect("bias_attn", is_false, "false")?;

        // The depformer: the official `LMModel` passes it every un-prefixed
        // transformer key of the config (`num_layers`, `max_period`,
        // `gating`, `kv_repeat`, …), each overridden by its `depformer_`
        // twin; `num_heads`, `hidden_scale` and `norm` are `LMModel`'s own
        // arguments (the depformer gets `norm`, a feed-forward width of
        // `hidden_scale · depformer_dim` unless `depformer_dim_feedforward`
        // says otherwise, and no `num_heads` but `depformer_num_heads`). Its
        // positional embedding is always `depformer_pos_emb` (default `sin`)
        // and its context always unlimited (`depformer_context` is ignored:
        // the cache holds the frame's `dep_q` steps).
        let depformer_dim = r.usize("depformer_dim")?;
        let dim_feedforward = match r.get("depformer_dim_feedforward") {
            None => (hidden_scale * depformer_dim as f64) as usize,
            Some(v) => v.as_u64().map(|x| x as usize).ok_or_else(|| {
                bad(
                    "depformer_dim_feedforward",
                    "expected a non-negative integer or null (a per-step list is not supported)",
                )
            })?,
        };
        let num_layers_dep = r.opt_usize("depformer_num_layers")?.unwrap_or(num_layers);
        let dep_gating = Gating::parse(
            "depformer_gating",
            &r.str_or("depformer_gating", &gating_name)?,
        )?;
        let depformer = DepformerConfig {
            dim: depformer_dim,
            dim_feedforward,
            num_heads: r.usize("depformer_num_heads")?,
            kv_repeat: r.opt_usize("depformer_kv_repeat")?.unwrap_or(kv_repeat),
            num_layers: num_layers_dep,
            multi_linear: r.bool_or("depformer_multi_linear", false)?,
            max_period: r.opt_f64("depformer_max_period")?.unwrap_or(max_period) as f32,
            gating: dep_gating,
            pos_emb: PosEmb::parse("depformer_pos_emb", &r.str_or("depformer_pos_emb", "sin")?)?,
            weights_per_step: r.bool_or("depformer_weights_per_step", false)?,
            weights_per_step_schedule: r.usize_list("depformer_weights_per_step_schedule")?,
            low_rank_embeddings: r.opt_usize("depformer_low_rank_embeddings")?,
            norm: match r.get("depformer_norm") {
                None => None,
                Some(v) => Some(NormKind::parse(
                    "depformer_norm",
                    v.as_str()
                        .ok_or_else(|| bad("depformer_norm", "expected a string or null"))?,
                )?),
            },
        };
        r.skip("depformer_context");
        let max_period = max_period as f32;

        let mut conditioners = Vec::new();
        if let Some(c) = r.get("conditioners") {
            for (name, spec) in obj(c, "conditioners")? {
                conditioners.push(parse_lut(name, spec, dim)?);
            }
        }
        let mut fuser_sum = Vec::new();
        if let Some(f) = r.get("fuser") {
            let mut fr = Reader::new("fuser", obj(f, "fuser")?);
            if let Some(s) = fr.get("sum") {
                let arr = s
                    .as_array()
                    .ok_or_else(|| bad("fuser.sum", "expected a list of names"))?;
                for x in arr {
                    let n = x
                        .as_str()
                        .ok_or_else(|| bad("fuser.sum", "expected a list of names"))?;
                    fuser_sum.push(n.to_string());
                }
            }
            let empty = |v: &Value| v.as_array().is_some_and(|a| a.is_empty());
            fr.expect("cross", empty, "an empty list")?;
            fr.expect("prepend", empty, "an empty list")?;
            fr.skip("cross_attention_pos_emb");
            fr.skip("cross_attention_pos_emb_scale");
            fr.finish()?;
        }
        r.finish()?;

        let cfg = LmConfig {
            model_type,
            dim,
            text_card,
            existing_text_padding_id,
            n_q,
            dep_q,
            dep_q_stored,
            kv_window: if persona {
                KvWindow::ContextMinusOne
            } else {
                KvWindow::Context
            },
            lora,
            card,
            num_heads,
            kv_repeat,
            num_layers,
            hidden_scale,
            context,
            max_period,
            pos_emb,
            norm,
            gating,
            delays,
            depformer,
            conditioners,
            fuser_sum,
            files,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let nonzero = [
            ("dim", self.dim),
            ("num_heads", self.num_heads),
            ("num_layers", self.num_layers),
            ("n_q", self.n_q),
            ("dep_q", self.dep_q),
            ("card", self.card),
            ("text_card", self.text_card),
            ("context", self.context),
            ("depformer_dim", self.depformer.dim),
            ("depformer_num_heads", self.depformer.num_heads),
            ("kv_repeat", self.kv_repeat),
            ("depformer_kv_repeat", self.depformer.kv_repeat),
        ];
        for (k, v) in nonzero {
            if v == 0 {
                return Err(bad(k, "must be positive"));
            }
        }
        if !self.dim.is_multiple_of(self.num_heads) {
            return Err(bad("num_heads", format!("must divide dim {}", self.dim)));
        }
        if !(self.dim / self.num_heads).is_multiple_of(2) {
            return Err(bad("num_heads", "head dimension must be even for RoPE"));
        }
        if !self.num_heads.is_multiple_of(self.kv_repeat) {
            return Err(bad(
                "kv_repeat",
                format!("must divide num_heads {}", self.num_heads),
            ));
        }
        if !self.depformer.dim.is_multiple_of(self.depformer.num_heads) {
            return Err(bad(
                "depformer_num_heads",
                format!("must divide depformer_dim {}", self.depformer.dim),
            ));
        }
        if !self
            .depformer
            .num_heads
            .is_multiple_of(self.depformer.kv_repeat)
        {
            return Err(bad(
                "depformer_kv_repeat",
                format!(
                    "must divide depformer_num_heads {} (when absent it is kv_repeat)",
                    self.depformer.num_heads
                ),
            ));
        }
        if self.depformer.pos_emb != PosEmb::None
            && !(self.depformer.dim / self.depformer.num_heads).is_multiple_of(2)
        {
            return Err(bad(
                "depformer_num_heads",
                "head dimension must be even for RoPE",
            ));
        }
        if self.dep_q > self.n_q {
            return Err(bad("dep_q", format!("must not exceed n_q {}", self.n_q)));
        }
        if self.delays.len() != self.n_q + 1 {
            return Err(bad(
                "delays",
                format!(
                    "expected n_q + 1 = {} entries, got {}",
                    self.n_q + 1,
                    self.delays.len()
                ),
            ));
        }
        if self.gating != Gating::Silu || self.depformer.gating != Gating::Silu {
            return Err(bad(
                "gating",
                "the LM and its depformer must use `silu` gating",
            ));
        }
        if !matches!(self.norm, NormKind::RmsNormF32 | NormKind::RmsNorm) {
            return Err(bad("norm", "the LM must use an RMS norm"));
        }
        if !self.depformer.multi_linear {
            return Err(bad("depformer_multi_linear", "only true is supported"));
        }
        if self.existing_text_padding_id as usize >= self.text_card {
            return Err(bad("existing_text_padding_id", "must be below text_card"));
        }
        if let Some(s) = &self.depformer.weights_per_step_schedule {
            if !self.depformer.weights_per_step {
                return Err(bad(
                    "depformer_weights_per_step_schedule",
                    "needs depformer_weights_per_step",
                ));
            }
            if s.len() != self.dep_q {
                return Err(bad(
                    "depformer_weights_per_step_schedule",
                    format!("expected dep_q = {} entries", self.dep_q),
                ));
            }
            let sets = s.iter().max().copied().unwrap_or(0) + 1;
            if (0..sets).any(|i| !s.contains(&i)) {
                return Err(bad(
                    "depformer_weights_per_step_schedule",
                    "every weight set up to the largest must be used",
                ));
            }
        }
        if self.depformer.low_rank_embeddings == Some(0) {
            return Err(bad("depformer_low_rank_embeddings", "must be positive"));
        }
        for name in &self.fuser_sum {
            if !self.conditioners.iter().any(|c| &c.name == name) {
                return Err(bad(
                    "fuser.sum",
                    format!("names `{name}`, which is not a conditioner"),
                ));
            }
        }
        for c in &self.conditioners {
            if !self.fuser_sum.contains(&c.name) {
                return Err(bad(
                    "fuser",
                    format!(
                        "conditioner `{}` is not summed; only `sum` fusion is supported",
                        c.name
                    ),
                ));
            }
        }
        Ok(())
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

fn parse_lut(name: &str, spec: &Value, lm_dim: usize) -> Result<LutConditionerConfig, ConfigError> {
    let prefix = format!("conditioners.{name}");
    let mut r = Reader::new(&prefix, obj(spec, &prefix)?);
    let kind = r.str_or("type", "")?;
    if kind != "lut" {
        return Err(bad(
            &format!("{prefix}.type"),
            format!("only `lut` conditioners are supported, got `{kind}`"),
        ));
    }
    let lut_key = format!("{prefix}.lut");
    let lut = r.req("lut")?;
    r.finish()?;
    let mut l = Reader::new(&lut_key, obj(lut, &lut_key)?);
    let n_bins = l.usize("n_bins")?;
    let dim = l.usize("dim")?;
    let output_dim = l.opt_usize("output_dim")?.unwrap_or(lm_dim);
    l.expect("tokenizer", |v| v.as_str() == Some("noop"), "`noop`")?;
    l.skip("device");
    let pv_key = format!("{lut_key}.possible_values");
    let pv = l.req("possible_values")?;
    let possible_values = pv
        .as_array()
        .ok_or_else(|| bad(&pv_key, "expected a list of strings"))?
        .iter()
        .map(|x| {
            x.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(&pv_key, "expected a list of strings"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    l.finish()?;
    if possible_values.is_empty() || possible_values.len() > n_bins {
        return Err(bad(
            &pv_key,
            format!("needs between 1 and n_bins = {n_bins} values"),
        ));
    }
    if output_dim != lm_dim {
        return Err(bad(
            &format!("{lut_key}.output_dim"),
            format!("must equal the LM dim {lm_dim}"),
        ));
    }
    Ok(LutConditionerConfig {
        name: name.to_string(),
        n_bins,
        dim,
        output_dim,
        possible_values,
    })
}

/// SEANet encoder/decoder hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct SeanetConfig {
    /// Audio channels (1).
    pub channels: usize,
    /// Latent width.
    pub dimension: usize,
    /// Base filter count.
    pub n_filters: usize,
    /// Residual blocks per stage.
    pub n_residual_layers: usize,
    /// Hidden width divisor in residual blocks.
    pub compress: usize,
    /// Dilation growth per residual layer.
    pub dilation_base: usize,
    /// First/last conv kernel.
    pub kernel_size: usize,
    /// Residual conv kernel.
    pub residual_kernel_size: usize,
    /// Final conv kernel.
    pub last_kernel_size: usize,
    /// Down-sampling ratios (the encoder applies them reversed).
    pub ratios: Vec<usize>,
    /// Identity skip in residual blocks.
    pub true_skip: bool,
}

impl SeanetConfig {
    /// Samples per latent step.
    pub fn hop_length(&self) -> usize {
        self.ratios.iter().product()
    }
}

/// Split residual vector quantizer hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizerConfig {
    /// Codebook vector width.
    pub dimension: usize,
    /// Codebooks stored in the checkpoint.
    pub n_q: usize,
    /// Entries per codebook.
    pub bins: usize,
    /// Input width.
    pub input_dimension: usize,
    /// Output width.
    pub output_dimension: usize,
}

/// Mimi's streaming transformers (encoder and decoder side share this).
#[derive(Debug, Clone, PartialEq)]
pub struct MimiTransformerConfig {
    /// Width.
    pub d_model: usize,
    /// Heads.
    pub num_heads: usize,
    /// Layers.
    pub num_layers: usize,
    /// Layer scale init (its presence means `layer_scale_*` tensors exist).
    pub layer_scale: Option<f64>,
    /// Attention context in steps.
    pub context: usize,
    /// RoPE period.
    pub max_period: f32,
    /// Feed-forward width.
    pub dim_feedforward: usize,
    /// Norm kind.
    pub norm: NormKind,
    /// What the ring KV caches show a query (set from the LM's family: not
    /// a key of Mimi's configuration).
    pub kv_window: KvWindow,
}

/// The Mimi codec configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct MimiConfig {
    /// Audio sample rate (24 000).
    pub sample_rate: usize,
    /// Audio channels (1).
    pub channels: usize,
    /// Token frame rate (12.5 Hz).
    pub frame_rate: f64,
    /// SEANet.
    pub seanet: SeanetConfig,
    /// Quantizer.
    pub quantizer: QuantizerConfig,
    /// Transformers.
    pub transformer: MimiTransformerConfig,
}

impl KvWindow {
    /// Keys a query sees once the ring of `context` entries is full.
    pub fn window(self, context: usize) -> usize {
        match self {
            KvWindow::Context => context,
            KvWindow::ContextMinusOne => context.saturating_sub(1).max(1),
        }
    }
}

impl MimiConfig {
    /// Reads and validates a Mimi config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_json(&read_json(path)?)
    }

    /// Validates a Mimi config given as JSON.
    pub fn from_json(v: &Value) -> Result<Self, ConfigError> {
        let mut r = Reader::new("", obj(v, "<root>")?);
        let sample_rate = r.usize("sample_rate")?;
        let channels = r.usize("channels")?;
        let frame_rate = r.f64("frame_rate")?;

        let sv = r.req("seanet")?;
        let mut s = Reader::new("seanet", obj(sv, "seanet")?);
        let seanet = SeanetConfig {
            channels: s.usize("channels")?,
            dimension: s.usize("dimension")?,
            n_filters: s.usize("n_filters")?,
            n_residual_layers: s.usize("n_residual_layers")?,
            compress: s.usize("compress")?,
            dilation_base: s.usize("dilation_base")?,
            kernel_size: s.usize("kernel_size")?,
            residual_kernel_size: s.usize("residual_kernel_size")?,
            last_kernel_size: s.usize("last_kernel_size")?,
            ratios: s
                .usize_list("ratios")?
                .ok_or_else(|| ConfigError::MissingKey("seanet.ratios".into()))?,
            true_skip: s.bool_or("true_skip", true)?,
        };
        s.expect("causal", |v| v.as_bool() == Some(true), "true")?;
        s.expect("activation", |v| v.as_str() == Some("ELU"), "`ELU`")?;
        s.expect("norm", |v| v.as_str() == Some("none"), "`none`")?;
        s.expect("pad_mode", |v| v.as_str() == Some("constant"), "`constant`")?;
        s.expect("disable_norm_outer_blocks", is_zero, "0")?;
        s.expect("lstm", is_zero, "0")?;
        s.skip("activation_params");
        s.finish()?;

        let qv = r.req("quantizer")?;
        let mut q = Reader::new("quantizer", obj(qv, "quantizer")?);
        let quantizer = QuantizerConfig {
            dimension: q.usize("dimension")?,
            n_q: q.usize("n_q")?,
            bins: q.usize("bins")?,
            input_dimension: q.usize("input_dimension")?,
            output_dimension: q.usize("output_dimension")?,
        };
        q.expect("n_q_semantic", |v| v.as_u64() == Some(1), "1")?;
        q.expect("no_quantization_rate", |v| v.as_f64() == Some(0.0), "0")?;
        q.finish()?;

        let tv = r.req("transformer")?;
        let mut t = Reader::new("transformer", obj(tv, "transformer")?);
        let transformer = MimiTransformerConfig {
            d_model: t.usize("d_model")?,
            num_heads: t.usize("num_heads")?,
            num_layers: t.usize("num_layers")?,
            layer_scale: t.opt_f64("layer_scale")?,
            context: t.usize("context")?,
            max_period: t.opt_f64("max_period")?.unwrap_or(10_000.0) as f32,
            dim_feedforward: t.usize("dim_feedforward")?,
            norm: NormKind::parse("transformer.norm", &t.str_or("norm", "layer_norm")?)?,
            kv_window: KvWindow::Context,
        };
        t.expect("causal", |v| v.as_bool() == Some(true), "true")?;
        t.expect("conv_layout", |v| v.as_bool() == Some(true), "true")?;
        t.expect("gating", |v| v.as_str() == Some("none"), "`none`")?;
        t.expect(
            "positional_embedding",
            |v| v.as_str() == Some("rope"),
            "`rope`",
        )?;
        let d = transformer.d_model as u64;
        t.expect("input_dimension", |v| v.as_u64() == Some(d), "d_model")?;
        t.expect(
            "output_dimensions",
            |v| {
                v.as_array()
                    .is_some_and(|a| a.len() == 1 && a[0].as_u64() == Some(d))
            },
            "[d_model]",
        )?;
        t.finish()?;
        r.finish()?;

        let cfg = MimiConfig {
            sample_rate,
            channels,
            frame_rate,
            seanet,
            quantizer,
            transformer,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.channels != 1 || self.seanet.channels != 1 {
            return Err(bad("channels", "only mono (1) is supported"));
        }
        if self.seanet.ratios.is_empty() || self.seanet.ratios.contains(&0) {
            return Err(bad(
                "seanet.ratios",
                "must be a non-empty list of positive ratios",
            ));
        }
        if self.seanet.compress == 0 || self.seanet.n_filters == 0 || self.seanet.dimension == 0 {
            return Err(bad(
                "seanet",
                "compress, n_filters and dimension must be positive",
            ));
        }
        let t = &self.transformer;
        if t.num_heads == 0
            || !t.d_model.is_multiple_of(t.num_heads)
            || !(t.d_model / t.num_heads).is_multiple_of(2)
        {
            return Err(bad(
                "transformer.num_heads",
                "must divide d_model into even head widths",
            ));
        }
        if t.d_model != self.seanet.dimension {
            return Err(bad("transformer.d_model", "must equal seanet.dimension"));
        }
        if t.norm != NormKind::LayerNorm {
            return Err(bad(
                "transformer.norm",
                "Mimi's transformers use `layer_norm`",
            ));
        }
        let q = &self.quantizer;
        if q.n_q < 2 || q.bins == 0 || q.dimension == 0 {
            return Err(bad(
                "quantizer",
                "needs n_q ≥ 2 (split RVQ), bins and dimension positive",
            ));
        }
        if q.input_dimension != self.seanet.dimension || q.output_dimension != self.seanet.dimension
        {
            return Err(bad(
                "quantizer.input_dimension",
                "must equal seanet.dimension",
            ));
        }
        let hop = self.seanet.hop_length() as f64;
        let enc_rate = self.sample_rate as f64 / hop;
        let ratio = enc_rate / self.frame_rate;
        if (ratio - ratio.round()).abs() > 1e-9 || ratio.round() < 1.0 {
            return Err(bad(
                "frame_rate",
                format!("the encoder rate {enc_rate} Hz must be an integer multiple of it"),
            ));
        }
        Ok(())
    }

    /// Encoder steps per token frame (2 for the real Mimi: 25 Hz → 12.5 Hz).
    pub fn downsample_stride(&self) -> usize {
        let enc_rate = self.sample_rate as f64 / self.seanet.hop_length() as f64;
        (enc_rate / self.frame_rate).round() as usize
    }

    /// Audio samples per token frame (1920 for the real Mimi).
    pub fn frame_samples(&self) -> usize {
        self.seanet.hop_length() * self.downsample_stride()
    }

    /// The real Mimi configuration.
    pub fn mimi_default() -> Self {
        let v = serde_json::json!({
            "sample_rate": 24000, "channels": 1, "frame_rate": 12.5,
            "seanet": {"channels": 1, "dimension": 512, "causal": true, "n_filters": 64,
                "n_residual_layers": 1, "activation": "ELU", "compress": 2, "dilation_base": 2,
                "disable_norm_outer_blocks": 0, "kernel_size": 7, "residual_kernel_size": 3,
                "last_kernel_size": 3, "norm": "none", "pad_mode": "constant",
                "ratios": [8, 6, 5, 4], "true_skip": true},
            "quantizer": {"dimension": 256, "n_q": 32, "bins": 2048,
                "input_dimension": 512, "output_dimension": 512},
            "transformer": {"d_model": 512, "num_heads": 8, "num_layers": 8, "causal": true,
                "layer_scale": 0.01, "context": 250, "conv_layout": true, "max_period": 10000,
                "gating": "none", "norm": "layer_norm", "positional_embedding": "rope",
                "dim_feedforward": 2048, "input_dimension": 512, "output_dimensions": [512]}
        });
        Self::from_json(&v).expect("the built-in Mimi config is valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/golden")
            .join(name)
    }

    #[test]
    fn golden_configs_parse() {
        let m = LmConfig::from_file(&golden("moshi-tiny/lm_config.json")).unwrap();
        assert_eq!(m.model_type, ModelType::Moshi);
        assert_eq!(m.ffn_hidden(), 176);
        assert_eq!(m.depformer_ffn_hidden(), 88);
        let h = LmConfig::from_file(&golden("hibiki-tiny/lm_config.json")).unwrap();
        assert_eq!(h.model_type, ModelType::Hibiki);
        assert_eq!(h.depformer.num_weight_sets(h.dep_q), 5);
        assert_eq!(h.conditioners[0].possible_values.len(), 5);
        let mimi = MimiConfig::from_file(&golden("moshi-tiny/mimi_config.json")).unwrap();
        assert_eq!(mimi.frame_samples(), 1920);
        assert_eq!(mimi.downsample_stride(), 2);
    }

    #[test]
    fn builtin_configs_are_valid() {
        let m = LmConfig::moshi_7b();
        assert_eq!(m.ffn_hidden(), 11264);
        // 1.47 GiB of bf16 KV cache per stream at full context.
        let gib = m.kv_bytes_per_stream(2) as f64 / (1u64 << 30) as f64;
        assert!((gib - 1.46).abs() < 0.02, "{gib}");
        assert_eq!(MimiConfig::mimi_default().frame_samples(), 1920);
    }

    fn moshi_json() -> Value {
        let text = std::fs::read_to_string(golden("moshi-tiny/lm_config.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn err_of(v: Value) -> String {
        LmConfig::from_json(&v).unwrap_err().to_string()
    }

    #[test]
    fn unknown_key_is_named() {
        let mut v = moshi_json();
        v["mystery_knob"] = 3.into();
        assert!(err_of(v).contains("mystery_knob"));
    }

    #[test]
    fn bad_values_are_named() {
        let mut v = moshi_json();
        v["num_heads"] = 5.into();
        assert!(err_of(v).contains("num_heads"));
        let mut v = moshi_json();
        v["delays"] = serde_json::json!([0, 1]);
        assert!(err_of(v).contains("delays"));
        let mut v = moshi_json();
        v["gating"] = "gelu".into();
        assert!(err_of(v).contains("gating"));
        let mut v = moshi_json();
        v["dim"] = "wide".into();
        assert!(err_of(v).contains("`dim`"));
        let mut v = moshi_json();
        v.as_object_mut().unwrap().remove("card");
        assert!(err_of(v).contains("card"));
        let mut v = moshi_json();
        v["demux_second_stream"] = true.into();
        assert!(err_of(v).contains("demux_second_stream"));
    }

    #[test]
    fn schedule_must_match_dep_q() {
        let text = std::fs::read_to_string(golden("hibiki-tiny/lm_config.json")).unwrap();
        let mut v: Value = serde_json::from_str(&text).unwrap();
        v["depformer_weights_per_step_schedule"] = serde_json::json!([0, 1, 2]);
        assert!(err_of(v).contains("depformer_weights_per_step_schedule"));
    }

    fn golden_next(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/golden-next")
            .join(name)
    }

    fn zero_json() -> Value {
        let p = golden_next("hibiki-zero-tiny/lm_config.json");
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    #[test]
    fn hibiki_zero_keys_parse_with_the_official_semantics() {
        let c = LmConfig::from_json(&zero_json()).unwrap();
        assert_eq!((c.kv_repeat, c.kv_dim()), (2, 32));
        assert_eq!(c.pos_emb, PosEmb::RopeConcat);
        assert_eq!(c.depformer.kv_repeat, 1);
        assert_eq!(c.depformer.norm, Some(NormKind::LayerNorm));
        // depformer_dim_feedforward null: hidden_scale 6 · depformer_dim 32.
        assert_eq!(c.depformer.dim_feedforward, 192);
        assert_eq!((c.ffn_hidden(), c.depformer_ffn_hidden()), (256, 128));
        // The depformer's positional embedding is its own key, never the
        // temporal one (the official code overrides it).
        assert_eq!(c.depformer.pos_emb, PosEmb::None);
        assert_eq!(c.depformer.pos_emb.rope(1.0), None);
        assert!(c.pos_emb.rope(1.0).is_some_and(|r| !r.interleaved));
    }

    #[test]
    fn depformer_keys_inherit_the_temporal_ones() {
        // As the official LMModel: an absent `depformer_X` takes `X`.
        let mut v = zero_json();
        let o = v.as_object_mut().unwrap();
        for k in [
            "depformer_kv_repeat",
            "depformer_num_layers",
            "depformer_max_period",
            "depformer_gating",
            "depformer_context",
        ] {
            o.remove(k);
        }
        o.insert("num_layers".into(), 3.into());
        let c = LmConfig::from_json(&v).unwrap();
        assert_eq!(c.depformer.kv_repeat, 2);
        assert_eq!(c.depformer.num_layers, 3);
        assert_eq!(c.depformer.max_period, 20_000.0);
        assert_eq!(c.depformer.gating, Gating::Silu);
        // The official defaults where neither is given.
        let mut v = zero_json();
        let o = v.as_object_mut().unwrap();
        o.remove("hidden_scale");
        o.remove("kv_repeat");
        o.remove("depformer_kv_repeat");
        let c = LmConfig::from_json(&v).unwrap();
        assert_eq!(
            (c.hidden_scale, c.kv_repeat, c.depformer.kv_repeat),
            (4.0, 1, 1)
        );
        // hidden_scale 4: exactly 4 · dim, the gating's 21 · dim / 8 rule.
        assert_eq!((c.ffn_hidden(), c.depformer_ffn_hidden()), (168, 84));
    }

    #[test]
    fn grouped_query_and_norm_values_are_checked_naming_the_key() {
        let cases: [(&str, Value, &str); 7] = [
            ("kv_repeat", 3.into(), "kv_repeat"),
            ("kv_repeat", 0.into(), "kv_repeat"),
            ("depformer_kv_repeat", 4.into(), "depformer_kv_repeat"),
            ("depformer_norm", "batch_norm".into(), "depformer_norm"),
            ("depformer_norm", 1.into(), "depformer_norm"),
            ("positional_embedding", "sin".into(), "positional_embedding"),
            (
                "depformer_dim_feedforward",
                serde_json::json!([128, 128]),
                "depformer_dim_feedforward",
            ),
        ];
        for (key, value, named) in cases {
            let mut v = zero_json();
            v[key] = value.clone();
            let e = err_of(v);
            assert!(e.contains(&format!("`{named}`")), "{key} = {value}: {e}");
        }
        // Every norm the official create_norm_fn knows is a depformer_norm.
        for n in ["layer_norm", "layer_norm_f32", "rms_norm", "rms_norm_f32"] {
            let mut v = zero_json();
            v["depformer_norm"] = n.into();
            assert!(
                LmConfig::from_json(&v).unwrap().depformer.norm.is_some(),
                "{n}"
            );
        }
        let mut v = zero_json();
        v["depformer_norm"] = Value::Null;
        assert_eq!(LmConfig::from_json(&v).unwrap().depformer.norm, None);
    }

    #[test]
    fn mimi_unknown_nested_key_is_named() {
        let text = std::fs::read_to_string(golden("moshi-tiny/mimi_config.json")).unwrap();
        let mut v: Value = serde_json::from_str(&text).unwrap();
        v["seanet"]["wobble"] = 1.into();
        let e = MimiConfig::from_json(&v).unwrap_err().to_string();
        assert!(e.contains("seanet.wobble"), "{e}");
    }
}
