//! One SIP call (a dialog, RFC 3261 §12) as the endpoint keeps it: who the
//! parties are, the route back, the RTP session carrying its media, and
//! where it stands.
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

use super::peer::Peer;
use super::sdp::{Choice, Offer};
use super::transaction::Backoff;
use crate::transport::rtp::state::SessionHandle;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// Where a call stands.
#[derive(Debug)]
pub enum CallState {
    /// 180 sent; the 200 goes at `answer_at`.
    Ringing {
        /// When to answer.
        answer_at: Instant,
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
    /// The key of the INVITE transaction that made the call (for CANCEL).
    pub invite_tx: String,
    /// The INVITE (answered with 200 or 487).
    pub invite: super::message::Request,
    /// The RTP session.
    pub session: Arc<SessionHandle>,
    /// Our RTP address (the answer's c=/m=).
    pub media: SocketAddr,
    /// The offer and what was chosen from it.
    pub offer: Offer,
    /// The chosen codec.
    pub choice: Choice,
    /// The answer's `o=` id and version (a re-INVITE's answer bumps it).
    pub sdp_id: u64,
    /// The answer's version.
    pub sdp_version: u64,
    /// The current answer.
    pub answer: String,
    /// Where the call stands.
    pub state: CallState,
    /// When the call began (logs).
    pub started: Instant,
}

impl Call {
    /// The dialog key: Call-ID and our tag.
    pub fn key(call_id: &str, local_tag: &str) -> String {
        format!("{call_id}|{local_tag}")
    }
}
