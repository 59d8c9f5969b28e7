//! What each phase of a frame step must move and compute, from the shapes
//! alone, and the floor that implies on a device of measured rates.
//!
//! The counts are a lower bound for the kernels as designed, not a model of
//! them: every weight read once per step, the KV cache read once per row
//! and key/value head, activations read and written once per kernel that
//! takes them (f32 where the kernels keep them in f32, the GEMMs' inputs in
//! the activation type), a GEMM's FLOPs `2·m·n·k`, attention `4·rows·dim·keys`
//! (scores and the weighted sum). Element-wise work inside Mimi (ELU,
//! residual adds, norms) and the samplers' arithmetic are left out (bytes of
//! their inputs only). The floor of a phase is `max(bytes ÷ bandwidth, FLOPs
//! ÷ matrix rate)`, against the rates of `calibrate`: HBM for device work,
//! the host link for the copies, the bf16 matrix rate for the LM's GEMMs
//! and the f32 (no TF32) rate for Mimi, which runs in f32.
//!
//! Invariants: every phase of [`Phase::ALL`] but `Other` has one entry;
//! nothing here depends on a device.

use crate::device::Phase;
use crate::model::io::Layout;
use crate::plan::{mimi_convs, ConvShape};
use moshid_model::config::{LmConfig, MimiConfig};
use moshid_model::lm::{depformer_in_indices, depformer_shape, temporal_shape, StackShape};

/// Which matrix rate a phase's FLOPs run at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matrix {
    /// bf16 inputs, f32 accumulation (tensor cores).
    Bf16,
    /// f32 throughout (no TF32).
    F32,
}

/// Which link a phase's bytes cross.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Device memory.
    Hbm,
    /// Host ↔ device (pinned copies).
    Host,
}

/// Bytes and FLOPs of some work.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Cost {
    /// Bytes moved.
    pub bytes: f64,
    /// Floating-point operations.
    pub flops: f64,
}

impl std::ops::AddAssign for Cost {
    fn add_assign(&mut self, o: Cost) {
        self.bytes += o.bytes;
        self.flops += o.flops;
    }
}

impl std::ops::Mul<f64> for Cost {
    type Output = Cost;
    fn mul(self, k: f64) -> Cost {
        Cost {
            bytes: self.bytes * k,
            flops: self.flops * k,
        }
    }
}

/// One phase's work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhaseCost {
    /// The phase.
    pub phase: Phase,
    /// Its bytes and FLOPs.
    pub cost: Cost,
    /// The rate its FLOPs run at.
    pub matrix: Matrix,
    /// The link its bytes cross.
    pub link: Link,
}

/// The device's rates, measured (`calibrate`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// Device memory bandwidth (bytes/s, read + write).
    pub hbm_bytes_per_s: f64,
    /// Host ↔ device bandwidth (bytes/s, the slower direction).
    pub host_bytes_per_s: f64,
    /// bf16 GEMM rate (FLOP/s).
    pub bf16_flops_per_s: f64,
    /// f32 GEMM rate (FLOP/s).
    pub f32_flops_per_s: f64,
}

impl PhaseCost {
    /// The phase's floor in ms: the slower of moving its bytes and doing its
    /// FLOPs at `rates`.
    pub fn floor_ms(&self, rates: &Rates) -> f64 {
        let bw = match self.link {
            Link::Hbm => rates.hbm_bytes_per_s,
            Link::Host => rates.host_bytes_per_s,
        };
        let rate = match self.matrix {
            Matrix::Bf16 => rates.bf16_flops_per_s,
            Matrix::F32 => rates.f32_flops_per_s,
        };
        1e3 * (self.cost.bytes / bw).max(self.cost.flops / rate)
    }
}

/// The step being costed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepShape {
    /// Slot-steps in the batch (all active).
    pub slots: usize,
    /// LM rows per slot-step (2 with guidance rows, all active).
    pub rows_per_slot: usize,
    /// Keys each temporal query attends (the context at full context).
    pub keys: usize,
    /// Bytes per temporal KV value (2 bf16, 1 fp8, 4 f32).
    pub kv_bytes: usize,
    /// Bytes per LM weight and GEMM input (2 bf16, 4 f32).
    pub act_bytes: usize,
}

