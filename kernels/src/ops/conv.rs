//! Mimi's streaming convolutions (conv.cu): causal conv1d with a per-slot
//! input history (optionally replicate-padded), dense and depthwise
//! transposed conv1d with a per-slot output tail, and their state updates.
//!
//! A streaming conv call is [`ConvKernels::conv1d_replicate_pad`]
//! (replicate-padded convs only), then [`ConvKernels::conv1d_stream`], then
//! [`ConvKernels::conv1d_state_update`] (when the history is not empty); a
//! transposed conv call is [`ConvKernels::convtr1d_stream`] then
//! [`ConvKernels::convtr1d_state_update`] (when the overlap is not empty).
//! Weights are in the device layouts of conv.cu's header
//! (`[kernel][c_in][c_out]`, depthwise `[c][kernel]`).
//!
//! The products of layers with at least [`GEMM_MIN_COUT`] output channels
//! run as conv.cu's implicit GEMM, with the reduction split over
//! [`GemmPlan::splits`] blocks (then one more launch adds the partial sums);
//! narrower layers run the direct kernel. Either can apply ELU to its inputs
//! and add a residual to its outputs ([`ConvIo`]). The split depends on the
//! layer's shape and the steps per slot only, never on the batch size, so a
//! stream's numbers do not depend on the batch it is in.

use super::{dim, int};
use crate::device::{Arg, DevPtr, Device, DeviceError, DeviceResult, KernelId, NULL};

/// `CONV_THREADS` of conv.cu.
pub const CONV_THREADS: u32 = 128;
/// `CONV_TT` of conv.cu: outputs per thread of the direct products.
pub const CONV_TT: usize = 4;
/// `CG_THREADS` of conv.cu.
pub const CG_THREADS: u32 = 128;
/// `CG_BM` of conv.cu: output rows per GEMM block (conv_gemm).
pub const CG_BM: usize = 32;
/// `CG_BM_TALL` of conv.cu: output rows per block of conv_gemm_tall, for
/// the layers with at least [`NO_SPLIT_ROWS`] rows per slot-step.
pub const CG_BM_TALL: usize = 64;
/// `CG_BN` of conv.cu: output channels per GEMM block.
pub const CG_BN: usize = 64;
/// `CG_BK` of conv.cu: reduction slice.
pub const CG_BK: usize = 32;
/// `CG_RED_THREADS` of conv.cu.
pub const CG_RED_THREADS: u32 = 256;
/// Layers with at least this many output channels take the implicit GEMM.
pub const GEMM_MIN_COUT: usize = 8;
/// Blocks one slot-step's call should fill at least (about four per SM of a
/// large GPU), reached by splitting the reduction of layers with few rows.
const TARGET_BLOCKS: usize = 512;
/// Shortest reduction range of one split.
const MIN_SPLIT_K: usize = 128;
/// Splits stop where the partial sums of one slot-step would outgrow this
/// many rows (their traffic at large batches).
const MAX_PARTIAL_ROWS: usize = 256;
/// Layers with at least this many output rows per slot-step never split
/// (and take the 64-row tiles).
pub const NO_SPLIT_ROWS: usize = 128;
/// Grid cap of the reduce's grid-stride loop.
const RED_MAX_BLOCKS: usize = 4096;

/// Shape of a causal streaming convolution (groups = 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    /// Input channels.
    pub c_in: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel size.
    pub kernel: usize,
    /// Stride.
    pub stride: usize,
    /// Dilation.
    pub dilation: usize,
}

impl ConvShape {
    /// Input steps kept per slot between calls, `(kernel − 1)·dilation + 1 − stride`.
    pub fn history(&self) -> usize {
        ((self.kernel.max(1) - 1) * self.dilation + 1).saturating_sub(self.stride)
    }

    /// Output steps of a call of `t_in` steps (which must be a multiple of the stride).
    pub fn t_out(&self, t_in: usize) -> usize {
        t_in / self.stride.max(1)
    }

    /// How the product of a call of `t_in` steps runs as a GEMM.
    pub fn plan(&self, t_in: usize) -> GemmPlan {
        GemmPlan::new(self.t_out(t_in), 1, self.c_out, self.kernel * self.c_in)
    }

