//! The depformer: the small transformer that, within one frame, predicts the
//! `dep_q` generated audio codebooks one after the other from the temporal
//! transformer's output (`LMModel.forward_depformer` / `LMGen.depformer_step`).
//!
//! Step `k` input: `depformer_in[in_index(k)](transformer_out)` plus the
//! embedding of the previous token (the text token for `k = 0`, via
//! `depformer_text_emb`; audio codebook `k − 1` via `depformer_emb[k − 1]`
//! otherwise; both optionally low-rank). The stack uses weight set
//! `weight_set(k)` and attends over positions `0..=k` of this frame; the head
//! is `linears[k]`, after `depformer_norms[k]` when the config has a
//! `depformer_norm` (an identity otherwise). Invariants: all rows run each
//! step's linears together; the per-frame KV cache is scratch (rewritten
//! from position 0 every frame).

use super::embeddings::Embedding;
use super::linear::linear;
use super::transformer::{AttnRow, Stack, StackScratch, StackShape};
use crate::config::{LmConfig, NormKind};
use crate::ops::{layer_norm, rms_norm};
use crate::weights::{CheckpointError, TensorSpec, Weights};

/// One head's norm (`depformer_norms.{k}`): an RMSNorm's `alpha`, or a
/// LayerNorm's weight and bias.
struct HeadNorm {
    kind: NormKind,
    weight: Vec<f32>,
    bias: Vec<f32>,
}

/// Names and shapes of the tensors of `depformer_norms.{k}` for `kind`.
pub fn head_norm_specs(kind: NormKind, k: usize, dim: usize) -> Vec<TensorSpec> {
    if kind.is_layer_norm() {
        vec![
            TensorSpec::new(format!("depformer_norms.{k}.weight"), &[dim]),
            TensorSpec::new(format!("depformer_norms.{k}.bias"), &[dim]),
        ]
    } else {
        vec![TensorSpec::new(
            format!("depformer_norms.{k}.alpha"),
            &[1, 1, dim],
        )]
    }
}

/// Depformer weights.
pub(crate) struct Depformer {
    dep_q: usize,
    dim: usize,
    lm_dim: usize,
    card: usize,
    /// `depformer_in` index per step.
    in_index: Vec<usize>,
    /// Weight set per step.
    set_index: Vec<usize>,
    depformer_in: Vec<Vec<f32>>,
    text_emb: Embedding,
    emb: Vec<Embedding>,
    stack: Stack,
    /// `depformer_norms`, one per step, when the config has them.
    norms: Vec<HeadNorm>,
    linears: Vec<Vec<f32>>,
}

/// The depformer stack's shape for `cfg`.
pub fn stack_shape(cfg: &LmConfig) -> StackShape {
    let d = &cfg.depformer;
    let sets = d.num_weight_sets(cfg.dep_q);
    StackShape {
        dim: d.dim,
        heads: d.num_heads,
        kv_heads: d.num_heads / d.kv_repeat,
        layers: d.num_layers,
        hidden: cfg.depformer_ffn_hidden(),
        sets,
        gating_list: d.weights_per_step,
        // The official depformer runs with `context = None` and a cache of
        // `dep_q` entries: every step sees the whole frame so far.
        capacity: cfg.dep_q,
        context: cfg.dep_q,
        rope: d.pos_emb.rope(d.max_period),
        eps: cfg.norm.eps(),
    }
}

/// `depformer_in` index of each step and the number of such projections.
pub fn in_indices(cfg: &LmConfig) -> (Vec<usize>, usize) {
    match &cfg.depformer.weights_per_step_schedule {
        Some(s) => (s.clone(), s.iter().max().map_or(0, |m| m + 1)),
        None => ((0..cfg.dep_q).collect(), cfg.dep_q),
    }
}

/// Tensors of the depformer steps a file stores but the model never runs
/// (PersonaPlex's steps `dep_q..dep_q_stored`, which predict the user's
/// audio): checked and skipped at load.
pub fn unused_step_specs(cfg: &LmConfig) -> Vec<TensorSpec> {
    let mut out = Vec::new();
    let d = cfg.depformer.dim;
    let rank = cfg.depformer.low_rank_embeddings;
    let sh = stack_shape(cfg);
    for k in cfg.dep_q..cfg.dep_q_stored {
        out.push(TensorSpec::new(
            format!("depformer_in.{k}.weight"),
            &[d, cfg.dim],
        ));
        Embedding::specs(
            &format!("depformer_emb.{}", k - 1),
            cfg.card + 1,
            d,
            rank,
            &mut out,
        );
        out.push(TensorSpec::new(
            format!("linears.{k}.weight"),
            &[cfg.card, d],
        ));
        for l in 0..sh.layers {
            out.extend(Stack::set_specs("depformer", &sh, l, k));
        }
    }
    out
}

