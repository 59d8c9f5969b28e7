//! The measured model of step time per batch size, which admission reads.
//!
//! Invariants: only the engine thread writes (warm-up, then an exponential
//! moving average of real steps); any thread reads. The warm-up measurement
//! is a floor: real steps can raise a batch size's estimate, never lower it
//! below what the warm-up measured, which is the worst case where the
//! backend can time it (the GPU model at full context: a step of young
//! conversations must not price the same batch once they are old). An
//! observed estimate that has not been refreshed for [`STALE_AFTER`] falls
//! back to the warm-up measurement: otherwise one slow period (CPU
//! contention) could price a batch size over the budget for good, since
//! admission would never let a batch of that size form again to correct it. Values are microseconds in
//! relaxed atomics: a reader may see a slightly stale estimate, never a torn
//! one. Sizes never measured are interpolated from their measured neighbours,
//! and a larger batch is never predicted faster than a smaller one.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

/// Weight of a new measurement in the moving average (1/8).
const EWMA_SHIFT: u32 = 3;

/// How long an observed estimate stands without a new observation.
pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// Step time estimates, indexed by batch size `1..=max_slots`.
pub struct StepTimes {
    /// Microseconds per step, moving average of real steps; 0 = none.
    micros: Vec<AtomicU32>,
    /// Microseconds per step measured at warm-up; 0 = not measured.
    baseline: Vec<AtomicU32>,
    /// When `micros` was last refreshed, in milliseconds since `epoch`.
    refreshed_ms: Vec<AtomicU64>,
    epoch: Instant,
    stale_after_ms: u64,
}

impl StepTimes {
    /// An empty model for batches up to `max_slots`.
    pub fn new(max_slots: usize) -> Self {
        Self::with_staleness(max_slots, STALE_AFTER)
    }

    /// An empty model whose observations stand for `stale_after`.
    pub fn with_staleness(max_slots: usize, stale_after: std::time::Duration) -> Self {
        StepTimes {
            micros: (0..=max_slots).map(|_| AtomicU32::new(0)).collect(),
            baseline: (0..=max_slots).map(|_| AtomicU32::new(0)).collect(),
            refreshed_ms: (0..=max_slots).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            stale_after_ms: stale_after.as_millis() as u64,
        }
    }

    /// Largest batch size.
    pub fn max_slots(&self) -> usize {
        self.micros.len() - 1
    }

    /// Records a warm-up measurement (replaces the estimate).
    pub fn set(&self, batch: usize, micros: u32) {
        if let Some(m) = self.baseline.get(batch) {
            m.store(micros.max(1), Ordering::Relaxed);
            self.micros[batch].store(0, Ordering::Relaxed);
        }
    }

    /// Folds one real step into the moving average.
    pub fn observe(&self, batch: usize, micros: u32) {
        let Some(m) = self.micros.get(batch) else {
            return;
        };
        let mut old = m.load(Ordering::Relaxed);
        let stale = self
            .now_ms()
            .saturating_sub(self.refreshed_ms[batch].load(Ordering::Relaxed))
            > self.stale_after_ms;
        if old == 0 || stale {
            // Start again from the warm-up measurement, if there is one.
            old = self.baseline[batch].load(Ordering::Relaxed);
        }
        let new = if old == 0 {
            micros
        } else {
            let delta = (micros as i64 - old as i64) >> EWMA_SHIFT;
            (old as i64 + delta) as u32
        };
        m.store(new.max(1), Ordering::Relaxed);
        self.refreshed_ms[batch].store(self.now_ms(), Ordering::Relaxed);
    }

