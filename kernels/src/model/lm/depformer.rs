//! The depformer on the device: within one frame, the `dep_q` generated
//! audio codebooks one after the other (CPU reference:
//! `moshid_model::lm` depformer). Step `k`: `depformer_in[in_index(k)]` of
//! the temporal output, plus the embedding of the previous token (the text
//! token at step 0, codebook `k − 1` after; optionally low-rank), the stack
//! with weight set `weight_set(k)` attending over positions `0..=k` of this
//! frame, the head `linears[k]` (after `depformer_norms[k]` when the config
//! has a `depformer_norm`), then sampling into codebook `k`.
//!
//! The projections go through proj.rs (for few rows one launch each, the
//! head's cast to bf16 inside it) and the stack's attention is one launch
//! per layer (short_attn.cu).
//!
//! Invariants: the per-frame KV cache has one row per batch row and is
//! rewritten from position 0 every frame (never reset); every launch
//! depends only on the bucket's row count and fixed pointers (capturable).

use super::super::tensor::{scratch, DevTensor, Init, WeightLoader};
use super::super::GpuError;
use super::proj::{project, ProjIn};
use super::stack::{Stack, StackScratch};
use super::LmKernels;
use crate::device::{DType, DevPtr, Device, DeviceResult, Phase, StackPhases};
use crate::ops::attention::KvType;
use crate::ops::embed::{TokenCache, TokenCacheShape};
use crate::ops::sampling::SampleArgs;
use moshid_model::config::{LmConfig, NormKind};

/// The norm before one head (`depformer_norms.{k}`), f32 on the device: an
/// RMSNorm's `alpha` (bias NULL) or a LayerNorm's weight and bias.
struct HeadNorm {
    kind: NormKind,
    weight: DevPtr,
    bias: DevPtr,
}

/// An embedding table, optionally low-rank (`[rows][rank]` + `[dim][rank]`).
pub(super) struct Embedding {
    pub table: DevTensor,
    pub low_rank: Option<DevTensor>,
}

impl Embedding {
    pub fn load<D: Device + ?Sized>(
        dev: &mut D,
        w: &mut WeightLoader<'_>,
        name: &str,
        rows: usize,
        dim: usize,
        rank: Option<usize>,
        dtype: DType,
    ) -> Result<Embedding, GpuError> {
        let width = rank.unwrap_or(dim);
        let table = w.tensor(
            dev,
            &format!("{name}.weight"),
            &[rows, width],
            dtype,
            Init::Embedding,
        )?;
        let low_rank = match rank {
            Some(r) => Some(w.tensor(
                dev,
                &format!("{name}.low_rank.weight"),
                &[dim, r],
                dtype,
                Init::Linear,
            )?),
            None => None,
        };
        Ok(Embedding { table, low_rank })
    }
}

/// Depformer weights, per-frame cache and scratch.
pub(super) struct Depformer {
    dep_q: usize,
    dim: usize,
    card: usize,
    act: DType,
    in_index: Vec<usize>,
    set_index: Vec<usize>,
    depformer_in: Vec<DevTensor>,
    text_emb: Embedding,
    emb: Vec<Embedding>,
    pub stack: Stack,
    /// One per step when the config has `depformer_norm`, else empty.
    norms: Vec<HeadNorm>,
    linears: Vec<DevTensor>,
    /// `[rows][dim]` f32 residual stream.
    x: DevPtr,
    /// `[rows][dim]` act: the heads' input (the stream normed, or cast to
    /// bf16 in bf16 mode).
    x_act: DevPtr,
    /// `[rows][widest rank]` gathered low-rank rows.
    low_rank_tmp: DevPtr,
    /// `[rows][card]` f32 logits of the current step.
    pub logits: DevPtr,
}

