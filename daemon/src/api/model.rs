//! `GET /v1/model`: what the loaded model is and which session parameters it
//! takes, for the page (and any client) to show and offer. Made once at
//! start from the checkpoint; answered with the configured defaults.
//!
//! Invariant: nothing in it is secret beyond what the endpoint's bearer
//! token already guards (no file system paths, no token).

use crate::config::GenDefaults;
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::config::ModelType;
use serde::Serialize;
use std::path::Path;

/// One conditioner and the values it accepts.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Conditioner {
    /// Its name, as in `condition.NAME=VALUE`.
    pub name: String,
    /// The values it accepts.
    pub values: Vec<String>,
}

/// The loaded model, described.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct ModelDescription {
    /// A name for people: the Hugging Face repository when the folder is in
    /// the hub's cache layout (`models--ORG--NAME/snapshots/REV`), else the
    /// folder's name; `demo` for the embedded demo checkpoint, `random
    /// weights: SHAPE` for random weights.
    pub name: String,
    /// `moshi` (dialogue), `hibiki` (translation) or `personaplex` (dialogue
    /// steered by `voice_prompt` and `text_prompt`).
    #[serde(rename = "type")]
    pub model_type: &'static str,
    /// The embedded demo checkpoint (random weights: no speech, no meaning).
    pub demo: bool,
    /// The shape served with random weights (`--random-weights`), if any:
    /// no speech, no meaning; for measuring.
    pub random_weights: Option<String>,
    /// The backend, as the start-up log describes it.
    pub backend: String,
    /// Streams the model serves at once.
    pub max_slots: usize,
    /// Audio sample rate in and out.
    pub sample_rate_hz: u32,
    /// One model frame.
    pub frame_ms: f64,
    /// Frames a stream sends before its first answer (the model's largest
    /// codebook delay): answer `k` is the model's step on input frame
    /// `k + frames_before_output`.
    pub frames_before_output: usize,
    /// `drain` (the model is run on after the end of input until it ends its
    /// text, Hibiki) or `immediate`.
    pub end_of_input: &'static str,
    /// Conditioners (empty for models without): `condition.NAME=VALUE` and
    /// `cfg_coef` apply to them.
    pub conditioners: Vec<Conditioner>,
}

impl ModelDescription {
    /// Describes the checkpoint in `dir` as loaded on `backend`.
    pub fn new(dir: &CheckpointDir, demo: bool, backend: &str, max_slots: usize) -> Self {
        ModelDescription {
            name: if demo {
                "demo".to_string()
            } else {
                name_of(&dir.dir)
            },
            model_type: match dir.lm.model_type {
                ModelType::Hibiki => "hibiki",
                ModelType::PersonaPlex => "personaplex",
                ModelType::Moshi => "moshi",
            },
            demo,
            random_weights: None,
            backend: backend.to_string(),
            max_slots,
            sample_rate_hz: crate::SAMPLE_RATE_HZ,
            frame_ms: crate::FRAME_MS,
            frames_before_output: dir.lm.max_delay(),
            end_of_input: match moshid_model::lm::end_of_stream_of(&dir.lm) {
                moshid_model::lm::EndOfStream::DrainUntilText { .. } => "drain",
                moshid_model::lm::EndOfStream::WithInput => "immediate",
            },
            conditioners: dir
                .lm
                .conditioners
                .iter()
                .map(|c| Conditioner {
                    name: c.name.clone(),
                    values: c.possible_values.clone(),
                })
                .collect(),
        }
    }

    /// The endpoint's answer: the model and the defaults a session gets.
    pub fn to_json(&self, defaults: &GenDefaults) -> serde_json::Value {
        // f32 values as people wrote them (0.8, not 0.800000011920929).
        let short = |x: f32| x.to_string().parse::<f64>().unwrap_or(f64::from(x));
        serde_json::json!({
            "model": self,
            "defaults": {
                "text_temperature": short(defaults.text_temperature),
                "text_topk": defaults.text_topk,
                "audio_temperature": short(defaults.audio_temperature),
                "audio_topk": defaults.audio_topk,
                "cfg_coef": short(defaults.cfg_coef),
                "pad_mult": short(defaults.pad_mult),
                "repetition_penalty": short(defaults.repetition_penalty),
                "repetition_penalty_context": defaults.repetition_penalty_context,
            },
        })
    }
}

/// `ORG/NAME` for a folder inside the hub's cache (`…/models--ORG--NAME/
/// snapshots/REV`), else the folder's own name.
fn name_of(dir: &Path) -> String {
    for part in dir.components().rev() {
        let part = part.as_os_str().to_string_lossy();
        if let Some(repo) = part.strip_prefix("models--") {
            return repo.replacen("--", "/", 1);
        }
    }
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::name_of;
    use std::path::Path;

    #[test]
    fn names_from_folders() {
        assert_eq!(
            name_of(Path::new(
                "/root/.cache/huggingface/hub/models--kyutai--moshiko-pytorch-bf16/snapshots/2bfc9ae"
            )),
            "kyutai/moshiko-pytorch-bf16"
        );
        assert_eq!(
            name_of(Path::new("/srv/models/hibiki-2b-pytorch-bf16")),
            "hibiki-2b-pytorch-bf16"
        );
        assert_eq!(name_of(Path::new("/srv/models/hibiki-2b/")), "hibiki-2b");
    }
}
