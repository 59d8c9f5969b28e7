//! End-to-end tests of `/api/chat`: the real `moshid serve` binary on an
//! ephemeral loopback port, real WebSocket clients sending real Ogg Opus.
//!
//! Sessions end by the daemon's idle timeout once their client stops
//! sending: that is the end that carries the final metadata message (a
//! client's WebSocket close ends a session without one).

use moshid::codec::{EncoderConfig, OggOpusEncoder};
use moshid_testkit::prelude::*;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::Message;

/// Sessions end 1.5 s after their last message. At most 4 frames in flight
/// per session (the engine's queue depth), so that no frame is ever dropped
/// whatever the machine's load: with the default 8, a frame can be dropped
/// when the engine falls behind (see `burst_is_backpressured_with_the_default_config`
/// in e2e_sessions.rs).
const CHAT_CONFIG: &str = r#"{"session": {"idle_timeout_ms": 1500, "max_frames_in_flight": 4}}"#;

#[test]
fn handshake_comes_first() {
    let daemon = daemon!().config(CHAT_CONFIG).start();
    let mut ws = connect_ws(daemon.addr, "seed=7");
    // Audio sent before reading anything must not overtake the handshake.
    let mut encoder = OggOpusEncoder::new(EncoderConfig::default()).unwrap();
    let mut buf = vec![0u8; 1 + encoder.max_output_bytes_per_frame()];
    for frame in signal(0, 3) {
        buf[0] = kind::AUDIO;
        let n = encoder.encode_frame(&frame, &mut buf[1..]).unwrap();
        ws.send(Message::Binary(buf[..1 + n].to_vec().into()))
            .unwrap();
    }
    let first = next_binary(&mut ws).expect("a first message");
    assert_eq!(
        first,
        [kind::HANDSHAKE],
        "the first message must be the bare handshake"
    );
    // The rest of the session: 2 answers for 3 frames, then the metadata.
    let deadline = Instant::now() + SESSION_END_TIMEOUT;
    let mut kinds = Vec::new();
    let mut metadata = None;
    while let Some(m) = next_binary(&mut ws) {
        assert_ne!(m[0], kind::HANDSHAKE, "a second handshake");
        kinds.push(m[0]);
        if m[0] == kind::METADATA {
            metadata = Some(serde_json::from_slice::<serde_json::Value>(&m[1..]).unwrap());
        }
        assert!(Instant::now() < deadline, "session did not end");
    }
    assert_eq!(
        kinds.iter().filter(|&&k| k == kind::AUDIO).count(),
        2,
        "{kinds:?}"
    );
    let meta = metadata.expect("metadata at the end");
    assert_eq!(meta["session"]["frames_in"], 3, "{meta}");
    daemon.wait_idle();
}

#[test]
fn concurrent_streams_are_batched_and_complete() {
    const STREAMS: usize = 8;
    const FRAMES: usize = 25;
    let daemon = daemon!().config(CHAT_CONFIG).start();
    let before = daemon.capacity();
    assert_eq!(before["engine"]["steps"], 0, "{before:#}");
    let addr = daemon.addr;
    // Every stream is admitted before any sends: their frames overlap.
    let logs: Vec<SessionLog> = start_together(
        STREAMS,
        move |i| ChatClient::start(addr, &format!("seed={}", 1000 + i)),
        |i, client| client.run(&signal(i as u32, FRAMES), Pace::RealTime),
    );
    for (i, log) in logs.iter().enumerate() {
        log.assert_complete(FRAMES, &format!("stream {i}"));
        assert!(!log.texts.is_empty(), "stream {i}: no text");
    }
    // Different seeds and inputs: not all streams said the same thing.
    assert!(
        logs.iter().any(|l| l.texts != logs[0].texts),
        "every stream produced the same text"
    );
    let cap = daemon.wait_idle();
    let engine = &cap["engine"];
    assert!(
        engine["multi_stream_steps"].as_u64().unwrap() > 0,
        "no step batched several streams: {cap:#}"
    );
    assert!(
        engine["max_batch"].as_u64().unwrap() >= 2,
        "max_batch < 2: {cap:#}"
    );
    assert_eq!(
        engine["frames_stepped"],
        (STREAMS * FRAMES) as u64,
        "{cap:#}"
    );
    assert_eq!(engine["dropped_frames"], 0, "{cap:#}");
    assert_eq!(engine["lost_outputs"], 0, "{cap:#}");
    assert_eq!(engine["faults"], 0, "{cap:#}");
    assert_eq!(cap["capacity"]["admitted_total"], STREAMS as u64, "{cap:#}");
    assert_eq!(cap["capacity"]["refused_total"], 0, "{cap:#}");
}

