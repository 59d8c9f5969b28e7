//! The SIP endpoint of one I/O core: requests in, responses and requests
//! out, transactions and calls kept here (single-threaded; every I/O core
//! has its own, over its own `SO_REUSEPORT` UDP socket and TCP listener,
//! and a peer's datagrams, or its connection, always reach the same core).
//!
//! Transport-independent: a message comes with its [`Peer`] (UDP, or the
//! TCP connection it arrived on), and whatever answers it or belongs to its
//! dialog goes back to that peer the same way (RFC 3261 §18.2.2). Over TCP
//! the Via and Contact of moshid's messages say so, no timer resends a
//! request or a non-2xx response (the transport is reliable; the 2xx of an
//! INVITE is still resent until the ACK, §13.3.1.4), and a call whose
//! connection closes ends (`sip_connection_closed`).
//!
//! Per request: malformed → 400 when it can be answered, else counted and
//! dropped; a retransmission → the transaction's last response again; a
//! source not in `sip.allowed_sources` → 403 (without `sip.auth`). With
//! `sip.auth`, an INVITE that creates a dialog from a source not in
//! `sip.allowed_sources` (any source when the list is empty, loopback
//! included) must carry good digest credentials ([`super::auth`]): else
//! 401 with the challenges (a malformed `Authorization`: 400); requests
//! within a dialog ride on the dialog's INVITE, CANCEL and the ACK of a
//! non-2xx cannot be challenged (RFC 3261 §22.1), and OPTIONS (a trunk's
//! keep-alive) is answered to anyone. INVITE: 100 at once, then
//! 404 (unknown user), 400 (bad parameters or SDP), 488 (no SDP offer, no
//! common codec), 486 (`sip.max_dialogs` calls on this core), 503 with
//! `Retry-After` (no slot, or no room for a transaction), else an RTP
//! session through the RTP machinery, 180, and 200 with the SDP answer
//! (after `sip.ring_ms`). ACK, BYE, CANCEL (from the INVITE's peer: 487
//! to the INVITE), OPTIONS
//! (200 with Allow/Accept) and re-INVITE (hold and resume; the codec is
//! kept) within the dialogs; other methods get 405 (out of a dialog) or
//! 501.
//!
//! Invariants: nothing a peer sends can make the endpoint panic or touch
//! another peer's calls (a request reaches a call only by Call-ID and our
//! tag, and from that call's peer address); every table is bounded by the
//! configuration; every call ends its RTP session when it ends, and every
//! RTP session that ends ends its call (BYE).

mod dialog;
mod invite;

use super::auth::{Authenticator, Verdict};
use super::call::{Call, CallState};
use super::status::SipShared;
use crate::app::CoreApp;
use crate::config::sip::SipConfig;
use crate::io::log_gate::LogGate;
use crate::log_record::{LogLine, Record};
use crate::metrics::sip::SipCounters;
use crate::transport::rtp::state::{Registry, SessionState};
use moshid_telephony::sip::build::{self, Ids, ALLOW};
use moshid_telephony::sip::message::{self, Request};
use moshid_telephony::sip::peer::{Peer, Transport};
use moshid_telephony::sip::transaction::{self, Table, Timers};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Digest authentication on this core.
enum AuthState {
    /// No `sip.auth`.
    Off,
    /// `sip.auth` in force.
    On(Box<Authenticator>),
    /// `sip.auth` set, but the system's random source could not key the
    /// nonces: INVITEs that need credentials get 500.
    Broken,
}

