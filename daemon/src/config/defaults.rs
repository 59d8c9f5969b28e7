//! `defaults.*`: the decoding parameters a session gets unless it names
//! its own.

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};

/// `defaults.*`: decoding parameters a session gets unless its query says otherwise.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GenDefaults {
    /// Text sampling temperature.
    pub text_temperature: f32,
    /// Text top-k.
    pub text_topk: usize,
    /// Audio sampling temperature.
    pub audio_temperature: f32,
    /// Audio top-k.
    pub audio_topk: usize,
    /// Classifier-free guidance coefficient (models with conditioners).
    pub cfg_coef: f32,
    /// Kyutai's `pad_mult`: the text padding probability is scaled by
    /// `exp(pad_mult)` (0: off).
    pub pad_mult: f32,
    /// Kyutai's repetition penalty on text tokens (1: off).
    pub repetition_penalty: f32,
    /// Counted text tokens the penalty looks back over.
    pub repetition_penalty_context: usize,
}

impl Default for GenDefaults {
    fn default() -> Self {
        GenDefaults {
            text_temperature: 0.7,
            text_topk: 25,
            audio_temperature: 0.8,
            audio_topk: 250,
            cfg_coef: 1.0,
            pad_mult: 0.0,
            repetition_penalty: 1.0,
            repetition_penalty_context: moshid_model::lm::text_rules::DEFAULT_REPETITION_CONTEXT,
        }
    }
}

impl GenDefaults {
    /// Checks the section's bounds; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let d = self;
        if !(d.text_temperature >= 0.0 && d.audio_temperature >= 0.0) {
            return Err(invalid(
                "defaults.text_temperature",
                "temperatures must be ≥ 0",
            ));
        }
        if d.text_topk == 0 || d.audio_topk == 0 {
            return Err(invalid(
                "defaults.text_topk",
                "top-k values must be positive",
            ));
        }
        if d.cfg_coef.is_nan() || d.cfg_coef < 0.0 {
            return Err(invalid("defaults.cfg_coef", "must be ≥ 0"));
        }
        if !(-10.0..=10.0).contains(&d.pad_mult) {
            return Err(invalid("defaults.pad_mult", "must be between -10 and 10"));
        }
        if !(0.1..=10.0).contains(&d.repetition_penalty) {
            return Err(invalid(
                "defaults.repetition_penalty",
                "must be between 0.1 and 10",
            ));
        }
        let max_ctx = moshid_model::lm::text_rules::MAX_REPETITION_CONTEXT;
        if d.repetition_penalty_context == 0 || d.repetition_penalty_context > max_ctx {
            return Err(invalid(
                "defaults.repetition_penalty_context",
                format!("must be between 1 and {max_ctx}"),
            ));
        }
        Ok(())
    }
}