#[test]
fn a_stream_is_independent_of_its_batch_mates() {
    const SEED_QUERY: &str = "seed=4242&greedy=false";
    const FRAMES: usize = 25;
    let daemon = daemon!().config(CHAT_CONFIG).start();
    let addr = daemon.addr;

    // Alone.
    let alone = ChatClient::start(addr, SEED_QUERY).run(&signal(0, FRAMES), Pace::RealTime);
    alone.assert_complete(FRAMES, "alone");
    let cap = daemon.wait_idle();
    assert_eq!(
        cap["engine"]["multi_stream_steps"], 0,
        "the first run was not alone: {cap:#}"
    );

    // The same stream among five others (other seeds, inputs and
    // parameters), which are admitted first so that it gets another slot
    // and runs in batches with them from its first frame to its last.
    let others_params = [
        "seed=1",
        "seed=2&greedy=true",
        "seed=3&text_temperature=1.2&audio_topk=10",
        "seed=4&audio_temperature=0.3",
        "seed=5&text_topk=3",
    ];
    let (started_tx, started_rx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let others: Vec<_> = others_params
        .iter()
        .enumerate()
        .map(|(i, params)| {
            let started_tx = started_tx.clone();
            let stop = stop.clone();
            let params = params.to_string();
            thread::spawn(move || {
                let mut c = ChatClient::start(addr, &params);
                started_tx.send(()).unwrap();
                // Real-time frames until the target stream is done (bounded).
                let frames = signal(10 + i as u32, 200);
                let start = Instant::now();
                for (n, frame) in frames.iter().enumerate() {
                    c.receive_until(start + FRAME * n as u32);
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    c.send_frame(frame);
                }
                c.close();
            })
        })
        .collect();
    for _ in 0..others.len() {
        started_rx
            .recv_timeout(IO_TIMEOUT)
            .expect("other streams started");
    }
    let crowd = ChatClient::start(addr, SEED_QUERY).run(&signal(0, FRAMES), Pace::RealTime);
    stop.store(true, Ordering::Relaxed);
    for t in others {
        t.join().expect("other stream thread");
    }
    crowd.assert_complete(FRAMES, "among others");
    assert_ne!(
        crowd.session()["slot"],
        alone.session()["slot"],
        "the stream should have had another slot among others"
    );
    let cap = daemon.wait_idle();
    assert!(
        cap["engine"]["multi_stream_steps"].as_u64().unwrap() > 0
            && cap["engine"]["max_batch"].as_u64().unwrap() >= 2,
        "the streams were never stepped in one batch: {cap:#}"
    );
    assert_eq!(cap["engine"]["dropped_frames"], 0, "{cap:#}");
    // Streams start in one group and move to their phases' groups once
    // measured: the identity below holds across those moves.
    assert!(
        cap["capacity"]["group_moves"].as_u64().unwrap() > 0,
        "no stream moved group: {cap:#}"
    );

    assert_eq!(
        crowd.texts, alone.texts,
        "text differs when the stream shares batches"
    );
    assert!(
        crowd.audio_payloads == alone.audio_payloads,
        "Opus payloads differ when the stream shares batches"
    );
    let (a, c) = (alone.pcm(), crowd.pcm());
    assert_eq!(a.len(), c.len());
    let identical = a.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(identical, "decoded PCM is not bit-identical");
}

#[test]
fn admission_refuses_when_every_slot_is_held() {
    let daemon = daemon!()
        .args(["--max-slots", "2"])
        .config(CHAT_CONFIG)
        .start();
    let a = ChatClient::start(daemon.addr, "seed=1");
    let b = ChatClient::start(daemon.addr, "seed=2");
    match ChatClient::connect(daemon.addr, "seed=3") {
        Err(NotStarted::Refused(msg)) => {
            assert!(msg.contains("server full"), "refusal message: {msg:?}")
        }
        Err(other) => panic!("expected a refusal message, got {other:?}"),
        Ok(_) => panic!("a third session was admitted with --max-slots 2"),
    }
    let cap = daemon.capacity();
    assert_eq!(cap["capacity"]["max_slots"], 2, "{cap:#}");
    assert_eq!(cap["capacity"]["free_slots"], 0, "{cap:#}");
    assert_eq!(cap["capacity"]["active_sessions"], 2, "{cap:#}");
    assert!(
        cap["capacity"]["refused_total"].as_u64().unwrap() >= 1,
        "{cap:#}"
    );
    // The held sessions were not disturbed, and their slots come back; a
    // client's close is answered with a close frame (a clean close, not a
    // dropped connection).
    for (who, c) in [("a", a), ("b", b)] {
        let log = c.close();
        assert!(
            log.close_received,
            "{who}: no close reply: {}",
            log.summary()
        );
    }
    let cap = daemon.wait_idle();
    assert_eq!(cap["capacity"]["admitted_total"], 2, "{cap:#}");
    let c = ChatClient::start(daemon.addr, "seed=4");
    c.close();
    daemon.wait_idle();
}

#[test]
fn admission_refuses_a_stream_over_the_step_budget() {
    // 80 ms − 79.95 ms: a 0.05 ms budget, below any measured step time
    // (the demo model steps in about 0.47 ms in an optimised build).
    let daemon = daemon!()
        .config(r#"{"engine": {"budget_margin_ms": 79.95}}"#)
        .start();
    let cap = daemon.capacity();
    let group = &cap["capacity"]["groups"][0];
    assert!(
        group["predicted_step_ms_next"].as_f64().unwrap() > 0.05,
        "a step is predicted under 0.05 ms, the test cannot overload the budget: {cap:#}"
    );
    assert_eq!(group["admits_one_more"], false, "{cap:#}");
    assert_eq!(cap["capacity"]["admissible_sessions"], 0, "{cap:#}");
    match ChatClient::connect(daemon.addr, "") {
        Err(NotStarted::Refused(msg)) => assert!(
            msg.contains("server full") && msg.contains("budget"),
            "refusal message: {msg:?}"
        ),
        Err(other) => panic!("expected a refusal message, got {other:?}"),
        Ok(_) => panic!("a stream over the step budget was admitted"),
    }
    let cap = daemon.wait_idle();
    assert_eq!(cap["capacity"]["refused_total"], 1, "{cap:#}");
    assert_eq!(cap["capacity"]["admitted_total"], 0, "{cap:#}");
}

/// Each bad client concerns only its own session: a healthy session runs
/// through all of them and completes with every frame.
#[test]
fn bad_input_ends_only_the_offending_session() {
    const HEALTHY_FRAMES: usize = 60;
    let daemon = daemon!().config(r#"{"session": {"idle_timeout_ms": 1500, "max_frames_in_flight": 4, "max_message_bytes": 16384}}"#,).start();
    let addr = daemon.addr;
    let (first_audio_tx, first_audio_rx) = mpsc::channel();
    let healthy = thread::spawn(move || {
        let mut c = ChatClient::start(addr, "seed=99");
        let frames = signal(3, HEALTHY_FRAMES);
        let start = Instant::now();
        let mut told = false;
        for (n, frame) in frames.iter().enumerate() {
            c.receive_until(start + FRAME * n as u32);
            if !told && !c.log.audio_payloads.is_empty() {
                first_audio_tx.send(()).unwrap();
                told = true;
            }
            c.send_frame(frame);
        }
        c.wait_closed(SESSION_END_TIMEOUT);
        c.log
    });
    // The bad clients start once the healthy session is streaming.
    first_audio_rx
        .recv_timeout(IO_TIMEOUT)
        .expect("the healthy session's first answer");

    type Case = fn(std::net::SocketAddr);
    let cases: [(&str, Case); 6] = [
        ("bad capture pattern", bad_capture_pattern),
        ("corrupted CRC", corrupted_crc),
        ("oversized message", oversized_message),
        ("unknown kind", unknown_kind_is_ignored),
        ("text message", text_message),
        ("half a page then TCP drop", half_page_then_drop),
    ];
    let bad: Vec<_> = cases
        .iter()
        .map(|&(name, case)| (name, thread::spawn(move || case(addr))))
        .collect();
    for (name, t) in bad {
        // The thread's panic message is printed above.
        assert!(t.join().is_ok(), "bad-input case {name:?} failed");
    }
    let log = healthy.join().expect("healthy session");
    log.assert_complete(HEALTHY_FRAMES, "healthy session");

    let cap = daemon.wait_idle();
    assert_eq!(
        cap["capacity"]["admitted_total"],
        1 + cases.len() as u64,
        "{cap:#}"
    );
    assert_eq!(cap["engine"]["faults"], 0, "{cap:#}");
    assert_eq!(cap["engine"]["dropped_frames"], 0, "{cap:#}");
    // The daemon's own account of the sessions whose clients could not be
    // told (or might not have heard) why they ended.
    let ends = daemon.records(Record::SessionEnd, &[]);
    assert!(
        ends.iter().any(|r| r.str("reason") == "client_closed"),
        "the dropped connection's session end is not logged:\n{}",
        daemon.stderr()
    );
    assert!(
        ends.iter().any(|r| r.str("reason") == "protocol_error"
            && r.get("detail")
                .is_some_and(|d| d.starts_with("message too large"))),
        "the oversized message's session end is not logged:\n{}",
        daemon.stderr()
    );
}

/// A protocol error: metadata saying so, a 0x05 message naming the cause,
/// a close with code 1002.
fn assert_protocol_error(log: &SessionLog, expected: &str, who: &str) {
    assert!(log.closed, "{who}: not closed: {}", log.summary());
    assert_eq!(
        log.end_kind(),
        Some("protocol_error"),
        "{who}: {}",
        log.summary()
    );
    assert!(
        log.errors.iter().any(|e| e.contains(expected)),
        "{who}: no 0x05 message containing {expected:?}: {}",
        log.summary()
    );
    assert_eq!(
        log.close_frame.as_ref().map(|(c, _)| *c),
        Some(CloseCode::Protocol),
        "{who}: {}",
        log.summary()
    );
}

fn bad_capture_pattern(addr: std::net::SocketAddr) {
    let mut c = ChatClient::start(addr, "seed=11");
    let frames = signal(4, 2);
    c.send_frame(&frames[0]);
    let mut page = c.encode(&frames[1]);
    page[..4].copy_from_slice(b"OggX");
    let mut msg = vec![kind::AUDIO];
    msg.extend_from_slice(&page);
    c.send_raw(msg);
    c.wait_closed(SESSION_END_TIMEOUT);
    assert_protocol_error(&c.log, "capture pattern", "bad capture pattern");
    assert_eq!(c.log.session()["frames_in"], 1, "{}", c.log.summary());
}

fn corrupted_crc(addr: std::net::SocketAddr) {
    let mut c = ChatClient::start(addr, "seed=12");
    let frames = signal(5, 2);
    c.send_frame(&frames[0]);
    let mut pages = c.encode(&frames[1]);
    // Flip a bit of the last page's body: its CRC no longer matches.
    let last = pages.len() - 1;
    pages[last] ^= 0x01;
    let mut msg = vec![kind::AUDIO];
    msg.extend_from_slice(&pages);
    c.send_raw(msg);
    c.wait_closed(SESSION_END_TIMEOUT);
    assert_protocol_error(&c.log, "CRC", "corrupted CRC");
}

fn oversized_message(addr: std::net::SocketAddr) {
    let mut c = ChatClient::start(addr, "seed=13");
    c.send_frame(&signal(6, 1)[0]);
    let mut msg = vec![0u8; 40_000];
    msg[0] = kind::AUDIO;
    // The daemon may close before it has read the whole message.
    let _ = c.try_send(Message::Binary(msg.into()));
    c.wait_closed(SESSION_END_TIMEOUT);
    // When the daemon's last words arrive, they name the cause.
    if c.log.metadata.is_some() {
        assert_protocol_error(&c.log, "too large", "oversized message");
    }
}

fn unknown_kind_is_ignored(addr: std::net::SocketAddr) {
    const FRAMES: usize = 12;
    let mut c = ChatClient::start(addr, "seed=14");
    let frames = signal(7, FRAMES);
    c.send_frames(&frames[..5], Pace::RealTime);
    c.send_raw(vec![0x42, 1, 2, 3, 4]);
    c.send_raw(vec![0x42]);
    c.send_frames(&frames[5..], Pace::RealTime);
    c.wait_closed(SESSION_END_TIMEOUT);
    c.log.assert_complete(FRAMES, "unknown kind");
}

fn text_message(addr: std::net::SocketAddr) {
    let mut c = ChatClient::start(addr, "seed=15");
    c.send_frame(&signal(8, 1)[0]);
    c.send(Message::Text("hello".into()));
    c.wait_closed(SESSION_END_TIMEOUT);
    assert_protocol_error(&c.log, "text messages", "text message");
}

fn half_page_then_drop(addr: std::net::SocketAddr) {
    let mut c = ChatClient::start(addr, "seed=16");
    let frames = signal(9, 3);
    // Two whole frames (the second one is answered: the model's delay is one
    // frame), then half of the third's pages.
    c.send_frame(&frames[0]);
    c.send_frame(&frames[1]);
    let page = c.encode(&frames[2]);
    let mut msg = vec![kind::AUDIO];
    msg.extend_from_slice(&page[..page.len() / 2]);
    c.send_raw(msg);
    // Once the answer has come the session is surely past the whole frames;
    // drop the TCP connection mid-page.
    let deadline = Instant::now() + IO_TIMEOUT;
    while c.log.audio_payloads.is_empty() && !c.log.closed && Instant::now() < deadline {
        c.receive_until(Instant::now() + Duration::from_millis(50));
    }
    assert_eq!(c.log.audio_payloads.len(), 1, "{}", c.log.summary());
    assert!(!c.log.closed, "closed before the drop: {}", c.log.summary());
    c.drop_connection();
}

/// `0x03 0x01` (end of input): the daemon answers every frame in flight,
/// then sends the session's record with `input_finished` and closes — no
/// idle timeout, no error.
#[test]
fn end_of_input_is_answered_then_the_session_closes() {
    let daemon = daemon!().start();
    let mut client = ChatClient::start(daemon.addr, "seed=11");
    client.send_frames(&signal(4, 10), Pace::Burst);
    client.send_raw(vec![0x03, 0x01]);
    client.wait_closed(Duration::from_secs(30));
    let log = client.log;
    assert_eq!(log.end_kind(), Some("input_finished"), "{}", log.summary());
    assert!(log.errors.is_empty(), "{}", log.summary());
    let s = log.session();
    assert_eq!(s["frames_in"], 10, "{}", log.summary());
    // The model's delay of one frame: nine answers for ten frames.
    assert_eq!(s["frames_out"], 9, "{}", log.summary());
    assert_eq!(log.audio_pcm.len(), 9, "{}", log.summary());
    daemon.wait_idle();
}

/// A Hibiki-shaped model is drained at the end of input as the official
/// inference does: one end-of-stream frame, then silence until it ends its
/// text or `session.drain_max_frames` frames have gone.
#[test]
fn hibiki_is_drained_after_the_end_of_input() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/hibiki-tiny");
    let model = fixture.to_str().expect("UTF-8 path");
    let config = r#"{"session": {"drain_max_frames": 6, "idle_timeout_ms": 20000}}"#;
    let daemon = daemon!().args(["--model", model]).config(config).start();
    let mut client = ChatClient::start(daemon.addr, "seed=5");
    client.send_frames(&signal(1, 8), Pace::Burst);
    client.send_raw(vec![0x03, 0x01]);
    client.wait_closed(Duration::from_secs(60));
    let log = client.log;
    assert_eq!(log.end_kind(), Some("input_finished"), "{}", log.summary());
    let s = log.session();
    assert_eq!(s["frames_in"], 8, "{}", log.summary());
    // Hibiki's delay is 2 frames: the 8 input frames give 6 answers; the
    // end-of-stream frame and up to 6 silent frames give up to 7 more.
    let out = s["frames_out"].as_u64().expect("frames_out");
    assert!(
        (7..=13).contains(&out),
        "{out} frames out: {}",
        log.summary()
    );
    daemon.wait_idle();
}
