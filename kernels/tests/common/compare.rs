//! A [`GpuModel`] against the CPU reference backend ([`CpuModel`]) on the
//! same inputs and the same schedule, step by step, through
//! `StreamingModel`: the fixture's three input streams placed in slots 4, 0
//! and 2 of a five-slot batch, one stream masked for a step (it must not
//! advance), a slot reset half way and reused by a stream started afresh,
//! and (Hibiki) an end-of-input frame at the end.

use super::fixtures::{input_pcm, rel_err};
use moshid_kernels::device::Device;
use moshid_kernels::model::GpuModel;
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::cpu::CpuModel;
use moshid_model::lm::GenParams;
use moshid_model::streaming::{Batch, SessionParams, StreamingModel};
use std::path::Path;

/// Slots of the batch and where the three streams sit.
pub const SLOTS: usize = 5;
const PLACES: [usize; 3] = [4, 0, 2];

/// What the comparison measured.
#[derive(Debug, Clone, Default)]
pub struct Agreement {
    /// Slot-steps compared.
    pub slot_steps: usize,
    /// Slot-steps where both produced an output frame.
    pub outputs: usize,
    /// Slot-steps where exactly one of the two produced an output.
    pub output_mismatches: usize,
    /// Text tokens that agree, of `outputs`.
    pub text_agree: usize,
    /// Audio codes that agree, of `codes_total`.
    pub codes_agree: usize,
    /// Audio codes compared.
    pub codes_total: usize,
    /// Largest relative error of one output frame.
    pub max_pcm_rel: f64,
    /// Relative error of all output audio together.
    pub pcm_rel: f64,
    /// Largest relative error of one step's text logits.
    pub max_logits_rel: f64,
    /// Relative error of the first step's text logits (before any token
    /// could have diverged).
    pub first_logits_rel: f64,
}

impl Agreement {
    /// Text-token agreement rate.
    pub fn text_rate(&self) -> f64 {
        self.text_agree as f64 / self.outputs.max(1) as f64
    }

    /// Audio-code agreement rate.
    pub fn codes_rate(&self) -> f64 {
        self.codes_agree as f64 / self.codes_total.max(1) as f64
    }

    /// Whether everything agrees exactly and the errors are within `tol`.
    pub fn exact_within(&self, tol: f64) -> bool {
        self.output_mismatches == 0
            && self.text_agree == self.outputs
            && self.codes_agree == self.codes_total
            && self.max_pcm_rel <= tol
            && self.max_logits_rel <= tol
    }
}

impl std::fmt::Display for Agreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} slot-steps, {} outputs ({} mismatched), text tokens {:.1}% agree, \
             audio codes {:.1}% agree, audio rel. error {:.2e} (worst frame {:.2e}), \
             text logits rel. error first step {:.2e} (worst step {:.2e})",
            self.slot_steps,
            self.outputs,
            self.output_mismatches,
            100.0 * self.text_rate(),
            100.0 * self.codes_rate(),
            self.pcm_rel,
            self.max_pcm_rel,
            self.first_logits_rel,
            self.max_logits_rel,
        )
    }
}

/// Greedy parameters for the fixture's model (Hibiki: its conditions and
/// guidance, as the official inference runs it).
pub fn params(dir: &CheckpointDir) -> SessionParams {
    let mut gen = GenParams::greedy();
    if dir.lm.has_conditioners() {
        gen = gen.with_hibiki_conditions(3.0);
    }
    SessionParams {
        gen,
        ..SessionParams::default()
    }
}

/// Runs the schedule on both models and measures their agreement.
pub fn compare<D: Device>(dir: &Path, gpu: &mut GpuModel<D>) -> Agreement {
    let d = CheckpointDir::open(dir).unwrap();
    compare_with(dir, gpu, &params(&d))
}

