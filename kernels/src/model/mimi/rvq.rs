//! Mimi's split residual vector quantizer on the device (CPU reference:
//! model/src/mimi/quantizer.rs): `rvq_first` (one codebook) and `rvq_rest`
//! (the others) each quantize the latent after their own 1×1 input
//! projection (a GEMM); decoding sums each part's codebook vectors, applies
//! its output projection and adds the two parts (the second GEMM
//! accumulates into the first's output).
//!
//! Device layout (quantizer.cu): per part, `books[c][bins][dq]` with
//! `e = embedding_sum / max(cluster_usage, 1e-5)` and `norms[c][bins] = ‖e‖²`
//! summed in index order in f32 on the host, as the reference.
//!
//! Invariants: every stored codebook tensor is taken (as the CPU loader
//! does) but only the used ones are uploaded; codes of inactive steps are
//! not written; decode's inactive rows are zeros.

use super::transformer::linear;
use super::weights::{Kind, Mem, Source};
use super::Kernels;
use crate::device::{DevPtr, Device, DeviceResult, NULL};
use crate::model::GpuError;
use crate::ops::rvq::{RvqShape, RVQ_MAX_DIM};
use moshid_model::config::QuantizerConfig;
use moshid_model::weights::TensorSpec;

/// The official `EuclideanCodebook` epsilon.
const CODEBOOK_EPS: f32 = 1e-5;

#[derive(Debug, Clone)]
struct Part {
    prefix: String,
    stored: usize,
    used: usize,
    col0: usize,
    in_proj: DevPtr,
    out_proj: DevPtr,
    books: DevPtr,
    norms: DevPtr,
}

/// The split RVQ with `used` codebooks.
#[derive(Debug, Clone)]
pub(crate) struct GpuRvq {
    d: usize,
    dq: usize,
    bins: usize,
    used: usize,
    parts: [Part; 2],
}

/// The scratch of one call: `xq`, `[n][dq]` (projected latents on encode,
/// codebook sums on decode), and `part`, the encode's partial minima
/// ([`GpuRvq::part_bytes`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RvqBufs {
    pub(crate) xq: DevPtr,
    pub(crate) part: DevPtr,
}

impl GpuRvq {
    /// A skeleton for `cfg` using `used` codebooks.
    pub(crate) fn new(cfg: &QuantizerConfig, used: usize) -> Result<Self, GpuError> {
        if used == 0 || used > cfg.n_q {
            return Err(GpuError::Unsupported(format!(
                "num_codebooks must be between 1 and the {} stored, got {used}",
                cfg.n_q
            )));
        }
        if cfg.dimension > RVQ_MAX_DIM {
            return Err(GpuError::Unsupported(format!(
                "codebook width {} > {RVQ_MAX_DIM}",
                cfg.dimension
            )));
        }
        let part = |name: &str, stored, used, col0| Part {
            prefix: format!("quantizer.{name}"),
            stored,
            used,
            col0,
            in_proj: NULL,
            out_proj: NULL,
            books: NULL,
            norms: NULL,
        };
        Ok(GpuRvq {
            d: cfg.input_dimension,
            dq: cfg.dimension,
            bins: cfg.bins,
            used,
            parts: [
                part("rvq_first", 1, 1, 0),
                part("rvq_rest", cfg.n_q - 1, used - 1, 1),
            ],
        })
    }

    /// Codebooks used per frame.
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    /// Scratch floats of `xq` for `n` steps.
    pub(crate) fn need(&self, n: usize) -> usize {
        n * self.dq
    }

    /// Scratch bytes of `part` for `n` steps (both parts share it).
    pub(crate) fn part_bytes(&self, n: usize) -> usize {
        self.shape(&self.parts[0], 1).part_bytes(n)
    }