    fn check(&self, t_in: usize) -> DeviceResult<()> {
        const WHAT: &str = "conv1d_stream";
        if self.c_in == 0 || self.c_out == 0 || self.kernel == 0 || self.dilation == 0 {
            return Err(DeviceError::shape(WHAT, format!("empty shape {self:?}")));
        }
        if self.stride == 0 || (self.kernel - 1) * self.dilation + 1 < self.stride {
            return Err(DeviceError::shape(
                WHAT,
                "effective kernel shorter than the stride",
            ));
        }
        if t_in == 0 || !t_in.is_multiple_of(self.stride) {
            return Err(DeviceError::shape(
                WHAT,
                format!("{t_in} input steps: not a multiple of the stride"),
            ));
        }
        Ok(())
    }
}

/// Shape of a causal streaming transposed convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvTrShape {
    /// Input channels.
    pub c_in: usize,
    /// Output channels (= `c_in` when depthwise).
    pub c_out: usize,
    /// Kernel size (≥ stride).
    pub kernel: usize,
    /// Stride.
    pub stride: usize,
    /// Depthwise (groups = channels): the learnt up-sampler.
    pub depthwise: bool,
}

impl ConvTrShape {
    /// Output steps carried per slot between calls, `kernel − stride`.
    pub fn overlap(&self) -> usize {
        self.kernel.saturating_sub(self.stride)
    }

    /// Output steps of a call of `t_in` steps.
    pub fn t_out(&self, t_in: usize) -> usize {
        t_in * self.stride
    }

    /// How the (dense) product of a call of `t_in` steps runs as a GEMM:
    /// one per phase, rows `ceil((t_out + overlap) / stride)` per slot-step,
    /// reduction over `ceil(kernel / stride)` taps (phase 0's, the most).
    pub fn plan(&self, t_in: usize) -> GemmPlan {
        let s = self.stride.max(1);
        GemmPlan::new(
            (self.t_out(t_in) + self.overlap()).div_ceil(s),
            s,
            self.c_out,
            self.kernel.div_ceil(s) * self.c_in,
        )
    }

    fn check(&self, t_in: usize) -> DeviceResult<()> {
        const WHAT: &str = "convtr1d_stream";
        if self.c_in == 0 || self.c_out == 0 || self.stride == 0 || self.kernel < self.stride {
            return Err(DeviceError::shape(
                WHAT,
                format!("needs kernel ≥ stride ≥ 1, got {self:?}"),
            ));
        }
        if self.depthwise && self.c_in != self.c_out {
            return Err(DeviceError::shape(WHAT, "depthwise needs c_in = c_out"));
        }
        if t_in == 0 || self.t_out(t_in) < self.overlap() {
            return Err(DeviceError::shape(WHAT, "a call must cover the overlap"));
        }
        Ok(())
    }
}

/// A convolution's product as conv.cu's implicit GEMM: per phase, `rows`
/// output rows per slot-step by `c_out` columns, reduced over at most
/// `k` terms, split in `splits` ranges of `k_split` (a multiple of
/// [`CG_BK`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmPlan {
    /// Output rows per slot-step and phase.
    pub rows: usize,
    /// Phases (the stride of a transposed conv, else 1).
    pub phases: usize,
    /// Output channels.
    pub c_out: usize,
    /// Reduction length (the longest phase's).
    pub k: usize,
    /// Ranges the reduction is split into (1: no partial sums).
    pub splits: usize,
    /// Output rows per block ([`CG_BM`] or [`CG_BM_TALL`]).
    pub tile_rows: usize,
    /// Reduction terms per split.
    pub k_split: usize,
}

