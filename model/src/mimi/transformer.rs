//! Mimi's streaming transformer (official `ProjectedTransformer` around a
//! `StreamingTransformer`, with `d_model == input == output` so there are no
//! projections): pre-norm layers `x += ls₁·Attn(LN₁(x))`,
//! `x += ls₂·W₂·gelu(W₁·LN₂(x))`, LayerNorm eps from the config, causal
//! multi-head attention with interleaved RoPE, no biases.
//!
//! Streaming, per slot: a ring KV cache of `context` entries per layer and a
//! step counter. A call with `t` steps first writes its `t` keys/values at
//! ring indices `(offset + i) mod context`, then each query at position `p`
//! attends to the ring entries whose position `q` satisfies
//! `0 ≤ p − q < context` (exactly the official `RingKVCache` + mask, including
//! its consequence that the first query of a call sees fewer than `context`
//! keys once the ring has wrapped). With [`KvWindow::ContextMinusOne`]
//! (NVIDIA's fork, PersonaPlex) positions are labelled from the call's end
//! instead of its last key: the entry the next write overwrites (the oldest
//! key) is labelled as a future position and never seen.
//!
//! Invariants: only the listed slots' caches and counters change; `forward`
//! does not allocate (scratch sized at creation for `max_slots × t_max`).

use super::act;
use super::conv::SlotBuf;
use super::linear::PackedLinear;
use crate::config::{KvWindow, MimiTransformerConfig};
use crate::ops;
use crate::weights::{CheckpointError, TensorSpec, Weights};

#[derive(Debug, Clone, Default)]
struct Layer {
    in_proj: PackedLinear,
    out_proj: PackedLinear,
    linear1: PackedLinear,
    linear2: PackedLinear,
    norm1_w: Vec<f32>,
    norm1_b: Vec<f32>,
    norm2_w: Vec<f32>,
    norm2_b: Vec<f32>,
    scale1: Vec<f32>,
    scale2: Vec<f32>,
}

/// One of Mimi's two transformers (`encoder_transformer` / `decoder_transformer`).
#[derive(Debug, Clone)]
pub(crate) struct MimiTransformer {
    /// `…_transformer.transformer`.
    prefix: String,
    d: usize,
    heads: usize,
    ff: usize,
    context: usize,
    /// Positions are labelled from the call's end (NVIDIA's fork).
    label_from_end: bool,
    layer_scale: bool,
    eps: f32,
    freqs: Vec<f32>,
    layers: Vec<Layer>,
}

/// Per-slot streaming state: KV rings and step counters.
#[derive(Debug, Clone)]
pub(crate) struct TransformerState {
    /// Per layer, `[context][d]` keys per slot (after RoPE).
    k: Vec<SlotBuf>,
    /// Per layer, `[context][d]` values per slot.
    v: Vec<SlotBuf>,
    /// Steps run so far, per slot.
    offset: Vec<usize>,
}

/// Scratch for one call over at most `rows` rows.
#[derive(Debug, Clone)]
pub(crate) struct TransformerScratch {
    xn: Vec<f32>,
    qkv: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    hidden: Vec<f32>,
    scores: Vec<f32>,
}

/// RoPE frequencies as the official `apply_rope` computes them: the scalar
/// `−ln(max_period)·2/D` in float64, then float32 `exp(i · scalar)`.
pub(crate) fn rope_freqs_exact(head_dim: usize, max_period: f32) -> Vec<f32> {
    let scale = (-(max_period as f64).ln() * 2.0 / head_dim as f64) as f32;
    (0..head_dim / 2)
        .map(|i| (i as f32 * scale).exp())
        .collect()
}

impl MimiTransformer {
    pub(crate) fn new(prefix: &str, cfg: &MimiTransformerConfig) -> Self {
        let head_dim = cfg.d_model / cfg.num_heads;
        MimiTransformer {
            prefix: format!("{prefix}.transformer"),
            d: cfg.d_model,
            heads: cfg.num_heads,
            ff: cfg.dim_feedforward,
            context: cfg.context,
            label_from_end: cfg.kv_window == KvWindow::ContextMinusOne,
            layer_scale: cfg.layer_scale.is_some(),
            eps: cfg.norm.eps(),
            freqs: rope_freqs_exact(head_dim, cfg.max_period),
            layers: vec![Layer::default(); cfg.num_layers],
        }
    }

