//! Calls moshid places (`POST /v1/sip/calls`): the INVITE client
//! transaction (RFC 3261 §17.1.1) and the dialog its 200 makes (§12.1.2,
//! §13.2), the endpoint's outbound half.
//!
//! Placing a call reserves its RTP session first ([`start::reserve`]: the
//! socket, the model slot and the event stream, so a full server refuses
//! before anything is sent and the id answers at once), then sends the
//! INVITE with moshid's offer ([`sdp::write_offer`]) from the core's own
//! socket ([`Transport::UdpOut`]). Then:
//!
//! * no answer: the INVITE is resent from T1 doubling (timer A); after
//!   64·T1 the call fails (`timeout`, 408);
//! * 1xx: the far end rings (status `ringing`); after
//!   `sip.outbound.ring_timeout_s` moshid CANCELs (`ring_timeout`);
//! * 2xx: ACK; the answer's codec ([`sdp::accept_answer`]) starts the RTP
//!   session ([`start::launch`]) and the call becomes a [`Call`] like any
//!   answered one (BYE either way, re-INVITE, the session's end); a 200
//!   without a usable answer is ACKed and hung up (`no_codec`);
//! * 401/407: answered once with `sip.outbound.auth` ([`client_auth`]);
//! * other finals: ACKed (same branch, §17.1.1.3), the call fails with the
//!   status and its reason phrase; the ACK is resent for each
//!   retransmitted final until timer D.
//!
//! `DELETE /v1/sip/calls/{id}`, the ring timeout and shutdown CANCEL a
//! ringing call (§9.1; before any 1xx the CANCEL waits for one, as the
//! RFC asks, and timer B still ends it); a CANCEL the far end does not
//! answer with the INVITE's final ends the attempt after 64·T1.
//!
//! Invariants: every reservation is launched or abandoned exactly once
//! (its slot never leaks); every call reaches a final status exactly once
//! ([`OutboundCall::finished`]) and leaves the live table; attempts per
//! core are bounded with the dialogs (`sip.max_dialogs`).

use super::call::{Call, CallState};
use super::client_auth::{self, Challenge};
use super::endpoint::Endpoint;
use super::status::OutboundCall;
use crate::events::webhook::WebhookUrl;
use crate::log_record::{LogLine, Record};
use crate::session::record::EndReason;
use crate::transport::rtp::media::MediaPath;
use crate::transport::rtp::start::{self, Reservation, StartError, Started};
use moshid_model::streaming::SessionParams;
use moshid_telephony::sip::build::{self, InDialog, ALLOW};
use moshid_telephony::sip::message::{self, Message};
use moshid_telephony::sip::peer::Peer;
use moshid_telephony::sip::sdp::{self, Choice, Offer};
use moshid_telephony::sip::transaction::Backoff;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to place.
pub struct PlaceRequest {
    /// The Request-URI (`sip:user@host[:port]`).
    pub to: String,
    /// Where the INVITE goes (the URI's host, resolved).
    pub target: SocketAddr,
    /// The checked session parameters.
    pub params: SessionParams,
    /// Where the final record goes.
    pub webhook: Option<WebhookUrl>,
}

/// Why a call was not placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlaceError {
    /// No capacity (model slot, RTP sessions, calls): 503.
    Busy(String),
    /// A local failure: 500.
    Internal(String),
}

impl std::fmt::Display for PlaceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlaceError::Busy(s) | PlaceError::Internal(s) => f.write_str(s),
        }
    }
}

/// Where an attempt stands.
enum Phase {
    /// INVITE sent, no answer yet: timer A resends it, timer B ends it.
    Calling {
        resend: Backoff,
        give_up_at: Instant,
    },
    /// A provisional came: the far end rings.
    Proceeding,
    /// CANCEL sent; the INVITE's final answer is awaited.
    Cancelling {
        cancel: Vec<u8>,
        resend: Option<Backoff>,
        give_up_at: Instant,
        why: &'static str,
    },
    /// A final non-2xx was ACKed: the ACK again for each retransmission,
    /// until timer D.
    Completed { ack: Vec<u8>, until: Instant },
    /// A 200 without a usable answer: ACKed and BYE sent, until answered
    /// or 64·T1.
    Leaving {
        bye: Vec<u8>,
        branch: String,
        resend: Backoff,
        give_up_at: Instant,
    },
}

