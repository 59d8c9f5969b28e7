//! Weights on the device: where they come from (a checkpoint, or a seeded
//! random fill for timing real shapes without one), in which precision, and
//! the GEMM that applies them.
//!
//! Invariants: a weight is read from the checkpoint exactly once (the
//! checkpoint reader refuses a second take and, at `finish`, any tensor
//! nobody took), converted on the host to the precision asked for (bf16 by
//! round-to-nearest-even, as `__float2bfloat16_rn`), and uploaded into memory
//! allocated for it alone. Norm weights and biases stay f32 whatever the
//! precision.

use crate::device::{DType, DevPtr, Device, DeviceResult, Gemm};
use crate::ops::elementwise::EwKernels;
use moshid_model::weights::Weights;

use super::GpuError;

/// A weight matrix on the device, `[rows][cols]` row-major (a PyTorch
/// `Linear` weight is `[out][in]`); vectors have `rows == 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevTensor {
    /// Start.
    pub ptr: DevPtr,
    /// Element type.
    pub dtype: DType,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
}

impl DevTensor {
    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        self.rows * self.cols * self.dtype.bytes()
    }

    /// Start of row `r`.
    pub fn row(&self, r: usize) -> DevPtr {
        self.ptr + (r * self.cols * self.dtype.bytes()) as u64
    }
}

/// How a random weight is drawn (timing models only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    /// A linear layer: uniform ±1/√fan_in, fan_in = the last dimension.
    Linear,
    /// An embedding table: uniform ±0.1.
    Embedding,
    /// A norm weight: all ones.
    Ones,
}

enum Source<'a> {
    Checkpoint(&'a mut Weights),
    Random {
        seed: u64,
        count: u64,
        ew: EwKernels,
    },
}

/// Hands out device weights by name, from one source.
pub struct WeightLoader<'a> {
    source: Source<'a>,
    bytes: usize,
}

/// bf16 bits of `x`, round to nearest even (NaN stays NaN).
pub fn bf16_bits(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

impl<'a> WeightLoader<'a> {
    /// Weights from a checkpoint.
    pub fn checkpoint(w: &'a mut Weights) -> Self {
        WeightLoader {
            source: Source::Checkpoint(w),
            bytes: 0,
        }
    }

    /// Deterministic random weights (every name gets its own stream).
    pub fn random<D: Device + ?Sized>(dev: &D, seed: u64) -> DeviceResult<Self> {
        Ok(WeightLoader {
            source: Source::Random {
                seed,
                count: 0,
                ew: EwKernels::resolve(dev)?,
            },
            bytes: 0,
        })
    }

    /// Device bytes handed out so far.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The weight `name` of `shape` (the checkpoint's shape; the device view
    /// is `[product of all but the last][last]`) in `dtype`.
    pub fn tensor<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        name: &str,
        shape: &[usize],
        dtype: DType,
        init: Init,
    ) -> Result<DevTensor, GpuError> {
        self.tensor_with(dev, name, shape, dtype, init, |_| {})
    }

    /// As [`WeightLoader::tensor`], applying `fixup` to the checkpoint's
    /// values before conversion (a loader rule such as Hibiki's `text_emb`
    /// row copy; not applied to random weights).
    pub fn tensor_with<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        name: &str,
        shape: &[usize],
        dtype: DType,
        init: Init,
        fixup: impl FnOnce(&mut [f32]),
    ) -> Result<DevTensor, GpuError> {
        let cols = *shape.last().unwrap_or(&1);
        let rows = shape.iter().rev().skip(1).product::<usize>();
        let ptr = dev.alloc(rows * cols * dtype.bytes())?;
        self.write_at(dev, name, shape, ptr, dtype, init, fixup)?;
        Ok(DevTensor {
            ptr,
            dtype,
            rows,
            cols,
        })
    }

    /// The weight `name` of `shape` written at `dst` (already allocated,
    /// e.g. one table of a stacked set), in `dtype`.
    pub fn tensor_at<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        name: &str,
        shape: &[usize],
        dst: DevPtr,
        dtype: DType,
        init: Init,
    ) -> Result<(), GpuError> {
        self.write_at(dev, name, shape, dst, dtype, init, |_| {})
    }

    /// Writes the weight `name` at `dst`: the checkpoint's values (after
    /// `fixup`) converted to `dtype`, or a random fill drawn as `init` says.
    #[allow(clippy::too_many_arguments)]
    fn write_at<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        name: &str,
        shape: &[usize],
        dst: DevPtr,
        dtype: DType,
        init: Init,
        fixup: impl FnOnce(&mut [f32]),
    ) -> Result<(), GpuError> {
        let n = shape.iter().product::<usize>();
        let cols = *shape.last().unwrap_or(&1);
        match &mut self.source {
            Source::Checkpoint(w) => {
                let mut v = w.take(name, shape)?;
                fixup(&mut v);
                upload_f32_as(dev, dst, &v, dtype)?;
            }
            Source::Random { seed, count, ew } => {
                *count += 1;
                let s = seed.wrapping_add(count.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                match (init, dtype) {
                    (Init::Ones, DType::F32) => ew.fill(dev, dst, n, 1.0)?,
                    (Init::Ones, DType::Bf16) => {
                        return Err(GpuError::Unsupported(format!(
                            "{name}: norm weights are f32"
                        )))
                    }
                    (Init::Linear, _) => {
                        ew.fill_uniform(dev, dst, dtype, n, s, 1.0 / (cols as f32).sqrt())?
                    }
                    (Init::Embedding, _) => ew.fill_uniform(dev, dst, dtype, n, s, 0.1)?,
                }
            }
        }
        self.bytes += n * dtype.bytes();
        Ok(())
    }
}

/// Uploads f32 values into `dst` as `dtype`.
pub fn upload_f32_as<D: Device + ?Sized>(
    dev: &mut D,
    dst: DevPtr,
    v: &[f32],
    dtype: DType,
) -> DeviceResult<()> {
    match dtype {
        DType::F32 => dev.upload(dst, crate::device::as_bytes(v)),
        DType::Bf16 => {
            let b: Vec<u16> = v.iter().map(|&x| bf16_bits(x)).collect();
            dev.upload(dst, crate::device::as_bytes(&b))
        }
    }
}

/// `y[rows][w.rows] (+)= x[rows][w.cols] · wᵀ`, f32 accumulation.
#[allow(clippy::too_many_arguments)]
pub fn linear<D: Device + ?Sized>(
    dev: &mut D,
    x: DevPtr,
    x_type: DType,
    rows: usize,
    w: &DevTensor,
    y: DevPtr,
    y_type: DType,
    accumulate: bool,
) -> DeviceResult<()> {
    dev.gemm(&Gemm {
        m: rows,
        n: w.rows,
        k: w.cols,
        a: x,
        a_type: x_type,
        lda: w.cols,
        b: w.ptr,
        b_type: w.dtype,
        ldb: w.cols,
        c: y,
        c_type: y_type,
        ldc: w.rows,
        alpha: 1.0,
        beta: if accumulate { 1.0 } else { 0.0 },
    })
}

/// Allocates `n` elements of `dtype` of scratch.
pub fn scratch<D: Device + ?Sized>(dev: &mut D, n: usize, dtype: DType) -> DeviceResult<DevPtr> {
    dev.alloc(n.max(1) * dtype.bytes())
}
