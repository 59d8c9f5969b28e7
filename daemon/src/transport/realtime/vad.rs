//! `server_vad`: speech detection on the caller's audio, one decision per
//! 80 ms model frame, for the API's `input_audio_buffer.speech_started` /
//! `speech_stopped` events (frameworks turn them into user turns and
//! barge-in).
//!
//! The model hears every frame whatever this says; only the events (and
//! the cancelling of a response, `interrupt_response`) depend on it. A
//! frame is speech when its RMS level reaches the threshold's level,
//! `-60 dBFS + threshold × 55 dB` (0.5 is −32.5 dBFS, a voice at a
//! microphone is louder, a quiet room is under −50). Speech starts on the
//! first speech frame; `audio_start_ms` goes back `prefix_padding_ms`
//! (not before 0). It stops after `silence_duration_ms` of non-speech
//! frames (rounded up to whole frames); `audio_end_ms` is the end of that
//! silence, as the API counts it.
//!
//! Invariants: pure, no allocation; times count the frames given, 80 ms
//! each, from the session's first frame.

use super::settings::TurnDetection;
use crate::FRAME_MS;

/// A change of the caller's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VadEvent {
    /// Speech began (ms from the first frame, prefix padding included).
    Started {
        /// `audio_start_ms`.
        audio_start_ms: u64,
    },
    /// Speech ended (ms from the first frame, the silence included).
    Stopped {
        /// `audio_end_ms`.
        audio_end_ms: u64,
    },
}

/// The detector of one session.
#[derive(Debug, Clone)]
pub struct Vad {
    /// Mean square at and above which a frame is speech.
    on_mean_square: f32,
    prefix_ms: u64,
    silence_frames: u32,
    speaking: bool,
    silent: u32,
    frames: u64,
}

const FRAME_MS_U64: u64 = FRAME_MS as u64;

impl Vad {
    /// A detector with `t`'s settings.
    pub fn new(t: &TurnDetection) -> Self {
        let level_db = -60.0 + 55.0 * t.threshold.clamp(0.0, 1.0);
        Vad {
            on_mean_square: 10f32.powf(level_db / 10.0),
            prefix_ms: t.prefix_padding_ms as u64,
            silence_frames: (t.silence_duration_ms as u64).div_ceil(FRAME_MS_U64).max(1) as u32,
            speaking: false,
            silent: 0,
            frames: 0,
        }
    }

    /// New settings, keeping the clock and whether the caller speaks.
    pub fn reconfigure(&mut self, t: &TurnDetection) {
        let fresh = Vad::new(t);
        self.on_mean_square = fresh.on_mean_square;
        self.prefix_ms = fresh.prefix_ms;
        self.silence_frames = fresh.silence_frames;
    }

    /// Whether the caller is speaking now.
    pub fn speaking(&self) -> bool {
        self.speaking
    }

    /// One model frame of the caller's audio (24 kHz, ±1.0).
    pub fn push(&mut self, frame: &[f32]) -> Option<VadEvent> {
        let start_ms = self.frames * FRAME_MS_U64;
        self.frames += 1;
        let mean_square = frame.iter().map(|x| x * x).sum::<f32>() / frame.len().max(1) as f32;
        let speech = mean_square >= self.on_mean_square;
        if speech {
            self.silent = 0;
            if !self.speaking {
                self.speaking = true;
                return Some(VadEvent::Started {
                    audio_start_ms: start_ms.saturating_sub(self.prefix_ms),
                });
            }
            return None;
        }
        if self.speaking {
            self.silent += 1;
            if self.silent >= self.silence_frames {
                self.speaking = false;
                self.silent = 0;
                return Some(VadEvent::Stopped {
                    audio_end_ms: self.frames * FRAME_MS_U64,
                });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FRAME_SAMPLES;

    fn frame(amplitude: f32) -> Vec<f32> {
        (0..FRAME_SAMPLES)
            .map(|i| amplitude * (i as f32 * 0.1).sin())
            .collect()
    }

    #[test]
    fn speech_starts_and_stops_with_padding_and_silence() {
        let mut v = Vad::new(&TurnDetection {
            silence_duration_ms: 200,
            ..TurnDetection::default()
        });
        let quiet = frame(0.001);
        let loud = frame(0.3);
        for _ in 0..5 {
            assert_eq!(v.push(&quiet), None);
        }
        // Frame 5 starts at 400 ms; 300 ms of padding.
        assert_eq!(
            v.push(&loud),
            Some(VadEvent::Started {
                audio_start_ms: 100
            })
        );
        assert!(v.speaking());
        assert_eq!(v.push(&loud), None);
        // 200 ms is three frames of silence: frames 7, 8, 9 end at 800 ms.
        assert_eq!(v.push(&quiet), None);
        assert_eq!(v.push(&quiet), None);
        assert_eq!(
            v.push(&quiet),
            Some(VadEvent::Stopped { audio_end_ms: 800 })
        );
        assert!(!v.speaking());
        // A short silence inside speech does not stop it.
        v.push(&loud);
        v.push(&quiet);
        assert_eq!(v.push(&loud), None);
    }

    #[test]
    fn the_threshold_sets_the_level() {
        let mid = frame(0.05); // about −29 dBFS
        let mut low = Vad::new(&TurnDetection {
            threshold: 0.2,
            ..TurnDetection::default()
        });
        let mut high = Vad::new(&TurnDetection {
            threshold: 0.9,
            ..TurnDetection::default()
        });
        assert!(low.push(&mid).is_some());
        assert!(high.push(&mid).is_none());
        assert_eq!(
            Vad::new(&TurnDetection::default()).push(&frame(0.3)),
            Some(VadEvent::Started { audio_start_ms: 0 })
        );
    }
}
