//! Reading an LM `config.json` ([`LmConfig::from_json`]), section by
//! section: family and file names, the temporal transformer, the keys pinned
//! to their defaults, LoRA, the depformer, and the conditioners and fuser.
//!
//! Invariants: keys are read in one fixed order, so the first fault reported
//! for a config is always the same one; a key no section reads is refused by
//! the final `finish`.

use super::reader::{is_false, is_zero, obj, Reader};
use super::{
    bad, CheckpointFiles, ConfigError, DepformerConfig, Gating, KvWindow, LmConfig, LoraConfig,
    LutConditionerConfig, ModelType, NormKind, PosEmb,
};
use serde_json::Value;

/// Keys that only carry information irrelevant to the computation.
const LM_INERT_KEYS: &[&str] = &["lm_gen_config", "model_id", "stt_config", "tts_config"];

impl LmConfig {
    /// Validates an LM config given as JSON.
    pub fn from_json(v: &Value) -> Result<Self, ConfigError> {
        let mut r = Reader::new("", obj(v, "<root>")?);
        let model_type = read_model_type(&mut r)?;
        let files = read_files(&mut r)?;
        for k in LM_INERT_KEYS {
            r.skip(k);
        }
        let t = read_temporal(&mut r, model_type)?;
        expect_pinned_keys(&mut r, t.text_card)?;
        let lora = read_lora(&mut r)?;
        r.skip("depformer_causal");
        r.expect("bias_ff", is_false, "false")?;
        r.expect("bias_attn", is_false, "false")?;
        let depformer = read_depformer(&mut r, &t)?;
        r.skip("depformer_context");
        let conditioners = read_conditioners(&mut r, t.dim)?;
        let fuser_sum = read_fuser(&mut r)?;
        r.finish()?;

        let cfg = LmConfig {
            model_type,
            dim: t.dim,
            text_card: t.text_card,
            existing_text_padding_id: t.existing_text_padding_id,
            n_q: t.n_q,
            dep_q: t.dep_q,
            dep_q_stored: t.dep_q_stored,
            kv_window: if model_type == ModelType::PersonaPlex {
                KvWindow::ContextMinusOne
            } else {
                KvWindow::Context
            },
            lora,
            card: t.card,
            num_heads: t.num_heads,
            kv_repeat: t.kv_repeat,
            num_layers: t.num_layers,
            hidden_scale: t.hidden_scale,
            context: t.context,
            max_period: t.max_period as f32,
            pos_emb: t.pos_emb,
            norm: t.norm,
            gating: t.gating,
            delays: t.delays,
            depformer,
            conditioners,
            fuser_sum,
            files,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// The temporal transformer's keys as read, before they are assembled into
/// an [`LmConfig`]; the depformer inherits several of them.
struct Temporal {
    dim: usize,
    text_card: usize,
    existing_text_padding_id: u32,
    n_q: usize,
    dep_q: usize,
    dep_q_stored: usize,
    card: usize,
    num_heads: usize,
    num_layers: usize,
    hidden_scale: f64,
    context: usize,
    /// Kept in f64: the depformer's default is this value, cast only then.
    max_period: f64,
    norm: NormKind,
    /// The spelling as read: the depformer's `gating` default.
    gating_name: String,
    gating: Gating,
    pos_emb: PosEmb,
    kv_repeat: usize,
    delays: Vec<usize>,
}

/// Reads `model_type` (default `moshi`), refusing a family we do not run.
fn read_model_type(r: &mut Reader) -> Result<ModelType, ConfigError> {
    Ok(match r.str_or("model_type", "moshi")?.as_str() {
        "moshi" => ModelType::Moshi,
        "hibiki" => ModelType::Hibiki,
        "personaplex" => ModelType::PersonaPlex,
        other => {
            return Err(bad(
                "model_type",
                format!("unsupported model type `{other}`"),
            ))
        }
    })
}

/// Reads the file-name overrides, each defaulting to the official name.
fn read_files(r: &mut Reader) -> Result<CheckpointFiles, ConfigError> {
    let defaults = CheckpointFiles::default();
    Ok(CheckpointFiles {
        lm: r.str_or("moshi_name", &defaults.lm)?,
        mimi: r.str_or("mimi_name", &defaults.mimi)?,
        tokenizer: r.str_or("tokenizer_name", &defaults.tokenizer)?,
        mimi_config: r
            .get("mimi_config_name")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// Reads the token streams and the temporal transformer's keys, with
/// PersonaPlex's stored depformer steps checked and halved to the model's own.
fn read_temporal(r: &mut Reader, model_type: ModelType) -> Result<Temporal, ConfigError> {
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
    Ok(Temporal {
        dim,
        text_card,
        existing_text_padding_id,
        n_q,
        dep_q,
        dep_q_stored,
        card,
        num_heads,
        num_layers,
        hidden_scale,
        context,
        max_period,
        norm,
        gating_name,
        gating,
        pos_emb,
        kv_repeat,
        delays,
    })
}

/// Checks the keys that must hold their default: the computation implemented
/// here depends on each of them.
fn expect_pinned_keys(r: &mut Reader, text_card: usize) -> Result<(), ConfigError> {
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
    r.expect("quantize", is_false, "false")
}

/// Reads the LoRA settings when `lora` is true (its rank and scaling keys are
/// ignored otherwise).
fn read_lora(r: &mut Reader) -> Result<Option<LoraConfig>, ConfigError> {
    if r.bool_or("lora", false)? {
        let rank = r.opt_usize("lora_rank")?.unwrap_or(128);
        let scaling = r.opt_f64("lora_scaling")?.unwrap_or(2.0) as f32;
        if rank == 0 || !scaling.is_finite() {
            return Err(bad(
                "lora_rank",
                "a LoRA needs a positive rank and a finite scaling",
            ));
        }
        Ok(Some(LoraConfig { rank, scaling }))
    } else {
        r.skip("lora_rank");
        r.skip("lora_scaling");
        Ok(None)
    }
}

/// Reads the depformer's keys, each absent one inheriting what the official
/// code gives it.
///
/// The official `LMModel` passes the depformer every un-prefixed transformer
/// key of the config (`num_layers`, `max_period`, `gating`, `kv_repeat`, …),
/// each overridden by its `depformer_` twin; `num_heads`, `hidden_scale` and
/// `norm` are `LMModel`'s own arguments (the depformer gets `norm`, a
/// feed-forward width of `hidden_scale · depformer_dim` unless
/// `depformer_dim_feedforward` says otherwise, and no `num_heads` but
/// `depformer_num_heads`). Its positional embedding is always
/// `depformer_pos_emb` (default `sin`) and its context always unlimited
/// (`depformer_context` is ignored: the cache holds the frame's `dep_q`
/// steps).
fn read_depformer(r: &mut Reader, t: &Temporal) -> Result<DepformerConfig, ConfigError> {
    let depformer_dim = r.usize("depformer_dim")?;
    let dim_feedforward = match r.get("depformer_dim_feedforward") {
        None => (t.hidden_scale * depformer_dim as f64) as usize,
        Some(v) => v.as_u64().map(|x| x as usize).ok_or_else(|| {
            bad(
                "depformer_dim_feedforward",
                "expected a non-negative integer or null (a per-step list is not supported)",
            )
        })?,
    };
    let num_layers_dep = r.opt_usize("depformer_num_layers")?.unwrap_or(t.num_layers);
    let dep_gating = Gating::parse(
        "depformer_gating",
        &r.str_or("depformer_gating", &t.gating_name)?,
    )?;
    Ok(DepformerConfig {
        dim: depformer_dim,
        dim_feedforward,
        num_heads: r.usize("depformer_num_heads")?,
        kv_repeat: r.opt_usize("depformer_kv_repeat")?.unwrap_or(t.kv_repeat),
        num_layers: num_layers_dep,
        multi_linear: r.bool_or("depformer_multi_linear", false)?,
        max_period: r.opt_f64("depformer_max_period")?.unwrap_or(t.max_period) as f32,
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
    })
}

/// Reads the `conditioners` object (absent: none), one lookup table each.
fn read_conditioners(
    r: &mut Reader,
    lm_dim: usize,
) -> Result<Vec<LutConditionerConfig>, ConfigError> {
    let mut conditioners = Vec::new();
    if let Some(c) = r.get("conditioners") {
        for (name, spec) in obj(c, "conditioners")? {
            conditioners.push(parse_lut(name, spec, lm_dim)?);
        }
    }
    Ok(conditioners)
}

/// Reads the `fuser` object (absent: nothing summed): the conditions summed
/// into the input embedding; cross-attention and prepend fusion are refused.
fn read_fuser(r: &mut Reader) -> Result<Vec<String>, ConfigError> {
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
    Ok(fuser_sum)
}

/// Reads one `lut` conditioner (`conditioners.{name}`) and its lookup table.
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