/// One core's endpoint. Its outbound half (calls moshid places) is in
/// [`super::uac`], its registrations in [`super::register`].
pub struct Endpoint {
    pub(super) app: CoreApp,
    /// The RTP sessions its calls run on (every core's endpoint and the
    /// control API share the registry).
    pub(super) rtp: Arc<Registry>,
    /// The status of the calls moshid places and of its registrations, as
    /// the control API sees them.
    pub(super) sip: Arc<SipShared>,
    /// The SIP address (Via and Contact of what moshid sends).
    local: SocketAddr,
    /// The outbound socket's address.
    out_local: SocketAddr,
    pub(super) timers: Timers,
    txs: Table,
    pub(super) calls: HashMap<String, Call>,
    /// Calls being placed, by Call-ID.
    pub(super) outgoing: HashMap<String, super::uac::Outgoing>,
    /// This core's registrations (core 0 keeps them all).
    pub(super) registrations: Vec<super::register::Registration>,
    pub(super) ids: Ids,
    out: Vec<(Peer, Vec<u8>)>,
    auth: AuthState,
    /// Counters.
    pub counters: SipCounters,
    log_gate: LogGate,
}

fn cfg(app: &CoreApp) -> &SipConfig {
    &app.shared.config.sip
}

impl Endpoint {
    /// An endpoint for `local` on this core, sending what it starts from
    /// `out_local`.
    pub fn new(
        app: CoreApp,
        rtp: Arc<Registry>,
        sip: Arc<SipShared>,
        local: SocketAddr,
        out_local: SocketAddr,
    ) -> Endpoint {
        let c = cfg(&app);
        let timers = Timers {
            t1: Duration::from_millis(c.t1_ms),
            t2: Duration::from_millis(c.t2_ms),
        };
        let auth = match &c.auth {
            None => AuthState::Off,
            Some(a) => match Authenticator::new(a, Instant::now()) {
                Some(a) => AuthState::On(Box::new(a)),
                None => {
                    eprintln!("<3>sip: no random source to key digest nonces: INVITEs needing sip.auth get 500");
                    AuthState::Broken
                }
            },
        };
        let registrations = if app.ctx.core == 0 {
            super::register::Registration::all(&app, &sip, Instant::now())
        } else {
            Vec::new()
        };
        Endpoint {
            app,
            rtp,
            sip,
            local,
            out_local,
            timers,
            txs: Table::default(),
            calls: HashMap::new(),
            outgoing: HashMap::new(),
            registrations,
            ids: Ids::new(),
            out: Vec::new(),
            auth,
            counters: SipCounters::default(),
            log_gate: LogGate::new(Duration::from_secs(10)),
        }
    }

    /// Calls alive on this core.
    pub fn calls(&self) -> usize {
        self.calls.len()
    }

    /// What is to be sent, in order.
    pub fn take_out(&mut self) -> Vec<(Peer, Vec<u8>)> {
        std::mem::take(&mut self.out)
    }

    fn log_refusal(&self, src: Peer, why: &str) {
        if self.log_gate.due(Instant::now()) {
            LogLine::new(Record::SipRequestRefused)
                .field("from", src)
                .quoted("reason", why)
                .field("malformed", self.counters.malformed)
                .field("not_sip", self.counters.not_sip)
                .field("challenged", self.counters.challenged)
                .emit();
        }
    }

    /// Handles one message from `src`: a UDP datagram, or a message a TCP
    /// connection's [`moshid_telephony::sip::framing::Framer`] cut out.
    pub fn on_message(&mut self, data: &[u8], src: Peer, now: Instant) {
        match message::parse_request(data) {
            Ok(Some(req)) => {
                self.counters.requests += 1;
                self.on_request(req, src, now);
            }
            Ok(None) => {
                if let Ok(m) = message::parse(data) {
                    if let message::StartLine::Response { code, .. } = m.start {
                        self.counters.responses += 1;
                        self.on_response(&m, code, src, now);
                    }
                }
            }
            Err(refused) => {
                self.counters.not_sip += 1;
                self.log_refusal(src, &refused.why);
            }
        }
    }

