//! Conditioning: lookup-table conditioners (`LUTConditioner`) summed into the
//! temporal transformer's input (`ConditionFuser` "sum"), and the
//! classifier-free guidance (CFG) mix of two rows' logits.
//!
//! A condition value `v` of conditioner `c` gives
//! `output_proj(embed[index of v])`; an absent value gives the learnt padding
//! (the official `None` value: index `n_bins`, mask 0). The fused vector is the
//! sum over the fuser's `sum` list, in its order. Invariants: the vectors are
//! computed once per slot at reset, never per step; an unknown conditioner or
//! value is an error naming it.

use super::linear::linear;
use super::ParamError;
use crate::config::LutConditionerConfig;
use crate::weights::{CheckpointError, TensorSpec, Weights};

/// One loaded LUT conditioner.
pub(crate) struct Lut {
    cfg: LutConditionerConfig,
    /// `[n_bins + 1, dim]`.
    embed: Vec<f32>,
    /// `[output_dim, dim]`.
    output_proj: Vec<f32>,
    /// `[output_dim]`.
    learnt_padding: Vec<f32>,
}

fn prefix(c: &LutConditionerConfig) -> String {
    format!("condition_provider.conditioners.{}", c.name)
}

impl Lut {
    /// Tensors of a conditioner.
    pub(crate) fn specs(c: &LutConditionerConfig, out: &mut Vec<TensorSpec>) {
        let p = prefix(c);
        out.push(TensorSpec::new(
            format!("{p}.embed.weight"),
            &[c.n_bins + 1, c.dim],
        ));
        out.push(TensorSpec::new(
            format!("{p}.output_proj.weight"),
            &[c.output_dim, c.dim],
        ));
        out.push(TensorSpec::new(
            format!("{p}.learnt_padding"),
            &[1, 1, c.output_dim],
        ));
    }

    /// Loads a conditioner.
    pub(crate) fn load(w: &mut Weights, c: &LutConditionerConfig) -> Result<Self, CheckpointError> {
        let p = prefix(c);
        Ok(Lut {
            embed: w.take(&format!("{p}.embed.weight"), &[c.n_bins + 1, c.dim])?,
            output_proj: w.take(&format!("{p}.output_proj.weight"), &[c.output_dim, c.dim])?,
            learnt_padding: w.take(&format!("{p}.learnt_padding"), &[1, 1, c.output_dim])?,
            cfg: c.clone(),
        })
    }

    /// The conditioner's name.
    /// Deterministic random weights of `c`'s shapes (uniform, ±1/√dim).
    pub(crate) fn random(c: &LutConditionerConfig, seed: u64) -> Self {
        let mut x = seed ^ 0x5eed_c0de;
        let scale = 1.0 / (c.dim as f32).sqrt();
        let mut next = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        };
        Lut {
            embed: (0..(c.n_bins + 1) * c.dim).map(|_| next()).collect(),
            output_proj: (0..c.output_dim * c.dim).map(|_| next()).collect(),
            learnt_padding: (0..c.output_dim).map(|_| next()).collect(),
            cfg: c.clone(),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.cfg.name
    }

    /// The id of a value, or an error naming it.
    pub(crate) fn index_of(&self, value: &str) -> Result<usize, ParamError> {
        self.cfg
            .possible_values
            .iter()
            .position(|v| v == value)
            .ok_or_else(|| ParamError::UnknownConditionValue {
                condition: self.cfg.name.clone(),
                value: value.to_string(),
                allowed: self.cfg.possible_values.clone(),
            })
    }

    /// Writes the condition vector (`[output_dim]`) for value id `index`
    /// (`None`: the learnt padding) into `y`.
    pub(crate) fn condition(&self, index: Option<usize>, y: &mut [f32]) {
        match index {
            Some(i) => {
                let d = self.cfg.dim;
                linear(
                    &self.embed[i * d..(i + 1) * d],
                    1,
                    &self.output_proj,
                    self.cfg.output_dim,
                    d,
                    y,
                );
            }
            None => y.copy_from_slice(&self.learnt_padding),
        }
    }
}

/// Classifier-free guidance exactly as the official `LMGen`:
/// `logits_null + (logits - logits_null) * coef`.
#[inline]
pub(crate) fn cfg_mix(cond: &[f32], null: &[f32], coef: f32, out: &mut [f32]) {
    for ((o, &c), &n) in out.iter_mut().zip(cond).zip(null) {
        *o = n + (c - n) * coef;
    }
}
