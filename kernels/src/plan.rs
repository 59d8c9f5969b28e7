//! Host-side memory planning for the CUDA backend: what a model and its
//! slots take on the device, how many slots fit, and the batch-size buckets
//! (and keys) of the per-frame CUDA graphs. Needs no GPU.
//!
//! The layout planned here is the one the kernels in `cuda/` assume:
//! - LM weights in bf16 (norm gains, and the depformer heads' norms, in
//!   f32); conditioner tables stay on the host (their vectors are computed
//!   once per slot at reset and uploaded);
//! - Mimi in f32 (as the official server runs it): convolution and
//!   transformer weights, and only the codebooks in use, transposed, with
//!   their squared norms;
//! - per slot: the temporal KV cache at the configured context for each of
//!   the slot's rows (two with classifier-free-guidance rows, one otherwise),
//!   `num_heads / kv_repeat` key/value heads wide (grouped-query attention),
//!   Mimi's conv histories, transposed-conv tails and transformer KV rings,
//!   the delayed token cache, offsets, RNG state, sampling parameters and
//!   condition rows;
//! - per slot-step of a batch (scratch, sized once for the largest bucket and
//!   shared by every graph): activations of both stacks, logits, the
//!   depformer's per-frame KV cache, Mimi's activations, step descriptors.
//!
//! Invariants: every figure is in bytes and derived from the configurations
//! alone (weights from the model crate's own tensor lists, so they agree with
//! what a checkpoint holds); `max_slots` never counts memory twice: the total
//! for `n` slots is `fixed + weights + n · (state_per_slot + scratch_per_step)`.

use moshid_model::config::{LmConfig, MimiConfig, SeanetConfig};
use moshid_model::lm::{depformer_shape, temporal_shape, Lm};
use moshid_model::mimi::Mimi;

/// Element type of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// bfloat16.
    Bf16,
    /// fp8 e4m3 (stored as x / scale).
    Fp8E4m3,
    /// float32.
    F32,
}

impl KvDtype {
    /// Bytes per stored number.
    pub fn bytes(self) -> u64 {
        match self {
            KvDtype::Bf16 => 2,
            KvDtype::Fp8E4m3 => 1,
            KvDtype::F32 => 4,
        }
    }
}

/// How batch sizes are rounded up to captured CUDA graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketPolicy {
    /// Powers of two from 1 up to this size.
    pub pow2_up_to: usize,
    /// Then multiples of this step.
    pub step_above: usize,
}

impl Default for BucketPolicy {
    fn default() -> Self {
        BucketPolicy {
            pow2_up_to: 64,
            step_above: 64,
        }
    }
}

/// Choices that change the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    /// The temporal transformer's KV cache.
    pub lm_kv: KvDtype,
    /// Mimi's transformer KV caches.
    pub mimi_kv: KvDtype,
    /// Two rows per slot (guidance) or one; `None`: two exactly when the model
    /// has conditioners, as the CPU backend does.
    pub cfg_rows: Option<bool>,
    /// Batch-size buckets.
    pub buckets: BucketPolicy,
    /// Device memory of the prompt snapshots (models with prompts; see
    /// [`crate::model::arena`]).
    pub prompt_cache_bytes: u64,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            lm_kv: KvDtype::Bf16,
            mimi_kv: KvDtype::F32,
            cfg_rows: None,
            buckets: BucketPolicy::default(),
            prompt_cache_bytes: 0,
        }
    }
}

/// Device memory that does not depend on the model: cuBLAS workspace and
/// small fixed buffers. CUDA-graph memory and the context itself belong in the
/// caller's reserve.
pub const FIXED_BYTES: u64 = 64 << 20;

/// Why a plan does not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Not even the asked number of slots fits.
    #[error(
        "{slots} slot(s) need {need} bytes (weights {weights}, fixed {fixed}, {per_slot} per slot) but only \
         {avail} of {free} free bytes may be used (reserve {reserve})"
    )]
    DoesNotFit {
        /// Slots asked for (1 when deriving `max_slots`).
        slots: usize,
        /// Bytes they need.
        need: u64,
        /// Weights.
        weights: u64,
        /// Fixed buffers.
        fixed: u64,
        /// State and scratch per slot.
        per_slot: u64,
        /// Free minus reserve.
        avail: u64,
        /// Free device memory.
        free: u64,
        /// Reserve kept free.
        reserve: u64,
    },
}

