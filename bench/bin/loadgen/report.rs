//! The load generator's outputs: the JSON report and its SVG figures.
//!
//! - `report.json`: the whole run ([`Report`]): machine, configuration, the
//!   bare-Opus floor, one [`StepReport`] per number of streams tried and the
//!   verdict (largest N that held).
//! - `timeline.csv`: every poll of `/capacity` (time, the step's N, active
//!   sessions, mean batch since the previous poll, engine counters).
//! - `latency_vs_streams.svg`: p50 / p90 / p99 / max added latency per N,
//!   with the budget.
//! - `cpu_per_stream.svg`: the daemon's CPU per stream-second per N (gross,
//!   net of what it burns idle, and without its engine thread, i.e. around
//!   the model), with the bare-Opus floors and 1.3× the one the ratios use.
//! - `batch_over_time.svg`: mean engine batch (frames stepped per step
//!   between two polls of `/capacity`), active sessions and the step's N
//!   over the run.
//! - `groups_over_time.svg`: the engine's phase groups over the run (groups
//!   in its plan, those of them stepping sessions) with active sessions.
//!
//! SVG only: plotters' SVG backend writes text as `<text>` elements and needs
//! no font files (its bitmap backend would need system fonts). Steps are
//! sorted by N in the report and the figures.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use serde::Serialize;

use crate::audio::OpusFloor;
use crate::daemon::{EngineCounters, PollSample};
use crate::stats::Summary;
use crate::sys::Machine;

/// The results of one number of streams.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    /// What the callers spoke.
    pub protocol: crate::wire::Protocol,
    /// Callers started.
    pub streams: usize,
    /// Sessions the daemon accepted.
    pub sessions: usize,
    /// Sessions refused (error message instead of the handshake).
    pub refused: usize,
    /// Callers that failed otherwise (connection, protocol, early close).
    pub errors: usize,
    /// A few of the refusal and error messages.
    pub messages: Vec<String>,
    /// Frames captured per caller.
    pub frames_per_stream: usize,
    pub frames_sent: usize,
    /// Frames dropped on the send side (`--loss`).
    pub frames_lost: usize,
    /// Answers matched to a frame.
    pub answers: usize,
    /// Added latency of every matched frame (ms).
    pub latency_ms: Option<Summary>,
    /// p99 over frames of (latency − the lowest latency of that stream):
    /// the variation a caller's jitter buffer has to absorb (ms).
    pub within_stream_spread_p99_ms: Option<f64>,
    /// Late answers plus unanswered frames.
    pub deadline_misses: usize,
    /// Answers later than the budget.
    pub late_answers: usize,
    /// Frames that should have been answered and were not.
    pub unanswered: usize,
    /// Answers with no frame to match (should be 0; more means
    /// `--model-delay-frames` is wrong or the daemon answered twice).
    pub unmatched_answers: usize,
    /// How late the load generator sent frames against their schedule (ms);
    /// a high p99 means the measurement itself was starved of CPU.
    pub send_lag_ms: Option<Summary>,
    /// Audio seconds sent by accepted sessions.
    pub stream_seconds: f64,
    /// Wall-clock seconds over which CPU was measured.
    pub window_s: f64,
    /// Daemon CPU (user + system) over the window, ms.
    pub daemon_cpu_ms: Option<f64>,
    /// Daemon CPU per stream-second, ms.
    pub cpu_ms_per_stream_s: Option<f64>,
    /// The same, less the daemon's idle CPU rate over the window.
    pub cpu_ms_per_stream_s_net_idle: Option<f64>,
    /// `cpu_ms_per_stream_s` / the bare-Opus floor.
    pub ratio_to_bare_opus: Option<f64>,
    /// `cpu_ms_per_stream_s_net_idle` / the bare-Opus floor.
    pub ratio_to_bare_opus_net_idle: Option<f64>,
    /// Daemon CPU in cores (CPU time / window).
    pub daemon_cores: Option<f64>,
    /// The load generator's own CPU in cores over the window.
    pub loadgen_cores: Option<f64>,
    /// The whole machine's busy CPU in cores over the window (/proc/stat).
    pub machine_busy_cores: Option<f64>,
    /// What the rest of the machine (neither the daemon nor the load
    /// generator: other users' builds, …) took, in cores.
    pub other_cores: Option<f64>,
    /// 1-minute load average at the end of the step.
    pub loadavg_1m: f64,
    /// The daemon's CPU per thread name over the window, in cores: which
    /// thread (engine, I/O core) runs out first.
    pub daemon_thread_cores: std::collections::BTreeMap<String, f64>,
    /// The engine thread's CPU (the model step, batch fill) per stream-second.
    pub engine_thread_ms_per_stream_s: Option<f64>,
    /// Daemon CPU per stream-second without the engine thread: what serving
    /// costs around the model (WebSocket, Opus, lanes, sessions).
    pub cpu_ms_per_stream_s_excl_engine: Option<f64>,
    /// `cpu_ms_per_stream_s_excl_engine` / the bare-Opus floor.
    pub ratio_to_bare_opus_excl_engine: Option<f64>,
    /// The same against the decoded-answer floor, when the floor itself
    /// encodes the demo model's own answers (`--floor-demo-answers`).
    pub ratio_to_bare_opus_excl_engine_decoded_answers: Option<f64>,
    /// `/capacity` before and after the step.
    pub engine_before: EngineCounters,
    pub engine_after: EngineCounters,
    /// Steps and frames stepped during the step; their ratio.
    pub engine_steps: u64,
    pub engine_frames: u64,
    pub mean_batch: Option<f64>,
    /// Late ticks and engine drops during the step.
    pub late_ticks: u64,
    pub dropped_frames: u64,
    /// Whether the step met every stop criterion.
    pub held: bool,
    /// The criteria it broke.
    pub broke: Vec<String>,
    /// Added latency of each accepted stream's frames (ms), in caller order.
    pub per_stream_latency_ms: Vec<Option<Summary>>,
    /// The daemon's phase groups halfway through the step (`/capacity`):
    /// groups in use, and per group its tick's phase, its sessions and the
    /// engine's measured wait of its frames (completion to step).
    pub groups: Option<GroupsSnapshot>,
}

