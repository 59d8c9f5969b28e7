//! Mimi on a [`Device`]: the streaming codec as launch sequences over the
//! kernels of conv.cu, quantizer.cu, norm.cu, attention.cu and
//! elementwise.cu, in f32 (as the official server runs it), batched over
//! slot-steps. CPU reference: `moshid_model::mimi::Mimi`, whose loading
//! rules, block order and numerics this follows.
//!
//! - encode: SEANet encoder (`hop` samples → one latent step) → encoder
//!   transformer (`stride` steps per frame) → learnt down-sampling conv
//!   (replicate-padded) → split RVQ codes;
//! - decode: split RVQ latent → learnt depthwise up-sampling transposed conv
//!   → decoder transformer → SEANet decoder.
//!
//! Files: `conv.rs` (one streaming conv / transposed conv with its state),
//! `seanet.rs`, `transformer.rs`, `rvq.rs`, `weights.rs` (tensor sources,
//! counted device allocations).
//!
//! Invariants:
//! - Everything is allocated by [`GpuMimi::load`] / [`GpuMimi::random`]:
//!   weights, the per-slot state of `max_slots` slots (conv histories,
//!   transposed-conv tails, replicate-pad flags, KV rings, stream positions),
//!   and scratch for `max_rows` slot-steps per call. Encode and decode share
//!   the scratch (they are ordered on the device's one stream).
//! - [`GpuMimi::encode`] / [`GpuMimi::decode`] never synchronize, never read
//!   anything back and issue launches that depend only on `rows` and
//!   pointers, so they can be captured in a graph and replayed frame after
//!   frame: the transformers' positions live on the device and are advanced
//!   there.
//! - Only active slot-steps read or write any state; active steps of one
//!   call name distinct slots. Inactive rows flow through as zeros; their
//!   codes are not written, their decoded PCM rows are zeros.
//! - A `GpuMimi` belongs to the device it was loaded on.

mod conv;
mod rvq;
mod seanet;
mod transformer;
mod weights;

use super::GpuError;
use crate::device::{DevPtr, Device, DeviceError, DeviceResult, Phase};
use crate::ops::attention::{AttnKernels, ATT_MAX_HEAD_DIM, ATT_VEC};
use crate::ops::conv::{ConvKernels, ConvShape, ConvTrShape};
use crate::ops::elementwise::EwKernels;
use crate::ops::norm::NormKernels;
use crate::ops::rvq::RvqKernels;
use conv::{ConvAct, GpuConv, GpuConvTr};
use moshid_model::config::MimiConfig;
use moshid_model::weights::{TensorSpec, Weights};
use rvq::{GpuRvq, RvqBufs};
use seanet::{GpuSeanet, SeanetBufs};
use transformer::{GpuTransformer, RowsKernel, TransformerBufs};
use weights::{Kind, Mem, RandomSource, Source};

/// Device memory of a [`GpuMimi`], in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MimiMemory {
    /// Weights (and constants).
    pub weights: usize,
    /// Streaming state of one slot.
    pub state_per_slot: usize,
    /// Scratch for `max_rows` slot-steps.
    pub scratch: usize,
}

/// The kernels Mimi launches, resolved once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kernels {
    pub(crate) conv: ConvKernels,
    pub(crate) rvq: RvqKernels,
    pub(crate) norm: NormKernels,
    pub(crate) attn: AttnKernels,
    pub(crate) ew: EwKernels,
    pub(crate) rows: RowsKernel,
}

impl Kernels {
    fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(Kernels {
            conv: ConvKernels::resolve(dev)?,
            rvq: RvqKernels::resolve(dev)?,
            norm: NormKernels::resolve(dev)?,
            attn: AttnKernels::resolve(dev)?,
            ew: EwKernels::resolve(dev)?,
            rows: RowsKernel::resolve(dev)?,
        })
    }
}

