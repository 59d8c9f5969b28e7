//! One SIP call (a dialog, RFC 3261 §12) as the endpoint keeps it: who the
//! parties are, the route back, the RTP session carrying its media, and
//! where it stands.
//!
//! A call moshid placed (`POST /v1/sip/calls`, [`super::uac`]) enters as
//! `Confirmed` once its 200 is ACKed; from there both kinds are the same.
//!
//! States: `Ringing` (180 sent, 200 due at `answer_at`: the window in which
//! a CANCEL gets 487) → `Answered` (200 sent and retransmitted, T1
//! doubling up to T2, until the ACK; 64·T1 without one ends the call with a
//! BYE) → `Confirmed` → `Ending` (moshid's BYE sent and retransmitted until
//! answered or 64·T1; over TCP sent once, RFC 3261 §17.1.2.2). A BYE
//! from the peer, a CANCEL, the end of the RTP session
//! (`session.max_session_seconds`, RTP inactivity, shutdown), or, over
//! TCP, the close of the connection the call came on (reason
//! `sip_connection_closed`: moshid opens no connections, so it could
//! neither hang up nor hear a BYE) take it out; whatever ends it, its RTP session is asked to stop.

use crate::log_record::{LogLine, Record};
use crate::transport::rtp::state::SessionHandle;
use moshid_telephony::sip::peer::{Peer, Transport};
use moshid_telephony::sip::sdp::{Choice, Offer};
use moshid_telephony::sip::transaction::Backoff;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// Where a call stands.
#[derive(Debug)]
pub enum CallState {
    /// 180 sent; the 200 goes at `answer_at` (calls moshid answers only).
    Ringing {
        /// When to answer.
        answer_at: Instant,
        /// The INVITE (answered with 200 or 487).
        invite: Box<moshid_telephony::sip::message::Request>,
        /// The key of its transaction (for CANCEL).
        invite_tx: String,
    },
    /// 200 sent, no ACK yet.
    Answered {
        /// The 200, for retransmission.
        ok: Vec<u8>,
        /// Its schedule.
        resend: Backoff,
        /// When to give up (64·T1) and hang up.
        give_up_at: Instant,
    },
    /// ACKed: media flows.
    Confirmed,
    /// moshid's BYE sent, no answer yet.
    Ending {
        /// The BYE.
        bye: Vec<u8>,
        /// Its branch (matches the answer).
        branch: String,
        /// Its schedule (timer E; not used over TCP).
        resend: Backoff,
        /// When to stop trying (timer F).
        give_up_at: Instant,
    },
}

/// One call.
pub struct Call {
    /// Call-ID.
    pub call_id: String,
    /// Our tag (To of the INVITE's responses).
    pub local_tag: String,
    /// The INVITE's To with our tag: our From in requests we send.
    pub local_party: String,
    /// The INVITE's From: our To in requests we send.
    pub remote_party: String,
    /// Where requests within the dialog go (the peer's Contact URI).
    pub remote_target: String,
    /// Record-Route of the INVITE (our route set, in order).
    pub route: Vec<String>,
    /// Where the peer's messages came from: responses and requests go
    /// there (over UDP) or over that connection (over TCP).
    pub peer: Peer,
    /// The highest CSeq seen from the peer.
    pub remote_cseq: u32,
    /// Our CSeq (requests we send).
    pub local_cseq: u32,
    /// Our SIP address in this dialog (Via, Contact).
    pub local_sip: SocketAddr,
    /// For a call moshid placed (`POST /v1/sip/calls`), its status.
    pub outbound: Option<Arc<super::status::OutboundCall>>,
    /// For a call moshid placed, the ACK of its 200 (sent again for each
    /// retransmitted 200).
    pub ack: Option<Vec<u8>>,
    /// The RTP session.
    pub session: Arc<SessionHandle>,
    /// Our RTP address (our SDP's c=/m=).
    pub media: SocketAddr,
    /// The peer's SDP (the offer it made, or the answer to moshid's offer)
    /// and what was chosen from it.
    pub offer: Offer,
    /// The chosen codec.
    pub choice: Choice,
    /// Our SDP's `o=` id (a re-INVITE's answer bumps its version).
    pub sdp_id: u64,
    /// Our SDP's version.
    pub sdp_version: u64,
    /// Our current SDP (the answer, or the offer of a call moshid placed).
    pub answer: String,
    /// Where the call stands.
    pub state: CallState,
    /// When the call began (logs).
    pub started: Instant,
}

impl Call {
    /// Our Contact header in this dialog (RFC 3263: the transport is named
    /// when it is not UDP).
    pub fn contact(&self) -> String {
        let local = self.local_sip;
        match self.peer.transport {
            Transport::Udp | Transport::UdpOut => format!("Contact: <sip:moshid@{local}>"),
            Transport::Tcp => format!("Contact: <sip:moshid@{local};transport=tcp>"),
        }
    }

    /// The call's start record: `from` is the peer's SIP address, `caller`
    /// who authenticated (an inbound call), `outbound` a call moshid placed.
    pub fn log_start(&self, from: Peer, caller: Option<&str>, outbound: bool) {
        let line = LogLine::new(Record::SipCallStart)
            .field("call_id", &self.call_id)
            .field("session", &self.session.id)
            .field("from", from)
            .field("codec", self.choice.codec.name())
            .field("pt", self.choice.pt)
            .opt("dtmf_pt", self.choice.dtmf_pt)
            .field("ptime_ms", self.choice.ptime_ms)
            .field("rtp", self.media)
            .opt("remote_rtp", self.offer.remote)
            .field("caller", caller.unwrap_or("-"));
        if outbound {
            line.field("direction", "outbound").emit();
        } else {
            line.emit();
        }
    }

    /// The dialog key: Call-ID and our tag.
    pub fn key(call_id: &str, local_tag: &str) -> String {
        format!("{call_id}|{local_tag}")
    }
}
