//! `sip.*`: the SIP endpoint's configuration and its checks.
//!
//! Every table the endpoint keeps is bounded here (dialogs, transactions,
//! message size, TCP connections and their idle time, digest nonces); the timers are RFC 3261's (T1, T2,
//! 64·T1). Off loopback a caller must be vouched for: `allowed_sources`
//! must list the trunks' and PBXs' addresses, or `auth` must hold digest
//! credentials, or both (the endpoint refuses to start otherwise, as
//! AudioSocket does). `outbound` and `registrations` configure what
//! moshid starts itself: calls it places, bindings it keeps at registrars.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

/// The codecs an answer may pick, in the default order of preference.
pub const DEFAULT_CODECS: [&str; 4] = ["opus", "PCMU", "PCMA", "L16"];

/// `sip.*`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SipConfig {
    /// Whether the endpoint runs.
    pub enabled: bool,
    /// Where it listens, over UDP and TCP (the same port); every I/O core
    /// binds it (`SO_REUSEPORT`). Port 0 picks one.
    pub address: SocketAddr,
    /// Source addresses allowed to call; empty: anyone who can reach the
    /// listener, which is accepted only on loopback.
    pub allowed_sources: Vec<IpAddr>,
    /// Calls (dialogs, ringing or answered) per I/O core; beyond, 486 Busy Here.
    pub max_dialogs: usize,
    /// Server and client transactions remembered per I/O core (retransmission
    /// absorption); beyond, new requests get 503 with `Retry-After`.
    pub max_transactions: usize,
    /// Largest SIP message accepted, in bytes (UDP datagram or TCP message).
    pub max_message_bytes: usize,
    /// TCP connections open at once per I/O core; beyond, a new connection
    /// is closed at once. 0: no TCP listener (UDP only).
    pub max_tcp_connections: usize,
    /// A TCP connection with no call and nothing received (messages and
    /// RFC 5626 CRLF keep-alives count) for this long is closed, in
    /// milliseconds. A connection that carries a call is not closed for
    /// idleness.
    pub tcp_idle_timeout_ms: u64,
    /// Codecs in order of preference (`opus`, `PCMU`, `PCMA`, `L16`); the
    /// answer picks the first one the offer has.
    pub codecs: Vec<String>,
    /// Packet time sent when the offer names none (or one the codec cannot
    /// use), in milliseconds.
    pub ptime_ms: u32,
    /// Whether RFC 4733 `telephone-event` is accepted when offered.
    pub dtmf: bool,
    /// Time between 180 Ringing and 200 OK, in milliseconds (0: answer at once).
    pub ring_ms: u64,
    /// `Retry-After` of a 503 (no capacity), in seconds.
    pub retry_after_s: u32,
    /// RFC 3261 T1 (round-trip estimate), in milliseconds.
    pub t1_ms: u64,
    /// RFC 3261 T2 (longest retransmission interval of non-INVITE requests
    /// and of final INVITE responses), in milliseconds.
    pub t2_ms: u64,
    /// Session parameters of every call (as a chat query's), overridden by
    /// `users` and the request-URI's parameters.
    pub params: BTreeMap<String, String>,
    /// Session parameters by request-URI user (`"agent": {"seed": "7"}`).
    /// When not empty, only these users can be called (404 otherwise).
    pub users: BTreeMap<String, BTreeMap<String, String>>,
    /// Digest authentication of callers (RFC 3261 §22, RFC 8760); `null`:
    /// none. When set, an INVITE from a source not in `allowed_sources`
    /// must answer a challenge, on loopback too.
    pub auth: Option<SipAuthConfig>,
    /// Calls moshid places (`POST /v1/sip/calls`).
    pub outbound: SipOutboundConfig,
    /// Registrations moshid keeps with registrars (REGISTER, refreshed), so
    /// that a PBX routes an extension to it. At most
    /// [`MAX_REGISTRATIONS`].
    pub registrations: Vec<SipRegistrationConfig>,
}

