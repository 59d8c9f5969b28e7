//! Weight-stationary matrix products for Mimi: `y[m][n] = x[m][k] · Wᵀ`
//! with `W` packed once at load into column panels, so a call streams each
//! weight once and never repacks it (the general sgemm repacks its operands
//! on every call, which dominates when a layer has only a few rows per slot).
//!
//! Layout: `W` is stored as `⌈n/16⌉` panels of `[k][16]` (the last one
//! zero-padded). The kernel computes tiles of up to 8 (AVX-512) or 4 rows ×
//! 16 columns, blocking `k` by [`KC`] and keeping the partial sums in `y`
//! between blocks. The instruction set is picked at run time (AVX-512F,
//! else AVX2+FMA, else portable code); the FMA paths give bit-identical
//! results.
//!
//! Invariants: every output element is the sum over `k` in increasing order,
//! one fused multiply-add (or multiply then add, on CPUs without FMA) per
//! term, starting from 0 — so a row's result does not depend on how many
//! rows are computed with it nor on its position among them (batching slots
//! never changes a slot's numbers). No allocation in [`PackedLinear::forward`].

/// Panel width (output columns per tile).
const NR: usize = 16;
/// `k` block: a panel block (`KC × NR` floats) stays in L1.
const KC: usize = 256;

/// A weight matrix `[n][k]` packed for [`PackedLinear::forward`].
#[derive(Debug, Clone, Default)]
pub(crate) struct PackedLinear {
    n: usize,
    k: usize,
    panels: Vec<f32>,
}

impl PackedLinear {
    /// Packs `w(o, i)` for `o < n`, `i < k` (output `o`, input `i`).
    pub(crate) fn from_fn(n: usize, k: usize, w: impl Fn(usize, usize) -> f32) -> Self {
        let np = n.div_ceil(NR);
        let mut panels = vec![0.0; np * k * NR];
        for o in 0..n {
            let (p, j) = (o / NR, o % NR);
            for i in 0..k {
                panels[(p * k + i) * NR + j] = w(o, i);
            }
        }
        PackedLinear { n, k, panels }
    }

