//! A session's mailbox: the engine's records for one session, handed from
//! the core's dispatch task to the session task on the same executor.
//!
//! Invariants: bounded at creation (the session's frames in flight plus one),
//! never reallocated; the engine sends at most one record per frame the
//! session sent, and the session stops sending at its in-flight bound, so the
//! mailbox cannot overflow — should it ever, the record is counted as lost
//! rather than growing memory. Single-threaded (`Cell`/`RefCell`): both ends
//! live on one glommio executor.

use crate::engine::records::FromEngine;
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

/// Records for one session.
pub struct Mailbox {
    ring: RefCell<Vec<FromEngine>>,
    head: Cell<usize>,
    len: Cell<usize>,
    lost: Cell<u64>,
    shutdown: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Mailbox {
    /// A mailbox of `capacity_frames` records (at least 1).
    pub fn new(capacity_frames: usize) -> Self {
        Mailbox {
            ring: RefCell::new(vec![FromEngine::default(); capacity_frames.max(1)]),
            head: Cell::new(0),
            len: Cell::new(0),
            lost: Cell::new(0),
            shutdown: Cell::new(false),
            waker: RefCell::new(None),
        }
    }

    /// Stores a record and wakes the session.
    pub fn deliver(&self, rec: &FromEngine) {
        let mut ring = self.ring.borrow_mut();
        let cap = ring.len();
        if self.len.get() == cap {
            self.lost.set(self.lost.get() + 1);
        } else {
            let idx = (self.head.get() + self.len.get()) % cap;
            ring[idx] = *rec;
            self.len.set(self.len.get() + 1);
        }
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Takes the oldest record, if any, into `out`.
    pub fn take(&self, out: &mut FromEngine) -> bool {
        if self.len.get() == 0 {
            return false;
        }
        let ring = self.ring.borrow();
        *out = ring[self.head.get()];
        self.head.set((self.head.get() + 1) % ring.len());
        self.len.set(self.len.get() - 1);
        true
    }

    /// Hands the oldest record, if any, to `f` where it lies (no copy of its
    /// PCM) and then removes it; `None` when no record waits. `f` must not
    /// deliver to this mailbox (it is borrowed meanwhile); the dispatch task
    /// that delivers never runs inside another task's synchronous code.
    pub fn take_with<R>(&self, f: impl FnOnce(&FromEngine) -> R) -> Option<R> {
        if self.len.get() == 0 {
            return None;
        }
        let ring = self.ring.borrow();
        let result = f(&ring[self.head.get()]);
        self.head.set((self.head.get() + 1) % ring.len());
        self.len.set(self.len.get() - 1);
        Some(result)
    }

    /// Records waiting.
    pub fn len(&self) -> usize {
        self.len.get()
    }

    /// Whether no record waits.
    pub fn is_empty(&self) -> bool {
        self.len.get() == 0
    }

    /// Records lost to a full mailbox.
    pub fn lost(&self) -> u64 {
        self.lost.get()
    }

    /// Asks the session to end (server shutdown) and wakes it.
    pub fn notify_shutdown(&self) {
        self.shutdown.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Whether the server asked the session to end.
    pub fn shutdown_requested(&self) -> bool {
        self.shutdown.get()
    }

    /// Completes when at least one record waits or shutdown was requested.
    pub async fn ready(&self) {
        poll_fn(|cx| {
            if self.len.get() > 0 || self.shutdown.get() {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_fifo() {
        let m = Mailbox::new(2);
        let mut r = FromEngine::default();
        for i in 0..3 {
            r.text_token = i;
            m.deliver(&r);
        }
        assert_eq!((m.len(), m.lost()), (2, 1));
        let mut out = FromEngine::default();
        assert!(m.take(&mut out));
        assert_eq!(out.text_token, 0);
        assert!(m.take(&mut out));
        assert_eq!(out.text_token, 1);
        assert!(!m.take(&mut out));
        r.text_token = 7;
        m.deliver(&r);
        assert_eq!(m.take_with(|rec| rec.text_token), Some(7));
        assert_eq!(m.take_with(|rec| rec.text_token), None);
        assert!(m.is_empty());
    }
}
