//! Tests of the config readers: the golden configs and built-in presets
//! parse, and unknown keys, bad values and inconsistent settings are refused
//! with errors naming the key.

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
