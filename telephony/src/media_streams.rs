//! The JSON events of Media Streams (Twilio's shape), in and out.
//!
//! In: `connected`, `start`, `media`, `mark`, `clear`, `dtmf`, `stop`. Each
//! text message is one event; [`parse`] borrows its strings from the
//! message where the JSON has no escapes (the base64 payload never has), so
//! a `media` event is parsed without allocating. Unknown fields are
//! ignored; an unknown event name is the caller's error.
//!
//! Out: `media` (one 20 ms packet, base64), `mark` (an echo) and `error`
//! (before a close), written by [`write_media`] / [`write_mark`] into the
//! session's reusable buffer.
//!
//! Invariants: parsing is pure and total (bad JSON is an `Err`, never a
//! panic); a stream id accepted by [`check_stream_sid`] needs no JSON
//! escaping, and mark names are escaped once when they arrive, so the
//! writers only copy.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use serde::de::{Deserializer, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt::Write;

/// Standard base64; decoding accepts payloads with or without padding.
pub const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Longest stream id accepted.
pub const MAX_STREAM_SID_BYTES: usize = 128;

/// A JSON string, borrowed from the message when it has no escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Cow<'de, str>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Cow::Borrowed(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v))
            }
        }
        d.deserialize_str(V).map(Text)
    }
}

impl Text<'_> {
    /// The string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One incoming event (fields of other events ignored).
#[derive(Debug, Deserialize)]
pub struct InEvent<'a> {
    /// The event name.
    #[serde(borrow)]
    pub event: Text<'a>,
    /// `streamSid` at the top level (Twilio sends it on every event but `connected`).
    #[serde(borrow, default, rename = "streamSid")]
    pub stream_sid: Option<Text<'a>>,
    /// `start` details.
    #[serde(default)]
    pub start: Option<InStart>,
    /// `media` details.
    #[serde(borrow, default)]
    pub media: Option<InMedia<'a>>,
    /// `mark` details.
    #[serde(borrow, default)]
    pub mark: Option<InMark<'a>>,
    /// `dtmf` details.
    #[serde(borrow, default)]
    pub dtmf: Option<InDtmf<'a>>,
}

/// `start.*`.
#[derive(Debug, Deserialize)]
pub struct InStart {
    /// The stream id (Twilio also repeats it at the top level).
    #[serde(default, rename = "streamSid")]
    pub stream_sid: Option<String>,
    /// The call's audio format.
    #[serde(default, rename = "mediaFormat")]
    pub media_format: Option<MediaFormat>,
    /// `<Parameter>`s of the TwiML `<Stream>`: session parameters.
    #[serde(default, rename = "customParameters")]
    pub custom_parameters: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `start.mediaFormat`.
#[derive(Debug, Deserialize)]
pub struct MediaFormat {
    /// `audio/x-mulaw` (or `audio/x-alaw`).
    pub encoding: String,
    /// 8000.
    #[serde(rename = "sampleRate")]
    pub sample_rate: u32,
    /// 1.
    pub channels: u32,
}

/// `media.*`.
#[derive(Debug, Deserialize)]
pub struct InMedia<'a> {
    /// `inbound` (others are ignored).
    #[serde(borrow, default)]
    pub track: Option<Text<'a>>,
    /// Base64 G.711 bytes.
    #[serde(borrow)]
    pub payload: Text<'a>,
}

/// `mark.*`.
#[derive(Debug, Deserialize)]
pub struct InMark<'a> {
    /// The label echoed back.
    #[serde(borrow)]
    pub name: Text<'a>,
}

/// `dtmf.*`.
#[derive(Debug, Deserialize)]
pub struct InDtmf<'a> {
    /// The digit.
    #[serde(borrow)]
    pub digit: Text<'a>,
}

/// Parses one text message.
pub fn parse(text: &str) -> Result<InEvent<'_>, serde_json::Error> {
    serde_json::from_str(text)
}

/// Checks a stream id: 1 to [`MAX_STREAM_SID_BYTES`] of ASCII letters,
/// digits, `-`, `_`, `.`, `:` (Twilio's `MZ…` ids, UUIDs).
pub fn check_stream_sid(sid: &str) -> Result<(), &'static str> {
    if sid.is_empty() || sid.len() > MAX_STREAM_SID_BYTES {
        return Err("streamSid must be 1 to 128 characters");
    }
    if !sid
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
    {
        return Err("streamSid may contain only ASCII letters, digits, '-', '_', '.' and ':'");
    }
    Ok(())
}

/// Session parameters from `customParameters` (strings, numbers and
/// booleans; anything else is refused, naming the key).
pub fn custom_parameters(
    map: &serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        let v = match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            _ => {
                return Err(format!(
                    "customParameters.{k} must be a string, a number or a boolean"
                ))
            }
        };
        out.push((k.clone(), v));
    }
    Ok(out)
}

/// Longest base64 text of `n` bytes.
pub fn base64_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

