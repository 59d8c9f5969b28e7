//! Built-in shapes of the published models, for benches, memory plans and
//! measurements run without their checkpoints (`gpu-bench` steps randomly
//! initialised models of exactly these shapes; `moshid serve
//! --random-weights` serves them; `check-checkpoint`'s tests build
//! header-only folders of them).
//!
//! **Serving a checkpoint never uses these**: moshid takes the context and
//! every other dimension from the checkpoint's own `config.json` (the
//! built-in Moshi 7B config, [`LmConfig::moshi_7b`], only for the folders
//! that ship none, as the official loader does). A built-in that drifts
//! from a published config only misprices a bench or a measurement.
//!
//! Each shape is written as a config.json in the official key format and
//! parsed by [`LmConfig::from_json`], the parser every checkpoint's config
//! goes through, so it is validated like one. Every number carries a
//! comment naming its source:
//! - `loaders.py`: the official `_lm_kwargs` (moshi 0.2.13,
//!   `moshi/models/loaders.py`), the config of Moshi 7B;
//! - `DESIGN.md`: the facts recorded in the project's design notes
//!   (docs/design.md, "Facts about the models");
//! - `issue 14`: the shapes issue 14 lists from the published configs
//!   (Hibiki-Zero 3B), and its copy of Hibiki 2B's published config
//!   (context 1500);
//! - `golden`: `../shared/golden/make_golden.py`, whose fixture variants
//!   are shaped after these models by the official implementation;
//! - `third-party`: third-party copies of the published config.json
//!   (ports and converters of these models); not checked against the
//!   published file;
//! - `official default`: absent from the config, the official `LMModel` /
//!   `StreamingTransformer` default applies.
//!
//! Invariant: a constructor here returns a configuration the model crate
//! accepts; a test checks each one and the figures DESIGN.md gives for it.

use moshid_model::config::LmConfig;
use serde_json::{json, Value};

/// The seed of the random weights of these shapes (gpu-bench's models and
/// `moshid serve --random-weights`: one seed, one model).
pub const RANDOM_SEED: u64 = 0x6d6f_7368_6964;

/// The models with built-in shapes, by the names the benches take.
pub const MODELS: &[&str] = &["moshi7b", "hibiki2b", "hibiki1b", "hibiki-zero-3b"];

/// The built-in LM configuration called `name` (one of [`MODELS`]).
pub fn lm_config(name: &str) -> Option<LmConfig> {
    match name {
        "moshi7b" => Some(LmConfig::moshi_7b()),
        "hibiki2b" => Some(hibiki_2b()),
        "hibiki1b" => Some(hibiki_1b()),
        "hibiki-zero-3b" => Some(hibiki_zero_3b()),
        _ => None,
    }
}

/// The config.json of the built-in model `name`, in the published key
/// format; `None` for Moshi 7B, whose checkpoints ship none, and for an
/// unknown name.
pub fn config_json(name: &str) -> Option<Value> {
    match name {
        "hibiki2b" => Some(hibiki_2b_json()),
        "hibiki1b" => Some(hibiki_1b_json()),
        "hibiki-zero-3b" => Some(hibiki_zero_3b_json()),
        _ => None,
    }
}

fn parse(v: &Value, what: &str) -> LmConfig {
    LmConfig::from_json(v).unwrap_or_else(|e| panic!("the built-in {what} config is invalid: {e}"))
}

/// The delays of a Hibiki-style model with `dep_q` generated codebooks:
/// text 0, then for the generated and for the user streams each, the
/// semantic codebook 0 and the acoustic ones 2 (DESIGN.md: "delays 2";
/// golden: the hibiki variants' `[0, 0] + [2] * (dep_q − 1) + [0] + [2] *
/// (dep_q − 1)`).
fn hibiki_delays(dep_q: usize) -> Vec<usize> {
    let mut d = vec![0, 0];
    d.extend(std::iter::repeat_n(2, dep_q - 1));
    d.push(0);
    d.extend(std::iter::repeat_n(2, dep_q - 1));
    d
}

