//! Where the threads run: the CPUs this process may use, and the plan that
//! puts each I/O core and the engine thread on one of them.
//!
//! Invariants: every CPU in a plan is in the allowed set; configured CPUs
//! are checked, never silently replaced; the engine gets a CPU of its own
//! whenever there is one to spare.

use crate::config::Config;
use anyhow::{bail, Result};

/// Where the CPUs go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuPlan {
    /// CPU of each I/O core.
    pub io_cpus: Vec<usize>,
    /// CPU of the engine thread.
    pub engine_cpu: usize,
}

/// Chooses CPUs from the allowed set (or checks the configured ones).
pub fn place(config: &Config, allowed: &[usize]) -> Result<CpuPlan> {
    if allowed.is_empty() {
        bail!("no CPU is available to this process");
    }
    let r = &config.runtime;
    let io_cpus = match &r.io_cpus {
        Some(cpus) => {
            for c in cpus {
                if !allowed.contains(c) {
                    bail!("config key `runtime.io_cpus`: CPU {c} is not available to this process (allowed: {allowed:?})");
                }
            }
            cpus.clone()
        }
        None => {
            if r.io_cores > allowed.len() {
                bail!(
                    "config key `runtime.io_cores`: {} I/O cores but only {} CPUs are available ({allowed:?})",
                    r.io_cores,
                    allowed.len()
                );
            }
            allowed[..r.io_cores].to_vec()
        }
    };
    let engine_cpu = match r.engine_cpu {
        Some(c) if !allowed.contains(&c) => {
            bail!("config key `runtime.engine_cpu`: CPU {c} is not available to this process (allowed: {allowed:?})")
        }
        Some(c) => c,
        // The first allowed CPU no I/O core uses; on a machine with fewer
        // CPUs than threads, the last one (shared).
        None => allowed
            .iter()
            .copied()
            .find(|c| !io_cpus.contains(c))
            .unwrap_or(*allowed.last().expect("checked non-empty")),
    };
    Ok(CpuPlan {
        io_cpus,
        engine_cpu,
    })
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    core_affinity::get_core_ids()
        .map(|ids| ids.into_iter().map(|c| c.id).collect())
        .unwrap_or_else(|| {
            (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
        })
}
