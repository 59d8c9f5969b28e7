//! End-to-end tests of the RTP transport against the real `moshid serve`
//! binary over loopback UDP.
//!
//! * A peer nobody here wrote — Debian's ffmpeg — sends a WAV as PCMU, L16
//!   16 kHz and Opus RTP to an allocated session; a raw UDP socket (the
//!   session's `remote`) captures what moshid sends back, which must be
//!   valid RTP of the payload type asked for, paced and numbered per
//!   packet, and decodable by ffmpeg (G.711, L16) or libopus.
//! * A synthetic sender impairs a PCMU stream (reordering, duplicates, 5%
//!   random loss, a burst loss, a sequence-number wrap, a new SSRC); the
//!   session's counters and the engine's show that the model got exactly
//!   one frame per release tick throughout.
//! * A second source sending valid RTP to a latched session is ignored and
//!   counted; RFC 4733 digits with repeated end packets and no marker are
//!   reported once each.
//!
//! ffmpeg is required: without it the ffmpeg tests fail saying how to
//! install it, unless `MOSHID_SKIP` names it. The tests run one at a time (they are real-time streams on
//! a small machine); no assertion is about timing — the measured packet
//! gaps are printed.

use moshid_testkit::daemon::one_at_a_time as serial;
use moshid_testkit::peers::need_program;
use moshid_testkit::prelude::*;
use serde_json::{json, Value};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const CONFIG: &str = r#"{"rtp": {"inactivity_timeout_ms": 3000}}"#;

/// An HTTP request with an optional JSON body: `(status, JSON body)`.
fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    json_request(addr, method, path, body)
}

/// Creates a session; returns `(id, RTP address)`.
fn create(d: &Daemon, body: Value) -> (String, SocketAddr) {
    let (status, j) = http(d.addr, "POST", "/v1/rtp/sessions", Some(&body));
    assert_eq!(
        status,
        201,
        "POST /v1/rtp/sessions {body}: {j}\nstderr:\n{}",
        d.stderr_tail()
    );
    let id = j["id"].as_str().expect("id").to_string();
    let addr = format!("{}:{}", j["address"].as_str().expect("address"), j["port"])
        .parse()
        .expect("address:port");
    (id, addr)
}

fn events(d: &Daemon, id: &str) -> Value {
    let (status, j) = http(
        d.addr,
        "GET",
        &format!("/v1/rtp/sessions/{id}/events"),
        None,
    );
    assert_eq!(status, 200, "events of {id}: {j}");
    j
}

/// Ends a session; returns its final view.
fn delete(d: &Daemon, id: &str) -> Value {
    let (status, j) = http(d.addr, "DELETE", &format!("/v1/rtp/sessions/{id}"), None);
    assert_eq!(
        status,
        200,
        "DELETE {id}: {j}\nstderr:\n{}",
        d.stderr_tail()
    );
    assert_eq!(j["state"], "ended");
    j
}

fn counter(j: &Value, name: &str) -> u64 {
    j["counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter `{name}` in {j:#}"))
}

/// A received datagram, parsed by this test's own reading of RFC 3550.
#[derive(Debug, Clone)]
struct Rtp {
    at: Instant,
    version: u8,
    marker: bool,
    payload_type: u8,
    seq: u16,
    ts: u32,
    ssrc: u32,
    payload: Vec<u8>,
}

fn parse_rtp(at: Instant, d: &[u8]) -> Rtp {
    assert!(d.len() >= 12, "datagram of {} bytes", d.len());
    let cc = (d[0] & 0x0F) as usize;
    assert_eq!(d[0] & 0x30, 0, "moshid sends no padding or extension");
    Rtp {
        at,
        version: d[0] >> 6,
        marker: d[1] & 0x80 != 0,
        payload_type: d[1] & 0x7F,
        seq: u16::from_be_bytes([d[2], d[3]]),
        ts: u32::from_be_bytes([d[4], d[5], d[6], d[7]]),
        ssrc: u32::from_be_bytes([d[8], d[9], d[10], d[11]]),
        payload: d[12 + 4 * cc..].to_vec(),
    }
}

/// Captures datagrams on a socket until stopped.
struct Capture {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<Vec<(Instant, Vec<u8>)>>,
}

