//! Media Streams (Twilio-style JSON over WebSocket) against the real daemon:
//! `moshid serve` on loopback and a blocking tungstenite client that
//! behaves like the provider — `connected`, `start`, `media` every 20 ms,
//! `dtmf`, `mark`, `clear`, `stop`.
//!
//! * A stream gets back `media` events of 160 μ-law bytes with its
//!   streamSid (counted; arrival gaps printed, not asserted); a mark sent
//!   after all the audio is echoed right after the answers to all of it, and
//!   nothing follows.
//! * `clear` flushes the queued audio and echoes the pending mark at once,
//!   where without it the mark would wait for the answers in flight.
//! * Bad JSON, bad base64, `media` before `start`, an unknown event, a
//!   binary message and an unsupported format each end only their own
//!   stream, with an `error` event and a close (1002) giving the reason,
//!   while a concurrent healthy stream completes.

use base64::Engine;
use moshid_testkit::daemon::one_at_a_time;
use moshid_testkit::prelude::*;
use serde_json::{json, Value};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

const CONFIG: &str = r#"{"session": {"idle_timeout_ms": 10000}, "metrics": {"enabled": true}}"#;
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// What the daemon sent, in order.
#[derive(Debug, Clone)]
enum Event {
    Media {
        at: Instant,
        seq: u64,
        chunk: u64,
        len: usize,
    },
    Mark {
        name: String,
    },
    Error {
        reason: String,
        message: String,
    },
    Other(Value),
}

struct Client {
    ws: WebSocket<TcpStream>,
    sid: String,
    events: Vec<Event>,
    close: Option<(CloseCode, String)>,
    closed: bool,
    packets_sent: usize,
}

