//! The page at `/` in a real browser: headless Chromium (Debian's package),
//! a WAV file as its microphone, driven through the DevTools protocol
//! (`tests/chromium`), against the real daemon on loopback.
//!
//! - `/?start=1` starts a session without a click: ≥ 3 s of the model's
//!   audio decoded and played by the page's AudioWorklet, text in the
//!   transcript, the record shown after hang-up, and the daemon's log line
//!   with ≥ 60 frames each way; the page's screenshot for docs/browser.md.
//! - A full server: the page shows the server's own message.
//! - Built-in TLS with a self-signed certificate: the page over `https://`
//!   and `wss://`, started by a click, capturing through the AudioWorklet
//!   path; the certificate is replaced and reloaded by SIGHUP while the
//!   session runs, which goes on, while new connections get the new one.
//! - `listen.token`: the page asks for the token, the browser's WebSocket is
//!   refused without it and accepted with it (`auth_id`), the form and
//!   `?token=` both start a session, and the token never reaches the log.
//! - A denied microphone and a daemon that dies under the session are said
//!   in words.
//! - A model with a conditioner (the Hibiki fixture): its values and
//!   `cfg_coef` are offered and reach the daemon.
//!
//! Each test holds one browser at a time (about 6–12 s each; see docs/browser.md).

mod chromium;

use chromium::{need_chromium, write_voice_wav, Browser, Mic};
use moshid_testkit::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What the page says of itself.
const SNAPSHOT: &str = "window.moshid ? window.moshid.snapshot() : null";
/// Bound on every wait for the page.
const PAGE_TIMEOUT: Duration = Duration::from_secs(40);

fn voice(d: &Daemon) -> PathBuf {
    let wav = d.temp_dir().join("voice.wav");
    write_voice_wav(&wav, 6.0);
    wav
}

fn session(v: &Value) -> &Value {
    &v["session"]
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Waits for the page's session to be live and `ms` of the model's audio
/// to have been played.
fn wait_played(b: &mut Browser, ms: u64) -> Value {
    b.wait_for(
        &format!("{ms} ms of the model's audio played"),
        PAGE_TIMEOUT,
        SNAPSHOT,
        |v| session(v)["state"] == "live" && num(&session(v)["playedMs"]) >= ms,
    )
}

/// Waits for the page to say something in its error box; returns the snapshot.
fn wait_error(b: &mut Browser) -> Value {
    b.wait_for("an error on the page", PAGE_TIMEOUT, SNAPSHOT, |v| {
        v["errors"].as_array().is_some_and(|e| !e.is_empty())
    })
}

/// The first thing the page said in its error box.
fn first_error(v: &Value) -> &str {
    v["errors"][0].as_str().unwrap_or_default()
}

/// Clicks "Hang up" and waits for the record; returns the last snapshot.
fn hang_up(b: &mut Browser) -> Value {
    b.click("#hangup");
    b.wait_for("the session record", PAGE_TIMEOUT, SNAPSHOT, |v| {
        session(v)["state"] == "ended" && session(v)["record"].is_object()
    })
}

/// `frames_in` and `frames_out` of the daemon's log line for the session
/// that ended with `reason`.
fn logged_frames(d: &Daemon, reason: &str) -> (u64, u64) {
    let end = d.wait_record(Record::SessionEnd, &[("reason", reason)]);
    (end.u64("frames_in"), end.u64("frames_out"))
}

/// Checks a snapshot taken after the record arrived.
fn assert_recorded(v: &Value, min_frames: u64) {
    let s = session(v);
    let rec = &s["record"]["session"];
    assert_eq!(rec["end_reason"]["kind"], "input_finished", "{v:#}");
    assert!(num(&rec["frames_in"]) >= min_frames, "{v:#}");
    assert!(num(&rec["frames_out"]) >= min_frames, "{v:#}");
    assert_eq!(v["errors"], serde_json::json!([]), "{v:#}");
}

#[test]
fn start_param_runs_a_session_with_audio_text_and_record() {
    if !need_chromium() {
        return;
    }
    let d = daemon!().start();
    let mut b = Browser::launch(&voice(&d), &[]);
    let t0 = Instant::now();
    b.navigate(&d.url("/?start=1"));
    // 60 frames each way and some margin: 5.5 s of answers played.
    let live = wait_played(&mut b, 5_500);
    let s = session(&live);
    assert_eq!(s["capturePath"], "track-processor", "{live:#}");
    assert_eq!(
        s["audioContext"], "running",
        "a page capturing the microphone may play sound: {live:#}"
    );
    assert!(num(&s["decodedMs"]) >= 5_500, "{live:#}");
    assert!(
        !s["transcript"].as_str().unwrap_or("").trim().is_empty(),
        "no text in the transcript: {live:#}"
    );
    assert!(s["latencyMs"].is_u64(), "no round-trip measured: {live:#}");
    // The page's own record of the text and what the screen shows, read in
    // one evaluation: the session is live, so text read apart may differ by
    // a piece that arrived in between.
    let both = b.eval(
        "[window.moshid.snapshot().session.transcript, document.getElementById('transcript').textContent]",
    );
    assert_eq!(both[1], both[0], "the transcript on screen");
    let done = hang_up(&mut b);
    assert_recorded(&done, 60);
    // The picture shows the parameters too.
    b.eval("document.getElementById('params').open = true");
    let rows = b.eval(
        "document.getElementById('record-box').hidden ? 0 : document.getElementById('record').rows.length",
    );
    assert!(num(&rows) >= 8, "the record is not shown: {rows}");
    let (frames_in, frames_out) = logged_frames(&d, "input_finished");
    assert!(
        frames_in >= 60 && frames_out >= 60,
        "in {frames_in}, out {frames_out}"
    );
    screenshot(&mut b);
    let s = session(&done);
    eprintln!(
        "page session: {} ms of audio played, {} underruns, round trip p50 {} ms, {frames_in} frames in, {frames_out} out, {:.1} s from opening the page to the record",
        s["playedMs"],
        s["underruns"],
        s["latencyMs"],
        t0.elapsed().as_secs_f64()
    );
}

/// The page's picture: always under the target folder; also
/// `docs/page.png` (docs/browser.md's) with `MOSHID_UPDATE_SCREENSHOTS=1`.
fn screenshot(b: &mut Browser) {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("moshid-page.png");
    b.screenshot(&tmp);
    let png = std::fs::read(&tmp).expect("reading the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a blank screenshot?"
    );
    if std::env::var_os("MOSHID_UPDATE_SCREENSHOTS").is_some_and(|v| v == "1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/page.png");
        std::fs::copy(&tmp, &docs).expect("writing docs/page.png");
        eprintln!("wrote {}", docs.display());
    }
}

