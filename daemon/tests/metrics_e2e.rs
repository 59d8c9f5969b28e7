//! Stage metrics on the real daemon: `moshid serve` on loopback, real
//! WebSocket sessions carrying real Ogg Opus, `GET /metrics` and
//! `POST /admin/metrics`.
//!
//! * Off (the default), 1,000 short unpaced sessions (1–3 frames each, 40 at
//!   a time): every session's final 0x04 metadata is complete, `/capacity`'s
//!   `session_state` is all zero afterwards, and no stage counter moved.
//! * On, the same: each stage's histogram count equals what went through
//!   (decode = audio messages, encode = send = output frames, frame_wait =
//!   frames stepped, model_step = batch_fill = engine steps).
//! * Switched on and off while sessions run: the stage counters start and
//!   stop moving; the sessions' results do not change.
//!
//! Nine sessions in ten end with the end-of-input message (0x03 0x01), the
//! tenth by the idle timeout; both send the session's metadata.
//! Every wait is bounded (socket timeouts, deadlines).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use moshid::codec::{EncoderConfig, OggOpusEncoder, FRAME_SAMPLES};
use serde_json::Value;
use tungstenite::Message;

const MAX_SLOTS: usize = 48;
const CLIENTS: usize = 40;
const SESSIONS_PER_PHASE: usize = 1000;
/// Long enough that the engine answers every frame first (a tick is 80 ms).
const IDLE_TIMEOUT_MS: u64 = 400;
const IO_TIMEOUT: Duration = Duration::from_secs(20);
const READY_TIMEOUT: Duration = Duration::from_secs(120);

use moshid::protocol::control::END_OF_INPUT;
use moshid::protocol::kind::{AUDIO, CONTROL, ERROR, HANDSHAKE, METADATA, TEXT};

/// The tests share two CPUs: one daemon under load at a time.
static SERIAL: Mutex<()> = Mutex::new(());

struct Daemon {
    child: Child,
    addr: SocketAddr,
    stderr_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(extra_args: &[&str], config_json: &str) -> Daemon {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = tempfile::Builder::new()
            .prefix("moshid-metrics-")
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
            .args(extra_args)
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
            stderr_path,
            _dir: dir,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("moshid did not start; stderr:\n{}", daemon.stderr()));
            if let Some(a) = line.trim().strip_prefix("moshid listening on http://") {
                daemon.addr = a.parse().unwrap();
                break;
            }
        }
        daemon
    }

    fn stderr(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// One HTTP request: `(status, body)`.
    fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = TcpStream::connect_timeout(&self.addr, IO_TIMEOUT).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("{method} {path}: no response in {text:?}"));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap();
        (status, body.to_string())
    }

    fn json(&self, method: &str, path: &str, body: &str) -> Value {
        let (status, text) = self.request(method, path, body);
        assert_eq!(status, 200, "{method} {path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    fn metrics(&self) -> Prom {
        let (status, text) = self.request("GET", "/metrics", "");
        assert_eq!(status, 200, "{text}");
        Prom::parse(&text)
    }

    fn set_metrics(&self, on: bool) {
        let v = self.json("POST", "/admin/metrics", &format!(r#"{{"enabled": {on}}}"#));
        assert_eq!(v["enabled"], on, "{v}");
    }

    /// Waits until no session holds anything; returns `/capacity`.
    fn wait_idle(&self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let cap = self.json("GET", "/capacity", "");
            let st = &cap["session_state"];
            let zero = |v: &Value| v.as_u64() == Some(0);
            let all_zero = |v: &Value| v.as_array().is_some_and(|a| a.iter().all(zero));
            if zero(&st["held_slots"])
                && zero(&st["pending_params"])
                && zero(&st["engine_open_slots"])
                && all_zero(&st["routed_per_core"])
                && all_zero(&st["pending_closes_per_core"])
                && zero(&cap["capacity"]["active_sessions"])
            {
                return cap;
            }
            assert!(
                Instant::now() < deadline,
                "not idle: {cap:#}\n{}",
                self.stderr()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("---- moshid stderr (tail) ----\n{}", self.stderr());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A parsed Prometheus text exposition: `(name, sorted labels) → value`.
#[derive(Debug, Clone, Default)]
struct Prom(BTreeMap<(String, Vec<(String, String)>), f64>);

impl Prom {
    fn parse(text: &str) -> Prom {
        let mut map = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {line:?}"));
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}').unwrap()),
                None => (series, ""),
            };
            let mut labels: Vec<(String, String)> = labels
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap();
                    (k.to_string(), v.trim_matches('"').to_string())
                })
                .collect();
            labels.sort();
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}"));
            map.insert((name.to_string(), labels), value);
        }
        Prom(map)
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut l: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        l.sort();
        *self
            .0
            .get(&(name.to_string(), l))
            .unwrap_or_else(|| panic!("no series {name}{labels:?} in /metrics"))
    }

    /// `moshid_stage_duration_seconds_count{stage, core}`.
    fn stage_count(&self, stage: &str, core: &str) -> u64 {
        self.get(
            "moshid_stage_duration_seconds_count",
            &[("stage", stage), ("core", core)],
        ) as u64
    }

    /// Every stage series (histogram counts and stage counters), for "did
    /// anything move" comparisons.
    fn stage_series(&self) -> BTreeMap<String, f64> {
        self.0
            .iter()
            .filter(|((name, _), _)| {
                name.starts_with("moshid_stage_duration_seconds_count")
                    || name.starts_with("moshid_stage_")
            })
            .filter(|((name, _), _)| !name.ends_with("_bucket"))
            .map(|((name, labels), v)| (format!("{name}{labels:?}"), *v))
            .collect()
    }

    fn counter(&self, name: &str) -> u64 {
        self.get(name, &[]) as u64
    }
}