/// Registrations kept at once.
pub const MAX_REGISTRATIONS: usize = 16;

/// A username and password moshid answers a digest challenge with (its
/// own calls and registrations).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SipClientCredentials {
    /// The digest username.
    pub username: String,
    /// The password.
    pub password: String,
}

/// `sip.outbound`: the calls moshid places.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SipOutboundConfig {
    /// Calls being placed or in progress at once, daemon-wide; beyond,
    /// `POST /v1/sip/calls` answers 503.
    pub max_calls: usize,
    /// Ended calls whose outcome `GET /v1/sip/calls/{id}` still shows (the
    /// oldest is forgotten first).
    pub keep_ended: usize,
    /// How long a call may ring before moshid CANCELs it, in seconds.
    pub ring_timeout_s: u64,
    /// The From of moshid's INVITEs (`sip:user@host`); default
    /// `sip:moshid@` and the address moshid sends from.
    pub from: Option<String>,
    /// Credentials for a 401 or 407 challenge to an INVITE; `null`: a
    /// challenged call fails.
    pub auth: Option<SipClientCredentials>,
}

impl Default for SipOutboundConfig {
    fn default() -> Self {
        SipOutboundConfig {
            max_calls: 64,
            keep_ended: 256,
            ring_timeout_s: 60,
            from: None,
            auth: None,
        }
    }
}

/// One `sip.registrations` entry: a binding moshid keeps at a registrar.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SipRegistrationConfig {
    /// The registrar (`sip:host[:port]`: the REGISTER's Request-URI and
    /// where it is sent).
    pub registrar: String,
    /// The address of record registered (`sip:600@pbx.example`): the To
    /// and From of the REGISTER.
    pub aor: String,
    /// Credentials for the registrar's challenge; `null`: none.
    #[serde(default)]
    pub auth: Option<SipClientCredentials>,
    /// The binding's lifetime asked for, in seconds (the registrar may
    /// shorten it); refreshed before it runs out.
    #[serde(default = "default_expires_s")]
    pub expires_s: u32,
    /// After a failed REGISTER, the wait before the next, in seconds.
    #[serde(default = "default_retry_s")]
    pub retry_s: u32,
}

fn default_expires_s() -> u32 {
    600
}

fn default_retry_s() -> u32 {
    30
}

/// `sip.auth`: who may call with a password.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SipAuthConfig {
    /// The realm of the challenges (what a softphone shows its user).
    pub realm: String,
    /// Passwords by username (the caller's digest username, not the
    /// Request-URI user of `sip.users`).
    pub credentials: BTreeMap<String, String>,
    /// The algorithms offered, one `WWW-Authenticate` each, in this order
    /// (`SHA-256`, `MD5`; RFC 8760 puts SHA-256 first).
    pub algorithms: Vec<String>,
    /// How long a nonce is good for, in seconds (then `stale=true`).
    pub nonce_seconds: u64,
    /// Nonces remembered per I/O core for replay detection (only nonces
    /// used with a correct response take room).
    pub max_nonces: usize,
}

impl Default for SipAuthConfig {
    fn default() -> Self {
        SipAuthConfig {
            realm: "moshid".into(),
            credentials: BTreeMap::new(),
            algorithms: vec!["SHA-256".into(), "MD5".into()],
            nonce_seconds: 300,
            max_nonces: 4096,
        }
    }
}