/// One convolution of Mimi as the kernels run it, per frame.
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
    /// Transposed.
    pub transposed: bool,
    /// Depthwise (transposed only: the up-sampler).
    pub depthwise: bool,
    /// Input steps per frame.
    pub t_in: usize,
}

impl ConvShape {
    /// Output steps per frame.
    pub fn t_out(&self) -> usize {
        if self.transposed {
            self.t_in * self.stride
        } else {
            self.t_in / self.stride
        }
    }

    /// Floats of split-reduction partial sums one slot-step of this conv
    /// needs (conv.cu's implicit GEMM; 0 for the direct kernels).
    pub fn part_floats(&self) -> usize {
        use crate::ops::conv as k;
        if self.depthwise || self.c_out < k::GEMM_MIN_COUT {
            return 0;
        }
        let plan = if self.transposed {
            k::ConvTrShape {
                c_in: self.c_in,
                c_out: self.c_out,
                kernel: self.kernel,
                stride: self.stride,
                depthwise: false,
            }
            .plan(self.t_in)
        } else {
            k::ConvShape {
                c_in: self.c_in,
                c_out: self.c_out,
                kernel: self.kernel,
                stride: self.stride,
                dilation: self.dilation,
            }
            .plan(self.t_in)
        };
        plan.part_floats(1)
    }

    /// Streaming state floats per slot: the input history of a conv, the
    /// output tail of a transposed conv.
    pub fn state_floats(&self) -> usize {
        if self.transposed {
            (self.kernel - self.stride) * self.c_out
        } else {
            ((self.kernel - 1) * self.dilation + 1 - self.stride) * self.c_in
        }
    }
}

/// Mimi's convolutions in execution order (SEANet encoder, down-sampler,
/// up-sampler, SEANet decoder), mirroring model/src/mimi/seanet.rs and
/// resample.rs, with their per-frame step counts.
pub fn mimi_convs(cfg: &MimiConfig) -> Vec<ConvShape> {
    let s = &cfg.seanet;
    let conv = |c_in, c_out, kernel, stride, dilation, t_in| ConvShape {
        c_in,
        c_out,
        kernel,
        stride,
        dilation,
        transposed: false,
        depthwise: false,
        t_in,
    };
    let res = |out: &mut Vec<ConvShape>, s: &SeanetConfig, dim: usize, t: usize| {
        for j in 0..s.n_residual_layers {
            let d = s.dilation_base.pow(j as u32);
            out.push(conv(dim, dim / s.compress, s.residual_kernel_size, 1, d, t));
            out.push(conv(dim / s.compress, dim, 1, 1, 1, t));
            if !s.true_skip {
                out.push(conv(dim, dim, 1, 1, 1, t));
            }
        }
    };
    let mut out = Vec::new();
    let nf = s.n_filters;
    let mut t = cfg.frame_samples();
    out.push(conv(s.channels, nf, s.kernel_size, 1, 1, t));
    let mut mult = 1;
    for &ratio in s.ratios.iter().rev() {
        res(&mut out, s, mult * nf, t);
        out.push(conv(mult * nf, mult * nf * 2, ratio * 2, ratio, 1, t));
        t /= ratio;
        mult *= 2;
    }
    out.push(conv(mult * nf, s.dimension, s.last_kernel_size, 1, 1, t));
    let stride = cfg.downsample_stride();
    if stride > 1 {
        out.push(conv(s.dimension, s.dimension, 2 * stride, stride, 1, t));
        out.push(ConvShape {
            transposed: true,
            depthwise: true,
            ..conv(s.dimension, s.dimension, 2 * stride, stride, 1, 1)
        });
    }
    let mut t = stride;
    let mut mult = 1usize << s.ratios.len();
    out.push(conv(s.dimension, mult * nf, s.kernel_size, 1, 1, t));
    for &ratio in &s.ratios {
        out.push(ConvShape {
            transposed: true,
            ..conv(mult * nf, mult * nf / 2, ratio * 2, ratio, 1, t)
        });
        t *= ratio;
        res(&mut out, s, mult * nf / 2, t);
        mult /= 2;
    }
    out.push(conv(nf, s.channels, s.last_kernel_size, 1, 1, t));
    out
}

