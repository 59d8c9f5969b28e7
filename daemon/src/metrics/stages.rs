//! One thread's stage timings and counts: a [`StageCounters`] per I/O core
//! and one for the engine thread, written through that thread's
//! [`StageRecorder`] and read by the exporter through an `Arc`.
//!
//! Which thread records what:
//! * I/O core: `decode`, `encode`, `send`, `frames` (frames pushed to the
//!   engine), `dropped_frames` (lane full), `refused_sessions`. Per
//!   transport: WebSocket chat — `decode` per client audio message,
//!   `encode` and `send` per output frame; RTP — `decode` per released
//!   frame, `encode` per 80 ms of outgoing audio, `send` per packet;
//!   AudioSocket and Media Streams — `decode` per audio message / `media`
//!   event, `encode` per model frame, `send` per packet.
//! * Engine: `frame_wait` (push on the core → taken into a batch, one sample
//!   per stepped frame that was stamped), `batch_fill` and `model_step` (one
//!   sample per model step; `model_step` per phase group and batch-size
//!   bucket), `frames` (frames stepped), `late_ticks`, `dropped_frames`
//!   (slot queue full).
//!
//! Invariants:
//! * Single writer: a [`StageRecorder`] is neither `Clone` nor `Sync`, and
//!   [`Registry::register`](super::Registry::register) hands out exactly one
//!   per `StageCounters`, so only the thread holding it writes; recording is
//!   relaxed load + store (see [`super::histogram`]) — no lock, no
//!   allocation, no map lookup, no clock read.
//! * Everything is allocated at registration (the per-group × batch-bucket
//!   table included); nothing per session or per frame.
//! * The struct is cache-line aligned so that two threads' counters never
//!   share a line.

use super::histogram::{Histogram, HistogramSnapshot, SingleWriterCounter};
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// The thread a [`StageCounters`] belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// I/O core `n`.
    Core(usize),
    /// The engine thread.
    Engine,
}

impl Owner {
    /// The `core` label: `"0"`, `"1"`, … or `"engine"`.
    pub fn label(&self) -> String {
        match self {
            Owner::Core(n) => n.to_string(),
            Owner::Engine => "engine".to_string(),
        }
    }
}

/// A timed stage other than the model step (which has its own table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Ogg Opus decoding of one client message (I/O core).
    Decode = 0,
    /// Frame pushed by its core → taken into a batch (engine).
    FrameWait = 1,
    /// Copying the queued frames into the batch (engine).
    BatchFill = 2,
    /// Opus encoding of one output frame (I/O core).
    Encode = 3,
    /// Handing one output frame's messages to the WebSocket (I/O core).
    Send = 4,
}

impl Stage {
    /// Every stage in index order.
    pub const ALL: [Stage; 5] = [
        Stage::Decode,
        Stage::FrameWait,
        Stage::BatchFill,
        Stage::Encode,
        Stage::Send,
    ];

    /// The `stage` label.
    pub fn label(self) -> &'static str {
        match self {
            Stage::Decode => "decode",
            Stage::FrameWait => "frame_wait",
            Stage::BatchFill => "batch_fill",
            Stage::Encode => "encode",
            Stage::Send => "send",
        }
    }
}

/// The `stage` label of the model step.
pub const MODEL_STEP_LABEL: &str = "model_step";

/// Batch-size bucket of a step of `batch` streams: 1 → 0, 2 → 1, 3–4 → 2,
/// 5–8 → 3, … (⌈log2 batch⌉).
#[inline]
pub fn batch_bucket(batch: usize) -> usize {
    if batch <= 1 {
        0
    } else {
        (usize::BITS - (batch - 1).leading_zeros()) as usize
    }
}

/// The `batch` label of bucket `b` for a model of `max_slots`: "1", "2",
/// "3-4", "5-8", … (the last range is capped at `max_slots`).
pub fn batch_label(b: usize, max_slots: usize) -> String {
    let hi = (1usize << b).min(max_slots.max(1));
    let lo = if b == 0 { 1 } else { (1usize << (b - 1)) + 1 };
    if lo >= hi {
        hi.to_string()
    } else {
        format!("{lo}-{hi}")
    }
}

