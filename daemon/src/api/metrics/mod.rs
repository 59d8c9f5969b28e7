//! `GET /metrics`: every thread's stage counters and the always-on gauges,
//! as Prometheus text.
//!
//! A scrape reads every published [`StageCounters`](crate::metrics::StageCounters)
//! (relaxed loads), folds them and hands the scalar values to the `metrics`
//! facade — recorded into this registry's `PrometheusRecorder` (built with
//! `PrometheusBuilder::build_recorder`, no HTTP listener) as absolute
//! counter values and gauges — then renders it with its `PrometheusHandle`.
//! The stage histograms are appended as Prometheus histogram text written
//! here from the exact bucket counts: the facade only takes individual
//! samples (`record_many` would push one sample per counted frame into the
//! exporter's buffer), while the threads already hold the buckets.
//!
//! Series:
//! * `moshid_stage_duration_seconds{stage, core}` — histogram per thread
//!   (`core` = "0", "1", … or "engine"; `model_step` also has `group` and
//!   `batch`), plus `core="all"`: the sum over every thread (and, for
//!   `model_step`, over groups and batch sizes). Sum over `core!="all"` or
//!   select `core="all"`, not both.
//! * `moshid_stage_{frames,late_ticks,dropped_frames,refused_sessions}_total{core}`
//!   — counted only while the switch is on; same `core` labels.
//! * Always, whatever the switch: `moshid_metrics_enabled`,
//!   `moshid_active_sessions`, `moshid_free_slots`, `moshid_accepting`,
//!   `moshid_group_sessions{group}`, `moshid_group_free_slots{group}`,
//!   `moshid_sessions_{admitted,refused}_total`, `moshid_engine_*` (read
//!   from `EngineShared` and the admission table at scrape time),
//!   `moshid_session_table_entries{table}` (every per-session table's size)
//!   the connection series `moshid_connections_*` (see
//!   [`crate::metrics::connections`]) and `moshid_heap_bytes{kind}` (see
//!   [`crate::metrics::heap`]).
//!
//! Invariants: nothing here runs on the hot path; scrapes are serialised
//! (one mutex) so that absolute values never go backwards between two
//! concurrent scrapes; counters are monotone because the threads' counters
//! are.
//!
//! The test `fold_adds_every_thread` is one scenario of about 150 lines on
//! purpose: a few recordings on three threads, then every series they reach
//! checked in the fold and in two scrapes; split, each part would repeat the
//! recordings and lose the totals they add up to.

pub mod events;

use crate::engine::EngineShared;
use crate::metrics::histogram::HistogramSnapshot;
use crate::metrics::stages::{Owner, Stage, ThreadSnapshot, MODEL_STEP_LABEL};
use std::fmt::Write as _;

/// Name of the stage histogram family.
pub const STAGE_HISTOGRAM: &str = "moshid_stage_duration_seconds";
/// `Content-Type` of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every thread's snapshot folded into one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Folded {
    /// Per [`Stage`], in [`Stage::ALL`] order, summed over threads.
    pub stages: [HistogramSnapshot; 5],
    /// Model steps over threads, groups and batch sizes.
    pub model_step: HistogramSnapshot,
    /// Frames counted by the cores (pushed).
    pub frames_pushed: u64,
    /// Frames counted by the engine (stepped).
    pub frames_stepped: u64,
    /// Late ticks.
    pub late_ticks: u64,
    /// Dropped frames (cores and engine).
    pub dropped_frames: u64,
    /// Refused sessions.
    pub refused_sessions: u64,
}

/// Adds up every thread's counters.
pub fn fold(snaps: &[ThreadSnapshot]) -> Folded {
    let mut f = Folded::default();
    for s in snaps {
        for (acc, h) in f.stages.iter_mut().zip(s.stages.iter()) {
            acc.merge(h);
        }
        f.model_step.merge(&s.model_step_total());
        match s.owner {
            Owner::Core(_) => f.frames_pushed += s.frames,
            Owner::Engine => f.frames_stepped += s.frames,
        }
        f.late_ticks += s.late_ticks;
        f.dropped_frames += s.dropped_frames;
        f.refused_sessions += s.refused_sessions;
    }
    f
}

/// Whether a thread of this kind records `stage` (its series is always
/// exported; other stages only once they have samples).
fn owns(owner: Owner, stage: Stage) -> bool {
    match owner {
        Owner::Core(_) => matches!(stage, Stage::Decode | Stage::Encode | Stage::Send),
        Owner::Engine => matches!(stage, Stage::FrameWait | Stage::BatchFill),
    }
}

