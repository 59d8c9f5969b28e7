//! A Realtime session's effective configuration: what `session.created`
//! reports, what `session.update` may change, and the fields it refuses.
//!
//! An update is read whole before any of it applies: the first field
//! moshid cannot honour is refused with an `error` naming it
//! (`param: "session.audio.output.voice"`) and nothing of that update
//! changes; the session goes on. Fields and what moshid does with them:
//!
//! * `audio.input.format`, `audio.output.format`: `audio/pcm` (24 kHz, the
//!   model's own rate), `audio/pcmu`, `audio/pcma` (8 kHz G.711).
//! * `audio.input.turn_detection`: `server_vad` (threshold, padding and
//!   silence honoured; `interrupt_response` cancels the response in
//!   progress when the caller starts to speak), or `null`/`false` (no
//!   speech events). `semantic_vad`, `create_response: false` and
//!   `idle_timeout_ms` are refused: the model decides when it speaks.
//! * `instructions` (non-empty), `audio.output.voice`, `tools` (non-empty),
//!   `audio.input.transcription`, `audio.input.noise_reduction`,
//!   `output_modalities` other than `["audio"]`, a numeric
//!   `max_output_tokens`, `tracing`, `prompt`, `include`, `reasoning` and a
//!   `truncation` other than `auto` are refused: the model has no role or
//!   voice prompt, tools, transcriber or text-only mode to give them to.
//! * `model`, `type` (`realtime`), and the read-only `id`, `object`,
//!   `expires_at` are accepted and change nothing (`session.updated`
//!   reports the served model).
//!
//! A translation session takes `audio.output.language` (the language the
//! model produces, or a refusal naming the one it can),
//! `audio.input.transcription` and `audio.input.noise_reduction` (refused
//! unless `null`: the model gives no source-language text).
//!
//! Invariants: pure (no I/O); [`apply_update`] returns a new value or an
//! error and never a half-applied one.

use super::error::ApiError;
use moshid_telephony::g711::Law;
use serde_json::{json, Map, Value};

/// An audio format of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AudioFormat {
    /// `audio/pcm`: 16-bit little-endian at 24 kHz.
    Pcm,
    /// `audio/pcmu` or `audio/pcma`: G.711 at 8 kHz.
    G711(Law),
}

impl AudioFormat {
    /// The format's JSON.
    pub fn to_json(self) -> Value {
        match self {
            AudioFormat::Pcm => json!({"type": "audio/pcm", "rate": 24000}),
            AudioFormat::G711(Law::Mu) => json!({"type": "audio/pcmu"}),
            AudioFormat::G711(Law::A) => json!({"type": "audio/pcma"}),
        }
    }

    /// The rate of the wire audio.
    pub fn rate_hz(self) -> u32 {
        match self {
            AudioFormat::Pcm => 24_000,
            AudioFormat::G711(_) => 8_000,
        }
    }
}

/// `server_vad` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnDetection {
    /// Activation threshold, 0 to 1.
    pub threshold: f32,
    /// Audio before the detected start included in `audio_start_ms`.
    pub prefix_padding_ms: u32,
    /// Silence that ends speech.
    pub silence_duration_ms: u32,
    /// Whether speech cancels the response in progress.
    pub interrupt_response: bool,
}

impl Default for TurnDetection {
    fn default() -> Self {
        TurnDetection {
            threshold: 0.5,
            prefix_padding_ms: 300,
            silence_duration_ms: 500,
            interrupt_response: true,
        }
    }
}

/// The effective configuration of one session.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Input audio.
    pub input: AudioFormat,
    /// Output audio.
    pub output: AudioFormat,
    /// Speech detection on the input, if on.
    pub turn_detection: Option<TurnDetection>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            input: AudioFormat::Pcm,
            output: AudioFormat::Pcm,
            turn_detection: Some(TurnDetection::default()),
        }
    }
}

