//! The audio path of a byte-stream phone line, shared by AudioSocket and
//! Media Streams: line audio (16-bit linear little-endian, or G.711) at the
//! line's rate in, 80 ms model frames at 24 kHz to the engine; the model's
//! frames back, resampled and encoded into 20 ms packets, queued, and taken
//! one per pacing tick.
//!
//! * [`LineIn`] accumulates decoded line samples into one 80 ms frame at the
//!   line rate and resamples it to 24 kHz when complete. It takes bytes
//!   under a frame budget ([`LineIn::push`]), so a session never sends more
//!   frames than its in-flight bound allows: bytes it cannot take stay with
//!   the caller, who stops reading its socket until the engine answers.
//! * [`LineOut`] is a ring of encoded 20 ms packets with a fixed capacity;
//!   [`LineOut::push_frame`] resamples and encodes one model frame (four
//!   packets). Counters: packets ever queued and ever taken (Media Streams
//!   marks are positions on that scale), packets dropped.
//! * [`Pacer`] hands out packet times from absolute deadlines every 20 ms:
//!   a late wake-up sends what is due (at most [`MAX_CATCH_UP`] at once)
//!   and skips the rest, so the far end never gets a long burst and the
//!   latency never grows.
//!
//! Invariants: everything is sized at construction (one frame in, one frame
//! and `capacity` packets out); `push`, `push_frame`, `front`, `pop` never
//! allocate. (The telephony codecs and resampler are `moshid_telephony`'s;
//! the byte layouts of these two transports are here.)

use crate::{FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE_HZ};
use moshid_telephony::g711::{f32_to_i16, Law};
use moshid_telephony::resample::ResampleError;
use moshid_telephony::FrameResampler;
use std::time::{Duration, Instant};

/// Packet duration on the line, in milliseconds.
pub const PACKET_MS: u32 = 20;
/// Packets per model frame (80 ms / 20 ms).
pub const PACKETS_PER_FRAME: usize = (FRAME_MS as u32 / PACKET_MS) as usize;
/// Packets a late wake-up sends at once; beyond, packet times are skipped.
pub const MAX_CATCH_UP: u32 = 3;

/// How samples are laid out on the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineCodec {
    /// Signed 16-bit little-endian (Asterisk `slin`).
    SlinLe,
    /// G.711, one byte per sample.
    G711(Law),
}

impl LineCodec {
    /// Bytes per sample.
    pub fn bytes_per_sample(self) -> usize {
        match self {
            LineCodec::SlinLe => 2,
            LineCodec::G711(_) => 1,
        }
    }

    /// Decodes whole samples of `bytes` into `out` (as many as both hold);
    /// returns the samples written.
    pub fn decode(self, bytes: &[u8], out: &mut [f32]) -> usize {
        match self {
            LineCodec::SlinLe => {
                let n = (bytes.len() / 2).min(out.len());
                for (o, b) in out[..n].iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = i16::from_le_bytes([b[0], b[1]]) as f32 * (1.0 / 32768.0);
                }
                n
            }
            LineCodec::G711(law) => {
                let n = bytes.len().min(out.len());
                law.decode(&bytes[..n], &mut out[..n]);
                n
            }
        }
    }

    /// Encodes `pcm` into `out` (sized `pcm.len() * bytes_per_sample()`).
    pub fn encode(self, pcm: &[f32], out: &mut [u8]) {
        match self {
            LineCodec::SlinLe => {
                for (o, &x) in out.chunks_exact_mut(2).zip(pcm) {
                    o.copy_from_slice(&f32_to_i16(x).to_le_bytes());
                }
            }
            LineCodec::G711(law) => law.encode(pcm, out),
        }
    }

    /// Fills `out` with the codec's silence.
    pub fn silence(self, out: &mut [u8]) {
        match self {
            LineCodec::SlinLe => out.fill(0),
            LineCodec::G711(law) => out.fill(law.silence()),
        }
    }
}

/// Samples in `ms` milliseconds at `rate_hz` (whole by construction of the
/// accepted rates).
fn samples(rate_hz: u32, ms: u32) -> usize {
    (rate_hz as u64 * ms as u64 / 1000) as usize
}

