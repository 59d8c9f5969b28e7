//! Asterisk AudioSocket against the real daemon: `moshid serve` with the
//! AudioSocket listener on an ephemeral loopback port, and a TCP client
//! that behaves like Asterisk's `AudioSocket()` application — the UUID,
//! then 8 kHz slin in 20 ms messages at real-time pace, a DTMF digit, a
//! hangup.
//!
//! * A healthy call gets back paced 20 ms slin messages of its own kind and
//!   size (counted; arrival gaps printed, not asserted), silence first and
//!   the model's audio after, and its DTMF digit shows in the call's log;
//!   with metrics on, its core's decode / encode / send stages count its
//!   audio messages, its model frames and the messages sent back.
//! * Malformed calls (bad length, unknown kind, audio before the UUID, an
//!   oversized payload) each end with an `0xff` message carrying the right
//!   code and a close, while a concurrent healthy call completes untouched.

use moshid_testkit::daemon::one_at_a_time;
use moshid_testkit::prelude::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

const CONFIG: &str = r#"{"audiosocket": {"enabled": true, "address": "127.0.0.1:0"}}"#;

/// 20 ms of 8 kHz slin.
const PACKET_BYTES: usize = 320;

/// One message the daemon sent.
#[derive(Debug, Clone)]
struct Msg {
    kind: u8,
    payload: Vec<u8>,
    at: Instant,
}

fn header(kind: u8, len: usize) -> [u8; 3] {
    let l = (len as u16).to_be_bytes();
    [kind, l[0], l[1]]
}

fn message(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut m = header(kind, payload.len()).to_vec();
    m.extend_from_slice(payload);
    m
}

/// The UUID of [`uuid_message`]`(tag)` as the daemon writes it.
fn uuid_text(tag: u8) -> String {
    format!("40000000-0000-0000-0000-0000000000{tag:02x}")
}

fn uuid_message(tag: u8) -> Vec<u8> {
    let mut id = [0u8; 16];
    id[0] = 0x40;
    id[15] = tag;
    message(0x01, &id)
}

fn audio_message(packet_index: usize) -> Vec<u8> {
    let pcm = tone(8_000, packet_index * 160, 160);
    let bytes: Vec<u8> = pcm.iter().flat_map(|s| s.to_le_bytes()).collect();
    message(0x10, &bytes)
}

/// Reads messages until the daemon closes the connection.
fn read_all(mut s: TcpStream) -> Vec<Msg> {
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading from the daemon: {e}"),
        };
        let at = Instant::now();
        buf.extend_from_slice(&chunk[..n]);
        while buf.len() >= 3 {
            let len = u16::from_be_bytes([buf[1], buf[2]]) as usize;
            if buf.len() < 3 + len {
                break;
            }
            out.push(Msg {
                kind: buf[0],
                payload: buf[3..3 + len].to_vec(),
                at,
            });
            buf.drain(..3 + len);
        }
    }
    assert!(
        buf.is_empty(),
        "{} bytes of a partial message at the end",
        buf.len()
    );
    out
}