/// Checks `sip.auth`.
fn validate_auth(a: &SipAuthConfig) -> Result<(), (&'static str, String)> {
    let plain = |s: &str| !s.chars().any(|c| c.is_control() || c == '"' || c == '\\');
    if a.realm.is_empty() || a.realm.len() > 128 || !plain(&a.realm) {
        return Err((
            "sip.auth.realm",
            "must be 1 to 128 characters without quotes, backslashes or control characters".into(),
        ));
    }
    if a.credentials.is_empty() {
        return Err((
            "sip.auth.credentials",
            "must hold at least one \"username\": \"password\"".into(),
        ));
    }
    for (user, password) in &a.credentials {
        if user.is_empty() || user.len() > 128 || user.chars().any(char::is_control) {
            return Err((
                "sip.auth.credentials",
                format!(
                    "username `{user}`: must be 1 to 128 characters without control characters"
                ),
            ));
        }
        if password.is_empty() {
            return Err((
                "sip.auth.credentials",
                format!("username `{user}` has an empty password"),
            ));
        }
    }
    if a.algorithms.is_empty() {
        return Err((
            "sip.auth.algorithms",
            "must name at least one algorithm".into(),
        ));
    }
    for (i, name) in a.algorithms.iter().enumerate() {
        if moshid_telephony::sip::digest::Algorithm::parse(name).is_none() {
            return Err((
                "sip.auth.algorithms",
                format!("unknown algorithm `{name}` (SHA-256, MD5)"),
            ));
        }
        if a.algorithms[..i]
            .iter()
            .any(|p| p.eq_ignore_ascii_case(name))
        {
            return Err(("sip.auth.algorithms", format!("`{name}` is listed twice")));
        }
    }
    if !(1..=3_600).contains(&a.nonce_seconds) {
        return Err((
            "sip.auth.nonce_seconds",
            "must be between 1 and 3600".into(),
        ));
    }
    if !(1..=1_000_000).contains(&a.max_nonces) {
        return Err((
            "sip.auth.max_nonces",
            "must be between 1 and 1000000".into(),
        ));
    }
    Ok(())
}

impl Default for SipConfig {
    fn default() -> Self {
        SipConfig {
            enabled: false,
            address: "127.0.0.1:5060".parse().expect("valid literal"),
            allowed_sources: Vec::new(),
            max_dialogs: 256,
            max_transactions: 1024,
            max_message_bytes: 16_384,
            max_tcp_connections: 256,
            tcp_idle_timeout_ms: 300_000,
            codecs: DEFAULT_CODECS.iter().map(|c| c.to_string()).collect(),
            ptime_ms: 20,
            dtmf: true,
            ring_ms: 0,
            retry_after_s: 5,
            t1_ms: 500,
            t2_ms: 4_000,
            params: BTreeMap::new(),
            users: BTreeMap::new(),
            auth: None,
            outbound: SipOutboundConfig::default(),
            registrations: Vec::new(),
        }
    }
}

/// Checks credentials at `key`.
fn validate_credentials(
    key: &'static str,
    c: &SipClientCredentials,
) -> Result<(), (&'static str, String)> {
    if c.username.is_empty() || c.username.len() > 128 || c.username.chars().any(char::is_control) {
        return Err((
            key,
            "username must be 1 to 128 characters without control characters".into(),
        ));
    }
    if c.password.is_empty() {
        return Err((key, "password must not be empty".into()));
    }
    Ok(())
}

/// Checks a `sip:` URI at `key`, with a user when `user` says so.
fn validate_uri(key: &'static str, uri: &str, user: bool) -> Result<(), (&'static str, String)> {
    let u = moshid_telephony::sip::uri::SipUri::parse(uri)
        .map_err(|e| (key, format!("`{uri}`: {e}")))?;
    if u.scheme != "sip" {
        return Err((key, format!("`{uri}`: only sip: URIs (no TLS)")));
    }
    if user && u.user.is_none() {
        return Err((key, format!("`{uri}`: a user is required (sip:user@host)")));
    }
    if uri.len() > 256
        || uri
            .chars()
            .any(|c| c.is_control() || c == ' ' || c == '<' || c == '>')
    {
        return Err((
            key,
            format!("`{uri}`: at most 256 characters, no spaces or angle brackets"),
        ));
    }
    Ok(())
}

