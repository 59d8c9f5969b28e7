//! One streaming convolution of Mimi on the device: its weights (in
//! conv.cu's device layouts), its per-slot state and the launch sequence of
//! one call (CPU reference: model/src/mimi/conv.rs).
//!
//! - [`GpuConv`]: causal conv1d; state `prev[max_slots][history][c_in]`,
//!   plus `first[max_slots]` (i32, 1 = fresh) when replicate-padded (the
//!   learnt down-sampler). A call is pad (replicate only) → product → state
//!   update (when the history is not empty).
//! - [`GpuConvTr`]: transposed conv1d (dense, or depthwise for the
//!   up-sampler); state `partial[max_slots][overlap][c_out]`. A call is
//!   product (new tail into the shared `tail` scratch) → state update.
//!
//! Invariants: only active steps' slots are read or written; a reset slot is
//! as after loading (zeros, `first` = 1); weights are uploaded once.

use super::weights::{at, Kind, Mem, Source};
use crate::device::{DevPtr, Device, DeviceResult, NULL};
use crate::model::GpuError;
use crate::ops::conv::{ConvIo, ConvKernels, ConvShape, ConvTrShape};
use moshid_model::weights::TensorSpec;

/// What a conv call fuses around its product: ELU of its inputs, a
/// residual added to its outputs (NULL: none), and the split-K scratch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConvAct {
    pub(crate) elu: bool,
    pub(crate) res: DevPtr,
    pub(crate) part: DevPtr,
}

impl ConvAct {
    /// The plain product (no ELU, no residual).
    pub(crate) fn plain(part: DevPtr) -> Self {
        ConvAct {
            elu: false,
            res: NULL,
            part,
        }
    }
}

/// A causal streaming conv1d.
#[derive(Debug, Clone)]
pub(crate) struct GpuConv {
    /// Tensor name prefix (`….conv.conv`).
    pub(crate) name: String,
    pub(crate) shape: ConvShape,
    pub(crate) has_bias: bool,
    pub(crate) replicate: bool,
    w: DevPtr,
    bias: DevPtr,
    prev: DevPtr,
    first: DevPtr,
}

impl GpuConv {
    /// A skeleton (no device memory yet).
    pub(crate) fn new(name: String, shape: ConvShape, has_bias: bool, replicate: bool) -> Self {
        GpuConv {
            name,
            shape,
            has_bias,
            replicate,
            w: NULL,
            bias: NULL,
            prev: NULL,
            first: NULL,
        }
    }

    pub(crate) fn specs(&self, out: &mut Vec<TensorSpec>) {
        let s = &self.shape;
        out.push(TensorSpec::new(
            format!("{}.weight", self.name),
            &[s.c_out, s.c_in, s.kernel],
        ));
        if self.has_bias {
            out.push(TensorSpec::new(format!("{}.bias", self.name), &[s.c_out]));
        }
    }

    /// Uploads the weights (`[c_out][c_in][k]` → `[k][c_in][c_out]`) and
    /// allocates the state for `max_slots`.
    pub(crate) fn load<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        mem: &mut Mem,
        src: &mut dyn Source,
        max_slots: usize,
    ) -> Result<(), GpuError> {
        let ConvShape {
            c_in: ci,
            c_out: co,
            kernel: k,
            ..
        } = self.shape;
        let raw = src.take(&format!("{}.weight", self.name), &[co, ci, k])?;
        let mut w = vec![0.0; raw.len()];
        for o in 0..co {
            for i in 0..ci {
                for kk in 0..k {
                    w[(kk * ci + i) * co + o] = raw[(o * ci + i) * k + kk];
                }
            }
        }
        self.w = mem.upload_f32(dev, Kind::Weights, &w)?;
        if self.has_bias {
            let b = src.take(&format!("{}.bias", self.name), &[co])?;
            self.bias = mem.upload_f32(dev, Kind::Weights, &b)?;
        }
        let hist = self.shape.history();
        if hist > 0 {
            self.prev = mem.floats(dev, Kind::State, max_slots * hist * ci)?;
        }
        if self.replicate {
            self.first = mem.upload_i32(dev, Kind::State, &vec![1; max_slots])?;
        }
        Ok(())
    }

    /// State bytes per slot.
    pub(crate) fn state_bytes(&self) -> usize {
        self.shape.history() * self.shape.c_in * 4 + if self.replicate { 4 } else { 0 }
    }

    /// Floats of split-K partial sums a call of `t_in` steps for `n` steps needs.
    pub(crate) fn part_need(&self, n: usize, t_in: usize) -> usize {
        if self.shape.c_out >= crate::ops::conv::GEMM_MIN_COUT {
            self.shape.plan(t_in).part_floats(n)
        } else {
            0
        }
    }

    /// One call: `x` `[n][t_in][c_in]` → `y` `[n][t_in/stride][c_out]`, with
    /// ELU applied to the inputs when `elu` and `res` (NULL: none, may be
    /// `y`) added to the outputs; `part`: scratch of [`GpuConv::part_need`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        k: &ConvKernels,
        n: usize,
        t_in: usize,
        steps: DevPtr,
        x: DevPtr,
        y: DevPtr,
        act: &ConvAct,
    ) -> DeviceResult<()> {
        let s = &self.shape;
        let hist = s.history();
        if self.replicate && hist > 0 {
            k.conv1d_replicate_pad(dev, s, t_in, n, x, self.prev, self.first, steps)?;
        }
        let io = ConvIo {
            x,
            state: self.prev,
            w: self.w,
            bias: self.bias,
            res: act.res,
            steps,
            y,
            tail: NULL,
            part: act.part,
            elu: act.elu,
        };
        k.conv1d_stream(dev, s, t_in, n, &io)?;
        if hist > 0 {
            k.conv1d_state_update(dev, s, t_in, n, x, self.prev, self.first, steps)?;
        }
        Ok(())
    }

    /// Issues the reset of `slot` (`one`: a device i32 holding 1).
    pub(crate) fn reset<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        slot: usize,
        one: DevPtr,
    ) -> DeviceResult<()> {
        let per = self.shape.history() * self.shape.c_in;
        if per > 0 {
            dev.memset_zero(at(self.prev, slot * per), per * 4)?;
        }
        if self.first != NULL {
            dev.copy_on_device(at(self.first, slot), one, 4)?;
        }
        Ok(())
    }
}