/// The daemon's phase groups at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct GroupsSnapshot {
    pub max_groups: String,
    pub groups_in_use: u64,
    pub groups: Vec<GroupLoad>,
}

/// One phase group's load, measured wait and predicted step.
#[derive(Debug, Clone, Serialize)]
pub struct GroupLoad {
    pub phase_ms: f64,
    pub sessions: u64,
    pub wait_ms: f64,
    pub predicted_step_ms: f64,
}

impl GroupsSnapshot {
    /// From a `/capacity` body (`None` for a daemon that does not publish groups).
    pub fn from_capacity(v: &serde_json::Value) -> Option<Self> {
        let c = &v["capacity"];
        let groups = c["groups"]
            .as_array()?
            .iter()
            .map(|g| GroupLoad {
                phase_ms: g["phase_ms"].as_f64().unwrap_or(0.0),
                sessions: g["sessions"].as_u64().unwrap_or(0),
                wait_ms: g["wait_ms"].as_f64().unwrap_or(0.0),
                predicted_step_ms: g["predicted_step_ms"].as_f64().unwrap_or(0.0),
            })
            .collect();
        Some(GroupsSnapshot {
            max_groups: c["max_groups"].as_str().unwrap_or("").to_string(),
            groups_in_use: c["groups_in_use"].as_u64()?,
            groups,
        })
    }

    /// The largest group's predicted step, in ms (0 with no group occupied).
    pub fn largest_predicted_step_ms(&self) -> f64 {
        self.groups
            .iter()
            .map(|g| g.predicted_step_ms)
            .fold(0.0, f64::max)
    }

