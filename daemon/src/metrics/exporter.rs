//! The Prometheus recorder of a metrics [`Registry`](super::Registry): the
//! `metrics` facade's recorder (built with `PrometheusBuilder::build_recorder`,
//! no HTTP listener), the description of every series moshid exports, and
//! one scrape at a time. What a scrape records and how `GET /metrics` is
//! rendered is the API's business (`crate::api::metrics`).
//!
//! Invariants: nothing here runs on the hot path; scrapes are serialised
//! (one mutex per recorder).

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Whether some registry's recorder was installed as the global one.
static GLOBAL_INSTALLED: AtomicBool = AtomicBool::new(false);

/// A registry's Prometheus recorder and its render handle.
pub struct Exporter {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    scrape: Mutex<()>,
}

impl Exporter {
    /// A recorder (no listener) with every series described.
    pub(super) fn new() -> Self {
        let recorder = Arc::new(PrometheusBuilder::new().build_recorder());
        let handle = recorder.handle();
        ::metrics::with_local_recorder(&*recorder, describe);
        Exporter {
            recorder,
            handle,
            scrape: Mutex::new(()),
        }
    }

    /// Installs this recorder as the process's global `metrics` recorder,
    /// once per process (later calls, or a recorder installed by someone
    /// else, leave it as is). Scrapes do not depend on it: they record into
    /// this recorder directly. Returns whether this call installed it.
    pub fn install_global(&self) -> bool {
        if GLOBAL_INSTALLED.swap(true, Ordering::AcqRel) {
            return false;
        }
        ::metrics::set_global_recorder(self.recorder.clone()).is_ok()
    }

    /// Starts a scrape: until the returned guard is dropped no other scrape
    /// records or renders, so absolute values never go backwards between
    /// two concurrent scrapes.
    pub fn scrape(&self) -> Scrape<'_> {
        Scrape {
            exporter: self,
            _one_at_a_time: self.scrape.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }
}

/// One scrape in progress (see [`Exporter::scrape`]).
pub struct Scrape<'a> {
    exporter: &'a Exporter,
    _one_at_a_time: MutexGuard<'a, ()>,
}

impl Scrape<'_> {
    /// Runs `record` with this registry's recorder as the `metrics`
    /// facade's recorder (counters set as absolute values, gauges set).
    pub fn record(&self, record: impl FnOnce()) {
        ::metrics::with_local_recorder(&*self.exporter.recorder, record)
    }

    /// The Prometheus text of everything recorded so far.
    pub fn render(&self) -> String {
        self.exporter.handle.render()
    }
}

fn describe() {
    use ::metrics::{describe_counter, describe_gauge};
    super::connections::describe();
    super::sip::describe();
    super::heap::describe();
    describe_gauge!(
        "moshid_session_table_entries",
        "Entries of each per-session table (all 0 when no session is open: leak checks)"
    );
    describe_gauge!(
        "moshid_metrics_enabled",
        "1 while stage metrics are recorded (POST /admin/metrics)"
    );
    describe_gauge!("moshid_active_sessions", "Sessions holding a slot");
    describe_gauge!("moshid_free_slots", "Slots not held by a session");
    describe_gauge!("moshid_accepting", "1 while new sessions are admitted");
    describe_gauge!(
        "moshid_group_sessions",
        "Sessions ticking with each phase group"
    );
    describe_gauge!(
        "moshid_group_free_slots",
        "Sessions that could still be admitted now (free slots within the period's step-time budget; groups merge to make room)"
    );
    describe_gauge!("moshid_groups_in_use", "Phase groups the engine steps now");
    describe_gauge!(
        "moshid_group_phase_ms",
        "Offset of each phase group's tick in the 80 ms frame period"
    );
    describe_gauge!(
        "moshid_group_wait_ms",
        "Moving average of a frame's wait from its completion to its group's step"
    );
    describe_counter!(
        "moshid_group_moves_total",
        "Streams moved from one phase group to another (as their phase drifted or groups merged)"
    );
    describe_counter!(
        "moshid_sessions_admitted_total",
        "Sessions admitted since start"
    );
    describe_counter!(
        "moshid_sessions_refused_total",
        "Sessions refused since start"
    );
    describe_counter!("moshid_engine_steps_total", "Model steps taken");
    describe_counter!(
        "moshid_engine_frames_stepped_total",
        "Stream-frames stepped"
    );
    describe_counter!(
        "moshid_engine_late_ticks_total",
        "Ticks that started over one group period late"
    );
    describe_counter!(
        "moshid_engine_dropped_frames_total",
        "Frames dropped because a slot's engine queue was full"
    );
    describe_counter!(
        "moshid_engine_lost_outputs_total",
        "Outputs lost because an I/O core's lane was full"
    );
    describe_counter!("moshid_engine_faults_total", "Per-slot model faults");
    describe_gauge!("moshid_engine_max_batch", "Largest batch stepped");
    describe_counter!(
        "moshid_stage_frames_total",
        "Frames pushed to the engine (I/O cores) or stepped (engine) while metrics were on"
    );
    describe_counter!(
        "moshid_stage_late_ticks_total",
        "Late engine ticks while metrics were on"
    );
    describe_counter!(
        "moshid_stage_dropped_frames_total",
        "Frames dropped (lane full on a core, slot queue full at the engine) while metrics were on"
    );
    describe_counter!(
        "moshid_stage_refused_sessions_total",
        "Sessions refused on a core while metrics were on"
    );
}
