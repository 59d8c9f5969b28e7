//! `gpu-bench`: step time per batch size of the GPU model on a real GPU, for
//! randomly initialised models of the published shapes (Moshi 7B, Hibiki 2B)
//! or of the shape of a checkpoint folder's configurations.
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
//! `--device emu` runs the same loop on the kernels' host emulator: for
//! checking the bench itself on a small shape (its timings say nothing of a
//! GPU); the kernels crate's tests do that on a golden fixture's shape.
//!
//! ```text
//! gpu-bench [--model moshi7b|hibiki2b|hibiki1b|hibiki-zero-3b|DIR] [--batch 1,8,32,64,128] [--steps 200]
//!           [--warmup 10] [--graphs on|off|both] [--out DIR] [--kv bf16|fp8]
//!           [--context N] [--precision bf16|f32] [--cfg COEF] [--device N|emu]
//!           [--reserve-gib G] [--ptx-cache DIR] [--full-context on|off]
//! ```

mod args;
mod measure;
mod profile;
mod report;

/// The golden fixture folders, found as every golden test finds them (only
/// `fixture_dirs` is used here).
#[cfg(test)]
#[allow(dead_code)]
#[path = "../../../../model/tests/golden_fixtures.rs"]
mod golden_fixtures;

use args::{Args, DeviceChoice};
use measure::{is_oom, measure, Results, Skip};
use moshid_kernels::device::cuda::{CudaDevice, CudaOpenOptions};
use moshid_kernels::device::emu::EmuDevice;
use moshid_kernels::device::{Device, DeviceError};
use moshid_kernels::model::{GpuModel, GpuOptions, Precision};
use moshid_kernels::plan::{BucketPolicy, MemoryPlan, PlanOptions};
use moshid_kernels::profile::calibrate::{self, Sizes};
use moshid_kernels::profile::roofline::Rates;
use moshid_kernels::profile::Profiled;
use moshid_kernels::shapes;
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::config::{LmConfig, MimiConfig};
use report::{report, write_profile};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

/// The frame period: a step slower than this falls behind real time.
const FRAME_MS: f64 = 80.0;

fn open_cuda(a: &Args, device: usize) -> Result<CudaDevice, String> {
    let opts = CudaOpenOptions {
        cache_dir: Some(a.ptx_cache.clone()),
        ..CudaOpenOptions::default()
    };
    CudaDevice::open(device, &opts).map_err(|e| match e {
        DeviceError::NoDriver => {
            "no CUDA driver on this machine: gpu-bench needs a GPU".to_string()
        }
        e => format!("opening device {device}: {e}"),
    })
}