/// A causal streaming transposed conv1d.
#[derive(Debug, Clone)]
pub(crate) struct GpuConvTr {
    /// Tensor name prefix (`….convtr.convtr`).
    pub(crate) name: String,
    pub(crate) shape: ConvTrShape,
    pub(crate) has_bias: bool,
    w: DevPtr,
    bias: DevPtr,
    partial: DevPtr,
}

impl GpuConvTr {
    /// A skeleton (no device memory yet).
    pub(crate) fn new(name: String, shape: ConvTrShape, has_bias: bool) -> Self {
        GpuConvTr {
            name,
            shape,
            has_bias,
            w: NULL,
            bias: NULL,
            partial: NULL,
        }
    }

    fn torch_shape(&self) -> [usize; 3] {
        let s = &self.shape;
        if s.depthwise {
            [s.c_in, 1, s.kernel]
        } else {
            [s.c_in, s.c_out, s.kernel]
        }
    }

    pub(crate) fn specs(&self, out: &mut Vec<TensorSpec>) {
        out.push(TensorSpec::new(
            format!("{}.weight", self.name),
            &self.torch_shape(),
        ));
        if self.has_bias {
            out.push(TensorSpec::new(
                format!("{}.bias", self.name),
                &[self.shape.c_out],
            ));
        }
    }

    /// Uploads the weights (dense `[c_in][c_out][k]` → `[k][c_in][c_out]`,
    /// depthwise `[c][1][k]` as is) and allocates the state.
    pub(crate) fn load<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        mem: &mut Mem,
        src: &mut dyn Source,
        max_slots: usize,
    ) -> Result<(), GpuError> {
        let ConvTrShape {
            c_in: ci,
            c_out: co,
            kernel: k,
            depthwise,
            ..
        } = self.shape;
        let raw = src.take(&format!("{}.weight", self.name), &self.torch_shape())?;
        let w = if depthwise {
            raw
        } else {
            let mut w = vec![0.0; raw.len()];
            for i in 0..ci {
                for o in 0..co {
                    for kk in 0..k {
                        w[(kk * ci + i) * co + o] = raw[(i * co + o) * k + kk];
                    }
                }
            }
            w
        };
        self.w = mem.upload_f32(dev, Kind::Weights, &w)?;
        if self.has_bias {
            let b = src.take(&format!("{}.bias", self.name), &[co])?;
            self.bias = mem.upload_f32(dev, Kind::Weights, &b)?;
        }
        let per = self.shape.overlap() * co;
        if per > 0 {
            self.partial = mem.floats(dev, Kind::State, max_slots * per)?;
        }
        Ok(())
    }

    /// State bytes per slot.
    pub(crate) fn state_bytes(&self) -> usize {
        self.shape.overlap() * self.shape.c_out * 4
    }

    /// Tail scratch floats for `n` steps.
    pub(crate) fn tail_need(&self, n: usize) -> usize {
        n * self.shape.overlap() * self.shape.c_out
    }

    /// Floats of split-K partial sums a call of `t_in` steps for `n` steps needs.
    pub(crate) fn part_need(&self, n: usize, t_in: usize) -> usize {
        if self.shape.depthwise {
            0
        } else {
            self.shape.plan(t_in).part_floats(n)
        }
    }

    /// One call: `x` `[n][t_in][c_in]` (after ELU when `act.elu`) → `y`
    /// `[n][t_in·stride][c_out]` (`tail`: scratch of
    /// [`GpuConvTr::tail_need`] floats; `act.res` must be NULL).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        k: &ConvKernels,
        n: usize,
        t_in: usize,
        steps: DevPtr,
        x: DevPtr,
        y: DevPtr,
        tail: DevPtr,
        act: &ConvAct,
    ) -> DeviceResult<()> {
        let s = &self.shape;
        let (partial, tail) = if s.overlap() > 0 {
            (self.partial, tail)
        } else {
            (NULL, NULL)
        };
        let io = ConvIo {
            x,
            state: partial,
            w: self.w,
            bias: self.bias,
            res: act.res,
            steps,
            y,
            tail,
            part: act.part,
            elu: act.elu,
        };
        k.convtr1d_stream(dev, s, t_in, n, &io)?;
        if s.overlap() > 0 {
            k.convtr1d_state_update(dev, s, n, tail, self.partial, steps)?;
        }
        Ok(())
    }

    /// Issues the reset of `slot`.
    pub(crate) fn reset<D: Device + ?Sized>(&self, dev: &mut D, slot: usize) -> DeviceResult<()> {
        let per = self.shape.overlap() * self.shape.c_out;
        if per > 0 {
            dev.memset_zero(at(self.partial, slot * per), per * 4)?;
        }
        Ok(())
    }
}