/// Mimi on the device: weights, per-slot state for `max_slots` slots and
/// scratch for `max_rows` slot-steps per call.
#[derive(Debug, Clone)]
pub struct GpuMimi {
    frame_samples: usize,
    stride: usize,
    max_slots: usize,
    max_rows: usize,
    k: Kernels,
    encoder: GpuSeanet,
    encoder_transformer: GpuTransformer,
    downsample: Option<GpuConv>,
    quantizer: GpuRvq,
    upsample: Option<GpuConvTr>,
    decoder_transformer: GpuTransformer,
    decoder: GpuSeanet,
    seanet_bufs: SeanetBufs,
    tr_bufs: TransformerBufs,
    rvq_bufs: RvqBufs,
    /// A device i32 holding 1 (the replicate-pad flag of a fresh slot).
    one: DevPtr,
    memory: MimiMemory,
}

/// The architecture of `cfg` without device memory.
struct Skeleton {
    encoder: GpuSeanet,
    encoder_transformer: GpuTransformer,
    downsample: Option<GpuConv>,
    quantizer: GpuRvq,
    upsample: Option<GpuConvTr>,
    decoder_transformer: GpuTransformer,
    decoder: GpuSeanet,
}

impl Skeleton {
    fn new(cfg: &MimiConfig, n_q: usize) -> Result<Self, GpuError> {
        let stride = cfg.downsample_stride();
        let dim = cfg.seanet.dimension;
        let tr = &cfg.transformer;
        if tr.num_heads == 0 || !tr.d_model.is_multiple_of(tr.num_heads) {
            return Err(GpuError::Unsupported(
                "d_model not divisible by num_heads".into(),
            ));
        }
        let hd = tr.d_model / tr.num_heads;
        if !hd.is_multiple_of(ATT_VEC) || hd > ATT_MAX_HEAD_DIM || tr.context == 0 {
            return Err(GpuError::Unsupported(format!(
                "transformer head width {hd} (a multiple of {ATT_VEC}, ≤ {ATT_MAX_HEAD_DIM}) and context {}",
                tr.context
            )));
        }
        if cfg.channels != 1 || cfg.seanet.channels != 1 || tr.d_model != dim {
            return Err(GpuError::Unsupported(
                "mono audio and d_model = seanet.dimension only".into(),
            ));
        }
        let downsample = (stride > 1).then(|| {
            let s = ConvShape {
                c_in: dim,
                c_out: dim,
                kernel: 2 * stride,
                stride,
                dilation: 1,
            };
            GpuConv::new("downsample.conv.conv.conv".into(), s, false, true)
        });
        let upsample = (stride > 1).then(|| {
            let s = ConvTrShape {
                c_in: dim,
                c_out: dim,
                kernel: 2 * stride,
                stride,
                depthwise: true,
            };
            GpuConvTr::new("upsample.convtr.convtr.convtr".into(), s, false)
        });
        Ok(Skeleton {
            encoder: GpuSeanet::encoder(&cfg.seanet),
            encoder_transformer: GpuTransformer::new("encoder_transformer", tr),
            downsample,
            quantizer: GpuRvq::new(&cfg.quantizer, n_q)?,
            upsample,
            decoder_transformer: GpuTransformer::new("decoder_transformer", tr),
            decoder: GpuSeanet::decoder(&cfg.seanet),
        })
    }
}

fn shape_err(what: &'static str, why: String) -> DeviceError {
    DeviceError::Shape { what, why }
}

impl GpuMimi {
    /// Uploads the weights (tensor names and loading rules as the CPU
    /// `moshid_model::mimi::Mimi::load`, through [`Weights::take`]) using the
    /// first `n_q` codebooks, and allocates every state and scratch buffer.
    /// The caller checks with `Weights::finish` that every tensor was used.
    pub fn load<D: Device>(
        dev: &mut D,
        cfg: &MimiConfig,
        weights: &mut Weights,
        n_q: usize,
        max_slots: usize,
        max_rows: usize,
    ) -> Result<GpuMimi, GpuError> {
        Self::build(dev, cfg, weights, n_q, max_slots, max_rows)
    }

    /// The same with deterministic random weights (seeded by `seed`, a
    /// tensor's values depending only on the seed and its name), scaled so
    /// that activations stay finite: for timing the real shape without a
    /// checkpoint.
    pub fn random<D: Device>(
        dev: &mut D,
        cfg: &MimiConfig,
        n_q: usize,
        max_slots: usize,
        max_rows: usize,
        seed: u64,
    ) -> Result<GpuMimi, GpuError> {
        Self::build(
            dev,
            cfg,
            &mut RandomSource::new(seed),
            n_q,
            max_slots,
            max_rows,
        )
    }

