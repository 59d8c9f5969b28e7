//! The page's server side without a browser: the embedded assets and their
//! headers, `GET /v1/model`, the token (headers and `auth_id`), built-in TLS
//! (plain HTTP to the TLS port, the handshake timeout, a certificate that
//! cannot be used) and SIGHUP. The browser itself: `e2e_browser.rs`.

use moshid_testkit::prelude::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "tok-9f2c";

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Status of a WebSocket upgrade of `path` (101 when accepted).
fn upgrade_status(d: &Daemon, path: &str, headers: &[&str]) -> u16 {
    let mut h = vec![
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
    ];
    h.extend_from_slice(headers);
    let mut s = d.open();
    let extra: String = h.iter().map(|l| format!("{l}\r\n")).collect();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n").unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n") {
        match s.read(&mut byte) {
            Ok(1) => got.push(byte[0]),
            _ => break,
        }
    }
    let line = String::from_utf8_lossy(&got).into_owned();
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {line:?}"))
}

#[test]
fn the_page_is_public_and_the_rest_needs_the_token() {
    let d = daemon!().args(["--token", TOKEN]).start();
    for path in [
        "/",
        "/index.html",
        "/assets/app.js",
        "/assets/ogg.js",
        "/assets/worklets.js",
        "/assets/style.css",
    ] {
        let (status, head, body) = d.http_request("GET", path, &[]);
        assert_eq!(status, 200, "{path}: {head}");
        assert!(!body.is_empty(), "{path}");
        let csp = header(&head, "content-security-policy").expect("a CSP");
        assert!(csp.contains("default-src 'none'") && csp.contains("script-src 'self'"));
        assert_eq!(header(&head, "x-content-type-options"), Some("nosniff"));
        assert_eq!(header(&head, "referrer-policy"), Some("no-referrer"));
        let ct = header(&head, "content-type").unwrap();
        let want = if path.ends_with(".js") {
            "text/javascript"
        } else if path.ends_with(".css") {
            "text/css"
        } else {
            "text/html"
        };
        assert!(ct.starts_with(want), "{path}: {ct}");
    }
    assert_eq!(d.http_request("POST", "/", &[]).0, 405);
    assert_eq!(
        d.http_get("/assets/nothing.js").0,
        401,
        "not an asset: guarded"
    );

    // The model description: behind the token, by either header.
    assert_eq!(d.http_get("/v1/model").0, 401);
    let (status, body) = d.http_get_with("/v1/model", &[&format!("Authorization: Bearer {TOKEN}")]);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let m = &v["model"];
    assert_eq!(m["name"], "demo");
    assert_eq!(m["type"], "moshi");
    assert_eq!(m["demo"], true);
    assert_eq!(m["sample_rate_hz"], 24_000);
    assert_eq!(m["frames_before_output"], 1);
    assert_eq!(m["conditioners"], serde_json::json!([]));
    assert_eq!(v["defaults"]["text_temperature"], 0.7);
    assert_eq!(v["defaults"]["audio_topk"], 250);
    let (status, _) = d.http_get_with("/v1/model", &[&format!("kyutai-api-key: {TOKEN}")]);
    assert_eq!(status, 200);
    assert!(
        !body.contains("/work") && !body.contains(".cache"),
        "no paths: {body}"
    );

    // `auth_id`: for WebSocket upgrades (browsers cannot set headers), and
    // only for them.
    assert_eq!(upgrade_status(&d, "/api/chat", &[]), 401);
    assert_eq!(upgrade_status(&d, "/api/chat?auth_id=nope", &[]), 401);
    assert_eq!(
        upgrade_status(&d, &format!("/api/chat?auth_id={TOKEN}"), &[]),
        101
    );
    assert_eq!(
        upgrade_status(&d, &format!("/api/chat?seed=3&auth_id={TOKEN}"), &[]),
        101
    );
    assert_eq!(
        upgrade_status(&d, &format!("/v1/media-stream?auth_id={TOKEN}"), &[]),
        101
    );
    assert_eq!(d.http_get(&format!("/capacity?auth_id={TOKEN}")).0, 401);
    // A header that is wrong is not rescued by a right `auth_id`.
    assert_eq!(
        upgrade_status(
            &d,
            &format!("/api/chat?auth_id={TOKEN}"),
            &["Authorization: Bearer wrong"]
        ),
        401
    );
    d.wait_record(Record::SessionEnd, &[]);
    assert!(!d.stderr().contains(TOKEN), "the token is in the log");
}

fn write_cert(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, rcgen::CertifiedKey) {
    let c =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.key_pair.serialize_pem()).unwrap();
    (cert, key, c)
}

#[test]
fn tls_listener_redirects_plain_http_and_times_out_silent_handshakes() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (cert, key, c) = write_cert(dir.path());
    let config = serde_json::json!({"listen": {
        "tls_cert_file": cert, "tls_key_file": key, "tls_handshake_timeout_ms": 300
    }})
    .to_string();
    let d = daemon!()
        .config(&config)
        .tls(tls_client(c.cert.der()))
        .start();
    assert_eq!(d.get_json("/capacity")["capacity"]["max_slots"], 8);
    assert_eq!(d.http_get("/").0, 200, "the page over https");

    // Plain HTTP to the TLS port: sent to https://.
    let mut s = TcpStream::connect(d.addr).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    write!(
        s,
        "GET /?start=1 HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
        d.addr.port()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 308"), "{answer}");
    let location = header(&answer, "location").unwrap();
    assert_eq!(
        location,
        format!("https://127.0.0.1:{}/?start=1", d.addr.port())
    );
    let mut s = TcpStream::connect(d.addr).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    write!(s, "POST /admin/metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("TLS only"),
        "{answer}"
    );

    // A client that opens a connection and says nothing is closed after
    // `listen.tls_handshake_timeout_ms`, and others are served meanwhile.
    let mut silent = TcpStream::connect(d.addr).unwrap();
    silent.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let t = Instant::now();
    assert_eq!(d.get_json("/health")["status"], "ok");
    let mut buf = [0u8; 16];
    let n = silent.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < IO_TIMEOUT,
        "closed after {waited:?}"
    );
    d.wait_log_text("no TLS handshake within 300ms", Duration::from_secs(5));
}

#[test]
fn a_certificate_that_cannot_be_used_fails_the_start_naming_the_key() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (cert, _key, _) = write_cert(dir.path());
    let run = |listen: serde_json::Value| {
        let path = dir.path().join("config.json");
        std::fs::write(&path, serde_json::json!({ "listen": listen }).to_string()).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_moshid"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(
        serde_json::json!({"tls_cert_file": cert, "tls_key_file": dir.path().join("missing.pem")}),
    );
    assert!(
        e.contains("listen.tls_key_file") && e.contains("missing.pem"),
        "{e}"
    );
    let e = run(serde_json::json!({"tls_cert_file": cert}));
    assert!(e.contains("listen.tls_key_file"), "{e}");
    // The key given as the certificate.
    let e =
        run(serde_json::json!({"tls_cert_file": dir.path().join("key.pem"), "tls_key_file": cert}));
    assert!(e.contains("listen.tls_cert_file"), "{e}");
}

#[test]
fn sighup_without_tls_is_logged_and_harmless() {
    let d = daemon!().start();
    d.signal("HUP");
    d.wait_record(Record::SighupReload, &[("outcome", "nothing_to_reload")]);
    assert_eq!(d.get_json("/health")["status"], "ok");
    let status = d.stop();
    assert!(status.success(), "{status:?}");
}
