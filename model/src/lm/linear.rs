//! The LM's linear layers: `y = x · wᵀ` (or `y += x · wᵀ`) for the few rows
//! of a step, reading the weights in place (PyTorch `[out, inp]` layout).
//!
//! Why not a general sgemm (matrixmultiply): it allocates a packing
//! buffer and repacks the weight on every call, and its 8-row micro-kernel
//! wastes most of its work when a step has one or two rows. Here the outer
//! loop walks blocks of 4 (8 for a single row) weight rows and the inner loop
//! every row pair of the batch, so each weight is read from memory once per
//! call, and nothing is allocated. With AVX2 and FMA (detected at run time)
//! the tiles are explicit 8-lane FMA kernels; elsewhere a portable loop.
//!
//! Numerics: float32, one 8-lane accumulator per output summed in a fixed
//! order; an output's value does not depend on how many rows the call has.

/// `y[rows, out] = x[rows, inp] · wᵀ`, `w` stored `[out, inp]`.
pub(crate) fn linear(x: &[f32], rows: usize, w: &[f32], out: usize, inp: usize, y: &mut [f32]) {
    dispatch(x, rows, w, out, inp, y, false);
}

/// `y[rows, out] += x[rows, inp] · wᵀ`.
pub(crate) fn linear_acc(x: &[f32], rows: usize, w: &[f32], out: usize, inp: usize, y: &mut [f32]) {
    dispatch(x, rows, w, out, inp, y, true);
}

fn dispatch(x: &[f32], rows: usize, w: &[f32], out: usize, inp: usize, y: &mut [f32], acc: bool) {
    assert!(x.len() >= rows * inp && w.len() >= out * inp && y.len() >= rows * out);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked just above) and the
        // slices hold `rows·inp`, `out·inp` and `rows·out` values (asserted).
        unsafe { avx::linear(x, rows, w, out, inp, y, acc) };
        return;
    }
    portable(x, rows, w, out, inp, y, acc);
}

/// Eight-lane dot product (vectorises on any SIMD width).
fn dot8(a: &[f32], b: &[f32]) -> f32 {
    let mut l = [0.0f32; 8];
    let body = a.len() - a.len() % 8;
    for (x, y) in a[..body].chunks_exact(8).zip(b[..body].chunks_exact(8)) {
        for i in 0..8 {
            l[i] += x[i] * y[i];
        }
    }
    let mut s = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
    for (x, y) in a[body..].iter().zip(&b[body..]) {
        s += x * y;
    }
    s
}

fn portable(x: &[f32], rows: usize, w: &[f32], out: usize, inp: usize, y: &mut [f32], acc: bool) {
    for (o, wo) in w[..out * inp].chunks_exact(inp).enumerate() {
        for (r, xr) in x[..rows * inp].chunks_exact(inp).enumerate() {
            let v = dot8(xr, wo);
            let p = &mut y[r * out + o];
            *p = if acc { *p + v } else { v };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::*;

    /// Sum of the 8 lanes, in a fixed order.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s)))
    }

    /// `R` rows × `O` outputs: `x` at the first row (stride `inp`), `w` at the
    /// first weight row (stride `inp`), `y` at the first output (row stride `out`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const O: usize>(
        x: *const f32,
        w: *const f32,
        inp: usize,
        y: *mut f32,
        out: usize,
        acc: bool,
    ) {
        let mut a = [[_mm256_setzero_ps(); O]; R];
        let body = inp & !7;
        let mut k = 0;
        while k < body {
            let mut wv = [_mm256_setzero_ps(); O];
            for (j, v) in wv.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(w.add(j * inp + k));
            }
            for (r, ar) in a.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(x.add(r * inp + k));
                for (aj, wj) in ar.iter_mut().zip(&wv) {
                    *aj = _mm256_fmadd_ps(xv, *wj, *aj);
                }
            }
            k += 8;
        }
        for (r, ar) in a.iter().enumerate() {
            for (j, aj) in ar.iter().enumerate() {
                let mut s = hsum(*aj);
                for i in body..inp {
                    s = (*x.add(r * inp + i)).mul_add(*w.add(j * inp + i), s);
                }
                let p = y.add(r * out + j);
                *p = if acc { *p + s } else { s };
            }
        }
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA; `x`, `w`, `y` must hold at least
    /// `rows·inp`, `out·inp`, `rows·out` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn linear(
        x: &[f32],
        rows: usize,
        w: &[f32],
        out: usize,
        inp: usize,
        y: &mut [f32],
        acc: bool,
    ) {
        let (xp, wp, yp) = (x.as_ptr(), w.as_ptr(), y.as_mut_ptr());
        let mut o = 0;
        if rows == 1 {
            while o + 8 <= out {
                tile::<1, 8>(xp, wp.add(o * inp), inp, yp.add(o), out, acc);
                o += 8;
            }
        }
        while o + 4 <= out {
            let mut r = 0;
            while r + 2 <= rows {
                tile::<2, 4>(
                    xp.add(r * inp),
                    wp.add(o * inp),
                    inp,
                    yp.add(r * out + o),
                    out,
                    acc,
                );
                r += 2;
            }
            if r < rows {
                tile::<1, 4>(
                    xp.add(r * inp),
                    wp.add(o * inp),
                    inp,
                    yp.add(r * out + o),
                    out,
                    acc,
                );
            }
            o += 4;
        }
        while o < out {
            for r in 0..rows {
                tile::<1, 1>(
                    xp.add(r * inp),
                    wp.add(o * inp),
                    inp,
                    yp.add(r * out + o),
                    out,
                    acc,
                );
            }
            o += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Kernel = fn(&[f32], usize, &[f32], usize, usize, &mut [f32], bool);

    fn check(f: Kernel) {
        for (rows, out, inp) in [
            (1, 1, 1),
            (3, 7, 13),
            (2, 4, 16),
            (5, 9, 37),
            (1, 13, 64),
            (4, 12, 24),
        ] {
            let x: Vec<f32> = (0..rows * inp).map(|i| (i as f32 * 0.37).sin()).collect();
            let w: Vec<f32> = (0..out * inp).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut y = vec![1.0; rows * out];
            f(&x, rows, &w, out, inp, &mut y, false);
            for r in 0..rows {
                for o in 0..out {
                    let want: f32 = (0..inp).map(|k| x[r * inp + k] * w[o * inp + k]).sum();
                    assert!(
                        (y[r * out + o] - want).abs() < 1e-4,
                        "{rows}x{out}x{inp} [{r},{o}]"
                    );
                }
            }
            let before = y.clone();
            f(&x, rows, &w, out, inp, &mut y, true);
            for (a, b) in y.iter().zip(&before) {
                assert!((a - 2.0 * b).abs() < 1e-4);
            }
            // An output's value does not depend on the number of rows.
            let mut y1 = vec![0.0; out];
            f(&x[(rows - 1) * inp..], 1, &w, out, inp, &mut y1, false);
            assert_eq!(&y1[..], &before[(rows - 1) * out..]);
        }
    }

    #[test]
    fn matches_naive_for_odd_shapes() {
        check(dispatch);
        check(portable);
    }
}
