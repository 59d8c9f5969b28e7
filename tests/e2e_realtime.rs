//! The OpenAI Realtime endpoints against the real daemon on loopback.
//!
//! * Clients nobody here wrote, unmodified, in Python
//!   (`tests/interop/`): the official `openai` package's
//!   `realtime.connect` converses with the demo model (session update, 6 s
//!   of audio in real time, audio and transcript deltas while it is sent,
//!   `response.cancel` honoured, a refused field and an unsupported event
//!   answered with `error` while the session goes on) and its
//!   `realtime.translations.connect` translates with the tiny Hibiki
//!   fixture and the fixtures' tiny tokenizer (deltas while the audio is sent, `session.close` drains the
//!   model and ends with `session.closed` and the record); Pipecat's
//!   `OpenAIRealtimeLLMService` holds a conversation in a headless
//!   pipeline. A missing package fails its test unless `MOSHID_SKIP` names
//!   it (`openai`, `pipecat`); `scripts/setup --tests` installs them in
//!   `.cache/test-venv`.
//! * A blocking tungstenite client for what no SDK sends: every kind of
//!   malformed input ends only its own session, with an `error` event
//!   before the close, while a healthy session streams on; a model on the
//!   wrong endpoint is refused; the token, as a bearer header or as the
//!   browsers' subprotocol; G.711 sessions; a client sending faster than
//!   real time is slowed, not buffered, and loses no frame.

use base64::Engine;
use moshid_testkit::peers::{need_python_package, python};
use moshid_testkit::prelude::*;
use moshid_testkit::{daemon::one_at_a_time, records::LogRecord};
use serde_json::{json, Value};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tungstenite::client::IntoClientRequest;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
/// Bytes of one 80 ms frame of PCM16 at 24 kHz.
const FRAME_BYTES: usize = 3840;