/// The memory plan of one model (LM + Mimi).
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    /// LM weights on the device.
    pub lm_weight_bytes: u64,
    /// Mimi weights on the device.
    pub mimi_weight_bytes: u64,
    /// Rows of the LM per slot (2 with guidance rows).
    pub rows_per_slot: usize,
    /// Temporal KV cache of one row at the configured context.
    pub kv_bytes_per_row: u64,
    /// Mimi's streaming state per slot (conv histories and tails, KV rings).
    pub mimi_state_bytes_per_slot: u64,
    /// Token cache, offset, RNG, sampling parameters, condition rows.
    pub token_state_bytes_per_slot: u64,
    /// Scratch per slot-step of a batch.
    pub scratch_bytes_per_step: u64,
    /// The prompt snapshots' memory (granules of the arena).
    pub prompt_cache_bytes: u64,
}

impl MemoryPlan {
    /// The plan for `lm` and `mimi` with `opts`.
    pub fn new(lm: &LmConfig, mimi: &MimiConfig, opts: &PlanOptions) -> MemoryPlan {
        let rows_per_slot = if opts.cfg_rows.unwrap_or(lm.has_conditioners()) {
            2
        } else {
            1
        };
        let lm_weight_bytes = Lm::tensor_specs(lm)
            .iter()
            .filter(|t| !t.name.starts_with("condition_provider."))
            .map(|t| {
                let f32_on_device =
                    t.name.ends_with(".alpha") || t.name.starts_with("depformer_norms.");
                t.numel() as u64 * if f32_on_device { 4 } else { 2 }
            })
            .sum();
        let q = &mimi.quantizer;
        let used = lm.dep_q as u64;
        let mimi_weight_bytes = Mimi::tensor_specs(mimi)
            .iter()
            .filter(|t| !t.name.contains("._codebook."))
            .map(|t| t.shape.iter().product::<usize>() as u64 * 4)
            .sum::<u64>()
            + used * q.bins as u64 * (q.dimension as u64 + 1) * 4;
        let kv_bytes_per_row = lm.kv_bytes_per_stream(opts.lm_kv.bytes() as usize) as u64;

        let convs = mimi_convs(mimi);
        let tr = &mimi.transformer;
        let mimi_kv =
            2 * (2 * tr.num_layers * tr.context * tr.d_model) as u64 * opts.mimi_kv.bytes();
        let mimi_state_bytes_per_slot = convs.iter().map(|c| c.state_floats() as u64 * 4).sum::<u64>()
            + mimi_kv
            + 2 * 4 // transformer offsets
            + 4; // replicate-padding flag

        let k = lm.num_codebooks() as u64;
        let ct = lm.max_delay() as u64 + 2;
        let cond_rows = if lm.has_conditioners() {
            rows_per_slot as u64 * lm.dim as u64 * 4
        } else {
            0
        };
        let token_state_bytes_per_slot = k * ct * 4 + 4 + 32 + 24 + cond_rows;

        // LM scratch per row.
        let (ts, ds) = (temporal_shape(lm), depformer_shape(lm));
        let (d, hid, qkv) = (ts.dim as u64, ts.hidden as u64, ts.qkv_dim() as u64);
        let (dd, dhid, dqkv) = (ds.dim as u64, ds.hidden as u64, ds.qkv_dim() as u64);
        let rank = lm.depformer.low_rank_embeddings.unwrap_or(0) as u64;
        // The depformer's per-frame cache is in the activations' type (f32
        // in the exact mode, bf16 otherwise, fp8 never).
        let dep_kv = if opts.lm_kv == KvDtype::F32 { 4 } else { 2 };
        let row = d * 4
            + d * 2
            + qkv * 4
            + d * 2
            + 2 * hid * 4
            + hid * 2
            + d * 2
            + lm.text_card as u64 * 4
            + dd * 4
            + dd * 2
            + dqkv * 4
            + dd * 2
            + 2 * dhid * 4
            + dhid * 2
            + rank * 2
            + lm.card as u64 * 4
            + 2 * (ds.layers * ds.capacity * ds.kv_dim()) as u64 * dep_kv
            + 2 * 20; // RowInfo of both stacks
        let dep_q = lm.dep_q as u64;
        let step_tokens =
            k * 4 + 4 + dep_q * 4 + (1 + dep_q) * 4 + 4 + 16 + lm.num_user_codebooks() as u64 * 4;
        // Mimi scratch per step: three activation buffers of the widest layer,
        // the widest transposed-conv tail, the largest split-reduction
        // partial sums, transformer rows, RVQ vectors and partial minima, PCM.
        let act = convs
            .iter()
            .map(|c| (c.t_in * c.c_in).max(c.t_out() * c.c_out))
            .max()
            .unwrap_or(0) as u64;
        let tail = convs
            .iter()
            .filter(|c| c.transposed)
            .map(|c| ((c.kernel - c.stride) * c.c_out) as u64)
            .max()
            .unwrap_or(0);
        let t = mimi.downsample_stride() as u64;
        let tr_rows = t * ((6 * tr.d_model + tr.dim_feedforward) as u64 * 4 + 20);
        let part = convs.iter().map(ConvShape::part_floats).max().unwrap_or(0) as u64;
        let rvq = (2 * q.dimension + q.input_dimension) as u64 * 4
            + crate::ops::rvq::RvqShape {
                n_books: 1,
                dq: q.dimension,
                bins: q.bins,
                codes_stride: 1,
                col0: 0,
            }
            .part_bytes(1) as u64;
        let pcm = 2 * mimi.frame_samples() as u64 * 4;
        let mimi_step = 3 * act * 4 + tail * 4 + part * 4 + tr_rows + rvq + pcm;
        MemoryPlan {
            lm_weight_bytes,
            mimi_weight_bytes,
            rows_per_slot,
            kv_bytes_per_row,
            mimi_state_bytes_per_slot,
            token_state_bytes_per_slot,
            scratch_bytes_per_step: rows_per_slot as u64 * row + step_tokens + mimi_step,
            prompt_cache_bytes: opts.prompt_cache_bytes / crate::model::arena::GRANULE_BYTES as u64
                * crate::model::arena::GRANULE_BYTES as u64,
        }
    }