fn would_block(e: &tungstenite::Error) -> bool {
    matches!(e, tungstenite::Error::Io(io)
        if matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

impl Client {
    fn connect(addr: SocketAddr, sid: &str) -> Client {
        let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT).unwrap();
        stream.set_nodelay(true).unwrap();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        let url = format!("ws://{addr}/v1/media-stream");
        let (ws, _) = tungstenite::client(url.as_str(), stream)
            .unwrap_or_else(|e| panic!("upgrade of {url}: {e}"));
        Client {
            ws,
            sid: sid.to_string(),
            events: Vec::new(),
            close: None,
            closed: false,
            packets_sent: 0,
        }
    }

    fn send_text(&mut self, text: &str) {
        // The daemon may already have closed after an error of ours.
        if self.ws.send(Message::Text(text.into())).is_err() {
            self.closed = true;
        }
    }

    fn send(&mut self, v: Value) {
        self.send_text(&v.to_string());
    }

    fn start(&mut self, params: Value) {
        self.send(json!({"event": "connected", "protocol": "Call", "version": "1.0.0"}));
        let sid = self.sid.clone();
        self.send(json!({
            "event": "start", "sequenceNumber": "1", "streamSid": sid,
            "start": {
                "accountSid": "AC0", "callSid": "CA0", "streamSid": sid, "tracks": ["inbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                "customParameters": params,
            }
        }));
    }

    fn media(&mut self) {
        let i = self.packets_sent;
        let ulaw: Vec<u8> = tone(8_000, i * 160, 160)
            .into_iter()
            .map(moshid_telephony::g711::linear_to_ulaw)
            .collect();
        let sid = self.sid.clone();
        self.send(json!({
            "event": "media", "sequenceNumber": (i + 2).to_string(), "streamSid": sid,
            "media": {"track": "inbound", "chunk": (i + 1).to_string(), "timestamp": (i * 20).to_string(), "payload": B64.encode(&ulaw)}
        }));
        self.packets_sent += 1;
    }

    fn mark(&mut self, name: &str) {
        let sid = self.sid.clone();
        self.send(json!({"event": "mark", "streamSid": sid, "mark": {"name": name}}));
    }

    fn on_text(&mut self, text: &str) {
        let v: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("daemon sent bad JSON {text:?}: {e}"));
        let event = match v["event"].as_str() {
            Some("media") => {
                assert_eq!(
                    v["streamSid"],
                    self.sid.as_str(),
                    "media of another stream: {v}"
                );
                assert_eq!(v["media"]["track"], "outbound", "{v}");
                let payload = B64
                    .decode(v["media"]["payload"].as_str().expect("a payload"))
                    .expect("base64 payload");
                Event::Media {
                    at: Instant::now(),
                    seq: v["sequenceNumber"].as_str().unwrap().parse().unwrap(),
                    chunk: v["media"]["chunk"].as_str().unwrap().parse().unwrap(),
                    len: payload.len(),
                }
            }
            Some("mark") => {
                assert_eq!(v["streamSid"], self.sid.as_str(), "{v}");
                Event::Mark {
                    name: v["mark"]["name"].as_str().unwrap().to_string(),
                }
            }
            Some("error") => Event::Error {
                reason: v["error"]["reason"].as_str().unwrap_or("").to_string(),
                message: v["error"]["message"].as_str().unwrap_or("").to_string(),
            },
            _ => Event::Other(v),
        };
        self.events.push(event);
    }

    /// Reads what arrives until `deadline` or the close.
    fn pump_until(&mut self, deadline: Instant) {
        while !self.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = left.clamp(Duration::from_millis(1), Duration::from_millis(20));
            self.ws.get_ref().set_read_timeout(Some(wait)).unwrap();
            match self.ws.read() {
                Ok(Message::Text(t)) => self.on_text(t.as_str()),
                Ok(Message::Close(frame)) => {
                    self.close = frame.map(|f| (f.code, f.reason.to_string()));
                }
                Ok(other) => panic!("unexpected message {other:?}"),
                Err(e) if would_block(&e) => {}
                Err(_) => self.closed = true,
            }
            if left.is_zero() {
                break;
            }
        }
    }

    /// Reads until `pred` holds for the events; fails after `timeout`.
    fn wait_for(&mut self, what: &str, timeout: Duration, pred: impl Fn(&[Event]) -> bool) {
        let deadline = Instant::now() + timeout;
        while !pred(&self.events) {
            assert!(
                Instant::now() < deadline && !self.closed,
                "{}: no {what} within {timeout:?} (closed: {}, close: {:?}); last events: {:?}",
                self.sid,
                self.closed,
                self.close,
                self.events.iter().rev().take(5).collect::<Vec<_>>()
            );
            self.pump_until(Instant::now() + Duration::from_millis(20));
        }
    }

    fn wait_mark(&mut self, name: &str) -> usize {
        self.wait_for(
            &format!("echo of mark {name}"),
            Duration::from_secs(15),
            |ev| {
                ev.iter()
                    .any(|e| matches!(e, Event::Mark { name: n } if n == name))
            },
        );
        self.events
            .iter()
            .position(|e| matches!(e, Event::Mark { name: n } if n == name))
            .unwrap()
    }

    fn wait_closed(&mut self) {
        self.pump_until(Instant::now() + Duration::from_secs(10));
        assert!(self.closed, "{}: the daemon did not close", self.sid);
    }

    /// Sends `packets` media events at real-time pace from `t0`, calling
    /// `at(i, self)` before packet `i`.
    fn stream_real_time(&mut self, packets: usize, mut at: impl FnMut(usize, &mut Client)) {
        let t0 = Instant::now();
        for i in 0..packets {
            self.pump_until(t0 + Duration::from_millis(20 * i as u64));
            at(i, self);
            self.media();
        }
    }

    fn media_count(&self, range: std::ops::Range<usize>) -> usize {
        self.events[range]
            .iter()
            .filter(|e| matches!(e, Event::Media { .. }))
            .count()
    }

    /// Every media event is 160 bytes, sequence numbers grow, chunks count up.
    fn check_media(&self) -> Vec<Instant> {
        let mut last_seq = 0;
        let mut last_chunk = 0;
        let mut arrivals = Vec::new();
        for e in &self.events {
            if let Event::Other(v) = e {
                panic!("{}: unexpected event {v}", self.sid);
            }
            if let Event::Media {
                at,
                seq,
                chunk,
                len,
            } = e
            {
                assert_eq!(*len, 160, "{}: media payload of {len} bytes", self.sid);
                assert!(*seq > last_seq, "{}: sequence numbers must grow", self.sid);
                assert!(*chunk > last_chunk, "{}: chunks must grow", self.sid);
                last_seq = *seq;
                last_chunk = *chunk;
                arrivals.push(*at);
            }
        }
        arrivals
    }
}

