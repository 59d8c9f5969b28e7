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

use super::auth::{Authenticator, Verdict};
use super::call::{Call, CallState};
use super::params::{pairs_for, ParamsError};
use super::status::SipShared;
use crate::app::CoreApp;
use crate::config::sip::SipConfig;
use crate::io::log_gate::LogGate;
use crate::metrics::sip::SipCounters;
use crate::session::params::session_params;
use crate::transport::rtp::session::MediaPath;
use crate::transport::rtp::start::{self, StartError, StartRequest};
use crate::transport::rtp::state::{Registry, SessionState};
use moshid_telephony::sip::build::{self, Ids, ALLOW};
use moshid_telephony::sip::message::{self, Request};
use moshid_telephony::sip::peer::{Peer, Transport};
use moshid_telephony::sip::sdp::{self, Negotiation};
use moshid_telephony::sip::transaction::{self, Backoff, Table, Timers};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
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
            eprintln!(
                "<5>sip: refused a message from {src}: {why} (malformed so far: {}, not SIP: {}, challenged: {})",
                self.counters.malformed, self.counters.not_sip, self.counters.challenged
            );
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

    fn on_ack(&mut self, req: &Request, key: &str, src: Peer, now: Instant) {
        // The ACK of a non-2xx final answer is part of the INVITE's transaction.
        if self.txs.acked(key, now) {
            return;
        }
        let Some(tag) = req.to.tag.as_deref() else {
            return;
        };
        if let Some(call) = self.calls.get_mut(&Call::key(&req.call_id, tag)) {
            if call.peer == src && matches!(call.state, CallState::Answered { .. }) {
                call.state = CallState::Confirmed;
            }
        }
    }

    fn on_invite(
        &mut self,
        req: Request,
        uri: moshid_telephony::sip::uri::SipUri,
        key: &str,
        src: Peer,
        caller: Option<String>,
        now: Instant,
    ) {
        self.respond(&req, key, src, 100, None, &[], None, now);
        let c = cfg(&self.app).clone();
        let pairs = match pairs_for(&c, &uri) {
            Ok(p) => p,
            Err(ParamsError::UnknownUser(u)) => {
                let w = warning(&format!("no such user `{u}` in sip.users"));
                self.respond(&req, key, src, 404, None, &[w], None, now);
                return;
            }
        };
        let shared = self.app.shared.clone();
        let params = match session_params(&pairs, &shared.config.defaults, &shared.model_info) {
            Ok(p) => p,
            Err(e) => {
                let w = warning(&format!("bad session parameter: {e}"));
                self.respond(&req, key, src, 400, None, &[w], None, now);
                return;
            }
        };
        let is_sdp = req
            .msg
            .header("Content-Type")
            .is_some_and(|t| t.trim().to_ascii_lowercase().starts_with("application/sdp"));
        if req.msg.body.is_empty() || !is_sdp {
            self.counters.not_acceptable += 1;
            let (code, why) = if req.msg.body.is_empty() {
                (488, "an SDP offer in the INVITE is required")
            } else {
                (415, "the body must be application/sdp")
            };
            let extra = [warning(why), "Accept: application/sdp".to_string()];
            self.respond(&req, key, src, code, None, &extra, None, now);
            return;
        }
        let offer = match sdp::parse_offer(&req.msg.body) {
            Ok(o) => o,
            Err(e) => {
                self.counters.not_acceptable += 1;
                let w = warning(&e.to_string());
                self.respond(&req, key, src, e.status_code(), None, &[w], None, now);
                return;
            }
        };
        let choice = match sdp::negotiate(&offer, &c.codecs, c.dtmf, c.ptime_ms) {
            Negotiation::Agreed(ch) => ch,
            Negotiation::NoCodec(offered) => {
                self.counters.not_acceptable += 1;
                let w = warning(&sdp::no_codec_why(&offered, &c.codecs));
                self.respond(&req, key, src, 488, None, &[w], None, now);
                return;
            }
        };
        if self.calls.len() >= c.max_dialogs {
            self.counters.busy += 1;
            let w = warning("sip.max_dialogs calls on this core");
            self.respond(&req, key, src, 486, None, &[w], None, now);
            return;
        }
        let reached_at: Option<IpAddr> = if self.local.ip().is_unspecified() {
            uri.host
                .rsplit_once(':')
                .map_or(uri.host.as_str(), |(h, _)| h)
                .trim_matches(['[', ']'])
                .parse()
                .ok()
        } else {
            Some(self.local.ip())
        };
        let spec = choice.spec(offer.remote);
        let webhook = crate::events::webhook::default_for(&shared.config);
        let started = match start::start(
            &self.app,
            &self.rtp,
            StartRequest {
                spec,
                params,
                webhook,
                transport: "sip",
                alias: Some(req.call_id.clone()),
                reached_at,
            },
        ) {
            Ok(s) => s,
            Err(e) => {
                let (code, extra) = match &e {
                    StartError::NoCapacity(_) => {
                        self.counters.busy += 1;
                        (503, vec![format!("Retry-After: {}", c.retry_after_s)])
                    }
                    StartError::Internal(_) => (500, Vec::new()),
                };
                let mut extra = extra;
                extra.push(warning(&e.to_string()));
                self.respond(&req, key, src, code, None, &extra, None, now);
                return;
            }
        };
        started.handle.set_send_paused(!offer.direction.we_send());
        let local_tag = self.ids.tag();
        let media = SocketAddr::new(started.address, started.port);
        let sdp_id = self.ids.next_u64() >> 1;
        let answer = sdp::write_answer(&offer, &choice, media, sdp_id, 1);
        let to_value = req.msg.header("To").unwrap_or("").to_string();
        let remote_target = req
            .msg
            .header("Contact")
            .and_then(|c| message::parse_name_addr(c).ok())
            .map(|c| c.uri)
            .unwrap_or_else(|| req.from.uri.clone());
        let call = Call {
            call_id: req.call_id.clone(),
            local_tag: local_tag.clone(),
            local_party: format!("{to_value};tag={local_tag}"),
            remote_party: req.msg.header("From").unwrap_or("").to_string(),
            remote_target,
            route: req
                .msg
                .headers_named("Record-Route")
                .map(str::to_string)
                .collect(),
            peer: src,
            remote_cseq: req.cseq,
            local_cseq: 0,
            local_sip: self.local_for(src),
            outbound: None,
            ack: None,
            session: started.handle.clone(),
            media,
            offer,
            choice,
            sdp_id,
            sdp_version: 1,
            answer,
            state: CallState::Ringing {
                answer_at: now + Duration::from_millis(c.ring_ms),
                invite: Box::new(req.clone()),
                invite_tx: key.to_string(),
            },
            started: now,
        };
        let ck = Call::key(&call.call_id, &local_tag);
        if let Some(tx) = self.txs.get_mut(key) {
            tx.call = Some(ck.clone());
        }
        eprintln!(
            "<6>sip call start call_id={} session={} from={} codec={} pt={} dtmf_pt={} ptime_ms={} rtp={} remote_rtp={} caller={}",
            call.call_id,
            call.session.id,
            src,
            call.choice.codec.name(),
            call.choice.pt,
            call.choice.dtmf_pt.map_or("-".to_string(), |p| p.to_string()),
            call.choice.ptime_ms,
            media,
            call.offer.remote.map_or("-".to_string(), |r| r.to_string()),
            caller.as_deref().unwrap_or("-")
        );
        let contact = call.contact();
        self.calls.insert(ck.clone(), call);
        self.respond(&req, key, src, 180, Some(&local_tag), &[contact], None, now);
        if c.ring_ms == 0 {
            self.answer(&ck, now);
        }
    }

    /// Sends the 200 with the answer.
    fn answer(&mut self, ck: &str, now: Instant) {
        let Some(call) = self.calls.get(ck) else {
            return;
        };
        let CallState::Ringing {
            invite, invite_tx, ..
        } = &call.state
        else {
            return;
        };
        let (req, key, src, tag, sdp, contact) = (
            (**invite).clone(),
            invite_tx.clone(),
            call.peer,
            call.local_tag.clone(),
            call.answer.clone(),
            call.contact(),
        );
        let extra = [
            contact,
            format!("Allow: {ALLOW}"),
            "Supported: ".to_string(),
        ];
        let ok = self.respond(&req, &key, src, 200, Some(&tag), &extra, Some(&sdp), now);
        self.counters.calls += 1;
        if let Some(call) = self.calls.get_mut(ck) {
            call.state = CallState::Answered {
                ok,
                resend: Backoff::start(now, &self.timers),
                give_up_at: now + self.timers.timeout(),
            };
        }
    }

    /// The call a request within a dialog belongs to (by Call-ID, our tag
    /// and the peer's address).
    fn dialog_of(&self, req: &Request, src: Peer) -> Option<String> {
        let tag = req.to.tag.as_deref()?;
        let k = Call::key(&req.call_id, tag);
        let call = self.calls.get(&k)?;
        (call.peer == src).then_some(k)
    }

    fn on_bye(&mut self, req: &Request, key: &str, src: Peer, now: Instant) {
        let Some(ck) = self.dialog_of(req, src) else {
            self.respond(req, key, src, 481, None, &[], None, now);
            return;
        };
        self.respond(req, key, src, 200, None, &[], None, now);
        self.end_call(&ck, "bye_from_peer");
    }

    fn on_cancel(&mut self, req: &Request, key: &str, src: Peer, now: Instant) {
        // CANCEL matches the INVITE's transaction (same branch, method INVITE).
        let mut invite_req = req.clone();
        invite_req.method = "INVITE".into();
        let invite_key = transaction::key(&invite_req, src);
        // The key holds the source: only the INVITE's own peer may cancel
        // it (a call may have been admitted by its source or its
        // credentials, which a CANCEL, never challenged, does not bring).
        let target = self
            .txs
            .get_mut(&invite_key)
            .map(|tx| (tx.final_code, tx.call.clone()));
        match target {
            None => {
                self.respond(req, key, src, 481, None, &[], None, now);
            }
            Some((final_code, call)) => {
                self.respond(req, key, src, 200, None, &[], None, now);
                let ringing = call.and_then(|ck| match &self.calls.get(&ck)?.state {
                    CallState::Ringing { invite, .. } => {
                        let tag = self.calls[&ck].local_tag.clone();
                        Some((ck, (**invite).clone(), tag))
                    }
                    _ => None,
                });
                if let (None, Some((ck, invite, tag))) = (final_code, ringing) {
                    self.respond(&invite, &invite_key, src, 487, Some(&tag), &[], None, now);
                    self.counters.cancelled += 1;
                    self.end_call(&ck, "cancelled");
                }
            }
        }
    }

    fn on_reinvite(&mut self, req: Request, key: &str, src: Peer, now: Instant) {
        let Some(ck) = self.dialog_of(&req, src) else {
            self.respond(&req, key, src, 481, None, &[], None, now);
            return;
        };
        let call = &self.calls[&ck];
        match call.state {
            CallState::Confirmed => {}
            CallState::Answered { .. } => {
                self.respond(&req, key, src, 491, None, &[], None, now);
                return;
            }
            _ => {
                let retry = "Retry-After: 1".to_string();
                self.respond(&req, key, src, 500, None, &[retry], None, now);
                return;
            }
        }
        if req.cseq <= call.remote_cseq {
            let w = warning("CSeq not above the dialog's");
            self.respond(&req, key, src, 500, None, &[w], None, now);
            return;
        }
        let (choice, old_remote, session) = (call.choice, call.offer.remote, call.session.clone());
        // No body: the offer comes from moshid (the current one) and the
        // answer in the ACK; the media stays as it is.
        let offer = if req.msg.body.is_empty() {
            call.offer.clone()
        } else {
            match sdp::parse_offer(&req.msg.body) {
                Ok(o) => o,
                Err(e) => {
                    let w = warning(&e.to_string());
                    self.respond(&req, key, src, e.status_code(), None, &[w], None, now);
                    return;
                }
            }
        };
        // The running codec stays while the offer still has it; else the
        // first of sip.codecs the offer has, and the session switches.
        let c = cfg(&self.app).clone();
        let keeps_codec = offer.formats.iter().any(|f| f.pt == choice.pt)
            && matches!(
                sdp::negotiate(&offer, &[choice.codec.name().to_string()], c.dtmf, c.ptime_ms),
                Negotiation::Agreed(ch) if ch.pt == choice.pt
            );
        let new_choice = if keeps_codec {
            choice
        } else {
            match sdp::negotiate(&offer, &c.codecs, c.dtmf, c.ptime_ms) {
                Negotiation::Agreed(ch) => ch,
                Negotiation::NoCodec(offered) => {
                    let w = warning(&sdp::no_codec_why(&offered, &c.codecs));
                    self.respond(&req, key, src, 488, None, &[w], None, now);
                    return;
                }
            }
        };
        // c=0.0.0.0 (hold) keeps the far end's address.
        let remote = offer.remote.or(old_remote);
        let moved = remote != old_remote;
        if new_choice != choice || moved {
            let spec = new_choice.spec(remote);
            if let Err(e) = MediaPath::configured(&spec, &self.app.shared.config.rtp) {
                let w = warning(&format!("cannot set up the audio path: {e}"));
                self.respond(&req, key, src, 488, None, &[w], None, now);
                return;
            }
            session.request_media_change(spec);
        }
        let choice = new_choice;
        let call = self.calls.get_mut(&ck).expect("looked up");
        call.remote_cseq = req.cseq;
        call.session.set_send_paused(!offer.direction.we_send());
        call.sdp_version += 1;
        let mut offer = offer;
        offer.remote = remote;
        call.choice = choice;
        call.answer = sdp::write_answer(&offer, &choice, call.media, call.sdp_id, call.sdp_version);
        eprintln!(
            "<6>sip call reinvite call_id={} session={} direction={} codec={} pt={} remote_rtp={}",
            call.call_id,
            call.session.id,
            offer.direction.answer(),
            choice.codec.name(),
            choice.pt,
            offer.remote.map_or("-".to_string(), |r| r.to_string())
        );
        call.offer = offer;
        let (tag, sdp) = (call.local_tag.clone(), call.answer.clone());
        let extra = [call.contact(), format!("Allow: {ALLOW}")];
        let ok = self.respond(&req, key, src, 200, Some(&tag), &extra, Some(&sdp), now);
        let timers = self.timers;
        if let Some(call) = self.calls.get_mut(&ck) {
            call.state = CallState::Answered {
                ok,
                resend: Backoff::start(now, &timers),
                give_up_at: now + timers.timeout(),
            };
        }
    }

    /// Sends moshid's BYE for call `ck`.
    pub(super) fn hang_up(&mut self, ck: &str, now: Instant) {
        let branch = self.ids.branch();
        let Some(call) = self.calls.get_mut(ck) else {
            return;
        };
        let via = format!("{} {}", call.peer.transport.via_token(), call.local_sip);
        call.local_cseq += 1;
        let bye = build::request(
            "BYE",
            &build::InDialog {
                target: &call.remote_target,
                route: &call.route,
                local_party: &call.local_party,
                remote_party: &call.remote_party,
                call_id: &call.call_id,
                cseq: call.local_cseq,
                via: &via,
            },
            &branch,
        );
        let peer = call.peer;
        call.state = CallState::Ending {
            bye: bye.clone(),
            branch,
            resend: Backoff::start(now, &self.timers),
            give_up_at: now + self.timers.timeout(),
        };
        self.counters.byes_sent += 1;
        self.send(peer, bye);
    }

    /// Removes call `ck` and stops its RTP session.
    fn end_call(&mut self, ck: &str, why: &str) {
        if let Some(call) = self.calls.remove(ck) {
            call.session.request_stop();
            if let Some(status) = &call.outbound {
                status.finished(None, why);
                let keep = cfg(&self.app).outbound.keep_ended;
                self.sip.calls.retire(&status.id, keep);
            }
            eprintln!(
                "<6>sip call end call_id={} session={} reason={why} seconds={:.1}",
                call.call_id,
                call.session.id,
                call.started.elapsed().as_secs_f64()
            );
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
