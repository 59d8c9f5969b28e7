//! Unit tests of the LM step on small random checkpoints.

use super::transformer::{AttnRow, StackScratch};
use super::*;
use rand_core::RngCore;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::Path;

fn config(conditioned: bool, context: usize) -> LmConfig {
    let mut v = serde_json::json!({
        "dim": 32, "text_card": 24, "existing_text_padding_id": 3, "n_q": 6, "dep_q": 3,
        "card": 16, "num_heads": 4, "num_layers": 2, "hidden_scale": 4.125, "causal": true,
        "context": context, "max_period": 10000, "gating": "silu", "norm": "rms_norm_f32",
        "positional_embedding": "rope", "depformer_dim": 16, "depformer_dim_feedforward": 66,
        "depformer_num_heads": 2, "depformer_num_layers": 2, "depformer_multi_linear": true,
        "depformer_context": 3, "depformer_max_period": 10000, "depformer_gating": "silu",
        "depformer_pos_emb": "none", "depformer_weights_per_step": true,
        "delays": [0, 0, 1, 1, 0, 1, 1]
    });
    if conditioned {
        let o = v.as_object_mut().unwrap();
        o.insert("model_type".into(), "hibiki".into());
        o.insert(
            "depformer_weights_per_step_schedule".into(),
            serde_json::json!([0, 1, 1]),
        );
        o.insert("depformer_low_rank_embeddings".into(), 6.into());
        o.insert("depformer_pos_emb".into(), "rope".into());
        o.insert("delays".into(), serde_json::json!([0, 0, 2, 2, 0, 2, 2]));
        o.insert(
            "conditioners".into(),
            serde_json::json!({"description": {"type": "lut", "lut": {"n_bins": 7, "dim": 8,
                "tokenizer": "noop", "possible_values": ["very_bad", "bad", "good", "very_good"]}}}),
        );
        o.insert(
            "fuser".into(),
            serde_json::json!({"sum": ["description"], "cross": [], "prepend": []}),
        );
    }
    LmConfig::from_json(&v).unwrap()
}

