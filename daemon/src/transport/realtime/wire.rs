//! A Realtime session's server events, written as WebSocket text frames
//! straight into the session's [`WsOut`] buffer (one `write_all` per batch
//! of answered frames, as for `/api/chat`).
//!
//! The per-frame events — an audio delta (base64 of the frame, encoded in
//! place) and a transcript delta (the text piece, JSON-escaped in place) —
//! are written without building a JSON value and without allocating. The
//! rare events (session, response and item lifecycle, errors) are built as
//! JSON values and serialized into a scratch buffer that keeps its
//! capacity, then copied in.
//!
//! Ids: `event_S_N` for the server's events, `resp_S_N` for responses,
//! `item_S_aN` for the model's items (one per response) and `item_S_uN`
//! for the caller's (one per commit), where `S` is the session's id.
//!
//! Invariants: every frame written is whole; a frame that does not fit is
//! refused before anything is written ([`Full`]); the buffer never grows.

use crate::transport::ws_out::{text_message_bytes, Full, PushError, WsOut};
use base64::Engine;
use moshid_telephony::media_streams::{base64_len, BASE64};
use serde_json::Value;
use std::io::Write;

/// Where a delta belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaOf {
    /// `response.output_audio*.delta` of response `n` (its item `item_S_aN`).
    Response(u64),
    /// `session.output_*.delta` of a translation, with `elapsed_ms`.
    Translation(u64),
}

/// Bytes of the JSON around a delta's payload, at most (type, ids, fields).
const DELTA_ENVELOPE_BYTES: usize = 320;

/// The outgoing side of one session.
pub struct Wire {
    out: WsOut,
    scratch: Vec<u8>,
    session: u64,
    events: u64,
    frame_wire_bytes: usize,
}

impl Wire {
    /// The wire of session `session`, whose frames are `frame_bytes` of
    /// audio and whose text pieces are at most `max_text_bytes`.
    pub fn new(session: u64, frame_bytes: usize, max_text_bytes: usize) -> Self {
        let frame_wire_bytes = text_message_bytes(DELTA_ENVELOPE_BYTES + base64_len(frame_bytes))
            + text_message_bytes(DELTA_ENVELOPE_BYTES + 6 * max_text_bytes + 2);
        Wire {
            out: WsOut::with_capacity(2 * frame_wire_bytes + 16 * 1024),
            scratch: Vec::with_capacity(4096),
            session,
            events: 0,
            frame_wire_bytes,
        }
    }

    /// Wire bytes one answered frame's deltas may take.
    pub fn frame_wire_bytes(&self) -> usize {
        self.frame_wire_bytes
    }

    /// Whether the buffer can take one more frame's deltas.
    pub fn has_room_for_a_frame(&self) -> bool {
        self.out.free_bytes() >= self.frame_wire_bytes
    }

