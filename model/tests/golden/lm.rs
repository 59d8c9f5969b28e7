//! The LM step against the golden fixtures made by the official
//! implementation (`shared/golden/make_golden.py`): greedy tokens exact, text
//! logits within 1e-4 relative error, slot reuse exact, and the same tokens
//! when the streams sit in other slots of a bigger, busier batch.
//!
//! Fixture folders: every folder of `shared/golden` that holds an
//! `lm_config.json`, `shared/golden-next/hibiki-zero-tiny`, and the folders
//! of `MOSHID_GOLDEN` (colon-separated).
//!
//! One deliberate difference: the official `LMGen` keeps a batch-wide
//! `offset_cpu` and returns `None` for the whole batch during the `max_delay`
//! steps after any slot reset, so `lm_tokens_out_slot_reuse` has −1 there for
//! the slots that were *not* reset. Our slots are independent: those slots
//! keep producing, and their tokens must equal the undisturbed run
//! (`lm_tokens_out`), which is what is checked at those steps.

use moshid_model::checkpoint::CheckpointDir;
use moshid_model::lm::{GenParams, Lm, LmStepOutput};
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};

use super::alloc_count::ALLOCS;
use super::fixtures::{tensor_f32, tensor_i64};

const STREAMS: usize = 3;

fn fixture_dirs() -> Vec<PathBuf> {
    super::fixtures::fixture_dirs("lm_config.json")
}

struct Fixture {
    name: String,
    lm: Lm,
    /// Frames.
    t: usize,
    /// Codebooks in `mimi_codes`.
    n_codes: usize,
    codes: Vec<i64>,
    tokens: Vec<i64>,
    logits: Vec<f32>,
    reuse: Vec<i64>,
    reuse_step: usize,
}

