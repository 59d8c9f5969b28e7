//! Mimi's streaming transformers on the device (CPU reference:
//! model/src/mimi/transformer.rs): pre-norm layers `x += ls₁·Attn(LN₁(x))`,
//! `x += ls₂·W₂·gelu(W₁·LN₂(x))`, causal multi-head attention with
//! interleaved RoPE, no biases, `t` steps per slot-step and call.
//!
//! Streaming state per slot, on the device: an f32 ring KV cache of
//! `context` entries per layer (`[max_slots][context][d]`, cache row = slot)
//! and the slot's stream position (`positions[max_slots]`, i32). A call
//! first turns the SlotSteps and positions into the call's RowInfo rows and
//! advances the positions (`rows_from_steps`, attention.cu), then runs the
//! layers over `n·t` rows; each layer writes the call's keys and values
//! before attending (the official RingKVCache window, see attention.cu).
//!
//! Invariants: nothing is read back to the host, every launch depends only
//! on `n`, `t` and pointers (capturable); only active steps' slots change;
//! inactive rows are zeros all the way through (norms and attention write
//! zeros, GEMMs and element-wise kernels keep them zero).

use super::weights::{at, Kind, Mem, Source};
use super::Kernels;
use crate::device::{Arg, DType, DevPtr, Device, DeviceError, DeviceResult, Gemm, KernelId, NULL};
use crate::model::GpuError;
use crate::ops::attention::{AttnShape, KvType};
use crate::ops::{dim, int};
use moshid_model::config::MimiTransformerConfig;
use moshid_model::weights::TensorSpec;

/// `ROWS_THREADS` of attention.cu.
pub const ROWS_THREADS: u32 = 128;

/// The `rows_from_steps` kernel (attention.cu).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowsKernel(KernelId);

impl RowsKernel {
    pub(crate) fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(RowsKernel(dev.kernel("rows_from_steps")?))
    }

    /// Rows `[n·t]` of `RowInfo` at `rows` for the `n` steps at `steps`,
    /// advancing `positions` (`[max_slots]` i32) of the active slots by `t`;
    /// `label_from_end` for NVIDIA's ring labels (see attention.cu).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        steps: DevPtr,
        n: usize,
        t: usize,
        label_from_end: bool,
        positions: DevPtr,
        rows: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "rows_from_steps";
        if steps == NULL || positions == NULL || rows == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        dev.launch(
            self.0,
            (dim(WHAT, n.div_ceil(ROWS_THREADS as usize))?, 1, 1),
            ROWS_THREADS,
            &[
                Arg::Ptr(steps),
                Arg::I32(int(WHAT, n)?),
                Arg::I32(int(WHAT, t)?),
                Arg::I32(i32::from(label_from_end)),
                Arg::Ptr(positions),
                Arg::Ptr(rows),
            ],
        )
    }
}

/// The scratch of one transformer call (sizes from [`GpuTransformer::need`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TransformerBufs {
    pub(crate) xn: DevPtr,
    pub(crate) qkv: DevPtr,
    pub(crate) att: DevPtr,
    pub(crate) proj: DevPtr,
    pub(crate) hidden: DevPtr,
    /// `RowInfo[n·t]`.
    pub(crate) rows: DevPtr,
}

#[derive(Debug, Clone, Copy)]
struct Layer {
    in_proj: DevPtr,
    out_proj: DevPtr,
    linear1: DevPtr,
    linear2: DevPtr,
    norm1_w: DevPtr,
    norm1_b: DevPtr,
    norm2_w: DevPtr,
    norm2_b: DevPtr,
    scale1: DevPtr,
    scale2: DevPtr,
    k_cache: DevPtr,
    v_cache: DevPtr,
}