    /// Packs a row-major `[n][k]` matrix (the `nn.Linear` layout).
    pub(crate) fn from_rows(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k);
        Self::from_fn(n, k, |o, i| w[o * k + i])
    }

    /// `y[m][n] = x[m][k] · Wᵀ` (overwrites `y`).
    pub(crate) fn forward(&self, x: &[f32], m: usize, y: &mut [f32]) {
        assert!(
            x.len() >= m * self.k && y.len() >= m * self.n,
            "operand too short"
        );
        if m == 0 || self.n == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked just above), the
            // only requirement of this `target_feature` function.
            unsafe { gemm_avx512(x, m, self.k, &self.panels, self.n, y) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above), the
            // only requirement of this `target_feature` function; its body is
            // safe Rust.
            unsafe { gemm_avx2_fma(x, m, self.k, &self.panels, self.n, y) };
            return;
        }
        gemm::<false, 4>(x, m, self.k, &self.panels, self.n, y);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn gemm_avx512(x: &[f32], m: usize, k: usize, panels: &[f32], n: usize, y: &mut [f32]) {
    gemm::<true, 8>(x, m, k, panels, n, y);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_avx2_fma(x: &[f32], m: usize, k: usize, panels: &[f32], n: usize, y: &mut [f32]) {
    gemm::<true, 4>(x, m, k, panels, n, y);
}

#[inline(always)]
fn gemm<const FMA: bool, const MRX: usize>(
    x: &[f32],
    m: usize,
    k: usize,
    panels: &[f32],
    n: usize,
    y: &mut [f32],
) {
    let np = n.div_ceil(NR);
    let mut k0 = 0;
    while k0 < k {
        let k1 = (k0 + KC).min(k);
        for p in 0..np {
            let block = &panels[(p * k + k0) * NR..(p * k + k1) * NR];
            let cols = NR.min(n - p * NR);
            let mut i = 0;
            while i < m {
                let rows = MRX.min(m - i);
                match rows {
                    8 => tile::<8, FMA>(x, i, k, k0, k1, block, y, n, p * NR, cols),
                    7 => tile::<7, FMA>(x, i, k, k0, k1, block, y, n, p * NR, cols),
                    6 => tile::<6, FMA>(x, i, k, k0, k1, block, y, n, p * NR, cols),
                    5 => tile::<5, FMA>(x, i, k, k0, k1, block, y, n, p * NR, cols),
                    4 => tile::<4, FMA>(x, i, k, k0, k1, block, y, n, p * NR, cols),
                    3 => tile::<3, FMA>(x, i, k, k0, k1, block, y, n, p * NR, cols),
                    2 => tile::<2, FMA>(x, i, k, k0, k1, block, y, n, p * NR, cols),
                    _ => tile::<1, FMA>(x, i, k, k0, k1, block, y, n, p * NR, cols),
                }
                i += rows;
            }
        }
        k0 = k1;
    }
}

/// One `R × NR` tile over `k0..k1`, continuing the sums held in `y` when `k0 > 0`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile<const R: usize, const FMA: bool>(
    x: &[f32],
    i: usize,
    k: usize,
    k0: usize,
    k1: usize,
    block: &[f32],
    y: &mut [f32],
    n: usize,
    c0: usize,
    cols: usize,
) {
    let kc = k1 - k0;
    let mut acc = [[0f32; NR]; R];
    if k0 > 0 {
        for (r, a) in acc.iter_mut().enumerate() {
            a[..cols].copy_from_slice(&y[(i + r) * n + c0..(i + r) * n + c0 + cols]);
        }
    }
    let xs: [&[f32]; R] = std::array::from_fn(|r| &x[(i + r) * k + k0..(i + r) * k + k1]);
    let block = &block[..kc * NR];
    for (t, w) in block.chunks_exact(NR).enumerate() {
        let w: &[f32; NR] = w.try_into().expect("panel row");
        for r in 0..R {
            let a = xs[r][t];
            let acc = &mut acc[r];
            for j in 0..NR {
                acc[j] = if FMA {
                    a.mul_add(w[j], acc[j])
                } else {
                    acc[j] + a * w[j]
                };
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        y[(i + r) * n + c0..(i + r) * n + c0 + cols].copy_from_slice(&a[..cols]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn det(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.377).sin()).collect()
    }

    #[test]
    fn matches_naive_and_is_row_independent() {
        for &(m, k, n) in &[(1, 3, 1), (5, 300, 17), (7, 513, 40), (2, 16, 16)] {
            let x = det(m * k, 1.0);
            let w = det(n * k, 2.0);
            let lin = PackedLinear::from_rows(&w, n, k);
            let mut y = vec![0.0; m * n];
            lin.forward(&x, m, &mut y);
            for r in 0..m {
                for o in 0..n {
                    let want: f32 = (0..k).map(|i| x[r * k + i] * w[o * k + i]).sum();
                    assert!(
                        (y[r * n + o] - want).abs() < 1e-3,
                        "({r},{o}) {} vs {want}",
                        y[r * n + o]
                    );
                }
                // The same row alone gives bit-identical results.
                let mut y1 = vec![0.0; n];
                lin.forward(&x[r * k..(r + 1) * k], 1, &mut y1);
                assert_eq!(&y1[..], &y[r * n..(r + 1) * n]);
            }
        }
    }

    /// `y = x · wᵀ` through matrixmultiply's general sgemm (the baseline).
    fn sgemm_linear(x: &[f32], m: usize, w: &[f32], n: usize, k: usize, y: &mut [f32]) {
        // SAFETY: `x` is m×k, `w` is n×k and `y` is m×n, all row-major and
        // sized by the caller; `y` is a unique borrow.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                x.as_ptr(),
                k as isize,
                1,
                w.as_ptr(),
                1,
                k as isize,
                0.0,
                y.as_mut_ptr(),
                n as isize,
                1,
            );
        }
    }

    /// `cargo test --release -p moshid-model --lib mimi::linear -- --ignored --nocapture`
    #[test]
    #[ignore = "benchmark"]
    fn bench_against_sgemm() {
        for &(m, k, n) in &[
            (2, 8192, 1024),
            (16, 3072, 512),
            (16, 512, 1536),
            (128, 512, 1536),
            (480, 512, 128),
            (1920, 192, 32),
        ] {
            let x = det(m * k, 1.0);
            let w = det(n * k, 2.0);
            let lin = PackedLinear::from_rows(&w, n, k);
            let mut y = vec![0.0; m * n];
            let reps = (2e9 / (m * k * n) as f64).clamp(3.0, 200.0) as usize;
            let t0 = std::time::Instant::now();
            for _ in 0..reps {
                lin.forward(&x, m, &mut y);
            }
            let a = t0.elapsed().as_secs_f64() / reps as f64;
            let t0 = std::time::Instant::now();
            for _ in 0..reps {
                sgemm_linear(&x, m, &w, n, k, &mut y);
            }
            let b = t0.elapsed().as_secs_f64() / reps as f64;
            let g = (m * k * n) as f64;
            println!(
                "m={m} k={k} n={n}: packed {:.2} GMAC/s, sgemm {:.2} GMAC/s",
                g / a / 1e9,
                g / b / 1e9
            );
        }
    }
}