fn load(dir: &Path) -> Fixture {
    let d = CheckpointDir::open(dir).unwrap();
    let cfg = d.lm.clone();
    let mut w = d.open_lm_weights().unwrap();
    w.checkpoint().validate(&Lm::tensor_specs(&cfg)).unwrap();
    let lm = Lm::load(&cfg, &mut w).unwrap();
    w.finish().unwrap();
    let bytes = std::fs::read(dir.join("io.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (codes, cs) = tensor_i64(&st, "mimi_codes");
    let (tokens, ts) = tensor_i64(&st, "lm_tokens_out");
    let (logits, ls) = tensor_f32(&st, "lm_text_logits");
    let (reuse, _) = tensor_i64(&st, "lm_tokens_out_slot_reuse");
    let (r, _) = tensor_i64(&st, "slot_reuse_step");
    assert_eq!(cs[0], STREAMS);
    assert_eq!(ts, [STREAMS, 1 + cfg.dep_q, cs[2]]);
    assert_eq!(ls, [STREAMS, cs[2], cfg.text_card]);
    assert!(cs[1] >= cfg.num_user_codebooks());
    Fixture {
        name: dir.display().to_string(),
        lm,
        t: cs[2],
        n_codes: cs[1],
        codes,
        tokens,
        logits,
        reuse,
        reuse_step: r[0] as usize,
    }
}

/// The parameters the fixtures were generated with.
fn params(lm: &Lm) -> GenParams {
    if lm.config().has_conditioners() {
        GenParams::greedy().with_hibiki_conditions(3.0)
    } else {
        GenParams::greedy()
    }
}

impl Fixture {
    fn width(&self) -> usize {
        1 + self.lm.config().dep_q
    }

    /// Writes stream `s`'s user codes of frame `t` into `out`.
    fn user_codes(&self, s: usize, t: usize, out: &mut [u32]) {
        for (k, o) in out.iter_mut().enumerate() {
            *o = self.codes[(s * self.n_codes + k) * self.t + t] as u32;
        }
    }

    fn expected(&self, tensor: &[i64], s: usize, t: usize, k: usize) -> i64 {
        tensor[(s * self.width() + k) * self.t + t]
    }

    /// Compares one slot's output with `tensor[s, :, t]`, recording mismatches.
    fn check(
        &self,
        what: &str,
        tensor: &[i64],
        s: usize,
        t: usize,
        got: Option<&[u32]>,
        errs: &mut Vec<String>,
    ) {
        for k in 0..self.width() {
            let want = self.expected(tensor, s, t, k);
            let have = got.map_or(-1, |g| g[k] as i64);
            if want != have {
                errs.push(format!(
                    "{}: {what}, stream {s}, step {t}, codebook {k}: expected {want}, got {have}",
                    self.name
                ));
            }
        }
    }
}

fn report(errs: Vec<String>) {
    if !errs.is_empty() {
        let n = errs.len();
        let head: Vec<_> = errs.into_iter().take(20).collect();
        panic!("{n} mismatches:\n{}", head.join("\n"));
    }
}

fn step(
    f: &Fixture,
    st: &mut moshid_model::lm::LmState,
    codes: &[u32],
    active: &[bool],
    out: &mut LmStepOutput,
) {
    f.lm.step(st, codes, active, out);
}

#[test]
fn greedy_tokens_and_text_logits() {
    let dirs = fixture_dirs();
    assert!(!dirs.is_empty(), "no fixture folders");
    let mut errs = Vec::new();
    for dir in dirs {
        let f = load(&dir);
        let (nu, tc) = (f.lm.config().num_user_codebooks(), f.lm.config().text_card);
        let mut st = f.lm.new_state(STREAMS);
        let mut out = f.lm.new_output(STREAMS);
        for s in 0..STREAMS {
            f.lm.reset_slot(&mut st, s, &params(&f.lm)).unwrap();
        }
        let mut codes = vec![0; STREAMS * nu];
        let mut logits = vec![0.0f32; STREAMS * f.t * tc];
        for t in 0..f.t {
            for s in 0..STREAMS {
                f.user_codes(s, t, &mut codes[s * nu..(s + 1) * nu]);
            }
            step(&f, &mut st, &codes, &[true; STREAMS], &mut out);
            for s in 0..STREAMS {
                f.check("lm_tokens_out", &f.tokens, s, t, out.tokens(s), &mut errs);
                logits[(s * f.t + t) * tc..(s * f.t + t + 1) * tc]
                    .copy_from_slice(out.text_logits(s));
            }
        }
        let mut worst = 0.0f64;
        for s in 0..STREAMS {
            let r = s * f.t * tc..(s + 1) * f.t * tc;
            let (num, den) = logits[r.clone()]
                .iter()
                .zip(&f.logits[r])
                .fold((0.0, 0.0), |(n, d), (&a, &b)| {
                    (n + ((a - b) as f64).powi(2), d + (b as f64).powi(2))
                });
            let rel = (num / den).sqrt();
            worst = worst.max(rel);
            if rel.is_nan() || rel > 1e-4 {
                errs.push(format!(
                    "{}: lm_text_logits, stream {s}: relative error {rel:.3e} > 1e-4",
                    f.name
                ));
            }
        }
        eprintln!("{}: text logits max relative error {worst:.3e}", f.name);
    }
    report(errs);
}

#[test]
fn slot_reuse() {
    let mut errs = Vec::new();
    for dir in fixture_dirs() {
        let f = load(&dir);
        let nu = f.lm.config().num_user_codebooks();
        let md = f.lm.config().max_delay();
        let r = f.reuse_step;
        let mut st = f.lm.new_state(STREAMS);
        let mut out = f.lm.new_output(STREAMS);
        for s in 0..STREAMS {
            f.lm.reset_slot(&mut st, s, &params(&f.lm)).unwrap();
        }
        let mut codes = vec![0; STREAMS * nu];
        for t in 0..f.t {
            if t == r {
                f.lm.reset_slot(&mut st, 1, &params(&f.lm)).unwrap();
            }
            for s in 0..STREAMS {
                let (src, tt) = if s == 1 && t >= r { (2, t - r) } else { (s, t) };
                f.user_codes(src, tt, &mut codes[s * nu..(s + 1) * nu]);
            }
            step(&f, &mut st, &codes, &[true; STREAMS], &mut out);
            for s in 0..STREAMS {
                let batch_wide_none = s != 1 && t >= r && t < r + md;
                if batch_wide_none {
                    // The official batch-wide `None` (see the module docs).
                    f.check(
                        "lm_tokens_out_slot_reuse (-1 by batch-wide offset)",
                        &f.reuse,
                        s,
                        t,
                        None,
                        &mut errs,
                    );
                    f.check(
                        "lm_tokens_out (slot not reset)",
                        &f.tokens,
                        s,
                        t,
                        out.tokens(s),
                        &mut errs,
                    );
                } else {
                    f.check(
                        "lm_tokens_out_slot_reuse",
                        &f.reuse,
                        s,
                        t,
                        out.tokens(s),
                        &mut errs,
                    );
                }
            }
        }
    }
    report(errs);
}

#[test]
fn streams_in_a_bigger_busier_batch() {
    // Streams 0, 1, 2 in slots 4, 0, 2 of 5. Slot 1 samples stream 0's codes
    // backwards; slot 3 samples stream 1's codes and runs every other step;
    // slot 2 (stream 2) pauses twice. Outputs must equal the fixture.
    const SLOTS: usize = 5;
    let place = [4usize, 0, 2];
    let mut errs = Vec::new();
    for dir in fixture_dirs() {
        let f = load(&dir);
        let nu = f.lm.config().num_user_codebooks();
        let mut st = f.lm.new_state(SLOTS);
        let mut out = f.lm.new_output(SLOTS);
        for &s in &place {
            f.lm.reset_slot(&mut st, s, &params(&f.lm)).unwrap();
        }
        let busy = |seed| GenParams {
            seed,
            cfg_coef: if f.lm.config().has_conditioners() {
                2.0
            } else {
                1.0
            },
            ..params(&f.lm)
        };
        f.lm.reset_slot(
            &mut st,
            1,
            &GenParams {
                use_sampling: true,
                ..busy(7)
            },
        )
        .unwrap();
        f.lm.reset_slot(
            &mut st,
            3,
            &GenParams {
                use_sampling: true,
                ..busy(8)
            },
        )
        .unwrap();
        let pauses = [3usize, 4, f.t / 2 + 2];
        let mut local = [0usize; 3];
        let mut codes = vec![0; SLOTS * nu];
        let mut iter = 0;
        while local.iter().any(|&l| l < f.t) {
            let mut active = [false; SLOTS];
            for (i, &s) in place.iter().enumerate() {
                active[s] = local[i] < f.t && !(i == 2 && pauses.contains(&iter));
                if active[s] {
                    f.user_codes(i, local[i], &mut codes[s * nu..(s + 1) * nu]);
                }
            }
            active[1] = true;
            f.user_codes(0, (f.t - 1) - iter % f.t, &mut codes[nu..2 * nu]);
            active[3] = iter % 2 == 1;
            f.user_codes(1, iter % f.t, &mut codes[3 * nu..4 * nu]);
            step(&f, &mut st, &codes, &active, &mut out);
            for (i, &s) in place.iter().enumerate() {
                if active[s] {
                    f.check(
                        "lm_tokens_out (slot placement)",
                        &f.tokens,
                        i,
                        local[i],
                        out.tokens(s),
                        &mut errs,
                    );
                    local[i] += 1;
                } else {
                    assert!(out.tokens(s).is_none());
                }
            }
            iter += 1;
        }
    }
    report(errs);
}

#[test]
fn step_does_not_allocate() {
    for dir in fixture_dirs() {
        let f = load(&dir);
        let nu = f.lm.config().num_user_codebooks();
        let slots = 4;
        let mut st = f.lm.new_state(slots);
        let mut out = f.lm.new_output(slots);
        let cfg = if f.lm.config().has_conditioners() {
            2.5
        } else {
            1.0
        };
        for s in 0..slots {
            let p = GenParams {
                seed: s as u64,
                use_sampling: s % 2 == 0,
                cfg_coef: if s == 1 { cfg } else { 1.0 },
                ..params(&f.lm)
            };
            f.lm.reset_slot(&mut st, s, &p).unwrap();
        }
        let mut codes = vec![0; slots * nu];
        // The counter works.
        ALLOCS.with(|c| c.set(Some(0)));
        drop(std::hint::black_box(vec![0u8; 64]));
        assert!(ALLOCS.with(|c| c.get()).unwrap() > 0);
        for t in 0..2 * f.t {
            for s in 0..slots {
                f.user_codes(s % STREAMS, t % f.t, &mut codes[s * nu..(s + 1) * nu]);
            }
            let active: Vec<bool> = (0..slots).map(|s| (t + s) % 3 != 0).collect();
            ALLOCS.with(|c| c.set(Some(0)));
            f.lm.step(&mut st, &codes, &active, &mut out);
            let n = ALLOCS.with(|c| c.get()).unwrap();
            assert_eq!(n, 0, "{}: step {t} allocated {n} times", f.name);
        }
        ALLOCS.with(|c| c.set(None));
    }
}

/// Single-thread timing of one step for 1 and 8 slots (run with
/// `cargo test --release -p moshid-model --test golden lm:: -- --ignored --nocapture`).
#[test]
#[ignore]
fn timing() {
    for dir in fixture_dirs() {
        let f = load(&dir);
        let nu = f.lm.config().num_user_codebooks();
        for slots in [1usize, 8] {
            let mut st = f.lm.new_state(slots);
            let mut out = f.lm.new_output(slots);
            for s in 0..slots {
                f.lm.reset_slot(&mut st, s, &params(&f.lm)).unwrap();
            }
            let mut codes = vec![0; slots * nu];
            let active = vec![true; slots];
            let steps = 3000;
            let mut run = |n: usize, st: &mut moshid_model::lm::LmState| {
                for t in 0..n {
                    for s in 0..slots {
                        f.user_codes(s % STREAMS, t % f.t, &mut codes[s * nu..(s + 1) * nu]);
                    }
                    f.lm.step(st, &codes, &active, &mut out);
                }
            };
            run(200, &mut st);
            let t0 = std::time::Instant::now();
            run(steps, &mut st);
            let us = t0.elapsed().as_secs_f64() * 1e6 / steps as f64;
            eprintln!("{}: {slots} slot(s): {us:.1} µs/step", f.name);
        }
    }
}