impl GemmPlan {
    /// The plan of a product: layers with many rows per slot-step are not
    /// split (their partial sums would cost more than they gain at large
    /// batches); the others are split until one slot-step's call fills
    /// about [`TARGET_BLOCKS`] blocks, each split at least [`MIN_SPLIT_K`]
    /// long, and the partial rows of a slot-step stay under
    /// [`MAX_PARTIAL_ROWS`]. A pure function of the shape, not of the batch.
    pub fn new(rows: usize, phases: usize, c_out: usize, k: usize) -> GemmPlan {
        let tiles = c_out.div_ceil(CG_BN) * rows.div_ceil(CG_BM) * phases;
        let want = if rows >= NO_SPLIT_ROWS {
            1
        } else {
            TARGET_BLOCKS
                .div_ceil(tiles.max(1))
                .min(k / MIN_SPLIT_K)
                .min(MAX_PARTIAL_ROWS / (rows * phases).max(1))
                .max(1)
        };
        let k_split = k.div_ceil(want).next_multiple_of(CG_BK).max(CG_BK);
        GemmPlan {
            rows,
            phases,
            c_out,
            k,
            splits: k.div_ceil(k_split).max(1),
            k_split,
            tile_rows: if rows >= NO_SPLIT_ROWS {
                CG_BM_TALL
            } else {
                CG_BM
            },
        }
    }

    /// Floats of partial sums a call over `n_steps` slot-steps needs (0
    /// without a split).
    pub fn part_floats(&self, n_steps: usize) -> usize {
        if self.splits > 1 {
            self.splits * self.phases * n_steps * self.rows * self.c_out
        } else {
            0
        }
    }
}

/// The operands of one product launch.
#[derive(Debug, Clone, Copy)]
pub struct ConvIo {
    /// Input `[n_steps][t_in][c_in]`.
    pub x: DevPtr,
    /// conv1d: the histories `[max_slots][history][c_in]` (NULL when the
    /// history is empty); transposed: the old tails
    /// `[max_slots][overlap][c_out]` (NULL when the overlap is empty).
    pub state: DevPtr,
    /// Weights in the device layout.
    pub w: DevPtr,
    /// `[c_out]` or NULL.
    pub bias: DevPtr,
    /// conv1d only: added to every output (`y = res + (conv + bias)`), laid
    /// out as `y`, which it may be; NULL for none.
    pub res: DevPtr,
    /// `SlotStep[n_steps]`.
    pub steps: DevPtr,
    /// Output `[n_steps][t_out][c_out]`.
    pub y: DevPtr,
    /// Transposed: the new tails `[n_steps][overlap][c_out]` (NULL when the
    /// overlap is empty); NULL for conv1d.
    pub tail: DevPtr,
    /// Partial sums, [`GemmPlan::part_floats`] floats (NULL when the plan
    /// has one split or the direct kernel runs).
    pub part: DevPtr,
    /// ELU applied to every input read (the state keeps raw inputs).
    pub elu: bool,
}

/// The convolution kernels of one device.
#[derive(Debug, Clone, Copy)]
pub struct ConvKernels {
    conv: KernelId,
    pad: KernelId,
    update: KernelId,
    tr_dw: KernelId,
    tr_update: KernelId,
    gemm: KernelId,
    gemm_tall: KernelId,
    reduce: KernelId,
}

