//! Always-on SIP counters: what every I/O core's SIP endpoint received,
//! answered and refused, and the calls it holds, exported by `GET /metrics`
//! whatever the stage-metrics switch says — how an operator sees a trunk
//! that retransmits, a scanner that probes, a flood of INVITEs over
//! capacity or a peer that fails its digest.
//!
//! The endpoint counts in plain integers it owns ([`SipCounters`]); its
//! timer task (every 20 ms, `serve::TICK`) copies them here with
//! [`SipPublished::publish`], so the request path carries no atomics and a
//! scrape sees values at most one tick old.
//!
//! Invariants: one writer per [`SipPublished`] (its core's timer task:
//! relaxed stores, never a contended read-modify-write); a scrape reads
//! with relaxed loads. Counters only grow (they are copies of counters that
//! only grow); gauges are true at some moment of the last tick. Sized at
//! start: one per core, nothing per call or per peer.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one core's SIP endpoint, owned by it as plain integers
/// (logged, and in `/metrics` through [`SipPublished`]: a field added here
/// needs its series in [`SERIES`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct SipCounters {
    /// Requests received (retransmissions included).
    pub requests: u64,
    /// Responses received (to moshid's BYEs).
    pub responses: u64,
    /// Datagrams that were not SIP at all (dropped).
    pub not_sip: u64,
    /// Requests answered 4xx for being malformed.
    pub malformed: u64,
    /// Retransmitted requests answered from their transaction.
    pub retransmissions: u64,
    /// Responses resent by timers (G, 2xx, BYE's E).
    pub resent: u64,
    /// Requests refused by `sip.allowed_sources`.
    pub forbidden: u64,
    /// INVITEs answered 401 (challenged: without credentials, or with
    /// wrong or stale ones).
    pub challenged: u64,
    /// INVITEs whose credentials were right.
    pub authenticated: u64,
    /// Calls answered.
    pub calls: u64,
    /// INVITEs refused for capacity (486/503).
    pub busy: u64,
    /// INVITEs refused for their SDP (488/400).
    pub not_acceptable: u64,
    /// Calls CANCELled before the answer.
    pub cancelled: u64,
    /// BYEs sent by moshid.
    pub byes_sent: u64,
    /// Calls moshid placed (INVITE sent).
    pub placed: u64,
    /// Placed calls answered.
    pub placed_answered: u64,
    /// Placed calls never answered (refused, cancelled, timed out).
    pub placed_failed: u64,
    /// REGISTERs answered 2xx.
    pub registered: u64,
    /// REGISTERs that failed (refused, timed out, unanswerable challenge).
    pub registration_failures: u64,
}

/// One Prometheus series of a [`SipCounters`] field: its name, its one
/// label (name, value) if any, and how to read it.
struct Series {
    name: &'static str,
    label: Option<(&'static str, &'static str)>,
    read: fn(&SipCounters) -> u64,
}

/// Every counter of [`SipCounters`], in the order [`SipPublished`] keeps
/// them. A field added there gets its series here.
const SERIES: [Series; 20] = [
    Series {
        name: "moshid_sip_requests_total",
        label: None,
        read: |c| c.requests,
    },
    Series {
        name: "moshid_sip_responses_total",
        label: None,
        read: |c| c.responses,
    },
    Series {
        name: "moshid_sip_dropped_total",
        label: Some(("reason", "not_sip")),
        read: |c| c.not_sip,
    },
    Series {
        name: "moshid_sip_malformed_total",
        label: None,
        read: |c| c.malformed,
    },
    Series {
        name: "moshid_sip_retransmissions_total",
        label: None,
        read: |c| c.retransmissions,
    },
    Series {
        name: "moshid_sip_resent_total",
        label: None,
        read: |c| c.resent,
    },
    Series {
        name: "moshid_sip_invites_refused_total",
        label: Some(("reason", "forbidden")),
        read: |c| c.forbidden,
    },
    Series {
        name: "moshid_sip_invites_refused_total",
        label: Some(("reason", "busy")),
        read: |c| c.busy,
    },
    Series {
        name: "moshid_sip_invites_refused_total",
        label: Some(("reason", "not_acceptable")),
        read: |c| c.not_acceptable,
    },
    Series {
        name: "moshid_sip_auth_total",
        label: Some(("result", "challenged")),
        read: |c| c.challenged,
    },
    Series {
        name: "moshid_sip_auth_total",
        label: Some(("result", "authenticated")),
        read: |c| c.authenticated,
    },
    Series {
        name: "moshid_sip_calls_total",
        label: None,
        read: |c| c.calls,
    },
    Series {
        name: "moshid_sip_calls_cancelled_total",
        label: None,
        read: |c| c.cancelled,
    },
    Series {
        name: "moshid_sip_byes_sent_total",
        label: None,
        read: |c| c.byes_sent,
    },
    Series {
        name: "moshid_sip_outbound_calls_total",
        label: Some(("result", "placed")),
        read: |c| c.placed,
    },
    Series {
        name: "moshid_sip_outbound_calls_total",
        label: Some(("result", "answered")),
        read: |c| c.placed_answered,
    },
    Series {
        name: "moshid_sip_outbound_calls_total",
        label: Some(("result", "failed")),
        read: |c| c.placed_failed,
    },
    Series {
        name: "moshid_sip_registrations_total",
        label: Some(("result", "ok")),
        read: |c| c.registered,
    },
    Series {
        name: "moshid_sip_registrations_total",
        label: Some(("result", "failed")),
        read: |c| c.registration_failures,
    },
    Series {
        name: "moshid_sip_tcp_messages_dropped_total",
        label: None,
        // Counted by the core's wire, not the endpoint: see `publish`.
        read: |_| 0,
    },
];

