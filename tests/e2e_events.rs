//! Live session events against the real daemon on loopback:
//!
//! * A WebSocket chat session is followed on `GET /v1/sessions/{id}/events`
//!   from before its first frame (the id comes with the upgrade): the SSE
//!   stream carries exactly the text pieces the client received, in order,
//!   and its `end` record counts them all and holds the whole text. Its
//!   webhook never answers: the session still ends and closes, while the
//!   delivery is still pending (`moshid_webhook_pending` 1), and the calls
//!   that follow run while it hangs.
//! * An RTP call (PCMU and RFC 4733 from this test) is followed the same
//!   way: `waiting` → `active`, its DTMF digit, every text piece of its
//!   record; its webhook receives the same final record. With metrics on,
//!   its decode / encode / send stages count its released frames, 80 ms of
//!   sent packets and packets.
//! * A Media Streams call is followed by its `streamSid`; its stages count
//!   its `media` events in and out.
//! * Bad subscriptions: no bearer token where one is configured (401),
//!   unknown id (404), ended session (410), one subscriber too many (429),
//!   wrong method (405).
//!
//! About 10 s per daemon on two cores (most of it real-time audio).

use base64::Engine;
use moshid::codec::{EncoderConfig, OggOpusEncoder, FRAME_SAMPLES};
use moshid_testkit::daemon::one_at_a_time;
use moshid_testkit::prelude::*;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use tungstenite::Message;

/// One SSE message: `(event, id, data)`.
type SseEvent = (String, Option<u64>, Value);

/// Follows `/v1/sessions/{key}/events` until `end` (or the stream closes)
/// on a thread; the status line is checked first.
fn follow(addr: SocketAddr, key: &str) -> thread::JoinHandle<Vec<SseEvent>> {
    follow_with(addr, key, "")
}

/// [`follow`] with `extra` header lines (each ending in `\r\n`).
fn follow_with(addr: SocketAddr, key: &str, extra: &str) -> thread::JoinHandle<Vec<SseEvent>> {
    let mut s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    write!(
        s,
        "GET /v1/sessions/{key}/events HTTP/1.1\r\nHost: {addr}\r\n{extra}Accept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    assert!(
        status.starts_with("HTTP/1.1 200"),
        "subscribing to {key}: {status}"
    );
    thread::spawn(move || {
        let mut line = String::new();
        // The rest of the head.
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
        }
        let mut events = Vec::new();
        let (mut event, mut id, mut data) = (String::new(), None, String::new());
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return events;
            }
            let l = line.trim_end_matches('\n');
            if let Some(v) = l.strip_prefix("event: ") {
                event = v.to_string();
            } else if let Some(v) = l.strip_prefix("id: ") {
                id = Some(v.parse().unwrap());
            } else if let Some(v) = l.strip_prefix("data: ") {
                data = v.to_string();
            } else if l.is_empty() && !event.is_empty() {
                let value = serde_json::from_str(&data)
                    .unwrap_or_else(|e| panic!("event {event}: data is not JSON ({e}): {data}"));
                let done = event == "end";
                events.push((std::mem::take(&mut event), id.take(), value));
                if done {
                    return events;
                }
            }
        }
    })
}

fn of_kind<'a>(events: &'a [SseEvent], kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|(e, _, _)| e == kind)
        .map(|(_, _, d)| d)
        .collect()
}

/// The `end` record of a followed session.
fn end_record(events: &[SseEvent]) -> &Value {
    let (kind, _, record) = events.last().expect("no event");
    assert_eq!(
        kind, "end",
        "the stream did not end with its record: {events:?}"
    );
    record
}

