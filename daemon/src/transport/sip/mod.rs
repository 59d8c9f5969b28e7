//! The SIP endpoint (RFC 3261): SIP trunks, Asterisk PJSIP, FreeSWITCH,
//! Kamailio and softphones call moshid directly; each call's media is an
//! RTP session of the RTP transport ([`crate::transport::rtp`]: symmetric
//! latching, jitter buffer, concealment, RFC 4733 DTMF, pacing), started
//! through the same code as `POST /v1/rtp/sessions`, so its session id and
//! `/v1/sessions/{id}/events` are the RTP session's.
//!
//! With `sip.enabled`, every I/O core binds `sip.address` over UDP and
//! TCP (`SO_REUSEPORT`, the same port; TCP unless
//! `sip.max_tcp_connections` is 0) and runs its own [`endpoint`]:
//! transactions and calls are per core, and a peer's datagrams, or its
//! connection, always reach the same core.
//!
//! Files: [`config`] (`sip.*` and its checks), [`message`] (SIP message
//! parsing and framing), [`uri`] (SIP URIs), [`sdp`] (offer/answer over
//! the `sdp-types` parser), [`params`] (a call's session parameters),
//! [`build`] (responses and in-dialog requests), [`transaction`] (server
//! transactions and their timers), [`call`] (a dialog), [`endpoint`] (the
//! requests' handling, whatever their transport), [`peer`] (a message's
//! source: UDP or a TCP connection), [`serve`] (a core's endpoint, its
//! timer and the sending of what it answers), [`udp`] (the socket),
//! [`tcp`] (the listener and its connections), [`framing`] (messages cut
//! out of a TCP stream); what moshid starts itself: [`uac`] (the calls it
//! places), [`register`] (its registrations), [`client_auth`] (its answers
//! to digest challenges), [`resolve`] (host names, off the core),
//! [`status`] (what the control API sees of them) and [`control`]
//! (`/v1/sip/calls`, `/v1/sip/registrations`); digest
//! authentication in [`auth`] (the verdicts), [`auth_header`] (the
//! `Authorization` header), [`digest`] (MD5 and SHA-256 responses),
//! [`nonce`] (signed nonces, the replay table) and [`quoted_string`] (the
//! one quoted-string grammar both sides read and write).
//!
//! Parsing: SDP goes through `sdp-types` (a maintained RFC 8866 parser and
//! writer). SIP itself is parsed here: the crates looked at were either
//! unmaintained (`rsip` 0.4, last released 2022, no licence in its
//! metadata) or a whole stack with its own string types and transaction
//! layer (`ezk-sip-types`), while the endpoint needs the message grammar
//! only, bounded by its own limits. The parsers are fuzzed
//! (`fuzz/fuzz_targets/sip_message.rs`, `sdp_offer.rs`,
//! `sip_auth_header.rs`, `sip_tcp_framing.rs`) and have tables of malformed cases in their tests.
//!
//! Who may call: a source in `sip.allowed_sources` (when it is set) with
//! no credentials; with `sip.auth`, any other source whose INVITE answers
//! a digest challenge (on loopback too); with neither, anyone, which is
//! accepted only on loopback. Off loopback one of the two is required at
//! start. A source neither listed nor authenticated gets 403 (no
//! `sip.auth`) or 401 (with it).

pub mod auth;
pub mod auth_header;
pub mod build;
pub mod call;
pub mod client_auth;
pub mod digest;
pub mod endpoint;
pub mod framing;
pub mod message;
pub mod nonce;
pub mod params;
pub mod peer;
pub mod quoted_string;
pub mod register;
pub mod resolve;
pub mod sdp;
pub mod serve;
pub mod status;
pub mod tcp;
pub mod transaction;
pub mod uac;
pub mod udp;
pub mod uri;

/// Checks `sip.params` and every `sip.users` entry against the model at
/// start, so that a bad parameter stops the daemon instead of failing
/// every call.
pub fn check_params(shared: &crate::io::app::Shared) -> Result<(), String> {
    let cfg = &shared.config;
    let check = |key: String, map: &std::collections::BTreeMap<String, String>| {
        let pairs: Vec<(String, String)> = cfg
            .sip
            .params
            .iter()
            .chain(map.iter())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        crate::session::params::session_params(&pairs, &cfg.defaults, &shared.model_info)
            .map(|_| ())
            .map_err(|e| format!("config key `{key}`: {e}"))
    };
    check("sip.params".into(), &Default::default())?;
    for (user, map) in &cfg.sip.users {
        check(format!("sip.users.{user}"), map)?;
    }
    Ok(())
}
