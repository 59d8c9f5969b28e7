//! The Moshi/Hibiki LM on the device: one frame for a bucket of slot-steps
//! as the CPU reference's `Lm::step` (moshi 0.2.13 `LMGen.step`), as a
//! sequence of launches that depends only on the bucket and fixed pointers,
//! so that it can be captured in a CUDA graph and replayed every frame.
//!
//! Per frame: the user codes go into each slot's delayed token cache and the
//! tokens due now come out (`token_cache_in`); their embeddings plus the
//! slot's condition vector form the input (`embed_sum`); the temporal
//! transformer runs over the slot's ring KV cache; out-norm and text head;
//! the text token is sampled (guidance mixed in the kernel); the depformer
//! produces the `dep_q` audio codebooks; the new tokens go into the cache
//! and the undelayed frame comes out with its ready flag (`token_cache_out`).
//!
//! Rows: each slot-step `j` owns rows `rps·j .. rps·j + rps` of every
//! activation (`rps` = 2 for a model with conditioners: the conditioned row,
//! then the guidance row, active only when the slot uses guidance). The
//! temporal KV cache row of slot `s`, sub-row `i`, is `s·rps + i`.
//!
//! Invariants: all state is per slot and touched only by active slot-steps;
//! [`GpuLm::reset_slot`] returns a slot to its initial state (offset, token
//! cache, RNG, parameters, condition rows); nothing is allocated after
//! [`GpuLm::load`].

mod depformer;
pub mod prefill;
mod proj;
mod stack;

use super::tensor::{scratch, DevTensor, Init, WeightLoader};
use super::GpuError;
use crate::device::as_bytes;
use crate::device::{DType, DevPtr, Device, DeviceResult, Phase, StackPhases, NULL};
use crate::ops::attention::{AttnKernels, KvType};
use crate::ops::elementwise::EwKernels;
use crate::ops::embed::{EmbedKernels, TokenCache, TokenCacheShape};
use crate::ops::gemv::GemvKernels;
use crate::ops::norm::NormKernels;
use crate::ops::sampling::{SampleArgs, SampleKernels};
use crate::ops::short_attn::ShortAttnKernels;
use crate::ops::text_rules::{TextRulesKernels, TextRulesParams, TextRulesState};
use crate::ops::types::SlotParams;
use depformer::Depformer;
use moshid_model::config::{LmConfig, ModelType};
use moshid_model::lm::{Conditioning, GenParams, ParamError};
use stack::{Stack, StackScratch};

/// Every kernel family the LM launches.
#[derive(Debug, Clone, Copy)]
pub struct LmKernels {
    /// Norms.
    pub norm: NormKernels,
    /// RoPE, KV writes, attention.
    pub attn: AttnKernels,
    /// Element-wise.
    pub ew: EwKernels,
    /// Token cache and embeddings.
    pub embed: EmbedKernels,
    /// Sampling.
    pub sample: SampleKernels,
    /// Few-row projections with their input's operation fused.
    pub gemv: GemvKernels,
    /// The depformer's one-launch attention.
    pub short: ShortAttnKernels,
    /// Kyutai's text rules.
    pub rules: TextRulesKernels,
}

impl LmKernels {
    /// Resolves every kernel.
    pub fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(LmKernels {
            norm: NormKernels::resolve(dev)?,
            attn: AttnKernels::resolve(dev)?,
            ew: EwKernels::resolve(dev)?,
            embed: EmbedKernels::resolve(dev)?,
            sample: SampleKernels::resolve(dev)?,
            gemv: GemvKernels::resolve(dev)?,
            short: ShortAttnKernels::resolve(dev)?,
            rules: TextRulesKernels::resolve(dev)?,
        })
    }
}

/// The text id the Hibiki loader treats as end of text, and the padding
/// row it copies over it (as the CPU reference).
const HIBIKI_TEXT_EOS: usize = 2;
const HIBIKI_TEXT_PAD: usize = 3;

