//! Loading the model: the configured checkpoint (or the embedded demo,
//! written to the cache on first use), built on the configured backend,
//! with its piece table, what sessions may ask of it and its description.
//!
//! Invariant: the checkpoint is checked before any weight is built.

use crate::config::Config;
use crate::session::params::ModelInfo;
use anyhow::{anyhow, Context, Result};
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::spm::PieceTable;
use moshid_model::streaming::StreamingModel;
use std::path::PathBuf;

/// The loaded model and what the sessions need to know of it.
pub struct LoadedModel {
    /// The backend.
    pub model: Box<dyn StreamingModel>,
    /// Token text.
    pub pieces: PieceTable,
    /// Conditioning.
    pub info: ModelInfo,
    /// Where it came from (for the log).
    pub description: String,
    /// What `GET /v1/model` says of it.
    pub about: crate::api::model::ModelDescription,
}

/// The default cache folder for the demo checkpoint.
pub fn default_cache_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("moshid");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join(".cache").join("moshid");
    }
    std::env::temp_dir().join("moshid-cache")
}

/// Loads the configured checkpoint (or the demo) on the configured backend.
pub fn load_model(config: &Config) -> Result<LoadedModel> {
    let (dir, demo) = match &config.model.dir {
        Some(d) => (
            CheckpointDir::open(d)
                .with_context(|| format!("loading the checkpoint in {}", d.display()))?,
            false,
        ),
        None => {
            let cache = config
                .model
                .cache_dir
                .clone()
                .unwrap_or_else(default_cache_dir);
            let d = moshid_model::demo::ensure_demo(&cache).with_context(|| {
                format!("writing the demo checkpoint under {}", cache.display())
            })?;
            (d, true)
        }
    };
    dir.check()
        .with_context(|| format!("checking the checkpoint in {}", dir.dir.display()))?;
    let cache = config
        .model
        .cache_dir
        .clone()
        .unwrap_or_else(default_cache_dir);
    let built = crate::backend::build(config, &dir, &cache)?;
    eprintln!("<6>backend: {}", built.description);
    let about = crate::api::model::ModelDescription::new(
        &dir,
        demo,
        &built.description,
        built.model.max_slots(),
    );
    let model = built.model;
    let pieces = match &dir.tokenizer {
        Some(p) => PieceTable::from_file(p).map_err(|e| anyhow!("{}: {e}", p.display()))?,
        // A folder without a tokenizer: no token is printed as text.
        None => PieceTable::from_pieces([(
            "<unk>".to_string(),
            0.0,
            moshid_model::spm::PieceKind::Unknown,
        )])
        .map_err(|e| anyhow!("placeholder piece table: {e}"))?,
    };
    let info = ModelInfo {
        conditioners: dir
            .lm
            .conditioners
            .iter()
            .map(|c| (c.name.clone(), c.possible_values.clone()))
            .collect(),
        is_hibiki: dir.lm.model_type == moshid_model::config::ModelType::Hibiki,
        drain_text_eos: match moshid_model::lm::end_of_stream_of(&dir.lm) {
            moshid_model::lm::EndOfStream::DrainUntilText { text_eos_id, .. } => Some(text_eos_id),
            moshid_model::lm::EndOfStream::WithInput => None,
        },
    };
    let description = if demo {
        format!(
            "the embedded demo checkpoint ({}; random weights, no speech)",
            dir.dir.display()
        )
    } else {
        format!("{} ({:?})", dir.dir.display(), dir.lm.model_type)
    };
    Ok(LoadedModel {
        model,
        pieces,
        info,
        description,
        about,
    })
}
