//! Element-wise kernels for Mimi written so the compiler vectorizes them:
//! ELU (SEANet), GELU (transformer feed-forward) and a dot product.
//!
//! - `exp` is a range-reduced degree-7 polynomial (relative error about
//!   1 ulp on the range used), with no library call and no branch.
//! - ELU is `x` for `x > 0`, else `exp(x) − 1` (absolute error ≲ 1e-7).
//! - GELU is `½x(1 + erf(x/√2))` with the erf polynomial that PyTorch's
//!   vectorized CPU kernel uses (Abramowitz–Stegun 7.1.26, absolute error
//!   ≤ 1.5e-7), so it tracks the reference as closely as the exact erf does.
//! - `dot` sums in 8 interleaved partial sums.
//!
//! Invariants: pure functions of their inputs, no allocation.

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// 1.5·2²³: adding it rounds to an integer held in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `e^x` for `x` in [−87, 88] (clamped), vectorizable.
#[inline(always)]
fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + ROUND_MAGIC;
    let n = t - ROUND_MAGIC;
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // Taylor series of e^r on |r| ≤ ln2/2 to degree 7.
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    p * f32::from_bits(((ni + 127) << 23) as u32)
}

#[inline(always)]
fn elu1(x: f32) -> f32 {
    let e = exp(x.min(0.0)) - 1.0;
    if x > 0.0 {
        x
    } else {
        e
    }
}

/// `dst[i] = elu(src[i])`.
pub(crate) fn elu_into(dst: &mut [f32], src: &[f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = elu1(*s);
    }
}

/// `x[i] = elu(x[i])`.
pub(crate) fn elu_inplace(x: &mut [f32]) {
    for v in x {
        *v = elu1(*v);
    }
}

#[inline(always)]
fn erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A1: f32 = 0.254_829_6;
    const A2: f32 = -0.284_496_72;
    const A3: f32 = 1.421_413_8;
    const A4: f32 = -1.453_152;
    const A5: f32 = 1.061_405_4;
    let ax = x.abs();
    let t = 1.0 / (P * ax + 1.0);
    let r = (((A5 * t + A4) * t + A3) * t + A2) * t + A1;
    let y = 1.0 - r * t * exp(-(ax * ax));
    y.copysign(x)
}

/// `x[i] = gelu(x[i])` (erf form).
pub(crate) fn gelu_inplace(x: &mut [f32]) {
    for v in x {
        *v = 0.5 * *v * (1.0 + erf(*v * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// `Σ a[i]·b[i]` (8 interleaved partial sums).
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;

    #[test]
    fn exp_is_accurate() {
        let mut worst = 0f64;
        for i in -8700..=8800 {
            let x = i as f32 * 0.01;
            let want = (x as f64).exp();
            let rel = ((exp(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
        }
        assert!(worst < 3e-7, "worst relative error {worst:e}");
    }

    #[test]
    fn activations_match_exact_forms() {
        let xs: Vec<f32> = (-4000..4000).map(|i| i as f32 * 0.003 + 0.0001).collect();
        let mut e = vec![0.0; xs.len()];
        elu_into(&mut e, &xs);
        let mut g = xs.clone();
        gelu_inplace(&mut g);
        for (i, &x) in xs.iter().enumerate() {
            assert!((e[i] - ops::elu(x)).abs() < 2e-7, "elu({x})");
            assert!(
                (g[i] - ops::gelu(x)).abs() < 4e-7 * x.abs().max(1.0),
                "gelu({x})"
            );
        }
        let mut big = vec![-200.0, 100.0];
        elu_inplace(&mut big);
        assert_eq!(big, vec![-1.0, 100.0]);
    }

    #[test]
    fn dot_matches() {
        let a: Vec<f32> = (0..67).map(|i| (i as f32 * 0.3).sin()).collect();
        let b: Vec<f32> = (0..67).map(|i| (i as f32 * 0.7).cos()).collect();
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (*x as f64) * (*y as f64))
            .sum();
        assert!((dot(&a, &b) as f64 - want).abs() < 1e-5);
    }
}
