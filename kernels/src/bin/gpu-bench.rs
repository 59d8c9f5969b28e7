//! `gpu-bench`: step time per batch size of the GPU model on a real GPU, for
//! randomly initialised models of the published shapes (Moshi 7B, Hibiki 2B).
//!
//! For each graphs mode asked, one model is built on a freshly opened
//! [`CudaDevice`] with `max_slots` = the largest asked batch size that the
//! memory plan fits (`plan::MemoryPlan`, checked against the device's free
//! memory before anything is allocated; sizes that do not fit are skipped with
//! a line saying why). Then for each batch size `b`, ascending: slots `0..b`
//! are reset, every step feeds each of them a deterministic tone (a
//! continuous sine per slot, filled outside the timed region), `--warmup`
//! steps run untimed, and `--steps` steps are timed wall-clock, each
//! including the step's own synchronisation (the model's `step` returns when
//! its outputs are on the host). Reported per size: p50, p99 and max ms; and
//! the largest size whose p99 is under the 80 ms frame. Results are printed
//! and written to `--out` as JSON and a markdown table with the GPU's name and
//! the date.
//!
//! Full context by default: after its reset each slot is moved forward by the
//! model's context (`GpuModel::fast_forward_for_timing`), so every timed step
//! attends over the whole window, as in a conversation older than the
//! context (3,000 steps = 4 minutes for Moshi). `--full-context off` times
//! fresh streams instead (attention over at most `warmup + steps`
//! positions). The report is rewritten after every batch size, so a run cut
//! short keeps what it measured.
//!
//! ```text
//! gpu-bench [--model moshi7b|hibiki2b] [--batch 1,8,32,64,128] [--steps 200]
//!           [--warmup 10] [--graphs on|off|both] [--out DIR] [--kv bf16|fp8]
//!           [--context N] [--precision bf16|f32] [--cfg COEF] [--device N]
//!           [--reserve-gib G] [--ptx-cache DIR] [--full-context on|off]
//! ```

use moshid_kernels::device::cuda::{CudaDevice, CudaOpenOptions};
use moshid_kernels::device::{Device, DeviceError};
use moshid_kernels::model::{GpuError, GpuModel, GpuOptions, Precision};
use moshid_kernels::plan::{BucketPolicy, KvDtype, MemoryPlan, PlanOptions};
use moshid_kernels::shapes;
use moshid_model::config::{LmConfig, MimiConfig};
use moshid_model::lm::GenParams;
use moshid_model::streaming::{Batch, SessionParams, StreamingModel};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// The frame period: a step slower than this falls behind real time.
const FRAME_MS: f64 = 80.0;

const USAGE: &str =
    "usage: gpu-bench [--model moshi7b|hibiki2b] [--batch 1,8,32,64,128] [--steps 200] \
[--warmup 10] [--graphs on|off|both] [--out DIR] [--kv bf16|fp8] [--context N] \
[--precision bf16|f32] [--cfg COEF] [--device N] [--reserve-gib G] [--ptx-cache DIR] \
[--full-context on|off]";

