//! An SDP offer through `parse_offer`, `negotiate` (every codec order) and
//! `write_answer`.
//!
//! Checked: no panic; a chosen payload type is one the offer has and not
//! in RTCP's range; an answer parses back (by the same parser) with the
//! chosen payload type first.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid_telephony::sip::sdp::{negotiate, parse_offer, write_answer, Negotiation};

fuzz_target!(|data: &[u8]| {
    let Ok(offer) = parse_offer(data) else {
        return;
    };
    let prefs: Vec<String> = ["opus", "PCMU", "PCMA", "L16"].iter().map(|s| s.to_string()).collect();
    if let Negotiation::Agreed(c) = negotiate(&offer, &prefs, true, 20) {
        assert!(offer.formats.iter().any(|f| f.pt == c.pt));
        assert!(!(72..=95).contains(&c.pt));
        let answer = write_answer(&offer, &c, "127.0.0.1:4000".parse().unwrap(), 1, 1);
        let back = parse_offer(answer.as_bytes()).expect("moshid's answer parses");
        assert_eq!(back.formats.first().map(|f| f.pt), Some(c.pt));
    }
});
