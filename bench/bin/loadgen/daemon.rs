//! The daemon under test: the target of a run (a `moshid serve` started by
//! `--spawn` with the test kit's one daemon builder, or one running at
//! `--url`), its `/capacity` endpoint, and polling the engine counters
//! during a run.
//!
//! Invariants: a spawned daemon is killed (by its own PID) when its
//! [`Target`] is dropped, so an error never leaves one running; `/capacity`
//! is fetched with one short-lived HTTP/1.1 connection per request.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use moshid_testkit::{Daemon, DaemonBuilder};
use serde_json::Value;

/// Timeout of one `/capacity` read.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// Which daemon a run loads: one it starts, or one already running.
#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// Chat endpoint of a running daemon (ws://HOST:PORT/api/chat).
    #[arg(long, required_unless_present = "spawn")]
    pub url: Option<String>,
    /// PID of that daemon, for its CPU time, memory and descriptors (/proc/PID).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Start this moshid binary (`serve --listen 127.0.0.1:0 SERVE_ARGS`)
    /// and measure it; it is stopped at the end.
    #[arg(long, value_name = "MOSHID", conflicts_with_all = ["url", "pid"])]
    pub spawn: Option<String>,
    /// Arguments of `moshid serve` with --spawn, split on whitespace
    /// (e.g. "--max-slots 64 --cache-dir /tmp/moshid-cache").
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    pub serve_args: String,
    /// Where the spawned daemon's stderr goes (default: discarded).
    #[arg(long)]
    pub daemon_log: Option<PathBuf>,
    /// Seconds to wait for the spawned daemon to listen (model warm-up).
    #[arg(long, default_value_t = 300.0)]
    pub spawn_timeout: f64,
}

/// The daemon a run loads.
pub struct Target {
    /// The daemon this run started (stopped when dropped), if it did.
    pub spawned: Option<Daemon>,
    /// Its chat endpoint.
    pub url: String,
    /// Its HTTP address.
    pub addr: SocketAddr,
    /// Its PID, when known (spawned, or `--pid`).
    pub pid: Option<u32>,
}

impl TargetArgs {
    /// `--serve-args`, split on whitespace.
    pub fn serve_args_list(&self) -> Vec<String> {
        self.serve_args
            .split_whitespace()
            .map(String::from)
            .collect()
    }

    /// Starts the daemon (`--spawn`, at `nice` when not 0) or names the
    /// running one (`--url`).
    pub fn target(&self, nice: i32) -> Result<Target> {
        let spawned = match &self.spawn {
            Some(binary) => {
                let serve_args: Vec<&str> = self.serve_args.split_whitespace().collect();
                eprintln!("starting {binary} serve {}", serve_args.join(" "));
                if !(self.spawn_timeout > 0.0 && self.spawn_timeout.is_finite()) {
                    bail!("--spawn-timeout must be a positive number of seconds");
                }
                let d = DaemonBuilder::new(binary)
                    .args(serve_args)
                    .stderr_to(self.daemon_log.as_deref())
                    .ready_timeout(Duration::from_secs_f64(self.spawn_timeout))
                    .spawn()
                    .with_context(|| format!("--spawn {binary}"))?;
                eprintln!("daemon pid {} listening on {}", d.pid(), d.addr);
                if nice != 0 {
                    crate::sys::favour_process(d.pid(), nice).context("--nice on the daemon")?;
                }
                Some(d)
            }
            None => None,
        };
        let url = match (&spawned, &self.url) {
            (Some(d), _) => d.chat_url(""),
            (None, Some(u)) => u.clone(),
            (None, None) => bail!("give --url or --spawn"),
        };
        let pid = spawned.as_ref().map(Daemon::pid).or(self.pid);
        let addr = http_addr(&url)?;
        Ok(Target {
            spawned,
            url,
            addr,
            pid,
        })
    }
}

/// `GET path` on `addr`; the body parsed as JSON.
pub fn get_json(addr: SocketAddr, path: &str) -> Result<Value> {
    moshid_testkit::http::get_json(addr, path, HTTP_TIMEOUT)
}

/// The HTTP address of a `ws://HOST:PORT/…` URL.
pub fn http_addr(url: &str) -> Result<SocketAddr> {
    moshid_testkit::chat::url_addr(url).map_err(|e| anyhow!(e))
}

/// The engine counters of one `/capacity` read.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct EngineCounters {
    /// The daemon's predicted step time of its busiest group now (ms).
    pub predicted_step_ms: f64,
    pub steps: u64,
    pub frames_stepped: u64,
    pub max_batch: u64,
    pub late_ticks: u64,
    pub dropped_frames: u64,
    pub active_sessions: u64,
    pub admissible_sessions: u64,
    pub refused_total: u64,
    /// Phase groups in the engine's plan, and how many of them step sessions.
    pub groups_in_use: u64,
    pub groups_occupied: u64,
}

