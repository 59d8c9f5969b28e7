//! How a subscriber learns that its session said something, on whatever
//! core the subscriber is: each I/O core looks, every `events.poll_ms`,
//! at the rings of the sessions its subscribers follow, and wakes the
//! subscribers whose ring moved (or whose session ended, or whose
//! keep-alive is due).
//!
//! Why polling by the subscriber's core rather than a wake from the
//! session: a session's core would have to wake tasks on other executors
//! (for glommio, a channel send that allocates now and then, plus an
//! `eventfd` write when that core sleeps) for every event of every
//! subscriber. Here the session's hot path only writes its ring; the cost
//! of following lies with the subscribers' cores: one timer per core while
//! it has subscribers, one atomic load per subscriber per period, and a
//! local wake for each subscriber that has news. An event waits at most
//! `events.poll_ms` before its subscriber is woken (its time stamp is the
//! session's own).
//!
//! Invariants: one [`Relay`] per executor thread (a `thread_local`), only
//! ever touched by that executor's tasks; its table holds one entry per
//! [`Watch`] alive on this core (removed when the watch is dropped); its
//! polling task runs only while the table is not empty; nothing here
//! allocates after a watch is made (wakers are cloned only when they
//! change).

use super::hub::Channel;
use glommio::timer::Timer;
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

struct Entry {
    key: u64,
    channel: Arc<Channel>,
    /// The ring's head the watcher has read up to.
    seen: u64,
    /// When the watcher wants to be woken anyway (keep-alive).
    due: Instant,
    waker: Option<Waker>,
}

impl Entry {
    fn ready(&self, now: Instant) -> bool {
        self.channel.ring().head() > self.seen || self.channel.is_ended() || now >= self.due
    }
}

/// One core's table of watched sessions and its polling task.
#[derive(Default)]
pub struct Relay {
    entries: RefCell<Vec<Entry>>,
    next_key: Cell<u64>,
    running: Cell<bool>,
    poll: Cell<Duration>,
}

thread_local! {
    static RELAY: Rc<Relay> = Rc::new(Relay::default());
}

impl Relay {
    /// This executor's relay.
    pub fn current() -> Rc<Relay> {
        RELAY.with(Rc::clone)
    }

    /// Watches on this core.
    pub fn watching(&self) -> usize {
        self.entries.borrow().len()
    }

    async fn run(self: Rc<Self>) {
        let mut timer = Timer::new(self.poll.get());
        loop {
            (&mut timer).await;
            let now = Instant::now();
            {
                let mut entries = self.entries.borrow_mut();
                if entries.is_empty() {
                    self.running.set(false);
                    return;
                }
                for e in entries.iter_mut() {
                    if e.waker.is_some() && e.ready(now) {
                        if let Some(w) = e.waker.take() {
                            // A local wake: schedules the task, runs nothing here.
                            w.wake();
                        }
                    }
                }
            }
            timer.reset(self.poll.get());
        }
    }
}

/// A subscriber's registration with its core's relay; dropping it removes
/// the entry. Must be made inside a glommio executor.
pub struct Watch {
    relay: Rc<Relay>,
    key: u64,
}

impl Watch {
    /// Watches `channel`, polled every `poll`.
    pub fn new(channel: Arc<Channel>, poll: Duration) -> Watch {
        let relay = Relay::current();
        let key = relay.next_key.get();
        relay.next_key.set(key + 1);
        relay.poll.set(poll);
        relay.entries.borrow_mut().push(Entry {
            key,
            seen: 0,
            due: Instant::now(),
            channel,
            waker: None,
        });
        if !relay.running.replace(true) {
            glommio::spawn_local(relay.clone().run()).detach();
        }
        Watch { relay, key }
    }

    /// Completes once the ring's head is past `seen`, the session has
    /// ended, or `due` has come.
    pub async fn changed(&self, seen: u64, due: Instant) {
        poll_fn(|cx| {
            let mut entries = self.relay.entries.borrow_mut();
            let Some(e) = entries.iter_mut().find(|e| e.key == self.key) else {
                return Poll::Ready(());
            };
            e.seen = seen;
            e.due = due;
            if e.ready(Instant::now()) {
                e.waker = None;
                return Poll::Ready(());
            }
            match &e.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => e.waker = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut entries = self.relay.entries.borrow_mut();
        if let Some(i) = entries.iter().position(|e| e.key == self.key) {
            entries.swap_remove(i);
        }
    }
}