/// One of Mimi's two transformers.
#[derive(Debug, Clone)]
pub(crate) struct GpuTransformer {
    /// `…_transformer.transformer`.
    prefix: String,
    d: usize,
    heads: usize,
    ff: usize,
    context: usize,
    /// NVIDIA's ring labels (PersonaPlex).
    label_from_end: bool,
    n_layers: usize,
    layer_scale: bool,
    eps: f32,
    max_period: f32,
    freqs: DevPtr,
    layers: Vec<Layer>,
    positions: DevPtr,
}

/// RoPE frequencies exactly as the reference (`rope_freqs_exact`): the
/// scalar `−ln(max_period)·2/D` in float64, then float32 `exp(i · scalar)`.
pub(crate) fn rope_freqs(head_dim: usize, max_period: f32) -> Vec<f32> {
    let scale = (-(max_period as f64).ln() * 2.0 / head_dim as f64) as f32;
    (0..head_dim / 2)
        .map(|i| (i as f32 * scale).exp())
        .collect()
}

/// `y[m][n] = x[m][k] · w[n][k]ᵀ (+ y when accumulate)`, all f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear<D: Device + ?Sized>(
    dev: &mut D,
    x: DevPtr,
    w: DevPtr,
    m: usize,
    n: usize,
    k: usize,
    y: DevPtr,
    accumulate: bool,
) -> DeviceResult<()> {
    dev.gemm(&Gemm {
        m,
        n,
        k,
        a: x,
        a_type: DType::F32,
        lda: k,
        b: w,
        b_type: DType::F32,
        ldb: k,
        c: y,
        c_type: DType::F32,
        ldc: n,
        alpha: 1.0,
        beta: if accumulate { 1.0 } else { 0.0 },
    })
}

impl GpuTransformer {
    pub(crate) fn new(prefix: &str, cfg: &MimiTransformerConfig) -> Self {
        GpuTransformer {
            prefix: format!("{prefix}.transformer"),
            d: cfg.d_model,
            heads: cfg.num_heads,
            ff: cfg.dim_feedforward,
            context: cfg.context,
            label_from_end: cfg.kv_window == moshid_model::config::KvWindow::ContextMinusOne,
            n_layers: cfg.num_layers,
            layer_scale: cfg.layer_scale.is_some(),
            eps: cfg.norm.eps(),
            max_period: cfg.max_period,
            freqs: NULL,
            layers: Vec::new(),
            positions: NULL,
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
        for i in 0..self.n_layers {
            for (name, shape) in self.names(i) {
                out.push(TensorSpec::new(name, &shape));
            }
        }
    }

    /// Uploads the weights and allocates caches and positions for `max_slots`.
    pub(crate) fn load<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        mem: &mut Mem,
        src: &mut dyn Source,
        max_slots: usize,
    ) -> Result<(), GpuError> {
        let hd = self.d / self.heads;
        self.freqs = mem.upload_f32(dev, Kind::Weights, &rope_freqs(hd, self.max_period))?;
        let ones = vec![1.0f32; self.d];
        let cache = max_slots * self.context * self.d;
        self.layers.clear();
        for i in 0..self.n_layers {
            let mut ptrs = Vec::with_capacity(10);
            for (name, shape) in self.names(i) {
                let v = src.take(&name, &shape)?;
                ptrs.push(mem.upload_f32(dev, Kind::Weights, &v)?);
            }
            if !self.layer_scale {
                for _ in 0..2 {
                    ptrs.push(mem.upload_f32(dev, Kind::Weights, &ones)?);
                }
            }
            self.layers.push(Layer {
                in_proj: ptrs[0],
                out_proj: ptrs[1],
                linear1: ptrs[2],
                linear2: ptrs[3],
                norm1_w: ptrs[4],
                norm1_b: ptrs[5],
                norm2_w: ptrs[6],
                norm2_b: ptrs[7],
                scale1: ptrs[8],
                scale2: ptrs[9],
                k_cache: mem.floats(dev, Kind::State, cache)?,
                v_cache: mem.floats(dev, Kind::State, cache)?,
            });
        }
        self.positions = mem.alloc(dev, Kind::State, max_slots * 4)?;
        Ok(())
    }

