//! `--profile`: after a batch size is timed, the same steps again with the
//! profiler's events — once with an event at each phase change (inside the
//! captured graph when graphs are on), once with events around every call —
//! and the figures against the floors of `moshid_kernels::profile::roofline`
//! at the rates measured at the start of the run.
//!
//! Per (model, KV type, graphs, context, batch): the plain wall p50/p99 (the
//! timed steps, no events), the graph's node count, the GPU time of a step
//! (first to last event) and the gap to the wall time (host staging, launch,
//! synchronisation, scatter), the calls per step; a row per phase with its
//! calls, median ms, share, bytes, FLOPs, achieved rates, floor and
//! × floor; the sum of the calls' own times and the ten slowest calls by
//! time per step. The graph is captured anew for each mode and once more
//! without events afterwards, so the next batch size is timed as before.

use crate::args::Args;
use crate::measure::{quantile, run_steps, Row};
use moshid_kernels::device::{Device, Phase};
use moshid_kernels::model::GpuModel;
use moshid_kernels::profile::profiler::{phase_index, CallTotal};
use moshid_kernels::profile::roofline::{step_costs, Rates, StepShape};
use moshid_kernels::profile::{Collected, ProfileMode, Profiled};
use moshid_model::config::{LmConfig, MimiConfig};
use moshid_model::streaming::Batch;
use serde_json::{json, Value};

/// One phase of a profiled batch.
#[derive(Debug, Clone)]
pub(crate) struct PhaseRow {
    pub(crate) phase: Phase,
    pub(crate) calls: u32,
    pub(crate) ms: f64,
    pub(crate) bytes: f64,
    pub(crate) flops: f64,
    pub(crate) floor_ms: f64,
}

/// One of the slowest calls.
#[derive(Debug, Clone)]
pub(crate) struct CallRow {
    pub(crate) phase: Phase,
    pub(crate) what: String,
    pub(crate) per_step: f64,
    pub(crate) ms_per_step: f64,
}

/// The profile of one batch size.
#[derive(Debug, Clone)]
pub(crate) struct ProfileRow {
    pub(crate) graphs: bool,
    pub(crate) context: usize,
    pub(crate) batch: usize,
    pub(crate) wall_p50: f64,
    pub(crate) wall_p99: f64,
    pub(crate) graph_nodes: Option<usize>,
    /// Wall p50 of the steps with phase events.
    pub(crate) phased_wall_p50: f64,
    /// GPU time of a step, first to last event (p50).
    pub(crate) gpu_p50: f64,
    pub(crate) calls_per_step: u32,
    pub(crate) phases: Vec<PhaseRow>,
    /// Sum of every call's own time per step (calls mode), and the GPU time
    /// of those steps.
    pub(crate) call_sum_ms: f64,
    pub(crate) calls_gpu_p50: f64,
    pub(crate) slowest: Vec<CallRow>,
    /// Why the profile is missing or partial.
    pub(crate) error: Option<String>,
}

