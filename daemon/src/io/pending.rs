//! The per-core budget of connections that have not started yet.
//!
//! A connection is *pending* from its accept until it has completed its
//! first request or handshake: the HTTP request (head and body), the
//! WebSocket upgrade request (and, for Media Streams, the `start` event),
//! the AudioSocket UUID — and whatever a listener puts in front of these
//! (a TLS handshake). A pending connection
//! holds no slot and has shown nothing; a flood of them must not lock real
//! clients out. Every listener of an I/O core therefore puts its new
//! connections into the core's one budget and runs the handshake through
//! one call:
//!
//! ```ignore
//! let pending = app.pending.admit(peer.ip()); // at accept (may close the oldest)
//! // in the connection's task; TLS, HTTP head, …:
//! let head = match pending.handshake(timeout, read_head(&mut stream, &mut buf, &limits)).await {
//!     Ok(head) => head,                 // started: leaves the budget, never evicted
//!     Err(_evicted_or_timed_out) => return, // close without an answer
//! };
//! ```
//!
//! Rules:
//! * At most `listen.max_pending_per_core` pending connections per core, and
//!   at most `listen.max_pending_per_ip` from one client address per core
//!   (0: no per-address budget).
//! * A new connection is always let in. When a budget is full, the oldest
//!   pending connection — of the same address when the address's budget is
//!   full, of the core otherwise — is closed to make room. So a client that
//!   sends its request promptly is served unless a whole budget of newer
//!   connections reaches its core before its request is complete, and a
//!   flood evicts its own connections first.
//! * Each handshake has a deadline (`listen.head_timeout_ms`,
//!   `audiosocket.uuid_timeout_ms`, …: the caller's).
//! * A completed handshake leaves the budget for good: established
//!   connections are never evicted.
//!
//! Invariants: the entry table is allocated once, `max_pending_per_core`
//! entries, linked in age order (oldest → newest) and, per address, in a
//! second list, so admission, eviction and release are O(1) and allocate
//! nothing but the per-address index; that index holds one entry per address
//! with a pending connection and none without a per-address budget. A
//! ticket names its entry by index and generation: an evicted (or released)
//! entry gets a new generation at once and can be reused, and the evicted
//! ticket sees the change at its next poll (it is woken). Counters and
//! gauges go to [`PendingCounters`] (exported by `/metrics`), evictions and
//! timeouts to the log at most once per [`CONNECTION_LOG_PERIOD`].

use super::log_gate::{LogGate, CONNECTION_LOG_PERIOD};
use crate::metrics::connections::{bump, set, PendingCounters};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// No entry.
const NIL: u32 = u32::MAX;

/// Why a handshake did not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingEnd {
    /// Closed to make room for a newer connection.
    Evicted,
    /// Not complete within its deadline.
    TimedOut,
}

impl std::fmt::Display for PendingEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PendingEnd::Evicted => {
                "closed to make room for a newer connection (listen.max_pending_per_core / max_pending_per_ip)"
            }
            PendingEnd::TimedOut => "the request or handshake did not complete in time",
        })
    }
}

/// One place in the budget.
struct Entry {
    /// Bumped whenever the place is given up; tickets compare it.
    generation: u32,
    live: bool,
    ip: IpAddr,
    older: u32,
    newer: u32,
    ip_older: u32,
    ip_newer: u32,
    /// The task of the ticket, to wake when it is evicted.
    waker: Option<Waker>,
}

/// One address's pending connections, oldest to newest.
struct AddressList {
    count: usize,
    oldest: u32,
    newest: u32,
}

struct State {
    entries: Vec<Entry>,
    free: Vec<u32>,
    oldest: u32,
    newest: u32,
    len: usize,
    per_ip: HashMap<IpAddr, AddressList>,
}

