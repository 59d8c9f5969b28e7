//! The LM's linear layers: `y = x · wᵀ` (or `y += x · wᵀ`) for the few rows
//! of a step, reading the weights in place (PyTorch `[out, inp]` layout).
//!
//! Why not `ops::linear` (matrixmultiply): its sgemm allocates a packing
//! buffer and repacks the whole weight on every call, and its 8-row
//! micro-kernel wastes most of its work when a step has one or two rows. Here
//! each tile computes 2 rows × 4 outputs with 8-lane accumulators straight
//! from the row-major weights, so every weight is read once per call and
//! nothing is allocated. With AVX2 and FMA present (detected at run time) the
//! same code is compiled for them.
//!
//! Numerics: float32 dot products with eight partial sums per output, summed
//! in a fixed order; results do not depend on the number of rows.

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
        // SAFETY: the CPU supports AVX2 and FMA, checked just above; the
        // function is otherwise safe code.
        unsafe { linear_avx2_fma(x, rows, w, out, inp, y, acc) };
        return;
    }
    linear_generic::<false>(x, rows, w, out, inp, y, acc);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn linear_avx2_fma(
    x: &[f32],
    rows: usize,
    w: &[f32],
    out: usize,
    inp: usize,
    y: &mut [f32],
    acc: bool,
) {
    linear_generic::<true>(x, rows, w, out, inp, y, acc);
}

#[inline(always)]
fn linear_generic<const FMA: bool>(
    x: &[f32],
    rows: usize,
    w: &[f32],
    out: usize,
    inp: usize,
    y: &mut [f32],
    acc: bool,
) {
    let mut o = 0;
    while o < out {
        match out - o {
            1 => rows_tile::<1, FMA>(x, rows, w, out, inp, y, acc, o),
            2 => rows_tile::<2, FMA>(x, rows, w, out, inp, y, acc, o),
            3 => rows_tile::<3, FMA>(x, rows, w, out, inp, y, acc, o),
            _ => rows_tile::<4, FMA>(x, rows, w, out, inp, y, acc, o),
        }
        o += 4;
    }
}

/// Outputs `o0 .. o0 + O` for every row.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn rows_tile<const O: usize, const FMA: bool>(
    x: &[f32],
    rows: usize,
    w: &[f32],
    out: usize,
    inp: usize,
    y: &mut [f32],
    acc: bool,
    o0: usize,
) {
    let ws: [&[f32]; O] = std::array::from_fn(|j| &w[(o0 + j) * inp..(o0 + j + 1) * inp]);
    let mut r = 0;
    while r < rows {
        if rows - r >= 2 {
            let xs = [&x[r * inp..(r + 1) * inp], &x[(r + 1) * inp..(r + 2) * inp]];
            let v = tile::<2, O, FMA>(xs, ws);
            store(y, out, r, o0, &v, acc);
            r += 2;
        } else {
            let v = tile::<1, O, FMA>([&x[r * inp..(r + 1) * inp]], ws);
            store(y, out, r, o0, &v, acc);
            r += 1;
        }
    }
}

#[inline(always)]
fn store<const R: usize, const O: usize>(
    y: &mut [f32],
    out: usize,
    r0: usize,
    o0: usize,
    v: &[[f32; O]; R],
    acc: bool,
) {
    for (i, vr) in v.iter().enumerate() {
        let yr = &mut y[(r0 + i) * out + o0..(r0 + i) * out + o0 + O];
        if acc {
            for (a, b) in yr.iter_mut().zip(vr) {
                *a += b;
            }
        } else {
            yr.copy_from_slice(vr);
        }
    }
}

#[inline(always)]
fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Dot products of `R` rows with `O` weight rows (all of the same length).
#[inline(always)]
fn tile<const R: usize, const O: usize, const FMA: bool>(
    xs: [&[f32]; R],
    ws: [&[f32]; O],
) -> [[f32; O]; R] {
    let inp = xs[0].len();
    let body = inp - inp % 8;
    let mut acc = [[[0.0f32; 8]; O]; R];
    let mut b = 0;
    while b < body {
        let wv: [&[f32; 8]; O] = std::array::from_fn(|j| ws[j][b..b + 8].try_into().unwrap());
        for (xr, ar) in xs.iter().zip(acc.iter_mut()) {
            let xv: &[f32; 8] = xr[b..b + 8].try_into().unwrap();
            for (wj, aj) in wv.iter().zip(ar.iter_mut()) {
                for l in 0..8 {
                    aj[l] = fmadd::<FMA>(xv[l], wj[l], aj[l]);
                }
            }
        }
        b += 8;
    }
    let mut out = [[0.0f32; O]; R];
    for r in 0..R {
        for j in 0..O {
            let a = &acc[r][j];
            let mut s = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
            for i in body..inp {
                s = fmadd::<FMA>(xs[r][i], ws[j][i], s);
            }
            out[r][j] = s;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_for_odd_shapes() {
        for (rows, out, inp) in [(1, 1, 1), (3, 7, 13), (2, 4, 16), (5, 9, 37), (1, 6, 64)] {
            let x: Vec<f32> = (0..rows * inp).map(|i| (i as f32 * 0.37).sin()).collect();
            let w: Vec<f32> = (0..out * inp).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut y = vec![1.0; rows * out];
            linear(&x, rows, &w, out, inp, &mut y);
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
            linear_acc(&x, rows, &w, out, inp, &mut y);
            for (a, b) in y.iter().zip(&before) {
                assert!((a - 2.0 * b).abs() < 1e-4);
            }
            // Row results do not depend on the number of rows.
            let mut y1 = vec![0.0; out];
            linear(&x[(rows - 1) * inp..], 1, &w, out, inp, &mut y1);
            assert_eq!(&y1[..], &before[(rows - 1) * out..]);
        }
    }
}