/// Work of one layer of a transformer stack over `rows` rows attending
/// `keys` keys: (linear layers, RoPE + KV write + attention, norms and
/// gating). `act` is the weights' and GEMM inputs' bytes, `kv` the cache's;
/// the residual stream, the in-projection's output and the norms are f32.
pub fn stack_layer(sh: &StackShape, rows: usize, keys: usize, act: usize, kv: usize) -> [Cost; 3] {
    let (r, n) = (rows as f64, keys as f64);
    let (a, k, f) = (act as f64, kv as f64, 4.0);
    let (d, hid, qkv, kvd) = (
        sh.dim as f64,
        sh.hidden as f64,
        sh.qkv_dim() as f64,
        sh.kv_dim() as f64,
    );
    let params = qkv * d + d * d + 2.0 * hid * d + d * hid;
    // A read in `act`; C written in f32, or read and written (accumulated
    // into the residual stream) for the out-projection and ff_out.
    let gemm_act = r * (d * a + qkv * f)
        + r * (d * a + 2.0 * d * f)
        + r * (d * a + 2.0 * hid * f)
        + r * (hid * a + 2.0 * d * f);
    let gemm = Cost {
        bytes: params * a + gemm_act,
        flops: 2.0 * r * params,
    };
    // rope_kv_write reads q, k, v, writes q back and k, v into the cache;
    // attention reads q, every key and value once per row and key/value
    // head, and writes its output in `act`.
    let attn = Cost {
        bytes: r * (qkv * f + d * f + 2.0 * kvd * k) + r * (d * f + 2.0 * n * kvd * k + d * a),
        flops: 4.0 * r * d * n,
    };
    // Two RMSNorms (f32 in, `act` out) and the gating (2·hid f32 in, hid out).
    let small = Cost {
        bytes: 2.0 * r * (d * f + d * a) + r * (2.0 * hid * f + hid * a),
        flops: 0.0,
    };
    [gemm, attn, small]
}

/// A GEMM applying a `[n][k]` weight to `rows` rows: weight and A in
/// `act`, C in f32 (written; read too when `accumulate`).
fn linear(rows: usize, n: usize, k: usize, act: usize, accumulate: bool) -> Cost {
    let (r, n, k, a) = (rows as f64, n as f64, k as f64, act as f64);
    Cost {
        bytes: n * k * a + r * k * a + r * n * 4.0 * if accumulate { 2.0 } else { 1.0 },
        flops: 2.0 * r * n * k,
    }
}

/// Work of one Mimi convolution (f32) for `slots` slots, streaming state
/// read and written once.
pub fn conv(c: &ConvShape, slots: usize) -> Cost {
    let b = slots as f64;
    let (ci, co, k) = (c.c_in as f64, c.c_out as f64, c.kernel as f64);
    let (ti, to) = (c.t_in as f64, c.t_out() as f64);
    let weights = if c.depthwise { co * k } else { co * ci * k };
    let macs = if c.depthwise {
        co * k * ti
    } else if c.transposed {
        ci * co * k * ti
    } else {
        co * ci * k * to
    };
    Cost {
        bytes: 4.0 * (weights + b * (ti * ci + to * co + 2.0 * c.state_floats() as f64)),
        flops: 2.0 * b * macs,
    }
}

/// Work of one Mimi transformer (f32) over `rows` steps attending `keys`.
fn mimi_transformer(cfg: &MimiConfig, rows: usize, keys: usize) -> Cost {
    let t = &cfg.transformer;
    let (r, n, d, ff) = (
        rows as f64,
        keys as f64,
        t.d_model as f64,
        t.dim_feedforward as f64,
    );
    let params = 4.0 * d * d + 2.0 * d * ff;
    let per_layer = Cost {
        // Weights; GEMM inputs and outputs; K and V read and written; norms.
        bytes: 4.0 * (params + r * (7.0 * d + 2.0 * ff) + r * 2.0 * d * (n + 1.0) + r * 4.0 * d),
        flops: 2.0 * r * params + 4.0 * r * d * n,
    };
    per_layer * t.num_layers as f64
}

