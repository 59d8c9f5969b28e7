//! `moshid check-checkpoint DIR`: the model crate's header-only check of a
//! checkpoint folder (names, shapes and dtypes of every tensor; parameters,
//! KV cache per stream), then what the CUDA backend's memory plan makes of
//! the model: its device footprint per stream and how many streams fit on
//! the GPUs people serve it on.
//!
//! Everything here comes from the folder's own configurations (context,
//! widths, `kv_repeat`, conditioners): no built-in shape is consulted. The
//! figures are the plan the daemon itself uses to derive `model.max_slots`
//! on CUDA ([`MemoryPlan::max_slots`]), for whole devices of the sizes
//! below less the default `model.cuda.memory_reserve_mib`; on a given
//! machine the daemon uses the memory it finds free instead.

use crate::config::Config;
use moshid_kernels::plan::{KvDtype, MemoryPlan, PlanOptions};
use moshid_model::checkpoint::{open_and_check, print_report};
use moshid_model::config::{LmConfig, MimiConfig};
use std::path::Path;
use std::process::ExitCode;

const MIB: u64 = 1 << 20;

/// The devices the report sizes, by the name it prints and their memory:
/// `memory.total` as nvidia-smi reports it for an 80 GB card (H100, A100
/// 80GB: 81 559 MiB) and for the H200 (141 GB: 143 771 MiB).
pub const DEVICES: &[(&str, u64)] = &[("80 GB", 81_559 * MIB), ("141 GB", 143_771 * MIB)];

/// The device memory kept free: the default `model.cuda.memory_reserve_mib`
/// (which also covers the CUDA context).
pub fn reserve_bytes() -> u64 {
    crate::config::CudaConfig::default().memory_reserve_mib * MIB
}

/// The KV cache element types the report compares.
pub const KV_TYPES: &[(&str, KvDtype)] = &[("bf16", KvDtype::Bf16), ("fp8", KvDtype::Fp8E4m3)];

/// What the memory plan makes of one model with one KV cache type.
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    /// The KV cache element type.
    pub kv: KvDtype,
    /// The plan.
    pub plan: MemoryPlan,
    /// Streams per device of [`DEVICES`] (0: not even one fits).
    pub streams: Vec<usize>,
}

/// The plan of `lm` + `mimi` for each of [`KV_TYPES`], with the streams
/// each of [`DEVICES`] holds.
pub fn capacity(lm: &LmConfig, mimi: &MimiConfig) -> Vec<Capacity> {
    let reserve = reserve_bytes();
    KV_TYPES
        .iter()
        .map(|&(_, kv)| {
            let plan = MemoryPlan::new(
                lm,
                mimi,
                &PlanOptions {
                    lm_kv: kv,
                    ..PlanOptions::default()
                },
            );
            let streams = DEVICES
                .iter()
                .map(|&(_, bytes)| plan.max_slots(bytes, reserve).unwrap_or(0))
                .collect();
            Capacity { kv, plan, streams }
        })
        .collect()
}

/// Prints [`capacity`] under the model crate's report.
pub fn print_capacity(lm: &LmConfig, mimi: &MimiConfig) {
    let caps = capacity(lm, mimi);
    let mb = |b: u64| b as f64 / 1e6;
    let p = &caps[0].plan;
    println!(
        "  on the GPU        weights {:.2} GB (LM bf16) + {:.0} MB (Mimi f32)",
        mb(p.lm_weight_bytes) / 1e3,
        mb(p.mimi_weight_bytes)
    );
    let rows = if p.rows_per_slot > 1 {
        format!(" ({} rows per stream: guidance)", p.rows_per_slot)
    } else {
        String::new()
    };
    for ((name, _), c) in KV_TYPES.iter().zip(&caps) {
        println!(
            "  per stream ({name:<4}) KV {:.1} MB{rows}, all state and scratch {:.1} MB",
            mb(c.plan.kv_bytes_per_slot()),
            mb(c.plan.state_bytes_per_slot() + c.plan.scratch_bytes_per_step)
        );
    }
    let header: Vec<String> = KV_TYPES.iter().map(|(n, _)| format!("{n} KV")).collect();
    println!(
        "  streams per GPU   {:<8} {}   (whole device less the {} MiB reserve)",
        "",
        header
            .iter()
            .map(|h| format!("{h:>8}"))
            .collect::<Vec<_>>()
            .join(" "),
        reserve_bytes() / MIB
    );
    for (i, (dev, _)) in DEVICES.iter().enumerate() {
        let cells: Vec<String> = caps
            .iter()
            .map(|c| format!("{:>8}", c.streams[i]))
            .collect();
        println!("                    {dev:<8} {}", cells.join(" "));
    }
}

/// The command: the report, the plan and this machine's verdict for
/// `setup` (the configuration `moshid serve` with the same arguments would
/// run with, or why there is none), or the reason and a failure code.
pub fn main(dir: &Path, setup: Result<Config, String>) -> ExitCode {
    let started = std::time::Instant::now();
    match open_and_check(dir) {
        Ok((d, r)) => {
            print_report(&d, &r, started.elapsed());
            print_capacity(&d.lm, &d.mimi);
            match setup {
                Ok(cfg) => crate::preflight::report::print_for_this_machine(&d, &cfg),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("checkpoint {}: INVALID: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshid_kernels::shapes;

    #[test]
    fn capacity_follows_kv_type_and_device() {
        let mimi = MimiConfig::mimi_default();
        for name in shapes::MODELS {
            let lm = shapes::lm_config(name).unwrap();
            let caps = capacity(&lm, &mimi);
            let (bf16, fp8) = (&caps[0], &caps[1]);
            assert_eq!(
                2 * fp8.plan.kv_bytes_per_slot(),
                bf16.plan.kv_bytes_per_slot()
            );
            for (i, &(_, total)) in DEVICES.iter().enumerate() {
                assert!(fp8.streams[i] > bf16.streams[i], "{name}: {caps:?}");
                // The count is the plan's: it fits, one more does not.
                let n = bf16.streams[i];
                assert!(bf16.plan.check_fits(n, total, reserve_bytes()).is_ok());
                assert!(bf16.plan.check_fits(n + 1, total, reserve_bytes()).is_err());
            }
            assert!(bf16.streams[1] > bf16.streams[0], "{name}");
        }
    }
}
