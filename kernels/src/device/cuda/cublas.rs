//! cuBLAS: the handle (created at `open`, bound to the device's stream, with
//! its own workspace and math mode) and the mapping of a row-major [`Gemm`]
//! onto `cublasGemmEx` (see the GEMM numerics in the module doc of
//! [`super`]).
//!
//! Invariants: the workspace is set with `cublasSetWorkspace_v2` *after*
//! `cublasSetStream_v2` (which would reset it), so cuBLAS never allocates
//! and a GEMM is capturable; a GEMM reaches cuBLAS only after the checks
//! both devices share (`check_gemm`: A and B of one type, C of theirs or
//! f32, every operand aligned, C overlapping neither A nor B), with every
//! operand inside one allocation of this device, and through the pure
//! translation of `cublas_args.rs`.

use super::calls::{call, guarded};
use super::cublas_args::{gemm_ex, Op};
use super::memory::ALLOC_ALIGN;
use super::symbols::{missing_symbols, CUBLAS_SYMBOLS};
use super::CudaDevice;
use crate::device::{operand_bytes, DType, DeviceError, DeviceResult, Gemm};
use cudarc::cublas::sys as blas;
use std::ffi::c_void;

impl CudaDevice {
    pub(super) fn init_cublas(&mut self, workspace_bytes: usize) -> DeviceResult<()> {
        // SAFETY: as for libcuda in `open`.
        let present = guarded("dlopen libcublas", || unsafe { blas::is_culib_present() })?;
        if !present {
            return Err(DeviceError::Call {
                call: "dlopen libcublas",
                why: format!(
                    "cuBLAS is not installed or not on the library path (tried {:?}); install the CUDA \
                     toolkit's libcublas or the `nvidia-cublas-cu12` wheel and add its lib folder to \
                     LD_LIBRARY_PATH",
                    cudarc::get_lib_name_candidates("cublas")
                ),
            });
        }
        // SAFETY: present (checked above), so `culib` loads it.
        let missing = guarded("dlopen libcublas", || {
            missing_symbols!(unsafe { blas::culib() }, CUBLAS_SYMBOLS)
        })?;
        if !missing.is_empty() {
            return Err(DeviceError::Call {
                call: "libcublas",
                why: format!("cuBLAS lacks {missing:?}: it is older than CUDA 11"),
            });
        }
        self.bind()?;
        self.blas = call("cublasCreate_v2", cudarc::cublas::result::create_handle)?;
        let stream = self.stream.cu_stream() as blas::cudaStream_t;
        // SAFETY: the handle was just created; the stream is ours and lives
        // as long as the handle (both released in `drop`, the handle first).
        call("cublasSetStream_v2", || unsafe {
            cudarc::cublas::result::set_stream(self.blas, stream)
        })?;
        let bytes = workspace_bytes
            .max(ALLOC_ALIGN)
            .next_multiple_of(ALLOC_ALIGN);
        // SAFETY: a plain allocation; freed in `drop` after the handle is destroyed.
        self.workspace = call("cuMemAlloc (cuBLAS workspace)", || unsafe {
            cudarc::driver::result::malloc_sync(bytes)
        })?;
        // SAFETY: the workspace is a live device allocation of `bytes`, 256-byte
        // aligned, used by this handle only (one stream, so never concurrently).
        // Set after `cublasSetStream_v2`, which resets the workspace.
        call("cublasSetWorkspace_v2", || unsafe {
            blas::cublasSetWorkspace_v2(self.blas, self.workspace as usize as *mut c_void, bytes)
                .result()
        })?;
        // SAFETY: a valid handle and a mode of the enum.
        call("cublasSetMathMode", || unsafe {
            blas::cublasSetMathMode(
                self.blas,
                blas::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
            )
            .result()
        })?;
        Ok(())
    }