/// Mimi's phases for `slots` slots with `used` codebooks: (encoder convs,
/// one transformer, RVQ encode, RVQ decode, decoder convs), f32.
fn mimi_costs(mimi: &MimiConfig, slots: usize, used: usize) -> [Cost; 5] {
    // Convolutions in execution order: encoder, down-sampler, up-sampler,
    // decoder.
    let sn = &mimi.seanet;
    let per_block = sn.n_residual_layers * if sn.true_skip { 2 } else { 3 } + 1;
    let n_enc = 2 + sn.ratios.len() * per_block + usize::from(mimi.downsample_stride() > 1);
    let (mut enc, mut dec) = (Cost::default(), Cost::default());
    for (i, c) in mimi_convs(mimi).iter().enumerate() {
        if i < n_enc {
            enc += conv(c, slots);
        } else {
            dec += conv(c, slots);
        }
    }
    let tr_rows = slots * mimi.downsample_stride();
    let tr = mimi_transformer(mimi, tr_rows, mimi.transformer.context);
    let q = &mimi.quantizer;
    let (b, dim, bins, used) = (slots as f64, q.dimension as f64, q.bins as f64, used as f64);
    let (din, dout) = (q.input_dimension as f64, q.output_dimension as f64);
    let rvq_enc = Cost {
        // Input projections of the two splits, the codebooks in use with
        // their norms; the latent in, codes out.
        bytes: 4.0 * (2.0 * dim * din + used * bins * (dim + 1.0) + b * (din + used)),
        flops: 2.0 * b * (2.0 * dim * din + used * bins * dim),
    };
    let rvq_dec = Cost {
        bytes: 4.0 * (2.0 * dim * dout + b * used * dim + b * (dout + used)),
        flops: 2.0 * b * 2.0 * dim * dout,
    };
    [enc, tr, rvq_enc, rvq_dec, dec]
}

/// The depformer's phases for `rows` rows: (GEMMs, attention, small,
/// sampling) over its `dep_q` steps, step k attending keys 0..=k.
fn depformer_costs(lm: &LmConfig, rows: usize, a: usize) -> [Cost; 4] {
    let ds = depformer_shape(lm);
    let (in_index, _) = depformer_in_indices(lm);
    let (dd, r) = (ds.dim as f64, rows as f64);
    let mut c = [Cost::default(); 4];
    for (k, _) in in_index.iter().enumerate().take(lm.dep_q) {
        c[0] += linear(rows, ds.dim, lm.dim, a, false);
        if let Some(rank) = lm.depformer.low_rank_embeddings {
            c[0] += linear(rows, ds.dim, rank, a, true);
        }
        let [lg, la, ls] = stack_layer(&ds, rows, k + 1, a, a);
        c[0] += lg * ds.layers as f64;
        c[1] += la * ds.layers as f64;
        c[2] += ls * ds.layers as f64;
        // Embedding row added into the f32 stream; the head's norm or cast.
        c[2] += Cost {
            bytes: r * (dd * a as f64 + 2.0 * dd * 4.0) + r * (dd * 4.0 + dd * a as f64),
            flops: 0.0,
        };
        c[0] += linear(rows, lm.card, ds.dim, a, false);
        c[3] += Cost {
            bytes: r * lm.card as f64 * 4.0,
            flops: 0.0,
        };
    }
    c
}