/// 2 s of audio at real time (25 model frames: 24 answers with audio after
/// the model's one-frame delay, 96 media events), a DTMF digit and mark
/// `m1` halfway, mark `m2` after the audio.
fn healthy_stream(addr: SocketAddr, sid: &str) -> Client {
    let mut c = Client::connect(addr, sid);
    c.start(json!({"seed": "7", "FirstName": "Jane"}));
    c.stream_real_time(100, |i, c| {
        if i == 50 {
            let sid = c.sid.clone();
            c.send(json!({"event": "dtmf", "streamSid": sid, "dtmf": {"track": "inbound_track", "digit": "7"}}));
            c.mark("m1");
        }
    });
    c.mark("m2");
    let m2 = c.wait_mark("m2");
    // Nothing follows the echo of a mark sent after all the audio.
    c.pump_until(Instant::now() + Duration::from_millis(400));
    let m1 = c
        .events
        .iter()
        .position(|e| matches!(e, Event::Mark { name } if name == "m1"))
        .expect("m1 echoed");
    assert!(m1 < m2, "{sid}: marks echoed out of order");
    let before_m1 = c.media_count(0..m1);
    let before_m2 = c.media_count(0..m2);
    let after_m2 = c.media_count(m2..c.events.len());
    println!("{sid}: {before_m1} media events before the m1 echo, {before_m2} before m2, {after_m2} after");
    // m1 follows packet 50: 12 whole frames were sent before it, 11 answered with audio.
    assert!(
        before_m1 >= 44,
        "{sid}: m1 echoed after only {before_m1} media events"
    );
    assert_eq!(
        before_m2, 96,
        "{sid}: the answers to all the audio come before m2's echo"
    );
    assert_eq!(after_m2, 0, "{sid}: media after the last mark's echo");
    c
}

#[test]
fn a_stream_gets_paced_media_and_its_marks_echoed() {
    let _serial = one_at_a_time();
    let daemon = daemon!().config(CONFIG).start();
    let waited = ["sum", "count"].map(|w| daemon.stage_total("frame_wait", w));
    let mut c = healthy_stream(daemon.addr, "MZ00000000000000000000000000000001");
    let arrivals = c.check_media();
    print_gaps("media events", &arrivals);
    // How long its frames waited for their tick (printed, not asserted):
    // the engine measures the stream's phase from when its frames complete.
    let [sum, count] = ["sum", "count"].map(|w| daemon.stage_total("frame_wait", w));
    let n = count - waited[1];
    println!(
        "frame_wait: {n} frames, mean {:.2} ms",
        (sum - waited[0]) * 1e3 / n.max(1.0)
    );
    let sid = c.sid.clone();
    c.send(json!({"event": "stop", "sequenceNumber": "200", "streamSid": sid, "stop": {"accountSid": "AC0", "callSid": "CA0"}}));
    c.wait_closed();
    let end = daemon.wait_record(
        Record::MediaStreamEnd,
        &[("stream_sid", "MZ00000000000000000000000000000001")],
    );
    println!("{end}");
    assert!(
        end.matches(&[("media_in", "100"), ("media_out", "96")]),
        "{end}"
    );
    assert!(
        end.matches(&[("dtmf", "1"), ("digits", "7"), ("marks", "2")]),
        "{end}"
    );
    assert_eq!(end.str("reason"), "client_closed", "{end}");
    let session = daemon.wait_record(Record::SessionEnd, &[("transport", "media_stream")]);
    assert!(
        session.matches(&[("frames_in", "25"), ("frames_out", "24")]),
        "{session}"
    );
}

#[test]
fn clear_flushes_queued_audio_and_releases_the_pending_mark() {
    let _serial = one_at_a_time();
    let daemon = daemon!().config(CONFIG).start();
    let mut c = Client::connect(daemon.addr, "MZclear");
    c.start(json!({}));
    let mut clear_at_event = 0;
    c.stream_real_time(100, |i, c| {
        if i == 50 {
            // Frames are in flight: without `clear`, "c1" would wait for their answers.
            c.mark("c1");
            let sid = c.sid.clone();
            c.send(json!({"event": "clear", "streamSid": sid}));
            clear_at_event = c.events.len();
        }
    });
    c.mark("end");
    let end = c.wait_mark("end");
    c.pump_until(Instant::now() + Duration::from_millis(400));
    let c1 = c
        .events
        .iter()
        .position(|e| matches!(e, Event::Mark { name } if name == "c1"))
        .expect("c1 echoed");
    let between = c.media_count(clear_at_event..c1);
    let after_c1 = c.media_count(c1..end);
    println!("clear: {between} media events between the clear and c1's echo, {after_c1} after it until the end mark");
    assert!(
        between <= 2,
        "c1 was not released by the clear ({between} media events came first)"
    );
    assert!(after_c1 > 0, "the stream goes on after a clear");
    assert_eq!(c.media_count(end..c.events.len()), 0);
    c.check_media();
    c.send(json!({"event": "stop", "streamSid": "MZclear"}));
    c.wait_closed();
    let end = daemon.wait_record(Record::MediaStreamEnd, &[("stream_sid", "MZclear")]);
    println!("{end}");
    assert!(end.matches(&[("clears", "1"), ("marks", "2")]), "{end}");
}