impl State {
    fn new(capacity: usize) -> Self {
        let entries = (0..capacity)
            .map(|_| Entry {
                generation: 0,
                live: false,
                ip: IpAddr::from([0, 0, 0, 0]),
                older: NIL,
                newer: NIL,
                ip_older: NIL,
                ip_newer: NIL,
                waker: None,
            })
            .collect();
        State {
            entries,
            // Reversed so that entry 0 is used first (easier to read in tests).
            free: (0..capacity as u32).rev().collect(),
            oldest: NIL,
            newest: NIL,
            len: 0,
            per_ip: HashMap::new(),
        }
    }

    /// Links a new entry for `ip` as the newest; needs a free entry.
    fn insert(&mut self, ip: IpAddr, track_ip: bool) -> (u32, u32) {
        let i = self.free.pop().expect("the caller made room");
        let older = self.newest;
        let (ip_older, list) = if track_ip {
            let list = self.per_ip.entry(ip).or_insert(AddressList {
                count: 0,
                oldest: NIL,
                newest: NIL,
            });
            (list.newest, Some(list))
        } else {
            (NIL, None)
        };
        if let Some(list) = list {
            if list.newest == NIL {
                list.oldest = i;
            }
            list.newest = i;
            list.count += 1;
        }
        if ip_older != NIL {
            self.entries[ip_older as usize].ip_newer = i;
        }
        if older != NIL {
            self.entries[older as usize].newer = i;
        } else {
            self.oldest = i;
        }
        self.newest = i;
        self.len += 1;
        let e = &mut self.entries[i as usize];
        debug_assert!(!e.live);
        e.live = true;
        e.ip = ip;
        e.older = older;
        e.newer = NIL;
        e.ip_older = ip_older;
        e.ip_newer = NIL;
        (i, e.generation)
    }

    /// Unlinks live entry `i`, gives its place back, and returns the waker
    /// of its ticket.
    fn remove(&mut self, i: u32, track_ip: bool) -> Option<Waker> {
        let (older, newer, ip_older, ip_newer, ip) = {
            let e = &self.entries[i as usize];
            debug_assert!(e.live);
            (e.older, e.newer, e.ip_older, e.ip_newer, e.ip)
        };
        match older {
            NIL => self.oldest = newer,
            o => self.entries[o as usize].newer = newer,
        }
        match newer {
            NIL => self.newest = older,
            n => self.entries[n as usize].older = older,
        }
        if track_ip {
            if ip_older != NIL {
                self.entries[ip_older as usize].ip_newer = ip_newer;
            }
            if ip_newer != NIL {
                self.entries[ip_newer as usize].ip_older = ip_older;
            }
            let list = self
                .per_ip
                .get_mut(&ip)
                .expect("a live entry's address is indexed");
            if ip_older == NIL {
                list.oldest = ip_newer;
            }
            if ip_newer == NIL {
                list.newest = ip_older;
            }
            list.count -= 1;
            if list.count == 0 {
                self.per_ip.remove(&ip);
            }
        }
        self.len -= 1;
        let e = &mut self.entries[i as usize];
        e.live = false;
        e.generation = e.generation.wrapping_add(1);
        self.free.push(i);
        e.waker.take()
    }
}

/// Bounds of a core's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingLimits {
    /// Pending connections per core (at least 1).
    pub max_per_core: usize,
    /// Pending connections per client address (0: no per-address budget).
    pub max_per_ip: usize,
}

/// One I/O core's budget of connections that have not started (see the
/// module docs). Shared by every listener of the core.
pub struct PendingBudget {
    core: usize,
    limits: PendingLimits,
    state: RefCell<State>,
    counters: Arc<PendingCounters>,
    log: LogGate,
    /// Counter values at the last log line: (core evictions, address
    /// evictions, timeouts).
    logged: Cell<(u64, u64, u64)>,
}

