//! The audio of a Realtime session on both sides of the model.
//!
//! In: [`AudioIn`] holds the decoded bytes of the last append
//! (`audio/pcm` 16-bit at 24 kHz, no resampling; `audio/pcmu`/`pcma` at
//! 8 kHz through the telephony codec and resampler of the phone-line
//! transports, [`LineIn`]) and cuts them into model frames under the
//! engine link's budget: bytes it cannot take yet stay here, and the
//! session stops reading its socket until the engine answers
//! (back-pressure on a client that sends faster than real time).
//!
//! Out: [`OutFrames`] encodes each model frame the engine answers
//! (`audio/pcm` as is, G.711 resampled to 8 kHz) into one of a fixed set of
//! slots, with its text token, until the session has written its events.
//!
//! Invariants: every buffer is sized at construction (or when a
//! `session.update` changes the format); taking, encoding and reading
//! slots never allocate.

use super::client_event::decode_audio;
use super::error::ApiError;
use super::settings::AudioFormat;
use crate::transport::line::{LineCodec, LineIn};
use crate::{FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE_HZ};
use moshid_telephony::resample::ResampleError;
use moshid_telephony::FrameResampler;

fn codec(format: AudioFormat) -> LineCodec {
    match format {
        AudioFormat::Pcm => LineCodec::SlinLe,
        AudioFormat::G711(law) => LineCodec::G711(law),
    }
}

/// The caller's audio on its way to the model.
pub struct AudioIn {
    format: AudioFormat,
    line: LineIn,
    pending: Box<[u8]>,
    len: usize,
    taken: usize,
    /// Samples (at the wire rate) appended since the last commit or clear.
    uncommitted: u64,
}

impl AudioIn {
    /// Input in `format`, appends of at most `max_audio_bytes` decoded.
    pub fn new(format: AudioFormat, max_audio_bytes: usize) -> Result<Self, ResampleError> {
        Ok(AudioIn {
            format,
            line: LineIn::new(codec(format), format.rate_hz())?,
            pending: vec![0; max_audio_bytes].into_boxed_slice(),
            len: 0,
            taken: 0,
            uncommitted: 0,
        })
    }

    /// The format.
    pub fn format(&self) -> AudioFormat {
        self.format
    }

    /// Changes the format (the samples of an unfinished frame are dropped).
    pub fn set_format(&mut self, format: AudioFormat) -> Result<(), ResampleError> {
        if format != self.format {
            self.line = LineIn::new(codec(format), format.rate_hz())?;
            self.format = format;
        }
        Ok(())
    }

    /// Whether decoded bytes wait for the engine's room.
    pub fn has_pending(&self) -> bool {
        self.taken < self.len
    }

    /// Decodes one append's base64 (the previous one is all taken).
    pub fn decode(&mut self, audio: &str) -> Result<(), ApiError> {
        debug_assert!(!self.has_pending());
        let bps = codec(self.format).bytes_per_sample();
        self.len = decode_audio(audio, &mut self.pending, bps)?;
        self.taken = 0;
        self.uncommitted += (self.len / bps) as u64;
        Ok(())
    }

    /// Cuts frames from the pending bytes, at most `budget` of them, each
    /// resampled into `frame` and handed to `on_frame`; returns the frames
    /// completed.
    pub fn take(
        &mut self,
        budget: usize,
        frame: &mut [f32; FRAME_SAMPLES],
        mut on_frame: impl FnMut(&[f32; FRAME_SAMPLES]),
    ) -> usize {
        let mut frames = 0;
        let n = self
            .line
            .push(&self.pending[self.taken..self.len], budget, frame, |f| {
                frames += 1;
                on_frame(f)
            });
        self.taken += n;
        frames
    }

    /// Completes an unfinished frame with silence (the end of the input:
    /// what the caller said last is heard whole).
    pub fn pad_to_frame(&mut self) {
        debug_assert!(!self.has_pending());
        let partial = self.line.partial();
        if partial == 0 {
            return;
        }
        let codec = codec(self.format);
        let bytes = (self.line.frame_samples() - partial) * codec.bytes_per_sample();
        codec.silence(&mut self.pending[..bytes]);
        self.len = bytes;
        self.taken = 0;
    }

    /// Milliseconds appended since the last commit or clear.
    pub fn uncommitted_ms(&self) -> u64 {
        self.uncommitted * 1000 / self.format.rate_hz() as u64
    }

    /// A commit: the count starts again.
    pub fn commit(&mut self) {
        self.uncommitted = 0;
    }

    /// `input_audio_buffer.clear`: what the model has not heard yet (the
    /// unfinished frame, bytes waiting for room) is dropped.
    pub fn clear(&mut self) {
        self.line.clear_partial();
        self.taken = self.len;
        self.uncommitted = 0;
    }
}

/// One model frame, encoded for the wire, and its text token.
struct Slot {
    bytes: Box<[u8]>,
    token: u32,
}

/// The model's frames on their way to the client.
pub struct OutFrames {
    format: AudioFormat,
    resampler: Option<FrameResampler>,
    pcm: Box<[f32]>,
    slots: Box<[Slot]>,
    head: usize,
    len: usize,
}

impl OutFrames {
    /// Output in `format`, with room for `capacity` frames.
    pub fn new(format: AudioFormat, capacity: usize) -> Result<Self, ResampleError> {
        let mut out = OutFrames {
            format,
            resampler: None,
            pcm: Box::new([]),
            slots: Box::new([]),
            head: 0,
            len: 0,
        };
        out.set_format(format, capacity.max(1))?;
        Ok(out)
    }

    /// Bytes of one encoded frame.
    pub fn frame_bytes(&self) -> usize {
        bytes_per_frame(self.format)
    }