/// What the session object of `session.created`/`.updated` says beyond
/// [`Settings`].
pub struct Described<'a> {
    /// `sess_…`.
    pub id: &'a str,
    /// The served model's name.
    pub model: &'a str,
    /// Unix seconds at which the session's length runs out (0: never).
    pub expires_at: u64,
}

/// `session` of `session.created`/`.updated` for a conversation.
pub fn realtime_session_json(s: &Settings, d: &Described) -> Value {
    let turn_detection = match s.turn_detection {
        None => Value::Null,
        Some(t) => json!({
            "type": "server_vad",
            "threshold": t.threshold,
            "prefix_padding_ms": t.prefix_padding_ms,
            "silence_duration_ms": t.silence_duration_ms,
            "create_response": true,
            "interrupt_response": t.interrupt_response,
            "idle_timeout_ms": null,
        }),
    };
    json!({
        "type": "realtime",
        "object": "realtime.session",
        "id": d.id,
        "model": d.model,
        "output_modalities": ["audio"],
        "instructions": "",
        "audio": {
            "input": {
                "format": s.input.to_json(),
                "transcription": null,
                "noise_reduction": null,
                "turn_detection": turn_detection,
            },
            "output": {"format": s.output.to_json(), "voice": null, "speed": 1.0},
        },
        "tools": [],
        "tool_choice": "auto",
        "max_output_tokens": "inf",
        "tracing": null,
        "truncation": "auto",
        "prompt": null,
        "include": null,
        "expires_at": d.expires_at,
    })
}

/// `session` of `session.created`/`.updated` for a translation.
pub fn translation_session_json(language: &str, d: &Described) -> Value {
    json!({
        "type": "translation",
        "id": d.id,
        "model": d.model,
        "expires_at": d.expires_at,
        "audio": {
            "input": {"transcription": null, "noise_reduction": null},
            "output": {"language": language},
        },
    })
}

/// Which endpoint an update is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/realtime`.
    Conversation,
    /// `/v1/realtime/translations`, with the language the model produces.
    Translation,
}

/// Applies a `session.update`'s session object to `current` (see the
/// module doc); `language` is what a translation model produces.
pub fn apply_update(
    current: &Settings,
    session: &Value,
    endpoint: Endpoint,
    language: &str,
) -> Result<Settings, ApiError> {
    let obj = object(session, "session")?;
    let mut next = current.clone();
    for (key, value) in obj {
        let param = format!("session.{key}");
        match (endpoint, key.as_str()) {
            (_, "model" | "id" | "object" | "expires_at") => {}
            (Endpoint::Conversation, "type") => expect_str(value, &param, &["realtime"])?,
            (Endpoint::Translation, "type") => expect_str(value, &param, &["translation"])?,
            (_, "audio") => audio(&mut next, value, endpoint, language)?,
            (Endpoint::Conversation, _) => conversation_field(key, value, &param)?,
            (Endpoint::Translation, _) => return Err(unknown(&param)),
        }
    }
    Ok(next)
}

/// The conversation's fields other than `audio` and the accepted ones.
fn conversation_field(key: &str, value: &Value, param: &str) -> Result<(), ApiError> {
    match key {
        "instructions" => match value {
            Value::Null => Ok(()),
            Value::String(s) if s.is_empty() => Ok(()),
            Value::String(_) => Err(ApiError::field(
                param,
                "this model takes no instructions: it has no role prompt (send an empty string or leave it out)",
            )),
            _ => Err(wrong_type(param, "a string")),
        },
        "output_modalities" => match value {
            Value::Null => Ok(()),
            Value::Array(a) if a.len() == 1 && a[0] == "audio" => Ok(()),
            _ => Err(ApiError::field(
                param,
                "this model answers in audio with its transcript: [\"audio\"] only",
            )),
        },
        "tools" => match value {
            Value::Null => Ok(()),
            Value::Array(a) if a.is_empty() => Ok(()),
            _ => Err(ApiError::field(param, "this model calls no tools")),
        },
        "tool_choice" => match value {
            Value::Null => Ok(()),
            _ => expect_str(value, param, &["auto", "none"]),
        },
        "max_output_tokens" => match value {
            Value::Null => Ok(()),
            _ => expect_str(value, param, &["inf"]),
        },
        "truncation" => match value {
            Value::Null => Ok(()),
            _ => expect_str(value, param, &["auto"]),
        },
        "tracing" | "prompt" | "include" | "reasoning" => match value {
            Value::Null => Ok(()),
            _ => Err(ApiError::field(param, "not available with this model")),
        },
        _ => Err(unknown(param)),
    }
}