impl Depformer {
    /// Tensors of the depformer.
    pub(crate) fn specs(cfg: &LmConfig, out: &mut Vec<TensorSpec>) {
        let d = cfg.depformer.dim;
        let rank = cfg.depformer.low_rank_embeddings;
        let (_, n_in) = in_indices(cfg);
        for i in 0..n_in {
            out.push(TensorSpec::new(
                format!("depformer_in.{i}.weight"),
                &[d, cfg.dim],
            ));
        }
        for k in 0..cfg.dep_q.saturating_sub(1) {
            Embedding::specs(&format!("depformer_emb.{k}"), cfg.card + 1, d, rank, out);
        }
        Embedding::specs("depformer_text_emb", cfg.text_card + 1, d, rank, out);
        Stack::specs("depformer", &stack_shape(cfg), out);
        if let Some(kind) = cfg.depformer.norm {
            for k in 0..cfg.dep_q {
                out.extend(head_norm_specs(kind, k, d));
            }
        }
        for k in 0..cfg.dep_q {
            out.push(TensorSpec::new(
                format!("linears.{k}.weight"),
                &[cfg.card, d],
            ));
        }
    }

    /// Loads the depformer.
    pub(crate) fn load(cfg: &LmConfig, w: &mut Weights) -> Result<Self, CheckpointError> {
        let d = cfg.depformer.dim;
        let rank = cfg.depformer.low_rank_embeddings;
        let (in_index, n_in) = in_indices(cfg);
        let depformer_in = (0..n_in)
            .map(|i| w.take(&format!("depformer_in.{i}.weight"), &[d, cfg.dim]))
            .collect::<Result<Vec<_>, _>>()?;
        let emb = (0..cfg.dep_q.saturating_sub(1))
            .map(|k| Embedding::load(w, &format!("depformer_emb.{k}"), cfg.card + 1, d, rank))
            .collect::<Result<Vec<_>, _>>()?;
        let text_emb = Embedding::load(w, "depformer_text_emb", cfg.text_card + 1, d, rank)?;
        let stack = Stack::load(w, "depformer", stack_shape(cfg))?;
        let mut norms = Vec::new();
        if let Some(kind) = cfg.depformer.norm {
            for k in 0..cfg.dep_q {
                let specs = head_norm_specs(kind, k, d);
                let weight = w.take(&specs[0].name, &specs[0].shape)?;
                let bias = match specs.get(1) {
                    Some(b) => w.take(&b.name, &b.shape)?,
                    None => Vec::new(),
                };
                norms.push(HeadNorm { kind, weight, bias });
            }
        }
        let linears = (0..cfg.dep_q)
            .map(|k| w.take(&format!("linears.{k}.weight"), &[cfg.card, d]))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Depformer {
            dep_q: cfg.dep_q,
            dim: d,
            lm_dim: cfg.dim,
            card: cfg.card,
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
        })
    }

    /// The stack (for sizing scratch and caches).
    pub(crate) fn stack(&self) -> &Stack {
        &self.stack
    }

    /// Width of the `tmp` scratch of [`Depformer::step`]: the widest
    /// stored embedding row (low-rank gathers) or, with head norms, the
    /// depformer width (the normed rows).
    pub(crate) fn emb_width(&self) -> usize {
        self.emb
            .iter()
            .map(Embedding::width)
            .chain([self.text_emb.width()])
            .chain(self.norms.first().map(|_| self.dim))
            .max()
            .unwrap_or(0)
    }

    /// Runs depformer step `k` for `rows.len()` rows: `tout` is the temporal
    /// output `[n, lm_dim]`, `prev` the previous token of each row; leaves the
    /// logits `[n, card]` in `logits`. `x` (`[n, dim]`) and `tmp` (`[n,
    /// emb_width]`) are scratch, `kv` the per-frame cache (one row per batch row).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn step(
        &self,
        k: usize,
        tout: &[f32],
        prev: impl Iterator<Item = u32>,
        rows: &[AttnRow],
        x: &mut [f32],
        tmp: &mut [f32],
        kv: &mut [f32],
        sc: &mut StackScratch,
        logits: &mut [f32],
    ) {
        debug_assert!(k < self.dep_q);
        let n = rows.len();
        let x = &mut x[..n * self.dim];
        linear(
            &tout[..n * self.lm_dim],
            n,
            &self.depformer_in[self.in_index[k]],
            self.dim,
            self.lm_dim,
            x,
        );
        let emb = if k == 0 {
            &self.text_emb
        } else {
            &self.emb[k - 1]
        };
        emb.add_rows(prev, x, tmp);
        self.stack.forward(self.set_index[k], x, rows, kv, sc);
        let head_in = match self.norms.get(k) {
            None => &*x,
            Some(norm) => {
                let y = &mut tmp[..n * self.dim];
                if norm.kind.is_layer_norm() {
                    layer_norm(x, &norm.weight, &norm.bias, norm.kind.eps(), self.dim, y);
                } else {
                    rms_norm(x, &norm.weight, norm.kind.eps(), self.dim, y);
                }
                &*y
            }
        };
        linear(
            head_in,
            n,
            &self.linears[k],
            self.card,
            self.dim,
            &mut logits[..n * self.card],
        );
    }
}
