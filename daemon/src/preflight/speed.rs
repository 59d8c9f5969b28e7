//! The CPU backend's step time at batch 1, predicted before loading the
//! LM: its weight bytes a step reads, at the rate this machine's LM kernel
//! streams weights, plus a few frames of the checkpoint's own Mimi, timed
//! (both by [`moshid_model::probe`]).
//!
//! Why these two terms: at batch 1 every LM weight is read once per step and
//! used for one row, so the LM is bound by memory bandwidth (7.7 G float32
//! parameters are 31 GB a step); Mimi is small and timed for real. The
//! depformer reads each weight set once per codebook step that uses it, so
//! a schedule sharing sets reads them more than once (approximated here as
//! the average set size times the steps). Embedding tables are not
//! streamed (a step reads one row of each).

use moshid_model::checkpoint::CheckpointDir;
use moshid_model::lm::Lm;

/// The LM's work in one step of one stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepWork {
    /// LM weight bytes read (float32).
    pub lm_bytes: f64,
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

    StepWork { lm_bytes }
}

/// A predicted step at batch 1, with its parts, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// The LM's share.
    pub lm_ms: f64,
    /// Mimi's share (measured).
    pub mimi_ms: f64,
    /// What went in.
    pub work: StepWork,
    /// The LM kernel's measured weight rate, bytes per second.
    pub weight_bytes_per_s: f64,
}

impl Prediction {
    /// The step.
    pub fn step_ms(&self) -> f64 {
        self.lm_ms + self.mimi_ms
    }

    /// The figures, for a message: "2950 ms (LM: 30.8 GB of weights at
    /// 10.4 GB/s, 2930 ms; Mimi: 20 ms measured)".
    pub fn explain(&self) -> String {
        format!(
            "{:.1} ms (LM: {:.2} GB of float32 weights read at {:.1} GB/s, {:.1} ms; \
             Mimi: {:.1} ms, timed; measured on this machine with the CPU backend's own kernels)",
            self.step_ms(),
            self.work.lm_bytes / 1e9,
            self.weight_bytes_per_s / 1e9,
            self.lm_ms,
            self.mimi_ms,
        )
    }
}

/// The step at batch 1 from the LM's `work` at `weight_bytes_per_s` and
/// Mimi's measured `mimi_ms`.
pub fn predict(work: StepWork, weight_bytes_per_s: f64, mimi_ms: f64) -> Prediction {
    Prediction {
        lm_ms: work.lm_bytes / weight_bytes_per_s * 1e3,
        mimi_ms,
        work,
        weight_bytes_per_s,
    }
}

/// Measures this machine and the checkpoint's Mimi, and predicts.
pub fn measure_and_predict(dir: &CheckpointDir) -> Result<Prediction, String> {
    let rate = moshid_model::probe::weight_stream_rate().map_err(|e| e.to_string())?;
    let mimi = moshid_model::probe::mimi_step_ms(dir, 5).map_err(|e| e.to_string())?;
    Ok(predict(step_work(dir), rate, mimi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshid_model::config::LmConfig;

    #[test]
    fn moshi_7b_work_per_step() {
        let t = tempfile::tempdir().unwrap();
        moshid_model::header_only::write_moshi_7b(t.path()).unwrap();
        let dir = CheckpointDir::open(t.path()).unwrap();
        assert_eq!(dir.lm.dim, LmConfig::moshi_7b().dim);
        let w = step_work(&dir);
        // Everything but the embeddings: ~7.2 G parameters in float32.
        assert!((28e9..31e9).contains(&w.lm_bytes), "{w:?}");
        let p = predict(w, 10e9, 20.0);
        assert!(p.step_ms() > 2000.0, "{}", p.explain());
        assert!(p.explain().contains("GB/s"), "{}", p.explain());
    }
}
