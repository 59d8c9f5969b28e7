//! The RTP control endpoints on the shared HTTP listener:
//!
//! * `POST /v1/rtp/sessions` — body `{"codec": "PCMU"|"PCMA"|"L16"|"opus",
//!   "payload_type", "sample_rate" (L16), "ptime_ms" (default 20),
//!   "dtmf_payload_type", "remote": "ip:port", "params": {…}}` → `201
//!   {"id", "address", "port", …}`. The session runs on the I/O core that
//!   took the request, with a UDP socket bound there (`rtp.bind_address`,
//!   else the listener's address; port chosen by the kernel). Its slot is
//!   admitted here, so a full server answers 503 before any RTP flows.
//! * `GET /v1/rtp/sessions` — the live sessions' ids and states.
//! * `GET /v1/rtp/sessions/{id}` and `GET /v1/rtp/sessions/{id}/events` —
//!   state, counters, gauges and the last [`EVENT_LOG_CAPACITY`] events.
//! * `DELETE /v1/rtp/sessions/{id}` — ends the session and answers with its
//!   final record and counters (or 202 if it has not ended within 2 s).
//!
//! The session's live events (text, DTMF, state, final record) are on
//! `GET /v1/sessions/{id}/events` (Server-Sent Events, registered before
//! the `201` is sent); `webhook_url` in the body names its own webhook
//! where `events.session_webhook_prefixes` allows it.
//!
//! Errors are JSON `{"error": …}` naming the field at fault (400), the
//! session (404), or why no session can be made now (503).

use super::ApiShared;
use crate::app::CoreApp;
use crate::events::webhook::WebhookUrl;
use crate::http::{self, HeadLimits, HttpError, RequestHead};
use crate::io::conn::Conn;
use crate::session::params::session_params;
use crate::transport::rtp::start::{self, StartError, StartRequest};
use crate::transport::rtp::state::{SessionState, EVENT_LOG_CAPACITY};
use crate::transport::rtp::Registry;
use moshid_model::streaming::SessionParams;
use moshid_telephony::rtp::SessionSpec;
use moshid_telephony::{CodecKind, CodecSpec};
use serde::Deserialize;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The collection path.
pub const SESSIONS_PATH: &str = "/v1/rtp/sessions";
/// How long `DELETE` waits for the session to end.
const DELETE_WAIT: Duration = Duration::from_secs(2);

/// Whether `path` belongs to these endpoints.
pub fn owns(path: &str) -> bool {
    path == SESSIONS_PATH
        || path
            .strip_prefix(SESSIONS_PATH)
            .is_some_and(|r| r.starts_with('/'))
}

/// The body of `POST /v1/rtp/sessions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// `PCMU`, `PCMA`, `L16` or `opus`.
    pub codec: String,
    /// Payload type of audio (default: 0 for PCMU, 8 for PCMA; required
    /// for the dynamic ones).
    pub payload_type: Option<u8>,
    /// L16's rate (8000 by default).
    pub sample_rate: Option<u32>,
    /// Packet duration sent (default 20).
    pub ptime_ms: Option<u32>,
    /// Payload type of RFC 4733 telephone-events.
    pub dtmf_payload_type: Option<u8>,
    /// `ip:port` to send to; RTP is then accepted from that IP only.
    pub remote: Option<String>,
    /// Session parameters (as the WebSocket query string's).
    #[serde(default)]
    pub params: serde_json::Map<String, Value>,
    /// Where the session's final record is POSTed (see
    /// `events.session_webhook_prefixes`; default `session.webhook_url`).
    pub webhook_url: Option<String>,
}

/// A request this endpoint refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field.
    pub field: &'static str,
    /// What is wrong.
    pub why: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "field `{}`: {}", self.field, self.why)
    }
}

fn field(field: &'static str, why: impl Into<String>) -> FieldError {
    FieldError {
        field,
        why: why.into(),
    }
}

fn check_payload_type(name: &'static str, pt: u8) -> Result<(), FieldError> {
    if pt > 127 {
        return Err(field(name, "must be between 0 and 127"));
    }
    if (72..=95).contains(&pt) {
        // RFC 5761 §4: these collide with RTCP packet types on a muxed port.
        return Err(field(
            name,
            "72 to 95 collide with RTCP (RFC 5761); use 96 to 127",
        ));
    }
    Ok(())
}