/// Line audio in, model frames out.
pub struct LineIn {
    codec: LineCodec,
    resampler: FrameResampler,
    acc: Vec<f32>,
    filled: usize,
}

impl LineIn {
    /// A line at `rate_hz` (20 ms must be a whole number of samples).
    pub fn new(codec: LineCodec, rate_hz: u32) -> Result<Self, ResampleError> {
        let resampler = FrameResampler::new(rate_hz, SAMPLE_RATE_HZ, FRAME_MS as u32)?;
        let acc = vec![0.0; resampler.in_frame()];
        Ok(LineIn {
            codec,
            resampler,
            acc,
            filled: 0,
        })
    }

    /// Line samples per model frame.
    pub fn frame_samples(&self) -> usize {
        self.acc.len()
    }

    /// Line samples waiting for the rest of their frame.
    pub fn partial(&self) -> usize {
        self.filled
    }

    /// Drops the samples waiting for the rest of their frame.
    pub fn clear_partial(&mut self) {
        self.filled = 0;
    }

    /// Frames that taking all of `bytes` would complete.
    pub fn frames_in(&self, bytes: usize) -> usize {
        (self.filled + bytes / self.codec.bytes_per_sample()) / self.acc.len()
    }

    /// Takes whole samples of `bytes` until they run out, or `budget`
    /// frames have been completed and the next chunk would complete another
    /// one (it then stops at the frame boundary);
    /// each completed frame is resampled into `frame` and handed to
    /// `on_frame`. Returns the bytes taken (a whole number of samples).
    pub fn push(
        &mut self,
        bytes: &[u8],
        mut budget: usize,
        frame: &mut [f32; FRAME_SAMPLES],
        mut on_frame: impl FnMut(&[f32; FRAME_SAMPLES]),
    ) -> usize {
        let bps = self.codec.bytes_per_sample();
        let mut taken = 0;
        let whole = bytes.len() / bps * bps;
        while taken < whole {
            let n = ((whole - taken) / bps).min(self.acc.len() - self.filled);
            if self.filled + n == self.acc.len() && budget == 0 {
                break;
            }
            let got = self.codec.decode(
                &bytes[taken..taken + n * bps],
                &mut self.acc[self.filled..self.filled + n],
            );
            debug_assert_eq!(got, n);
            self.filled += n;
            taken += n * bps;
            if self.filled == self.acc.len() {
                self.resampler.process(&self.acc, &mut frame[..]);
                self.filled = 0;
                budget -= 1;
                on_frame(frame);
            }
        }
        taken
    }
}

/// Counters of the outgoing side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineOutStats {
    /// Packets ever queued.
    pub queued: u64,
    /// Packets ever removed, sent or dropped (always `queued` minus those
    /// still queued: a position on this scale is passed once `taken`
    /// reaches it).
    pub taken: u64,
    /// Packets dropped: queue full, skipped packet times, `clear`.
    pub dropped: u64,
}

/// Model frames in, paced line packets out.
pub struct LineOut {
    codec: LineCodec,
    resampler: FrameResampler,
    pcm: Vec<f32>,
    ring: Vec<u8>,
    packet_bytes: usize,
    packet_samples: usize,
    capacity: usize,
    head: usize,
    len: usize,
    stats: LineOutStats,
}

impl LineOut {
    /// A queue of `capacity_packets` (at least one frame's worth) for a line
    /// at `rate_hz`.
    pub fn new(
        codec: LineCodec,
        rate_hz: u32,
        capacity_packets: usize,
    ) -> Result<Self, ResampleError> {
        let resampler = FrameResampler::new(SAMPLE_RATE_HZ, rate_hz, FRAME_MS as u32)?;
        let packet_samples = samples(rate_hz, PACKET_MS);
        let packet_bytes = packet_samples * codec.bytes_per_sample();
        let capacity = capacity_packets.max(PACKETS_PER_FRAME);
        Ok(LineOut {
            codec,
            pcm: vec![0.0; resampler.out_frame()],
            resampler,
            ring: vec![0; capacity * packet_bytes],
            packet_bytes,
            packet_samples,
            capacity,
            head: 0,
            len: 0,
            stats: LineOutStats::default(),
        })
    }