    /// All weights.
    pub fn weight_bytes(&self) -> u64 {
        self.lm_weight_bytes + self.mimi_weight_bytes
    }

    /// Temporal KV cache per slot (every row of the slot).
    pub fn kv_bytes_per_slot(&self) -> u64 {
        self.kv_bytes_per_row * self.rows_per_slot as u64
    }

    /// Everything a slot keeps between steps.
    pub fn state_bytes_per_slot(&self) -> u64 {
        self.kv_bytes_per_slot() + self.mimi_state_bytes_per_slot + self.token_state_bytes_per_slot
    }

    /// Scratch for a batch of `bucket` slot-steps.
    pub fn scratch_bytes(&self, bucket: usize) -> u64 {
        self.scratch_bytes_per_step * bucket as u64
    }

    /// Memory that does not grow with the slots: [`FIXED_BYTES`] and the
    /// prompt snapshots' arena.
    pub fn fixed_bytes(&self) -> u64 {
        FIXED_BYTES + self.prompt_cache_bytes
    }

    /// Device bytes for `slots` slots: fixed buffers (the prompt
    /// snapshots' arena included), weights, per-slot state, and scratch for
    /// a batch of every slot (the largest bucket).
    pub fn bytes_for(&self, slots: usize) -> u64 {
        self.fixed_bytes()
            + self.weight_bytes()
            + slots as u64 * (self.state_bytes_per_slot() + self.scratch_bytes_per_step)
    }

    fn does_not_fit(&self, slots: usize, free: u64, reserve: u64) -> PlanError {
        PlanError::DoesNotFit {
            slots,
            need: self.bytes_for(slots),
            weights: self.weight_bytes(),
            fixed: self.fixed_bytes(),
            per_slot: self.state_bytes_per_slot() + self.scratch_bytes_per_step,
            avail: free.saturating_sub(reserve),
            free,
            reserve,
        }
    }

