//! Integrated loudness (ITU-R BS.1770-4) exactly as pyloudnorm 0.2's
//! `Meter(rate).integrated_loudness` computes it, and the gain
//! `pyloudnorm.normalize.loudness` applies: NVIDIA's server normalises every
//! WAV voice prompt to −24 LUFS before encoding it.
//!
//! K-weighting is pyloudnorm's two RBJ biquads (high shelf +4 dB at 1500 Hz,
//! Q 1/√2; high pass at 38 Hz, Q 0.5), run as `scipy.signal.lfilter` does
//! (transposed direct form II, float64). Blocks of 400 ms with 75 % overlap,
//! `round((T − 0.4) / 0.1) + 1` of them; gates −70 LUFS absolute and −10 LU
//! relative; channel weight 1 (mono).

/// Why loudness cannot be measured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoudnessError {
    /// pyloudnorm refuses audio shorter than one 400 ms block.
    #[error("the audio is shorter than 0.4 s")]
    TooShort,
    /// Nothing above the absolute gate: silence has no loudness to normalise.
    #[error("the audio is silent (no block louder than -70 LUFS)")]
    Silent,
}

const BLOCK_S: f64 = 0.4;
const OVERLAP: f64 = 0.75;
const ABS_GATE: f64 = -70.0;

/// `(b, a)` of one of pyloudnorm's biquads, normalised by `a0`.
fn biquad(kind: &str, gain_db: f64, q: f64, fc: f64, rate: f64) -> ([f64; 3], [f64; 3]) {
    let a = 10f64.powf(gain_db / 40.0);
    let w0 = 2.0 * std::f64::consts::PI * (fc / rate);
    let alpha = w0.sin() / (2.0 * q);
    let c = w0.cos();
    let (b, den) = if kind == "high_shelf" {
        let sa = 2.0 * a.sqrt() * alpha;
        (
            [
                a * ((a + 1.0) + (a - 1.0) * c + sa),
                -2.0 * a * ((a - 1.0) + (a + 1.0) * c),
                a * ((a + 1.0) + (a - 1.0) * c - sa),
            ],
            [
                (a + 1.0) - (a - 1.0) * c + sa,
                2.0 * ((a - 1.0) - (a + 1.0) * c),
                (a + 1.0) - (a - 1.0) * c - sa,
            ],
        )
    } else {
        (
            [(1.0 + c) / 2.0, -(1.0 + c), (1.0 + c) / 2.0],
            [1.0 + alpha, -2.0 * c, 1.0 - alpha],
        )
    };
    let a0 = den[0];
    (b.map(|x| x / a0), den.map(|x| x / a0))
}

/// `scipy.signal.lfilter(b, a, x)` in place (a[0] = 1).
fn lfilter(b: &[f64; 3], a: &[f64; 3], x: &mut [f64]) {
    let (mut z0, mut z1) = (0.0, 0.0);
    for v in x.iter_mut() {
        let xn = *v;
        let y = b[0] * xn + z0;
        z0 = b[1] * xn - a[1] * y + z1;
        z1 = b[2] * xn - a[2] * y;
        *v = y;
    }
}

/// Integrated loudness in LUFS of mono `samples` at `rate` Hz.
pub fn integrated_loudness(samples: &[f32], rate: u32) -> Result<f64, LoudnessError> {
    let r = rate as f64;
    if (samples.len() as f64) < BLOCK_S * r {
        return Err(LoudnessError::TooShort);
    }
    let mut x: Vec<f64> = samples.iter().map(|&v| v as f64).collect();
    let (b, a) = biquad("high_shelf", 4.0, 1.0 / 2f64.sqrt(), 1500.0, r);
    lfilter(&b, &a, &mut x);
    let (b, a) = biquad("high_pass", 0.0, 0.5, 38.0, r);
    lfilter(&b, &a, &mut x);
    let step = 1.0 - OVERLAP;
    let t = samples.len() as f64 / r;
    let blocks = (((t - BLOCK_S) / (BLOCK_S * step)).round_ties_even() + 1.0) as usize;
    let z: Vec<f64> = (0..blocks)
        .map(|j| {
            let l = (BLOCK_S * (j as f64 * step) * r) as usize;
            let u = ((BLOCK_S * (j as f64 * step + 1.0) * r) as usize).min(x.len());
            let l = l.min(u);
            x[l..u].iter().map(|v| v * v).sum::<f64>() / (BLOCK_S * r)
        })
        .collect();
    let lufs = |z: f64| -0.691 + 10.0 * z.log10();
    let gated_mean = |keep: &dyn Fn(f64) -> bool| {
        let kept: Vec<f64> = z.iter().copied().filter(|&zj| keep(lufs(zj))).collect();
        (!kept.is_empty()).then(|| kept.iter().sum::<f64>() / kept.len() as f64)
    };
    let abs = gated_mean(&|l| l >= ABS_GATE).ok_or(LoudnessError::Silent)?;
    let rel_gate = lufs(abs) - 10.0;
    let rel = gated_mean(&|l| l > rel_gate && l > ABS_GATE).unwrap_or(0.0);
    Ok(lufs(rel))
}

/// The gain pyloudnorm applies to bring `loudness` to `target` LUFS.
pub fn gain_to(loudness: f64, target: f64) -> f64 {
    10f64.powf((target - loudness) / 20.0)
}