#[derive(Debug, Clone)]
struct Args {
    model: String,
    batches: Vec<usize>,
    steps: usize,
    warmup: usize,
    graphs: Vec<bool>,
    out: PathBuf,
    kv: KvDtype,
    context: Option<usize>,
    /// f32 weights (`--precision f32`) instead of bf16.
    f32_weights: bool,
    cfg: Option<f32>,
    device: usize,
    reserve: u64,
    ptx_cache: PathBuf,
    /// Attention over the whole context in every timed step.
    full_context: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        model: "moshi7b".into(),
        batches: vec![1, 8, 32, 64, 128],
        steps: 200,
        warmup: 10,
        graphs: vec![true],
        out: PathBuf::from("bench/results"),
        kv: KvDtype::Bf16,
        context: None,
        f32_weights: false,
        cfg: None,
        device: 0,
        reserve: 2 << 30,
        ptx_cache: PathBuf::from("target/ptx-cache"),
        full_context: true,
    };
    let num = |flag: &str, v: &str| -> Result<usize, String> {
        v.parse::<usize>()
            .map_err(|_| format!("{flag}: `{v}` is not a number"))
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.into());
        }
        let v = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--model" => {
                if !shapes::MODELS.contains(&v.as_str()) {
                    return Err(format!("--model: `{v}` is not one of {:?}", shapes::MODELS));
                }
                a.model = v;
            }
            "--batch" => {
                let mut b = v
                    .split(',')
                    .map(|s| num("--batch", s.trim()))
                    .collect::<Result<Vec<_>, _>>()?;
                b.sort_unstable();
                b.dedup();
                if b.is_empty() || b[0] == 0 {
                    return Err("--batch: give positive sizes, e.g. 1,8,32".into());
                }
                a.batches = b;
            }
            "--steps" => a.steps = num("--steps", &v)?.max(1),
            "--warmup" => a.warmup = num("--warmup", &v)?,
            "--graphs" => {
                a.graphs = match v.as_str() {
                    "on" => vec![true],
                    "off" => vec![false],
                    "both" => vec![true, false],
                    _ => return Err("--graphs: on, off or both".into()),
                }
            }
            "--out" => a.out = PathBuf::from(v),
            "--kv" => {
                a.kv = match v.as_str() {
                    "bf16" => KvDtype::Bf16,
                    "fp8" => KvDtype::Fp8E4m3,
                    _ => return Err("--kv: bf16 or fp8".into()),
                }
            }
            "--context" => a.context = Some(num("--context", &v)?),
            "--precision" => {
                a.f32_weights = match v.as_str() {
                    "bf16" => false,
                    "f32" => true,
                    _ => return Err("--precision: bf16 or f32".into()),
                }
            }
            "--cfg" => {
                a.cfg = Some(
                    v.parse()
                        .map_err(|_| format!("--cfg: `{v}` is not a number"))?,
                )
            }
            "--device" => a.device = num("--device", &v)?,
            "--reserve-gib" => {
                let g: f64 = v
                    .parse()
                    .map_err(|_| format!("--reserve-gib: `{v}` is not a number"))?;
                a.reserve = (g.max(0.0) * (1u64 << 30) as f64) as u64;
            }
            "--ptx-cache" => a.ptx_cache = PathBuf::from(v),
            "--full-context" => {
                a.full_context = match v.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => return Err("--full-context: on or off".into()),
                }
            }
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    Ok(a)
}

/// Timings of one batch size.
#[derive(Debug, Clone)]
struct Row {
    graphs: bool,
    batch: usize,
    p50: f64,
    p99: f64,
    max: f64,
    mean: f64,
    steps: usize,
    /// Slot-steps that reported a fault (non-finite values): a random model
    /// may produce some; counted, not fatal.
    faults: usize,
}

/// A batch size that was not measured, and why.
#[derive(Debug, Clone)]
struct Skip {
    graphs: bool,
    batch: usize,
    why: String,
}

/// The `q`-quantile of sorted values (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `YYYY-MM-DD` and `HH:MM:SSZ` (UTC) of now.
fn utc_now() -> (String, String) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    civil(secs)
}

/// `YYYY-MM-DD` and `HH:MM:SSZ` of `secs` seconds after the Unix epoch.
fn civil(secs: i64) -> (String, String) {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60),
    )
}

fn open_device(a: &Args) -> Result<CudaDevice, String> {
    let opts = CudaOpenOptions {
        cache_dir: Some(a.ptx_cache.clone()),
        ..CudaOpenOptions::default()
    };
    CudaDevice::open(a.device, &opts).map_err(|e| match e {
        DeviceError::NoDriver => {
            "no CUDA driver on this machine: gpu-bench needs a GPU".to_string()
        }
        e => format!("opening device {}: {e}", a.device),
    })
}

/// Whether a model build failed for lack of device memory.
fn is_oom(e: &GpuError) -> bool {
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
    SessionParams { gen }
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

/// Steps `model` for each batch size of `sizes` (all ≤ its `max_slots`).
#[allow(clippy::too_many_arguments)]
fn measure(
    model: &mut GpuModel<CudaDevice>,
    lm: &LmConfig,
    a: &Args,
    graphs: bool,
    sizes: &[usize],
    rows: &mut Vec<Row>,
    skips: &mut Vec<Skip>,
    mut after_each: impl FnMut(&[Row], &[Skip]),
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
            let mut times = Vec::with_capacity(a.steps);
            let mut faults = 0;
            for step in 0..a.warmup + a.steps {
                fill_input(&mut batch, b, step);
                let t = Instant::now();
                model
                    .step(&mut batch)
                    .map_err(|e| format!("step {step}: {e}"))?;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                if step >= a.warmup {
                    times.push(ms);
                    faults += batch.fault[..b].iter().filter(|f| f.is_some()).count();
                }
            }
            let mean = times.iter().sum::<f64>() / times.len() as f64;
            times.sort_by(f64::total_cmp);
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
                rows.push(r);
            }
            Err(why) => {
                println!("graphs {graphs}  batch {b}: failed: {why}");
                skips.push(Skip {
                    graphs,
                    batch: b,
                    why,
                });
            }
        }
        after_each(rows, skips);
    }
}

