//! PersonaPlex on the emulated GPU model (f32 weights and KV cache) against
//! NVIDIA's official numbers (`personaplex-tiny`): each stream's prompt run
//! in uneven chunks, then its session — tokens and codes exact, text logits
//! and decoded audio within 1e-4 — and the same sessions restored from
//! snapshots in other slots, identical to the ones that ran the prompt.
//! `MOSHID_TEST_DEVICE=cuda` runs the same checks on a GPU.

mod common;

use common::device::{open, Kind};
use common::fixtures::{persona_dirs, rel_err, tensor_f32, tensor_i64};
use moshid_kernels::model::{GpuModel, GpuOptions, Precision};
use moshid_kernels::plan::KvDtype;
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::lm::GenParams;
use moshid_model::persona::wav::read_wav;
use moshid_model::persona::{text_prompt_tokens, voice_from_pcm_24k, voice_from_pt};
use moshid_model::spm_encode::Encoder;
use moshid_model::streaming::{
    Prompt, PromptProgress, SessionParams, SlotFault, StreamingModel, VoiceInput,
};
use safetensors::SafeTensors;

const STREAMS: usize = 3;

fn prompt(
    dir: &std::path::Path,
    stream: &serde_json::Value,
    d: &CheckpointDir,
    fs: usize,
) -> Prompt {
    let enc = Encoder::from_file(d.tokenizer.as_ref().unwrap()).unwrap();
    let voice = match stream["voice_prompt"].as_str() {
        None => VoiceInput::None,
        Some(n) if n.ends_with(".pt") => {
            voice_from_pt(&std::fs::read(dir.join(n)).unwrap(), &d.lm).unwrap()
        }
        Some(n) => {
            let w = read_wav(&std::fs::read(dir.join(n)).unwrap()).unwrap();
            voice_from_pcm_24k(&w.samples, fs).unwrap()
        }
    };
    Prompt {
        voice,
        text_tokens: text_prompt_tokens(&enc, stream["text_prompt"].as_str().unwrap()),
        cache_key: None,
    }
}

#[test]
fn f32_sessions_match_the_official_code() {
    for dir in persona_dirs() {
        let d = CheckpointDir::open(&dir).unwrap();
        let opts = GpuOptions {
            max_slots: 2 * STREAMS,
            precision: Precision::F32,
            kv: KvDtype::F32,
            graphs: true,
            ..GpuOptions::default()
        };
        // The emulator, or a GPU with MOSHID_TEST_DEVICE=cuda (f32 without
        // FMA contraction, as gpu_golden's exact checks).
        let mut m = GpuModel::load(open(Kind::Emu, false), &d, &opts).unwrap();
        assert!(m.takes_prompts());
        let bytes = std::fs::read(dir.join("io.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let (pcm_in, psh) = tensor_f32(&st, "pcm_in");
        let (tok, tsh) = tensor_i64(&st, "lm_tokens_out");
        let (logits, _) = tensor_f32(&st, "lm_text_logits");
        let (pcm_out, _) = tensor_f32(&st, "mimi_pcm_out");
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap())
                .unwrap();
        let fs = m.frame_samples();
        let greedy = SessionParams {
            gen: GenParams::greedy(),
            ..SessionParams::default()
        };
        let mut batch = m.new_batch();
        // A slot owing its prompt does not step.
        m.reset_slot(0, &greedy).unwrap();
        batch.exec[0] = true;
        m.step(&mut batch).unwrap();
        assert_eq!(batch.fault[0], Some(SlotFault::NoPrompt));
        for s in 0..STREAMS {
            let p = prompt(&dir, &meta["streams"][s], &d, fs);
            m.reset_slot(s, &greedy).unwrap();
            m.begin_prompt(s, &p).unwrap();
            let mut i = 0;
            while m.prompt_chunk(s, [5, 1, 40][i % 3]).unwrap() != PromptProgress::Done {
                i += 1;
            }
            let snap = m.snapshot_slot(s).unwrap();
            m.reset_slot(STREAMS + s, &greedy).unwrap();
            m.restore_slot(STREAMS + s, &snap).unwrap();
        }
        let (t_n, tc) = (tsh[2], d.lm.text_card);
        let mut out = vec![vec![0.0f32; t_n * fs]; 2 * STREAMS];
        let mut got_logits = vec![0.0f32; tc];
        for t in 0..t_n {
            for slot in 0..2 * STREAMS {
                let s = slot % STREAMS;
                batch.exec[slot] = true;
                batch
                    .input_mut(slot)
                    .copy_from_slice(&pcm_in[s * psh[2] + t * fs..s * psh[2] + (t + 1) * fs]);
            }
            m.step(&mut batch).unwrap();
            for (slot, out) in out.iter_mut().enumerate() {
                let s = slot % STREAMS;
                assert!(batch.has_output[slot], "slot {slot} frame {t}: no output");
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
                        "slot {slot} frame {t} cb {q}"
                    );
                }
                assert!(m.text_logits(slot, &mut got_logits).unwrap());
                let want = &logits[(s * t_n + t) * tc..(s * t_n + t + 1) * tc];
                let e = rel_err(&got_logits, want);
                assert!(e < 1e-4, "slot {slot} frame {t}: text logits off by {e:e}");
                out[t * fs..(t + 1) * fs].copy_from_slice(batch.output(slot));
            }
        }
        for slot in 0..2 * STREAMS {
            let s = slot % STREAMS;
            let e = rel_err(&out[slot], &pcm_out[s * psh[2]..(s + 1) * psh[2]]);
            assert!(e < 1e-4, "slot {slot}: decoded audio off by {e:e}");
            assert_eq!(out[slot], out[s], "slot {slot}: a restored session differs");
        }
    }
}
