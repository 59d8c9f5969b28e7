//! `/capacity`: the daemon's sessions, slots and per-core session state,
//! and waiting until nothing is held.

use serde_json::Value;

use crate::wait::poll;
use crate::{Daemon, IDLE_TIMEOUT};

/// Whether a `/capacity` snapshot shows nothing held by any session.
pub fn is_idle(cap: &Value) -> bool {
    let st = &cap["session_state"];
    let zero = |v: &Value| v.as_u64() == Some(0);
    let all_zero = |v: &Value| v.as_array().is_some_and(|a| a.iter().all(zero));
    zero(&st["held_slots"])
        && zero(&st["pending_params"])
        && zero(&st["engine_open_slots"])
        && all_zero(&st["routed_per_core"])
        && all_zero(&st["pending_closes_per_core"])
        && zero(&cap["capacity"]["active_sessions"])
        && cap["capacity"]["free_slots"] == cap["capacity"]["max_slots"]
}

impl Daemon {
    /// `/capacity`.
    pub fn capacity(&self) -> Value {
        self.get_json("/capacity")
    }

    /// `/capacity`'s `capacity.active_sessions`.
    pub fn active_sessions(&self) -> u64 {
        self.capacity()["capacity"]["active_sessions"]
            .as_u64()
            .expect("capacity.active_sessions")
    }

    /// Polls `/capacity` until no session holds anything (every
    /// `session_state` table empty, no active session); returns that
    /// snapshot. Fails after [`IDLE_TIMEOUT`] with the last one.
    pub fn wait_idle(&self) -> Value {
        self.wait_capacity("the daemon to be idle", is_idle)
    }

    /// Polls `/capacity` until `cond` holds (bounded by [`IDLE_TIMEOUT`]);
    /// returns the snapshot that satisfied it.
    pub fn wait_capacity(&self, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        let found = poll(IDLE_TIMEOUT, || {
            last = self.capacity();
            cond(&last).then(|| last.clone())
        });
        found.unwrap_or_else(|| {
            panic!(
                "timed out after {IDLE_TIMEOUT:?} waiting for {what}: {last:#}\nstderr:\n{}",
                self.stderr_tail()
            )
        })
    }
}