/// Reads everything and renders the Prometheus text of `GET /metrics`.
pub fn render(shared: &EngineShared) -> String {
    let registry = &shared.metrics;
    let scrape = registry.exporter().scrape();
    let snaps = registry.snapshots();
    let folded = fold(&snaps);
    let cap = shared.capacity();
    let stats = shared.stats.snapshot();
    scrape.record(|| {
        use ::metrics::{counter, gauge};
        gauge!("moshid_metrics_enabled").set(if registry.enabled() { 1.0 } else { 0.0 });
        gauge!("moshid_active_sessions").set(cap.active_sessions as f64);
        gauge!("moshid_free_slots").set(cap.free_slots as f64);
        gauge!("moshid_accepting").set(if cap.accepting { 1.0 } else { 0.0 });
        gauge!("moshid_groups_in_use").set(cap.groups_in_use as f64);
        counter!("moshid_group_moves_total").absolute(cap.group_moves);
        for g in &cap.groups {
            let group = g.group.to_string();
            gauge!("moshid_group_sessions", "group" => group.clone()).set(g.sessions as f64);
            gauge!("moshid_group_phase_ms", "group" => group.clone()).set(g.phase_ms);
            gauge!("moshid_group_wait_ms", "group" => group.clone()).set(g.wait_ms);
            // A new stream can join any group (groups merge to make room).
            gauge!("moshid_group_free_slots", "group" => group).set(cap.admissible_sessions as f64);
        }
        counter!("moshid_sessions_admitted_total").absolute(cap.admitted_total);
        counter!("moshid_sessions_refused_total").absolute(cap.refused_total);
        counter!("moshid_engine_steps_total").absolute(stats.steps);
        counter!("moshid_engine_frames_stepped_total").absolute(stats.frames_stepped);
        counter!("moshid_engine_late_ticks_total").absolute(stats.late_ticks);
        counter!("moshid_engine_dropped_frames_total").absolute(stats.dropped_frames);
        counter!("moshid_engine_lost_outputs_total").absolute(stats.lost_outputs);
        counter!("moshid_engine_faults_total").absolute(stats.faults);
        gauge!("moshid_engine_max_batch").set(stats.max_batch as f64);
        for (table, entries) in shared.session_tables() {
            gauge!("moshid_session_table_entries", "table" => table).set(entries as f64);
        }
        crate::metrics::heap::record();
        {
            let conns = registry.connections();
            crate::metrics::connections::record(&conns.listeners, &conns.pending);
            crate::metrics::sip::record(&conns.sip);
        }

        let per_thread = snaps.iter().map(|s| {
            (
                s.owner.label(),
                s.frames,
                s.late_ticks,
                s.dropped_frames,
                s.refused_sessions,
            )
        });
        let all = (
            "all".to_string(),
            folded.frames_pushed + folded.frames_stepped,
            folded.late_ticks,
            folded.dropped_frames,
            folded.refused_sessions,
        );
        for (core, frames, late, dropped, refused) in per_thread.chain(std::iter::once(all)) {
            counter!("moshid_stage_frames_total", "core" => core.clone()).absolute(frames);
            counter!("moshid_stage_late_ticks_total", "core" => core.clone()).absolute(late);
            counter!("moshid_stage_dropped_frames_total", "core" => core.clone()).absolute(dropped);
            counter!("moshid_stage_refused_sessions_total", "core" => core).absolute(refused);
        }
    });
    let mut out = scrape.render();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    write_histograms(&mut out, &snaps, &folded);
    out
}

/// Appends the stage histograms (per thread, then `core="all"`).
pub fn write_histograms(out: &mut String, snaps: &[ThreadSnapshot], folded: &Folded) {
    let _ = writeln!(
        out,
        "# HELP {STAGE_HISTOGRAM} Time spent in each stage of a frame's path, recorded while metrics are on"
    );
    let _ = writeln!(out, "# TYPE {STAGE_HISTOGRAM} histogram");
    for s in snaps {
        let core = s.owner.label();
        for stage in Stage::ALL {
            let h = s.stage(stage);
            if owns(s.owner, stage) || h.count() > 0 {
                write_histogram(
                    out,
                    &format!("stage=\"{}\",core=\"{core}\"", stage.label()),
                    h,
                );
            }
        }
        for m in &s.model_step {
            let labels = format!(
                "stage=\"{MODEL_STEP_LABEL}\",core=\"{core}\",group=\"{}\",batch=\"{}\"",
                m.group, m.batch
            );
            write_histogram(out, &labels, &m.histogram);
        }
    }
    for stage in Stage::ALL {
        write_histogram(
            out,
            &format!("stage=\"{}\",core=\"all\"", stage.label()),
            &folded.stages[stage as usize],
        );
    }
    write_histogram(
        out,
        &format!("stage=\"{MODEL_STEP_LABEL}\",core=\"all\""),
        &folded.model_step,
    );
}