/// [`compare`] with the given session parameters in every slot.
pub fn compare_with<D: Device>(dir: &Path, gpu: &mut GpuModel<D>, p: &SessionParams) -> Agreement {
    let d = CheckpointDir::open(dir).unwrap();
    let mut cpu = CpuModel::load(&d, SLOTS).unwrap();
    assert_eq!(
        gpu.max_slots(),
        SLOTS,
        "the GPU model must have {SLOTS} slots"
    );
    let (streams, samples, pcm) = input_pcm(dir);
    assert_eq!(streams, 3);
    let fs = cpu.frame_samples();
    let frames = samples / fs;
    for &s in &PLACES {
        cpu.reset_slot(s, p).unwrap();
        gpu.reset_slot(s, p).unwrap();
    }
    let hibiki = d.lm.has_conditioners();
    let tc = d.lm.text_card;
    let mut bc = cpu.new_batch();
    let mut bg = gpu.new_batch();
    // Next input frame of each placed stream, and which fixture stream it plays.
    let mut next = [0usize; 3];
    let mut source = [0usize, 1, 2];
    let reuse_at = frames / 2;
    let mut a = Agreement::default();
    let (mut num, mut den) = (0.0f64, 0.0f64);
    let mut lc = vec![0.0f32; tc];
    let mut lg = vec![0.0f32; tc];
    for step in 0..frames + 1 {
        if step == reuse_at {
            // Slot 2 starts a new stream: fixture stream 0 from its start.
            cpu.reset_slot(PLACES[2], p).unwrap();
            gpu.reset_slot(PLACES[2], p).unwrap();
            next[2] = 0;
            source[2] = 0;
        }
        for b in [&mut bc, &mut bg] {
            b.exec.fill(false);
            b.end_of_input.fill(false);
        }
        for (i, &slot) in PLACES.iter().enumerate() {
            let masked = i == 1 && step == 3;
            let eoi = next[i] >= frames;
            if masked || (eoi && !(hibiki && next[i] == frames)) {
                continue;
            }
            for b in [&mut bc, &mut bg] {
                b.exec[slot] = true;
                b.end_of_input[slot] = eoi;
                if !eoi {
                    let src = source[i] * samples + next[i] * fs;
                    b.input_mut(slot).copy_from_slice(&pcm[src..src + fs]);
                }
            }
            next[i] += 1;
        }
        cpu.step(&mut bc).unwrap();
        gpu.step(&mut bg).unwrap();
        for &slot in &PLACES {
            if !bc.exec[slot] {
                continue;
            }
            a.slot_steps += 1;
            lc.copy_from_slice(cpu.lm_text_logits(slot));
            assert!(gpu.text_logits(slot, &mut lg).unwrap());
            let e = rel_err(&lg, &lc);
            a.max_logits_rel = a.max_logits_rel.max(e);
            if step == 0 {
                a.first_logits_rel = a.first_logits_rel.max(e);
            }
            match (bc.has_output[slot], bg.has_output[slot]) {
                (true, true) => {
                    a.outputs += 1;
                    a.text_agree += (bc.text_token[slot] == bg.text_token[slot]) as usize;
                    for (x, y) in bc.codes(slot).iter().zip(bg.codes(slot)) {
                        a.codes_total += 1;
                        a.codes_agree += (x == y) as usize;
                    }
                    let (oc, og) = (bc.output(slot), bg.output(slot));
                    a.max_pcm_rel = a.max_pcm_rel.max(rel_err(og, oc));
                    for (x, y) in og.iter().zip(oc) {
                        num += ((x - y) as f64).powi(2);
                        den += (*y as f64).powi(2);
                    }
                }
                (false, false) => {}
                _ => a.output_mismatches += 1,
            }
        }
    }
    a.pcm_rel = if den > 0.0 {
        (num / den).sqrt()
    } else {
        num.sqrt()
    };
    a
}

/// Steps `model` over a fixed pseudo-random schedule and returns every
/// output (tokens and PCM) for determinism checks.
pub fn outputs<M: StreamingModel>(
    model: &mut M,
    p: &SessionParams,
    frames: usize,
) -> Vec<(u32, Vec<u32>, Vec<f32>)> {
    let n = model.max_slots();
    for s in 0..n {
        model.reset_slot(s, p).unwrap();
    }
    let mut b: Batch = model.new_batch();
    let mut out = Vec::new();
    for t in 0..frames {
        for s in 0..n {
            b.exec[s] = (t + s) % 4 != 1;
        }
        for (i, x) in b.input_pcm.iter_mut().enumerate() {
            *x = 0.3 * (((t * 7919 + i) as f32) * 0.0123).sin();
        }
        model.step(&mut b).unwrap();
        for s in 0..n {
            if b.exec[s] && b.has_output[s] {
                out.push((b.text_token[s], b.codes(s).to_vec(), b.output(s).to_vec()));
            }
        }
    }
    out
}