    /// Every tensor (name and shape) [`GpuMimi::load`] takes for `cfg`: the
    /// same set as `moshid_model::mimi::Mimi::tensor_specs`.
    pub fn tensor_specs(cfg: &MimiConfig) -> Result<Vec<TensorSpec>, GpuError> {
        let m = Skeleton::new(cfg, 1)?;
        let mut out = Vec::new();
        m.encoder.specs(&mut out);
        m.decoder.specs(&mut out);
        m.encoder_transformer.specs(&mut out);
        m.decoder_transformer.specs(&mut out);
        if let Some(d) = &m.downsample {
            d.specs(&mut out);
        }
        if let Some(u) = &m.upsample {
            u.specs(&mut out);
        }
        m.quantizer.specs(&mut out);
        Ok(out)
    }

    fn build<D: Device>(
        dev: &mut D,
        cfg: &MimiConfig,
        src: &mut dyn Source,
        n_q: usize,
        max_slots: usize,
        max_rows: usize,
    ) -> Result<GpuMimi, GpuError> {
        if max_slots == 0 || max_rows == 0 {
            return Err(GpuError::Unsupported(
                "max_slots and max_rows must be positive".into(),
            ));
        }
        let k = Kernels::resolve(dev)?;
        let mut m = Skeleton::new(cfg, n_q)?;
        // A call writes a frame's steps into each ring before attending:
        // more than the ring holds would overwrite keys within the call.
        let (steps, context) = (
            cfg.downsample_stride(),
            m.encoder_transformer
                .context()
                .min(m.decoder_transformer.context()),
        );
        if steps > context {
            return Err(GpuError::Unsupported(format!(
                "a transformer context of {context} positions is shorter than the {steps} steps of one frame"
            )));
        }
        let mut mem = Mem::default();
        m.encoder.load(dev, &mut mem, src, max_slots)?;
        m.decoder.load(dev, &mut mem, src, max_slots)?;
        m.encoder_transformer.load(dev, &mut mem, src, max_slots)?;
        m.decoder_transformer.load(dev, &mut mem, src, max_slots)?;
        if let Some(d) = &mut m.downsample {
            d.load(dev, &mut mem, src, max_slots)?;
        }
        if let Some(u) = &mut m.upsample {
            u.load(dev, &mut mem, src, max_slots)?;
        }
        m.quantizer.load(dev, &mut mem, src)?;
        let one = mem.upload_i32(dev, Kind::Weights, &[1])?;

        let (fs, stride, dim) = (
            cfg.frame_samples(),
            cfg.downsample_stride(),
            cfg.seanet.dimension,
        );
        if m.encoder.t_out(fs) != stride || m.decoder.t_out(stride) != fs {
            return Err(GpuError::Unsupported(format!(
                "SEANet hop does not divide the {fs}-sample frame into {stride} steps"
            )));
        }
        let n = max_rows;
        let act = m
            .encoder
            .act_need(n, fs)
            .max(m.decoder.act_need(n, stride))
            .max(n * stride * dim);
        let tail = m
            .encoder
            .tail_need(n)
            .max(m.decoder.tail_need(n))
            .max(m.upsample.as_ref().map_or(0, |u| u.tail_need(n)));
        let part = m
            .encoder
            .part_need(n, fs)
            .max(m.decoder.part_need(n, stride))
            .max(m.downsample.as_ref().map_or(0, |d| d.part_need(n, stride)))
            .max(m.upsample.as_ref().map_or(0, |u| u.part_need(n, 1)));
        let mut scratch = |n: usize| mem.floats(dev, Kind::Scratch, n);
        let seanet_bufs = SeanetBufs {
            a: scratch(act)?,
            b: scratch(act)?,
            t1: scratch(act)?,
            tail: scratch(tail)?,
            part: scratch(part)?,
        };
        let [xn, qkv, att, proj, hidden, rows] = m.encoder_transformer.need(n * stride);
        let tr_bufs = TransformerBufs {
            xn: scratch(xn)?,
            qkv: scratch(qkv)?,
            att: scratch(att)?,
            proj: scratch(proj)?,
            hidden: scratch(hidden)?,
            // RowInfo is 5 × 4 bytes.
            rows: scratch(rows * 5)?,
        };
        let rvq_bufs = RvqBufs {
            xq: scratch(m.quantizer.need(n))?,
            part: scratch(m.quantizer.part_bytes(n).div_ceil(4))?,
        };
        let state_per_slot = m.encoder.state_bytes()
            + m.decoder.state_bytes()
            + m.encoder_transformer.state_bytes()
            + m.decoder_transformer.state_bytes()
            + m.downsample.as_ref().map_or(0, GpuConv::state_bytes)
            + m.upsample.as_ref().map_or(0, GpuConvTr::state_bytes);
        debug_assert_eq!(state_per_slot * max_slots, mem.state);
        Ok(GpuMimi {
            frame_samples: fs,
            stride,
            max_slots,
            max_rows,
            k,
            encoder: m.encoder,
            encoder_transformer: m.encoder_transformer,
            downsample: m.downsample,
            quantizer: m.quantizer,
            upsample: m.upsample,
            decoder_transformer: m.decoder_transformer,
            decoder: m.decoder,
            seanet_bufs,
            tr_bufs,
            rvq_bufs,
            one,
            memory: MimiMemory {
                weights: mem.weights,
                state_per_slot,
                scratch: mem.scratch,
            },
        })
    }

