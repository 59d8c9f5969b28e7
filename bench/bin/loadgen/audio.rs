//! The audio the simulated callers send, and the bare-Opus floor.
//!
//! - [`speech_like`] (from the bench library, shared with `opus-interleave`):
//!   a deterministic speech-like signal, so that Opus works as hard as on
//!   speech rather than on a tone or silence.
//! - [`EncodedAudio`]: the signal encoded once, before the run, with the
//!   daemon's own [`OggOpusEncoder`] (80 ms frames, two 40 ms packets each),
//!   kept as raw Opus packets. Callers never run an encoder during the run:
//!   on a 2-core machine the load generator must take as little CPU from the
//!   daemon as it can.
//! - [`StreamWriter`]: one caller's Ogg stream. It wraps the shared packets in
//!   pages of its own (contiguous sequence numbers, headers first), so a frame
//!   lost on the send side is simply skipped and the stream stays valid.
//! - [`bare_opus_floor`]: what decoding the callers' audio and encoding the
//!   same amount of answer audio costs on one thread with nothing else — the
//!   floor that the daemon's CPU per stream is compared with. The answer
//!   audio is what the daemon really sent back (kept from one caller), since
//!   Opus's cost depends on the signal; the sent audio is the fallback.
//!
//! Invariants: every message starts with the audio kind byte 0x01; the first
//! message of a stream carries `OpusHead` and `OpusTags`; granule positions
//! grow by 1920 (48 kHz) per packet sent.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use moshid::codec::ogg_reader::{OggPacketReader, OggReaderConfig, OGG_MAX_PAGE_BYTES};
use moshid::codec::ogg_writer::{ogg_page_bytes_for_packet, OggPageWriter};
use moshid::codec::{DecoderConfig, EncoderConfig, OggOpusDecoder, OggOpusEncoder};
use moshid::protocol::kind;
use moshid::FRAME_SAMPLES;

use crate::sys::thread_cpu;

pub use moshid_bench::signal::{speech_like, Rng};

/// Ogg granule (48 kHz samples) of one 40 ms packet.
const GRANULE_PER_PACKET: u64 = 1920;

/// A signal encoded once as raw Opus packets (two per 80 ms frame).
pub struct EncodedAudio {
    head: Vec<u8>,
    tags: Vec<u8>,
    /// `2 × frames` packets.
    packets: Vec<Vec<u8>>,
    /// The PCM of each frame, for the floor measurement.
    pcm: Vec<[f32; FRAME_SAMPLES]>,
}

impl EncodedAudio {
    /// Encodes `frames` frames of `pcm`, looping it when it is shorter.
    pub fn encode(pcm: &[f32], frames: usize) -> Result<Self> {
        if pcm.is_empty() {
            bail!("no audio to send");
        }
        let mut encoder = OggOpusEncoder::new(EncoderConfig::default())?;
        let mut reader = OggPacketReader::new(OggReaderConfig {
            max_page_bytes: OGG_MAX_PAGE_BYTES,
            max_packet_bytes: 64 * 1024,
            max_buffered_bytes: 256 * 1024,
        })?;
        let mut buf = vec![0u8; encoder.max_output_bytes_per_frame()];
        let mut all: Vec<Vec<u8>> = Vec::with_capacity(2 * frames + 2);
        let mut frame_pcm = Vec::with_capacity(frames);
        let mut pos = 0usize;
        for _ in 0..frames {
            let mut frame = [0f32; FRAME_SAMPLES];
            for x in frame.iter_mut() {
                *x = pcm[pos % pcm.len()];
                pos += 1;
            }
            let n = encoder.encode_frame(&frame, &mut buf)?;
            reader.push_bytes(&buf[..n])?;
            while let Some(packet) = reader.next_packet()? {
                all.push(packet.data.to_vec());
            }
            frame_pcm.push(frame);
        }
        if all.len() != 2 + 2 * frames {
            bail!(
                "expected {} packets from the encoder, got {}",
                2 + 2 * frames,
                all.len()
            );
        }
        let packets = all.split_off(2);
        let tags = all.pop().context("no OpusTags")?;
        let head = all.pop().context("no OpusHead")?;
        Ok(EncodedAudio {
            head,
            tags,
            packets,
            pcm: frame_pcm,
        })
    }

    /// Frames available.
    pub fn frames(&self) -> usize {
        self.pcm.len()
    }

    /// The PCM of the frames.
    pub fn pcm(&self) -> &[[f32; FRAME_SAMPLES]] {
        &self.pcm
    }

    /// Bytes of the largest message a [`StreamWriter`] can produce.
    pub fn max_message_bytes(&self) -> usize {
        1 + ogg_page_bytes_for_packet(self.head.len())
            + ogg_page_bytes_for_packet(self.tags.len())
            + self
                .packets
                .iter()
                .map(|p| 2 * ogg_page_bytes_for_packet(p.len()))
                .max()
                .unwrap_or(0)
    }
}

/// One caller's Ogg Opus stream over the shared packets.
pub struct StreamWriter {
    pages: OggPageWriter,
    granule: u64,
    scratch: Vec<u8>,
}

impl StreamWriter {
    /// A stream writer for messages of `audio`.
    pub fn new(audio: &EncodedAudio) -> Self {
        StreamWriter {
            pages: OggPageWriter::new(42),
            granule: 0,
            scratch: vec![0u8; audio.max_message_bytes()],
        }
    }