/// Index of the wire's own counter in [`SERIES`].
const TCP_DROPPED: usize = SERIES.len() - 1;

/// One core's SIP counters as a scrape reads them.
#[derive(Debug)]
pub struct SipPublished {
    /// The I/O core.
    pub core: usize,
    values: [AtomicU64; SERIES.len()],
    /// Calls (dialogs) alive on the core now.
    calls_now: AtomicU64,
}

impl SipPublished {
    /// Zeroed counters for core `core`.
    pub fn new(core: usize) -> Self {
        SipPublished {
            core,
            values: std::array::from_fn(|_| AtomicU64::new(0)),
            calls_now: AtomicU64::new(0),
        }
    }

    /// Copies the endpoint's counters, its live calls and the wire's count
    /// of TCP messages dropped (only the core's timer task calls this).
    pub fn publish(&self, counters: &SipCounters, calls_now: usize, tcp_dropped: u64) {
        for (i, (slot, series)) in self.values.iter().zip(SERIES.iter()).enumerate() {
            let v = if i == TCP_DROPPED {
                tcp_dropped
            } else {
                (series.read)(counters)
            };
            slot.store(v, Ordering::Relaxed);
        }
        self.calls_now.store(calls_now as u64, Ordering::Relaxed);
    }
}

/// Describes the series [`record`] writes.
pub fn describe() {
    use ::metrics::{describe_counter, describe_gauge};
    describe_counter!(
        "moshid_sip_requests_total",
        "SIP requests received on each I/O core (retransmissions included)"
    );
    describe_counter!(
        "moshid_sip_responses_total",
        "SIP responses received (to requests moshid sent)"
    );
    describe_counter!(
        "moshid_sip_dropped_total",
        "Datagrams or messages dropped unanswered (reason=not_sip: not a SIP message at all)"
    );
    describe_counter!(
        "moshid_sip_malformed_total",
        "SIP requests answered 4xx for being malformed"
    );
    describe_counter!(
        "moshid_sip_retransmissions_total",
        "Retransmitted requests answered from their transaction"
    );
    describe_counter!(
        "moshid_sip_resent_total",
        "Messages resent by moshid's timers (responses until ACK, BYE retransmissions)"
    );
    describe_counter!(
        "moshid_sip_invites_refused_total",
        "INVITEs refused: source not allowed (forbidden: 403), no capacity (busy: 486/503), no common codec or bad SDP (not_acceptable: 488/400)"
    );
    describe_counter!(
        "moshid_sip_auth_total",
        "Digest authentication: INVITEs challenged (401: none, wrong or stale credentials) and authenticated"
    );
    describe_counter!("moshid_sip_calls_total", "SIP calls answered (200 OK)");
    describe_counter!(
        "moshid_sip_calls_cancelled_total",
        "SIP calls CANCELled before the answer"
    );
    describe_counter!(
        "moshid_sip_byes_sent_total",
        "BYEs sent by moshid (max_session_seconds, the session's end, shutdown)"
    );
    describe_counter!(
        "moshid_sip_outbound_calls_total",
        "Calls moshid placed (POST /v1/sip/calls): placed (INVITE sent), answered, failed (never answered)"
    );
    describe_counter!(
        "moshid_sip_registrations_total",
        "REGISTERs to sip.registrations' registrars: ok (binding granted or refreshed), failed"
    );
    describe_counter!(
        "moshid_sip_tcp_messages_dropped_total",
        "SIP messages for a TCP connection that was gone or did not read (connection closed)"
    );
    describe_gauge!("moshid_sip_calls", "SIP calls alive on each I/O core");
}

/// Hands every core's SIP counters to the `metrics` facade (inside a scrape).
pub fn record(cores: &[std::sync::Arc<SipPublished>]) {
    use ::metrics::{counter, gauge};
    for c in cores {
        let core = c.core.to_string();
        for (slot, series) in c.values.iter().zip(SERIES.iter()) {
            let v = slot.load(Ordering::Relaxed);
            match series.label {
                None => counter!(series.name, "core" => core.clone()).absolute(v),
                Some((k, val)) => {
                    counter!(series.name, "core" => core.clone(), k => val).absolute(v)
                }
            }
        }
        gauge!("moshid_sip_calls", "core" => core.clone())
            .set(c.calls_now.load(Ordering::Relaxed) as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_copies_every_field_into_its_series() {
        let c = SipCounters {
            requests: 1,
            responses: 2,
            not_sip: 3,
            malformed: 4,
            retransmissions: 5,
            resent: 6,
            forbidden: 7,
            busy: 8,
            not_acceptable: 9,
            challenged: 10,
            authenticated: 11,
            calls: 12,
            cancelled: 13,
            byes_sent: 14,
            placed: 15,
            placed_answered: 16,
            placed_failed: 17,
            registered: 18,
            registration_failures: 19,
        };
        let p = SipPublished::new(3);
        p.publish(&c, 2, 20);
        let got: Vec<u64> = p.values.iter().map(|v| v.load(Ordering::Relaxed)).collect();
        // Each field lands in its own series: 1..=20 in order, none twice.
        assert_eq!(got, (1..=20).collect::<Vec<u64>>());
        assert_eq!(p.calls_now.load(Ordering::Relaxed), 2);
    }
}
