//! `moshid check-checkpoint`'s verdict for this machine: the same checks
//! `serve` makes before loading (memory and speed on the CPU, memory on a
//! CUDA device when a driver is present), printed instead of enforced.

use super::{cpu_memory, frame_ms, gib, speed};
use crate::config::{Backend, Config, CPU_DEFAULT_SLOTS};
use moshid_kernels::device::cuda::{CudaDevice, CudaOpenOptions};
use moshid_kernels::device::{Device, DeviceError};
use moshid_model::checkpoint::CheckpointDir;

/// Prints what `serve` would find on this machine for the checkpoint in
/// `dir` under `config` (backend, slots, budget). Informational: the
/// checkpoint itself was validated before.
pub fn print_for_this_machine(dir: &CheckpointDir, config: &Config) {
    println!("  on this machine   (as `moshid serve` would check before loading)");
    if config.model.backend != Backend::Cuda {
        let slots = config.model.max_slots.unwrap_or(CPU_DEFAULT_SLOTS);
        let m = cpu_memory(dir, slots, &super::host::HostMemory::read());
        let verdict = if m.fits() {
            "fits".to_string()
        } else if m.fits_slots == 0 {
            "does NOT fit, not even one slot".to_string()
        } else {
            format!("does NOT fit; at most {} slot(s) would", m.fits_slots)
        };
        println!("    cpu memory      {}: {verdict}", m.summary());
        match speed::measure_and_predict(dir) {
            Ok(p) => {
                let budget = frame_ms(dir);
                let verdict = if p.step_ms() <= budget {
                    "real time".to_string()
                } else {
                    format!(
                        "NOT real time (over the {budget:.0} ms frame; `serve` needs --allow-slow)"
                    )
                };
                println!(
                    "    cpu speed       predicted step at batch 1: {}: {verdict}",
                    p.explain()
                );
            }
            Err(e) => println!("    cpu speed       not measured: {e}"),
        }
    }
    if config.model.backend == Backend::Cpu {
        return;
    }
    let c = &config.model.cuda;
    let opts = CudaOpenOptions {
        include_dirs: c.include_dirs.clone(),
        cache_dir: c.ptx_cache_dir.clone(),
        ..CudaOpenOptions::default()
    };
    match CudaDevice::open(c.device, &opts) {
        Err(DeviceError::NoDriver) => {
            println!("    cuda            no CUDA driver on this machine")
        }
        Err(e) => println!("    cuda            device {} unusable: {e}", c.device),
        Ok(dev) => {
            let line = super::cuda_plan(config, dir)
                .map_err(|e| format!("{e:#}"))
                .and_then(|(_, kv, plan)| {
                    let (free, total) = dev.memory().map_err(|e| e.to_string())?;
                    super::cuda_slots(
                        dir,
                        &plan,
                        kv,
                        config.model.max_slots,
                        free as u64,
                        total as u64,
                        c.memory_reserve_mib << 20,
                    )
                    .map(|(n, how)| {
                        format!(
                            "{}: {n} slots fit ({how}; weights {})",
                            dev.name(),
                            gib(plan.weight_bytes())
                        )
                    })
                    .map_err(|r| r.to_string())
                });
            match line {
                Ok(l) => println!("    cuda            {l}"),
                Err(e) => println!(
                    "    cuda            {}",
                    e.replace('\n', "\n                    ")
                ),
            }
        }
    }
}