impl EngineCounters {
    /// Reads `/capacity` of the daemon at `addr`.
    pub fn read(addr: SocketAddr) -> Result<Self> {
        Ok(Self::from_json(&get_json(addr, "/capacity")?))
    }

    /// The counters of a `/capacity` body (missing ones are 0).
    pub fn from_json(v: &Value) -> Self {
        let u = |section: &str, key: &str| v[section][key].as_u64().unwrap_or(0);
        let predicted_step_ms = v["capacity"]["groups"]
            .as_array()
            .map(|groups| {
                groups
                    .iter()
                    .filter_map(|g| g["predicted_step_ms"].as_f64())
                    .fold(0.0, f64::max)
            })
            .unwrap_or(0.0);
        let groups_occupied = v["capacity"]["groups"].as_array().map_or(0, |groups| {
            groups
                .iter()
                .filter(|g| g["sessions"].as_u64().unwrap_or(0) > 0)
                .count() as u64
        });
        EngineCounters {
            predicted_step_ms,
            groups_in_use: u("capacity", "groups_in_use"),
            groups_occupied,
            steps: u("engine", "steps"),
            frames_stepped: u("engine", "frames_stepped"),
            max_batch: u("engine", "max_batch"),
            late_ticks: u("engine", "late_ticks"),
            dropped_frames: u("engine", "dropped_frames"),
            active_sessions: u("capacity", "active_sessions"),
            admissible_sessions: u("capacity", "admissible_sessions"),
            refused_total: u("capacity", "refused_total"),
        }
    }
}

/// One poll of the engine during the run.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct PollSample {
    /// Seconds since the start of the ramp.
    pub t_s: f64,
    /// Streams the load generator was running (the step's N, 0 between steps).
    pub streams: usize,
    /// Mean batch since the previous poll (frames stepped / steps), 0 if no step.
    pub mean_batch: f64,
    pub counters: EngineCounters,
}

/// Polls `/capacity` every `interval` on a thread until dropped.
pub struct Poller {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<PollSample>>>,
    thread: Option<JoinHandle<()>>,
}

impl Poller {
    /// Starts polling `addr`; `streams` is read at each poll for the label.
    pub fn start(
        addr: SocketAddr,
        interval: Duration,
        epoch: Instant,
        streams: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, samples) = (stop.clone(), samples.clone());
            std::thread::Builder::new()
                .name("loadgen-poll".into())
                .spawn(move || {
                    let mut previous: Option<EngineCounters> = None;
                    let mut next = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(c) = EngineCounters::read(addr) {
                            let mean_batch = previous.map_or(0.0, |p| {
                                let steps = c.steps.saturating_sub(p.steps);
                                let frames = c.frames_stepped.saturating_sub(p.frames_stepped);
                                if steps == 0 {
                                    0.0
                                } else {
                                    frames as f64 / steps as f64
                                }
                            });
                            previous = Some(c);
                            samples.lock().unwrap().push(PollSample {
                                t_s: epoch.elapsed().as_secs_f64(),
                                streams: streams.load(Ordering::Relaxed),
                                mean_batch,
                                counters: c,
                            });
                        }
                        next += interval;
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        } else {
                            next = now;
                        }
                    }
                })?
        };
        Ok(Poller {
            stop,
            samples,
            thread: Some(thread),
        })
    }

    /// Stops polling; the samples taken.
    pub fn finish(mut self) -> Vec<PollSample> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.samples.lock().unwrap())
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Waits until the daemon holds no session (the previous step's are
/// released), at most `timeout`; returns whether it got there.
pub fn wait_idle(addr: SocketAddr, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if EngineCounters::read(addr).is_ok_and(|c| c.active_sessions == 0) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_counters_of_a_capacity_body() {
        let v: Value = serde_json::json!({
            "capacity": {"active_sessions": 3, "admissible_sessions": 61,
                "groups": [{"predicted_step_ms": 1.5}, {"predicted_step_ms": 2.5}]},
            "engine": {"steps": 10, "frames_stepped": 25, "max_batch": 3}
        });
        let c = EngineCounters::from_json(&v);
        assert_eq!(
            (c.steps, c.frames_stepped, c.max_batch, c.active_sessions),
            (10, 25, 3, 3)
        );
        assert_eq!(http_addr("ws://127.0.0.1:9/api/chat").unwrap().port(), 9);
    }
}
