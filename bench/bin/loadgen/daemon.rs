//! The daemon under test: starting `moshid serve` (`--spawn`), reading its
//! `/capacity` endpoint, and polling the engine counters during a run.
//!
//! Invariants: a spawned daemon is killed (by its own PID) when its
//! [`Spawned`] is dropped, so an error never leaves one running; its stdout
//! is drained by a thread for as long as it lives; `/capacity` is fetched
//! with one short-lived HTTP/1.1 connection per request (the endpoint closes
//! or gives a Content-Length; either is handled).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

/// The line `moshid serve` prints once it is ready.
const READY_PREFIX: &str = "moshid listening on http://";

/// A `moshid serve` started by the load generator.
pub struct Spawned {
    child: Child,
    /// The address it listens on.
    pub addr: SocketAddr,
}

impl Spawned {
    /// Starts `binary serve --listen 127.0.0.1:0 ARGS…` (no `--listen` is
    /// added when `args` has one) and waits up to `timeout` for it to say
    /// where it listens. Its stderr goes to `log` (or nowhere).
    pub fn start(
        binary: &str,
        args: &[String],
        log: Option<&std::path::Path>,
        timeout: Duration,
    ) -> Result<Self> {
        let mut cmd = Command::new(binary);
        cmd.arg("serve");
        if !args
            .iter()
            .any(|a| a == "--listen" || a.starts_with("--listen="))
        {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped());
        match log {
            Some(path) => {
                let file = std::fs::File::create(path)
                    .with_context(|| format!("creating {}", path.display()))?;
                cmd.stderr(file);
            }
            None => {
                cmd.stderr(Stdio::null());
            }
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {binary} serve"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("loadgen-daemon-out".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Some(rest) = line.trim().strip_prefix(READY_PREFIX) {
                        let _ = tx.send(rest.trim_end_matches('/').to_string());
                    }
                }
            })?;
        let mut spawned = Spawned {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let deadline = Instant::now() + timeout;
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(addr) => {
                    spawned.addr = addr
                        .parse()
                        .with_context(|| format!("moshid printed address {addr:?}"))?;
                    return Ok(spawned);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!("{binary} serve exited before listening (see --daemon-log)")
                }
            }
            if let Some(status) = spawned.child.try_wait()? {
                bail!("{binary} serve exited with {status} before listening");
            }
            if Instant::now() >= deadline {
                bail!("{binary} serve did not listen within {timeout:?}");
            }
        }
    }

    /// The daemon's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` on `addr`; the body parsed as JSON.
pub fn get_json(addr: SocketAddr, path: &str) -> Result<Value> {
    let timeout = Duration::from_secs(5);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        response.extend_from_slice(&buf[..n]);
        if let Some(body) = complete_body(&response) {
            return Ok(serde_json::from_slice(body)?);
        }
    }
    let split = find(&response, b"\r\n\r\n").ok_or_else(|| anyhow!("no HTTP head"))?;
    Ok(serde_json::from_slice(&response[split + 4..])?)
}

/// The body once the whole of it (by Content-Length) has come.
fn complete_body(response: &[u8]) -> Option<&[u8]> {
    let split = find(response, b"\r\n\r\n")?;
    let head = std::str::from_utf8(&response[..split]).ok()?;
    let length: usize = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())?
    })?;
    let body = &response[split + 4..];
    (body.len() >= length).then(|| &body[..length])
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The HTTP address of a `ws://HOST:PORT/…` URL.
pub fn http_addr(url: &str) -> Result<SocketAddr> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    authority
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| anyhow!("{authority} has no address"))
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
    fn body_by_content_length() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(complete_body(r), Some(&b"{}"[..]));
        assert_eq!(complete_body(&r[..r.len() - 1]), None);
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
