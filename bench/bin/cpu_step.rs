//! `cpu-step`: times the CPU backend's full step (Mimi encode → LM step →
//! Mimi decode) on a checkpoint folder, for a batch of B streams over T
//! frames, single thread, and prints one JSON line. `bench/torch_compare.py`
//! runs the official implementation on the same inputs and prints the ratio.
//!
//! Input: the fixture's `pcm_in` streams (tiled to B) when the folder has an
//! `io.safetensors`, otherwise a deterministic tone.
//!
//! `--by-position N`: also times every step and prints, per block of N
//! positions, the block's mean step time (the best repeat): what a stream's
//! position in the call costs, e.g. before and after its KV ring fills at
//! the model's context (`--frames` past the context to see the wrap).

use moshid_model::checkpoint::CheckpointDir;
use moshid_model::cpu::CpuModel;
use moshid_model::lm::GenParams;
use moshid_model::streaming::{SessionParams, StreamingModel};
use std::path::PathBuf;
use std::time::Instant;

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn load_pcm(dir: &std::path::Path) -> Option<(Vec<f32>, usize)> {
    let bytes = std::fs::read(dir.join("io.safetensors")).ok()?;
    let st = safetensors::SafeTensors::deserialize(&bytes).ok()?;
    let v = st.tensor("pcm_in").ok()?;
    let shape = v.shape().to_vec();
    let data: Vec<f32> = v
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Some((data, shape[0]))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model_dir: PathBuf = arg(
        &args,
        "--model",
        PathBuf::from("../shared/golden/moshi-tiny"),
    );
    let batch: usize = arg(&args, "--batch", 8);
    let frames: usize = arg(&args, "--frames", 16);
    let repeats: usize = arg(&args, "--repeats", 5);
    let block: usize = arg(&args, "--by-position", 0);
    let mut step_s = vec![f64::INFINITY; frames];
    let dir =
        CheckpointDir::open(&model_dir).unwrap_or_else(|e| panic!("{}: {e}", model_dir.display()));
    let mut model = CpuModel::load(&dir, batch).expect("weights");
    let fs = model.frame_samples();
    let pcm = load_pcm(&model_dir);
    let mut params = SessionParams {
        gen: GenParams::greedy(),
        ..SessionParams::default()
    };
    if !dir.lm.conditioners.is_empty() {
        params.gen = GenParams::greedy().with_hibiki_conditions(3.0);
    }
    let mut b = model.new_batch();
    let mut best = f64::INFINITY;
    for _ in 0..repeats {
        for s in 0..batch {
            model.reset_slot(s, &params).expect("reset");
            b.exec[s] = true;
        }
        let start = Instant::now();
        for (t, best_step_s) in step_s.iter_mut().enumerate() {
            for s in 0..batch {
                let dst = &mut b.input_pcm[s * fs..(s + 1) * fs];
                match &pcm {
                    Some((data, streams)) => {
                        let stream = s % streams;
                        let total = data.len() / streams;
                        let off = stream * total + (t * fs) % total;
                        dst.copy_from_slice(&data[off..off + fs]);
                    }
                    None => {
                        for (i, x) in dst.iter_mut().enumerate() {
                            *x = 0.2 * (((t * fs + i) as f32) * 0.0523).sin();
                        }
                    }
                }
            }
            let t0 = Instant::now();
            model.step(&mut b).expect("step");
            if block > 0 {
                let dt = t0.elapsed().as_secs_f64();
                *best_step_s = best_step_s.min(dt);
            }
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    println!(
        "{{\"impl\": \"moshid\", \"model\": \"{}\", \"batch\": {batch}, \"frames\": {frames}, \"ms_per_step\": {:.4}}}",
        model_dir.display(),
        best * 1000.0 / frames as f64
    );
    if block > 0 {
        // Each position's fastest step over the repeats: the machine's
        // noise only ever adds time.
        for (i, chunk) in step_s.chunks(block).enumerate() {
            let mean_ms = chunk.iter().sum::<f64>() * 1000.0 / chunk.len() as f64;
            println!(
                "{{\"positions\": [{}, {}], \"batch\": {batch}, \"ms_per_step\": {mean_ms:.4}}}",
                i * block,
                i * block + chunk.len()
            );
        }
    }
}