    /// The frames written, for the socket.
    pub fn as_bytes(&self) -> &[u8] {
        self.out.as_bytes()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// Forgets the frames (once written).
    pub fn clear(&mut self) {
        self.out.clear();
    }

    /// The next server event id (for an event built as a JSON value).
    pub fn next_event_id(&mut self) -> String {
        self.events += 1;
        format!("event_{}_{}", self.session, self.events)
    }

    /// `resp_S_N`.
    pub fn response_id(&self, n: u64) -> String {
        format!("resp_{}_{n}", self.session)
    }

    /// `item_S_aN`: the model's item of response `n`.
    pub fn assistant_item_id(&self, n: u64) -> String {
        format!("item_{}_a{n}", self.session)
    }

    /// `item_S_uN`: the caller's item `n`.
    pub fn user_item_id(&self, n: u64) -> String {
        format!("item_{}_u{n}", self.session)
    }

    /// The response number of one of this session's model items.
    pub fn response_of_item(&self, item_id: &str) -> Option<u64> {
        let rest = item_id.strip_prefix("item_")?;
        let (session, n) = rest.split_once("_a")?;
        (session.parse::<u64>().ok()? == self.session)
            .then(|| n.parse().ok())
            .flatten()
    }

    /// Serializes `event` into the scratch buffer; returns its bytes.
    pub fn serialize(&mut self, event: &Value) -> &[u8] {
        self.scratch.clear();
        serde_json::to_writer(&mut self.scratch, event).expect("a JSON value serializes");
        &self.scratch
    }

    /// Appends the event last [`Wire::serialize`]d (`Full`: write the
    /// buffer out and try again; an event larger than the whole buffer
    /// goes through [`Wire::scratch_text`] instead).
    pub fn push_serialized(&mut self) -> Result<(), Full> {
        let body = std::str::from_utf8(&self.scratch).expect("serde_json writes UTF-8");
        self.out.push_text(body)
    }

    /// Whether the event last serialized can never fit the buffer.
    pub fn serialized_too_large(&self) -> bool {
        text_message_bytes(self.scratch.len()) > self.out.free_bytes() + self.out.as_bytes().len()
    }

    /// The event last serialized, as text.
    pub fn scratch_text(&self) -> &str {
        std::str::from_utf8(&self.scratch).expect("serde_json writes UTF-8")
    }

    /// Appends an audio delta carrying `audio` (encoded as base64 in place).
    pub fn push_audio_delta(&mut self, of: DeltaOf, audio: &[u8]) -> Result<(), Full> {
        self.events += 1;
        let (session, event) = (self.session, self.events);
        let max = DELTA_ENVELOPE_BYTES + base64_len(audio.len());
        let pushed = self.out.push_text_with(max, |body| {
            let mut w = &mut body[..];
            match of {
                DeltaOf::Response(n) => write!(
                    w,
                    r#"{{"type":"response.output_audio.delta","event_id":"event_{session}_{event}","response_id":"resp_{session}_{n}","item_id":"item_{session}_a{n}","output_index":0,"content_index":0,"delta":""#
                ),
                DeltaOf::Translation(elapsed_ms) => write!(
                    w,
                    r#"{{"type":"session.output_audio.delta","event_id":"event_{session}_{event}","elapsed_ms":{elapsed_ms},"format":"pcm16","sample_rate":24000,"channels":1,"delta":""#
                ),
            }?;
            let at = max - w.len();
            let n = BASE64
                .encode_slice(audio, &mut body[at..])
                .map_err(|_| std::io::ErrorKind::WriteZero)?;
            let mut w = &mut body[at + n..];
            w.write_all(br#""}"#)?;
            Ok::<usize, std::io::Error>(max - w.len())
        });
        unfull(pushed)
    }

    /// Appends a transcript delta carrying `text` (JSON-escaped in place).
    pub fn push_transcript_delta(&mut self, of: DeltaOf, text: &str) -> Result<(), Full> {
        self.events += 1;
        let (session, event) = (self.session, self.events);
        let max = DELTA_ENVELOPE_BYTES + 6 * text.len() + 2;
        let pushed = self.out.push_text_with(max, |body| {
            let mut w = &mut body[..];
            match of {
                DeltaOf::Response(n) => write!(
                    w,
                    r#"{{"type":"response.output_audio_transcript.delta","event_id":"event_{session}_{event}","response_id":"resp_{session}_{n}","item_id":"item_{session}_a{n}","output_index":0,"content_index":0,"delta":"#
                ),
                DeltaOf::Translation(elapsed_ms) => write!(
                    w,
                    r#"{{"type":"session.output_transcript.delta","event_id":"event_{session}_{event}","elapsed_ms":{elapsed_ms},"delta":"#
                ),
            }?;
            serde_json::to_writer(&mut w, text).map_err(std::io::Error::other)?;
            w.write_all(b"}")?;
            Ok::<usize, std::io::Error>(max - w.len())
        });
        unfull(pushed)
    }
}

/// A writer error cannot happen (the slice was sized for the worst case):
/// it is reported as `Full` rather than a panic.
fn unfull(r: Result<(), PushError<std::io::Error>>) -> Result<(), Full> {
    r.map_err(|_| Full)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tungstenite::protocol::frame::FrameHeader;

    fn messages(bytes: &[u8]) -> Vec<Value> {
        let mut cursor = std::io::Cursor::new(bytes);
        let mut out = Vec::new();
        while (cursor.position() as usize) < bytes.len() {
            let (_, len) = FrameHeader::parse(&mut cursor).unwrap().unwrap();
            let at = cursor.position() as usize;
            out.push(serde_json::from_slice(&bytes[at..at + len as usize]).unwrap());
            cursor.set_position((at + len as usize) as u64);
        }
        out
    }

    #[test]
    fn deltas_are_the_api_events() {
        let mut w = Wire::new(9, 3840, 32);
        let audio: Vec<u8> = (0..3840).map(|i| i as u8).collect();
        w.push_audio_delta(DeltaOf::Response(2), &audio).unwrap();
        w.push_transcript_delta(DeltaOf::Response(2), " \"quoted\"\n é")
            .unwrap();
        w.push_audio_delta(DeltaOf::Translation(160), &audio[..640])
            .unwrap();
        w.push_transcript_delta(DeltaOf::Translation(160), "hi")
            .unwrap();
        let m = messages(w.as_bytes());
        assert_eq!(m[0]["type"], "response.output_audio.delta");
        assert_eq!(m[0]["event_id"], "event_9_1");
        assert_eq!(m[0]["response_id"], "resp_9_2");
        assert_eq!(m[0]["item_id"], "item_9_a2");
        assert_eq!(m[0]["content_index"], 0);
        assert_eq!(
            BASE64.decode(m[0]["delta"].as_str().unwrap()).unwrap(),
            audio
        );
        assert_eq!(m[1]["delta"], " \"quoted\"\n é");
        assert_eq!(m[1]["type"], "response.output_audio_transcript.delta");
        assert_eq!(m[2]["type"], "session.output_audio.delta");
        assert_eq!(m[2]["elapsed_ms"], 160);
        assert_eq!(m[2]["sample_rate"], 24000);
        assert_eq!(m[3]["type"], "session.output_transcript.delta");
        assert_eq!(m[3]["event_id"], "event_9_4");
        assert_eq!(w.next_event_id(), "event_9_5");
    }

    #[test]
    fn lifecycle_events_and_ids() {
        let mut w = Wire::new(3, 640, 8);
        w.serialize(&serde_json::json!({"type": "response.created"}));
        assert!(!w.serialized_too_large());
        w.push_serialized().unwrap();
        assert_eq!(messages(w.as_bytes())[0]["type"], "response.created");
        assert_eq!(w.response_of_item(&w.assistant_item_id(12)), Some(12));
        assert_eq!(w.response_of_item("item_4_a12"), None);
        assert_eq!(w.response_of_item(&w.user_item_id(1)), None);
        assert_eq!(w.response_of_item("item_3_ax"), None);
        // A frame's deltas always fit twice in an empty buffer.
        w.clear();
        for _ in 0..2 {
            assert!(w.has_room_for_a_frame());
            w.push_audio_delta(DeltaOf::Response(1), &[0; 640]).unwrap();
            w.push_transcript_delta(DeltaOf::Response(1), &"\u{1}".repeat(8))
                .unwrap();
        }
        let big = "x".repeat(200_000);
        w.serialize(&serde_json::json!({ "t": big }));
        assert!(w.serialized_too_large());
    }
}
