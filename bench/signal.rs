//! The benchmarks' test signal: a deterministic speech-like signal and the
//! small generator behind it, shared by the load generator (what callers
//! send) and `opus-interleave` (what it encodes), so that both measure Opus
//! on the same kind of input.
//!
//! [`speech_like`] is voiced syllables with gliding pitch and two formants,
//! fricative onsets and pauses: Opus works as hard on it as on speech, and
//! the same seed always gives the same samples.

use moshid::SAMPLE_RATE_HZ;

/// A small deterministic generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

/// Gain of a two-pole resonance at `f` for a formant at `center` Hz.
fn resonance(f: f64, center: f64, bandwidth: f64) -> f64 {
    let x = (f - center) / bandwidth;
    1.0 / (1.0 + x * x)
}

/// `seconds` of a deterministic speech-like signal at 24 kHz (peak ≈ 0.5).
pub fn speech_like(seconds: f64, seed: u64) -> Vec<f32> {
    let rate = f64::from(SAMPLE_RATE_HZ);
    let total = (seconds * rate) as usize;
    let mut out = Vec::with_capacity(total);
    let mut rng = Rng::new(seed);
    let mut phases = [0f64; 48];
    let mut noise_state = 0.0f64;
    while out.len() < total {
        // A pause now and then, a short gap between syllables otherwise.
        let gap = if rng.unit() < 0.15 {
            rng.range(0.25, 0.6)
        } else {
            rng.range(0.03, 0.12)
        };
        let gap_samples = (gap * rate) as usize;
        for _ in 0..gap_samples {
            out.push((0.002 * (rng.unit() - 0.5)) as f32);
        }
        // An optional fricative onset, then a voiced nucleus.
        if rng.unit() < 0.4 {
            let n = (rng.range(0.03, 0.09) * rate) as usize;
            for i in 0..n {
                let white = rng.unit() - 0.5;
                let hp = white - noise_state;
                noise_state = white;
                let env = (std::f64::consts::PI * i as f64 / n as f64).sin();
                out.push((0.12 * env * hp) as f32);
            }
        }
        let n = (rng.range(0.12, 0.32) * rate) as usize;
        let (f0_a, f0_b) = (rng.range(95.0, 210.0), rng.range(95.0, 210.0));
        let (f1, f2) = (rng.range(300.0, 800.0), rng.range(900.0, 2300.0));
        for i in 0..n {
            let t = i as f64 / n as f64;
            let f0 = f0_a + (f0_b - f0_a) * t;
            let env = (std::f64::consts::PI * t).sin().powf(0.6);
            let mut s = 0.0;
            for (k, phase) in phases.iter_mut().enumerate() {
                let f = f0 * (k + 1) as f64;
                if f > 4000.0 {
                    break;
                }
                *phase = (*phase + f / rate).fract();
                let gain =
                    (resonance(f, f1, 90.0) + 0.6 * resonance(f, f2, 140.0)) / (k + 1) as f64;
                s += gain * (std::f64::consts::TAU * *phase).sin();
            }
            out.push((0.35 * env * s) as f32);
        }
    }
    out.truncate(total);
    out
}
