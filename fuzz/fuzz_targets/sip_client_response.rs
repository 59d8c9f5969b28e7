//! A SIP response as the client side reads it — the answers to the
//! INVITEs and REGISTERs moshid sends: its challenges
//! (`client_auth::pick`, then the answer moshid would write), its SDP
//! answer to moshid's offer (`sdp::accept_answer`) and a REGISTER's
//! granted lifetime (`register::granted_expires`).
//!
//! Checked: no panic; an answer moshid writes to a challenge parses back
//! with the server side's own parser (one quoted-string grammar,
//! `quoted_string`), with the challenge's realm, nonce and opaque, and as
//! a Digest response when it uses `qop=auth`; a codec taken from an answer is one moshid offered, on the
//! payload type it offered; a lifetime is never longer than asked.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid_telephony::sip::auth_header::{self, DigestResponse};
use moshid::transport::sip::client_auth;
use moshid::config::sip::SipClientCredentials;
use moshid::transport::sip::register;
use moshid_telephony::sip::{message, sdp};

const PREFS: [&str; 4] = ["opus", "PCMU", "PCMA", "L16"];

fuzz_target!(|data: &[u8]| {
    let Ok(m) = message::parse(data) else {
        return;
    };
    let creds = SipClientCredentials {
        username: "moshid".into(),
        password: "pw".into(),
    };
    for code in [401, 407] {
        if let Ok(mut c) = client_auth::pick(&m, code) {
            let line = c
                .answer(&creds, "INVITE", "sip:a@127.0.0.1", "0123abcd")
                .expect("a picked challenge is answerable");
            let value = line.split_once(": ").expect("a header line").1;
            let parsed = auth_header::parse(value).expect("moshid's answer parses");
            // The values went out escaped and came back as they were.
            assert_eq!(parsed.param("realm"), Some(c.realm.as_str()));
            assert_eq!(parsed.param("nonce"), Some(c.nonce.as_str()));
            assert_eq!(parsed.param("opaque"), c.opaque.as_deref());
            if c.qop_auth {
                DigestResponse::from_credentials(&parsed).expect("a Digest response");
            }
        }
    }
    let prefs: Vec<String> = PREFS.iter().map(|s| s.to_string()).collect();
    let offer = sdp::write_offer(&prefs, true, 20, "127.0.0.1:40000".parse().unwrap(), 1);
    if let Ok((_, choice)) = sdp::accept_answer(&offer, &m.body, &prefs, true, 20) {
        let ours = sdp::parse_offer(offer.as_bytes()).expect("moshid's offer parses");
        assert!(ours.formats.iter().any(|f| f.pt == choice.pt), "{choice:?}");
    }
    assert!(register::granted_expires(&m, 600) <= 600);
});
