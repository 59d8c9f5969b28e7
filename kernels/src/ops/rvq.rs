//! The codebook parts of Mimi's split RVQ (quantizer.cu): nearest-entry
//! search with residual updates (encode) and codebook sums (decode). The
//! 1×1 projections around them are GEMMs.
//!
//! Device codebook layout (quantizer.cu's header): `books_t[c][dq][bins]`
//! and `norms[c][bins] = ‖e‖²`.

use super::{dim, int};
use crate::device::{Arg, DevPtr, Device, DeviceError, DeviceResult, KernelId, NULL};

/// `RVQ_THREADS` of quantizer.cu.
pub const RVQ_THREADS: u32 = 256;
/// `RVQ_DEC_THREADS` of quantizer.cu.
pub const RVQ_DEC_THREADS: u32 = 128;
/// `RVQ_MAX_DIM` of quantizer.cu.
pub const RVQ_MAX_DIM: usize = 512;
/// torch.cdist takes its matrix-product path above this many entries (and
/// so does the reference); the kernel follows with `use_mm`.
pub const CDIST_MM_THRESHOLD: usize = 25;

/// Shape of one group of codebooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RvqShape {
    /// Codebooks in the group.
    pub n_books: usize,
    /// Codebook vector width.
    pub dq: usize,
    /// Entries per codebook.
    pub bins: usize,
    /// Row stride of the codes array (u32 elements).
    pub codes_stride: usize,
    /// Column of the group's first codebook in a codes row.
    pub col0: usize,
}

impl RvqShape {
    fn check(&self, what: &'static str) -> DeviceResult<()> {
        if self.n_books == 0 || self.dq == 0 || self.dq > RVQ_MAX_DIM || self.bins == 0 {
            return Err(DeviceError::shape(
                what,
                format!(
                    "{} books of width {} (1..={RVQ_MAX_DIM}) and {} entries",
                    self.n_books, self.dq, self.bins
                ),
            ));
        }
        if self.col0 + self.n_books > self.codes_stride {
            return Err(DeviceError::shape(what, "codes columns out of the row"));
        }
        Ok(())
    }
}

/// The RVQ kernels of one device.
#[derive(Debug, Clone, Copy)]
pub struct RvqKernels {
    encode: KernelId,
    decode: KernelId,
}

impl RvqKernels {
    /// Resolves the kernels.
    pub fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(RvqKernels {
            encode: dev.kernel("rvq_encode")?,
            decode: dev.kernel("rvq_decode")?,
        })
    }

    /// For each active step j: the residual `xq[j]` (`[n_steps][dq]`, not
    /// modified) through the group's codebooks, each code written to
    /// `codes[j·codes_stride + col0 + c]`. Inactive steps write nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn encode<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        s: &RvqShape,
        n_steps: usize,
        xq: DevPtr,
        books_t: DevPtr,
        norms: DevPtr,
        steps: DevPtr,
        codes: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "rvq_encode";
        s.check(WHAT)?;
        if xq == NULL || books_t == NULL || norms == NULL || steps == NULL || codes == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        dev.launch(
            self.encode,
            (dim(WHAT, n_steps)?, 1, 1),
            RVQ_THREADS,
            &[
                Arg::Ptr(xq),
                Arg::Ptr(books_t),
                Arg::Ptr(norms),
                Arg::Ptr(steps),
                Arg::I32(int(WHAT, s.n_books)?),
                Arg::I32(int(WHAT, s.dq)?),
                Arg::I32(int(WHAT, s.bins)?),
                Arg::I32(i32::from(s.bins > CDIST_MM_THRESHOLD)),
                Arg::Ptr(codes),
                Arg::I32(int(WHAT, s.codes_stride)?),
                Arg::I32(int(WHAT, s.col0)?),
            ],
        )
    }

    /// `q[j] = Σ_c books[c][codes[j·codes_stride + col0 + c]]` (`[n_steps][dq]`);
    /// inactive steps get zeros. A code ≥ bins contributes nothing and sets
    /// `fault[j]` when `fault` (`[n_steps]` i32) is not NULL.
    #[allow(clippy::too_many_arguments)]
    pub fn decode<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        s: &RvqShape,
        n_steps: usize,
        codes: DevPtr,
        books_t: DevPtr,
        steps: DevPtr,
        q: DevPtr,
        fault: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "rvq_decode";
        s.check(WHAT)?;
        if codes == NULL || books_t == NULL || steps == NULL || q == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        dev.launch(
            self.decode,
            (
                dim(WHAT, s.dq.div_ceil(RVQ_DEC_THREADS as usize))?,
                dim(WHAT, n_steps)?,
                1,
            ),
            RVQ_DEC_THREADS,
            &[
                Arg::Ptr(codes),
                Arg::I32(int(WHAT, s.codes_stride)?),
                Arg::I32(int(WHAT, s.col0)?),
                Arg::Ptr(books_t),
                Arg::Ptr(steps),
                Arg::I32(int(WHAT, s.n_books)?),
                Arg::I32(int(WHAT, s.dq)?),
                Arg::I32(int(WHAT, s.bins)?),
                Arg::Ptr(q),
                Arg::Ptr(fault),
            ],
        )
    }
}