    /// A TCP message the stream could not carry on from (no or a bad
    /// `Content-Length`: 400; over `sip.max_message_bytes`: 513): the
    /// answer to `head`, when it is a request whose core headers can be
    /// read, for the connection to send before it closes. Stateless: the
    /// connection goes, and so would any transaction.
    pub fn stream_fault(
        &mut self,
        head: &[u8],
        src: Peer,
        code: u16,
        why: &str,
    ) -> Option<Vec<u8>> {
        self.counters.malformed += 1;
        self.log_refusal(src, why);
        let head = moshid_telephony::sip::framing::without_content_length(head);
        let req = message::parse_request(&head).ok().flatten()?;
        if req.method == "ACK" {
            return None;
        }
        Some(build::response(&req, code, None, &[warning(why)], None))
    }

    /// Whether a call's dialog runs over `peer` (a TCP connection with a
    /// call is never closed for idleness: RTP carries the call, SIP may be
    /// silent for its whole length).
    pub fn has_calls_over(&self, peer: Peer) -> bool {
        self.calls.values().any(|c| c.peer == peer)
    }

    /// The TCP connection `peer` closed: its calls end (reason
    /// `sip_connection_closed`), as moshid opens no connections of its own
    /// and so could neither send their BYE nor hear one (RFC 3261 §18.2.2
    /// would have moshid connect to the Via's sent-by; see docs/sip.md,
    /// "Not done").
    pub fn on_connection_closed(&mut self, peer: Peer) {
        let gone: Vec<String> = self
            .calls
            .iter()
            .filter(|(_, c)| c.peer == peer)
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.end_call(&k, "sip_connection_closed");
        }
    }

    pub(super) fn send(&mut self, to: Peer, bytes: Vec<u8>) {
        self.out.push((to, bytes));
    }

    /// Our SIP address towards `peer` (Via, Contact): the socket's own, or,
    /// bound to every interface, the address the system routes `peer`
    /// from (control plane only: a lookup per dialog, not per packet).
    pub(super) fn local_for(&self, peer: Peer) -> SocketAddr {
        let local = match peer.transport {
            Transport::UdpOut => self.out_local,
            Transport::Udp | Transport::Tcp => self.local,
        };
        if !local.ip().is_unspecified() {
            return local;
        }
        let routed = std::net::UdpSocket::bind(SocketAddr::new(local.ip(), 0))
            .and_then(|s| {
                s.connect(peer.addr)?;
                s.local_addr()
            })
            .map(|a| a.ip());
        SocketAddr::new(routed.unwrap_or(local.ip()), local.port())
    }

    /// Answers `req` in its transaction.
    #[allow(clippy::too_many_arguments)]
    fn respond(
        &mut self,
        req: &Request,
        key: &str,
        src: Peer,
        code: u16,
        to_tag: Option<&str>,
        extra: &[String],
        sdp: Option<&str>,
        now: Instant,
    ) -> Vec<u8> {
        let bytes = build::response(req, code, to_tag, extra, sdp);
        self.txs
            .responded(key, &bytes, code, req.method == "INVITE", now, &self.timers);
        self.send(src, bytes.clone());
        bytes
    }

    fn on_request(&mut self, req: Request, src: Peer, now: Instant) {
        let key = transaction::key(&req, src);
        if req.method == "ACK" {
            self.on_ack(&req, &key, src, now);
            return;
        }
        // A retransmission: the same answer again.
        if let Some(tx) = self.txs.get_mut(&key) {
            self.counters.retransmissions += 1;
            if let Some(r) = tx.last_response.clone() {
                let peer = tx.peer;
                self.send(peer, r);
            }
            return;
        }
        let max = cfg(&self.app).max_transactions;
        if !self.txs.open(key.clone(), src, now, &self.timers, max) {
            // No room to remember an answer: answer statelessly, try later.
            self.counters.busy += 1;
            let retry = format!("Retry-After: {}", cfg(&self.app).retry_after_s);
            let bytes = build::response(&req, 503, None, &[retry], None);
            self.send(src, bytes);
            return;
        }
        let allowed = &cfg(&self.app).allowed_sources;
        let listed = !allowed.is_empty()
            && crate::transport::audiosocket::peer_allowed(allowed, src.addr.ip());
        // Without sip.auth, the list is the only way in; with it, the
        // others may authenticate.
        if !allowed.is_empty() && !listed && matches!(self.auth, AuthState::Off) {
            self.counters.forbidden += 1;
            self.log_refusal(src, "not in sip.allowed_sources");
            self.respond(&req, &key, src, 403, None, &[], None, now);
            return;
        }
        let uri = match req.check() {
            Ok(u) => u,
            Err((code, why)) => {
                self.counters.malformed += 1;
                let warning = warning(&why);
                self.respond(&req, &key, src, code, None, &[warning], None, now);
                return;
            }
        };
        let in_dialog = req.to.tag.is_some();
        let mut caller = None;
        if req.method == "INVITE" && !in_dialog && !listed {
            match self.authenticate(&req, &key, src, now) {
                Some(c) => caller = c,
                None => return,
            }
        }
        if let Some(req_ext) = req.msg.header("Require") {
            // moshid supports no extension that a caller may require.
            let unsupported = format!("Unsupported: {req_ext}");
            if req.method != "CANCEL" {
                self.respond(&req, &key, src, 420, None, &[unsupported], None, now);
                return;
            }
        }
        match req.method.as_str() {
            "INVITE" if in_dialog => self.on_reinvite(req, &key, src, now),
            "INVITE" => self.on_invite(req, uri, &key, src, caller, now),
            "BYE" => self.on_bye(&req, &key, src, now),
            "CANCEL" => self.on_cancel(&req, &key, src, now),
            "OPTIONS" => {
                let extra = [
                    format!("Allow: {ALLOW}"),
                    "Accept: application/sdp".to_string(),
                    "Supported: ".to_string(),
                ];
                let tag = req.to.tag.is_none().then(|| self.ids.tag());
                self.respond(&req, &key, src, 200, tag.as_deref(), &extra, None, now);
            }
            _ => {
                let code = if in_dialog { 501 } else { 405 };
                let allow = format!("Allow: {ALLOW}");
                self.respond(&req, &key, src, code, None, &[allow], None, now);
            }
        }
    }

    /// Checks the credentials of a dialog-creating INVITE: `Some(caller)`
    /// to go on (`Some(None)` without `sip.auth`), `None` when it was
    /// answered (401, 400 or 500).
    fn authenticate(
        &mut self,
        req: &Request,
        key: &str,
        src: Peer,
        now: Instant,
    ) -> Option<Option<String>> {
        let verdict = match &mut self.auth {
            AuthState::Off => return Some(None),
            AuthState::Broken => {
                let w = warning("digest authentication is unavailable (no random source)");
                self.respond(req, key, src, 500, None, &[w], None, now);
                return None;
            }
            AuthState::On(a) => a.verify(req, now),
        };
        match verdict {
            Verdict::Caller(user) => {
                self.counters.authenticated += 1;
                Some(Some(user))
            }
            Verdict::Challenge { stale, why } => {
                self.counters.challenged += 1;
                let mut extra = match &mut self.auth {
                    AuthState::On(a) => a.challenge(stale, now),
                    _ => Vec::new(),
                };
                // A first INVITE without credentials is the normal start of
                // an authenticated call, not a refusal worth a log line.
                if req.msg.header("Authorization").is_some() {
                    self.log_refusal(src, &format!("digest authentication: {why}"));
                    extra.push(warning(&why));
                }
                let tag = self.ids.tag();
                self.respond(req, key, src, 401, Some(&tag), &extra, None, now);
                None
            }
            Verdict::Malformed(why) => {
                self.counters.malformed += 1;
                self.log_refusal(src, &why);
                let w = warning(&why);
                self.respond(req, key, src, 400, None, &[w], None, now);
                None
            }
        }
    }

    fn on_response(&mut self, m: &message::Message, code: u16, src: Peer, now: Instant) {
        match m.cseq().map_or("", |(_, method)| method) {
            "INVITE" | "CANCEL" => return self.on_client_response(m, code, src, now),
            "REGISTER" => return self.on_register_response(m, code, src, now),
            _ => {}
        }
        if code < 200 {
            return;
        }
        let Some(branch) = m.top_branch() else {
            return;
        };
        let done: Vec<String> = self
            .calls
            .iter()
            .filter(|(_, c)| {
                c.peer == src
                    && matches!(&c.state, CallState::Ending { branch: b, .. } if *b == branch)
            })
            .map(|(k, _)| k.clone())
            .collect();
        if done.is_empty() {
            let call_id = m.header("Call-ID").unwrap_or("").trim();
            self.on_leaving_response(call_id, &branch, code);
        }
        for k in done {
            self.end_call(&k, "bye_answered");
        }
    }

    /// Timers: answers due, retransmissions, give-ups, and calls whose RTP
    /// session ended.
    pub fn tick(&mut self, now: Instant) {
        let mut resends = Vec::new();
        self.txs.tick(now, &self.timers, &mut resends);
        self.counters.resent += resends.len() as u64;
        self.out.extend(resends);
        let timers = self.timers;
        let mut answer = Vec::new();
        let mut hang_up = Vec::new();
        let mut gone = Vec::new();
        for (k, call) in self.calls.iter_mut() {
            let ended = call.session.state() == SessionState::Ended;
            match &mut call.state {
                CallState::Ringing { answer_at, .. } => {
                    if ended {
                        gone.push((k.clone(), "session_ended_ringing"));
                    } else if now >= *answer_at {
                        answer.push(k.clone());
                    }
                }
                CallState::Answered {
                    ok,
                    resend,
                    give_up_at,
                } => {
                    if ended || now >= *give_up_at {
                        hang_up.push(k.clone());
                    } else if resend.due(now, &timers) {
                        self.counters.resent += 1;
                        self.out.push((call.peer, ok.clone()));
                    }
                }
                CallState::Confirmed => {
                    let asked = call
                        .outbound
                        .as_ref()
                        .is_some_and(|s| s.hang_up_requested());
                    if ended || asked {
                        hang_up.push(k.clone());
                    }
                }
                CallState::Ending {
                    bye,
                    resend,
                    give_up_at,
                    ..
                } => {
                    if now >= *give_up_at {
                        gone.push((k.clone(), "bye_unanswered"));
                    } else if !call.peer.transport.is_reliable() && resend.due(now, &timers) {
                        self.counters.resent += 1;
                        self.out.push((call.peer, bye.clone()));
                    }
                }
            }
        }
        self.tick_outgoing(now);
        self.tick_registrations(now);
        for k in answer {
            self.answer(&k, now);
        }
        for k in hang_up {
            self.hang_up(&k, now);
        }
        for (k, why) in gone {
            if why == "session_ended_ringing" {
                if let Some(call) = self.calls.get(&k) {
                    if let CallState::Ringing {
                        invite, invite_tx, ..
                    } = &call.state
                    {
                        let (invite, key, peer, tag) = (
                            (**invite).clone(),
                            invite_tx.clone(),
                            call.peer,
                            call.local_tag.clone(),
                        );
                        self.respond(&invite, &key, peer, 480, Some(&tag), &[], None, now);
                    }
                }
            }
            self.end_call(&k, why);
        }
    }
}

/// A `Warning` header (RFC 3261 §20.43, code 399: miscellaneous) with `why`.
fn warning(why: &str) -> String {
    let text: String = why
        .chars()
        .filter(|c| *c != '"' && *c != '\\' && !c.is_control())
        .take(200)
        .collect();
    format!("Warning: 399 moshid \"{text}\"")
}
