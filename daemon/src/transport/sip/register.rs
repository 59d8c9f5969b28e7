//! Registrations (RFC 3261 §10): moshid keeps a binding at each registrar
//! of `sip.registrations`, so that a PBX routes an extension to it — the
//! REGISTER's Contact is moshid's listening address (`sip.address`) with
//! the address of record's user, so the PBX's INVITEs name that user and
//! pick its session parameters from `sip.users`.
//!
//! Core 0 keeps every registration. Each sends REGISTER (Call-ID kept,
//! CSeq counting up, §10.2.4) from the core's outbound socket, answers a
//! 401/407 once per REGISTER with its credentials ([`super::client_auth`];
//! the challenge is kept, so refreshes carry credentials at once), honours
//! `423 Interval Too Brief` (`Min-Expires`), and refreshes at half the
//! granted lifetime (at least a second before it runs out). A failure
//! (final error, no answer within 64·T1, a challenge it cannot answer)
//! waits `retry_s` and starts again. A registrar named by host name is
//! looked up before each REGISTER (off the core: [`super::resolve`]).
//!
//! Invariants: at most one REGISTER of a registration is in flight; every
//! outcome is in its [`RegistrationStatus`] and the counters; nothing here
//! can end or touch a call.

use super::client_auth::{self, Challenge};
use super::endpoint::Endpoint;
use super::status::{RegistrationStatus, SipShared};
use crate::app::CoreApp;
use crate::config::sip::SipRegistrationConfig;
use crate::log_record::{LogLine, Record};
use moshid_telephony::sip::build::{self, InDialog};
use moshid_telephony::sip::message::Message;
use moshid_telephony::sip::peer::Peer;
use moshid_telephony::sip::transaction::Backoff;
use moshid_telephony::sip::uri::SipUri;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a registration stands.
enum Phase {
    /// Waiting until `at` (the next REGISTER: first, refresh or retry).
    Idle { at: Instant },
    /// The registrar's host name is being looked up.
    Resolving,
    /// REGISTER sent.
    Sent {
        bytes: Vec<u8>,
        branch: String,
        resend: Backoff,
        give_up_at: Instant,
        expires_s: u32,
    },
}

/// One registration.
pub struct Registration {
    cfg: SipRegistrationConfig,
    status: Arc<RegistrationStatus>,
    /// `(host, port)` of the registrar.
    host: (String, u16),
    /// The registrar's address, once known.
    target: Option<SocketAddr>,
    call_id: String,
    local_tag: String,
    cseq: u32,
    challenge: Option<Challenge>,
    /// Whether the REGISTER in flight already answered a fresh challenge.
    answered_challenge: bool,
    /// The lifetime asked for (raised by a 423).
    expires_s: u32,
    /// The registrar's name was looked up for the next REGISTER.
    looked_up: bool,
    phase: Phase,
}

/// Splits `host[:port]` (IPv6 in brackets) into host and port (5060).
pub fn host_port(hostport: &str) -> Option<(String, u16)> {
    if let Some(rest) = hostport.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => 5060,
            None => return None,
        };
        return Some((h.to_string(), port));
    }
    match hostport.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((hostport.to_string(), 5060)),
    }
}

impl Registration {
    /// One per `sip.registrations` entry, each due at `now` (the config
    /// was checked at start, so every URI reads).
    pub fn all(app: &CoreApp, sip: &SipShared, now: Instant) -> Vec<Registration> {
        let mut ids = moshid_telephony::sip::build::Ids::new();
        app.shared
            .config
            .sip
            .registrations
            .iter()
            .zip(&sip.registrations)
            .filter_map(|(cfg, status)| {
                let uri = SipUri::parse(&cfg.registrar).ok()?;
                let host = host_port(&uri.host)?;
                Some(Registration {
                    target: host.0.parse().ok().map(|ip| SocketAddr::new(ip, host.1)),
                    host,
                    call_id: format!("{:016x}@moshid", ids.next_u64()),
                    local_tag: ids.tag(),
                    cseq: 0,
                    challenge: None,
                    answered_challenge: false,
                    expires_s: cfg.expires_s,
                    looked_up: false,
                    cfg: cfg.clone(),
                    status: status.clone(),
                    phase: Phase::Idle { at: now },
                })
            })
            .collect()
    }
}

impl Endpoint {
    /// Registrars whose host name must be looked up now:
    /// `(index, host, port)`; each is [`Endpoint::resolved`] later.
    pub fn take_lookups(&mut self) -> Vec<(usize, String, u16)> {
        let now = Instant::now();
        let mut out = Vec::new();
        for (i, r) in self.registrations.iter_mut().enumerate() {
            let due = matches!(r.phase, Phase::Idle { at } if now >= at);
            if due && !r.looked_up && r.host.0.parse::<std::net::IpAddr>().is_err() {
                r.phase = Phase::Resolving;
                out.push((i, r.host.0.clone(), r.host.1));
            }
        }
        out
    }