fn audio(
    next: &mut Settings,
    value: &Value,
    endpoint: Endpoint,
    language: &str,
) -> Result<(), ApiError> {
    for (key, v) in object(value, "session.audio")? {
        match key.as_str() {
            "input" => audio_input(next, v, endpoint)?,
            "output" => audio_output(next, v, endpoint, language)?,
            other => return Err(unknown(&format!("session.audio.{other}"))),
        }
    }
    Ok(())
}

fn audio_input(next: &mut Settings, value: &Value, endpoint: Endpoint) -> Result<(), ApiError> {
    for (key, v) in object(value, "session.audio.input")? {
        let param = format!("session.audio.input.{key}");
        match key.as_str() {
            "format" => {
                let f = format(v, &param)?;
                if endpoint == Endpoint::Translation && f != AudioFormat::Pcm {
                    return Err(ApiError::field(
                        param,
                        "translation sessions take audio/pcm",
                    ));
                }
                next.input = f;
            }
            "transcription" if v.is_null() => {}
            "transcription" => {
                return Err(ApiError::field(
                    param,
                    "this model gives no transcript of the input audio (set it to null)",
                ))
            }
            "noise_reduction" if v.is_null() => {}
            "noise_reduction" => {
                return Err(ApiError::field(
                    param,
                    "moshid applies no noise reduction (set it to null)",
                ))
            }
            "turn_detection" if endpoint == Endpoint::Conversation => {
                next.turn_detection = turn_detection(next.turn_detection, v, &param)?;
            }
            _ => return Err(unknown(&param)),
        }
    }
    Ok(())
}

fn audio_output(
    next: &mut Settings,
    value: &Value,
    endpoint: Endpoint,
    language: &str,
) -> Result<(), ApiError> {
    for (key, v) in object(value, "session.audio.output")? {
        let param = format!("session.audio.output.{key}");
        match (endpoint, key.as_str()) {
            (Endpoint::Conversation, "format") => next.output = format(v, &param)?,
            (Endpoint::Conversation, "voice") if v.is_null() => {}
            (Endpoint::Conversation, "voice") => {
                return Err(ApiError::field(
                    param,
                    "this model speaks in its own voice: it has no voice prompt to choose one",
                ))
            }
            (Endpoint::Conversation, "speed") => match v.as_f64() {
                None if v.is_null() => {}
                Some(1.0) => {}
                _ => {
                    return Err(ApiError::field(
                        param,
                        "the model speaks at its own speed: 1.0",
                    ))
                }
            },
            (Endpoint::Translation, "language") => match v.as_str() {
                Some(l) if same_language(l, language) => {}
                Some(l) => {
                    return Err(ApiError::invalid(
                        "unsupported_language",
                        format!(
                            "this model translates into `{language}` only, not `{}`",
                            super::client_event::clip(l)
                        ),
                    )
                    .param(param))
                }
                None => return Err(wrong_type(&param, "a language tag")),
            },
            _ => return Err(unknown(&param)),
        }
    }
    Ok(())
}

