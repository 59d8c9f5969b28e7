//! The session query parser: the query string of `/api/chat` decoded
//! (`http::parse_query`) into session parameters (`session_params`) for a
//! Moshi-shaped model with a conditioner and for a Hibiki-shaped one.
//!
//! Checked: no panic; accepted parameters are within the documented ranges
//! (Kyutai's text keys included, never with guidance); the prompt keys parse
//! within their bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid::config::GenDefaults;
use moshid::http::parse_query;
use moshid::session::params::{session_params, ModelInfo};

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(pairs) = parse_query(query) else {
        return;
    };
    assert!(pairs.len() <= moshid::http::MAX_QUERY_PARAMS);
    let defaults = GenDefaults::default();
    let models = [
        ModelInfo::default(),
        ModelInfo {
            conditioners: vec![(
                "description".into(),
                vec!["very_good".into(), "very_bad".into()],
            )],
            is_hibiki: true,
            ..ModelInfo::default()
        },
    ];
    for model in &models {
        let Ok(p) = session_params(&pairs, &defaults, model) else {
            continue;
        };
        let g = &p.gen;
        for t in [g.temp, g.temp_text] {
            assert!((0.0..=10.0).contains(&t), "temperature {t}");
        }
        for k in [g.top_k, g.top_k_text] {
            assert!((1..=1_000_000).contains(&k), "top-k {k}");
        }
        assert!(
            (0.0..=100.0).contains(&g.cfg_coef),
            "cfg_coef {}",
            g.cfg_coef
        );
        assert!((-10.0..=10.0).contains(&g.pad_mult), "pad_mult {}", g.pad_mult);
        if let Some((c, p)) = g.repetition_penalty {
            assert!((1..=512).contains(&c) && (0.1..=10.0).contains(&p), "penalty {c} {p}");
            assert!(g.cfg_coef == 1.0, "the text keys with guidance");
        }
        let keys = moshid::session::prompt::prompt_keys(&pairs, true);
        if let Ok(k) = keys {
            assert!(k.text.len() <= moshid::session::prompt::MAX_TEXT_PROMPT_BYTES);
        }
        for (name, value) in g.conditions.iter().chain(&g.null_conditions) {
            let (_, values) = model
                .conditioners
                .iter()
                .find(|(n, _)| n == name)
                .expect("known conditioner");
            assert!(values.contains(value));
        }
    }
});