/// The `description` LUT conditioner and its fuser of the Hibiki 1B / 2B
/// configs (DESIGN.md: "`description` LUT conditioner with CFG"; golden:
/// the hibiki variant's conditioner; third-party: 31 bins of width 16).
fn description_conditioner(cfg: &mut Value) {
    cfg["conditioners"] = json!({
        "description": {
            "type": "lut",
            "lut": {
                "n_bins": 31,                                   // third-party, golden
                "dim": 16,                                      // third-party, golden
                "tokenizer": "noop",
                "possible_values": ["very_bad", "bad", "neutral", "good", "very_good"]
            }
        }
    });
    cfg["fuser"] = json!({
        "sum": ["description"], "cross": [], "prepend": [],
        "cross_attention_pos_emb": false, "cross_attention_pos_emb_scale": 1
    });
}

/// Hibiki 2B (`kyutai/hibiki-2b-pytorch-bf16`, French → English).
pub fn hibiki_2b() -> LmConfig {
    parse(&hibiki_2b_json(), "Hibiki 2B")
}

fn hibiki_2b_json() -> Value {
    let mut v = json!({
        "model_type": "hibiki",
        "dim": 2560,                                            // DESIGN.md
        "num_heads": 20,                                        // DESIGN.md
        "num_layers": 24,                                       // DESIGN.md
        "hidden_scale": 4.125,                                  // third-party
        "context": 1500,                                        // issue 14 (a copy of the published config); DESIGN.md's 500 is its README's 40 s
        "max_period": 100000,                                   // DESIGN.md
        "text_card": 48000,                                     // DESIGN.md
        "existing_text_padding_id": 3,                          // loaders.py
        "n_q": 32,                                              // DESIGN.md
        "dep_q": 16,                                            // DESIGN.md
        "card": 2048,                                           // loaders.py (Mimi's bins)
        "delays": hibiki_delays(16),
        "causal": true, "layer_scale": null,
        "gating": "silu", "norm": "rms_norm_f32", "positional_embedding": "rope", // loaders.py, as Moshi
        "depformer_dim": 1024,                                  // third-party
        "depformer_dim_feedforward": 3072,                      // third-party
        "depformer_num_heads": 16,                              // third-party
        "depformer_num_layers": 4,                              // DESIGN.md
        "depformer_layer_scale": null, "depformer_multi_linear": true,
        "depformer_max_period": 10000,                          // loaders.py, as Moshi
        "depformer_gating": "silu", "depformer_pos_emb": "none",
        "depformer_weights_per_step": true,
        "depformer_weights_per_step_schedule":                  // DESIGN.md (a schedule), third-party (9 sets)
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 8, 8, 8, 8],
        "depformer_low_rank_embeddings": 128,                   // DESIGN.md (low-rank), third-party (128)
        "tokenizer_name": "tokenizer_spm_48k_multi6_2.model"    // third-party
    });
    description_conditioner(&mut v);
    v
}

/// Hibiki 1B (`kyutai/hibiki-1b-pytorch-bf16`, "Hibiki-M", French →
/// English). The official loaders have no built-in config for it: it loads,
/// as Hibiki 2B does, from its repository's config.json.
pub fn hibiki_1b() -> LmConfig {
    parse(&hibiki_1b_json(), "Hibiki 1B")
}

