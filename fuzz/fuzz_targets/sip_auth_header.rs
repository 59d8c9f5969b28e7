//! An `Authorization` header value through the endpoint's parser
//! (`auth_header::parse`), its Digest view (`DigestResponse`), and the
//! whole verification of an INVITE that carries it (`Authenticator::verify`,
//! with moshid's nonces and digest code behind it).
//!
//! Checked: no panic; a parsed header written back (every value quoted by
//! moshid's one writer, `quoted_string`) parses to the same scheme and
//! parameters; a header nobody could have computed never authenticates.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid::transport::sip::auth::{Authenticator, Verdict};
use moshid_telephony::sip::auth_header::{self, DigestResponse};
use moshid::config::sip::SipAuthConfig;
use moshid_telephony::sip::message;
use moshid_telephony::sip::quoted_string::quoted;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

fn authenticator() -> &'static Mutex<Authenticator> {
    static A: OnceLock<Mutex<Authenticator>> = OnceLock::new();
    A.get_or_init(|| {
        let c = SipAuthConfig {
            credentials: [("alice".to_string(), "s3cret".to_string())].into(),
            ..SipAuthConfig::default()
        };
        Mutex::new(Authenticator::new(&c, Instant::now()).expect("a random source"))
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = auth_header::parse(text) {
        let written: Vec<String> = c
            .params
            .iter()
            .map(|(n, v)| format!("{n}={}", quoted(v).expect("a parsed value is writable")))
            .collect();
        let again = format!("{} {}", c.scheme, written.join(", "));
        let back = auth_header::parse(&again).expect("a written-back header parses");
        assert_eq!(back, c);
        let _ = DigestResponse::from_credentials(&c);
    }
    // The same value in an INVITE (when it fits on one header line).
    if text.contains(['\r', '\n']) {
        return;
    }
    let invite = format!(
        "INVITE sip:moshi@127.0.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK1\r\n\
         From: <sip:a@127.0.0.1>;tag=1\r\nTo: <sip:moshi@127.0.0.1>\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\n\
         Authorization: {text}\r\nContent-Length: 0\r\n\r\n"
    );
    let Ok(Some(req)) = message::parse_request(invite.as_bytes()) else {
        return;
    };
    let mut a = authenticator().lock().unwrap_or_else(|p| p.into_inner());
    let verdict = a.verify(&req, Instant::now());
    // No nonce was ever issued by this authenticator's key for the input
    // to answer, so nothing can be a caller.
    assert!(!matches!(verdict, Verdict::Caller(_)), "{verdict:?}");
});