    /// The look-up of registration `i`'s registrar ended.
    pub fn resolved(&mut self, i: usize, result: Result<SocketAddr, String>, now: Instant) {
        let Some(r) = self.registrations.get_mut(i) else {
            return;
        };
        if !matches!(r.phase, Phase::Resolving) {
            return;
        }
        match result {
            Ok(a) => {
                r.target = Some(a);
                r.looked_up = true;
                r.phase = Phase::Idle { at: now };
            }
            Err(why) => {
                let retry = Duration::from_secs(r.cfg.retry_s.into());
                r.phase = Phase::Idle { at: now + retry };
                r.status.failed(None, &why);
                self.counters.registration_failures += 1;
                LogLine::new(Record::SipRegisterFailed)
                    .field("registrar", &r.cfg.registrar)
                    .field("aor", &r.cfg.aor)
                    .field("reason", &why)
                    .emit();
            }
        }
    }

    /// Sends registration `i`'s REGISTER (credentials when a challenge is
    /// kept).
    fn send_register(&mut self, i: usize, now: Instant) {
        let Some(target) = self.registrations[i].target else {
            return;
        };
        let peer = Peer::udp_out(target);
        let via_local = self.local_for(peer);
        let contact_local = self.local_for(Peer::udp(target));
        let branch = self.ids.branch();
        let cnonce = format!("{:016x}", self.ids.next_u64());
        let timers = self.timers;
        let r = &mut self.registrations[i];
        r.cseq += 1;
        r.looked_up = false;
        let user = SipUri::parse(&r.cfg.aor)
            .ok()
            .and_then(|u| u.user)
            .unwrap_or_else(|| "moshid".into());
        let mut extra = vec![
            format!("Contact: <sip:{user}@{contact_local}>"),
            format!("Expires: {}", r.expires_s),
        ];
        if let (Some(c), Some(creds)) = (&mut r.challenge, &r.cfg.auth) {
            match c.answer(creds, "REGISTER", &r.cfg.registrar, &cnonce) {
                Ok(line) => extra.push(line),
                Err(why) => {
                    // Not answerable: forget the challenge; the retry asks
                    // for a fresh one.
                    r.challenge = None;
                    self.registration_failed(i, None, &why, now);
                    return;
                }
            }
        }
        let from = format!("<{}>;tag={}", r.cfg.aor, r.local_tag);
        let to = format!("<{}>", r.cfg.aor);
        let via = format!("{} {via_local}", peer.transport.via_token());
        let bytes = build::request_with(
            "REGISTER",
            &InDialog {
                target: &r.cfg.registrar,
                route: &[],
                local_party: &from,
                remote_party: &to,
                call_id: &r.call_id,
                cseq: r.cseq,
                via: &via,
            },
            &branch,
            &extra,
            None,
        );
        r.phase = Phase::Sent {
            bytes: bytes.clone(),
            branch,
            resend: Backoff::start(now, &timers),
            give_up_at: now + timers.timeout(),
            expires_s: r.expires_s,
        };
        self.send(peer, bytes);
    }

    /// Registration `i` failed: retry after `retry_s`.
    fn registration_failed(&mut self, i: usize, code: Option<u16>, why: &str, now: Instant) {
        let r = &mut self.registrations[i];
        r.phase = Phase::Idle {
            at: now + Duration::from_secs(r.cfg.retry_s.into()),
        };
        r.answered_challenge = false;
        r.status.failed(code, why);
        self.counters.registration_failures += 1;
        LogLine::new(Record::SipRegisterFailed)
            .field("registrar", &r.cfg.registrar)
            .field("aor", &r.cfg.aor)
            .opt("status", code)
            .field("reason", why)
            .emit();
    }