impl PendingBudget {
    /// A budget for core `core`; its counters are published in `counters`.
    pub fn new(core: usize, limits: PendingLimits, counters: Arc<PendingCounters>) -> Rc<Self> {
        assert!(
            limits.max_per_core > 0,
            "validated: max_pending_per_core ≥ 1"
        );
        assert!(limits.max_per_core < NIL as usize);
        Rc::new(PendingBudget {
            core,
            limits,
            state: RefCell::new(State::new(limits.max_per_core)),
            counters,
            log: LogGate::new(CONNECTION_LOG_PERIOD),
            logged: Cell::new((0, 0, 0)),
        })
    }

    fn track_ip(&self) -> bool {
        self.limits.max_per_ip > 0
    }

    /// Puts a new connection from `ip` into the budget, closing the oldest
    /// pending one (of `ip` if its budget is full, else of the core) when
    /// there is no room. Never refuses.
    pub fn admit(self: &Rc<Self>, ip: IpAddr) -> Pending {
        let ip = ip.to_canonical();
        let track = self.track_ip();
        let (index, generation, evicted, woken) = {
            let mut st = self.state.borrow_mut();
            let by_address = st
                .per_ip
                .get(&ip)
                .filter(|l| track && l.count >= self.limits.max_per_ip)
                .map(|l| l.oldest);
            let victim = match by_address {
                Some(v) => {
                    bump(&self.counters.evicted_address);
                    Some(v)
                }
                None if st.len >= self.limits.max_per_core => {
                    bump(&self.counters.evicted_core);
                    Some(st.oldest)
                }
                None => None,
            };
            let woken = victim.and_then(|v| st.remove(v, track));
            let (index, generation) = st.insert(ip, track);
            set(&self.counters.pending, st.len);
            set(&self.counters.addresses, st.per_ip.len());
            (index, generation, victim.is_some(), woken)
        };
        bump(&self.counters.admitted);
        if let Some(w) = woken {
            w.wake();
        }
        if evicted {
            self.maybe_log();
        }
        Pending {
            budget: self.clone(),
            index,
            generation,
        }
    }

    /// Pending connections now.
    pub fn len(&self) -> usize {
        self.state.borrow().len
    }

    /// Whether no connection is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Addresses with a pending connection (0 without a per-address budget).
    pub fn addresses(&self) -> usize {
        self.state.borrow().per_ip.len()
    }

