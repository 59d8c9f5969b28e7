//! The device GEMM in every dtype combination against a host GEMM.

use super::*;

fn put_matrix(dev: &mut dyn Device, v: &[f32], t: DType) -> (DevPtr, Vec<f32>) {
    match t {
        DType::F32 => (up(dev, v), v.to_vec()),
        DType::Bf16 => {
            let b: Vec<u16> = v.iter().map(|&x| bf16(x)).collect();
            let seen = b.iter().map(|&x| from_bf16(x)).collect();
            (up(dev, &b), seen)
        }
    }
}

#[test]
fn gemm_in_every_dtype_combination_cublas_computes() {
    let (m, n, kk) = (5, 70, 37);
    let (lda, ldb, ldc) = (kk + 3, kk + 1, n + 2);
    let types = [DType::F32, DType::Bf16];
    for at in types {
        for bt in types {
            for ct in types {
                let mut dev = device();
                let (da, a) = put_matrix(&mut dev, &det(m * lda, 1.0), at);
                let (db, b) = put_matrix(&mut dev, &det(n * ldb, 2.0), bt);
                let c0 = det(m * ldc, 3.0);
                let (dc, c_seen) = put_matrix(&mut dev, &c0, ct);
                let (alpha, beta) = (0.75, 0.5);
                // What cublasGemmEx computes with an f32 compute type: A and
                // B of one type, C of theirs or f32; the rest is refused.
                let computed = at == bt && (ct == at || ct == DType::F32);
                let g = Gemm {
                    m,
                    n,
                    k: kk,
                    a: da,
                    a_type: at,
                    lda,
                    b: db,
                    b_type: bt,
                    ldb,
                    c: dc,
                    c_type: ct,
                    ldc,
                    alpha,
                    beta,
                };
                if !computed {
                    assert!(
                        matches!(dev.gemm(&g), Err(DeviceError::Shape { .. })),
                        "{at:?}·{bt:?}→{ct:?} is refused"
                    );
                    continue;
                }
                dev.gemm(&g).unwrap();
                let got: Vec<f32> = match ct {
                    DType::F32 => down::<f32>(&mut dev, dc, m * ldc),
                    DType::Bf16 => down::<u16>(&mut dev, dc, m * ldc)
                        .into_iter()
                        .map(from_bf16)
                        .collect(),
                };
                for i in 0..m {
                    for j in 0..ldc {
                        let idx = i * ldc + j;
                        if j >= n {
                            assert_eq!(got[idx], c_seen[idx], "padding of C is left alone");
                            continue;
                        }
                        let dot: f64 = (0..kk)
                            .map(|p| a[i * lda + p] as f64 * b[j * ldb + p] as f64)
                            .sum();
                        let want = (alpha as f64 * dot + beta as f64 * c_seen[idx] as f64) as f32;
                        let tol = match ct {
                            DType::F32 => 1e-5,
                            DType::Bf16 => 1.0 / 128.0,
                        };
                        assert!(
                            (got[idx] - want).abs() <= tol * want.abs().max(1.0),
                            "{at:?}·{bt:?}→{ct:?} [{i}][{j}]: {} vs {want}",
                            got[idx]
                        );
                    }
                }
            }
        }
    }
    // beta = 0: C is not read (NaN in C does not leak).
    let mut dev = device();
    let da = up(&mut dev, &[1.0f32, 2.0]);
    let db = up(&mut dev, &[3.0f32, 4.0]);
    let dc = up(&mut dev, &[f32::NAN]);
    let g = Gemm {
        m: 1,
        n: 1,
        k: 2,
        a: da,
        a_type: DType::F32,
        lda: 2,
        b: db,
        b_type: DType::F32,
        ldb: 2,
        c: dc,
        c_type: DType::F32,
        ldc: 1,
        alpha: 1.0,
        beta: 0.0,
    };
    dev.gemm(&g).unwrap();
    assert_eq!(down::<f32>(&mut dev, dc, 1), vec![11.0]);
    // An operand that does not fit its allocation is refused.
    let bad = Gemm {
        k: 3,
        lda: 3,
        ldb: 3,
        ..g
    };
    assert!(matches!(dev.gemm(&bad), Err(DeviceError::Shape { .. })));
}

#[test]
fn c_overlapping_a_or_b_is_refused() {
    // Undefined in cuBLAS, so refused by the checks both devices share;
    // A and B may share memory.
    let mut dev = device();
    let buf = up(&mut dev, &det(64, 1.0));
    let g = Gemm {
        m: 2,
        n: 2,
        k: 4,
        a: buf,
        a_type: DType::F32,
        lda: 4,
        b: buf + 32,
        b_type: DType::F32,
        ldb: 4,
        c: buf + 64,
        c_type: DType::F32,
        ldc: 2,
        alpha: 1.0,
        beta: 0.0,
    };
    dev.gemm(&g).unwrap();
    for c in [buf, buf + 16, buf + 32 + 28] {
        assert!(
            matches!(dev.gemm(&Gemm { c, ..g }), Err(DeviceError::Shape { .. })),
            "C at +{}",
            c - buf
        );
    }
    dev.gemm(&Gemm { b: buf, ..g }).unwrap();
}
