//! The operations endpoints: `GET /health` and `/ready`, `GET /capacity`
//! (free slots per group, predicted step times, every per-session table's
//! size, for load balancers and leak checks), `GET /metrics` (Prometheus
//! text) and `GET`/`POST /admin/metrics` (the stage-metrics switch).
//!
//! Invariants: every answer is read from counters and gauges the engine
//! and the cores publish (nothing here waits on the engine); the switch
//! changes only with `metrics.runtime_switch` and a body that is exactly
//! `{"enabled": true|false}`.

use super::ApiShared;
use crate::app::CoreApp;
use crate::http::{self, HeadLimits, HttpError, RequestHead};
use crate::io::conn::Conn;
use serde::Deserialize;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The paths served here.
pub const PATHS: [&str; 5] = [
    "/health",
    "/ready",
    "/capacity",
    "/metrics",
    "/admin/metrics",
];

/// Answers `method` on `path`, one of [`PATHS`]; `false` for a method
/// these paths do not serve (the caller answers 405).
pub async fn handle(
    stream: &mut Conn,
    app: &CoreApp,
    api: &ApiShared,
    head: &RequestHead,
    buf: &mut Vec<u8>,
    limits: &HeadLimits,
) -> Result<bool, HttpError> {
    let engine = &app.ctx.engine;
    match (head.method.as_str(), head.path.as_str()) {
        ("GET", "/health") => http::write_json(stream, 200, &json!({"status": "ok"})).await?,
        ("GET", "/ready") => {
            let ready = engine.ready.load(Ordering::Acquire) && engine.admission().accepting();
            let status = if ready { 200 } else { 503 };
            http::write_json(stream, status, &json!({ "ready": ready })).await?;
        }
        ("GET", "/capacity") => {
            let body = json!({
                "capacity": engine.capacity(),
                "engine": engine.stats.snapshot(),
                "session_state": engine.session_state(),
                "rtp_sessions": api.rtp.len(),
                "events": app.shared.events.sizes(),
                "phase_groups": engine.phase_groups,
            });
            http::write_json(stream, 200, &body).await?;
        }
        ("GET", "/metrics") => {
            let mut text = super::metrics::render(engine);
            super::metrics::events::append(&mut text, &app.shared.events);
            let content_type = super::metrics::CONTENT_TYPE;
            http::write_response(stream, 200, content_type, text.as_bytes(), &[]).await?;
        }
        ("GET", "/admin/metrics") => {
            let body = json!({
                "enabled": engine.metrics.enabled(),
                "runtime_switch": app.shared.config.metrics.runtime_switch,
            });
            http::write_json(stream, 200, &body).await?;
        }
        ("POST", "/admin/metrics") => switch_metrics(stream, app, head, buf, limits).await?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// The body of `POST /admin/metrics`: exactly `{"enabled": true|false}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SwitchBody {
    enabled: bool,
}

/// The answer to a `POST /admin/metrics` body that is not a [`SwitchBody`].
fn switch_refusal(e: serde_json::Error) -> String {
    format!("expected a JSON body {{\"enabled\": true|false}}: {e}")
}

/// `POST /admin/metrics`: turns the stage metrics on or off.
async fn switch_metrics(
    stream: &mut Conn,
    app: &CoreApp,
    head: &RequestHead,
    buf: &mut Vec<u8>,
    limits: &HeadLimits,
) -> Result<(), HttpError> {
    if !app.shared.config.metrics.runtime_switch {
        let why = "metrics.runtime_switch is false in the configuration";
        return http::write_error(stream, 403, why).await;
    }
    let timeout = Duration::from_millis(app.shared.config.listen.head_timeout_ms);
    let on = match http::read_json::<SwitchBody, _>(stream, head, buf, limits, timeout).await? {
        Ok(b) => b.enabled,
        Err(e) => return http::write_error(stream, 400, &switch_refusal(e)).await,
    };
    let previous = app.ctx.engine.metrics.set_enabled(on);
    if previous != on {
        eprintln!(
            "<6>metrics: stage timings {} (POST /admin/metrics on core {})",
            if on { "on" } else { "off" },
            app.ctx.core
        );
    }
    http::write_json(stream, 200, &json!({ "enabled": on, "previous": previous })).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_switch_body(body: &[u8]) -> Result<bool, String> {
        serde_json::from_slice::<SwitchBody>(body)
            .map(|b| b.enabled)
            .map_err(switch_refusal)
    }

    #[test]
    fn switch_body_is_strict() {
        assert_eq!(parse_switch_body(br#"{"enabled": true}"#), Ok(true));
        assert_eq!(parse_switch_body(br#"{"enabled":false}"#), Ok(false));
        for bad in [
            &b""[..],
            b"{}",
            br#"{"enabled": 1}"#,
            br#"{"enabled": true, "x": 1}"#,
            b"on",
        ] {
            let e = parse_switch_body(bad).unwrap_err();
            assert!(e.contains("\"enabled\": true|false"), "{e}");
        }
    }
}
