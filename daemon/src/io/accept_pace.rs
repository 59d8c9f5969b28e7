//! Pacing of an accept loop, so that a flood of connections cannot starve
//! the sessions sharing its executor.
//!
//! glommio's `TcpListener::accept` first tries a plain non-blocking
//! `accept(2)` and goes through the reactor only when nothing is waiting.
//! While connections keep arriving the accept loop therefore never returns
//! `Pending`: it would accept the whole backlog in one go while every other
//! task of the core — the sessions' audio, the connections it has just
//! evicted or spawned — waits, and the reactor (socket readiness, timers)
//! is not polled at all. An [`AcceptPace`] ends each run of
//! [`ACCEPT_BURST`] accepts with a short timer sleep: the task becomes not
//! runnable, the executor runs everything else that is ready and polls the
//! reactor, and then the loop goes on. At about 10–20 µs per accepted
//! connection that still accepts well over 50,000 connections a second, so
//! the listen backlog does not overflow (which would delay every client's
//! SYN by a second), while a session waits at most one burst.
//!
//! Invariants: one per accept loop (single-threaded, `Cell`); costs one
//! counter increment per accept and one timer per burst.

use std::cell::Cell;
use std::time::Duration;

/// Accepts in a row before the loop lets the rest of the core run.
pub const ACCEPT_BURST: u32 = 16;
/// The pause after a burst: long enough that the timer is not already
/// expired when first polled (so the task really yields to the reactor).
pub const ACCEPT_PAUSE: Duration = Duration::from_micros(50);

/// Counts an accept loop's accepts and yields after each burst.
#[derive(Debug, Default)]
pub struct AcceptPace {
    in_burst: Cell<u32>,
}

impl AcceptPace {
    /// Call after each accepted connection (inside a glommio executor).
    pub async fn accepted(&self) {
        let n = self.in_burst.get() + 1;
        if n < ACCEPT_BURST {
            self.in_burst.set(n);
            return;
        }
        self.in_burst.set(0);
        glommio::timer::sleep(ACCEPT_PAUSE).await;
    }
}
