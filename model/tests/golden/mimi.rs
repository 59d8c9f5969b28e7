//! Mimi against the official implementation's golden fixtures.
//!
//! For every fixture folder (every folder under `shared/golden` with a
//! `mimi_config.json`, `shared/golden-next/hibiki-zero-tiny`, and the
//! colon-separated folders of `MOSHID_GOLDEN`):
//! streaming encode of `pcm_in` must give `mimi_codes` exactly; streaming
//! decode of `mimi_codes` must give `mimi_pcm_out` within a relative error of
//! 1e-4; and a run with the streams scattered over 5 slots, some slots idle,
//! one stream paused on some frames and a slot reset and reused, must give the
//! very same results.

use moshid_model::config::MimiConfig;
use moshid_model::mimi::Mimi;
use moshid_model::weights::Weights;
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

const MAX_REL: f64 = 1e-4;

fn fixture_dirs() -> Vec<PathBuf> {
    super::fixtures::fixture_dirs("mimi_config.json")
}

struct Io {
    streams: usize,
    codebooks: usize,
    frames: usize,
    pcm_in: Vec<f32>,
    codes: Vec<i64>,
    pcm_out: Vec<f32>,
}

fn tensor(st: &SafeTensors, name: &str, dtype: Dtype) -> (Vec<usize>, Vec<u8>) {
    let t = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("io.safetensors: {name}: {e}"));
    assert_eq!(t.dtype(), dtype, "{name}");
    (t.shape().to_vec(), t.data().to_vec())
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn read_io(dir: &Path) -> Io {
    let bytes = std::fs::read(dir.join("io.safetensors")).expect("io.safetensors");
    let st = SafeTensors::deserialize(&bytes).expect("valid io.safetensors");
    let (ps, pcm) = tensor(&st, "pcm_in", Dtype::F32);
    let (cs, codes) = tensor(&st, "mimi_codes", Dtype::I64);
    let (os, out) = tensor(&st, "mimi_pcm_out", Dtype::F32);
    assert_eq!(ps.len(), 3);
    assert_eq!(ps, os);
    assert_eq!(cs[0], ps[0]);
    Io {
        streams: cs[0],
        codebooks: cs[1],
        frames: cs[2],
        pcm_in: f32s(&pcm),
        codes: codes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        pcm_out: f32s(&out),
    }
}

impl Io {
    fn code(&self, stream: usize, k: usize, frame: usize) -> u32 {
        self.codes[(stream * self.codebooks + k) * self.frames + frame] as u32
    }
    fn pcm(&self, stream: usize, frame: usize, fs: usize) -> &[f32] {
        let base = stream * self.frames * fs + frame * fs;
        &self.pcm_in[base..base + fs]
    }
    fn ref_out(&self, stream: usize, fs: usize) -> &[f32] {
        &self.pcm_out[stream * self.frames * fs..(stream + 1) * self.frames * fs]
    }
}

use super::fixtures::rel_err;

fn load(dir: &Path, codebooks: usize) -> Mimi {
    let cfg = MimiConfig::from_file(&dir.join("mimi_config.json")).expect("mimi config");
    let mut w = Weights::open(&dir.join("mimi.safetensors")).expect("mimi weights");
    w.checkpoint()
        .validate(&Mimi::tensor_specs(&cfg))
        .expect("header matches tensor_specs");
    let mimi = Mimi::load(&cfg, &mut w, codebooks).expect("load");
    w.finish().expect("every tensor used");
    assert_eq!(mimi.num_codebooks(), codebooks);
    mimi
}

/// Per-stream codes `[stream][frame][k]` and audio `[stream][frame·fs]`
/// from a run where `placement[s]` is stream s's slot and `schedule(call, s)`
/// says whether stream s is fed its next frame at that call.
struct Run {
    codes: Vec<Vec<u32>>,
    audio: Vec<Vec<f32>>,
}

