//! Launches and GEMMs described for people: what an error names when a
//! kernel or a GEMM fails (the CUDA device's debug-sync mode, the
//! emulator's faults), so that a failure says which kernel, on which grid
//! and block, with which arguments — pointers shown against the allocation
//! they point into.
//!
//! Invariant: only formatting; nothing here reads device memory.

use super::{Arg, DevPtr, Gemm, NULL};
use std::fmt::Write as _;

/// `ptr` as `0x… (+off of a N-byte allocation)`, `NULL`, or `0x… (in no
/// allocation)`; `alloc_of` gives the allocation (start, bytes) holding an
/// address, if any.
fn describe_ptr(p: DevPtr, alloc_of: &dyn Fn(DevPtr) -> Option<(DevPtr, usize)>) -> String {
    if p == NULL {
        return "NULL".into();
    }
    match alloc_of(p) {
        Some((base, bytes)) if p < base + bytes as u64 => {
            format!("{p:#x} (+{} of a {bytes}-byte allocation)", p - base)
        }
        Some((base, bytes)) => format!(
            "{p:#x} ({} bytes past the end of a {bytes}-byte allocation)",
            p - base - bytes as u64
        ),
        None => format!("{p:#x} (in no allocation)"),
    }
}

/// A launch's arguments, in order: pointers against their allocations,
/// scalars with their C type.
pub fn describe_args(args: &[Arg], alloc_of: &dyn Fn(DevPtr) -> Option<(DevPtr, usize)>) -> String {
    let mut s = String::from("(");
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = match *a {
            Arg::Ptr(p) => write!(s, "{}", describe_ptr(p, alloc_of)),
            Arg::I32(v) => write!(s, "int {v}"),
            Arg::U32(v) => write!(s, "unsigned {v}"),
            Arg::F32(v) => write!(s, "float {v:e}"),
            Arg::U64(v) => write!(s, "u64 {v}"),
        };
    }
    s.push(')');
    s
}

/// A GEMM's shape, operands, strides and scales.
pub fn describe_gemm(g: &Gemm, alloc_of: &dyn Fn(DevPtr) -> Option<(DevPtr, usize)>) -> String {
    format!(
        "gemm C[{m}×{n}] = {alpha:e}·A[{m}×{k}]·B[{n}×{k}]ᵀ + {beta:e}·C; A {at:?} at {a} lda {lda}; \
         B {bt:?} at {b} ldb {ldb}; C {ct:?} at {c} ldc {ldc}",
        m = g.m,
        n = g.n,
        k = g.k,
        alpha = g.alpha,
        beta = g.beta,
        at = g.a_type,
        a = describe_ptr(g.a, alloc_of),
        lda = g.lda,
        bt = g.b_type,
        b = describe_ptr(g.b, alloc_of),
        ldb = g.ldb,
        ct = g.c_type,
        c = describe_ptr(g.c, alloc_of),
        ldc = g.ldc,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_are_named_against_their_allocations() {
        let alloc_of = |p: DevPtr| (0x1000..0x2000).contains(&p).then_some((0x1000, 0x800));
        let s = describe_args(
            &[
                Arg::Ptr(0x1100),
                Arg::Ptr(0x1900),
                Arg::Ptr(NULL),
                Arg::Ptr(0x9000),
                Arg::I32(-3),
                Arg::U32(7),
                Arg::F32(0.5),
                Arg::U64(1 << 40),
            ],
            &alloc_of,
        );
        assert_eq!(
            s,
            "(0x1100 (+256 of a 2048-byte allocation), 0x1900 (256 bytes past the end of a \
             2048-byte allocation), NULL, 0x9000 (in no allocation), int -3, unsigned 7, \
             float 5e-1, u64 1099511627776)"
        );
    }
}
