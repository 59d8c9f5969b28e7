//! Server transactions (RFC 3261 §17.2) of one I/O core: what makes a
//! retransmitted request get the same answer instead of a second call.
//!
//! A transaction is keyed by the topmost Via's branch and sent-by and the
//! method (ACK matches its INVITE; CANCEL has its own, RFC 3261 §17.2.3),
//! or, for an RFC 2543 peer without the magic cookie, by Call-ID, CSeq,
//! From tag and method — and, stricter than §17.2.3, by the source address
//! the request came from: the branch is no secret, so without it another
//! source could send a request with a victim's branch first and have the
//! victim's own (an unchallenged CANCEL, say) absorbed as its
//! retransmission, answered to the other source. It keeps the last
//! response it sent: a retransmitted request gets that response again. An
//! INVITE's non-2xx final response is retransmitted from T1, doubling up
//! to T2, until the ACK (timer G) or
//! 64·T1 (timer H); every other transaction is forgotten 64·T1 after its
//! final response (timers I/J; an INVITE answered 2xx stays that long too,
//! RFC 6026 "Accepted", to absorb retransmitted INVITEs). Over TCP (a
//! reliable transport, RFC 3261 §17.2.1 and §17.2.2) timer G is not
//! started (timer H still waits for the ACK), and timers I and J are 0:
//! a non-INVITE transaction, or an INVITE's acknowledged non-2xx, is
//! forgotten at the next tick. The 2xx of an INVITE is the dialog's to
//! retransmit ([`super::call`]), over TCP too (§13.3.1.4).
//!
//! Invariants: at most `sip.max_transactions` entries; each has a deadline,
//! so the table empties when traffic stops.

use super::message::Request;
use super::peer::Peer;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// RFC 3261 timers of this endpoint.
#[derive(Debug, Clone, Copy)]
pub struct Timers {
    /// T1.
    pub t1: Duration,
    /// T2.
    pub t2: Duration,
}

impl Timers {
    /// 64·T1: how long a transaction (and an unacknowledged 2xx) lives.
    pub fn timeout(&self) -> Duration {
        self.t1 * 64
    }
}

/// The key of the transaction `req`, received from `src`, belongs to.
pub fn key(req: &Request, src: Peer) -> String {
    let method = if req.method == "ACK" {
        "INVITE"
    } else {
        req.method.as_str()
    };
    if req.via.branch.starts_with("z9hG4bK") {
        format!("{}|{}|{method}|{src}", req.via.branch, req.via.sent_by)
    } else {
        format!(
            "2543|{}|{}|{}|{method}|{src}",
            req.call_id,
            req.cseq,
            req.from.tag.as_deref().unwrap_or("")
        )
    }
}

/// A retransmission schedule: T1, doubling, capped at T2.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The next send.
    pub next_at: Instant,
    /// The current interval.
    pub interval: Duration,
}

impl Backoff {
    /// Starts at `now` + T1.
    pub fn start(now: Instant, t: &Timers) -> Backoff {
        Backoff {
            next_at: now + t.t1,
            interval: t.t1,
        }
    }

    /// Whether a resend is due; if so, schedules the next one.
    pub fn due(&mut self, now: Instant, t: &Timers) -> bool {
        if now < self.next_at {
            return false;
        }
        self.interval = (self.interval * 2).min(t.t2);
        self.next_at = now + self.interval;
        true
    }

    /// [`Backoff::due`] without T2's cap: timer A of an INVITE client
    /// transaction doubles until timer B ends it (RFC 3261 §17.1.1.2).
    pub fn due_unbounded(&mut self, now: Instant) -> bool {
        if now < self.next_at {
            return false;
        }
        self.interval *= 2;
        self.next_at = now + self.interval;
        true
    }
}

/// One server transaction.
#[derive(Debug)]
pub struct ServerTx {
    /// Where its responses go.
    pub peer: Peer,
    /// The last response sent.
    pub last_response: Option<Vec<u8>>,
    /// The final status, once sent.
    pub final_code: Option<u16>,
    /// Timer G (a non-2xx final response to an INVITE, until the ACK).
    pub resend: Option<Backoff>,
    /// When the transaction is forgotten.
    pub expires_at: Instant,
    /// The call an INVITE transaction made (for CANCEL).
    pub call: Option<String>,
}

/// The core's transactions.
#[derive(Debug, Default)]
pub struct Table {
    txs: HashMap<String, ServerTx>,
}

/// What [`Table::tick`] found to resend.
pub type Resends = Vec<(Peer, Vec<u8>)>;

impl Table {
    /// Live transactions.
    pub fn len(&self) -> usize {
        self.txs.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.txs.is_empty()
    }