impl Depformer {
    pub fn load<D: Device + ?Sized>(
        dev: &mut D,
        w: &mut WeightLoader<'_>,
        cfg: &LmConfig,
        act: DType,
        max_rows: usize,
    ) -> Result<Depformer, GpuError> {
        let d = cfg.depformer.dim;
        let rank = cfg.depformer.low_rank_embeddings;
        let (in_index, n_in) = moshid_model::lm::depformer_in_indices(cfg);
        let depformer_in = (0..n_in)
            .map(|i| {
                w.tensor(
                    dev,
                    &format!("depformer_in.{i}.weight"),
                    &[d, cfg.dim],
                    act,
                    Init::Linear,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let emb = (0..cfg.dep_q.saturating_sub(1))
            .map(|k| {
                Embedding::load(
                    dev,
                    w,
                    &format!("depformer_emb.{k}"),
                    cfg.card + 1,
                    d,
                    rank,
                    act,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let text_emb = Embedding::load(
            dev,
            w,
            "depformer_text_emb",
            cfg.text_card + 1,
            d,
            rank,
            act,
        )?;
        let kv = match act {
            DType::F32 => KvType::F32,
            DType::Bf16 => KvType::Bf16,
        };
        let stack = Stack::load(
            dev,
            w,
            "depformer",
            moshid_model::lm::depformer_shape(cfg),
            act,
            kv,
            max_rows,
            StackPhases::DEPFORMER,
        )?
        .with_short_attention();
        let mut norms = Vec::new();
        if let Some(kind) = cfg.depformer.norm {
            for k in 0..cfg.dep_q {
                let specs = moshid_model::lm::depformer_head_norm_specs(kind, k, d);
                let weight = w
                    .tensor(dev, &specs[0].name, &specs[0].shape, DType::F32, Init::Ones)?
                    .ptr;
                let bias = match specs.get(1) {
                    Some(b) => {
                        w.tensor(dev, &b.name, &b.shape, DType::F32, Init::Zeros)?
                            .ptr
                    }
                    None => crate::device::NULL,
                };
                norms.push(HeadNorm { kind, weight, bias });
            }
        }
        let linears = (0..cfg.dep_q)
            .map(|k| {
                w.tensor(
                    dev,
                    &format!("linears.{k}.weight"),
                    &[cfg.card, d],
                    act,
                    Init::Linear,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Depformer {
            dep_q: cfg.dep_q,
            dim: d,
            card: cfg.card,
            act,
            in_index,
            set_index: (0..cfg.dep_q)
                .map(|k| cfg.depformer.weight_set(k))
                .collect(),
            depformer_in,
            text_emb,
            emb,
            stack,
            norms,
            linears,
            x: scratch(dev, max_rows * d, DType::F32)?,
            x_act: scratch(dev, max_rows * d, act)?,
            low_rank_tmp: scratch(dev, max_rows * rank.unwrap_or(1), act)?,
            logits: scratch(dev, max_rows * cfg.card, DType::F32)?,
        })
    }

    /// Runs every codebook step for `rows` rows: `tout` is the temporal
    /// output (`[rows][lm dim]`, act), `dep_rows` dep_q RowInfo arrays of
    /// `rows` entries (position k), `text` the sampled text tokens
    /// (`[n_steps]`), `audio` receives `[n_steps][dep_q]`.
    #[allow(clippy::too_many_arguments)]
    pub fn run<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        k: &LmKernels,
        rows: usize,
        tout: DevPtr,
        dep_rows: &[DevPtr],
        sample: SampleArgs,
        text: DevPtr,
        audio: DevPtr,
        sc: &StackScratch,
        force: (&TokenCache, &TokenCacheShape),
    ) -> DeviceResult<()> {
        let act = self.act;
        for (step, &row_info) in dep_rows.iter().enumerate().take(self.dep_q) {
            project(
                dev,
                k,
                StackPhases::DEPFORMER.into(),
                ProjIn::Act(tout),
                act,
                rows,
                &self.depformer_in[self.in_index[step]],
                self.x,
                false,
                tout,
            )?;
            self.add_embedding(dev, k, step, rows, row_info, text, audio)?;
            self.stack
                .forward(dev, k, self.set_index[step], rows, self.x, row_info, sc)?;
            self.head(dev, k, step, rows, row_info)?;
            dev.phase(Phase::DepSample);
            k.sample.sample(
                dev,
                &SampleArgs {
                    logits: self.logits,
                    vocab: self.card,
                    ld: self.card,
                    audio: true,
                    out: audio + 4 * step as u64,
                    out_stride: self.dep_q,
                    ..sample
                },
            )?;
            // PersonaPlex: a forced codebook feeds its target onwards.
            let (tc, sh) = force;
            k.embed.force(
                dev,
                tc,
                sh,
                sample.steps,
                sample.n_steps,
                1 + step,
                audio + 4 * step as u64,
                self.dep_q,
            )?;
        }
        Ok(())
    }

    /// Adds step `step`'s embedding of the previous token (the text token
    /// for step 0, else codebook `step - 1`) into `self.x`, through the
    /// low-rank projection when the checkpoint has one.
    #[allow(clippy::too_many_arguments)]
    fn add_embedding<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        k: &LmKernels,
        step: usize,
        rows: usize,
        row_info: DevPtr,
        text: DevPtr,
        audio: DevPtr,
    ) -> DeviceResult<()> {
        let (d, act) = (self.dim, self.act);
        let (emb, tokens, stride) = if step == 0 {
            (&self.text_emb, text, 1)
        } else {
            (
                &self.emb[step - 1],
                audio + 4 * (step as u64 - 1),
                self.dep_q,
            )
        };
        dev.phase(Phase::DepSmall);
        match &emb.low_rank {
            None => k.embed.add_rows(
                dev,
                act,
                self.x,
                emb.table.ptr,
                row_info,
                rows,
                tokens,
                stride,
                d,
            )?,
            Some(proj) => {
                k.embed.gather_rows(
                    dev,
                    act,
                    self.low_rank_tmp,
                    emb.table.ptr,
                    row_info,
                    rows,
                    tokens,
                    stride,
                    emb.table.cols,
                )?;
                project(
                    dev,
                    k,
                    StackPhases::DEPFORMER.into(),
                    ProjIn::Act(self.low_rank_tmp),
                    act,
                    rows,
                    proj,
                    self.x,
                    true,
                    self.low_rank_tmp,
                )?;
            }
        }
        Ok(())
    }

    /// Step `step`'s head: `self.logits` = head(norm(`self.x`)), the norm
    /// fused into the projection when it is an RMS norm (or the bf16 cast
    /// when there is none).
    fn head<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        k: &LmKernels,
        step: usize,
        rows: usize,
        row_info: DevPtr,
    ) -> DeviceResult<()> {
        let (d, act) = (self.dim, self.act);
        dev.phase(Phase::DepSmall);
        let head_in = match self.norms.get(step) {
            Some(n) if n.kind.is_layer_norm() => {
                k.norm.layer_norm_to(
                    dev,
                    self.x,
                    n.weight,
                    n.bias,
                    n.kind.eps(),
                    d,
                    row_info,
                    rows,
                    self.x_act,
                    act,
                )?;
                ProjIn::Act(self.x_act)
            }
            Some(n) => ProjIn::Rms {
                x: self.x,
                alpha: n.weight,
                eps: n.kind.eps(),
                rows: row_info,
            },
            None => ProjIn::Cast(self.x),
        };
        project(
            dev,
            k,
            StackPhases::DEPFORMER.into(),
            head_in,
            act,
            rows,
            &self.linears[step],
            self.logits,
            false,
            self.x_act,
        )
    }
}