fn hibiki_1b_json() -> Value {
    let mut v = json!({
        "model_type": "hibiki",
        "dim": 2048,                                            // third-party
        "num_heads": 16,                                        // third-party
        "num_layers": 16,                                       // third-party
        "hidden_scale": 4.125,                                  // third-party
        "context": 1500,                                        // third-party
        "max_period": 100000,                                   // third-party
        "text_card": 48000,                                     // third-party
        "existing_text_padding_id": 3,                          // third-party
        "n_q": 16,                                              // third-party
        "dep_q": 8,                                             // third-party
        "card": 2048,                                           // third-party
        "delays": hibiki_delays(8),                             // third-party
        "causal": true, "layer_scale": null,
        "gating": "silu", "norm": "rms_norm_f32", "positional_embedding": "rope", // third-party
        "depformer_dim": 1024,                                  // third-party
        "depformer_dim_feedforward": null,                      // third-party: hidden_scale · 1024
        "depformer_num_heads": 16,                              // third-party
        "depformer_num_layers": 6,                              // third-party
        "depformer_multi_linear": true, "depformer_pos_emb": "none",
        "depformer_weights_per_step": true,                     // third-party
        "mimi_name": "mimi-pytorch-e351c8d8@125.safetensors",   // third-party
        "tokenizer_name": "tokenizer_spm_48k_multi6_2.model"    // third-party
    });
    description_conditioner(&mut v);
    v
}

/// Hibiki-Zero 3B (`kyutai/hibiki-zero-3b-pytorch-bf16`, 2026: French,
/// Spanish, Portuguese and German → English): grouped-query attention,
/// RoPE over head halves, LayerNorms before the depformer heads, no
/// conditioner.
pub fn hibiki_zero_3b() -> LmConfig {
    parse(&hibiki_zero_3b_json(), "Hibiki-Zero 3B")
}

