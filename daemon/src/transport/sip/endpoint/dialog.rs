//! Requests within a dialog: ACK, BYE, CANCEL and re-INVITE, and the ends
//! of a call — moshid's BYE ([`Endpoint::hang_up`]) and the removal of a
//! call with its RTP session.
//!
//! Invariant: a request reaches a call only by Call-ID and our tag, and
//! from that call's peer; a call removed here always stops its RTP session.

use super::{cfg, warning, Endpoint};
use crate::log_record::{LogLine, Record};
use crate::transport::rtp::media::MediaPath;
use crate::transport::sip::call::{Call, CallState};
use moshid_telephony::sip::build::{self, ALLOW};
use moshid_telephony::sip::message::Request;
use moshid_telephony::sip::peer::Peer;
use moshid_telephony::sip::sdp::{self, Choice, Negotiation, Offer};
use moshid_telephony::sip::transaction::{self, Backoff};
use std::time::Instant;

impl Endpoint {
    /// An ACK: of a non-2xx final answer (its transaction), or of a 200
    /// (the call is confirmed).
    pub(super) fn on_ack(&mut self, req: &Request, key: &str, src: Peer, now: Instant) {
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

    /// The call a request within a dialog belongs to (by Call-ID, our tag
    /// and the peer's address).
    fn dialog_of(&self, req: &Request, src: Peer) -> Option<String> {
        let tag = req.to.tag.as_deref()?;
        let k = Call::key(&req.call_id, tag);
        let call = self.calls.get(&k)?;
        (call.peer == src).then_some(k)
    }

    /// A BYE within a dialog: 200 and the call ends (481 outside one).
    pub(super) fn on_bye(&mut self, req: &Request, key: &str, src: Peer, now: Instant) {
        let Some(ck) = self.dialog_of(req, src) else {
            self.respond(req, key, src, 481, None, &[], None, now);
            return;
        };
        self.respond(req, key, src, 200, None, &[], None, now);
        self.end_call(&ck, "bye_from_peer");
    }

    /// A CANCEL: 200, and 487 to the INVITE while it rings (481 when it
    /// matches no INVITE of the same peer).
    pub(super) fn on_cancel(&mut self, req: &Request, key: &str, src: Peer, now: Instant) {
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

    /// A re-INVITE within a confirmed dialog: hold and resume, a new
    /// remote address, or a codec change (the running codec stays while
    /// the offer still has it; else the first of `sip.codecs` it has, and
    /// the RTP session switches at its next frame boundary).
    pub(super) fn on_reinvite(&mut self, req: Request, key: &str, src: Peer, now: Instant) {
        let Some(ck) = self.dialog_of(&req, src) else {
            self.respond(&req, key, src, 481, None, &[], None, now);
            return;
        };
        let (offer, choice) = match self.reinvite_offer(&req, &ck) {
            Ok(x) => x,
            Err((code, extra)) => {
                self.respond(&req, key, src, code, None, &extra, None, now);
                return;
            }
        };
        let call = self.calls.get_mut(&ck).expect("looked up");
        call.remote_cseq = req.cseq;
        call.session.set_send_paused(!offer.direction.we_send());
        call.sdp_version += 1;
        call.choice = choice;
        call.answer = sdp::write_answer(&offer, &choice, call.media, call.sdp_id, call.sdp_version);
        LogLine::new(Record::SipCallReinvite)
            .field("call_id", &call.call_id)
            .field("session", &call.session.id)
            .field("direction", offer.direction.answer())
            .field("codec", choice.codec.name())
            .field("pt", choice.pt)
            .opt("remote_rtp", offer.remote)
            .emit();
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

    /// The offer a re-INVITE of call `ck` makes (its remote address kept on
    /// hold) and the codec answered, with the media switch asked of the RTP
    /// session when either changed; or the response refusing it.
    fn reinvite_offer(
        &self,
        req: &Request,
        ck: &str,
    ) -> Result<(Offer, Choice), (u16, Vec<String>)> {
        let call = &self.calls[ck];
        match call.state {
            CallState::Confirmed => {}
            CallState::Answered { .. } => return Err((491, Vec::new())),
            _ => return Err((500, vec!["Retry-After: 1".to_string()])),
        }
        if req.cseq <= call.remote_cseq {
            return Err((500, vec![warning("CSeq not above the dialog's")]));
        }
        let (choice, old_remote, session) = (call.choice, call.offer.remote, call.session.clone());
        // No body: the offer comes from moshid (the current one) and the
        // answer in the ACK; the media stays as it is.
        let mut offer = if req.msg.body.is_empty() {
            call.offer.clone()
        } else {
            sdp::parse_offer(&req.msg.body)
                .map_err(|e| (e.status_code(), vec![warning(&e.to_string())]))?
        };
        // The running codec stays while the offer still has it; else the
        // first of sip.codecs the offer has, and the session switches.
        let c = cfg(&self.app);
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
                    return Err((488, vec![warning(&sdp::no_codec_why(&offered, &c.codecs))]))
                }
            }
        };
        // c=0.0.0.0 (hold) keeps the far end's address.
        let remote = offer.remote.or(old_remote);
        if new_choice != choice || remote != old_remote {
            let spec = new_choice.spec(remote);
            if let Err(e) = MediaPath::configured(&spec, &self.app.shared.config.rtp) {
                let w = warning(&format!("cannot set up the audio path: {e}"));
                return Err((488, vec![w]));
            }
            session.request_media_change(spec);
        }
        offer.remote = remote;
        Ok((offer, new_choice))
    }

    /// Sends moshid's BYE for call `ck`.
    pub(in crate::transport::sip) fn hang_up(&mut self, ck: &str, now: Instant) {
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
    pub(super) fn end_call(&mut self, ck: &str, why: &str) {
        if let Some(call) = self.calls.remove(ck) {
            call.session.request_stop();
            if let Some(status) = &call.outbound {
                status.finished(None, why);
                let keep = cfg(&self.app).outbound.keep_ended;
                self.sip.calls.retire(&status.id, keep);
            }
            LogLine::new(Record::SipCallEnd)
                .field("call_id", &call.call_id)
                .field("session", &call.session.id)
                .field("reason", why)
                .field(
                    "seconds",
                    format_args!("{:.1}", call.started.elapsed().as_secs_f64()),
                )
                .emit();
        }
    }
}
