//! One I/O core's listener: accepts connections (the kernel spreads them
//! over the cores' SO_REUSEPORT sockets), reads the request head and routes
//! it: `/api/chat` upgrades to a chat session on this core,
//! `/v1/media-stream` to a Media Streams session (unless
//! `media_streams.enabled` is false), `/v1/realtime` and
//! `/v1/realtime/translations` to an OpenAI Realtime session (unless
//! `realtime.enabled` is false), `/v1/sessions/{id}/events` streams a
//! session's events (Server-Sent Events), the control endpoints answer JSON.
//!
//! Invariants: a connection never leaves the core that accepted it; the
//! number of open connections per core is bounded by configuration (beyond
//! it new connections are closed at once), and so is the number per client
//! IP address on each core (`listen.max_connections_per_ip`, counted per
//! core: a client may hold that many on every core), kept by
//! [`ConnTable`]. Until its request is
//! complete — the TLS handshake when the listener serves TLS (bounded by
//! `listen.tls_handshake_timeout_ms`, run in the connection's task, not in
//! the accept loop), then the head and body (a Media Streams WebSocket
//! until its `start` event) — a connection is pending in the core's
//! [`PendingBudget`](crate::io::pending::PendingBudget): it may be closed to
//! make room for a newer one, and the request must be complete within
//! `listen.head_timeout_ms`; after that it is never evicted. A request is
//! routed only when [`super::routes::ROUTES`] holds its method and path
//! (404 or 405 otherwise), so that table is the list of endpoints. Endpoints
//! other than `/health`, `/ready` and the page need the bearer token when
//! one is configured (WebSocket upgrades may carry it as the `auth_id`
//! query parameter, as browsers cannot set headers, or as the subprotocol
//! `openai-insecure-api-key.TOKEN` browsers' Realtime clients offer), compared in constant
//! time and never logged. `GET /metrics` serves Prometheus text; `POST
//! /admin/metrics` with `{"enabled": true|false}` switches the stage metrics
//! at run time (unless `metrics.runtime_switch` is false).

use super::ApiShared;
use crate::app::CoreApp;
use crate::http::{self, HeadLimits, HttpError, RequestHead};
use crate::io::accept::ConnTable;
use crate::io::accept_pace::AcceptPace;
use crate::io::conn::Conn;
use crate::io::pending::{Pending, PendingEnd};
use crate::transport::ws_chat;
use glommio::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

