//! The streaming transformer of the LM (`StreamingTransformer` with
//! `StreamingTransformerLayer`s): pre-norm RMSNorm, causal multi-head
//! self-attention over a ring KV cache with optional RoPE (interleaved
//! pairs, or the two halves of each head for `rope_concat`) and grouped
//! query heads (`kv_repeat`: query head `h` reads key/value head
//! `h / kv_repeat`, the official `expand_repeated_kv`), and a
//! SiLU-gated feed-forward block (`ActivationGating`). The same code runs the
//! temporal transformer (one weight set, ring of `context` steps, RoPE at the
//! stream's offset) and the depformer (one weight set per codebook step,
//! positions 0..dep_q within a frame).
//!
//! Invariants: every linear layer runs once over all rows of the batch
//! (`rows` are gathered, contiguous); attention is per row and only reads the
//! cache entries of that row written since its last reset (positions
//! `pos + 1 - min(pos + 1, context) ..= pos`), so stale cache contents are never
//! seen and rows never mix. No allocation: scratch is sized by the caller for
//! the largest batch.

use super::linear::{linear, linear_acc};
use crate::config::Rope;
use crate::ops::{rms_norm, rope_freqs, rope_halves, rope_interleaved, silu, softmax_inplace};
use crate::weights::{CheckpointError, TensorSpec, Weights};

/// Hidden width of an official `ActivationGating` for a model width and a
/// configured `dim_feedforward` (note the special case of exactly `4 · dim`).
pub fn gating_hidden(dim: usize, dim_feedforward: usize) -> usize {
    if dim_feedforward == 4 * dim {
        21 * dim / 8
    } else {
        2 * dim_feedforward / 3
    }
}

/// Shape of one transformer stack (every backend builds its stacks from it).
#[derive(Debug, Clone, PartialEq)]
pub struct StackShape {
    /// Width.
    pub dim: usize,
    /// Attention (query) heads.
    pub heads: usize,
    /// Key/value heads (`heads / kv_repeat`); the KV cache stores
    /// `kv_heads · dim / heads` values per position.
    pub kv_heads: usize,
    /// Layers.
    pub layers: usize,
    /// Gated feed-forward hidden width.
    pub hidden: usize,
    /// Weight sets (1, or one per scheduled depformer step).
    pub sets: usize,
    /// Whether the gating modules are a per-step list (`gating.{i}.…`).
    pub gating_list: bool,
    /// Ring KV cache length.
    pub capacity: usize,
    /// Attention window (steps, including the current one).
    pub context: usize,
    /// The rotary embedding, when one is used.
    pub rope: Option<Rope>,
    /// Norm epsilon.
    pub eps: f32,
}

impl StackShape {
    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.dim / self.heads
    }

    /// Width of the keys (and of the values) of one position.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim()
    }

    /// Rows of an in-projection: the queries (`dim`), then the keys and
    /// the values (`kv_dim` each).
    pub fn qkv_dim(&self) -> usize {
        self.dim + 2 * self.kv_dim()
    }

    /// Query heads per key/value head.
    pub fn kv_repeat(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// One weight set of a layer.
#[derive(Clone)]
struct SetWeights {
    /// `[dim + 2·kv_dim, dim]`: q `(heads, head_dim)`, then k and v
    /// `(kv_heads, head_dim)` each.
    in_proj: Vec<f32>,
    /// `[dim, dim]`.
    out_proj: Vec<f32>,
    /// `[2·hidden, dim]`: gate then value.
    ff_in: Vec<f32>,
    /// `[dim, hidden]`.
    ff_out: Vec<f32>,
}

#[derive(Clone)]
struct Layer {
    norm1: Vec<f32>,
    norm2: Vec<f32>,
    sets: Vec<SetWeights>,
}

/// A row of the batch as attention sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnRow {
    /// Which KV cache row (index into the cache's leading dimension).
    pub kv_row: usize,
    /// Position of this step in the row's stream.
    pub pos: usize,
}

/// Scratch for [`Stack::forward`], sized for `rows` rows of the widest stack.
pub(crate) struct StackScratch {
    h: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    ff: Vec<f32>,
    act: Vec<f32>,
    scores: Vec<f32>,
}

impl StackScratch {
    /// Scratch for up to `rows` rows of any of `shapes`.
    pub(crate) fn new(rows: usize, shapes: &[&StackShape]) -> Self {
        let dim = shapes.iter().map(|s| s.dim).max().unwrap_or(0);
        let qkv = shapes.iter().map(|s| s.qkv_dim()).max().unwrap_or(0);
        let hidden = shapes.iter().map(|s| s.hidden).max().unwrap_or(0);
        let ctx = shapes
            .iter()
            .map(|s| s.context.min(s.capacity))
            .max()
            .unwrap_or(0);
        StackScratch {
            h: vec![0.0; rows * dim],
            qkv: vec![0.0; rows * qkv],
            attn: vec![0.0; rows * dim],
            ff: vec![0.0; rows * 2 * hidden],
            act: vec![0.0; rows * hidden],
            scores: vec![0.0; ctx],
        }
    }
}