/// Writes a checkpoint with every tensor of `cfg`, random but well scaled.
fn write_checkpoint(cfg: &LmConfig, path: &Path, seed: u64) {
    let mut rng = slot_rng(seed);
    let specs = Lm::tensor_specs(cfg);
    let data: Vec<Vec<u8>> = specs
        .iter()
        .map(|s| {
            let fan = if s.shape.len() == 2 { s.shape[1] } else { 1 };
            let a = (3.0 / fan as f32).sqrt();
            (0..s.numel())
                .flat_map(|_| {
                    let u = (rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
                    let v = if s.name.ends_with("alpha") {
                        1.0 + 0.1 * u
                    } else {
                        a * u
                    };
                    v.to_le_bytes()
                })
                .collect()
        })
        .collect();
    let views: Vec<(String, TensorView)> = specs
        .iter()
        .zip(&data)
        .map(|(s, d)| {
            (
                s.name.clone(),
                TensorView::new(Dtype::F32, s.shape.clone(), d).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn model(conditioned: bool, context: usize) -> Lm {
    let cfg = config(conditioned, context);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("lm.safetensors");
    write_checkpoint(&cfg, &p, 11);
    let mut w = Weights::open(&p).unwrap();
    let lm = Lm::load(&cfg, &mut w).unwrap();
    w.finish().unwrap();
    lm
}

/// Deterministic user codes for stream `id` at step `t`.
fn codes(lm: &Lm, id: u64, t: usize, out: &mut [u32]) {
    let mut rng = slot_rng(id * 1000 + t as u64);
    for c in out.iter_mut() {
        *c = (rng.next_u32() % lm.config().card as u32) as u32;
    }
}

/// One slot's outputs: per step, the output frame (or None) and the logits.
type Trace = Vec<(Option<Vec<u32>>, Vec<f32>)>;

/// Runs `steps` frames of stream `id` alone in a fresh 1-slot state.
fn alone(lm: &Lm, id: u64, params: &GenParams, steps: usize) -> Trace {
    let mut st = lm.new_state(1);
    let mut out = lm.new_output(1);
    lm.reset_slot(&mut st, 0, params).unwrap();
    let nu = lm.config().num_user_codebooks();
    let mut c = vec![0; nu];
    (0..steps)
        .map(|t| {
            codes(lm, id, t, &mut c);
            lm.step(&mut st, &c, &[true], &mut out);
            (
                out.tokens(0).map(<[u32]>::to_vec),
                out.text_logits(0).to_vec(),
            )
        })
        .collect()
}

fn sampled(seed: u64) -> GenParams {
    GenParams {
        seed,
        top_k: 5,
        top_k_text: 4,
        ..GenParams::default()
    }
}

#[test]
fn specs_match_what_load_takes() {
    // `finish` inside `model` fails on any tensor `load` did not take.
    for conditioned in [false, true] {
        let lm = model(conditioned, 4);
        let specs = Lm::tensor_specs(lm.config());
        let n = specs.len();
        let mut names: Vec<_> = specs.into_iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate tensor names");
    }
}

#[test]
fn ring_kv_wrap_equals_unbounded_window() {
    let lm = model(false, 3);
    let ring = &lm.temporal;
    let wide = ring.with_window(64, 3);
    let all = ring.with_window(64, 64);
    let d = lm.config().dim;
    let mut sc = StackScratch::new(2, &[all.shape()]);
    let mut kv_a = vec![0.0; 2 * ring.kv_row_len()];
    let mut kv_b = vec![0.0; 2 * wide.kv_row_len()];
    let mut rng = slot_rng(5);
    // Two rows at different positions: row 1 starts 4 steps later.
    for t in 0..12 {
        let rows: Vec<AttnRow> = (0..2)
            .filter(|&r| t >= 4 * r)
            .map(|r| AttnRow {
                kv_row: r,
                pos: t - 4 * r,
            })
            .collect();
        let x0: Vec<f32> = (0..rows.len() * d)
            .map(|_| (rng.next_u32() % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let (mut xa, mut xb) = (x0.clone(), x0.clone());
        ring.forward(0, &mut xa, &rows, &mut kv_a, &mut sc);
        wide.forward(0, &mut xb, &rows, &mut kv_b, &mut sc);
        assert_eq!(xa, xb, "ring and unbounded cache differ at step {t}");
    }
    // And the window matters: an unbounded window gives other numbers.
    let mut kv_c = vec![0.0; all.kv_row_len()];
    let mut kv_d = vec![0.0; ring.kv_row_len()];
    let mut differ = false;
    for t in 0..6 {
        let rows = [AttnRow { kv_row: 0, pos: t }];
        let x0: Vec<f32> = (0..d).map(|i| ((i + t) as f32 * 0.3).sin()).collect();
        let (mut xa, mut xc) = (x0.clone(), x0);
        ring.forward(0, &mut xa, &rows, &mut kv_d, &mut sc);
        all.forward(0, &mut xc, &rows, &mut kv_c, &mut sc);
        differ |= t >= 3 && xa != xc;
    }
    assert!(differ, "context window had no effect");
}

#[test]
fn slots_at_different_offsets_match_solo_runs() {
    // RoPE and the caches use each slot's own offset: streams started at
    // different steps, sharing the batch, equal their solo runs.
    for conditioned in [false, true] {
        let lm = model(conditioned, 4);
        let params = |i: u64| {
            let p = if i == 1 {
                GenParams::greedy()
            } else {
                sampled(i)
            };
            if conditioned {
                p.with_hibiki_conditions(if i == 2 { 1.0 } else { 2.5 })
            } else {
                p
            }
        };
        let starts = [0usize, 3, 5];
        let steps = 10;
        let solo: Vec<Trace> = (0..3)
            .map(|i| alone(&lm, i as u64, &params(i as u64), steps))
            .collect();
        let mut st = lm.new_state(3);
        let mut out = lm.new_output(3);
        let nu = lm.config().num_user_codebooks();
        let mut c = vec![0; 3 * nu];
        for t in 0..steps + 5 {
            let mut active = [false; 3];
            for i in 0..3 {
                if t == starts[i] {
                    lm.reset_slot(&mut st, i, &params(i as u64)).unwrap();
                }
                let local = t.wrapping_sub(starts[i]);
                active[i] = t >= starts[i] && local < steps;
                if active[i] {
                    codes(&lm, i as u64, local, &mut c[i * nu..(i + 1) * nu]);
                }
            }
            lm.step(&mut st, &c, &active, &mut out);
            for i in 0..3 {
                if active[i] {
                    let local = t - starts[i];
                    let (tok, logits) = &solo[i][local];
                    assert_eq!(
                        out.tokens(i).map(<[u32]>::to_vec),
                        *tok,
                        "slot {i} step {local}"
                    );
                    assert_eq!(
                        out.text_logits(i),
                        &logits[..],
                        "slot {i} step {local} logits"
                    );
                } else {
                    assert!(!out.stepped(i) && out.tokens(i).is_none());
                }
            }
        }
    }
}

#[test]
fn inactive_slot_does_not_advance() {
    let lm = model(false, 4);
    let solo = alone(&lm, 9, &sampled(9), 8);
    let mut st = lm.new_state(2);
    let mut out = lm.new_output(2);
    lm.reset_slot(&mut st, 1, &sampled(9)).unwrap();
    let nu = lm.config().num_user_codebooks();
    let mut c = vec![0; 2 * nu];
    let pattern = [
        true, false, true, true, false, false, true, true, true, false, true, true,
    ];
    let mut local = 0;
    for (t, &on) in pattern.iter().enumerate() {
        codes(&lm, 9, local, &mut c[nu..]);
        codes(&lm, 1, t, &mut c[..nu]);
        lm.step(&mut st, &c, &[true, on], &mut out);
        if on {
            assert_eq!(
                out.tokens(1).map(<[u32]>::to_vec),
                solo[local].0,
                "step {local}"
            );
            local += 1;
        } else {
            assert!(out.tokens(1).is_none() && !out.stepped(1));
        }
        assert_eq!(st.offset(1), local);
        assert_eq!(st.offset(0), t + 1);
    }
}

#[test]
fn reset_slot_equals_fresh() {
    for conditioned in [false, true] {
        let lm = model(conditioned, 3);
        let p = if conditioned {
            sampled(4).with_hibiki_conditions(3.0)
        } else {
            sampled(4)
        };
        let solo = alone(&lm, 4, &p, 9);
        let mut st = lm.new_state(1);
        let mut out = lm.new_output(1);
        let nu = lm.config().num_user_codebooks();
        let mut c = vec![0; nu];
        let other = if conditioned {
            sampled(77).with_hibiki_conditions(1.0)
        } else {
            GenParams::greedy()
        };
        lm.reset_slot(&mut st, 0, &other).unwrap();
        for t in 0..7 {
            codes(&lm, 50, t, &mut c);
            lm.step(&mut st, &c, &[true], &mut out);
        }
        lm.reset_slot(&mut st, 0, &p).unwrap();
        for (t, want) in solo.iter().enumerate() {
            codes(&lm, 4, t, &mut c);
            lm.step(&mut st, &c, &[true], &mut out);
            assert_eq!(out.tokens(0).map(<[u32]>::to_vec), want.0, "step {t}");
            assert_eq!(out.text_logits(0), &want.1[..], "step {t}");
        }
    }
}

#[test]
fn first_max_delay_steps_have_no_output() {
    let lm = model(true, 4);
    let trace = alone(&lm, 1, &GenParams::greedy(), 5);
    let md = lm.config().max_delay();
    for (t, (tok, _)) in trace.iter().enumerate() {
        assert_eq!(tok.is_some(), t >= md, "step {t}");
    }
}

#[test]
fn bad_params_are_named() {
    let lm = model(true, 4);
    let mut st = lm.new_state(2);
    let mut p = GenParams::greedy().with_hibiki_conditions(3.0);
    p.conditions[0].1 = "superb".into();
    let e = lm.reset_slot(&mut st, 0, &p).unwrap_err().to_string();
    assert!(e.contains("superb") && e.contains("description"), "{e}");
    let mut p = GenParams::greedy();
    p.conditions = vec![("mood".into(), "good".into())];
    let e = lm.reset_slot(&mut st, 0, &p).unwrap_err().to_string();
    assert!(e.contains("mood"), "{e}");
    let e = lm
        .reset_slot(&mut st, 2, &GenParams::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("slot 2"), "{e}");
    let plain = model(false, 4);
    let mut st = plain.new_state(1);
    let p = GenParams {
        cfg_coef: 2.0,
        ..GenParams::default()
    };
    assert!(matches!(
        plain.reset_slot(&mut st, 0, &p),
        Err(ParamError::CfgWithoutConditioners(_))
    ));
    let p = GenParams {
        temp: f32::NAN,
        ..GenParams::default()
    };
    assert!(plain
        .reset_slot(&mut st, 0, &p)
        .unwrap_err()
        .to_string()
        .contains("temp"));
}

#[test]
fn end_of_stream_rules() {
    let h = model(true, 4);
    assert_eq!(
        h.end_of_stream(),
        EndOfStream::DrainUntilText {
            eos_user_code: 16,
            text_eos_id: 2
        }
    );
    let mut c = [0u32; 3];
    h.end_of_stream_user_codes(&mut c);
    assert_eq!(c, [16; 3]);
    assert_eq!(model(false, 4).end_of_stream(), EndOfStream::WithInput);
    // The end-of-stream codes are valid input.
    let mut st = h.new_state(1);
    let mut out = h.new_output(1);
    h.step(&mut st, &c, &[true], &mut out);
}

#[test]
fn hibiki_rule_copies_padding_row() {
    let cfg = config(true, 4);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("lm.safetensors");
    write_checkpoint(&cfg, &p, 3);
    let raw = Weights::open(&p)
        .unwrap()
        .take("text_emb.weight", &[25, 32])
        .unwrap();
    let lm = Lm::load(&cfg, &mut Weights::open(&p).unwrap()).unwrap();
    assert_eq!(lm.text_emb.row(2), &raw[3 * 32..4 * 32]);
    assert_eq!(lm.text_emb.row(4), &raw[4 * 32..5 * 32]);
    assert_ne!(&raw[2 * 32..3 * 32], &raw[3 * 32..4 * 32]);
}
