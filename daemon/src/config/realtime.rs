//! `realtime.*`: the OpenAI Realtime endpoints (`/v1/realtime`,
//! `/v1/realtime/translations`) and their checks at start (errors name the
//! key). The per-session bounds they share with every WebSocket session
//! (`session.max_frames_in_flight`, `session.idle_timeout_ms`, …) stay in
//! `session.*`.

use serde::{Deserialize, Serialize};

/// How the model's continuous output is cut into responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseMode {
    /// A response opens when the model's text leaves padding (it starts to
    /// speak) and closes after `realtime.response_silence_ms` of padding;
    /// the model's audio between responses is not sent.
    Turns,
    /// Every frame of the model's audio is sent: a response opens at the
    /// first frame and closes only when it is cancelled (by the client, or
    /// by speech in the caller's audio); the next frame opens the next one.
    Continuous,
}

/// `realtime.*`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RealtimeConfig {
    /// Whether `/v1/realtime` and `/v1/realtime/translations` are served.
    pub enabled: bool,
    /// Largest client event accepted, in bytes (an `input_audio_buffer.append`
    /// carries its audio as base64: 256 KiB is 4 s of 24 kHz PCM16). The
    /// session's audio buffer is sized from it once, at its start.
    pub max_event_bytes: usize,
    /// How a session's responses are cut unless its URL says otherwise
    /// (`?responses=turns|continuous`).
    pub responses: ResponseMode,
    /// In `turns` mode, the padding (no text) after which a response
    /// closes, in milliseconds (rounded up to whole 80 ms frames).
    pub response_silence_ms: u64,
    /// A response's transcript kept for its `.done` events, in bytes
    /// (allocated at the session's start; the deltas carry all of it).
    pub max_transcript_bytes: usize,
    /// The language a translation model's output is in (BCP 47, as the
    /// Realtime translation API names it: `en`); a session asking for
    /// another is refused.
    pub translation_language: String,
}

impl Default for RealtimeConfig {
    fn default() -> Self {
        RealtimeConfig {
            enabled: true,
            max_event_bytes: 256 * 1024,
            responses: ResponseMode::Turns,
            response_silence_ms: 800,
            max_transcript_bytes: 4096,
            translation_language: "en".to_string(),
        }
    }
}

/// Checks the section: `Err((key, why))`.
pub fn validate(r: &RealtimeConfig) -> Result<(), (&'static str, String)> {
    if !(1024..=16 * 1024 * 1024).contains(&r.max_event_bytes) {
        return Err((
            "realtime.max_event_bytes",
            "must be between 1024 and 16777216".into(),
        ));
    }
    if !(80..=60_000).contains(&r.response_silence_ms) {
        return Err((
            "realtime.response_silence_ms",
            "must be between 80 and 60000".into(),
        ));
    }
    if !(64..=1024 * 1024).contains(&r.max_transcript_bytes) {
        return Err((
            "realtime.max_transcript_bytes",
            "must be between 64 and 1048576".into(),
        ));
    }
    if !is_language_tag(&r.translation_language) {
        return Err((
            "realtime.translation_language",
            format!(
                "`{}` is not a language tag (letters, digits and '-', starting with a 2 or 3 letter language)",
                r.translation_language.escape_debug()
            ),
        ));
    }
    Ok(())
}

/// A BCP 47 tag as far as this daemon needs one: a 2-3 letter primary
/// language, then `-`-separated subtags of 1-8 letters or digits.
pub fn is_language_tag(tag: &str) -> bool {
    let mut parts = tag.split('-');
    let primary = parts.next().unwrap_or("");
    (2..=3).contains(&primary.len())
        && primary.bytes().all(|b| b.is_ascii_alphabetic())
        && parts.all(|p| (1..=8).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bounds_name_their_key() {
        assert!(validate(&RealtimeConfig::default()).is_ok());
        let mut r = RealtimeConfig {
            max_event_bytes: 10,
            ..RealtimeConfig::default()
        };
        assert_eq!(validate(&r).unwrap_err().0, "realtime.max_event_bytes");
        r.max_event_bytes = 4096;
        r.response_silence_ms = 0;
        assert_eq!(validate(&r).unwrap_err().0, "realtime.response_silence_ms");
        r.response_silence_ms = 800;
        r.translation_language = "english please".into();
        assert_eq!(validate(&r).unwrap_err().0, "realtime.translation_language");
    }

    #[test]
    fn language_tags() {
        for ok in ["en", "fr", "en-US", "zh-Hans-CN", "yue"] {
            assert!(is_language_tag(ok), "{ok}");
        }
        for bad in ["", "e", "english", "en_US", "en-", "fr-toolongsubtag"] {
            assert!(!is_language_tag(bad), "{bad}");
        }
    }
}