/// One call being placed.
pub struct Outgoing {
    status: Arc<OutboundCall>,
    reservation: Option<Reservation>,
    target: Peer,
    request_uri: String,
    local_tag: String,
    local_party: String,
    remote_party: String,
    cseq: u32,
    branch: String,
    via: String,
    local_sip: SocketAddr,
    invite: Vec<u8>,
    offer: String,
    sdp_id: u64,
    media: SocketAddr,
    challenged: bool,
    phase: Phase,
    ring_until: Instant,
    /// A CANCEL asked for before any provisional (sent on the first one).
    cancel_wanted: Option<&'static str>,
}

/// The value of header `name` of `m`, or "".
fn header<'a>(m: &'a Message, name: &str) -> &'a str {
    m.header(name).unwrap_or("")
}

impl Endpoint {
    /// Calls being placed on this core (not yet answered or given up).
    pub fn outgoing(&self) -> usize {
        self.outgoing.len()
    }

    /// Places a call: reserves its session, sends the INVITE. The call's
    /// status is in the shared `calls` table under the returned id.
    pub fn place(
        &mut self,
        req: PlaceRequest,
        now: Instant,
    ) -> Result<Arc<OutboundCall>, PlaceError> {
        let c = self.app.shared.config.sip.clone();
        if self.calls.len() + self.outgoing.len() >= c.max_dialogs {
            return Err(PlaceError::Busy(format!(
                "sip.max_dialogs ({}) calls on this core",
                c.max_dialogs
            )));
        }
        let target = Peer::udp_out(req.target);
        let local_sip = self.local_for(target);
        let call_id = format!(
            "{:016x}{:016x}@moshid",
            self.ids.next_u64(),
            self.ids.next_u64()
        );
        let reservation = start::reserve(
            &self.app,
            &self.rtp,
            req.params,
            req.webhook,
            "sip",
            Some(call_id.clone()),
            Some(local_sip.ip()),
        )
        .map_err(|e| match e {
            StartError::NoCapacity(s) => PlaceError::Busy(s),
            StartError::Internal(s) => PlaceError::Internal(s),
        })?;
        let id = reservation.id().to_string();
        let status = OutboundCall::new(
            id.clone(),
            req.to.clone(),
            call_id.clone(),
            self.app.ctx.core,
        );
        if !self.sip.calls.insert(status.clone(), c.outbound.max_calls) {
            let why = format!(
                "sip.outbound.max_calls ({}) calls placed",
                c.outbound.max_calls
            );
            reservation.abandon(&self.app, EndReason::Refused(why.clone()));
            return Err(PlaceError::Busy(why));
        }
        let media = SocketAddr::new(reservation.address, reservation.port);
        let sdp_id = self.ids.next_u64() >> 1;
        let offer = sdp::write_offer(&c.codecs, c.dtmf, c.ptime_ms, media, sdp_id);
        let local_tag = self.ids.tag();
        let from = c
            .outbound
            .from
            .clone()
            .unwrap_or_else(|| format!("sip:moshid@{local_sip}"));
        let mut o = Outgoing {
            status: status.clone(),
            reservation: Some(reservation),
            target,
            request_uri: req.to.clone(),
            local_party: format!("<{from}>;tag={local_tag}"),
            local_tag,
            remote_party: format!("<{}>", req.to),
            cseq: 1,
            branch: String::new(),
            via: format!("{} {local_sip}", target.transport.via_token()),
            local_sip,
            invite: Vec::new(),
            offer,
            sdp_id,
            media,
            challenged: false,
            phase: Phase::Proceeding,
            ring_until: now + Duration::from_secs(c.outbound.ring_timeout_s),
            cancel_wanted: None,
        };
        self.send_invite(&mut o, &call_id, None, now);
        LogLine::new(Record::SipCallPlaced)
            .field("id", &id)
            .field("call_id", &call_id)
            .field("to", &req.to)
            .field("target", req.target)
            .field("rtp", media)
            .emit();
        self.counters.placed += 1;
        self.outgoing.insert(call_id, o);
        Ok(status)
    }

