//! End-to-end tests of what moshid starts over SIP — the calls it places
//! (`POST /v1/sip/calls`) and its registrations (`sip.registrations`) —
//! against the real `moshid serve` and sipp (Debian's sip-tester) as the
//! far end, each test in a network namespace of its own with only
//! loopback (`moshid_testkit::sip`).
//!
//! Scenarios (`tests/data/sip/uas_*.xml`, `registrar.xml`): a callee that
//! answers PCMU and sends RTP while moshid sends its own, then hangs up; a
//! PBX that challenges the INVITE and checks moshid's digest with sipp's
//! own code; a busy callee (486, ACKed); a callee that rings until
//! `DELETE` CANCELs it (487, ACKed); a registrar that challenges, grants
//! 2 s and checks that the refresh comes with credentials at once. Each
//! call's outcome is read back from `GET /v1/sip/calls/{id}`, the log and
//! `/metrics`; the model slot a failed call reserved is given back.
//!
//! Nothing asserts timing.

use moshid_testkit::audio::ulaw_file;
use moshid_testkit::prelude::*;
use moshid_testkit::sip::{inside_netns, need, sip_config, SippServer};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

fn start(extra_sip: &str) -> Daemon {
    daemon!().config(&sip_config(extra_sip, "")).start()
}

/// Places a call to `user` at `server`; returns its id.
fn place(d: &Daemon, user: &str, server: std::net::SocketAddr) -> String {
    let body = json!({"to": format!("sip:{user}@{server}"), "params": {"seed": 7}});
    let (status, j) = json_request(d.addr, "POST", "/v1/sip/calls", Some(&body));
    assert_eq!(
        status,
        201,
        "POST /v1/sip/calls: {j}\nstderr:\n{}",
        d.stderr_tail()
    );
    assert_eq!(j["state"], "calling", "{j}");
    j["id"].as_str().expect("an id").to_string()
}

