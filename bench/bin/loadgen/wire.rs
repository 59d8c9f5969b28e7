//! What a caller speaks: Kyutai's `/api/chat` protocol (binary messages,
//! Ogg Opus) or the OpenAI Realtime API (`/v1/realtime`: JSON events,
//! base64 PCM16 at 24 kHz), behind one interface so that [`crate::stream`]
//! runs the same schedule, timing and matching for both, and a run can
//! compare what the daemon spends serving each.
//!
//! Realtime callers ask for `responses=continuous`, so that every frame the
//! model answers comes back (as `/api/chat` sends every frame) and the
//! answers match the frames one for one.

use anyhow::{anyhow, Result};
use base64::Engine;
use moshid::codec::{DecoderConfig, OggOpusDecoder};
use moshid::protocol::kind;
use moshid::FRAME_SAMPLES;
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

    /// What the first message from the server says: the session started
    /// (`Some(Ok)`), was refused (`Some(Err(why))`), or not yet (`None`).
    pub fn handshake(self, msg: &Message) -> Option<Result<(), String>> {
        match (self, msg) {
            (Protocol::Chat, Message::Binary(data)) => match data.first() {
                Some(&kind::HANDSHAKE) => Some(Ok(())),
                Some(&kind::ERROR) => Some(Err(String::from_utf8_lossy(&data[1..]).into_owned())),
                _ => None,
            },
            (Protocol::Realtime, Message::Text(text)) => {
                let v: Value = serde_json::from_str(text.as_str()).ok()?;
                match v["type"].as_str()? {
                    "session.created" => Some(Ok(())),
                    "error" => Some(Err(v["error"]["message"]
                        .as_str()
                        .unwrap_or("?")
                        .to_string())),
                    _ => None,
                }
            }
            _ => None,
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
                let mut samples = 0;
                for piece in data[1..].chunks(32 * 1024) {
                    self.decoder.push_bytes(piece)?;
                    while let Some(pcm) = self.decoder.next_pcm()? {
                        samples += pcm.len();
                        if let Some(keep) = out.answer_pcm.as_mut() {
                            keep.extend_from_slice(pcm);
                        }
                    }
                }
                out.matcher.audio(samples, arrival_ms);
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
