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
//! The protocol without I/O is `moshid_telephony::sip` (messages, URIs,
//! SDP offer/answer, responses and requests built, server transactions, a
//! message's source, TCP framing, digest headers, responses and signed
//! nonces); `sip.*` and its checks are [`crate::config::sip`]. Files here:
//! [`params`] (a call's session parameters), [`call`] (a dialog),
//! [`endpoint`] (the requests' handling, whatever their transport),
//! [`serve`] (a core's endpoint, its timer and the sending of what it
//! answers), [`udp`] (the socket), [`tcp`] (the listener and its
//! connections); what moshid starts itself: [`uac`] (the calls it places),
//! [`register`] (its registrations), [`client_auth`] (its answers to digest
//! challenges), [`resolve`] (host names, off the core), [`status`] (what
//! the control API, [`crate::api::sip`], sees of them); digest
//! authentication's verdicts in [`auth`].
//!
//! Who may call: a source in `sip.allowed_sources` (when it is set) with
//! no credentials; with `sip.auth`, any other source whose INVITE answers
//! a digest challenge (on loopback too); with neither, anyone, which is
//! accepted only on loopback. Off loopback one of the two is required at
//! start. A source neither listed nor authenticated gets 403 (no
//! `sip.auth`) or 401 (with it).

pub mod auth;
pub mod call;
pub mod client_auth;
pub mod endpoint;
pub mod params;
pub mod register;
pub mod resolve;
pub mod serve;
pub mod status;
pub mod tcp;
pub mod uac;
pub mod udp;

/// Checks `sip.params` and every `sip.users` entry against the model at
/// start, so that a bad parameter stops the daemon instead of failing
/// every call.
pub fn check_params(shared: &crate::app::Shared) -> Result<(), String> {
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