#[test]
fn a_full_server_shows_its_message() {
    if !need_chromium() {
        return;
    }
    let d = daemon!().args(["--max-slots", "1"]).start();
    // The only slot is taken.
    let holder = ChatClient::start(d.addr, "");
    let mut b = Browser::launch(&voice(&d), &[]);
    b.navigate(&d.url("/?start=1"));
    let v = wait_error(&mut b);
    assert_eq!(session(&v)["state"], "ended", "{v:#}");
    let shown = b.eval("document.getElementById('error').textContent");
    let shown = shown.as_str().unwrap_or_default();
    assert!(
        shown.starts_with("The server is full") && shown.contains("every stream slot is in use"),
        "the page says {shown:?}: {v:#}"
    );
    assert_eq!(
        v["connectEnabled"], true,
        "the page lets one try again: {v:#}"
    );
    assert_eq!(session(&v)["handshake"], false);
    holder.close();
}

/// A self-signed certificate for `localhost` and 127.0.0.1, written as
/// PEM; returns its DER and the base64 SHA-256 of its public key (the form
/// Chromium's `--ignore-certificate-errors-spki-list` takes).
struct TestCert {
    der: rustls::pki_types::CertificateDer<'static>,
    spki_sha256_b64: String,
    sha256_hex: String,
}

fn make_cert(cert_path: &Path, key_path: &Path) -> TestCert {
    use base64::Engine;
    let c = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("a self-signed certificate");
    // Written elsewhere and renamed: the daemon never reads half a file.
    let tmp_c = cert_path.with_extension("new");
    let tmp_k = key_path.with_extension("new");
    std::fs::write(&tmp_c, c.cert.pem()).unwrap();
    std::fs::write(&tmp_k, c.key_pair.serialize_pem()).unwrap();
    std::fs::rename(&tmp_c, cert_path).unwrap();
    std::fs::rename(&tmp_k, key_path).unwrap();
    let spki = ring::digest::digest(&ring::digest::SHA256, &c.key_pair.public_key_der());
    let leaf = ring::digest::digest(&ring::digest::SHA256, c.cert.der());
    TestCert {
        der: c.cert.der().clone(),
        spki_sha256_b64: base64::engine::general_purpose::STANDARD.encode(spki.as_ref()),
        sha256_hex: leaf.as_ref().iter().map(|b| format!("{b:02x}")).collect(),
    }
}

