//! Matrix-vector products for a few rows (gemv.cu): `y (+)= x'·Wᵀ` for at
//! most [`GV_MAX_ROWS`] rows, the weights streamed once at the memory's
//! bandwidth, with the GEMM input computed on the fly from the tensor the
//! separate kernel would have read ([`GemvInput`]: as stored, cast, RMS-normed
//! or gated), so a norm or activation and its projection are one launch.
//!
//! Each output's summation order depends on K only (not on the other rows
//! of the call), and x' is bit for bit what norm.cu and elementwise.cu
//! store. The host takes a GEMV where [`GemvKernels::takes`] says so and
//! cuBLAS otherwise (model/lm/proj.rs).

use super::{dim, int};
use crate::device::{Arg, DType, DevPtr, Device, DeviceError, DeviceResult, KernelId, NULL};

/// `GV_THREADS` of gemv.cu.
pub const GV_THREADS: u32 = 256;
/// `GV_COLS` of gemv.cu: output columns per thread group.
pub const GV_COLS: usize = 4;
/// `GV_MAX_ROWS` of gemv.cu.
pub const GV_MAX_ROWS: usize = 8;
/// Rows up to which the lighter (two-row) kernels run.
const FEW_ROWS: usize = 2;

/// What a GEMV computes its input rows x' from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GemvInput {
    /// `x` `[rows][K]` in the weights' type.
    Plain,
    /// `x` `[rows][K]` f32, rounded to the weights' type (bf16 weights only).
    Cast,
    /// `x` `[rows][K]` f32 (the residual stream), RMS-normed with the gains
    /// `alpha` (`[K]` f32) and `eps`; rows whose `RowInfo` at `rows` (NULL:
    /// all active) is inactive give zeros, as norm.cu's `rms_norm`.
    Rms {
        /// Gains.
        alpha: DevPtr,
        /// Epsilon.
        eps: f32,
        /// `RowInfo[rows]` or NULL.
        rows: DevPtr,
    },
    /// `x` `[rows][2K]` f32 (gate, then value), `silu(gate) · value` as
    /// elementwise.cu's `silu_gate`.
    Silu,
}

impl GemvInput {
    fn index(&self) -> usize {
        match self {
            GemvInput::Plain => 0,
            GemvInput::Cast => 1,
            GemvInput::Rms { .. } => 2,
            GemvInput::Silu => 3,
        }
    }
}

/// One product: `y` `[rows][n]` f32 (+)= x' `[rows][k]` · `w` `[n][k]`ᵀ.
#[derive(Debug, Clone, Copy)]
pub struct GemvCall {
    /// The input tensor (see [`GemvInput`]).
    pub x: DevPtr,
    /// How x' comes from `x`.
    pub input: GemvInput,
    /// Weights `[n][k]`.
    pub w: DevPtr,
    /// Their type (and x''s).
    pub w_type: DType,
    /// Rows (≤ [`GV_MAX_ROWS`]).
    pub rows: usize,
    /// Output columns.
    pub n: usize,
    /// Reduction length (a multiple of 8).
    pub k: usize,
    /// Output, `[rows][n]` f32.
    pub y: DevPtr,
    /// Add into `y` instead of overwriting it.
    pub accumulate: bool,
}

/// The GEMV kernels of one device: `[bf16, f32][input][few, many rows]`
/// (no f32 cast: a cast to f32 is the plain kernel).
#[derive(Debug, Clone, Copy)]
pub struct GemvKernels {
    ids: [[[Option<KernelId>; 2]; 4]; 2],
}

impl GemvKernels {
    /// Resolves the kernels.
    pub fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        let mut ids = [[[None; 2]; 4]; 2];
        for (t, ty) in ["bf16", "f32"].iter().enumerate() {
            for (i, input) in ["", "_cast", "_rms", "_silu"].iter().enumerate() {
                if *ty == "f32" && *input == "_cast" {
                    continue;
                }
                for (r, rows) in ["x2", "x8"].iter().enumerate() {
                    ids[t][i][r] = Some(dev.kernel(&format!("gemv_{ty}{input}_{rows}"))?);
                }
            }
        }
        Ok(GemvKernels { ids })
    }

    /// The thread group of a product over `k` terms of `t`: the power of two
    /// that covers one pass over K in 16-byte chunks, between 32 and
    /// [`GV_THREADS`] (a function of K only, so the summation order is).
    pub fn group(k: usize, t: DType) -> u32 {
        let chunks = k.div_ceil(16 / t.bytes());
        chunks.next_power_of_two().clamp(32, GV_THREADS as usize) as u32
    }

    /// Whether a product of `rows` rows over `k` terms runs here (few rows,
    /// 16-byte aligned rows).
    pub fn takes(rows: usize, k: usize) -> bool {
        (1..=GV_MAX_ROWS).contains(&rows) && k > 0 && k.is_multiple_of(8)
    }

    /// Issues one product.
    pub fn gemv<D: Device + ?Sized>(&self, dev: &mut D, c: &GemvCall) -> DeviceResult<()> {
        const WHAT: &str = "gemv";
        if !Self::takes(c.rows, c.k) || c.n == 0 {
            return Err(DeviceError::shape(
                WHAT,
                format!("{} rows × {} terms × {} columns", c.rows, c.k, c.n),
            ));
        }
        if c.x == NULL || c.w == NULL || c.y == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        let input = match (c.input, c.w_type) {
            // Rounding f32 to f32 is the plain product.
            (GemvInput::Cast, DType::F32) => GemvInput::Plain,
            (i, _) => i,
        };
        let t = match c.w_type {
            DType::Bf16 => 0,
            DType::F32 => 1,
        };
        let r = usize::from(c.rows > FEW_ROWS);
        let kernel = self.ids[t][input.index()][r]
            .ok_or_else(|| DeviceError::shape(WHAT, "no such kernel"))?;
        let (alpha, eps, rows) = match input {
            GemvInput::Rms { alpha, eps, rows } => {
                if alpha == NULL {
                    return Err(DeviceError::shape(WHAT, "null norm gains"));
                }
                (alpha, eps, rows)
            }
            _ => (NULL, 0.0, NULL),
        };
        let group = Self::group(c.k, c.w_type);
        let cols = GV_COLS * (GV_THREADS / group) as usize;
        dev.launch(
            kernel,
            (dim(WHAT, c.n.div_ceil(cols))?, 1, 1),
            GV_THREADS,
            &[
                Arg::Ptr(c.x),
                Arg::Ptr(c.w),
                Arg::Ptr(alpha),
                Arg::Ptr(rows),
                Arg::F32(eps),
                Arg::I32(int(WHAT, c.rows)?),
                Arg::I32(int(WHAT, c.n)?),
                Arg::I32(int(WHAT, c.k)?),
                Arg::I32(group as i32),
                Arg::I32(c.accumulate as i32),
                Arg::Ptr(c.y),
            ],
        )
    }
}
