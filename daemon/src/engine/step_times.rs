//! The measured model of step time per batch size, which admission reads.
//!
//! Invariants: only the engine thread writes (warm-up, then an exponential
//! moving average of real steps); any thread reads. Values are microseconds in
//! relaxed atomics: a reader may see a slightly stale estimate, never a torn
//! one. Sizes never measured are interpolated from their measured neighbours,
//! and a larger batch is never predicted faster than a smaller one.

use std::sync::atomic::{AtomicU32, Ordering};

/// Weight of a new measurement in the moving average (1/8).
const EWMA_SHIFT: u32 = 3;

/// Step time estimates, indexed by batch size `1..=max_slots`.
pub struct StepTimes {
    /// Microseconds per step; 0 = not measured.
    micros: Vec<AtomicU32>,
}

impl StepTimes {
    /// An empty model for batches up to `max_slots`.
    pub fn new(max_slots: usize) -> Self {
        StepTimes {
            micros: (0..=max_slots).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Largest batch size.
    pub fn max_slots(&self) -> usize {
        self.micros.len() - 1
    }

    /// Records a warm-up measurement (replaces the estimate).
    pub fn set(&self, batch: usize, micros: u32) {
        if let Some(m) = self.micros.get(batch) {
            m.store(micros.max(1), Ordering::Relaxed);
        }
    }

    /// Folds one real step into the moving average.
    pub fn observe(&self, batch: usize, micros: u32) {
        let Some(m) = self.micros.get(batch) else {
            return;
        };
        let old = m.load(Ordering::Relaxed);
        let new = if old == 0 {
            micros
        } else {
            let delta = (micros as i64 - old as i64) >> EWMA_SHIFT;
            (old as i64 + delta) as u32
        };
        m.store(new.max(1), Ordering::Relaxed);
    }

    /// Predicted step time for a batch of `batch` streams, in milliseconds.
    pub fn predict_ms(&self, batch: usize) -> f64 {
        if batch == 0 {
            return 0.0;
        }
        let batch = batch.min(self.max_slots());
        let at = |b: usize| self.micros[b].load(Ordering::Relaxed);
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
    fn moving_average_follows_slowly() {
        let t = StepTimes::new(2);
        t.observe(1, 8000);
        assert_eq!(t.predict_ms(1), 8.0);
        t.observe(1, 16000);
        assert_eq!(t.predict_ms(1), 9.0);
        assert_eq!(t.warmup_sizes(), vec![1, 2]);
    }
}