#[test]
fn built_in_tls_serves_the_page_and_reloads_on_sighup_without_dropping_it() {
    if !need_chromium() {
        return;
    }
    let certs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (cert_path, key_path) = (certs.path().join("cert.pem"), certs.path().join("key.pem"));
    let first = make_cert(&cert_path, &key_path);
    let config = serde_json::json!({"listen": {
        "tls_cert_file": cert_path, "tls_key_file": key_path
    }})
    .to_string();
    let d = daemon!()
        .config(&config)
        .tls(tls_client(&first.der))
        .start();
    assert_eq!(d.get_json("/health")["status"], "ok");

    // The second certificate exists from the start so that the browser can
    // be told to accept both keys.
    let next_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (next_cert, next_key) = (next_dir.path().join("c.pem"), next_dir.path().join("k.pem"));
    let second = make_cert(&next_cert, &next_key);
    let flag = format!(
        "--ignore-certificate-errors-spki-list={},{}",
        first.spki_sha256_b64, second.spki_sha256_b64
    );
    let mut b = Browser::launch(&voice(&d), &[flag]);
    b.navigate(&d.url("/?capture=worklet"));
    b.wait_for("the page to be ready", PAGE_TIMEOUT, SNAPSHOT, |v| {
        v["connectEnabled"] == true
    });
    assert_eq!(b.eval("location.protocol"), "https:");
    b.click("#connect");
    let before = wait_played(&mut b, 3_000);
    assert_eq!(session(&before)["capturePath"], "worklet", "{before:#}");

    // Renewal: new files in place, SIGHUP.
    std::fs::copy(&next_cert, &cert_path).unwrap();
    std::fs::copy(&next_key, &key_path).unwrap();
    d.signal("HUP");
    let reload = d.wait_record(Record::SighupReload, &[("outcome", "tls_reloaded")]);
    assert!(
        reload.str("certificate").contains(&second.sha256_hex),
        "{reload}"
    );
    // New handshakes get the new certificate, and only it.
    let mut s = open_stream(d.addr, Some(&tls_client(&second.der)))
        .expect("a handshake with the reloaded certificate");
    use std::io::{Read, Write};
    write!(
        s,
        "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let old = open_stream(d.addr, Some(&tls_client(&first.der)));
    assert!(old.is_err(), "the old certificate is still served");

    // The browser's session went on through the reload.
    let played = num(&session(&before)["playedMs"]);
    let after = wait_played(&mut b, played + 1_500);
    assert_eq!(session(&after)["handshake"], true);
    let done = hang_up(&mut b);
    assert_recorded(&done, 50);
    assert_eq!(
        d.records(Record::SighupReload, &[("outcome", "tls_reloaded")])
            .len(),
        1
    );
    eprintln!(
        "TLS page session: {} ms played across the reload, round trip p50 {} ms",
        session(&done)["playedMs"],
        session(&done)["latencyMs"]
    );
}

#[test]
fn a_token_protected_daemon_refuses_without_the_token_and_accepts_with_it() {
    if !need_chromium() {
        return;
    }
    const TOKEN: &str = "s3cret-Token_42";
    let d = daemon!().args(["--token", TOKEN]).start();
    let mut b = Browser::launch(&voice(&d), &[]);
    b.navigate(&d.url("/?start=1"));
    let v = b.wait_for(
        "the page to ask for the token",
        PAGE_TIMEOUT,
        SNAPSHOT,
        |v| v["tokenAsked"] == true,
    );
    assert!(
        v["errors"][0]
            .as_str()
            .is_some_and(|e| e.starts_with("Authentication needed")),
        "{v:#}"
    );
    assert_eq!(v["connectEnabled"], false);
    assert!(
        v["session"].is_null(),
        "no session without the token: {v:#}"
    );

    // The browser's own WebSocket: refused without the token, accepted with
    // it as `auth_id`.
    let probe = |token: &str| {
        format!(
            "new Promise((done) => {{
                const ws = new WebSocket(`ws://${{location.host}}/api/chat{token}`);
                ws.binaryType = 'arraybuffer';
                ws.onmessage = (e) => {{ done('message ' + new Uint8Array(e.data)[0]); ws.close(); }};
                ws.onclose = (e) => done('closed ' + e.code);
            }})"
        )
    };
    assert_eq!(b.eval(&probe("")), "closed 1006");
    assert_eq!(b.eval(&probe("?auth_id=wrong")), "closed 1006");
    assert_eq!(
        b.eval(&probe(&format!("?auth_id={TOKEN}"))),
        "message 0",
        "the handshake comes with the token"
    );

    // The form.
    b.eval("document.getElementById('token').focus()");
    b.type_text(TOKEN);
    b.click("#token-form button");
    wait_played(&mut b, 1_500);
    let done = hang_up(&mut b);
    assert_recorded(&done, 15);

    // `?token=`: taken, then gone from the address bar.
    b.eval("sessionStorage.clear()");
    b.navigate(&d.url(&format!("/?start=1&token={TOKEN}")));
    wait_played(&mut b, 1_000);
    let href = b.eval("location.href");
    assert!(
        !href.as_str().unwrap_or_default().contains(TOKEN),
        "the token stays in the address bar: {href}"
    );
    hang_up(&mut b);
    assert!(
        !d.stderr().contains(TOKEN),
        "the token appears in the daemon's log"
    );
}

