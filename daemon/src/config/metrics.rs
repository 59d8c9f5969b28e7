//! `metrics.*`: the stage metrics' switch at start and whether it may be
//! turned at run time. Two independent booleans: every combination is
//! usable (wrong types and unknown keys are refused by the parser, which
//! names the key), so the section has nothing more to check.

use serde::{Deserialize, Serialize};

/// `metrics.*`: per-core stage metrics (`GET /metrics` always serves the
/// cheap gauges; stage timings are recorded only while the switch is on).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Whether stage timings are recorded from the start (`--metrics`).
    pub enabled: bool,
    /// Whether `POST /admin/metrics` may turn the recording on and off at
    /// run time (`false`: it answers 403 and `enabled` holds until restart).
    pub runtime_switch: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: false,
            runtime_switch: true,
        }
    }
}