    /// The transaction of `key`.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut ServerTx> {
        self.txs.get_mut(key)
    }

    /// Starts a transaction; false when `max` are live.
    pub fn open(&mut self, key: String, peer: Peer, now: Instant, t: &Timers, max: usize) -> bool {
        if self.txs.len() >= max {
            return false;
        }
        self.txs.insert(
            key,
            ServerTx {
                peer,
                last_response: None,
                final_code: None,
                resend: None,
                // A transaction whose answer never comes is forgotten too.
                expires_at: now + t.timeout(),
                call: None,
            },
        );
        true
    }

    /// Records a response sent in transaction `key` (`invite`: whether it
    /// is an INVITE transaction, whose non-2xx finals are retransmitted
    /// over UDP).
    pub fn responded(
        &mut self,
        key: &str,
        bytes: &[u8],
        code: u16,
        invite: bool,
        now: Instant,
        t: &Timers,
    ) {
        let Some(tx) = self.txs.get_mut(key) else {
            return;
        };
        tx.last_response = Some(bytes.to_vec());
        if code >= 200 {
            let reliable = tx.peer.transport.is_reliable();
            tx.final_code = Some(code);
            tx.expires_at = if reliable && !invite {
                // Timer J is 0 over TCP: no retransmission to absorb.
                now
            } else {
                now + t.timeout()
            };
            if invite && code >= 300 && !reliable {
                tx.resend = Some(Backoff::start(now, t));
            }
        }
    }

    /// The ACK of a non-2xx final response: stop timer G, linger T4 (5 s)
    /// for retransmitted ACKs (timer I; 0 over TCP).
    pub fn acked(&mut self, key: &str, now: Instant) -> bool {
        match self.txs.get_mut(key) {
            Some(tx) if tx.final_code.is_some_and(|c| c >= 300) => {
                tx.resend = None;
                let linger = if tx.peer.transport.is_reliable() {
                    Duration::ZERO
                } else {
                    Duration::from_secs(5)
                };
                tx.expires_at = tx.expires_at.min(now + linger);
                true
            }
            _ => false,
        }
    }

    /// Resends what is due and forgets what expired.
    pub fn tick(&mut self, now: Instant, t: &Timers, out: &mut Resends) {
        self.txs.retain(|_, tx| {
            if now >= tx.expires_at {
                return false;
            }
            if let (Some(b), Some(r)) = (tx.resend.as_mut(), tx.last_response.as_ref()) {
                if b.due(now, t) {
                    out.push((tx.peer, r.clone()));
                }
            }
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_g_doubles_to_t2_and_h_expires() {
        let t = Timers {
            t1: Duration::from_millis(500),
            t2: Duration::from_secs(4),
        };
        let start = Instant::now();
        let mut table = Table::default();
        let peer = Peer::udp("127.0.0.1:5061".parse().unwrap());
        assert!(table.open("k".into(), peer, start, &t, 1));
        assert!(!table.open("k2".into(), peer, start, &t, 1));
        table.responded("k", b"SIP/2.0 486", 486, true, start, &t);
        let mut sends = Vec::new();
        let mut now = start;
        let mut gaps = Vec::new();
        let mut last = start;
        while now < start + Duration::from_secs(40) {
            now += Duration::from_millis(10);
            let before = sends.len();
            table.tick(now, &t, &mut sends);
            if sends.len() > before {
                gaps.push((now - last).as_millis() / 10 * 10);
                last = now;
            }
        }
        assert_eq!(&gaps[..5], &[500, 1000, 2000, 4000, 4000]);
        assert!(table.is_empty(), "timer H (32 s) forgets the transaction");
        assert!(!table.acked("k", now));
    }

    #[test]
    fn over_tcp_no_timer_g_and_timers_i_j_are_zero() {
        let t = Timers {
            t1: Duration::from_millis(500),
            t2: Duration::from_secs(4),
        };
        let start = Instant::now();
        let peer = Peer::tcp("127.0.0.1:5061".parse().unwrap());
        let mut table = Table::default();
        let mut sends = Vec::new();
        // An INVITE answered 486: not resent, kept for the ACK (timer H)...
        assert!(table.open("inv".into(), peer, start, &t, 4));
        table.responded("inv", b"SIP/2.0 486", 486, true, start, &t);
        // ...a BYE answered 200: forgotten at once (timer J = 0).
        assert!(table.open("bye".into(), peer, start, &t, 4));
        table.responded("bye", b"SIP/2.0 200", 200, false, start, &t);
        table.tick(start + Duration::from_secs(10), &t, &mut sends);
        assert!(sends.is_empty(), "no timer G over TCP");
        assert_eq!(table.len(), 1);
        assert!(table.get_mut("bye").is_none());
        // The ACK ends the INVITE's at once (timer I = 0).
        let acked_at = start + Duration::from_secs(10);
        assert!(table.acked("inv", acked_at));
        table.tick(acked_at, &t, &mut sends);
        assert!(table.is_empty());
    }
}