#[test]
fn a_denied_microphone_and_a_lost_connection_are_said_in_words() {
    if !need_chromium() {
        return;
    }
    let d = daemon!().start();
    {
        let mut b = Browser::launch_with(Mic::Denied, &[]);
        b.navigate(&d.url("/?start=1"));
        let v = wait_error(&mut b);
        assert!(
            first_error(&v).starts_with("Microphone access was denied"),
            "{v:#}"
        );
        assert_eq!(v["connectEnabled"], true, "{v:#}");
    }
    let mut b = Browser::launch(&voice(&d), &[]);
    b.navigate(&d.url("/?start=1"));
    wait_played(&mut b, 1_000);
    // The daemon dies under the session.
    d.signal("KILL");
    let v = wait_error(&mut b);
    assert!(first_error(&v).starts_with("Connection lost"), "{v:#}");
    assert_eq!(session(&v)["state"], "ended");
}

#[test]
fn a_model_with_a_conditioner_offers_its_values_and_cfg_coef() {
    if !need_chromium() {
        return;
    }
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/hibiki-tiny");
    let model = fixture.to_str().expect("UTF-8 path");
    let config = r#"{"session": {"drain_max_frames": 6}}"#;
    let d = daemon!().args(["--model", model]).config(config).start();
    let mut b = Browser::launch(&voice(&d), &[]);
    b.navigate(&d.url("/"));
    let v = b.wait_for("the page to be ready", PAGE_TIMEOUT, SNAPSHOT, |v| {
        v["connectEnabled"] == true
    });
    assert_eq!(v["model"]["name"], "hibiki-tiny", "{v:#}");
    assert_eq!(v["model"]["type"], "hibiki");
    assert_eq!(v["model"]["frames_before_output"], 2);
    let offered = b.eval(
        "[...document.querySelector('select[name=\"condition.description\"]').options].map(o => o.value)",
    );
    assert_eq!(
        offered,
        serde_json::json!(["", "very_bad", "bad", "neutral", "good", "very_good"])
    );
    assert_eq!(b.eval("document.getElementById('cfg-row').hidden"), false);
    // Choose a value and a guidance coefficient; the daemon takes them (a
    // bad one would end the session with `bad_parameters`).
    b.eval(
        "document.querySelector('select[name=\"condition.description\"]').value = 'very_good';
         document.querySelector('input[name=cfg_coef]').value = '3'",
    );
    b.click("#connect");
    wait_played(&mut b, 1_000);
    let url = b.eval("window.moshid.last.ws.url");
    let url = url.as_str().unwrap_or_default();
    assert!(
        url.contains("condition.description=very_good") && url.contains("cfg_coef=3"),
        "{url}"
    );
    let done = hang_up(&mut b);
    assert_recorded(&done, 10);
    let answered = num(&session(&done)["answeredFrames"]);
    assert!(answered >= 10, "{done:#}");
}