    /// The message (kind byte, then pages) carrying frame `frame` of `audio`;
    /// the first message of the stream also carries the header pages.
    pub fn message(&mut self, audio: &EncodedAudio, frame: usize) -> Result<&[u8]> {
        let frame = frame % audio.frames();
        let out = &mut self.scratch;
        out[0] = kind::AUDIO;
        let mut n = 1;
        if self.pages.pages_written() == 0 {
            n += self.pages.write_page(&mut out[n..], &audio.head, 0, 0)?;
            n += self.pages.write_page(&mut out[n..], &audio.tags, 0, 0)?;
        }
        for packet in &audio.packets[2 * frame..2 * frame + 2] {
            self.granule += GRANULE_PER_PACKET;
            n += self
                .pages
                .write_page(&mut out[n..], packet, self.granule, 0)?;
        }
        Ok(&out[..n])
    }
}

/// The bare-Opus floor: CPU per stream-second of decoding the callers' Ogg
/// Opus and encoding the same amount of audio back, on one thread.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct OpusFloor {
    /// Audio processed (per direction), in seconds.
    pub audio_seconds: f64,
    /// Thread CPU of decoding, ms per stream-second.
    pub decode_ms_per_stream_s: f64,
    /// Thread CPU of encoding, ms per stream-second.
    pub encode_ms_per_stream_s: f64,
    /// Both together.
    pub total_ms_per_stream_s: f64,
}

impl OpusFloor {
    /// The floor over several measurements, weighted by their audio.
    pub fn mean(floors: &[OpusFloor]) -> OpusFloor {
        let seconds: f64 = floors.iter().map(|f| f.audio_seconds).sum();
        let w = |f: fn(&OpusFloor) -> f64| {
            floors.iter().map(|x| f(x) * x.audio_seconds).sum::<f64>()
                / seconds.max(f64::MIN_POSITIVE)
        };
        OpusFloor {
            audio_seconds: seconds,
            decode_ms_per_stream_s: w(|f| f.decode_ms_per_stream_s),
            encode_ms_per_stream_s: w(|f| f.encode_ms_per_stream_s),
            total_ms_per_stream_s: w(|f| f.total_ms_per_stream_s),
        }
    }
}

/// Measures [`OpusFloor`] over at least `min_audio` of audio: decoding
/// `audio` (what the callers send) and encoding as many frames of `answer`
/// (looped; what the daemon sends back), in whole passes, each pass a fresh
/// decoder and encoder as a new session.
pub fn bare_opus_floor(
    audio: &EncodedAudio,
    answer: &[[f32; FRAME_SAMPLES]],
    min_audio: Duration,
) -> Result<OpusFloor> {
    if answer.is_empty() {
        bail!("no answer audio to encode");
    }
    let mut writer = StreamWriter::new(audio);
    let messages: Vec<Vec<u8>> = (0..audio.frames())
        .map(|i| writer.message(audio, i).map(|m| m[1..].to_vec()))
        .collect::<Result<_>>()?;
    let pass_seconds = audio.frames() as f64 * moshid::FRAME_MS / 1000.0;
    let passes = (min_audio.as_secs_f64() / pass_seconds).ceil().max(1.0) as usize;
    let (mut decode_ns, mut encode_ns) = (0u64, 0u64);
    let mut checksum = 0f64;
    for _ in 0..passes {
        let mut decoder = OggOpusDecoder::new(DecoderConfig {
            trim_pre_skip: false,
            ..DecoderConfig::default()
        })?;
        let mut encoder = OggOpusEncoder::new(EncoderConfig::default())?;
        let mut out = vec![0u8; encoder.max_output_bytes_per_frame()];
        let t = thread_cpu();
        for message in &messages {
            decoder.push_bytes(message)?;
            while let Some(pcm) = decoder.next_pcm()? {
                checksum += f64::from(pcm[0]);
            }
        }
        let t_mid = thread_cpu();
        for frame in answer.iter().cycle().take(audio.frames()) {
            checksum += encoder.encode_frame(frame, &mut out)? as f64;
        }
        let t_end = thread_cpu();
        decode_ns += t_mid.saturating_sub(t);
        encode_ns += t_end.saturating_sub(t_mid);
    }
    std::hint::black_box(checksum);
    let seconds = passes as f64 * pass_seconds;
    let per_s = |ns: u64| ns as f64 / 1e6 / seconds;
    Ok(OpusFloor {
        audio_seconds: seconds,
        decode_ms_per_stream_s: per_s(decode_ns),
        encode_ms_per_stream_s: per_s(encode_ns),
        total_ms_per_stream_s: per_s(decode_ns + encode_ns),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_with_a_lost_frame_decodes() {
        let pcm = speech_like(1.0, 3);
        let audio = EncodedAudio::encode(&pcm, 6).unwrap();
        let mut writer = StreamWriter::new(&audio);
        let mut decoder = OggOpusDecoder::new(DecoderConfig {
            trim_pre_skip: false,
            ..DecoderConfig::default()
        })
        .unwrap();
        let mut samples = 0;
        for frame in [0, 1, 3, 4, 5] {
            let message = writer.message(&audio, frame).unwrap();
            assert_eq!(message[0], kind::AUDIO);
            decoder.push_bytes(&message[1..]).unwrap();
            while let Some(out) = decoder.next_pcm().unwrap() {
                samples += out.len();
            }
        }
        assert_eq!(samples, 5 * FRAME_SAMPLES);
    }

    #[test]
    fn speech_is_deterministic_and_not_silent() {
        let a = speech_like(2.0, 7);
        assert_eq!(a, speech_like(2.0, 7));
        assert_eq!(a.len(), 48_000);
        let rms = (a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / a.len() as f64).sqrt();
        assert!(rms > 0.01 && a.iter().all(|x| x.abs() < 1.0), "rms {rms}");
    }
}