    /// A response to a REGISTER.
    pub(super) fn on_register_response(&mut self, m: &Message, code: u16, src: Peer, now: Instant) {
        let branch = m.top_branch().unwrap_or_default();
        let Some(i) = self.registrations.iter().position(|r| {
            r.target.map(Peer::udp_out) == Some(src)
                && matches!(&r.phase, Phase::Sent { branch: b, .. } if *b == branch)
        }) else {
            return;
        };
        if code < 200 {
            return;
        }
        let Phase::Sent { expires_s, .. } = self.registrations[i].phase else {
            return;
        };
        match code {
            200..=299 => {
                let granted = granted_expires(m, expires_s);
                let r = &mut self.registrations[i];
                r.answered_challenge = false;
                // Refresh at half the lifetime, at least a second early.
                let refresh = (granted / 2).min(granted.saturating_sub(1)).max(1);
                r.phase = Phase::Idle {
                    at: now + Duration::from_secs(refresh.into()),
                };
                let first = r.status.state() != super::status::RegistrationPhase::Registered;
                r.status.registered(granted);
                self.counters.registered += 1;
                if first {
                    LogLine::new(Record::SipRegistered)
                        .field("registrar", &r.cfg.registrar)
                        .field("aor", &r.cfg.aor)
                        .field("expires_s", granted)
                        .emit();
                }
            }
            401 | 407 => {
                let r = &mut self.registrations[i];
                if r.cfg.auth.is_none() || r.answered_challenge {
                    let why = if r.cfg.auth.is_none() {
                        "challenged, and the registration has no auth"
                    } else {
                        "credentials refused"
                    };
                    self.registration_failed(i, Some(code), why, now);
                    return;
                }
                match client_auth::pick(m, code) {
                    Ok(c) => {
                        r.challenge = Some(c);
                        r.answered_challenge = true;
                        self.send_register(i, now);
                    }
                    Err(why) => self.registration_failed(i, Some(code), &why, now),
                }
            }
            423 => {
                let min = m
                    .header("Min-Expires")
                    .and_then(|v| v.trim().parse::<u32>().ok())
                    .filter(|v| *v > expires_s && *v <= 86_400);
                match min {
                    Some(min) => {
                        self.registrations[i].expires_s = min;
                        self.send_register(i, now);
                    }
                    None => self.registration_failed(
                        i,
                        Some(code),
                        "423 without a usable Min-Expires",
                        now,
                    ),
                }
            }
            _ => {
                self.registration_failed(i, Some(code), &m.status_text(), now);
            }
        }
    }

    /// Registrations' timers: REGISTERs due, resends, give-ups.
    pub(super) fn tick_registrations(&mut self, now: Instant) {
        let timers = self.timers;
        for i in 0..self.registrations.len() {
            let r = &mut self.registrations[i];
            let literal = r.host.0.parse::<std::net::IpAddr>().is_ok();
            match &mut r.phase {
                // A name is looked up again before each REGISTER.
                Phase::Idle { at }
                    if now >= *at && r.target.is_some() && (literal || r.looked_up) =>
                {
                    self.send_register(i, now);
                }
                Phase::Sent {
                    bytes,
                    resend,
                    give_up_at,
                    ..
                } => {
                    if now >= *give_up_at {
                        self.registration_failed(i, Some(408), "no answer (timer F)", now);
                    } else if resend.due(now, &timers) {
                        let bytes = bytes.clone();
                        let peer = r.target.map(Peer::udp_out);
                        self.counters.resent += 1;
                        if let Some(p) = peer {
                            self.send(p, bytes);
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// The lifetime a 2xx granted: our Contact's `expires`, else `Expires`,
/// else what was asked.
pub fn granted_expires(m: &Message, asked: u32) -> u32 {
    let from_contact = m.headers_named("Contact").find_map(|c| {
        c.split(';')
            .skip(1)
            .find_map(|p| p.trim().strip_prefix("expires="))
            .and_then(|v| v.trim().parse::<u32>().ok())
    });
    from_contact
        .or_else(|| m.header("Expires").and_then(|v| v.trim().parse().ok()))
        .unwrap_or(asked)
        .min(asked.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshid_telephony::sip::message::parse;

    #[test]
    fn host_ports() {
        assert_eq!(host_port("10.0.0.1"), Some(("10.0.0.1".into(), 5060)));
        assert_eq!(
            host_port("pbx.example:5070"),
            Some(("pbx.example".into(), 5070))
        );
        assert_eq!(host_port("[::1]:5080"), Some(("::1".into(), 5080)));
        assert_eq!(host_port("[::1]"), Some(("::1".into(), 5060)));
        assert_eq!(host_port("h:x"), None);
        assert_eq!(host_port("[::1]x"), None);
    }

    #[test]
    fn granted_lifetimes() {
        let ok = |headers: &str| {
            parse(
                format!(
                    "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nFrom: <sip:a@h>;tag=1\r\n\
                     To: <sip:a@h>;tag=2\r\nCall-ID: c\r\nCSeq: 1 REGISTER\r\n{headers}Content-Length: 0\r\n\r\n"
                )
                .as_bytes(),
            )
            .unwrap()
        };
        assert_eq!(
            granted_expires(&ok("Contact: <sip:a@1.2.3.4>;expires=120\r\n"), 600),
            120
        );
        assert_eq!(granted_expires(&ok("Expires: 300\r\n"), 600), 300);
        assert_eq!(granted_expires(&ok(""), 600), 600);
        // A registrar may shorten, never lengthen, what was asked.
        assert_eq!(granted_expires(&ok("Expires: 9000\r\n"), 600), 600);
    }
}
