//! The CPU backend's step time at batch 1, predicted before loading: the
//! LM's weight bytes a step reads, at the rate this machine's LM kernel
//! streams weights, plus Mimi's arithmetic for one frame (encode and
//! decode), at the rate of Mimi's packed product — both rates measured a
//! moment before by [`moshid_model::probe`].
//!
//! Why these two terms: at batch 1 every LM weight is read once per step and
//! used for one row, so the LM is bound by memory bandwidth (7.7 G float32
//! parameters are 31 GB a step); Mimi is small and compute-bound. The
//! depformer reads each weight set once per codebook step that uses it, so
//! a schedule sharing sets reads them more than once (approximated here as
//! the average set size times the steps). Embedding tables are not
//! streamed (a step reads one row of each).

use moshid_kernels::plan::mimi_convs;
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::lm::Lm;
use moshid_model::probe::HostRates;

/// The work of one step of one stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepWork {
    /// LM weight bytes read (float32).
    pub lm_bytes: f64,
    /// Mimi floating-point operations (encode + decode of one frame).
    pub mimi_flops: f64,
}

/// What one step of one stream costs for the model in `dir`.
pub fn step_work(dir: &CheckpointDir) -> StepWork {
    let lm = &dir.lm;
    let specs = Lm::tensor_specs(lm);
    let bytes = |keep: &dyn Fn(&str) -> bool| -> f64 {
        specs
            .iter()
            .filter(|t| keep(&t.name))
            .map(|t| t.numel() as f64 * 4.0)
            .sum()
    };
    let embedding = |n: &str| {
        n.starts_with("emb.")
            || n.starts_with("text_emb.")
            || n.starts_with("condition_provider.")
            || n.starts_with("depformer_emb.")
            || n.starts_with("depformer_text_emb.")
    };
    let temporal = bytes(&|n| !n.starts_with("depformer") && !embedding(n));
    let sets = lm.depformer.num_weight_sets(lm.dep_q).max(1) as f64;
    let dep_layers = bytes(&|n| n.starts_with("depformer.layers."));
    let dep_rest = bytes(&|n| {
        n.starts_with("depformer") && !n.starts_with("depformer.layers.") && !embedding(n)
    });
    let lm_bytes = temporal + dep_layers / sets * lm.dep_q as f64 + dep_rest;

    let mimi = &dir.mimi;
    let conv_flops: f64 = mimi_convs(mimi)
        .iter()
        .map(|c| {
            let macs = if c.depthwise {
                c.c_out * c.kernel * c.t_in
            } else if c.transposed {
                c.c_in * c.c_out * c.kernel * c.t_in
            } else {
                c.c_in * c.c_out * c.kernel * c.t_out()
            };
            2.0 * macs as f64
        })
        .sum();
    let tr = &mimi.transformer;
    let (d, ff, ctx) = (
        tr.d_model as f64,
        tr.dim_feedforward as f64,
        tr.context as f64,
    );
    let per_layer_step = 2.0 * (4.0 * d * d + 2.0 * d * ff) + 4.0 * ctx * d;
    let steps = mimi.downsample_stride() as f64;
    let transformer_flops = 2.0 * steps * tr.num_layers as f64 * per_layer_step;
    let q = &mimi.quantizer;
    let used = dir.mimi_codebooks() as f64;
    let rvq_flops = 2.0 * used * q.bins as f64 * q.dimension as f64
        + 4.0 * 2.0 * (q.input_dimension * q.dimension) as f64;
    StepWork {
        lm_bytes,
        mimi_flops: conv_flops + transformer_flops + rvq_flops,
    }
}

/// A predicted step at batch 1, with its parts, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// The LM's share.
    pub lm_ms: f64,
    /// Mimi's share.
    pub mimi_ms: f64,
    /// What went in.
    pub work: StepWork,
    /// The rates measured.
    pub rates: HostRates,
}

impl Prediction {
    /// The step.
    pub fn step_ms(&self) -> f64 {
        self.lm_ms + self.mimi_ms
    }

    /// The figures, for a message: "2950 ms (LM: 30.8 GB of weights at
    /// 10.4 GB/s; Mimi: 1.3 GFLOP at 41 GFLOP/s)".
    pub fn explain(&self) -> String {
        format!(
            "{:.0} ms (LM: {:.2} GB of float32 weights read at {:.1} GB/s, {:.0} ms; \
             Mimi: {:.2} GFLOP at {:.1} GFLOP/s, {:.0} ms; rates measured on this machine \
             with the CPU backend's own kernels)",
            self.step_ms(),
            self.work.lm_bytes / 1e9,
            self.rates.weight_bytes_per_s / 1e9,
            self.lm_ms,
            self.work.mimi_flops / 1e9,
            self.rates.flops_per_s / 1e9,
            self.mimi_ms,
        )
    }
}

/// The step at batch 1 predicted from `work` and `rates`.
pub fn predict(work: StepWork, rates: HostRates) -> Prediction {
    Prediction {
        lm_ms: work.lm_bytes / rates.weight_bytes_per_s * 1e3,
        mimi_ms: work.mimi_flops / rates.flops_per_s * 1e3,
        work,
        rates,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshid_model::config::{LmConfig, MimiConfig};

    #[test]
    fn moshi_7b_work_per_step() {
        let t = tempfile::tempdir().unwrap();
        moshid_model::header_only::write_moshi_7b(t.path()).unwrap();
        let dir = CheckpointDir::open(t.path()).unwrap();
        assert_eq!(dir.lm.dim, LmConfig::moshi_7b().dim);
        let w = step_work(&dir);
        // Everything but the embeddings: ~7.2 G parameters in float32.
        assert!((28e9..31e9).contains(&w.lm_bytes), "{w:?}");
        // Mimi: a few GFLOP per frame (SEANet dominated).
        let _ = MimiConfig::mimi_default();
        assert!((0.5e9..20e9).contains(&w.mimi_flops), "{w:?}");
        let p = predict(
            w,
            HostRates {
                weight_bytes_per_s: 10e9,
                flops_per_s: 50e9,
            },
        );
        assert!(p.step_ms() > 2000.0, "{}", p.explain());
        assert!(p.explain().contains("GB/s"), "{}", p.explain());
    }
}