    /// Changes the format (the frames queued are dropped; the session
    /// writes them before it applies an update).
    pub fn set_format(
        &mut self,
        format: AudioFormat,
        capacity: usize,
    ) -> Result<(), ResampleError> {
        let rate = format.rate_hz();
        self.resampler = if rate == SAMPLE_RATE_HZ {
            None
        } else {
            Some(FrameResampler::new(SAMPLE_RATE_HZ, rate, FRAME_MS as u32)?)
        };
        let samples = FRAME_SAMPLES * rate as usize / SAMPLE_RATE_HZ as usize;
        self.pcm = vec![0.0; samples].into_boxed_slice();
        let bytes = bytes_per_frame(format);
        self.slots = (0..capacity.max(self.slots.len()))
            .map(|_| Slot {
                bytes: vec![0; bytes].into_boxed_slice(),
                token: 0,
            })
            .collect();
        self.format = format;
        self.head = 0;
        self.len = 0;
        Ok(())
    }

    /// Encodes one model frame at the tail; `false` when every slot is
    /// taken (the caller sized them for every frame in flight).
    pub fn push(&mut self, pcm: &[f32; FRAME_SAMPLES], token: u32) -> bool {
        if self.len == self.slots.len() {
            return false;
        }
        let i = (self.head + self.len) % self.slots.len();
        let slot = &mut self.slots[i];
        match self.resampler.as_mut() {
            None => codec(self.format).encode(pcm, &mut slot.bytes),
            Some(r) => {
                r.process(pcm, &mut self.pcm);
                codec(self.format).encode(&self.pcm, &mut slot.bytes);
            }
        }
        slot.token = token;
        self.len += 1;
        true
    }

    /// The oldest frame: its bytes and text token.
    pub fn front(&self) -> Option<(&[u8], u32)> {
        (self.len > 0).then(|| {
            let s = &self.slots[self.head];
            (&s.bytes[..], s.token)
        })
    }

    /// Drops the oldest frame (once its events are written).
    pub fn pop(&mut self) {
        if self.len > 0 {
            self.head = (self.head + 1) % self.slots.len();
            self.len -= 1;
        }
    }

    /// Frames waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Wire bytes of one 80 ms frame in `format`.
pub fn bytes_per_frame(format: AudioFormat) -> usize {
    let samples = FRAME_SAMPLES * format.rate_hz() as usize / SAMPLE_RATE_HZ as usize;
    samples * codec(format).bytes_per_sample()
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use moshid_telephony::g711::Law;
    use moshid_telephony::media_streams::BASE64;

    #[test]
    fn pcm_in_is_cut_into_frames_under_the_budget() {
        let mut a = AudioIn::new(AudioFormat::Pcm, 64 * 1024).unwrap();
        let samples: Vec<u8> = (0..(FRAME_SAMPLES * 2 + 100) as i16)
            .flat_map(|i| (i * 3).to_le_bytes())
            .collect();
        a.decode(&BASE64.encode(&samples)).unwrap();
        let mut frame = [0.0; FRAME_SAMPLES];
        let mut firsts = Vec::new();
        assert_eq!(a.take(1, &mut frame, |f| firsts.push(f[1])), 1);
        assert!(a.has_pending());
        assert_eq!(a.take(5, &mut frame, |f| firsts.push(f[1])), 1);
        assert!(!a.has_pending());
        // No resampling: sample 1 is 3/32768, then 1921 × 3.
        assert_eq!(firsts, [3.0 / 32768.0, 5763.0 / 32768.0]);
        assert_eq!(a.uncommitted_ms(), 80 * 2 + 4);
        a.clear();
        assert_eq!(a.uncommitted_ms(), 0);
        // The end of input completes the unfinished frame with silence.
        a.decode(&BASE64.encode([1u8; 200])).unwrap();
        assert_eq!(a.take(1, &mut frame, |_| ()), 0);
        a.pad_to_frame();
        assert!(a.has_pending());
        assert_eq!(a.take(1, &mut frame, |_| ()), 1);
        assert!(!a.has_pending());
        assert_eq!(frame[FRAME_SAMPLES - 1], 0.0);
        // An odd byte of PCM16 is refused.
        assert!(a.decode(&BASE64.encode([1u8, 2, 3])).is_err());
    }

    #[test]
    fn g711_in_is_resampled_to_model_frames() {
        let mut a = AudioIn::new(AudioFormat::G711(Law::Mu), 4096).unwrap();
        a.decode(&BASE64.encode([0xffu8; 640])).unwrap();
        let mut frame = [1.0; FRAME_SAMPLES];
        assert_eq!(a.take(4, &mut frame, |_| ()), 1);
        assert!(frame.iter().all(|x| x.abs() < 1e-3));
        a.set_format(AudioFormat::Pcm).unwrap();
        assert_eq!(a.format(), AudioFormat::Pcm);
    }

    #[test]
    fn out_frames_encode_in_the_wire_format() {
        let mut o = OutFrames::new(AudioFormat::Pcm, 2).unwrap();
        let pcm = [0.5f32; FRAME_SAMPLES];
        assert!(o.push(&pcm, 7) && o.push(&pcm, 8));
        assert!(!o.push(&pcm, 9));
        let (bytes, token) = o.front().unwrap();
        assert_eq!((bytes.len(), token), (3840, 7));
        assert_eq!(&bytes[..2], &16384i16.to_le_bytes());
        o.pop();
        assert_eq!(o.front().unwrap().1, 8);
        o.set_format(AudioFormat::G711(Law::A), 2).unwrap();
        assert!(o.is_empty());
        assert!(o.push(&pcm, 1));
        assert_eq!(o.front().unwrap().0.len(), 640);
        assert_eq!(o.frame_bytes(), 640);
        assert_eq!(bytes_per_frame(AudioFormat::Pcm), 3840);
    }
}
