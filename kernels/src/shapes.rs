//! Built-in shapes of the published models, for benches and memory plans run
//! without their checkpoints (`gpu-bench` steps randomly initialised models of
//! exactly these shapes).
//!
//! Moshi 7B is [`LmConfig::moshi_7b`] (its checkpoints ship no config.json).
//! Hibiki 2B's checkpoint ships one; [`hibiki_2b`] writes its values as a JSON
//! literal in the same key format and parses it with [`LmConfig::from_json`],
//! the parser every config.json goes through, so it is validated like one.
//!
//! Invariant: a constructor here returns a configuration the model crate
//! accepts; a test checks each one and the figures DESIGN.md gives for it.

use moshid_model::config::LmConfig;

/// The models with built-in shapes, by the names the benches take.
pub const MODELS: &[&str] = &["moshi7b", "hibiki2b"];

/// The built-in LM configuration called `name` (one of [`MODELS`]).
pub fn lm_config(name: &str) -> Option<LmConfig> {
    match name {
        "moshi7b" => Some(LmConfig::moshi_7b()),
        "hibiki2b" => Some(hibiki_2b()),
        _ => None,
    }
}

/// Hibiki 2B (`kyutai/hibiki-2b-pytorch-bf16`): dim 2560, 20 heads, 24
/// layers, RoPE period 1e5, text_card 48000, 32 audio codebooks of which the
/// depformer generates 16, delays 0 for the text and each semantic codebook
/// and 2 for the acoustic ones; a 4-layer depformer (dim 1024, 16 heads) with
/// 9 weight sets over its 16 steps and rank-128 embeddings; a `description`
/// LUT conditioner summed into the input (used with classifier-free guidance).
///
/// The context is 500 steps, as DESIGN.md records. A third-party inspection
/// of the published config.json lists `"context": 1500`; until the real file
/// is read, treat the context as unconfirmed (`gpu-bench --context` overrides
/// it; the KV cache scales with it).
pub fn hibiki_2b() -> LmConfig {
    let v: serde_json::Value =
        serde_json::from_str(HIBIKI_2B_CONFIG).expect("the built-in Hibiki 2B config is JSON");
    LmConfig::from_json(&v).expect("the built-in Hibiki 2B config is valid")
}

/// Hibiki 2B's config.json (see [`hibiki_2b`]).
const HIBIKI_2B_CONFIG: &str = r#"{
  "model_type": "hibiki",
  "dim": 2560, "text_card": 48000, "existing_text_padding_id": 3,
  "n_q": 32, "dep_q": 16, "card": 2048,
  "num_heads": 20, "num_layers": 24, "hidden_scale": 4.125,
  "causal": true, "layer_scale": null, "context": 500, "max_period": 100000,
  "gating": "silu", "norm": "rms_norm_f32", "positional_embedding": "rope",
  "depformer_dim": 1024, "depformer_dim_feedforward": 3072,
  "depformer_num_heads": 16, "depformer_num_layers": 4,
  "depformer_layer_scale": null, "depformer_multi_linear": true,
  "depformer_context": 16, "depformer_max_period": 10000,
  "depformer_gating": "silu", "depformer_pos_emb": "none",
  "depformer_weights_per_step": true,
  "depformer_weights_per_step_schedule": [0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 8, 8, 8, 8],
  "depformer_low_rank_embeddings": 128,
  "delays": [0,
             0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
             0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2],
  "conditioners": {
    "description": {
      "type": "lut",
      "lut": {
        "n_bins": 31, "dim": 16, "tokenizer": "noop",
        "possible_values": ["very_bad", "bad", "neutral", "good", "very_good"]
      }
    }
  },
  "fuser": {
    "sum": ["description"], "cross": [], "prepend": [],
    "cross_attention_pos_emb": false, "cross_attention_pos_emb_scale": 1
  },
  "lm_gen_config": {"temp": 0.8, "temp_text": 0.8, "top_k": 250, "top_k_text": 50},
  "tokenizer_name": "tokenizer_spm_48k_multi6_2.model"
}"#;

#[cfg(test)]
mod tests {
    use super::*;
    use moshid_model::config::ModelType;

    #[test]
    fn hibiki_2b_has_the_published_shape() {
        let c = hibiki_2b();
        assert_eq!(c.model_type, ModelType::Hibiki);
        assert_eq!((c.dim, c.num_heads, c.num_layers), (2560, 20, 24));
        assert_eq!((c.n_q, c.dep_q, c.text_card, c.card), (32, 16, 48000, 2048));
        assert_eq!(c.context, 500);
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
        // DESIGN.md: 123 MB of bf16 KV cache per stream at context 500.
        let mb = c.kv_bytes_per_stream(2) as f64 / 1e6;
        assert!((mb - 122.9).abs() < 0.5, "{mb}");
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
