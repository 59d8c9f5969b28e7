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
//! holds more entries than there are open connections. Until its request is
//! complete — the TLS handshake when the listener serves TLS (bounded by
//! `listen.tls_handshake_timeout_ms`, run in the connection's task, not in
//! the accept loop), then the head and body (a Media Streams WebSocket
//! until its `start` event) — a connection is pending in the core's
//! [`PendingBudget`](super::pending::PendingBudget): it may be closed to
//! make room for a newer one, and the request must be complete within
//! `listen.head_timeout_ms`; after that it is never evicted. A request is
//! routed only when [`crate::routes::ROUTES`] holds its method and path
//! (404 or 405 otherwise), so that table is the list of endpoints. Endpoints
//! other than `/health`, `/ready` and the page need the bearer token when
//! one is configured (WebSocket upgrades may carry it as the `auth_id`
//! query parameter, as browsers cannot set headers), compared in constant
//! time and never logged. `GET /metrics` serves Prometheus text; `POST
//! /admin/metrics` with `{"enabled": true|false}` switches the stage metrics
//! at run time (unless `metrics.runtime_switch` is false). Refusals and
//! accept errors are counted in [`ListenerCounters`] (exported by
//! `/metrics`) and logged at most once per [`CONNECTION_LOG_PERIOD`].

use super::accept_pace::AcceptPace;
use super::app::CoreApp;
use super::conn::Conn;
use super::log_gate::{LogGate, CONNECTION_LOG_PERIOD};
use super::pending::{Pending, PendingEnd};
use crate::http::{self, HeadLimits, HttpError, RequestHead};
use crate::metrics::connections::{bump, set, ListenerCounters};
use crate::transport::ws_chat;
use glommio::net::TcpListener;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
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

/// One listener's open connections on one core, in all and per client
/// address.
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
    counters: Arc<ListenerCounters>,
    log: LogGate,
}

/// One open connection; dropping it gives its place back.
pub struct ConnGuard {
    table: Rc<ConnTable>,
    ip: Option<IpAddr>,
}

impl ConnTable {
    /// A table whose bounds and counters are `counters` (`max_open`
    /// connections, `max_per_ip` per address, 0: no per-address limit).
    pub fn new(counters: Arc<ListenerCounters>) -> Rc<ConnTable> {
        Rc::new(ConnTable {
            open: Cell::new(0),
            per_ip: RefCell::new(HashMap::new()),
            max_open: counters.max_open,
            max_per_ip: counters.max_per_ip,
            counters,
            log: LogGate::new(CONNECTION_LOG_PERIOD),
        })
    }

    /// The table of listener `name` on `app`'s core, its counters published
    /// in the metrics registry.
    pub fn register(
        app: &CoreApp,
        name: &'static str,
        max_open: usize,
        max_per_ip: usize,
    ) -> Rc<Self> {
        let counters = ListenerCounters::new(app.ctx.core, name, max_open, max_per_ip);
        Self::new(app.ctx.engine.metrics.register_listener(counters))
    }

    /// Takes a place for a connection from `ip`, or says why there is none.
    pub fn try_open(self: &Rc<Self>, ip: IpAddr) -> Result<ConnGuard, ConnRefusal> {
        if self.open.get() >= self.max_open {
            bump(&self.counters.refused_full);
            return Err(ConnRefusal::CoreFull);
        }
        let mut key = None;
        if self.max_per_ip > 0 {
            // An IPv4 client seen through an IPv6 socket counts as itself.
            let ip = ip.to_canonical();
            let mut map = self.per_ip.borrow_mut();
            let count = map.entry(ip).or_insert(0);
            if *count >= self.max_per_ip {
                // (An existing entry: `max_per_ip` ≥ 1.)
                bump(&self.counters.refused_address);
                return Err(ConnRefusal::AddressFull);
            }
            *count += 1;
            key = Some(ip);
            set(&self.counters.addresses, map.len());
        }
        self.open.set(self.open.get() + 1);
        set(&self.counters.open, self.open.get());
        bump(&self.counters.accepted);
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
        self.counters.refused()
    }

    /// Counts a connection closed at once because its address may not
    /// connect, and logs it (bounded).
    pub fn refuse_not_allowed(&self, core: usize, ip: IpAddr, why: &dyn std::fmt::Display) {
        bump(&self.counters.refused_not_allowed);
        self.log_refusal(core, ip, why);
    }

    /// Logs a refusal at most once per [`CONNECTION_LOG_PERIOD`], with the
    /// total so far.
    pub fn log_refusal(&self, core: usize, ip: IpAddr, why: &dyn std::fmt::Display) {
        if self.log.due(Instant::now()) {
            eprintln!(
                "<4>core {core}: closed a {} connection from {ip}: {why} ({} refused since start; logged at most every {} s)",
                self.counters.listener,
                self.refused(),
                self.log.period_secs()
            );
        }
    }