/// One thread's counters (written by its [`StageRecorder`], read by anyone).
#[derive(Debug)]
#[repr(align(128))]
pub struct StageCounters {
    owner: Owner,
    phase_groups: usize,
    max_slots: usize,
    batch_buckets: usize,
    stages: [Histogram; 5],
    /// `phase_groups × batch_buckets`, group-major.
    model_step: Box<[Histogram]>,
    frames: SingleWriterCounter,
    late_ticks: SingleWriterCounter,
    dropped_frames: SingleWriterCounter,
    refused_sessions: SingleWriterCounter,
}

impl StageCounters {
    /// Zeroed counters for `owner` (model steps of up to `max_slots` streams
    /// in `phase_groups` groups).
    pub(super) fn new(owner: Owner, phase_groups: usize, max_slots: usize) -> Self {
        let phase_groups = phase_groups.max(1);
        let batch_buckets = batch_bucket(max_slots.max(1)) + 1;
        StageCounters {
            owner,
            phase_groups,
            max_slots: max_slots.max(1),
            batch_buckets,
            stages: Default::default(),
            model_step: (0..phase_groups * batch_buckets)
                .map(|_| Histogram::default())
                .collect(),
            frames: SingleWriterCounter::default(),
            late_ticks: SingleWriterCounter::default(),
            dropped_frames: SingleWriterCounter::default(),
            refused_sessions: SingleWriterCounter::default(),
        }
    }

    /// Whose counters these are.
    pub fn owner(&self) -> Owner {
        self.owner
    }

    /// The current values (allocates: scrape time only).
    pub fn snapshot(&self) -> ThreadSnapshot {
        let mut model_step = Vec::new();
        for g in 0..self.phase_groups {
            for b in 0..self.batch_buckets {
                let h = self.model_step[g * self.batch_buckets + b].snapshot();
                if h.count() > 0 {
                    model_step.push(ModelStepSnapshot {
                        group: g,
                        batch: batch_label(b, self.max_slots),
                        histogram: h,
                    });
                }
            }
        }
        ThreadSnapshot {
            owner: self.owner,
            stages: std::array::from_fn(|i| self.stages[i].snapshot()),
            model_step,
            frames: self.frames.get(),
            late_ticks: self.late_ticks.get(),
            dropped_frames: self.dropped_frames.get(),
            refused_sessions: self.refused_sessions.get(),
        }
    }
}

/// The model-step histogram of one phase group and batch-size bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelStepSnapshot {
    /// Phase group.
    pub group: usize,
    /// Batch-size range label ("1", "2", "3-4", …).
    pub batch: String,
    /// Its counts.
    pub histogram: HistogramSnapshot,
}

/// A [`StageCounters`] read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadSnapshot {
    /// Whose.
    pub owner: Owner,
    /// Per [`Stage`], in [`Stage::ALL`] order.
    pub stages: [HistogramSnapshot; 5],
    /// Non-empty model-step histograms.
    pub model_step: Vec<ModelStepSnapshot>,
    /// Frames pushed (core) or stepped (engine).
    pub frames: u64,
    /// Late ticks (engine).
    pub late_ticks: u64,
    /// Frames dropped (lane full on a core, slot queue full at the engine).
    pub dropped_frames: u64,
    /// Sessions refused admission (core).
    pub refused_sessions: u64,
}

impl ThreadSnapshot {
    /// The histogram of `stage`.
    pub fn stage(&self, stage: Stage) -> &HistogramSnapshot {
        &self.stages[stage as usize]
    }

    /// All model steps of this thread, over groups and batch sizes.
    pub fn model_step_total(&self) -> HistogramSnapshot {
        let mut h = HistogramSnapshot::default();
        for m in &self.model_step {
            h.merge(&m.histogram);
        }
        h
    }
}

