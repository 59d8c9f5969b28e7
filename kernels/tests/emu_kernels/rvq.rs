//! RVQ encode (nearest codeword, both distance paths) and decode (sums).

use super::*;

pub(crate) fn transpose_books(
    book: &[f32],
    books: usize,
    bins: usize,
    dq: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut books_t = vec![0.0; books * dq * bins];
    let mut norms = vec![0.0; books * bins];
    for c in 0..books {
        for b in 0..bins {
            let e = &book[(c * bins + b) * dq..(c * bins + b + 1) * dq];
            norms[c * bins + b] = e.iter().map(|v| v * v).sum();
            for d in 0..dq {
                books_t[(c * dq + d) * bins + b] = e[d];
            }
        }
    }
    (books_t, norms)
}

#[test]
fn rvq_encode_finds_nearest_and_decode_sums() {
    // Both distance paths: the expanded form and the exact-distance path (≤ 25
    // entries), a masked step and a code out of range.
    for (n, dq, bins, books) in [(4, 256, 2048, 3), (3, 32, 20, 2)] {
        let mut dev = device();
        let book = det(books * bins * dq, 9.0);
        let (books_t, norms) = transpose_books(&book, books, bins, dq);
        let x = det(n * dq, 3.0);
        let mut steps = steps_all(n);
        steps[n - 1].active = 0;
        let dx = up(&mut dev, &x);
        let dbt = up(&mut dev, &books_t);
        let dn = up(&mut dev, &norms);
        let ds = up(&mut dev, &steps);
        let stride = books + 1;
        let codes = up(&mut dev, &vec![7777u32; n * stride]);
        dev.launch(
            k(&dev, "rvq_encode"),
            (n as u32, 1, 1),
            RVQ_THREADS,
            &[
                Arg::Ptr(dx),
                Arg::Ptr(dbt),
                Arg::Ptr(dn),
                Arg::Ptr(ds),
                Arg::I32(books as i32),
                Arg::I32(dq as i32),
                Arg::I32(bins as i32),
                Arg::I32((bins > 25) as i32),
                Arg::Ptr(codes),
                Arg::I32(stride as i32),
                Arg::I32(1),
            ],
        )
        .unwrap();
        let mut got = down::<u32>(&mut dev, codes, n * stride);
        for r in 0..n {
            assert_eq!(got[r * stride], 7777, "column 0 is not the quantizer's");
            if r == n - 1 {
                assert!(got[r * stride..(r + 1) * stride].iter().all(|&c| c == 7777));
                continue;
            }
            let mut res = x[r * dq..(r + 1) * dq].to_vec();
            for c in 0..books {
                let dist = |b: usize| -> f32 {
                    (0..dq)
                        .map(|d| (res[d] - book[(c * bins + b) * dq + d]).powi(2))
                        .sum()
                };
                let best = (0..bins)
                    .min_by(|&a, &b| dist(a).total_cmp(&dist(b)))
                    .unwrap();
                assert_eq!(
                    got[r * stride + 1 + c] as usize,
                    best,
                    "row {r} codebook {c}"
                );
                for d in 0..dq {
                    res[d] -= book[(c * bins + best) * dq + d];
                }
            }
        }
        // Decode; step 0's last code is made out of range (fault[0] set, no contribution).
        got[books] = bins as u32;
        for r in 0..n {
            got[r * stride] = 0;
        }
        write(&mut dev, codes, &got);
        let q = zeros::<f32>(&mut dev, n * dq);
        let fault = zeros::<i32>(&mut dev, n);
        dev.launch(
            k(&dev, "rvq_decode"),
            (dq.div_ceil(RVQ_DEC_THREADS as usize) as u32, n as u32, 1),
            RVQ_DEC_THREADS,
            &[
                Arg::Ptr(codes),
                Arg::I32(stride as i32),
                Arg::I32(1),
                Arg::Ptr(dbt),
                Arg::Ptr(ds),
                Arg::I32(books as i32),
                Arg::I32(dq as i32),
                Arg::I32(bins as i32),
                Arg::Ptr(q),
                Arg::Ptr(fault),
            ],
        )
        .unwrap();
        let q = down::<f32>(&mut dev, q, n * dq);
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
        assert_eq!(down::<i32>(&mut dev, fault, n), want_fault);
    }
}
