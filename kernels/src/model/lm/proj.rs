//! One projection of the LM with the operation that feeds it: `y (+)=
//! input(x) · Wᵀ`, where the input is a stored activation, an f32 tensor
//! cast to the activation type, the RMS norm of the residual stream, or the
//! gated FFN activation.
//!
//! For at most [`GV_MAX_ROWS`](crate::ops::gemv::GV_MAX_ROWS) rows it is one
//! gemv.cu launch (the weights streamed once, the input computed on the
//! fly); otherwise the input's own kernel writes the activation into a
//! staging buffer and cuBLAS multiplies, as before. Both give the GEMM the
//! same input bits (gemv.cu's header). A call's launches depend only on the
//! row count (capturable).
//!
//! Profile phases: a call marks its own sections ([`ProjPhases`]) — the
//! input's kernel on the cuBLAS path under one, the product (a fused launch
//! included) under the other.

use super::super::tensor::{linear, DevTensor};
use super::LmKernels;
use crate::device::{DType, DevPtr, Device, DeviceResult, Phase, StackPhases};
use crate::ops::gemv::{GemvCall, GemvInput, GemvKernels};

/// What a projection reads.
#[derive(Debug, Clone, Copy)]
pub(super) enum ProjIn {
    /// `[rows][K]` in the activation type.
    Act(DevPtr),
    /// `[rows][K]` f32, cast to the activation type.
    Cast(DevPtr),
    /// `[rows][K]` f32 residual stream, RMS-normed with gains `alpha`;
    /// rows whose `RowInfo` (at `rows`) is inactive give zeros.
    Rms {
        x: DevPtr,
        alpha: DevPtr,
        eps: f32,
        rows: DevPtr,
    },
    /// `[rows][2K]` f32 gated FFN, `silu(gate) · value`.
    Silu(DevPtr),
}

/// The profile's phases of a projection's launches.
#[derive(Debug, Clone, Copy)]
pub(super) struct ProjPhases {
    /// The input's own kernel (norm, gate, cast) on the cuBLAS path.
    pub input: Phase,
    /// The product, and the fused launch that computes its input too.
    pub product: Phase,
}

impl ProjPhases {
    /// The text head: its input is the out-norm's output (`lm.small`).
    pub(super) const TEXT_HEAD: ProjPhases = ProjPhases {
        input: Phase::LmSmall,
        product: Phase::LmHead,
    };
}

impl From<StackPhases> for ProjPhases {
    fn from(p: StackPhases) -> Self {
        ProjPhases {
            input: p.small,
            product: p.gemm,
        }
    }
}

/// `y` (`[rows][w.rows]` f32) = (or += when `accumulate`) `input · wᵀ`, the
/// activation in `act`; `staging` (`[rows][w.cols]` of `act`) takes the
/// input on the cuBLAS path when it is not stored already; the launches are
/// marked with `phases`.
#[allow(clippy::too_many_arguments)]
pub(super) fn project<D: Device + ?Sized>(
    dev: &mut D,
    k: &LmKernels,
    phases: ProjPhases,
    input: ProjIn,
    act: DType,
    rows: usize,
    w: &DevTensor,
    y: DevPtr,
    accumulate: bool,
    staging: DevPtr,
) -> DeviceResult<()> {
    if GemvKernels::takes(rows, w.cols) {
        dev.phase(phases.product);
        let (x, input) = match input {
            ProjIn::Act(x) => (x, GemvInput::Plain),
            ProjIn::Cast(x) => (x, GemvInput::Cast),
            ProjIn::Rms {
                x,
                alpha,
                eps,
                rows,
            } => (x, GemvInput::Rms { alpha, eps, rows }),
            ProjIn::Silu(x) => (x, GemvInput::Silu),
        };
        return k.gemv.gemv(
            dev,
            &GemvCall {
                x,
                input,
                w: w.ptr,
                w_type: w.dtype,
                rows,
                n: w.rows,
                k: w.cols,
                y,
                accumulate,
            },
        );
    }
    if !matches!(input, ProjIn::Act(_)) {
        dev.phase(phases.input);
    }
    let x = match input {
        ProjIn::Act(x) => x,
        ProjIn::Cast(x) if act == DType::F32 => x,
        ProjIn::Cast(x) => {
            k.ew.to_bf16(dev, x, staging, rows * w.cols)?;
            staging
        }
        ProjIn::Rms {
            x,
            alpha,
            eps,
            rows: infos,
        } => {
            k.norm
                .rms_norm(dev, x, alpha, eps, w.cols, infos, rows, staging, act)?;
            staging
        }
        ProjIn::Silu(x) => {
            k.ew.silu_gate(dev, x, w.cols, rows, staging, act)?;
            staging
        }
    };
    dev.phase(phases.product);
    linear(dev, x, act, rows, w, y, DType::F32, accumulate)
}
