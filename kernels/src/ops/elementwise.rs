//! Element-wise launches (elementwise.cu): gating, activations, residual sums
//! and the f32 → bf16 cast, as grid-stride loops over whole buffers.

use super::{ew_grid, int, EW_THREADS};
use crate::device::{Arg, DType, DevPtr, Device, DeviceError, DeviceResult, KernelId, NULL};

/// The element-wise kernels of one device.
#[derive(Debug, Clone, Copy)]
pub struct EwKernels {
    silu_bf16: KernelId,
    silu_f32: KernelId,
    gelu: KernelId,
    elu: KernelId,
    add_scaled: KernelId,
    add: KernelId,
    to_bf16: KernelId,
    uniform_f32: KernelId,
    uniform_bf16: KernelId,
    fill: KernelId,
}

fn nonnull(what: &'static str, ptrs: &[DevPtr]) -> DeviceResult<()> {
    if ptrs.contains(&NULL) {
        return Err(DeviceError::shape(what, "null operand"));
    }
    Ok(())
}

impl EwKernels {
    /// Resolves the kernels.
    pub fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(EwKernels {
            silu_bf16: dev.kernel("silu_gate_bf16")?,
            silu_f32: dev.kernel("silu_gate_f32")?,
            gelu: dev.kernel("gelu_f32")?,
            elu: dev.kernel("elu_f32")?,
            add_scaled: dev.kernel("add_scaled_f32")?,
            add: dev.kernel("add_f32")?,
            to_bf16: dev.kernel("f32_to_bf16")?,
            uniform_f32: dev.kernel("fill_uniform_f32")?,
            uniform_bf16: dev.kernel("fill_uniform_bf16")?,
            fill: dev.kernel("fill_f32")?,
        })
    }

    /// `act[r][j] = silu(ff[r][j]) · ff[r][hidden + j]` over `rows` rows,
    /// `act` in `out` precision.
    pub fn silu_gate<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        ff: DevPtr,
        hidden: usize,
        rows: usize,
        act: DevPtr,
        out: DType,
    ) -> DeviceResult<()> {
        nonnull("silu_gate", &[ff, act])?;
        let k = match out {
            DType::Bf16 => self.silu_bf16,
            DType::F32 => self.silu_f32,
        };
        dev.launch(
            k,
            ew_grid(rows * hidden),
            EW_THREADS,
            &[
                Arg::Ptr(ff),
                Arg::I32(int("silu_gate", hidden)?),
                Arg::I32(int("silu_gate", rows)?),
                Arg::Ptr(act),
            ],
        )
    }

    /// `x = gelu(x)` (erf form) over `n` floats.
    pub fn gelu<D: Device + ?Sized>(&self, dev: &mut D, x: DevPtr, n: usize) -> DeviceResult<()> {
        nonnull("gelu", &[x])?;
        dev.launch(
            self.gelu,
            ew_grid(n),
            EW_THREADS,
            &[Arg::Ptr(x), Arg::U64(n as u64)],
        )
    }

    /// `y = elu(x)` over `n` floats (`y` may be `x`).
    pub fn elu<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        x: DevPtr,
        y: DevPtr,
        n: usize,
    ) -> DeviceResult<()> {
        nonnull("elu", &[x, y])?;
        dev.launch(
            self.elu,
            ew_grid(n),
            EW_THREADS,
            &[Arg::Ptr(x), Arg::Ptr(y), Arg::U64(n as u64)],
        )
    }

    /// `x[e] += scale[e % width] · u[e]` over `n` floats.
    pub fn add_scaled<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        x: DevPtr,
        u: DevPtr,
        scale: DevPtr,
        width: usize,
        n: usize,
    ) -> DeviceResult<()> {
        nonnull("add_scaled", &[x, u, scale])?;
        dev.launch(
            self.add_scaled,
            ew_grid(n),
            EW_THREADS,
            &[
                Arg::Ptr(x),
                Arg::Ptr(u),
                Arg::Ptr(scale),
                Arg::I32(int("add_scaled", width)?),
                Arg::U64(n as u64),
            ],
        )
    }

    /// `x += u` over `n` floats.
    pub fn add<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        x: DevPtr,
        u: DevPtr,
        n: usize,
    ) -> DeviceResult<()> {
        nonnull("add", &[x, u])?;
        dev.launch(
            self.add,
            ew_grid(n),
            EW_THREADS,
            &[Arg::Ptr(x), Arg::Ptr(u), Arg::U64(n as u64)],
        )
    }

    /// `y = bf16(x)` over `n` values, round to nearest even.
    pub fn to_bf16<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        x: DevPtr,
        y: DevPtr,
        n: usize,
    ) -> DeviceResult<()> {
        nonnull("f32_to_bf16", &[x, y])?;
        dev.launch(
            self.to_bf16,
            ew_grid(n),
            EW_THREADS,
            &[Arg::Ptr(x), Arg::Ptr(y), Arg::U64(n as u64)],
        )
    }

    /// `n` deterministic pseudo-random values uniform in [−scale, scale)
    /// (random-weight models for timing).
    pub fn fill_uniform<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        y: DevPtr,
        dtype: DType,
        n: usize,
        seed: u64,
        scale: f32,
    ) -> DeviceResult<()> {
        nonnull("fill_uniform", &[y])?;
        let k = match dtype {
            DType::F32 => self.uniform_f32,
            DType::Bf16 => self.uniform_bf16,
        };
        dev.launch(
            k,
            ew_grid(n),
            EW_THREADS,
            &[
                Arg::Ptr(y),
                Arg::U64(n as u64),
                Arg::U64(seed),
                Arg::F32(scale),
            ],
        )
    }

    /// `y = value` over `n` floats.
    pub fn fill<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        y: DevPtr,
        n: usize,
        value: f32,
    ) -> DeviceResult<()> {
        nonnull("fill_f32", &[y])?;
        dev.launch(
            self.fill,
            ew_grid(n),
            EW_THREADS,
            &[Arg::Ptr(y), Arg::U64(n as u64), Arg::F32(value)],
        )
    }
}
