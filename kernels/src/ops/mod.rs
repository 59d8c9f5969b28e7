//! Typed launches of the `.cu` kernels over any [`Device`](crate::device::Device).
//!
//! One file per kernel source. Each `*Kernels` struct resolves its kernels'
//! ids once ([`Device::kernel`](crate::device::Device::kernel)); each method
//! checks what it can (widths, head sizes, non-null operands), then issues one
//! launch whose grid and block are exactly the geometry the kernel's comment
//! in its `.cu` file documents, with the arguments in the kernel's order. No
//! method allocates: the argument list is an array on the stack.
//!
//! Invariant: the block-size constants here equal the sources' `#define`s (a
//! test reads them).

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod embed;
pub mod gemv;
pub mod norm;
pub mod rvq;
pub mod sampling;
pub mod short_attn;
pub mod text_rules;
pub mod types;

use crate::device::{DeviceError, DeviceResult};

/// `EW_THREADS` of elementwise.cu.
pub const EW_THREADS: u32 = 256;
/// Grid cap of the grid-stride element-wise kernels.
pub const EW_MAX_BLOCKS: u32 = 8192;

/// The grid of a grid-stride kernel over `n` elements.
pub fn ew_grid(n: usize) -> (u32, u32, u32) {
    let blocks = n
        .div_ceil(EW_THREADS as usize)
        .clamp(1, EW_MAX_BLOCKS as usize);
    (blocks as u32, 1, 1)
}

/// `n` as a kernel `int`.
pub fn int(what: &'static str, n: usize) -> DeviceResult<i32> {
    i32::try_from(n).map_err(|_| DeviceError::Shape {
        what,
        why: format!("{n} does not fit a kernel int"),
    })
}

/// `n` as a grid dimension.
pub fn dim(what: &'static str, n: usize) -> DeviceResult<u32> {
    if n == 0 {
        return Err(DeviceError::Shape {
            what,
            why: "empty grid".into(),
        });
    }
    u32::try_from(n).map_err(|_| DeviceError::Shape {
        what,
        why: format!("grid dimension {n} is too large"),
    })
}

#[cfg(test)]
mod tests {
    /// The `#define NAME value` of a kernel source.
    pub(crate) fn define(source: &str, name: &str) -> u64 {
        source
            .lines()
            .find_map(|l| {
                let mut it = l.split_whitespace();
                (it.next() == Some("#define") && it.next() == Some(name))
                    .then(|| it.next().and_then(|v| v.parse().ok()))
                    .flatten()
            })
            .unwrap_or_else(|| panic!("#define {name} not found"))
    }

    #[test]
    fn block_sizes_match_the_sources() {
        let ew = include_str!("../../cuda/elementwise.cu");
        let norm = include_str!("../../cuda/norm.cu");
        let att = include_str!("../../cuda/attention.cu");
        let emb = include_str!("../../cuda/embed.cu");
        let smp = include_str!("../../cuda/sampling.cu");
        assert_eq!(define(ew, "EW_THREADS"), super::EW_THREADS as u64);
        assert_eq!(define(emb, "TOK_THREADS"), super::embed::TOK_THREADS as u64);
        assert_eq!(define(emb, "EMB_THREADS"), super::embed::EMB_THREADS as u64);
        assert_eq!(
            define(smp, "SAMPLE_THREADS"),
            super::sampling::SAMPLE_THREADS as u64
        );
        assert_eq!(
            define(norm, "NORM_THREADS"),
            super::norm::NORM_THREADS as u64
        );
        assert_eq!(
            define(att, "ROPE_THREADS"),
            super::attention::ROPE_THREADS as u64
        );
        assert_eq!(
            define(att, "ATT_THREADS"),
            super::attention::ATT_THREADS as u64
        );
        assert_eq!(
            define(att, "ATT_MAX_HEAD_DIM"),
            super::attention::ATT_MAX_HEAD_DIM as u64
        );
        assert_eq!(define(att, "ATT_VEC"), super::attention::ATT_VEC as u64);
        assert_eq!(
            define(att, "ATT_HEADS_PER_BLOCK"),
            super::attention::ATT_HEADS_PER_BLOCK as u64
        );
        assert_eq!(
            define(att, "ATT_MAX_SPLITS"),
            super::attention::ATT_MAX_SPLITS as u64
        );
        let conv = include_str!("../../cuda/conv.cu");
        let rvq = include_str!("../../cuda/quantizer.cu");
        assert_eq!(
            define(conv, "CONV_THREADS"),
            super::conv::CONV_THREADS as u64
        );
        assert_eq!(define(conv, "CONV_TT"), super::conv::CONV_TT as u64);
        assert_eq!(define(rvq, "RVQ_THREADS"), super::rvq::RVQ_THREADS as u64);
        assert_eq!(
            define(rvq, "RVQ_DEC_THREADS"),
            super::rvq::RVQ_DEC_THREADS as u64
        );
        assert_eq!(define(rvq, "RVQ_MAX_DIM"), super::rvq::RVQ_MAX_DIM as u64);
        assert_eq!(define(rvq, "RVQ_ROWS"), super::rvq::RVQ_ROWS as u64);
        assert_eq!(define(rvq, "RVQ_TILE"), super::rvq::RVQ_TILE as u64);
        for (name, v) in [
            ("CG_THREADS", super::conv::CG_THREADS as u64),
            ("CG_BM", super::conv::CG_BM as u64),
            ("CG_BM_TALL", super::conv::CG_BM_TALL as u64),
            ("CG_BN", super::conv::CG_BN as u64),
            ("CG_BK", super::conv::CG_BK as u64),
            ("CG_RED_THREADS", super::conv::CG_RED_THREADS as u64),
        ] {
            assert_eq!(define(conv, name), v, "{name}");
        }
        let gemv = include_str!("../../cuda/gemv.cu");
        assert_eq!(define(gemv, "GV_THREADS"), super::gemv::GV_THREADS as u64);
        assert_eq!(define(gemv, "GV_COLS"), super::gemv::GV_COLS as u64);
        assert_eq!(define(gemv, "GV_MAX_ROWS"), super::gemv::GV_MAX_ROWS as u64);
        let sa = include_str!("../../cuda/short_attn.cu");
        assert_eq!(
            define(sa, "SA_THREADS"),
            super::short_attn::SA_THREADS as u64
        );
        assert_eq!(
            define(sa, "SA_MAX_KEYS"),
            super::short_attn::SA_MAX_KEYS as u64
        );
        assert_eq!(
            define(sa, "SA_MAX_HEAD_DIM"),
            super::short_attn::SA_MAX_HEAD_DIM as u64
        );
    }
}
