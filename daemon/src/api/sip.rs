//! The SIP control endpoints on the shared HTTP listener (bearer token as
//! for every `/v1` path):
//!
//! * `POST /v1/sip/calls` — body `{"to": "sip:user@host[:port]",
//!   "params": {…}, "webhook_url": …}` → `201 {"id", "call_id", "state":
//!   "calling", …}`: moshid places the call from the I/O core that took
//!   the request ([`crate::transport::sip::uac`]). Its id is its session's, so
//!   `/v1/sessions/{id}/events` follows it from the start (text, DTMF,
//!   state, final record). 400 names the field at fault, 503 says why no
//!   call can be placed now (no model slot, `sip.outbound.max_calls`,
//!   `sip.max_dialogs`), also when SIP is off.
//! * `GET /v1/sip/calls` — the live calls and the last ended ones.
//! * `GET /v1/sip/calls/{id}` — where call `id` stands: `calling`,
//!   `ringing`, `answered`, then `ended` or `failed` with the SIP status
//!   and the reason (kept for the last `sip.outbound.keep_ended` calls).
//! * `DELETE /v1/sip/calls/{id}` — hangs up (CANCEL while it rings, BYE
//!   once answered); `202` with the state then.
//! * `GET /v1/sip/registrations` — each `sip.registrations` entry's state.

use super::rtp::{param_pairs, session_of};
use crate::app::CoreApp;
use crate::http::{self, HeadLimits, HttpError, RequestHead};
use crate::io::conn::Conn;
use crate::transport::sip::register::host_port;
use crate::transport::sip::resolve::resolve;
use crate::transport::sip::serve::current_wire;
use crate::transport::sip::uac::{PlaceError, PlaceRequest};
use moshid_telephony::sip::uri::SipUri;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The calls' path.
pub const CALLS_PATH: &str = "/v1/sip/calls";
/// The registrations' path.
pub const REGISTRATIONS_PATH: &str = "/v1/sip/registrations";

/// Whether `path` belongs to these endpoints.
pub fn owns(path: &str) -> bool {
    path == REGISTRATIONS_PATH
        || path == CALLS_PATH
        || path
            .strip_prefix(CALLS_PATH)
            .is_some_and(|r| r.starts_with('/'))
}

/// The body of `POST /v1/sip/calls`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaceBody {
    /// Whom to call: `sip:user@host[:port]`.
    pub to: String,
    /// Session parameters (as the WebSocket query string's).
    #[serde(default)]
    pub params: serde_json::Map<String, Value>,
    /// Where the session's final record is POSTed (see
    /// `events.session_webhook_prefixes`; default `session.webhook_url`).
    pub webhook_url: Option<String>,
}

/// Checks `to`: a `sip:` URI with a user, at most 256 bytes; `(host,
/// port)` to send to.
pub fn check_to(to: &str) -> Result<(String, u16), String> {
    if to.len() > 256
        || to
            .chars()
            .any(|c| c.is_control() || c == ' ' || c == '<' || c == '>')
    {
        return Err(
            "at most 256 characters, no spaces, angle brackets or control characters".into(),
        );
    }
    let uri = SipUri::parse(to).map_err(|e| e.to_string())?;
    if uri.scheme != "sip" {
        return Err("only sip: URIs (moshid has no SIP over TLS)".into());
    }
    if uri.user.is_none() {
        return Err("a user is required (sip:user@host)".into());
    }
    if let Some((_, t)) = uri
        .params
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("transport"))
    {
        if !t.eq_ignore_ascii_case("udp") {
            return Err(format!("transport={t}: moshid places calls over UDP only"));
        }
    }
    host_port(&uri.host).ok_or_else(|| format!("`{}` is not host[:port]", uri.host))
}