/// The audio messages of a session of `k` frames (Ogg headers in the first).
fn session_messages() -> Vec<Vec<Vec<u8>>> {
    (1..=3)
        .map(|k| {
            let mut enc = OggOpusEncoder::new(EncoderConfig::default()).unwrap();
            let mut buf = vec![0u8; 1 + enc.max_output_bytes_per_frame()];
            (0..k)
                .map(|i| {
                    let mut frame = [0.0f32; FRAME_SAMPLES];
                    for (j, x) in frame.iter_mut().enumerate() {
                        let t = (i * FRAME_SAMPLES + j) as f32 / 24_000.0;
                        *x = 0.3 * (2.0 * std::f32::consts::PI * 330.0 * t).sin();
                    }
                    buf[0] = AUDIO;
                    let n = enc.encode_frame(&frame, &mut buf[1..]).unwrap();
                    buf[..1 + n].to_vec()
                })
                .collect()
        })
        .collect()
}

/// What one session's client saw.
#[derive(Debug, Default)]
struct Outcome {
    frames_sent: u64,
    audio: u64,
    texts: u64,
    metadata: Option<Value>,
    errors: Vec<String>,
    /// Whether the client said its input was over (0x03 0x01) rather than
    /// letting the idle timeout end the session.
    end_of_input: bool,
}

impl Outcome {
    /// The metadata is complete: ended as the client chose (end of input or
    /// idle timeout), one answer per frame after the model's one-frame
    /// delay, a token with each.
    fn check(&self, who: &str) {
        let out = self.frames_sent - 1;
        let s = &self
            .metadata
            .as_ref()
            .unwrap_or_else(|| panic!("{who}: no metadata: {self:?}"))["session"];
        let reason = if self.end_of_input {
            "input_finished"
        } else {
            "idle_timeout"
        };
        assert_eq!(s["end_reason"]["kind"], reason, "{who}: {s}");
        assert_eq!(s["frames_in"], self.frames_sent, "{who}: {s}");
        assert_eq!(s["frames_out"], out, "{who}: {s}");
        assert_eq!(s["text_tokens"], out, "{who}: {s}");
        assert_eq!(s["frames_dropped"], 0, "{who}: {s}");
        assert_eq!(self.audio, out, "{who}: audio messages: {self:?}");
        assert!(self.texts <= out, "{who}: {self:?}");
    }
}

