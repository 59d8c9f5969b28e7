//! The outgoing RTP stream: model audio (already at the codec's media rate)
//! queued, cut into packets of `ptime`, encoded and given RTP headers.
//!
//! * Random initial SSRC, sequence number and timestamp (RFC 3550 §5.1);
//!   the sequence number grows by one and the timestamp by the packet's
//!   duration in the codec's RTP clock per packet (Opus: 48 kHz, so 960 per
//!   20 ms), whatever the packet carries.
//! * Until the model has audio, and whenever its audio runs dry, the packet
//!   carries the codec's silence ("comfort silence"), so that the far end
//!   sees an unbroken stream paced at `ptime`.
//! * Talk resumes one packet after audio is queued (a packet of slack
//!   against the 80 ms arrival granularity of model frames), and the first
//!   packet of each talkspurt — and of the stream — has the marker bit.
//!
//! Invariants: the queue is bounded (4 model frames plus a packet; beyond
//! it the oldest audio is dropped and counted); building a packet never
//! allocates.

use super::packet::{write_header, HEADER_BYTES};
use crate::{CodecError, CodecSpec, MediaEncoder};

/// Counters of the outgoing stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboundStats {
    /// Packets built.
    pub packets: u64,
    /// Of which comfort silence.
    pub comfort_silence: u64,
    /// Talkspurts that ran dry.
    pub underruns: u64,
    /// Samples dropped from a full queue.
    pub overflow_samples: u64,
    /// Encoder failures (silence sent instead).
    pub encode_errors: u64,
}

/// Random starting values of a stream.
#[derive(Debug, Clone, Copy)]
pub struct StreamStart {
    /// SSRC.
    pub ssrc: u32,
    /// First sequence number.
    pub sequence: u16,
    /// First timestamp.
    pub timestamp: u32,
}

impl StreamStart {
    /// Fresh random values.
    pub fn random() -> Self {
        let r = random_u64();
        let r2 = random_u64();
        StreamStart {
            ssrc: r as u32,
            sequence: (r >> 32) as u16,
            timestamp: r2 as u32,
        }
    }
}

/// 64 random bits from the standard library's per-process random keys and
/// the clock (no RNG crate needed for stream identifiers).
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// One session's outgoing stream.
pub struct Outbound {
    encoder: MediaEncoder,
    payload_type: u8,
    packet_media: usize,
    ts_step: u32,
    ssrc: u32,
    seq: u16,
    ts: u32,
    marker_next: bool,
    playing: bool,
    armed: bool,
    stateless_silence: bool,
    fifo: Vec<f32>,
    head: usize,
    len: usize,
    pcm: Vec<f32>,
    buf: Vec<u8>,
    stats: OutboundStats,
}