/// Waits until call `id` is in `state`; returns its status.
fn wait_state(d: &Daemon, id: &str, state: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let j = d.get_json(&format!("/v1/sip/calls/{id}"));
        if j["state"] == state {
            return j;
        }
        assert!(
            Instant::now() < deadline,
            "call {id} never reached `{state}`: {j}\nstderr:\n{}",
            d.stderr_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_placed_call_is_answered_with_rtp_both_ways() {
    if !need("sipp") || !inside_netns("a_placed_call_is_answered_with_rtp_both_ways") {
        return;
    }
    let d = start("");
    let audio = ulaw_file(d.temp_dir(), 5);
    let callee = SippServer::spawn(
        d.temp_dir(),
        "uas_answer",
        &[
            ("@AUDIO@", audio.display().to_string()),
            ("@PAUSE_MS@", "3000".into()),
            ("@USER@", "callee".into()),
        ],
        1,
        60,
    );
    let id = place(&d, "callee", callee.addr);
    let answered = wait_state(&d, &id, "answered");
    println!("{answered}");
    assert_eq!(answered["codec"], "PCMU", "{answered}");
    // Its session's event stream is listed under the call's id.
    let sessions = d.get_json("/v1/sessions");
    assert!(
        sessions
            .to_string()
            .contains(&format!("/v1/sessions/{id}/events")),
        "{sessions}"
    );
    callee.wait().assert_ok("uas_answer");
    let ended = wait_state(&d, &id, "ended");
    println!("{ended}");
    assert_eq!(ended["reason"], "bye_from_peer", "{ended}");
    assert_eq!(ended["status_code"], 200, "{ended}");
    let start = d.wait_record(Record::SipCallStart, &[("direction", "outbound")]);
    println!("{start}");
    assert!(
        start.matches(&[
            ("codec", "PCMU"),
            ("pt", "0"),
            ("dtmf_pt", "102"),
            ("ptime_ms", "20")
        ]),
        "{start}"
    );
    let rtp = d.wait_record(Record::RtpSessionEnd, &[("codec", "PCMU")]);
    println!("{rtp}");
    // About 150 packets each way in 3 s; at least a second's worth.
    assert!(rtp.u64("received") >= 50, "{rtp}");
    assert!(rtp.u64("packets_sent") >= 50, "{rtp}");
    assert!(rtp.u64("frames_to_engine") >= 10, "{rtp}");
    assert_eq!(
        d.metric_at_least(
            "moshid_sip_outbound_calls_total",
            &["result=\"answered\""],
            1,
            WAIT
        ),
        1
    );
    let list = d.get_json("/v1/sip/calls");
    assert_eq!(list["calls"][0]["id"], id.as_str(), "{list}");
}

#[test]
fn a_challenged_call_answers_with_the_configured_credentials() {
    if !need("sipp") || !inside_netns("a_challenged_call_answers_with_the_configured_credentials") {
        return;
    }
    let d = start(r#""outbound": {"auth": {"username": "moshid", "password": "pw-7f3a"}}"#);
    let pbx = SippServer::spawn(
        d.temp_dir(),
        "uas_auth",
        &[
            ("@USER@", "moshid".into()),
            ("@PASSWORD@", "pw-7f3a".into()),
        ],
        1,
        60,
    );
    let id = place(&d, "agent", pbx.addr);
    pbx.wait().assert_ok("uas_auth");
    let ended = wait_state(&d, &id, "ended");
    println!("{ended}");
    assert_eq!(ended["codec"], "PCMA", "{ended}");
    assert_eq!(ended["reason"], "bye_from_peer", "{ended}");
}

#[test]
fn a_challenge_without_credentials_fails_the_call() {
    if !need("sipp") || !inside_netns("a_challenge_without_credentials_fails_the_call") {
        return;
    }
    let d = start("");
    // The PBX challenges; moshid has no sip.outbound.auth: the call fails
    // with the 401 (sipp then waits for a second INVITE that never comes).
    let pbx = SippServer::spawn(
        d.temp_dir(),
        "uas_auth",
        &[("@USER@", "moshid".into()), ("@PASSWORD@", "x".into())],
        1,
        3,
    );
    let id = place(&d, "agent", pbx.addr);
    let failed = wait_state(&d, &id, "failed");
    println!("{failed}");
    assert_eq!(failed["status_code"], 401, "{failed}");
    let _ = pbx.wait();
    // The slot it reserved is back.
    d.wait_idle();
}

#[test]
fn a_busy_callee_fails_the_call_and_gets_its_ack() {
    if !need("sipp") || !inside_netns("a_busy_callee_fails_the_call_and_gets_its_ack") {
        return;
    }
    let d = start("");
    let callee = SippServer::spawn(d.temp_dir(), "uas_busy", &[], 1, 30);
    let id = place(&d, "busy", callee.addr);
    let failed = wait_state(&d, &id, "failed");
    println!("{failed}");
    assert_eq!(
        (failed["status_code"].as_u64(), failed["reason"].as_str()),
        (Some(486), Some("busy"))
    );
    // sipp's scenario ends with the ACK of its 486: it passes only if
    // moshid sent it.
    callee.wait().assert_ok("uas_busy");
    assert_eq!(
        d.metric_at_least(
            "moshid_sip_outbound_calls_total",
            &["result=\"failed\""],
            1,
            WAIT
        ),
        1
    );
    let line = d.wait_record(Record::SessionEnd, &[("transport", "sip")]);
    assert_eq!(line.str("reason"), "refused", "{line}");
}

#[test]
fn delete_cancels_a_ringing_call() {
    if !need("sipp") || !inside_netns("delete_cancels_a_ringing_call") {
        return;
    }
    let d = start("");
    let callee = SippServer::spawn(d.temp_dir(), "uas_ring_cancel", &[], 1, 30);
    let id = place(&d, "ringing", callee.addr);
    wait_state(&d, &id, "ringing");
    let (status, j) = json_request(d.addr, "DELETE", &format!("/v1/sip/calls/{id}"), None);
    assert_eq!(status, 202, "{j}");
    let failed = wait_state(&d, &id, "failed");
    println!("{failed}");
    assert_eq!(
        (failed["status_code"].as_u64(), failed["reason"].as_str()),
        (Some(487), Some("cancelled"))
    );
    callee.wait().assert_ok("uas_ring_cancel");
}

#[test]
fn bad_call_requests_get_400_and_unknown_ids_404() {
    let d = start("");
    for (body, want) in [
        (json!({"to": "tel:+15551234"}), "field `to`"),
        (json!({"to": "sip:127.0.0.1:5070"}), "field `to`"),
        (json!({"to": "sip:a@127.0.0.1;transport=tcp"}), "field `to`"),
        (
            json!({"to": "sip:a@127.0.0.1", "params": {"seed": [1]}}),
            "params",
        ),
        (
            json!({"to": "sip:a@127.0.0.1", "params": {"text_temperature": "hot"}}),
            "params",
        ),
        (
            json!({"to": "sip:a@127.0.0.1", "colour": "red"}),
            "bad JSON",
        ),
        (json!({"too": "sip:a@127.0.0.1"}), "bad JSON"),
    ] {
        let (status, j) = json_request(d.addr, "POST", "/v1/sip/calls", Some(&body));
        assert_eq!(status, 400, "{body}: {j}");
        assert!(
            j["error"].as_str().unwrap_or("").contains(want),
            "{body}: {j}"
        );
    }
    let (status, _) = json_request(d.addr, "GET", "/v1/sip/calls/999", None);
    assert_eq!(status, 404);
    let (status, _) = json_request(d.addr, "DELETE", "/v1/sip/calls/999", None);
    assert_eq!(status, 404);
    let (status, _) = json_request(d.addr, "PUT", "/v1/sip/calls", None);
    assert_eq!(status, 405);
    // Nothing was placed, nothing is held.
    assert_eq!(d.get_json("/v1/sip/calls")["calls"], json!([]));
}

#[test]
fn a_registration_answers_the_challenge_and_refreshes() {
    if !need("sipp") || !inside_netns("a_registration_answers_the_challenge_and_refreshes") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let registrar = SippServer::spawn(
        dir.path(),
        "registrar",
        &[
            ("@USER@", "600".into()),
            ("@PASSWORD@", "reg-secret".into()),
        ],
        1,
        30,
    );
    let d = start(&format!(
        r#""registrations": [{{"registrar": "sip:{}", "aor": "sip:600@pbx.test", "auth": {{"username": "600", "password": "reg-secret"}}, "expires_s": 120}}]"#,
        registrar.addr
    ));
    registrar.wait().assert_ok("registrar");
    let deadline = Instant::now() + WAIT;
    let reg = loop {
        let j = d.get_json("/v1/sip/registrations");
        let r = j["registrations"][0].clone();
        if r["successes"].as_u64() >= Some(2) {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "{j}\nstderr:\n{}",
            d.stderr_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    println!("{reg}");
    assert_eq!(reg["state"], "registered", "{reg}");
    // It granted 600 s to a binding asked for 120: moshid keeps the
    // shorter (it refreshes before either runs out).
    assert_eq!(reg["expires_s"], 120, "{reg}");
    d.wait_record(Record::SipRegistered, &[("aor", "sip:600@pbx.test")]);
    assert!(
        d.metric_at_least(
            "moshid_sip_registrations_total",
            &["result=\"ok\""],
            2,
            WAIT
        ) >= 2
    );
}
