//! Choosing and building the model backend: the float32 CPU reference, or
//! the GPU model on a CUDA device.
//!
//! `model.backend = "auto"` runs CUDA when a driver is present and the
//! device opens (its kernels compile with NVRTC), and otherwise the CPU; the
//! log says which and why. `"cuda"` fails the start with the device's own
//! error instead of falling back. The driver is looked for with
//! `is_culib_present` before any CUDA call (cudarc panics on a missing
//! libcuda otherwise), inside `CudaDevice::open`.
//!
//! With CUDA and no `model.max_slots`, the slot count is the largest the
//! memory plan fits into the device's free memory less
//! `model.cuda.memory_reserve_mib`, and it is printed. `"emu"` builds the
//! GPU model on the kernels' CPU emulator (tests and rehearsals of the CUDA
//! path), with [`CPU_DEFAULT_SLOTS`] slots unless configured.
//!
//! With `model.random_weights` the folder is the shape's (see
//! [`crate::random_weights`]): the GPU model generates its weights on the
//! device, the CPU backend reads the tiny shape's and refuses a full-size
//! one after its preflight.

use crate::config::{Backend, Config, CPU_DEFAULT_SLOTS};
use anyhow::{Context, Result};
use moshid_kernels::device::cuda::{CudaDevice, CudaOpenOptions};
use moshid_kernels::device::emu::EmuDevice;
use moshid_kernels::device::{Device, DeviceError};
use moshid_kernels::model::{GpuModel, GpuOptions};
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::cpu::CpuModel;
use moshid_model::streaming::StreamingModel;
use std::path::Path;

/// A built backend and one line saying what it is.
pub struct Built {
    /// The model.
    pub model: Box<dyn StreamingModel>,
    /// E.g. "cuda (NVIDIA H200, sm_90; bf16, bf16 KV cache, graphs; 64 slots …)".
    pub description: String,
}

fn open_device(config: &Config, cache: &Path) -> Result<CudaDevice, DeviceError> {
    let c = &config.model.cuda;
    let opts = CudaOpenOptions {
        include_dirs: c.include_dirs.clone(),
        cache_dir: Some(c.ptx_cache_dir.clone().unwrap_or_else(|| cache.join("ptx"))),
        debug_sync: c.debug_sync,
        ..CudaOpenOptions::default()
    };
    CudaDevice::open(c.device, &opts)
}

/// Builds the configured backend for the checkpoint in `dir`.
pub fn build(config: &Config, dir: &CheckpointDir, cache: &Path) -> Result<Built> {
    let device = match config.model.backend {
        Backend::Cpu => {
            return cpu(config, dir, "configured".into());
        }
        Backend::Emu => {
            let mut config = config.clone();
            config.model.max_slots = config.model.max_slots.or(Some(CPU_DEFAULT_SLOTS));
            return gpu_as("emu", &config, dir, EmuDevice::new());
        }
        Backend::Cuda => open_device(config, cache).with_context(|| {
            format!(
                "config key `model.backend`: cuda was asked for, but device {} cannot be used",
                config.model.cuda.device
            )
        })?,
        Backend::Auto => match open_device(config, cache) {
            Ok(d) => d,
            Err(DeviceError::NoDriver) => {
                return cpu(config, dir, "auto: no CUDA driver on this machine".into());
            }
            Err(e) => {
                eprintln!(
                    "<4>backend: CUDA device {} is unusable: {e}",
                    config.model.cuda.device
                );
                return cpu(
                    config,
                    dir,
                    format!("auto: the CUDA device is unusable: {e}"),
                );
            }
        },
    };
    gpu(config, dir, device)
}

fn cpu(config: &Config, dir: &CheckpointDir, why: String) -> Result<Built> {
    // Before any weight is read: does it fit, and is it fast enough?
    let (slots, predicted) = crate::preflight::cpu(config, dir)?;
    eprintln!(
        "<6>backend: cpu preflight: {slots} slots fit; predicted step at batch 1: {}",
        predicted.explain()
    );
    if let Some(shape) = random_shape(config) {
        if shape.full_size() {
            return Err(crate::random_weights::cpu_refusal(shape));
        }
    }
    let model = CpuModel::load(dir, slots)
        .with_context(|| format!("loading the weights in {}", dir.dir.display()))?;
    Ok(Built {
        model: Box::new(model),
        description: format!("cpu ({why}; {slots} slots)"),
    })
}

/// The GPU model on `dev` (a [`CudaDevice`] when serving; any [`Device`] in tests).
pub fn gpu<D: Device + 'static>(config: &Config, dir: &CheckpointDir, dev: D) -> Result<Built> {
    gpu_as("cuda", config, dir, dev)
}

/// [`gpu`], described as the backend `label`.
fn gpu_as<D: Device + 'static>(
    label: &str,
    config: &Config,
    dir: &CheckpointDir,
    dev: D,
) -> Result<Built> {
    let c = &config.model.cuda;
    let (precision, kv, plan) = crate::preflight::cuda_plan(config, dir)?;
    let name = dev.name();
    let (free, total) = dev.memory().context("reading the GPU's free memory")?;
    let reserve = c.memory_reserve_mib << 20;
    let (slots, how) = crate::preflight::cuda_slots(
        dir,
        &plan,
        kv,
        config.model.max_slots,
        free as u64,
        total as u64,
        reserve,
    )?;
    eprintln!("<6>backend: {label} on {name}: building for {slots} slots ({how})");
    // A captured launch runs only when its graph does, where no sync can
    // follow it: debug-sync steps launch by launch.
    let graphs = c.graphs && !c.debug_sync;
    if c.debug_sync {
        eprintln!(
            "<4>backend: model.cuda.debug_sync: every launch and GEMM is synchronised and graphs are off (slow; for finding a failing kernel)"
        );
    }
    let opts = GpuOptions {
        max_slots: slots,
        precision,
        kv,
        graphs,
        ..GpuOptions::default()
    };
    let (model, weights) = match random_shape(config) {
        Some(shape) => (
            GpuModel::random(dev, &dir.lm, &dir.mimi, crate::random_weights::SEED, &opts)
                .with_context(|| format!("generating the {} weights on the GPU", shape.name))?,
            format!(
                "random {precision:?} weights ({}) made on the device",
                shape.name
            ),
        ),
        None => (
            GpuModel::load(dev, dir, &opts).with_context(|| {
                format!("loading the weights in {} onto the GPU", dir.dir.display())
            })?,
            format!("{precision:?} weights"),
        ),
    };
    Ok(Built {
        model: Box::new(model),
        description: format!(
            "{label} ({name}; {weights}, {kv:?} KV cache, graphs {}{}; {slots} slots, {how})",
            if graphs { "on" } else { "off" },
            if c.debug_sync { ", debug_sync" } else { "" }
        ),
    })
}

