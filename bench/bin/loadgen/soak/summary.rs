//! The soak's records and verdicts: per-minute figures from the sessions'
//! outcomes and the daemon's readings, the checks (memory and tables flat
//! after warm-up, everything back to 0 at the end, no latency drift within
//! a metrics setting), and the files — `soak.json`, `minutes.csv`,
//! `timeline.csv`, `memory.svg`, `descriptors.svg`, `tables.svg`,
//! `latency.svg`, `sessions.svg`.
//!
//! Definitions: an answer's added latency is the ramp's (see
//! [`crate::stats`]), counted in the minute it arrived; a deadline miss is
//! an answer later than the budget, or a frame never answered by a session
//! that did not drop its connection (counted in the minute the session
//! ended). "Flat" is (max − min) / min of the per-minute values over the
//! minutes after warm-up; drift is the least-squares slope of the
//! per-minute percentile over those minutes, per metrics setting.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use super::caller::{Ending, Outcome};
use super::probe::{Reading, TABLES};
use super::SoakArgs;
use crate::report::line_chart;
use crate::stats::{summarize, Summary};
use crate::sys::Machine;

/// Everything the run gathered.
pub struct Input<'a> {
    pub args: &'a SoakArgs,
    pub serve_args: Vec<String>,
    pub url: String,
    pub pid: Option<u32>,
    pub started_utc: String,
    pub machine: Machine,
    /// When stage metrics were switched on (s since the epoch), if ever.
    pub metrics_on_at_s: Option<f64>,
    pub outcomes: &'a [Outcome],
    pub readings: &'a [Reading],
    /// (s, sessions the load generator was running) per reading.
    pub concurrency: &'a [(f64, usize)],
    /// Arrivals skipped at `--max-concurrent` (s).
    pub skipped: &'a [f64],
    pub final_reading: Reading,
}

/// One minute of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Minute {
    pub minute: usize,
    pub metrics_on: bool,
    pub sessions_started: usize,
    pub sessions_ended: usize,
    pub ended_end_of_input: usize,
    pub ended_close: usize,
    pub ended_abrupt: usize,
    pub long_calls_ended: usize,
    pub refused: usize,
    pub errors: usize,
    pub skipped: usize,
    pub concurrent_mean: f64,
    pub concurrent_max: usize,
    /// At the minute's last reading.
    pub rss_mib: f64,
    pub rss_mib_max: f64,
    /// Smallest reading of the minute (between session bursts).
    pub rss_mib_min: f64,
    /// Median of the minute's readings (less tied than its last reading to
    /// how many sessions happen to be live at that second).
    pub rss_mib_median: f64,
    /// Anonymous RSS at the minute's last reading (heap, stacks).
    pub rss_anon_mib: f64,
    /// The daemon's heap at the minute's last reading (`moshid_heap_bytes`;
    /// 0 where the daemon's allocator does not report it): allocated and
    /// not freed, free but kept by the allocator, and the allocator's total.
    pub heap_in_use_mib: f64,
    pub heap_free_mib: f64,
    pub heap_total_mib: f64,
    pub fds: usize,
    pub fds_max: usize,
    pub threads_max: usize,
    /// Largest entries of each per-session table ([`TABLES`] order).
    pub tables_max: [f64; 5],
    /// Largest excess of a slot table over the active sessions at one read.
    pub table_excess_max: f64,
    pub connections_open_max: f64,
    pub connection_addresses_max: f64,
    pub connections_pending_max: f64,
    pub latency_ms: Option<Summary>,
    pub late_answers: usize,
    pub unanswered: usize,
    pub deadline_misses: usize,
    pub late_ticks: f64,
    pub dropped_frames: f64,
    pub lost_outputs: f64,
    pub daemon_cores: Option<f64>,
}

/// A drift check of one metrics setting.
#[derive(Debug, Clone, Serialize)]
pub struct Drift {
    pub metrics_on: bool,
    /// Minutes judged (after warm-up, whole minutes of arrivals).
    pub minutes: Vec<usize>,
    pub p50_slope_ms_per_min: Option<f64>,
    pub p99_slope_ms_per_min: Option<f64>,
    /// Mean p99 of the first and last three judged minutes.
    pub p99_first3_ms: Option<f64>,
    pub p99_last3_ms: Option<f64>,
}