    /// Evictions since start: (core budget full, address budget full).
    pub fn evicted(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.counters.evicted_core.load(Relaxed),
            self.counters.evicted_address.load(Relaxed),
        )
    }

    /// Connections that left the budget otherwise since start (request or
    /// handshake over, well-formed or not, or the client closed).
    pub fn completed(&self) -> u64 {
        self.counters
            .completed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Handshakes that timed out since start.
    pub fn timeouts(&self) -> u64 {
        self.counters
            .timed_out
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The limits in force.
    pub fn limits(&self) -> PendingLimits {
        self.limits
    }

    /// Logs what was closed since the last line, at most once per period.
    fn maybe_log(&self) {
        if !self.log.due(Instant::now()) {
            return;
        }
        let (core, address) = self.evicted();
        let timeouts = self.timeouts();
        let (c0, a0, t0) = self.logged.replace((core, address, timeouts));
        eprintln!(
            "<4>core {}: closed {} connection(s) that had not completed a request or handshake \
             to make room for newer ones ({} over listen.max_pending_per_core = {}, {} over \
             listen.max_pending_per_ip = {}) and {} that did not complete in time, since the last \
             such line ({} pending now; totals {}, {}, {}; logged at most every {} s)",
            self.core,
            (core - c0) + (address - a0),
            core - c0,
            self.limits.max_per_core,
            address - a0,
            self.limits.max_per_ip,
            timeouts - t0,
            self.len(),
            core,
            address,
            timeouts,
            self.log.period_secs(),
        );
    }
}

/// A connection's place in its core's [`PendingBudget`]; dropping it gives
/// the place back (if it was not evicted already).
pub struct Pending {
    budget: Rc<PendingBudget>,
    index: u32,
    generation: u32,
}

impl Pending {
    /// Whether this connection was closed to make room.
    pub fn is_evicted(&self) -> bool {
        self.budget.state.borrow().entries[self.index as usize].generation != self.generation
    }

    /// Runs the connection's handshake — everything up to its first
    /// complete request — until it completes, `timeout` passes, or the
    /// connection is evicted for a newer one. Completed (whatever `fut`
    /// returned, error included), the connection leaves the budget and is
    /// never evicted. Must run inside a glommio executor.
    pub async fn handshake<F: Future>(
        self,
        timeout: Duration,
        fut: F,
    ) -> Result<F::Output, PendingEnd> {
        // Dropping `self` on the way out gives the place back.
        self.within(timeout, fut).await
    }

    /// One step of a handshake of several (an HTTP upgrade request, then a
    /// protocol's first message): like [`handshake`](Self::handshake), but
    /// the connection stays pending afterwards; end with
    /// [`complete`](Self::complete) or another step.
    pub async fn within<F: Future>(
        &self,
        timeout: Duration,
        fut: F,
    ) -> Result<F::Output, PendingEnd> {
        let raced = futures_lite::future::or(async { Ok(fut.await) }, async {
            Evicted { ticket: self }.await;
            Err(PendingEnd::Evicted)
        });
        match glommio::timer::timeout(timeout, async { Ok(raced.await) }).await {
            Ok(r) => r,
            Err(_) => {
                self.release();
                bump(&self.budget.counters.timed_out);
                self.budget.maybe_log();
                Err(PendingEnd::TimedOut)
            }
        }
    }

    /// The handshake is over (well-formed or not: the caller answers it):
    /// the connection leaves the budget. The same as dropping the ticket,
    /// said where it happens.
    pub fn complete(self) {}

    /// Gives the place back if it is still ours; whether it was.
    fn release(&self) -> bool {
        let b = &self.budget;
        let mut st = b.state.borrow_mut();
        if st.entries[self.index as usize].generation != self.generation {
            return false;
        }
        // Our own waker: nothing to wake.
        drop(st.remove(self.index, b.track_ip()));
        set(&b.counters.pending, st.len);
        set(&b.counters.addresses, st.per_ip.len());
        true
    }
}

impl Drop for Pending {
    /// Not evicted, not timed out: the handshake is over one way or another
    /// (complete, malformed, or the client left), counted as completed.
    fn drop(&mut self) {
        if self.release() {
            bump(&self.budget.counters.completed);
        }
    }
}

/// Ready once the ticket's entry was given to someone else.
struct Evicted<'a> {
    ticket: &'a Pending,
}