impl ConvKernels {
    /// Resolves the kernels.
    pub fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(ConvKernels {
            conv: dev.kernel("conv1d_stream")?,
            pad: dev.kernel("conv1d_replicate_pad")?,
            update: dev.kernel("conv1d_state_update")?,
            tr_dw: dev.kernel("convtr1d_dw_stream")?,
            tr_update: dev.kernel("convtr1d_state_update")?,
            gemm: dev.kernel("conv_gemm")?,
            gemm_tall: dev.kernel("conv_gemm_tall")?,
            reduce: dev.kernel("conv_gemm_reduce")?,
        })
    }

    /// `y[j] = conv(prev[slot] ++ x[j])` (plus `res`, after ELU of the inputs
    /// when asked) for each of `n_steps` slot-steps; inactive steps get zeros.
    pub fn conv1d_stream<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        s: &ConvShape,
        t_in: usize,
        n_steps: usize,
        io: &ConvIo,
    ) -> DeviceResult<()> {
        const WHAT: &str = "conv1d_stream";
        s.check(t_in)?;
        let hist = s.history();
        if io.x == NULL || io.w == NULL || io.steps == NULL || io.y == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        if hist > 0 && io.state == NULL {
            return Err(DeviceError::shape(WHAT, "null history"));
        }
        if s.c_out >= GEMM_MIN_COUT {
            let plan = s.plan(t_in);
            return self.gemm(dev, WHAT, &plan, n_steps, io, &GemmDims::conv(s, t_in));
        }
        // Threads over (channel, group of CONV_TT output steps).
        let threads = s.c_out * s.t_out(t_in).div_ceil(CONV_TT);
        let grid = (
            dim(WHAT, threads.div_ceil(CONV_THREADS as usize))?,
            dim(WHAT, n_steps)?,
            1,
        );
        dev.launch(
            self.conv,
            grid,
            CONV_THREADS,
            &[
                Arg::Ptr(io.x),
                Arg::Ptr(io.state),
                Arg::Ptr(io.w),
                Arg::Ptr(io.bias),
                Arg::Ptr(io.res),
                Arg::Ptr(io.steps),
                Arg::I32(int(WHAT, s.c_in)?),
                Arg::I32(int(WHAT, s.c_out)?),
                Arg::I32(int(WHAT, s.kernel)?),
                Arg::I32(int(WHAT, s.stride)?),
                Arg::I32(int(WHAT, s.dilation)?),
                Arg::I32(int(WHAT, t_in)?),
                Arg::I32(int(WHAT, hist)?),
                Arg::I32(io.elu as i32),
                Arg::Ptr(io.y),
            ],
        )
    }

    /// Before [`ConvKernels::conv1d_stream`] of a replicate-padded conv: the
    /// history of each active step's slot whose `first[slot]` is set is
    /// filled with the step's first input step.
    #[allow(clippy::too_many_arguments)]
    pub fn conv1d_replicate_pad<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        s: &ConvShape,
        t_in: usize,
        n_steps: usize,
        x: DevPtr,
        prev: DevPtr,
        first: DevPtr,
        steps: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "conv1d_replicate_pad";
        s.check(t_in)?;
        if x == NULL || prev == NULL || first == NULL || steps == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        dev.launch(
            self.pad,
            (dim(WHAT, n_steps)?, 1, 1),
            CONV_THREADS,
            &[
                Arg::Ptr(x),
                Arg::Ptr(prev),
                Arg::Ptr(first),
                Arg::Ptr(steps),
                Arg::I32(int(WHAT, s.c_in)?),
                Arg::I32(int(WHAT, t_in)?),
                Arg::I32(int(WHAT, s.history())?),
            ],
        )
    }

    /// After [`ConvKernels::conv1d_stream`]: each active step's slot history
    /// becomes the last `history` steps of `prev ++ x`; clears `first[slot]`
    /// when `first` is not NULL.
    #[allow(clippy::too_many_arguments)]
    pub fn conv1d_state_update<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        s: &ConvShape,
        t_in: usize,
        n_steps: usize,
        x: DevPtr,
        prev: DevPtr,
        first: DevPtr,
        steps: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "conv1d_state_update";
        s.check(t_in)?;
        if x == NULL || prev == NULL || steps == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        dev.launch(
            self.update,
            (dim(WHAT, n_steps)?, 1, 1),
            CONV_THREADS,
            &[
                Arg::Ptr(x),
                Arg::Ptr(prev),
                Arg::Ptr(first),
                Arg::Ptr(steps),
                Arg::I32(int(WHAT, s.c_in)?),
                Arg::I32(int(WHAT, t_in)?),
                Arg::I32(int(WHAT, s.history())?),
            ],
        )
    }

    /// The transposed conv of each step: `x` `[n_steps][t_in][c_in]` (after
    /// ELU when asked) → `y` `[n_steps][t_in·stride][c_out]` plus the slot's
    /// old tail (`io.state`); the new tail goes to `io.tail`, for
    /// [`ConvKernels::convtr1d_state_update`]. No residual.
    pub fn convtr1d_stream<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        s: &ConvTrShape,
        t_in: usize,
        n_steps: usize,
        io: &ConvIo,
    ) -> DeviceResult<()> {
        const WHAT: &str = "convtr1d_stream";
        s.check(t_in)?;
        let ov = s.overlap();
        if io.x == NULL || io.w == NULL || io.steps == NULL || io.y == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        if ov > 0 && (io.state == NULL || io.tail == NULL) {
            return Err(DeviceError::shape(
                WHAT,
                "null state or tail with a non-empty overlap",
            ));
        }
        if io.res != NULL {
            return Err(DeviceError::shape(WHAT, "no residual for transposed convs"));
        }
        if !s.depthwise {
            let plan = s.plan(t_in);
            return self.gemm(dev, WHAT, &plan, n_steps, io, &GemmDims::convtr(s, t_in));
        }
        if io.elu {
            return Err(DeviceError::shape(WHAT, "no ELU for depthwise convs"));
        }
        // A thread per channel and output step.
        let grid = (
            dim(WHAT, s.c_out.div_ceil(CONV_THREADS as usize))?,
            dim(WHAT, s.t_out(t_in) + ov)?,
            dim(WHAT, n_steps)?,
        );
        dev.launch(
            self.tr_dw,
            grid,
            CONV_THREADS,
            &[
                Arg::Ptr(io.x),
                Arg::Ptr(io.state),
                Arg::Ptr(io.w),
                Arg::Ptr(io.bias),
                Arg::Ptr(io.steps),
                Arg::I32(int(WHAT, s.c_out)?),
                Arg::I32(int(WHAT, s.kernel)?),
                Arg::I32(int(WHAT, s.stride)?),
                Arg::I32(int(WHAT, t_in)?),
                Arg::Ptr(io.y),
                Arg::Ptr(io.tail),
            ],
        )
    }

    /// After [`ConvKernels::convtr1d_stream`]: `partial[slot] ← tail[j]`
    /// (`overlap · c_out` floats) for each active step.
    pub fn convtr1d_state_update<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        s: &ConvTrShape,
        n_steps: usize,
        tail: DevPtr,
        partial: DevPtr,
        steps: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "convtr1d_state_update";
        if tail == NULL || partial == NULL || steps == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        dev.launch(
            self.tr_update,
            (dim(WHAT, n_steps)?, 1, 1),
            CONV_THREADS,
            &[
                Arg::Ptr(tail),
                Arg::Ptr(partial),
                Arg::Ptr(steps),
                Arg::I32(int(WHAT, s.overlap() * s.c_out)?),
            ],
        )
    }

    /// The implicit GEMM of `plan` (and, with splits, the reduce).
    fn gemm<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        what: &'static str,
        plan: &GemmPlan,
        n_steps: usize,
        io: &ConvIo,
        d: &GemmDims,
    ) -> DeviceResult<()> {
        if plan.splits > 1 && io.part == NULL {
            return Err(DeviceError::shape(what, "null partial-sum scratch"));
        }
        let row_tiles = (n_steps * plan.rows).div_ceil(plan.tile_rows);
        let grid = (
            dim(what, plan.c_out.div_ceil(CG_BN))?,
            dim(what, plan.phases * row_tiles)?,
            dim(what, plan.splits)?,
        );
        let i = |v: usize| int(what, v).map(Arg::I32);
        let (n, c_out, kernel, stride, t_in) = (
            i(n_steps)?,
            i(plan.c_out)?,
            i(d.kernel)?,
            i(d.stride)?,
            i(d.t_in)?,
        );
        let transposed = Arg::I32(d.transposed as i32);
        let id = if plan.tile_rows == CG_BM_TALL {
            self.gemm_tall
        } else {
            self.gemm
        };
        dev.launch(
            id,
            grid,
            CG_THREADS,
            &[
                Arg::Ptr(io.x),
                Arg::Ptr(if d.transposed { NULL } else { io.state }),
                Arg::Ptr(io.w),
                Arg::Ptr(io.bias),
                Arg::Ptr(io.res),
                Arg::Ptr(if d.transposed { io.state } else { NULL }),
                Arg::Ptr(io.steps),
                Arg::Ptr(io.y),
                Arg::Ptr(io.tail),
                Arg::Ptr(io.part),
                n,
                i(d.c_in)?,
                c_out,
                kernel,
                stride,
                i(d.dilation)?,
                t_in,
                i(d.hist)?,
                transposed,
                Arg::I32(io.elu as i32),
                i(plan.k_split)?,
            ],
        )?;
        if plan.splits == 1 {
            return Ok(());
        }
        let total = plan.phases * n_steps * plan.rows * plan.c_out;
        let blocks = total
            .div_ceil(CG_RED_THREADS as usize)
            .clamp(1, RED_MAX_BLOCKS);
        dev.launch(
            self.reduce,
            (dim(what, blocks)?, 1, 1),
            CG_RED_THREADS,
            &[
                Arg::Ptr(io.part),
                Arg::Ptr(io.bias),
                Arg::Ptr(io.res),
                Arg::Ptr(if d.transposed { io.state } else { NULL }),
                Arg::Ptr(io.steps),
                Arg::Ptr(io.y),
                Arg::Ptr(io.tail),
                n,
                c_out,
                kernel,
                stride,
                t_in,
                transposed,
                i(plan.splits)?,
            ],
        )
    }
}

