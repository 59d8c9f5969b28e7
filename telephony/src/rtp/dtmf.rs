//! RFC 4733 telephone-events (DTMF) received on the session's
//! `dtmf_payload_type`.
//!
//! An event is identified by its RTP timestamp (the event's start; every
//! packet of one event carries it, with a growing duration). The end is the
//! E bit; senders repeat the end packet (typically 3×) and many carriers
//! never set the marker bit on the first packet, so detection relies on the
//! timestamp and the E bit only: a digit is reported once, when its first
//! end packet arrives; further packets with that timestamp are ignored. An
//! event whose end packets were all lost is reported (with `ended: false`)
//! when the next event starts or when the session ends.
//!
//! Invariants: constant memory; at most one event reported per timestamp.

use serde::Serialize;

/// A telephone event that ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DtmfEvent {
    /// The digit or symbol (`0`–`9`, `*`, `#`, `A`–`D`; `?` for other events).
    pub digit: char,
    /// The event code (0–15 are DTMF).
    pub event: u8,
    /// Duration in RTP clock ticks.
    pub duration_ticks: u32,
    /// Duration in milliseconds.
    pub duration_ms: u32,
    /// Volume, in −dBm0 (0–63).
    pub volume: u8,
    /// The RTP timestamp of the event's start.
    pub rtp_timestamp: u32,
    /// Whether an end packet was received (false: inferred).
    pub ended: bool,
}

/// Why a telephone-event payload was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("telephone-event payload shorter than 4 bytes")]
pub struct DtmfError;

/// The digit of an event code.
pub fn digit_of(event: u8) -> char {
    match event {
        0..=9 => (b'0' + event) as char,
        10 => '*',
        11 => '#',
        12..=15 => (b'A' + event - 12) as char,
        _ => '?',
    }
}

#[derive(Debug, Clone, Copy)]
struct Current {
    ts: u32,
    event: u8,
    duration: u16,
    volume: u8,
}

/// Detects the events of one stream.
#[derive(Debug, Clone)]
pub struct DtmfDetector {
    clock_hz: u32,
    current: Option<Current>,
    reported_ts: Option<u32>,
}

impl DtmfDetector {
    /// A detector for events timed in `clock_hz` ticks.
    pub fn new(clock_hz: u32) -> Self {
        DtmfDetector {
            clock_hz,
            current: None,
            reported_ts: None,
        }
    }

    fn event(&self, c: Current, ended: bool) -> DtmfEvent {
        DtmfEvent {
            digit: digit_of(c.event),
            event: c.event,
            duration_ticks: c.duration as u32,
            duration_ms: (c.duration as u64 * 1000 / self.clock_hz.max(1) as u64) as u32,
            volume: c.volume,
            rtp_timestamp: c.ts,
            ended,
        }
    }

    /// Takes one telephone-event packet; calls `report` for each event that
    /// ended (at most two: an unterminated previous one and this one).
    pub fn on_packet(
        &mut self,
        timestamp: u32,
        payload: &[u8],
        mut report: impl FnMut(DtmfEvent),
    ) -> Result<(), DtmfError> {
        if payload.len() < 4 {
            return Err(DtmfError);
        }
        // Events are ordered by their RTP timestamp (serial arithmetic): a
        // packet of an event at or before the last reported one is a repeat
        // or a straggler (a late end of a digit already reported).
        if let Some(reported) = self.reported_ts {
            if (timestamp.wrapping_sub(reported) as i32) <= 0 {
                return Ok(());
            }
        }
        let c = Current {
            ts: timestamp,
            event: payload[0],
            duration: u16::from_be_bytes([payload[2], payload[3]]),
            volume: payload[1] & 0x3F,
        };
        let end = payload[1] & 0x80 != 0;
        if let Some(prev) = self.current {
            if prev.ts != timestamp {
                report(self.event(prev, false));
                self.reported_ts = Some(prev.ts);
                self.current = None;
            }
        }
        if end {
            report(self.event(c, true));
            self.reported_ts = Some(timestamp);
            self.current = None;
        } else {
            self.current = Some(c);
        }
        Ok(())
    }

    /// A new RTP stream (SSRC change): its timestamps start anywhere, so the
    /// order of the old stream's events means nothing for it.
    pub fn restart(&mut self, report: impl FnMut(DtmfEvent)) {
        self.flush(report);
        self.reported_ts = None;
    }

    /// Reports an event still running (the session ends).
    pub fn flush(&mut self, mut report: impl FnMut(DtmfEvent)) {
        if let Some(c) = self.current.take() {
            report(self.event(c, false));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(event: u8, end: bool, duration: u16) -> [u8; 4] {
        let d = duration.to_be_bytes();
        [event, ((end as u8) << 7) | 10, d[0], d[1]]
    }

    #[test]
    fn reports_once_despite_repeated_ends_and_no_marker() {
        let mut d = DtmfDetector::new(8000);
        let mut got = Vec::new();
        for (ts, ev) in [(1000u32, 1u8), (5000, 11), (9000, 9)] {
            for dur in [160u16, 320, 480, 640] {
                d.on_packet(ts, &pkt(ev, false, dur), |e| got.push(e))
                    .unwrap();
            }
            for _ in 0..3 {
                d.on_packet(ts, &pkt(ev, true, 800), |e| got.push(e))
                    .unwrap();
            }
        }
        let digits: String = got.iter().map(|e| e.digit).collect();
        assert_eq!(digits, "1#9");
        assert!(got
            .iter()
            .all(|e| e.ended && e.duration_ms == 100 && e.volume == 10));
    }

    #[test]
    fn a_lost_end_is_inferred() {
        let mut d = DtmfDetector::new(8000);
        let mut got = Vec::new();
        d.on_packet(100, &pkt(5, false, 160), |e| got.push(e))
            .unwrap();
        d.on_packet(100, &pkt(5, false, 320), |e| got.push(e))
            .unwrap();
        d.on_packet(900, &pkt(10, false, 160), |e| got.push(e))
            .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].digit, got[0].ended, got[0].duration_ticks),
            ('5', false, 320)
        );
        d.flush(|e| got.push(e));
        assert_eq!(got[1].digit, '*');
        assert!(d.on_packet(1, &[1, 2], |_| {}).is_err());
    }

    #[test]
    fn a_late_end_of_an_earlier_digit_is_not_reported_again() {
        let mut d = DtmfDetector::new(8000);
        let mut got = Vec::new();
        d.on_packet(1000, &pkt(1, false, 160), |e| got.push(e.digit))
            .unwrap();
        // Digit B starts before A's end arrived: A is reported as inferred.
        d.on_packet(2000, &pkt(2, false, 160), |e| got.push(e.digit))
            .unwrap();
        d.on_packet(2000, &pkt(2, true, 800), |e| got.push(e.digit))
            .unwrap();
        // A's end packet turns up late, then again (ends are repeated).
        for _ in 0..3 {
            d.on_packet(1000, &pkt(1, true, 800), |e| got.push(e.digit))
                .unwrap();
        }
        assert_eq!(got, vec!['1', '2']);
    }
}
