//! RTP without I/O: RFC 3550 packets ([`packet`]), extended sequence
//! numbers and timestamps ([`seq`]), the jitter buffer ([`jitter`]) and its
//! loss concealment ([`conceal`]), RFC 4733 DTMF ([`dtmf`]), the outgoing
//! stream's packets ([`sender`]) and the release clock's arithmetic
//! ([`clock`]). The sessions that run them are the daemon's
//! (`moshid::transport::rtp`).

pub mod clock;
pub mod conceal;
pub mod dtmf;
pub mod jitter;
pub mod packet;
pub mod sender;
pub mod seq;

use crate::CodecSpec;
use std::net::SocketAddr;

/// What an RTP session is asked for: the control API's request, or a SIP
/// call's negotiated SDP.
#[derive(Debug, Clone, Copy)]
pub struct SessionSpec {
    /// The codec.
    pub codec: CodecSpec,
    /// Payload type of audio.
    pub payload_type: u8,
    /// Packet duration sent, in milliseconds.
    pub ptime_ms: u32,
    /// Payload type of RFC 4733 events.
    pub dtmf_payload_type: Option<u8>,
    /// Where to send, and the only IP accepted, when given.
    pub remote: Option<SocketAddr>,
}