/// The verdicts.
#[derive(Debug, Clone, Serialize)]
pub struct Checks {
    pub warmup_minutes: usize,
    pub rss_mib_after_warmup: (f64, f64),
    pub rss_spread_pct: f64,
    pub rss_flat_within_5pct: bool,
    /// The heap's allocated bytes at the minutes' ends after warm-up: a leak
    /// grows them, fragmentation does not.
    pub heap_in_use_mib_after_warmup: (f64, f64),
    /// The minutes' medians after warm-up, and their spread (%).
    pub rss_median_mib_after_warmup: (f64, f64),
    pub rss_median_spread_pct: f64,
    /// Least-squares slope of the minutes' ends after warm-up (MiB/min).
    pub rss_slope_mib_per_min: Option<f64>,
    /// The same of the minutes' medians.
    pub rss_median_slope_mib_per_min: Option<f64>,
    pub heap_in_use_slope_mib_per_min: Option<f64>,
    pub fds_after_warmup: (usize, usize),
    pub threads_after_warmup: (usize, usize),
    pub table_max_after_warmup: [f64; 5],
    pub table_excess_max: f64,
    pub tables_at_end: [f64; 5],
    pub connections_at_end: (f64, f64, f64),
    pub idle_at_end: bool,
    pub drift: Vec<Drift>,
}

/// Totals of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Totals {
    pub sessions: usize,
    pub accepted: usize,
    pub refused: usize,
    pub errors: usize,
    pub skipped: usize,
    pub sessions_metrics_off: usize,
    pub sessions_metrics_on: usize,
    pub ended_end_of_input: usize,
    pub ended_close: usize,
    pub ended_abrupt: usize,
    pub long_calls: usize,
    pub long_calls_complete: usize,
    pub frames_sent: usize,
    pub answers: usize,
    pub deadline_misses: usize,
    pub late_answers: usize,
    pub unanswered: usize,
    pub latency_ms: Option<Summary>,
    pub latency_metrics_off_ms: Option<Summary>,
    pub latency_metrics_on_ms: Option<Summary>,
    /// Answers to frames past the model's context (the KV cache wrapped).
    pub past_context_latency_ms: Option<Summary>,
    /// The long calls' answers by the position of their frame in the call.
    pub long_calls_by_position: Vec<PositionBucket>,
    pub end_reasons: std::collections::BTreeMap<String, usize>,
    pub messages: Vec<String>,
}

/// The long calls' answers to frames `from_frame..to_frame`.
#[derive(Debug, Clone, Serialize)]
pub struct PositionBucket {
    pub from_frame: u32,
    pub to_frame: u32,
    pub latency_ms: Option<Summary>,
    /// Each answer's latency minus the median of its own call's answers
    /// to frames 0–49 (what the call gained since its start).
    pub over_own_start_ms: Option<Summary>,
}

/// Frames per [`PositionBucket`].
const POSITION_BUCKET_FRAMES: u32 = 25;

/// The long calls' answers bucketed by frame position.
fn by_position(outcomes: &[Outcome]) -> Vec<PositionBucket> {
    let mut lat: Vec<Vec<f64>> = Vec::new();
    let mut over: Vec<Vec<f64>> = Vec::new();
    for o in outcomes.iter().filter(|o| !o.long_by_frame.is_empty()) {
        let mut start: Vec<f64> = o
            .long_by_frame
            .iter()
            .filter(|(f, _)| *f < 50)
            .map(|x| x.1)
            .collect();
        let own_start = summarize(&mut start).map(|s| s.p50);
        for &(frame, l) in &o.long_by_frame {
            let b = (frame / POSITION_BUCKET_FRAMES) as usize;
            if lat.len() <= b {
                lat.resize(b + 1, Vec::new());
                over.resize(b + 1, Vec::new());
            }
            lat[b].push(l);
            if let Some(s) = own_start {
                over[b].push(l - s);
            }
        }
    }
    lat.iter_mut()
        .zip(over.iter_mut())
        .enumerate()
        .map(|(b, (l, o))| PositionBucket {
            from_frame: b as u32 * POSITION_BUCKET_FRAMES,
            to_frame: (b as u32 + 1) * POSITION_BUCKET_FRAMES,
            latency_ms: summarize(l),
            over_own_start_ms: summarize(o),
        })
        .collect()
}

/// The whole report (`soak.json`).
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    pub tool: String,
    pub started_utc: String,
    pub machine: Machine,
    pub url: String,
    pub daemon_pid: Option<u32>,
    pub spawned: Option<String>,
    pub serve_args: Vec<String>,
    pub minutes_requested: f64,
    /// `--nice` of the load generator, its autogroup and the daemon.
    pub nice: i32,
    pub rate_per_s: f64,
    pub shares: (f64, f64, f64),
    pub context_frames: usize,
    pub budget_ms: f64,
    pub metrics_on_at_s: Option<f64>,
    pub seed: u64,
    pub definitions: String,
    pub totals: Totals,
    pub checks: Checks,
    pub minutes: Vec<Minute>,
}

fn minute_of(t_s: f64) -> usize {
    (t_s.max(0.0) / 60.0) as usize
}

fn metrics_on_at(input: &Input<'_>, t_s: f64) -> bool {
    input.metrics_on_at_s.is_some_and(|at| t_s >= at)
}