    /// State bytes per slot.
    /// Positions each layer's ring holds (the attention context).
    pub(crate) fn context(&self) -> usize {
        self.context
    }

    pub(crate) fn state_bytes(&self) -> usize {
        self.n_layers * 2 * self.context * self.d * 4 + 4
    }

    /// Scratch floats `(xn, qkv, att, proj, hidden)` and RowInfo count for `rows` rows.
    pub(crate) fn need(&self, rows: usize) -> [usize; 6] {
        let (d, ff) = (self.d, self.ff);
        [rows * d, rows * 3 * d, rows * d, rows * d, rows * ff, rows]
    }

    /// Runs `t` steps for each of the `n` steps on `x` (`[n][t][d]`), in place.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        k: &Kernels,
        n: usize,
        t: usize,
        steps: DevPtr,
        x: DevPtr,
        b: &TransformerBufs,
    ) -> DeviceResult<()> {
        let (d, ff) = (self.d, self.ff);
        let rows = n * t;
        k.rows.launch(
            dev,
            steps,
            n,
            t,
            self.label_from_end,
            self.positions,
            b.rows,
        )?;
        let shape = AttnShape {
            dim: d,
            heads: self.heads,
            kv_heads: self.heads,
            rope_interleaved: true,
            capacity: self.context,
            context: self.context,
            rows,
        };
        for l in &self.layers {
            k.norm.layer_norm(
                dev, x, l.norm1_w, l.norm1_b, self.eps, d, b.rows, rows, b.xn,
            )?;
            linear(dev, b.xn, l.in_proj, rows, 3 * d, d, b.qkv, false)?;
            k.attn.rope_kv_write(
                dev,
                KvType::F32,
                b.qkv,
                self.freqs,
                b.rows,
                l.k_cache,
                l.v_cache,
                &shape,
            )?;
            k.attn.attend(
                dev,
                KvType::F32,
                DType::F32,
                b.qkv,
                l.k_cache,
                l.v_cache,
                b.rows,
                &shape,
                b.att,
            )?;
            linear(dev, b.att, l.out_proj, rows, d, d, b.proj, false)?;
            k.ew.add_scaled(dev, x, b.proj, l.scale1, d, rows * d)?;
            k.norm.layer_norm(
                dev, x, l.norm2_w, l.norm2_b, self.eps, d, b.rows, rows, b.xn,
            )?;
            linear(dev, b.xn, l.linear1, rows, ff, d, b.hidden, false)?;
            k.ew.gelu(dev, b.hidden, rows * ff)?;
            linear(dev, b.hidden, l.linear2, rows, d, ff, b.proj, false)?;
            k.ew.add_scaled(dev, x, b.proj, l.scale2, d, rows * d)?;
        }
        Ok(())
    }

    /// Issues the reset of `slot` (caches zeroed, position 0).
    pub(crate) fn reset<D: Device + ?Sized>(&self, dev: &mut D, slot: usize) -> DeviceResult<()> {
        let per = self.context * self.d;
        for l in &self.layers {
            dev.memset_zero(at(l.k_cache, slot * per), per * 4)?;
            dev.memset_zero(at(l.v_cache, slot * per), per * 4)?;
        }
        dev.memset_zero(at(self.positions, slot), 4)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rows_block_size_matches_the_source() {
        let src = include_str!("../../../cuda/attention.cu");
        let v: u32 = src
            .lines()
            .find_map(|l| l.strip_prefix("#define ROWS_THREADS "))
            .and_then(|v| v.trim().parse().ok())
            .expect("#define ROWS_THREADS");
        assert_eq!(v, super::ROWS_THREADS);
    }

    #[test]
    fn rope_freqs_match_the_reference_formula() {
        let f = super::rope_freqs(8, 10_000.0);
        assert_eq!(f.len(), 4);
        assert_eq!(f[0], 1.0);
        assert!((f[1] - 0.1).abs() < 1e-6);
    }
}