fn run_scheduled(
    mimi: &Mimi,
    io: &Io,
    max_slots: usize,
    placement: &[usize],
    schedule: &dyn Fn(usize, usize) -> bool,
) -> Run {
    let (fs, nq, n) = (mimi.frame_samples(), mimi.num_codebooks(), io.streams);
    let sentinel_code = u32::MAX - 1;
    let mut enc = mimi.new_state(max_slots);
    let mut dec = mimi.new_state(max_slots);
    let mut codes = vec![Vec::new(); n];
    let mut audio = vec![Vec::new(); n];
    let mut next = vec![0usize; n];
    let mut call = 0;
    while next.iter().any(|&f| f < io.frames) {
        let mut active = vec![false; max_slots];
        // Inactive rows hold garbage that must not be read.
        let mut pcm = vec![f32::NAN; max_slots * fs];
        let mut code_in = vec![u32::MAX; max_slots * nq];
        for s in 0..n {
            if next[s] < io.frames && schedule(call, s) {
                let slot = placement[s];
                active[slot] = true;
                pcm[slot * fs..(slot + 1) * fs].copy_from_slice(io.pcm(s, next[s], fs));
                for k in 0..nq {
                    code_in[slot * nq + k] = io.code(s, k, next[s]);
                }
            }
        }
        let mut code_out = vec![sentinel_code; max_slots * nq];
        let mut pcm_out = vec![f32::INFINITY; max_slots * fs];
        mimi.encode_step(&mut enc, &pcm, &active, &mut code_out);
        mimi.decode_step(&mut dec, &code_in, &active, &mut pcm_out);
        for slot in 0..max_slots {
            if !active[slot] {
                assert!(code_out[slot * nq..(slot + 1) * nq]
                    .iter()
                    .all(|&c| c == sentinel_code));
                assert!(pcm_out[slot * fs..(slot + 1) * fs]
                    .iter()
                    .all(|&v| v == f32::INFINITY));
            }
        }
        for s in 0..n {
            let slot = placement[s];
            if active[slot] && next[s] < io.frames {
                codes[s].push(code_out[slot * nq..(slot + 1) * nq].to_vec());
                audio[s].extend_from_slice(&pcm_out[slot * fs..(slot + 1) * fs]);
                next[s] += 1;
            }
        }
        call += 1;
    }
    Run {
        codes: codes.into_iter().map(|v| v.concat()).collect(),
        audio,
    }
}

fn check_codes(io: &Io, run: &Run, what: &str) {
    for s in 0..io.streams {
        for f in 0..io.frames {
            for k in 0..io.codebooks {
                let got = run.codes[s][f * io.codebooks + k];
                let want = io.code(s, k, f);
                assert_eq!(
                    got, want,
                    "{what}: stream {s}, frame {f}, codebook {k}: expected {want}, got {got}"
                );
            }
        }
    }
}

fn check_audio(io: &Io, run: &Run, fs: usize, what: &str) -> f64 {
    let got: Vec<f32> = run.audio.concat();
    let err = rel_err(&got, &io.pcm_out);
    for s in 0..io.streams {
        let e = rel_err(&run.audio[s], io.ref_out(s, fs));
        assert!(
            e <= MAX_REL,
            "{what}: stream {s}: decoded audio relative error {e:.3e} > {MAX_REL:e}"
        );
    }
    assert!(
        err <= MAX_REL,
        "{what}: decoded audio relative error {err:.3e} > {MAX_REL:e}"
    );
    err
}

#[test]
fn mimi_matches_golden() {
    let dirs = fixture_dirs();
    assert!(!dirs.is_empty(), "no fixture folder found");
    for dir in dirs {
        let io = read_io(&dir);
        let mimi = load(&dir, io.codebooks);
        let fs = mimi.frame_samples();
        assert_eq!(io.pcm_in.len(), io.streams * io.frames * fs);
        let name = dir.display().to_string();

        // 1. All streams every frame, slot s = stream s.
        let plain: Vec<usize> = (0..io.streams).collect();
        let run = run_scheduled(&mimi, &io, io.streams, &plain, &|_, _| true);
        check_codes(&io, &run, &format!("{name} (batched)"));
        let err = check_audio(&io, &run, fs, &format!("{name} (batched)"));

        // 2. Scattered slots, idle slots, stream 1 paused every third call.
        let max_slots = io.streams + 2;
        let placement: Vec<usize> = (0..io.streams)
            .map(|s| (max_slots - 1 + 3 * s) % max_slots)
            .collect();
        let run2 = run_scheduled(&mimi, &io, max_slots, &placement, &|call, s| {
            s != 1 || call % 3 != 1
        });
        check_codes(&io, &run2, &format!("{name} (masked, slots {placement:?})"));
        let err2 = check_audio(&io, &run2, fs, &format!("{name} (masked)"));

        // 3. Slot reuse: stream 0's slot runs a few frames of stream 0, is reset,
        //    then runs the last stream from its start; it must match the reference.
        let last = io.streams - 1;
        let slot = 1;
        let mut enc = mimi.new_state(2);
        let mut dec = mimi.new_state(2);
        let nq = io.codebooks;
        let active = [false, true];
        let mut pcm = vec![0.0; 2 * fs];
        let mut codes = vec![0u32; 2 * nq];
        let mut out = vec![0.0; 2 * fs];
        for f in 0..io.frames.min(5) {
            pcm[fs..].copy_from_slice(io.pcm(0, f, fs));
            mimi.encode_step(&mut enc, &pcm, &active, &mut codes);
            mimi.decode_step(&mut dec, &codes, &active, &mut out);
        }
        mimi.reset_slot(&mut enc, slot);
        mimi.reset_slot(&mut dec, slot);
        let mut audio = Vec::new();
        for f in 0..io.frames {
            pcm[fs..].copy_from_slice(io.pcm(last, f, fs));
            mimi.encode_step(&mut enc, &pcm, &active, &mut codes);
            for k in 0..nq {
                let want = io.code(last, k, f);
                assert_eq!(
                    codes[nq + k],
                    want,
                    "{name} (reset slot): frame {f}, codebook {k}: expected {want}, got {}",
                    codes[nq + k]
                );
                codes[nq + k] = want;
            }
            mimi.decode_step(&mut dec, &codes, &active, &mut out);
            audio.extend_from_slice(&out[fs..]);
        }
        let err3 = rel_err(&audio, io.ref_out(last, fs));
        assert!(
            err3 <= MAX_REL,
            "{name} (reset slot): decoded audio relative error {err3:.3e}"
        );
        println!(
            "{name}: codes exact ({} streams × {} frames × {} codebooks); audio rel. error {err:.3e} (batched), {err2:.3e} (masked), {err3:.3e} (reset slot)",
            io.streams, io.frames, io.codebooks
        );
    }
}

