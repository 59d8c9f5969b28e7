//! The start-up preflight: before a weight is read, can this machine hold
//! the model, and can it run it in real time? A machine that cannot gets a
//! refusal in words — the figures and the ways out — instead of an
//! allocation abort or the kernel's OOM killer.
//!
//! One place for both users: `moshid serve` (through [`crate::backend`],
//! before it loads anything) and `moshid check-checkpoint` (which prints the
//! same verdicts for this machine, [`report`]).
//!
//! - **CPU memory**: the CPU backend's footprint
//!   ([`moshid_model::footprint`]: float32 weights, KV caches and Mimi
//!   state for `max_slots`, scratch) against the lowest of `MemAvailable`,
//!   the cgroup's `memory.max` and `RLIMIT_AS` ([`host`]).
//! - **CPU speed**: the step at batch 1 predicted from a measured probe of
//!   this machine ([`speed`]) against the frame it must produce (80 ms);
//!   over it,
//!   `serve` refuses unless `model.allow_slow` (`--allow-slow`), and then
//!   admission still refuses every stream it cannot carry.
//! - **CUDA memory**: the kernels' memory plan ([`moshid_kernels::plan`])
//!   against the device's free memory less `model.cuda.memory_reserve_mib`.

pub mod host;
pub mod report;
pub mod speed;

use crate::config::{Config, CudaPrecision, KvCacheType, CPU_DEFAULT_SLOTS};
use host::HostMemory;
use moshid_kernels::model::Precision;
use moshid_kernels::plan::{KvDtype, MemoryPlan, PlanError, PlanOptions};
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::footprint::CpuFootprint;

/// Address space a running daemon maps beyond the model (code, thread
/// stacks, io_uring rings, allocator arenas): counted only against
/// `RLIMIT_AS`, which counts reservations as well as memory. Measured on
/// the demo model (VmPeak of a serving daemon ≈ 0.6 GiB), with margin.
pub const ADDRESS_SPACE_OVERHEAD: u64 = 1 << 30;

/// The CUDA backend's precision, KV cache type and memory plan for `dir`
/// under `config` (what [`crate::backend::gpu`] builds, and what `check-checkpoint` reports).
pub fn cuda_plan(
    config: &Config,
    dir: &CheckpointDir,
) -> anyhow::Result<(Precision, KvDtype, MemoryPlan)> {
    let c = &config.model.cuda;
    let (precision, kv) = match (c.precision, c.kv()) {
        (CudaPrecision::Bf16, KvCacheType::Bf16) => (Precision::Bf16, KvDtype::Bf16),
        (CudaPrecision::Bf16, KvCacheType::Fp8) => (Precision::Bf16, KvDtype::Fp8E4m3),
        (CudaPrecision::F32, KvCacheType::F32) => (Precision::F32, KvDtype::F32),
        (p, k) => anyhow::bail!("config key `model.cuda.kv_cache`: {k:?} with precision {p:?}"),
    };
    let mut plan = MemoryPlan::new(
        &dir.lm,
        &dir.mimi,
        &PlanOptions {
            lm_kv: kv,
            ..PlanOptions::default()
        },
    );
    if precision == Precision::F32 {
        plan.lm_weight_bytes *= 2;
    }
    Ok((precision, kv, plan))
}

/// A refusal to start, in words: what is needed, what there is, the ways out.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

pub(crate) fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// A short name of the model: "Moshi (dim 4096, 32 layers) in DIR".
pub(crate) fn model_name(dir: &CheckpointDir) -> String {
    format!(
        "the {:?} model in {} (dim {}, {} layers, context {})",
        dir.lm.model_type,
        dir.dir.display(),
        dir.lm.dim,
        dir.lm.num_layers,
        dir.lm.context
    )
}

/// The CPU backend's memory verdict for `slots` slots on this machine.
#[derive(Debug, Clone)]
pub struct CpuMemory {
    /// Slots asked for.
    pub slots: usize,
    /// Bytes they need, as the binding limit counts them.
    pub need: u64,
    /// Bytes available under it.
    pub available: u64,
    /// The binding limit's name.
    pub limit: &'static str,
    /// The footprint the need comes from.
    pub footprint: CpuFootprint,
    /// The most slots that fit (0: not even one).
    pub fits_slots: usize,
    /// Address space counted in `need` beyond memory (the mapped checkpoint
    /// and the runtime's reservations), when the binding limit counts it.
    pub mapped: u64,
}

impl CpuMemory {
    /// Whether the slots fit.
    pub fn fits(&self) -> bool {
        self.need <= self.available
    }

