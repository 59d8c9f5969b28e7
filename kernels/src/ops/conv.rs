//! Mimi's streaming convolutions (conv.cu): causal conv1d with a per-slot
//! input history (optionally replicate-padded), dense and depthwise
//! transposed conv1d with a per-slot output tail, and their state updates.
//!
//! One method per kernel, one launch per method. A streaming conv call is
//! [`ConvKernels::conv1d_replicate_pad`] (replicate-padded convs only), then
//! [`ConvKernels::conv1d_stream`], then [`ConvKernels::conv1d_state_update`]
//! (when the history is not empty); a transposed conv call is
//! [`ConvKernels::convtr1d_stream`] then [`ConvKernels::convtr1d_state_update`]
//! (when the overlap is not empty). Weights are in the device layouts of
//! conv.cu's header (`[kernel][c_in][c_out]`, depthwise `[c][kernel]`).

use super::{dim, int};
use crate::device::{Arg, DevPtr, Device, DeviceError, DeviceResult, KernelId, NULL};

/// `CONV_THREADS` of conv.cu.
pub const CONV_THREADS: u32 = 128;
/// `CONV_TT` of conv.cu: outputs per thread of the dense products.
pub const CONV_TT: usize = 4;

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

/// The convolution kernels of one device.
#[derive(Debug, Clone, Copy)]
pub struct ConvKernels {
    conv: KernelId,
    pad: KernelId,
    update: KernelId,
    tr: KernelId,
    tr_dw: KernelId,
    tr_update: KernelId,
}

impl ConvKernels {
    /// Resolves the kernels.
    pub fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(ConvKernels {
            conv: dev.kernel("conv1d_stream")?,
            pad: dev.kernel("conv1d_replicate_pad")?,
            update: dev.kernel("conv1d_state_update")?,
            tr: dev.kernel("convtr1d_stream")?,
            tr_dw: dev.kernel("convtr1d_dw_stream")?,
            tr_update: dev.kernel("convtr1d_state_update")?,
        })
    }

    /// `y[j] = conv(prev[slot] ++ x[j])` for each of `n_steps` slot-steps:
    /// `x` is `[n_steps][t_in][c_in]`, `y` `[n_steps][t_in/stride][c_out]`,
    /// `prev` `[max_slots][history][c_in]` (may be NULL when the history is
    /// empty), `bias` `[c_out]` or NULL. Inactive steps get zeros.
    #[allow(clippy::too_many_arguments)]
    pub fn conv1d_stream<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        s: &ConvShape,
        t_in: usize,
        n_steps: usize,
        x: DevPtr,
        prev: DevPtr,
        w: DevPtr,
        bias: DevPtr,
        steps: DevPtr,
        y: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "conv1d_stream";
        s.check(t_in)?;
        let hist = s.history();
        if x == NULL || w == NULL || steps == NULL || y == NULL || (hist > 0 && prev == NULL) {
            return Err(DeviceError::shape(WHAT, "null operand"));
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
                Arg::Ptr(x),
                Arg::Ptr(prev),
                Arg::Ptr(w),
                Arg::Ptr(bias),
                Arg::Ptr(steps),
                Arg::I32(int(WHAT, s.c_in)?),
                Arg::I32(int(WHAT, s.c_out)?),
                Arg::I32(int(WHAT, s.kernel)?),
                Arg::I32(int(WHAT, s.stride)?),
                Arg::I32(int(WHAT, s.dilation)?),
                Arg::I32(int(WHAT, t_in)?),
                Arg::I32(int(WHAT, hist)?),
                Arg::Ptr(y),
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

    /// The transposed conv of each step: `x` `[n_steps][t_in][c_in]` →
    /// `y` `[n_steps][t_in·stride][c_out]` plus the slot's old tail
    /// (`partial`, `[max_slots][overlap][c_out]`); the new tail goes to
    /// `tail` (`[n_steps][overlap][c_out]`), for
    /// [`ConvKernels::convtr1d_state_update`]. `bias` `[c_out]` or NULL;
    /// `partial` and `tail` may be NULL when the overlap is empty.
    #[allow(clippy::too_many_arguments)]
    pub fn convtr1d_stream<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        s: &ConvTrShape,
        t_in: usize,
        n_steps: usize,
        x: DevPtr,
        partial: DevPtr,
        w: DevPtr,
        bias: DevPtr,
        steps: DevPtr,
        y: DevPtr,
        tail: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "convtr1d_stream";
        s.check(t_in)?;
        let ov = s.overlap();
        if x == NULL || w == NULL || steps == NULL || y == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        if ov > 0 && (partial == NULL || tail == NULL) {
            return Err(DeviceError::shape(
                WHAT,
                "null state or tail with a non-empty overlap",
            ));
        }
        let outputs = s.t_out(t_in) + ov;
        let grid = if s.depthwise {
            // A thread per channel and output step.
            (
                dim(WHAT, s.c_out.div_ceil(CONV_THREADS as usize))?,
                dim(WHAT, outputs)?,
                dim(WHAT, n_steps)?,
            )
        } else {
            // Threads over (channel, phase, group of CONV_TT outputs of that
            // phase).
            let groups = outputs.div_ceil(s.stride).div_ceil(CONV_TT);
            let threads = s.c_out * s.stride * groups;
            (
                dim(WHAT, threads.div_ceil(CONV_THREADS as usize))?,
                dim(WHAT, n_steps)?,
                1,
            )
        };
        let (kernel, stride, t) = (
            Arg::I32(int(WHAT, s.kernel)?),
            Arg::I32(int(WHAT, s.stride)?),
            Arg::I32(int(WHAT, t_in)?),
        );
        let head = [
            Arg::Ptr(x),
            Arg::Ptr(partial),
            Arg::Ptr(w),
            Arg::Ptr(bias),
            Arg::Ptr(steps),
        ];
        if s.depthwise {
            let mut args = [Arg::Ptr(y); 11];
            args[..5].copy_from_slice(&head);
            args[5] = Arg::I32(int(WHAT, s.c_out)?);
            args[6] = kernel;
            args[7] = stride;
            args[8] = t;
            args[10] = Arg::Ptr(tail);
            dev.launch(self.tr_dw, grid, CONV_THREADS, &args)
        } else {
            let mut args = [Arg::Ptr(y); 12];
            args[..5].copy_from_slice(&head);
            args[5] = Arg::I32(int(WHAT, s.c_in)?);
            args[6] = Arg::I32(int(WHAT, s.c_out)?);
            args[7] = kernel;
            args[8] = stride;
            args[9] = t;
            args[11] = Arg::Ptr(tail);
            dev.launch(self.tr, grid, CONV_THREADS, &args)
        }
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
}