    /// (Re)sends `o`'s INVITE with a fresh branch, with `auth` when given.
    fn send_invite(&mut self, o: &mut Outgoing, call_id: &str, auth: Option<String>, now: Instant) {
        o.branch = self.ids.branch();
        let mut extra = vec![
            format!("Contact: <sip:moshid@{}>", o.local_sip),
            format!("Allow: {ALLOW}"),
        ];
        extra.extend(auth);
        o.invite = build::request_with(
            "INVITE",
            &InDialog {
                target: &o.request_uri,
                route: &[],
                local_party: &o.local_party,
                remote_party: &o.remote_party,
                call_id,
                cseq: o.cseq,
                via: &o.via,
            },
            &o.branch,
            &extra,
            Some(&o.offer),
        );
        o.phase = Phase::Calling {
            resend: Backoff::start(now, &self.timers),
            give_up_at: now + self.timers.timeout(),
        };
        self.send(o.target, o.invite.clone());
    }

    /// A request outside the dialog that reuses the INVITE's Via branch
    /// (the ACK of a non-2xx, the CANCEL), to `remote_party`.
    fn same_branch(
        &self,
        o: &Outgoing,
        method: &str,
        call_id: &str,
        remote_party: &str,
    ) -> Vec<u8> {
        build::request(
            method,
            &InDialog {
                target: &o.request_uri,
                route: &[],
                local_party: &o.local_party,
                remote_party,
                call_id,
                cseq: o.cseq,
                via: &o.via,
            },
            &o.branch,
        )
    }

    /// Ends attempt `o` without an answer.
    fn fail_outgoing(&mut self, mut o: Outgoing, code: Option<u16>, why: &str) {
        self.settle_failed(&mut o, code, why);
    }

    /// Settles an attempt that will not be answered: its reservation is
    /// given back, its status made final and retired. It may stay in the
    /// table only to ACK or BYE (phases `Completed`, `Leaving`).
    fn settle_failed(&mut self, o: &mut Outgoing, code: Option<u16>, why: &str) {
        if let Some(r) = o.reservation.take() {
            r.abandon(
                &self.app,
                EndReason::Refused(format!("outbound call: {why}")),
            );
        }
        o.status.finished(code, why);
        let keep = self.app.shared.config.sip.outbound.keep_ended;
        self.sip.calls.retire(&o.status.id, keep);
        self.counters.placed_failed += 1;
        LogLine::new(Record::SipCallFailed)
            .field("id", &o.status.id)
            .field("call_id", &o.status.call_id)
            .field("to", &o.request_uri)
            .opt("status", code)
            .field("reason", why)
            .emit();
    }