    pub(super) fn gemm_inner(&self, g: &Gemm) -> DeviceResult<()> {
        // The shared checks (shape, types, alignment, no C over A or B) and
        // the translation into cuBLAS's column-major arguments (a pure
        // function, checked on the CPU: cublas_args.rs).
        let e = gemm_ex(g)?;
        for (what, ptr, rows, cols, ld, t) in [
            ("gemm A", g.a, g.m, g.k, g.lda, g.a_type),
            ("gemm B", g.b, g.n, g.k, g.ldb, g.b_type),
            ("gemm C", g.c, g.m, g.n, g.ldc, g.c_type),
        ] {
            let bytes = operand_bytes(rows, cols, ld, t)
                .ok_or_else(|| DeviceError::shape(what, "operand size overflows"))?;
            self.check_range(what, ptr, bytes)?;
        }
        let ty = |t: DType| match t {
            DType::F32 => blas::cudaDataType::CUDA_R_32F,
            DType::Bf16 => blas::cudaDataType::CUDA_R_16BF,
        };
        let op = |o: Op| match o {
            Op::N => blas::cublasOperation_t::CUBLAS_OP_N,
            Op::T => blas::cublasOperation_t::CUBLAS_OP_T,
        };
        let (alpha, beta) = (e.alpha, e.beta);
        self.bind()?;
        let handle = self.blas;
        // SAFETY: the handle is live and bound to our stream; A, B and C lie
        // inside allocations of this device (checked above) with the strides
        // given, C overlapping neither A nor B (`check_gemm`); alpha and beta
        // are f32 host scalars as the f32 compute type and the default (host)
        // pointer mode require, read during the call.
        call("cublasGemmEx", || unsafe {
            cudarc::cublas::result::gemm_ex(
                handle,
                op(e.transa),
                op(e.transb),
                e.m,
                e.n,
                e.k,
                &alpha as *const f32 as *const c_void,
                e.a as usize as *const c_void,
                ty(e.a_type),
                e.lda,
                e.b as usize as *const c_void,
                ty(e.b_type),
                e.ldb,
                &beta as *const f32 as *const c_void,
                e.c as usize as *mut c_void,
                ty(e.c_type),
                e.ldc,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
        })
    }
}

/// GPU tests: run by `scripts/gpu-check` (`--include-ignored`).
#[cfg(test)]
mod tests {
    use super::super::gpu_test::{bytes_of, det, floats, open};
    use crate::device::{DType, Device, DeviceError, Gemm};

    /// f32 → bf16 bits, round to nearest even (finite inputs).
    fn bf16(x: f32) -> u16 {
        let b = x.to_bits();
        ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
    }

    fn from_bf16(h: u16) -> f32 {
        f32::from_bits((h as u32) << 16)
    }

    /// Row-major `rows × cols` with stride `ld`, padding filled with junk.
    fn strided(rows: usize, cols: usize, ld: usize, seed: f32) -> Vec<f32> {
        let v = det(rows * cols, seed);
        let mut out = vec![1e30; (rows - 1) * ld + cols];
        for r in 0..rows {
            out[r * ld..r * ld + cols].copy_from_slice(&v[r * cols..(r + 1) * cols]);
        }
        out
    }

