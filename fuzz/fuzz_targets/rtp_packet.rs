//! RTP datagrams (RFC 3550, RTCP muxed per RFC 5761) and RFC 4733
//! telephone-events: `transport::rtp::packet::parse` / `is_rtcp`, then the
//! DTMF detector for packets of its payload type.
//! Input: `[dtmf_payload_type, (u16 length, datagram)...]`.
//!
//! Checked: no panic; the payload lies inside the datagram after the headers
//! it announces; a digit is never reported twice in a row for one
//! timestamp; reported fields stay in their ranges.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid_telephony::rtp::dtmf::{digit_of, DtmfDetector, DtmfEvent};
use moshid_telephony::rtp::packet::{is_rtcp, parse, HEADER_BYTES};
use moshid_fuzz::messages;

fuzz_target!(|data: &[u8]| {
    let [dtmf_pt, rest @ ..] = data else { return };
    let dtmf_pt = dtmf_pt & 0x7F;
    let mut detector = DtmfDetector::new(8000);
    let mut last: Option<DtmfEvent> = None;
    let mut check = |e: DtmfEvent| {
        assert_eq!(e.digit, digit_of(e.event));
        assert!(e.volume <= 63);
        assert!(e.duration_ms as u64 <= u16::MAX as u64 * 1000 / 8000 + 1);
        if let Some(prev) = last {
            assert!(
                prev.rtp_timestamp != e.rtp_timestamp || !prev.ended,
                "digit at {} reported twice in a row",
                e.rtp_timestamp
            );
        }
        last = Some(e);
    };
    for datagram in messages(rest) {
        if is_rtcp(datagram) {
            continue;
        }
        let Ok(p) = parse(datagram) else { continue };
        let base = datagram.as_ptr() as usize;
        let start = p.payload.as_ptr() as usize - base;
        assert!(start >= HEADER_BYTES + 4 * (datagram[0] & 0x0F) as usize);
        assert!(start + p.payload.len() <= datagram.len());
        assert!(p.payload_type < 128);
        if p.payload_type == dtmf_pt {
            let _ = detector.on_packet(p.timestamp, p.payload, &mut check);
        }
    }
    detector.flush(&mut check);
});