impl Outbound {
    /// A stream of `spec` at `ptime_ms`, fed model frames of `frame_media`
    /// samples.
    pub fn new(
        spec: CodecSpec,
        payload_type: u8,
        ptime_ms: u32,
        frame_media: usize,
        start: StreamStart,
    ) -> Result<Self, CodecError> {
        spec.check_ptime(ptime_ms)?;
        let encoder = MediaEncoder::new(spec)?;
        let packet_media = spec.media_samples(ptime_ms);
        let mut probe = [0u8; 4];
        let stateless_silence = encoder.stateless_silence(0, &mut probe).is_some();
        Ok(Outbound {
            encoder,
            payload_type,
            packet_media,
            ts_step: packet_media as u32 * spec.rtp_per_media(),
            ssrc: start.ssrc,
            seq: start.sequence,
            ts: start.timestamp,
            marker_next: true,
            playing: false,
            armed: false,
            stateless_silence,
            fifo: vec![0.0; 4 * frame_media + packet_media],
            head: 0,
            len: 0,
            pcm: vec![0.0; packet_media],
            buf: vec![0; HEADER_BYTES + spec.max_payload_bytes(ptime_ms)],
            stats: OutboundStats::default(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> &OutboundStats {
        &self.stats
    }

    /// The stream's SSRC.
    pub fn ssrc(&self) -> u32 {
        self.ssrc
    }

    /// Media samples per packet.
    pub fn packet_samples(&self) -> usize {
        self.packet_media
    }

    /// Audio queued, in media samples.
    pub fn queued(&self) -> usize {
        self.len
    }

    /// Queues model audio (media rate).
    pub fn push_audio(&mut self, pcm: &[f32]) {
        let cap = self.fifo.len();
        let pcm = if pcm.len() > cap {
            self.stats.overflow_samples += (pcm.len() - cap) as u64;
            &pcm[pcm.len() - cap..]
        } else {
            pcm
        };
        let over = (self.len + pcm.len()).saturating_sub(cap);
        if over > 0 {
            self.head = (self.head + over) % cap;
            self.len -= over;
            self.stats.overflow_samples += over as u64;
        }
        let mut w = (self.head + self.len) % cap;
        for &x in pcm {
            self.fifo[w] = x;
            w += 1;
            if w == cap {
                w = 0;
            }
        }
        self.len += pcm.len();
    }

    fn pop_packet(&mut self) {
        let cap = self.fifo.len();
        for (i, o) in self.pcm.iter_mut().enumerate() {
            *o = self.fifo[(self.head + i) % cap];
        }
        self.head = (self.head + self.packet_media) % cap;
        self.len -= self.packet_media;
    }

    /// Skips `packets` packet times that could not be sent (the executor
    /// was late): their audio is dropped and the timestamp moves on, so the
    /// far end stays in step with the wall clock.
    pub fn skip(&mut self, packets: u32) {
        self.ts = self.ts.wrapping_add(self.ts_step.wrapping_mul(packets));
        let drop = (packets as usize * self.packet_media).min(self.len);
        let cap = self.fifo.len();
        self.head = (self.head + drop) % cap;
        self.len -= drop;
        self.marker_next = true;
    }

    /// Builds the packet to send now.
    pub fn next_packet(&mut self) -> &[u8] {
        let n = self.packet_media;
        if !self.playing {
            if self.len >= n {
                if self.armed {
                    self.playing = true;
                    self.marker_next = true;
                } else {
                    self.armed = true;
                }
            }
        } else if self.len < n {
            self.playing = false;
            self.armed = false;
            self.stats.underruns += 1;
        }
        let mut payload = None;
        if self.playing {
            self.pop_packet();
            match self
                .encoder
                .encode(&self.pcm, &mut self.buf[HEADER_BYTES..])
            {
                Ok(b) => payload = Some(b),
                Err(_) => self.stats.encode_errors += 1,
            }
        }
        let bytes = match payload {
            Some(b) => b,
            None => {
                self.stats.comfort_silence += 1;
                if self.stateless_silence {
                    self.encoder
                        .stateless_silence(n, &mut self.buf[HEADER_BYTES..])
                        .unwrap_or(0)
                } else {
                    self.pcm.fill(0.0);
                    match self
                        .encoder
                        .encode(&self.pcm, &mut self.buf[HEADER_BYTES..])
                    {
                        Ok(b) => b,
                        Err(_) => {
                            self.stats.encode_errors += 1;
                            0
                        }
                    }
                }
            }
        };
        write_header(
            &mut self.buf,
            self.marker_next,
            self.payload_type,
            self.seq,
            self.ts,
            self.ssrc,
        );
        self.marker_next = false;
        self.seq = self.seq.wrapping_add(1);
        self.ts = self.ts.wrapping_add(self.ts_step);
        self.stats.packets += 1;
        &self.buf[..HEADER_BYTES + bytes]
    }
}

#[cfg(test)]
mod tests {
    use super::super::packet::parse;
    use super::*;
    use crate::g711::Law;

    #[test]
    fn paced_stream_with_comfort_silence_and_talkspurts() {
        let start = StreamStart {
            ssrc: 77,
            sequence: 65_534,
            timestamp: u32::MAX - 200,
        };
        let mut o = Outbound::new(CodecSpec::PCMU, 0, 20, 640, start).unwrap();
        let mut seen = Vec::new();
        let grab = |o: &mut Outbound| {
            let p = parse(o.next_packet()).unwrap();
            let mut pcm = [0f32; 160];
            Law::Mu.decode(p.payload, &mut pcm);
            (p.marker, p.sequence, p.timestamp, p.payload.len(), pcm[0])
        };
        // Two packets of silence (the first has the marker).
        seen.push(grab(&mut o));
        seen.push(grab(&mut o));
        // A model frame arrives: one packet of slack, then four of talk.
        o.push_audio(&[0.25; 640]);
        for _ in 0..6 {
            seen.push(grab(&mut o));
        }
        let markers: Vec<bool> = seen.iter().map(|s| s.0).collect();
        assert_eq!(
            markers,
            [true, false, false, true, false, false, false, false]
        );
        let talk: Vec<bool> = seen.iter().map(|s| s.4 > 0.2).collect();
        assert_eq!(talk, [false, false, false, true, true, true, true, false]);
        for w in seen.windows(2) {
            assert_eq!(w[1].1, w[0].1.wrapping_add(1));
            assert_eq!(w[1].2, w[0].2.wrapping_add(160));
            assert_eq!(w[1].3, 160);
        }
        assert_eq!(o.stats().underruns, 1);
        assert_eq!(o.stats().comfort_silence, 4);
    }

    #[test]
    fn opus_timestamps_use_the_48_khz_clock() {
        let start = StreamStart {
            ssrc: 1,
            sequence: 0,
            timestamp: 0,
        };
        let mut o = Outbound::new(CodecSpec::OPUS, 111, 20, 1920, start).unwrap();
        let a = parse(o.next_packet()).unwrap().timestamp;
        let b = parse(o.next_packet()).unwrap().timestamp;
        assert_eq!(b - a, 960);
        o.skip(2);
        let c = parse(o.next_packet()).unwrap();
        assert_eq!(c.timestamp - b, 3 * 960);
        assert!(c.marker);
    }

    #[test]
    fn the_queue_is_bounded() {
        let start = StreamStart {
            ssrc: 1,
            sequence: 0,
            timestamp: 0,
        };
        let mut o = Outbound::new(CodecSpec::PCMA, 8, 20, 640, start).unwrap();
        for _ in 0..10 {
            o.push_audio(&[0.1; 640]);
        }
        assert_eq!(o.queued(), 4 * 640 + 160);
        assert_eq!(
            o.stats().overflow_samples,
            10 * 640 - (4 * 640 + 160) as u64
        );
    }
}
