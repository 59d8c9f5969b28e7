//! `runtime.*`: the I/O cores, the CPUs they and the engine run on, and the
//! heap's trimming.

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};

/// `runtime.*`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Number of I/O cores (glommio executors).
    pub io_cores: usize,
    /// CPUs for the I/O cores, in order; `null` picks from the allowed set.
    pub io_cpus: Option<Vec<usize>>,
    /// CPU for the engine thread; `null` picks one not used by an I/O core
    /// when there is one.
    pub engine_cpu: Option<usize>,
    /// How often the heap's free pages are given back to the system, in
    /// milliseconds (glibc's `malloc_trim`, on the main thread; 0: never).
    /// Without it the resident size follows the largest footprint the
    /// daemon ever had (see `heap.rs`).
    pub heap_trim_ms: u64,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            io_cores: 1,
            io_cpus: None,
            engine_cpu: None,
            heap_trim_ms: 10_000,
        }
    }
}

impl RuntimeConfig {
    /// Checks the section's bounds; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let r = self;
        if r.io_cores == 0 || r.io_cores > 256 {
            return Err(invalid("runtime.io_cores", "must be between 1 and 256"));
        }
        if let Some(cpus) = &r.io_cpus {
            if cpus.len() != r.io_cores {
                return Err(invalid(
                    "runtime.io_cpus",
                    format!("lists {} CPUs for {} I/O cores", cpus.len(), r.io_cores),
                ));
            }
            let mut seen = cpus.clone();
            seen.sort_unstable();
            seen.dedup();
            if seen.len() != cpus.len() {
                return Err(invalid("runtime.io_cpus", "lists a CPU twice"));
            }
        }
        Ok(())
    }
}