/// The random-weights shape the config names, if any (validated with the config).
fn random_shape(config: &Config) -> Option<&'static crate::random_weights::RandomShape> {
    config
        .model
        .random_weights
        .as_deref()
        .and_then(|n| crate::random_weights::resolve(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshid_kernels::device::emu::EmuDevice;
    use moshid_kernels::plan::{MemoryPlan, PlanOptions};

    fn fixture() -> CheckpointDir {
        let d = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/golden/moshi-tiny"
        ));
        CheckpointDir::open(d).expect("the moshi-tiny golden fixture")
    }

    #[test]
    fn slots_are_derived_from_free_memory_and_printed() {
        let dir = fixture();
        let mut config = Config::default();
        config.model.cuda.memory_reserve_mib = 1;
        let plan = MemoryPlan::new(&dir.lm, &dir.mimi, &PlanOptions::default());
        // Room for the reserve, the fixed buffers and exactly three slots.
        let limit = (1 << 20) + plan.bytes_for(3) as usize + 1024;
        let built = gpu(&config, &dir, EmuDevice::with_memory(limit)).unwrap();
        assert_eq!(built.model.max_slots(), 3, "{}", built.description);
        assert!(
            built.description.contains("3 slots"),
            "{}",
            built.description
        );
        assert!(
            built.description.contains("GiB free"),
            "{}",
            built.description
        );
    }

    #[test]
    fn debug_sync_steps_without_graphs_and_says_so() {
        let mut config = Config::default();
        config.model.cuda.debug_sync = true;
        config.model.max_slots = Some(2);
        config.model.cuda.memory_reserve_mib = 1;
        let built = gpu(&config, &fixture(), EmuDevice::new()).unwrap();
        assert!(
            built.description.contains("graphs off, debug_sync"),
            "{}",
            built.description
        );
    }

    #[test]
    fn configured_slots_that_do_not_fit_are_refused_naming_the_key() {
        let dir = fixture();
        let mut config = Config::default();
        config.model.max_slots = Some(4096);
        let e = gpu(&config, &dir, EmuDevice::with_memory(64 << 20))
            .err()
            .unwrap();
        assert!(format!("{e:#}").contains("model.max_slots"), "{e:#}");
        assert!(format!("{e:#}").contains("not enough GPU memory"), "{e:#}");
    }

    #[test]
    fn random_weights_are_made_on_the_device_and_said_so() {
        let t = tempfile::tempdir().unwrap();
        let shape = crate::random_weights::resolve("moshi-tiny").unwrap();
        let dir = crate::random_weights::prepare(shape, t.path()).unwrap();
        let mut config = Config::default();
        config.model.random_weights = Some("moshi-tiny".into());
        config.model.max_slots = Some(2);
        config.model.cuda.memory_reserve_mib = 1;
        let mut built = gpu(&config, &dir, EmuDevice::new()).unwrap();
        assert!(
            built
                .description
                .contains("random Bf16 weights (moshi-tiny) made on the device"),
            "{}",
            built.description
        );
        // It steps: every slot answers once the model's delay has passed.
        let m = &mut built.model;
        let mut batch = m.new_batch();
        for s in 0..2 {
            m.reset_slot(s, &Default::default()).unwrap();
            batch.exec[s] = true;
        }
        let mut answered = 0;
        for _ in 0..4 {
            m.step(&mut batch).unwrap();
            answered += batch.has_output.iter().filter(|&&o| o).count();
        }
        assert!(answered >= 2, "{answered} outputs");
    }

    #[test]
    fn the_cpu_refuses_a_full_size_random_shape_with_the_way_out() {
        let t = tempfile::tempdir().unwrap();
        let shape = crate::random_weights::resolve("moshi-7b").unwrap();
        let dir = crate::random_weights::prepare(shape, t.path()).unwrap();
        let mut config = Config::default();
        config.model.random_weights = Some("moshi-7b".into());
        config.model.backend = Backend::Cpu;
        config.model.allow_slow = true;
        config.model.max_slots = Some(1);
        let e = build(&config, &dir, t.path()).err().unwrap();
        assert!(format!("{e:#}").contains("--backend cuda"), "{e:#}");
    }

    #[test]
    fn auto_without_a_driver_runs_the_cpu_and_says_why() {
        let dir = fixture();
        let mut config = Config::default();
        config.model.max_slots = Some(2);
        let built = build(&config, &dir, &std::env::temp_dir()).unwrap();
        if moshid_kernels::device::cuda::CudaDevice::open(0, &Default::default()).is_err() {
            assert!(
                built.description.starts_with("cpu (auto"),
                "{}",
                built.description
            );
            assert_eq!(built.model.max_slots(), 2);
        }
    }
}
