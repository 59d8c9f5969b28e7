//! A doorbell: a plain thread wakes one async task.
//!
//! The engine thread calls [`Doorbell::ring`] after pushing output records;
//! the I/O core's output task awaits [`Doorbell::wait`] and then drains its
//! lane. Share it with `Arc<Doorbell>`.
//!
//! # Invariants
//!
//! * No lost rings: a `wait` completes if `ring` was called after the
//!   previous `wait` (or `poll_rung`) completed, even if the ring happened
//!   before the task started waiting.
//! * Coalescing: any number of rings between two completions yield one
//!   completion and at most one wake of the task.
//! * Ordering: everything a thread wrote before `ring` (or `close`) is
//!   visible to the task once the `wait` that observes it returns.
//! * Closing is sticky and rings after it are ignored. A ring that
//!   precedes `close` is reported first (`Ok(())`, so the task drains its
//!   lane once more); after that every `wait` returns `Err(Closed)` at once.
//! * One waiting task at a time: a second task that waits replaces the
//!   first one's waker (the first is then never woken by this doorbell).
//!   Any number of threads may ring.
//! * Cancel-safe: dropping a [`Wait`] loses nothing; the ring stays
//!   pending for the next `wait`.
//! * Cost: `ring` on an already-rung or closed bell is one atomic
//!   compare-and-swap (retried only if the task clears the bell meanwhile).
//!   Otherwise it adds [`AtomicWaker::wake`] and the executor's own wake
//!   (for a glommio task woken from another thread: a channel send, plus an
//!   eventfd write if the executor sleeps). No lock, no spinning.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;

/// Set by `ring`, cleared by the waiting side when it reports the ring.
const RUNG: u8 = 1 << 0;
/// Set by `close`, never cleared.
const CLOSED: u8 = 1 << 1;

/// Wakes one async task from any thread. `Send + Sync`.
pub struct Doorbell {
    state: AtomicU8,
    waker: AtomicWaker,
}

/// The doorbell was closed: no more rings will come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Closed;

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("doorbell closed")
    }
}

impl std::error::Error for Closed {}

impl Doorbell {
    /// A doorbell neither rung nor closed.
    pub const fn new() -> Self {
        Self {
            state: AtomicU8::new(0),
            waker: AtomicWaker::new(),
        }
    }

    /// Rings the bell: the waiting task (or the next `wait`) completes.
    /// Callable from any thread; never blocks. Ignored once closed.
    pub fn ring(&self) {
        // Always a read-modify-write, even when RUNG is already set: the
        // Release write is what publishes this ringer's earlier writes to
        // the task's Acquire in `take` (a plain load here could strand them).
        // Only the ring that sets RUNG wakes; later ones coalesce into it.
        let set_rung = |state: u8| (state & CLOSED == 0).then_some(state | RUNG);
        if let Ok(before) = self
            .state
            .fetch_update(Ordering::Release, Ordering::Relaxed, set_rung)
        {
            if before & RUNG == 0 {
                self.waker.wake();
            }
        }
    }

    /// Closes the bell: once any pending ring is reported, every `wait`
    /// returns [`Closed`]. Idempotent; rings after it are ignored.
    pub fn close(&self) {
        self.state.fetch_or(CLOSED, Ordering::Release);
        self.waker.wake();
    }

    /// `true` once [`close`](Self::close) has been called.
    pub fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Completes when the bell has been rung since the last completion:
    /// `Ok(())`, or `Err(Closed)` once it is closed and no ring is pending.
    pub fn wait(&self) -> Wait<'_> {
        Wait { bell: self }
    }

    /// Poll form of [`wait`](Self::wait), for hand-written futures.
    /// On `Pending`, `cx`'s waker is woken by the next ring or close.
    pub fn poll_rung(&self, cx: &mut Context<'_>) -> Poll<Result<(), Closed>> {
        if let Some(outcome) = self.take() {
            return Poll::Ready(outcome);
        }
        self.waker.register(cx.waker());
        // Check again after registering: a ring between the first check and
        // `register` found no waker to wake, so it must be seen here.
        match self.take() {
            Some(outcome) => Poll::Ready(outcome),
            None => Poll::Pending,
        }
    }

    /// Consumes a pending ring, or reports closure.
    fn take(&self) -> Option<Result<(), Closed>> {
        // Acquire (here and below): pairs with the Release in `ring` and
        // `close`. The plain load keeps an idle bell free of writes.
        let state = self.state.load(Ordering::Acquire);
        if state & RUNG == 0 {
            // Every ring ordered before the close has been reported.
            return (state & CLOSED != 0).then_some(Err(Closed));
        }
        let state = self.state.fetch_and(!RUNG, Ordering::Acquire);
        if state & RUNG != 0 {
            Some(Ok(()))
        } else if state & CLOSED != 0 {
            Some(Err(Closed))
        } else {
            None
        }
    }
}

impl Default for Doorbell {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.load(Ordering::Relaxed);
        f.debug_struct("Doorbell")
            .field("rung", &(state & RUNG != 0))
            .field("closed", &(state & CLOSED != 0))
            .finish()
    }
}

/// Future returned by [`Doorbell::wait`]. Cancel-safe.
#[derive(Debug)]
#[must_use = "futures do nothing unless awaited"]
pub struct Wait<'a> {
    bell: &'a Doorbell,
}

impl Future for Wait<'_> {
    type Output = Result<(), Closed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.bell.poll_rung(cx)
    }
}

#[cfg(test)]
mod tests;
