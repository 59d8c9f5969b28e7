//! Model configurations: the official LM `config.json` and Mimi config key
//! sets, parsed strictly.
//!
//! Invariants: a parsed config has been validated as a whole (dimensions
//! divide, lengths agree, every value is one this implementation computes
//! exactly). A key we do not know, or a value we would have to guess the
//! meaning of, is refused with an error that names the key. Keys that only
//! name files or carry generation defaults are kept or ignored, never refused.
//! An absent key means what it means to the official code (moshi 0.2.13):
//! the `LMModel` / `StreamingTransformer` default, and for a `depformer_*`
//! transformer key the temporal key it inherits (see [`LmConfig::from_json`]).
//!
//! Layout: `layers` holds the transformer building blocks both models name
//! (norms, gating, positional embeddings, KV windows); `reader` the strict
//! key-by-key JSON reader; [`LmConfig`] is declared with its family presets in
//! `lm`, read from JSON in `lm_json` and checked as a whole in `lm_validate`;
//! [`MimiConfig`] lives in `mimi`. Every public item is re-exported here, so
//! its path stays `moshid_model::config::…`.

mod layers;
mod lm;
mod lm_json;
mod lm_validate;
mod mimi;
mod reader;

pub use layers::{Gating, KvWindow, NormKind, PosEmb, Rope};
pub use lm::{
    CheckpointFiles, DepformerConfig, LmConfig, LoraConfig, LutConditionerConfig, ModelType,
};
pub use mimi::{MimiConfig, MimiTransformerConfig, QuantizerConfig, SeanetConfig};

use serde_json::Value;
use std::path::Path;

/// A configuration that cannot be used, with the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The text is not JSON.
    #[error("{path}: not valid JSON: {source}")]
    Json {
        /// The file.
        path: String,
        /// The cause.
        source: serde_json::Error,
    },
    /// A key that this implementation does not know.
    #[error("unknown key `{0}`")]
    UnknownKey(String),
    /// A required key is absent.
    #[error("missing key `{0}`")]
    MissingKey(String),
    /// A key whose value is of the wrong type or outside what is supported.
    #[error("key `{key}`: {why}")]
    BadValue {
        /// The key (dotted path for nested keys).
        key: String,
        /// What is wrong with it.
        why: String,
    },
}

fn bad(key: &str, why: impl Into<String>) -> ConfigError {
    ConfigError::BadValue {
        key: key.to_string(),
        why: why.into(),
    }
}

fn read_json(path: &Path) -> Result<Value, ConfigError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: p.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ConfigError::Json { path: p, source })
}

#[cfg(test)]
mod tests;