    /// One line: "8 slots need 56.3 GiB, 15.1 GiB available (RLIMIT_AS …)".
    pub fn summary(&self) -> String {
        let maps = if self.mapped > 0 {
            format!(
                ", {} of mapped checkpoint and runtime address space, which {} counts",
                gib(self.mapped),
                self.limit
            )
        } else {
            String::new()
        };
        format!(
            "{} slot(s) need {} (float32 weights {}, {} per slot{maps}), {} available ({})",
            self.slots,
            gib(self.need),
            gib(self.footprint.weight_bytes()),
            gib(self.footprint.bytes_per_slot()),
            gib(self.available),
            self.limit
        )
    }
}

/// Computes the CPU memory verdict (reads nothing but the headers' sizes).
pub fn cpu_memory(dir: &CheckpointDir, slots: usize, host: &HostMemory) -> CpuMemory {
    let footprint = CpuFootprint::new(&dir.lm, &dir.mimi);
    let memory = footprint.bytes_for(slots);
    // The loader maps one weights file at a time (Mimi, then the LM).
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let mapped = size(&dir.lm_weights).max(size(&dir.mimi_weights)) + ADDRESS_SPACE_OVERHEAD;
    let (need, available, limit, counts_maps) = match host.available_for(memory, mapped) {
        Some((need, avail, l)) => (need, avail, l.name, l.counts_mappings),
        // No limit known: nothing to check against.
        None => (memory, u64::MAX, "no limit known on this system", false),
    };
    let room = if counts_maps {
        available.saturating_sub(mapped)
    } else {
        available
    };
    CpuMemory {
        slots,
        need,
        available,
        limit,
        fits_slots: footprint.max_slots(room),
        footprint,
        mapped: if counts_maps { mapped } else { 0 },
    }
}

/// What the model would take on a GPU (for the ways out of a CPU refusal).
fn gpu_figures(dir: &CheckpointDir) -> String {
    let plan = MemoryPlan::new(&dir.lm, &dir.mimi, &PlanOptions::default());
    format!(
        "there its weights take {:.1} GB (the LM in bf16) and each stream {} of KV cache ({} with \
         `model.cuda.kv_cache = \"fp8\"`)",
        plan.weight_bytes() as f64 / 1e9,
        gib(plan.kv_bytes_per_slot()),
        gib(plan.kv_bytes_per_slot() / 2)
    )
}

/// The refusal for a CPU memory verdict that does not fit.
pub fn cpu_memory_refusal(dir: &CheckpointDir, m: &CpuMemory) -> Refusal {
    let mut ways = Vec::new();
    if m.fits_slots >= 1 {
        ways.push(format!(
            "fewer streams: `--max-slots {}` (`model.max_slots`) fits in what is available",
            m.fits_slots
        ));
    } else {
        ways.push(format!(
            "fewer streams will not do: even one slot needs {} here",
            gib(m.need - m.footprint.bytes_per_slot() * (m.slots.saturating_sub(1)) as u64)
        ));
    }
    ways.push(format!(
        "the GPU backend: `--backend cuda` on a machine with an NVIDIA GPU ({})",
        gpu_figures(dir)
    ));
    ways.push(format!(
        "another machine, or a higher limit: {} available to this process is needed for {} slot(s)",
        gib(m.need),
        m.slots
    ));
    Refusal(format!(
        "not enough memory to serve {} on the CPU backend: {}.\n\
         The CPU backend holds every weight in float32. Ways out:\n  - {}",
        model_name(dir),
        m.summary(),
        ways.join("\n  - ")
    ))
}

/// The real-time bound on one stream's step, in milliseconds: the frame.
/// A model slower than its frame at batch 1 can never keep up; the finer
/// budget (`80 ms / engine.phase_groups − engine.budget_margin_ms`, which
/// can be tightened at will) is admission's to apply, stream by stream.
pub fn frame_ms(dir: &CheckpointDir) -> f64 {
    1000.0 / dir.mimi.frame_rate
}

/// The refusal for a CPU step predicted over the budget.
pub fn cpu_speed_refusal(dir: &CheckpointDir, p: &speed::Prediction, budget_ms: f64) -> Refusal {
    Refusal(format!(
        "{} cannot run in real time on this machine's CPU: one stream's step is predicted at {}, \
         longer than the {budget_ms:.0} ms of audio a step makes. Ways out:\n  \
         - the GPU backend: `--backend cuda` on a machine with an NVIDIA GPU ({})\n  \
         - `--allow-slow` (`model.allow_slow`) to start anyway, for offline or test use: \
         admission still refuses every stream it cannot carry in real time",
        model_name(dir),
        p.explain(),
        gpu_figures(dir)
    ))
}

