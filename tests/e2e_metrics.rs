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

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use moshid::codec::{EncoderConfig, OggOpusEncoder, FRAME_SAMPLES};
use moshid_testkit::chat::kind::AUDIO;
use moshid_testkit::daemon::one_at_a_time;
use moshid_testkit::metrics::Prom;
use moshid_testkit::prelude::*;
use serde_json::Value;

const MAX_SLOTS: usize = 48;
const CLIENTS: usize = 40;
const SESSIONS_PER_PHASE: usize = 1000;
/// Long enough that the engine answers every frame first (a tick is 80 ms).
const IDLE_TIMEOUT_MS: u64 = 400;

/// Switches the stage metrics with `POST /admin/metrics`.
fn set_metrics(d: &Daemon, on: bool) {
    let v = d.json("POST", "/admin/metrics", &format!(r#"{{"enabled": {on}}}"#));
    assert_eq!(v["enabled"], on, "{v}");
}

/// Waits until the engine has stepped `more` times since `from`; returns
/// that read of `/metrics`.
fn after_steps(d: &Daemon, from: &Prom, more: u64) -> Prom {
    let steps = from.counter("moshid_engine_steps_total");
    d.wait_metrics(&format!("{more} engine steps"), |m| {
        m.counter("moshid_engine_steps_total") >= steps + more
    })
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
    let mut c = match ChatClient::connect(addr, "") {
        Ok(c) => c,
        Err(NotStarted::Refused(_)) => return None,
        Err(e) => panic!("expected the handshake, got {e:?}"),
    };
    let mut o = Outcome::default();
    for m in messages {
        c.send_raw(m.clone());
        o.frames_sent += 1;
    }
    if end_of_input {
        c.send_end_of_input();
        o.end_of_input = true;
    }
    c.wait_closed(IO_TIMEOUT);
    o.audio = c.log.audio_payloads.len() as u64;
    o.texts = c.log.texts.len() as u64;
    o.metadata = c.log.metadata.take();
    o.errors = std::mem::take(&mut c.log.errors);
    Some(o)
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
    let _serial = one_at_a_time();
    let started = Instant::now();
    let config = format!(
        r#"{{"model": {{"max_slots": {MAX_SLOTS}}}, "session": {{"idle_timeout_ms": {IDLE_TIMEOUT_MS}}}}}"#
    );
    let d = daemon!().config(&config).start();
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
    set_metrics(&d, true);
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
    // Each window below is counted in engine steps (one per group and
    // tick), not in wall time: the sessions run, so the engine steps.
    set_metrics(&d, false);
    let stop = Arc::new(AtomicBool::new(false));
    let background = {
        let (stop, msgs, addr) = (stop.clone(), msgs.clone(), d.addr);
        thread::spawn(move || run_sessions_until(addr, usize::MAX, &msgs, stop))
    };
    let s0 = after_steps(&d, &d.metrics(), 8);
    let s1 = after_steps(&d, &s0, 6);
    assert_eq!(
        s1.stage_series(),
        s0.stage_series(),
        "stage counters moved while off"
    );
    assert!(s1.counter("moshid_engine_steps_total") > s0.counter("moshid_engine_steps_total"));
    set_metrics(&d, true);
    let moving = [
        ("decode", "0"),
        ("model_step", "all"),
        ("frame_wait", "engine"),
        ("batch_fill", "engine"),
    ];
    let moved = |from: &Prom, to: &Prom| {
        moving
            .iter()
            .all(|&(stage, core)| to.stage_count(stage, core) > from.stage_count(stage, core))
    };
    // The counters start moving (bounded: a stage that never does fails
    // the wait), then keep moving while on.
    let s2 = d.wait_metrics("every stage to start moving", |m| moved(&s1, m));
    let s3 = d.wait_metrics("every stage to keep moving", |m| moved(&s2, m));
    for (stage, core) in moving {
        assert!(
            s2.stage_count(stage, core) > s1.stage_count(stage, core),
            "{stage} did not start moving"
        );
        assert!(
            s3.stage_count(stage, core) > s2.stage_count(stage, core),
            "{stage} stopped moving while on"
        );
    }
    set_metrics(&d, false);
    // A tick or message batch that read the switch before it changed has
    // finished once the engine has stepped twice more.
    let s4 = after_steps(&d, &d.metrics(), 2);
    let s5 = after_steps(&d, &s4, 8);
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
        "e2e_metrics: {} sessions off in {:.1} s, {} on in {:.1} s, {} switched; {} refusals retried; total {:.1} s",
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
    let _serial = one_at_a_time();
    // --metrics on a config whose run-time switch is locked.
    let d = daemon!()
        .args(["--metrics"])
        .config(r#"{"metrics": {"runtime_switch": false}, "session": {"idle_timeout_ms": 300}}"#)
        .start();
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
    let d = daemon!()
        .config(r#"{"session": {"idle_timeout_ms": 300}}"#)
        .start();
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