    /// Bytes of one packet.
    pub fn packet_bytes(&self) -> usize {
        self.packet_bytes
    }

    /// The line codec.
    pub fn codec(&self) -> LineCodec {
        self.codec
    }

    /// Packets queued now.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Packets the queue can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Counters.
    pub fn stats(&self) -> LineOutStats {
        self.stats
    }

    /// Resamples and encodes one model frame into [`PACKETS_PER_FRAME`]
    /// packets at the tail; a full queue drops its oldest packets (counted).
    pub fn push_frame(&mut self, pcm: &[f32; FRAME_SAMPLES]) {
        self.resampler.process(pcm, &mut self.pcm);
        for i in 0..PACKETS_PER_FRAME {
            if self.len == self.capacity {
                self.skip(1);
            }
            let slot = (self.head + self.len) % self.capacity;
            let bytes = &mut self.ring[slot * self.packet_bytes..(slot + 1) * self.packet_bytes];
            let pcm = &self.pcm[i * self.packet_samples..(i + 1) * self.packet_samples];
            self.codec.encode(pcm, bytes);
            self.len += 1;
            self.stats.queued += 1;
        }
    }

    /// The oldest packet, if any.
    pub fn front(&self) -> Option<&[u8]> {
        (self.len > 0)
            .then(|| &self.ring[self.head * self.packet_bytes..(self.head + 1) * self.packet_bytes])
    }

    /// Removes the oldest packet (once sent).
    pub fn pop(&mut self) {
        if self.len > 0 {
            self.head = (self.head + 1) % self.capacity;
            self.len -= 1;
            self.stats.taken += 1;
        }
    }

    /// Drops up to `n` of the oldest packets unsent (skipped packet times);
    /// returns how many.
    pub fn skip(&mut self, n: usize) -> usize {
        let n = n.min(self.len);
        self.head = (self.head + n) % self.capacity;
        self.len -= n;
        self.stats.taken += n as u64;
        self.stats.dropped += n as u64;
        n
    }

    /// Drops everything queued (barge-in); returns how many packets.
    pub fn clear(&mut self) -> usize {
        self.skip(self.len)
    }

    /// Writes one packet of silence into `out` (sized [`LineOut::packet_bytes`]).
    pub fn silence(&self, out: &mut [u8]) {
        self.codec.silence(out);
    }
}

/// Packet times from absolute deadlines.
#[derive(Debug, Clone)]
pub struct Pacer {
    period: Duration,
    next: Option<Instant>,
    skipped: u64,
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer::new(Duration::from_millis(PACKET_MS as u64))
    }
}

impl Pacer {
    /// A pacer with `period` between packets, not started.
    pub fn new(period: Duration) -> Self {
        Pacer {
            period,
            next: None,
            skipped: 0,
        }
    }

    /// Starts the clock: the first packet is due at `now`.
    pub fn start(&mut self, now: Instant) {
        if self.next.is_none() {
            self.next = Some(now);
        }
    }

    /// Whether started.
    pub fn started(&self) -> bool {
        self.next.is_some()
    }