/// One session: connect (`None` when refused: the daemon is full), send
/// every message at once, read until the daemon closes.
fn run_session(addr: SocketAddr, messages: &[Vec<u8>], end_of_input: bool) -> Option<Outcome> {
    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT).unwrap();
    stream.set_nodelay(true).unwrap();
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    let (mut ws, _) =
        tungstenite::client(format!("ws://{addr}/api/chat"), stream).expect("upgrade");
    match ws.read() {
        Ok(Message::Binary(b)) if b[..] == [HANDSHAKE] => {}
        Ok(Message::Binary(b)) if b.first() == Some(&ERROR) => return None,
        other => panic!("expected the handshake, got {other:?}"),
    }
    let mut o = Outcome::default();
    for m in messages {
        ws.send(Message::Binary(m.clone().into()))
            .expect("sending audio");
        o.frames_sent += 1;
    }
    if end_of_input {
        ws.send(Message::Binary(vec![CONTROL, END_OF_INPUT].into()))
            .expect("sending end of input");
        o.end_of_input = true;
    }
    loop {
        match ws.read() {
            Ok(Message::Binary(b)) => match b.first() {
                Some(&AUDIO) => o.audio += 1,
                Some(&TEXT) => o.texts += 1,
                Some(&METADATA) => {
                    o.metadata = Some(serde_json::from_slice(&b[1..]).expect("metadata JSON"))
                }
                Some(&ERROR) => o.errors.push(String::from_utf8_lossy(&b[1..]).into_owned()),
                _ => {}
            },
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                panic!("session did not end within {IO_TIMEOUT:?}: {o:?}")
            }
            Err(_) => return Some(o),
        }
    }
}

/// What a batch of sessions added up to.
#[derive(Debug, Default)]
struct Phase {
    sessions: u64,
    refused: u64,
    frames_in: u64,
    frames_out: u64,
}

/// Runs `n` sessions (session `i` sends `1 + i % 3` frames), `CLIENTS` at a
/// time, unpaced; a refused session is retried after 100 ms (the daemon is
/// full: its slots, or its step-time budget on a busy machine). Checks every
/// session.
fn run_sessions(addr: SocketAddr, n: usize, msgs: &Arc<Vec<Vec<Vec<u8>>>>) -> Phase {
    run_sessions_until(addr, n, msgs, Arc::new(AtomicBool::new(false)))
}

/// [`run_sessions`], starting no new session once `stop` is set.
fn run_sessions_until(
    addr: SocketAddr,
    n: usize,
    msgs: &Arc<Vec<Vec<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
) -> Phase {
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (next, msgs, stop) = (next.clone(), msgs.clone(), stop.clone());
            thread::spawn(move || {
                let mut p = Phase::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n || stop.load(Ordering::Relaxed) {
                        return p;
                    }
                    let k = 1 + i % 3;
                    let o = loop {
                        // Most sessions end with the end-of-input message;
                        // every tenth by the idle timeout.
                        match run_session(addr, &msgs[k - 1], i % 10 != 9) {
                            Some(o) => break o,
                            None => {
                                p.refused += 1;
                                thread::sleep(Duration::from_millis(100));
                            }
                        }
                    };
                    o.check(&format!("session {i} ({k} frames)"));
                    p.sessions += 1;
                    p.frames_in += k as u64;
                    p.frames_out += k as u64 - 1;
                }
            })
        })
        .collect();
    let mut total = Phase::default();
    for w in workers {
        let p = w.join().expect("a session failed");
        total.sessions += p.sessions;
        total.refused += p.refused;
        total.frames_in += p.frames_in;
        total.frames_out += p.frames_out;
    }
    total
}

const STAGES: [&str; 6] = [
    "decode",
    "frame_wait",
    "batch_fill",
    "model_step",
    "encode",
    "send",
];