/// Where one frame's LM inputs and outputs live on the device (per bucket).
#[derive(Debug, Clone)]
pub struct LmStepIo {
    /// `SlotStep[bucket]`.
    pub steps: DevPtr,
    /// Temporal `RowInfo[bucket · rps]`.
    pub rows: DevPtr,
    /// dep_q arrays of RowInfo[bucket · rps] (depformer step k at position k).
    pub dep_rows: Vec<DevPtr>,
    /// User codes `[bucket][n_user]` u32.
    pub user_codes: DevPtr,
    /// Undelayed frame `[bucket][1 + dep_q]` u32.
    pub out: DevPtr,
    /// Ready flags `[bucket]` i32.
    pub ready: DevPtr,
}

/// Device bytes of the LM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LmMemory {
    /// Weights.
    pub weights: usize,
    /// Temporal KV cache per slot (all its rows).
    pub kv_per_slot: usize,
}

/// The LM on the device.
pub struct GpuLm {
    cfg: LmConfig,
    act: DType,
    rps: usize,
    max_slots: usize,
    max_rows: usize,
    conditioning: Conditioning,
    audio_emb: DevTensor,
    text_emb: DevTensor,
    temporal: Stack,
    out_norm: DevPtr,
    text_linear: DevTensor,
    depformer: Depformer,
    /// `[max_slots · rps][dim]` f32 condition vectors, or NULL.
    cond: DevPtr,
    tc: TokenCache,
    tc_shape: TokenCacheShape,
    /// `[max_slots][4]` u64.
    rng: DevPtr,
    /// SlotParams[max_slots].
    params: DevPtr,
    x: DevPtr,
    tout: DevPtr,
    /// `[max_rows][text_card]` f32.
    text_logits: DevPtr,
    tokens: DevPtr,
    text: DevPtr,
    audio: DevPtr,
    scratch: StackScratch,
    /// Kyutai's text rules per slot.
    rules: TextRulesState,
    /// Prefill buffers (models with a prompt prefill only).
    prefill: Option<prefill::PrefillBufs>,
    host_cond: Vec<f32>,
    host_tmp: Vec<f32>,
    memory: LmMemory,
}

