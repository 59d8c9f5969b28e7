//! The codebook parts of Mimi's split RVQ (quantizer.cu): nearest-entry
//! search with residual updates (encode, one launch per codebook stage plus
//! one that writes the last code) and codebook sums (decode). The 1×1
//! projections around them are GEMMs.
//!
//! Device codebook layout (quantizer.cu's header): `books[c][bins][dq]`
//! (entry-major) and `norms[c][bins] = ‖e‖²`.

use super::{dim, int};
use crate::device::{Arg, DevPtr, Device, DeviceError, DeviceResult, KernelId, NULL};

/// `RVQ_THREADS` of quantizer.cu.
pub const RVQ_THREADS: u32 = 128;
/// `RVQ_ROWS` of quantizer.cu: slot-steps per block of a stage.
pub const RVQ_ROWS: usize = 16;
/// `RVQ_TILE` of quantizer.cu: codebook entries per block of a stage.
pub const RVQ_TILE: usize = 64;
/// Bytes of one partial minimum (`struct RvqBest`: a float and an int).
pub const RVQ_BEST_BYTES: usize = 8;
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

    /// Entry tiles per codebook (blocks of a stage along the entries).
    pub fn tiles(&self) -> usize {
        self.bins.div_ceil(RVQ_TILE)
    }

    /// Bytes of the partial-minimum scratch an encode of `n_steps` needs
    /// (two halves of `[n_steps][tiles]`).
    pub fn part_bytes(&self, n_steps: usize) -> usize {
        2 * n_steps * self.tiles() * RVQ_BEST_BYTES
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
            encode: dev.kernel("rvq_stage")?,
            decode: dev.kernel("rvq_decode")?,
        })
    }

    /// For each active step j: the residual `xq[j]` (`[n_steps][dq]`, not
    /// modified) through the group's codebooks, each code written to
    /// `codes[j·codes_stride + col0 + c]`; `part` is scratch of
    /// [`RvqShape::part_bytes`]. Inactive steps write no code. Issues
    /// `n_books + 1` launches.
    #[allow(clippy::too_many_arguments)]
    pub fn encode<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        s: &RvqShape,
        n_steps: usize,
        xq: DevPtr,
        books: DevPtr,
        norms: DevPtr,
        steps: DevPtr,
        part: DevPtr,
        codes: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "rvq_stage";
        s.check(WHAT)?;
        if [xq, books, norms, steps, part, codes].contains(&NULL) {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        let row_tiles = dim(WHAT, n_steps.div_ceil(RVQ_ROWS))?;
        for stage in 0..=s.n_books {
            let tiles = if stage < s.n_books { s.tiles() } else { 1 };
            dev.launch(
                self.encode,
                (dim(WHAT, tiles)?, row_tiles, 1),
                RVQ_THREADS,
                &[
                    Arg::Ptr(xq),
                    Arg::Ptr(books),
                    Arg::Ptr(norms),
                    Arg::Ptr(steps),
                    Arg::I32(int(WHAT, n_steps)?),
                    Arg::I32(int(WHAT, s.n_books)?),
                    Arg::I32(int(WHAT, s.dq)?),
                    Arg::I32(int(WHAT, s.bins)?),
                    Arg::I32(i32::from(s.bins > CDIST_MM_THRESHOLD)),
                    Arg::I32(int(WHAT, stage)?),
                    Arg::Ptr(part),
                    Arg::Ptr(codes),
                    Arg::I32(int(WHAT, s.codes_stride)?),
                    Arg::I32(int(WHAT, s.col0)?),
                ],
            )?;
        }
        Ok(())
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
        books: DevPtr,
        steps: DevPtr,
        q: DevPtr,
        fault: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "rvq_decode";
        s.check(WHAT)?;
        if codes == NULL || books == NULL || steps == NULL || q == NULL {
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
                Arg::Ptr(books),
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