fn run(a: &Args) -> Result<bool, String> {
    let mut lm = shapes::lm_config(&a.model).ok_or("unknown model")?;
    if let Some(c) = a.context {
        if c == 0 {
            return Err("--context must be positive".into());
        }
        lm.context = c;
    }
    let mimi = MimiConfig::mimi_default();
    let plan = MemoryPlan::new(
        &lm,
        &mimi,
        &PlanOptions {
            lm_kv: a.kv,
            ..PlanOptions::default()
        },
    );
    let mut rows: Vec<Row> = Vec::new();
    let mut skips: Vec<Skip> = Vec::new();
    let mut gpu = String::new();
    let mut total_mem = 0usize;
    for &graphs in &a.graphs {
        let dev = open_device(a)?;
        gpu = dev.name();
        let (free, total) = dev.memory().map_err(|e| e.to_string())?;
        total_mem = total;
        println!(
            "{gpu}: {:.1} of {:.1} GiB free; {} context {}, KV {:?}: weights {:.2} GB, {:.1} MB per slot",
            free as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64,
            a.model,
            lm.context,
            a.kv,
            plan.weight_bytes() as f64 / 1e9,
            (plan.state_bytes_per_slot() + plan.scratch_bytes_per_step) as f64 / 1e6
        );
        let mut fits: Vec<usize> = Vec::new();
        for &b in &a.batches {
            match plan.check_fits(b, free as u64, a.reserve) {
                Ok(()) => fits.push(b),
                Err(e) => {
                    println!("batch {b}: skipped, does not fit: {e}");
                    skips.push(Skip {
                        graphs,
                        batch: b,
                        why: format!("does not fit: {e}"),
                    });
                }
            }
        }
        // Build for the largest size that fits; if the plan was optimistic,
        // fall back to the next smaller one on a fresh device.
        let mut dev = Some(dev);
        let mut model = None;
        while let Some(&max_slots) = fits.last() {
            let d = match dev.take() {
                Some(d) => d,
                None => open_device(a)?,
            };
            let opts = GpuOptions {
                max_slots,
                precision: if a.f32_weights {
                    Precision::F32
                } else {
                    Precision::Bf16
                },
                kv: a.kv,
                graphs,
                buckets: BucketPolicy::default(),
            };
            let t = Instant::now();
            match GpuModel::random(d, &lm, &mimi, 0x6d6f_7368_6964, &opts) {
                Ok(m) => {
                    println!(
                        "model built for {max_slots} slots (graphs {}) in {:.1} s",
                        if graphs { "on" } else { "off" },
                        t.elapsed().as_secs_f64()
                    );
                    model = Some(m);
                    break;
                }
                Err(e) if is_oom(&e) => {
                    println!("batch {max_slots}: skipped, out of memory while building: {e}");
                    skips.push(Skip {
                        graphs,
                        batch: max_slots,
                        why: format!("out of memory while building: {e}"),
                    });
                    fits.pop();
                }
                Err(e) => return Err(format!("building the model: {e}")),
            }
        }
        if let Some(mut m) = model {
            let (g, tm) = (gpu.clone(), total_mem);
            measure(
                &mut m,
                &lm,
                a,
                graphs,
                &fits,
                &mut rows,
                &mut skips,
                |r, s| {
                    if let Err(e) = report(a, &lm, &g, tm, r, s, true) {
                        println!("writing the partial report: {e}");
                    }
                },
            );
        }
    }
    report(a, &lm, &gpu, total_mem, &rows, &skips, false)?;
    Ok(!rows.is_empty())
}

/// The largest measured batch whose p99 is under the frame period.
fn largest_real_time(rows: &[Row], graphs: bool) -> Option<usize> {
    rows.iter()
        .filter(|r| r.graphs == graphs && r.p99 < FRAME_MS)
        .map(|r| r.batch)
        .max()
}