    /// Audio samples per frame (1920 for the real Mimi).
    pub fn frame_samples(&self) -> usize {
        self.frame_samples
    }

    /// Codebooks per frame.
    pub fn num_codebooks(&self) -> usize {
        self.quantizer.used()
    }

    /// Slots this instance holds state for.
    pub fn max_slots(&self) -> usize {
        self.max_slots
    }

    /// Slot-steps one call may carry.
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }

    fn check_rows(&self, what: &'static str, rows: usize, codes_stride: usize) -> DeviceResult<()> {
        if rows > self.max_rows {
            return Err(shape_err(
                what,
                format!("{rows} rows > max_rows {}", self.max_rows),
            ));
        }
        if codes_stride < self.num_codebooks() {
            return Err(shape_err(
                what,
                format!(
                    "codes row stride {codes_stride} < {} codebooks",
                    self.num_codebooks()
                ),
            ));
        }
        Ok(())
    }

    /// Issues the streaming encode of one frame for each of `rows`
    /// slot-steps: `steps` = `SlotStep[rows]` on the device (inactive
    /// entries neither read nor write any state), `pcm` = `[rows][frame_samples]`
    /// f32 (rows of inactive steps are not read); writes
    /// `codes[j][0..n_q]` (u32, row stride `codes_stride`) for active j only.
    /// No synchronisation, no host read: capturable.
    pub fn encode<D: Device>(
        &self,
        dev: &mut D,
        rows: usize,
        steps: DevPtr,
        pcm: DevPtr,
        codes: DevPtr,
        codes_stride: usize,
    ) -> DeviceResult<()> {
        self.check_rows("mimi encode", rows, codes_stride)?;
        if rows == 0 {
            return Ok(());
        }
        let (k, sb) = (&self.k, &self.seanet_bufs);
        let fs = self.frame_samples;
        dev.phase(Phase::MimiEncSeanet);
        let h = self
            .encoder
            .forward(dev, &k.conv, &k.ew, rows, fs, steps, pcm, None, sb)?;
        dev.phase(Phase::MimiEncXfmr);
        self.encoder_transformer
            .forward(dev, k, rows, self.stride, steps, h, &self.tr_bufs)?;
        let latent = match &self.downsample {
            Some(d) => {
                dev.phase(Phase::MimiEncSeanet);
                let dst = if h == sb.a { sb.b } else { sb.a };
                let plain = ConvAct::plain(sb.part);
                d.forward(dev, &k.conv, rows, self.stride, steps, h, dst, &plain)?;
                dst
            }
            None => h,
        };
        dev.phase(Phase::MimiEncRvq);
        self.quantizer.encode(
            dev,
            k,
            rows,
            steps,
            latent,
            codes,
            codes_stride,
            &self.rvq_bufs,
        )
    }

    /// Issues the streaming decode of one frame of codes (`codes[j][0..n_q]`,
    /// u32, row stride `codes_stride`; rows of inactive steps are not read)
    /// per active slot-step into `pcm` `[rows][frame_samples]` (inactive
    /// rows get zeros). Capturable, as [`GpuMimi::encode`].
    pub fn decode<D: Device>(
        &self,
        dev: &mut D,
        rows: usize,
        steps: DevPtr,
        codes: DevPtr,
        codes_stride: usize,
        pcm: DevPtr,
    ) -> DeviceResult<()> {
        self.check_rows("mimi decode", rows, codes_stride)?;
        if rows == 0 {
            return Ok(());
        }
        let (k, sb) = (&self.k, &self.seanet_bufs);
        let latent = sb.b;
        dev.phase(Phase::MimiDecRvq);
        self.quantizer.decode(
            dev,
            k,
            rows,
            steps,
            codes,
            codes_stride,
            latent,
            &self.rvq_bufs,
        )?;
        let x = match &self.upsample {
            Some(u) => {
                dev.phase(Phase::MimiDecSeanet);
                let plain = ConvAct::plain(sb.part);
                u.forward(dev, &k.conv, rows, 1, steps, latent, sb.a, sb.tail, &plain)?;
                sb.a
            }
            None => latent,
        };
        dev.phase(Phase::MimiDecXfmr);
        self.decoder_transformer
            .forward(dev, k, rows, self.stride, steps, x, &self.tr_bufs)?;
        dev.phase(Phase::MimiDecSeanet);
        let out = self.decoder.forward(
            dev,
            &k.conv,
            &k.ew,
            rows,
            self.stride,
            steps,
            x,
            Some(pcm),
            sb,
        )?;
        if out != pcm {
            dev.copy_on_device(pcm, out, rows * self.frame_samples * 4)?;
        }
        Ok(())
    }

    /// Issues what returns `slot` to its initial state, encoder and decoder
    /// side (conv histories and tails zeroed, replicate-pad flag set, KV
    /// caches zeroed, positions 0), as `moshid_model::mimi::Mimi::reset_slot`.
    pub fn reset_slot<D: Device>(&self, dev: &mut D, slot: usize) -> DeviceResult<()> {
        if slot >= self.max_slots {
            return Err(shape_err(
                "mimi reset_slot",
                format!("slot {slot} ≥ max_slots {}", self.max_slots),
            ));
        }
        self.encoder.reset(dev, slot, self.one)?;
        self.encoder_transformer.reset(dev, slot)?;
        if let Some(d) = &self.downsample {
            d.reset(dev, slot, self.one)?;
        }
        if let Some(u) = &self.upsample {
            u.reset(dev, slot)?;
        }
        self.decoder_transformer.reset(dev, slot)?;
        self.decoder.reset(dev, slot, self.one)
    }

    /// Device bytes of the weights, of one slot's state, of the scratch.
    pub fn memory(&self) -> MimiMemory {
        self.memory
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshid_model::mimi::Mimi;

    fn sorted(mut v: Vec<TensorSpec>) -> Vec<(String, Vec<usize>)> {
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v.into_iter().map(|s| (s.name, s.shape)).collect()
    }

    #[test]
    fn takes_exactly_the_cpu_tensors() {
        let cfg = MimiConfig::mimi_default();
        assert_eq!(
            sorted(GpuMimi::tensor_specs(&cfg).unwrap()),
            sorted(Mimi::tensor_specs(&cfg))
        );
        let mut cfg = MimiConfig::mimi_default();
        cfg.transformer.context = 1;
        let mut dev = crate::device::emu::EmuDevice::new();
        let e = GpuMimi::random(&mut dev, &cfg, 8, 1, 1, 0).unwrap_err();
        assert!(e.to_string().contains("context of 1 positions"), "{e}");
        let mut cfg = MimiConfig::mimi_default();
        cfg.seanet.true_skip = false;
        cfg.transformer.layer_scale = None;
        assert_eq!(
            sorted(GpuMimi::tensor_specs(&cfg).unwrap()),
            sorted(Mimi::tensor_specs(&cfg))
        );
    }
}
