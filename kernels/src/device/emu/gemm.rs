//! The emulator's GEMM, computed on the CPU: operands widened to f32 (bf16
//! exactly), f32 dot products with eight running sums, and a bf16 C rounded
//! to nearest even as `__float2bfloat16_rn` does.
//!
//! Invariants: only validated GEMMs (operands checked to lie inside live
//! allocations, aligned, C overlapping neither A nor B, as cuBLAS requires)
//! reach [`gemm`]; memory is read and written through raw pointers only; C
//! is never read when beta is 0;
//! the scratch buffer is grown on first use and then reused (a steady-state
//! step allocates nothing).

use crate::device::{DType, DevPtr, Gemm};

fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Round to nearest even, NaN to 0x7fff (as `__float2bfloat16_rn`).
fn f32_to_bf16(f: f32) -> u16 {
    let x = f.to_bits();
    if x & 0x7fff_ffff > 0x7f80_0000 {
        return 0x7fff;
    }
    let hi = x >> 16;
    let rem = x & 0xffff;
    let up = rem > 0x8000 || (rem == 0x8000 && hi & 1 == 1);
    (hi + up as u32) as u16
}

/// Rows `r0..r0 + rows` of a `cols`-wide operand with row stride `ld`, as f32.
///
/// # Safety
/// The rows must lie inside a live allocation, aligned for `t`.
unsafe fn widen(
    p: DevPtr,
    t: DType,
    r0: usize,
    rows: usize,
    ld: usize,
    cols: usize,
    out: &mut [f32],
) {
    for r in 0..rows {
        let row = &mut out[r * cols..(r + 1) * cols];
        let start = (r0 + r) * ld;
        match t {
            DType::F32 => {
                let src = (p as *const f32).add(start);
                for (c, o) in row.iter_mut().enumerate() {
                    *o = src.add(c).read();
                }
            }
            DType::Bf16 => {
                let src = (p as *const u16).add(start);
                for (c, o) in row.iter_mut().enumerate() {
                    *o = bf16_to_f32(src.add(c).read());
                }
            }
        }
    }
}

/// f32 dot product, eight running sums (vectorisable).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// A validated GEMM (see [`Gemm`]): B is widened 64 rows at a time, so both
/// operands of the inner product over k are contiguous.
pub(super) fn gemm(g: &Gemm, scratch: &mut Vec<f32>) {
    const NB: usize = 64;
    let need = (g.m + NB) * g.k;
    if scratch.len() < need {
        scratch.resize(need, 0.0);
    }
    let (a, b) = scratch.split_at_mut(g.m * g.k);
    let b = &mut b[..NB * g.k];
    // SAFETY: the operands were checked to lie inside live allocations,
    // aligned (`check_operand`), C apart from A and B (`check_gemm`); they
    // are read and written through raw pointers only.
    unsafe { widen(g.a, g.a_type, 0, g.m, g.lda, g.k, a) };
    for n0 in (0..g.n).step_by(NB) {
        let nb = NB.min(g.n - n0);
        // SAFETY: as above.
        unsafe { widen(g.b, g.b_type, n0, nb, g.ldb, g.k, b) };
        for i in 0..g.m {
            let ar = &a[i * g.k..(i + 1) * g.k];
            for j in 0..nb {
                let acc = dot(ar, &b[j * g.k..(j + 1) * g.k]);
                let idx = i * g.ldc + n0 + j;
                // SAFETY: C was checked like A and B; element idx lies in it.
                unsafe {
                    match g.c_type {
                        DType::F32 => {
                            let p = (g.c as *mut f32).add(idx);
                            let old = if g.beta != 0.0 {
                                g.beta * p.read()
                            } else {
                                0.0
                            };
                            p.write(g.alpha * acc + old);
                        }
                        DType::Bf16 => {
                            let p = (g.c as *mut u16).add(idx);
                            let old = if g.beta != 0.0 {
                                g.beta * bf16_to_f32(p.read())
                            } else {
                                0.0
                            };
                            p.write(f32_to_bf16(g.alpha * acc + old));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        // 1 + 3·2^-8 is halfway between two bf16: ties to the even one above.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(f32::NAN), 0x7fff);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        assert_eq!(bf16_to_f32(0xbf80), -1.0);
    }
}