    /// The most slots that fit in `free` device bytes keeping `reserve` free.
    pub fn max_slots(&self, free: u64, reserve: u64) -> Result<usize, PlanError> {
        let avail = free.saturating_sub(reserve);
        let base = self.fixed_bytes() + self.weight_bytes();
        let per = self.state_bytes_per_slot() + self.scratch_bytes_per_step;
        match avail.checked_sub(base).map(|rest| rest / per) {
            Some(n) if n >= 1 => Ok(n as usize),
            _ => Err(self.does_not_fit(1, free, reserve)),
        }
    }

    /// Checks that a configured `slots` fits.
    pub fn check_fits(&self, slots: usize, free: u64, reserve: u64) -> Result<(), PlanError> {
        if self.bytes_for(slots) <= free.saturating_sub(reserve) {
            Ok(())
        } else {
            Err(self.does_not_fit(slots, free, reserve))
        }
    }
}

/// The batch sizes a graph is captured for, ascending, the last one exactly
/// `max_slots`: powers of two up to `pow2_up_to`, then multiples of `step_above`.
pub fn buckets(max_slots: usize, policy: BucketPolicy) -> Vec<usize> {
    let mut out = Vec::new();
    let mut b = 1;
    while b < max_slots && b <= policy.pow2_up_to {
        out.push(b);
        b *= 2;
    }
    if let Some(&last) = out.last() {
        let step = policy.step_above.max(1);
        let mut b = (last / step + 1) * step;
        while b < max_slots {
            out.push(b);
            b += step;
        }
    }
    if max_slots > 0 {
        out.push(max_slots);
    }
    out
}

/// The smallest bucket holding `n` slot-steps (`None` for 0 or too many).
pub fn bucket_for(buckets: &[usize], n: usize) -> Option<usize> {
    if n == 0 {
        return None;
    }
    buckets.iter().copied().find(|&b| b >= n)
}

/// The engine's id of a loaded model (one daemon may hold several).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(pub u32);

/// The key of a captured per-frame graph: a graph binds the buffers of one
/// model and one phase group, for one bucket size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GraphKey {
    /// The model.
    pub model: ModelId,
    /// The phase group (0..G).
    pub phase_group: u8,
    /// The bucket (batch size the graph was captured for).
    pub bucket: u32,
}