/// A healthy call: UUID, `seconds` of audio at real-time pace with a DTMF
/// digit halfway, then a hangup. Returns what the daemon sent.
fn healthy_call(addr: SocketAddr, tag: u8, seconds: f64) -> Vec<Msg> {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    let reader = {
        let r = s.try_clone().unwrap();
        thread::spawn(move || read_all(r))
    };
    let mut w = s;
    w.write_all(&uuid_message(tag)).unwrap();
    let packets = (seconds * 50.0) as usize;
    let t0 = Instant::now();
    for i in 0..packets {
        let due = t0 + Duration::from_millis(20 * i as u64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        w.write_all(&audio_message(i)).unwrap();
        if i == packets / 2 {
            w.write_all(&message(0x03, b"5")).unwrap();
        }
    }
    w.write_all(&message(0x00, &[])).unwrap();
    reader.join().unwrap()
}

/// Checks a healthy call's answers; returns the count.
fn check_healthy(who: &str, msgs: &[Msg], expected_packets: usize) -> usize {
    for (i, m) in msgs.iter().enumerate() {
        assert_eq!(
            m.kind, 0x10,
            "{who}: message {i} has kind {:#04x} ({:?})",
            m.kind, m.payload
        );
        assert_eq!(m.payload.len(), PACKET_BYTES, "{who}: message {i} size");
    }
    let n = msgs.len();
    let lo = expected_packets * 8 / 10;
    let hi = expected_packets * 12 / 10;
    assert!(
        (lo..=hi).contains(&n),
        "{who}: {n} packets back, expected about {expected_packets}"
    );
    let voiced = msgs
        .iter()
        .filter(|m| m.payload.iter().any(|&b| b != 0))
        .count();
    let leading_silence = msgs
        .iter()
        .take_while(|m| m.payload.iter().all(|&b| b == 0))
        .count();
    println!("{who}: {n} packets back, {voiced} with model audio, {leading_silence} of silence before the first");
    assert!(
        leading_silence >= 1,
        "{who}: the first packet should be silence (the model has no output yet)"
    );
    assert!(
        voiced >= n / 2,
        "{who}: only {voiced} of {n} packets carry the model's audio"
    );
    let arrivals: Vec<Instant> = msgs.iter().map(|m| m.at).collect();
    print_gaps(who, &arrivals);
    n
}

/// The count of stage `stage`'s samples.
fn stage_count(d: &Daemon, stage: &str) -> u64 {
    d.stage_total(stage, "count") as u64
}

#[test]
fn a_call_gets_paced_slin_back_and_its_dtmf_is_seen() {
    let _serial = one_at_a_time();
    let daemon = daemon!().config(r#"{"audiosocket": {"enabled": true, "address": "127.0.0.1:0"}, "metrics": {"enabled": true}}"#,).start();
    let addr = daemon
        .audiosocket
        .expect("the daemon printed its AudioSocket address");
    let before: Vec<u64> = ["decode", "encode", "send"]
        .map(|s| stage_count(&daemon, s))
        .into();
    let waited = ["sum", "count"].map(|w| daemon.stage_total("frame_wait", w));
    let msgs = healthy_call(addr, 1, 2.0);
    let sent = check_healthy("healthy call", &msgs, 100);
    let end = daemon.wait_record(Record::AudiosocketCallEnd, &[("uuid", &uuid_text(1))]);
    println!("{end}");
    assert!(
        end.matches(&[("kind", "0x10"), ("rate_hz", "8000")]),
        "{end}"
    );
    assert!(end.matches(&[("dtmf", "1"), ("digits", "5")]), "{end}");
    assert!(
        end.matches(&[("reason", "client_closed"), ("error_code", "-")]),
        "{end}"
    );
    assert_eq!(end.u64("audio_in"), 100, "{end}");
    let session = daemon.wait_record(Record::SessionEnd, &[("transport", "audiosocket")]);
    assert_eq!(session.u64("frames_in"), 25, "{session}");
    // Its I/O core's stages: a decode per audio message, an encode per
    // model frame out, a send per message back.
    let frames_out = session.u64("frames_out");
    let delta: Vec<u64> = ["decode", "encode", "send"]
        .iter()
        .zip(&before)
        .map(|(s, b)| stage_count(&daemon, s) - b)
        .collect();
    assert_eq!(
        delta,
        vec![100, frames_out, sent as u64],
        "decode, encode, send"
    );
    // How long its frames waited for their tick (printed, not asserted):
    // the engine measures the call's phase from when its frames complete.
    let [sum, count] = ["sum", "count"].map(|w| daemon.stage_total("frame_wait", w));
    let n = count - waited[1];
    println!(
        "frame_wait: {n} frames, mean {:.2} ms",
        (sum - waited[0]) * 1e3 / n.max(1.0)
    );
}

/// A malformed call: `messages` are sent (with `pace` between them), then
/// everything the daemon sends is read to the close.
fn bad_call(addr: SocketAddr, messages: Vec<Vec<u8>>, pace: Duration) -> Vec<Msg> {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    let reader = {
        let r = s.try_clone().unwrap();
        thread::spawn(move || read_all(r))
    };
    let mut w = s;
    for m in messages {
        // The daemon may already have closed: later writes may fail.
        if w.write_all(&m).is_err() {
            break;
        }
        thread::sleep(pace);
    }
    reader.join().unwrap()
}

#[test]
fn malformed_messages_end_only_their_own_call() {
    let _serial = one_at_a_time();
    let daemon = daemon!().config(CONFIG).start();
    let addr = daemon.audiosocket.unwrap();

    let healthy = thread::spawn(move || healthy_call(addr, 2, 2.0));
    daemon.wait_capacity("the healthy call to be live", |c| {
        c["capacity"]["active_sessions"] == 1
    });

    let mut five_then_oversized: Vec<Vec<u8>> = vec![uuid_message(13)];
    five_then_oversized.extend((0..5).map(audio_message));
    // A header announcing 60000 bytes (> audiosocket.max_payload_bytes).
    five_then_oversized.push(header(0x10, 60_000).to_vec());
    let cases: Vec<(&str, Vec<Vec<u8>>, u8)> = vec![
        ("UUID of 15 bytes", vec![message(0x01, &[0x40; 15])], 0x01),
        (
            "odd audio length",
            vec![uuid_message(11), message(0x10, &[1, 2, 3])],
            0x01,
        ),
        (
            "DTMF of two bytes",
            vec![uuid_message(12), message(0x03, b"12")],
            0x01,
        ),
        (
            "unknown kind",
            vec![uuid_message(14), message(0x42, &[])],
            0x02,
        ),
        (
            "audio before the UUID",
            vec![audio_message(0), uuid_message(15)],
            0x03,
        ),
        (
            "a second UUID",
            vec![uuid_message(16), uuid_message(17)],
            0x03,
        ),
        ("oversized payload", five_then_oversized, 0x04),
    ];
    let handles: Vec<_> = cases
        .into_iter()
        .map(|(who, msgs, code)| {
            (
                who,
                code,
                thread::spawn(move || bad_call(addr, msgs, Duration::from_millis(20))),
            )
        })
        .collect();
    for (who, code, h) in handles {
        let msgs = h.join().unwrap();
        let last = msgs
            .last()
            .unwrap_or_else(|| panic!("{who}: nothing received before the close"));
        assert_eq!(
            (last.kind, last.payload.as_slice()),
            (0xff, &[code][..]),
            "{who}: expected error code {code:#04x} last, got {:?}",
            msgs.iter()
                .map(|m| (m.kind, m.payload.len()))
                .collect::<Vec<_>>()
        );
        for m in &msgs[..msgs.len() - 1] {
            assert_eq!(
                (m.kind, m.payload.len()),
                (0x10, PACKET_BYTES),
                "{who}: before the error"
            );
        }
        println!(
            "{who}: {} audio packets, then 0xff {code:#04x} and the close",
            msgs.len() - 1
        );
    }
    let msgs = healthy.join().unwrap();
    check_healthy("concurrent healthy call", &msgs, 100);
    let end = daemon.wait_record(Record::AudiosocketCallEnd, &[("uuid", &uuid_text(2))]);
    assert!(
        end.matches(&[("reason", "client_closed"), ("error_code", "-")]),
        "{end}"
    );
    for code in ["0x01", "0x02", "0x03", "0x04"] {
        daemon.wait_record(
            Record::AudiosocketCallEnd,
            &[("reason", "protocol_error"), ("error_code", code)],
        );
    }
}