/// Accepts connections until the task is cancelled.
pub async fn accept_loop(listener: TcpListener, app: CoreApp, api: Arc<ApiShared>) {
    let l = &app.shared.config.listen;
    let table = ConnTable::register(
        &app.ctx,
        "http",
        l.max_connections_per_core,
        l.connections_per_ip(),
    );
    let core = app.ctx.core;
    let pace = AcceptPace::default();
    loop {
        let (stream, peer) = table.accept(&listener, &pace, core).await;
        let guard = match table.try_open(peer.ip()) {
            Ok(g) => g,
            Err(refusal) => {
                // Over a bound: close at once rather than queue.
                drop(stream);
                table.log_refusal(core, peer.ip(), &refusal);
                continue;
            }
        };
        // Not started until its request is complete.
        let pending = app.pending.admit(peer.ip());
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let api = api.clone();
        glommio::spawn_local(async move {
            let _guard = guard;
            // The TLS handshake is part of the pending phase: one call puts
            // it under the core's budget (evictable, counted).
            let stream = match &api.tls {
                None => Conn::Plain(stream),
                Some(tls) => {
                    // tls.accept has its own deadline (and error); this one
                    // only backs it up.
                    let backstop = Duration::from_millis(
                        app.shared.config.listen.tls_handshake_timeout_ms + 1_000,
                    );
                    match pending.within(backstop, tls.accept(stream)).await {
                        Ok(Ok(crate::tls::Accepted::Tls(s))) => s,
                        Ok(Ok(crate::tls::Accepted::Plaintext(s))) => {
                            pending.complete();
                            let timeout =
                                Duration::from_millis(app.shared.config.listen.head_timeout_ms);
                            crate::tls::answer_plaintext(s, &limits(&app), timeout).await;
                            return;
                        }
                        Ok(Err(e)) => {
                            crate::tls::note_handshake_failure(app.ctx.core, peer.ip(), &e);
                            return;
                        }
                        // Evicted or timed out: counted by the budget.
                        Err(_) => return,
                    }
                }
            };
            handle_connection(stream, app, &api, pending).await;
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

/// The query parameter that carries the token on a WebSocket upgrade.
const AUTH_QUERY_KEY: &str = "auth_id";

fn authorized(app: &CoreApp, head: &RequestHead) -> bool {
    let Some(token) = app.shared.config.listen.token.as_deref() else {
        return true;
    };
    let ok = |g: &str| constant_time_eq(g.as_bytes(), token.as_bytes());
    if let Some(g) = head.bearer_token().or_else(|| head.api_key()) {
        return ok(g);
    }
    // Browsers' OpenAI Realtime clients carry the key as a subprotocol.
    if head.is_websocket_upgrade() {
        if let Some(g) = subprotocol_key(head) {
            return ok(g);
        }
    }
    // Browsers cannot set headers on a WebSocket: Kyutai's server takes the
    // token from `auth_id` there, and so does this one (upgrades only, so a
    // token in a URL is never needed for anything else).
    head.is_websocket_upgrade()
        && head.query_pairs().is_ok_and(|q| {
            q.iter()
                .any(|(k, v)| k == AUTH_QUERY_KEY && !v.is_empty() && ok(v))
        })
}

/// The subprotocol prefix a browser's Realtime client carries its key in.
const KEY_SUBPROTOCOL: &str = "openai-insecure-api-key.";

/// The key of a `Sec-WebSocket-Protocol: realtime, openai-insecure-api-key.KEY`.
fn subprotocol_key(head: &RequestHead) -> Option<&str> {
    head.header_values("sec-websocket-protocol")
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(KEY_SUBPROTOCOL))
}

/// The subprotocol a Realtime upgrade answers with: `realtime` when the
/// client offers it (a browser refuses an upgrade that picks none of the
/// protocols it offered; the key's own is never echoed).
fn realtime_subprotocol(head: &RequestHead) -> Option<&'static str> {
    head.header_values("sec-websocket-protocol")
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == "realtime")
        .then_some("realtime")
}

fn is_public(head: &RequestHead) -> bool {
    matches!(head.path.as_str(), "/health" | "/ready") || super::page::is_public(&head.path)
}

/// The whole request: its head and, when it has one and will be answered
/// (authorized, not an upgrade), its body, which then waits in `buf` for
/// [`http::read_body`] (which returns it at once).
async fn read_request(
    stream: &mut Conn,
    buf: &mut Vec<u8>,
    limits: &HeadLimits,
    app: &CoreApp,
) -> Result<RequestHead, HttpError> {
    let head = http::read_head(stream, buf, limits).await?;
    let has_body = head.content_length.unwrap_or(0) > 0 && !head.is_websocket_upgrade();
    if has_body && (is_public(&head) || authorized(app, &head)) {
        http::read_body(stream, &head, buf, limits).await?;
    }
    Ok(head)
}

/// A session's query parameters, less the token.
fn session_query(head: &RequestHead) -> Result<Vec<(String, String)>, HttpError> {
    let mut q = head.query_pairs()?;
    q.retain(|(k, _)| k != AUTH_QUERY_KEY);
    Ok(q)
}

async fn handle_connection(mut stream: Conn, app: CoreApp, api: &ApiShared, pending: Pending) {
    let limits = limits(&app);
    let mut buf = Vec::new();
    let Some((head, pending)) =
        receive_request(&mut stream, &mut buf, &limits, &app, pending).await
    else {
        return;
    };
    if !is_public(&head) && !authorized(&app, &head) {
        let _ = http::write_error(&mut stream, 401, "missing or wrong bearer token").await;
        return;
    }
    let result = route(&mut stream, &app, api, &head, &mut buf, &limits).await;
    match result {
        Ok(Route::Done) => {}
        Ok(Route::Chat) => upgrade_chat(stream, app, &head, buf).await,
        Ok(Route::MediaStream) => upgrade_media_stream(stream, app, &head, buf, pending).await,
        Ok(Route::Realtime(endpoint)) => {
            upgrade_realtime(stream, app, api, &head, buf, endpoint).await;
        }
        Err(e) => {
            let _ = http::respond_error(&mut stream, &e).await;
        }
    }
}

/// Reads the request while the connection is pending (within
/// `listen.head_timeout_ms`, evictable), answering a broken or late one.
/// Returns its head and, for a Media Streams WebSocket, the still pending
/// place: that connection is pending until its `start` event; every other
/// one is complete (never evicted) from here.
async fn receive_request(
    stream: &mut Conn,
    buf: &mut Vec<u8>,
    limits: &HeadLimits,
    app: &CoreApp,
    pending: Pending,
) -> Option<(RequestHead, Option<Pending>)> {
    let timeout = Duration::from_millis(app.shared.config.listen.head_timeout_ms);
    let request = pending
        .within(timeout, read_request(stream, buf, limits, app))
        .await;
    let head = match request {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            pending.complete();
            if !matches!(e, HttpError::ClosedBeforeHead { .. }) {
                let _ = http::respond_error(stream, &e).await;
            }
            return None;
        }
        Err(PendingEnd::TimedOut) => {
            let _ = http::respond_error(stream, &HttpError::Timeout).await;
            return None;
        }
        // Closed to make room for a newer connection: no answer.
        Err(PendingEnd::Evicted) => return None,
    };
    let media_stream = head.method == "GET"
        && head.path == "/v1/media-stream"
        && app.shared.config.media_streams.enabled
        && head.is_websocket_upgrade();
    if media_stream {
        return Some((head, Some(pending)));
    }
    pending.complete();
    Some((head, None))
}