/// Appends a `media` event carrying `packet` to `out`.
pub fn write_media(
    out: &mut bytes::BytesMut,
    seq: u64,
    sid: &str,
    chunk: u64,
    timestamp_ms: u64,
    packet: &[u8],
) {
    let _ = write!(
        out,
        r#"{{"event":"media","sequenceNumber":"{seq}","streamSid":"{sid}","media":{{"track":"outbound","chunk":"{chunk}","timestamp":"{timestamp_ms}","payload":""#
    );
    let at = out.len();
    out.resize(at + base64_len(packet.len()), 0);
    let n = BASE64
        .encode_slice(packet, &mut out[at..])
        .expect("sized by base64_len");
    out.truncate(at + n);
    out.extend_from_slice(br#""}}"#);
}

/// Appends a `mark` echo to `out`; `name_json` is the name as a JSON string
/// (quotes included).
pub fn write_mark(out: &mut bytes::BytesMut, seq: u64, sid: &str, name_json: &str) {
    let _ = write!(
        out,
        r#"{{"event":"mark","sequenceNumber":"{seq}","streamSid":"{sid}","mark":{{"name":{name_json}}}}}"#
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twilio_events_parse() {
        let start = r#"{"event":"start","sequenceNumber":"1","start":{"accountSid":"AC1","streamSid":"MZ18ad3ab5a668481ce02b83e7395059f0","callSid":"CA1","tracks":["inbound"],"mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":8000,"channels":1},"customParameters":{"seed":"42","FirstName":"Jane"}},"streamSid":"MZ18ad3ab5a668481ce02b83e7395059f0"}"#;
        let e = parse(start).unwrap();
        assert_eq!(e.event.as_str(), "start");
        let s = e.start.unwrap();
        let f = s.media_format.unwrap();
        assert_eq!(
            (f.encoding.as_str(), f.sample_rate, f.channels),
            ("audio/x-mulaw", 8000, 1)
        );
        let params = custom_parameters(&s.custom_parameters.unwrap()).unwrap();
        assert!(params.contains(&("seed".to_string(), "42".to_string())));

        let media = r#"{"event":"media","sequenceNumber":"3","media":{"track":"inbound","chunk":"1","timestamp":"5","payload":"/////w=="},"streamSid":"MZ1"}"#;
        let e = parse(media).unwrap();
        let m = e.media.unwrap();
        assert!(
            matches!(m.payload.0, Cow::Borrowed(_)),
            "the payload is borrowed"
        );
        assert_eq!(BASE64.decode(m.payload.as_str()).unwrap(), [0xff; 4]);
        assert_eq!(m.track.unwrap().as_str(), "inbound");
        // Unpadded base64 is accepted too.
        assert_eq!(BASE64.decode("/////w").unwrap(), [0xff; 4]);

        let e = parse(r#"{"event":"mark","streamSid":"MZ1","mark":{"name":"a \"quoted\" label"}}"#)
            .unwrap();
        assert_eq!(e.mark.unwrap().name.as_str(), "a \"quoted\" label");
        let e = parse(
            r#"{"event":"dtmf","streamSid":"MZ1","dtmf":{"track":"inbound_track","digit":"5"}}"#,
        )
        .unwrap();
        assert_eq!(e.dtmf.unwrap().digit.as_str(), "5");
        assert!(parse("{not json").is_err());
        assert!(parse(r#"{"no_event":1}"#).is_err());
        assert!(parse(r#"{"event":"media","media":{"payload":7}}"#).is_err());
    }

    #[test]
    fn stream_ids_and_parameters() {
        assert!(check_stream_sid("MZ18ad3ab5a668481ce02b83e7395059f0").is_ok());
        assert!(check_stream_sid("3f2a-11:x.y_z").is_ok());
        assert!(check_stream_sid("").is_err());
        assert!(check_stream_sid("a\"b").is_err());
        assert!(check_stream_sid(&"x".repeat(129)).is_err());
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(r#"{"seed": 3, "greedy": true, "x": {"y": 1}}"#).unwrap();
        assert!(custom_parameters(&map)
            .unwrap_err()
            .contains("customParameters.x"));
    }

    #[test]
    fn outgoing_events_are_json() {
        let mut out = bytes::BytesMut::with_capacity(512);
        write_media(&mut out, 7, "MZ1", 3, 40, &[0xff; 160]);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["event"], "media");
        assert_eq!(v["sequenceNumber"], "7");
        assert_eq!(v["streamSid"], "MZ1");
        assert_eq!(v["media"]["chunk"], "3");
        assert_eq!(v["media"]["timestamp"], "40");
        let payload = BASE64
            .decode(v["media"]["payload"].as_str().unwrap())
            .unwrap();
        assert_eq!(payload, [0xff; 160]);
        out.clear();
        let name = serde_json::to_string("a \"quoted\" label").unwrap();
        write_mark(&mut out, 8, "MZ1", &name);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["mark"]["name"], "a \"quoted\" label");
        assert_eq!(v["event"], "mark");
    }
}