/// Least-squares slope of `points`.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Builds the per-minute records, totals and checks.
pub fn build(input: &Input<'_>) -> SoakReport {
    let args = input.args;
    let last_t = input
        .readings
        .iter()
        .map(|r| r.t_s)
        .chain(input.outcomes.iter().map(|o| o.ended_s))
        .fold(0.0, f64::max);
    let n_minutes = minute_of(last_t) + 1;
    let budget = args.budget_ms;
    let mut latencies: Vec<Vec<f64>> = vec![Vec::new(); n_minutes];
    let mut minutes: Vec<Minute> = (0..n_minutes)
        .map(|m| Minute {
            minute: m,
            metrics_on: metrics_on_at(input, m as f64 * 60.0 + 30.0),
            sessions_started: 0,
            sessions_ended: 0,
            ended_end_of_input: 0,
            ended_close: 0,
            ended_abrupt: 0,
            long_calls_ended: 0,
            refused: 0,
            errors: 0,
            skipped: 0,
            concurrent_mean: 0.0,
            concurrent_max: 0,
            rss_mib: 0.0,
            rss_mib_max: 0.0,
            rss_mib_min: f64::INFINITY,
            rss_mib_median: 0.0,
            rss_anon_mib: 0.0,
            heap_in_use_mib: 0.0,
            heap_free_mib: 0.0,
            heap_total_mib: 0.0,
            fds: 0,
            fds_max: 0,
            threads_max: 0,
            tables_max: [0.0; 5],
            table_excess_max: 0.0,
            connections_open_max: 0.0,
            connection_addresses_max: 0.0,
            connections_pending_max: 0.0,
            latency_ms: None,
            late_answers: 0,
            unanswered: 0,
            deadline_misses: 0,
            late_ticks: 0.0,
            dropped_frames: 0.0,
            lost_outputs: 0.0,
            daemon_cores: None,
        })
        .collect();
    let mut all_lat = Vec::new();
    let mut lat_off = Vec::new();
    let mut lat_on = Vec::new();
    let mut past_context = Vec::new();
    let mut end_reasons = std::collections::BTreeMap::new();
    let mut messages: Vec<String> = Vec::new();
    for o in input.outcomes {
        minutes[minute_of(o.started_s)].sessions_started += 1;
        let m = &mut minutes[minute_of(o.ended_s)];
        if o.refused.is_some() {
            m.refused += 1;
        } else if o.error.is_some() {
            m.errors += 1;
        } else {
            m.sessions_ended += 1;
            match o.plan.ending {
                Ending::EndOfInput => m.ended_end_of_input += 1,
                Ending::Close => m.ended_close += 1,
                Ending::Abrupt => m.ended_abrupt += 1,
            }
            if o.plan.long {
                m.long_calls_ended += 1;
            }
        }
        m.unanswered += o.unanswered;
        for msg in o.refused.iter().chain(o.error.iter()) {
            if messages.len() < 8 && !messages.contains(msg) {
                messages.push(msg.clone());
            }
        }
        if let Some(r) = &o.end_reason {
            *end_reasons.entry(r.clone()).or_insert(0) += 1;
        }
        for &(arrival_s, l) in &o.latencies {
            latencies[minute_of(arrival_s)].push(l);
            all_lat.push(l);
            if metrics_on_at(input, arrival_s) {
                lat_on.push(l);
            } else {
                lat_off.push(l);
            }
        }
        past_context.extend_from_slice(&o.past_context_ms);
    }
    for &t in input.skipped {
        minutes[minute_of(t)].skipped += 1;
    }
    for (m, l) in minutes.iter_mut().zip(latencies.iter_mut()) {
        m.late_answers = l.iter().filter(|&&x| x > budget).count();
        m.deadline_misses = m.late_answers + m.unanswered;
        m.latency_ms = summarize(l);
    }
    let mut rss_readings: Vec<Vec<f64>> = vec![Vec::new(); n_minutes];
    for r in input.readings.iter().filter(|r| r.scraped) {
        rss_readings[minute_of(r.t_s)].push(r.rss_kib as f64 / 1024.0);
    }
    for (m, v) in minutes.iter_mut().zip(rss_readings.iter_mut()) {
        m.rss_mib_median = summarize(v).map_or(0.0, |s| s.p50);
    }
    let mut per_minute_conc: Vec<Vec<usize>> = vec![Vec::new(); n_minutes];
    for &(t, c) in input.concurrency {
        per_minute_conc[minute_of(t)].push(c);
    }
    for (m, c) in minutes.iter_mut().zip(&per_minute_conc) {
        if !c.is_empty() {
            m.concurrent_mean = c.iter().sum::<usize>() as f64 / c.len() as f64;
            m.concurrent_max = c.iter().copied().max().unwrap_or(0);
        }
    }
    // Readings: the last of each minute, maxima, counter deltas.
    let mut cpu: Vec<(f64, f64)> = vec![(0.0, 0.0); n_minutes];
    let mut previous: Option<&Reading> = None;
    for r in input.readings.iter().filter(|r| r.scraped) {
        let m = &mut minutes[minute_of(r.t_s)];
        let rss = r.rss_kib as f64 / 1024.0;
        m.rss_mib = rss;
        m.rss_mib_max = m.rss_mib_max.max(rss);
        m.rss_mib_min = m.rss_mib_min.min(rss);
        m.rss_anon_mib = r.rss_anon_kib as f64 / 1024.0;
        m.heap_in_use_mib = r.heap_in_use_kib as f64 / 1024.0;
        m.heap_free_mib = r.heap_free_kib as f64 / 1024.0;
        m.heap_total_mib = r.heap_total_kib as f64 / 1024.0;
        m.fds = r.fds;
        m.fds_max = m.fds_max.max(r.fds);
        m.threads_max = m.threads_max.max(r.threads);
        for (mx, v) in m.tables_max.iter_mut().zip(r.tables) {
            *mx = mx.max(v);
        }
        let slot_tables = r.tables[0].max(r.tables[2]).max(r.tables[3]);
        m.table_excess_max = m.table_excess_max.max(slot_tables - r.active_sessions);
        m.connections_open_max = m.connections_open_max.max(r.connections_open);
        m.connection_addresses_max = m.connection_addresses_max.max(r.connection_addresses);
        m.connections_pending_max = m.connections_pending_max.max(r.connections_pending);
        if let Some(p) = previous {
            m.late_ticks += r.late_ticks - p.late_ticks;
            m.dropped_frames += r.dropped_frames - p.dropped_frames;
            m.lost_outputs += r.lost_outputs - p.lost_outputs;
            let c = &mut cpu[minute_of(r.t_s)];
            c.0 += r.cpu_ms - p.cpu_ms;
            c.1 += r.t_s - p.t_s;
        }
        previous = Some(r);
    }
    for (m, (cpu_ms, secs)) in minutes.iter_mut().zip(cpu) {
        if !m.rss_mib_min.is_finite() {
            m.rss_mib_min = 0.0; // no reading in this minute
        }
        if secs > 0.0 && input.pid.is_some() {
            m.daemon_cores = Some(cpu_ms / 1000.0 / secs);
        }
    }

    // Checks over the whole minutes of arrivals after warm-up.
    let arrival_minutes = (args.minutes.floor() as usize).min(n_minutes);
    let judged: Vec<&Minute> = minutes
        .iter()
        .filter(|m| m.minute >= args.warmup_minutes && m.minute < arrival_minutes)
        .collect();
    let rss: Vec<f64> = judged.iter().map(|m| m.rss_mib).collect();
    let (rss_min, rss_max) = (
        rss.iter().copied().fold(f64::INFINITY, f64::min),
        rss.iter().copied().fold(0.0, f64::max),
    );
    let rss_spread_pct = if rss_min.is_finite() && rss_min > 0.0 {
        (rss_max - rss_min) / rss_min * 100.0
    } else {
        f64::NAN
    };
    let heap: Vec<f64> = judged.iter().map(|m| m.heap_in_use_mib).collect();
    let medians: Vec<f64> = judged.iter().map(|m| m.rss_mib_median).collect();
    let (med_min, med_max) = (
        medians.iter().copied().fold(f64::INFINITY, f64::min),
        medians.iter().copied().fold(0.0, f64::max),
    );
    let per_minute = |f: fn(&Minute) -> f64| -> Vec<(f64, f64)> {
        judged.iter().map(|m| (m.minute as f64, f(m))).collect()
    };
    let fds: Vec<usize> = judged.iter().map(|m| m.fds_max).collect();
    let threads: Vec<usize> = judged.iter().map(|m| m.threads_max).collect();
    let mut table_max = [0.0f64; 5];
    for m in &judged {
        for (mx, v) in table_max.iter_mut().zip(m.tables_max) {
            *mx = mx.max(v);
        }
    }
    let drift = [false, true]
        .into_iter()
        .filter_map(|on| {
            let ms: Vec<&&Minute> = judged
                .iter()
                .filter(|m| m.metrics_on == on && m.latency_ms.is_some())
                .collect();
            if ms.is_empty() {
                return None;
            }
            let p = |f: fn(&Summary) -> f64| -> Vec<(f64, f64)> {
                ms.iter()
                    .map(|m| (m.minute as f64, f(m.latency_ms.as_ref().expect("filtered"))))
                    .collect()
            };
            let p99: Vec<f64> = p(|s| s.p99).into_iter().map(|x| x.1).collect();
            Some(Drift {
                metrics_on: on,
                minutes: ms.iter().map(|m| m.minute).collect(),
                p50_slope_ms_per_min: slope(&p(|s| s.p50)),
                p99_slope_ms_per_min: slope(&p(|s| s.p99)),
                p99_first3_ms: mean(&p99[..p99.len().min(3)]),
                p99_last3_ms: mean(&p99[p99.len().saturating_sub(3)..]),
            })
        })
        .collect();
    let f = &input.final_reading;
    let checks = Checks {
        warmup_minutes: args.warmup_minutes,
        rss_mib_after_warmup: (rss_min, rss_max),
        rss_spread_pct,
        rss_flat_within_5pct: rss_spread_pct <= 5.0,
        heap_in_use_mib_after_warmup: (
            heap.iter().copied().fold(f64::INFINITY, f64::min),
            heap.iter().copied().fold(0.0, f64::max),
        ),
        rss_median_mib_after_warmup: (med_min, med_max),
        rss_median_spread_pct: (med_max - med_min) / med_min * 100.0,
        rss_slope_mib_per_min: slope(&per_minute(|m| m.rss_mib)),
        rss_median_slope_mib_per_min: slope(&per_minute(|m| m.rss_mib_median)),
        heap_in_use_slope_mib_per_min: slope(&per_minute(|m| m.heap_in_use_mib)),
        fds_after_warmup: (
            fds.iter().copied().min().unwrap_or(0),
            fds.iter().copied().max().unwrap_or(0),
        ),
        threads_after_warmup: (
            threads.iter().copied().min().unwrap_or(0),
            threads.iter().copied().max().unwrap_or(0),
        ),
        table_max_after_warmup: table_max,
        table_excess_max: minutes
            .iter()
            .map(|m| m.table_excess_max)
            .fold(0.0, f64::max),
        tables_at_end: f.tables,
        connections_at_end: (
            f.connections_open,
            f.connection_addresses,
            f.connections_pending,
        ),
        idle_at_end: f.scraped && f.active_sessions == 0.0 && f.tables.iter().all(|&t| t == 0.0),
        drift,
    };
    let accepted = input.outcomes.iter().filter(|o| o.accepted).count();
    let count = |e: Ending| {
        input
            .outcomes
            .iter()
            .filter(|o| o.accepted && o.error.is_none() && o.plan.ending == e)
            .count()
    };
    let long: Vec<&Outcome> = input.outcomes.iter().filter(|o| o.plan.long).collect();
    let totals = Totals {
        sessions: input.outcomes.len(),
        accepted,
        refused: input
            .outcomes
            .iter()
            .filter(|o| o.refused.is_some())
            .count(),
        errors: input.outcomes.iter().filter(|o| o.error.is_some()).count(),
        skipped: input.skipped.len(),
        sessions_metrics_off: input
            .outcomes
            .iter()
            .filter(|o| !metrics_on_at(input, o.started_s))
            .count(),
        sessions_metrics_on: input
            .outcomes
            .iter()
            .filter(|o| metrics_on_at(input, o.started_s))
            .count(),
        ended_end_of_input: count(Ending::EndOfInput),
        ended_close: count(Ending::Close),
        ended_abrupt: count(Ending::Abrupt),
        long_calls: long.len(),
        long_calls_complete: long
            .iter()
            .filter(|o| o.accepted && o.error.is_none() && o.unanswered == 0)
            .count(),
        frames_sent: input.outcomes.iter().map(|o| o.frames_sent).sum(),
        answers: input.outcomes.iter().map(|o| o.answers).sum(),
        deadline_misses: minutes.iter().map(|m| m.deadline_misses).sum(),
        late_answers: minutes.iter().map(|m| m.late_answers).sum(),
        unanswered: minutes.iter().map(|m| m.unanswered).sum(),
        latency_ms: summarize(&mut all_lat),
        latency_metrics_off_ms: summarize(&mut lat_off),
        latency_metrics_on_ms: summarize(&mut lat_on),
        past_context_latency_ms: summarize(&mut past_context),
        long_calls_by_position: by_position(input.outcomes),
        end_reasons,
        messages,
    };
    SoakReport {
        tool: format!("moshid-loadgen {} soak", env!("CARGO_PKG_VERSION")),
        started_utc: input.started_utc.clone(),
        machine: input.machine.clone(),
        url: input.url.clone(),
        daemon_pid: input.pid,
        spawned: args.target.spawn.clone(),
        serve_args: input.serve_args.clone(),
        minutes_requested: args.minutes,
        nice: args.nice,
        rate_per_s: args.rate,
        shares: (args.short, args.long, args.abrupt),
        context_frames: args.context_frames,
        budget_ms: budget,
        metrics_on_at_s: input.metrics_on_at_s,
        seed: args.seed,
        definitions: "added latency: arrival of the answer released by frame i's step minus the \
            moment frame i's last sample was captured (answers matched in 1920-sample units, \
            model delay 1 frame), counted in the minute it arrived; deadline miss: an answer \
            later than budget_ms, or a frame never answered by a session that did not drop its \
            connection; flat: (max - min) / min of the minutes' last readings after warm-up; \
            table excess: largest (max of held_slots, engine_open_slots, routed) - active \
            sessions in one /metrics read"
            .into(),
        totals,
        checks,
        minutes,
    }
}

