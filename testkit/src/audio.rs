//! Deterministic test audio (the same samples every run) and summaries of
//! packet arrival gaps, which tests print and never assert.

use std::path::{Path, PathBuf};
use std::time::Instant;

use moshid::codec::FRAME_SAMPLES;

/// A test signal of `n` frames: a tone around `220 + 37·variant` Hz with a
/// slow vibrato, a harmonic and an amplitude envelope.
pub fn signal(variant: u32, n: usize) -> Vec<[f32; FRAME_SAMPLES]> {
    let f0 = 220.0 + 37.0 * variant as f64;
    let mut phase = 0.0f64;
    (0..n)
        .map(|i| {
            let mut frame = [0.0f32; FRAME_SAMPLES];
            for (j, x) in frame.iter_mut().enumerate() {
                let t = (i * FRAME_SAMPLES + j) as f64 / 24_000.0;
                let f = f0 * (1.0 + 0.05 * (2.0 * std::f64::consts::PI * 3.0 * t).sin());
                phase += 2.0 * std::f64::consts::PI * f / 24_000.0;
                let env = 0.5 + 0.5 * (2.0 * std::f64::consts::PI * 0.7 * t).sin().abs();
                *x = (0.3 * env * (phase.sin() + 0.3 * (2.0 * phase).sin())) as f32;
            }
            frame
        })
        .collect()
}

/// Samples `start..start + n` of a 440 Hz tone at `rate`, 16-bit.
pub fn tone(rate: u32, start: usize, n: usize) -> Vec<i16> {
    (start..start + n)
        .map(|i| {
            ((2.0 * std::f32::consts::PI * 440.0 * i as f32 / rate as f32).sin() * 8000.0) as i16
        })
        .collect()
}

/// `seconds` of a 440 Hz tone as raw G.711 μ-law at 8 kHz (sipp's
/// `rtp_stream` plays raw payload bytes), written under `dir`.
pub fn ulaw_file(dir: &Path, seconds: u32) -> PathBuf {
    let bytes: Vec<u8> = tone(8000, 0, 8000 * seconds as usize)
        .into_iter()
        .map(moshid_telephony::g711::linear_to_ulaw)
        .collect();
    let path = dir.join("tone.ulaw");
    std::fs::write(&path, bytes).expect("writing the tone");
    path
}

/// Writes a mono 16-bit WAV file at `rate_hz`: sample `i` is `at(t)`
/// for `t = i / rate_hz` seconds, `seconds` long; `at` gives values in
/// [-1, 1] (clamped).
pub fn write_wav(path: &Path, rate_hz: u32, seconds: f64, mut at: impl FnMut(f64) -> f64) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate_hz,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec)
        .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    let n = (seconds * f64::from(rate_hz)).round() as usize;
    for i in 0..n {
        let x = at(i as f64 / f64::from(rate_hz));
        w.write_sample((x.clamp(-1.0, 1.0) * f64::from(i16::MAX)) as i16)
            .expect("writing the WAV");
    }
    w.finalize().expect("finishing the WAV");
}

/// Arrival gaps of paced packets, in milliseconds: printed, not asserted.
pub fn print_gaps(what: &str, arrivals: &[Instant]) {
    if arrivals.len() < 2 {
        println!("{what}: {} packets, no gaps to measure", arrivals.len());
        return;
    }
    let mut gaps: Vec<f64> = arrivals
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1000.0)
        .collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    gaps.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let pct = |p: f64| gaps[((gaps.len() - 1) as f64 * p).round() as usize];
    let span = (arrivals[arrivals.len() - 1] - arrivals[0]).as_secs_f64() * 1000.0;
    println!(
        "{what}: {} packets over {span:.0} ms; gap ms: mean {mean:.2}, min {:.2}, p50 {:.2}, p90 {:.2}, p99 {:.2}, max {:.2}",
        arrivals.len(),
        gaps[0],
        pct(0.5),
        pct(0.9),
        pct(0.99),
        gaps[gaps.len() - 1]
    );
}
