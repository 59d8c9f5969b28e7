//! One I/O core's listener: accepts connections (the kernel spreads them
//! over the cores' SO_REUSEPORT sockets), reads the request head and routes
//! it: `/api/chat` upgrades to a chat session on this core,
//! `/v1/media-stream` to a Media Streams session (unless
//! `media_streams.enabled` is false), `/v1/sessions/{id}/events` streams a
//! session's events (Server-Sent Events), the control endpoints answer JSON.
//!
//! Invariants: a connection never leaves the core that accepted it; the
//! number of open connections per core is bounded by configuration (beyond
//! it new connections are closed at once), and so is the number per client
//! IP address on each core (`listen.max_connections_per_ip`, counted per
//! core: a client may hold that many on every core) with a table that never
//! holds more entries than there are open connections; a request head must arrive within
//! `listen.head_timeout_ms` (after the TLS handshake, which has its own
//! `listen.tls_handshake_timeout_ms` and runs in the connection's task, not
//! in the accept loop); endpoints other than `/health`, `/ready` and the
//! page need the bearer token when one is configured (WebSocket upgrades may
//! carry it as the `auth_id` query parameter, as browsers cannot set
//! headers), compared in constant time and never logged. `GET /metrics` serves Prometheus text; `POST
//! /admin/metrics` with `{"enabled": true|false}` switches the stage metrics
//! at run time (unless `metrics.runtime_switch` is false).

use super::app::CoreApp;
use super::conn::Conn;
use crate::http::{self, HeadLimits, HttpError, RequestHead};
use crate::transport::ws_chat;
use glommio::net::TcpListener;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Why a connection was closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnRefusal {
    /// `listen.max_connections_per_core` connections are open on this core.
    CoreFull,
    /// `listen.max_connections_per_ip` connections from this address are
    /// open on this core.
    AddressFull,
}

impl std::fmt::Display for ConnRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConnRefusal::CoreFull => "listen.max_connections_per_core reached on this core",
            ConnRefusal::AddressFull => {
                "listen.max_connections_per_ip reached for this address on this core"
            }
        })
    }
}

/// How often a core logs that it closed connections over a bound.
const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);

/// One core's open connections, in all and per client address.
///
/// Bounded: an address has an entry only while it has an open connection
/// (the entry is removed when its count returns to 0), and at most
/// `max_open` connections are open, so there are never more than `max_open`
/// entries. With no per-address limit the table stays empty.
pub struct ConnTable {
    open: Cell<usize>,
    per_ip: RefCell<HashMap<IpAddr, usize>>,
    max_open: usize,
    max_per_ip: usize,
    refused: Cell<u64>,
    last_log: Cell<Option<Instant>>,
}

/// One open connection; dropping it gives its place back.
pub struct ConnGuard {
    table: Rc<ConnTable>,
    ip: Option<IpAddr>,
}

impl ConnTable {
    /// A table for `max_open` connections, `max_per_ip` per address (0: no
    /// per-address limit).
    pub fn new(max_open: usize, max_per_ip: usize) -> Rc<ConnTable> {
        Rc::new(ConnTable {
            open: Cell::new(0),
            per_ip: RefCell::new(HashMap::new()),
            max_open,
            max_per_ip,
            refused: Cell::new(0),
            last_log: Cell::new(None),
        })
    }

    /// Takes a place for a connection from `ip`, or says why there is none.
    pub fn try_open(self: &Rc<Self>, ip: IpAddr) -> Result<ConnGuard, ConnRefusal> {
        let refuse = |r| {
            self.refused.set(self.refused.get() + 1);
            Err(r)
        };
        if self.open.get() >= self.max_open {
            return refuse(ConnRefusal::CoreFull);
        }
        let mut key = None;
        if self.max_per_ip > 0 {
            // An IPv4 client seen through an IPv6 socket counts as itself.
            let ip = ip.to_canonical();
            let mut map = self.per_ip.borrow_mut();
            let count = map.entry(ip).or_insert(0);
            if *count >= self.max_per_ip {
                return refuse(ConnRefusal::AddressFull);
            }
            *count += 1;
            key = Some(ip);
        }
        self.open.set(self.open.get() + 1);
        Ok(ConnGuard {
            table: self.clone(),
            ip: key,
        })
    }

