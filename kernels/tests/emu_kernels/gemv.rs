//! Few-row matrix-vector products with their fused inputs, against the
//! separate kernels they replace (rms_norm, silu_gate, f32_to_bf16) followed
//! by a host product in f64; rows computed alone and among others give the
//! same bits.

use super::*;
use moshid_kernels::ops::elementwise::EwKernels;
use moshid_kernels::ops::gemv::{GemvCall, GemvInput, GemvKernels};
use moshid_kernels::ops::norm::NormKernels;

/// `v` as the device stores `t` (bf16 bits or f32).
fn up_as(dev: &mut dyn Device, v: &[f32], t: DType) -> DevPtr {
    match t {
        DType::F32 => up(dev, v),
        DType::Bf16 => up(dev, &v.iter().map(|&x| bf16(x)).collect::<Vec<u16>>()),
    }
}

/// `n` values of type `t` at `p` as f32.
fn down_as(dev: &mut dyn Device, p: DevPtr, n: usize, t: DType) -> Vec<f32> {
    match t {
        DType::F32 => down::<f32>(dev, p, n),
        DType::Bf16 => down::<u16>(dev, p, n).into_iter().map(from_bf16).collect(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Plain,
    Cast,
    Rms,
    Silu,
}

/// One case: the GEMV of `rows` rows against the separate kernel's x' and
/// a host product.
#[allow(clippy::too_many_arguments)]
fn case(
    dev: &mut dyn Device,
    t: DType,
    kind: Kind,
    rows: usize,
    n: usize,
    k: usize,
    accumulate: bool,
    seed: f32,
) {
    let ew = EwKernels::resolve(dev).unwrap();
    let norm = NormKernels::resolve(dev).unwrap();
    let gv = GemvKernels::resolve(dev).unwrap();
    let dw = up_as(dev, &weights(n, k, seed), t);
    let w = down_as(dev, dw, n * k, t);
    let width = if kind == Kind::Silu { 2 * k } else { k };
    let x = det(rows * width, seed + 1.0)
        .iter()
        .map(|v| v * 3.0)
        .collect::<Vec<_>>();
    // Row 1 is masked for the norm (zeros, as the residual stream's masked rows).
    let mut infos = rows_all(rows);
    let mut x = x;
    if kind == Kind::Rms && rows > 1 {
        infos[1].active = 0;
        x[k..2 * k].iter_mut().for_each(|v| *v = 0.0);
    }
    let alpha = det(k, seed + 2.0);
    let (dalpha, dinfo) = (up(dev, &alpha), up(dev, &infos));
    // x' from the separate kernel.
    let xp = zeros::<f32>(dev, rows * k);
    let (dx, input) = match kind {
        Kind::Plain => {
            let dx = up_as(dev, &x, t);
            (dx, GemvInput::Plain)
        }
        Kind::Cast => {
            let dx = up(dev, &x);
            if t == DType::Bf16 {
                ew.to_bf16(dev, dx, xp, rows * k).unwrap();
            }
            (dx, GemvInput::Cast)
        }
        Kind::Rms => {
            let dx = up(dev, &x);
            norm.rms_norm(dev, dx, dalpha, 1e-5, k, dinfo, rows, xp, t)
                .unwrap();
            let input = GemvInput::Rms {
                alpha: dalpha,
                eps: 1e-5,
                rows: dinfo,
            };
            (dx, input)
        }
        Kind::Silu => {
            let dx = up(dev, &x);
            ew.silu_gate(dev, dx, k, rows, xp, t).unwrap();
            (dx, GemvInput::Silu)
        }
    };
    let xprime = match (kind, t) {
        (Kind::Plain, _) => down_as(dev, dx, rows * k, t),
        (Kind::Cast, DType::F32) => x.clone(),
        _ => down_as(dev, xp, rows * k, t),
    };
    let y0 = det(rows * n, seed + 3.0);
    let dy = up(dev, &y0);
    gv.gemv(
        dev,
        &GemvCall {
            x: dx,
            input,
            w: dw,
            w_type: t,
            rows,
            n,
            k,
            y: dy,
            accumulate,
        },
    )
    .unwrap();
    let got = down::<f32>(dev, dy, rows * n);
    if seed == 0.0 {
        let diff = got
            .iter()
            .zip(&xprime)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(
            diff, None,
            "{t:?} {kind:?} rows {rows}: x' differs from the separate kernel's"
        );
        return;
    }
    let what = format!("{t:?} {kind:?} rows {rows}");
    check_product(
        &got,
        &xprime,
        &w,
        accumulate.then_some(&y0[..]),
        (rows, n, k),
        &what,
    );
}

/// The weights of a case: seed 0 gives the identity (n = k), so that y is
/// x' itself, bit for bit.
fn weights(n: usize, k: usize, seed: f32) -> Vec<f32> {
    if seed == 0.0 {
        (0..n * k)
            .map(|e| f32::from(u8::from(e / k == e % k)))
            .collect()
    } else {
        det(n * k, seed).iter().map(|v| v * 0.5).collect()
    }
}

/// `got` (`[rows][n]`) against the host product `x' · wᵀ` (+ `y0`) in f64.
fn check_product(
    got: &[f32],
    xprime: &[f32],
    w: &[f32],
    y0: Option<&[f32]>,
    (rows, n, k): (usize, usize, usize),
    what: &str,
) {
    for m in 0..rows {
        for o in 0..n {
            let dot: f64 = (0..k)
                .map(|i| xprime[m * k + i] as f64 * w[o * k + i] as f64)
                .sum();
            let want = dot + y0.map_or(0.0, |y0| y0[m * n + o] as f64);
            let g = got[m * n + o] as f64;
            assert!(
                (g - want).abs() <= 2e-5 * want.abs().max(1.0),
                "{what} n {n} k {k}: y[{m}][{o}] = {g} vs {want}"
            );
        }
    }
}

#[test]
fn gemv_matches_the_separate_kernels_and_a_product() {
    let mut dev = device();
    for t in [DType::Bf16, DType::F32] {
        for kind in [Kind::Plain, Kind::Cast, Kind::Rms, Kind::Silu] {
            // Rows on both kernels (≤ 2, ≤ 8); columns not a multiple of the
            // block's 4; K of one chunk per thread or less, and several
            // passes with a partial last one.
            for (rows, n, k, acc) in [
                (1, 37, 8, false),
                (2, 130, 264, true),
                (3, 5, 4104, false),
                (8, 9, 520, true),
            ] {
                case(
                    &mut *dev,
                    t,
                    kind,
                    rows,
                    n,
                    k,
                    acc,
                    rows as f32 + k as f32 * 0.01,
                );
            }
            // x' bit for bit (an identity product), on both kernels, with a
            // block of 64 threads and of 256 (2056 terms).
            for (rows, k) in [(2, 264), (5, 264), (3, 2056)] {
                case(&mut *dev, t, kind, rows, k, k, false, 0.0);
            }
        }
    }
}

#[test]
fn gemv_rows_do_not_depend_on_the_others() {
    // The same row alone (the two-row kernel) and as row 5 of 7 (the
    // eight-row kernel): the same bits.
    let mut dev = device();
    let gv = GemvKernels::resolve(&*dev).unwrap();
    let (n, k) = (70, 2056);
    let w = up_as(&mut *dev, &det(n * k, 1.0), DType::Bf16);
    let mine = det(k, 2.0);
    let mut many = det(7 * k, 3.0);
    many[5 * k..6 * k].copy_from_slice(&mine);
    let alpha = up(&mut *dev, &det(k, 4.0));
    let run = |dev: &mut dyn Device, x: &[f32], rows: usize| {
        let dx = up(dev, x);
        let y = zeros::<f32>(dev, rows * n);
        gv.gemv(
            dev,
            &GemvCall {
                x: dx,
                input: GemvInput::Rms {
                    alpha,
                    eps: 1e-6,
                    rows: NULL,
                },
                w,
                w_type: DType::Bf16,
                rows,
                n,
                k,
                y,
                accumulate: false,
            },
        )
        .unwrap();
        down::<f32>(dev, y, rows * n)
    };
    let alone = run(&mut *dev, &mine, 1);
    let among = run(&mut *dev, &many, 7);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&alone), bits(&among[5 * n..6 * n]));
    // Refused: too many rows, K not a multiple of 8.
    assert!(!GemvKernels::takes(9, 8) && !GemvKernels::takes(1, 12) && !GemvKernels::takes(0, 8));
}
