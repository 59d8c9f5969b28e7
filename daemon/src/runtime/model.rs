//! Loading the model: the configured checkpoint (random weights of a
//! built-in shape, or the embedded demo, written to the cache on first
//! use), built on the configured backend, with its piece table, what
//! sessions may ask of it and its description.
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

/// Loads the configured checkpoint (or random weights of a shape, or the
/// demo) on the configured backend.
pub fn load_model(config: &Config) -> Result<LoadedModel> {
    let cache = config
        .model
        .cache_dir
        .clone()
        .unwrap_or_else(default_cache_dir);
    let random = match config.model.random_weights.as_deref() {
        Some(n) => Some(
            crate::random_weights::resolve(n)
                .map_err(|e| anyhow!("config key `model.random_weights`: {e}"))?,
        ),
        None => None,
    };
    let (dir, demo) = match (random, &config.model.dir) {
        (Some(shape), _) => {
            eprintln!("<4>model: {}", shape.marker());
            (crate::random_weights::prepare(shape, &cache)?, false)
        }
        (None, Some(d)) => (
            CheckpointDir::open(d)
                .with_context(|| format!("loading the checkpoint in {}", d.display()))?,
            false,
        ),
        (None, None) => {
            let d = moshid_model::demo::ensure_demo(&cache).with_context(|| {
                format!("writing the demo checkpoint under {}", cache.display())
            })?;
            (d, true)
        }
    };
    dir.check()
        .with_context(|| format!("checking the checkpoint in {}", dir.dir.display()))?;
    let built = crate::backend::build(config, &dir, &cache)?;
    eprintln!("<6>backend: {}", built.description);
    let mut about = crate::api::model::ModelDescription::new(
        &dir,
        demo,
        &built.description,
        built.model.max_slots(),
    );
    if let Some(shape) = random {
        about.name = format!("random weights: {}", shape.name);
        about.random_weights = Some(shape.name.to_string());
    }
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
    let info = model_info(config, &dir, model.as_ref())?;
    let description = describe(&dir, demo, random);
    Ok(LoadedModel {
        model,
        pieces,
        info,
        description,
        about,
    })
}

/// What sessions may ask of the model: its conditioners, its kind, how its
/// stream ends, and (models with prompts) what prompts are built from.
fn model_info(
    config: &Config,
    dir: &CheckpointDir,
    model: &dyn StreamingModel,
) -> Result<ModelInfo> {
    Ok(ModelInfo {
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
        prompts: if model.takes_prompts() {
            let tok = dir
                .tokenizer
                .as_ref()
                .ok_or_else(|| anyhow!("a model with prompts needs its tokenizer"))?;
            let encoder = moshid_model::spm_encode::Encoder::from_file(tok)
                .map_err(|e| anyhow!("{}: {e}", tok.display()))?;
            Some(std::sync::Arc::new(crate::session::prompt::PromptSetup {
                voice_dir: config.model.voice_dir.clone(),
                encoder,
                lm: dir.lm.clone(),
                frame_samples: model.frame_samples(),
            }))
        } else {
            None
        },
    })
}

/// Where the model came from, for the log.
fn describe(
    dir: &CheckpointDir,
    demo: bool,
    random: Option<&crate::random_weights::RandomShape>,
) -> String {
    if let Some(shape) = random {
        format!(
            "the {:?} shape {} (dim {}, {} layers, context {}): {}",
            dir.lm.model_type,
            shape.name,
            dir.lm.dim,
            dir.lm.num_layers,
            dir.lm.context,
            shape.marker()
        )
    } else if demo {
        format!(
            "the embedded demo checkpoint ({}; random weights, no speech)",
            dir.dir.display()
        )
    } else {
        format!("{} ({:?})", dir.dir.display(), dir.lm.model_type)
    }
}