/// A session's query parameters, or `None` once a bad query is answered.
async fn query_or_answer(stream: &mut Conn, head: &RequestHead) -> Option<Vec<(String, String)>> {
    match session_query(head) {
        Ok(q) => Some(q),
        Err(e) => {
            let _ = http::respond_error(stream, &e).await;
            None
        }
    }
}

/// `/api/chat`: upgrades and runs a chat session on this core. The id is
/// handed out with the upgrade, so the client can follow its own session's
/// events from the start.
async fn upgrade_chat(mut stream: Conn, app: CoreApp, head: &RequestHead, buf: Vec<u8>) {
    let Some(query) = query_or_answer(&mut stream, head).await else {
        return;
    };
    let max = app.shared.config.session.max_message_bytes;
    let config = http::ws_config(max, max);
    let id = app.shared.session_id();
    let id_header = [("Moshid-Session-Id", id.to_string())];
    let headers = id_header.each_ref().map(|(n, v)| (*n, v.as_str()));
    if let Ok(ws) = http::accept_websocket_with(stream, head, buf, config, &headers).await {
        ws_chat::run(ws, app, query, id).await;
    }
}

/// `/v1/media-stream`: upgrades and runs a Media Streams session, which
/// keeps the connection pending until its `start` event.
async fn upgrade_media_stream(
    mut stream: Conn,
    app: CoreApp,
    head: &RequestHead,
    buf: Vec<u8>,
    pending: Option<Pending>,
) {
    let Some(query) = query_or_answer(&mut stream, head).await else {
        return;
    };
    let max = app.shared.config.session.max_message_bytes;
    let config = http::ws_config(max, max);
    let Some(pending) = pending else {
        return;
    };
    if let Ok(ws) = http::accept_websocket(stream, head, buf, config).await {
        crate::transport::media_streams::run(ws, app, query, pending).await;
    }
}

