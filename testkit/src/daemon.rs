//! The one way to start the real `moshid serve`: [`DaemonBuilder`] spawns it
//! on an ephemeral loopback port, reads the addresses it prints on stdout
//! (`moshid listening on …`, `sip listening on udp …`, `audiosocket
//! listening on …`, `agent-check: …`) and hands back a [`Daemon`] that stops
//! it when dropped.
//!
//! Invariants: the child's stdout is drained by a thread for as long as it
//! lives (it never blocks on a full pipe), and every line is kept; its
//! stderr goes to a file (read by [`crate::records`] and failure messages)
//! or nowhere; starts are serialized within a process (the first writes the
//! shared demo checkpoint); a [`Daemon`] is stopped by its own PID when
//! dropped — SIGTERM and a grace period for tests, SIGKILL for tools.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::READY_TIMEOUT;

/// Daemon starts are serialized: the first one writes the shared demo
/// checkpoint, which concurrent first starts would race on.
static START_LOCK: Mutex<()> = Mutex::new(());

/// Held by tests that load the machine (real-time peers, many sessions),
/// so that within a test binary one runs at a time: the machine may have
/// two CPUs.
static HEAVY: Mutex<()> = Mutex::new(());

/// Runs the calling test alone among the binary's tests that call it too
/// (until the guard is dropped); a test that panicked does not poison it.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|p| p.into_inner())
}

/// What dropping a [`Daemon`] does.
#[derive(Debug, Clone, Copy)]
enum OnDrop {
    /// SIGTERM, then SIGKILL after the grace period.
    Terminate(Duration),
    /// SIGKILL at once.
    Kill,
}

/// Where the daemon's stderr goes.
#[derive(Debug, Clone)]
enum StderrTo {
    /// `stderr.log` in the daemon's temp folder.
    TempFile,
    /// A file of the caller's.
    File(PathBuf),
    /// Nowhere.
    Null,
}

/// How to start a `moshid serve`.
#[derive(Debug, Clone)]
pub struct DaemonBuilder {
    binary: PathBuf,
    temp_root: PathBuf,
    cache_dir: Option<PathBuf>,
    args: Vec<OsString>,
    config: Option<String>,
    env: Vec<(OsString, Option<OsString>)>,
    tls: Option<Arc<rustls::ClientConfig>>,
    wait_ready: bool,
    stderr: StderrTo,
    ready_timeout: Duration,
    on_drop: OnDrop,
}

