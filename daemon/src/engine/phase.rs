//! A stream's phase: when, modulo the 80 ms frame period and on the engine's
//! clock, its frames become complete (for WebSocket streams, when the last
//! sample of a frame reached its I/O core).
//!
//! The estimate must stand up to what clients do:
//! * network jitter delays arrivals (never advances them), so the phase is an
//!   upper quantile of the recent arrival phases: the tick chosen after it
//!   finds nearly every frame already there, instead of one frame in two
//!   missing it and waiting a whole period;
//! * a burst at connect (a client sending frames it had buffered) delivers
//!   several frames at once: only paced arrivals, those between half and one
//!   and a half periods after the previous one, are samples, so the burst and
//!   the first frame after a pause say nothing;
//! * client clock drift (±100 ppm is 8 µs per frame) moves the phase slowly:
//!   the window is [`WINDOW`] frames (1.28 s), so the estimate follows within
//!   a window's worth of drift (about 0.1 ms).
//!
//! Invariants: fixed size, no allocation; phases are nanoseconds in
//! `0..PERIOD_NS`; offsets are compared on the circle, relative to the
//! newest sample, so a phase near the period's end and one near its start
//! are neighbours.

/// The frame period, in nanoseconds.
pub const PERIOD_NS: u64 = 80_000_000;
/// Paced arrivals kept.
pub const WINDOW: usize = 16;
/// Paced arrivals needed before there is an estimate.
pub const MIN_SAMPLES: usize = 4;
/// From this many samples on, the largest is taken as an outlier and the
/// second largest is the estimate.
const OUTLIER_FROM: usize = 8;

/// Tracks one stream's phase from its frames' completion times.
#[derive(Debug, Clone, Copy, Default)]
pub struct PhaseEstimator {
    phases_ns: [u32; WINDOW],
    next: usize,
    len: usize,
    last_at_ns: Option<u64>,
}

/// `x` on the circle of one period, in `(-PERIOD/2, PERIOD/2]`.
pub fn wrap_ns(x: i64) -> i64 {
    let p = PERIOD_NS as i64;
    let r = x.rem_euclid(p);
    if r > p / 2 {
        r - p
    } else {
        r
    }
}

impl PhaseEstimator {
    /// Forgets everything (a new session in the slot).
    pub fn reset(&mut self) {
        *self = PhaseEstimator::default();
    }

    /// A frame of the stream became complete at `at_ns` (engine clock).
    pub fn observe(&mut self, at_ns: u64) {
        let paced = self.last_at_ns.is_some_and(|last| {
            let gap = at_ns.saturating_sub(last);
            (PERIOD_NS / 2..=PERIOD_NS * 3 / 2).contains(&gap)
        });
        self.last_at_ns = Some(at_ns);
        if !paced {
            return;
        }
        self.phases_ns[self.next] = (at_ns % PERIOD_NS) as u32;
        self.next = (self.next + 1) % WINDOW;
        self.len = (self.len + 1).min(WINDOW);
    }

    /// Until there is an estimate, the phase of the latest completion (the
    /// first frames' tick is chosen from it, so they do not wait in a group
    /// picked blind; a burst or jitter may move the stream again once the
    /// estimate stands).
    pub fn provisional_ns(&self) -> Option<u64> {
        self.phase_ns()
            .or_else(|| self.last_at_ns.map(|at| at % PERIOD_NS))
    }

    /// The phase, once [`MIN_SAMPLES`] paced frames were seen.
    pub fn phase_ns(&self) -> Option<u64> {
        if self.len < MIN_SAMPLES {
            return None;
        }
        let newest = self.phases_ns[(self.next + WINDOW - 1) % WINDOW] as i64;
        let (mut first, mut second) = (i64::MIN, i64::MIN);
        for &p in &self.phases_ns[..self.len] {
            let d = wrap_ns(p as i64 - newest);
            if d > first {
                second = first;
                first = d;
            } else if d > second {
                second = d;
            }
        }
        let top = if self.len >= OUTLIER_FROM {
            second
        } else {
            first
        };
        Some((newest + top).rem_euclid(PERIOD_NS as i64) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn paced_frames_give_their_phase_after_the_minimum() {
        let mut e = PhaseEstimator::default();
        assert_eq!(e.provisional_ns(), None);
        for k in 0..=MIN_SAMPLES as u64 {
            assert_eq!(e.phase_ns(), None);
            e.observe(1000 * PERIOD_NS + k * PERIOD_NS + 37 * MS + k);
            assert_eq!(e.provisional_ns(), Some(37 * MS + k));
        }
        assert_eq!(e.phase_ns(), Some(37 * MS + MIN_SAMPLES as u64));
    }

    #[test]
    fn a_burst_at_connect_is_not_a_sample() {
        let mut e = PhaseEstimator::default();
        // Five buffered frames at once at 10 ms, then paced ones at 52 ms.
        for _ in 0..5 {
            e.observe(10 * MS);
        }
        for k in 1..=10 {
            e.observe(k * PERIOD_NS + 52 * MS);
        }
        assert_eq!(e.phase_ns(), Some(52 * MS));
    }

    #[test]
    fn jitter_gives_an_upper_quantile_and_one_outlier_is_ignored() {
        let mut e = PhaseEstimator::default();
        for k in 0..17u64 {
            let jitter = match k {
                9 => 15 * MS, // one outlier
                _ => (k % 4) * MS,
            };
            e.observe(k * PERIOD_NS + 20 * MS + jitter);
        }
        assert_eq!(e.phase_ns(), Some(23 * MS));
    }

    #[test]
    fn phases_near_the_period_end_wrap_around() {
        let mut e = PhaseEstimator::default();
        for k in 0..10u64 {
            // Alternately just before and just after the period boundary.
            let at = if k % 2 == 0 { 79 * MS } else { PERIOD_NS + MS };
            e.observe(k * PERIOD_NS + at);
        }
        // The upper quantile is 1 ms after the boundary.
        assert_eq!(e.phase_ns(), Some(MS));
    }
}
