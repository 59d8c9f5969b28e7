//! The client events of the Realtime API, parsed: one text message is one
//! JSON object whose `type` names the event (the GA names, as the official
//! SDKs send them).
//!
//! [`parse`] borrows the strings it keeps from the message where the JSON
//! has no escapes (a base64 `audio` never has), so an
//! `input_audio_buffer.append` is parsed without copying its audio; the
//! objects of the rare events (`session`, `response`, `item`) are kept as
//! JSON values for [`super::settings`] to read. [`decode_audio`] turns the
//! base64 into bytes in the session's buffer, sized once from
//! `realtime.max_event_bytes`.
//!
//! Invariants: pure and total — any input gives an event or an
//! [`ApiError`], never a panic (fuzzed: `fuzz/fuzz_targets/realtime_client_event.rs`);
//! unknown fields are ignored here (the settings name the ones they refuse);
//! an error says which event it was about (`event_id`) when the message got
//! that far.

use super::error::ApiError;
use base64::Engine;
use moshid_telephony::media_streams::{Text, BASE64};
use serde::Deserialize;
use serde_json::Value;

/// The event types moshid knows, on either endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `session.update` (both endpoints).
    SessionUpdate,
    /// `input_audio_buffer.append`.
    InputAudioAppend,
    /// `input_audio_buffer.commit`.
    InputAudioCommit,
    /// `input_audio_buffer.clear`.
    InputAudioClear,
    /// `response.create`.
    ResponseCreate,
    /// `response.cancel`.
    ResponseCancel,
    /// `conversation.item.create`.
    ItemCreate,
    /// `conversation.item.truncate`.
    ItemTruncate,
    /// `session.input_audio_buffer.append` (translations).
    TranslationAppend,
    /// `session.close` (translations).
    SessionClose,
    /// Any other type (the session answers an `error` naming it).
    Other,
}

impl Kind {
    /// The kind of a `type` string.
    pub fn of(name: &str) -> Kind {
        match name {
            "session.update" => Kind::SessionUpdate,
            "input_audio_buffer.append" => Kind::InputAudioAppend,
            "input_audio_buffer.commit" => Kind::InputAudioCommit,
            "input_audio_buffer.clear" => Kind::InputAudioClear,
            "response.create" => Kind::ResponseCreate,
            "response.cancel" => Kind::ResponseCancel,
            "conversation.item.create" => Kind::ItemCreate,
            "conversation.item.truncate" => Kind::ItemTruncate,
            "session.input_audio_buffer.append" => Kind::TranslationAppend,
            "session.close" => Kind::SessionClose,
            _ => Kind::Other,
        }
    }
}

/// One client event.
#[derive(Debug, Deserialize)]
pub struct ClientEvent<'a> {
    /// The `type` as sent.
    #[serde(borrow, rename = "type")]
    pub type_name: Text<'a>,
    /// The client's own id of the event, echoed in errors about it.
    #[serde(borrow, default)]
    pub event_id: Option<Text<'a>>,
    /// Base64 audio (`input_audio_buffer.append`,
    /// `session.input_audio_buffer.append`).
    #[serde(borrow, default)]
    pub audio: Option<Text<'a>>,
    /// `session.update`'s session object.
    #[serde(default)]
    pub session: Option<Value>,
    /// `response.create`'s response object.
    #[serde(default)]
    pub response: Option<Value>,
    /// `conversation.item.create`'s item.
    #[serde(default)]
    pub item: Option<Value>,
    /// `conversation.item.truncate`'s item.
    #[serde(borrow, default)]
    pub item_id: Option<Text<'a>>,
    /// `response.cancel`'s response (none: the one in progress).
    #[serde(borrow, default)]
    pub response_id: Option<Text<'a>>,
    /// `conversation.item.truncate`: the content part.
    #[serde(default)]
    pub content_index: Option<u64>,
    /// `conversation.item.truncate`: the audio the client played.
    #[serde(default)]
    pub audio_end_ms: Option<u64>,
}

impl ClientEvent<'_> {
    /// The event's kind.
    pub fn kind(&self) -> Kind {
        Kind::of(self.type_name.as_str())
    }

    /// The client's event id, owned (for an error about this event).
    pub fn id(&self) -> Option<String> {
        self.event_id.as_ref().map(|t| clip(t.as_str()).to_string())
    }
}