    /// A response whose CSeq method is INVITE or CANCEL, from `src`.
    pub(super) fn on_client_response(&mut self, m: &Message, code: u16, src: Peer, now: Instant) {
        let call_id = header(m, "Call-ID").trim().to_string();
        let Some((cseq, method)) = m.cseq() else {
            return;
        };
        let branch = m.top_branch().unwrap_or_default();
        let Some(mut o) = self.outgoing.remove(&call_id) else {
            // A 200 retransmitted after the call was made: ACK it again.
            if method == "INVITE" && (200..300).contains(&code) {
                self.ack_again(m, src);
            }
            return;
        };
        if o.target != src || o.branch != branch || o.cseq != cseq {
            self.outgoing.insert(call_id, o);
            return;
        }
        if method == "CANCEL" {
            // The CANCEL is answered: stop resending it; the INVITE's own
            // final (487) ends the attempt.
            if let Phase::Cancelling { resend, .. } = &mut o.phase {
                *resend = None;
            }
            self.outgoing.insert(call_id, o);
            return;
        }
        match (&o.phase, code) {
            (Phase::Completed { ack, .. }, 300..) => {
                let ack = ack.clone();
                self.send(src, ack);
                self.outgoing.insert(call_id, o);
            }
            (Phase::Leaving { .. } | Phase::Completed { .. }, _) => {
                self.outgoing.insert(call_id, o);
            }
            (_, 100..=199) => {
                if code > 100 {
                    o.status.ringing();
                }
                if matches!(o.phase, Phase::Calling { .. }) {
                    o.phase = Phase::Proceeding;
                    if let Some(why) = o.cancel_wanted.take() {
                        self.cancel(&mut o, &call_id, why, now);
                    }
                }
                self.outgoing.insert(call_id, o);
            }
            (_, 200..=299) => self.on_answer(o, &call_id, m, now),
            (_, 401 | 407)
                if !o.challenged && self.app.shared.config.sip.outbound.auth.is_some() =>
            {
                let ack = self.same_branch(&o, "ACK", &call_id, header(m, "To"));
                self.send(src, ack);
                match client_auth::pick(m, code) {
                    Ok(challenge) => {
                        o.challenged = true;
                        o.cseq += 1;
                        match self.answer_challenge(challenge, "INVITE", &o.request_uri) {
                            Ok(auth) => {
                                self.send_invite(&mut o, &call_id, Some(auth), now);
                                self.outgoing.insert(call_id, o);
                            }
                            Err(why) => self.fail_outgoing(o, Some(code), &why),
                        }
                    }
                    Err(why) => self.fail_outgoing(o, Some(code), &why),
                }
            }
            (phase, _) => {
                let why = match (phase, code) {
                    (Phase::Cancelling { why, .. }, 487) => why.to_string(),
                    (_, 486 | 600) => "busy".to_string(),
                    (_, 603) => "declined".to_string(),
                    _ => m.status_text(),
                };
                let ack = self.same_branch(&o, "ACK", &call_id, header(m, "To"));
                self.send(src, ack.clone());
                // Timer D: 32 s over UDP, 0 over a reliable transport.
                let hold = if src.transport.is_reliable() {
                    Duration::ZERO
                } else {
                    self.timers.timeout() / 2
                };
                o.phase = Phase::Completed {
                    ack,
                    until: now + hold,
                };
                self.settle_failed(&mut o, Some(code), &why);
                self.outgoing.insert(call_id, o);
            }
        }
    }

    /// The `Authorization` line for `challenge`, with a fresh cnonce
    /// (`Err`: a value it cannot carry, see [`Challenge::answer`]).
    fn answer_challenge(
        &mut self,
        mut challenge: Challenge,
        method: &str,
        uri: &str,
    ) -> Result<String, String> {
        let creds = self
            .app
            .shared
            .config
            .sip
            .outbound
            .auth
            .clone()
            .expect("checked by the caller");
        let cnonce = format!("{:016x}", self.ids.next_u64());
        challenge.answer(&creds, method, uri, &cnonce)
    }

    /// Sends CANCEL for `o` (it rings) or notes that one is wanted.
    fn cancel(&mut self, o: &mut Outgoing, call_id: &str, why: &'static str, now: Instant) {
        match o.phase {
            Phase::Calling { .. } => {
                // §9.1: not before a provisional; timer B still runs.
                o.cancel_wanted.get_or_insert(why);
            }
            Phase::Proceeding => {
                let cancel = self.same_branch(o, "CANCEL", call_id, &o.remote_party.clone());
                self.send(o.target, cancel.clone());
                o.phase = Phase::Cancelling {
                    cancel,
                    resend: (!o.target.transport.is_reliable())
                        .then(|| Backoff::start(now, &self.timers)),
                    give_up_at: now + self.timers.timeout(),
                    why,
                };
            }
            _ => {}
        }
    }

