//! When a session releases its frames: one every 80 ms from absolute
//! deadlines, locked to the engine tick of the session's phase group.
//!
//! The engine answers each frame right after the step of the session's
//! group, so an answer that arrives at `t` says the group ticked at about
//! `t − step` (the engine's predicted step time), and the frames still in
//! flight after it are queued for the following ticks, one each. The next
//! frame is therefore due [`RELEASE_LEAD`] before the tick after those:
//! `tick + (1 + in_flight) · period − lead`. Releasing then puts the frame
//! in the engine's queue just before the tick that drains it (the DESIGN's
//! "frame cut aligned to the group's tick"), and never stacks two frames on
//! one tick — a backlog drains instead of standing. Estimates only err late
//! (scheduling delays add to arrival times), so the clock takes the
//! earliest of a window of [`WINDOW`] answers and corrects its schedule
//! when that differs by over [`DEADBAND`]. The first answer sets the phase
//! at once.
//!
//! Invariants: deadlines are `origin + n · period` between corrections (no
//! drift); a wake-up later than one period skips the missed deadlines
//! (counted) rather than releasing a burst; after a correction the next
//! release is aimed at a tick no frame in flight will take.

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

    /// The engine answered a frame at `arrival`; its step takes about
    /// `step`; `in_flight` frames are still unanswered after it.
    pub fn observe(&mut self, arrival: Instant, step: Duration, in_flight: usize) {
        let Some(tick) = arrival.checked_sub(step) else {
            return;
        };
        let Some(aim) = (tick + PERIOD * (1 + in_flight as u32)).checked_sub(RELEASE_LEAD) else {
            return;
        };
        self.offsets_ns[self.count] = signed_ns(aim, self.next);
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

    /// A simulated engine (ticks every 80 ms at `phase_ms`, one queued frame
    /// stepped per tick, answers `step` later plus noise) driven by the
    /// clock from an arbitrary start.
    fn simulate(phase_ms: u64, first_release_ms: u64) -> (Vec<usize>, Vec<f64>) {
        let t0 = Instant::now();
        let ms = |m: f64| t0 + Duration::from_secs_f64(m / 1000.0);
        let step = Duration::from_millis(3);
        let mut clock = ReleaseClock::new(ms(first_release_ms as f64));
        let mut queue: Vec<Instant> = Vec::new();
        let mut in_flight = 0usize;
        let mut answers: Vec<(Instant, Instant)> = Vec::new();
        let (mut queued_at_tick, mut waits) = (Vec::new(), Vec::new());
        let mut tick = ms(phase_ms as f64);
        for n in 0..60u64 {
            // Releases due before this tick.
            while clock.next() <= tick {
                let at = clock.next();
                // Answers that arrived before this release are seen first.
                answers.sort();
                while answers.first().is_some_and(|a| a.0 <= at) {
                    let (arrival, _) = answers.remove(0);
                    in_flight -= 1;
                    clock.observe(arrival, step, in_flight);
                }
                if clock.next() > tick {
                    break;
                }
                clock.advance(at);
                queue.push(at);
                in_flight += 1;
            }
            queued_at_tick.push(queue.len());
            if !queue.is_empty() {
                let released = queue.remove(0);
                let noise = Duration::from_micros((n * 1_777) % 4_000);
                let arrival = tick + step + noise;
                waits.push((arrival - released).as_secs_f64() * 1000.0);
                answers.push((arrival, released));
            }
            tick += PERIOD;
        }
        (queued_at_tick, waits)
    }

    #[test]
    fn one_frame_per_tick_and_no_standing_backlog_from_any_start() {
        for phase in (0..80).step_by(7) {
            for first in [0u64, 1, 39, 41, 79, 85, 150] {
                let (queued, waits) = simulate(phase, first);
                let steady = &queued[5..];
                assert!(
                    steady.iter().all(|&q| q == 1),
                    "phase {phase}, first {first}: frames queued at each tick {queued:?}"
                );
                // Released RELEASE_LEAD (within the deadband) before the tick,
                // answered after the step and its noise.
                let tail = &waits[waits.len() - 20..];
                assert!(
                    tail.iter().all(|&w| (10.5..=18.0).contains(&w)),
                    "phase {phase}, first {first}: waits {tail:?}"
                );
            }
        }
    }

    #[test]
    fn noisy_answers_do_not_move_a_locked_clock() {
        let t0 = Instant::now();
        let step = Duration::from_millis(5);
        let mut c = ReleaseClock::new(t0 + Duration::from_millis(70));
        c.observe(t0 + step, step, 0);
        assert_eq!(c.next(), t0 + PERIOD - RELEASE_LEAD);
        assert_eq!(c.corrections(), 0);
        for n in 1..=16u32 {
            c.advance(c.next());
            let noise = Duration::from_millis((n % 4 * 2) as u64);
            c.observe(t0 + PERIOD * n + step + noise, step, 0);
        }
        assert_eq!(c.corrections(), 0);
        assert_eq!(c.next(), t0 + PERIOD * 17 - RELEASE_LEAD);
    }
}
