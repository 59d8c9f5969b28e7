//! The LM configuration checked as a whole (`LmConfig::validate`): sizes
//! positive, heads that divide, stream counts that agree, and only the
//! computations this implementation performs.
//!
//! Invariants: the checks run in one fixed order, so the first fault reported
//! for a config is always the same one; each error names the key at fault.

use super::{bad, ConfigError, Gating, LmConfig, NormKind, PosEmb};

impl LmConfig {
    /// Checks the parsed config as a whole; the first fault found is the
    /// error.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.check_positive()?;
        self.check_heads()?;
        self.check_streams()?;
        self.check_computations()?;
        self.check_depformer_weights()?;
        self.check_fusion()
    }

    /// Sizes and repeat factors that must be positive (the checks after
    /// this one divide by them).
    fn check_positive(&self) -> Result<(), ConfigError> {
        let nonzero = [
            ("dim", self.dim),
            ("num_heads", self.num_heads),
            ("num_layers", self.num_layers),
            ("n_q", self.n_q),
            ("dep_q", self.dep_q),
            ("card", self.card),
            ("text_card", self.text_card),
            ("context", self.context),
            ("depformer_dim", self.depformer.dim),
            ("depformer_num_heads", self.depformer.num_heads),
            ("kv_repeat", self.kv_repeat),
            ("depformer_kv_repeat", self.depformer.kv_repeat),
        ];
        for (k, v) in nonzero {
            if v == 0 {
                return Err(bad(k, "must be positive"));
            }
        }
        Ok(())
    }

    /// Head counts that divide the widths into even (RoPE) head widths, and
    /// key/value head counts that divide the head counts.
    fn check_heads(&self) -> Result<(), ConfigError> {
        if !self.dim.is_multiple_of(self.num_heads) {
            return Err(bad("num_heads", format!("must divide dim {}", self.dim)));
        }
        if !(self.dim / self.num_heads).is_multiple_of(2) {
            return Err(bad("num_heads", "head dimension must be even for RoPE"));
        }
        if !self.num_heads.is_multiple_of(self.kv_repeat) {
            return Err(bad(
                "kv_repeat",
                format!("must divide num_heads {}", self.num_heads),
            ));
        }
        if !self.depformer.dim.is_multiple_of(self.depformer.num_heads) {
            return Err(bad(
                "depformer_num_heads",
                format!("must divide depformer_dim {}", self.depformer.dim),
            ));
        }
        if !self
            .depformer
            .num_heads
            .is_multiple_of(self.depformer.kv_repeat)
        {
            return Err(bad(
                "depformer_kv_repeat",
                format!(
                    "must divide depformer_num_heads {} (when absent it is kv_repeat)",
                    self.depformer.num_heads
                ),
            ));
        }
        if self.depformer.pos_emb != PosEmb::None
            && !(self.depformer.dim / self.depformer.num_heads).is_multiple_of(2)
        {
            return Err(bad(
                "depformer_num_heads",
                "head dimension must be even for RoPE",
            ));
        }
        Ok(())
    }

    /// Generated codebooks within the stream count, and one delay per stream.
    fn check_streams(&self) -> Result<(), ConfigError> {
        if self.dep_q > self.n_q {
            return Err(bad("dep_q", format!("must not exceed n_q {}", self.n_q)));
        }
        if self.delays.len() != self.n_q + 1 {
            return Err(bad(
                "delays",
                format!(
                    "expected n_q + 1 = {} entries, got {}",
                    self.n_q + 1,
                    self.delays.len()
                ),
            ));
        }
        Ok(())
    }

    /// Only the layer kinds this implementation computes, and a padding id
    /// inside the text vocabulary.
    fn check_computations(&self) -> Result<(), ConfigError> {
        if self.gating != Gating::Silu || self.depformer.gating != Gating::Silu {
            return Err(bad(
                "gating",
                "the LM and its depformer must use `silu` gating",
            ));
        }
        if !matches!(self.norm, NormKind::RmsNormF32 | NormKind::RmsNorm) {
            return Err(bad("norm", "the LM must use an RMS norm"));
        }
        if !self.depformer.multi_linear {
            return Err(bad("depformer_multi_linear", "only true is supported"));
        }
        if self.existing_text_padding_id as usize >= self.text_card {
            return Err(bad("existing_text_padding_id", "must be below text_card"));
        }
        Ok(())
    }

    /// A per-step weight schedule only with per-step weights, one entry per
    /// generated codebook, every weight set used; low-rank embeddings of a
    /// positive rank.
    fn check_depformer_weights(&self) -> Result<(), ConfigError> {
        if let Some(s) = &self.depformer.weights_per_step_schedule {
            if !self.depformer.weights_per_step {
                return Err(bad(
                    "depformer_weights_per_step_schedule",
                    "needs depformer_weights_per_step",
                ));
            }
            if s.len() != self.dep_q {
                return Err(bad(
                    "depformer_weights_per_step_schedule",
                    format!("expected dep_q = {} entries", self.dep_q),
                ));
            }
            let sets = s.iter().max().copied().unwrap_or(0) + 1;
            if (0..sets).any(|i| !s.contains(&i)) {
                return Err(bad(
                    "depformer_weights_per_step_schedule",
                    "every weight set up to the largest must be used",
                ));
            }
        }
        if self.depformer.low_rank_embeddings == Some(0) {
            return Err(bad("depformer_low_rank_embeddings", "must be positive"));
        }
        Ok(())
    }

    /// Every summed condition is a conditioner and every conditioner is
    /// summed (`sum` is the only fusion implemented).
    fn check_fusion(&self) -> Result<(), ConfigError> {
        for name in &self.fuser_sum {
            if !self.conditioners.iter().any(|c| &c.name == name) {
                return Err(bad(
                    "fuser.sum",
                    format!("names `{name}`, which is not a conditioner"),
                ));
            }
        }
        for c in &self.conditioners {
            if !self.fuser_sum.contains(&c.name) {
                return Err(bad(
                    "fuser",
                    format!(
                        "conditioner `{}` is not summed; only `sum` fusion is supported",
                        c.name
                    ),
                ));
            }
        }
        Ok(())
    }
}
