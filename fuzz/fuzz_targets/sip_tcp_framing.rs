//! A TCP stream through the SIP framer (`transport::sip::framing`), fed in
//! pieces whose sizes come from the input's first byte, as reads would cut
//! it.
//!
//! Checked: no panic; every message is within `sip.max_message_bytes` and
//! is a prefix-free cut of the stream (what was fed comes out as messages,
//! pings and skipped CR/LF bytes, never more); the buffer stays within the
//! limit plus one piece; a failed framer stays failed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid_telephony::sip::framing::{Frame, Framer};

const MAX: usize = 2048;

fuzz_target!(|data: &[u8]| {
    let Some((&step, stream)) = data.split_first() else {
        return;
    };
    let step = usize::from(step % 64) + 1;
    let mut f = Framer::new(MAX);
    let mut out = 0usize;
    for piece in stream.chunks(step) {
        f.push(piece);
        assert!(f.buffered() <= MAX + step + 4);
        loop {
            match f.next_frame() {
                Ok(None) => break,
                Ok(Some(Frame::Ping)) => out += 4,
                Ok(Some(Frame::Message(m))) => {
                    assert!(!m.is_empty() && m.len() <= MAX);
                    out += m.len();
                }
                Err(_) => {
                    assert!(f.next_frame().is_err(), "a failed framer stays failed");
                    return;
                }
            }
        }
        assert!(out + f.buffered() <= stream.len());
    }
});
