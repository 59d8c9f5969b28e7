//! Statistics of the load generator: percentiles and the matching of the
//! daemon's answers to the frames a caller sent.
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

/// The nearest-rank percentile `q` (0–100) of `sorted` (ascending): the
/// smallest value such that at least `q` % of the values are at most it.
/// `None` for an empty slice.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let rank = ((q / 100.0) * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// Summary of a set of latencies, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Sorts `values` and summarises them; `None` when empty.
pub fn summarize(values: &mut [f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let p = |q| percentile(values, q).unwrap_or(f64::NAN);
    Some(Summary {
        count: values.len(),
        mean: values.iter().sum::<f64>() / values.len() as f64,
        p50: p(50.0),
        p90: p(90.0),
        p99: p(99.0),
        max: values[values.len() - 1],
    })
}

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
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 90.0), Some(90.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        // 10 values: p99 is the largest, p50 the 5th.
        let w: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&w, 99.0), Some(10.0));
        assert_eq!(percentile(&w, 50.0), Some(5.0));
    }

    #[test]
    fn summary_sorts_and_summarises() {
        let mut v = vec![3.0, 1.0, 2.0, 4.0];
        let s = summarize(&mut v).unwrap();
        assert_eq!((s.count, s.p50, s.max, s.mean), (4, 2.0, 4.0, 2.5));
        assert!(summarize(&mut []).is_none());
    }

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