fn fmt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

/// Writes the report, the CSVs and the figures into `dir`.
pub fn write(dir: &Path, report: &SoakReport, input: &Input<'_>) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let path = dir.join("soak.json");
    std::fs::write(&path, serde_json::to_string_pretty(report)? + "\n")?;
    written.push(path.display().to_string());

    let mut csv = String::from(
        "minute,metrics_on,started,ended,end_of_input,close,abrupt,long_ended,refused,errors,skipped,\
         concurrent_mean,concurrent_max,rss_mib,rss_mib_min,rss_mib_median,rss_anon_mib,heap_in_use_mib,\
         heap_free_mib,heap_total_mib,fds,threads_max,held_slots_max,pending_params_max,\
         engine_open_slots_max,routed_max,pending_closes_max,table_excess_max,connections_open_max,\
         connection_addresses_max,answers,p50_ms,p90_ms,p99_ms,max_ms,late,unanswered,\
         late_ticks,dropped_frames,daemon_cores\n",
    );
    for m in &report.minutes {
        let l = m.latency_ms.as_ref();
        let t = m.tables_max;
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{:.2},{},{:.2},{:.2},{:.2},{:.2},{:.2},{:.2},{:.2},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            m.minute,
            m.metrics_on,
            m.sessions_started,
            m.sessions_ended,
            m.ended_end_of_input,
            m.ended_close,
            m.ended_abrupt,
            m.long_calls_ended,
            m.refused,
            m.errors,
            m.skipped,
            m.concurrent_mean,
            m.concurrent_max,
            m.rss_mib,
            m.rss_mib_min,
            m.rss_mib_median,
            m.rss_anon_mib,
            m.heap_in_use_mib,
            m.heap_free_mib,
            m.heap_total_mib,
            m.fds,
            m.threads_max,
            t[0],
            t[1],
            t[2],
            t[3],
            t[4],
            m.table_excess_max,
            m.connections_open_max,
            m.connection_addresses_max,
            l.map_or(0, |l| l.count),
            fmt(l.map(|l| l.p50)),
            fmt(l.map(|l| l.p90)),
            fmt(l.map(|l| l.p99)),
            fmt(l.map(|l| l.max)),
            m.late_answers,
            m.unanswered,
            m.late_ticks,
            m.dropped_frames,
            m.daemon_cores.map_or("-".into(), |c| format!("{c:.3}")),
        );
    }
    let path = dir.join("minutes.csv");
    std::fs::write(&path, csv)?;
    written.push(path.display().to_string());

    let mut csv = String::from(
        "t_s,rss_kib,rss_anon_kib,heap_in_use_kib,heap_free_kib,heap_total_kib,fds,threads,cpu_ms,active_sessions,held_slots,pending_params,engine_open_slots,\
         routed,pending_closes,connections_open,connection_addresses,connections_pending,\
         metrics_enabled,late_ticks,dropped_frames,steps\n",
    );
    for r in input.readings {
        let t = r.tables;
        let _ = writeln!(
            csv,
            "{:.2},{},{},{},{},{},{},{},{:.0},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.t_s,
            r.rss_kib,
            r.rss_anon_kib,
            r.heap_in_use_kib,
            r.heap_free_kib,
            r.heap_total_kib,
            r.fds,
            r.threads,
            r.cpu_ms,
            r.active_sessions,
            t[0],
            t[1],
            t[2],
            t[3],
            t[4],
            r.connections_open,
            r.connection_addresses,
            r.connections_pending,
            u8::from(r.metrics_enabled),
            r.late_ticks,
            r.dropped_frames,
            r.steps
        );
    }
    let path = dir.join("timeline.csv");
    std::fs::write(&path, csv)?;
    written.push(path.display().to_string());

    let minutes_x = |r: &Reading| r.t_s / 60.0;
    let readings: Vec<&Reading> = input.readings.iter().filter(|r| r.scraped).collect();
    let on_at = input.metrics_on_at_s.map(|s| s / 60.0);
    let note = on_at.map_or(String::new(), |m| format!("; metrics on at {m:.0} min"));

    // One series of the memory chart: a KiB reading per minute, in MiB.
    let mib_series = |kib: fn(&Reading) -> u64| -> Vec<(f64, f64)> {
        readings
            .iter()
            .map(|r| (minutes_x(r), kib(r) as f64 / 1024.0))
            .collect()
    };
    let path = dir.join("memory.svg");
    line_chart(
        &path,
        &format!("Daemon resident memory{note}"),
        "minutes",
        "MiB",
        &[
            ("RSS", mib_series(|r| r.rss_kib)),
            ("RSS anonymous", mib_series(|r| r.rss_anon_kib)),
            ("heap total (allocator)", mib_series(|r| r.heap_total_kib)),
            ("heap in use", mib_series(|r| r.heap_in_use_kib)),
        ],
        &[],
        false,
    )?;
    written.push(path.display().to_string());

    let path = dir.join("descriptors.svg");
    line_chart(
        &path,
        &format!("Daemon open file descriptors and threads{note}"),
        "minutes",
        "count",
        &[
            (
                "open fds",
                readings
                    .iter()
                    .map(|r| (minutes_x(r), r.fds as f64))
                    .collect(),
            ),
            (
                "threads",
                readings
                    .iter()
                    .map(|r| (minutes_x(r), r.threads as f64))
                    .collect(),
            ),
            (
                "open connections",
                readings
                    .iter()
                    .map(|r| (minutes_x(r), r.connections_open))
                    .collect(),
            ),
        ],
        &[],
        false,
    )?;
    written.push(path.display().to_string());

    let path = dir.join("tables.svg");
    let mut series: Vec<(&str, Vec<(f64, f64)>)> = vec![(
        "active sessions",
        readings
            .iter()
            .map(|r| (minutes_x(r), r.active_sessions))
            .collect(),
    )];
    for (i, name) in TABLES.iter().enumerate() {
        series.push((
            name,
            readings
                .iter()
                .map(|r| (minutes_x(r), r.tables[i]))
                .collect(),
        ));
    }
    line_chart(
        &path,
        &format!("Per-session tables (entries, every second){note}"),
        "minutes",
        "entries",
        &series,
        &[],
        false,
    )?;
    written.push(path.display().to_string());

    let path = dir.join("latency.svg");
    let pick = |f: fn(&Summary) -> f64| -> Vec<(f64, f64)> {
        report
            .minutes
            .iter()
            .filter_map(|m| m.latency_ms.as_ref().map(|l| (m.minute as f64 + 0.5, f(l))))
            .collect()
    };
    line_chart(
        &path,
        &format!("Added latency of the answers, per minute{note}"),
        "minutes",
        "added latency (ms)",
        &[
            ("p50", pick(|s| s.p50)),
            ("p90", pick(|s| s.p90)),
            ("p99", pick(|s| s.p99)),
            ("max", pick(|s| s.max)),
        ],
        &[("deadline", report.budget_ms)],
        true,
    )?;
    written.push(path.display().to_string());

    let path = dir.join("position.svg");
    let buckets = &report.totals.long_calls_by_position;
    let at = |f: fn(&PositionBucket) -> Option<f64>| -> Vec<(f64, f64)> {
        buckets
            .iter()
            .filter_map(|b| f(b).map(|v| (f64::from(b.from_frame + b.to_frame) / 2.0, v)))
            .collect()
    };
    line_chart(
        &path,
        &format!(
            "Long calls: added latency by frame position (context {} frames)",
            input.args.context_frames
        ),
        "frame in the call",
        "added latency (ms)",
        &[
            ("p50", at(|b| b.latency_ms.as_ref().map(|l| l.p50))),
            ("p99", at(|b| b.latency_ms.as_ref().map(|l| l.p99))),
            (
                "p50 over the call's own start",
                at(|b| b.over_own_start_ms.as_ref().map(|l| l.p50)),
            ),
        ],
        &[("deadline", report.budget_ms)],
        false,
    )?;
    written.push(path.display().to_string());

    let path = dir.join("sessions.svg");
    let per = |f: fn(&Minute) -> f64| -> Vec<(f64, f64)> {
        report
            .minutes
            .iter()
            .map(|m| (m.minute as f64 + 0.5, f(m)))
            .collect()
    };
    line_chart(
        &path,
        &format!("Sessions per minute{note}"),
        "minutes",
        "sessions",
        &[
            ("started / 10", per(|m| m.sessions_started as f64 / 10.0)),
            ("concurrent (mean)", per(|m| m.concurrent_mean)),
            ("concurrent (max)", per(|m| m.concurrent_max as f64)),
            ("refused + errors", per(|m| (m.refused + m.errors) as f64)),
        ],
        &[],
        true,
    )?;
    written.push(path.display().to_string());
    Ok(written)
}