/// A webhook receiver: `answer` `Some(status)` answers each request and
/// hands its body over; `None` reads the request and never answers.
fn webhook_receiver(answer: Option<u16>) -> (SocketAddr, mpsc::Receiver<String>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 65536];
            let body = loop {
                let n = s.read(&mut buf).unwrap_or(0);
                if n == 0 {
                    break None;
                }
                req.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&req).into_owned();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if body.len() >= len {
                        break Some(body.to_string());
                    }
                }
            };
            let Some(body) = body else { continue };
            match answer {
                Some(status) => {
                    let _ = write!(s, "HTTP/1.1 {status} OK\r\nContent-Length: 0\r\n\r\n");
                }
                // Never answers: the connection stays open until the test ends.
                None => held.push(s),
            }
            let _ = tx.send(body);
        }
    });
    (addr, rx)
}

/// `name{labels}` in a Prometheus page (0 when absent).
fn sample(page: &str, name_and_labels: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn stage_count(page: &str, stage: &str) -> u64 {
    sample(
        page,
        &format!("moshid_stage_duration_seconds_count{{stage=\"{stage}\",core=\"0\"}}"),
    ) as u64
}

fn metrics(d: &Daemon) -> String {
    let (status, page) = http_request(d.addr, "GET", "/metrics", None);
    assert_eq!(status, 200);
    page
}

/// A test tone, 80 ms frames at 24 kHz.
fn tone_frames(n: usize) -> Vec<[f32; FRAME_SAMPLES]> {
    (0..n)
        .map(|i| {
            std::array::from_fn(|j| {
                let t = (i * FRAME_SAMPLES + j) as f32 / 24_000.0;
                0.3 * (2.0 * std::f32::consts::PI * 330.0 * t).sin()
            })
        })
        .collect()
}

/// What the chat client got: text pieces and the final metadata.
struct ChatOutcome {
    texts: Vec<String>,
    metadata: Value,
}

/// Opens `/api/chat?query` and reads the handshake (sent once the session
/// holds its slot and is an event source); returns the socket and its
/// session id (the upgrade's `Moshid-Session-Id`).
fn chat_connect(addr: SocketAddr, query: &str) -> (tungstenite::WebSocket<TcpStream>, String) {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let (ws, response) =
        tungstenite::client(format!("ws://{addr}/api/chat?{query}"), s).expect("WebSocket upgrade");
    let id = response
        .headers()
        .get("moshid-session-id")
        .expect("the upgrade names the session")
        .to_str()
        .unwrap()
        .to_string();
    let mut ws = ws;
    assert_eq!(
        ws.read().unwrap(),
        Message::Binary(vec![0x00].into()),
        "handshake"
    );
    (ws, id)
}

/// Sends `frames` in real time, then the end of input, and reads to the close.
fn chat_run(
    mut ws: tungstenite::WebSocket<TcpStream>,
    frames: &[[f32; FRAME_SAMPLES]],
) -> ChatOutcome {
    let mut enc = OggOpusEncoder::new(EncoderConfig::default()).unwrap();
    let mut buf = vec![0u8; 1 + enc.max_output_bytes_per_frame()];
    let mut out = ChatOutcome {
        texts: Vec::new(),
        metadata: Value::Null,
    };
    let mut closed = false;
    let on = |msg: Message, out: &mut ChatOutcome| match msg {
        Message::Binary(b) if b.first() == Some(&0x02) => {
            out.texts.push(String::from_utf8(b[1..].to_vec()).unwrap())
        }
        Message::Binary(b) if b.first() == Some(&0x04) => {
            out.metadata = serde_json::from_slice(&b[1..]).unwrap()
        }
        _ => {}
    };
    let start = Instant::now();
    for (i, f) in frames.iter().enumerate() {
        let n = enc.encode_frame(f, &mut buf[1..]).unwrap();
        buf[0] = 0x01;
        ws.send(Message::Binary(buf[..1 + n].to_vec().into()))
            .unwrap();
        let due = start + Duration::from_millis(80) * (i as u32 + 1);
        while let Some(left) = due.checked_duration_since(Instant::now()) {
            ws.get_ref()
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            match ws.read() {
                Ok(m) => on(m, &mut out),
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => panic!("chat: {e}"),
            }
        }
    }
    ws.send(Message::Binary(vec![0x03, 0x01].into())).unwrap();
    ws.get_ref().set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    while !closed {
        match ws.read() {
            Ok(Message::Close(_)) => closed = true,
            Ok(m) => on(m, &mut out),
            Err(_) => closed = true,
        }
    }
    out
}

/// A PCMU RTP packet of a tone (and the next sequence number / timestamp).
fn pcmu_packet(seq: u16, ts: u32) -> Vec<u8> {
    let mut p = vec![0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34];
    p[2..4].copy_from_slice(&seq.to_be_bytes());
    p[4..8].copy_from_slice(&ts.to_be_bytes());
    for i in 0..160u32 {
        let x = (2.0 * std::f32::consts::PI * 300.0 * ts.wrapping_add(i) as f32 / 8000.0).sin();
        p.push(moshid_telephony::g711::linear_to_ulaw(
            moshid_telephony::g711::f32_to_i16(0.3 * x),
        ));
    }
    p
}

/// An RFC 4733 packet of `event` on payload type 101.
fn dtmf_packet(seq: u16, event_ts: u32, event: u8, end: bool, duration: u16) -> Vec<u8> {
    let mut p = vec![0x80, 101, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34];
    p[2..4].copy_from_slice(&seq.to_be_bytes());
    p[4..8].copy_from_slice(&event_ts.to_be_bytes());
    p.extend_from_slice(&[event, ((end as u8) << 7) | 10]);
    p.extend_from_slice(&duration.to_be_bytes());
    p
}

/// Checks the SSE view of a session against its final record: every text
/// piece once, in frame order, and the record's text is theirs.
fn check_texts(who: &str, events: &[SseEvent]) -> Vec<String> {
    let record = end_record(events);
    let texts: Vec<String> = of_kind(events, "text")
        .iter()
        .map(|t| t["text"].as_str().unwrap().to_string())
        .collect();
    let frames: Vec<u64> = of_kind(events, "text")
        .iter()
        .map(|t| t["frame"].as_u64().unwrap())
        .collect();
    assert!(
        frames.windows(2).all(|w| w[0] < w[1]),
        "{who}: frames {frames:?}"
    );
    assert_eq!(
        record["text_pieces"].as_u64(),
        Some(texts.len() as u64),
        "{who}: the record counts {} pieces, the stream carried {}",
        record["text_pieces"],
        texts.len()
    );
    assert_eq!(
        record["text"].as_str(),
        Some(texts.concat().as_str()),
        "{who}"
    );
    assert_eq!(of_kind(events, "lost").len(), 0, "{who}: lost events");
    // Ids count the session's events from 1 (the state, text and DTMF ones).
    let ids: Vec<u64> = events.iter().filter_map(|(_, id, _)| *id).collect();
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "{who}: ids {ids:?}"
    );
    texts
}