    /// The ACK of a 200 for a call already made, sent again.
    fn ack_again(&mut self, m: &Message, src: Peer) {
        let call_id = header(m, "Call-ID").trim();
        let Some(tag) = message::parse_name_addr(header(m, "From"))
            .ok()
            .and_then(|f| f.tag)
        else {
            return;
        };
        if let Some(call) = self.calls.get(&Call::key(call_id, &tag)) {
            if let (Some(ack), true) = (&call.ack, call.peer == src) {
                let ack = ack.clone();
                self.counters.resent += 1;
                self.send(src, ack);
            }
        }
    }

    /// The RTP session of a placed call answered with `answer` (its SDP):
    /// the codec taken, the audio path made, the reservation launched; or
    /// the label and reason the answer cannot be used.
    fn launch_answered(
        &mut self,
        offer: &str,
        reservation: &mut Option<Reservation>,
        answer: &[u8],
    ) -> Result<(Offer, Choice, Started), (&'static str, String)> {
        let c = &self.app.shared.config.sip;
        let (theirs, choice) = sdp::accept_answer(offer, answer, &c.codecs, c.dtmf, c.ptime_ms)
            .map_err(|e| ("no_codec", e.to_string()))?;
        let spec = choice.spec(theirs.remote);
        let media = MediaPath::configured(&spec, &self.app.shared.config.rtp)
            .map_err(|e| ("internal", format!("cannot set up the audio path: {e}")))?;
        let reservation = reservation
            .take()
            .expect("an unanswered call holds its reservation");
        let started = start::launch(&self.app, &self.rtp, reservation, spec, media)
            .map_err(|e| ("busy", e.to_string()))?;
        Ok((theirs, choice, started))
    }

    /// A placed call answered unusably (ACKed already): sends `bye`, fails
    /// the call with `label` and keeps it until the BYE is answered.
    fn leave_unusable(
        &mut self,
        mut o: Outgoing,
        call_id: &str,
        (bye, branch): (Vec<u8>, String),
        label: &'static str,
        why: &str,
        now: Instant,
    ) {
        self.send(o.target, bye.clone());
        self.counters.byes_sent += 1;
        eprintln!(
            "<5>sip call placed id={} answered unusably: {why}",
            o.status.id
        );
        self.settle_failed(&mut o, Some(200), label);
        o.phase = Phase::Leaving {
            bye,
            branch,
            resend: Backoff::start(now, &self.timers),
            give_up_at: now + self.timers.timeout(),
        };
        self.outgoing.insert(call_id.to_string(), o);
    }

    /// The 200: ACK, then the call (or, without a usable answer, BYE).
    fn on_answer(&mut self, mut o: Outgoing, call_id: &str, m: &Message, now: Instant) {
        let to_value = header(m, "To").to_string();
        let remote_target = m
            .header("Contact")
            .and_then(|c| message::parse_name_addr(c).ok())
            .map(|c| c.uri)
            .unwrap_or_else(|| o.request_uri.clone());
        // §12.1.2: the route set is the Record-Route in reverse.
        let mut route: Vec<String> = m
            .headers_named("Record-Route")
            .map(str::to_string)
            .collect();
        route.reverse();
        let ack_branch = self.ids.branch();
        let dialog = InDialog {
            target: &remote_target,
            route: &route,
            local_party: &o.local_party,
            remote_party: &to_value,
            call_id,
            cseq: o.cseq,
            via: &o.via,
        };
        let ack = build::request("ACK", &dialog, &ack_branch);
        self.send(o.target, ack.clone());
        let (theirs, choice, started) =
            match self.launch_answered(&o.offer, &mut o.reservation, &m.body) {
                Ok(s) => s,
                Err((label, why)) => {
                    // ACKed; now hang up the call that cannot be used.
                    let branch = self.ids.branch();
                    let bye = build::request(
                        "BYE",
                        &InDialog {
                            cseq: o.cseq + 1,
                            ..dialog
                        },
                        &branch,
                    );
                    self.leave_unusable(o, call_id, (bye, branch), label, &why, now);
                    return;
                }
            };
        started.handle.set_send_paused(!theirs.direction.we_send());
        o.status.answered(choice.codec.name());
        self.counters.placed_answered += 1;
        let call = Call {
            call_id: call_id.to_string(),
            local_tag: o.local_tag.clone(),
            local_party: o.local_party.clone(),
            remote_party: to_value,
            remote_target,
            route,
            peer: o.target,
            local_sip: o.local_sip,
            remote_cseq: 0,
            local_cseq: o.cseq,
            outbound: Some(o.status.clone()),
            ack: Some(ack),
            session: started.handle.clone(),
            media: o.media,
            offer: theirs,
            choice,
            sdp_id: o.sdp_id,
            sdp_version: 1,
            answer: o.offer.clone(),
            state: CallState::Confirmed,
            started: now,
        };
        call.log_start(call.peer, None, true);
        let ck = Call::key(call_id, &o.local_tag);
        self.calls.insert(ck.clone(), call);
        if o.cancel_wanted.is_some() || o.status.hang_up_requested() {
            // Hung up while the answer was on its way.
            self.hang_up(&ck, now);
        }
    }