/// The scalar arguments of conv_gemm besides the plan's.
struct GemmDims {
    c_in: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    t_in: usize,
    hist: usize,
    transposed: bool,
}

impl GemmDims {
    fn conv(s: &ConvShape, t_in: usize) -> Self {
        GemmDims {
            c_in: s.c_in,
            kernel: s.kernel,
            stride: s.stride,
            dilation: s.dilation,
            t_in,
            hist: s.history(),
            transposed: false,
        }
    }

    fn convtr(s: &ConvTrShape, t_in: usize) -> Self {
        GemmDims {
            c_in: s.c_in,
            kernel: s.kernel,
            stride: s.stride,
            dilation: 1,
            t_in,
            hist: 0,
            transposed: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(c_in: usize, c_out: usize, kernel: usize, stride: usize, dilation: usize) -> ConvShape {
        ConvShape {
            c_in,
            c_out,
            kernel,
            stride,
            dilation,
        }
    }

    #[test]
    fn splits_follow_the_shape_not_the_batch() {
        // Mimi's layers: many rows per slot-step never split; the deep ones
        // split until a slot-step fills about 512 blocks, within the bounds.
        assert_eq!(conv(64, 32, 3, 1, 1).plan(1920).splits, 1);
        assert_eq!(conv(64, 32, 3, 1, 1).plan(1920).tile_rows, CG_BM_TALL);
        assert_eq!(conv(512, 1024, 16, 8, 1).plan(16).tile_rows, CG_BM);
        assert_eq!(conv(64, 128, 8, 4, 1).plan(1920).splits, 1);
        let down = conv(512, 1024, 16, 8, 1).plan(16);
        assert_eq!((down.rows, down.k), (2, 8192));
        // 16 column tiles × 1 row tile; 512 / 16 = 32 splits of 256.
        assert_eq!((down.splits, down.k_split), (32, 256));
        let res = conv(512, 256, 3, 1, 1).plan(16);
        // 4 tiles → 128 wanted, 1536 / 128 = 12 allowed, 256 / 16 = 16 rows.
        assert_eq!(res.splits, 12);
        let mid = conv(128, 256, 10, 5, 1).plan(480);
        // 96 rows: at most 256 / 96 = 2 splits.
        assert_eq!(mid.splits, 2);
        let tr = ConvTrShape {
            c_in: 1024,
            c_out: 512,
            kernel: 16,
            stride: 8,
            depthwise: false,
        }
        .plan(2);
        // 3 rows and 8 phases per slot-step, 2 taps of 1024 channels.
        assert_eq!((tr.rows, tr.phases, tr.k), (3, 8, 2048));
        assert_eq!(tr.splits, 8);
        // Every split covers its range in whole slices, the last one not empty.
        for p in [down, res, mid, tr] {
            assert_eq!(p.k_split % CG_BK, 0);
            assert!((p.splits - 1) * p.k_split < p.k && p.splits * p.k_split >= p.k);
        }
        // Short reductions are never split.
        assert_eq!(conv(8, 16, 3, 1, 1).plan(2).splits, 1);
        assert_eq!(conv(8, 16, 3, 1, 1).plan(2).part_floats(5), 0);
        assert_eq!(down.part_floats(3), 32 * 3 * 2 * 1024);
    }
}