/// Checks `sip.outbound` and `sip.registrations`.
fn validate_client(c: &SipConfig) -> Result<(), (&'static str, String)> {
    let o = &c.outbound;
    if !(1..=100_000).contains(&o.max_calls) {
        return Err((
            "sip.outbound.max_calls",
            "must be between 1 and 100000".into(),
        ));
    }
    if o.keep_ended > 100_000 {
        return Err(("sip.outbound.keep_ended", "must be at most 100000".into()));
    }
    if !(1..=600).contains(&o.ring_timeout_s) {
        return Err((
            "sip.outbound.ring_timeout_s",
            "must be between 1 and 600".into(),
        ));
    }
    if let Some(from) = &o.from {
        validate_uri("sip.outbound.from", from, true)?;
    }
    if let Some(a) = &o.auth {
        validate_credentials("sip.outbound.auth", a)?;
    }
    if c.registrations.len() > MAX_REGISTRATIONS {
        return Err((
            "sip.registrations",
            format!("at most {MAX_REGISTRATIONS} entries"),
        ));
    }
    for r in &c.registrations {
        validate_uri("sip.registrations.registrar", &r.registrar, false)?;
        validate_uri("sip.registrations.aor", &r.aor, true)?;
        if let Some(a) = &r.auth {
            validate_credentials("sip.registrations.auth", a)?;
        }
        if !(60..=86_400).contains(&r.expires_s) {
            return Err((
                "sip.registrations.expires_s",
                "must be between 60 and 86400".into(),
            ));
        }
        if !(1..=3_600).contains(&r.retry_s) {
            return Err((
                "sip.registrations.retry_s",
                "must be between 1 and 3600".into(),
            ));
        }
    }
    Ok(())
}

