//! When a session releases its frames: one every 80 ms from absolute
//! deadlines, locked to the engine tick of the session's phase group.
//!
//! The engine answers each frame right after the step of the session's
//! group, so an answer that arrives at `t` says the group ticked at about
//! `t − step` (the engine's predicted step time). The clock aims each
//! release [`RELEASE_LEAD`] before that tick: the frame is in the engine's
//! queue when the tick drains it, and waits there as little as possible
//! (the DESIGN's "frame cut aligned to the group's tick"). Estimates only
//! err late (scheduling delays add to arrival times), so the clock takes
//! the earliest of a window of [`WINDOW`] answers and corrects its phase
//! when that differs by over [`DEADBAND`]. The first answer locks the
//! phase at once.
//!
//! Invariants: deadlines are `origin + n · period` (no drift); a wake-up
//! later than one period skips the missed deadlines (counted) rather than
//! releasing a burst; a phase correction moves the next deadline by less
//! than half a period, so no tick gets two releases from one correction.

use std::time::{Duration, Instant};

/// The engine's frame period.
pub const PERIOD: Duration = Duration::from_millis(80);
/// How long before the group's tick a frame is released.
pub const RELEASE_LEAD: Duration = Duration::from_millis(10);
/// Answers per phase estimate.
pub const WINDOW: usize = 8;
/// Phase errors below this are left alone.
pub const DEADBAND: Duration = Duration::from_millis(2);

/// The release schedule of one session.
#[derive(Debug, Clone)]
pub struct ReleaseClock {
    next: Instant,
    offsets_ns: [i64; WINDOW],
    count: usize,
    locked: bool,
    corrections: u64,
}

fn signed_ns(a: Instant, b: Instant) -> i64 {
    if a >= b {
        (a - b).as_nanos() as i64
    } else {
        -((b - a).as_nanos() as i64)
    }
}

impl ReleaseClock {
    /// A clock whose first deadline is `first`.
    pub fn new(first: Instant) -> Self {
        ReleaseClock {
            next: first,
            offsets_ns: [0; WINDOW],
            count: 0,
            locked: false,
            corrections: 0,
        }
    }

    /// The next deadline.
    pub fn next(&self) -> Instant {
        self.next
    }

    /// Phase corrections applied so far.
    pub fn corrections(&self) -> u64 {
        self.corrections
    }

    /// Consumes the due deadline at `now`; returns how many further
    /// deadlines had already passed (skipped).
    pub fn advance(&mut self, now: Instant) -> u64 {
        let mut skipped = 0;
        self.next += PERIOD;
        if now >= self.next {
            let behind = ((now - self.next).as_nanos() / PERIOD.as_nanos()) as u32 + 1;
            self.next += PERIOD * behind;
            skipped = behind as u64;
        }
        skipped
    }

    /// The engine answered a frame at `arrival`; its step takes about `step`.
    pub fn observe(&mut self, arrival: Instant, step: Duration) {
        let Some(tick) = arrival.checked_sub(step) else {
            return;
        };
        let Some(aim) = tick.checked_sub(RELEASE_LEAD) else {
            return;
        };
        let p = PERIOD.as_nanos() as i64;
        let mut off = signed_ns(aim, self.next).rem_euclid(p);
        if off > p / 2 {
            off -= p;
        }
        self.offsets_ns[self.count] = off;
        self.count += 1;
        if self.locked && self.count < WINDOW {
            return;
        }
        let best = self.offsets_ns[..self.count]
            .iter()
            .copied()
            .min()
            .unwrap_or(0);
        self.count = 0;
        self.locked = true;
        if best.unsigned_abs() as u128 > DEADBAND.as_nanos() {
            if best > 0 {
                self.next += Duration::from_nanos(best as u64);
            } else {
                self.next -= Duration::from_nanos(best.unsigned_abs());
            }
            self.corrections += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_missed_deadlines() {
        let t0 = Instant::now();
        let mut c = ReleaseClock::new(t0);
        assert_eq!(c.advance(t0), 0);
        assert_eq!(c.next(), t0 + PERIOD);
        assert_eq!(c.advance(t0 + PERIOD * 3 + Duration::from_millis(5)), 2);
        assert_eq!(c.next(), t0 + PERIOD * 4);
    }

    #[test]
    fn locks_to_the_tick_and_keeps_the_earliest_estimate() {
        let t0 = Instant::now();
        let mut c = ReleaseClock::new(t0 + Duration::from_millis(30));
        // The group ticks at t0 + 80 n; steps take 5 ms; answers arrive 5 ms
        // after the tick plus scheduling noise.
        let step = Duration::from_millis(5);
        c.observe(t0 + Duration::from_millis(5), step);
        let aim = t0 + PERIOD - RELEASE_LEAD;
        let err = signed_ns(c.next(), t0).rem_euclid(PERIOD.as_nanos() as i64) - signed_ns(aim, t0);
        assert!(err.abs() < 1_000, "{err} ns");
        // Noisy answers (late by up to 7 ms) do not move it.
        for n in 1..=8u32 {
            let noise = Duration::from_millis((n % 4 * 2) as u64);
            c.observe(t0 + PERIOD * n + step + noise, step);
        }
        assert_eq!(c.corrections(), 1);
    }
}