fn write_histogram(out: &mut String, labels: &str, h: &HistogramSnapshot) {
    for (le, count) in h.cumulative() {
        let _ = writeln!(
            out,
            "{STAGE_HISTOGRAM}_bucket{{{labels},le=\"{le}\"}} {count}"
        );
    }
    let count = h.count();
    let _ = writeln!(
        out,
        "{STAGE_HISTOGRAM}_bucket{{{labels},le=\"+Inf\"}} {count}"
    );
    let _ = writeln!(
        out,
        "{STAGE_HISTOGRAM}_sum{{{labels}}} {}",
        h.sum_ns as f64 / 1e9
    );
    let _ = writeln!(out, "{STAGE_HISTOGRAM}_count{{{labels}}} {count}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::histogram::FINITE_BUCKETS;
    use std::time::Duration;

    /// The value of the sample `name{labels}` (labels exactly as written).
    fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
        text.lines().find_map(|l| {
            l.strip_prefix(name_and_labels)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
    }

    #[test]
    fn fold_adds_every_thread() {
        let shared = EngineShared::new(8, 2, 10.0, 2);
        let r = &shared.metrics;
        let c0 = r.register(Owner::Core(0), 2, 8);
        let c1 = r.register(Owner::Core(1), 2, 8);
        let e = r.register(Owner::Engine, 2, 8);
        c0.record(Stage::Decode, Duration::from_micros(30));
        c1.record(Stage::Decode, Duration::from_micros(70));
        c1.record(Stage::Decode, Duration::from_secs(10));
        c0.frames(2);
        c1.frames(1);
        c1.refused_session();
        e.record(Stage::FrameWait, Duration::from_millis(5));
        e.model_step(0, 3, Duration::from_millis(4));
        e.model_step(1, 8, Duration::from_millis(9));
        e.frames(3);
        e.late_tick();
        e.dropped_frame();
        let f = fold(&r.snapshots());
        let decode = &f.stages[Stage::Decode as usize];
        assert_eq!(decode.count(), 3);
        assert_eq!(decode.sum_ns, 30_000 + 70_000 + 10_000_000_000);
        assert_eq!(
            decode.buckets[crate::metrics::histogram::OVERFLOW_BUCKET],
            1
        );
        assert_eq!(f.stages[Stage::FrameWait as usize].count(), 1);
        assert_eq!(f.model_step.count(), 2);
        assert_eq!(f.model_step.sum_ns, 13_000_000);
        assert_eq!((f.frames_pushed, f.frames_stepped), (3, 3));
        assert_eq!(
            (f.late_ticks, f.dropped_frames, f.refused_sessions),
            (1, 1, 1)
        );

        let text = render(&shared);
        let h = STAGE_HISTOGRAM;
        assert_eq!(
            sample(&text, &format!("{h}_count{{stage=\"decode\",core=\"0\"}}")),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, &format!("{h}_count{{stage=\"decode\",core=\"1\"}}")),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                &format!("{h}_count{{stage=\"decode\",core=\"all\"}}")
            ),
            Some(3.0)
        );
        assert_eq!(
            sample(
                &text,
                &format!("{h}_bucket{{stage=\"decode\",core=\"all\",le=\"+Inf\"}}")
            ),
            Some(3.0)
        );
        // The 10 s sample is in +Inf only: the largest finite bucket holds 2.
        let last_le = crate::metrics::histogram::upper_bound_ns(FINITE_BUCKETS - 1) as f64 / 1e9;
        assert_eq!(
            sample(
                &text,
                &format!("{h}_bucket{{stage=\"decode\",core=\"all\",le=\"{last_le}\"}}")
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                &format!("{h}_bucket{{stage=\"decode\",core=\"0\",le=\"0.000032\"}}")
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                &format!("{h}_bucket{{stage=\"decode\",core=\"0\",le=\"0.000016\"}}")
            ),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &text,
                &format!(
                    "{h}_count{{stage=\"model_step\",core=\"engine\",group=\"1\",batch=\"5-8\"}}"
                )
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                &format!("{h}_count{{stage=\"model_step\",core=\"all\"}}")
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                &format!("{h}_sum{{stage=\"model_step\",core=\"all\"}}")
            ),
            Some(0.013)
        );
        // Engine stages are not listed for cores that never record them.
        assert!(!text.contains("stage=\"frame_wait\",core=\"0\""));
        assert_eq!(
            sample(&text, "moshid_stage_frames_total{core=\"all\"}"),
            Some(6.0)
        );
        assert_eq!(
            sample(&text, "moshid_stage_frames_total{core=\"engine\"}"),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, "moshid_stage_refused_sessions_total{core=\"1\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "moshid_stage_late_ticks_total{core=\"all\"}"),
            Some(1.0)
        );
        // Always-on series come from EngineShared.
        assert_eq!(sample(&text, "moshid_metrics_enabled"), Some(0.0));
        assert_eq!(sample(&text, "moshid_free_slots"), Some(8.0));
        assert_eq!(
            sample(&text, "moshid_group_sessions{group=\"1\"}"),
            Some(0.0)
        );
        assert_eq!(sample(&text, "moshid_engine_steps_total"), Some(0.0));
        assert!(text.contains("# TYPE moshid_stage_duration_seconds histogram"));
        assert!(text.contains("# TYPE moshid_engine_steps_total counter"));

        // A second scrape after more samples reports the new totals.
        c0.record(Stage::Decode, Duration::from_micros(1));
        shared.metrics.set_enabled(true);
        let text = render(&shared);
        assert_eq!(
            sample(
                &text,
                &format!("{h}_count{{stage=\"decode\",core=\"all\"}}")
            ),
            Some(4.0)
        );
        assert_eq!(sample(&text, "moshid_metrics_enabled"), Some(1.0));
    }
}
