//! `opus-interleave`: what one Opus encode costs when a thread serves many
//! streams, next to the loadgen's bare-Opus floor (one encoder, one stream,
//! on one thread), measured in the same run.
//!
//! The daemon's I/O core encodes every stream's answer back to back, each
//! with its own encoder state; the floor encodes one stream in a loop with
//! its state hot in cache. This tool times both on the same signal (the
//! loadgen's speech-like signal), plus the floor's signal basis: the floor
//! encodes the answers as the client decoded them (once through Opus), the
//! daemon encodes the model's raw output.
//!
//! ```text
//! opus-interleave --streams 30 --seconds 10
//! ```

use std::time::Instant;

use moshid::codec::{DecoderConfig, EncoderConfig, OggOpusDecoder, OggOpusEncoder};
use moshid::FRAME_SAMPLES;
use moshid_bench::signal::speech_like;

/// CPU time of this thread in ns (/proc/thread-self/schedstat).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `frames` frames of the benchmarks' speech-like signal (the one the
/// loadgen's callers send).
fn signal(frames: usize) -> Vec<[f32; FRAME_SAMPLES]> {
    let pcm = speech_like(frames as f64 * 0.08 + 1.0, 1);
    pcm.chunks_exact(FRAME_SAMPLES)
        .take(frames)
        .map(|c| c.try_into().expect("exact"))
        .collect()
}

/// Frames each encoder encodes before the timing starts.
const WARM_UP_FRAMES: usize = 10;

/// ms of CPU per stream-second to encode `frames` for each of `streams`
/// encoders, stream after stream within each frame (as the I/O core does).
fn encode_cost(frames: &[[f32; FRAME_SAMPLES]], streams: usize) -> f64 {
    let mut encoders: Vec<OggOpusEncoder> = (0..streams)
        .map(|_| OggOpusEncoder::new(EncoderConfig::default()).expect("encoder"))
        .collect();
    let mut out = vec![0u8; encoders[0].max_output_bytes_per_frame()];
    let mut sink = 0usize;
    // Past the header pages and the encoder's start, as in a running session.
    for frame in frames.iter().rev().take(WARM_UP_FRAMES) {
        for e in &mut encoders {
            sink += e.encode_frame(frame, &mut out).expect("encode");
        }
    }
    let t = thread_cpu_ns();
    for frame in frames {
        for e in &mut encoders {
            sink += e.encode_frame(frame, &mut out).expect("encode");
        }
    }
    let ns = thread_cpu_ns() - t;
    std::hint::black_box(sink);
    ns as f64 / 1e6 / (streams as f64 * frames.len() as f64 * 0.08)
}

/// The signal after one pass through Opus (what a client decodes).
fn through_opus(frames: &[[f32; FRAME_SAMPLES]]) -> Vec<[f32; FRAME_SAMPLES]> {
    let mut enc = OggOpusEncoder::new(EncoderConfig::default()).expect("encoder");
    let mut dec = OggOpusDecoder::new(DecoderConfig {
        trim_pre_skip: false,
        ..DecoderConfig::default()
    })
    .expect("decoder");
    let mut out = vec![0u8; enc.max_output_bytes_per_frame()];
    let mut pcm = Vec::new();
    for f in frames {
        let n = enc.encode_frame(f, &mut out).expect("encode");
        dec.push_bytes(&out[..n]).expect("decode");
        while let Some(p) = dec.next_pcm().expect("decode") {
            pcm.extend_from_slice(p);
        }
    }
    pcm.chunks_exact(FRAME_SAMPLES)
        .map(|c| c.try_into().expect("exact"))
        .collect()
}

fn main() {
    let mut streams = 30usize;
    let mut seconds = 10f64;
    let args: Vec<String> = std::env::args().collect();
    for w in args.windows(2) {
        match w[0].as_str() {
            "--streams" => streams = w[1].parse().expect("--streams N"),
            "--seconds" => seconds = w[1].parse().expect("--seconds S"),
            _ => {}
        }
    }
    let frames = signal((seconds / 0.08) as usize);
    let decoded = through_opus(&frames);
    let started = Instant::now();
    // Alternate the measurements so that a neighbour's load hits both alike.
    let (mut one, mut many, mut one_decoded) = (0f64, 0f64, 0f64);
    let rounds = 3;
    for _ in 0..rounds {
        one += encode_cost(&frames, 1) / rounds as f64;
        many += encode_cost(&frames, streams) / rounds as f64;
        one_decoded += encode_cost(&decoded, 1) / rounds as f64;
    }
    println!(
        "encode, ms of CPU per stream-second: one encoder {one:.3}; {streams} encoders \
         interleaved {many:.3} ({:.2}x); one encoder on the once-decoded signal {one_decoded:.3} \
         ({:.2}x of the raw signal); {:.1} s",
        many / one,
        one_decoded / one,
        started.elapsed().as_secs_f64()
    );
}