/// Checks `sip.*`: `(key, why)` on the first problem.
pub fn validate(c: &SipConfig, listen: SocketAddr) -> Result<(), (&'static str, String)> {
    if c.max_dialogs == 0 {
        return Err(("sip.max_dialogs", "must be positive".into()));
    }
    if c.max_transactions < 2 * c.max_dialogs {
        return Err((
            "sip.max_transactions",
            format!(
                "must be at least twice sip.max_dialogs ({}): every call holds its INVITE's and its BYE's",
                c.max_dialogs
            ),
        ));
    }
    if !(1_500..=65_507).contains(&c.max_message_bytes) {
        return Err((
            "sip.max_message_bytes",
            "must be between 1500 and 65507 (the largest UDP payload)".into(),
        ));
    }
    if c.max_tcp_connections > 65_536 {
        return Err((
            "sip.max_tcp_connections",
            "must be at most 65536 (0: no TCP)".into(),
        ));
    }
    if !(1_000..=3_600_000).contains(&c.tcp_idle_timeout_ms) {
        return Err((
            "sip.tcp_idle_timeout_ms",
            "must be between 1000 and 3600000".into(),
        ));
    }
    if c.codecs.is_empty() {
        return Err(("sip.codecs", "must name at least one codec".into()));
    }
    for (i, name) in c.codecs.iter().enumerate() {
        let known = DEFAULT_CODECS.iter().any(|k| k.eq_ignore_ascii_case(name));
        if !known {
            return Err((
                "sip.codecs",
                format!("unknown codec `{name}` (opus, PCMU, PCMA, L16)"),
            ));
        }
        if c.codecs[..i].iter().any(|p| p.eq_ignore_ascii_case(name)) {
            return Err(("sip.codecs", format!("`{name}` is listed twice")));
        }
    }
    if !(10..=60).contains(&c.ptime_ms) || !c.ptime_ms.is_multiple_of(10) {
        return Err(("sip.ptime_ms", "must be 10 to 60 in steps of 10".into()));
    }
    if c.t1_ms == 0 || c.t1_ms > 10_000 {
        return Err(("sip.t1_ms", "must be between 1 and 10000".into()));
    }
    if c.t2_ms < c.t1_ms || c.t2_ms > 60_000 {
        return Err(("sip.t2_ms", "must be between sip.t1_ms and 60000".into()));
    }
    if c.retry_after_s == 0 {
        return Err(("sip.retry_after_s", "must be positive".into()));
    }
    if c.ring_ms > 60_000 {
        return Err(("sip.ring_ms", "must be at most 60000".into()));
    }
    if let Some(a) = &c.auth {
        validate_auth(a)?;
    }
    validate_client(c)?;
    if !c.enabled && !c.registrations.is_empty() {
        return Err((
            "sip.registrations",
            "needs sip.enabled (moshid registers so that calls reach its SIP endpoint)".into(),
        ));
    }
    if c.enabled {
        if c.address.port() != 0 && c.address == listen {
            return Err((
                "sip.address",
                format!("is listen.address ({listen}): give SIP its own port"),
            ));
        }
        if !c.address.ip().is_loopback() && c.allowed_sources.is_empty() && c.auth.is_none() {
            return Err((
                "sip.allowed_sources",
                format!(
                    "or sip.auth is required when listening on {} (not loopback): list the trunks' and PBXs' addresses, or give callers digest credentials",
                    c.address
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(j: &str) -> Result<(), &'static str> {
        let c: SipConfig = serde_json::from_str(j).map_err(|_| "parse")?;
        validate(&c, "127.0.0.1:8998".parse().unwrap()).map_err(|(k, _)| k)
    }

    #[test]
    fn defaults_pass_and_errors_name_the_key() {
        assert_eq!(check(r#"{"enabled": true}"#), Ok(()));
        assert_eq!(
            check(r#"{"enabled": true, "address": "0.0.0.0:5060"}"#),
            Err("sip.allowed_sources")
        );
        assert_eq!(
            check(
                r#"{"enabled": true, "address": "0.0.0.0:5060", "allowed_sources": ["10.0.0.2"]}"#
            ),
            Ok(())
        );
        assert_eq!(check(r#"{"max_dialogs": 0}"#), Err("sip.max_dialogs"));
        assert_eq!(
            check(r#"{"max_dialogs": 600}"#),
            Err("sip.max_transactions")
        );
        assert_eq!(
            check(r#"{"max_message_bytes": 100}"#),
            Err("sip.max_message_bytes")
        );
        assert_eq!(
            check(r#"{"max_tcp_connections": 100000}"#),
            Err("sip.max_tcp_connections")
        );
        assert_eq!(check(r#"{"max_tcp_connections": 0}"#), Ok(()));
        assert_eq!(
            check(r#"{"tcp_idle_timeout_ms": 10}"#),
            Err("sip.tcp_idle_timeout_ms")
        );
        assert_eq!(check(r#"{"codecs": ["G729"]}"#), Err("sip.codecs"));
        assert_eq!(check(r#"{"codecs": ["pcmu", "PCMU"]}"#), Err("sip.codecs"));
        assert_eq!(check(r#"{"codecs": []}"#), Err("sip.codecs"));
        assert_eq!(check(r#"{"ptime_ms": 25}"#), Err("sip.ptime_ms"));
        assert_eq!(check(r#"{"t1_ms": 500, "t2_ms": 100}"#), Err("sip.t2_ms"));
        assert_eq!(
            check(r#"{"enabled": true, "address": "127.0.0.1:8998"}"#),
            Err("sip.address")
        );
        assert_eq!(check(r#"{"enabeld": true}"#), Err("parse"));
    }

    #[test]
    fn auth_is_checked_and_admits_off_loopback() {
        let auth = r#""auth": {"credentials": {"alice": "s3cret"}}"#;
        assert_eq!(
            check(&format!(
                r#"{{"enabled": true, "address": "0.0.0.0:5060", {auth}}}"#
            )),
            Ok(())
        );
        let c: SipConfig = serde_json::from_str(&format!("{{{auth}}}")).unwrap();
        let a = c.auth.unwrap();
        assert_eq!((a.realm.as_str(), a.nonce_seconds), ("moshid", 300));
        assert_eq!(a.algorithms, ["SHA-256", "MD5"]);
        let bad = |inner: &str| check(&format!(r#"{{"auth": {{{inner}}}}}"#));
        assert_eq!(bad(""), Err("sip.auth.credentials"));
        assert_eq!(
            bad(r#""credentials": {"": "x"}"#),
            Err("sip.auth.credentials")
        );
        assert_eq!(
            bad(r#""credentials": {"a": ""}"#),
            Err("sip.auth.credentials")
        );
        let with = |more: &str| bad(&format!(r#""credentials": {{"a": "p"}}, {more}"#));
        assert_eq!(with(r#""realm": """#), Err("sip.auth.realm"));
        assert_eq!(with(r#""realm": "a\"b""#), Err("sip.auth.realm"));
        assert_eq!(with(r#""algorithms": []"#), Err("sip.auth.algorithms"));
        assert_eq!(
            with(r#""algorithms": ["SHA-1"]"#),
            Err("sip.auth.algorithms")
        );
        assert_eq!(
            with(r#""algorithms": ["MD5", "md5"]"#),
            Err("sip.auth.algorithms")
        );
        assert_eq!(with(r#""algorithms": ["MD5"]"#), Ok(()));
        assert_eq!(with(r#""nonce_seconds": 0"#), Err("sip.auth.nonce_seconds"));
        assert_eq!(with(r#""max_nonces": 0"#), Err("sip.auth.max_nonces"));
        assert_eq!(with(r#""nonse_seconds": 5"#), Err("parse"));
    }

    #[test]
    fn outbound_and_registrations_are_checked() {
        let c: SipConfig = serde_json::from_str("{}").unwrap();
        assert_eq!((c.outbound.max_calls, c.outbound.ring_timeout_s), (64, 60));
        assert_eq!(
            check(
                r#"{"outbound": {"from": "sip:agent@example.com", "auth": {"username": "u", "password": "p"}}}"#
            ),
            Ok(())
        );
        assert_eq!(
            check(r#"{"outbound": {"max_calls": 0}}"#),
            Err("sip.outbound.max_calls")
        );
        assert_eq!(
            check(r#"{"outbound": {"ring_timeout_s": 0}}"#),
            Err("sip.outbound.ring_timeout_s")
        );
        assert_eq!(
            check(r#"{"outbound": {"from": "sip:example.com"}}"#),
            Err("sip.outbound.from")
        );
        assert_eq!(
            check(r#"{"outbound": {"from": "tel:+1"}}"#),
            Err("sip.outbound.from")
        );
        assert_eq!(
            check(r#"{"outbound": {"auth": {"username": "u", "password": ""}}}"#),
            Err("sip.outbound.auth")
        );
        let reg = |more: &str| {
            check(&format!(
                r#"{{"enabled": true, "registrations": [{{"registrar": "sip:127.0.0.1:5070", "aor": "sip:600@pbx"{more}}}]}}"#
            ))
        };
        assert_eq!(
            check(r#"{"registrations": [{"registrar": "sip:127.0.0.1", "aor": "sip:600@pbx"}]}"#),
            Err("sip.registrations")
        );
        assert_eq!(reg(""), Ok(()));
        assert_eq!(
            reg(r#", "expires_s": 10"#),
            Err("sip.registrations.expires_s")
        );
        assert_eq!(reg(r#", "retry_s": 0"#), Err("sip.registrations.retry_s"));
        assert_eq!(
            reg(r#", "auth": {"username": "", "password": "p"}"#),
            Err("sip.registrations.auth")
        );
        assert_eq!(
            check(
                r#"{"enabled": true, "registrations": [{"registrar": "sip:h", "aor": "sip:pbx"}]}"#
            ),
            Err("sip.registrations.aor")
        );
        assert_eq!(
            check(
                r#"{"enabled": true, "registrations": [{"registrar": "http://h", "aor": "sip:a@pbx"}]}"#
            ),
            Err("sip.registrations.registrar")
        );
    }
}