fn hibiki_zero_3b_json() -> Value {
    json!({
        "model_type": "hibiki",                                 // golden (the text_emb row copy applies)
        "dim": 2048,                                            // issue 14, DESIGN.md
        "num_heads": 16,                                        // issue 14, DESIGN.md
        "kv_repeat": 2,                                         // issue 14, DESIGN.md
        "num_layers": 28,                                       // issue 14, DESIGN.md
        "hidden_scale": 6,                                      // issue 14, DESIGN.md
        "context": 3000,                                        // issue 14, DESIGN.md
        "max_period": 20000,                                    // third-party, golden
        "positional_embedding": "rope_concat",                  // issue 14, DESIGN.md
        "text_card": 48000,                                     // third-party
        "existing_text_padding_id": 3,                          // third-party
        "n_q": 32,                                              // issue 14 (32 codebooks)
        "dep_q": 16,                                            // issue 14 (16 generated)
        "card": 2048,                                           // third-party (Mimi's bins)
        "delays": hibiki_delays(16),                            // third-party, golden
        "causal": true, "layer_scale": null,
        "gating": "silu", "norm": "rms_norm_f32",               // third-party
        "depformer_dim": 1024,                                  // issue 14, DESIGN.md
        "depformer_num_heads": 16,                              // issue 14
        "depformer_num_layers": 6,                              // issue 14, DESIGN.md
        "depformer_kv_repeat": 1,                               // third-party, golden
        "depformer_dim_feedforward": null,                      // issue 14, golden: hidden_scale · 1024
        "depformer_norm": "layer_norm",                         // issue 14, golden
        "depformer_multi_linear": true, "depformer_pos_emb": "none", // third-party, golden
        "depformer_weights_per_step": true,                     // issue 14
        "depformer_weights_per_step_schedule":                  // issue 14 (a schedule), third-party (9 sets)
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 8, 8, 8, 8],
        "demux_second_stream": false, "text_card_out": null,    // third-party
        "conditioners": {}, "cross_attention": false            // third-party, DESIGN.md (no conditioner)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshid_model::config::{ModelType, NormKind, PosEmb};
    use moshid_model::lm::Lm;

    fn params(c: &LmConfig) -> usize {
        Lm::tensor_specs(c).iter().map(|t| t.numel()).sum()
    }

    #[test]
    fn hibiki_2b_has_the_published_shape() {
        let c = hibiki_2b();
        assert_eq!(c.model_type, ModelType::Hibiki);
        assert_eq!((c.dim, c.num_heads, c.num_layers), (2560, 20, 24));
        assert_eq!((c.n_q, c.dep_q, c.text_card, c.card), (32, 16, 48000, 2048));
        assert_eq!(c.context, 1500);
        assert_eq!(c.max_period, 100_000.0);
        assert_eq!(c.delays.len(), 33);
        assert_eq!(
            (c.delays[0], c.delays[1], c.delays[2], c.delays[17]),
            (0, 0, 2, 0)
        );
        assert_eq!(c.max_delay(), 2);
        assert_eq!(c.ffn_hidden(), 7040);
        assert_eq!(c.depformer.num_weight_sets(c.dep_q), 9);
        assert_eq!(c.depformer.weight_set(15), 8);
        assert_eq!(c.depformer.low_rank_embeddings, Some(128));
        assert!(c.has_conditioners());
        assert_eq!(c.conditioners[0].possible_values.len(), 5);
        // DESIGN.md: 369 MB of bf16 KV cache per stream at context 1500.
        let mb = c.kv_bytes_per_stream(2) as f64 / 1e6;
        assert!((mb - 368.6).abs() < 0.5, "{mb}");
        // "Hibiki 2B": DESIGN.md gives 5.6 GB of bf16 weights.
        let gb = params(&c) as f64 * 2.0 / 1e9;
        assert!((gb - 5.6).abs() < 0.3, "{gb} GB");
    }

    #[test]
    fn hibiki_1b_is_hibiki_m() {
        let c = hibiki_1b();
        assert_eq!(
            (c.dim, c.num_heads, c.num_layers, c.context),
            (2048, 16, 16, 1500)
        );
        assert_eq!((c.n_q, c.dep_q), (16, 8));
        // depformer_dim_feedforward null: hidden_scale · depformer_dim, gated.
        assert_eq!(c.depformer.dim_feedforward, 4224);
        assert_eq!(c.depformer_ffn_hidden(), 2816);
        // "Hibiki-M … a 1.7B parameter hierarchical Transformer" (its model card).
        let b = params(&c) as f64 / 1e9;
        assert!((1.5..=1.9).contains(&b), "{b} B parameters");
    }

    #[test]
    fn hibiki_zero_3b_has_the_published_shape() {
        let c = hibiki_zero_3b();
        assert_eq!(c.model_type, ModelType::Hibiki);
        assert_eq!(
            (c.dim, c.num_heads, c.kv_repeat, c.num_layers),
            (2048, 16, 2, 28)
        );
        assert_eq!((c.n_q, c.dep_q, c.context), (32, 16, 3000));
        assert_eq!(c.pos_emb, PosEmb::RopeConcat);
        // hidden_scale 6: 12288 configured, 8192 gated.
        assert_eq!(c.ffn_hidden(), 8192);
        let d = &c.depformer;
        assert_eq!(
            (d.dim, d.num_heads, d.num_layers, d.kv_repeat),
            (1024, 16, 6, 1)
        );
        assert_eq!((d.dim_feedforward, c.depformer_ffn_hidden()), (6144, 4096));
        assert_eq!(d.norm, Some(NormKind::LayerNorm));
        assert_eq!(d.num_weight_sets(c.dep_q), 9);
        assert!(!c.has_conditioners());
        // DESIGN.md: 344 MB of bf16 KV per stream at context 3000 with GQA
        // (half of the 688 MB of 16 key/value heads).
        assert_eq!(c.kv_dim(), 1024);
        let mb = c.kv_bytes_per_stream(2) as f64 / 1e6;
        assert!((mb - 344.1).abs() < 0.5, "{mb}");
        // DESIGN.md: 6.3 GB of weights (bf16).
        let gb = params(&c) as f64 * 2.0 / 1e9;
        assert!((gb - 6.3).abs() < 0.3, "{gb} GB");
    }

    #[test]
    fn every_name_resolves() {
        for m in MODELS {
            assert!(lm_config(m).is_some(), "{m}");
        }
        assert!(lm_config("gpt").is_none());
        assert_eq!(lm_config("moshi7b").unwrap().dim, 4096);
    }
}