#[test]
fn sessions_are_complete_with_metrics_off_on_and_switched_while_running() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let started = Instant::now();
    let config = format!(
        r#"{{"model": {{"max_slots": {MAX_SLOTS}}}, "session": {{"idle_timeout_ms": {IDLE_TIMEOUT_MS}}}}}"#
    );
    let d = Daemon::start(&[], &config);
    let msgs = Arc::new(session_messages());
    assert_eq!(
        d.json("GET", "/admin/metrics", "")["enabled"],
        false,
        "off by default"
    );

    // --- Off: nothing recorded, sessions complete, nothing left behind.
    let before = d.metrics();
    assert_eq!(before.counter("moshid_metrics_enabled"), 0);
    let a = run_sessions(d.addr, SESSIONS_PER_PHASE, &msgs);
    let cap = d.wait_idle();
    let off = d.metrics();
    assert_eq!(
        off.stage_series(),
        before.stage_series(),
        "stage counters moved with metrics off"
    );
    for stage in STAGES {
        assert_eq!(off.stage_count(stage, "all"), 0, "{stage}");
    }
    // The always-on series counted the traffic anyway.
    assert_eq!(off.counter("moshid_sessions_admitted_total"), a.sessions);
    assert_eq!(off.counter("moshid_sessions_refused_total"), a.refused);
    assert_eq!(
        off.counter("moshid_engine_frames_stepped_total"),
        a.frames_in
    );
    assert!(off.counter("moshid_engine_steps_total") > 0);
    assert_eq!(off.get("moshid_active_sessions", &[]), 0.0);
    assert_eq!(off.get("moshid_free_slots", &[]), MAX_SLOTS as f64);
    assert_eq!(cap["capacity"]["admitted_total"], a.sessions);
    let time_off = started.elapsed();

    // --- On: every stage counts exactly what went through.
    d.set_metrics(true);
    let t_on = Instant::now();
    let b = run_sessions(d.addr, SESSIONS_PER_PHASE, &msgs);
    d.wait_idle();
    let time_on = t_on.elapsed();
    let on = d.metrics();
    assert_eq!(on.counter("moshid_metrics_enabled"), 1);
    let steps = on.counter("moshid_engine_steps_total") - off.counter("moshid_engine_steps_total");
    let stepped = on.counter("moshid_engine_frames_stepped_total")
        - off.counter("moshid_engine_frames_stepped_total");
    assert_eq!(stepped, b.frames_in);
    // One core: its series and the aggregate agree.
    for core in ["0", "all"] {
        assert_eq!(
            on.stage_count("decode", core),
            b.frames_in,
            "one audio message per frame"
        );
        assert_eq!(on.stage_count("encode", core), b.frames_out);
        assert_eq!(on.stage_count("send", core), b.frames_out);
    }
    for core in ["engine", "all"] {
        assert_eq!(on.stage_count("frame_wait", core), stepped);
        assert_eq!(on.stage_count("batch_fill", core), steps);
    }
    assert_eq!(on.stage_count("model_step", "all"), steps);
    let per_batch: f64 =
        on.0.iter()
            .filter(|((name, labels), _)| {
                name == "moshid_stage_duration_seconds_count"
                    && labels.contains(&("core".to_string(), "engine".to_string()))
                    && labels.contains(&("stage".to_string(), "model_step".to_string()))
            })
            .map(|(_, v)| *v)
            .sum();
    assert_eq!(
        per_batch as u64, steps,
        "model_step per group and batch size adds up to the steps"
    );
    assert_eq!(
        on.get("moshid_stage_frames_total", &[("core", "0")]) as u64,
        b.frames_in
    );
    assert_eq!(
        on.get("moshid_stage_frames_total", &[("core", "engine")]) as u64,
        stepped
    );
    assert_eq!(
        on.get("moshid_stage_refused_sessions_total", &[("core", "0")]) as u64,
        b.refused
    );
    let inf = on.get(
        "moshid_stage_duration_seconds_bucket",
        &[("stage", "frame_wait"), ("core", "engine"), ("le", "+Inf")],
    );
    assert_eq!(inf as u64, stepped);
    // A frame waits at most a few ticks for its batch (80 ms each).
    let wait_s = on.get(
        "moshid_stage_duration_seconds_sum",
        &[("stage", "frame_wait"), ("core", "all")],
    );
    assert!(
        wait_s / stepped as f64 <= 0.5,
        "mean frame_wait {} s",
        wait_s / stepped as f64
    );

    // --- Switched while sessions run: counters start and stop moving; the
    // sessions' results are unchanged (each is checked by run_sessions).
    d.set_metrics(false);
    thread::sleep(Duration::from_millis(300));
    let stop = Arc::new(AtomicBool::new(false));
    let background = {
        let (stop, msgs, addr) = (stop.clone(), msgs.clone(), d.addr);
        thread::spawn(move || run_sessions_until(addr, usize::MAX, &msgs, stop))
    };
    thread::sleep(Duration::from_millis(700));
    let s0 = d.metrics();
    thread::sleep(Duration::from_millis(500));
    let s1 = d.metrics();
    assert_eq!(
        s1.stage_series(),
        s0.stage_series(),
        "stage counters moved while off"
    );
    assert!(s1.counter("moshid_engine_steps_total") > s0.counter("moshid_engine_steps_total"));
    d.set_metrics(true);
    thread::sleep(Duration::from_millis(700));
    let s2 = d.metrics();
    thread::sleep(Duration::from_millis(500));
    let s3 = d.metrics();
    for (stage, core) in [
        ("decode", "0"),
        ("model_step", "all"),
        ("frame_wait", "engine"),
        ("batch_fill", "engine"),
    ] {
        assert!(
            s2.stage_count(stage, core) > s1.stage_count(stage, core),
            "{stage} did not start moving"
        );
        assert!(
            s3.stage_count(stage, core) > s2.stage_count(stage, core),
            "{stage} stopped moving while on"
        );
    }
    d.set_metrics(false);
    // Let a tick or message batch that read the switch before it changed finish.
    thread::sleep(Duration::from_millis(300));
    let s4 = d.metrics();
    thread::sleep(Duration::from_millis(700));
    let s5 = d.metrics();
    assert_eq!(
        s5.stage_series(),
        s4.stage_series(),
        "stage counters moved after the switch went off"
    );
    assert!(s5.counter("moshid_engine_steps_total") > s4.counter("moshid_engine_steps_total"));
    stop.store(true, Ordering::Relaxed);
    let c = background
        .join()
        .expect("a session failed while the switch changed");
    d.wait_idle();
    let end = d.metrics();
    assert_eq!(
        end.counter("moshid_sessions_admitted_total"),
        a.sessions + b.sessions + c.sessions,
        "every session admitted once"
    );
    eprintln!(
        "metrics_e2e: {} sessions off in {:.1} s, {} on in {:.1} s, {} switched; {} refusals retried; total {:.1} s",
        a.sessions,
        time_off.as_secs_f64(),
        b.sessions,
        time_on.as_secs_f64(),
        c.sessions,
        a.refused + b.refused + c.refused,
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn flag_turns_metrics_on_and_the_admin_endpoint_is_strict() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // --metrics on a config whose run-time switch is locked.
    let d = Daemon::start(
        &["--metrics"],
        r#"{"metrics": {"runtime_switch": false}, "session": {"idle_timeout_ms": 300}}"#,
    );
    let state = d.json("GET", "/admin/metrics", "");
    assert_eq!(
        (
            state["enabled"].as_bool(),
            state["runtime_switch"].as_bool()
        ),
        (Some(true), Some(false))
    );
    assert_eq!(
        d.request("POST", "/admin/metrics", r#"{"enabled": false}"#)
            .0,
        403
    );
    let msgs = session_messages();
    run_session(d.addr, &msgs[2], false)
        .expect("admitted")
        .check("flagged session");
    d.wait_idle();
    let m = d.metrics();
    assert_eq!(m.counter("moshid_metrics_enabled"), 1);
    assert_eq!(m.stage_count("decode", "0"), 3);
    assert_eq!(m.stage_count("encode", "0"), 2);
    assert_eq!(m.stage_count("frame_wait", "engine"), 3);
    drop(d);

    // Default config: the switch takes exactly {"enabled": bool}.
    let d = Daemon::start(&[], r#"{"session": {"idle_timeout_ms": 300}}"#);
    for bad in [
        "",
        "{}",
        r#"{"enabled": "yes"}"#,
        r#"{"enabled": true, "extra": 1}"#,
    ] {
        let (status, body) = d.request("POST", "/admin/metrics", bad);
        assert_eq!(status, 400, "{bad:?}: {body}");
    }
    assert_eq!(d.request("DELETE", "/admin/metrics", "").0, 405);
    assert_eq!(d.request("POST", "/metrics", "").0, 405);
    assert_eq!(d.json("GET", "/admin/metrics", "")["enabled"], false);
    let v = d.json("POST", "/admin/metrics", r#"{"enabled": true}"#);
    assert_eq!(
        (v["enabled"].as_bool(), v["previous"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(d.metrics().counter("moshid_metrics_enabled"), 1);
}
