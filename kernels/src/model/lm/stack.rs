//! One transformer stack of the LM on the device — the temporal transformer
//! or the depformer — as the CPU reference's `Stack::forward`: per layer,
//! RMSNorm → in-projection (queries, then `kv_heads` keys and values) →
//! RoPE (interleaved or halves) + KV write → attention (query head `h` over
//! key/value head `h / kv_repeat`) → out-projection added into the residual
//! → RMSNorm → gated feed-forward added into the residual.
//!
//! The norms and the gate run inside the projections that read them
//! (proj.rs: one launch for few rows), and a stack made with
//! [`Stack::with_short_attention`] (the depformer: a window of a few
//! positions, one new position per row and call) does RoPE, KV write and
//! attention in one launch (short_attn.cu).
//!
//! Invariants: every GEMM runs once over all rows of the call (masked rows
//! are zero rows: the norms write zeros for inactive `RowInfo`s and the
//! embeddings do too, so they stay zero and finite); attention reads only
//! the positions a row wrote since its reset; the KV caches are allocated
//! once for `cache_rows` rows at full capacity. Activations that feed a GEMM
//! are in the model's precision (bf16, or f32 for the exact reference mode);
//! the residual stream, norms and softmax are f32.

use super::super::tensor::{scratch, DevTensor, Init, WeightLoader};
use super::super::GpuError;
use super::proj::{project, ProjIn};
use super::LmKernels;
use crate::device::{DType, DevPtr, Device, DeviceResult, NULL};
use crate::ops::attention::{AttnShape, KvType};
use crate::ops::short_attn::ShortAttnKernels;
pub use moshid_model::lm::StackShape;

struct SetWeights {
    in_proj: DevTensor,
    out_proj: DevTensor,
    ff_in: DevTensor,
    ff_out: DevTensor,
}

struct Layer {
    norm1: DevPtr,
    norm2: DevPtr,
    sets: Vec<SetWeights>,
    k_cache: DevPtr,
    v_cache: DevPtr,
}

/// Scratch of one stack call, sized for the largest call.
pub struct StackScratch {
    h: DevPtr,
    qkv: DevPtr,
    attn: DevPtr,
    ff: DevPtr,
    act: DevPtr,
}

impl StackScratch {
    /// Scratch for `rows` rows of every stack in `shapes`, activations in `act`.
    pub fn new<D: Device + ?Sized>(
        dev: &mut D,
        rows: usize,
        shapes: &[&StackShape],
        act: DType,
    ) -> DeviceResult<Self> {
        let dim = shapes.iter().map(|s| s.dim).max().unwrap_or(1);
        let qkv = shapes.iter().map(|s| s.qkv_dim()).max().unwrap_or(1);
        let hidden = shapes.iter().map(|s| s.hidden).max().unwrap_or(1);
        Ok(StackScratch {
            h: scratch(dev, rows * dim, act)?,
            qkv: scratch(dev, rows * qkv, DType::F32)?,
            attn: scratch(dev, rows * dim, act)?,
            ff: scratch(dev, rows * 2 * hidden, DType::F32)?,
            act: scratch(dev, rows * hidden, act)?,
        })
    }
}

/// A loaded stack with its KV caches.
pub struct Stack {
    shape: StackShape,
    layers: Vec<Layer>,
    /// head_dim/2 RoPE frequencies (f32), or NULL.
    freqs: DevPtr,
    kv: KvType,
    act: DType,
    kv_bytes: usize,
    /// RoPE, KV write and attention in one launch (short_attn.cu).
    short: bool,
}