impl Capture {
    fn start(socket: UdpSocket) -> Capture {
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let addr = socket.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !flag.load(Ordering::Relaxed) {
                if let Ok((n, _)) = socket.recv_from(&mut buf) {
                    got.push((Instant::now(), buf[..n].to_vec()));
                }
            }
            got
        });
        Capture { addr, stop, thread }
    }

    fn finish(self) -> Vec<Rtp> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .unwrap()
            .iter()
            .map(|(t, d)| parse_rtp(*t, d))
            .collect()
    }
}

/// Checks the stream moshid sent and prints its pacing.
fn check_stream(
    what: &str,
    pkts: &[Rtp],
    payload_type: u8,
    ts_step: u32,
    payload_len: Option<usize>,
) {
    assert!(
        pkts.len() > 50,
        "{what}: only {} packets came back",
        pkts.len()
    );
    let ssrc = pkts[0].ssrc;
    assert!(
        pkts[0].marker,
        "{what}: the first packet has the marker bit"
    );
    for (i, p) in pkts.iter().enumerate() {
        assert_eq!(p.version, 2, "{what}: packet {i}");
        assert_eq!(p.payload_type, payload_type, "{what}: packet {i}");
        assert_eq!(p.ssrc, ssrc, "{what}: packet {i}");
        match payload_len {
            Some(n) => assert_eq!(p.payload.len(), n, "{what}: packet {i}"),
            None => assert!(!p.payload.is_empty(), "{what}: packet {i}"),
        }
    }
    for (i, w) in pkts.windows(2).enumerate() {
        assert_eq!(
            w[1].seq,
            w[0].seq.wrapping_add(1),
            "{what}: sequence at packet {}",
            i + 1
        );
        assert_eq!(
            w[1].ts,
            w[0].ts.wrapping_add(ts_step),
            "{what}: timestamp at packet {}",
            i + 1
        );
    }
    let mut gaps: Vec<f64> = pkts
        .windows(2)
        .map(|w| (w[1].at - w[0].at).as_secs_f64() * 1000.0)
        .collect();
    gaps.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| gaps[((gaps.len() - 1) as f64 * p).round() as usize];
    let talkspurts = pkts.iter().filter(|p| p.marker).count();
    println!(
        "{what}: {} packets, inter-packet gap p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {talkspurts} talkspurt(s)",
        pkts.len(),
        pct(0.5),
        pct(0.99),
        gaps[gaps.len() - 1]
    );
}

/// A 3 s, 16 kHz mono WAV with voiced, syllable-like content.
fn write_wav(path: &Path) {
    moshid_testkit::audio::write_wav(path, 16_000, 3.0, |t| {
        let f0 = 140.0 + 30.0 * (2.0 * std::f64::consts::PI * 0.7 * t).sin();
        let voice: f64 = (1..6)
            .map(|h| (2.0 * std::f64::consts::PI * f0 * h as f64 * t).sin() / h as f64)
            .sum();
        let envelope = (0.5 - 0.5 * (2.0 * std::f64::consts::PI * 4.0 * t).cos()).powf(0.7);
        voice * envelope * 6000.0 / f64::from(i16::MAX)
    });
}