    /// When the next packet is due.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.next
    }

    /// Packet times skipped so far (woken too late).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Nothing is queued: the next packet may go as soon as it is queued
    /// (the grid restarts there instead of counting idle times as late).
    pub fn rest(&mut self, now: Instant) {
        if self.next.is_some_and(|n| n < now) {
            self.next = Some(now);
        }
    }

    /// Packets due at `now`: `(send, skip)` — send `send` packets now and
    /// drop `skip` packet times; the deadlines advance past `now`.
    pub fn due(&mut self, now: Instant) -> (u32, u32) {
        let Some(next) = self.next else {
            return (0, 0);
        };
        if now < next {
            return (0, 0);
        }
        let late = now.duration_since(next);
        let due = (late.as_nanos() / self.period.as_nanos()) as u64 + 1;
        let due = due.min(u32::MAX as u64) as u32;
        self.next = Some(next + self.period * due);
        let send = due.min(MAX_CATCH_UP);
        let skip = due - send;
        self.skipped += skip as u64;
        (send, skip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every AudioSocket rate and G.711 build, with the right sizes.
    #[test]
    fn sizes_for_every_line_rate() {
        for rate in [
            8_000, 12_000, 16_000, 24_000, 32_000, 44_100, 48_000, 96_000, 192_000,
        ] {
            let li = LineIn::new(LineCodec::SlinLe, rate).unwrap();
            assert_eq!(li.frame_samples(), rate as usize * 80 / 1000);
            let lo = LineOut::new(LineCodec::SlinLe, rate, 8).unwrap();
            assert_eq!(lo.packet_bytes(), rate as usize * 20 / 1000 * 2, "{rate}");
        }
        let lo = LineOut::new(LineCodec::G711(Law::Mu), 8_000, 8).unwrap();
        assert_eq!(lo.packet_bytes(), 160);
    }

    #[test]
    fn push_respects_the_frame_budget() {
        let mut li = LineIn::new(LineCodec::SlinLe, 8_000).unwrap();
        let bytes = vec![0u8; 640 * 2 * 3 + 100];
        let mut frame = [0f32; FRAME_SAMPLES];
        let mut frames = 0;
        assert_eq!(li.frames_in(bytes.len()), 3);
        // Budget 1: one frame, then it stops at the frame boundary.
        let taken = li.push(&bytes, 1, &mut frame, |_| frames += 1);
        assert_eq!(frames, 1);
        assert_eq!(taken, 640 * 2);
        assert_eq!(li.partial(), 0);
        // Budget 0 still takes samples that do not complete a frame.
        assert_eq!(li.push(&bytes[..100], 0, &mut frame, |_| frames += 1), 100);
        assert_eq!(li.partial(), 50);
        let mut li = LineIn::new(LineCodec::SlinLe, 8_000).unwrap();
        let taken = li.push(&bytes, 1, &mut frame, |_| ());
        let taken2 = li.push(&bytes[taken..], 5, &mut frame, |_| frames += 1);
        assert_eq!(frames, 3);
        assert_eq!(taken + taken2, bytes.len());
        assert_eq!(li.partial(), 50);
        // An odd trailing byte is left to the caller.
        assert_eq!(li.push(&[1, 2, 3], 0, &mut frame, |_| ()), 2);
    }

    #[test]
    fn queue_order_overflow_and_clear() {
        let mut lo = LineOut::new(LineCodec::G711(Law::Mu), 8_000, 6).unwrap();
        let pcm = [0.25f32; FRAME_SAMPLES];
        lo.push_frame(&pcm);
        assert_eq!(lo.len(), 4);
        lo.push_frame(&pcm);
        assert_eq!((lo.len(), lo.stats().dropped), (6, 2));
        assert_eq!(lo.front().unwrap().len(), 160);
        lo.pop();
        assert_eq!(lo.skip(2), 2);
        assert_eq!(lo.clear(), 3);
        assert!(lo.is_empty() && lo.front().is_none());
        let s = lo.stats();
        assert_eq!((s.queued, s.taken, s.dropped), (8, 8, 7));
    }

    #[test]
    fn slin_round_trip() {
        let pcm = [0.0f32, 0.5, -0.5, -1.0];
        let mut bytes = [0u8; 8];
        LineCodec::SlinLe.encode(&pcm, &mut bytes);
        assert_eq!(&bytes[..4], &[0, 0, 0, 0x40]);
        let mut back = [0f32; 4];
        assert_eq!(LineCodec::SlinLe.decode(&bytes, &mut back), 4);
        assert_eq!(back, pcm);
    }

    #[test]
    fn pacer_catches_up_boundedly() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = Pacer::default();
        assert_eq!(p.due(t0), (0, 0));
        p.start(t0);
        assert_eq!(p.due(t0), (1, 0));
        assert_eq!(p.due(t0 + ms(19)), (0, 0));
        assert_eq!(p.due(t0 + ms(20)), (1, 0));
        assert_eq!(p.next_deadline(), Some(t0 + ms(40)));
        // 100 ms late: 6 packet times due (40..=140), 3 sent, 3 skipped.
        assert_eq!(p.due(t0 + ms(140)), (3, 3));
        assert_eq!(p.next_deadline(), Some(t0 + ms(160)));
        assert_eq!(p.skipped(), 3);
    }
}