/// Serves one request to these endpoints.
pub async fn handle(
    stream: &mut Conn,
    app: &CoreApp,
    api: &super::ApiShared,
    head: &RequestHead,
    buf: &mut Vec<u8>,
    limits: &HeadLimits,
) -> Result<(), HttpError> {
    let sip = &api.sip;
    if head.path == REGISTRATIONS_PATH {
        if head.method != "GET" {
            return http::write_error(stream, 405, "method not allowed").await;
        }
        let list: Vec<Value> = sip.registrations.iter().map(|r| r.to_json()).collect();
        return http::write_json(stream, 200, &json!({ "registrations": list })).await;
    }
    let rest = &head.path[CALLS_PATH.len()..];
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    match (head.method.as_str(), parts.as_slice()) {
        ("POST", []) => place(stream, app, head, buf, limits).await,
        ("GET", []) => http::write_json(stream, 200, &json!({ "calls": sip.calls.list() })).await,
        ("GET", [id]) => match sip.calls.get(id) {
            Some(c) => http::write_json(stream, 200, &c.to_json()).await,
            None => http::write_error(stream, 404, &format!("no SIP call `{id}`")).await,
        },
        ("DELETE", [id]) => {
            let Some(c) = sip.calls.get(id) else {
                return http::write_error(stream, 404, &format!("no SIP call `{id}`")).await;
            };
            c.request_hang_up();
            // The call's core acts on it at its next tick (20 ms).
            glommio::timer::sleep(2 * crate::transport::sip::serve::TICK).await;
            http::write_json(stream, 202, &c.to_json()).await
        }
        (_, [] | [_]) => http::write_error(stream, 405, "method not allowed").await,
        _ => http::write_error(stream, 404, "no such endpoint").await,
    }
}

async fn place(
    stream: &mut Conn,
    app: &CoreApp,
    head: &RequestHead,
    buf: &mut Vec<u8>,
    limits: &HeadLimits,
) -> Result<(), HttpError> {
    let shared = app.shared.clone();
    let cfg = &shared.config;
    let timeout = Duration::from_millis(cfg.listen.head_timeout_ms);
    let body = http::read_json::<PlaceBody, _>(stream, head, buf, limits, timeout).await?;
    let Some(wire) = current_wire() else {
        return http::write_error(stream, 503, "SIP is disabled (config key `sip.enabled`)").await;
    };
    let req = match body {
        Ok(r) => r,
        Err(e) => return http::write_error(stream, 400, &format!("bad JSON body: {e}")).await,
    };
    let (host, port) = match check_to(&req.to) {
        Ok(hp) => hp,
        Err(e) => return http::write_error(stream, 400, &format!("field `to`: {e}")).await,
    };
    let pairs = match param_pairs(&req.params) {
        Ok(p) => p,
        Err(e) => return http::write_error(stream, 400, &e.to_string()).await,
    };
    let pairs: Vec<(String, String)> = cfg
        .sip
        .params
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .chain(pairs)
        .collect();
    let (params, webhook) = match session_of(&shared, &pairs, req.webhook_url.as_deref()) {
        Ok(p) => p,
        Err(e) => return http::write_error(stream, 400, &e).await,
    };
    let target = match resolve(&host, port).await {
        Ok(a) => a,
        Err(e) => return http::write_error(stream, 400, &format!("field `to`: {e}")).await,
    };
    let placed = wire.endpoint.borrow_mut().place(
        PlaceRequest {
            to: req.to.clone(),
            target,
            params,
            webhook,
        },
        Instant::now(),
    );
    wire.flush().await;
    match placed {
        Ok(call) => http::write_json(stream, 201, &call.to_json()).await,
        Err(e @ PlaceError::Busy(_)) => http::write_error(stream, 503, &e.to_string()).await,
        Err(e @ PlaceError::Internal(_)) => http::write_error(stream, 500, &e.to_string()).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_targets() {
        assert!(owns("/v1/sip/calls") && owns("/v1/sip/calls/7") && owns("/v1/sip/registrations"));
        assert!(!owns("/v1/sip/callsx") && !owns("/v1/sip"));
        assert_eq!(
            check_to("sip:600@127.0.0.1:5070"),
            Ok(("127.0.0.1".into(), 5070))
        );
        assert_eq!(
            check_to("sip:agent@pbx.example"),
            Ok(("pbx.example".into(), 5060))
        );
        assert_eq!(
            check_to("sip:a@[::1]:5080;transport=udp"),
            Ok(("::1".into(), 5080))
        );
        for bad in [
            "sip:127.0.0.1",
            "sips:a@h",
            "tel:+1555",
            "sip:a@h;transport=tcp",
            "sip:a@h:port",
            "sip:a@h x",
            "sip:a@",
        ] {
            assert!(check_to(bad).is_err(), "{bad}");
        }
        assert!(check_to(&format!("sip:a@{}", "h".repeat(300))).is_err());
    }
}
