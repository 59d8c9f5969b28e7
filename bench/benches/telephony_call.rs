//! CPU cost of one RTP telephony call, per call-second, at 8 kHz PCMU with
//! 20 ms packets: everything an I/O core does for a call except the socket
//! calls and the model — RTP parse, jitter buffer (store, order, decode),
//! resampling 8 → 24 kHz (to the model) and 24 → 8 kHz (from it), G.711
//! encode and packetization. Compared with bare G.711 decode + encode of
//! the same audio, the floor any μ-law call pays.
//!
//! Criterion reports each per 80 ms frame; the bench then measures thread
//! CPU time over 60 call-seconds of each and prints CPU per call-second and
//! the ratio.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use moshid_telephony::g711::{linear_to_ulaw, Law};
use moshid_telephony::rtp::jitter::{JitterBuffer, JitterConfig, PacketKind};
use moshid_telephony::rtp::packet::{parse, write_header};
use moshid_telephony::rtp::sender::{Outbound, StreamStart};
use moshid_telephony::{CodecSpec, FrameResampler};
use std::hint::black_box;
use std::time::Duration;

/// Packets per model frame (80 ms of 20 ms packets).
const PACKETS_PER_FRAME: usize = 4;
/// Model frames per call-second.
const FRAMES_PER_SECOND: f64 = 12.5;

/// 20 ms PCMU packets of a voiced signal, made once.
fn packets(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|k| {
            let mut p = vec![0u8; 12 + 160];
            write_header(&mut p, false, 0, k as u16, (k * 160) as u32, 42);
            for i in 0..160 {
                let t = (k * 160 + i) as f32 / 8000.0;
                let x = (2.0 * std::f32::consts::PI * 180.0 * t).sin() * 0.3
                    + (2.0 * std::f32::consts::PI * 720.0 * t).sin() * 0.1;
                p[12 + i] = linear_to_ulaw((x * 32767.0) as i16);
            }
            p
        })
        .collect()
}

/// The call path of one session.
struct CallPath {
    jitter: JitterBuffer,
    res_in: FrameResampler,
    res_out: FrameResampler,
    outbound: Outbound,
    frame8: Vec<f32>,
    frame24: Vec<f32>,
    out8: Vec<f32>,
    pkts: Vec<Vec<u8>>,
    next: usize,
    seq: u16,
    ts: u32,
    clock: f64,
    scratch: Vec<u8>,
}

impl CallPath {
    fn new() -> Self {
        let spec = CodecSpec::PCMU;
        let jitter = JitterBuffer::new(JitterConfig {
            spec,
            min_ms: 40,
            max_ms: 120,
            frame_ms: 80,
        })
        .unwrap();
        let res_in = FrameResampler::new(8_000, 24_000, 80).unwrap();
        let res_out = FrameResampler::new(24_000, 8_000, 80).unwrap();
        let outbound = Outbound::new(spec, 0, 20, 640, StreamStart::random()).unwrap();
        let mut c = CallPath {
            jitter,
            res_in,
            res_out,
            outbound,
            frame8: vec![0.0; 640],
            frame24: vec![0.0; 1920],
            out8: vec![0.0; 640],
            pkts: packets(500),
            next: 0,
            seq: 0,
            ts: 0,
            clock: 0.0,
            scratch: vec![0u8; 12 + 160],
        };
        // Fill the buffer to its depth first.
        for _ in 0..3 {
            c.feed();
        }
        c
    }

    /// Four packets arrive (their sequence numbers and timestamps keep
    /// counting, their audio cycles through the prepared set).
    fn feed(&mut self) {
        for _ in 0..PACKETS_PER_FRAME {
            self.scratch.copy_from_slice(&self.pkts[self.next]);
            self.next = (self.next + 1) % self.pkts.len();
            self.scratch[2..4].copy_from_slice(&self.seq.to_be_bytes());
            self.scratch[4..8].copy_from_slice(&self.ts.to_be_bytes());
            self.seq = self.seq.wrapping_add(1);
            self.ts = self.ts.wrapping_add(160);
            self.clock += 0.02;
            let p = parse(&self.scratch).unwrap();
            self.jitter.insert(&p, PacketKind::Audio, self.clock);
        }
    }

    /// One 80 ms frame of a call: packets in, a frame to the model, the
    /// model's frame (here: the input, resampled) back out as packets.
    fn frame(&mut self) -> usize {
        self.feed();
        self.jitter.pull(&mut self.frame8);
        self.res_in.process(&self.frame8, &mut self.frame24);
        self.res_out.process(&self.frame24, &mut self.out8);
        self.outbound.push_audio(&self.out8);
        let mut bytes = 0;
        for _ in 0..PACKETS_PER_FRAME {
            bytes += black_box(self.outbound.next_packet()).len();
        }
        bytes
    }
}

/// Bare G.711: decode four payloads, encode them again.
struct Bare {
    pkts: Vec<Vec<u8>>,
    next: usize,
    pcm: Vec<f32>,
    out: Vec<u8>,
}

impl Bare {
    fn new() -> Self {
        Bare {
            pkts: packets(500),
            next: 0,
            pcm: vec![0.0; 160],
            out: vec![0u8; 160],
        }
    }

    fn frame(&mut self) -> usize {
        let mut bytes = 0;
        for _ in 0..PACKETS_PER_FRAME {
            let p = &self.pkts[self.next];
            self.next = (self.next + 1) % self.pkts.len();
            Law::Mu.decode(&p[12..], &mut self.pcm);
            Law::Mu.encode(&self.pcm, &mut self.out);
            bytes += black_box(&self.out).len();
        }
        bytes
    }
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Thread CPU time per call-second over `seconds` call-seconds.
fn cpu_per_call_second(seconds: usize, mut frame: impl FnMut() -> usize) -> Duration {
    let frames = (seconds as f64 * FRAMES_PER_SECOND) as usize;
    for _ in 0..frames / 10 {
        frame();
    }
    let t = thread_cpu();
    for _ in 0..frames {
        black_box(frame());
    }
    (thread_cpu() - t).div_f64(seconds as f64)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("telephony_call_pcmu_8khz_per_80ms_frame");
    group.throughput(Throughput::Elements(1));
    let mut call = CallPath::new();
    group.bench_function("rtp_call_path", |b| b.iter(|| call.frame()));
    let mut bare = Bare::new();
    group.bench_function("g711_decode_encode_only", |b| b.iter(|| bare.frame()));
    group.finish();

    let seconds = 600;
    let mut call = CallPath::new();
    let path = cpu_per_call_second(seconds, || call.frame());
    let s = call.jitter.stats();
    assert_eq!(
        (s.lost, s.underruns, s.concealed),
        (0, 0, 0),
        "the bench call must be clean: {s:?}"
    );
    let mut bare = Bare::new();
    let g711 = cpu_per_call_second(seconds, || bare.frame());
    println!(
        "telephony_call: CPU per call-second at 8 kHz PCMU: call path {:.1} µs ({:.4}% of a core; decode + jitter buffer + \
         resample both ways + encode + packetize), bare G.711 decode+encode {:.1} µs; ratio {:.1}×; {:.0} calls per core",
        path.as_secs_f64() * 1e6,
        path.as_secs_f64() * 100.0,
        g711.as_secs_f64() * 1e6,
        path.as_secs_f64() / g711.as_secs_f64(),
        1.0 / path.as_secs_f64()
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