/// A stream that breaks the protocol: sends `msgs` after `start` (or
/// instead of it), then reads to the close.
fn bad_stream(addr: SocketAddr, sid: &str, with_start: bool, msgs: Vec<Message>) -> Client {
    let mut c = Client::connect(addr, sid);
    if with_start {
        c.start(json!({}));
        c.media();
    }
    for m in msgs {
        if c.ws.send(m).is_err() {
            break;
        }
    }
    c.wait_closed();
    c
}

#[test]
fn bad_events_end_only_their_own_stream() {
    let _serial = one_at_a_time();
    let daemon = daemon!().config(CONFIG).start();
    let addr = daemon.addr;
    let healthy = thread::spawn(move || healthy_stream(addr, "MZhealthy"));
    daemon.wait_capacity("the healthy stream to be live", |c| {
        c["capacity"]["active_sessions"] == 1
    });
    let text = |s: &str| Message::Text(s.to_string().into());
    let media_before_start =
        json!({"event": "media", "streamSid": "MZx", "media": {"payload": "/////w=="}}).to_string();
    let l16 = json!({"event": "start", "streamSid": "MZl16", "start": {"streamSid": "MZl16",
        "mediaFormat": {"encoding": "audio/x-l16", "sampleRate": 16000, "channels": 1}}})
    .to_string();
    let cases: Vec<(&str, bool, Vec<Message>, &str)> = vec![
        (
            "MZjson",
            true,
            vec![text("{\"event\": \"media\", oops")],
            "bad JSON",
        ),
        (
            "MZbase64",
            true,
            vec![text(
                r#"{"event":"media","streamSid":"MZbase64","media":{"payload":"%%%not base64%%%"}}"#,
            )],
            "bad base64",
        ),
        (
            "MZearly",
            false,
            vec![text(r#"{"event":"connected"}"#), text(&media_before_start)],
            "`media` before `start`",
        ),
        (
            "MZunknown",
            true,
            vec![text(r#"{"event":"bogus","streamSid":"MZunknown"}"#)],
            "unknown event `bogus`",
        ),
        (
            "MZbinary",
            true,
            vec![Message::Binary(vec![1u8, 2, 3].into())],
            "binary messages",
        ),
        ("MZl16", false, vec![text(&l16)], "mediaFormat.encoding"),
    ];
    let handles: Vec<_> = cases
        .into_iter()
        .map(|(sid, with_start, msgs, needle)| {
            (
                sid,
                needle,
                thread::spawn(move || bad_stream(addr, sid, with_start, msgs)),
            )
        })
        .collect();
    for (sid, needle, h) in handles {
        let c = h.join().unwrap();
        let error = c.events.iter().find_map(|e| match e {
            Event::Error { reason, message } => Some((reason.clone(), message.clone())),
            _ => None,
        });
        let (reason, message) =
            error.unwrap_or_else(|| panic!("{sid}: no error event; events {:?}", c.events));
        assert_eq!(reason, "protocol_error", "{sid}: {message}");
        assert!(
            message.contains(needle),
            "{sid}: error {message:?} should mention {needle:?}"
        );
        let (code, close_reason) = c
            .close
            .clone()
            .unwrap_or_else(|| panic!("{sid}: no close frame"));
        assert_eq!(code, CloseCode::Protocol, "{sid}");
        assert!(
            close_reason.contains(needle),
            "{sid}: close reason {close_reason:?}"
        );
        println!("{sid}: error event {message:?}, close {code:?}");
    }
    let c = healthy.join().unwrap();
    assert!(!c.closed, "the healthy stream was closed");
    c.check_media();
    for sid in ["MZjson", "MZbase64", "MZunknown", "MZbinary"] {
        daemon.wait_record(
            Record::MediaStreamEnd,
            &[("stream_sid", sid), ("reason", "protocol_error")],
        );
    }
}