fn turn_detection(
    current: Option<TurnDetection>,
    v: &Value,
    param: &str,
) -> Result<Option<TurnDetection>, ApiError> {
    let obj = match v {
        Value::Null | Value::Bool(false) => return Ok(None),
        Value::Object(o) => o,
        _ => return Err(wrong_type(param, "an object, null or false")),
    };
    let mut t = current.unwrap_or_default();
    for (key, v) in obj {
        let p = format!("{param}.{key}");
        match key.as_str() {
            "type" => expect_str(v, &p, &["server_vad"])?,
            "threshold" => match v.as_f64() {
                Some(x) if (0.0..=1.0).contains(&x) => t.threshold = x as f32,
                _ => return Err(wrong_type(&p, "a number from 0 to 1")),
            },
            "prefix_padding_ms" => t.prefix_padding_ms = millis(v, &p)?,
            "silence_duration_ms" => t.silence_duration_ms = millis(v, &p)?,
            "interrupt_response" => match v {
                Value::Null => {}
                Value::Bool(b) => t.interrupt_response = *b,
                _ => return Err(wrong_type(&p, "a boolean")),
            },
            "create_response" => match v {
                Value::Null | Value::Bool(true) => {}
                _ => {
                    return Err(ApiError::field(
                        p,
                        "the model decides when it speaks: responses cannot be held back",
                    ))
                }
            },
            "idle_timeout_ms" if v.is_null() => {}
            "idle_timeout_ms" => {
                return Err(ApiError::field(
                    p,
                    "the model decides when it speaks: no idle prompt",
                ))
            }
            _ => return Err(unknown(&p)),
        }
    }
    Ok(Some(t))
}

fn millis(v: &Value, param: &str) -> Result<u32, ApiError> {
    match v.as_u64() {
        Some(ms) if ms <= 60_000 => Ok(ms as u32),
        _ => Err(wrong_type(param, "milliseconds from 0 to 60000")),
    }
}

fn format(v: &Value, param: &str) -> Result<AudioFormat, ApiError> {
    let obj = object(v, param)?;
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("");
    let f = match kind {
        "audio/pcm" => AudioFormat::Pcm,
        "audio/pcmu" => AudioFormat::G711(Law::Mu),
        "audio/pcma" => AudioFormat::G711(Law::A),
        _ => {
            return Err(ApiError::field(
                format!("{param}.type"),
                "audio/pcm (24 kHz), audio/pcmu or audio/pcma",
            ))
        }
    };
    match obj.get("rate") {
        None | Some(Value::Null) => {}
        Some(r) if r.as_u64() == Some(f.rate_hz() as u64) => {}
        Some(_) => {
            return Err(ApiError::field(
                format!("{param}.rate"),
                format!("{kind} is {} Hz", f.rate_hz()),
            ))
        }
    }
    Ok(f)
}

/// Whether two language tags name the same language (their primary
/// subtags, case aside: `en-US` is `en`).
pub fn same_language(a: &str, b: &str) -> bool {
    let primary = |t: &str| {
        t.split(['-', '_'])
            .next()
            .unwrap_or("")
            .to_ascii_lowercase()
    };
    !a.is_empty() && primary(a) == primary(b)
}

fn object<'v>(v: &'v Value, param: &str) -> Result<&'v Map<String, Value>, ApiError> {
    v.as_object().ok_or_else(|| wrong_type(param, "an object"))
}

fn expect_str(v: &Value, param: &str, allowed: &[&str]) -> Result<(), ApiError> {
    match v.as_str() {
        Some(s) if allowed.contains(&s) => Ok(()),
        _ => Err(ApiError::field(
            param,
            format!("must be {}", allowed.join(" or ")),
        )),
    }
}

fn wrong_type(param: &str, what: &str) -> ApiError {
    ApiError::invalid("invalid_value", format!("`{param}` must be {what}")).param(param)
}

