//! Float32 building blocks of the CPU backend: norms, activations, rotary
//! embeddings and softmax, over plain row-major slices. (Matrix products
//! live beside their users, `lm/linear.rs` and `mimi/linear.rs`: each keeps
//! its weights in the layout its shapes want.)
//!
//! Invariants: no function allocates; every output is written into a slice
//! the caller owns, sized by the caller (checked with debug assertions).
//! Numerics follow the official PyTorch modules (same epsilons, same order of
//! the float32 operations where it matters for exactness).

/// RMSNorm over each row of width `dim`: `x / sqrt(mean(x²) + eps) · alpha`.
/// `x` and `y` may not alias.
pub fn rms_norm(x: &[f32], alpha: &[f32], eps: f32, dim: usize, y: &mut [f32]) {
    for (xr, yr) in x.chunks_exact(dim).zip(y.chunks_exact_mut(dim)) {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, v), a) in yr.iter_mut().zip(xr).zip(alpha) {
            // Same grouping as the official `x * (alpha * rsqrt(var))`.
            *o = v * (a * inv);
        }
    }
}

/// LayerNorm over each row of width `dim`, with affine weight and bias.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], eps: f32, dim: usize, y: &mut [f32]) {
    for (xr, yr) in x.chunks_exact(dim).zip(y.chunks_exact_mut(dim)) {
        let mean = xr.iter().sum::<f32>() / dim as f32;
        let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / dim as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (((o, v), w), b) in yr.iter_mut().zip(xr).zip(weight).zip(bias) {
            *o = (v - mean) * inv * w + b;
        }
    }
}

/// SiLU: `x · sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, exact (erf) form, as PyTorch's default `F.gelu`.
#[inline]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// ELU with alpha 1.
#[inline]
pub fn elu(x: f32) -> f32 {
    if x > 0.0 {
        x
    } else {
        x.exp_m1()
    }
}

/// The error function in float32, computed in float64 for accuracy
/// (Abramowitz–Stegun 7.1.26 is not accurate enough for 1e-4 agreement).
pub fn erf(x: f32) -> f32 {
    erf_f64(x as f64) as f32
}

