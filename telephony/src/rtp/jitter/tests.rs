//! The jitter buffer's unit tests: PCMU and Opus streams with loss,
//! reordering, duplicates, late packets and underruns, traced to the
//! sequence numbers they came from.

use super::super::packet::{parse, write_header};
use super::*;
use crate::g711::{linear_to_ulaw, Law};

/// PCMU packets of 20 ms carrying a ramp of known values so that the
/// output can be traced back to sequence numbers.
struct Sender {
    seq: u16,
    ts: u32,
    ssrc: u32,
    buf: Vec<u8>,
}

impl Sender {
    fn new(seq: u16, ts: u32, ssrc: u32) -> Self {
        Sender {
            seq,
            ts,
            ssrc,
            buf: vec![0; 12 + 160],
        }
    }
    /// The next packet; its samples all encode `value`.
    fn next(&mut self, value: i16) -> Vec<u8> {
        write_header(&mut self.buf, false, 0, self.seq, self.ts, self.ssrc);
        self.buf[12..].fill(linear_to_ulaw(value));
        self.seq = self.seq.wrapping_add(1);
        self.ts = self.ts.wrapping_add(160);
        self.buf.clone()
    }
}

fn buffer() -> JitterBuffer {
    JitterBuffer::new(JitterConfig {
        spec: CodecSpec::PCMU,
        min_ms: 40,
        max_ms: 120,
        frame_ms: 80,
    })
    .unwrap()
}

fn insert(jb: &mut JitterBuffer, bytes: &[u8], t: f64) -> InsertOutcome {
    jb.insert(&parse(bytes).unwrap(), PacketKind::Audio, t)
}

/// Value carried by packet `i`: distinct per packet, exact in μ-law.
fn value(i: usize) -> i16 {
    let mut tmp = [0f32];
    Law::Mu.decode(&[(i % 100) as u8 + 0x80], &mut tmp);
    (tmp[0] * 32768.0) as i16
}

fn packet_of(sample: f32) -> Option<usize> {
    (0..100).find(|&i| (value(i) as f32 / 32768.0 - sample).abs() < 1e-6)
}

#[test]
fn reorders_and_drops_duplicates() {
    let mut jb = buffer();
    let mut tx = Sender::new(1000, 0, 7);
    let pkts: Vec<Vec<u8>> = (0..12).map(|i| tx.next(value(i))).collect();
    // Order: 0 2 1 3 3 5 4 6..11
    let order = [0, 2, 1, 3, 3, 5, 4, 6, 7, 8, 9, 10, 11];
    let mut outcomes = Vec::new();
    for (t, &i) in order.iter().enumerate() {
        outcomes.push(insert(&mut jb, &pkts[i], t as f64 * 0.02));
    }
    assert_eq!(outcomes[4], InsertOutcome::Duplicate);
    let s = jb.stats();
    assert_eq!((s.received, s.duplicate, s.reordered), (13, 1, 2));
    let mut out = vec![0f32; 640];
    let mut played = Vec::new();
    for _ in 0..3 {
        jb.pull(&mut out);
        for chunk in out.chunks(160) {
            played.push(packet_of(chunk[80]));
        }
    }
    let expect: Vec<Option<usize>> = (0..12).map(Some).collect();
    assert_eq!(played, expect, "in order, each once");
    assert_eq!(jb.stats().lost, 0);
}

#[test]
fn conceals_a_lost_packet_and_counts_it() {
    let mut jb = buffer();
    let mut tx = Sender::new(65_530, 4_000_000_000, 9);
    let mut out = vec![0f32; 640];
    let mut t = 0.0;
    // Lose packet 6 (which also sits across the sequence wrap).
    for i in 0..40 {
        let p = tx.next(value(i));
        if i != 6 {
            insert(&mut jb, &p, t);
        }
        t += 0.02;
        if i % 4 == 3 && i >= 7 {
            jb.pull(&mut out);
        }
    }
    let s = *jb.stats();
    assert_eq!(s.lost, 1, "{s:?}");
    assert_eq!(s.concealed, 1);
    assert_eq!(s.concealed_samples, 160);
    assert_eq!(s.resyncs, 0, "the wrap is not a resync");
    assert_eq!(s.underruns, 0, "{s:?}");
}