    /// The next connection `listener` accepts, with its peer's address, paced
    /// by `pace` (a flood must not hold the rest of the core off). A failed
    /// `accept` is counted and logged ([`ConnTable::accept_failed`]) and
    /// retried 10 ms later; a connection already gone is skipped.
    pub async fn accept(
        &self,
        listener: &TcpListener,
        pace: &AcceptPace,
        core: usize,
    ) -> (glommio::net::TcpStream, SocketAddr) {
        loop {
            match listener.accept().await {
                Ok(stream) => {
                    pace.accepted().await;
                    if let Ok(peer) = stream.peer_addr() {
                        return (stream, peer);
                    }
                }
                Err(e) => {
                    self.accept_failed(core, &e);
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    /// Counts a failed `accept` and logs it (bounded).
    pub fn accept_failed(&self, core: usize, e: &dyn std::fmt::Display) {
        bump(&self.counters.accept_errors);
        if self.log.due(Instant::now()) {
            eprintln!(
                "<4>core {core}: {} accept failed: {e} ({} since start; logged at most every {} s)",
                self.counters.listener,
                self.counters
                    .accept_errors
                    .load(std::sync::atomic::Ordering::Relaxed),
                self.log.period_secs()
            );
        }
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let t = &self.table;
        t.open.set(t.open.get() - 1);
        set(&t.counters.open, t.open.get());
        if let Some(ip) = self.ip {
            let mut map = t.per_ip.borrow_mut();
            if let Some(count) = map.get_mut(&ip) {
                *count -= 1;
                if *count == 0 {
                    map.remove(&ip);
                }
            }
            set(&t.counters.addresses, map.len());
        }
    }
}

/// A listening socket on `addr` for this executor: `SO_REUSEPORT` (every
/// I/O core binds the same address; the kernel spreads connections) and an
/// accept queue of `backlog` (glommio's own `bind` fixes it at 1024).
pub fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::{FromRawFd, IntoRawFd};
    let domain = if addr.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let socket = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog.min(i32::MAX as u32) as i32)?;
    // SAFETY: the descriptor is a bound, listening TCP socket whose only
    // owner was `socket`; `into_raw_fd` gives that ownership to the listener.
    Ok(unsafe { TcpListener::from_raw_fd(socket.into_raw_fd()) })
}

/// Accepts connections until the task is cancelled.
pub async fn accept_loop(listener: TcpListener, app: CoreApp) {
    let l = &app.shared.config.listen;
    let table = ConnTable::register(
        &app,
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
        glommio::spawn_local(async move {
            let _guard = guard;
            // The TLS handshake is part of the pending phase: one call puts
            // it under the core's budget (evictable, counted).
            let stream = match &app.shared.tls {
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
            handle_connection(stream, app, pending).await;
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

fn is_public(head: &RequestHead) -> bool {
    matches!(head.path.as_str(), "/health" | "/ready") || crate::web::is_public(&head.path)
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

async fn handle_connection(mut stream: Conn, app: CoreApp, pending: Pending) {
    let limits = limits(&app);
    let mut buf = Vec::new();
    let timeout = Duration::from_millis(app.shared.config.listen.head_timeout_ms);
    let request = pending
        .within(timeout, read_request(&mut stream, &mut buf, &limits, &app))
        .await;
    let head = match request {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            pending.complete();
            if !matches!(e, HttpError::ClosedBeforeHead { .. }) {
                let _ = http::respond_error(&mut stream, &e).await;
            }
            return;
        }
        Err(PendingEnd::TimedOut) => {
            let _ = http::respond_error(&mut stream, &HttpError::Timeout).await;
            return;
        }
        // Closed to make room for a newer connection: no answer.
        Err(PendingEnd::Evicted) => return,
    };
    // Started, except a Media Streams WebSocket, which is pending until its
    // `start` event.
    let media_stream = head.method == "GET"
        && head.path == "/v1/media-stream"
        && app.shared.config.media_streams.enabled
        && head.is_websocket_upgrade();
    let mut pending = Some(pending);
    if !media_stream {
        pending.take().expect("not taken yet").complete();
    }
    if !is_public(&head) && !authorized(&app, &head) {
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
            let Some(pending) = pending else {
                return;
            };
            if let Ok(ws) =
                http::accept_websocket(stream, &head, std::mem::take(&mut buf), config).await
            {
                crate::transport::media_streams::run(ws, app, query, pending).await;
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

/// Answers 404 or 405 to a request [`crate::routes::ROUTES`] does not hold
/// (`false`); `true` when it holds it.
async fn in_route_table(
    stream: &mut Conn,
    app: &CoreApp,
    head: &RequestHead,
) -> Result<bool, HttpError> {
    use crate::routes::{resolve, Resolved, Switch};
    let config = &app.shared.config;
    let on = |s: Switch| match s {
        Switch::MediaStreams => config.media_streams.enabled,
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
    head: &RequestHead,
    buf: &mut Vec<u8>,
    limits: &HeadLimits,
) -> Result<Route, HttpError> {
    if !in_route_table(stream, app, head).await? {
        return Ok(Route::Done);
    }
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
        (_, path) if crate::transport::sip::control::owns(path) => {
            crate::transport::sip::control::handle(stream, app, head, buf, limits).await?;
            Ok(Route::Done)
        }
        (_, path) if crate::web::owns(path) => {
            crate::web::handle(stream, app, head).await?;
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
    use super::{constant_time_eq, ConnRefusal, ConnTable, ListenerCounters};
    use std::net::IpAddr;
    use std::rc::Rc;
    use std::sync::Arc;

    fn table(max_open: usize, max_per_ip: usize) -> Rc<ConnTable> {
        ConnTable::new(Arc::new(ListenerCounters::new(
            0, "test", max_open, max_per_ip,
        )))
    }

    #[test]
    fn per_address_limit_with_a_bounded_table() {
        let t = table(4, 2);
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
        let t = table(3, 0);
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
