//! Weights on the device: where they come from (a checkpoint, or a seeded
//! random fill for timing real shapes without one), in which precision, and
//! the GEMM that applies them.
//!
//! A checkpoint's tensor goes from the mapped file straight into the pinned
//! [`Staging`] buffer, converted chunk by chunk on the way (a bf16 tensor
//! loaded as bf16 is a plain copy), and from there to the device by DMA: no
//! host copy of a whole tensor is made, except for the few tensors a loader
//! rule rewrites (`fixup`).
//!
//! Invariants: a weight is taken from the checkpoint once (`finish` then
//! refuses any tensor nobody took), converted on the host to the precision
//! asked for (bf16 by round-to-nearest-even, as `__float2bfloat16_rn`), and
//! written into memory allocated for it alone or into its place in a stacked
//! set. Norm weights and biases stay f32 whatever the precision.

use crate::device::{DType, DevPtr, Device, DeviceResult, Gemm};
use crate::ops::elementwise::EwKernels;
use moshid_model::weights::{RawDtype, RawTensor, Weights};

use super::staging::Staging;
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
    /// A norm bias: all zeros.
    Zeros,
}

enum Source<'a> {
    Checkpoint {
        weights: &'a mut Weights,
        /// Made at the first tensor (it needs the device).
        staging: Option<Staging>,
    },
    Random {
        seed: u64,
        count: u64,
        ew: EwKernels,
    },
}