/// Every phase's work for one step of `lm` + `mimi` at `s`, in step order.
pub fn step_costs(lm: &LmConfig, mimi: &MimiConfig, s: &StepShape) -> Vec<PhaseCost> {
    let rows = s.slots * s.rows_per_slot;
    let (a, r) = (s.act_bytes, rows as f64);
    let lm_m = if a == 2 { Matrix::Bf16 } else { Matrix::F32 };
    let (f32_m, hbm) = (Matrix::F32, Link::Hbm);
    let layout = Layout::new(s.slots, s.rows_per_slot, lm.dep_q, mimi.frame_samples());
    let copies = Cost {
        bytes: (layout.in_bytes + layout.out_bytes) as f64,
        flops: 0.0,
    };
    let [enc, tr, rvq_enc, rvq_dec, dec] = mimi_costs(mimi, s.slots, lm.dep_q);
    let ts = temporal_shape(lm);
    let [g, at, sm] = stack_layer(&ts, rows, s.keys, a, s.kv_bytes);
    let (layers, d) = (ts.layers as f64, lm.dim as f64);
    let mut lm_small = sm * layers;
    lm_small += Cost {
        // The codebooks' embedding rows (act), condition rows and the
        // residual stream (f32), the out-norm.
        bytes: r * (lm.num_codebooks() as f64 * d * a as f64 + 2.0 * d * 4.0)
            + r * (d * 4.0 + d * a as f64),
        flops: 0.0,
    };
    let text_sample = Cost {
        bytes: r * lm.text_card as f64 * 4.0,
        flops: 0.0,
    };
    let [dg, dat, dsm, dsa] = depformer_costs(lm, rows, a);
    [
        (Phase::Copies, copies, f32_m, Link::Host),
        (Phase::MimiEncSeanet, enc, f32_m, hbm),
        (Phase::MimiEncXfmr, tr, f32_m, hbm),
        (Phase::MimiEncRvq, rvq_enc, f32_m, hbm),
        (Phase::LmSmall, lm_small, lm_m, hbm),
        (Phase::LmGemm, g * layers, lm_m, hbm),
        (Phase::LmAttn, at * layers, lm_m, hbm),
        (
            Phase::LmHead,
            linear(rows, lm.text_card, lm.dim, a, false),
            lm_m,
            hbm,
        ),
        (Phase::LmSample, text_sample, lm_m, hbm),
        (Phase::DepGemm, dg, lm_m, hbm),
        (Phase::DepAttn, dat, lm_m, hbm),
        (Phase::DepSmall, dsm, lm_m, hbm),
        (Phase::DepSample, dsa, lm_m, hbm),
        (Phase::MimiDecRvq, rvq_dec, f32_m, hbm),
        (Phase::MimiDecXfmr, tr, f32_m, hbm),
        (Phase::MimiDecSeanet, dec, f32_m, hbm),
    ]
    .into_iter()
    .map(|(phase, cost, matrix, link)| PhaseCost {
        phase,
        cost,
        matrix,
        link,
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One temporal layer of Moshi 7B at batch 1, bf16, full context,
    /// counted by hand.
    #[test]
    fn one_moshi_layer_by_hand() {
        let lm = LmConfig::moshi_7b();
        let ts = temporal_shape(&lm);
        assert_eq!((ts.dim, ts.hidden, ts.kv_dim()), (4096, 11264, 4096));
        let [g, at, sm] = stack_layer(&ts, 1, 3000, 2, 2);
        // Weights: in_proj 12288×4096, out_proj 4096², ff_in 22528×4096,
        // ff_out 4096×11264 = 205,520,896 parameters.
        let params = 12288.0 * 4096.0 + 4096.0 * 4096.0 + 22528.0 * 4096.0 + 4096.0 * 11264.0;
        assert_eq!(params, 205_520_896.0);
        assert_eq!(g.flops, 2.0 * params);
        // 411.0 MB of bf16 weights, and the row's activations:
        // in_proj 4096·2 + 12288·4, out_proj 4096·2 + 2·4096·4,
        // ff_in 4096·2 + 22528·4, ff_out 11264·2 + 2·4096·4.
        let act =
            (8192.0 + 49152.0) + (8192.0 + 32768.0) + (8192.0 + 90112.0) + (22528.0 + 32768.0);
        assert_eq!(g.bytes, 2.0 * params + act);
        // Attention: 3000 keys and values of 4096 bf16 = 49,152,000 bytes,
        // plus q/k/v in (12288·4), q out (4096·4), k and v written
        // (2·4096·2), q read again (4096·4), output (4096·2).
        assert_eq!(
            at.bytes,
            49_152_000.0 + 49152.0 + 16384.0 + 16384.0 + 16384.0 + 8192.0
        );
        // Scores and weighted sum: 2 · 2 · 4096 · 3000.
        assert_eq!(at.flops, 49_152_000.0);
        // Norms: 2 · (4096·4 + 4096·2); gating: 22528·4 + 11264·2.
        assert_eq!(sm.bytes, 2.0 * 24576.0 + 90112.0 + 22528.0);
        // fp8 halves the cache bytes only.
        let [_, at8, _] = stack_layer(&ts, 1, 3000, 2, 1);
        assert_eq!(at.bytes - at8.bytes, 24_576_000.0 + 8192.0);
    }

    /// Grouped-query attention reads each key/value head once per row.
    #[test]
    fn grouped_query_heads_read_once() {
        let mut ts = temporal_shape(&LmConfig::moshi_7b());
        let [_, full, _] = stack_layer(&ts, 1, 1000, 2, 2);
        ts.kv_heads /= 2;
        let [_, half, _] = stack_layer(&ts, 1, 1000, 2, 2);
        // 2 (K and V) · 1000 keys · 2048 fewer values · 2 bytes less read,
        // and 2 · 2048 · 2 fewer written, 2 · 2048 · 4 fewer qkv floats in.
        assert_eq!(
            full.bytes - half.bytes,
            2.0 * 1000.0 * 2048.0 * 2.0 + 2.0 * 2048.0 * 2.0 + 2.0 * 2048.0 * 4.0
        );
        assert_eq!(full.flops, half.flops);
    }

    /// A Mimi convolution by hand: the 512 → 1024 down-sampling conv of the
    /// SEANet encoder's last block (kernel 16, stride 8, 16 → 2 steps).
    #[test]
    fn one_mimi_conv_by_hand() {
        let mimi = MimiConfig::mimi_default();
        let convs = mimi_convs(&mimi);
        let c = convs
            .iter()
            .find(|c| c.c_in == 512 && c.c_out == 1024 && !c.transposed)
            .copied()
            .unwrap();
        assert_eq!((c.kernel, c.stride, c.t_in, c.t_out()), (16, 8, 16, 2));
        let k = conv(&c, 1);
        // 1024 outputs · 512 inputs · 16 taps · 2 steps multiply-adds.
        assert_eq!(k.flops, 2.0 * 1024.0 * 512.0 * 16.0 * 2.0);
        let w = 1024.0 * 512.0 * 16.0;
        let acts = 16.0 * 512.0 + 2.0 * 1024.0;
        let state = 2.0 * c.state_floats() as f64;
        assert_eq!(k.bytes, 4.0 * (w + acts + state));
        // Batch scales activations and FLOPs, not weights.
        let k64 = conv(&c, 64);
        assert_eq!(k64.flops, 64.0 * k.flops);
        assert_eq!(k64.bytes, 4.0 * (w + 64.0 * (acts + state)));
    }

    /// The whole step: every phase once, the temporal weights where the
    /// memory plan puts them, floors against rates.
    #[test]
    fn a_step_costs_every_phase() {
        let lm = LmConfig::moshi_7b();
        let mimi = MimiConfig::mimi_default();
        let s = StepShape {
            slots: 1,
            rows_per_slot: 1,
            keys: 3000,
            kv_bytes: 2,
            act_bytes: 2,
        };
        let costs = step_costs(&lm, &mimi, &s);
        let phases: Vec<Phase> = costs.iter().map(|c| c.phase).collect();
        let mut want: Vec<Phase> = Phase::ALL
            .iter()
            .copied()
            .filter(|&p| p != Phase::Other)
            .collect();
        let mut got = phases.clone();
        got.sort();
        want.sort();
        assert_eq!(got, want);
        let get = |p: Phase| costs.iter().find(|c| c.phase == p).unwrap().cost;
        // 32 layers of 411.0 MB of weights: 13.15 GB.
        let w = 32.0 * 2.0 * 205_520_896.0;
        assert!(get(Phase::LmGemm).bytes > w && get(Phase::LmGemm).bytes < w * 1.001);
        // KV read: 32 layers · 3000 keys · 2 · 4096 · 2 bytes = 1.57 GB.
        let kv = 32.0 * 3000.0 * 2.0 * 4096.0 * 2.0;
        assert!(get(Phase::LmAttn).bytes > kv && get(Phase::LmAttn).bytes < kv * 1.01);
        // The text head: 32000 × 4096 bf16.
        assert!(get(Phase::LmHead).bytes > 32000.0 * 4096.0 * 2.0);
        let rates = Rates {
            hbm_bytes_per_s: 4e12,
            host_bytes_per_s: 50e9,
            bf16_flops_per_s: 700e12,
            f32_flops_per_s: 50e12,
        };
        let gemm = costs.iter().find(|c| c.phase == Phase::LmGemm).unwrap();
        // Batch 1 is bandwidth-bound: bytes / 4 TB/s.
        assert!((gemm.floor_ms(&rates) - 1e3 * gemm.cost.bytes / 4e12).abs() < 1e-9);
        let total: f64 = costs.iter().map(|c| c.floor_ms(&rates)).sum();
        assert!(total > 3.5 && total < 6.0, "{total}");
    }
}
