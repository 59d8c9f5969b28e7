//! The embedded demo model's own answer audio to the sent audio, for the
//! bare-Opus floor (`--floor-demo-answers`).
//!
//! Why: the floor's encode half must encode what the daemon encodes. Without
//! this the only answers at hand are the ones a caller decoded, which have
//! been through Opus once already; libopus encodes such audio markedly
//! cheaper than the model's raw output (0.69–0.74× on the speech-like
//! signal, `opus-interleave`), so a floor built on them is lower than bare
//! Opus on the daemon's real work. Stepping the same demo checkpoint on the
//! CPU with the daemon's default sampling parameters, one stream, gives
//! answers of the same kind the daemon encoded during the run (not the same
//! samples: sampling is seeded per session).

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use moshid::config::Config;
use moshid::session::params::{session_params, ModelInfo};
use moshid::FRAME_SAMPLES;
use moshid_model::cpu::CpuModel;
use moshid_model::streaming::StreamingModel;

/// The demo model's answers to `input` for `streams` sessions (each with
/// its own sampling seed, as the daemon's sessions: the encode cost of the
/// answers depends on them), one frame per input frame that produced output
/// (the model's delay drops the first).
pub fn demo_answers(
    input: &[[f32; FRAME_SAMPLES]],
    cache_dir: &Path,
    streams: usize,
) -> Result<Vec<Vec<[f32; FRAME_SAMPLES]>>> {
    let dir = moshid_model::demo::ensure_demo(cache_dir)
        .with_context(|| format!("the demo checkpoint under {}", cache_dir.display()))?;
    let mut model = CpuModel::load(&dir, streams).map_err(|e| anyhow!("loading the demo: {e}"))?;
    let info = ModelInfo {
        conditioners: Vec::new(),
        is_hibiki: false,
        drain_text_eos: None,
        prompts: None,
    };
    let mut batch = model.new_batch();
    for slot in 0..streams {
        let params = session_params(&[], &Config::default().defaults, &info)
            .map_err(|e| anyhow!("default session parameters: {e}"))?;
        model
            .reset_slot(slot, &params)
            .map_err(|e| anyhow!("reset: {e}"))?;
        batch.exec[slot] = true;
    }
    let mut out = vec![Vec::with_capacity(input.len()); streams];
    for frame in input {
        for slot in 0..streams {
            batch.input_mut(slot).copy_from_slice(frame);
        }
        model.step(&mut batch).map_err(|e| anyhow!("step: {e}"))?;
        for (slot, answers) in out.iter_mut().enumerate() {
            if batch.has_output[slot] {
                answers.push(batch.output(slot).try_into().expect("one frame"));
            }
        }
    }
    Ok(out)
}