fn unknown(param: &str) -> ApiError {
    ApiError::field(param, format!("`{param}` is not a field moshid knows"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(s: &Settings, v: Value) -> Result<Settings, ApiError> {
        apply_update(s, &v, Endpoint::Conversation, "en")
    }

    #[test]
    fn formats_and_turn_detection_apply() {
        let s = Settings::default();
        let n = update(
            &s,
            json!({"type": "realtime", "model": "x", "audio": {
                "input": {"format": {"type": "audio/pcmu"}, "turn_detection": {"type": "server_vad", "threshold": 0.7, "silence_duration_ms": 200}},
                "output": {"format": {"type": "audio/pcma"}, "voice": null}
            }}),
        )
        .unwrap();
        assert_eq!(n.input, AudioFormat::G711(Law::Mu));
        assert_eq!(n.output, AudioFormat::G711(Law::A));
        let t = n.turn_detection.unwrap();
        assert_eq!(
            (t.threshold, t.silence_duration_ms, t.prefix_padding_ms),
            (0.7, 200, 300)
        );
        let off = update(&n, json!({"audio": {"input": {"turn_detection": false}}})).unwrap();
        assert!(off.turn_detection.is_none());
        let off = update(&n, json!({"audio": {"input": {"turn_detection": null}}})).unwrap();
        assert!(off.turn_detection.is_none());
        // Pipecat's and the SDK's usual update is accepted whole.
        assert!(update(&s, json!({"type": "realtime", "tools": [], "instructions": "", "output_modalities": ["audio"]})).is_ok());
    }

    #[test]
    fn refusals_name_the_field_and_change_nothing() {
        let s = Settings::default();
        for (v, param) in [
            (json!({"instructions": "be nice"}), "session.instructions"),
            (
                json!({"audio": {"output": {"voice": "alloy"}}}),
                "session.audio.output.voice",
            ),
            (json!({"tools": [{"type": "function"}]}), "session.tools"),
            (
                json!({"output_modalities": ["text"]}),
                "session.output_modalities",
            ),
            (
                json!({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}),
                "session.audio.input.format.rate",
            ),
            (
                json!({"audio": {"input": {"format": {"type": "audio/opus"}}}}),
                "session.audio.input.format.type",
            ),
            (
                json!({"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}),
                "session.audio.input.turn_detection.type",
            ),
            (
                json!({"audio": {"input": {"turn_detection": {"create_response": false}}}}),
                "session.audio.input.turn_detection.create_response",
            ),
            (
                json!({"audio": {"input": {"transcription": {"model": "whisper-1"}}}}),
                "session.audio.input.transcription",
            ),
            (json!({"temperature": 0.8}), "session.temperature"),
            (json!({"type": "transcription"}), "session.type"),
        ] {
            let e = update(&s, v.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{v}: {e:?}");
        }
        // A bad field after a good one: nothing applies.
        let e = update(
            &s,
            json!({"audio": {"input": {"format": {"type": "audio/pcmu"}}}, "instructions": "x"}),
        );
        assert!(e.is_err());
        assert!(update(&s, json!("not an object")).is_err());
    }

    #[test]
    fn translation_updates() {
        let s = Settings::default();
        let t = |v: Value| apply_update(&s, &v, Endpoint::Translation, "en");
        assert!(t(json!({"audio": {"output": {"language": "en-US"}}})).is_ok());
        assert!(t(json!({"type": "translation", "audio": {"input": {"transcription": null, "noise_reduction": null}}})).is_ok());
        let e = t(json!({"audio": {"output": {"language": "de"}}})).unwrap_err();
        assert_eq!(e.code, "unsupported_language");
        assert!(e.message.contains("`en`"), "{}", e.message);
        assert_eq!(
            t(json!({"audio": {"input": {"transcription": {"model": "x"}}}}))
                .unwrap_err()
                .param
                .as_deref(),
            Some("session.audio.input.transcription")
        );
        assert!(t(json!({"audio": {"input": {"turn_detection": null}}})).is_err());
        assert!(t(json!({"instructions": ""})).is_err());
    }

    #[test]
    fn session_objects_have_the_api_fields() {
        let d = Described {
            id: "sess_1",
            model: "m",
            expires_at: 7,
        };
        let v = realtime_session_json(&Settings::default(), &d);
        assert_eq!(v["type"], "realtime");
        assert_eq!(v["audio"]["input"]["format"]["rate"], 24000);
        assert_eq!(v["audio"]["input"]["turn_detection"]["type"], "server_vad");
        let t = translation_session_json("en", &d);
        assert_eq!(t["audio"]["output"]["language"], "en");
        assert!(same_language("EN-gb", "en") && !same_language("", "en"));
    }
}