impl DaemonBuilder {
    /// A daemon from `binary` as a tool starts it: the arguments given
    /// only (plus `--listen 127.0.0.1:0` when they have none), stderr
    /// discarded, ready once it says where it listens, killed when dropped.
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        DaemonBuilder {
            binary: binary.into(),
            temp_root: std::env::temp_dir(),
            cache_dir: None,
            args: Vec::new(),
            config: None,
            env: Vec::new(),
            tls: None,
            wait_ready: false,
            stderr: StderrTo::Null,
            ready_timeout: READY_TIMEOUT,
            on_drop: OnDrop::Kill,
        }
    }

    /// A daemon as a test starts it (see [`crate::daemon!`]): the demo
    /// checkpoint cached under `target_tmp` (shared by every test), stderr
    /// kept in the daemon's temp folder there, ready once `/ready` answers
    /// 200, stopped by SIGTERM (10 s grace) when dropped.
    pub fn for_tests(binary: &str, target_tmp: &str) -> Self {
        let tmp = Path::new(target_tmp);
        DaemonBuilder {
            temp_root: tmp.to_path_buf(),
            cache_dir: Some(tmp.join("moshid-e2e-demo-cache")),
            wait_ready: true,
            stderr: StderrTo::TempFile,
            on_drop: OnDrop::Terminate(Duration::from_secs(10)),
            ..Self::new(binary)
        }
    }

    /// Adds command-line arguments after `serve`.
    pub fn args<S: AsRef<std::ffi::OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// Writes `json` to a file in the daemon's temp folder and passes it as
    /// `--config`.
    pub fn config(mut self, json: &str) -> Self {
        self.config = Some(json.to_string());
        self
    }

    /// [`DaemonBuilder::config`] when `json` is given.
    pub fn config_opt(self, json: Option<&str>) -> Self {
        match json {
            Some(j) => self.config(j),
            None => self,
        }
    }

    /// Sets an environment variable of the daemon.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), Some(value.into())));
        self
    }

    /// Removes an environment variable of the daemon.
    pub fn env_remove(mut self, key: impl Into<OsString>) -> Self {
        self.env.push((key.into(), None));
        self
    }

    /// A daemon with built-in TLS (its config names the certificate): the
    /// helpers' requests trust `tls`, and its listening line says `https`.
    pub fn tls(mut self, tls: Arc<rustls::ClientConfig>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Whether the start waits for `/ready` to answer 200 after the
    /// listening line (a test that watches readiness itself says no).
    pub fn wait_ready(mut self, wait: bool) -> Self {
        self.wait_ready = wait;
        self
    }

    /// Writes stderr to `path` (or nowhere, with `None`).
    pub fn stderr_to(mut self, path: Option<&Path>) -> Self {
        self.stderr = match path {
            Some(p) => StderrTo::File(p.to_path_buf()),
            None => StderrTo::Null,
        };
        self
    }

    /// Bound on the whole start (listening line and `/ready`).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Starts the daemon; panics (with its stderr) when it does not start:
    /// what a test wants.
    pub fn start(self) -> Daemon {
        self.spawn().unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Starts the daemon; an error says why it did not start.
    pub fn spawn(self) -> Result<Daemon> {
        let dir = tempfile::Builder::new()
            .prefix("moshid-e2e-")
            .tempdir_in(&self.temp_root)
            .with_context(|| format!("creating a temp dir under {}", self.temp_root.display()))?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("serve");
        if !self
            .args
            .iter()
            .any(|a| a == "--listen" || a.to_string_lossy().starts_with("--listen="))
        {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        if let Some(cache) = &self.cache_dir {
            cmd.arg("--cache-dir").arg(cache);
        }
        if let Some(json) = &self.config {
            let path = dir.path().join("config.json");
            std::fs::write(&path, json).context("writing the config file")?;
            cmd.arg("--config").arg(path);
        }
        cmd.args(&self.args);
        for (k, v) in &self.env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        let stderr_path = match &self.stderr {
            StderrTo::TempFile => Some(dir.path().join("stderr.log")),
            StderrTo::File(p) => Some(p.clone()),
            StderrTo::Null => None,
        };
        match &stderr_path {
            Some(p) => {
                let f = File::create(p).with_context(|| format!("creating {}", p.display()))?;
                cmd.stderr(f)
            }
            None => cmd.stderr(Stdio::null()),
        };
        cmd.stdin(Stdio::null()).stdout(Stdio::piped());

        let _serialized = START_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {} serve", self.binary.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel::<String>();
        {
            let lines = lines.clone();
            thread::Builder::new()
                .name("moshid-stdout".into())
                .spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { break };
                        lines.lock().unwrap().push(line.clone());
                        let _ = tx.send(line);
                    }
                })?;
        }
        let mut daemon = Daemon {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            sip: None,
            audiosocket: None,
            stdout: lines,
            stderr_path,
            dir,
            tls: self.tls,
            on_drop: self.on_drop,
        };
        let deadline = Instant::now() + self.ready_timeout;
        let scheme = if daemon.tls.is_some() {
            "https"
        } else {
            "http"
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => match Listening::parse(&line, scheme)? {
                    Some(Listening::Chat(a)) => {
                        daemon.addr = a;
                        break;
                    }
                    Some(Listening::Sip(a)) => daemon.sip = Some(a),
                    Some(Listening::AudioSocket(a)) => daemon.audiosocket = Some(a),
                    Some(Listening::Agent(_)) | None => {}
                },
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = daemon.child.wait().ok();
                    bail!(
                        "moshid serve exited ({status:?}) before listening; stderr:\n{}",
                        daemon.stderr_tail()
                    );
                }
                Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                    "moshid serve did not say where it listens within {:?}; stderr:\n{}",
                    self.ready_timeout,
                    daemon.stderr_tail()
                ),
            }
        }
        if self.wait_ready {
            while daemon.try_http_get("/ready").map(|r| r.0) != Some(200) {
                if Instant::now() >= deadline {
                    bail!(
                        "/ready did not answer 200 within {:?}; stderr:\n{}",
                        self.ready_timeout,
                        daemon.stderr_tail()
                    );
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(daemon)
    }
}

/// An address line the daemon prints on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listening {
    /// `moshid listening on http://ADDR` (or `https://`): it is ready.
    Chat(SocketAddr),
    /// `sip listening on udp ADDR [tcp ADDR]` (the same address).
    Sip(SocketAddr),
    /// `audiosocket listening on ADDR`.
    AudioSocket(SocketAddr),
    /// `  agent-check:     ADDR (HAProxy agent-port)`.
    Agent(SocketAddr),
}

impl Listening {
    /// The address a stdout line gives, if it is one of those lines;
    /// `scheme` is `http` or `https`.
    pub fn parse(line: &str, scheme: &str) -> Result<Option<Listening>> {
        let line = line.trim();
        let addr = |a: &str| -> Result<SocketAddr> {
            let a = a.split_whitespace().next().unwrap_or("");
            let a = a.trim_end_matches('/');
            a.parse()
                .map_err(|e| anyhow!("bad address {a:?} in {line:?}: {e}"))
        };
        let chat = format!("moshid listening on {scheme}://");
        Ok(if let Some(a) = line.strip_prefix(chat.as_str()) {
            Some(Listening::Chat(addr(a)?))
        } else if let Some(a) = line.strip_prefix("sip listening on udp ") {
            Some(Listening::Sip(addr(a)?))
        } else if let Some(a) = line.strip_prefix("audiosocket listening on ") {
            Some(Listening::AudioSocket(addr(a)?))
        } else if let Some(a) = line.strip_prefix("agent-check:") {
            Some(Listening::Agent(addr(a)?))
        } else {
            None
        })
    }
}

