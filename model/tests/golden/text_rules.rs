//! Kyutai's text sampling keys on a real (tiny) model: a greedy run with a
//! repetition penalty and `pad_mult` chooses, at every step, the argmax of
//! the rule applied by hand to the logits of an unmodified run (while both
//! runs saw the same tokens), and the rule changes at least one choice; a
//! seeded sampling run's padding rate follows `pad_mult`.

use moshid_model::checkpoint::CheckpointDir;
use moshid_model::lm::{GenParams, Lm};
use std::path::Path;

fn moshi_tiny() -> Lm {
    let dir = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/golden/moshi-tiny"
    ));
    let d = CheckpointDir::open(dir).unwrap();
    let mut w = d.open_lm_weights().unwrap();
    let lm = Lm::load(&d.lm, &mut w).unwrap();
    w.finish().unwrap();
    lm
}

/// Deterministic user codes for frame `t`.
fn codes(lm: &Lm, t: usize, out: &mut [u32]) {
    let card = lm.config().card as u64;
    for (k, o) in out.iter_mut().enumerate() {
        *o = ((t as u64 * 7919 + k as u64 * 104_729) % card) as u32;
    }
}

#[test]
fn greedy_choices_follow_the_rule() {
    let lm = moshi_tiny();
    let cfg = lm.config().clone();
    let pad = cfg.existing_text_padding_id as usize;
    let (context, penalty, pad_mult) = (6usize, 1.8f32, -0.7f32);
    let ruled = GenParams {
        pad_mult,
        repetition_penalty: Some((context, penalty)),
        ..GenParams::greedy()
    };
    let mut st = lm.new_state(2);
    lm.reset_slot(&mut st, 0, &GenParams::greedy()).unwrap();
    lm.reset_slot(&mut st, 1, &ruled).unwrap();
    let mut out = lm.new_output(2);
    let nu = cfg.num_user_codebooks();
    let mut user = vec![0u32; 2 * nu];
    let mut history: Vec<u32> = Vec::new();
    let mut changed = 0;
    for t in 0..40 {
        codes(&lm, t, &mut user[..nu]);
        user.copy_within(..nu, nu);
        lm.step(&mut st, &user, &[true, true], &mut out);
        // The rule by hand on the plain run's logits.
        let mut l = out.text_logits(0).to_vec();
        let mut seen = Vec::new();
        for &tok in history.iter().rev().take(context) {
            if !seen.contains(&tok) {
                seen.push(tok);
                let v = &mut l[tok as usize];
                *v = if *v >= 0.0 {
                    *v / penalty
                } else {
                    *v * penalty
                };
            }
        }
        l[pad] += pad_mult;
        let want = (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b });
        let plain = (0..l.len()).fold(0, |b, i| {
            let p = out.text_logits(0);
            if p[i] > p[b] {
                i
            } else {
                b
            }
        });
        let got = out.text_logits(1);
        let chosen = (0..got.len()).fold(0, |b, i| if got[i] > got[b] { i } else { b });
        assert_eq!(chosen, want, "step {t}: the ruled run's choice");
        if want != plain {
            changed += 1;
            break;
        }
        if want != pad && want != 0 {
            history.push(want as u32);
        }
    }
    assert!(
        changed > 0,
        "the rule never changed a choice: the test proves nothing"
    );
}

fn pad_rate(lm: &Lm, pad_mult: f32) -> f64 {
    let cfg = lm.config();
    let params = GenParams {
        pad_mult,
        seed: 1234,
        ..GenParams::default()
    };
    let mut st = lm.new_state(1);
    lm.reset_slot(&mut st, 0, &params).unwrap();
    let mut out = lm.new_output(1);
    let mut user = vec![0u32; cfg.num_user_codebooks()];
    let (mut pads, mut n) = (0, 0);
    for t in 0..300 {
        codes(lm, t, &mut user);
        lm.step(&mut st, &user, &[true], &mut out);
        if let Some(tok) = out.text_token(0) {
            n += 1;
            pads += usize::from(tok == cfg.existing_text_padding_id);
        }
    }
    pads as f64 / n as f64
}

#[test]
fn pad_mult_moves_the_padding_rate() {
    let lm = moshi_tiny();
    let (low, mid, high) = (pad_rate(&lm, -3.0), pad_rate(&lm, 0.0), pad_rate(&lm, 3.0));
    eprintln!("padding rate: pad_mult -3 {low:.3}, 0 {mid:.3}, +3 {high:.3}");
    assert!(low <= mid && mid < high, "{low} {mid} {high}");
    assert!(
        high - low > 0.1,
        "pad_mult barely moved the rate: {low} .. {high}"
    );
}
