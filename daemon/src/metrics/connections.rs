//! Always-on connection counters: every I/O core's listeners (open
//! connections, refusals) and its budget of connections that have not
//! completed their first request (pending, evicted, timed out), exported by
//! `GET /metrics` whatever the stage-metrics switch says — they are how an
//! operator sees a flood and what the limits did about it.
//!
//! Invariants: each counter has one writer, the core's executor that owns
//! the listener or the budget (relaxed load + store, never a contended
//! read-modify-write); a scrape reads them with relaxed loads. Gauges
//! (`open`, `pending`, `addresses`) are stored after every change, so a
//! scrape sees a value that was true at some moment. Nothing is per
//! connection or per address: the counters are sized at start.

use std::sync::atomic::{AtomicU64, Ordering};

/// One writer adds one.
#[inline]
pub fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// One writer sets a gauge.
#[inline]
pub fn set(c: &AtomicU64, v: usize) {
    c.store(v as u64, Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// One listener on one core (`listener` = `http`, `audiosocket`, …).
#[derive(Debug)]
pub struct ListenerCounters {
    /// The I/O core.
    pub core: usize,
    /// Which listener.
    pub listener: &'static str,
    /// Its bound on open connections.
    pub max_open: usize,
    /// Its bound per client address (0: none).
    pub max_per_ip: usize,
    /// Open connections now.
    pub open: AtomicU64,
    /// Addresses with an open connection now (0 without a per-address bound).
    pub addresses: AtomicU64,
    /// Connections accepted and kept since start.
    pub accepted: AtomicU64,
    /// Closed at once: `max_open` reached.
    pub refused_full: AtomicU64,
    /// Closed at once: `max_per_ip` reached for the address.
    pub refused_address: AtomicU64,
    /// Closed at once: the address may not connect (`audiosocket.allowed_peers`).
    pub refused_not_allowed: AtomicU64,
    /// `accept` failed (e.g. out of file descriptors).
    pub accept_errors: AtomicU64,
}

impl ListenerCounters {
    /// Zeroed counters for one listener of one core.
    pub fn new(core: usize, listener: &'static str, max_open: usize, max_per_ip: usize) -> Self {
        ListenerCounters {
            core,
            listener,
            max_open,
            max_per_ip,
            open: AtomicU64::new(0),
            addresses: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            refused_full: AtomicU64::new(0),
            refused_address: AtomicU64::new(0),
            refused_not_allowed: AtomicU64::new(0),
            accept_errors: AtomicU64::new(0),
        }
    }

    /// Every refusal since start.
    pub fn refused(&self) -> u64 {
        get(&self.refused_full) + get(&self.refused_address) + get(&self.refused_not_allowed)
    }
}

/// One core's budget of connections that have not started yet.
#[derive(Debug)]
pub struct PendingCounters {
    /// The I/O core.
    pub core: usize,
    /// `listen.max_pending_per_core` in force.
    pub max_per_core: usize,
    /// `listen.max_pending_per_ip` in force (0: none).
    pub max_per_ip: usize,
    /// Pending connections now.
    pub pending: AtomicU64,
    /// Addresses with a pending connection now (0 without a per-address budget).
    pub addresses: AtomicU64,
    /// Connections that entered the budget since start.
    pub admitted: AtomicU64,
    /// Closed to make room: the core's budget was full.
    pub evicted_core: AtomicU64,
    /// Closed to make room: the address's budget was full.
    pub evicted_address: AtomicU64,
    /// Closed: the handshake did not complete within its deadline.
    pub timed_out: AtomicU64,
    /// Left the budget otherwise: their request or handshake was over,
    /// well-formed or not, or the client closed first. Once no connection
    /// is pending: `admitted` = `evicted_core` + `evicted_address` +
    /// `timed_out` + `completed`.
    pub completed: AtomicU64,
}

impl PendingCounters {
    /// Zeroed counters for one core's budget.
    pub fn new(core: usize, max_per_core: usize, max_per_ip: usize) -> Self {
        PendingCounters {
            core,
            max_per_core,
            max_per_ip,
            pending: AtomicU64::new(0),
            addresses: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            evicted_core: AtomicU64::new(0),
            evicted_address: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            completed: AtomicU64::new(0),
        }
    }
}

/// Describes the series [`record`] writes.
pub fn describe() {
    use ::metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        "moshid_connections_open",
        "Open connections of each listener on each I/O core"
    );
    describe_gauge!(
        "moshid_connections_max",
        "Bound on open connections of each listener per I/O core (listen.max_connections_per_core, audiosocket.max_connections_per_core)"
    );
    describe_gauge!(
        "moshid_connections_max_per_address",
        "Bound on open connections from one address per I/O core (listen.max_connections_per_ip; 0: none)"
    );
    describe_gauge!(
        "moshid_connections_addresses",
        "Client addresses with an open connection (entries of the per-address table)"
    );
    describe_counter!(
        "moshid_connections_accepted_total",
        "Connections accepted and kept"
    );
    describe_counter!(
        "moshid_connections_refused_total",
        "Connections closed at once: bound reached (reason=full, address) or address not allowed"
    );
    describe_counter!(
        "moshid_connections_accept_errors_total",
        "accept() failures (e.g. out of file descriptors)"
    );
    describe_gauge!(
        "moshid_connections_pending",
        "Connections on each I/O core that have not completed their first request or handshake"
    );
    describe_gauge!(
        "moshid_connections_pending_max",
        "listen.max_pending_per_core in force"
    );
    describe_gauge!(
        "moshid_connections_pending_max_per_address",
        "listen.max_pending_per_ip in force (0: none)"
    );
    describe_gauge!(
        "moshid_connections_pending_addresses",
        "Client addresses with a pending connection (entries of the per-address table)"
    );
    describe_counter!(
        "moshid_connections_pending_total",
        "Connections that entered the pending budget"
    );
    describe_counter!(
        "moshid_connections_evicted_total",
        "Pending connections closed to make room for a newer one (budget=core, address)"
    );
    describe_counter!(
        "moshid_connections_handshake_timeouts_total",
        "Pending connections closed because their request or handshake did not complete in time"
    );
    describe_counter!(
        "moshid_connections_completed_total",
        "Pending connections that left the budget with their request or handshake over (well-formed or not) or closed by the client"
    );
}

/// Hands every counter to the `metrics` facade (inside a scrape).
pub fn record(
    listeners: &[std::sync::Arc<ListenerCounters>],
    pending: &[std::sync::Arc<PendingCounters>],
) {
    use ::metrics::{counter, gauge};
    for l in listeners {
        let core = l.core.to_string();
        let labels = [("core", core.clone()), ("listener", l.listener.to_string())];
        gauge!("moshid_connections_open", &labels).set(get(&l.open) as f64);
        gauge!("moshid_connections_max", &labels).set(l.max_open as f64);
        gauge!("moshid_connections_max_per_address", &labels).set(l.max_per_ip as f64);
        gauge!("moshid_connections_addresses", &labels).set(get(&l.addresses) as f64);
        counter!("moshid_connections_accepted_total", &labels).absolute(get(&l.accepted));
        counter!("moshid_connections_accept_errors_total", &labels).absolute(get(&l.accept_errors));
        for (reason, c) in [
            ("full", &l.refused_full),
            ("address", &l.refused_address),
            ("not_allowed", &l.refused_not_allowed),
        ] {
            let labels = [
                ("core", core.clone()),
                ("listener", l.listener.to_string()),
                ("reason", reason.to_string()),
            ];
            counter!("moshid_connections_refused_total", &labels).absolute(get(c));
        }
    }
    for p in pending {
        let core = p.core.to_string();
        let labels = [("core", core.clone())];
        gauge!("moshid_connections_pending", &labels).set(get(&p.pending) as f64);
        gauge!("moshid_connections_pending_max", &labels).set(p.max_per_core as f64);
        gauge!("moshid_connections_pending_max_per_address", &labels).set(p.max_per_ip as f64);
        gauge!("moshid_connections_pending_addresses", &labels).set(get(&p.addresses) as f64);
        counter!("moshid_connections_pending_total", &labels).absolute(get(&p.admitted));
        counter!("moshid_connections_handshake_timeouts_total", &labels)
            .absolute(get(&p.timed_out));
        counter!("moshid_connections_completed_total", &labels).absolute(get(&p.completed));
        for (budget, c) in [("core", &p.evicted_core), ("address", &p.evicted_address)] {
            let labels = [("core", core.clone()), ("budget", budget.to_string())];
            counter!("moshid_connections_evicted_total", &labels).absolute(get(c));
        }
    }
}