/// The only writer of one [`StageCounters`]: owned by its thread, neither
/// `Clone` nor `Sync` (it may move to the thread it serves, then stays there).
#[derive(Debug)]
pub struct StageRecorder {
    counters: Arc<StageCounters>,
    /// `Cell` is `Send + !Sync`: the recorder can be moved to its thread but
    /// never shared with a second one.
    _single_thread: PhantomData<Cell<()>>,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl StageRecorder {
    pub(super) fn new(counters: Arc<StageCounters>) -> Self {
        StageRecorder {
            counters,
            _single_thread: PhantomData,
        }
    }

    /// The counters this recorder writes (for readers).
    pub fn counters(&self) -> &Arc<StageCounters> {
        &self.counters
    }

    /// Records one sample of `stage`.
    #[inline]
    pub fn record(&self, stage: Stage, elapsed: Duration) {
        self.counters.stages[stage as usize].record_ns(nanos(elapsed));
    }

    /// Records one model step of `batch` streams in `group`.
    #[inline]
    pub fn model_step(&self, group: usize, batch: usize, elapsed: Duration) {
        let c = &self.counters;
        let g = group.min(c.phase_groups - 1);
        let b = batch_bucket(batch).min(c.batch_buckets - 1);
        c.model_step[g * c.batch_buckets + b].record_ns(nanos(elapsed));
    }

    /// Counts `n` frames (pushed on a core, stepped on the engine).
    #[inline]
    pub fn frames(&self, n: u64) {
        self.counters.frames.add(n);
    }

    /// Counts a late tick.
    #[inline]
    pub fn late_tick(&self) {
        self.counters.late_ticks.add(1);
    }

    /// Counts a dropped frame.
    #[inline]
    pub fn dropped_frame(&self) {
        self.counters.dropped_frames.add(1);
    }

    /// Counts a refused session.
    #[inline]
    pub fn refused_session(&self) {
        self.counters.refused_sessions.add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_buckets_and_labels() {
        let b: Vec<usize> = [1, 2, 3, 4, 5, 8, 9, 16, 17]
            .iter()
            .map(|&n| batch_bucket(n))
            .collect();
        assert_eq!(b, vec![0, 1, 2, 2, 3, 3, 4, 4, 5]);
        let labels: Vec<String> = (0..=3).map(|b| batch_label(b, 6)).collect();
        assert_eq!(labels, vec!["1", "2", "3-4", "5-6"]);
        assert_eq!(batch_label(3, 5), "5");
    }

    #[test]
    fn recorder_writes_its_counters() {
        let c = Arc::new(StageCounters::new(Owner::Engine, 2, 8));
        let r = StageRecorder::new(c.clone());
        r.record(Stage::FrameWait, Duration::from_micros(3));
        r.record(Stage::FrameWait, Duration::from_millis(40));
        r.model_step(1, 5, Duration::from_millis(11));
        r.model_step(0, 1, Duration::from_millis(1));
        // Out-of-range group and batch clamp to the last entries.
        r.model_step(7, 100, Duration::from_millis(1));
        r.frames(6);
        r.late_tick();
        r.dropped_frame();
        let s = c.snapshot();
        assert_eq!(s.stage(Stage::FrameWait).count(), 2);
        assert_eq!(s.stage(Stage::Decode).count(), 0);
        assert_eq!(s.model_step_total().count(), 3);
        let keys: Vec<(usize, &str, u64)> = s
            .model_step
            .iter()
            .map(|m| (m.group, m.batch.as_str(), m.histogram.count()))
            .collect();
        assert_eq!(keys, vec![(0, "1", 1), (1, "5-8", 2)]);
        assert_eq!(
            (s.frames, s.late_ticks, s.dropped_frames, s.refused_sessions),
            (6, 1, 1, 0)
        );
        assert_eq!(s.owner.label(), "engine");
        assert_eq!(Owner::Core(3).label(), "3");
    }
}
