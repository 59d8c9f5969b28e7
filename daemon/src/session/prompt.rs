//! A session's prompt keys (`voice_prompt`, `text_prompt`) for models that
//! take prompts (PersonaPlex), resolved into what the model is fed.
//!
//! `voice_prompt` names a file of the configured voice folder
//! (`model.voice_dir`): a `.pt` file is NVIDIA's stored embeddings, anything
//! else a WAV file (read as `sphn.read` reads it, resampled to 24 kHz,
//! normalised to −24 LUFS). A name with a path separator, `..`, a leading
//! dot, a NUL, or that is not a file directly in the folder is refused and
//! never opened (NVIDIA's server joins it to the folder unchecked); the
//! folder's path never appears in an error. `text_prompt` is wrapped in
//! `<system>` tags and tokenized as NVIDIA's server does.
//!
//! Where NVIDIA's server fails, this does what a user expects: both keys are
//! optional (no voice: no voice frames; an empty text: no text frames), and
//! `seed` is accepted. For a model without prompts either key is refused,
//! naming it.

use super::params::ParamError;
use moshid_model::config::LmConfig;
use moshid_model::persona::{text_prompt_tokens, voice_from_pcm_24k, voice_from_pt};
use moshid_model::spm_encode::Encoder;
use moshid_model::streaming::{Prompt, VoiceInput};
use std::path::{Path, PathBuf};

/// Largest voice file read.
pub const MAX_VOICE_BYTES: u64 = 64 << 20;
/// Longest role text accepted, in bytes.
pub const MAX_TEXT_PROMPT_BYTES: usize = 16 << 10;

fn err(key: &str, why: impl Into<String>) -> ParamError {
    ParamError {
        key: key.to_string(),
        why: why.into(),
    }
}

/// What a model with prompts needs to resolve the keys.
#[derive(Debug)]
pub struct PromptSetup {
    /// The voice folder, when configured.
    pub voice_dir: Option<PathBuf>,
    /// The model's tokenizer, able to encode.
    pub encoder: Encoder,
    /// The LM's configuration (a `.pt` voice is checked against it).
    pub lm: LmConfig,
    /// Samples per frame.
    pub frame_samples: usize,
}

/// The prompt keys of a session, as given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PromptKeys {
    /// `voice_prompt`, when given and not empty.
    pub voice: Option<String>,
    /// `text_prompt` (empty when not given).
    pub text: String,
}

/// Reads the prompt keys from a query; refuses them for a model without
/// prompts (`setup` is `None`), naming the key.
pub fn prompt_keys(
    pairs: &[(String, String)],
    takes_prompts: bool,
) -> Result<PromptKeys, ParamError> {
    let mut keys = PromptKeys::default();
    for (k, v) in pairs {
        match k.as_str() {
            "voice_prompt" | "text_prompt" if !takes_prompts => {
                return Err(err(k, "this model takes no prompts"));
            }
            "voice_prompt" => keys.voice = (!v.is_empty()).then(|| v.clone()),
            "text_prompt" => {
                if v.len() > MAX_TEXT_PROMPT_BYTES {
                    return Err(err(k, format!("longer than {MAX_TEXT_PROMPT_BYTES} bytes")));
                }
                keys.text = v.clone();
            }
            _ => {}
        }
    }
    Ok(keys)
}

/// `params` with the session's prompt from its query: refused, naming the
/// key, for a model without prompts; resolved for one with.
pub fn with_prompt(
    mut params: moshid_model::streaming::SessionParams,
    pairs: &[(String, String)],
    model: &super::params::ModelInfo,
) -> Result<moshid_model::streaming::SessionParams, ParamError> {
    let keys = prompt_keys(pairs, model.prompts.is_some())?;
    if let Some(setup) = &model.prompts {
        params.prompt = resolve(&keys, setup)?;
    }
    Ok(params)
}

/// Whether a client's voice name may be looked up in the folder.
fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\\', '\0'])
        && name != ".."
}

/// The voice file `name` inside `dir`, without leaving it.
pub fn voice_path(dir: &Path, name: &str) -> Result<PathBuf, ParamError> {
    if !safe_name(name) {
        return Err(err(
            "voice_prompt",
            "a voice name is a file name of the voice folder (no path)",
        ));
    }
    let p = dir.join(name);
    let inside = p.parent() == Some(dir);
    match std::fs::symlink_metadata(&p) {
        Ok(m) if inside && m.is_file() => Ok(p),
        _ => Err(err("voice_prompt", format!("no voice named `{name}`"))),
    }
}