    pub(crate) fn specs(&self, out: &mut Vec<TensorSpec>) {
        for r in &self.parts {
            out.push(TensorSpec::new(
                format!("{}.input_proj.weight", r.prefix),
                &[self.dq, self.d, 1],
            ));
            out.push(TensorSpec::new(
                format!("{}.output_proj.weight", r.prefix),
                &[self.d, self.dq, 1],
            ));
            for i in 0..r.stored {
                let p = format!("{}.vq.layers.{i}._codebook", r.prefix);
                out.push(TensorSpec::new(format!("{p}._initialized"), &[1]));
                out.push(TensorSpec::new(format!("{p}.cluster_usage"), &[self.bins]));
                out.push(TensorSpec::new(
                    format!("{p}.embedding_sum"),
                    &[self.bins, self.dq],
                ));
            }
        }
    }

    pub(crate) fn load<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        mem: &mut Mem,
        src: &mut dyn Source,
    ) -> Result<(), GpuError> {
        let (d, dq, bins) = (self.d, self.dq, self.bins);
        for r in &mut self.parts {
            let w = src.take(&format!("{}.input_proj.weight", r.prefix), &[dq, d, 1])?;
            r.in_proj = mem.upload_f32(dev, Kind::Weights, &w)?;
            let w = src.take(&format!("{}.output_proj.weight", r.prefix), &[d, dq, 1])?;
            r.out_proj = mem.upload_f32(dev, Kind::Weights, &w)?;
            let mut books = vec![0.0f32; r.used * bins * dq];
            let mut norms = vec![0.0f32; r.used * bins];
            for i in 0..r.stored {
                let p = format!("{}.vq.layers.{i}._codebook", r.prefix);
                src.take(&format!("{p}._initialized"), &[1])?;
                let usage = src.take(&format!("{p}.cluster_usage"), &[bins])?;
                let sum = src.take(&format!("{p}.embedding_sum"), &[bins, dq])?;
                if i >= r.used {
                    continue;
                }
                for b in 0..bins {
                    let u = usage[b].max(CODEBOOK_EPS);
                    let mut n2 = 0.0f32;
                    for k in 0..dq {
                        let e = sum[b * dq + k] / u;
                        books[(i * bins + b) * dq + k] = e;
                        n2 += e * e;
                    }
                    norms[i * bins + b] = n2;
                }
            }
            if r.used > 0 {
                r.books = mem.upload_f32(dev, Kind::Weights, &books)?;
                r.norms = mem.upload_f32(dev, Kind::Weights, &norms)?;
            }
        }
        Ok(())
    }

    fn shape(&self, r: &Part, codes_stride: usize) -> RvqShape {
        RvqShape {
            n_books: r.used,
            dq: self.dq,
            bins: self.bins,
            codes_stride,
            col0: r.col0,
        }
    }

    /// Codes of the latents `latent` (`[n][d]`) into `codes[j][0..used]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn encode<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        k: &Kernels,
        n: usize,
        steps: DevPtr,
        latent: DevPtr,
        codes: DevPtr,
        codes_stride: usize,
        b: &RvqBufs,
    ) -> DeviceResult<()> {
        for r in self.parts.iter().filter(|r| r.used > 0) {
            linear(dev, latent, r.in_proj, n, self.dq, self.d, b.xq, false)?;
            let s = self.shape(r, codes_stride);
            k.rvq
                .encode(dev, &s, n, b.xq, r.books, r.norms, steps, b.part, codes)?;
        }
        Ok(())
    }

    /// Latents `out` (`[n][d]`) of `codes[j][0..used]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decode<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        k: &Kernels,
        n: usize,
        steps: DevPtr,
        codes: DevPtr,
        codes_stride: usize,
        out: DevPtr,
        b: &RvqBufs,
    ) -> DeviceResult<()> {
        for (i, r) in self.parts.iter().filter(|r| r.used > 0).enumerate() {
            let s = self.shape(r, codes_stride);
            k.rvq
                .decode(dev, &s, n, codes, r.books, steps, b.xq, NULL)?;
            linear(dev, b.xq, r.out_proj, n, self.d, self.dq, out, i > 0)?;
        }
        Ok(())
    }
}