    /// `4 groups: 0ms×3 wait 9.1, 20ms×2 wait 7.0, …` (occupied groups only).
    pub fn line(&self) -> String {
        let occupied: Vec<String> = self
            .groups
            .iter()
            .filter(|g| g.sessions > 0)
            .map(|g| format!("{:.0}ms×{} wait {:.1}", g.phase_ms, g.sessions, g.wait_ms))
            .collect();
        format!(
            "{} of max {} groups: {}",
            self.groups_in_use,
            self.max_groups,
            occupied.join(", ")
        )
    }
}

/// How the run was set up.
#[derive(Debug, Clone, Serialize)]
pub struct RunConfig {
    pub url: String,
    pub daemon_pid: Option<u32>,
    pub spawned: Option<String>,
    pub serve_args: Vec<String>,
    pub plan: Vec<usize>,
    pub step_seconds: f64,
    pub budget_ms: f64,
    pub stop_on: Vec<String>,
    pub jitter_ms: f64,
    pub loss: f64,
    pub seed: u64,
    pub audio: String,
    pub model_delay_frames: usize,
    /// Scheduling priority given to the load generator and the daemon.
    pub nice: i32,
    pub latency_definition: String,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub tool: String,
    pub started_utc: String,
    pub machine: Machine,
    pub config: RunConfig,
    /// The bare-Opus floor the ratios use.
    pub opus_floor: OpusFloor,
    /// What that floor decodes and encodes.
    pub opus_floor_basis: String,
    /// The floor with the sent audio both ways (for comparison).
    pub opus_floor_sent_audio: OpusFloor,
    /// With `--floor-demo-answers`: the floor on the answers a caller
    /// decoded (what `opus_floor` is without that option), and its basis.
    pub opus_floor_decoded_answers: Option<OpusFloor>,
    pub opus_floor_decoded_answers_basis: Option<String>,
    /// The daemon's CPU while idle before the ramp, ms per second.
    pub daemon_idle_cpu_ms_per_s: Option<f64>,
    pub steps: Vec<StepReport>,
    /// 1-minute load average when the run ended.
    pub loadavg_1m_at_end: f64,
    /// Largest N that held (and every smaller N tried held too).
    pub largest_streams_held: Option<usize>,
    /// Smallest N that broke a criterion.
    pub first_streams_broken: Option<usize>,
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

const SERIES: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(100, 100, 100),
];

const REFERENCES: [RGBColor; 3] = [
    RGBColor(0, 0, 0),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
];

