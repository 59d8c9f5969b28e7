//! RMSNorm and LayerNorm launches (norm.cu): one block per row.

use super::{dim, int};
use crate::device::{Arg, DType, DevPtr, Device, DeviceError, DeviceResult, KernelId, NULL};

/// `NORM_THREADS` of norm.cu.
pub const NORM_THREADS: u32 = 256;

/// The norm kernels of one device.
#[derive(Debug, Clone, Copy)]
pub struct NormKernels {
    rms_bf16: KernelId,
    rms_f32: KernelId,
    layer_f32: KernelId,
    layer_bf16: KernelId,
}

impl NormKernels {
    /// Resolves the kernels.
    pub fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(NormKernels {
            rms_bf16: dev.kernel("rms_norm_bf16")?,
            rms_f32: dev.kernel("rms_norm_f32")?,
            layer_f32: dev.kernel("layer_norm_f32")?,
            layer_bf16: dev.kernel("layer_norm_bf16")?,
        })
    }

    /// `y[r] = rms_norm(x[r]) · alpha` for `rows` rows of `width` f32, `y` in
    /// `out` precision; rows whose `RowInfo` (at `row_info`, or NULL: all
    /// active) is inactive are written as zeros.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        x: DevPtr,
        alpha: DevPtr,
        eps: f32,
        width: usize,
        row_info: DevPtr,
        rows: usize,
        y: DevPtr,
        out: DType,
    ) -> DeviceResult<()> {
        const WHAT: &str = "rms_norm";
        if x == NULL || alpha == NULL || y == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        let k = match out {
            DType::Bf16 => self.rms_bf16,
            DType::F32 => self.rms_f32,
        };
        dev.launch(
            k,
            (dim(WHAT, rows)?, 1, 1),
            NORM_THREADS,
            &[
                Arg::Ptr(x),
                Arg::Ptr(alpha),
                Arg::F32(eps),
                Arg::I32(int(WHAT, width)?),
                Arg::Ptr(row_info),
                Arg::Ptr(y),
            ],
        )
    }

    /// `y[r] = layer_norm(x[r]) · w + b`, all f32, as [`NormKernels::rms_norm`].
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        x: DevPtr,
        w: DevPtr,
        b: DevPtr,
        eps: f32,
        width: usize,
        row_info: DevPtr,
        rows: usize,
        y: DevPtr,
    ) -> DeviceResult<()> {
        self.layer_norm_to(dev, x, w, b, eps, width, row_info, rows, y, DType::F32)
    }

    /// [`NormKernels::layer_norm`] with `y` in `out` precision.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm_to<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        x: DevPtr,
        w: DevPtr,
        b: DevPtr,
        eps: f32,
        width: usize,
        row_info: DevPtr,
        rows: usize,
        y: DevPtr,
        out: DType,
    ) -> DeviceResult<()> {
        const WHAT: &str = "layer_norm";
        if x == NULL || w == NULL || b == NULL || y == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        let k = match out {
            DType::Bf16 => self.layer_bf16,
            DType::F32 => self.layer_f32,
        };
        dev.launch(
            k,
            (dim(WHAT, rows)?, 1, 1),
            NORM_THREADS,
            &[
                Arg::Ptr(x),
                Arg::Ptr(w),
                Arg::Ptr(b),
                Arg::F32(eps),
                Arg::I32(int(WHAT, width)?),
                Arg::Ptr(row_info),
                Arg::Ptr(y),
            ],
        )
    }
}
