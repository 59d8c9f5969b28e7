//! What every backend does when a slot is (re)assigned: validate the
//! session's [`GenParams`], resolve its conditions and compute the fused
//! condition vectors of its rows, and derive the two samplers.
//!
//! [`Conditioning`] holds the model's LUT conditioners in the fuser's `sum`
//! order. It is shared by the CPU LM and the CUDA backend so that both accept
//! and refuse exactly the same parameters and condition their rows with the
//! same vectors (computed on the host once per reset, never per step).

use super::conditioner::Lut;
use super::sampling::Sampler;
use super::{GenParams, ParamError};
use crate::config::{LmConfig, LutConditionerConfig};
use crate::weights::{CheckpointError, TensorSpec, Weights};

/// The configured conditioners in the fuser's `sum` order.
pub(crate) fn fused_conditioners(cfg: &LmConfig) -> impl Iterator<Item = &LutConditionerConfig> {
    cfg.fuser_sum
        .iter()
        .filter_map(|n| cfg.conditioners.iter().find(|c| &c.name == n))
}

/// A slot's validated decoding set-up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlotSetup {
    /// Guidance coefficient when guidance is on (two rows).
    pub cfg_coef: Option<f32>,
    /// Text sampler.
    pub text: Sampler,
    /// Audio sampler.
    pub audio: Sampler,
    /// Seed of the slot's generator.
    pub seed: u64,
    /// Kyutai's text rules.
    pub rules: super::text_rules::TextRules,
}

/// The model's conditioners.
pub struct Conditioning {
    luts: Vec<Lut>,
    dim: usize,
}

fn check_finite(name: &'static str, v: f32) -> Result<(), ParamError> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(ParamError::NotFinite(name, v))
    }
}

impl Conditioning {
    /// Tensors of the conditioners.
    pub fn specs(cfg: &LmConfig, out: &mut Vec<TensorSpec>) {
        for c in fused_conditioners(cfg) {
            Lut::specs(c, out);
        }
    }

    /// Loads the conditioners of `cfg` (none for Moshi).
    pub fn load(cfg: &LmConfig, w: &mut Weights) -> Result<Self, CheckpointError> {
        Ok(Conditioning {
            luts: fused_conditioners(cfg)
                .map(|c| Lut::load(w, c))
                .collect::<Result<_, _>>()?,
            dim: cfg.dim,
        })
    }

    /// Deterministic random conditioners of `cfg`'s shapes (for timing
    /// models of real shapes without a checkpoint).
    pub fn random(cfg: &LmConfig, seed: u64) -> Self {
        Conditioning {
            luts: fused_conditioners(cfg)
                .enumerate()
                .map(|(i, c)| Lut::random(c, seed.wrapping_add(i as u64)))
                .collect(),
            dim: cfg.dim,
        }
    }

    /// Whether the model has no conditioner (no guidance possible).
    pub fn is_empty(&self) -> bool {
        self.luts.is_empty()
    }

    /// Rows per slot: two when the model has conditioners (guidance
    /// possible), else one.
    pub fn rows_per_slot(&self) -> usize {
        if self.is_empty() {
            1
        } else {
            2
        }
    }

    /// Value ids of each conditioner for a condition list.
    fn resolve(&self, list: &[(String, String)]) -> Result<Vec<Option<usize>>, ParamError> {
        let mut ids = vec![None; self.luts.len()];
        for (name, value) in list {
            let i = self
                .luts
                .iter()
                .position(|c| c.name() == name)
                .ok_or_else(|| {
                    ParamError::UnknownCondition(
                        name.clone(),
                        self.luts.iter().map(|c| c.name().to_string()).collect(),
                    )
                })?;
            if ids[i].is_some() {
                return Err(ParamError::DuplicateCondition(name.clone()));
            }
            ids[i] = Some(self.luts[i].index_of(value)?);
        }
        Ok(ids)
    }

    /// Validates `params` and, for a model with conditioners, writes the
    /// fused condition vectors of the slot's conditioned row into `cond` and
    /// of its guidance row into `null` (each `dim` floats; `tmp` is scratch
    /// of `dim` floats). Nothing is written on error.
    pub fn prepare(
        &self,
        params: &GenParams,
        cond: &mut [f32],
        null: &mut [f32],
        tmp: &mut [f32],
    ) -> Result<SlotSetup, ParamError> {
        check_finite("temp", params.temp)?;
        check_finite("temp_text", params.temp_text)?;
        check_finite("cfg_coef", params.cfg_coef)?;
        check_finite("pad_mult", params.pad_mult)?;
        if let Some((context, penalty)) = params.repetition_penalty {
            check_finite("repetition_penalty", penalty)?;
            if penalty <= 0.0 {
                return Err(ParamError::OutOfRange(
                    "repetition_penalty",
                    format!("must be positive, got {penalty}"),
                ));
            }
            if context == 0 || context > super::text_rules::MAX_REPETITION_CONTEXT {
                return Err(ParamError::OutOfRange(
                    "repetition_penalty_context",
                    format!(
                        "must be 1..={}, got {context}",
                        super::text_rules::MAX_REPETITION_CONTEXT
                    ),
                ));
            }
        }
        let cfg_on = params.cfg_coef != 1.0;
        if cfg_on && self.is_empty() {
            return Err(ParamError::CfgWithoutConditioners(params.cfg_coef));
        }
        if cfg_on && (params.pad_mult != 0.0 || params.repetition_penalty.is_some()) {
            return Err(ParamError::OutOfRange(
                if params.pad_mult != 0.0 {
                    "pad_mult"
                } else {
                    "repetition_penalty"
                },
                "is not available with classifier-free guidance".into(),
            ));
        }
        let cond_ids = self.resolve(&params.conditions)?;
        let null_ids = self.resolve(&params.null_conditions)?;
        let d = self.dim;
        if !self.is_empty() {
            for (y, ids) in [(cond, &cond_ids), (null, &null_ids)] {
                let y = &mut y[..d];
                for (i, (c, id)) in self.luts.iter().zip(ids).enumerate() {
                    if i == 0 {
                        c.condition(*id, y);
                    } else {
                        let t = &mut tmp[..d];
                        c.condition(*id, t);
                        for (o, v) in y.iter_mut().zip(t.iter()) {
                            *o += v;
                        }
                    }
                }
            }
        }
        let text = Sampler {
            use_sampling: params.use_sampling,
            temp: params.temp_text,
            top_k: params.top_k_text,
        };
        Ok(SlotSetup {
            cfg_coef: cfg_on.then_some(params.cfg_coef),
            rules: super::text_rules::TextRules::new(
                params.pad_mult,
                params.repetition_penalty,
                &text,
            ),
            text,
            audio: Sampler {
                use_sampling: params.use_sampling,
                temp: params.temp,
                top_k: params.top_k,
            },
            seed: params.seed,
        })
    }
}
