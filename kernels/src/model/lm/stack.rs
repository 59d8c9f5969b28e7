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
use crate::device::{DType, DevPtr, Device, DeviceResult, StackPhases, NULL};
use crate::ops::attention::{attn_partial_floats, attn_splits, AttnShape, KvType};
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
    /// The profile's phases of this stack's calls.
    phases: StackPhases,
    /// The device's multiprocessors (the attention's splits).
    sms: usize,
    /// f32 partial results of split attention, for the largest call.
    partial: DevPtr,
}

impl Stack {
    /// Loads the stack under `prefix` (`transformer`, `depformer`) with the
    /// tensor names of the official checkpoints (split attention names, as
    /// the checkpoint reader presents them), weights and activations in
    /// `act`, and KV caches of `kv` for `cache_rows` rows; its calls are
    /// marked with `phases`.
    #[allow(clippy::too_many_arguments)]
    pub fn load<D: Device + ?Sized>(
        dev: &mut D,
        w: &mut WeightLoader<'_>,
        prefix: &str,
        shape: StackShape,
        act: DType,
        kv: KvType,
        cache_rows: usize,
        phases: StackPhases,
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
        let sms = dev.multiprocessors();
        let partial = split_partials(dev, &shape, cache_rows, sms)?;
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
            phases,
            sms,
            partial,
        })
    }

    /// The same stack with its attention in one launch per layer, for a
    /// stack whose calls write one position per row and attend over at
    /// most [`SA_MAX_KEYS`](crate::ops::short_attn::SA_MAX_KEYS) of them
    /// (the depformer); unchanged when the kernel does not take its shape.
    pub fn with_short_attention(mut self) -> Self {
        let s = attn_shape(&self.shape, 1);
        self.short = ShortAttnKernels::takes(&s, self.kv);
        self
    }

    /// The shape.
    pub fn shape(&self) -> &StackShape {
        &self.shape
    }

    /// Device bytes of the KV caches.
    pub fn kv_bytes(&self) -> usize {
        self.kv_bytes
    }

    /// Bytes of one position's keys (or values) in one layer.
    pub fn kv_position_bytes(&self) -> usize {
        self.shape.kv_dim() * self.kv.bytes()
    }

    /// Copies positions `first..end` of cache row `row` out of (`read`) or
    /// into the KV caches, to or from `host` (`[layers][2][positions]`
    /// position records), as at most two ring segments per cache.
    pub fn copy_positions<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        row: usize,
        first: usize,
        end: usize,
        host: &mut [u8],
        read: bool,
    ) -> DeviceResult<()> {
        let cap = self.shape.capacity;
        let pb = self.kv_position_bytes();
        let n = end - first;
        let mut at = 0;
        for layer in &self.layers {
            for cache in [layer.k_cache, layer.v_cache] {
                let mut p = first;
                while p < end {
                    let idx = p % cap;
                    let run = (cap - idx).min(end - p);
                    let dptr = cache + ((row * cap + idx) * pb) as u64;
                    let h = &mut host[at..at + run * pb];
                    if read {
                        dev.download(dptr, h)?;
                    } else {
                        dev.upload(dptr, h)?;
                    }
                    at += run * pb;
                    p += run;
                }
            }
        }
        debug_assert_eq!(at, 2 * self.layers.len() * n * pb);
        Ok(())
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
        let attn_shape = attn_shape(sh, rows);
        let splits = attn_splits(&attn_shape, sh.context, self.sms);
        let ph = self.phases;
        for layer in &self.layers {
            let w = &layer.sets[set];
            let norm = |alpha| ProjIn::Rms {
                x,
                alpha,
                eps: sh.eps,
                rows: row_info,
            };
            let proj = |dev: &mut D, input: ProjIn, w: &DevTensor, y, accumulate, staging| {
                project(
                    dev,
                    k,
                    ph.into(),
                    input,
                    self.act,
                    rows,
                    w,
                    y,
                    accumulate,
                    staging,
                )
            };
            proj(dev, norm(layer.norm1), &w.in_proj, sc.qkv, false, sc.h)?;
            dev.phase(ph.attn);
            self.attention(dev, k, layer, row_info, &attn_shape, splits, sc)?;
            proj(dev, ProjIn::Act(sc.attn), &w.out_proj, x, true, sc.h)?;
            proj(dev, norm(layer.norm2), &w.ff_in, sc.ff, false, sc.h)?;
            proj(dev, ProjIn::Silu(sc.ff), &w.ff_out, x, true, sc.act)?;
        }
        Ok(())
    }

    /// One layer's RoPE, KV write and attention of `sc.qkv` into `sc.attn`:
    /// one short_attn launch for a stack made with
    /// [`Stack::with_short_attention`], else the KV write and the split
    /// attention (`splits` blocks a row, partials in `self.partial`).
    #[allow(clippy::too_many_arguments)]
    fn attention<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        k: &LmKernels,
        layer: &Layer,
        row_info: DevPtr,
        attn_shape: &AttnShape,
        splits: usize,
        sc: &StackScratch,
    ) -> DeviceResult<()> {
        let caches = (layer.k_cache, layer.v_cache);
        if self.short {
            return k.short.attend(
                dev, self.kv, sc.qkv, self.freqs, row_info, caches.0, caches.1, attn_shape, sc.attn,
            );
        }
        k.attn.rope_kv_write(
            dev, self.kv, sc.qkv, self.freqs, row_info, caches.0, caches.1, attn_shape,
        )?;
        k.attn.attend_split(
            dev,
            self.kv,
            self.act,
            sc.qkv,
            (caches.0, caches.1, row_info),
            attn_shape,
            (splits, self.partial),
            sc.attn,
        )
    }
}

/// The attention shape of a call of `rows` rows of stack `sh`.
fn attn_shape(sh: &StackShape, rows: usize) -> AttnShape {
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

/// Checks the attention's shape (head width) at load and allocates the
/// partial results of its largest split call of up to `max_rows` rows on a
/// device of `sms` multiprocessors (NULL when no call splits).
fn split_partials<D: Device + ?Sized>(
    dev: &mut D,
    shape: &StackShape,
    max_rows: usize,
    sms: usize,
) -> Result<DevPtr, GpuError> {
    attn_shape(shape, 1).head_dim()?;
    let floats = (1..=max_rows.max(1))
        .map(|r| {
            let s = attn_shape(shape, r);
            attn_partial_floats(&s, attn_splits(&s, shape.context, sms))
        })
        .max()
        .unwrap_or(0);
    Ok(if floats > 0 {
        scratch(dev, floats, DType::F32)?
    } else {
        NULL
    })
}
