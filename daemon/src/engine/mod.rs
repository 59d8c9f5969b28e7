//! The engine: one pinned thread that owns the model and steps every stream
//! of a phase group as one batch, fed and drained through the lanes.
//!
//! * [`records`]: what crosses the lanes.
//! * [`admission`]: slots, refusals, published capacity.
//! * [`phase`]: a stream's phase, estimated from its frames' completion times.
//! * [`grouping`]: which tick steps each stream, and how many groups load allows.
//! * [`step_times`]: the measured step-time model admission relies on.
//! * [`thread`]: the tick loop.
//!
//! Invariants: the engine thread is the only one that touches the model; it
//! never blocks on an I/O core (a full lane is counted, never waited on); the
//! tick allocates nothing.

pub mod admission;
pub mod grouping;
#[cfg(test)]
mod grouping_sim;
pub mod phase;
pub mod prompts;
pub mod records;
pub mod step_times;
pub mod thread;

use admission::AdmissionTable;
use grouping::MaxGroups;
use moshid_ringbuf::{lane, Doorbell, LaneReceiver, LaneSender};
use records::{FromEngine, ToEngine};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use step_times::StepTimes;

/// Counters the engine thread writes and anyone reads (single writer, relaxed).
#[derive(Default)]
pub struct EngineStats {
    /// Model steps taken.
    pub steps: AtomicU64,
    /// Stream-frames stepped.
    pub frames_stepped: AtomicU64,
    /// Steps that batched more than one stream.
    pub multi_stream_steps: AtomicU64,
    /// Largest batch stepped.
    pub max_batch: AtomicU64,
    /// Ticks that started over one group period late.
    pub late_ticks: AtomicU64,
    /// Frames dropped because a slot's engine queue was full.
    pub dropped_frames: AtomicU64,
    /// Output records lost because an I/O core's lane was full.
    pub lost_outputs: AtomicU64,
    /// Per-slot model faults.
    pub faults: AtomicU64,
}

/// A snapshot of [`EngineStats`].
#[derive(Debug, Clone, Serialize)]
pub struct EngineStatsSnapshot {
    /// Model steps taken.
    pub steps: u64,
    /// Stream-frames stepped.
    pub frames_stepped: u64,
    /// Steps that batched more than one stream.
    pub multi_stream_steps: u64,
    /// Largest batch stepped.
    pub max_batch: u64,
    /// Late ticks.
    pub late_ticks: u64,
    /// Frames dropped at the engine.
    pub dropped_frames: u64,
    /// Outputs lost to a full lane.
    pub lost_outputs: u64,
    /// Per-slot faults.
    pub faults: u64,
}

impl EngineStats {
    /// Reads every counter.
    pub fn snapshot(&self) -> EngineStatsSnapshot {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EngineStatsSnapshot {
            steps: r(&self.steps),
            frames_stepped: r(&self.frames_stepped),
            multi_stream_steps: r(&self.multi_stream_steps),
            max_batch: r(&self.max_batch),
            late_ticks: r(&self.late_ticks),
            dropped_frames: r(&self.dropped_frames),
            lost_outputs: r(&self.lost_outputs),
            faults: r(&self.faults),
        }
    }
}

/// What the engine shares with the I/O cores and the control API.
pub struct EngineShared {
    /// Slot table (locked once per session start and end).
    pub admission: Mutex<AdmissionTable>,
    /// Step-time model.
    pub step_times: StepTimes,
    /// Budget of the steps of one frame period (all groups together), in
    /// milliseconds: what admission prices a new stream against.
    pub budget_ms: f64,
    /// The most phase groups.
    pub phase_groups: MaxGroups,
    /// The groups in use, as the engine last planned them.
    pub groups: GroupBoard,
    /// Slots.
    pub max_slots: usize,
    /// Time kept free per frame period, in milliseconds.
    pub budget_margin_ms: f64,
    /// Set once warm-up is done.
    pub ready: AtomicBool,
    /// Asks the engine thread to finish.
    pub stop: AtomicBool,
    /// Counters.
    pub stats: EngineStats,
    /// Slots the engine currently has open (its own view; leak checks).
    pub open_slots: AtomicU64,
    /// Sessions routed on each I/O core (each core writes its own entry at
    /// session start and end; leak checks and `/capacity`).
    pub routed_per_core: Vec<AtomicU64>,
    /// Close records each I/O core still has to deliver.
    pub pending_closes_per_core: Vec<AtomicU64>,
    /// The stage-metrics switch and every thread's stage counters (off
    /// until the runtime applies `metrics.enabled`).
    pub metrics: crate::metrics::Registry,
}

impl EngineShared {
    /// Shared state for a model of `max_slots` over up to `phase_groups` groups.
    pub fn new(
        max_slots: usize,
        phase_groups: impl Into<MaxGroups>,
        budget_margin_ms: f64,
        io_cores: usize,
    ) -> Self {
        let phase_groups = phase_groups.into();
        EngineShared {
            admission: Mutex::new(AdmissionTable::new(max_slots)),
            step_times: StepTimes::new(max_slots),
            budget_ms: crate::FRAME_MS - budget_margin_ms,
            phase_groups,
            groups: GroupBoard::new(phase_groups),
            budget_margin_ms,
            max_slots,
            ready: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            stats: EngineStats::default(),
            open_slots: AtomicU64::new(0),
            routed_per_core: (0..io_cores).map(|_| AtomicU64::new(0)).collect(),
            pending_closes_per_core: (0..io_cores).map(|_| AtomicU64::new(0)).collect(),
            metrics: crate::metrics::Registry::default(),
        }
    }

