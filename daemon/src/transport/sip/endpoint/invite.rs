//! An INVITE that creates a dialog: 100 at once; then the refusals, each
//! with its code and a `Warning` that says why — 404 (unknown user), 400
//! (bad parameters), 488 or 415 (no SDP offer, not SDP, no common codec),
//! 486 (`sip.max_dialogs`), 503 with `Retry-After` (no slot) or 500; else
//! the call's RTP session (through the RTP machinery), 180, and the 200
//! with the SDP answer after `sip.ring_ms`.
//!
//! Invariant: every refusal is counted once, and nothing is held (no slot,
//! no socket, no call) by an INVITE that was refused.

use super::{cfg, warning, Endpoint};
use crate::config::sip::SipConfig;
use crate::session::params::session_params;
use crate::transport::rtp::start::{self, StartError, StartRequest, Started};
use crate::transport::sip::call::{Call, CallState};
use crate::transport::sip::params::{pairs_for, ParamsError};
use moshid_model::streaming::SessionParams;
use moshid_telephony::sip::build::ALLOW;
use moshid_telephony::sip::message::{self, Request};
use moshid_telephony::sip::peer::Peer;
use moshid_telephony::sip::sdp::{self, Choice, Negotiation, Offer};
use moshid_telephony::sip::transaction::Backoff;
use moshid_telephony::sip::uri::SipUri;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// The response that refuses an INVITE: its code and extra headers.
struct Refusal {
    code: u16,
    extra: Vec<String>,
}

impl Refusal {
    /// A refusal whose `Warning` says `why`.
    fn because(code: u16, why: &str) -> Self {
        Refusal {
            code,
            extra: vec![warning(why)],
        }
    }
}

/// What an acceptable INVITE asks for.
struct Accepted {
    params: SessionParams,
    offer: Offer,
    choice: Choice,
}

impl Endpoint {
    /// An INVITE that creates a dialog (see the module's doc); `caller` is
    /// the digest user that authenticated it, if any.
    pub(super) fn on_invite(
        &mut self,
        req: Request,
        uri: SipUri,
        key: &str,
        src: Peer,
        caller: Option<String>,
        now: Instant,
    ) {
        self.respond(&req, key, src, 100, None, &[], None, now);
        let c = cfg(&self.app).clone();
        let started = self
            .check_invite(&req, &uri, &c)
            .and_then(|accepted| self.start_session(&req, &uri, &c, accepted));
        let (started, offer, choice) = match started {
            Ok(s) => s,
            Err(r) => {
                self.respond(&req, key, src, r.code, None, &r.extra, None, now);
                return;
            }
        };
        let call = self.new_call(&req, key, src, started, offer, choice, &c, now);
        let ck = Call::key(&call.call_id, &call.local_tag);
        if let Some(tx) = self.txs.get_mut(key) {
            tx.call = Some(ck.clone());
        }
        call.log_start(src, caller.as_deref(), false);
        let (contact, local_tag) = (call.contact(), call.local_tag.clone());
        self.calls.insert(ck.clone(), call);
        self.respond(&req, key, src, 180, Some(&local_tag), &[contact], None, now);
        if c.ring_ms == 0 {
            self.answer(&ck, now);
        }
    }

    /// Whether the INVITE can be answered: its user and parameters, its
    /// SDP offer and a codec in common, room for a dialog; every refusal
    /// counted.
    fn check_invite(
        &mut self,
        req: &Request,
        uri: &SipUri,
        c: &SipConfig,
    ) -> Result<Accepted, Refusal> {
        let pairs = pairs_for(c, uri).map_err(|ParamsError::UnknownUser(u)| {
            Refusal::because(404, &format!("no such user `{u}` in sip.users"))
        })?;
        let shared = &self.app.shared;
        let params = session_params(&pairs, &shared.config.defaults, &shared.model_info)
            .map_err(|e| Refusal::because(400, &format!("bad session parameter: {e}")))?;
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
            let extra = vec![warning(why), "Accept: application/sdp".to_string()];
            return Err(Refusal { code, extra });
        }
        let offer = sdp::parse_offer(&req.msg.body).map_err(|e| {
            self.counters.not_acceptable += 1;
            Refusal::because(e.status_code(), &e.to_string())
        })?;
        let choice = match sdp::negotiate(&offer, &c.codecs, c.dtmf, c.ptime_ms) {
            Negotiation::Agreed(ch) => ch,
            Negotiation::NoCodec(offered) => {
                self.counters.not_acceptable += 1;
                return Err(Refusal::because(
                    488,
                    &sdp::no_codec_why(&offered, &c.codecs),
                ));
            }
        };
        if self.calls.len() >= c.max_dialogs {
            self.counters.busy += 1;
            return Err(Refusal::because(486, "sip.max_dialogs calls on this core"));
        }
        Ok(Accepted {
            params,
            offer,
            choice,
        })
    }

    /// Starts the call's RTP session (socket, slot, events, task).
    fn start_session(
        &mut self,
        req: &Request,
        uri: &SipUri,
        c: &SipConfig,
        accepted: Accepted,
    ) -> Result<(Started, Offer, Choice), Refusal> {
        let Accepted {
            params,
            offer,
            choice,
        } = accepted;
        // A socket bound to every interface is reached at the address the
        // INVITE was sent to.
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
        let request = StartRequest {
            spec: choice.spec(offer.remote),
            params,
            webhook: crate::events::webhook::default_for(&self.app.shared.config),
            transport: "sip",
            alias: Some(req.call_id.clone()),
            reached_at,
        };
        match start::start(&self.app, &self.rtp, request) {
            Ok(started) => {
                started.handle.set_send_paused(!offer.direction.we_send());
                Ok((started, offer, choice))
            }
            Err(e) => {
                let (code, mut extra) = match &e {
                    StartError::NoCapacity(_) => {
                        self.counters.busy += 1;
                        (503, vec![format!("Retry-After: {}", c.retry_after_s)])
                    }
                    StartError::Internal(_) => (500, Vec::new()),
                };
                extra.push(warning(&e.to_string()));
                Err(Refusal { code, extra })
            }
        }
    }

    /// The ringing call of an accepted INVITE, with its SDP answer.
    #[allow(clippy::too_many_arguments)]
    fn new_call(
        &mut self,
        req: &Request,
        key: &str,
        src: Peer,
        started: Started,
        offer: Offer,
        choice: Choice,
        c: &SipConfig,
        now: Instant,
    ) -> Call {
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
        Call {
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
        }
    }

    /// Sends the 200 with the answer.
    pub(super) fn answer(&mut self, ck: &str, now: Instant) {
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
}