/// Parses one text message. A message that is not a JSON object with a
/// string `type`, or whose known fields have the wrong JSON type, is an
/// `invalid_event` error.
pub fn parse(text: &str) -> Result<ClientEvent<'_>, ApiError> {
    serde_json::from_str(text).map_err(|e| {
        ApiError::invalid("invalid_event", format!("not a Realtime client event: {e}"))
    })
}

/// Longest decoded audio of a message of `max_event_bytes` (the size of a
/// session's audio buffer).
pub fn max_audio_bytes(max_event_bytes: usize) -> usize {
    max_event_bytes / 4 * 3 + 3
}

/// Decodes base64 `audio` into `out`; the audio must be whole samples of
/// `bytes_per_sample`. Returns the bytes written.
pub fn decode_audio(
    audio: &str,
    out: &mut [u8],
    bytes_per_sample: usize,
) -> Result<usize, ApiError> {
    let n = BASE64.decode_slice(audio, out).map_err(|e| {
        ApiError::invalid(
            "invalid_audio",
            format!("`audio` is not base64 that fits this session's buffer: {e}"),
        )
        .param("audio")
    })?;
    if n % bytes_per_sample != 0 {
        return Err(ApiError::invalid(
            "invalid_audio",
            format!("`audio` holds {n} bytes: not whole {bytes_per_sample}-byte samples"),
        )
        .param("audio"));
    }
    Ok(n)
}

/// At most 64 bytes of client text (ids, names) in an error, cut on a
/// character boundary.
pub fn clip(s: &str) -> &str {
    let mut cut = s.len().min(64);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    #[test]
    fn appends_borrow_their_audio() {
        let e = parse(r#"{"type":"input_audio_buffer.append","event_id":"e1","audio":"AAABAA=="}"#)
            .unwrap();
        assert_eq!(e.kind(), Kind::InputAudioAppend);
        let audio = e.audio.as_ref().unwrap();
        assert!(matches!(audio.0, Cow::Borrowed(_)));
        let mut out = [0u8; 16];
        assert_eq!(decode_audio(audio.as_str(), &mut out, 2).unwrap(), 4);
        assert_eq!(&out[..4], &[0, 0, 1, 0]);
        assert_eq!(e.id().as_deref(), Some("e1"));
    }

    #[test]
    fn every_known_type_and_the_others() {
        for (name, kind) in [
            ("session.update", Kind::SessionUpdate),
            ("input_audio_buffer.commit", Kind::InputAudioCommit),
            ("input_audio_buffer.clear", Kind::InputAudioClear),
            ("response.create", Kind::ResponseCreate),
            ("response.cancel", Kind::ResponseCancel),
            ("conversation.item.create", Kind::ItemCreate),
            ("conversation.item.truncate", Kind::ItemTruncate),
            ("session.input_audio_buffer.append", Kind::TranslationAppend),
            ("session.close", Kind::SessionClose),
            ("conversation.item.retrieve", Kind::Other),
            ("", Kind::Other),
        ] {
            let text = serde_json::json!({ "type": name }).to_string();
            assert_eq!(parse(&text).unwrap().kind(), kind, "{name}");
        }
    }

    #[test]
    fn malformed_events_are_errors_not_panics() {
        for bad in [
            "",
            "not json",
            "[]",
            "{}",
            r#"{"type": 7}"#,
            r#"{"type": "input_audio_buffer.append", "audio": 5}"#,
            r#"{"type": "conversation.item.truncate", "audio_end_ms": -1}"#,
            r#"{"type": "x", "event_id": {}}"#,
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.code, "invalid_event", "{bad}");
        }
        let mut out = [0u8; 4];
        assert_eq!(
            decode_audio("!!!!", &mut out, 2).unwrap_err().code,
            "invalid_audio"
        );
        // Too long for the buffer.
        assert!(decode_audio("AAAAAAAAAAAA", &mut out, 1).is_err());
        // An odd byte of 16-bit audio.
        assert!(decode_audio("AA==", &mut out, 2).is_err());
        assert_eq!(max_audio_bytes(4), 6);
    }

    #[test]
    fn clip_cuts_on_characters() {
        let s = "é".repeat(40);
        assert_eq!(clip(&s).len(), 64);
        assert_eq!(clip("abc"), "abc");
    }
}