#[test]
fn sse_and_webhooks_follow_chat_rtp_and_media_stream_calls() {
    let _serial = one_at_a_time();
    let (dead_hook, dead_rx) = webhook_receiver(None);
    let (live_hook, live_rx) = webhook_receiver(Some(204));
    let d = daemon!()
        .config(
            r#"{"session": {"idle_timeout_ms": 5000},
            "rtp": {"inactivity_timeout_ms": 5000},
            "metrics": {"enabled": true},
            "events": {"session_webhook_prefixes": ["http://127.0.0.1:"],
                       "webhook_timeout_ms": 60000, "webhook_retries": 0, "poll_ms": 10}}"#,
        )
        .start();

    // --- WebSocket chat, followed from its upgrade; its webhook never answers.
    let (ws, id) = chat_connect(
        d.addr,
        &format!("seed=7&webhook_url=http://{dead_hook}/never"),
    );
    let sse = follow(d.addr, &id);
    let chat = chat_run(ws, &tone_frames(30));
    let events = sse.join().unwrap();
    let (kind, _, hello) = &events[0];
    assert_eq!(
        (kind.as_str(), hello["transport"].as_str()),
        ("session", Some("ws"))
    );
    assert_eq!(hello["id"].as_str(), Some(id.as_str()));
    let texts = check_texts("chat", &events);
    assert_eq!(
        texts, chat.texts,
        "SSE text pieces differ from the client's"
    );
    let record = end_record(&events);
    assert_eq!(record["session"]["id"].to_string(), id);
    assert_eq!(
        record["session"]["frames_out"], chat.metadata["session"]["frames_out"],
        "{record}"
    );
    assert_eq!(record["session"]["end_reason"]["kind"], "input_finished");
    assert_eq!(
        of_kind(&events, "state")
            .iter()
            .map(|s| s["state"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["draining"]
    );
    println!(
        "chat: {} frames out, {} text pieces followed, {} events",
        record["session"]["frames_out"],
        texts.len(),
        events.len()
    );
    // The dead webhook got the record and holds the delivery open: the
    // session ended and closed anyway.
    let body: Value = serde_json::from_str(&dead_rx.recv_timeout(IO_TIMEOUT).unwrap()).unwrap();
    assert_eq!(body["session"]["id"].to_string(), id);
    assert_eq!(sample(&metrics(&d), "moshid_webhook_pending"), 1.0);

    // --- RTP call while that delivery hangs.
    let before = metrics(&d);
    let body = serde_json::json!({"codec": "PCMU", "dtmf_payload_type": 101,
        "webhook_url": format!("http://{live_hook}/rtp")});
    let (status, created) =
        http_request(d.addr, "POST", "/v1/rtp/sessions", Some(&body.to_string()));
    assert_eq!(status, 201, "{created}");
    let created: Value = serde_json::from_str(&created).unwrap();
    let rtp_id = created["id"].as_str().unwrap().to_string();
    assert_eq!(
        created["event_stream"].as_str(),
        Some(format!("/v1/sessions/{rtp_id}/events").as_str())
    );
    let sse = follow(d.addr, &rtp_id);
    let to: SocketAddr = format!("127.0.0.1:{}", created["port"]).parse().unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(1)))
        .unwrap();
    let start = Instant::now();
    let (mut received, mut buf) = (0u32, [0u8; 2048]);
    let (mut seq, mut ts) = (100u16, 8000u32);
    for n in 0..150u32 {
        let p = if (60..64).contains(&n) {
            // Digit 5: three updates and the end, one timestamp.
            dtmf_packet(seq, 8000 + 60 * 160, 5, n == 63, (n - 59) as u16 * 160)
        } else {
            pcmu_packet(seq, ts)
        };
        udp.send_to(&p, to).unwrap();
        seq = seq.wrapping_add(1);
        ts = ts.wrapping_add(160);
        let due = start + Duration::from_millis(20) * (n + 1);
        while Instant::now() < due {
            if udp.recv_from(&mut buf).is_ok() {
                received += 1;
            }
        }
    }
    let (status, ended) = http_request(
        d.addr,
        "DELETE",
        &format!("/v1/rtp/sessions/{rtp_id}"),
        None,
    );
    assert_eq!(status, 200, "{ended}");
    let ended: Value = serde_json::from_str(&ended).unwrap();
    let events = sse.join().unwrap();
    assert_eq!(events[0].2["state"], "waiting");
    let states: Vec<&str> = of_kind(&events, "state")
        .iter()
        .map(|s| s["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, vec!["active"]);
    let digits: Vec<&str> = of_kind(&events, "dtmf")
        .iter()
        .map(|s| s["digit"].as_str().unwrap())
        .collect();
    assert_eq!(digits, vec!["5"]);
    let texts = check_texts("rtp", &events);
    let record = end_record(&events);
    assert_eq!(record["dtmf"], "5");
    assert_eq!(record["session"], ended["session"]["record"]);
    let c = &ended["session"]["counters"];
    println!(
        "rtp: {received} packets received in 3 s while the chat's webhook hangs; {} frames out, {} text pieces followed",
        record["session"]["frames_out"],
        texts.len()
    );
    // Paced at 20 ms from the first packet on: about 150 in 3 s, webhook or not.
    assert!(received >= 100, "only {received} RTP packets came back");
    let hook: Value = serde_json::from_str(&live_rx.recv_timeout(IO_TIMEOUT).unwrap()).unwrap();
    assert_eq!(
        &hook, record,
        "the webhook's record differs from the stream's"
    );
    // Stages of this call alone (the chat had ended).
    let after = metrics(&d);
    let delta = |stage| stage_count(&after, stage) - stage_count(&before, stage);
    assert_eq!(delta("decode"), c["release_ticks"].as_u64().unwrap());
    assert_eq!(delta("send"), c["packets_sent"].as_u64().unwrap());
    assert_eq!(delta("encode"), c["packets_sent"].as_u64().unwrap() / 4);

    // --- Media Streams, followed by its streamSid.
    let before = metrics(&d);
    let s = TcpStream::connect_timeout(&d.addr, IO_TIMEOUT).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let (mut ws, _) = tungstenite::client(format!("ws://{}/v1/media-stream", d.addr), s).unwrap();
    let sid = "MZevents0000000000000000000000001";
    let send = |ws: &mut tungstenite::WebSocket<TcpStream>, v: Value| {
        ws.send(Message::Text(v.to_string().into())).unwrap()
    };
    send(
        &mut ws,
        serde_json::json!({"event": "connected", "protocol": "Call", "version": "1.0.0"}),
    );
    send(
        &mut ws,
        serde_json::json!({"event": "start", "sequenceNumber": "1", "streamSid": sid,
        "start": {"streamSid": sid, "callSid": "CA1", "tracks": ["inbound"],
                  "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                  "customParameters": {"seed": "3"}}}),
    );
    let deadline = Instant::now() + IO_TIMEOUT;
    let sse = loop {
        let (status, list) = http_request(d.addr, "GET", "/v1/sessions", None);
        assert_eq!(status, 200);
        if list.contains(sid) {
            break follow(d.addr, sid);
        }
        assert!(
            Instant::now() < deadline,
            "the stream never registered: {list}"
        );
        thread::sleep(Duration::from_millis(10));
    };
    let payload = base64::engine::general_purpose::STANDARD.encode([0x55u8; 160]);
    ws.get_ref()
        .set_read_timeout(Some(Duration::from_millis(1)))
        .unwrap();
    let (start, mut media_out) = (Instant::now(), 0u64);
    for n in 0..100u32 {
        send(
            &mut ws,
            serde_json::json!({"event": "media", "streamSid": sid,
            "media": {"track": "inbound", "chunk": (n + 1).to_string(),
                      "timestamp": (n * 20).to_string(), "payload": payload}}),
        );
        if n == 50 {
            send(
                &mut ws,
                serde_json::json!({"event": "dtmf", "streamSid": sid,
                "dtmf": {"track": "inbound_track", "digit": "7"}}),
            );
        }
        let due = start + Duration::from_millis(20) * (n + 1);
        while Instant::now() < due {
            if let Ok(Message::Text(t)) = ws.read() {
                media_out += t.contains("\"media\"") as u64;
            }
        }
    }
    send(
        &mut ws,
        serde_json::json!({"event": "stop", "streamSid": sid}),
    );
    ws.get_ref().set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    while let Ok(m) = ws.read() {
        if let Message::Text(t) = m {
            media_out += t.contains("\"media\"") as u64;
        }
    }
    let events = sse.join().unwrap();
    assert_eq!(events[0].2["alias"], sid);
    check_texts("media stream", &events);
    let record = end_record(&events);
    assert_eq!(record["dtmf"], "7");
    let after = metrics(&d);
    let delta = |stage| stage_count(&after, stage) - stage_count(&before, stage);
    assert_eq!(delta("decode"), 100, "one decode sample per media event");
    assert_eq!(
        delta("encode"),
        record["session"]["frames_out"].as_u64().unwrap()
    );
    assert_eq!(
        delta("send"),
        media_out,
        "one send sample per media event sent"
    );

    // Every table emptied; the chat's delivery is still hanging.
    let (_, cap) = http_request(d.addr, "GET", "/capacity", None);
    let cap: Value = serde_json::from_str(&cap).unwrap();
    assert_eq!(cap["events"]["live_sessions"], 0, "{cap}");
    assert_eq!(cap["events"]["aliases"], 0, "{cap}");
    assert_eq!(cap["events"]["subscribers"], 0, "{cap}");
    assert_eq!(cap["events"]["webhook_pending"], 1, "{cap}");
    let page = metrics(&d);
    assert_eq!(
        sample(
            &page,
            "moshid_webhook_deliveries_total{result=\"delivered\"}"
        ),
        1.0
    );
    assert_eq!(sample(&page, "moshid_events_lost_total"), 0.0);
}

#[test]
fn bad_subscriptions_get_clear_errors() {
    let _serial = one_at_a_time();
    let d = daemon!()
        .config(
            r#"{"rtp": {"inactivity_timeout_ms": 5000}, "listen": {"token": "s3cret"},
            "events": {"max_subscribers_per_session": 1}}"#,
        )
        .start();
    const AUTH: &str = "Authorization: Bearer s3cret\r\n";
    let req = |method: &str, path: &str, body: Option<&str>| {
        http_request_with(d.addr, method, path, body, AUTH)
    };
    let get = |path: &str| {
        let (status, body) = req("GET", path, None);
        let j: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        (status, j["error"].as_str().unwrap_or("").to_string())
    };
    // The listener's rules: the bearer token where one is configured.
    for path in ["/v1/sessions", "/v1/sessions/1/events"] {
        let (status, _) = http_request(d.addr, "GET", path, None);
        assert_eq!(status, 401, "{path} without the token");
    }
    let (status, why) = get("/v1/sessions/999/events");
    assert_eq!((status, why.as_str()), (404, "no session `999`"));
    let (status, why) = get("/v1/sessions/no-such-call/events");
    assert_eq!(status, 404, "{why}");
    let (status, _) = get("/v1/sessions/1/nonsense");
    assert_eq!(status, 404);
    let (status, _) = req("POST", "/v1/sessions/1/events", Some("{}"));
    assert_eq!(status, 405);

    let (status, created) = req("POST", "/v1/rtp/sessions", Some(r#"{"codec": "PCMU"}"#));
    assert_eq!(status, 201, "{created}");
    let id = serde_json::from_str::<Value>(&created).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let first = follow_with(d.addr, &id, AUTH);
    let (status, why) = get(&format!("/v1/sessions/{id}/events"));
    assert_eq!(status, 429, "{why}");
    assert!(why.contains("events.max_subscribers_per_session"), "{why}");
    let (status, _) = req("DELETE", &format!("/v1/rtp/sessions/{id}"), None);
    assert_eq!(status, 200);
    let events = first.join().unwrap();
    assert_eq!(
        end_record(&events)["session"]["end_reason"]["kind"],
        "client_closed"
    );
    let (status, why) = get(&format!("/v1/sessions/{id}/events"));
    assert_eq!(status, 410, "{why}");
    assert!(why.contains("has ended"), "{why}");

    // A per-session webhook is refused where no prefix allows it.
    let (status, body) = req(
        "POST",
        "/v1/rtp/sessions",
        Some(r#"{"codec": "PCMU", "webhook_url": "http://127.0.0.1:9/x"}"#),
    );
    assert_eq!(status, 400);
    assert!(body.contains("webhook_url"), "{body}");
    let (status, page) = req("GET", "/metrics", None);
    assert_eq!(status, 200);
    for (result, n) in [
        ("unknown", 2.0),
        ("full", 1.0),
        ("ended", 1.0),
        ("accepted", 1.0),
    ] {
        assert_eq!(
            sample(
                &page,
                &format!("moshid_events_subscriptions_total{{result=\"{result}\"}}")
            ),
            n,
            "{result}"
        );
    }
}