    /// Every per-session table's size, for leak checks (all zero when idle).
    pub fn session_state(&self) -> serde_json::Value {
        let a = self.admission();
        let r = |v: &Vec<AtomicU64>| {
            v.iter()
                .map(|x| x.load(Ordering::Relaxed))
                .collect::<Vec<_>>()
        };
        serde_json::json!({
            "held_slots": a.active(),
            "pending_params": a.pending_params(),
            "engine_open_slots": self.open_slots.load(Ordering::Relaxed),
            "routed_per_core": r(&self.routed_per_core),
            "pending_closes_per_core": r(&self.pending_closes_per_core),
        })
    }

    /// Every per-session table with its entries, summed over cores (the
    /// same tables as [`session_state`](Self::session_state); `/metrics`).
    pub fn session_tables(&self) -> [(&'static str, u64); 5] {
        let a = self.admission();
        let sum = |v: &Vec<AtomicU64>| v.iter().map(|x| x.load(Ordering::Relaxed)).sum();
        [
            ("held_slots", a.active() as u64),
            ("pending_params", a.pending_params() as u64),
            ("engine_open_slots", self.open_slots.load(Ordering::Relaxed)),
            ("routed", sum(&self.routed_per_core)),
            ("pending_closes", sum(&self.pending_closes_per_core)),
        ]
    }

    /// The admission table (a poisoned lock is recovered: the table's
    /// invariants hold between calls, none of which can panic midway).
    pub fn admission(&self) -> std::sync::MutexGuard<'_, AdmissionTable> {
        self.admission.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The capacity snapshot.
    pub fn capacity(&self) -> admission::Capacity {
        self.admission()
            .capacity(&self.step_times, self.budget_ms, &self.groups)
    }
}

/// The engine's plan as published (single writer: the engine thread, once
/// per tick; relaxed atomics, so a reader may see a plan half updated, never
/// a torn value).
pub struct GroupBoard {
    /// The most groups.
    pub max: MaxGroups,
    /// Tick positions per period.
    pub positions: usize,
    /// Groups in use (`positions / groups` positions apart).
    pub in_use: AtomicU64,
    /// Sessions each position's group steps (by plan).
    pub sessions: Vec<AtomicU64>,
    /// Moving average of the wait of frames with a completion time (from
    /// completion to the step), per position, in microseconds.
    pub wait_us: Vec<AtomicU64>,
    /// Streams moved from one group to another.
    pub moves: AtomicU64,
}

impl GroupBoard {
    /// A board for up to `max` groups.
    pub fn new(max: MaxGroups) -> Self {
        let positions = max.positions();
        GroupBoard {
            max,
            positions,
            in_use: AtomicU64::new(max.max() as u64),
            sessions: (0..positions).map(|_| AtomicU64::new(0)).collect(),
            wait_us: (0..positions).map(|_| AtomicU64::new(0)).collect(),
            moves: AtomicU64::new(0),
        }
    }

    /// Folds one frame's wait at `position` into its moving average (1/8).
    pub fn observe_wait(&self, position: usize, wait_us: u64) {
        if let Some(w) = self.wait_us.get(position) {
            let old = w.load(Ordering::Relaxed);
            let new = if old == 0 {
                wait_us.max(1)
            } else {
                (old * 7 + wait_us) / 8
            };
            w.store(new.max(1), Ordering::Relaxed);
        }
    }
}

/// The engine's end of one I/O core's lanes.
pub struct CoreLink {
    /// Records from the core.
    pub from_core: LaneReceiver<ToEngine>,
    /// Records to the core.
    pub to_core: LaneSender<FromEngine>,
    /// Wakes the core's output task.
    pub doorbell: Arc<Doorbell>,
}

/// An I/O core's end of its lanes.
pub struct CorePort {
    /// Records to the engine.
    pub to_engine: LaneSender<ToEngine>,
    /// Records from the engine.
    pub from_engine: LaneReceiver<FromEngine>,
    /// Rung by the engine when `from_engine` has records.
    pub doorbell: Arc<Doorbell>,
}

/// Lanes for `io_cores` cores, each direction holding `capacity_frames` records.
pub fn core_links(io_cores: usize, capacity_frames: usize) -> (Vec<CoreLink>, Vec<CorePort>) {
    let mut links = Vec::with_capacity(io_cores);
    let mut ports = Vec::with_capacity(io_cores);
    for _ in 0..io_cores {
        let (to_engine, from_core) =
            lane::<ToEngine>(capacity_frames).expect("capacity validated positive");
        let (to_core, from_engine) =
            lane::<FromEngine>(capacity_frames).expect("capacity validated positive");
        let doorbell = Arc::new(Doorbell::new());
        links.push(CoreLink {
            from_core,
            to_core,
            doorbell: doorbell.clone(),
        });
        ports.push(CorePort {
            to_engine,
            from_engine,
            doorbell,
        });
    }
    (links, ports)
}
