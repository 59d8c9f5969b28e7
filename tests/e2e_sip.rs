//! End-to-end tests of the SIP endpoint against the real `moshid serve`
//! and a SIP peer nobody here wrote — Debian's sipp (sip-tester) — each
//! test in a network namespace of its own with only loopback
//! (`moshid_testkit::sip`).
//!
//! Scenarios (`tests/data/sip/`): a basic call with PCMU RTP both ways and
//! BYE from sipp; CANCEL before the answer (487); OPTIONS (Allow, Accept);
//! a retransmitted INVITE answered once; a call over capacity (503 with
//! Retry-After) and over `sip.max_dialogs` (486); no common codec (488);
//! BYE from moshid at `session.max_session_seconds`; hold and resume by
//! re-INVITE; 16 calls at once, and 50 INVITEs within a second each
//! answered (200 or 503) with `/metrics` agreeing; digest authentication (a call that
//! answers the challenge, wrong credentials, the challenge itself, listed
//! sources beside unlisted ones). baresip dials moshid over PCMU, plays a
//! WAV file and records what it hears, also after answering an MD5
//! challenge; linphone answers a SHA-256 challenge. A raw UDP peer checks what sipp cannot
//! easily: the 200 retransmitted until the ACK (timer G for 2xx, T1
//! doubling), malformed requests next to a live call (each gets its
//! 4xx; the call does not notice), and SHA-256 answers, replays, expired
//! nonces and malformed `Authorization` headers.
//!
//! Nothing asserts timing: gaps and durations are printed. moshid's side
//! of each call is read from its log (`sip call start/end`, `rtp session
//! end … received= packets_sent=`).

use moshid_testkit::audio::ulaw_file;
use moshid_testkit::prelude::*;
use moshid_testkit::sip::{inside_netns, need, sip_config, sipp, sipp_with};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// Bound on waiting for a SIP counter to reach its value.
const METRIC_WAIT: Duration = Duration::from_secs(30);

fn start(extra_sip: &str, extra: &str, args: &[&str]) -> (Daemon, SocketAddr) {
    let d = daemon!()
        .args(args)
        .config(&sip_config(extra_sip, extra))
        .start();
    let sip = d.sip.expect("the daemon printed its SIP address");
    (d, sip)
}

/// The sum over cores of `/metrics` series `name` whose labels include
/// every one of `labels`, once the endpoints' counters (published every
/// 20 ms) show at least `min`.
fn sip_metric(d: &Daemon, name: &str, labels: &[&str], min: u64) -> u64 {
    d.metric_at_least(name, labels, min, METRIC_WAIT)
}

#[test]
fn basic_call_with_rtp_both_ways() {
    if !need("sipp") || !inside_netns("basic_call_with_rtp_both_ways") {
        return;
    }
    let (d, sip) = start("", "", &[]);
    let audio = ulaw_file(d.temp_dir(), 5);
    let run = sipp(
        d.temp_dir(),
        sip,
        "basic_call",
        &[
            ("@AUDIO@", audio.display().to_string()),
            ("@PAUSE_MS@", "3000".into()),
        ],
        1,
        1,
    );
    run.assert_ok("basic_call");
    let start = d.wait_records(Record::SipCallStart, &[], 1);
    println!("{}", start[0]);
    assert!(
        start[0].matches(&[
            ("codec", "PCMU"),
            ("pt", "0"),
            ("dtmf_pt", "101"),
            ("ptime_ms", "20")
        ]),
        "{}",
        start[0]
    );
    assert!(
        start[0].str("remote_rtp").starts_with("127.0.0.1:"),
        "{}",
        start[0]
    );
    let end = d.wait_records(Record::SipCallEnd, &[("reason", "bye_from_peer")], 1);
    println!("{}", end[0]);
    let rtp = d.wait_records(Record::RtpSessionEnd, &[("codec", "PCMU")], 1);
    println!("{}", rtp[0]);
    // About 150 packets each way in 3 s; at least a second's worth.
    assert!(rtp[0].u64("received") >= 50, "{}", rtp[0]);
    assert!(rtp[0].u64("packets_sent") >= 50, "{}", rtp[0]);
    assert!(rtp[0].u64("frames_to_engine") >= 10, "{}", rtp[0]);
    let record = d.wait_records(Record::SessionEnd, &[("transport", "sip")], 1);
    println!("{}", record[0]);
    // The call in /metrics: INVITE, ACK and BYE received, one call answered
    // and none left.
    assert_eq!(sip_metric(&d, "moshid_sip_calls_total", &[], 1), 1);
    assert!(sip_metric(&d, "moshid_sip_requests_total", &[], 3) >= 3);
    assert_eq!(sip_metric(&d, "moshid_sip_calls", &[], 0), 0);
    assert_eq!(sip_metric(&d, "moshid_sip_malformed_total", &[], 0), 0);
}