/// A loader rule rewriting a checkpoint tensor's values before upload.
type Fixup<'f> = dyn FnMut(&mut [f32]) + 'f;

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
            source: Source::Checkpoint {
                weights: w,
                staging: None,
            },
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
        self.place(dev, name, shape, dtype, init, None)
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
        mut fixup: impl FnMut(&mut [f32]),
    ) -> Result<DevTensor, GpuError> {
        self.place(dev, name, shape, dtype, init, Some(&mut fixup))
    }

    fn place<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        name: &str,
        shape: &[usize],
        dtype: DType,
        init: Init,
        fixup: Option<&mut Fixup<'_>>,
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

    /// Accounts for a checkpoint tensor the model never uses (checked, not
    /// read; nothing for random weights).
    pub fn skip(&mut self, name: &str, shape: &[usize]) -> Result<(), GpuError> {
        if let Source::Checkpoint { weights, .. } = &mut self.source {
            weights.skip(name, shape)?;
        }
        Ok(())
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
        self.write_at(dev, name, shape, dst, dtype, init, None)
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
        fixup: Option<&mut Fixup<'_>>,
    ) -> Result<(), GpuError> {
        let n = shape.iter().product::<usize>();
        let cols = *shape.last().unwrap_or(&1);
        match &mut self.source {
            Source::Checkpoint { weights, staging } => {
                let staging = Staging::in_slot(staging, dev)?;
                let raw = weights.take_raw(name, shape)?;
                match fixup {
                    None => upload_converted(dev, staging, dst, raw, dtype)?,
                    Some(fixup) => {
                        let mut fixed: Vec<f32> =
                            (0..raw.numel()).map(|i| raw.get_f32(i)).collect();
                        fixup(&mut fixed);
                        let src = RawTensor {
                            dtype: RawDtype::F32,
                            bytes: crate::device::as_bytes(&fixed),
                        };
                        upload_converted(dev, staging, dst, src, dtype)?;
                    }
                }
            }
            Source::Random { seed, count, ew } => {
                *count += 1;
                let s = seed.wrapping_add(count.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                match (init, dtype) {
                    (Init::Ones, DType::F32) => ew.fill(dev, dst, n, 1.0)?,
                    (Init::Zeros, DType::F32) => ew.fill(dev, dst, n, 0.0)?,
                    (Init::Ones | Init::Zeros, DType::Bf16) => {
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

/// Writes `src` at `dst` as `dtype` through `staging`, converting each
/// chunk from the stored type on the way (a copy when the types agree).
pub fn upload_converted<D: Device + ?Sized>(
    dev: &mut D,
    staging: &mut Staging,
    dst: DevPtr,
    src: RawTensor<'_>,
    dtype: DType,
) -> DeviceResult<()> {
    let out_bytes = dtype.bytes();
    staging.upload(dev, dst, src.numel() * out_bytes, |offset, out| {
        convert(src, offset / out_bytes, dtype, out)
    })
}

/// Writes values `first ..` of `src` into `out` (`out.len() / dtype.bytes()`
/// of them) as little-endian `dtype`.
pub fn convert(src: RawTensor<'_>, first: usize, dtype: DType, out: &mut [u8]) {
    let same = matches!(
        (src.dtype, dtype),
        (RawDtype::F32, DType::F32) | (RawDtype::Bf16, DType::Bf16)
    );
    if same {
        let start = first * src.dtype.bytes();
        out.copy_from_slice(&src.bytes[start..start + out.len()]);
        return;
    }
    let n = out.len() / dtype.bytes();
    match dtype {
        DType::F32 => {
            for (i, o) in out.chunks_exact_mut(4).enumerate().take(n) {
                o.copy_from_slice(&src.get_f32(first + i).to_le_bytes());
            }
        }
        DType::Bf16 => {
            for (i, o) in out.chunks_exact_mut(2).enumerate().take(n) {
                o.copy_from_slice(&bf16_bits(src.get_f32(first + i)).to_le_bytes());
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::emu::EmuDevice;
    use crate::model::staging::STAGING_CHUNK_BYTES;
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;

    fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|x| f(*x)).collect()
    }

    #[test]
    fn conversion_rounds_like_the_device_and_copies_when_types_agree() {
        // 1 + 2⁻⁸ is a tie between two bf16 values: even (1.0) wins; the
        // next float above rounds up.
        let tie = 1.0f32 + 2f32.powi(-8);
        let above = f32::from_bits(tie.to_bits() + 1);
        let vals = [tie, above, -0.0, 3.0e38, 1.0e-40, f32::INFINITY];
        let f32_bytes = le(&vals, f32::to_le_bytes);
        let src = RawTensor {
            dtype: RawDtype::F32,
            bytes: &f32_bytes,
        };
        let mut out = vec![0u8; 2 * vals.len()];
        convert(src, 0, DType::Bf16, &mut out);
        let expect = le(&vals, |x| half::bf16::from_f32(x).to_bits().to_le_bytes());
        assert_eq!(out, expect);
        assert_eq!(&out[..4], &[0x80, 0x3f, 0x81, 0x3f]);
        // From the middle of a tensor, as a chunk of a staged upload is.
        let mut out = vec![0u8; 8];
        convert(src, 2, DType::F32, &mut out);
        assert_eq!(out, f32_bytes[8..16]);
        // bf16 → bf16 is the stored bytes; bf16 → f32 and f16 widen exactly.
        let bf = le(&[0x3f81u16, 0xc0a0], u16::to_le_bytes);
        let src = RawTensor {
            dtype: RawDtype::Bf16,
            bytes: &bf,
        };
        let mut out = vec![0u8; 2];
        convert(src, 1, DType::Bf16, &mut out);
        assert_eq!(out, bf[2..]);
        let mut out = vec![0u8; 8];
        convert(src, 0, DType::F32, &mut out);
        assert_eq!(out, le(&[1.0078125f32, -5.0], f32::to_le_bytes));
        let hf = le(&[half::f16::from_f32(0.333).to_bits()], u16::to_le_bytes);
        let src = RawTensor {
            dtype: RawDtype::F16,
            bytes: &hf,
        };
        let mut out = vec![0u8; 2];
        convert(src, 0, DType::Bf16, &mut out);
        let wide = half::f16::from_f32(0.333).to_f32();
        assert_eq!(out, half::bf16::from_f32(wide).to_bits().to_le_bytes());
    }

    /// A checkpoint tensor larger than two staging chunks, stored in bf16
    /// and in f32, reaches the device whole in both precisions; a fixup
    /// sees the stored values.
    #[test]
    fn checkpoint_tensors_larger_than_the_staging_buffer_arrive_whole() {
        // Several chunks each way, and a short last chunk.
        let n = 5 * (STAGING_CHUNK_BYTES / 5 + 2_469);
        let vals: Vec<f32> = (0..n).map(|i| ((i % 1999) as f32 - 999.0) / 7.0).collect();
        let bf: Vec<u16> = vals.iter().map(|&x| bf16_bits(x)).collect();
        let bf_bytes = le(&bf, u16::to_le_bytes);
        let f_bytes = le(&vals, f32::to_le_bytes);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let views = vec![
            (
                "b",
                TensorView::new(Dtype::BF16, vec![n / 5, 5], &bf_bytes).unwrap(),
            ),
            (
                "f",
                TensorView::new(Dtype::F32, vec![n / 5, 5], &f_bytes).unwrap(),
            ),
            (
                "g",
                TensorView::new(Dtype::F32, vec![3], &f_bytes[..12]).unwrap(),
            ),
        ];
        safetensors::serialize_to_file(views, None, &path).unwrap();
        let mut w = Weights::open(&path).unwrap();
        let mut dev = EmuDevice::new();
        let shape = [n / 5, 5];
        let mut loader = WeightLoader::checkpoint(&mut w);
        let b = loader
            .tensor(&mut dev, "b", &shape, DType::F32, Init::Linear)
            .unwrap();
        let f = loader
            .tensor(&mut dev, "f", &shape, DType::Bf16, Init::Linear)
            .unwrap();
        let g = loader
            .tensor_with(&mut dev, "g", &[3], DType::F32, Init::Ones, |v| {
                v[1] = v[0] * 2.0
            })
            .unwrap();
        assert_eq!(loader.bytes(), n * 4 + n * 2 + 12);
        drop(loader);
        w.finish().unwrap();
        let mut back = vec![0u8; n * 4];
        dev.download(b.ptr, &mut back).unwrap();
        let widened: Vec<f32> = bf
            .iter()
            .map(|&h| f32::from_bits((h as u32) << 16))
            .collect();
        assert!(back == le(&widened, f32::to_le_bytes), "bf16 → f32");
        let mut back = vec![0u8; n * 2];
        dev.download(f.ptr, &mut back).unwrap();
        assert!(back == bf_bytes, "f32 → bf16");
        let mut back = vec![0u8; 12];
        dev.download(g.ptr, &mut back).unwrap();
        assert_eq!(
            back,
            le(&[vals[0], vals[0] * 2.0, vals[2]], f32::to_le_bytes)
        );
    }
}