/// The CPU preflight of `serve`: memory, then speed. Returns the slots and
/// the predicted step (for the log), or the refusal.
pub fn cpu(config: &Config, dir: &CheckpointDir) -> Result<(usize, speed::Prediction), Refusal> {
    let slots = config.model.max_slots.unwrap_or(CPU_DEFAULT_SLOTS);
    let m = cpu_memory(dir, slots, &HostMemory::read());
    if !m.fits() {
        return Err(cpu_memory_refusal(dir, &m));
    }
    let p = speed::measure_and_predict(dir)
        .map_err(|e| Refusal(format!("measuring this machine before loading: {e}")))?;
    let budget = frame_ms(dir);
    if p.step_ms() > budget && !config.model.allow_slow {
        return Err(cpu_speed_refusal(dir, &p, budget));
    }
    Ok((slots, p))
}

/// The CUDA memory plan's verdict: the slots to build (configured, or the
/// most that fit) and how they were chosen, or the refusal in words.
pub fn cuda_slots(
    dir: &CheckpointDir,
    plan: &MemoryPlan,
    kv: KvDtype,
    max_slots: Option<usize>,
    free: u64,
    total: u64,
    reserve: u64,
) -> Result<(usize, String), Refusal> {
    let refuse = |e: PlanError, configured: bool| {
        let PlanError::DoesNotFit {
            slots, need, avail, ..
        } = e;
        let fit = plan.max_slots(free, reserve).unwrap_or(0);
        let mut ways = Vec::new();
        if configured && fit >= 1 {
            ways.push(format!(
                "fewer streams: `--max-slots {fit}` (`model.max_slots`) fits"
            ));
        }
        if kv == KvDtype::Bf16 {
            ways.push(
                "an fp8 KV cache: `model.cuda.kv_cache = \"fp8\"` halves the memory per stream"
                    .to_string(),
            );
        }
        ways.push(format!(
            "a smaller `model.cuda.memory_reserve_mib` (now {} MiB), if nothing else uses the GPU",
            reserve >> 20
        ));
        ways.push(format!(
            "a GPU with more free memory: {} for {slots} slot(s)",
            gib(need + reserve)
        ));
        Refusal(format!(
            "not enough GPU memory to serve {}: {slots} slot(s){} need {} (weights {}, {} per slot), \
             {} of the device's {} free ({} total) may be used after the {} reserve. Ways out:\n  - {}",
            model_name(dir),
            if configured { " (`model.max_slots`)" } else { "" },
            gib(need),
            gib(plan.weight_bytes()),
            gib(plan.state_bytes_per_slot() + plan.scratch_bytes_per_step),
            gib(avail),
            gib(free),
            gib(total),
            gib(reserve),
            ways.join("\n  - ")
        ))
    };
    match max_slots {
        Some(n) => {
            plan.check_fits(n, free, reserve)
                .map_err(|e| refuse(e, true))?;
            Ok((n, "configured".to_string()))
        }
        None => {
            let n = plan
                .max_slots(free, reserve)
                .map_err(|e| refuse(e, false))?;
            Ok((
                n.min(4096),
                format!(
                    "from {} of {} free, {} reserved, {} per slot",
                    gib(free),
                    gib(total),
                    gib(reserve),
                    gib(plan.bytes_for(2) - plan.bytes_for(1)),
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use host::Limit;

    fn moshi_7b() -> (tempfile::TempDir, CheckpointDir) {
        let t = tempfile::tempdir().unwrap();
        moshid_model::header_only::write_moshi_7b(t.path()).unwrap();
        let d = CheckpointDir::open(t.path()).unwrap();
        (t, d)
    }

    fn limited(bytes: u64) -> HostMemory {
        HostMemory {
            limits: vec![Limit {
                name: "RLIMIT_AS (ulimit -v)",
                available: bytes,
                counts_mappings: true,
            }],
        }
    }

    #[test]
    fn moshi_7b_under_16_gb_is_refused_with_figures_and_ways_out() {
        let (_t, dir) = moshi_7b();
        let m = cpu_memory(&dir, 8, &limited(16_000_000 * 1024));
        assert!(!m.fits());
        assert_eq!(m.fits_slots, 0);
        let r = cpu_memory_refusal(&dir, &m).to_string();
        for want in [
            "not enough memory",
            "RLIMIT_AS",
            "--backend cuda",
            "even one slot needs",
            "15.7 GB",
            "fp8",
        ] {
            assert!(r.contains(want), "missing {want:?} in:\n{r}");
        }
        // With room for the weights and two slots, two slots are offered.
        let f = CpuFootprint::new(&dir.lm, &dir.mimi);
        let mapped = std::fs::metadata(&dir.lm_weights).unwrap().len() + ADDRESS_SPACE_OVERHEAD;
        let m = cpu_memory(&dir, 8, &limited(f.bytes_for(2) + mapped + 1));
        assert_eq!(m.fits_slots, 2, "{}", m.summary());
        let r = cpu_memory_refusal(&dir, &m).to_string();
        assert!(r.contains("--max-slots 2"), "{r}");
    }

    #[test]
    fn the_demo_fits_and_is_real_time() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("demo");
        moshid_model::demo::write_demo(&d, 3).unwrap();
        let dir = CheckpointDir::open(&d).unwrap();
        // The speed check's verdict depends on how busy this machine is
        // (a measurement); what the test holds is the memory verdict and the
        // demo's work, which are not.
        let mut config = Config::default();
        config.model.allow_slow = true;
        let (slots, p) = cpu(&config, &dir).unwrap();
        assert_eq!(slots, CPU_DEFAULT_SLOTS);
        // Real-time with room to spare even on a slow machine: its LM weights
        // read at 1 GB/s take under a tenth of a frame.
        let slow = speed::predict(p.work, 1e9, 0.0);
        assert!(slow.step_ms() < frame_ms(&dir) / 10.0, "{}", slow.explain());
    }

    /// A header-only 0.9 G-parameter Moshi-shaped folder (3.5 GB in float32;
    /// real Mimi): small enough to fit any test machine's memory, slow
    /// enough at batch 1 on any CPU (over 100 ms at 35 GB/s).
    pub(crate) fn write_slow_model(dir: &std::path::Path) -> CheckpointDir {
        let mut v = moshid_model::demo::demo_lm_config();
        let o = v.as_object_mut().unwrap();
        o.remove("mimi_config_name");
        for (k, x) in [
            ("dim", 2048),
            ("num_layers", 16),
            ("num_heads", 16),
            ("context", 3000),
            ("text_card", 32000),
            ("card", 2048),
            ("depformer_dim", 1024),
            ("depformer_dim_feedforward", 2816),
            ("depformer_num_heads", 16),
            ("depformer_num_layers", 2),
        ] {
            o.insert(k.into(), x.into());
        }
        let lm = moshid_model::config::LmConfig::from_json(&v).unwrap();
        moshid_model::header_only::write_published_dir(
            dir,
            &lm,
            &moshid_model::config::MimiConfig::mimi_default(),
            Some(&v),
            None,
        )
        .unwrap();
        CheckpointDir::open(dir).unwrap()
    }

    #[test]
    fn a_slow_model_is_refused_before_loading_unless_allowed() {
        let t = tempfile::tempdir().unwrap();
        let dir = write_slow_model(t.path());
        let mut config = Config::default();
        config.model.max_slots = Some(1);
        let host = HostMemory::read();
        // The model is sized to fit any test machine (3.5 GB): a machine
        // without that much free fails here instead of passing untested.
        let memory = cpu_memory(&dir, 1, &host);
        assert!(
            memory.fits(),
            "this machine has not the free memory for the slow model's footprint: {memory:?}"
        );
        let e = cpu(&config, &dir).unwrap_err().to_string();
        assert!(
            e.contains("cannot run in real time") && e.contains("--allow-slow"),
            "{e}"
        );
        config.model.allow_slow = true;
        let (slots, p) = cpu(&config, &dir).unwrap();
        assert_eq!(slots, 1);
        assert!(p.step_ms() > frame_ms(&dir), "{}", p.explain());
    }

    #[test]
    fn a_slow_model_message_names_the_override() {
        let (_t, dir) = moshi_7b();
        let p = speed::predict(speed::step_work(&dir), 20e9, 20.0);
        let r = cpu_speed_refusal(&dir, &p, 80.0).to_string();
        assert!(
            r.contains("--allow-slow") && r.contains("80 ms of audio"),
            "{r}"
        );
        assert!(r.contains("GB/s"), "{r}");
    }

    #[test]
    fn cuda_refusals_name_the_ways_out() {
        let (_t, dir) = moshi_7b();
        let plan = MemoryPlan::new(&dir.lm, &dir.mimi, &PlanOptions::default());
        let gib = 1u64 << 30;
        let e = cuda_slots(
            &dir,
            &plan,
            KvDtype::Bf16,
            None,
            16 * gib,
            16 * gib,
            4 * gib,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("not enough GPU memory") && e.contains("fp8"),
            "{e}"
        );
        let e = cuda_slots(
            &dir,
            &plan,
            KvDtype::Bf16,
            Some(200),
            139 * gib,
            141 * gib,
            4 * gib,
        )
        .unwrap_err()
        .to_string();
        let fit = plan.max_slots(139 * gib, 4 * gib).unwrap();
        assert!(e.contains(&format!("--max-slots {fit}")), "{e}");
        let (n, how) = cuda_slots(
            &dir,
            &plan,
            KvDtype::Bf16,
            None,
            139 * gib,
            141 * gib,
            4 * gib,
        )
        .unwrap();
        assert!((70..=85).contains(&n) && how.contains("free"), "{n} {how}");
    }
}