impl Stack {
    /// Loads the stack under `prefix` (`transformer`, `depformer`) with the
    /// tensor names of the official checkpoints (split attention names, as
    /// the checkpoint reader presents them), weights and activations in
    /// `act`, and KV caches of `kv` for `cache_rows` rows.
    pub fn load<D: Device + ?Sized>(
        dev: &mut D,
        w: &mut WeightLoader<'_>,
        prefix: &str,
        shape: StackShape,
        act: DType,
        kv: KvType,
        cache_rows: usize,
    ) -> Result<Stack, GpuError> {
        let (d, hid) = (shape.dim, shape.hidden);
        let mut layers = Vec::with_capacity(shape.layers);
        let kv_elems = cache_rows * shape.capacity * shape.kv_dim();
        for l in 0..shape.layers {
            let p = format!("{prefix}.layers.{l}");
            let norm1 = w.tensor(
                dev,
                &format!("{p}.norm1.alpha"),
                &[1, 1, d],
                DType::F32,
                Init::Ones,
            )?;
            let norm2 = w.tensor(
                dev,
                &format!("{p}.norm2.alpha"),
                &[1, 1, d],
                DType::F32,
                Init::Ones,
            )?;
            let mut sets = Vec::with_capacity(shape.sets);
            for set in 0..shape.sets {
                let g = if shape.gating_list {
                    format!("{p}.gating.{set}")
                } else {
                    format!("{p}.gating")
                };
                let lin = Init::Linear;
                sets.push(SetWeights {
                    in_proj: w.tensor(
                        dev,
                        &format!("{p}.self_attn.in_projs.{set}.weight"),
                        &[shape.qkv_dim(), d],
                        act,
                        lin,
                    )?,
                    out_proj: w.tensor(
                        dev,
                        &format!("{p}.self_attn.out_projs.{set}.weight"),
                        &[d, d],
                        act,
                        lin,
                    )?,
                    ff_in: w.tensor(
                        dev,
                        &format!("{g}.linear_in.weight"),
                        &[2 * hid, d],
                        act,
                        lin,
                    )?,
                    ff_out: w.tensor(
                        dev,
                        &format!("{g}.linear_out.weight"),
                        &[d, hid],
                        act,
                        lin,
                    )?,
                });
            }
            layers.push(Layer {
                norm1: norm1.ptr,
                norm2: norm2.ptr,
                sets,
                k_cache: dev.alloc(kv_elems * kv.bytes())?,
                v_cache: dev.alloc(kv_elems * kv.bytes())?,
            });
        }
        let freqs = match shape.rope {
            Some(rope) => {
                let hd = shape.head_dim();
                let mut f = vec![0.0f32; hd / 2];
                moshid_model::ops::rope_freqs(hd, rope.period, &mut f);
                let p = dev.alloc(f.len() * 4)?;
                dev.upload(p, crate::device::as_bytes(&f))?;
                p
            }
            None => NULL,
        };
        Ok(Stack {
            kv_bytes: 2 * shape.layers * kv_elems * kv.bytes(),
            shape,
            layers,
            freqs,
            kv,
            act,
            short: false,
        })
    }

    /// The same stack with its attention in one launch per layer, for a
    /// stack whose calls write one position per row and attend over at
    /// most [`SA_MAX_KEYS`](crate::ops::short_attn::SA_MAX_KEYS) of them
    /// (the depformer); unchanged when the kernel does not take its shape.
    pub fn with_short_attention(mut self) -> Self {
        let s = self.attn_shape(1);
        self.short = ShortAttnKernels::takes(&s, self.kv);
        self
    }

    fn attn_shape(&self, rows: usize) -> AttnShape {
        let sh = &self.shape;
        AttnShape {
            dim: sh.dim,
            heads: sh.heads,
            kv_heads: sh.kv_heads,
            rope_interleaved: sh.rope.is_none_or(|r| r.interleaved),
            capacity: sh.capacity,
            context: sh.context,
            rows,
        }
    }

    /// The shape.
    pub fn shape(&self) -> &StackShape {
        &self.shape
    }

    /// Device bytes of the KV caches.
    pub fn kv_bytes(&self) -> usize {
        self.kv_bytes
    }

    /// Runs the stack in place on `x` (`[rows][dim]` f32) with weight set
    /// `set`; `row_info` holds `rows` RowInfos (cache row, position, activity).
    #[allow(clippy::too_many_arguments)]
    pub fn forward<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        k: &LmKernels,
        set: usize,
        rows: usize,
        x: DevPtr,
        row_info: DevPtr,
        sc: &StackScratch,
    ) -> DeviceResult<()> {
        let sh = &self.shape;
        let act = self.act;
        let attn_shape = self.attn_shape(rows);
        for layer in &self.layers {
            let w = &layer.sets[set];
            let norm = |alpha| ProjIn::Rms {
                x,
                alpha,
                eps: sh.eps,
                rows: row_info,
            };
            project(
                dev,
                k,
                norm(layer.norm1),
                act,
                rows,
                &w.in_proj,
                sc.qkv,
                false,
                sc.h,
            )?;
            if self.short {
                k.short.attend(
                    dev,
                    self.kv,
                    sc.qkv,
                    self.freqs,
                    row_info,
                    layer.k_cache,
                    layer.v_cache,
                    &attn_shape,
                    sc.attn,
                )?;
            } else {
                k.attn.rope_kv_write(
                    dev,
                    self.kv,
                    sc.qkv,
                    self.freqs,
                    row_info,
                    layer.k_cache,
                    layer.v_cache,
                    &attn_shape,
                )?;
                k.attn.attend(
                    dev,
                    self.kv,
                    act,
                    sc.qkv,
                    layer.k_cache,
                    layer.v_cache,
                    row_info,
                    &attn_shape,
                    sc.attn,
                )?;
            }
            project(
                dev,
                k,
                ProjIn::Act(sc.attn),
                act,
                rows,
                &w.out_proj,
                x,
                true,
                sc.h,
            )?;
            project(
                dev,
                k,
                norm(layer.norm2),
                act,
                rows,
                &w.ff_in,
                sc.ff,
                false,
                sc.h,
            )?;
            project(
                dev,
                k,
                ProjIn::Silu(sc.ff),
                act,
                rows,
                &w.ff_out,
                x,
                true,
                sc.act,
            )?;
        }
        Ok(())
    }
}