fn report(
    a: &Args,
    lm: &LmConfig,
    gpu: &str,
    total_mem: usize,
    rows: &[Row],
    skips: &[Skip],
    quiet: bool,
) -> Result<(), String> {
    let (date, time) = utc_now();
    let attention = if a.full_context {
        format!(
            "Every slot starts {} positions in, so attention spans the full context.",
            lm.context
        )
    } else {
        format!(
            "Fresh streams: the KV cache holds at most {} positions, so attention does not span the full context.",
            a.warmup + a.steps
        )
    };
    let kv = match a.kv {
        KvDtype::Bf16 => "bf16",
        KvDtype::Fp8E4m3 => "fp8",
        KvDtype::F32 => "f32",
    };
    let precision = if a.f32_weights { "f32" } else { "bf16" };
    let mut md = format!(
        "# gpu-bench: {} on {gpu}\n\n{date} {time}; random weights of the {} shapes (dim {}, {} layers, \
         context {}), {precision} weights, KV cache {kv}; {} timed steps after {} warm-up steps, wall-clock \
         per step including its synchronisation. {attention}\n\n\
         | graphs | batch | p50 ms | p99 ms | max ms | mean ms | faults |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        a.model,
        a.model,
        lm.dim,
        lm.num_layers,
        lm.context,
        a.steps,
        a.warmup,
    );
    if !quiet {
        println!();
        println!("graphs  batch    p50 ms    p99 ms    max ms   mean ms  faults");
    }
    for r in rows {
        let g = if r.graphs { "on" } else { "off" };
        if !quiet {
            println!(
                "{g:6} {:6} {:9.2} {:9.2} {:9.2} {:9.2} {:7}",
                r.batch, r.p50, r.p99, r.max, r.mean, r.faults
            );
        }
        md.push_str(&format!(
            "| {g} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} |\n",
            r.batch, r.p50, r.p99, r.max, r.mean, r.faults
        ));
    }
    let mut best = Vec::new();
    for &g in &a.graphs {
        let mode = if g { "on" } else { "off" };
        let line = match largest_real_time(rows, g) {
            Some(b) => format!("graphs {mode}: largest batch with p99 < {FRAME_MS} ms: {b}"),
            None => format!("graphs {mode}: no measured batch has p99 < {FRAME_MS} ms"),
        };
        if !quiet {
            println!("{line}");
        }
        md.push_str(&format!("\n{line}"));
        best.push(serde_json::json!({"graphs": g, "largest_batch_p99_under_80ms": largest_real_time(rows, g)}));
    }
    md.push('\n');
    if !skips.is_empty() {
        md.push_str("\nNot measured:\n\n");
        for s in skips {
            md.push_str(&format!(
                "- graphs {} batch {}: {}\n",
                if s.graphs { "on" } else { "off" },
                s.batch,
                s.why
            ));
        }
    }
    let json = serde_json::json!({
        "tool": "gpu-bench",
        "gpu": gpu,
        "gpu_memory_bytes": total_mem,
        "date": date,
        "time_utc": time,
        "model": a.model,
        "shape": {"dim": lm.dim, "num_layers": lm.num_layers, "num_heads": lm.num_heads,
                  "context": lm.context, "n_q": lm.n_q, "dep_q": lm.dep_q},
        "precision": precision,
        "kv": kv,
        "steps": a.steps,
        "warmup": a.warmup,
        "full_context": a.full_context,
        "kv_positions_at_most": if a.full_context { lm.context } else { a.warmup + a.steps },
        "frame_ms": FRAME_MS,
        "results": rows.iter().map(|r| serde_json::json!({
            "graphs": r.graphs, "batch": r.batch, "p50_ms": r.p50, "p99_ms": r.p99,
            "max_ms": r.max, "mean_ms": r.mean, "steps": r.steps, "faulted_slot_steps": r.faults,
        })).collect::<Vec<_>>(),
        "not_measured": skips.iter().map(|s| serde_json::json!({
            "graphs": s.graphs, "batch": s.batch, "why": s.why,
        })).collect::<Vec<_>>(),
        "summary": best,
    });
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let stem = format!("gpu-bench-{}-kv{kv}", a.model);
    let jp = a.out.join(format!("{stem}.json"));
    let mp = a.out.join(format!("{stem}.md"));
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(&jp, text + "\n").map_err(|e| format!("{}: {e}", jp.display()))?;
    std::fs::write(&mp, md).map_err(|e| format!("{}: {e}", mp.display()))?;
    if !quiet {
        println!("wrote {} and {}", jp.display(), mp.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("gpu-bench: nothing was measured");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("gpu-bench: {e}");
            ExitCode::FAILURE
        }
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

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil(0), ("1970-01-01".into(), "00:00:00Z".into()));
        assert_eq!(civil(951_782_400 + 3_723).0, "2000-02-29");
        assert_eq!(civil(951_782_400 + 3_723).1, "01:02:03Z");
        assert_eq!(civil(1_735_689_599).0, "2024-12-31");
        assert_eq!(civil(1_735_689_600).0, "2025-01-01");
    }
}