/// A checkpoint for `cfg` with bounded random weights, written under `dir`.
fn random_checkpoint(cfg: &MimiConfig, dir: &Path) -> PathBuf {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let specs = Mimi::tensor_specs(cfg);
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = specs
        .iter()
        .map(|s| {
            let fan = if s.shape.len() > 1 {
                s.numel() / s.shape[0]
            } else {
                0
            };
            let vals: Vec<f32> = (0..s.numel())
                .map(|_| {
                    let r = rnd();
                    if s.name.ends_with("cluster_usage") || s.name.ends_with("_initialized") {
                        1.0
                    } else if s.name.ends_with(".scale") {
                        0.1
                    } else if s.name.contains("norm") && s.name.ends_with("weight") {
                        1.0 + 0.1 * r
                    } else if fan > 0 && !s.name.ends_with("embedding_sum") {
                        r * (3.0 / fan as f32).sqrt()
                    } else {
                        0.05 * r
                    }
                })
                .collect();
            let bytes = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
            (s.name.clone(), s.shape.clone(), bytes)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = data
        .iter()
        .map(|(n, shape, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), b).unwrap(),
            )
        })
        .collect();
    let path = dir.join("mimi_random.safetensors");
    safetensors::serialize_to_file(views, None, &path).unwrap();
    path
}

/// Mean encode and decode milliseconds per call after `warm` calls (enough
/// to fill the transformers' KV rings, so attention runs at full context).
fn time_steps(mimi: &Mimi, slots: usize, warm: usize, frames: usize) -> (f64, f64) {
    let (fs, nq) = (mimi.frame_samples(), mimi.num_codebooks());
    let mut enc = mimi.new_state(slots);
    let mut dec = mimi.new_state(slots);
    let active = vec![true; slots];
    let mut codes = vec![0u32; slots * nq];
    let mut out = vec![0.0f32; slots * fs];
    let (mut te, mut td) = (0.0, 0.0);
    for f in 0..warm + frames {
        let pcm: Vec<f32> = (0..slots * fs)
            .map(|i| (0.01 * (i + f * fs) as f32).sin() * 0.3)
            .collect();
        let t0 = std::time::Instant::now();
        mimi.encode_step(&mut enc, &pcm, &active, &mut codes);
        let t1 = std::time::Instant::now();
        mimi.decode_step(&mut dec, &codes, &active, &mut out);
        let t2 = std::time::Instant::now();
        if f >= warm {
            te += (t1 - t0).as_secs_f64();
            td += (t2 - t1).as_secs_f64();
        }
    }
    (te / frames as f64 * 1e3, td / frames as f64 * 1e3)
}

/// `cargo test --release -p moshid-model --test golden mimi:: -- --ignored --nocapture`
#[test]
#[ignore = "timing; run in release"]
fn mimi_step_timing() {
    let tiny = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/golden/moshi-tiny"
    ));
    let dir = tempfile::tempdir().unwrap();
    let real_cfg = MimiConfig::mimi_default();
    let real_path = random_checkpoint(&real_cfg, dir.path());
    let mut w = Weights::open(&real_path).unwrap();
    let real = Mimi::load(&real_cfg, &mut w, 8).unwrap();
    w.finish().unwrap();
    // Warm-up: enough frames to fill the KV rings (context / steps per frame), plus 3.
    let warm_real = real_cfg.transformer.context / real_cfg.downsample_stride() + 3;
    for (name, mimi, warm) in [
        ("fixture (moshi-tiny)", load(tiny, 8), 8),
        ("real Mimi shape", real, warm_real),
    ] {
        for slots in [1, 8] {
            let (e, d) = time_steps(&mimi, slots, warm, if slots == 1 { 20 } else { 8 });
            println!(
                "{name}, {slots} slot(s): encode {e:.2} ms + decode {d:.2} ms = {:.2} ms per frame ({:.2} ms per slot-frame)",
                e + d,
                (e + d) / slots as f64
            );
        }
    }
}