    /// Host reference `alpha · A · Bᵀ + beta · C` in f64, with the
    /// magnitude `Σ|a·b|` of each entry for the tolerance.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        (m, n, k): (usize, usize, usize),
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &[f32],
        ldc: usize,
        alpha: f32,
        beta: f32,
    ) -> Vec<(f64, f64)> {
        let mut out = Vec::new();
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut mag) = (0.0f64, 0.0f64);
                for p in 0..k {
                    let t = a[i * lda + p] as f64 * b[j * ldb + p] as f64;
                    s += t;
                    mag += t.abs();
                }
                let old = c[i * ldc + j] as f64;
                out.push((
                    alpha as f64 * s + beta as f64 * old,
                    alpha.abs() as f64 * mag + (beta as f64 * old).abs(),
                ));
            }
        }
        out
    }

    #[test]
    #[ignore = "needs a GPU (scripts/gpu-check)"]
    fn gemm_f32_matches_the_host_product() {
        let mut d = open();
        let (m, n, k, lda, ldb, ldc) = (5, 37, 70, 72, 75, 40);
        let a = strided(m, k, lda, 1.0);
        let b = strided(n, k, ldb, 2.0);
        let c = strided(m, n, ldc, 3.0);
        let (alpha, beta) = (0.75, 0.5);
        let want = reference((m, n, k), &a, lda, &b, ldb, &c, ldc, alpha, beta);
        let [da, db, dc] = [&a, &b, &c].map(|v| {
            let p = d.alloc(v.len() * 4).unwrap();
            d.upload(p, &bytes_of(v)).unwrap();
            p
        });
        d.gemm(&Gemm {
            m,
            n,
            k,
            a: da,
            a_type: DType::F32,
            lda,
            b: db,
            b_type: DType::F32,
            ldb,
            c: dc,
            c_type: DType::F32,
            ldc,
            alpha,
            beta,
        })
        .unwrap();
        let mut out = vec![0u8; c.len() * 4];
        d.download(dc, &mut out).unwrap();
        let got = floats(&out);
        for i in 0..m {
            for j in 0..n {
                let (w, mag) = want[i * n + j];
                let g = got[i * ldc + j] as f64;
                // f32 accumulation over k terms: within k·2⁻²⁴·Σ|a·b| ≈ 4e-6·Σ|a·b|.
                assert!(
                    (g - w).abs() <= 2e-5 * mag.max(1.0),
                    "C[{i}][{j}] {g} vs {w}"
                );
            }
            // The padding between rows is left alone.
            if i + 1 < m {
                assert!(got[i * ldc + n..(i + 1) * ldc].iter().all(|&x| x == 1e30));
            }
        }
    }

    #[test]
    #[ignore = "needs a GPU (scripts/gpu-check)"]
    fn gemm_bf16_matches_the_host_product() {
        let mut d = open();
        let (m, n, k) = (8, 384, 512);
        let round = |v: Vec<f32>| {
            v.into_iter()
                .map(|x| from_bf16(bf16(x)))
                .collect::<Vec<_>>()
        };
        let a = round(det(m * k, 4.0));
        let b = round(det(n * k, 5.0));
        let to_bits =
            |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|&x| bf16(x).to_ne_bytes()).collect() };
        let da = d.alloc(a.len() * 2).unwrap();
        let db = d.alloc(b.len() * 2).unwrap();
        d.upload(da, &to_bits(&a)).unwrap();
        d.upload(db, &to_bits(&b)).unwrap();
        let zeros = vec![0.0; m * n];
        let want = reference((m, n, k), &a, k, &b, k, &zeros, n, 1.0, 0.0);
        for c_type in [DType::F32, DType::Bf16] {
            let dc = d.alloc(m * n * c_type.bytes()).unwrap();
            let g = Gemm {
                m,
                n,
                k,
                a: da,
                a_type: DType::Bf16,
                lda: k,
                b: db,
                b_type: DType::Bf16,
                ldb: k,
                c: dc,
                c_type,
                ldc: n,
                alpha: 1.0,
                beta: 0.0,
            };
            d.gemm(&g).unwrap();
            let mut out = vec![0u8; m * n * c_type.bytes()];
            d.download(dc, &mut out).unwrap();
            let got: Vec<f32> = match c_type {
                DType::F32 => floats(&out),
                DType::Bf16 => out
                    .chunks_exact(2)
                    .map(|c| from_bf16(u16::from_ne_bytes([c[0], c[1]])))
                    .collect(),
            };
            // f32 accumulation of exact bf16 products (within
            // k·2⁻²⁴·Σ|a·b| ≈ 3e-5·Σ|a·b| for k = 512); a bf16 result adds
            // its own rounding (half an ulp: 2⁻⁹ relative).
            for (i, (&g, &(w, mag))) in got.iter().zip(&want).enumerate() {
                let tol = match c_type {
                    DType::F32 => 1e-4 * mag.max(1.0),
                    DType::Bf16 => 1e-4 * mag.max(1.0) + w.abs() / 256.0,
                };
                assert!((g as f64 - w).abs() <= tol, "{c_type:?} C[{i}] {g} vs {w}");
            }
        }
        // Mixed operand types are refused before cuBLAS sees them.
        let c = d.alloc(m * n * 4).unwrap();
        let mixed = Gemm {
            m,
            n,
            k,
            a: da,
            a_type: DType::Bf16,
            lda: k,
            b: db,
            b_type: DType::F32,
            ldb: k,
            c,
            c_type: DType::F32,
            ldc: n,
            alpha: 1.0,
            beta: 0.0,
        };
        assert!(matches!(d.gemm(&mixed), Err(DeviceError::Shape { .. })));
    }
}