impl CreateRequest {
    /// Checks the request and resolves its defaults.
    pub fn spec(&self) -> Result<SessionSpec, FieldError> {
        let codec = CodecSpec::parse(&self.codec, self.sample_rate).map_err(|e| {
            let f = if self.sample_rate.is_some() && CodecSpec::parse(&self.codec, None).is_ok() {
                "sample_rate"
            } else {
                "codec"
            };
            field(f, e.to_string())
        })?;
        let payload_type = match (self.payload_type, codec.kind) {
            (Some(pt), _) => pt,
            (None, CodecKind::Pcmu) => 0,
            (None, CodecKind::Pcma) => 8,
            (None, _) => {
                return Err(field(
                    "payload_type",
                    format!(
                        "required for {} (a dynamic payload type, 96 to 127)",
                        codec.name()
                    ),
                ))
            }
        };
        check_payload_type("payload_type", payload_type)?;
        let ptime_ms = self.ptime_ms.unwrap_or(20);
        codec
            .check_ptime(ptime_ms)
            .map_err(|e| field("ptime_ms", e.to_string()))?;
        if let Some(d) = self.dtmf_payload_type {
            check_payload_type("dtmf_payload_type", d)?;
            if d == payload_type {
                return Err(field("dtmf_payload_type", "must differ from payload_type"));
            }
        }
        let remote = match &self.remote {
            None => None,
            Some(r) => {
                let a: SocketAddr = r
                    .parse()
                    .map_err(|_| field("remote", format!("`{r}` is not an ip:port")))?;
                if a.port() == 0 || a.ip().is_unspecified() || a.ip().is_multicast() {
                    return Err(field(
                        "remote",
                        format!("`{r}` is not a unicast address with a port"),
                    ));
                }
                Some(a)
            }
        };
        Ok(SessionSpec {
            codec,
            payload_type,
            ptime_ms,
            dtmf_payload_type: self.dtmf_payload_type,
            remote,
        })
    }

    /// The session parameters as `(key, value)` pairs.
    pub fn param_pairs(&self) -> Result<Vec<(String, String)>, FieldError> {
        param_pairs(&self.params)
    }
}

/// A control call's session parameters and webhook: `pairs` checked
/// against the model, `webhook_url` against
/// `events.session_webhook_prefixes` (default `session.webhook_url`).
/// Shared by the control calls that start sessions; the error names the
/// field (a 400).
pub fn session_of(
    shared: &crate::app::Shared,
    pairs: &[(String, String)],
    webhook_url: Option<&str>,
) -> Result<(SessionParams, Option<WebhookUrl>), String> {
    let cfg = &shared.config;
    let params = session_params(pairs, &cfg.defaults, &shared.model_info)
        .map_err(|e| format!("field `params`: {e}"))?;
    let webhook = crate::events::webhook::choose(
        webhook_url,
        cfg.session.webhook_url.as_deref(),
        &cfg.events.session_webhook_prefixes,
    )
    .map_err(|e| format!("field `webhook_url`: {e}"))?;
    Ok((params, webhook))
}

/// A JSON `params` object as `(key, value)` pairs (strings, numbers and
/// booleans; anything else is refused naming the key). Shared by the
/// control calls that take session parameters.
pub fn param_pairs(
    params: &serde_json::Map<String, Value>,
) -> Result<Vec<(String, String)>, FieldError> {
    params
        .iter()
        .map(|(k, v)| {
            let s = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => {
                    return Err(field(
                        "params",
                        format!("`{k}` must be a string, number or boolean"),
                    ))
                }
            };
            Ok((k.clone(), s))
        })
        .collect()
}

/// Serves one request to these endpoints.
pub async fn handle(
    stream: &mut Conn,
    app: &CoreApp,
    api: &ApiShared,
    head: &RequestHead,
    buf: &mut Vec<u8>,
    limits: &HeadLimits,
) -> Result<(), HttpError> {
    let rest = &head.path[SESSIONS_PATH.len()..];
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    match (head.method.as_str(), parts.as_slice()) {
        ("POST", []) => create(stream, app, &api.rtp, head, buf, limits).await,
        ("GET", []) => {
            let list: Vec<Value> = api
                .rtp
                .list()
                .into_iter()
                .map(|(id, state)| json!({"id": id, "state": state}))
                .collect();
            http::write_json(stream, 200, &json!({ "sessions": list })).await
        }
        ("GET", [id]) | ("GET", [id, "events"]) => match api.rtp.get(id) {
            Some(h) => http::write_json(stream, 200, &h.to_json()).await,
            None => http::write_error(stream, 404, &format!("no RTP session `{id}`")).await,
        },
        ("DELETE", [id]) => delete(stream, &api.rtp, id).await,
        (_, [] | [_] | [_, "events"]) => http::write_error(stream, 405, "method not allowed").await,
        _ => http::write_error(stream, 404, "no such endpoint").await,
    }
}

async fn delete(stream: &mut Conn, rtp: &Registry, id: &str) -> Result<(), HttpError> {
    let Some(h) = rtp.get(id) else {
        return http::write_error(stream, 404, &format!("no RTP session `{id}`")).await;
    };
    h.request_stop();
    let deadline = Instant::now() + DELETE_WAIT;
    while h.state() != SessionState::Ended && Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    let status = if h.state() == SessionState::Ended {
        200
    } else {
        202
    };
    http::write_json(stream, status, &h.to_json()).await
}