impl Future for Evicted<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let t = self.ticket;
        let mut st = t.budget.state.borrow_mut();
        let e = &mut st.entries[t.index as usize];
        if e.generation != t.generation {
            return Poll::Ready(());
        }
        match &e.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => e.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(max_per_core: usize, max_per_ip: usize) -> Rc<PendingBudget> {
        let counters = Arc::new(PendingCounters::new(0, max_per_core, max_per_ip));
        PendingBudget::new(
            0,
            PendingLimits {
                max_per_core,
                max_per_ip,
            },
            counters,
        )
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn the_oldest_makes_room_and_release_is_exact() {
        let b = budget(3, 0);
        let p1 = b.admit(ip(1));
        let p2 = b.admit(ip(2));
        let p3 = b.admit(ip(3));
        assert_eq!(b.len(), 3);
        let p4 = b.admit(ip(4));
        assert!(p1.is_evicted(), "the oldest goes first");
        assert!(!p2.is_evicted() && !p3.is_evicted() && !p4.is_evicted());
        assert_eq!((b.len(), b.evicted()), (3, (1, 0)));
        // A released place (handshake done) is not evicted later.
        drop(p3);
        assert_eq!(b.len(), 2);
        let p5 = b.admit(ip(5));
        assert!(!p2.is_evicted(), "room was free: nobody evicted");
        let p6 = b.admit(ip(6));
        assert!(p2.is_evicted(), "p2 is now the oldest");
        assert!(!p4.is_evicted() && !p5.is_evicted() && !p6.is_evicted());
        // Dropping an evicted ticket gives back nothing twice.
        drop((p1, p2));
        assert_eq!(b.len(), 3);
        drop((p4, p5, p6));
        assert_eq!((b.len(), b.addresses()), (0, 0));
        assert_eq!(b.evicted(), (2, 0));
    }

    #[test]
    fn an_address_over_its_budget_evicts_its_own_oldest() {
        let b = budget(8, 2);
        let a1 = b.admit(ip(1));
        let other = b.admit(ip(9));
        let a2 = b.admit(IpAddr::from([0, 0, 0, 0, 0, 0xffff, 0x7f00, 1])); // mapped 127.0.0.1
        assert_eq!(b.addresses(), 2);
        let a3 = b.admit(ip(1));
        assert!(a1.is_evicted(), "the address's own oldest makes room");
        assert!(!other.is_evicted(), "another address is untouched");
        assert!(!a2.is_evicted() && !a3.is_evicted());
        assert_eq!(b.evicted(), (0, 1));
        // The address's list is intact after a removal in the middle.
        drop(a2);
        let a4 = b.admit(ip(1));
        assert!(!a3.is_evicted(), "room for two again");
        let a5 = b.admit(ip(1));
        assert!(a3.is_evicted() && !a4.is_evicted() && !a5.is_evicted());
        drop((a1, a3, a4, a5));
        assert_eq!(b.addresses(), 1, "only the other address is left");
        drop(other);
        assert_eq!((b.len(), b.addresses()), (0, 0));
    }

    #[test]
    fn many_rounds_stay_bounded() {
        // A reconnecting flood from a few addresses next to one client.
        let b = budget(16, 4);
        let mut held: Vec<Pending> = Vec::new();
        for round in 0..10_000u32 {
            held.push(b.admit(ip((round % 7) as u8)));
            held.retain(|p| !p.is_evicted());
            assert!(b.len() <= 16 && held.len() == b.len());
            if round % 5 == 0 {
                // Some complete their handshake.
                held.remove(0);
            }
        }
        let st = b.state.borrow();
        assert!(st.per_ip.values().all(|l| l.count <= 4));
        assert_eq!(st.len + st.free.len(), 16);
    }

    #[test]
    fn handshake_completes_times_out_or_is_evicted() {
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async {
                let b = budget(1, 0);
                // Completes: the place is given back.
                let p = b.admit(ip(1));
                let r = p.handshake(Duration::from_secs(5), async { 7 }).await;
                assert_eq!(r, Ok(7));
                assert_eq!(b.len(), 0);
                // Times out.
                let p = b.admit(ip(1));
                let r = p
                    .handshake(Duration::from_millis(20), std::future::pending::<()>())
                    .await;
                assert_eq!(r, Err(PendingEnd::TimedOut));
                assert_eq!((b.len(), b.timeouts()), (0, 1));
                // Evicted while waiting: a newer connection takes the place.
                let p = b.admit(ip(1));
                let waiting = glommio::spawn_local(async move {
                    p.handshake(Duration::from_secs(30), std::future::pending::<()>())
                        .await
                });
                glommio::timer::sleep(Duration::from_millis(5)).await;
                let newer = b.admit(ip(2));
                let started = Instant::now();
                assert_eq!(waiting.await, Err(PendingEnd::Evicted));
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "woken, not timed out"
                );
                assert!(!newer.is_evicted());
                assert_eq!(b.len(), 1);
                drop(newer);
                // Every connection that entered left one way.
                let (core, address) = b.evicted();
                assert_eq!((b.completed(), b.timeouts(), core, address), (2, 1, 1, 0));
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
