//! Per-core stage metrics that cost nothing when off, switched at run time.
//!
//! * [`histogram`]: fixed log-spaced buckets made of single-writer counters.
//! * [`stages`]: one thread's stage timings and counts ([`StageCounters`])
//!   and its only writer ([`StageRecorder`]).
//! * [`exporter`]: the `metrics` facade's Prometheus recorder and the
//!   description of every series; `GET /metrics` itself (folding every
//!   thread's counters into it and rendering the text) is
//!   `crate::api::metrics`.
//! * [`heap`]: the heap (in use, free, arenas; trims), always on.
//! * [`connections`] and [`sip`]: every core's listeners, pending budget
//!   and SIP endpoint, always on.
//!
//! The [`Registry`] lives in [`EngineShared`](crate::engine::EngineShared):
//! it holds the switch and the `Arc` of every thread's counters, published
//! once when the thread starts (the engine in `Engine::new`, each I/O core in
//! `CoreContext::new`).
//!
//! Invariants:
//! * Off by default. The switch is read once per engine tick and once per
//!   session message batch (a relaxed load); when it is off no clock is read
//!   and nothing is recorded — the hot path costs one predictable branch.
//! * On, recording is relaxed load + store into memory owned by the
//!   recording thread: no lock, no allocation, no map lookup, no contended
//!   read-modify-write. The registry's mutex is taken at thread start and at
//!   scrape time only.
//! * No per-session state: counters are per thread, sized at start.
//!   Session accounting (frames, tokens, end reason) lives in
//!   [`SessionRecord`](crate::session::record::SessionRecord) whatever the
//!   switch says.
//! * Turning the switch on or off loses nothing and needs no restart; a
//!   frame pushed while off carries no timestamp, so it adds no `frame_wait`
//!   sample even if the switch is on when it is stepped.

pub mod connections;
pub mod exporter;
pub mod heap;
pub mod histogram;
pub mod sip;
pub mod stages;

pub use stages::{Owner, Stage, StageCounters, StageRecorder, ThreadSnapshot};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// The switch and every thread's counters.
pub struct Registry {
    enabled: AtomicBool,
    threads: Mutex<Vec<Arc<StageCounters>>>,
    /// Always-on connection counters of every core (see [`connections`]).
    connections: Mutex<ConnectionCounters>,
    exporter: OnceLock<exporter::Exporter>,
}

/// Every core's listener and pending-budget counters.
#[derive(Default)]
pub struct ConnectionCounters {
    /// One per listener per core.
    pub listeners: Vec<Arc<connections::ListenerCounters>>,
    /// One per core.
    pub pending: Vec<Arc<connections::PendingCounters>>,
    /// One per core serving SIP.
    pub sip: Vec<Arc<sip::SipPublished>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new(false)
    }
}

impl Registry {
    /// An empty registry with the switch at `enabled`.
    pub fn new(enabled: bool) -> Self {
        Registry {
            enabled: AtomicBool::new(enabled),
            threads: Mutex::new(Vec::new()),
            connections: Mutex::new(ConnectionCounters::default()),
            exporter: OnceLock::new(),
        }
    }

    /// Whether stage metrics are recorded (read once per tick / message batch).
    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Turns recording on or off; returns the previous state. Threads see
    /// the change at their next tick or message batch.
    pub fn set_enabled(&self, on: bool) -> bool {
        self.enabled.swap(on, Ordering::Relaxed)
    }

    /// A timestamp when recording is on, `None` (and no clock read) when off.
    #[inline]
    pub fn stamp(&self) -> Option<Instant> {
        if self.enabled() {
            Some(Instant::now())
        } else {
            None
        }
    }

    /// Creates and publishes the counters of a thread; the returned recorder
    /// is their only writer and belongs to that thread. Call once per thread
    /// at start (allocates).
    pub fn register(&self, owner: Owner, phase_groups: usize, max_slots: usize) -> StageRecorder {
        let counters = Arc::new(StageCounters::new(owner, phase_groups, max_slots));
        self.lock().push(counters.clone());
        StageRecorder::new(counters)
    }

    /// Every published thread's counters, read now (scrape time).
    pub fn snapshots(&self) -> Vec<ThreadSnapshot> {
        self.lock().iter().map(|c| c.snapshot()).collect()
    }

    /// Publishes a listener's connection counters (once per listener per
    /// core, at start; allocates).
    pub fn register_listener(
        &self,
        counters: connections::ListenerCounters,
    ) -> Arc<connections::ListenerCounters> {
        let c = Arc::new(counters);
        self.connections().listeners.push(c.clone());
        c
    }

    /// Publishes a core's pending-budget counters (once per core, at start).
    pub fn register_pending(
        &self,
        counters: connections::PendingCounters,
    ) -> Arc<connections::PendingCounters> {
        let c = Arc::new(counters);
        self.connections().pending.push(c.clone());
        c
    }

    /// Publishes a core's SIP counters (once per core serving SIP, at start).
    pub fn register_sip(&self, core: usize) -> Arc<sip::SipPublished> {
        let c = Arc::new(sip::SipPublished::new(core));
        self.connections().sip.push(c.clone());
        c
    }

    /// The connection counters (scrape time).
    pub fn connections(&self) -> std::sync::MutexGuard<'_, ConnectionCounters> {
        self.connections.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This registry's Prometheus exporter (made on first use).
    pub fn exporter(&self) -> &exporter::Exporter {
        self.exporter.get_or_init(exporter::Exporter::new)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<StageCounters>>> {
        // Nothing panics while the lock is held; recover from poisoning anyway.
        self.threads.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switch_gates_stamps_and_registration_publishes() {
        let r = Registry::default();
        assert!(!r.enabled());
        assert!(r.stamp().is_none());
        assert!(!r.set_enabled(true));
        assert!(r.stamp().is_some());
        let core = r.register(Owner::Core(0), 1, 8);
        let engine = r.register(Owner::Engine, 1, 8);
        core.record(Stage::Decode, std::time::Duration::from_micros(50));
        engine.frames(2);
        let snaps = r.snapshots();
        assert_eq!(snaps.len(), 2);
        assert_eq!(snaps[0].owner, Owner::Core(0));
        assert_eq!(snaps[0].stage(Stage::Decode).count(), 1);
        assert_eq!(snaps[1].frames, 2);
        assert!(r.set_enabled(false));
    }
}