/// erf(x) in float64 via its Taylor series near zero and the continued
/// fraction of erfc elsewhere; absolute error below 1e-12.
fn erf_f64(x: f64) -> f64 {
    let ax = x.abs();
    let r = if ax < 2.5 {
        // Taylor series: erf(x) = 2/√π Σ (-1)^n x^(2n+1) / (n! (2n+1)).
        let x2 = ax * ax;
        let mut term = ax;
        let mut sum = ax;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -x2 / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() <= 1e-17 * sum.abs() || n > 200.0 {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if ax > 6.0 {
        1.0
    } else {
        // Continued fraction for erfc, evaluated backwards (Lentz-free form).
        let mut f = 0.0;
        for k in (1..=60).rev() {
            f = (k as f64 / 2.0) / (ax + f);
        }
        let erfc = (-ax * ax).exp() / (std::f64::consts::PI.sqrt() * (ax + f));
        1.0 - erfc
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// In-place softmax over `x`.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Index of the largest value (the first one on ties, as `torch.argmax`).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best
}

/// Rotary frequencies for a head width `head_dim`: `exp(-ln(period)·2i/D)`,
/// computed in float32 as the official `apply_rope`.
pub fn rope_freqs(head_dim: usize, max_period: f32, out: &mut [f32]) {
    let scale = -max_period.ln() * 2.0 / head_dim as f32;
    for (i, f) in out.iter_mut().enumerate().take(head_dim / 2) {
        *f = (i as f32 * scale).exp();
    }
}

/// Applies RoPE in place to one head vector at position `pos`, with the real
/// and imaginary parts interleaved (`[r0, i0, r1, i1, …]`).
pub fn rope_interleaved(v: &mut [f32], freqs: &[f32], pos: f32) {
    for (pair, f) in v.chunks_exact_mut(2).zip(freqs) {
        let angle = f * pos;
        let (s, c) = angle.sin_cos();
        let (r, i) = (pair[0], pair[1]);
        pair[0] = r * c - i * s;
        pair[1] = r * s + i * c;
    }
}

/// Applies RoPE in place to one head vector at position `pos`, with the real
/// parts in the first half and the imaginary parts in the second
/// (`[r0, r1, …, i0, i1, …]`, the official `rope_concat`).
pub fn rope_halves(v: &mut [f32], freqs: &[f32], pos: f32) {
    let (re, im) = v.split_at_mut(v.len() / 2);
    for ((r, i), f) in re.iter_mut().zip(im.iter_mut()).zip(freqs) {
        let angle = f * pos;
        let (s, c) = angle.sin_cos();
        let (x, y) = (*r, *i);
        *r = x * c - y * s;
        *i = x * s + y * c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_known_values() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (2.0, 0.995_322_3),
            (3.0, 0.999_977_9),
            (-1.0, -0.842_700_8),
        ] {
            assert!((erf(x) - want).abs() < 1e-6, "erf({x}) = {}", erf(x));
        }
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_norm() {
        let mut f = [0.0; 2];
        rope_freqs(4, 10_000.0, &mut f);
        assert_eq!(f[0], 1.0);
        assert!((f[1] - 0.01).abs() < 1e-7);
        let mut v = [1.0, 0.0, 0.0, 1.0];
        rope_interleaved(&mut v, &f, 1.0);
        assert!((v[0] - 1f32.cos()).abs() < 1e-6 && (v[1] - 1f32.sin()).abs() < 1e-6);
        assert!((v[2] + 0.01f32.sin()).abs() < 1e-6 && (v[3] - 0.01f32.cos()).abs() < 1e-6);
        let n: f32 = v.iter().map(|x| x * x).sum();
        assert!((n - 2.0).abs() < 1e-6);
        // Position 0 is the identity.
        let mut w = [0.3, -0.7, 1.1, 2.0];
        rope_interleaved(&mut w, &f, 0.0);
        assert_eq!(w, [0.3, -0.7, 1.1, 2.0]);
    }

    #[test]
    fn rope_halves_pairs_element_i_with_i_plus_half() {
        let mut f = [0.0; 2];
        rope_freqs(4, 10_000.0, &mut f);
        // The halves layout of the interleaved vector [1, 0, 0, 1] is
        // [1, 0, 0, 1] reordered as (r0, r1, i0, i1) = (1, 0, 0, 1).
        let mut a = [1.0, 0.0, 0.0, 1.0];
        let mut b = [1.0, 0.0, 0.0, 1.0];
        rope_interleaved(&mut a, &f, 1.0);
        rope_halves(&mut b, &f, 1.0);
        // Same rotations, other positions: a = (r0', i0', r1', i1').
        assert_eq!([b[0], b[2], b[1], b[3]], a);
        let mut w = [0.3, -0.7, 1.1, 2.0];
        rope_halves(&mut w, &f, 0.0);
        assert_eq!(w, [0.3, -0.7, 1.1, 2.0]);
    }

    #[test]
    fn norms_and_softmax() {
        let x = [1.0, 2.0, 3.0, 4.0];
        let mut y = [0.0; 4];
        layer_norm(&x, &[1.0; 4], &[0.0; 4], 1e-5, 4, &mut y);
        assert!(y.iter().sum::<f32>().abs() < 1e-5);
        rms_norm(&x, &[2.0; 4], 1e-8, 4, &mut y);
        let rms = (30.0f32 / 4.0).sqrt();
        assert!((y[3] - 2.0 * 4.0 / rms).abs() < 1e-5);
        let mut s = [1.0, 2.0, 3.0];
        softmax_inplace(&mut s);
        assert!((s.iter().sum::<f32>() - 1.0).abs() < 1e-6 && s[2] > s[1]);
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    }
}