#[test]
fn underrun_conceals_and_rebuffers_then_new_ssrc_resyncs() {
    let mut jb = buffer();
    let mut tx = Sender::new(1, 0, 1);
    let mut out = vec![0f32; 640];
    for i in 0..8 {
        insert(&mut jb, &tx.next(value(i)), i as f64 * 0.02);
    }
    jb.pull(&mut out);
    jb.pull(&mut out);
    assert!(jb.is_playing());
    // Nothing more: the third pull underruns but still fills the frame.
    out.fill(9.0);
    jb.pull(&mut out);
    assert!(out.iter().all(|x| x.abs() <= 1.0));
    assert_eq!(jb.stats().underruns, 1);
    assert!(!jb.is_playing());
    assert!(jb.target_ms() > 40.0);
    // A new stream.
    let mut tx2 = Sender::new(50_000, 123, 2);
    for i in 0..10 {
        insert(&mut jb, &tx2.next(value(50 + i)), 1.0 + i as f64 * 0.02);
    }
    assert_eq!(jb.stats().ssrc_changes, 1);
    jb.pull(&mut out);
    assert!(jb.is_playing());
    assert_eq!(packet_of(out[80]), Some(50));
    assert_eq!(jb.stats().late, 0);
}

#[test]
fn late_packets_are_dropped() {
    let mut jb = buffer();
    let mut tx = Sender::new(10, 0, 3);
    let pkts: Vec<Vec<u8>> = (0..20).map(|i| tx.next(value(i))).collect();
    for (i, p) in pkts.iter().enumerate() {
        if i != 2 {
            insert(&mut jb, p, i as f64 * 0.02);
        }
    }
    let mut out = vec![0f32; 640];
    jb.pull(&mut out);
    assert_eq!(jb.stats().lost, 1);
    assert_eq!(insert(&mut jb, &pkts[2], 0.5), InsertOutcome::Late);
    assert_eq!(jb.stats().late, 1);
}

#[test]
fn every_pull_fills_the_frame_even_when_empty() {
    let mut jb = buffer();
    let mut out = vec![1f32; 640];
    for _ in 0..100 {
        jb.pull(&mut out);
        assert!(out.iter().all(|x| *x == 0.0));
    }
    assert_eq!(jb.stats().frames_out, 100);
}

#[test]
fn opus_loss_uses_plc_or_fec() {
    use crate::MediaEncoder;
    let spec = CodecSpec::OPUS;
    let mut jb = JitterBuffer::new(JitterConfig {
        spec,
        min_ms: 40,
        max_ms: 120,
        frame_ms: 80,
    })
    .unwrap();
    let mut enc = MediaEncoder::new(spec).unwrap();
    let mut payload = [0u8; 1275];
    let mut buf = vec![0u8; 12 + 1275];
    let pcm: Vec<f32> = (0..480).map(|i| (i as f32 * 0.07).sin() * 0.2).collect();
    let mut out = vec![0f32; 1920];
    for i in 0..40u16 {
        let n = enc.encode(&pcm, &mut payload).unwrap();
        write_header(&mut buf, false, 111, i, i as u32 * 960, 5);
        buf[12..12 + n].copy_from_slice(&payload[..n]);
        if i != 9 && i != 20 && i != 21 {
            jb.insert(
                &parse(&buf[..12 + n]).unwrap(),
                PacketKind::Audio,
                i as f64 * 0.02,
            );
        }
        if i % 4 == 3 && i >= 11 {
            jb.pull(&mut out);
        }
    }
    let s = jb.stats();
    assert_eq!(s.lost, 3, "{s:?}");
    assert_eq!(s.concealed, 2);
    assert_eq!(s.concealed_samples, 3 * 480);
    assert_eq!(s.decode_errors, 0);
}