/// The name, LM and Mimi shapes of `--model`: a built-in shape (with the
/// published Mimi) or a checkpoint folder's configurations.
fn shapes_of(model: &str) -> Result<(String, LmConfig, MimiConfig), String> {
    if let Some(lm) = shapes::lm_config(model) {
        return Ok((model.to_string(), lm, MimiConfig::mimi_default()));
    }
    let dir = CheckpointDir::open(Path::new(model)).map_err(|e| format!("--model {model}: {e}"))?;
    let name = dir.dir.file_name().map_or_else(
        || "checkpoint".to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok((name, dir.lm, dir.mimi))
}

fn run(a: &Args) -> Result<bool, String> {
    match a.device {
        DeviceChoice::Cuda(n) => run_on(a, Sizes::GPU, || open_cuda(a, n)),
        DeviceChoice::Emulator => run_on(a, Sizes::SMALL, || Ok(EmuDevice::new())),
    }
}

/// Every context asked (`--context`, or the model's own) in turn; with
/// `--profile`, the device's rates first, on a device opened for them.
fn run_on<D: Device>(
    a: &Args,
    sizes: Sizes,
    open_device: impl Fn() -> Result<D, String>,
) -> Result<bool, String> {
    let (name, lm, mimi) = shapes_of(&a.model)?;
    let rates = if a.profile {
        let mut dev = open_device()?;
        let r = calibrate::measure(&mut dev, &sizes)
            .map_err(|e| format!("measuring the device's rates: {e}"))?;
        println!(
            "rates: device memory {:.0} GB/s, host link {:.1} GB/s, bf16 GEMM {:.0} TFLOP/s, f32 GEMM {:.1} TFLOP/s",
            r.hbm_bytes_per_s / 1e9,
            r.host_bytes_per_s / 1e9,
            r.bf16_flops_per_s / 1e12,
            r.f32_flops_per_s / 1e12
        );
        Some(r)
    } else {
        None
    };
    let contexts = if a.contexts.is_empty() {
        vec![lm.context]
    } else {
        a.contexts.clone()
    };
    let mut profiles = Vec::new();
    let mut measured = false;
    for c in contexts {
        let mut lm = lm.clone();
        lm.context = c;
        measured |= run_context(
            a,
            &name,
            &lm,
            &mimi,
            rates.as_ref(),
            &mut profiles,
            &open_device,
        )?;
    }
    Ok(measured)
}

/// Builds the model for the largest size of `fits` on `dev`; if the plan was
/// optimistic, falls back to the next smaller size on a fresh device (each
/// size dropped is a skip). `None` when no size fits.
fn build<D: Device>(
    a: &Args,
    (lm, mimi): (&LmConfig, &MimiConfig),
    graphs: bool,
    dev: D,
    fits: &mut Vec<usize>,
    skips: &mut Vec<Skip>,
    open_device: &impl Fn() -> Result<D, String>,
) -> Result<Option<GpuModel<Profiled<D>>>, String> {
    let mut dev = Some(dev);
    while let Some(&max_slots) = fits.last() {
        let d = match dev.take() {
            Some(d) => d,
            None => open_device()?,
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
            prompt_cache_bytes: 0,
        };
        let t = Instant::now();
        match GpuModel::random(Profiled::new(d), lm, mimi, 0x6d6f_7368_6964, &opts) {
            Ok(m) => {
                println!(
                    "model built for {max_slots} slots (graphs {}) in {:.1} s",
                    if graphs { "on" } else { "off" },
                    t.elapsed().as_secs_f64()
                );
                return Ok(Some(m));
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
    Ok(None)
}

/// One context: a model per graphs mode, every batch size timed (and
/// profiled); the report rewritten after each.
fn run_context<D: Device>(
    a: &Args,
    name: &str,
    lm: &LmConfig,
    mimi: &MimiConfig,
    rates: Option<&Rates>,
    profiles: &mut Vec<profile::ProfileRow>,
    open_device: &impl Fn() -> Result<D, String>,
) -> Result<bool, String> {
    let plan = MemoryPlan::new(
        lm,
        mimi,
        &PlanOptions {
            lm_kv: a.kv,
            ..PlanOptions::default()
        },
    );
    let mut res = Results {
        profiles: std::mem::take(profiles),
        ..Results::default()
    };
    let mut gpu = String::new();
    let mut total_mem = 0usize;
    for &graphs in &a.graphs {
        let dev = open_device()?;
        gpu = dev.name();
        let (free, total) = dev.memory().map_err(|e| e.to_string())?;
        total_mem = total;
        println!(
            "{gpu}: {:.1} of {:.1} GiB free; {} context {}, KV {:?}: weights {:.2} GB, {:.1} MB per slot",
            free as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64,
            name,
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
                    res.skips.push(Skip {
                        graphs,
                        batch: b,
                        why: format!("does not fit: {e}"),
                    });
                }
            }
        }
        let model = build(
            a,
            (lm, mimi),
            graphs,
            dev,
            &mut fits,
            &mut res.skips,
            open_device,
        )?;
        if let Some(mut m) = model {
            let (g, tm) = (gpu.clone(), total_mem);
            measure(&mut m, (lm, mimi), a, graphs, &fits, rates, &mut res, |r| {
                if let Err(e) = report(a, name, lm, &g, tm, &r.rows, &r.skips, true) {
                    println!("writing the partial report: {e}");
                }
                if let Some(rates) = rates {
                    if let Err(e) = write_profile(a, name, lm, &g, rates, &r.profiles) {
                        println!("writing the partial profile: {e}");
                    }
                }
            });
        }
    }
    report(a, name, lm, &gpu, total_mem, &res.rows, &res.skips, false)?;
    if let Some(rates) = rates {
        let (jp, mp) = write_profile(a, name, lm, &gpu, rates, &res.profiles)?;
        println!("wrote {} and {}", jp.display(), mp.display());
    }
    *profiles = res.profiles;
    Ok(!res.rows.is_empty())
}

fn main() -> ExitCode {
    let args = match args::parse(std::env::args().skip(1)) {
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

    /// The bench end to end on the emulator, on a golden fixture's shape:
    /// both graph modes, two batch sizes (one bucket padded), full context,
    /// and the report it writes.
    #[test]
    fn the_bench_runs_and_reports_on_the_emulator() {
        let golden = golden_fixtures::fixture_dirs("lm_config.json").remove(0);
        let out = tempfile::tempdir().unwrap();
        let a = args::parse(
            [
                "--model",
                golden.to_str().unwrap(),
                "--device",
                "emu",
                "--batch",
                "3,1",
                "--steps",
                "3",
                "--warmup",
                "1",
                "--graphs",
                "both",
                "--reserve-gib",
                "0",
                "--out",
                out.path().to_str().unwrap(),
            ]
            .map(String::from),
        )
        .unwrap();
        assert_eq!(a.batches, vec![1, 3]);
        assert!(run(&a).unwrap(), "something was measured");
        let name = golden.file_name().unwrap().to_string_lossy().into_owned();
        let json =
            std::fs::read_to_string(out.path().join(format!("gpu-bench-{name}-kvbf16.json")))
                .unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["gpu"], "emulator");
        assert_eq!(v["full_context"], true);
        let results = v["results"].as_array().unwrap();
        let seen: Vec<(bool, u64)> = results
            .iter()
            .map(|r| (r["graphs"].as_bool().unwrap(), r["batch"].as_u64().unwrap()))
            .collect();
        assert_eq!(seen, vec![(true, 1), (true, 3), (false, 1), (false, 3)]);
        for r in results {
            assert_eq!(r["steps"], 3);
            let (p50, p99) = (r["p50_ms"].as_f64().unwrap(), r["p99_ms"].as_f64().unwrap());
            assert!(p50 > 0.0 && p99 >= p50, "{r}");
        }
        assert!(v["not_measured"].as_array().unwrap().is_empty());
        let md = std::fs::read_to_string(out.path().join(format!("gpu-bench-{name}-kvbf16.md")))
            .unwrap();
        assert!(
            md.contains("| on | 3 |") && md.contains("| off | 1 |"),
            "{md}"
        );
        assert!(md.contains("graphs off: "), "{md}");
    }

    /// One batch's profile: no error, GPU time, every phase (but `other`)
    /// once with calls that add up to the step's, floors, ten slowest calls,
    /// and with graphs the captured graph's nodes equal to the calls.
    fn check_profile(p: &serde_json::Value) {
        assert!(p["error"].is_null(), "{p}");
        assert!(p["gpu_ms"].as_f64().unwrap() > 0.0, "{p}");
        let calls = p["calls_per_step"].as_u64().unwrap();
        if p["graphs"].as_bool().unwrap() {
            assert_eq!(p["graph_nodes"].as_u64(), Some(calls), "{p}");
        }
        let phases = p["phases"].as_array().unwrap();
        let names: Vec<&str> = phases
            .iter()
            .map(|r| r["phase"].as_str().unwrap())
            .collect();
        let want: Vec<&str> = moshid_kernels::device::Phase::ALL
            .iter()
            .filter(|&&ph| ph != moshid_kernels::device::Phase::Other)
            .map(|ph| ph.name())
            .collect();
        let (mut n2, mut w2) = (names.clone(), want.clone());
        n2.sort_unstable();
        w2.sort_unstable();
        assert_eq!(n2, w2);
        let mut sum = 0;
        for r in phases {
            let c = r["calls"].as_u64().unwrap();
            assert!(c > 0, "phase {} has no call: {p}", r["phase"]);
            assert!(r["floor_ms"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["bytes"].as_f64().unwrap() > 0.0, "{r}");
            sum += c;
        }
        assert_eq!(sum, calls, "every call of the step is in a phase: {p}");
        let slowest = p["slowest_calls"].as_array().unwrap();
        assert_eq!(slowest.len(), 10, "{p}");
        assert!(p["x_floor"].as_f64().unwrap() > 0.0);
    }

    /// The profile end to end on the emulator (its timings say nothing; the
    /// plumbing, phases, call counts and JSON are what is checked): a
    /// context sweep, both graph modes, every phase the model runs seen
    /// with calls, the captured graph's nodes equal to the calls counted.
    #[test]
    fn the_profile_runs_on_the_emulator() {
        let golden = golden_fixtures::fixture_dirs("lm_config.json").remove(0);
        let out = tempfile::tempdir().unwrap();
        let json = out.path().join("profile.json");
        let a = args::parse(
            [
                "--model",
                golden.to_str().unwrap(),
                "--device",
                "emu",
                "--batch",
                "2",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--graphs",
                "both",
                "--context",
                "8,12",
                "--profile",
                "--profile-steps",
                "2",
                "--reserve-gib",
                "0",
                "--json",
                json.to_str().unwrap(),
                "--out",
                out.path().to_str().unwrap(),
            ]
            .map(String::from),
        )
        .unwrap();
        assert!(a.profile);
        assert_eq!(a.contexts, vec![8, 12]);
        assert!(run(&a).unwrap(), "something was measured");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert!(v["rates"]["hbm_gb_per_s"].as_f64().unwrap() > 0.0, "{v}");
        let profiles = v["profiles"].as_array().unwrap();
        let seen: Vec<(u64, bool, u64)> = profiles
            .iter()
            .map(|p| {
                (
                    p["context"].as_u64().unwrap(),
                    p["graphs"].as_bool().unwrap(),
                    p["batch"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            vec![(8, true, 2), (8, false, 2), (12, true, 2), (12, false, 2)]
        );
        profiles.iter().for_each(check_profile);
        let md = std::fs::read_to_string(json.with_extension("md")).unwrap();
        assert!(
            md.contains("| lm.attn |") && md.contains("slowest calls"),
            "{md}"
        );
        // The sweep writes one step-time report per context.
        let name = golden.file_name().unwrap().to_string_lossy().into_owned();
        for c in [8, 12] {
            assert!(out
                .path()
                .join(format!("gpu-bench-{name}-kvbf16-ctx{c}.json"))
                .is_file());
        }
    }

    #[test]
    fn arguments_are_checked() {
        assert!(args::parse(["--model", "nope"].map(String::from)).is_err());
        assert!(args::parse(["--device", "x"].map(String::from)).is_err());
        assert!(args::parse(["--batch", "0"].map(String::from)).is_err());
        assert!(args::parse(["--context", "750,0"].map(String::from)).is_err());
        let a =
            args::parse(["--profile", "--context", "750, 1500,3000"].map(String::from)).unwrap();
        assert!(a.profile);
        assert_eq!(a.contexts, vec![750, 1500, 3000]);
        let a = args::parse(["--device", "2"].map(String::from)).unwrap();
        assert_eq!(a.device, DeviceChoice::Cuda(2));
    }
}
