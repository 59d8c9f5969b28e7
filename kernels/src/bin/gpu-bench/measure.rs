//! The timing loop: slots reset (and fast-forwarded to full context), a
//! deterministic input per slot, warm-up steps, then timed steps per batch
//! size (and, with `--profile`, the profile of each: `profile.rs`); and the
//! per-size figures it produces.

use crate::args::Args;
use crate::profile::{profile_batch, ProfileRow};
use moshid_kernels::device::{Device, DeviceError};
use moshid_kernels::model::{GpuError, GpuModel};
use moshid_kernels::profile::roofline::Rates;
use moshid_kernels::profile::Profiled;
use moshid_model::config::{LmConfig, MimiConfig};
use moshid_model::lm::GenParams;
use moshid_model::streaming::{Batch, SessionParams, StreamingModel};
use std::time::Instant;

/// Timings of one batch size.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) graphs: bool,
    pub(crate) batch: usize,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
    pub(crate) mean: f64,
    pub(crate) steps: usize,
    /// Slot-steps that reported a fault (non-finite values): a random model
    /// may produce some; counted, not fatal.
    pub(crate) faults: usize,
}

/// A batch size that was not measured, and why.
#[derive(Debug, Clone)]
pub(crate) struct Skip {
    pub(crate) graphs: bool,
    pub(crate) batch: usize,
    pub(crate) why: String,
}

/// The `q`-quantile of sorted values (nearest rank).
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Whether a model build failed for lack of device memory.
pub(crate) fn is_oom(e: &GpuError) -> bool {
    matches!(e, GpuError::Device(DeviceError::OutOfMemory { .. }))
}

/// Session parameters of slot `s`: sampling with the model's usual settings,
/// a seed per slot; Hibiki conditioned as it is served (guidance on).
fn session(lm: &LmConfig, cfg: Option<f32>, s: usize) -> SessionParams {
    let mut gen = GenParams {
        seed: 0x5eed_0000 + s as u64,
        ..GenParams::default()
    };
    if let Some(c) = lm.conditioners.first() {
        gen.cfg_coef = cfg.unwrap_or(3.0);
        if let Some(v) = c.possible_values.last() {
            gen.conditions = vec![(c.name.clone(), v.clone())];
        }
    } else if let Some(c) = cfg {
        gen.cfg_coef = c;
    }
    SessionParams {
        gen,
        ..SessionParams::default()
    }
}

/// Writes this step's input frame of every slot in `0..b`: slot `s` hears a
/// sine of 180 + 37·s Hz at amplitude 0.3, continuous across steps.
fn fill_input(batch: &mut Batch, b: usize, step: usize) {
    let n = batch.frame_samples();
    for s in 0..b {
        let f = 180.0 + 37.0 * s as f64;
        let w = 2.0 * std::f64::consts::PI * f / 24_000.0;
        let t0 = (step * n) as f64;
        for (i, x) in batch.input_mut(s).iter_mut().enumerate() {
            *x = (0.3 * (w * (t0 + i as f64)).sin()) as f32;
        }
    }
}

/// Steps `steps` frames of slots `0..b` (the input of frame `first + i`),
/// timing those after the first `warmup`: the sorted wall times (ms) and
/// the slot-steps that faulted.
pub(crate) fn run_steps<D: Device>(
    model: &mut GpuModel<D>,
    batch: &mut Batch,
    b: usize,
    first: usize,
    warmup: usize,
    steps: usize,
) -> Result<(Vec<f64>, usize), String> {
    let mut times = Vec::with_capacity(steps);
    let mut faults = 0;
    for step in first..first + warmup + steps {
        fill_input(batch, b, step);
        let t = Instant::now();
        model.step(batch).map_err(|e| format!("step {step}: {e}"))?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if step >= first + warmup {
            times.push(ms);
            faults += batch.fault[..b].iter().filter(|f| f.is_some()).count();
        }
    }
    times.sort_by(f64::total_cmp);
    Ok((times, faults))
}

/// What the timing loop fills: rows, skips and (with `--profile`) profiles.
#[derive(Default)]
pub(crate) struct Results {
    pub(crate) rows: Vec<Row>,
    pub(crate) skips: Vec<Skip>,
    pub(crate) profiles: Vec<ProfileRow>,
}

/// Steps `model` for each batch size of `sizes` (all ≤ its `max_slots`);
/// with `rates` (`--profile`), profiles each size after timing it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn measure<D: Device>(
    model: &mut GpuModel<Profiled<D>>,
    (lm, mimi): (&LmConfig, &MimiConfig),
    a: &Args,
    graphs: bool,
    sizes: &[usize],
    rates: Option<&Rates>,
    out: &mut Results,
    mut after_each: impl FnMut(&Results),
) {
    let mut batch = model.new_batch();
    for &b in sizes {
        let run = (|| -> Result<Row, String> {
            for s in 0..b {
                model
                    .reset_slot(s, &session(lm, a.cfg, s))
                    .map_err(|e| format!("reset_slot {s}: {e}"))?;
                if a.full_context {
                    model
                        .fast_forward_for_timing(s, lm.context)
                        .map_err(|e| format!("fast_forward {s}: {e}"))?;
                }
            }
            for (s, e) in batch.exec.iter_mut().enumerate() {
                *e = s < b;
            }
            batch.end_of_input.iter_mut().for_each(|e| *e = false);
            let (times, faults) = run_steps(model, &mut batch, b, 0, a.warmup, a.steps)?;
            let mean = times.iter().sum::<f64>() / times.len() as f64;
            Ok(Row {
                graphs,
                batch: b,
                p50: quantile(&times, 0.5),
                p99: quantile(&times, 0.99),
                max: *times.last().unwrap_or(&f64::NAN),
                mean,
                steps: times.len(),
                faults,
            })
        })();
        match run {
            Ok(r) => {
                println!(
                    "graphs {:3}  batch {:4}  p50 {:8.2} ms  p99 {:8.2} ms  max {:8.2} ms{}",
                    if graphs { "on" } else { "off" },
                    b,
                    r.p50,
                    r.p99,
                    r.max,
                    if r.faults > 0 {
                        format!("  ({} faulted slot-steps)", r.faults)
                    } else {
                        String::new()
                    }
                );
                if let Some(rates) = rates {
                    let nodes = model.graph_nodes(b);
                    let first = a.warmup + a.steps;
                    let p =
                        profile_batch(model, &mut batch, (lm, mimi), a, &r, nodes, first, rates);
                    out.profiles.push(p);
                }
                out.rows.push(r);
            }
            Err(why) => {
                println!("graphs {graphs}  batch {b}: failed: {why}");
                out.skips.push(Skip {
                    graphs,
                    batch: b,
                    why,
                });
            }
        }
        after_each(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 100.0);
        assert_eq!(quantile(&v, 0.99), 198.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