/// The tiny Hibiki fixture with the fixtures' tiny tokenizer beside it (the
/// fixture alone has none, and a model without one shows no text).
fn hibiki_with_tokenizer() -> tempfile::TempDir {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden");
    let dir = tempfile::Builder::new()
        .prefix("hibiki-tiny-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a temp dir");
    for entry in std::fs::read_dir(golden.join("hibiki-tiny")).expect("the hibiki-tiny fixture") {
        let entry = entry.unwrap();
        std::os::unix::fs::symlink(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let tokenizer = golden.join("tokenizer_tiny.model");
    std::os::unix::fs::symlink(tokenizer, dir.path().join("tokenizer.model")).unwrap();
    dir
}

// ---- the Python peers ------------------------------------------------------

/// Runs `tests/interop/SCRIPT ARGS…` and returns its `SUMMARY` JSON.
fn run_script(daemon: &Daemon, script: &str, args: &[&str]) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/interop")
        .join(script);
    let out = Command::new(python())
        .arg(&path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary = stdout.lines().find_map(|l| l.strip_prefix("SUMMARY "));
    match (out.status.success(), summary) {
        (true, Some(s)) => serde_json::from_str(s).expect("the summary is JSON"),
        _ => panic!(
            "{script} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}\ndaemon:\n{}",
            out.status,
            daemon.stderr_tail()
        ),
    }
}

/// The `session end` record of the session with transport `transport`.
fn session_end(daemon: &Daemon, transport: &str) -> LogRecord {
    daemon.wait_record(Record::SessionEnd, &[("transport", transport)])
}

#[test]
fn the_openai_sdk_converses() {
    if !need_python_package("openai", "openai") {
        return;
    }
    let _serial = one_at_a_time();
    let daemon = daemon!()
        .config(r#"{"realtime": {"responses": "continuous"}}"#)
        .start();
    let model = daemon.get_json("/v1/model")["model"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let addr = daemon.addr.to_string();
    let s = run_script(
        &daemon,
        "openai_realtime.py",
        &["conversation", &addr, &model, "none"],
    );
    let said = s.to_string();
    assert_eq!(s["first"], "session.created", "{said}");
    assert_eq!(s["session_type"], "realtime", "{said}");
    assert_eq!(s["model"], model.as_str(), "{said}");
    assert_eq!(s["kinds"]["session.updated"], 1, "{said}");
    // The refused field and the unsupported event, each named.
    let errors = s["errors"].as_array().unwrap();
    assert!(
        errors.iter().any(|e| e["param"] == "session.instructions"),
        "{said}"
    );
    assert!(
        errors.iter().any(|e| e["code"] == "unsupported_event"
            && e["message"]
                .as_str()
                .unwrap()
                .contains("conversation.item.retrieve")),
        "{said}"
    );
    // Audio and text as the audio was sent, and on after the errors.
    assert!(s["audio_frames"].as_f64().unwrap() >= 60.0, "{said}");
    assert!(
        s["audio_frames_before_last_append"].as_f64().unwrap() >= 40.0,
        "{said}"
    );
    assert!(
        s["audio_frames_after_errors"].as_f64().unwrap() >= 40.0,
        "{said}"
    );
    assert!(s["transcript_deltas"].as_u64().unwrap() >= 1, "{said}");
    assert!(
        s["kinds"]["input_audio_buffer.speech_started"]
            .as_u64()
            .unwrap_or(0)
            >= 1,
        "{said}"
    );
    // response.cancel: that response ended cancelled by the client, and no
    // audio of it came after.
    let cancelled = s["cancelled"].as_str().expect("a response was in progress");
    assert_eq!(s["responses"][cancelled]["status"], "cancelled", "{said}");
    assert_eq!(
        s["responses"][cancelled]["reason"], "client_cancelled",
        "{said}"
    );
    assert_eq!(s["deltas_after_cancel"], 0, "{said}");
    let end = session_end(&daemon, "realtime");
    assert_eq!(end.u64("frames_in"), 75, "{end}");
    assert_eq!(end.u64("dropped"), 0, "{end}");
}

#[test]
fn the_openai_sdk_translates_with_hibiki() {
    if !need_python_package("openai", "openai") {
        return;
    }
    let _serial = one_at_a_time();
    let config = r#"{"session": {"drain_max_frames": 6}}"#;
    let model_dir = hibiki_with_tokenizer();
    let daemon = daemon!()
        .args(["--model", model_dir.path().to_str().unwrap()])
        .config(config)
        .start();
    let model = daemon.get_json("/v1/model")["model"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    // The conversation endpoint refuses a translation model.
    let mut ws = RawClient::connect(daemon.addr, "/v1/realtime", &[]);
    let e = ws.next_event();
    assert_eq!(
        (e["type"].as_str(), e["error"]["code"].as_str()),
        (Some("error"), Some("model_not_supported")),
        "{e}"
    );
    ws.expect_close(CloseCode::Policy);

    let addr = daemon.addr.to_string();
    let s = run_script(
        &daemon,
        "openai_realtime.py",
        &["translation", &addr, &model, "none"],
    );
    let said = s.to_string();
    assert_eq!(s["first"], "session.created", "{said}");
    assert_eq!(s["session_type"], "translation", "{said}");
    assert_eq!(s["language"], "en", "{said}");
    let errors = s["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{said}");
    assert_eq!(errors[0]["code"], "unsupported_language", "{said}");
    assert!(
        errors[0]["message"].as_str().unwrap().contains("`en`"),
        "{said}"
    );
    assert_eq!(s["kinds"]["session.updated"], 1, "{said}");
    // Audio (one delta per frame, 80 ms apart) and text while the audio was sent.
    assert!(s["audio_frames"].as_f64().unwrap() >= 60.0, "{said}");
    assert!(
        s["audio_frames_before_last_append"].as_f64().unwrap() >= 40.0,
        "{said}"
    );
    assert_eq!(s["elapsed_ms_steps"], json!([80]), "{said}");
    assert!(s["transcript_deltas"].as_u64().unwrap() >= 1, "{said}");
    // session.close: the drain, then session.closed with the record, last.
    assert_eq!(s["last"], "session.closed", "{said}");
    let record = &s["record"]["session"];
    assert_eq!(record["frames_in"], 75, "{said}");
    assert_eq!(record["end_reason"]["kind"], "input_finished", "{said}");
    assert!(record["frames_out"].as_u64().unwrap() >= 74, "{said}");
    let end = session_end(&daemon, "realtime_translation");
    assert_eq!(end.str("reason"), "input_finished", "{end}");
}

#[test]
fn pipecat_holds_a_conversation() {
    if !need_python_package("pipecat", "pipecat.services.openai.realtime.llm") {
        return;
    }
    let _serial = one_at_a_time();
    let daemon = daemon!().start();
    let model = daemon.get_json("/v1/model")["model"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let addr = daemon.addr.to_string();
    let s = run_script(&daemon, "pipecat_realtime.py", &[&addr, &model, "none"]);
    let said = s.to_string();
    assert_eq!(s["errors"], json!([]), "{said}");
    assert!(s["user_started"].as_u64().unwrap() >= 2, "{said}");
    assert!(s["user_stopped"].as_u64().unwrap() >= 1, "{said}");
    assert!(s["responses_started"].as_u64().unwrap() >= 1, "{said}");
    assert!(s["bot_audio_frames"].as_f64().unwrap() >= 10.0, "{said}");
    assert!(!s["bot_text"].as_str().unwrap().is_empty(), "{said}");
    let end = session_end(&daemon, "realtime");
    assert_eq!(end.u64("dropped"), 0, "{end}");
}

// ---- a raw client ----------------------------------------------------------

struct RawClient {
    ws: WebSocket<TcpStream>,
    subprotocol: Option<String>,
}

impl RawClient {
    fn try_connect(
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<RawClient, tungstenite::Error> {
        let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT).unwrap();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        let mut req = format!("ws://{addr}{path}").into_client_request().unwrap();
        for (n, v) in headers {
            let name = tungstenite::http::HeaderName::from_bytes(n.as_bytes()).unwrap();
            req.headers_mut().insert(name, v.parse().unwrap());
        }
        let (ws, response) = tungstenite::client(req, stream).map_err(|e| match e {
            tungstenite::HandshakeError::Failure(e) => e,
            tungstenite::HandshakeError::Interrupted(_) => panic!("a blocking handshake"),
        })?;
        let subprotocol = response
            .headers()
            .get("sec-websocket-protocol")
            .map(|v| v.to_str().unwrap().to_string());
        Ok(RawClient { ws, subprotocol })
    }

    fn connect(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> RawClient {
        Self::try_connect(addr, path, headers).unwrap_or_else(|e| panic!("upgrade of {path}: {e}"))
    }

    fn send(&mut self, v: Value) {
        self.ws.send(Message::Text(v.to_string().into())).unwrap();
    }

    fn append(&mut self, pcm: &[u8]) {
        self.send(json!({"type": "input_audio_buffer.append", "audio": B64.encode(pcm)}));
    }

    /// The next JSON event (panics on a close or a timeout).
    fn next_event(&mut self) -> Value {
        loop {
            match self.ws.read().unwrap() {
                Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap(),
                Message::Close(c) => panic!("closed before an event: {c:?}"),
                _ => {}
            }
        }
    }

    /// Events until one of type `kind` (returned with those before it).
    fn until(&mut self, kind: &str) -> (Value, Vec<Value>) {
        let mut seen = Vec::new();
        loop {
            let e = self.next_event();
            if e["type"] == kind {
                return (e, seen);
            }
            seen.push(e);
        }
    }

    /// Reads until the server's close frame, which must carry `code`.
    fn expect_close(&mut self, code: CloseCode) {
        loop {
            match self.ws.read() {
                Ok(Message::Close(Some(c))) => {
                    assert_eq!(c.code, code, "{c:?}");
                    return;
                }
                Ok(Message::Close(None)) => panic!("a close without its code"),
                Ok(_) => {}
                Err(e) => panic!("no close frame: {e}"),
            }
        }
    }
}

/// `frames` frames of the kit's test tone, PCM16 at 24 kHz.
fn tone_pcm16(frames: usize) -> Vec<u8> {
    tone(24_000, 0, frames * FRAME_BYTES / 2)
        .into_iter()
        .flat_map(i16::to_le_bytes)
        .collect()
}

#[test]
fn bad_input_ends_only_its_own_session_with_an_error_first() {
    let _serial = one_at_a_time();
    let config = r#"{"realtime": {"max_event_bytes": 65536, "responses": "continuous"}, "session": {"idle_timeout_ms": 20000}}"#;
    let daemon = daemon!().config(config).start();
    let mut healthy = RawClient::connect(daemon.addr, "/v1/realtime?responses=continuous", &[]);
    let created = healthy.next_event();
    assert_eq!(created["type"], "session.created", "{created}");
    let audio = tone_pcm16(1);
    let start = Instant::now();
    let mut sent = 0;
    let mut pace = |c: &mut RawClient| {
        // Keep the healthy session fed in real time between the others.
        while (sent as f64) * 0.08 < start.elapsed().as_secs_f64() {
            c.append(&audio);
            sent += 1;
        }
    };
    let bad: Vec<(Message, &str)> = vec![
        (Message::Text("not json".into()), "invalid_event"),
        (
            Message::Text(r#"{"type":"input_audio_buffer.append","audio":"%%%%"}"#.into()),
            "invalid_audio",
        ),
        (
            Message::Text(r#"{"type":"input_audio_buffer.append","audio":"AA=="}"#.into()),
            "invalid_audio",
        ),
        (
            Message::Text(r#"{"type":"input_audio_buffer.append","audio":5}"#.into()),
            "invalid_event",
        ),
        (
            Message::Text(r#"{"type":"input_audio_buffer.append"}"#.into()),
            "invalid_event",
        ),
        (Message::Text(r#"{"no_type":1}"#.into()), "invalid_event"),
        (Message::Binary(vec![1, 2, 3].into()), "invalid_event"),
        (
            Message::Text(format!(r#"{{"type":"x","pad":"{}"}}"#, "a".repeat(70_000)).into()),
            "event_too_large",
        ),
    ];
    for (msg, code) in bad {
        pace(&mut healthy);
        // The engine frees an ended session's slot on its next tick: wait
        // for it rather than race it (the demo model has 8 slots).
        daemon.wait_capacity("a free slot", |c| {
            c["capacity"]["free_slots"].as_u64().unwrap_or(0) > 0
        });
        let mut c = RawClient::connect(daemon.addr, "/v1/realtime", &[]);
        let created = c.next_event();
        assert_eq!(created["type"], "session.created", "{created}");
        c.ws.send(msg).unwrap();
        let e = c.next_event();
        assert_eq!(
            (e["type"].as_str(), e["error"]["code"].as_str()),
            (Some("error"), Some(code)),
            "{e}"
        );
        c.expect_close(CloseCode::Protocol);
    }
    // Refused, not malformed: an error, and the session goes on.
    let mut c = RawClient::connect(daemon.addr, "/v1/realtime", &[]);
    c.next_event();
    c.send(json!({"type": "output_audio_buffer.clear", "event_id": "mine"}));
    let e = c.next_event();
    assert_eq!(e["error"]["code"], "unsupported_event", "{e}");
    assert_eq!(e["error"]["event_id"], "mine", "{e}");
    c.send(json!({"type": "response.cancel"}));
    assert_eq!(
        c.next_event()["error"]["code"],
        "response_cancel_not_active"
    );
    c.append(&tone_pcm16(2));
    c.send(json!({"type": "input_audio_buffer.commit"}));
    let (committed, _) = c.until("input_audio_buffer.committed");
    assert!(
        committed["item_id"].as_str().unwrap().starts_with("item_"),
        "{committed}"
    );
    drop(c);
    // The healthy session streamed on throughout.
    while start.elapsed() < Duration::from_secs(4) {
        pace(&mut healthy);
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut frames = 0;
    while frames < 30 {
        let e = healthy.next_event();
        if e["type"] == "response.output_audio.delta" {
            frames += 1;
        }
    }
    healthy.ws.close(None).unwrap();
    // The translation endpoint refuses a conversation model.
    let mut t = RawClient::connect(daemon.addr, "/v1/realtime/translations", &[]);
    assert_eq!(t.next_event()["error"]["code"], "model_not_supported");
    t.expect_close(CloseCode::Policy);
    daemon.wait_idle();
}

#[test]
fn the_token_as_a_bearer_header_or_the_browsers_subprotocol() {
    let _serial = one_at_a_time();
    let daemon = daemon!()
        .config(r#"{"listen": {"token": "s3cret"}}"#)
        .start();
    let path = "/v1/realtime?model=anything";
    let refused = RawClient::try_connect(daemon.addr, path, &[]);
    assert!(
        matches!(refused, Err(tungstenite::Error::Http(ref r)) if r.status() == 401),
        "{:?}",
        refused.err()
    );
    let wrong = RawClient::try_connect(
        daemon.addr,
        path,
        &[(
            "Sec-WebSocket-Protocol",
            "realtime, openai-insecure-api-key.nope",
        )],
    );
    assert!(matches!(wrong, Err(tungstenite::Error::Http(ref r)) if r.status() == 401));
    let mut bearer = RawClient::connect(daemon.addr, path, &[("Authorization", "Bearer s3cret")]);
    assert_eq!(bearer.next_event()["type"], "session.created");
    assert_eq!(bearer.subprotocol, None);
    let mut browser = RawClient::connect(
        daemon.addr,
        path,
        &[(
            "Sec-WebSocket-Protocol",
            "realtime, openai-insecure-api-key.s3cret",
        )],
    );
    assert_eq!(browser.subprotocol.as_deref(), Some("realtime"));
    let created = browser.next_event();
    assert_eq!(created["session"]["type"], "realtime", "{created}");
}

#[test]
fn g711_and_a_client_faster_than_real_time() {
    let _serial = one_at_a_time();
    let config =
        r#"{"realtime": {"responses": "continuous"}, "session": {"idle_timeout_ms": 20000}}"#;
    let daemon = daemon!().config(config).start();
    // G.711 μ-law both ways: 80 ms of 8 kHz audio is 640 bytes.
    let mut c = RawClient::connect(daemon.addr, "/v1/realtime", &[]);
    c.next_event();
    let fmt = json!({"type": "audio/pcmu"});
    c.send(json!({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"format": fmt}, "output": {"format": fmt}}}}));
    let (updated, _) = c.until("session.updated");
    assert_eq!(
        updated["session"]["audio"]["output"]["format"]["type"],
        "audio/pcmu"
    );
    let ulaw = vec![0xffu8; 640 * 10];
    c.send(json!({"type": "input_audio_buffer.append", "audio": B64.encode(&ulaw)}));
    let (delta, _) = c.until("response.output_audio.delta");
    assert_eq!(
        B64.decode(delta["delta"].as_str().unwrap()).unwrap().len(),
        640
    );
    c.ws.close(None).unwrap();
    drop(c);
    // 6 s of audio at once, in 1 s appends: the session takes it as the
    // engine answers (the rest waits in the socket), and every frame is
    // heard and answered.
    let mut fast = RawClient::connect(daemon.addr, "/v1/realtime", &[]);
    fast.next_event();
    let second = tone_pcm16(13)[..48_000].to_vec();
    let t0 = Instant::now();
    for _ in 0..6 {
        fast.append(&second);
    }
    let written_in = t0.elapsed();
    let mut bytes = 0;
    while bytes < 70 * FRAME_BYTES {
        let e = fast.next_event();
        if e["type"] == "response.output_audio.delta" {
            bytes += B64.decode(e["delta"].as_str().unwrap()).unwrap().len();
        }
    }
    println!(
        "6 s of audio written in {written_in:?}; 70 frames answered after {:?}",
        t0.elapsed()
    );
    fast.ws.close(None).unwrap();
    let ends = daemon.wait_records(Record::SessionEnd, &[("transport", "realtime")], 2);
    assert_eq!(ends[1].u64("frames_in"), 75, "{}", ends[1]);
    assert_eq!(ends[1].u64("dropped"), 0, "{}", ends[1]);
    daemon.wait_idle();
}