impl ProfileRow {
    fn empty(graphs: bool, context: usize, row: &Row, nodes: Option<usize>) -> Self {
        ProfileRow {
            graphs,
            context,
            batch: row.batch,
            wall_p50: row.p50,
            wall_p99: row.p99,
            graph_nodes: nodes,
            phased_wall_p50: f64::NAN,
            gpu_p50: f64::NAN,
            calls_per_step: 0,
            phases: Vec::new(),
            call_sum_ms: f64::NAN,
            calls_gpu_p50: f64::NAN,
            slowest: Vec::new(),
            error: None,
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    quantile(&v, 0.5)
}

/// Steps `a.profile_steps` frames (after two untimed, which capture the
/// graph) in `mode`: the wall times and what the profiler gathered.
fn collect<D: Device>(
    model: &mut GpuModel<Profiled<D>>,
    batch: &mut Batch,
    b: usize,
    first: &mut usize,
    a: &Args,
    mode: ProfileMode,
) -> Result<(Vec<f64>, Collected), String> {
    model.device_mut().set_mode(mode);
    model.device_mut().forget_graphs();
    model.forget_graphs();
    let warm = run_steps(model, batch, b, *first, 2, 0);
    *first += 2;
    warm?;
    model.device_mut().start_collecting();
    let timed = run_steps(model, batch, b, *first, 0, a.profile_steps);
    *first += a.profile_steps;
    let got = model.device_mut().take_collected();
    let (times, _) = timed?;
    if let Some(e) = got.error {
        return Err(format!("{mode:?}: reading the events: {e}"));
    }
    if got.steps.is_empty() {
        return Err(format!("{mode:?}: no step was timed"));
    }
    Ok((times, got))
}

/// Profiles batch size `row.batch` (slots `0..b` already reset and stepped
/// `first` frames): see the module doc. Failures are kept in the row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn profile_batch<D: Device>(
    model: &mut GpuModel<Profiled<D>>,
    batch: &mut Batch,
    (lm, mimi): (&LmConfig, &MimiConfig),
    a: &Args,
    row: &Row,
    graph_nodes: Option<usize>,
    mut first: usize,
    rates: &Rates,
) -> ProfileRow {
    let b = row.batch;
    let mut p = ProfileRow::empty(row.graphs, lm.context, row, graph_nodes);
    let shape = StepShape {
        slots: b,
        rows_per_slot: if lm.has_conditioners() { 2 } else { 1 },
        keys: if a.full_context {
            lm.context
        } else {
            (a.warmup + a.steps).min(lm.context)
        },
        kv_bytes: a.kv.bytes() as usize,
        act_bytes: if a.f32_weights { 4 } else { 2 },
    };
    let costs = step_costs(lm, mimi, &shape);
    let result = (|| -> Result<(), String> {
        let (times, got) = collect(model, batch, b, &mut first, a, ProfileMode::Phases)?;
        p.phased_wall_p50 = quantile(&times, 0.5);
        p.gpu_p50 = median(got.steps.iter().map(|s| s.gpu_ms).collect());
        for c in &costs {
            let i = phase_index(c.phase);
            let ms = median(got.steps.iter().map(|s| s.phases[i].0).collect());
            let calls = got.steps.last().map_or(0, |s| s.phases[i].1);
            p.phases.push(PhaseRow {
                phase: c.phase,
                calls,
                ms,
                bytes: c.cost.bytes,
                flops: c.cost.flops,
                floor_ms: c.floor_ms(rates),
            });
        }
        p.calls_per_step = got
            .steps
            .last()
            .map_or(0, |s| s.phases.iter().map(|x| x.1).sum());
        let (_, calls) = collect(model, batch, b, &mut first, a, ProfileMode::Calls)?;
        let n = calls.steps.len() as f64;
        p.calls_gpu_p50 = median(calls.steps.iter().map(|s| s.gpu_ms).collect());
        p.call_sum_ms = calls.calls.values().map(|c| c.ms).sum::<f64>() / n;
        let mut all: Vec<(&(Phase, String), &CallTotal)> = calls.calls.iter().collect();
        all.sort_by(|x, y| y.1.ms.total_cmp(&x.1.ms));
        p.slowest = all
            .into_iter()
            .take(10)
            .map(|((phase, what), t)| CallRow {
                phase: *phase,
                what: what.clone(),
                per_step: t.count as f64 / n,
                ms_per_step: t.ms / n,
            })
            .collect();
        Ok(())
    })();
    // The next batch size is timed without events, on graphs captured anew.
    model.device_mut().set_mode(ProfileMode::Off);
    model.device_mut().forget_graphs();
    model.forget_graphs();
    if let Err(e) = result {
        println!("batch {b}: profile failed: {e}");
        p.error = Some(e);
    }
    print_profile(&p);
    p
}

fn ratio(x: f64, y: f64) -> f64 {
    if y > 0.0 {
        x / y
    } else {
        f64::NAN
    }
}

/// The profile of one batch as markdown (also printed).
pub(crate) fn markdown(p: &ProfileRow) -> String {
    let phase_sum: f64 = p.phases.iter().map(|r| r.ms).sum();
    let floor: f64 = p.phases.iter().map(|r| r.floor_ms).sum();
    let mut s = format!(
        "### graphs {} · context {} · batch {}\n\n\
         wall p50 {:.2} ms, p99 {:.2} ms (no events); graph nodes {}; with phase events: wall p50 {:.2} ms, \
         GPU {:.2} ms per step, host and sync gap {:.2} ms; {} calls per step; floor {:.2} ms, \
         wall × floor {:.2}; calls' own time {:.2} ms of {:.2} ms GPU (idle between calls {:.2} ms)\n\n\
         | phase | calls | ms | share | GB | GFLOP | GB/s | TFLOP/s | floor ms | × floor |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        if p.graphs { "on" } else { "off" },
        p.context,
        p.batch,
        p.wall_p50,
        p.wall_p99,
        p.graph_nodes.map_or("-".into(), |n| n.to_string()),
        p.phased_wall_p50,
        p.gpu_p50,
        p.phased_wall_p50 - p.gpu_p50,
        p.calls_per_step,
        floor,
        ratio(p.wall_p50, floor),
        p.call_sum_ms,
        p.calls_gpu_p50,
        p.calls_gpu_p50 - p.call_sum_ms,
    );
    for r in &p.phases {
        s.push_str(&format!(
            "| {} | {} | {:.3} | {:.1}% | {:.3} | {:.1} | {:.0} | {:.2} | {:.3} | {:.1} |\n",
            r.phase.name(),
            r.calls,
            r.ms,
            100.0 * ratio(r.ms, phase_sum),
            r.bytes / 1e9,
            r.flops / 1e9,
            ratio(r.bytes / 1e9, r.ms / 1e3),
            ratio(r.flops / 1e12, r.ms / 1e3),
            r.floor_ms,
            ratio(r.ms, r.floor_ms),
        ));
    }
    s.push_str("\n| slowest calls | phase | per step | ms per step | µs each |\n|---|---|---:|---:|---:|\n");
    for c in &p.slowest {
        s.push_str(&format!(
            "| {} | {} | {:.0} | {:.3} | {:.1} |\n",
            c.what,
            c.phase.name(),
            c.per_step,
            c.ms_per_step,
            1e3 * ratio(c.ms_per_step, c.per_step),
        ));
    }
    if let Some(e) = &p.error {
        s.push_str(&format!("\nprofile failed: {e}\n"));
    }
    s
}

fn print_profile(p: &ProfileRow) {
    println!("{}", markdown(p));
}

/// Finite numbers as JSON numbers, the rest as null.
fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// The profile of one batch as JSON.
pub(crate) fn to_json(p: &ProfileRow) -> Value {
    let phase_sum: f64 = p.phases.iter().map(|r| r.ms).sum();
    let floor: f64 = p.phases.iter().map(|r| r.floor_ms).sum();
    json!({
        "graphs": p.graphs,
        "context": p.context,
        "batch": p.batch,
        "wall_p50_ms": num(p.wall_p50),
        "wall_p99_ms": num(p.wall_p99),
        "graph_nodes": p.graph_nodes,
        "phased_wall_p50_ms": num(p.phased_wall_p50),
        "gpu_ms": num(p.gpu_p50),
        "host_gap_ms": num(p.phased_wall_p50 - p.gpu_p50),
        "calls_per_step": p.calls_per_step,
        "floor_ms": num(floor),
        "x_floor": num(ratio(p.wall_p50, floor)),
        "call_sum_ms": num(p.call_sum_ms),
        "calls_gpu_ms": num(p.calls_gpu_p50),
        "idle_between_calls_ms": num(p.calls_gpu_p50 - p.call_sum_ms),
        "phases": p.phases.iter().map(|r| json!({
            "phase": r.phase.name(),
            "calls": r.calls,
            "ms": num(r.ms),
            "share": num(ratio(r.ms, phase_sum)),
            "bytes": r.bytes,
            "flops": r.flops,
            "gb_per_s": num(ratio(r.bytes / 1e9, r.ms / 1e3)),
            "tflop_per_s": num(ratio(r.flops / 1e12, r.ms / 1e3)),
            "floor_ms": num(r.floor_ms),
            "x_floor": num(ratio(r.ms, r.floor_ms)),
        })).collect::<Vec<_>>(),
        "slowest_calls": p.slowest.iter().map(|c| json!({
            "call": c.what,
            "phase": c.phase.name(),
            "per_step": num(c.per_step),
            "ms_per_step": num(c.ms_per_step),
        })).collect::<Vec<_>>(),
        "error": p.error,
    })
}

/// The rates as JSON.
pub(crate) fn rates_json(r: &Rates) -> Value {
    json!({
        "hbm_gb_per_s": r.hbm_bytes_per_s / 1e9,
        "host_gb_per_s": r.host_bytes_per_s / 1e9,
        "bf16_tflop_per_s": r.bf16_flops_per_s / 1e12,
        "f32_tflop_per_s": r.f32_flops_per_s / 1e12,
    })
}