    /// Predicted step time for a batch of `batch` streams, in milliseconds.
    pub fn predict_ms(&self, batch: usize) -> f64 {
        if batch == 0 {
            return 0.0;
        }
        let batch = batch.min(self.max_slots());
        let now_ms = self.now_ms();
        let stale_ms = self.stale_after_ms;
        let at = |b: usize| {
            let observed = self.micros[b].load(Ordering::Relaxed);
            let baseline = self.baseline[b].load(Ordering::Relaxed);
            let fresh =
                now_ms.saturating_sub(self.refreshed_ms[b].load(Ordering::Relaxed)) <= stale_ms;
            if observed != 0 && fresh {
                observed.max(baseline)
            } else {
                baseline
            }
        };
        let mut best = 0u32;
        // Monotone: the prediction for `batch` is at least every measured
        // smaller size, and interpolated towards the next measured larger size.
        let mut below = None;
        for b in 1..=batch {
            let v = at(b);
            if v != 0 {
                best = best.max(v);
                below = Some((b, v));
            }
        }
        if at(batch) != 0 {
            return best as f64 / 1000.0;
        }
        let above = (batch + 1..=self.max_slots()).find_map(|b| {
            let v = at(b);
            (v != 0).then_some((b, v))
        });
        let est = match (below, above) {
            (Some((b0, v0)), Some((b1, v1))) => {
                v0 as f64 + (v1 as f64 - v0 as f64) * (batch - b0) as f64 / (b1 - b0) as f64
            }
            (Some((b0, v0)), None) => v0 as f64 * batch as f64 / b0 as f64,
            (None, Some((b1, v1))) => v1 as f64 * batch as f64 / b1 as f64,
            (None, None) => 0.0,
        };
        est.max(best as f64) / 1000.0
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Batch sizes to measure during warm-up: 1, 2, 4, … and `max_slots`.
    pub fn warmup_sizes(&self) -> Vec<usize> {
        let max = self.max_slots();
        let mut sizes = Vec::new();
        let mut b = 1;
        while b < max {
            sizes.push(b);
            b *= 2;
        }
        sizes.push(max);
        sizes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolates_and_stays_monotone() {
        let t = StepTimes::new(8);
        t.set(1, 1000);
        t.set(4, 4000);
        t.set(8, 6000);
        assert_eq!(t.predict_ms(1), 1.0);
        assert_eq!(t.predict_ms(2), 2.0);
        assert_eq!(t.predict_ms(6), 5.0);
        assert_eq!(t.predict_ms(8), 6.0);
        assert_eq!(t.predict_ms(100), 6.0);
        // A noisy small measurement never makes a larger batch look cheaper.
        t.set(2, 5000);
        assert!(t.predict_ms(3) >= 5.0);
    }

    #[test]
    fn a_slow_spell_is_forgotten_once_stale() {
        let t = StepTimes::with_staleness(4, std::time::Duration::from_millis(30));
        for b in 1..=4 {
            t.set(b, 10_000 * b as u32);
        }
        // Contention: batch 2 measured far over its warm-up time.
        for _ in 0..50 {
            t.observe(2, 90_000);
        }
        assert!(t.predict_ms(2) > 80.0);
        assert!(t.predict_ms(3) > 80.0, "monotone while fresh");
        std::thread::sleep(std::time::Duration::from_millis(60));
        // No batch of 2 formed since: back to the warm-up figures.
        assert_eq!(t.predict_ms(2), 20.0);
        assert_eq!(t.predict_ms(3), 30.0);
    }

    #[test]
    fn real_steps_never_price_below_the_warm_up() {
        // Warm-up at full context: 60 ms at 64; young conversations step in 40.
        let t = StepTimes::new(64);
        t.set(1, 30_000);
        t.set(64, 60_000);
        for _ in 0..100 {
            t.observe(64, 40_000);
        }
        assert_eq!(t.predict_ms(64), 60.0);
        // Slower than the warm-up: the real steps price it.
        for _ in 0..100 {
            t.observe(64, 70_000);
        }
        assert!(t.predict_ms(64) > 65.0, "{}", t.predict_ms(64));
    }

    #[test]
    fn moving_average_follows_slowly() {
        let t = StepTimes::new(2);
        t.observe(1, 8000);
        assert_eq!(t.predict_ms(1), 8.0);
        t.observe(1, 16000);
        assert_eq!(t.predict_ms(1), 9.0);
        assert_eq!(t.warmup_sizes(), vec![1, 2]);
    }
}