/// Runs ffmpeg with `args` (input already set) to `rtp://addr`.
fn ffmpeg_send(wav: &Path, args: &[&str], to: SocketAddr) {
    let out = Command::new("ffmpeg")
        .args([
            "-hide_banner",
            "-loglevel",
            "error",
            "-nostdin",
            "-re",
            "-i",
        ])
        .arg(wav)
        .args(args)
        .args(["-f", "rtp"])
        .arg(format!("rtp://{to}"))
        .output()
        .expect("running ffmpeg");
    assert!(
        out.status.success(),
        "ffmpeg failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Decodes raw audio with ffmpeg; returns the 16-bit samples.
fn ffmpeg_decode(raw: &Path, format: &str, rate: u32) -> Vec<i16> {
    let out = Command::new("ffmpeg")
        .args([
            "-hide_banner",
            "-loglevel",
            "error",
            "-nostdin",
            "-f",
            format,
            "-ar",
            &rate.to_string(),
            "-ac",
            "1",
            "-i",
        ])
        .arg(raw)
        .args(["-f", "s16le", "-acodec", "pcm_s16le", "-"])
        .output()
        .expect("running ffmpeg");
    assert!(
        out.status.success(),
        "ffmpeg could not decode what moshid sent: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect()
}

fn rms(x: &[i16]) -> f64 {
    (x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / x.len().max(1) as f64).sqrt()
}

/// ffmpeg → moshid → raw socket, for one codec; `None` when ffmpeg is
/// missing and skipped.
fn round_trip(
    what: &str,
    session: Value,
    ffmpeg_args: &[&str],
) -> Option<(Vec<Rtp>, Value, Daemon)> {
    if !need_program("ffmpeg") {
        return None;
    }
    let d = daemon!().config(CONFIG).start();
    let wav = d.temp_dir().join("in.wav");
    write_wav(&wav);
    let cap = Capture::start(UdpSocket::bind("127.0.0.1:0").unwrap());
    let mut body = session;
    body["remote"] = json!(cap.addr.to_string());
    let (id, rtp) = create(&d, body);
    ffmpeg_send(&wav, ffmpeg_args, rtp);
    // The jitter buffer played out what ffmpeg sent and the model answered it.
    let live = wait_events(&d, &id, "what ffmpeg sent to be played out", drained);
    let end = delete(&d, &id);
    let pkts = cap.finish();
    println!("{what}: counters {}", end["counters"]);
    assert_eq!(live["state"], "active", "{what}: {live:#}");
    assert!(counter(&end, "received") > 0, "{what}: {end:#}");
    assert_eq!(
        counter(&end, "hijack_attempts"),
        0,
        "{what}: ffmpeg's packets come from the remote's IP"
    );
    assert!(counter(&end, "frames_to_engine") > 0);
    assert_eq!(counter(&end, "engine_dropped"), 0);
    assert_eq!(counter(&end, "lane_full"), 0);
    assert!(counter(&end, "packets_sent") as usize >= pkts.len());
    d.wait_idle();
    Some((pkts, end, d))
}

#[test]
fn ffmpeg_pcmu_round_trip() {
    let _g = serial();
    let Some((pkts, end, d)) = round_trip(
        "PCMU",
        json!({"codec": "PCMU", "payload_type": 0}),
        &["-ar", "8000", "-ac", "1", "-acodec", "pcm_mulaw"],
    ) else {
        return;
    };
    check_stream("PCMU", &pkts, 0, 160, Some(160));
    let raw = d.temp_dir().join("out.ul");
    std::fs::write(
        &raw,
        pkts.iter()
            .flat_map(|p| p.payload.clone())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let pcm = ffmpeg_decode(&raw, "mulaw", 8000);
    assert_eq!(pcm.len(), pkts.len() * 160);
    println!(
        "PCMU: {} s decoded by ffmpeg, rms {:.0}",
        pcm.len() as f64 / 8000.0,
        rms(&pcm)
    );
    assert!(counter(&end, "engine_outputs") > 0);
}

#[test]
fn ffmpeg_l16_16khz_round_trip() {
    let _g = serial();
    let Some((pkts, _end, d)) = round_trip(
        "L16/16000",
        json!({"codec": "L16", "payload_type": 97, "sample_rate": 16000}),
        &["-ar", "16000", "-ac", "1", "-acodec", "pcm_s16be"],
    ) else {
        return;
    };
    check_stream("L16/16000", &pkts, 97, 320, Some(640));
    let raw = d.temp_dir().join("out.s16be");
    std::fs::write(
        &raw,
        pkts.iter()
            .flat_map(|p| p.payload.clone())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let pcm = ffmpeg_decode(&raw, "s16be", 16_000);
    assert_eq!(pcm.len(), pkts.len() * 320);
    println!(
        "L16/16000: {} s decoded by ffmpeg, rms {:.0}",
        pcm.len() as f64 / 16_000.0,
        rms(&pcm)
    );
}

#[test]
fn ffmpeg_opus_round_trip() {
    let _g = serial();
    let Some((pkts, end, _d)) = round_trip(
        "opus",
        json!({"codec": "opus", "payload_type": 97}),
        &["-ar", "48000", "-ac", "1", "-acodec", "libopus"],
    ) else {
        return;
    };
    check_stream("opus", &pkts, 97, 960, None);
    assert_eq!(counter(&end, "decode_errors"), 0);
    // libopus decodes every packet to 20 ms.
    let mut dec = opus::Decoder::new(48_000, opus::Channels::Mono).unwrap();
    let mut out = vec![0f32; 5760];
    let mut energy = 0.0f64;
    for (i, p) in pkts.iter().enumerate() {
        let n = dec
            .decode_float(&p.payload, &mut out, false)
            .unwrap_or_else(|e| panic!("opus packet {i}: {e}"));
        assert_eq!(n, 960, "opus packet {i}");
        energy += out[..n].iter().map(|x| (*x as f64).powi(2)).sum::<f64>();
    }
    println!(
        "opus: {} packets decoded by libopus, rms {:.4}",
        pkts.len(),
        (energy / (pkts.len() * 960) as f64).sqrt()
    );
}

/// A PCMU sender for the synthetic tests.
struct Sender {
    socket: UdpSocket,
    to: SocketAddr,
    seq: u16,
    ts: u32,
    ssrc: u32,
    sent: u64,
}

impl Sender {
    fn new(to: SocketAddr, seq: u16, ts: u32, ssrc: u32) -> Sender {
        Sender {
            socket: UdpSocket::bind("127.0.0.1:0").unwrap(),
            to,
            seq,
            ts,
            ssrc,
            sent: 0,
        }
    }

    /// The next audio packet (a 300 Hz tone in μ-law, from moshid's tables).
    fn audio(&mut self) -> Vec<u8> {
        let mut p = vec![0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        p[2..4].copy_from_slice(&self.seq.to_be_bytes());
        p[4..8].copy_from_slice(&self.ts.to_be_bytes());
        p[8..12].copy_from_slice(&self.ssrc.to_be_bytes());
        for i in 0..160u32 {
            let x = (2.0 * std::f32::consts::PI * 300.0 * (self.ts.wrapping_add(i)) as f32
                / 8000.0)
                .sin()
                * 0.3;
            p.push(moshid_telephony::g711::linear_to_ulaw(
                moshid_telephony::g711::f32_to_i16(x),
            ));
        }
        self.seq = self.seq.wrapping_add(1);
        self.ts = self.ts.wrapping_add(160);
        p
    }

    /// An RFC 4733 packet (no marker) taking the next sequence number.
    fn dtmf(&mut self, pt: u8, event_ts: u32, event: u8, end: bool, duration: u16) -> Vec<u8> {
        let mut p = vec![0x80, pt, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        p[2..4].copy_from_slice(&self.seq.to_be_bytes());
        p[4..8].copy_from_slice(&event_ts.to_be_bytes());
        p[8..12].copy_from_slice(&self.ssrc.to_be_bytes());
        p.extend_from_slice(&[event, ((end as u8) << 7) | 10]);
        p.extend_from_slice(&duration.to_be_bytes());
        self.seq = self.seq.wrapping_add(1);
        p
    }

    fn send(&mut self, p: &[u8]) {
        self.socket.send_to(p, self.to).unwrap();
        self.sent += 1;
    }
}

/// Sleeps until `start + n × 20 ms`.
fn pace(start: Instant, n: u32) {
    let t = start + Duration::from_millis(20) * n;
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        thread::sleep(d);
    }
}

/// Whether a session's view shows its jitter buffer played out and every
/// frame it sent answered.
fn drained(j: &Value) -> bool {
    j["counters"]["received"].as_u64() > Some(0)
        && j["gauges"]["depth_ms"].as_f64() == Some(0.0)
        && j["gauges"]["in_flight"].as_u64() == Some(0)
}

/// Polls a session until `cond` holds on its view.
fn wait_events(d: &Daemon, id: &str, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let j = events(d, id);
        if cond(&j) {
            return j;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {j:#}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn jitter_buffer_feeds_one_frame_per_tick_through_impairments() {
    let _g = serial();
    let d = daemon!().config(CONFIG).start();
    let (id, rtp) = create(&d, json!({"codec": "PCMU"}));
    // The sequence number wraps at packet 136; a new SSRC starts at 200.
    let mut tx = Sender::new(rtp, 65_400, 4_294_960_000, 0x1111_1111);
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let (mut dropped, mut dups, mut swaps) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let total = 300u32;
    let mut held: Option<Vec<u8>> = None;
    for i in 0..total {
        pace(start, i);
        if i == 200 {
            // Same source, new stream.
            (tx.seq, tx.ts, tx.ssrc) = (1_000, 77_000, 0x2222_2222);
        }
        let p = tx.audio();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let burst = (100..110).contains(&i);
        let random_loss = i > 20 && rng % 100 < 5;
        if burst || random_loss {
            dropped += 1;
            continue;
        }
        if i % 17 == 5 && held.is_none() && i + 1 != 200 {
            // Hold this one back: it goes out after the next packet.
            held = Some(p);
            swaps += 1;
            continue;
        }
        tx.send(&p);
        if let Some(h) = held.take() {
            tx.send(&h);
        }
        if i % 13 == 7 {
            tx.send(&p);
            dups += 1;
        }
    }
    if let Some(h) = held.take() {
        tx.send(&h);
    }
    let sent = tx.sent;
    let view = wait_events(&d, &id, "every packet received and played out", |j| {
        j["counters"]["received"].as_u64() == Some(sent) && drained(j)
    });
    let end = delete(&d, &id);
    println!(
        "impairments: {dropped} dropped, {dups} duplicated, {swaps} swapped; counters {}",
        end["counters"]
    );
    println!("gauges {}", view["gauges"]);
    assert_eq!(counter(&end, "duplicate"), dups);
    assert!(counter(&end, "reordered") >= swaps / 2, "reordered");
    let lost = counter(&end, "lost");
    assert!(
        lost >= dropped / 2 && lost <= dropped,
        "lost {lost} of {dropped} dropped"
    );
    assert!(counter(&end, "concealed") > 0);
    assert_eq!(counter(&end, "ssrc_changes"), 1);
    assert_eq!(counter(&end, "seq_jumps"), 0, "the wrap is not a jump");
    assert_eq!(counter(&end, "resyncs"), 0, "the wrap is not a resync");
    assert_eq!(counter(&end, "hijack_attempts"), 0);
    // Exactly one frame per release tick reached the model.
    let ticks = counter(&end, "release_ticks");
    assert!(
        ticks >= (total as u64 * 20 / 80) / 2,
        "{ticks} release ticks"
    );
    assert_eq!(counter(&end, "backlog_skips"), 0);
    assert_eq!(counter(&end, "lane_full"), 0);
    assert_eq!(counter(&end, "frames_to_engine"), ticks);
    assert_eq!(counter(&end, "engine_dropped"), 0);
    let answered = counter(&end, "frames_answered");
    assert!(ticks - answered <= 2, "{ticks} sent, {answered} answered");
    let cap = d.wait_idle();
    // The session ended (DELETE) with up to two frames in flight: the
    // engine may still have stepped those, whose answers found no session.
    let stepped = cap["engine"]["frames_stepped"].as_u64().unwrap();
    assert!(
        (answered..=ticks).contains(&stepped),
        "the engine stepped {stepped} frames, the session sent {ticks} and got {answered} answers: {cap:#}"
    );
    assert_eq!(cap["rtp_sessions"], 0);
    println!(
        "one frame per tick: {ticks} release ticks, {} missed deadlines, {} frames stepped by the engine",
        counter(&end, "missed_release_deadlines"),
        answered
    );
}

#[test]
fn a_second_source_cannot_take_over() {
    let _g = serial();
    let d = daemon!().config(CONFIG).start();
    let (id, rtp) = create(&d, json!({"codec": "PCMU"}));
    let mut a = Sender::new(rtp, 1, 0, 0xAAAA);
    let mut b = Sender::new(rtp, 500, 9_000, 0xBBBB);
    b.socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let a_addr = a.socket.local_addr().unwrap();
    let start = Instant::now();
    for i in 0..100u32 {
        pace(start, i);
        let p = a.audio();
        a.send(&p);
        if (25..55).contains(&i) {
            let q = b.audio();
            b.send(&q);
        }
    }
    let view = wait_events(&d, &id, "A's packets", |j| {
        j["counters"]["received"].as_u64() == Some(100)
    });
    assert_eq!(view["latched_source"], a_addr.to_string());
    assert_eq!(view["events"][0]["kind"], "latched");
    // moshid answers the latched source, never the intruder.
    let mut buf = [0u8; 2048];
    a.socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let (n, from) = a
        .socket
        .recv_from(&mut buf)
        .expect("moshid sends RTP to the latched source");
    assert_eq!(from, rtp);
    assert_eq!(parse_rtp(Instant::now(), &buf[..n]).payload_type, 0);
    let intruder_got = b.socket.recv_from(&mut buf).is_ok();
    let end = delete(&d, &id);
    assert_eq!(counter(&end, "hijack_attempts"), b.sent);
    assert_eq!(counter(&end, "received"), a.sent);
    assert_eq!(counter(&end, "ssrc_changes"), 0);
    assert!(!intruder_got, "the intruder received RTP");
    println!(
        "hijack: {} packets from a second source ignored and counted",
        b.sent
    );
}

#[test]
fn dtmf_digits_are_reported_once() {
    let _g = serial();
    let d = daemon!().config(CONFIG).start();
    let (id, rtp) = create(&d, json!({"codec": "PCMU", "dtmf_payload_type": 101}));
    let mut tx = Sender::new(rtp, 30_000, 1_000, 0xD7F);
    let start = Instant::now();
    let mut n = 0u32;
    let audio = |tx: &mut Sender, count: u32, n: &mut u32| {
        for _ in 0..count {
            pace(start, *n);
            let p = tx.audio();
            tx.send(&p);
            *n += 1;
        }
    };
    audio(&mut tx, 20, &mut n);
    for event in [1u8, 11, 9] {
        // The event replaces audio for 100 ms (RFC 4733 §2.5): the event
        // timestamp is its start, the duration grows, no marker; the end
        // packet is sent three times.
        let event_ts = tx.ts;
        for k in 1..=5u16 {
            pace(start, n);
            let p = tx.dtmf(101, event_ts, event, false, 160 * k);
            tx.send(&p);
            n += 1;
        }
        for _ in 0..3 {
            let p = tx.dtmf(101, event_ts, event, true, 800);
            tx.send(&p);
        }
        tx.ts = tx.ts.wrapping_add(800);
        audio(&mut tx, 15, &mut n);
    }
    let view = wait_events(&d, &id, "three digits", |j| {
        j["counters"]["dtmf_events"].as_u64() == Some(3)
    });
    let digits: Vec<&Value> = view["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "dtmf")
        .collect();
    let s: String = digits
        .iter()
        .map(|e| e["digit"].as_str().unwrap())
        .collect();
    assert_eq!(s, "1#9", "{view:#}");
    for e in &digits {
        assert_eq!(e["ended"], true);
        assert_eq!(e["duration_ms"], 100);
        assert_eq!(
            e["event"].as_u64().unwrap(),
            e["digit"].as_str().unwrap().parse::<u64>().unwrap_or(11)
        );
    }
    let end = delete(&d, &id);
    assert_eq!(counter(&end, "dtmf_events"), 3);
    assert_eq!(counter(&end, "dtmf_packets"), 24);
    assert_eq!(counter(&end, "received"), tx.sent);
    assert_eq!(
        counter(&end, "lost"),
        0,
        "event packets are not lost audio: {end:#}"
    );
    println!(
        "dtmf: digits {s} reported once each from {} event packets",
        counter(&end, "dtmf_packets")
    );
}

#[test]
fn bad_requests_name_the_field() {
    let _g = serial();
    let d = daemon!().config(CONFIG).start();
    for (body, field) in [
        (json!({"codec": "G729"}), "codec"),
        (json!({"codec": "opus"}), "payload_type"),
        (json!({"codec": "PCMU", "ptime_ms": 25}), "ptime_ms"),
        (json!({"codec": "PCMU", "remote": "nowhere"}), "remote"),
        (
            json!({"codec": "PCMU", "params": {"text_temperature": "hot"}}),
            "text_temperature",
        ),
    ] {
        let (status, j) = http(d.addr, "POST", "/v1/rtp/sessions", Some(&body));
        assert_eq!(status, 400, "{body}: {j}");
        assert!(j["error"].as_str().unwrap().contains(field), "{body}: {j}");
    }
    let (status, _) = http(d.addr, "DELETE", "/v1/rtp/sessions/nope", None);
    assert_eq!(status, 404);
    // Inactivity ends a session nobody sends to.
    let (id, _) = create(&d, json!({"codec": "PCMA"}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while http(d.addr, "GET", &format!("/v1/rtp/sessions/{id}"), None).0 == 200 {
        assert!(
            Instant::now() < deadline,
            "the inactivity timeout did not end the session"
        );
        thread::sleep(Duration::from_millis(50));
    }
    d.wait_idle();
    d.wait_record(
        Record::SessionEnd,
        &[("transport", "rtp"), ("reason", "idle_timeout")],
    );
}
