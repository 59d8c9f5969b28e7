//! PersonaPlex against NVIDIA's official code (`personaplex-tiny`, made by
//! `shared/golden/make_golden_personaplex.py`): the voice prompt's stages
//! (WAV samples, loudness and gain, normalised PCM, Mimi codes), the role
//! text's tokens, the prefill's transformer inputs and text logits, then the
//! session after the prompt on the whole CPU backend (tokens and codes
//! exact, text logits and audio within 1e-4), the prompt run in uneven
//! chunks, and a session restored from a snapshot equal to the one that ran
//! the prompt.

use moshid_model::checkpoint::CheckpointDir;
use moshid_model::cpu::CpuModel;
use moshid_model::lm::prefill::{PositionInput, Replay};
use moshid_model::lm::{GenParams, Lm};
use moshid_model::persona::wav::{prepare_voice, read_wav};
use moshid_model::persona::{
    prefill_frames, replay_from_pt, text_prompt_tokens, voice_from_pt, Voice,
};
use moshid_model::spm_encode::Encoder;
use moshid_model::streaming::{Prompt, PromptProgress, SessionParams, StreamingModel, VoiceInput};
use safetensors::SafeTensors;
use std::path::Path;

use super::fixtures::{persona_dirs, rel_err, tensor_f32, tensor_i64};

const STREAMS: usize = 3;

struct Stream {
    voice: Option<String>,
    text: String,
}

fn streams(dir: &Path) -> Vec<Stream> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap()).unwrap();
    v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| Stream {
            voice: s["voice_prompt"].as_str().map(str::to_string),
            text: s["text_prompt"].as_str().unwrap().to_string(),
        })
        .collect()
}

/// A replayed voice from a `.pt` file, checked against the model.
fn replay(dir: &Path, name: &str, lm: &Lm) -> Replay {
    replay_from_pt(&std::fs::read(dir.join(name)).unwrap(), lm.config()).unwrap()
}

/// The prompt of a stream, checking each stage of a WAV voice on the way.
fn prompt(dir: &Path, st: &SafeTensors, s: &Stream, enc: &Encoder, lm: &Lm, fs: usize) -> Prompt {
    let voice = match s.voice.as_deref() {
        None => VoiceInput::None,
        Some(n) if n.ends_with(".pt") => {
            voice_from_pt(&std::fs::read(dir.join(n)).unwrap(), lm.config()).unwrap()
        }
        Some(n) => {
            let stem = n.trim_end_matches(".wav");
            let wav = read_wav(&std::fs::read(dir.join(n)).unwrap()).unwrap();
            assert_eq!(wav.rate, 24_000);
            let (raw, _) = tensor_f32(st, &format!("{stem}_raw"));
            assert_eq!(wav.samples, raw, "{n}: samples as sphn.read gives them");
            let (pcm, loud, gain) = prepare_voice(&wav.samples, fs).unwrap();
            let lg = st.tensor(&format!("{stem}_loudness_gain")).unwrap();
            let want: Vec<f64> = lg
                .data()
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
                .collect();
            assert!(
                (loud - want[0]).abs() < 1e-6,
                "{n}: loudness {loud} vs {}",
                want[0]
            );
            assert!(
                (gain / want[1] - 1.0).abs() < 1e-6,
                "{n}: gain {gain} vs {}",
                want[1]
            );
            let (want_pcm, _) = tensor_f32(st, &format!("{stem}_pcm"));
            assert!(rel_err(&pcm, &want_pcm) < 1e-6, "{n}: normalised pcm");
            VoiceInput::Pcm(pcm.into())
        }
    };
    let text_tokens = text_prompt_tokens(enc, &s.text);
    Prompt {
        voice,
        text_tokens,
        cache_key: None,
    }
}

fn greedy() -> SessionParams {
    SessionParams {
        gen: GenParams::greedy(),
        ..SessionParams::default()
    }
}

/// Runs a slot's prompt in chunks of the given sizes (cycled).
fn run_prompt(m: &mut CpuModel, slot: usize, p: &Prompt, chunks: &[usize]) {
    m.reset_slot(slot, &greedy()).unwrap();
    m.begin_prompt(slot, p).unwrap();
    for i in 0.. {
        match m.prompt_chunk(slot, chunks[i % chunks.len()]).unwrap() {
            PromptProgress::Done => return,
            PromptProgress::Pending { .. } => assert!(i < 10_000),
        }
    }
}