impl GpuLm {
    /// Uploads the LM (weights and activations in `act`, temporal KV cache in
    /// `kv`) for `max_slots` slots and buckets of up to `max_bucket`
    /// slot-steps. `conditioning` is the model's conditioners (loaded from
    /// the same checkpoint, or random).
    #[allow(clippy::too_many_arguments)]
    pub fn load<D: Device + ?Sized>(
        dev: &mut D,
        cfg: &LmConfig,
        w: &mut WeightLoader<'_>,
        conditioning: Conditioning,
        act: DType,
        kv: KvType,
        max_slots: usize,
        max_bucket: usize,
    ) -> Result<GpuLm, GpuError> {
        if act == DType::F32 && matches!(kv, KvType::Fp8 { .. }) {
            return Err(GpuError::Unsupported(
                "an fp8 KV cache needs bf16 precision".into(),
            ));
        }
        if act == DType::Bf16 && kv == KvType::F32 {
            return Err(GpuError::Unsupported(
                "an f32 KV cache needs f32 precision".into(),
            ));
        }
        let (dim, card, n_q) = (cfg.dim, cfg.card, cfg.n_q);
        let rps = conditioning.rows_per_slot();
        let max_rows = max_bucket * rps;
        let cache_rows = max_slots * rps;
        let before = w.bytes();
        let audio_emb = DevTensor {
            ptr: dev.alloc(n_q * (card + 1) * dim * act.bytes())?,
            dtype: act,
            rows: n_q * (card + 1),
            cols: dim,
        };
        for k in 0..n_q {
            w.tensor_at(
                dev,
                &format!("emb.{k}.weight"),
                &[card + 1, dim],
                audio_emb.row(k * (card + 1)),
                act,
                Init::Embedding,
            )?;
        }
        let hibiki = cfg.model_type == ModelType::Hibiki;
        let text_emb = w.tensor_with(
            dev,
            "text_emb.weight",
            &[cfg.text_card + 1, dim],
            act,
            Init::Embedding,
            |t| {
                if hibiki && t.len() > (HIBIKI_TEXT_PAD + 1) * dim {
                    t.copy_within(
                        HIBIKI_TEXT_PAD * dim..(HIBIKI_TEXT_PAD + 1) * dim,
                        HIBIKI_TEXT_EOS * dim,
                    );
                }
            },
        )?;
        let temporal = Stack::load(
            dev,
            w,
            "transformer",
            moshid_model::lm::temporal_shape(cfg),
            act,
            kv,
            cache_rows,
            StackPhases::TEMPORAL,
        )?;
        let out_norm = w
            .tensor(dev, "out_norm.alpha", &[1, 1, dim], DType::F32, Init::Ones)?
            .ptr;
        let text_linear = w.tensor(
            dev,
            "text_linear.weight",
            &[cfg.text_card, dim],
            act,
            Init::Linear,
        )?;
        let depformer = Depformer::load(dev, w, cfg, act, max_rows)?;
        for spec in moshid_model::lm::Lm::tensor_specs_unused(cfg) {
            w.skip(&spec.name, &spec.shape)?;
        }
        let weights = w.bytes() - before;
        let k = cfg.num_codebooks();
        let lag = usize::from(cfg.model_type == ModelType::PersonaPlex);
        let ring = cfg.max_delay() + 2 + lag;
        let delays: Vec<i32> = cfg.delays.iter().map(|&d| d as i32).collect();
        let delays_ptr = dev.alloc(delays.len() * 4)?;
        dev.upload(delays_ptr, as_bytes(&delays))?;
        let tc = TokenCache {
            cache: dev.alloc(max_slots * k * ring * 4)?,
            offset: dev.alloc(max_slots * 4)?,
            delays: delays_ptr,
            forced: if lag > 0 {
                dev.alloc(max_slots * k * ring * 4)?
            } else {
                NULL
            },
        };
        let tc_shape = TokenCacheShape {
            codebooks: k,
            ring,
            dep_q: cfg.dep_q,
            n_user: cfg.num_user_codebooks(),
            card,
            text_card: cfg.text_card,
            max_delay: cfg.max_delay(),
            lag,
        };
        let cond = if conditioning.is_empty() {
            NULL
        } else {
            dev.alloc(cache_rows * dim * 4)?
        };
        let scratch_rows = max_rows.max(1);
        let sc = StackScratch::new(
            dev,
            scratch_rows,
            &[temporal.shape(), depformer.stack.shape()],
            act,
        )?;
        let memory = LmMemory {
            weights,
            kv_per_slot: temporal.kv_bytes() / max_slots.max(1),
        };
        let prefill = if moshid_model::lm::prefill_headroom(cfg) > 0 {
            Some(prefill::PrefillBufs::new(dev, temporal.shape(), k, act)?)
        } else {
            None
        };
        let cap = moshid_model::lm::text_rules::MAX_REPETITION_CONTEXT;
        let rules = TextRulesState {
            rules: dev.alloc(max_slots * std::mem::size_of::<TextRulesParams>())?,
            hist: dev.alloc(max_slots * cap * 4)?,
            hist_n: dev.alloc(max_slots * 4)?,
            cap,
            seen: dev.alloc(max_slots * cfg.text_card)?,
            pad: cfg.existing_text_padding_id,
            start: cfg.text_card as u32,
        };
        dev.memset_zero(rules.seen, max_slots * cfg.text_card)?;
        let mut lm = GpuLm {
            rules,
            prefill,
            act,
            rps,
            max_slots,
            max_rows,
            conditioning,
            audio_emb,
            text_emb,
            temporal,
            out_norm,
            text_linear,
            depformer,
            cond,
            tc,
            tc_shape,
            rng: dev.alloc(max_slots * 4 * 8)?,
            params: dev.alloc(max_slots * std::mem::size_of::<SlotParams>())?,
            x: scratch(dev, scratch_rows * dim, DType::F32)?,
            tout: scratch(dev, scratch_rows * dim, act)?,
            text_logits: scratch(dev, scratch_rows * cfg.text_card, DType::F32)?,
            tokens: scratch(dev, max_bucket.max(1) * k, DType::F32)?,
            text: scratch(dev, max_bucket.max(1), DType::F32)?,
            audio: scratch(dev, max_bucket.max(1) * cfg.dep_q, DType::F32)?,
            scratch: sc,
            host_cond: vec![0.0; 2 * dim],
            host_tmp: vec![0.0; dim],
            memory,
            cfg: cfg.clone(),
        };
        let defaults = GenParams::default();
        for s in 0..max_slots {
            lm.reset_slot(dev, s, &defaults)?
                .map_err(|e| GpuError::Unsupported(format!("default parameters: {e}")))?;
        }
        Ok(lm)
    }