async fn create(
    stream: &mut Conn,
    app: &CoreApp,
    rtp: &Arc<Registry>,
    head: &RequestHead,
    buf: &mut Vec<u8>,
    limits: &HeadLimits,
) -> Result<(), HttpError> {
    let shared = app.shared.clone();
    let cfg = &shared.config;
    if !cfg.rtp.enabled {
        return http::write_error(
            stream,
            503,
            "the RTP transport is disabled (config key `rtp.enabled`)",
        )
        .await;
    }
    let timeout = Duration::from_millis(cfg.listen.head_timeout_ms);
    let req: CreateRequest = match http::read_json(stream, head, buf, limits, timeout).await? {
        Ok(r) => r,
        Err(e) => return http::write_error(stream, 400, &format!("bad JSON body: {e}")).await,
    };
    let spec = match req.spec() {
        Ok(s) => s,
        Err(e) => return http::write_error(stream, 400, &e.to_string()).await,
    };
    let pairs = match req.param_pairs() {
        Ok(p) => p,
        Err(e) => return http::write_error(stream, 400, &e.to_string()).await,
    };
    let (params, webhook) = match session_of(&shared, &pairs, req.webhook_url.as_deref()) {
        Ok(p) => p,
        Err(e) => return http::write_error(stream, 400, &e).await,
    };
    let reached_at = stream.tcp().local_addr().ok().map(|a| a.ip());
    let started = match start::start(
        app,
        rtp,
        StartRequest {
            spec,
            params,
            webhook,
            transport: "rtp",
            alias: None,
            reached_at,
        },
    ) {
        Ok(s) => s,
        Err(e @ StartError::NoCapacity(_)) => {
            return http::write_error(stream, 503, &e.to_string()).await
        }
        Err(e @ StartError::Internal(_)) => {
            return http::write_error(stream, 500, &e.to_string()).await
        }
    };
    let id = started.handle.id.clone();
    let address = started.address;
    let local_port = started.port;
    let body = json!({
        "id": id,
        "address": address.to_string(),
        "port": local_port,
        "codec": spec.codec.name(),
        "payload_type": spec.payload_type,
        "sample_rate": spec.codec.sample_rate_hz,
        "ptime_ms": spec.ptime_ms,
        "dtmf_payload_type": spec.dtmf_payload_type,
        "events": format!("{SESSIONS_PATH}/{id}/events"),
        "event_stream": format!("{}/{id}/events", crate::events::SESSIONS_PATH),
        "event_log_capacity": EVENT_LOG_CAPACITY,
    });
    http::write_json(stream, 201, &body).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(j: &str) -> Result<SessionSpec, FieldError> {
        serde_json::from_str::<CreateRequest>(j).unwrap().spec()
    }

    #[test]
    fn defaults_and_errors_name_the_field() {
        let s = req(r#"{"codec": "PCMU"}"#).unwrap();
        assert_eq!((s.payload_type, s.ptime_ms, s.remote), (0, 20, None));
        let s = req(r#"{"codec": "L16", "payload_type": 97, "sample_rate": 16000, "remote": "127.0.0.1:4000", "dtmf_payload_type": 101}"#).unwrap();
        assert_eq!(s.codec.sample_rate_hz, 16_000);
        assert_eq!(
            req(r#"{"codec": "opus"}"#).unwrap_err().field,
            "payload_type"
        );
        assert_eq!(req(r#"{"codec": "G729"}"#).unwrap_err().field, "codec");
        assert_eq!(
            req(r#"{"codec": "L16", "payload_type": 97, "sample_rate": 11025}"#)
                .unwrap_err()
                .field,
            "sample_rate"
        );
        assert_eq!(
            req(r#"{"codec": "PCMU", "ptime_ms": 25}"#)
                .unwrap_err()
                .field,
            "ptime_ms"
        );
        assert_eq!(
            req(r#"{"codec": "PCMU", "payload_type": 200}"#)
                .unwrap_err()
                .field,
            "payload_type"
        );
        assert_eq!(
            req(r#"{"codec": "PCMU", "payload_type": 72}"#)
                .unwrap_err()
                .field,
            "payload_type"
        );
        assert_eq!(
            req(r#"{"codec": "PCMU", "dtmf_payload_type": 0}"#)
                .unwrap_err()
                .field,
            "dtmf_payload_type"
        );
        assert_eq!(
            req(r#"{"codec": "PCMU", "remote": "nowhere"}"#)
                .unwrap_err()
                .field,
            "remote"
        );
        assert!(
            serde_json::from_str::<CreateRequest>(r#"{"codec": "PCMU", "colour": 1}"#).is_err()
        );
    }

    #[test]
    fn params_become_pairs() {
        let r: CreateRequest = serde_json::from_str(
            r#"{"codec": "PCMU", "params": {"text_temperature": 0.5, "seed": 3, "greedy": true}}"#,
        )
        .unwrap();
        let mut p = r.param_pairs().unwrap();
        p.sort();
        assert_eq!(p[0], ("greedy".to_string(), "true".to_string()));
        let r: CreateRequest =
            serde_json::from_str(r#"{"codec": "PCMU", "params": {"x": [1]}}"#).unwrap();
        assert_eq!(r.param_pairs().unwrap_err().field, "params");
    }

    #[test]
    fn paths() {
        assert!(owns("/v1/rtp/sessions"));
        assert!(owns("/v1/rtp/sessions/12/events"));
        assert!(!owns("/v1/rtp/sessionsx"));
    }
}