impl GraphKey {
    /// The key for a batch of `n` slot-steps, or `None` when `n` is 0 or above every bucket.
    pub fn for_batch(
        model: ModelId,
        phase_group: u8,
        n: usize,
        buckets: &[usize],
    ) -> Option<GraphKey> {
        bucket_for(buckets, n).map(|b| GraphKey {
            model,
            phase_group,
            bucket: b as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: f64 = (1u64 << 30) as f64;

    use crate::shapes::{hibiki_2b, hibiki_zero_3b};

    #[test]
    fn moshi_7b_weights_and_kv() {
        let lm = LmConfig::moshi_7b();
        let mimi = MimiConfig::mimi_default();
        let p = MemoryPlan::new(&lm, &mimi, &PlanOptions::default());
        let gb = p.lm_weight_bytes as f64 / 1e9;
        assert!((gb - 15.4).abs() < 0.1, "Moshi 7B weights {gb} GB");
        let kv = p.kv_bytes_per_row as f64 / GIB;
        assert!((kv - 1.465).abs() < 0.01, "KV per stream {kv} GiB");
        assert_eq!(p.rows_per_slot, 1);
        assert_eq!(p.kv_bytes_per_slot(), p.kv_bytes_per_row);
        let fp8 = MemoryPlan::new(
            &lm,
            &mimi,
            &PlanOptions {
                lm_kv: KvDtype::Fp8E4m3,
                ..PlanOptions::default()
            },
        );
        assert_eq!(2 * fp8.kv_bytes_per_row, p.kv_bytes_per_row);
        // Mimi in f32 with 8 codebooks: tens of MB of weights, a few MB of state.
        assert!(
            p.mimi_weight_bytes > 200_000_000 && p.mimi_weight_bytes < 500_000_000,
            "{}",
            p.mimi_weight_bytes
        );
        assert!(
            p.mimi_state_bytes_per_slot < 32 << 20,
            "{}",
            p.mimi_state_bytes_per_slot
        );
    }

    #[test]
    fn the_prompt_snapshot_memory_is_fixed_and_costs_slots() {
        let (lm, mimi) = (LmConfig::moshi_7b(), MimiConfig::mimi_default());
        let none = MemoryPlan::new(&lm, &mimi, &PlanOptions::default());
        let two_gib = PlanOptions {
            prompt_cache_bytes: (2 << 30) + 5,
            ..PlanOptions::default()
        };
        let p = MemoryPlan::new(&lm, &mimi, &two_gib);
        // Whole granules of the arena, counted once, not per slot.
        assert_eq!(p.prompt_cache_bytes, 2 << 30);
        assert_eq!(p.bytes_for(3) - none.bytes_for(3), 2 << 30);
        let free = 141 * (1u64 << 30);
        let (a, b) = (
            none.max_slots(free, 1 << 30).unwrap(),
            p.max_slots(free, 1 << 30).unwrap(),
        );
        assert!(b < a && b + 2 >= a, "{a} slots without, {b} with");
    }

    #[test]
    fn hibiki_2b_kv_per_stream() {
        let lm = hibiki_2b();
        let p = MemoryPlan::new(&lm, &MimiConfig::mimi_default(), &PlanOptions::default());
        let mb = p.kv_bytes_per_row as f64 / 1e6;
        assert!((mb - 368.6).abs() < 0.5, "Hibiki KV per stream {mb} MB");
        // With conditioners, slots carry a guidance row (as the CPU backend).
        assert_eq!(p.rows_per_slot, 2);
        assert_eq!(p.kv_bytes_per_slot(), 2 * p.kv_bytes_per_row);
        let one = MemoryPlan::new(
            &lm,
            &MimiConfig::mimi_default(),
            &PlanOptions {
                cfg_rows: Some(false),
                ..PlanOptions::default()
            },
        );
        assert_eq!(one.kv_bytes_per_slot(), p.kv_bytes_per_row);
    }

    #[test]
    fn hibiki_zero_3b_kv_follows_kv_repeat() {
        let lm = hibiki_zero_3b();
        let mimi = MimiConfig::mimi_default();
        let p = MemoryPlan::new(&lm, &mimi, &PlanOptions::default());
        // No conditioner: one row per slot; 8 of 16 key/value heads.
        assert_eq!(p.rows_per_slot, 1);
        let mb = p.kv_bytes_per_row as f64 / 1e6;
        assert!(
            (mb - 344.1).abs() < 0.5,
            "Hibiki-Zero KV per stream {mb} MB"
        );
        let mut mha = lm.clone();
        mha.kv_repeat = 1;
        let full = MemoryPlan::new(&mha, &mimi, &PlanOptions::default());
        assert_eq!(full.kv_bytes_per_row, 2 * p.kv_bytes_per_row);
        assert!(full.scratch_bytes_per_step > p.scratch_bytes_per_step);
        let gb = p.lm_weight_bytes as f64 / 1e9;
        assert!((gb - 6.3).abs() < 0.2, "Hibiki-Zero weights {gb} GB");
        // DESIGN.md: ~370 streams in bf16 on one H200.
        let free = 139 * (1u64 << 30);
        let n = p.max_slots(free, 4 << 30).unwrap();
        assert!((340..=420).contains(&n), "Hibiki-Zero slots {n}");
        assert!(full.max_slots(free, 4 << 30).unwrap() < n * 6 / 10);
    }

    #[test]
    fn mimi_convs_mirror_the_seanet() {
        let mimi = MimiConfig::mimi_default();
        let convs = mimi_convs(&mimi);
        // Encoder: 1 + 4 × (2 residual + 1 down) + 1; resamplers: 2; decoder: 1 + 4 × (1 up + 2 residual) + 1.
        assert_eq!(convs.len(), 14 + 2 + 14);
        assert_eq!(
            (convs[0].c_in, convs[0].c_out, convs[0].t_in),
            (1, 64, 1920)
        );
        let enc_last = convs[13];
        assert_eq!((enc_last.c_out, enc_last.t_out()), (512, 2));
        let down = convs[14];
        assert_eq!(
            (down.kernel, down.stride, down.t_out(), down.state_floats()),
            (4, 2, 1, 2 * 512)
        );
        assert!(convs[15].depthwise && convs[15].t_out() == 2);
        let last = convs[convs.len() - 1];
        assert_eq!((last.c_in, last.c_out, last.t_out()), (64, 1, 1920));
    }

    #[test]
    fn buckets_and_choice() {
        let p = BucketPolicy::default();
        assert_eq!(buckets(1, p), vec![1]);
        assert_eq!(buckets(8, p), vec![1, 2, 4, 8]);
        assert_eq!(buckets(100, p), vec![1, 2, 4, 8, 16, 32, 64, 100]);
        assert_eq!(
            buckets(300, p),
            vec![1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 300]
        );
        assert_eq!(buckets(256, p), vec![1, 2, 4, 8, 16, 32, 64, 128, 192, 256]);
        let b = buckets(100, p);
        assert_eq!(bucket_for(&b, 0), None);
        assert_eq!(bucket_for(&b, 1), Some(1));
        assert_eq!(bucket_for(&b, 3), Some(4));
        assert_eq!(bucket_for(&b, 64), Some(64));
        assert_eq!(bucket_for(&b, 65), Some(100));
        assert_eq!(bucket_for(&b, 101), None);
        let k = GraphKey::for_batch(ModelId(0), 2, 5, &b).unwrap();
        assert_eq!(
            k,
            GraphKey {
                model: ModelId(0),
                phase_group: 2,
                bucket: 8
            }
        );
        assert_ne!(k, GraphKey::for_batch(ModelId(0), 1, 5, &b).unwrap());
        assert_eq!(GraphKey::for_batch(ModelId(0), 0, 0, &b), None);
    }

    #[test]
    fn max_slots_from_memory() {
        let lm = LmConfig::moshi_7b();
        let mimi = MimiConfig::mimi_default();
        let bf16 = MemoryPlan::new(&lm, &mimi, &PlanOptions::default());
        let fp8 = MemoryPlan::new(
            &lm,
            &mimi,
            &PlanOptions {
                lm_kv: KvDtype::Fp8E4m3,
                ..PlanOptions::default()
            },
        );
        // One H200 (~139 GiB free after the context), 4 GiB kept free.
        let free = 139 * (1u64 << 30);
        let reserve = 4 * (1u64 << 30);
        let n16 = bf16.max_slots(free, reserve).unwrap();
        let n8 = fp8.max_slots(free, reserve).unwrap();
        assert!((70..=85).contains(&n16), "bf16 KV: {n16} slots");
        assert!((135..=165).contains(&n8), "fp8 KV: {n8} slots");
        // The derived count fits and one more does not.
        assert!(bf16.check_fits(n16, free, reserve).is_ok());
        assert!(bf16.check_fits(n16 + 1, free, reserve).is_err());
        // A 16 GiB device cannot hold Moshi 7B with a slot: an error naming the figures.
        let e = bf16.max_slots(16 << 30, 1 << 30).unwrap_err().to_string();
        assert!(e.contains("weights") && e.contains("reserve"), "{e}");
        // Hibiki 2B at context 1500, two rows per slot (guidance): under
        // two hundred guided streams in 139 GiB.
        let h = MemoryPlan::new(&hibiki_2b(), &mimi, &PlanOptions::default());
        let nh = h.max_slots(free, reserve).unwrap();
        assert!((120..=200).contains(&nh), "Hibiki slots {nh}");
        eprintln!(
            "Moshi 7B: weights {:.2} GB (+ Mimi {:.0} MB), state {:.1} MB/slot, scratch {:.1} MB/step: \
             {n16} slots (bf16 KV), {n8} (fp8); Hibiki 2B: {nh} slots",
            bf16.lm_weight_bytes as f64 / 1e9,
            bf16.mimi_weight_bytes as f64 / 1e6,
            bf16.state_bytes_per_slot() as f64 / 1e6,
            bf16.scratch_bytes_per_step as f64 / 1e6,
        );
    }
}