/// The model's prompt for `keys`: reads and prepares the voice file and
/// tokenizes the role text. Errors name the key and never the folder.
pub fn resolve(keys: &PromptKeys, setup: &PromptSetup) -> Result<Prompt, ParamError> {
    let voice = match &keys.voice {
        None => VoiceInput::None,
        Some(name) => {
            let dir = setup
                .voice_dir
                .as_deref()
                .ok_or_else(|| err("voice_prompt", "no voice folder is configured"))?;
            let path = voice_path(dir, name)?;
            let bytes =
                read_bounded(&path).map_err(|e| err("voice_prompt", format!("`{name}`: {e}")))?;
            let bad = |e: &dyn std::fmt::Display| err("voice_prompt", format!("`{name}`: {e}"));
            if name.ends_with(".pt") {
                voice_from_pt(&bytes, &setup.lm).map_err(|e| bad(&e))?
            } else {
                let wav = moshid_model::persona::wav::read_wav(&bytes).map_err(|e| bad(&e))?;
                // The client's whole-buffer resampler (rubato FFT), not sphn's.
                let pcm = crate::codec::resample::whole_to_24k(&wav.samples, wav.rate)
                    .map_err(|e| bad(&e))?;
                voice_from_pcm_24k(&pcm, setup.frame_samples).map_err(|e| bad(&e))?
            }
        }
    };
    Ok(Prompt {
        voice,
        text_tokens: text_prompt_tokens(&setup.encoder, &keys.text),
        cache_key: Some(format!(
            "{}\u{0}{}",
            keys.voice.as_deref().unwrap_or(""),
            keys.text
        )),
    })
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|_| "cannot be read".to_string())?;
    let mut bytes = Vec::new();
    f.take(MAX_VOICE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|_| "cannot be read".to_string())?;
    if bytes.len() as u64 > MAX_VOICE_BYTES {
        return Err(format!("larger than {MAX_VOICE_BYTES} bytes"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden-next/personaplex-tiny")
    }

    fn setup(voice_dir: &Path) -> PromptSetup {
        let d = moshid_model::checkpoint::CheckpointDir::open(&fixture()).unwrap();
        PromptSetup {
            voice_dir: Some(voice_dir.to_path_buf()),
            encoder: Encoder::from_file(d.tokenizer.as_ref().unwrap()).unwrap(),
            lm: d.lm.clone(),
            frame_samples: 1920,
        }
    }

    fn keys(voice: &str, text: &str) -> PromptKeys {
        PromptKeys {
            voice: Some(voice.into()),
            text: text.into(),
        }
    }

    #[test]
    fn voices_resolve_and_bad_names_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let voices = t.path().join("voices");
        std::fs::create_dir(&voices).unwrap();
        for f in ["voice_a.wav", "voice_b.pt"] {
            std::fs::copy(fixture().join(f), voices.join(f)).unwrap();
        }
        std::fs::write(t.path().join("outside.pt"), b"x").unwrap();
        std::fs::write(voices.join("noise.wav"), b"RIFF this is not audio").unwrap();
        let mut pt = std::fs::read(voices.join("voice_b.pt")).unwrap();
        let n = pt.len();
        pt[n / 2..].fill(0);
        std::fs::write(voices.join("broken.pt"), &pt).unwrap();
        let s = setup(&voices);
        let p = resolve(&keys("voice_a.wav", "you are nice"), &s).unwrap();
        assert!(matches!(p.voice, VoiceInput::Pcm(_)));
        assert!(!p.text_tokens.is_empty());
        let p = resolve(&keys("voice_b.pt", ""), &s).unwrap();
        assert!(matches!(p.voice, VoiceInput::Replay(_)));
        assert!(p.text_tokens.is_empty());
        for bad in [
            "../outside.pt",
            "..",
            "/etc/passwd",
            "sub/x.pt",
            ".hidden",
            "missing.pt",
            "noise.wav",
            "broken.pt",
        ] {
            let e = resolve(&keys(bad, ""), &s).unwrap_err();
            assert_eq!(e.key, "voice_prompt", "{bad}");
            let msg = e.to_string();
            assert!(
                !msg.contains(voices.to_str().unwrap()),
                "{bad}: the folder leaked: {msg}"
            );
        }
    }

    #[test]
    fn prompt_keys_are_refused_by_models_without_prompts() {
        let q = vec![("text_prompt".to_string(), "hi".to_string())];
        assert_eq!(prompt_keys(&q, false).unwrap_err().key, "text_prompt");
        let q = vec![("voice_prompt".to_string(), "a.pt".to_string())];
        assert_eq!(prompt_keys(&q, false).unwrap_err().key, "voice_prompt");
        assert_eq!(
            prompt_keys(&q, true).unwrap().voice.as_deref(),
            Some("a.pt")
        );
        assert_eq!(prompt_keys(&[], false).unwrap(), PromptKeys::default());
    }
}