/// Prints the verdicts.
pub fn print(r: &SoakReport) {
    let t = &r.totals;
    let c = &r.checks;
    let l = t.latency_ms.as_ref();
    println!(
        "sessions: {} ({} with metrics off, {} on); accepted {}, refused {}, errors {}, skipped {}; \
         endings: end-of-input {}, close {}, abrupt {}; long calls {} ({} complete)",
        t.sessions,
        t.sessions_metrics_off,
        t.sessions_metrics_on,
        t.accepted,
        t.refused,
        t.errors,
        t.skipped,
        t.ended_end_of_input,
        t.ended_close,
        t.ended_abrupt,
        t.long_calls,
        t.long_calls_complete
    );
    println!(
        "answers {} of {} frames sent; latency p50 {} p90 {} p99 {} max {} ms; past the context: p99 {} ms; deadline misses {} (late {}, unanswered {})",
        t.answers,
        t.frames_sent,
        fmt(l.map(|l| l.p50)),
        fmt(l.map(|l| l.p90)),
        fmt(l.map(|l| l.p99)),
        fmt(l.map(|l| l.max)),
        fmt(t.past_context_latency_ms.as_ref().map(|l| l.p99)),
        t.deadline_misses,
        t.late_answers,
        t.unanswered
    );
    println!(
        "after {} min of warm-up: RSS {:.1}–{:.1} MiB ({:.2} %, {}), fds {}–{}, threads {}–{}, \
         table maxima {:?}, largest table excess {}",
        c.warmup_minutes,
        c.rss_mib_after_warmup.0,
        c.rss_mib_after_warmup.1,
        c.rss_spread_pct,
        if c.rss_flat_within_5pct {
            "flat within 5 %"
        } else {
            "NOT flat within 5 %"
        },
        c.fds_after_warmup.0,
        c.fds_after_warmup.1,
        c.threads_after_warmup.0,
        c.threads_after_warmup.1,
        c.table_max_after_warmup,
        c.table_excess_max
    );
    println!(
        "RSS per-minute median after warm-up {:.1}–{:.1} MiB ({:.2} %); heap in use {:.1}–{:.1} MiB; slopes: RSS {} (medians {}) MiB/min, heap in use {} MiB/min",
        c.rss_median_mib_after_warmup.0,
        c.rss_median_mib_after_warmup.1,
        c.rss_median_spread_pct,
        c.heap_in_use_mib_after_warmup.0,
        c.heap_in_use_mib_after_warmup.1,
        c.rss_slope_mib_per_min.map_or("-".into(), |v| format!("{v:+.3}")),
        c.rss_median_slope_mib_per_min.map_or("-".into(), |v| format!("{v:+.3}")),
        c.heap_in_use_slope_mib_per_min.map_or("-".into(), |v| format!("{v:+.3}")),
    );
    println!(
        "at the end: tables {:?}, connections (open, addresses, pending) {:?}: {}",
        c.tables_at_end,
        c.connections_at_end,
        if c.idle_at_end { "idle" } else { "NOT idle" }
    );
    for d in &c.drift {
        println!(
            "metrics {}: minutes {:?}: p50 slope {} ms/min, p99 slope {} ms/min, p99 first 3 min {} ms, last 3 min {} ms",
            if d.metrics_on { "on" } else { "off" },
            d.minutes,
            d.p50_slope_ms_per_min.map_or("-".into(), |v| format!("{v:+.3}")),
            d.p99_slope_ms_per_min.map_or("-".into(), |v| format!("{v:+.3}")),
            fmt(d.p99_first3_ms),
            fmt(d.p99_last3_ms)
        );
    }
    for b in &t.long_calls_by_position {
        let (l, o) = (b.latency_ms.as_ref(), b.over_own_start_ms.as_ref());
        println!(
            "long calls, frames {:>3}–{:>3}: {:>5} answers, p50 {} p99 {} ms; over the call's own start: p50 {} p99 {} ms",
            b.from_frame,
            b.to_frame,
            l.map_or(0, |l| l.count),
            fmt(l.map(|l| l.p50)),
            fmt(l.map(|l| l.p99)),
            fmt(o.map(|o| o.p50)),
            fmt(o.map(|o| o.p99)),
        );
    }
    for m in &t.messages {
        println!("message: {m}");
    }
}

#[cfg(test)]
mod tests {
    use super::slope;

    #[test]
    fn least_squares_slope() {
        let pts: Vec<(f64, f64)> = (0..10).map(|x| (x as f64, 2.0 * x as f64 + 1.0)).collect();
        assert!((slope(&pts).unwrap() - 2.0).abs() < 1e-12);
        assert_eq!(slope(&pts[..2]), None);
        let flat: Vec<(f64, f64)> = (0..5).map(|x| (x as f64, 7.0)).collect();
        assert_eq!(slope(&flat), Some(0.0));
    }
}
