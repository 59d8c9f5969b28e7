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
}

impl Default for GenDefaults {
    fn default() -> Self {
        GenDefaults {
            text_temperature: 0.7,
            text_topk: 25,
            audio_temperature: 0.8,
            audio_topk: 250,
            cfg_coef: 1.0,
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
        Ok(())
    }
}