    /// Timers of the calls being placed: resends, give-ups, the ring
    /// timeout, hang-ups asked for, shutdown.
    pub(super) fn tick_outgoing(&mut self, now: Instant) {
        let keys: Vec<String> = self.outgoing.keys().cloned().collect();
        for call_id in keys {
            let Some(mut o) = self.outgoing.remove(&call_id) else {
                continue;
            };
            let shutdown = o
                .reservation
                .as_ref()
                .is_some_and(|r| r.shutdown_requested());
            if shutdown {
                // The daemon waits for every slot: give it back now, and
                // CANCEL if the far end rings (best effort).
                if matches!(o.phase, Phase::Proceeding) {
                    self.cancel(&mut o, &call_id, "shutdown", now);
                }
                self.fail_outgoing(o, None, "shutdown");
                continue;
            }
            let wanted = if o.status.hang_up_requested() {
                Some("cancelled")
            } else if now >= o.ring_until {
                Some("ring_timeout")
            } else {
                None
            };
            if let (Some(why), Phase::Calling { .. } | Phase::Proceeding) = (wanted, &o.phase) {
                self.cancel(&mut o, &call_id, why, now);
            }
            let timers = self.timers;
            let reliable = o.target.transport.is_reliable();
            match &mut o.phase {
                Phase::Calling { resend, give_up_at } => {
                    if now >= *give_up_at {
                        let why = o.cancel_wanted.unwrap_or("timeout");
                        self.fail_outgoing(o, Some(408), why);
                        continue;
                    }
                    if !reliable && resend.due_unbounded(now) {
                        self.counters.resent += 1;
                        let invite = o.invite.clone();
                        self.send(o.target, invite);
                    }
                }
                Phase::Proceeding => {}
                Phase::Cancelling {
                    cancel,
                    resend,
                    give_up_at,
                    why,
                } => {
                    if now >= *give_up_at {
                        let why = *why;
                        self.fail_outgoing(o, None, why);
                        continue;
                    }
                    if resend.as_mut().is_some_and(|r| r.due(now, &timers)) {
                        self.counters.resent += 1;
                        let cancel = cancel.clone();
                        self.send(o.target, cancel);
                    }
                }
                Phase::Completed { until, .. } => {
                    if now >= *until {
                        continue;
                    }
                }
                Phase::Leaving {
                    bye,
                    resend,
                    give_up_at,
                    ..
                } => {
                    if now >= *give_up_at {
                        continue;
                    }
                    if !reliable && resend.due(now, &timers) {
                        self.counters.resent += 1;
                        let bye = bye.clone();
                        self.send(o.target, bye);
                    }
                }
            }
            self.outgoing.insert(call_id, o);
        }
    }

    /// The answer to the BYE of a call answered unusably (any final).
    pub(super) fn on_leaving_response(&mut self, call_id: &str, branch: &str, code: u16) -> bool {
        let done = self.outgoing.get(call_id).is_some_and(|o| {
            code >= 200 && matches!(&o.phase, Phase::Leaving { branch: b, .. } if b == branch)
        });
        if done {
            self.outgoing.remove(call_id);
        }
        done
    }
}
