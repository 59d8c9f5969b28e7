//! The translation of a row-major [`Gemm`] into the arguments of
//! `cublasGemmEx`, as a pure function, so that it is checked on machines
//! without a GPU: its test runs the arguments through a literal interpreter
//! of cuBLAS's documented column-major semantics and compares the result,
//! byte for byte over the whole memory, with the row-major definition.
//!
//! The mapping: row-major `C (m×n) = A (m×k) · Bᵀ`, read column-major, is
//! `Cᵀ (n×m) = B · Aᵀ`. Row-major B (n rows of k, `ldb` apart) is, column-
//! major, the k×n matrix Bᵀ with leading dimension `ldb`, so cuBLAS's first
//! operand is B with `op = T`; row-major A is, column-major, the k×m matrix
//! Aᵀ, cuBLAS's second operand with `op = N`; m and n swap; C keeps `ldc`.
//!
//! Invariants: only GEMMs that pass [`check_gemm`] (shared with the
//! emulator) are translated; every size fits a cuBLAS `int`; the result
//! meets cuBLAS's documented constraints (`lda ≥ max(1, rows of op(A)
//! stored)`, …), which the test's interpreter checks as cuBLAS does.

use crate::device::{check_gemm, DType, DevPtr, DeviceError, DeviceResult, Gemm};

/// `cublasOperation_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `CUBLAS_OP_N`.
    N,
    /// `CUBLAS_OP_T`.
    T,
}

/// The arguments of one `cublasGemmEx` call (compute type
/// `CUBLAS_COMPUTE_32F`, host f32 `alpha` and `beta`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmEx {
    /// `transa`.
    pub transa: Op,
    /// `transb`.
    pub transb: Op,
    /// Rows of op(A) and C.
    pub m: i32,
    /// Columns of op(B) and C.
    pub n: i32,
    /// Columns of op(A), rows of op(B).
    pub k: i32,
    /// `alpha`.
    pub alpha: f32,
    /// `A`.
    pub a: DevPtr,
    /// `Atype`.
    pub a_type: DType,
    /// `lda`.
    pub lda: i32,
    /// `B`.
    pub b: DevPtr,
    /// `Btype`.
    pub b_type: DType,
    /// `ldb`.
    pub ldb: i32,
    /// `beta`.
    pub beta: f32,
    /// `C`.
    pub c: DevPtr,
    /// `Ctype`.
    pub c_type: DType,
    /// `ldc`.
    pub ldc: i32,
}