#[test]
fn prefill_inputs_and_logits() {
    for dir in persona_dirs() {
        let d = CheckpointDir::open(&dir).unwrap();
        let mut w = d.open_lm_weights().unwrap();
        let lm = Lm::load(&d.lm, &mut w).unwrap();
        w.finish().unwrap();
        let bytes = std::fs::read(dir.join("io.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let (feed, fsh) = tensor_i64(&st, "prompt_feed");
        let (minput, _) = tensor_i64(&st, "prompt_model_input");
        let (plog, _) = tensor_f32(&st, "prompt_text_logits");
        let (plen, _) = tensor_i64(&st, "prompt_len");
        let (vf, _) = tensor_i64(&st, "prompt_voice_frames");
        let (kinds, _) = tensor_i64(&st, "prompt_kind");
        let (k, pmax, tc) = (fsh[1], fsh[2], d.lm.text_card);
        let cfg = lm.config();
        let initial: Vec<u32> = (0..k)
            .map(|i| {
                if i == 0 {
                    cfg.text_card as u32
                } else {
                    cfg.card as u32
                }
            })
            .collect();
        let ss = streams(&dir);
        for s in 0..STREAMS {
            let p = plen[s] as usize;
            // The frames from the fixture's feed, the voice from its codes.
            let (codes, _) = tensor_i64(&st, "voice_a_codes");
            let voice = match ss[s].voice.as_deref() {
                None => Voice::None,
                Some(n) if n.ends_with(".pt") => Voice::Replay(replay(&dir, n, &lm)),
                Some(_) => {
                    let n = vf[s] as usize;
                    Voice::Codes(
                        (0..n * 8)
                            .map(|i| codes[(i % 8) * n + i / 8] as u32)
                            .collect(),
                    )
                }
            };
            let text: Vec<u32> = (0..p)
                .filter(|&f| kinds[s * pmax + f] == 3)
                .map(|f| feed[(s * k) * pmax + f] as u32)
                .collect();
            let frames = prefill_frames(voice, &text, cfg.card as u32);
            assert_eq!(frames.frames(), p);
            for f in 0..p {
                for r in 0..k {
                    assert_eq!(
                        frames.given[f * k + r] as i64,
                        feed[(s * k + r) * pmax + f],
                        "stream {s} frame {f} row {r}: given token"
                    );
                }
            }
            let sim = frames.simulate(&cfg.delays, &initial, 4);
            assert_eq!(sim.positions(), p - 1);
            let mut state = lm.new_state(2);
            lm.reset_slot(&mut state, 1, &GenParams::greedy()).unwrap();
            let mut logits = vec![0.0; (p - 1) * tc];
            let mut t = 0;
            while t < p - 1 {
                let n = (p - 1 - t).min(5 + t % 7);
                lm.prefill_pass(
                    &mut state,
                    1,
                    &sim,
                    frames.replay.as_ref(),
                    t,
                    n,
                    Some(&mut logits[t * tc..]),
                );
                t += n;
            }
            for pos in 0..p - 1 {
                let f = pos + 1;
                if let PositionInput::Tokens(at) = sim.inputs[pos] {
                    for r in 0..k {
                        assert_eq!(
                            sim.tokens[at + r] as i64,
                            minput[(s * k + r) * pmax + f],
                            "stream {s} prefill frame {f} row {r}: model input"
                        );
                    }
                }
                let want = &plog[(s * pmax + f) * tc..(s * pmax + f + 1) * tc];
                let e = rel_err(&logits[pos * tc..(pos + 1) * tc], want);
                assert!(
                    e < 1e-4,
                    "stream {s} prefill frame {f}: text logits off by {e:e}"
                );
            }
        }
    }
}

#[test]
fn voice_wav_encodes_to_the_official_codes() {
    for dir in persona_dirs() {
        let d = CheckpointDir::open(&dir).unwrap();
        let bytes = std::fs::read(dir.join("io.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let m = CpuModel::load(&d, 1).unwrap();
        let enc = Encoder::from_file(d.tokenizer.as_ref().unwrap()).unwrap();
        let fs = m.frame_samples();
        let (lm, _) = (m.lm(), ());
        let ss = streams(&dir);
        let p = prompt(&dir, &st, &ss[0], &enc, lm, fs);
        let VoiceInput::Pcm(pcm) = &p.voice else {
            panic!("stream 0 has a WAV voice")
        };
        let (want, sh) = tensor_i64(&st, "voice_a_codes");
        let n = sh[1];
        let mimi = m.mimi();
        let mut state = mimi.new_state(1);
        let mut codes = vec![0u32; mimi.num_codebooks()];
        for f in 0..n {
            mimi.encode_step(&mut state, &pcm[f * fs..(f + 1) * fs], &[true], &mut codes);
            for q in 0..8 {
                assert_eq!(
                    codes[q] as i64,
                    want[q * n + f],
                    "voice_a frame {f} codebook {q}"
                );
            }
        }
    }
}

/// Every stream's session after its prompt, against the fixture, and the
/// same sessions restored from snapshots in other slots.
#[test]
fn sessions_after_the_prompt() {
    for dir in persona_dirs() {
        let d = CheckpointDir::open(&dir).unwrap();
        let bytes = std::fs::read(dir.join("io.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let (pcm_in, psh) = tensor_f32(&st, "pcm_in");
        let (tok, tsh) = tensor_i64(&st, "lm_tokens_out");
        let (logits, _) = tensor_f32(&st, "lm_text_logits");
        let (pcm_out, _) = tensor_f32(&st, "mimi_pcm_out");
        let (ptoks, ptsh) = tensor_i64(&st, "prompt_text_tokens");
        let enc = Encoder::from_file(d.tokenizer.as_ref().unwrap()).unwrap();
        // Slots 0..3 run the prompts; slots 3..6 are restored from snapshots.
        let mut m = CpuModel::load(&d, 2 * STREAMS).unwrap();
        let fs = m.frame_samples();
        let tc = d.lm.text_card;
        let t_n = tsh[2];
        let ss = streams(&dir);
        for (s, stream) in ss.iter().enumerate() {
            let p = prompt(&dir, &st, stream, &enc, m.lm(), fs);
            let want: Vec<u32> = ptoks[s * ptsh[1]..(s + 1) * ptsh[1]]
                .iter()
                .filter(|&&t| t >= 0)
                .map(|&t| t as u32)
                .collect();
            assert_eq!(p.text_tokens, want, "stream {s}: role text tokens");
            run_prompt(&mut m, s, &p, &[3, 1, 17, 64]);
            let snap = m.snapshot_slot(s).unwrap();
            m.reset_slot(STREAMS + s, &greedy()).unwrap();
            m.restore_slot(STREAMS + s, &snap).unwrap();
        }
        let mut batch = m.new_batch();
        let mut out = vec![vec![0.0f32; t_n * fs]; 2 * STREAMS];
        for t in 0..t_n {
            for slot in 0..2 * STREAMS {
                let s = slot % STREAMS;
                batch.exec[slot] = true;
                let src = &pcm_in[s * psh[2] + t * fs..s * psh[2] + (t + 1) * fs];
                batch.input_mut(slot).copy_from_slice(src);
            }
            m.step(&mut batch).unwrap();
            for (slot, out) in out.iter_mut().enumerate() {
                let s = slot % STREAMS;
                assert!(batch.has_output[slot], "slot {slot} frame {t}: no output");
                assert_eq!(batch.fault[slot], None);
                let col = |r: usize| tok[(s * tsh[1] + r) * t_n + t];
                assert_eq!(
                    batch.text_token[slot] as i64,
                    col(0),
                    "slot {slot} frame {t}: text"
                );
                for q in 0..8 {
                    assert_eq!(
                        batch.codes(slot)[q] as i64,
                        col(1 + q),
                        "slot {slot} frame {t}: model codebook {q}"
                    );
                }
                if slot < STREAMS {
                    let want = &logits[(s * t_n + t) * tc..(s * t_n + t + 1) * tc];
                    let e = rel_err(m.lm_text_logits(slot), want);
                    assert!(e < 1e-4, "stream {s} frame {t}: text logits off by {e:e}");
                }
                out[t * fs..(t + 1) * fs].copy_from_slice(batch.output(slot));
            }
        }
        for slot in 0..2 * STREAMS {
            let s = slot % STREAMS;
            let want = &pcm_out[s * psh[2]..(s + 1) * psh[2]];
            let e = rel_err(&out[slot], want);
            assert!(e < 1e-4, "slot {slot}: decoded audio off by {e:e}");
            assert_eq!(out[slot], out[s], "slot {slot}: a restored session differs");
        }
    }
}

#[test]
fn a_slot_without_its_prompt_does_not_step() {
    let dir = &persona_dirs()[0];
    let d = CheckpointDir::open(dir).unwrap();
    let mut m = CpuModel::load(&d, 2).unwrap();
    assert!(m.takes_prompts());
    m.reset_slot(0, &greedy()).unwrap();
    let mut batch = m.new_batch();
    batch.exec[0] = true;
    m.step(&mut batch).unwrap();
    assert_eq!(
        batch.fault[0],
        Some(moshid_model::streaming::SlotFault::NoPrompt)
    );
    assert!(!batch.has_output[0]);
}