#[test]
fn cancel_before_answer_gets_487() {
    if !need("sipp") || !inside_netns("cancel_before_answer_gets_487") {
        return;
    }
    let (d, sip) = start(r#""ring_ms": 10000"#, "", &[]);
    sipp(d.temp_dir(), sip, "cancel", &[], 1, 1).assert_ok("cancel");
    let end = d.wait_records(Record::SipCallEnd, &[("reason", "cancelled")], 1);
    println!("{}", end[0]);
    // The RTP session made for the call ended with it.
    d.wait_records(Record::RtpSessionEnd, &[], 1);
    assert!(d.records(Record::SipCallStart, &[]).len() == 1);
    assert_eq!(
        sip_metric(&d, "moshid_sip_calls_cancelled_total", &[], 1),
        1
    );
    assert_eq!(sip_metric(&d, "moshid_sip_calls_total", &[], 0), 0);
}

#[test]
fn options_answers_allow_and_accept() {
    if !need("sipp") || !inside_netns("options_answers_allow_and_accept") {
        return;
    }
    let (d, sip) = start("", "", &[]);
    sipp(d.temp_dir(), sip, "options", &[], 3, 10).assert_ok("options");
    assert!(d.records(Record::SipCallStart, &[]).is_empty());
}

#[test]
fn retransmitted_invite_is_one_call() {
    if !need("sipp") || !inside_netns("retransmitted_invite_is_one_call") {
        return;
    }
    // Ringing for a while, so that the retransmission comes before the 200.
    let (d, sip) = start(r#""ring_ms": 1000"#, "", &[]);
    sipp(d.temp_dir(), sip, "retransmitted_invite", &[], 1, 1).assert_ok("retransmitted_invite");
    d.wait_records(Record::SipCallEnd, &[("reason", "bye_from_peer")], 1);
    assert_eq!(
        d.records(Record::SipCallStart, &[]).len(),
        1,
        "{}",
        d.stderr_tail()
    );
    assert_eq!(
        d.records(Record::RtpSessionStart, &[]).len(),
        1,
        "{}",
        d.stderr_tail()
    );
}

/// Starts a daemon with `extra_sip` and `args`, holds it busy with one call,
/// and checks that a second call is refused with `code` and a header
/// matching `header_re` while the first goes on to its end.
fn busy_while_one_call_holds(extra_sip: &str, args: &[&str], code: u16, header_re: &str) {
    let (d, sip) = start(extra_sip, "", args);
    let audio = ulaw_file(d.temp_dir(), 8);
    let dir = d.temp_dir().to_path_buf();
    let first = std::thread::spawn(move || {
        sipp(
            &dir,
            sip,
            "basic_call",
            &[
                ("@AUDIO@", audio.display().to_string()),
                ("@PAUSE_MS@", "4000".into()),
            ],
            1,
            1,
        )
    });
    d.wait_records(Record::SipCallStart, &[], 1);
    sipp(
        d.temp_dir(),
        sip,
        "busy",
        &[
            ("@CODE@", code.to_string()),
            ("@HEADER_RE@", header_re.into()),
        ],
        1,
        1,
    )
    .assert_ok(&format!("busy ({code})"));
    first
        .join()
        .unwrap()
        .assert_ok("the call holding the slot or dialog");
}

#[test]
fn over_capacity_gets_503_and_486() {
    if !need("sipp") || !inside_netns("over_capacity_gets_503_and_486") {
        return;
    }
    // One slot: a second call while the first holds it gets 503 + Retry-After.
    busy_while_one_call_holds(
        r#""retry_after_s": 7"#,
        &["--max-slots", "1"],
        503,
        "Retry-After: 7",
    );
    // One dialog per core: 486 Busy Here.
    busy_while_one_call_holds(
        r#""max_dialogs": 1"#,
        &["--max-slots", "2"],
        486,
        "max_dialogs",
    );
}

#[test]
fn no_common_codec_gets_488() {
    if !need("sipp") || !inside_netns("no_common_codec_gets_488") {
        return;
    }
    let (d, sip) = start("", "", &[]);
    sipp(d.temp_dir(), sip, "no_codec", &[], 1, 1).assert_ok("no_codec");
    assert!(d.records(Record::RtpSessionStart, &[]).is_empty());
}

#[test]
fn moshid_hangs_up_at_max_session_seconds() {
    if !need("sipp") || !inside_netns("moshid_hangs_up_at_max_session_seconds") {
        return;
    }
    let (d, sip) = start("", r#""session": {"max_session_seconds": 2}"#, &[]);
    let audio = ulaw_file(d.temp_dir(), 5);
    let t = Instant::now();
    sipp(
        d.temp_dir(),
        sip,
        "bye_from_moshid",
        &[("@AUDIO@", audio.display().to_string())],
        1,
        1,
    )
    .assert_ok("bye_from_moshid");
    println!("BYE from moshid after {:.1} s", t.elapsed().as_secs_f64());
    let end = d.wait_records(Record::SipCallEnd, &[("reason", "bye_answered")], 1);
    println!("{}", end[0]);
    let rec = d.wait_records(Record::SessionEnd, &[("transport", "sip")], 1);
    assert_eq!(rec[0].str("reason"), "max_duration", "{}", rec[0]);
}

#[test]
fn hold_and_resume_by_reinvite() {
    if !need("sipp") || !inside_netns("hold_and_resume_by_reinvite") {
        return;
    }
    let (d, sip) = start("", "", &[]);
    sipp(d.temp_dir(), sip, "hold", &[], 1, 1).assert_ok("hold");
    for dir in ["recvonly", "inactive", "sendrecv"] {
        d.wait_records(Record::SipCallReinvite, &[("direction", dir)], 1);
    }
    d.wait_records(Record::SipCallEnd, &[("reason", "bye_from_peer")], 1);
}

#[test]
fn codec_change_by_reinvite() {
    if !need("sipp") || !inside_netns("codec_change_by_reinvite") {
        return;
    }
    let (d, sip) = start("", "", &[]);
    // One second of audio on each codec, played once each.
    let audio = ulaw_file(d.temp_dir(), 1);
    sipp(
        d.temp_dir(),
        sip,
        "codec_change",
        &[
            ("@AUDIO@", audio.display().to_string()),
            ("@PAUSE_MS@", "1500".into()),
        ],
        1,
        1,
    )
    .assert_ok("codec_change");
    let re = d.wait_records(
        Record::SipCallReinvite,
        &[("codec", "PCMA"), ("pt", "8")],
        1,
    );
    println!("{}", re[0]);
    let switched = d.wait_records(
        Record::RtpSessionMedia,
        &[("codec", "PCMA"), ("pt", "8")],
        1,
    );
    println!("{}", switched[0]);
    d.wait_records(Record::SipCallEnd, &[("reason", "bye_from_peer")], 1);
    // The session went on across the switch (one session, one slot) and
    // ended on PCMA, having taken audio on both codecs: 50 packets each,
    // none of them of a payload type it did not expect.
    let rtp = d.wait_records(Record::RtpSessionEnd, &[], 1);
    println!("{}", rtp[0]);
    assert!(rtp[0].matches(&[("codec", "PCMA")]), "{}", rtp[0]);
    assert!(rtp[0].u64("received") >= 90, "{}", rtp[0]);
    assert_eq!(rtp[0].u64("wrong_payload_type"), 0, "{}", rtp[0]);
    assert!(rtp[0].u64("packets_sent") >= 100, "{}", rtp[0]);
    assert_eq!(d.records(Record::RtpSessionStart, &[]).len(), 1);
}

#[test]
fn many_calls_at_once() {
    if !need("sipp") || !inside_netns("many_calls_at_once") {
        return;
    }
    // The calls beyond what admission prices into the 70 ms step budget get
    // 503 ("server full"), and that price is the CPU demo model's measured
    // step on this machine: on 2 busy cores (sipp's 30 RTP streams, another
    // test) 20 calls already priced at 74 ms. 16 stays inside the budget
    // there; more calls at once measure the machine, not SIP.
    let calls = 16;
    let (d, sip) = start("", "", &["--max-slots", "32"]);
    let audio = ulaw_file(d.temp_dir(), 5);
    let t = Instant::now();
    sipp(
        d.temp_dir(),
        sip,
        "basic_call",
        &[
            ("@AUDIO@", audio.display().to_string()),
            ("@PAUSE_MS@", "3000".into()),
        ],
        calls,
        calls,
    )
    .assert_ok("many calls");
    println!("{calls} calls in {:.1} s", t.elapsed().as_secs_f64());
    let ends = d.wait_records(Record::RtpSessionEnd, &[], calls as usize);
    let received: Vec<u64> = ends.iter().map(|l| l.u64("received")).collect();
    let sent: Vec<u64> = ends.iter().map(|l| l.u64("packets_sent")).collect();
    println!(
        "RTP per call: received min {} max {}, sent min {} max {}",
        received.iter().min().unwrap(),
        received.iter().max().unwrap(),
        sent.iter().min().unwrap(),
        sent.iter().max().unwrap()
    );
    assert_eq!(d.records(Record::SipCallStart, &[]).len(), calls as usize);
    assert!(received.iter().all(|&r| r > 0) && sent.iter().all(|&s| s > 0));
    assert_eq!(
        d.records(Record::SipCallEnd, &[("reason", "bye_from_peer")])
            .len(),
        calls as usize
    );
}

#[test]
fn fifty_calls_at_once_each_answered_or_refused() {
    if !need("sipp") || !inside_netns("fifty_calls_at_once_each_answered_or_refused") {
        return;
    }
    // 50 INVITEs within a second. Admission prices each into the step
    // budget (on this 2-core machine, with auto phase groups, all 50 fit;
    // a slower or busier machine admits fewer): every call must be
    // answered, the admitted ones with audio both ways to a BYE, the
    // others 503 (and ACKed), and nothing lost in between.
    let calls = 50;
    let (d, sip) = start("", "", &["--max-slots", "64"]);
    let audio = ulaw_file(d.temp_dir(), 5);
    let t = Instant::now();
    sipp(
        d.temp_dir(),
        sip,
        "call_or_busy",
        &[
            ("@AUDIO@", audio.display().to_string()),
            ("@PAUSE_MS@", "3000".into()),
        ],
        calls,
        calls,
    )
    .assert_ok("50 calls");
    let answered = d.records(Record::SipCallStart, &[]).len();
    println!(
        "{calls} calls in {:.1} s: {answered} answered, {} refused",
        t.elapsed().as_secs_f64(),
        calls as usize - answered
    );
    assert!(answered >= 1, "{}", d.stderr_tail());
    let ends = d.wait_records(Record::RtpSessionEnd, &[], answered);
    assert!(
        ends.iter()
            .all(|l| l.u64("received") > 0 && l.u64("packets_sent") > 0),
        "{ends:#?}"
    );
    d.wait_records(Record::SipCallEnd, &[("reason", "bye_from_peer")], answered);
    let refused = (calls as usize - answered) as u64;
    let busy = r#"reason="busy""#;
    assert_eq!(
        sip_metric(&d, "moshid_sip_invites_refused_total", &[busy], refused),
        refused
    );
    assert_eq!(
        sip_metric(&d, "moshid_sip_calls_total", &[], answered as u64),
        answered as u64
    );
    assert_eq!(sip_metric(&d, "moshid_sip_calls", &[], 0), 0);
}

/// A raw SIP peer on a UDP socket.
struct RawPeer {
    socket: UdpSocket,
    to: SocketAddr,
}

impl RawPeer {
    fn new(to: SocketAddr) -> RawPeer {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        RawPeer { socket, to }
    }

    fn port(&self) -> u16 {
        self.socket.local_addr().unwrap().port()
    }

    fn send(&self, msg: &str) {
        self.socket.send_to(msg.as_bytes(), self.to).unwrap();
    }

    /// The next datagram, as text.
    fn recv(&self) -> String {
        let mut buf = vec![0u8; 65536];
        let (n, _) = self
            .socket
            .recv_from(&mut buf)
            .expect("a SIP message in time");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// The next response's status code (skipping requests).
    fn recv_status(&self) -> (u16, String) {
        loop {
            let m = self.recv();
            if let Some(rest) = m.strip_prefix("SIP/2.0 ") {
                return (rest[..3].parse().unwrap(), m);
            }
        }
    }

    fn invite(&self, call: &str, branch: &str, sdp: &str) -> String {
        let port = self.port();
        format!(
            "INVITE sip:moshi@{to} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:{port};branch={branch}\r\n\
             From: <sip:raw@127.0.0.1:{port}>;tag=raw1\r\nTo: <sip:moshi@{to}>\r\nCall-ID: {call}\r\n\
             CSeq: 1 INVITE\r\nContact: <sip:raw@127.0.0.1:{port}>\r\nMax-Forwards: 70\r\n\
             Content-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{sdp}",
            sdp.len(),
            to = self.to
        )
    }
}

fn header<'a>(msg: &'a str, name: &str) -> Option<&'a str> {
    msg.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .map(str::trim)
}

const RAW_SDP: &str = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n";

#[test]
fn ok_retransmitted_until_ack() {
    if !inside_netns("ok_retransmitted_until_ack") {
        return;
    }
    let (d, sip) = start(r#""t1_ms": 100, "t2_ms": 4000"#, "", &[]);
    let p = RawPeer::new(sip);
    p.send(&p.invite("retx-1", "z9hG4bK-retx-1", RAW_SDP));
    let mut oks = Vec::new();
    while oks.len() < 5 {
        let (code, m) = p.recv_status();
        if code == 200 {
            oks.push((Instant::now(), m));
        }
    }
    let gaps: Vec<f64> = oks
        .windows(2)
        .map(|w| (w[1].0 - w[0].0).as_secs_f64() * 1000.0)
        .collect();
    println!("200 retransmission gaps (ms, T1 = 100): {gaps:.0?}");
    assert!(
        oks.iter().all(|(_, m)| *m == oks[0].1),
        "a retransmission is the same 200"
    );
    let to = header(&oks[0].1, "To").unwrap().to_string();
    assert!(to.contains(";tag="), "{to}");
    let port = p.port();
    let in_dialog = |method: &str, cseq: u32, branch: &str| {
        format!(
            "{method} sip:moshid@{sip} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:{port};branch={branch}\r\n\
             From: <sip:raw@127.0.0.1:{port}>;tag=raw1\r\nTo: {to}\r\nCall-ID: retx-1\r\n\
             CSeq: {cseq} {method}\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
        )
    };
    p.send(&in_dialog("ACK", 1, "z9hG4bK-retx-ack"));
    p.send(&in_dialog("BYE", 2, "z9hG4bK-retx-bye"));
    loop {
        let (code, m) = p.recv_status();
        if header(&m, "CSeq") == Some("2 BYE") {
            assert_eq!(code, 200, "{m}");
            break;
        }
    }
    d.wait_records(Record::SipCallEnd, &[("reason", "bye_from_peer")], 1);
}

#[test]
fn malformed_requests_get_4xx_and_the_call_goes_on() {
    if !need("sipp") || !inside_netns("malformed_requests_get_4xx_and_the_call_goes_on") {
        return;
    }
    let (d, sip) = start("", "", &[]);
    let audio = ulaw_file(d.temp_dir(), 8);
    let dir = d.temp_dir().to_path_buf();
    let call = std::thread::spawn(move || {
        sipp(
            &dir,
            sip,
            "basic_call",
            &[
                ("@AUDIO@", audio.display().to_string()),
                ("@PAUSE_MS@", "4000".into()),
            ],
            1,
            1,
        )
    });
    d.wait_records(Record::SipCallStart, &[], 1);
    let p = RawPeer::new(sip);
    let port = p.port();
    let n = std::cell::Cell::new(0u32);
    let req = |first: &str, extra: &str, body: &str| {
        n.set(n.get() + 1);
        let i = n.get();
        format!(
            "{first}\r\nVia: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK-bad-{}\r\n\
             From: <sip:raw@127.0.0.1>;tag=x\r\nTo: <sip:moshi@127.0.0.1>\r\nCall-ID: bad-{}\r\n{extra}\
             Content-Length: {}\r\n\r\n{body}",
            i,
            i,
            body.len()
        )
    };
    let sdp = |m: &str| {
        format!("v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n{m}")
    };
    // (request, expected status)
    let cases: Vec<(String, u16)> = vec![
        (
            req("INVITE sip:moshi@127.0.0.1 SIP/2.0", "CSeq: 1 BYE\r\n", ""),
            400,
        ),
        (
            req(
                "INVITE sip:moshi@127.0.0.1 SIP/2.0",
                "CSeq: 1 INVITE\r\nMax-Forwards: 0\r\n",
                "",
            ),
            483,
        ),
        (
            req("INVITE http://moshi SIP/2.0", "CSeq: 1 INVITE\r\n", ""),
            416,
        ),
        (
            req(
                "INVITE sip:moshi@127.0.0.1 SIP/2.0",
                "CSeq: 1 INVITE\r\n",
                "",
            ),
            488,
        ),
        (
            req(
                "INVITE sip:moshi@127.0.0.1 SIP/2.0",
                "CSeq: 1 INVITE\r\nContent-Type: text/plain\r\n",
                "hello",
            ),
            415,
        ),
        (
            req(
                "INVITE sip:moshi@127.0.0.1 SIP/2.0",
                "CSeq: 1 INVITE\r\nContent-Type: application/sdp\r\n",
                "not sdp",
            ),
            400,
        ),
        (
            req(
                "INVITE sip:moshi@127.0.0.1 SIP/2.0",
                "CSeq: 1 INVITE\r\nContent-Type: application/sdp\r\n",
                &sdp("m=audio 4000 RTP/SAVP 0\r\n"),
            ),
            488,
        ),
        (
            req(
                "INVITE sip:moshi;text_temperature=-3@127.0.0.1 SIP/2.0",
                "CSeq: 1 INVITE\r\nContent-Type: application/sdp\r\n",
                &sdp("m=audio 4000 RTP/AVP 0\r\n"),
            ),
            400,
        ),
        (
            req(
                "INVITE sip:moshi@127.0.0.1 SIP/2.0",
                "CSeq: 1 INVITE\r\nRequire: 100rel\r\n",
                "",
            ),
            420,
        ),
        (
            req("BYE sip:moshi@127.0.0.1 SIP/2.0", "CSeq: 2 BYE\r\n", ""),
            481,
        ),
        (
            req(
                "CANCEL sip:moshi@127.0.0.1 SIP/2.0",
                "CSeq: 1 CANCEL\r\n",
                "",
            ),
            481,
        ),
        (
            req("REGISTER sip:127.0.0.1 SIP/2.0", "CSeq: 1 REGISTER\r\n", ""),
            405,
        ),
    ];
    for (msg, want) in &cases {
        p.send(msg);
        // The final answer (an INVITE gets 100 Trying first).
        let (code, resp) = loop {
            let (code, resp) = p.recv_status();
            if code >= 200 {
                break (code, resp);
            }
        };
        let first = msg.lines().next().unwrap();
        println!(
            "{first} -> {code} {}",
            header(&resp, "Warning").unwrap_or("")
        );
        assert_eq!(code, *want, "{msg}\n->\n{resp}");
    }
    // Not SIP at all, or without the headers an answer needs: dropped.
    for junk in [
        "",
        "\u{0}\u{1}garbage",
        "INVITE sip:a SIP/2.0\r\n\r\n",
        "GET / HTTP/1.1\r\n\r\n",
    ] {
        p.send(junk);
    }
    call.join()
        .unwrap()
        .assert_ok("the call next to the malformed requests");
    let rtp = d.wait_records(Record::RtpSessionEnd, &[("codec", "PCMU")], 1);
    assert!(rtp[0].u64("received") >= 50, "{}", rtp[0]);
    assert_eq!(
        d.records(Record::SipCallStart, &[]).len(),
        1,
        "only the real call started"
    );
}

/// baresip dials moshid with `codec` as moshid's only choice (and
/// `extra_sip` keys of `sip`) from account `account`, plays a WAV file and
/// records what it hears (its `sndfile` module dumps the decoded audio);
/// returns (samples heard, moshid's RTP end line, its call start line).
fn baresip_call(codec: &str, extra_sip: &str, account: &str) -> (usize, LogRecord, LogRecord) {
    baresip_call_to(codec, extra_sip, account, "")
}

/// [`baresip_call`], dialling `sip:moshi@ADDR` + `uri_params`.
fn baresip_call_to(
    codec: &str,
    extra_sip: &str,
    account: &str,
    uri_params: &str,
) -> (usize, LogRecord, LogRecord) {
    let sep = if extra_sip.is_empty() { "" } else { ", " };
    let (d, sip) = start(
        &format!(r#""codecs": ["{codec}"]{sep}{extra_sip}"#),
        "",
        &[],
    );
    let dir = d.temp_dir().join("baresip");
    std::fs::create_dir_all(&dir).unwrap();
    // 4 s of a 440 Hz tone, 16-bit, at the codec's rate and channels:
    // baresip's aufile source does not convert (with an 8 kHz mono file and
    // Opus's 48 kHz stereo it fails with "No such device" and sends no RTP).
    let (rate, channels) = if codec == "opus" {
        (48_000, 2)
    } else {
        (8000, 1)
    };
    let spec = hound::WavSpec {
        channels,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let input = dir.join("in.wav");
    let mut w = hound::WavWriter::create(&input, spec).unwrap();
    for i in 0..rate * 4 {
        let x = (2.0 * std::f32::consts::PI * 440.0 * i as f32 / rate as f32).sin() * 8000.0;
        for _ in 0..channels {
            w.write_sample(x as i16).unwrap();
        }
    }
    w.finalize().unwrap();
    let config = format!(
        "poll_method epoll\nsip_listen 127.0.0.1:{port}\naudio_source aufile,{input}\n\
         audio_player aubridge,moshid\naudio_alert aubridge,moshid\nmodule_path /usr/lib/baresip/modules\n\
         module menu.so\nmodule g711.so\nmodule opus.so\nmodule aufile.so\nmodule aubridge.so\n\
         module sndfile.so\nsnd_path {dir}\n",
        port = moshid_testkit::sip::free_udp_port(),
        input = input.display(),
        dir = dir.display()
    );
    std::fs::write(dir.join("config"), config).unwrap();
    std::fs::write(dir.join("accounts"), "").unwrap();
    std::fs::write(dir.join("contacts"), "").unwrap();
    let out = std::process::Command::new("timeout")
        .args(["60", "baresip", "-v", "-f"])
        .arg(&dir)
        .args(["-e", &format!("/uanew {account}")])
        .args(["-e", &format!("/dial sip:moshi@{sip}{uri_params}")])
        .args(["-t", "8"])
        .output()
        .expect("running baresip");
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // The status line is redrawn with CRs: keep lines only.
    let log = log.replace('\r', "\n");
    println!(
        "baresip (tail):\n{}",
        log.lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let rtp = d.wait_records(Record::RtpSessionEnd, &[], 1).remove(0);
    println!("{rtp}");
    let heard = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with("-dec.wav"))
        .unwrap_or_else(|| {
            panic!(
                "baresip recorded nothing (no *-dec.wav in {})",
                dir.display()
            )
        });
    let r = hound::WavReader::open(&heard).expect("baresip's recording");
    let rate = r.spec().sample_rate;
    let heard_channels = r.spec().channels as usize;
    let samples: Vec<i16> = r.into_samples::<i16>().map(Result::unwrap).collect();
    let rms = (samples.iter().map(|&s| (s as f64).powi(2)).sum::<f64>()
        / samples.len().max(1) as f64)
        .sqrt();
    println!(
        "baresip heard {} samples at {rate} Hz ({:.1} s), rms {rms:.1}",
        samples.len(),
        samples.len() as f64 / rate as f64 / heard_channels.max(1) as f64
    );
    let start = d.wait_records(Record::SipCallStart, &[], 1).remove(0);
    println!("{start}");
    assert_eq!(start.str("codec"), codec, "{start}");
    // In 8 kHz mono samples.
    let per_8k = (rate as usize / 8000).max(1) * heard_channels.max(1);
    (samples.len() / per_8k, rtp, start)
}

#[test]
fn baresip_calls_with_pcmu() {
    if !need("baresip") || !inside_netns("baresip_calls_with_pcmu") {
        return;
    }
    let (heard, rtp, _) = baresip_call("PCMU", "", "sip:baresip@127.0.0.1;regint=0");
    // baresip plays 4 s: moshid received and answered at least 2 s of it.
    assert!(rtp.u64("received") >= 100, "{rtp}");
    assert!(rtp.u64("packets_sent") >= 100, "{rtp}");
    assert!(heard >= 8000 * 2, "baresip heard {heard} samples");
}

#[test]
fn baresip_calls_with_opus() {
    if !need("baresip") || !inside_netns("baresip_calls_with_opus") {
        return;
    }
    let (heard, rtp, _) = baresip_call("opus", "", "sip:baresip@127.0.0.1;regint=0");
    assert!(rtp.u64("received") >= 100, "{rtp}");
    assert!(rtp.u64("packets_sent") >= 100, "{rtp}");
    assert!(heard >= 8000 * 2, "baresip heard {heard} samples");
}

/// `sip.auth` with one user (`alice`), and `more` keys of `sip.auth`.
fn auth_config(more: &str) -> String {
    let sep = if more.is_empty() { "" } else { ", " };
    format!(r#""auth": {{"credentials": {{"alice": "s3cret"}}{sep}{more}}}"#)
}

#[test]
fn auth_call_with_credentials_has_rtp() {
    if !need("sipp") || !inside_netns("auth_call_with_credentials_has_rtp") {
        return;
    }
    // sipp 3.6 answers MD5 only and reads the first challenge of a 401, so
    // moshid offers MD5 alone here (SHA-256 is the raw peer's test below).
    let (d, sip) = start(&auth_config(r#""algorithms": ["MD5"]"#), "", &[]);
    let audio = ulaw_file(d.temp_dir(), 5);
    // sipp computes the digest over `sip:` + -auth_uri (by default the
    // target address, not the Request-URI, which moshid requires).
    let auth_uri = format!("moshi@{sip}");
    sipp_with(
        d.temp_dir(),
        sip,
        "auth_call",
        &[
            ("@AUDIO@", audio.display().to_string()),
            ("@PAUSE_MS@", "3000".into()),
            ("@USER@", "alice".into()),
            ("@PASSWORD@", "s3cret".into()),
        ],
        1,
        1,
        &["-auth_uri", &auth_uri],
    )
    .assert_ok("auth_call");
    let start = d.wait_records(Record::SipCallStart, &[], 1);
    println!("{}", start[0]);
    assert_eq!(start[0].str("caller"), "alice", "{}", start[0]);
    d.wait_records(Record::SipCallEnd, &[("reason", "bye_from_peer")], 1);
    let rtp = d.wait_records(Record::RtpSessionEnd, &[("codec", "PCMU")], 1);
    println!("{}", rtp[0]);
    assert!(rtp[0].u64("received") >= 50, "{}", rtp[0]);
    assert!(rtp[0].u64("packets_sent") >= 50, "{}", rtp[0]);
    assert_eq!(d.records(Record::SipCallStart, &[]).len(), 1);
}

#[test]
fn auth_wrong_password_gets_401_again_and_no_call() {
    if !need("sipp") || !inside_netns("auth_wrong_password_gets_401_again_and_no_call") {
        return;
    }
    let (d, sip) = start(&auth_config(r#""algorithms": ["MD5"]"#), "", &[]);
    let auth_uri = format!("moshi@{sip}");
    for (user, password) in [("alice", "wrong"), ("mallory", "s3cret")] {
        sipp_with(
            d.temp_dir(),
            sip,
            "auth_wrong",
            &[("@USER@", user.into()), ("@PASSWORD@", password.into())],
            1,
            1,
            &["-auth_uri", &auth_uri],
        )
        .assert_ok(&format!("auth_wrong ({user}/{password})"));
    }
    d.wait_record(
        Record::SipRequestRefused,
        &[("reason", "digest authentication: wrong credentials")],
    );
    assert!(
        d.records(Record::SipCallStart, &[]).is_empty(),
        "{}",
        d.stderr_tail()
    );
    assert!(d.records(Record::RtpSessionStart, &[]).is_empty());
    // Each INVITE was challenged, first without credentials, then for
    // wrong ones; none authenticated.
    let challenged = r#"result="challenged""#;
    assert!(sip_metric(&d, "moshid_sip_auth_total", &[challenged], 4) >= 4);
    let ok = r#"result="authenticated""#;
    assert_eq!(sip_metric(&d, "moshid_sip_auth_total", &[ok], 0), 0);
}

#[test]
fn auth_without_credentials_gets_both_challenges() {
    if !need("sipp") || !inside_netns("auth_without_credentials_gets_both_challenges") {
        return;
    }
    let (d, sip) = start(&auth_config(""), "", &[]);
    sipp(d.temp_dir(), sip, "auth_challenge", &[], 1, 1).assert_ok("auth_challenge");
    // A trunk's OPTIONS ping needs no credentials.
    sipp(d.temp_dir(), sip, "options", &[], 1, 1).assert_ok("options with sip.auth");
    assert!(d.records(Record::SipCallStart, &[]).is_empty());
}

/// The value of parameter `name` in a `WWW-Authenticate` line.
fn auth_param(line: &str, name: &str) -> String {
    let quoted = format!("{name}=\"");
    if let Some(i) = line.find(&quoted) {
        let rest = &line[i + quoted.len()..];
        return rest[..rest.find('"').expect("closing quote")].to_string();
    }
    let bare = format!("{name}=");
    let i = line
        .find(&bare)
        .unwrap_or_else(|| panic!("no {name} in {line}"));
    let rest = &line[i + bare.len()..];
    rest.split([',', '\r', ' ']).next().unwrap().to_string()
}

/// A SHA-256 `Authorization` value for `challenge`, computed here with
/// the `sha2` crate (not moshid's digest code).
fn sha256_authorization(challenge: &str, password: &str, uri: &str, nc: u32) -> String {
    use sha2::Digest;
    let h = |s: String| -> String {
        sha2::Sha256::digest(s.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let (realm, nonce, opaque) = (
        auth_param(challenge, "realm"),
        auth_param(challenge, "nonce"),
        auth_param(challenge, "opaque"),
    );
    let cnonce = "0a4f113b";
    let ha1 = h(format!("alice:{realm}:{password}"));
    let ha2 = h(format!("INVITE:{uri}"));
    let response = h(format!("{ha1}:{nonce}:{nc:08x}:{cnonce}:auth:{ha2}"));
    format!(
        "Digest username=\"alice\", realm=\"{realm}\", nonce=\"{nonce}\", uri=\"{uri}\", \
         response=\"{response}\", algorithm=SHA-256, qop=auth, nc={nc:08x}, cnonce=\"{cnonce}\", opaque=\"{opaque}\""
    )
}

impl RawPeer {
    /// A peer on `local` (another loopback address, say).
    fn bound(local: &str, to: SocketAddr) -> RawPeer {
        let socket = UdpSocket::bind(local).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        RawPeer { socket, to }
    }

    /// A request of this peer (From tag `raw1`), with `extra` header lines;
    /// an INVITE carries [`RAW_SDP`].
    fn request(
        &self,
        method: &str,
        call: &str,
        branch: &str,
        cseq: u32,
        to: &str,
        extra: &str,
    ) -> String {
        let port = self.port();
        let local = self.socket.local_addr().unwrap().ip();
        let body = if method == "INVITE" { RAW_SDP } else { "" };
        let content_type = if body.is_empty() {
            ""
        } else {
            "Content-Type: application/sdp\r\n"
        };
        format!(
            "{method} sip:moshi@{sip} SIP/2.0\r\nVia: SIP/2.0/UDP {local}:{port};branch={branch}\r\n\
             From: <sip:raw@{local}:{port}>;tag=raw1\r\nTo: {to}\r\nCall-ID: {call}\r\n\
             CSeq: {cseq} {method}\r\nContact: <sip:raw@{local}:{port}>\r\nMax-Forwards: 70\r\n{extra}\
             {content_type}Content-Length: {}\r\n\r\n{body}",
            body.len(),
            sip = self.to
        )
    }

    /// The final response to the request with CSeq `cseq`.
    fn final_for(&self, cseq: &str) -> (u16, String) {
        loop {
            let (code, m) = self.recv_status();
            if code >= 200 && header(&m, "CSeq") == Some(cseq) {
                return (code, m);
            }
        }
    }

    /// Sends an INVITE out of any dialog; returns its final response,
    /// ACKed when it is not a 2xx.
    fn invite_final(&self, call: &str, branch: &str, cseq: u32, extra: &str) -> (u16, String) {
        let to = format!("<sip:moshi@{}>", self.to);
        self.send(&self.request("INVITE", call, branch, cseq, &to, extra));
        let (code, m) = self.final_for(&format!("{cseq} INVITE"));
        if code >= 300 {
            let to = header(&m, "To").unwrap().to_string();
            self.send(&self.request("ACK", call, branch, cseq, &to, ""));
        }
        (code, m)
    }
}

/// The `WWW-Authenticate` lines of a response.
fn challenges(m: &str) -> Vec<String> {
    m.lines()
        .filter(|l| l.starts_with("WWW-Authenticate:"))
        .map(str::to_string)
        .collect()
}

#[test]
fn auth_sha256_raw_peer_stale_replay_and_malformed() {
    if !inside_netns("auth_sha256_raw_peer_stale_replay_and_malformed") {
        return;
    }
    let (d, sip) = start(&auth_config(r#""nonce_seconds": 2"#), "", &[]);
    let p = RawPeer::new(sip);
    let uri = format!("sip:moshi@{sip}");
    let (code, m) = p.invite_final("sha-1", "z9hG4bK-sha-1", 1, "");
    assert_eq!(code, 401, "{m}");
    let ch = challenges(&m);
    println!("{}", ch.join("\n"));
    assert_eq!(ch.len(), 2, "{m}");
    assert_eq!(auth_param(&ch[0], "algorithm"), "SHA-256");
    assert_eq!(auth_param(&ch[1], "algorithm"), "MD5");
    let sha = ch[0].clone();
    let good = sha256_authorization(&sha, "s3cret", &uri, 1);
    // Malformed or mismatched answers: 400 each, for that request only.
    let malformed = [
        "Digest username=\"alice".to_string(),
        "Digest username=alice,,realm=moshid".to_string(),
        good.replace(", qop=auth", ""),
        good.replace("nc=00000001", "nc=1"),
        good.replace(&format!("uri=\"{uri}\""), "uri=\"sip:someone@else\""),
        format!("{good}, {good}"),
    ];
    for (i, a) in malformed.iter().enumerate() {
        let (code, m) = p.invite_final(
            "sha-bad",
            &format!("z9hG4bK-bad-{i}"),
            10 + i as u32,
            &format!("Authorization: {a}\r\n"),
        );
        println!("{a:.60} -> {code} {}", header(&m, "Warning").unwrap_or(""));
        assert_eq!(code, 400, "{a}\n->\n{m}");
    }
    // A wrong password: challenged again, not stale.
    let wrong = sha256_authorization(&sha, "s3creT", &uri, 1);
    let (code, m) = p.invite_final(
        "sha-1",
        "z9hG4bK-sha-wrong",
        2,
        &format!("Authorization: {wrong}\r\n"),
    );
    assert_eq!(code, 401, "{m}");
    assert!(!m.contains("stale"), "{m}");
    // The right one: the call.
    let (code, ok) = p.invite_final(
        "sha-1",
        "z9hG4bK-sha-2",
        3,
        &format!("Authorization: {good}\r\n"),
    );
    assert_eq!(code, 200, "{ok}");
    let start = d.wait_records(Record::SipCallStart, &[], 1);
    assert_eq!(start[0].str("caller"), "alice", "{}", start[0]);
    let to = header(&ok, "To").unwrap().to_string();
    p.send(&p.request("ACK", "sha-1", "z9hG4bK-sha-ack", 3, &to, ""));
    p.send(&p.request("BYE", "sha-1", "z9hG4bK-sha-bye", 4, &to, ""));
    assert_eq!(p.final_for("4 BYE").0, 200);
    d.wait_records(Record::SipCallEnd, &[("reason", "bye_from_peer")], 1);
    // The same answer again (a replay, as from someone who overheard it):
    // a right digest on a used nonce count is stale.
    let (code, m) = p.invite_final(
        "sha-2",
        "z9hG4bK-sha-replay",
        1,
        &format!("Authorization: {good}\r\n"),
    );
    assert_eq!(code, 401, "{m}");
    let ch = challenges(&m);
    assert!(ch.iter().all(|c| c.ends_with("stale=true")), "{m}");
    assert_ne!(auth_param(&ch[0], "nonce"), auth_param(&sha, "nonce"));
    // An expired nonce (sip.auth.nonce_seconds = 2): stale as well.
    let (_, m) = p.invite_final("sha-3", "z9hG4bK-sha-3", 1, "");
    let fresh = challenges(&m)[0].clone();
    std::thread::sleep(Duration::from_millis(2_500));
    let late = sha256_authorization(&fresh, "s3cret", &uri, 1);
    let (code, m) = p.invite_final(
        "sha-3",
        "z9hG4bK-sha-late",
        2,
        &format!("Authorization: {late}\r\n"),
    );
    assert_eq!(code, 401, "{m}");
    assert!(challenges(&m)[0].ends_with("stale=true"), "{m}");
    assert_eq!(
        d.records(Record::SipCallStart, &[]).len(),
        1,
        "{}",
        d.stderr_tail()
    );
}

#[test]
fn auth_and_allowed_sources_combine() {
    if !need("sipp") || !inside_netns("auth_and_allowed_sources_combine") {
        return;
    }
    let sip_cfg = format!(r#""allowed_sources": ["127.0.0.1"], {}"#, auth_config(""));
    let (d, sip) = start(&sip_cfg, "", &[]);
    // A listed source calls without credentials.
    let audio = ulaw_file(d.temp_dir(), 3);
    sipp(
        d.temp_dir(),
        sip,
        "basic_call",
        &[
            ("@AUDIO@", audio.display().to_string()),
            ("@PAUSE_MS@", "1000".into()),
        ],
        1,
        1,
    )
    .assert_ok("basic_call from a listed source");
    let start = d.wait_records(Record::SipCallStart, &[], 1);
    assert_eq!(start[0].str("caller"), "-", "{}", start[0]);
    // Another source (127.0.0.2, still loopback) must authenticate; its
    // OPTIONS ping is answered.
    let p = RawPeer::bound("127.0.0.2:0", sip);
    let (code, m) = p.invite_final("other-1", "z9hG4bK-other-1", 1, "");
    assert_eq!(code, 401, "{m}");
    let to = format!("<sip:moshi@{sip}>");
    p.send(&p.request("OPTIONS", "other-2", "z9hG4bK-other-2", 1, &to, ""));
    assert_eq!(p.final_for("1 OPTIONS").0, 200);
    let uri = format!("sip:moshi@{sip}");
    let good = sha256_authorization(&challenges(&m)[0], "s3cret", &uri, 1);
    let (code, ok) = p.invite_final(
        "other-1",
        "z9hG4bK-other-3",
        2,
        &format!("Authorization: {good}\r\n"),
    );
    assert_eq!(code, 200, "{ok}");
    let to = header(&ok, "To").unwrap().to_string();
    p.send(&p.request("ACK", "other-1", "z9hG4bK-other-ack", 2, &to, ""));
    p.send(&p.request("BYE", "other-1", "z9hG4bK-other-bye", 3, &to, ""));
    assert_eq!(p.final_for("3 BYE").0, 200);
    let starts = d.wait_records(Record::SipCallStart, &[("caller", "alice")], 1);
    assert!(
        starts[0].str("from").starts_with("127.0.0.2:"),
        "{}",
        starts[0]
    );
}

/// linphone (Debian linphone-cli, belle-sip 5) dials moshid, which offers
/// SHA-256 and MD5 (the defaults): linphone answers the SHA-256 challenge
/// with its account's password, and the call is set up and hung up.
#[test]
fn linphone_authenticates_with_sha256() {
    if !need("linphonec") || !inside_netns("linphone_authenticates_with_sha256") {
        return;
    }
    use std::io::Write;
    let sip_cfg = format!(r#""codecs": ["PCMU"], {}"#, auth_config(""));
    let (d, sip) = start(&sip_cfg, "", &[]);
    let home = d.temp_dir().join("linphone");
    std::fs::create_dir_all(home.join(".local/share/linphone")).unwrap();
    let rc = home.join("rc");
    std::fs::write(
        &rc,
        "[sip]\ncontact=\"Alice\" <sip:alice@127.0.0.1>\ndefault_proxy=-1\nipv6_enabled=0\n\n\
         [auth_info_0]\nusername=alice\npasswd=s3cret\nrealm=moshid\ndomain=127.0.0.1\n",
    )
    .unwrap();
    let log = home.join("log");
    let mut child = std::process::Command::new("timeout")
        .args(["60", "linphonec", "-d", "4", "-c"])
        .arg(&rc)
        .arg("-l")
        .arg(&log)
        .env("HOME", &home)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running linphonec");
    let mut stdin = child.stdin.take().unwrap();
    // No sound card in the namespace: WAV files stand in for one.
    writeln!(stdin, "soundcard use files").unwrap();
    writeln!(stdin, "call sip:moshi@{sip}").unwrap();
    let start = d.wait_records(Record::SipCallStart, &[], 1);
    println!("{}", start[0]);
    std::thread::sleep(Duration::from_secs(2));
    writeln!(stdin, "terminate").unwrap();
    let end = d.wait_records(Record::SipCallEnd, &[], 1);
    println!("{}", end[0]);
    writeln!(stdin, "quit").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    println!(
        "linphonec (tail):\n{}",
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let rtp = d.wait_records(Record::RtpSessionEnd, &[], 1);
    println!("{}", rtp[0]);
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    let answers: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("Authorization:"))
        .collect();
    println!(
        "{}",
        answers
            .first()
            .unwrap_or(&"(no Authorization in linphone's log)")
    );
    assert_eq!(start[0].str("caller"), "alice", "{}", start[0]);
    assert!(start[0].matches(&[("codec", "PCMU")]), "{}", start[0]);
    assert!(end[0].matches(&[("reason", "bye_from_peer")]), "{}", end[0]);
    // moshid's media reached linphone's address (linphone itself sends
    // nothing: no file is given to stand in for its microphone).
    assert!(rtp[0].u64("packets_sent") > 0, "{}", rtp[0]);
    assert!(
        answers
            .first()
            .is_some_and(|a| a.contains("algorithm=SHA-256")),
        "linphone answered with SHA-256: {answers:?}"
    );
}

/// A CANCEL is not challenged (RFC 3261 §22.1), so it must come from the
/// INVITE's own source: another one that copies the INVITE's Via (branch
/// and sent-by) gets 481, the call rings on, and its caller's own CANCEL
/// (the same Via) is not taken for a retransmission of the other's.
#[test]
fn cancel_from_another_source_gets_481() {
    if !inside_netns("cancel_from_another_source_gets_481") {
        return;
    }
    let (d, sip) = start(r#""ring_ms": 10000"#, "", &[]);
    let a = RawPeer::new(sip);
    a.send(&a.invite("cancel-2", "z9hG4bK-cancel-2", RAW_SDP));
    loop {
        if a.recv_status().0 == 180 {
            break;
        }
    }
    let cancel = || {
        let port = a.port();
        format!(
            "CANCEL sip:moshi@{sip} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK-cancel-2\r\n\
             From: <sip:raw@127.0.0.1:{port}>;tag=raw1\r\nTo: <sip:moshi@{sip}>\r\nCall-ID: cancel-2\r\n\
             CSeq: 1 CANCEL\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
        )
    };
    let b = RawPeer::bound("127.0.0.2:0", sip);
    b.send(&cancel());
    assert_eq!(b.final_for("1 CANCEL").0, 481);
    assert!(
        d.records(Record::SipCallEnd, &[]).is_empty(),
        "{}",
        d.stderr_tail()
    );
    a.send(&cancel());
    assert_eq!(a.final_for("1 CANCEL").0, 200);
    assert_eq!(a.final_for("1 INVITE").0, 487);
    d.wait_records(Record::SipCallEnd, &[("reason", "cancelled")], 1);
}

/// baresip (1.0, libre 1.1: MD5 only, and it gives up on a SHA-256
/// challenge, hence `algorithms: ["MD5"]`) answers moshid's challenge with
/// its account's `auth_pass` and the call has audio both ways.
#[test]
fn baresip_authenticates_with_md5() {
    if !need("baresip") || !inside_netns("baresip_authenticates_with_md5") {
        return;
    }
    let (heard, rtp, start) = baresip_call(
        "PCMU",
        &auth_config(r#""algorithms": ["MD5"]"#),
        "<sip:alice@127.0.0.1>;auth_pass=s3cret;regint=0",
    );
    assert_eq!(start.str("caller"), "alice", "{start}");
    assert!(rtp.u64("received") >= 100, "{rtp}");
    assert!(rtp.u64("packets_sent") >= 100, "{rtp}");
    assert!(heard >= 8000 * 2, "baresip heard {heard} samples");
}

// ---- SIP over TCP (RFC 3261 §18) ----

/// sipp over TCP: `-t t1` (every call on one connection) or `-t tn` (a
/// connection per call).
const T1: &[&str] = &["-t", "t1"];
const TN: &[&str] = &["-t", "tn", "-max_socket", "100"];

/// A sipp call with PCMU both ways over TCP; `calls` at once.
fn tcp_calls(mode: &[&str], calls: u32) {
    let (d, sip) = start("", "", &["--max-slots", "32"]);
    let audio = ulaw_file(d.temp_dir(), 5);
    sipp_with(
        d.temp_dir(),
        sip,
        "basic_call",
        &[
            ("@AUDIO@", audio.display().to_string()),
            ("@PAUSE_MS@", "3000".into()),
        ],
        calls,
        calls,
        mode,
    )
    .assert_ok(&format!("basic_call over TCP ({mode:?})"));
    let starts = d.wait_records(Record::SipCallStart, &[], calls as usize);
    println!("{}", starts[0]);
    for s in &starts {
        assert!(s.str("from").starts_with("tcp:127.0.0.1:"), "{s}");
        assert!(s.matches(&[("codec", "PCMU"), ("pt", "0")]), "{s}");
    }
    let ends = d.wait_records(Record::RtpSessionEnd, &[("codec", "PCMU")], calls as usize);
    for rtp in &ends {
        println!("{rtp}");
        // About 150 packets each way in 3 s; at least a second's worth.
        assert!(rtp.u64("received") >= 50, "{rtp}");
        assert!(rtp.u64("packets_sent") >= 50, "{rtp}");
    }
    assert_eq!(
        d.records(Record::SipCallEnd, &[("reason", "bye_from_peer")])
            .len(),
        calls as usize
    );
    let closes = d.wait_records(Record::SipTcpClose, &[("reason", "peer_closed")], 1);
    for c in &closes {
        println!("{c}");
    }
}

#[test]
fn tcp_basic_call_with_rtp_both_ways() {
    if !need("sipp") || !inside_netns("tcp_basic_call_with_rtp_both_ways") {
        return;
    }
    tcp_calls(T1, 1);
}

#[test]
fn tcp_calls_at_once_on_one_connection() {
    if !need("sipp") || !inside_netns("tcp_calls_at_once_on_one_connection") {
        return;
    }
    tcp_calls(T1, 6);
}

#[test]
fn tcp_one_connection_per_call() {
    if !need("sipp") || !inside_netns("tcp_one_connection_per_call") {
        return;
    }
    tcp_calls(TN, 4);
}

#[test]
fn tcp_cancel_and_options() {
    if !need("sipp") || !inside_netns("tcp_cancel_and_options") {
        return;
    }
    let (d, sip) = start(r#""ring_ms": 10000"#, "", &[]);
    sipp_with(d.temp_dir(), sip, "cancel", &[], 1, 1, T1).assert_ok("cancel over TCP");
    let end = d.wait_records(Record::SipCallEnd, &[("reason", "cancelled")], 1);
    println!("{}", end[0]);
    d.wait_records(Record::RtpSessionEnd, &[], 1);
    sipp_with(d.temp_dir(), sip, "options", &[], 3, 10, T1).assert_ok("options over TCP");
    sipp_with(d.temp_dir(), sip, "options", &[], 3, 10, TN).assert_ok("options over TCP, tn");
}

#[test]
fn tcp_moshid_hangs_up_over_the_connection() {
    if !need("sipp") || !inside_netns("tcp_moshid_hangs_up_over_the_connection") {
        return;
    }
    let (d, sip) = start("", r#""session": {"max_session_seconds": 2}"#, &[]);
    let audio = ulaw_file(d.temp_dir(), 5);
    sipp_with(
        d.temp_dir(),
        sip,
        "bye_from_moshid",
        &[("@AUDIO@", audio.display().to_string())],
        1,
        1,
        T1,
    )
    .assert_ok("bye_from_moshid over TCP");
    let end = d.wait_records(Record::SipCallEnd, &[("reason", "bye_answered")], 1);
    println!("{}", end[0]);
}

#[test]
fn baresip_calls_over_tcp() {
    if !need("baresip") || !inside_netns("baresip_calls_over_tcp") {
        return;
    }
    let (heard, rtp, start) = baresip_call_to(
        "PCMU",
        "",
        "sip:baresip@127.0.0.1;regint=0",
        ";transport=tcp",
    );
    assert!(start.str("from").starts_with("tcp:127.0.0.1:"), "{start}");
    assert!(rtp.u64("received") >= 100, "{rtp}");
    assert!(rtp.u64("packets_sent") >= 100, "{rtp}");
    assert!(heard >= 8000 * 2, "baresip heard {heard} samples");
}

/// A raw SIP peer on a TCP connection.
struct TcpPeer {
    stream: std::net::TcpStream,
    to: SocketAddr,
    /// Bytes read and not yet returned.
    buf: Vec<u8>,
}

impl TcpPeer {
    fn connect(to: SocketAddr) -> TcpPeer {
        let stream = std::net::TcpStream::connect(to).expect("connecting to moshid over TCP");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        TcpPeer {
            stream,
            to,
            buf: Vec::new(),
        }
    }

    fn port(&self) -> u16 {
        self.stream.local_addr().unwrap().port()
    }

    fn write(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.stream.write_all(bytes).unwrap();
    }

    /// Reads more; 0 at the end of the stream.
    fn fill(&mut self) -> usize {
        use std::io::Read;
        let mut b = [0u8; 4096];
        let n = self.stream.read(&mut b).expect("moshid answers in time");
        self.buf.extend_from_slice(&b[..n]);
        n
    }

    /// The next message moshid sent (framed by its Content-Length).
    fn recv(&mut self) -> String {
        loop {
            let text = String::from_utf8_lossy(&self.buf).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let len: usize = header(&text[..end], "Content-Length")
                    .expect("moshid always sends Content-Length")
                    .parse()
                    .unwrap();
                if self.buf.len() >= end + 4 + len {
                    let m = String::from_utf8_lossy(&self.buf[..end + 4 + len]).into_owned();
                    self.buf.drain(..end + 4 + len);
                    return m;
                }
            }
            assert!(self.fill() > 0, "connection closed; had {text:?}");
        }
    }

    fn recv_status(&mut self) -> (u16, String) {
        loop {
            let m = self.recv();
            if let Some(rest) = m.strip_prefix("SIP/2.0 ") {
                return (rest[..3].parse().unwrap(), m);
            }
        }
    }

    /// Waits for moshid to close the connection (a reset counts: moshid
    /// closing with bytes unread sends one); what came before.
    fn closed(&mut self) -> String {
        use std::io::Read;
        let mut b = [0u8; 4096];
        loop {
            match self.stream.read(&mut b) {
                Ok(0) => break,
                Ok(n) => self.buf.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("waiting for moshid to close: {e}"),
            }
        }
        String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned()
    }

    fn options(&self, branch: &str) -> String {
        let port = self.port();
        format!(
            "OPTIONS sip:moshi@{to} SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:{port};branch={branch}\r\n\
             From: <sip:raw@127.0.0.1:{port}>;tag=raw1\r\nTo: <sip:moshi@{to}>\r\nCall-ID: {branch}\r\n\
             CSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
            to = self.to
        )
    }

    fn invite(&self, call: &str, branch: &str) -> String {
        let port = self.port();
        format!(
            "INVITE sip:moshi@{to} SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:{port};branch={branch}\r\n\
             From: <sip:raw@127.0.0.1:{port}>;tag=raw1\r\nTo: <sip:moshi@{to}>\r\nCall-ID: {call}\r\n\
             CSeq: 1 INVITE\r\nContact: <sip:raw@127.0.0.1:{port};transport=tcp>\r\nMax-Forwards: 70\r\n\
             Content-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{RAW_SDP}",
            RAW_SDP.len(),
            to = self.to
        )
    }

    fn in_dialog(&self, method: &str, call: &str, to: &str, cseq: u32, branch: &str) -> String {
        let port = self.port();
        format!(
            "{method} sip:moshid@{sip} SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:{port};branch={branch}\r\n\
             From: <sip:raw@127.0.0.1:{port}>;tag=raw1\r\nTo: {to}\r\nCall-ID: {call}\r\n\
             CSeq: {cseq} {method}\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
            sip = self.to
        )
    }
}

#[test]
fn tcp_framing_edge_cases() {
    if !inside_netns("tcp_framing_edge_cases") {
        return;
    }
    let (d, sip) = start(r#""max_message_bytes": 2000"#, "", &[]);
    let mut p = TcpPeer::connect(sip);
    // Two messages in one write: two answers, in order.
    let two = p.options("z9hG4bK-two-1") + &p.options("z9hG4bK-two-2");
    p.write(two.as_bytes());
    for branch in ["z9hG4bK-two-1", "z9hG4bK-two-2"] {
        let (code, m) = p.recv_status();
        assert_eq!(code, 200, "{m}");
        assert!(header(&m, "Via").unwrap().contains(branch), "{m}");
    }
    // A message split byte by byte.
    for b in p.options("z9hG4bK-bytes").as_bytes() {
        p.write(std::slice::from_ref(b));
    }
    let (code, m) = p.recv_status();
    assert_eq!(code, 200, "{m}");
    assert!(header(&m, "Via").unwrap().contains("z9hG4bK-bytes"));
    // An RFC 5626 ping gets a pong (and only that).
    p.write(b"\r\n\r\n");
    p.fill();
    assert_eq!(p.buf, b"\r\n", "a double CRLF is answered with one CRLF");
    p.buf.clear();
    // No Content-Length: 400, then the connection is closed.
    let no_length = p
        .options("z9hG4bK-nolen")
        .replace("Content-Length: 0\r\n", "");
    p.write(no_length.as_bytes());
    let (code, m) = p.recv_status();
    assert_eq!(code, 400, "{m}");
    assert!(m.contains("Content-Length is required"), "{m}");
    assert_eq!(p.closed(), "", "closed after the 400");
    // Over sip.max_message_bytes with a readable head: 513, then closed.
    let mut p = TcpPeer::connect(sip);
    let big = p
        .options("z9hG4bK-big")
        .replace("Content-Length: 0", "Content-Length: 5000");
    p.write(big.as_bytes());
    let (code, m) = p.recv_status();
    assert_eq!(code, 513, "{m}");
    assert_eq!(p.closed(), "", "closed after the 513");
    // A head that never ends: closed without an answer.
    let mut p = TcpPeer::connect(sip);
    p.write(b"OPTIONS sip:moshi@127.0.0.1 SIP/2.0\r\n");
    for _ in 0..200 {
        if p.stream
            .write_all_ok(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaa\r\n")
            .is_err()
        {
            break;
        }
    }
    assert_eq!(
        p.closed(),
        "",
        "an endless head is closed without an answer"
    );
    // Garbage: closed without an answer.
    let mut p = TcpPeer::connect(sip);
    p.write(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n");
    assert_eq!(p.closed(), "");
    let closes = d.wait_records(Record::SipTcpClose, &[("reason", "stream_fault")], 4);
    for c in &closes {
        println!("{c}");
    }
    // The daemon still serves TCP.
    let mut p = TcpPeer::connect(sip);
    p.write(p.options("z9hG4bK-after").as_bytes());
    assert_eq!(p.recv_status().0, 200);
}

/// `write_all` that reports a closed connection instead of panicking.
trait WriteAllOk {
    fn write_all_ok(&mut self, b: &[u8]) -> std::io::Result<()>;
}

impl WriteAllOk for std::net::TcpStream {
    fn write_all_ok(&mut self, b: &[u8]) -> std::io::Result<()> {
        std::io::Write::write_all(self, b)
    }
}

#[test]
fn tcp_dialog_over_the_connection_and_its_close() {
    if !inside_netns("tcp_dialog_over_the_connection_and_its_close") {
        return;
    }
    let (d, sip) = start(
        r#""t1_ms": 100"#,
        r#""session": {"max_session_seconds": 2}"#,
        &[],
    );
    let mut p = TcpPeer::connect(sip);
    // Call 1: moshid hangs up at max_session_seconds, over the connection.
    p.write(p.invite("tcp-1", "z9hG4bK-tcp-1").as_bytes());
    let ok = loop {
        let (code, m) = p.recv_status();
        if code == 200 {
            break m;
        }
    };
    let contact = header(&ok, "Contact").unwrap();
    assert!(contact.ends_with(";transport=tcp>"), "{contact}");
    // The 2xx is retransmitted until the ACK over TCP too (§13.3.1.4).
    let (code, again) = p.recv_status();
    assert_eq!((code, &again), (200, &ok), "the same 200 again");
    let to = header(&ok, "To").unwrap().to_string();
    p.write(
        p.in_dialog("ACK", "tcp-1", &to, 1, "z9hG4bK-tcp-1-ack")
            .as_bytes(),
    );
    let bye = loop {
        let m = p.recv();
        if m.starts_with("BYE ") {
            break m;
        }
    };
    println!("{bye}");
    let via = header(&bye, "Via").unwrap();
    assert!(via.starts_with("SIP/2.0/TCP "), "{via}");
    let ok_bye = format!(
        "SIP/2.0 200 OK\r\nVia: {via}\r\nFrom: {}\r\nTo: {}\r\nCall-ID: tcp-1\r\nCSeq: {}\r\nContent-Length: 0\r\n\r\n",
        header(&bye, "From").unwrap(),
        header(&bye, "To").unwrap(),
        header(&bye, "CSeq").unwrap()
    );
    p.write(ok_bye.as_bytes());
    d.wait_records(Record::SipCallEnd, &[("reason", "bye_answered")], 1);
    // Call 2 on the same connection: the connection closes mid-call, the
    // call ends with it.
    let (d2, sip2) = start("", "", &[]);
    let mut p = TcpPeer::connect(sip2);
    p.write(p.invite("tcp-2", "z9hG4bK-tcp-2").as_bytes());
    let ok = loop {
        let (code, m) = p.recv_status();
        if code == 200 {
            break m;
        }
    };
    let to = header(&ok, "To").unwrap().to_string();
    p.write(
        p.in_dialog("ACK", "tcp-2", &to, 1, "z9hG4bK-tcp-2-ack")
            .as_bytes(),
    );
    d2.wait_records(Record::SipCallStart, &[("call_id", "tcp-2")], 1);
    drop(p);
    let end = d2.wait_records(
        Record::SipCallEnd,
        &[("reason", "sip_connection_closed")],
        1,
    );
    println!("{}", end[0]);
    d2.wait_records(Record::RtpSessionEnd, &[], 1);
    drop(d);
}

#[test]
fn tcp_idle_connections_close_and_pings_keep_them() {
    if !inside_netns("tcp_idle_connections_close_and_pings_keep_them") {
        return;
    }
    let (d, sip) = start(r#""tcp_idle_timeout_ms": 1000"#, "", &[]);
    let mut p = TcpPeer::connect(sip);
    p.write(p.options("z9hG4bK-idle").as_bytes());
    assert_eq!(p.recv_status().0, 200);
    // Pings for three idle timeouts keep it open: each gets its pong.
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(300));
        p.write(b"\r\n\r\n");
        while p.buf.len() < 2 {
            assert!(p.fill() > 0, "closed while pinging");
        }
        assert_eq!(p.buf.drain(..2).as_slice(), b"\r\n");
    }
    // Then silence: closed.
    let t = Instant::now();
    assert_eq!(p.closed(), "");
    println!(
        "closed {:.1} s after the last ping",
        t.elapsed().as_secs_f64()
    );
    d.wait_records(Record::SipTcpClose, &[("reason", "idle_timeout")], 1);
}

#[test]
fn tcp_connection_limit() {
    if !inside_netns("tcp_connection_limit") {
        return;
    }
    let (d, sip) = start(r#""max_tcp_connections": 2"#, "", &["--io-cores", "1"]);
    let mut a = TcpPeer::connect(sip);
    let mut b = TcpPeer::connect(sip);
    a.write(a.options("z9hG4bK-lim-a").as_bytes());
    b.write(b.options("z9hG4bK-lim-b").as_bytes());
    assert_eq!(a.recv_status().0, 200);
    assert_eq!(b.recv_status().0, 200);
    let mut c = TcpPeer::connect(sip);
    assert_eq!(c.closed(), "", "a third connection is closed at once");
    drop(a);
    // Its place comes back.
    let deadline = Instant::now() + IDLE_TIMEOUT;
    loop {
        let mut e = TcpPeer::connect(sip);
        if e.stream
            .write_all_ok(e.options("z9hG4bK-lim-e").as_bytes())
            .is_ok()
        {
            use std::io::Read;
            let mut one = [0u8; 1];
            if matches!(e.stream.read(&mut one), Ok(1)) {
                break;
            }
        }
        assert!(Instant::now() < deadline, "no place came back");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(d);
}

#[test]
fn bad_tcp_clients_beside_a_udp_call() {
    if !need("sipp") || !inside_netns("bad_tcp_clients_beside_a_udp_call") {
        return;
    }
    let (d, sip) = start(r#""max_tcp_connections": 8"#, "", &[]);
    let audio = ulaw_file(d.temp_dir(), 5);
    let dir = d.temp_dir().to_path_buf();
    let call = std::thread::spawn(move || {
        sipp(
            &dir,
            sip,
            "basic_call",
            &[
                ("@AUDIO@", audio.display().to_string()),
                ("@PAUSE_MS@", "4000".into()),
            ],
            1,
            1,
        )
    });
    d.wait_records(Record::SipCallStart, &[], 1);
    // While it runs: connections beyond the limit, garbage, endless heads,
    // missing Content-Length, oversized messages, silent connections.
    let mut silent: Vec<std::net::TcpStream> = Vec::new();
    for i in 0..40 {
        let Ok(mut s) = std::net::TcpStream::connect(sip) else {
            continue;
        };
        let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
        let junk: Vec<u8> = match i % 4 {
            0 => (0..3000u32).map(|x| (x * 7 + 3) as u8).collect(),
            1 => b"INVITE sip:moshi@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP x\r\n\r\n".to_vec(),
            2 => b"INVITE sip:m@h SIP/2.0\r\nContent-Length: 999999\r\n\r\n".to_vec(),
            _ => {
                silent.push(s);
                continue;
            }
        };
        let _ = s.write_all_ok(&junk);
    }
    let run = call.join().unwrap();
    run.assert_ok("the UDP call beside bad TCP clients");
    let rtp = d.wait_records(Record::RtpSessionEnd, &[("codec", "PCMU")], 1);
    println!("{}", rtp[0]);
    assert!(rtp[0].u64("received") >= 100, "{}", rtp[0]);
    assert!(rtp[0].u64("packets_sent") >= 100, "{}", rtp[0]);
    assert_eq!(
        d.records(Record::SipCallEnd, &[("reason", "bye_from_peer")])
            .len(),
        1
    );
    println!("tcp closes: {}", d.records(Record::SipTcpClose, &[]).len());
    drop(silent);
}