/// The `cublasGemmEx` arguments that compute `g` (see the module doc).
pub fn gemm_ex(g: &Gemm) -> DeviceResult<GemmEx> {
    check_gemm(g)?;
    let int = |what: &'static str, v: usize| {
        i32::try_from(v)
            .map_err(|_| DeviceError::shape("gemm", format!("{what} = {v} exceeds a cuBLAS int")))
    };
    Ok(GemmEx {
        transa: Op::T,
        transb: Op::N,
        m: int("n", g.n)?,
        n: int("m", g.m)?,
        k: int("k", g.k)?,
        alpha: g.alpha,
        a: g.b,
        a_type: g.b_type,
        lda: int("ldb", g.ldb)?,
        b: g.a,
        b_type: g.a_type,
        ldb: int("lda", g.lda)?,
        beta: g.beta,
        c: g.c,
        c_type: g.c_type,
        ldc: int("ldc", g.ldc)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Device memory for the interpreters: one byte arena at a fake address.
    struct Mem {
        base: DevPtr,
        bytes: Vec<u8>,
    }

    impl Mem {
        fn at(&self, p: DevPtr, i: usize, t: DType) -> usize {
            (p - self.base) as usize + i * t.bytes()
        }

        fn get(&self, p: DevPtr, i: usize, t: DType) -> f64 {
            let o = self.at(p, i, t);
            match t {
                DType::F32 => f32::from_le_bytes(self.bytes[o..o + 4].try_into().unwrap()) as f64,
                DType::Bf16 => {
                    let h = u16::from_le_bytes([self.bytes[o], self.bytes[o + 1]]);
                    f32::from_bits((h as u32) << 16) as f64
                }
            }
        }

        fn set(&mut self, p: DevPtr, i: usize, t: DType, v: f64) {
            let o = self.at(p, i, t);
            let f = v as f32;
            match t {
                DType::F32 => self.bytes[o..o + 4].copy_from_slice(&f.to_le_bytes()),
                DType::Bf16 => {
                    // Round to nearest even (finite values only here).
                    let b = f.to_bits();
                    let h = ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16;
                    self.bytes[o..o + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
        }
    }

    /// `cublasGemmEx` as its documentation defines it, literally:
    /// column-major `C = alpha·op(A)·op(B) + beta·C` with `op(X)[i][p]` =
    /// `X[i + p·ld]` (N) or `X[p + i·ld]` (T), C not read when beta is 0;
    /// and its argument checks (`CUBLAS_STATUS_INVALID_VALUE`).
    fn cublas_gemm_ex(e: &GemmEx, mem: &mut Mem) -> Result<(), String> {
        let (m, n, k) = (e.m as usize, e.n as usize, e.k as usize);
        if e.m < 0 || e.n < 0 || e.k < 0 {
            return Err("negative size".into());
        }
        let rows_a = if e.transa == Op::N { e.m } else { e.k };
        let rows_b = if e.transb == Op::N { e.k } else { e.n };
        if e.lda < rows_a.max(1) || e.ldb < rows_b.max(1) || e.ldc < e.m.max(1) {
            return Err(format!("invalid leading dimension in {e:?}"));
        }
        let (lda, ldb, ldc) = (e.lda as usize, e.ldb as usize, e.ldc as usize);
        let op_a = |mem: &Mem, i: usize, p: usize| match e.transa {
            Op::N => mem.get(e.a, i + p * lda, e.a_type),
            Op::T => mem.get(e.a, p + i * lda, e.a_type),
        };
        let op_b = |mem: &Mem, p: usize, j: usize| match e.transb {
            Op::N => mem.get(e.b, p + j * ldb, e.b_type),
            Op::T => mem.get(e.b, j + p * ldb, e.b_type),
        };
        for j in 0..n {
            for i in 0..m {
                let mut s = 0.0f64;
                for p in 0..k {
                    s += op_a(mem, i, p) * op_b(mem, p, j);
                }
                let old = if e.beta == 0.0 {
                    0.0
                } else {
                    e.beta as f64 * mem.get(e.c, i + j * ldc, e.c_type)
                };
                mem.set(e.c, i + j * ldc, e.c_type, e.alpha as f64 * s + old);
            }
        }
        Ok(())
    }

    /// The row-major definition of [`Gemm`], computed in the same order.
    fn row_major(g: &Gemm, mem: &mut Mem) {
        for i in 0..g.m {
            for j in 0..g.n {
                let mut s = 0.0f64;
                for p in 0..g.k {
                    s += mem.get(g.a, i * g.lda + p, g.a_type)
                        * mem.get(g.b, j * g.ldb + p, g.b_type);
                }
                let old = if g.beta == 0.0 {
                    0.0
                } else {
                    g.beta as f64 * mem.get(g.c, i * g.ldc + j, g.c_type)
                };
                mem.set(g.c, i * g.ldc + j, g.c_type, g.alpha as f64 * s + old);
            }
        }
    }

    /// splitmix64.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn the_translation_computes_the_row_major_product_under_cublas_semantics() {
        let mut rng = Rng(7);
        let base: DevPtr = 0x7f00_0000_0000;
        for case in 0..400 {
            let (m, n, k) = (1 + rng.below(40), 1 + rng.below(40), 1 + rng.below(40));
            let pad = |rng: &mut Rng| if rng.below(2) == 0 { 0 } else { rng.below(9) };
            let (lda, ldb, ldc) = (k + pad(&mut rng), k + pad(&mut rng), n + pad(&mut rng));
            let t = if rng.below(2) == 0 {
                DType::F32
            } else {
                DType::Bf16
            };
            let c_type = if rng.below(2) == 0 { t } else { DType::F32 };
            // Operands one after another at random aligned gaps, in a random order.
            let sizes = [
                crate::device::operand_bytes(m, k, lda, t).unwrap(),
                crate::device::operand_bytes(n, k, ldb, t).unwrap(),
                crate::device::operand_bytes(m, n, ldc, c_type).unwrap(),
            ];
            let mut order = [0usize, 1, 2];
            for i in (1..3).rev() {
                order.swap(i, rng.below(i + 1));
            }
            let mut at = [0u64; 3];
            let mut off = 16 * rng.below(4) as u64;
            for &o in &order {
                at[o] = base + off;
                off = (off + sizes[o] as u64).next_multiple_of(4) + 4 * rng.below(8) as u64;
            }
            let total = off as usize + 64;
            let mut bytes = vec![0u8; total];
            // Small values exactly representable in bf16 and f32, so the
            // two sums are exact and the orders cannot differ.
            for chunk in bytes.chunks_exact_mut(2) {
                let v = (rng.below(15) as i32 - 7) as f32 * 0.25;
                let h = (v.to_bits() >> 16) as u16;
                chunk.copy_from_slice(&h.to_le_bytes());
            }
            let alpha = [1.0, 0.5, -2.0][rng.below(3)];
            let beta = [0.0, 1.0, 0.25][rng.below(3)];
            let g = Gemm {
                m,
                n,
                k,
                a: at[0],
                a_type: t,
                lda,
                b: at[1],
                b_type: t,
                ldb,
                c: at[2],
                c_type,
                ldc,
                alpha,
                beta,
            };
            let mut want = Mem { base, bytes };
            let mut got = Mem {
                base,
                bytes: want.bytes.clone(),
            };
            row_major(&g, &mut want);
            let e = gemm_ex(&g).unwrap();
            cublas_gemm_ex(&e, &mut got).unwrap_or_else(|why| panic!("case {case}: {why}"));
            assert!(
                got.bytes == want.bytes,
                "case {case}: {g:?} as {e:?} computes something else (or writes elsewhere)"
            );
        }
    }

    #[test]
    fn what_cublas_cannot_do_is_refused_before_translation() {
        let g = Gemm {
            m: 4,
            n: 8,
            k: 16,
            a: 0x10000,
            a_type: DType::Bf16,
            lda: 16,
            b: 0x20000,
            b_type: DType::Bf16,
            ldb: 16,
            c: 0x30000,
            c_type: DType::F32,
            ldc: 8,
            alpha: 1.0,
            beta: 0.0,
        };
        assert!(gemm_ex(&g).is_ok());
        let refused = [
            Gemm {
                b_type: DType::F32,
                ..g
            },
            Gemm {
                a_type: DType::F32,
                b_type: DType::F32,
                c_type: DType::Bf16,
                ..g
            },
            // C over the end of A, over B, and C = A.
            Gemm {
                c: 0x10000 + 4 * 16 * 2 - 4,
                ..g
            },
            Gemm {
                c: 0x20000 - 16,
                ..g
            },
            Gemm {
                c: g.a,
                c_type: DType::Bf16,
                ..g
            },
            Gemm { a: 0x10001, ..g },
            Gemm { ldc: 7, ..g },
            Gemm {
                k: usize::MAX / 2,
                lda: usize::MAX / 2,
                ldb: usize::MAX / 2,
                ..g
            },
            // Apart, but more rows than a cuBLAS int holds.
            Gemm {
                m: 1 << 31,
                a: 1 << 48,
                c: 2 << 48,
                ..g
            },
        ];
        for (i, r) in refused.iter().enumerate() {
            assert!(
                matches!(gemm_ex(r), Err(DeviceError::Shape { .. })),
                "case {i}: {r:?} was translated"
            );
        }
        // A and B may overlap (both are only read).
        assert!(gemm_ex(&Gemm {
            b: g.a,
            ldb: 16,
            ..g
        })
        .is_ok());
    }
}
