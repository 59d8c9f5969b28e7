//! One I/O core's listener: accepts connections (the kernel spreads them
//! over the cores' SO_REUSEPORT sockets), reads the request head and routes
//! it: `/api/chat` upgrades to a chat session on this core, the control
//! endpoints answer JSON.
//!
//! Invariants: a connection never leaves the core that accepted it; the
//! number of open connections per core is bounded by configuration (beyond
//! it new connections are closed at once); a request head must arrive within
//! `listen.head_timeout_ms`; control endpoints other than `/health` and
//! `/ready` need the bearer token when one is configured, compared in
//! constant time.

use super::app::CoreApp;
use crate::http::{self, HeadLimits, HttpError, RequestHead};
use crate::transport::ws_chat;
use glommio::net::{TcpListener, TcpStream};
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

/// Accepts connections until the task is cancelled.
pub async fn accept_loop(listener: TcpListener, app: CoreApp) {
    let open = Rc::new(Cell::new(0usize));
    let max_open = app.shared.config.listen.max_connections_per_core;
    loop {
        let stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("<4>core {}: accept failed: {e}", app.ctx.core);
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if open.get() >= max_open {
            // Over the bound: close at once rather than queue.
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        open.set(open.get() + 1);
        let app = app.clone();
        let open = open.clone();
        glommio::spawn_local(async move {
            handle_connection(stream, app).await;
            open.set(open.get() - 1);
        })
        .detach();
    }
}

fn limits(app: &CoreApp) -> HeadLimits {
    let l = &app.shared.config.listen;
    HeadLimits {
        max_head_bytes: l.max_head_bytes,
        max_body_bytes: l.max_body_bytes,
        ..HeadLimits::default()
    }
}

/// Equal-length comparison that does not stop at the first difference.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn authorized(app: &CoreApp, head: &RequestHead) -> bool {
    let Some(token) = app.shared.config.listen.token.as_deref() else {
        return true;
    };
    let given = head.bearer_token().or_else(|| head.api_key());
    given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes()))
}

async fn handle_connection(mut stream: TcpStream, app: CoreApp) {
    let limits = limits(&app);
    let mut buf = Vec::new();
    let timeout = Duration::from_millis(app.shared.config.listen.head_timeout_ms);
    let head = match http::deadline(timeout, http::read_head(&mut stream, &mut buf, &limits)).await {
        Ok(h) => h,
        Err(e) => {
            if !matches!(e, HttpError::ClosedBeforeHead { .. }) {
                let _ = http::respond_error(&mut stream, &e).await;
            }
            return;
        }
    };
    let public = matches!(head.path.as_str(), "/health" | "/ready");
    if !public && !authorized(&app, &head) {
        let _ = http::write_error(&mut stream, 401, "missing or wrong bearer token").await;
        return;
    }
    let result = route(&mut stream, &app, &head, &mut buf, &limits).await;
    match result {
        Ok(Route::Done) => {}
        Ok(Route::Chat) => {
            let query = match head.query_pairs() {
                Ok(q) => q,
                Err(e) => {
                    let _ = http::respond_error(&mut stream, &e).await;
                    return;
                }
            };
            let max = app.shared.config.session.max_message_bytes;
            let config = http::ws_config(max, max);
            if let Ok(ws) = http::accept_websocket(stream, &head, std::mem::take(&mut buf), config).await {
                ws_chat::run(ws, app, query).await;
            }
        }
        Err(e) => {
            let _ = http::respond_error(&mut stream, &e).await;
        }
    }
}

enum Route {
    Done,
    Chat,
}

async fn route(
    stream: &mut TcpStream,
    app: &CoreApp,
    head: &RequestHead,
    _buf: &mut Vec<u8>,
    _limits: &HeadLimits,
) -> Result<Route, HttpError> {
    let engine = &app.ctx.engine;
    match (head.method.as_str(), head.path.as_str()) {
        ("GET", "/api/chat") => {
            if !head.is_websocket_upgrade() {
                http::write_error(stream, 426, "/api/chat is a WebSocket endpoint").await?;
                return Ok(Route::Done);
            }
            Ok(Route::Chat)
        }
        ("GET", "/health") => {
            http::write_json(stream, 200, &serde_json::json!({"status": "ok"})).await?;
            Ok(Route::Done)
        }
        ("GET", "/ready") => {
            let ready = engine.ready.load(std::sync::atomic::Ordering::Acquire) && engine.admission().accepting();
            let status = if ready { 200 } else { 503 };
            http::write_json(stream, status, &serde_json::json!({ "ready": ready })).await?;
            Ok(Route::Done)
        }
        ("GET", "/capacity") => {
            let body = serde_json::json!({
                "capacity": engine.capacity(),
                "engine": engine.stats.snapshot(),
                "session_state": engine.session_state(),
                "phase_groups": engine.phase_groups,
            });
            http::write_json(stream, 200, &body).await?;
            Ok(Route::Done)
        }
        (_, "/api/chat" | "/health" | "/ready" | "/capacity") => {
            http::write_error(stream, 405, "method not allowed").await?;
            Ok(Route::Done)
        }
        _ => {
            http::write_error(stream, 404, "no such endpoint").await?;
            Ok(Route::Done)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
