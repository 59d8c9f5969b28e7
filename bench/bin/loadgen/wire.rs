//! What a caller speaks: Kyutai's `/api/chat` protocol (binary messages,
//! Ogg Opus) or the OpenAI Realtime API (`/v1/realtime`: JSON events,
//! base64 PCM16 at 24 kHz), behind one interface so that [`crate::stream`]
//! runs the same schedule, timing and matching for both, and a run can
//! compare what the daemon spends serving each.
//!
//! Realtime callers ask for `responses=continuous`, so that every frame the
//! model answers comes back (as `/api/chat` sends every frame) and the
//! answers match the frames one for one.

use std::time::Instant;

use anyhow::{anyhow, Result};
use base64::Engine;
use moshid::client::{decode_audio, is_closed, would_block};
use moshid::codec::{DecoderConfig, OggOpusDecoder};
use moshid::protocol::kind;
use moshid::FRAME_SAMPLES;
use moshid_testkit::chat::{ChatSocket, NotStarted};
use serde_json::Value;
use tungstenite::{Bytes, Message};

use crate::audio::{EncodedAudio, StreamWriter};
use crate::stream::Outcome;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The protocols a caller can speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// `/api/chat`: Kyutai's binary protocol, Ogg Opus.
    Chat,
    /// `/v1/realtime`: the OpenAI Realtime API, base64 PCM16 in JSON.
    Realtime,
}

impl Protocol {
    /// The endpoint of this protocol on the daemon at `addr`.
    pub fn url(self, addr: std::net::SocketAddr) -> String {
        match self {
            Protocol::Chat => format!("ws://{addr}/api/chat"),
            Protocol::Realtime => format!("ws://{addr}/v1/realtime?responses=continuous"),
        }
    }

    /// A caller's side of this protocol.
    pub fn caller(self, audio: &EncodedAudio) -> Result<Box<dyn Caller>> {
        Ok(match self {
            Protocol::Chat => Box::new(ChatCaller {
                writer: StreamWriter::new(audio),
                decoder: OggOpusDecoder::new(DecoderConfig {
                    trim_pre_skip: false,
                    ..DecoderConfig::default()
                })?,
            }),
            Protocol::Realtime => Box::new(RealtimeCaller {
                pcm: vec![0; FRAME_SAMPLES * 2],
                decoded: vec![0; FRAME_SAMPLES * 2 + 3],
            }),
        })
    }
}

/// Reads a Realtime session's first events until `session.created` (the
/// session started) or an `error` event (refused), before `deadline`.
pub fn await_session_created(ws: &mut ChatSocket, deadline: Instant) -> Result<(), NotStarted> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NotStarted::Failed("no session.created in time".into()));
        }
        ws.get_ref()
            .set_read_timeout(Some(left))
            .map_err(|e| NotStarted::Failed(e.to_string()))?;
        match ws.read() {
            Ok(Message::Text(text)) => {
                let v: Value = serde_json::from_str(text.as_str()).map_err(|e| {
                    NotStarted::Failed(format!("a first event that is not JSON: {e}"))
                })?;
                match v["type"].as_str() {
                    Some("session.created") => return Ok(()),
                    Some("error") => {
                        let why = v["error"]["message"].as_str().unwrap_or("?");
                        return Err(NotStarted::Refused(why.to_string()));
                    }
                    _ => {}
                }
            }
            Ok(Message::Close(_)) => return Err(NotStarted::Closed),
            Ok(_) => {}
            Err(e) if would_block(&e) => {}
            Err(e) if is_closed(&e) => return Err(NotStarted::Closed),
            Err(e) => return Err(NotStarted::Failed(format!("before session.created: {e}"))),
        }
    }
}

/// One caller's encoding of what it sends and reading of what comes back.
pub trait Caller {
    /// The message carrying frame `frame` of `audio`.
    fn frame_message(&mut self, audio: &EncodedAudio, frame: usize) -> Result<Message>;
    /// Accounts for one message from the server (answer audio, text);
    /// an error message is an error.
    fn on_message(&mut self, msg: Message, arrival_ms: f64, out: &mut Outcome) -> Result<()>;
}

struct ChatCaller {
    writer: StreamWriter,
    decoder: OggOpusDecoder,
}

impl Caller for ChatCaller {
    fn frame_message(&mut self, audio: &EncodedAudio, frame: usize) -> Result<Message> {
        let bytes = self.writer.message(audio, frame)?;
        Ok(Message::Binary(Bytes::copy_from_slice(bytes)))
    }

    fn on_message(&mut self, msg: Message, arrival_ms: f64, out: &mut Outcome) -> Result<()> {
        let Message::Binary(data) = msg else {
            return Ok(());
        };
        match data.first() {
            Some(&kind::AUDIO) => {
                let pcm = decode_audio(&mut self.decoder, &data[1..])?;
                if let Some(keep) = out.answer_pcm.as_mut() {
                    keep.extend_from_slice(&pcm);
                }
                out.matcher.audio(pcm.len(), arrival_ms);
            }
            Some(&kind::TEXT) => out.text_messages += 1,
            Some(&kind::METADATA) => out.metadata = serde_json::from_slice(&data[1..]).ok(),
            Some(&kind::ERROR) => {
                return Err(anyhow!(
                    "server error: {}",
                    String::from_utf8_lossy(&data[1..])
                ))
            }
            _ => {}
        }
        Ok(())
    }
}

struct RealtimeCaller {
    /// One frame of PCM16.
    pcm: Vec<u8>,
    /// One answer's audio, decoded.
    decoded: Vec<u8>,
}

impl Caller for RealtimeCaller {
    fn frame_message(&mut self, audio: &EncodedAudio, frame: usize) -> Result<Message> {
        let pcm = &audio.pcm()[frame % audio.frames()];
        for (out, &x) in self.pcm.chunks_exact_mut(2).zip(pcm.iter()) {
            let s = (x.clamp(-1.0, 1.0) * 32767.0).round() as i16;
            out.copy_from_slice(&s.to_le_bytes());
        }
        let mut text = String::with_capacity(64 + self.pcm.len() * 4 / 3);
        text.push_str(r#"{"type":"input_audio_buffer.append","audio":""#);
        B64.encode_string(&self.pcm, &mut text);
        text.push_str(r#""}"#);
        Ok(Message::Text(text.into()))
    }

    fn on_message(&mut self, msg: Message, arrival_ms: f64, out: &mut Outcome) -> Result<()> {
        let Message::Text(text) = msg else {
            return Ok(());
        };
        let v: Value = serde_json::from_str(text.as_str())?;
        match v["type"].as_str().unwrap_or("") {
            "response.output_audio.delta" => {
                let delta = v["delta"].as_str().unwrap_or("");
                let n = B64
                    .decode_slice(delta, &mut self.decoded)
                    .map_err(|e| anyhow!("audio delta: {e}"))?;
                if let Some(keep) = out.answer_pcm.as_mut() {
                    keep.extend(
                        self.decoded[..n]
                            .chunks_exact(2)
                            .map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0),
                    );
                }
                out.matcher.audio(n / 2, arrival_ms);
            }
            "response.output_audio_transcript.delta" => out.text_messages += 1,
            "error" => return Err(anyhow!("server error: {}", v["error"])),
            _ => {}
        }
        Ok(())
    }
}