/// Draws `series` (name, points) as lines (with dots if `dots`), and
/// horizontal reference lines (name, y) in black, orange and purple.
pub(crate) fn line_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(&str, Vec<(f64, f64)>)],
    references: &[(&str, f64)],
    dots: bool,
) -> Result<()> {
    let all_x = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0));
    let x_max = all_x.fold(1.0f64, f64::max);
    let y_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .chain(references.iter().map(|r| r.1))
        .filter(|y| y.is_finite())
        .fold(1.0f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max * 1.05, 0f64..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = SERIES[i % SERIES.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        if dots {
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(err)?;
        }
    }
    for (i, (name, y)) in references.iter().enumerate() {
        let color = REFERENCES[i % REFERENCES.len()];
        chart
            .draw_series(LineSeries::new(
                [(0.0, *y), (x_max * 1.05, *y)],
                color.stroke_width(1),
            ))
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Writes `report.json` and the figures into `dir`.
pub fn write(dir: &Path, report: &Report, polls: &[PollSample]) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let json = dir.join("report.json");
    std::fs::write(&json, serde_json::to_string_pretty(report)? + "\n")?;
    written.push(json.display().to_string());

    let csv = dir.join("timeline.csv");
    let mut text = String::from(
        "t_s,streams,active_sessions,mean_batch,steps,frames_stepped,max_batch,late_ticks,dropped_frames,predicted_step_ms,groups_in_use,groups_occupied\n",
    );
    for p in polls {
        let c = &p.counters;
        text.push_str(&format!(
            "{:.2},{},{},{:.2},{},{},{},{},{},{:.2},{},{}\n",
            p.t_s,
            p.streams,
            c.active_sessions,
            p.mean_batch,
            c.steps,
            c.frames_stepped,
            c.max_batch,
            c.late_ticks,
            c.dropped_frames,
            c.predicted_step_ms,
            c.groups_in_use,
            c.groups_occupied
        ));
    }
    std::fs::write(&csv, text)?;
    written.push(csv.display().to_string());

    let steps = &report.steps;
    let pick = |f: fn(&Summary) -> f64| -> Vec<(f64, f64)> {
        steps
            .iter()
            .filter_map(|s| s.latency_ms.as_ref().map(|l| (s.streams as f64, f(l))))
            .collect()
    };
    let path = dir.join("latency_vs_streams.svg");
    line_chart(
        &path,
        "Added latency per frame vs concurrent streams",
        "streams",
        "ms (answer arrival - frame complete)",
        &[
            ("p50", pick(|l| l.p50)),
            ("p90", pick(|l| l.p90)),
            ("p99", pick(|l| l.p99)),
            ("max", pick(|l| l.max)),
        ],
        &[("budget", report.config.budget_ms)],
        true,
    )?;
    written.push(path.display().to_string());

    let cpu = |f: fn(&StepReport) -> Option<f64>| -> Vec<(f64, f64)> {
        steps
            .iter()
            .filter_map(|s| f(s).map(|v| (s.streams as f64, v)))
            .collect()
    };
    let floor = report.opus_floor.total_ms_per_stream_s;
    let path = dir.join("cpu_per_stream.svg");
    line_chart(
        &path,
        "Daemon CPU per stream-second vs concurrent streams",
        "streams",
        "CPU ms per stream-second",
        &[
            ("daemon (gross)", cpu(|s| s.cpu_ms_per_stream_s)),
            (
                "daemon (net of idle)",
                cpu(|s| s.cpu_ms_per_stream_s_net_idle),
            ),
            (
                "daemon without its engine thread (model step)",
                cpu(|s| s.cpu_ms_per_stream_s_excl_engine),
            ),
        ],
        &[
            ("bare Opus: decode sent + encode answers", floor),
            ("1.3 x that", 1.3 * floor),
            (
                "bare Opus: sent audio both ways",
                report.opus_floor_sent_audio.total_ms_per_stream_s,
            ),
        ],
        true,
    )?;
    written.push(path.display().to_string());

    let path = dir.join("batch_over_time.svg");
    let over_time = |f: fn(&PollSample) -> f64| -> Vec<(f64, f64)> {
        polls.iter().map(|p| (p.t_s, f(p))).collect()
    };
    line_chart(
        &path,
        "Engine batch over the run (polled /capacity)",
        "seconds",
        "streams / frames per step",
        &[
            ("mean batch (frames/step)", over_time(|p| p.mean_batch)),
            (
                "active sessions",
                over_time(|p| p.counters.active_sessions as f64),
            ),
            ("step N", over_time(|p| p.streams as f64)),
        ],
        &[],
        false,
    )?;
    written.push(path.display().to_string());

    let path = dir.join("groups_over_time.svg");
    line_chart(
        &path,
        "Phase groups over the run (polled /capacity)",
        "seconds",
        "groups / sessions",
        &[
            (
                "groups in the plan",
                over_time(|p| p.counters.groups_in_use as f64),
            ),
            (
                "groups stepping sessions",
                over_time(|p| p.counters.groups_occupied as f64),
            ),
            (
                "active sessions",
                over_time(|p| p.counters.active_sessions as f64),
            ),
        ],
        &[],
        false,
    )?;
    written.push(path.display().to_string());
    Ok(written)
}
