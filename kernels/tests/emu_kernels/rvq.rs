//! RVQ encode (nearest codeword, both distance paths, one launch per stage)
//! and decode (sums), against a host search in f64.

use super::*;
use moshid_kernels::ops::rvq::{RvqKernels, RvqShape};

/// The squared norms `[books][bins]` of entry-major codebooks
/// (`[books][bins][dq]`), summed in index order as the loader does.
pub(crate) fn book_norms(book: &[f32], books: usize, bins: usize, dq: usize) -> Vec<f32> {
    (0..books * bins)
        .map(|e| book[e * dq..(e + 1) * dq].iter().map(|v| v * v).sum())
        .collect()
}

/// Codes `[n][books]` of the host search: per stage the entry of least
/// exact distance (f64, first index on ties), then the residual update in
/// f32 as the kernel subtracts.
fn host_codes(
    x: &[f32],
    book: &[f32],
    n: usize,
    dq: usize,
    bins: usize,
    books: usize,
) -> Vec<usize> {
    let mut out = Vec::new();
    for r in 0..n {
        let mut res = x[r * dq..(r + 1) * dq].to_vec();
        for c in 0..books {
            let dist = |b: usize| -> f64 {
                (0..dq)
                    .map(|d| (res[d] as f64 - book[(c * bins + b) * dq + d] as f64).powi(2))
                    .sum()
            };
            let best = (0..bins)
                .min_by(|&a, &b| dist(a).total_cmp(&dist(b)))
                .unwrap();
            out.push(best);
            for d in 0..dq {
                res[d] -= book[(c * bins + best) * dq + d];
            }
        }
    }
    out
}

/// Runs the encode of `x` (`[n][dq]`) with codes in columns 1.. of rows of
/// `books + 1` (column 0 is someone else's and must stay untouched).
fn encode(
    dev: &mut dyn Device,
    x: &[f32],
    book: &[f32],
    steps: &[SlotStep],
    shape: (usize, usize, usize),
) -> Vec<u32> {
    let (dq, bins, books) = shape;
    let n = steps.len();
    let s = RvqShape {
        n_books: books,
        dq,
        bins,
        codes_stride: books + 1,
        col0: 1,
    };
    let (dx, dbook) = (up(dev, x), up(dev, book));
    let dn = up(dev, &book_norms(book, books, bins, dq));
    let ds = up(dev, steps);
    let part = zeros::<u8>(dev, s.part_bytes(n));
    let codes = up(dev, &vec![7777u32; n * (books + 1)]);
    RvqKernels::resolve(dev)
        .unwrap()
        .encode(dev, &s, n, dx, dbook, dn, ds, part, codes)
        .unwrap();
    down::<u32>(dev, codes, n * (books + 1))
}

#[test]
fn rvq_encode_finds_nearest_and_decode_sums() {
    // The expanded-distance path at the real shape (2048 entries, 32 tiles),
    // an odd shape (dq not a multiple of the 32-wide slice, a short last
    // tile, 37 steps over three row tiles) and the exact-distance path (≤ 25
    // entries); a masked step each time and a code out of range on decode.
    for (n, dq, bins, books) in [(4, 256, 2048, 3), (37, 40, 100, 4), (3, 32, 20, 2)] {
        let mut dev = device();
        let book = det(books * bins * dq, 9.0);
        let x = det(n * dq, 3.0);
        let mut steps = steps_all(n);
        steps[n - 1].active = 0;
        let mut got = encode(&mut *dev, &x, &book, &steps, (dq, bins, books));
        let want = host_codes(&x, &book, n, dq, bins, books);
        let stride = books + 1;
        for r in 0..n {
            assert_eq!(got[r * stride], 7777, "column 0 is not the quantizer's");
            if r == n - 1 {
                assert!(got[r * stride..(r + 1) * stride].iter().all(|&c| c == 7777));
                continue;
            }
            for c in 0..books {
                assert_eq!(
                    got[r * stride + 1 + c] as usize,
                    want[r * books + c],
                    "shape {:?} row {r} codebook {c}",
                    (n, dq, bins, books)
                );
            }
        }
        // Decode; step 0's last code is made out of range (fault[0] set, no contribution).
        got[books] = bins as u32;
        for r in 0..n {
            got[r * stride] = 0;
        }
        let codes = up(&mut *dev, &got);
        let (dbook, ds) = (up(&mut *dev, &book), up(&mut *dev, &steps));
        let q = zeros::<f32>(&mut *dev, n * dq);
        let fault = zeros::<i32>(&mut *dev, n);
        let s = RvqShape {
            n_books: books,
            dq,
            bins,
            codes_stride: stride,
            col0: 1,
        };
        RvqKernels::resolve(&*dev)
            .unwrap()
            .decode(&mut *dev, &s, n, codes, dbook, ds, q, fault)
            .unwrap();
        let q = down::<f32>(&mut *dev, q, n * dq);
        for r in 0..n - 1 {
            for d in 0..dq {
                let want: f32 = (0..books)
                    .filter(|&c| got[r * stride + 1 + c] < bins as u32)
                    .map(|c| book[(c * bins + got[r * stride + 1 + c] as usize) * dq + d])
                    .sum();
                assert!(
                    (q[r * dq + d] - want).abs() < 1e-5,
                    "decode row {r} dim {d}"
                );
            }
        }
        assert!(q[(n - 1) * dq..].iter().all(|&v| v == 0.0));
        let mut want_fault = vec![0; n];
        want_fault[0] = 1;
        assert_eq!(down::<i32>(&mut *dev, fault, n), want_fault);
    }
}

#[test]
fn rvq_codes_do_not_depend_on_the_batch() {
    // The same latents encoded alone, among 40 steps (three row tiles) at
    // another position, and after a masked step: identical codes, and the
    // first index wins a tie (entries 5 and 9 equal, the nearest to every x).
    let (dq, bins, books) = (48, 130, 3);
    let mut book = det(books * bins * dq, 2.0);
    let near: Vec<f32> = det(dq, 70.0).iter().map(|v| v * 0.01).collect();
    for b in [5, 9] {
        book[b * dq..(b + 1) * dq].copy_from_slice(&near);
    }
    let one = det(dq, 40.0);
    let mut x = det(40 * dq, 41.0);
    x[33 * dq..34 * dq].copy_from_slice(&one);
    let mut dev = device();
    let alone = encode(&mut *dev, &one, &book, &steps_all(1), (dq, bins, books));
    let mut steps = steps_all(40);
    steps[32].active = 0;
    let many = encode(&mut *dev, &x, &book, &steps, (dq, bins, books));
    let row = |v: &[u32], r: usize| v[r * (books + 1) + 1..(r + 1) * (books + 1)].to_vec();
    assert_eq!(row(&alone, 0), row(&many, 33));
    // The tie: a latent at the shared entry picks 5, not 9.
    let tie = encode(&mut *dev, &near, &book, &steps_all(1), (dq, bins, books));
    assert_eq!(tie[1], 5);
}
