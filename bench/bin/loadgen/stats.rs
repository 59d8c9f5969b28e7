//! Statistics of the load generator: the matching of the daemon's answers
//! to the frames a caller sent, and the percentiles (from
//! [`moshid_bench::percentiles`], shared with the other bench tools).
//!
//! # Matching answers to frames
//! The model answers with a fixed delay of `delay` frames (1 for Moshi and
//! the demo model): stepping input frame `k` releases output frame `k − delay`,
//! and the first `delay` frames release nothing. Answers are counted in
//! 1920-sample units of decoded audio (the client decodes without trimming
//! the Opus pre-skip, so one answered frame is exactly 1920 samples, whatever
//! the message chunking), in arrival order. Answer `j` (0-based) is matched to
//! the `(j + delay)`-th frame *sent* — the frame whose step released it — so
//! that the latency measures what serving adds (waiting for the engine's tick,
//! the batched step, encoding, the network) and not the model's algorithmic
//! delay, which is `delay × 80 ms` on top for a listener.
//!
//! Frames dropped on the send side (`--loss`) are never sent, so they are not
//! in the list; the daemon never sees them either and the order still holds.
//! A frame the daemon drops itself (engine queue full) produces no answer and
//! shifts the matching by one; such runs show `dropped_frames` on `/capacity`
//! and fail the deadline criterion anyway.
//!
//! Invariants: times are milliseconds on one monotonic clock (the run's
//! epoch); a frame's time is when its last sample was captured; percentiles
//! use the nearest-rank definition and are taken from exact sorted samples.

/// Samples of one answered frame (80 ms at 24 kHz).
pub const FRAME_SAMPLES: usize = moshid::FRAME_SAMPLES;

pub use moshid_bench::percentiles::{percentile, summarize, Summary};

/// Matches one caller's answers to its sent frames (see the module docs).
#[derive(Debug, Clone)]
pub struct FrameMatcher {
    delay: usize,
    /// Capture-complete time of each frame sent, in send order.
    sent: Vec<f64>,
    /// Decoded samples not yet making a whole frame.
    pending_samples: usize,
    answers: usize,
    /// Answers that matched no sent frame (more answers than frames − delay).
    unmatched: usize,
    latencies: Vec<f64>,
}

impl FrameMatcher {
    /// A matcher for a model that answers `delay` frames late.
    pub fn new(delay: usize) -> Self {
        FrameMatcher {
            delay,
            sent: Vec::new(),
            pending_samples: 0,
            answers: 0,
            unmatched: 0,
            latencies: Vec::new(),
        }
    }

    /// Records a frame sent whose last sample was captured at `complete_ms`.
    pub fn frame_sent(&mut self, complete_ms: f64) {
        self.sent.push(complete_ms);
    }

    /// Records `samples` of decoded answer audio that arrived at
    /// `arrival_ms`; every frame they complete gets its latency.
    pub fn audio(&mut self, samples: usize, arrival_ms: f64) {
        self.pending_samples += samples;
        while self.pending_samples >= FRAME_SAMPLES {
            self.pending_samples -= FRAME_SAMPLES;
            match self.sent.get(self.answers + self.delay) {
                Some(&complete) => self.latencies.push(arrival_ms - complete),
                None => self.unmatched += 1,
            }
            self.answers += 1;
        }
    }

    /// Frames sent so far.
    pub fn frames_sent(&self) -> usize {
        self.sent.len()
    }

    /// Whole frames answered so far.
    pub fn answers(&self) -> usize {
        self.answers
    }

    /// Whether every frame that can be answered has been.
    pub fn all_answered(&self) -> bool {
        self.answers + self.delay >= self.sent.len()
    }

    /// Frames that should have been answered and were not.
    pub fn unanswered(&self) -> usize {
        self.sent
            .len()
            .saturating_sub(self.delay)
            .saturating_sub(self.answers)
    }

    /// Answers beyond the frames sent (a model delay set too high).
    pub fn unmatched(&self) -> usize {
        self.unmatched
    }

    /// Latency of each matched frame, in send order (ms).
    pub fn latencies(&self) -> &[f64] {
        &self.latencies
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_match_the_frame_that_released_them() {
        let mut m = FrameMatcher::new(1);
        // Frames complete at 80, 160, 240, 320 ms.
        for i in 1..=4 {
            m.frame_sent(80.0 * f64::from(i));
        }
        // Answer 0 (released by frame 1, complete at 160) arrives at 170 in
        // two pieces; answer 1 (frame 2, 240) at 250; answers 2 and 3 come
        // in one message at 330 but only answer 2 has a frame.
        m.audio(1000, 165.0);
        assert_eq!(m.answers(), 0);
        m.audio(FRAME_SAMPLES - 1000, 170.0);
        m.audio(FRAME_SAMPLES, 250.0);
        assert!(!m.all_answered());
        assert_eq!(m.unanswered(), 1);
        m.audio(2 * FRAME_SAMPLES, 330.0);
        assert_eq!(m.latencies(), &[10.0, 10.0, 10.0]);
        assert_eq!(m.answers(), 4);
        assert_eq!(m.unmatched(), 1);
        assert!(m.all_answered());
        assert_eq!(m.unanswered(), 0);
    }

    #[test]
    fn lost_frames_are_not_in_the_order() {
        // Frames 0..4 captured, frame 2 lost on the send side: the daemon
        // sees 0, 1, 3, so its second answer is released by frame 3.
        let mut m = FrameMatcher::new(1);
        for complete in [80.0, 160.0, 320.0] {
            m.frame_sent(complete);
        }
        m.audio(FRAME_SAMPLES, 200.0);
        m.audio(FRAME_SAMPLES, 330.0);
        assert_eq!(m.latencies(), &[40.0, 10.0]);
        assert_eq!(m.frames_sent(), 3);
        assert_eq!(m.unanswered(), 0);
    }
}