/// A running `moshid serve`; dropping it stops the process.
pub struct Daemon {
    child: Child,
    /// The HTTP/WebSocket listener.
    pub addr: SocketAddr,
    /// The SIP endpoint's UDP address, when `sip.enabled`.
    pub sip: Option<SocketAddr>,
    /// The AudioSocket listener, when `audiosocket.enabled`.
    pub audiosocket: Option<SocketAddr>,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr_path: Option<PathBuf>,
    dir: tempfile::TempDir,
    /// For a daemon with built-in TLS: how the helpers' requests trust it.
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    on_drop: OnDrop,
}

impl Daemon {
    /// `ws://ADDR/api/chat?QUERY` (no `?` when the query is empty).
    pub fn chat_url(&self, query: &str) -> String {
        if query.is_empty() {
            format!("ws://{}/api/chat", self.addr)
        } else {
            format!("ws://{}/api/chat?{query}", self.addr)
        }
    }

    /// The HAProxy agent-check address (`listen.agent_address`), printed
    /// just after the listening line; fails after [`READY_TIMEOUT`].
    pub fn agent(&self) -> SocketAddr {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let found = self.stdout.lock().unwrap().iter().find_map(|l| {
                match Listening::parse(l, "http") {
                    Ok(Some(Listening::Agent(a))) => Some(a),
                    _ => None,
                }
            });
            if let Some(a) = found {
                return a;
            }
            assert!(
                Instant::now() < deadline,
                "no agent-check address on stdout: {:?}",
                self.stdout.lock().unwrap()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The whole stderr log ("" when it goes nowhere).
    pub fn stderr(&self) -> String {
        self.stderr_path
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// Waits (bounded by `timeout`) until stderr contains `needle`: for
    /// the prose lines people read (warnings, rate-limited summaries);
    /// facts are [`crate::records`], waited for by kind and field.
    pub fn wait_log_text(&self, needle: &str, timeout: Duration) {
        crate::wait::poll_until(
            &format!("{needle:?} in the log"),
            timeout,
            || self.stderr().contains(needle).then_some(()),
            || format!("stderr:\n{}", self.stderr_tail()),
        )
    }

    /// The last few kilobytes of the daemon's stderr (for failure messages).
    pub fn stderr_tail(&self) -> String {
        let text = self.stderr();
        let start = text.len().saturating_sub(6000);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }

    /// A temp folder that lives as long as the daemon.
    pub fn temp_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends the daemon a signal (`"HUP"`, `"TERM"`, …).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits (bounded by `timeout`) for the daemon to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for moshid") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "moshid did not exit within {timeout:?}; stderr:\n{}",
                self.stderr_tail()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the daemon with SIGTERM and returns its exit status (bounded:
    /// killed after 60 s).
    pub fn stop(mut self) -> ExitStatus {
        self.terminate(Duration::from_secs(60))
    }

    fn terminate(&mut self, grace: Duration) -> ExitStatus {
        if let Ok(Some(status)) = self.child.try_wait() {
            return status;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        self.child.wait().expect("waiting for the killed daemon")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if thread::panicking() && self.stderr_path.is_some() {
            eprintln!(
                "---- moshid serve stderr (tail) ----\n{}\n------------------------------------",
                self.stderr_tail()
            );
        }
        match self.on_drop {
            OnDrop::Terminate(grace) => {
                self.terminate(grace);
            }
            OnDrop::Kill => {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_lines() {
        let p = |l: &str, s: &str| Listening::parse(l, s).unwrap();
        let a: SocketAddr = "127.0.0.1:8998".parse().unwrap();
        assert_eq!(
            p("moshid listening on http://127.0.0.1:8998", "http"),
            Some(Listening::Chat(a))
        );
        assert_eq!(
            p("moshid listening on https://127.0.0.1:8998", "https"),
            Some(Listening::Chat(a))
        );
        assert_eq!(
            p("moshid listening on https://127.0.0.1:8998", "http"),
            None
        );
        assert_eq!(
            p(
                "sip listening on udp 127.0.0.1:8998 tcp 127.0.0.1:8998",
                "http"
            ),
            Some(Listening::Sip(a))
        );
        assert_eq!(
            p("audiosocket listening on 127.0.0.1:8998", "http"),
            Some(Listening::AudioSocket(a))
        );
        assert_eq!(
            p(
                "  agent-check:     127.0.0.1:8998 (HAProxy agent-port)",
                "http"
            ),
            Some(Listening::Agent(a))
        );
        assert_eq!(p("  in a browser:    http://127.0.0.1:8998/", "http"), None);
        assert!(Listening::parse("sip listening on udp nowhere", "http").is_err());
    }
}
