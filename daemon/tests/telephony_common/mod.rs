//! Shared by the telephony end-to-end tests: start the real `moshid serve`
//! on loopback (ephemeral ports for the HTTP listener and, when enabled,
//! the AudioSocket listener), read its logs, make test audio, and summarise
//! packet arrival gaps.
//!
//! Every wait is bounded (socket timeouts, deadlines), so a hung daemon
//! fails a test instead of hanging it.

#![allow(dead_code)] // each test binary uses a subset

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The first start writes the demo checkpoint and warms the engine up.
pub const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// Bound on any socket read or write.
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// One daemon at a time: the machine may have two CPUs.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// A running `moshid serve`; dropping it stops the process.
pub struct Daemon {
    child: Child,
    /// The HTTP/WebSocket listener.
    pub addr: SocketAddr,
    /// The AudioSocket listener, when enabled.
    pub audiosocket: Option<SocketAddr>,
    stderr_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts `moshid serve --listen 127.0.0.1:0 --cache-dir … --config
    /// <config_json>` and waits for its listening lines.
    pub fn start(config_json: &str) -> Daemon {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = tempfile::Builder::new()
            .prefix("moshid-telephony-")
            .tempdir_in(tmp)
            .unwrap();
        let config = dir.path().join("config.json");
        std::fs::write(&config, config_json).unwrap();
        let stderr_path = dir.path().join("stderr.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_moshid"))
            .args(["serve", "--listen", "127.0.0.1:0", "--cache-dir"])
            .arg(tmp.join("demo-cache"))
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&stderr_path).unwrap()))
            .spawn()
            .expect("spawning moshid serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let mut daemon = Daemon {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            audiosocket: None,
            stderr_path,
            _dir: dir,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| {
                    panic!("moshid did not start; stderr:\n{}", daemon.stderr_tail())
                });
            let line = line.trim();
            if let Some(a) = line.strip_prefix("audiosocket listening on ") {
                daemon.audiosocket = Some(a.parse().unwrap());
            }
            if let Some(a) = line.strip_prefix("moshid listening on http://") {
                daemon.addr = a.parse().unwrap();
                break;
            }
        }
        daemon
    }

    /// The whole stderr log.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// The last 60 lines of stderr.
    pub fn stderr_tail(&self) -> String {
        let text = self.stderr();
        let tail: Vec<&str> = text.lines().rev().take(60).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Waits until stderr has a line containing every one of `needles`;
    /// Stage `stage`'s `count` or `sum` (seconds) in `/metrics`, over every
    /// thread (not the `core="all"` total).
    pub fn stage_total(&self, stage: &str, what: &str) -> f64 {
        let (status, page) = http_request(self.addr, "GET", "/metrics", None);
        assert_eq!(status, 200, "{page}");
        let series = format!("moshid_stage_duration_seconds_{what}{{stage=\"{stage}\",core=\"");
        page.lines()
            .filter_map(|l| l.strip_prefix(series.as_str()))
            .filter(|l| !l.starts_with("all"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }

    /// returns it.
    pub fn wait_for_log(&self, needles: &[&str], timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self
                .stderr()
                .lines()
                .find(|l| needles.iter().all(|n| l.contains(n)))
            {
                return line.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needles:?} within {timeout:?}; stderr:\n{}",
                self.stderr_tail()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("---- moshid stderr (tail) ----\n{}", self.stderr_tail());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `n` samples of a 440 Hz tone at `rate`, 16-bit.
pub fn tone(rate: u32, start: usize, n: usize) -> Vec<i16> {
    (start..start + n)
        .map(|i| {
            ((2.0 * std::f32::consts::PI * 440.0 * i as f32 / rate as f32).sin() * 8000.0) as i16
        })
        .collect()
}

/// Arrival gaps of paced packets, in milliseconds: printed, not asserted.
pub fn print_gaps(what: &str, arrivals: &[Instant]) {
    if arrivals.len() < 2 {
        println!("{what}: {} packets, no gaps to measure", arrivals.len());
        return;
    }
    let mut gaps: Vec<f64> = arrivals
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1000.0)
        .collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    gaps.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let pct = |p: f64| gaps[((gaps.len() - 1) as f64 * p).round() as usize];
    let span = (arrivals[arrivals.len() - 1] - arrivals[0]).as_secs_f64() * 1000.0;
    println!(
        "{what}: {} packets over {span:.0} ms; gap ms: mean {mean:.2}, min {:.2}, p50 {:.2}, p90 {:.2}, p99 {:.2}, max {:.2}",
        arrivals.len(),
        gaps[0],
        pct(0.5),
        pct(0.9),
        pct(0.99),
        gaps[gaps.len() - 1]
    );
}

/// One HTTP/1.1 request (`Connection: close`) with an optional body:
/// `(status, body)`.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String) {
    http_request_with(addr, method, path, body, "")
}

/// [`http_request`] with `extra` header lines (each ending in `\r\n`).
pub fn http_request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    extra: &str,
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("HTTP connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("HTTP request");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{method} {path}: no response head in {text:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, body.to_string())
}