/// `/v1/realtime` and `/v1/realtime/translations`: upgrades (with the
/// session's id, and the `realtime` subprotocol when offered) and runs a
/// Realtime session.
async fn upgrade_realtime(
    mut stream: Conn,
    app: CoreApp,
    api: &ApiShared,
    head: &RequestHead,
    buf: Vec<u8>,
    endpoint: crate::transport::realtime::Endpoint,
) {
    let Some(query) = query_or_answer(&mut stream, head).await else {
        return;
    };
    let max = app.shared.config.realtime.max_event_bytes;
    let config = http::ws_config(max, max);
    let id = app.shared.session_id();
    let id_value = id.to_string();
    let mut headers = vec![("Moshid-Session-Id", id_value.as_str())];
    if let Some(p) = realtime_subprotocol(head) {
        headers.push(("Sec-WebSocket-Protocol", p));
    }
    if let Ok(ws) = http::accept_websocket_with(stream, head, buf, config, &headers).await {
        crate::transport::realtime::run(ws, app, query, id, endpoint, &api.model.name).await;
    }
}

enum Route {
    Done,
    Chat,
    MediaStream,
    Realtime(crate::transport::realtime::Endpoint),
}

/// Answers 404 or 405 to a request [`super::routes::ROUTES`] does not hold
/// (`false`); `true` when it holds it.
async fn in_route_table(
    stream: &mut Conn,
    app: &CoreApp,
    head: &RequestHead,
) -> Result<bool, HttpError> {
    use super::routes::{resolve, Resolved, Switch};
    let config = &app.shared.config;
    let on = |s: Switch| match s {
        Switch::MediaStreams => config.media_streams.enabled,
        Switch::Realtime => config.realtime.enabled,
    };
    match resolve(&head.method, &head.path, on) {
        Resolved::Route(_) => Ok(true),
        Resolved::WrongMethod => {
            http::write_error(stream, 405, "method not allowed").await?;
            Ok(false)
        }
        Resolved::Unknown => {
            http::write_error(stream, 404, "no such endpoint").await?;
            Ok(false)
        }
    }
}

async fn route(
    stream: &mut Conn,
    app: &CoreApp,
    api: &ApiShared,
    head: &RequestHead,
    buf: &mut Vec<u8>,
    limits: &HeadLimits,
) -> Result<Route, HttpError> {
    if !in_route_table(stream, app, head).await? {
        return Ok(Route::Done);
    }
    match (head.method.as_str(), head.path.as_str()) {
        ("GET", "/api/chat") => {
            if !head.is_websocket_upgrade() {
                http::write_error(stream, 426, "/api/chat is a WebSocket endpoint").await?;
                return Ok(Route::Done);
            }
            Ok(Route::Chat)
        }
        ("GET", "/v1/media-stream") if app.shared.config.media_streams.enabled => {
            if !head.is_websocket_upgrade() {
                http::write_error(stream, 426, "/v1/media-stream is a WebSocket endpoint").await?;
                return Ok(Route::Done);
            }
            Ok(Route::MediaStream)
        }
        ("GET", path @ ("/v1/realtime" | "/v1/realtime/translations"))
            if app.shared.config.realtime.enabled =>
        {
            use crate::transport::realtime::Endpoint;
            if !head.is_websocket_upgrade() {
                http::write_error(stream, 426, &format!("{path} is a WebSocket endpoint")).await?;
                return Ok(Route::Done);
            }
            Ok(Route::Realtime(if path == "/v1/realtime" {
                Endpoint::Conversation
            } else {
                Endpoint::Translation
            }))
        }
        (_, path) if super::ops::PATHS.contains(&path) => {
            if !super::ops::handle(stream, app, api, head, buf, limits).await? {
                http::write_error(stream, 405, "method not allowed").await?;
            }
            Ok(Route::Done)
        }
        (_, path) if super::events::owns(path) => {
            super::events::handle(stream, app, head).await?;
            Ok(Route::Done)
        }
        (_, path) if super::rtp::owns(path) => {
            super::rtp::handle(stream, app, api, head, buf, limits).await?;
            Ok(Route::Done)
        }
        (_, path) if super::sip::owns(path) => {
            super::sip::handle(stream, app, api, head, buf, limits).await?;
            Ok(Route::Done)
        }
        (_, path) if super::page::owns(path) => {
            super::page::handle(stream, app, api, head).await?;
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
