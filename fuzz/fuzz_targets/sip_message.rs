//! A SIP datagram (or a message framed out of a TCP stream, see
//! `sip_tcp_framing`) through the endpoint's parsers: the message (`parse`), the request view and its checks
//! (`parse_request`, `check`, the Request-URI), and a response built from
//! whatever was accepted.
//!
//! Checked: no panic; a
//! response built for an accepted request parses back with the same
//! Call-ID and CSeq.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid_telephony::sip::{build, message};

fuzz_target!(|data: &[u8]| {
    let Ok(Some(req)) = message::parse_request(data) else {
        return;
    };
    let _ = req.check();
    let out = build::response(&req, 400, Some("t"), &[], None);
    let back = message::parse(&out).expect("a response moshid writes parses");
    // A Call-ID or CSeq with a line break cannot come out of the parser.
    assert_eq!(back.header("Call-ID"), Some(req.call_id.as_str()));
    assert_eq!(back.header("CSeq").map(|c| c.split_whitespace().next()), Some(Some(req.cseq.to_string().as_str())));
});