    fn names(&self, i: usize) -> Vec<(String, Vec<usize>)> {
        let (d, ff) = (self.d, self.ff);
        let p = format!("{}.layers.{i}", self.prefix);
        let mut v = vec![
            (format!("{p}.self_attn.in_projs.0.weight"), vec![3 * d, d]),
            (format!("{p}.self_attn.out_projs.0.weight"), vec![d, d]),
            (format!("{p}.linear1.weight"), vec![ff, d]),
            (format!("{p}.linear2.weight"), vec![d, ff]),
            (format!("{p}.norm1.weight"), vec![d]),
            (format!("{p}.norm1.bias"), vec![d]),
            (format!("{p}.norm2.weight"), vec![d]),
            (format!("{p}.norm2.bias"), vec![d]),
        ];
        if self.layer_scale {
            v.push((format!("{p}.layer_scale_1.scale"), vec![d]));
            v.push((format!("{p}.layer_scale_2.scale"), vec![d]));
        }
        v
    }

    pub(crate) fn specs(&self, out: &mut Vec<TensorSpec>) {
        for i in 0..self.layers.len() {
            for (name, shape) in self.names(i) {
                out.push(TensorSpec::new(name, &shape));
            }
        }
    }

    pub(crate) fn load(&mut self, weights: &mut Weights) -> Result<(), CheckpointError> {
        for i in 0..self.layers.len() {
            let mut t = self
                .names(i)
                .into_iter()
                .map(|(name, shape)| weights.take(&name, &shape))
                .collect::<Result<Vec<_>, _>>()?
                .into_iter();
            let mut next = || t.next().unwrap_or_default();
            let (d, ff) = (self.d, self.ff);
            let mut l = Layer {
                in_proj: PackedLinear::from_rows(&next(), 3 * d, d),
                out_proj: PackedLinear::from_rows(&next(), d, d),
                linear1: PackedLinear::from_rows(&next(), ff, d),
                linear2: PackedLinear::from_rows(&next(), d, ff),
                norm1_w: next(),
                norm1_b: next(),
                norm2_w: next(),
                norm2_b: next(),
                scale1: next(),
                scale2: next(),
            };
            if !self.layer_scale {
                l.scale1 = vec![1.0; self.d];
                l.scale2 = vec![1.0; self.d];
            }
            self.layers[i] = l;
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn new_state(&self, max_slots: usize) -> TransformerState {
        self.try_new_state(max_slots)
            .unwrap_or_else(|e| panic!("Mimi transformer state: {e}"))
    }

    /// [`Self::new_state`] with the KV rings allocated fallibly.
    pub(crate) fn try_new_state(
        &self,
        max_slots: usize,
    ) -> Result<TransformerState, crate::alloc::AllocError> {
        let per = self.context * self.d;
        let ring = || {
            SlotBuf::try_new(max_slots, per, || {
                format!("a Mimi transformer KV ring for {max_slots} slots")
            })
        };
        Ok(TransformerState {
            k: self
                .layers
                .iter()
                .map(|_| ring())
                .collect::<Result<_, _>>()?,
            v: self
                .layers
                .iter()
                .map(|_| ring())
                .collect::<Result<_, _>>()?,
            offset: vec![0; max_slots],
        })
    }

    pub(crate) fn reset(&self, st: &mut TransformerState, slot: usize) {
        for (k, v) in st.k.iter_mut().zip(&mut st.v) {
            k.clear(slot);
            v.clear(slot);
        }
        st.offset[slot] = 0;
    }

    pub(crate) fn new_scratch(&self, rows: usize) -> TransformerScratch {
        TransformerScratch {
            xn: vec![0.0; rows * self.d],
            qkv: vec![0.0; rows * 3 * self.d],
            att: vec![0.0; rows * self.d],
            proj: vec![0.0; rows * self.d],
            hidden: vec![0.0; rows * self.ff],
            scores: vec![0.0; self.context],
        }
    }

    /// Runs `t` steps for `slots` on `x = [n][t][d]`, in place.
    pub(crate) fn forward(
        &self,
        st: &mut TransformerState,
        sc: &mut TransformerScratch,
        slots: &[usize],
        x: &mut [f32],
        t: usize,
    ) {
        let (d, ff) = (self.d, self.ff);
        let rows = slots.len() * t;
        let x = &mut x[..rows * d];
        for (l, layer) in self.layers.iter().enumerate() {
            // Self-attention block.
            ops::layer_norm(
                x,
                &layer.norm1_w,
                &layer.norm1_b,
                self.eps,
                d,
                &mut sc.xn[..rows * d],
            );
            layer
                .in_proj
                .forward(&sc.xn, rows, &mut sc.qkv[..rows * 3 * d]);
            self.attention(&mut st.k[l], &mut st.v[l], &st.offset, sc, slots, t);
            layer
                .out_proj
                .forward(&sc.att, rows, &mut sc.proj[..rows * d]);
            add_scaled(x, &sc.proj[..rows * d], &layer.scale1);
            // Feed-forward block.
            ops::layer_norm(
                x,
                &layer.norm2_w,
                &layer.norm2_b,
                self.eps,
                d,
                &mut sc.xn[..rows * d],
            );
            layer
                .linear1
                .forward(&sc.xn, rows, &mut sc.hidden[..rows * ff]);
            act::gelu_inplace(&mut sc.hidden[..rows * ff]);
            layer
                .linear2
                .forward(&sc.hidden, rows, &mut sc.proj[..rows * d]);
            add_scaled(x, &sc.proj[..rows * d], &layer.scale2);
        }
        for &s in slots {
            st.offset[s] += t;
        }
    }

    /// RoPE on `sc.qkv`, ring update, and attention into `sc.att`.
    fn attention(
        &self,
        kc: &mut SlotBuf,
        vc: &mut SlotBuf,
        offsets: &[usize],
        sc: &mut TransformerScratch,
        slots: &[usize],
        t: usize,
    ) {
        let d = self.d;
        let hd = d / self.heads;
        let cap = self.context;
        let scale = 1.0 / (hd as f32).sqrt();
        for (j, &s) in slots.iter().enumerate() {
            let off = offsets[s];
            let keys = kc.get_mut(s);
            let vals = vc.get_mut(s);
            for tt in 0..t {
                let row = &mut sc.qkv[(j * t + tt) * 3 * d..(j * t + tt + 1) * 3 * d];
                let pos = (off + tt) as f32;
                for h in 0..self.heads {
                    ops::rope_interleaved(&mut row[h * hd..(h + 1) * hd], &self.freqs, pos);
                    ops::rope_interleaved(&mut row[d + h * hd..d + (h + 1) * hd], &self.freqs, pos);
                }
                let idx = (off + tt) % cap;
                keys[idx * d..(idx + 1) * d].copy_from_slice(&row[d..2 * d]);
                vals[idx * d..(idx + 1) * d].copy_from_slice(&row[2 * d..3 * d]);
            }
            // Positions held by the ring after the write (official formula).
            let end_new = (off + t) as i64;
            let last = end_new - i64::from(!self.label_from_end);
            let end_index = last % cap as i64;
            let position = |i: usize| -> i64 {
                let i = i as i64;
                if i >= end_new {
                    return -1;
                }
                let delta = i - end_index;
                if delta <= 0 {
                    last + delta
                } else {
                    last + delta - cap as i64
                }
            };
            for tt in 0..t {
                let pq = (off + tt) as i64;
                let q_row = (j * t + tt) * 3 * d;
                let out_row = (j * t + tt) * d;
                for h in 0..self.heads {
                    let q = &sc.qkv[q_row + h * hd..q_row + (h + 1) * hd];
                    let mut max = f32::NEG_INFINITY;
                    for i in 0..cap {
                        let pk = position(i);
                        let delta = pq - pk;
                        sc.scores[i] = if pk >= 0 && delta >= 0 && delta < cap as i64 {
                            let k = &keys[i * d + h * hd..i * d + (h + 1) * hd];
                            let dot = act::dot(q, k);
                            let v = dot * scale;
                            max = max.max(v);
                            v
                        } else {
                            f32::NEG_INFINITY
                        };
                    }
                    let mut sum = 0.0;
                    for s in &mut sc.scores[..cap] {
                        *s = (*s - max).exp();
                        sum += *s;
                    }
                    let inv = 1.0 / sum;
                    let out = &mut sc.att[out_row + h * hd..out_row + (h + 1) * hd];
                    out.fill(0.0);
                    for i in 0..cap {
                        let p = sc.scores[i];
                        if p == 0.0 {
                            continue;
                        }
                        let p = p * inv;
                        let v = &vals[i * d + h * hd..i * d + (h + 1) * hd];
                        for (o, vv) in out.iter_mut().zip(v) {
                            *o += p * vv;
                        }
                    }
                }
            }
        }
    }
}

fn add_scaled(x: &mut [f32], update: &[f32], scale: &[f32]) {
    for (xr, ur) in x
        .chunks_exact_mut(scale.len())
        .zip(update.chunks_exact(scale.len()))
    {
        for ((xv, u), s) in xr.iter_mut().zip(ur).zip(scale) {
            *xv += s * u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NormKind;

    fn det(n: usize, seed: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 + seed) * 0.3137).sin() * 0.5)
            .collect()
    }

    fn tiny(context: usize) -> MimiTransformer {
        let cfg = MimiTransformerConfig {
            kv_window: crate::config::KvWindow::Context,
            d_model: 8,
            num_heads: 2,
            num_layers: 2,
            layer_scale: Some(0.1),
            context,
            max_period: 10_000.0,
            dim_feedforward: 16,
            norm: NormKind::LayerNorm,
        };
        let mut tr = MimiTransformer::new("t", &cfg);
        let d = 8;
        for (i, l) in tr.layers.iter_mut().enumerate() {
            let s = i as f32 * 10.0;
            *l = Layer {
                in_proj: PackedLinear::from_rows(&det(3 * d * d, s + 1.0), 3 * d, d),
                out_proj: PackedLinear::from_rows(&det(d * d, s + 2.0), d, d),
                linear1: PackedLinear::from_rows(&det(16 * d, s + 3.0), 16, d),
                linear2: PackedLinear::from_rows(&det(16 * d, s + 4.0), d, 16),
                norm1_w: det(d, s + 5.0).iter().map(|v| 1.0 + v).collect(),
                norm1_b: det(d, s + 6.0),
                norm2_w: det(d, s + 7.0).iter().map(|v| 1.0 + v).collect(),
                norm2_b: det(d, s + 8.0),
                scale1: det(d, s + 9.0),
                scale2: det(d, s + 10.0),
            };
        }
        tr
    }

    /// Naive reference: full history kept, each query at position p attends
    /// to the keys whose position q satisfies p − q < context and which are
    /// still in a ring of `context` after the call's writes.
    fn reference(tr: &MimiTransformer, x: &[f32], steps: usize, t: usize) -> Vec<f32> {
        let (d, ff, hd) = (tr.d, tr.ff, tr.d / tr.heads);
        let mut x = x.to_vec();
        for layer in &tr.layers {
            let mut ks: Vec<Vec<f32>> = Vec::new();
            let mut vs: Vec<Vec<f32>> = Vec::new();
            for p in 0..steps {
                let mut xn = vec![0.0; d];
                ops::layer_norm(
                    &x[p * d..(p + 1) * d],
                    &layer.norm1_w,
                    &layer.norm1_b,
                    1e-5,
                    d,
                    &mut xn,
                );
                let mut qkv = vec![0.0; 3 * d];
                layer.in_proj.forward(&xn, 1, &mut qkv);
                for h in 0..tr.heads {
                    ops::rope_interleaved(&mut qkv[h * hd..(h + 1) * hd], &tr.freqs, p as f32);
                    ops::rope_interleaved(
                        &mut qkv[d + h * hd..d + (h + 1) * hd],
                        &tr.freqs,
                        p as f32,
                    );
                }
                ks.push(qkv[d..2 * d].to_vec());
                vs.push(qkv[2 * d..].to_vec());
            }
            // Attention per step with the ring semantics.
            let mut att = vec![0.0; steps * d];
            for p in 0..steps {
                let call_end = (p / t + 1) * t; // steps written once this call's keys are in
                let mut xn = vec![0.0; d];
                ops::layer_norm(
                    &x[p * d..(p + 1) * d],
                    &layer.norm1_w,
                    &layer.norm1_b,
                    1e-5,
                    d,
                    &mut xn,
                );
                let mut qkv = vec![0.0; 3 * d];
                layer.in_proj.forward(&xn, 1, &mut qkv);
                for h in 0..tr.heads {
                    ops::rope_interleaved(&mut qkv[h * hd..(h + 1) * hd], &tr.freqs, p as f32);
                    let mut sc = Vec::new();
                    let mut idx = Vec::new();
                    for (q, kq) in ks.iter().enumerate().take(p + 1) {
                        let in_ring = q + tr.context >= call_end;
                        if p - q < tr.context && in_ring {
                            let dot: f32 = (0..hd).map(|e| qkv[h * hd + e] * kq[h * hd + e]).sum();
                            sc.push(dot / (hd as f32).sqrt());
                            idx.push(q);
                        }
                    }
                    ops::softmax_inplace(&mut sc);
                    for (w, &q) in sc.iter().zip(&idx) {
                        for e in 0..hd {
                            att[p * d + h * hd + e] += w * vs[q][h * hd + e];
                        }
                    }
                }
            }
            let mut proj = vec![0.0; steps * d];
            layer.out_proj.forward(&att, steps, &mut proj);
            add_scaled(&mut x, &proj, &layer.scale1);
            let mut xn = vec![0.0; steps * d];
            ops::layer_norm(&x, &layer.norm2_w, &layer.norm2_b, 1e-5, d, &mut xn);
            let mut hid = vec![0.0; steps * ff];
            layer.linear1.forward(&xn, steps, &mut hid);
            act::gelu_inplace(&mut hid);
            layer.linear2.forward(&hid, steps, &mut proj);
            add_scaled(&mut x, &proj, &layer.scale2);
        }
        x
    }

    #[test]
    fn ring_wraps_like_reference() {
        let (t, calls, context) = (2, 9, 5);
        let tr = tiny(context);
        let d = tr.d;
        let x = det(t * calls * d, 0.5);
        let want = reference(&tr, &x, t * calls, t);
        // Slot 1 of 3, batched with slot 0 running other data.
        let mut st = tr.new_state(3);
        let mut sc = tr.new_scratch(2 * t);
        let other = det(t * calls * d, 7.0);
        let mut got = Vec::new();
        for c in 0..calls {
            let mut buf = other[c * t * d..(c + 1) * t * d].to_vec();
            buf.extend_from_slice(&x[c * t * d..(c + 1) * t * d]);
            tr.forward(&mut st, &mut sc, &[0, 1], &mut buf, t);
            got.extend_from_slice(&buf[t * d..]);
        }
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() < 1e-4, "index {i}: {a} vs {b}");
        }
        // A reset slot is as good as new.
        tr.reset(&mut st, 0);
        let mut again = Vec::new();
        for c in 0..calls {
            let mut buf = x[c * t * d..(c + 1) * t * d].to_vec();
            tr.forward(&mut st, &mut sc, &[0], &mut buf, t);
            again.extend_from_slice(&buf);
        }
        assert_eq!(again, got);
    }
}