    /// The configuration.
    pub fn config(&self) -> &LmConfig {
        &self.cfg
    }

    /// Rows per slot-step (2 with conditioners).
    pub fn rows_per_slot(&self) -> usize {
        self.rps
    }

    /// Device memory.
    pub fn memory(&self) -> LmMemory {
        self.memory
    }

    /// The text logits of batch row `row` of the last step (`text_card` f32).
    pub fn text_logits_row(&self, row: usize) -> DevPtr {
        self.text_logits + (row * self.cfg.text_card * 4) as u64
    }

    /// Starts a new stream in `slot`: validates `params` (as the CPU LM),
    /// writes the slot's condition rows, sampling parameters and RNG, and
    /// clears its token cache and offset. Returns whether the slot uses
    /// guidance. On a parameter error nothing is changed.
    pub fn reset_slot<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        slot: usize,
        params: &GenParams,
    ) -> Result<Result<bool, ParamError>, GpuError> {
        if slot >= self.max_slots {
            return Ok(Err(ParamError::NoSuchSlot {
                slot,
                max_slots: self.max_slots,
            }));
        }
        let d = self.cfg.dim;
        let (cond, null) = self.host_cond.split_at_mut(d);
        let setup = match self
            .conditioning
            .prepare(params, cond, null, &mut self.host_tmp)
        {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        };
        if self.cond != NULL {
            let at = self.cond + (slot * self.rps * d * 4) as u64;
            dev.upload(at, as_bytes(&self.host_cond[..self.rps * d]))?;
        }
        let clamp = |k: usize| i32::try_from(k).unwrap_or(i32::MAX);
        let p = SlotParams {
            temp_text: setup.text.temp,
            temp_audio: setup.audio.temp,
            top_k_text: clamp(setup.text.top_k),
            top_k_audio: clamp(setup.audio.top_k),
            use_sampling: setup.text.use_sampling as i32,
            cfg_coef: setup.cfg_coef.unwrap_or(1.0),
        };
        let psize = std::mem::size_of::<SlotParams>();
        dev.upload(self.params + (slot * psize) as u64, as_bytes(&[p]))?;
        let r = TextRulesParams {
            pad_bonus: setup.rules.pad_bonus,
            context: setup.rules.repetition.map_or(0, |(c, _)| clamp(c)),
            penalty: setup.rules.repetition.map_or(1.0, |(_, p)| p),
        };
        let rsize = std::mem::size_of::<TextRulesParams>();
        dev.upload(self.rules.rules + (slot * rsize) as u64, as_bytes(&[r]))?;
        dev.memset_zero(self.rules.hist_n + (slot * 4) as u64, 4)?;
        let rng = crate::rng::seed_state(setup.seed);
        dev.upload(self.rng + (slot * 32) as u64, as_bytes(&rng))?;
        let per_slot = self.tc_shape.codebooks * self.tc_shape.ring * 4;
        dev.memset_zero(self.tc.cache + (slot * per_slot) as u64, per_slot)?;
        if self.tc.forced != NULL {
            dev.memset_zero(self.tc.forced + (slot * per_slot) as u64, per_slot)?;
        }
        dev.memset_zero(self.tc.offset + (slot * 4) as u64, 4)?;
        Ok(Ok(setup.cfg_coef.is_some()))
    }

    /// Sets `slot`'s step counter (the token cache's offset) to `offset`
    /// (timing: see `GpuModel::fast_forward_for_timing`).
    pub fn set_offset<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        slot: usize,
        offset: usize,
    ) -> Result<(), GpuError> {
        let v = i32::try_from(offset)
            .map_err(|_| GpuError::Unsupported(format!("offset {offset} too large")))?;
        dev.upload(self.tc.offset + (slot * 4) as u64, as_bytes(&[v]))?;
        Ok(())
    }

    /// Issues one frame for `bucket` slot-steps (see the module doc).
    pub fn issue_step<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        k: &LmKernels,
        bucket: usize,
        io: &LmStepIo,
    ) -> DeviceResult<()> {
        let cfg = &self.cfg;
        let (dim, act) = (cfg.dim, self.act);
        let rows = bucket * self.rps;
        debug_assert!(rows <= self.max_rows);
        dev.phase(Phase::LmSmall);
        k.embed.cache_in(
            dev,
            &self.tc,
            &self.tc_shape,
            io.steps,
            bucket,
            io.user_codes,
            self.tokens,
        )?;
        k.embed.sum(
            dev,
            act,
            self.x,
            self.audio_emb.ptr,
            self.text_emb.ptr,
            self.cond,
            io.rows,
            rows,
            self.tokens,
            self.tc_shape.codebooks,
            cfg.card,
            dim,
        )?;
        self.temporal
            .forward(dev, k, 0, rows, self.x, io.rows, &self.scratch)?;
        dev.phase(Phase::LmSmall);
        k.norm.rms_norm(
            dev,
            self.x,
            self.out_norm,
            cfg.norm.eps(),
            dim,
            io.rows,
            rows,
            self.tout,
            act,
        )?;
        proj::project(
            dev,
            k,
            proj::ProjPhases::TEXT_HEAD,
            proj::ProjIn::Act(self.tout),
            act,
            rows,
            &self.text_linear,
            self.text_logits,
            false,
            self.tout,
        )?;
        let text_args = SampleArgs {
            logits: self.text_logits,
            vocab: cfg.text_card,
            ld: cfg.text_card,
            steps: io.steps,
            n_steps: bucket,
            params: self.params,
            audio: false,
            rng: self.rng,
            out: self.text,
            out_stride: 1,
        };
        self.sample_text(dev, k, bucket, io, &text_args)?;
        self.depformer.run(
            dev,
            k,
            rows,
            self.tout,
            &io.dep_rows,
            text_args,
            self.text,
            self.audio,
            &self.scratch,
            (&self.tc, &self.tc_shape),
        )?;
        dev.phase(Phase::LmSmall);
        k.embed.cache_out(
            dev,
            &self.tc,
            &self.tc_shape,
            io.steps,
            bucket,
            self.text,
            self.audio,
            io.out,
            io.ready,
        )
    }

    /// The text token of each slot-step from the text logits: Kyutai's text
    /// rules on the logits, sampling, PersonaPlex's forced text entries,
    /// then the rules' history.
    fn sample_text<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        k: &LmKernels,
        bucket: usize,
        io: &LmStepIo,
        args: &SampleArgs,
    ) -> DeviceResult<()> {
        dev.phase(Phase::LmSample);
        k.rules.apply(
            dev,
            &self.rules,
            io.steps,
            bucket,
            self.text_logits,
            self.cfg.text_card,
            self.cfg.text_card,
        )?;
        k.sample.sample(dev, args)?;
        k.embed.force(
            dev,
            &self.tc,
            &self.tc_shape,
            io.steps,
            bucket,
            0,
            self.text,
            1,
        )?;
        k.rules.push(dev, &self.rules, io.steps, bucket, self.text)
    }
}