/// A loaded transformer stack.
#[derive(Clone)]
pub(crate) struct Stack {
    shape: StackShape,
    head_dim: usize,
    freqs: Option<Vec<f32>>,
    layers: Vec<Layer>,
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent partial sums so the loop vectorises.
    let mut acc = [0.0f32; 8];
    let (ac, ar) = a.split_at(a.len() - a.len() % 8);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(8).zip(bc.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

impl Stack {
    fn layer_names(prefix: &str, shape: &StackShape, l: usize, set: usize) -> [String; 4] {
        let g = if shape.gating_list {
            format!("{prefix}.layers.{l}.gating.{set}")
        } else {
            format!("{prefix}.layers.{l}.gating")
        };
        [
            format!("{prefix}.layers.{l}.self_attn.in_projs.{set}.weight"),
            format!("{prefix}.layers.{l}.self_attn.out_projs.{set}.weight"),
            format!("{g}.linear_in.weight"),
            format!("{g}.linear_out.weight"),
        ]
    }

    fn set_shapes(shape: &StackShape) -> [[usize; 2]; 4] {
        let (d, h) = (shape.dim, shape.hidden);
        [[shape.qkv_dim(), d], [d, d], [2 * h, d], [d, h]]
    }

    /// Tensors of weight set `set` of layer `l`.
    pub(crate) fn set_specs(
        prefix: &str,
        shape: &StackShape,
        l: usize,
        set: usize,
    ) -> Vec<TensorSpec> {
        Self::layer_names(prefix, shape, l, set)
            .into_iter()
            .zip(Self::set_shapes(shape))
            .map(|(n, s)| TensorSpec::new(n, &s))
            .collect()
    }

    /// Tensors of the stack under `prefix` (`transformer`, `depformer`).
    pub(crate) fn specs(prefix: &str, shape: &StackShape, out: &mut Vec<TensorSpec>) {
        let d = shape.dim;
        for l in 0..shape.layers {
            out.push(TensorSpec::new(
                format!("{prefix}.layers.{l}.norm1.alpha"),
                &[1, 1, d],
            ));
            out.push(TensorSpec::new(
                format!("{prefix}.layers.{l}.norm2.alpha"),
                &[1, 1, d],
            ));
            for set in 0..shape.sets {
                out.extend(Self::set_specs(prefix, shape, l, set));
            }
        }
    }

    /// Loads the stack under `prefix`.
    pub(crate) fn load(
        w: &mut Weights,
        prefix: &str,
        shape: StackShape,
    ) -> Result<Self, CheckpointError> {
        let d = shape.dim;
        let mut layers = Vec::with_capacity(shape.layers);
        for l in 0..shape.layers {
            let norm1 = w.take(&format!("{prefix}.layers.{l}.norm1.alpha"), &[1, 1, d])?;
            let norm2 = w.take(&format!("{prefix}.layers.{l}.norm2.alpha"), &[1, 1, d])?;
            let mut sets = Vec::with_capacity(shape.sets);
            for set in 0..shape.sets {
                let [a, b, c, e] = Self::layer_names(prefix, &shape, l, set);
                let [sa, sb, sc, se] = Self::set_shapes(&shape);
                sets.push(SetWeights {
                    in_proj: w.take(&a, &sa)?,
                    out_proj: w.take(&b, &sb)?,
                    ff_in: w.take(&c, &sc)?,
                    ff_out: w.take(&e, &se)?,
                });
            }
            layers.push(Layer { norm1, norm2, sets });
        }
        let head_dim = d / shape.heads;
        let freqs = shape.rope.map(|r| {
            let mut f = vec![0.0; head_dim / 2];
            rope_freqs(head_dim, r.period, &mut f);
            f
        });
        Ok(Stack {
            shape,
            head_dim,
            freqs,
            layers,
        })
    }

    /// The same weights with another cache capacity and attention window.
    #[cfg(test)]
    pub(crate) fn with_window(&self, capacity: usize, context: usize) -> Stack {
        let mut s = self.clone();
        s.shape.capacity = capacity;
        s.shape.context = context;
        s
    }

    /// The shape.
    pub(crate) fn shape(&self) -> &StackShape {
        &self.shape
    }

    /// Floats of KV cache per cache row.
    pub(crate) fn kv_row_len(&self) -> usize {
        self.shape.layers * 2 * self.shape.capacity * self.shape.kv_dim()
    }

    /// Copies the keys and values of position `pos` of one KV row (every
    /// layer: `[layers][2][kv_dim]`) into `out`.
    pub(crate) fn read_position(&self, kv_row: &[f32], pos: usize, out: &mut [f32]) {
        let kvd = self.shape.kv_dim();
        let plane = self.shape.capacity * kvd;
        let at = (pos % self.shape.capacity) * kvd;
        for (l, o) in out.chunks_exact_mut(2 * kvd).enumerate() {
            let base = l * 2 * plane;
            o[..kvd].copy_from_slice(&kv_row[base + at..base + at + kvd]);
            o[kvd..].copy_from_slice(&kv_row[base + plane + at..base + plane + at + kvd]);
        }
    }

    /// Writes what [`Stack::read_position`] read back at position `pos`.
    pub(crate) fn write_position(&self, kv_row: &mut [f32], pos: usize, src: &[f32]) {
        let kvd = self.shape.kv_dim();
        let plane = self.shape.capacity * kvd;
        let at = (pos % self.shape.capacity) * kvd;
        for (l, s) in src.chunks_exact(2 * kvd).enumerate() {
            let base = l * 2 * plane;
            kv_row[base + at..base + at + kvd].copy_from_slice(&s[..kvd]);
            kv_row[base + plane + at..base + plane + at + kvd].copy_from_slice(&s[kvd..]);
        }
    }

    /// Runs the stack in place on `x` (`[rows.len(), dim]`), with weight set
    /// `set`, writing this step's keys and values into `kv` (`[kv rows,
    /// kv_row_len]`) at each row's position.
    pub(crate) fn forward(
        &self,
        set: usize,
        x: &mut [f32],
        rows: &[AttnRow],
        kv: &mut [f32],
        sc: &mut StackScratch,
    ) {
        let n = rows.len();
        let sh = &self.shape;
        let (d, hid, kvd, qd) = (sh.dim, sh.hidden, sh.kv_dim(), sh.qkv_dim());
        let x = &mut x[..n * d];
        let h = &mut sc.h[..n * d];
        let kv_row_len = self.kv_row_len();
        let plane = sh.capacity * kvd;
        for (l, layer) in self.layers.iter().enumerate() {
            let w = &layer.sets[set];
            // Self-attention block.
            rms_norm(x, &layer.norm1, sh.eps, d, h);
            let qkv = &mut sc.qkv[..n * qd];
            linear(h, n, &w.in_proj, qd, d, qkv);
            for (r, row) in rows.iter().enumerate() {
                let qkv = &mut qkv[r * qd..(r + 1) * qd];
                if let (Some(f), Some(rope)) = (&self.freqs, sh.rope) {
                    let pos = row.pos as f32;
                    // Queries and keys: every head of the first dim + kv_dim values.
                    for head in qkv[..d + kvd].chunks_exact_mut(self.head_dim) {
                        if rope.interleaved {
                            rope_interleaved(head, f, pos);
                        } else {
                            rope_halves(head, f, pos);
                        }
                    }
                }
                let base = row.kv_row * kv_row_len + l * 2 * plane;
                let (kc, vc) = kv[base..base + 2 * plane].split_at_mut(plane);
                let slot = row.pos % sh.capacity;
                kc[slot * kvd..(slot + 1) * kvd].copy_from_slice(&qkv[d..d + kvd]);
                vc[slot * kvd..(slot + 1) * kvd].copy_from_slice(&qkv[d + kvd..]);
                self.attend(
                    &qkv[..d],
                    kc,
                    vc,
                    row.pos,
                    &mut sc.attn[r * d..(r + 1) * d],
                    &mut sc.scores,
                );
            }
            linear_acc(&sc.attn[..n * d], n, &w.out_proj, d, d, x);
            // Feed-forward block.
            rms_norm(x, &layer.norm2, sh.eps, d, h);
            let ff = &mut sc.ff[..n * 2 * hid];
            linear(h, n, &w.ff_in, 2 * hid, d, ff);
            let act = &mut sc.act[..n * hid];
            for (a, g) in act.chunks_exact_mut(hid).zip(ff.chunks_exact(2 * hid)) {
                let (gate, val) = g.split_at(hid);
                for ((o, &x), &y) in a.iter_mut().zip(gate).zip(val) {
                    *o = silu(x) * y;
                }
            }
            linear_acc(act, n, &w.ff_out, d, hid, x);
        }
    }

    /// Causal attention of one query over the row's cache.
    fn attend(
        &self,
        q: &[f32],
        kc: &[f32],
        vc: &[f32],
        pos: usize,
        out: &mut [f32],
        scores: &mut [f32],
    ) {
        let sh = &self.shape;
        let (kvd, hd, rep) = (sh.kv_dim(), self.head_dim, sh.kv_repeat());
        let len = (pos + 1).min(sh.context).min(sh.capacity);
        let start = pos + 1 - len;
        let scale = 1.0 / (hd as f32).sqrt();
        let scores = &mut scores[..len];
        for head in 0..sh.heads {
            let o = head * hd;
            // The key/value head this query head shares with `rep - 1` others.
            let ko = (head / rep) * hd;
            let qh = &q[o..o + hd];
            for (s, p) in scores.iter_mut().zip(start..=pos) {
                let i = (p % sh.capacity) * kvd + ko;
                *s = dot(qh, &kc[i..i + hd]) * scale;
            }
            softmax_inplace(scores);
            let oh = &mut out[o..o + hd];
            oh.fill(0.0);
            for (&s, p) in scores.iter().zip(start..=pos) {
                let i = (p % sh.capacity) * kvd + ko;
                for (y, v) in oh.iter_mut().zip(&vc[i..i + hd]) {
                    *y += s * v;
                }
            }
        }
    }
}