    /// Open connections.
    pub fn open(&self) -> usize {
        self.open.get()
    }

    /// Addresses with an open connection (0 without a per-address limit).
    pub fn addresses(&self) -> usize {
        self.per_ip.borrow().len()
    }

    /// Connections refused since start.
    pub fn refused(&self) -> u64 {
        self.refused.get()
    }

    /// Whether a refusal should be logged now (at most every [`REFUSAL_LOG_PERIOD`]).
    fn log_due(&self, now: Instant) -> bool {
        let due = self
            .last_log
            .get()
            .is_none_or(|t| now.saturating_duration_since(t) >= REFUSAL_LOG_PERIOD);
        if due {
            self.last_log.set(Some(now));
        }
        due
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let t = &self.table;
        t.open.set(t.open.get() - 1);
        if let Some(ip) = self.ip {
            let mut map = t.per_ip.borrow_mut();
            if let Some(count) = map.get_mut(&ip) {
                *count -= 1;
                if *count == 0 {
                    map.remove(&ip);
                }
            }
        }
    }
}

/// Accepts connections until the task is cancelled.
pub async fn accept_loop(listener: TcpListener, app: CoreApp) {
    let l = &app.shared.config.listen;
    let table = ConnTable::new(l.max_connections_per_core, l.max_connections_per_ip);
    loop {
        let stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("<4>core {}: accept failed: {e}", app.ctx.core);
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(peer) = stream.peer_addr() else {
            // Already gone.
            continue;
        };
        let guard = match table.try_open(peer.ip()) {
            Ok(g) => g,
            Err(refusal) => {
                // Over a bound: close at once rather than queue.
                drop(stream);
                if table.log_due(Instant::now()) {
                    eprintln!(
                        "<4>core {}: closed a connection from {}: {refusal} ({} refused since start; logged at most every {} s)",
                        app.ctx.core,
                        peer.ip(),
                        table.refused(),
                        REFUSAL_LOG_PERIOD.as_secs()
                    );
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        glommio::spawn_local(async move {
            let _guard = guard;
            let stream = match &app.shared.tls {
                None => Conn::Plain(stream),
                Some(tls) => match tls.accept(stream).await {
                    Ok(crate::tls::Accepted::Tls(s)) => s,
                    Ok(crate::tls::Accepted::Plaintext(s)) => {
                        let timeout =
                            Duration::from_millis(app.shared.config.listen.head_timeout_ms);
                        crate::tls::answer_plaintext(s, &limits(&app), timeout).await;
                        return;
                    }
                    Err(e) => {
                        crate::tls::note_handshake_failure(app.ctx.core, peer.ip(), &e);
                        return;
                    }
                },
            };
            handle_connection(stream, app).await;
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
    // Browsers cannot set headers on a WebSocket: Kyutai's server takes the
    // token from `auth_id` there, and so does this one (upgrades only, so a
    // token in a URL is never needed for anything else).
    head.is_websocket_upgrade()
        && head.query_pairs().is_ok_and(|q| {
            q.iter()
                .any(|(k, v)| k == AUTH_QUERY_KEY && !v.is_empty() && ok(v))
        })
}

/// A session's query parameters, less the token.
fn session_query(head: &RequestHead) -> Result<Vec<(String, String)>, HttpError> {
    let mut q = head.query_pairs()?;
    q.retain(|(k, _)| k != AUTH_QUERY_KEY);
    Ok(q)
}

async fn handle_connection(mut stream: Conn, app: CoreApp) {
    let limits = limits(&app);
    let mut buf = Vec::new();
    let timeout = Duration::from_millis(app.shared.config.listen.head_timeout_ms);
    let head = match http::deadline(timeout, http::read_head(&mut stream, &mut buf, &limits)).await
    {
        Ok(h) => h,
        Err(e) => {
            if !matches!(e, HttpError::ClosedBeforeHead { .. }) {
                let _ = http::respond_error(&mut stream, &e).await;
            }
            return;
        }
    };
    let public =
        matches!(head.path.as_str(), "/health" | "/ready") || crate::web::is_public(&head.path);
    if !public && !authorized(&app, &head) {
        let _ = http::write_error(&mut stream, 401, "missing or wrong bearer token").await;
        return;
    }
    let result = route(&mut stream, &app, &head, &mut buf, &limits).await;
    match result {
        Ok(Route::Done) => {}
        Ok(Route::Chat) => {
            let query = match session_query(&head) {
                Ok(q) => q,
                Err(e) => {
                    let _ = http::respond_error(&mut stream, &e).await;
                    return;
                }
            };
            let max = app.shared.config.session.max_message_bytes;
            let config = http::ws_config(max, max);
            // The id is handed out with the upgrade: the client can follow
            // its own session's events from the start.
            let id = app.shared.session_id();
            let id_header = [("Moshid-Session-Id", id.to_string())];
            let headers = id_header.each_ref().map(|(n, v)| (*n, v.as_str()));
            if let Ok(ws) = http::accept_websocket_with(
                stream,
                &head,
                std::mem::take(&mut buf),
                config,
                &headers,
            )
            .await
            {
                ws_chat::run(ws, app, query, id).await;
            }
        }
        Ok(Route::MediaStream) => {
            let query = match session_query(&head) {
                Ok(q) => q,
                Err(e) => {
                    let _ = http::respond_error(&mut stream, &e).await;
                    return;
                }
            };
            let max = app.shared.config.session.max_message_bytes;
            let config = http::ws_config(max, max);
            if let Ok(ws) =
                http::accept_websocket(stream, &head, std::mem::take(&mut buf), config).await
            {
                crate::transport::media_streams::run(ws, app, query).await;
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
    MediaStream,
}

async fn route(
    stream: &mut Conn,
    app: &CoreApp,
    head: &RequestHead,
    buf: &mut Vec<u8>,
    limits: &HeadLimits,
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
        ("GET", "/v1/media-stream") if app.shared.config.media_streams.enabled => {
            if !head.is_websocket_upgrade() {
                http::write_error(stream, 426, "/v1/media-stream is a WebSocket endpoint").await?;
                return Ok(Route::Done);
            }
            Ok(Route::MediaStream)
        }
        ("GET", "/health") => {
            http::write_json(stream, 200, &serde_json::json!({"status": "ok"})).await?;
            Ok(Route::Done)
        }
        ("GET", "/ready") => {
            let ready = engine.ready.load(std::sync::atomic::Ordering::Acquire)
                && engine.admission().accepting();
            let status = if ready { 200 } else { 503 };
            http::write_json(stream, status, &serde_json::json!({ "ready": ready })).await?;
            Ok(Route::Done)
        }
        ("GET", "/capacity") => {
            let body = serde_json::json!({
                "capacity": engine.capacity(),
                "engine": engine.stats.snapshot(),
                "session_state": engine.session_state(),
                "rtp_sessions": app.shared.rtp.len(),
                "events": app.shared.events.sizes(),
                "phase_groups": engine.phase_groups,
            });
            http::write_json(stream, 200, &body).await?;
            Ok(Route::Done)
        }
        ("GET", "/metrics") => {
            let mut text = crate::metrics::export::render(engine);
            crate::events::metrics::append(&mut text, &app.shared.events);
            http::write_response(
                stream,
                200,
                crate::metrics::export::CONTENT_TYPE,
                text.as_bytes(),
                &[],
            )
            .await?;
            Ok(Route::Done)
        }
        ("GET", "/admin/metrics") => {
            let body = serde_json::json!({
                "enabled": engine.metrics.enabled(),
                "runtime_switch": app.shared.config.metrics.runtime_switch,
            });
            http::write_json(stream, 200, &body).await?;
            Ok(Route::Done)
        }
        ("POST", "/admin/metrics") => {
            if !app.shared.config.metrics.runtime_switch {
                http::write_error(
                    stream,
                    403,
                    "metrics.runtime_switch is false in the configuration",
                )
                .await?;
                return Ok(Route::Done);
            }
            let timeout = Duration::from_millis(app.shared.config.listen.head_timeout_ms);
            let body = http::deadline(timeout, http::read_body(stream, head, buf, limits)).await?;
            let on = match crate::metrics::parse_switch_body(body) {
                Ok(on) => on,
                Err(why) => {
                    http::write_error(stream, 400, &why).await?;
                    return Ok(Route::Done);
                }
            };
            let previous = engine.metrics.set_enabled(on);
            if previous != on {
                eprintln!(
                    "<6>metrics: stage timings {} (POST /admin/metrics on core {})",
                    if on { "on" } else { "off" },
                    app.ctx.core
                );
            }
            http::write_json(
                stream,
                200,
                &serde_json::json!({ "enabled": on, "previous": previous }),
            )
            .await?;
            Ok(Route::Done)
        }
        (_, path) if crate::events::sse::owns(path) => {
            crate::events::sse::handle(stream, app, head).await?;
            Ok(Route::Done)
        }
        (_, path) if crate::transport::rtp::control::owns(path) => {
            crate::transport::rtp::control::handle(stream, app, head, buf, limits).await?;
            Ok(Route::Done)
        }
        (_, path) if crate::web::owns(path) => {
            crate::web::handle(stream, app, head).await?;
            Ok(Route::Done)
        }
        (_, "/v1/media-stream") if app.shared.config.media_streams.enabled => {
            http::write_error(stream, 405, "method not allowed").await?;
            Ok(Route::Done)
        }
        (_, "/api/chat" | "/health" | "/ready" | "/capacity" | "/metrics" | "/admin/metrics") => {
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
    use super::{constant_time_eq, ConnRefusal, ConnTable};
    use std::net::IpAddr;

    #[test]
    fn per_address_limit_with_a_bounded_table() {
        let t = ConnTable::new(4, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let a_mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = t.try_open(a).unwrap();
        let a2 = t.try_open(a_mapped).unwrap();
        assert_eq!(
            t.try_open(a).err(),
            Some(ConnRefusal::AddressFull),
            "mapped IPv4 counts as the same address"
        );
        let b1 = t.try_open(b).unwrap();
        let b2 = t.try_open(b).unwrap();
        assert_eq!((t.open(), t.addresses()), (4, 2));
        assert_eq!(
            t.try_open("10.0.0.3".parse().unwrap()).err(),
            Some(ConnRefusal::CoreFull)
        );
        assert_eq!(t.addresses(), 2, "a refused address leaves no entry behind");
        drop(a1);
        let a3 = t.try_open(a).unwrap();
        drop((a2, a3));
        assert_eq!((t.open(), t.addresses()), (2, 1), "entry removed at 0");
        drop((b1, b2));
        assert_eq!((t.open(), t.addresses(), t.refused()), (0, 0, 2));
    }

    #[test]
    fn no_per_address_limit_keeps_no_table() {
        let t = ConnTable::new(3, 0);
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let guards: Vec<_> = (0..3).map(|_| t.try_open(ip).unwrap()).collect();
        assert_eq!(t.addresses(), 0);
        assert_eq!(t.try_open(ip).err(), Some(ConnRefusal::CoreFull));
        drop(guards);
        assert_eq!(t.open(), 0);
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
