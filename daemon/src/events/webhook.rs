//! Webhooks: each session's final record, with its whole text, POSTed as
//! JSON to `session.webhook_url` or to the URL the session named at its
//! creation (when it starts with one of `events.session_webhook_prefixes`).
//!
//! Delivery runs on its own threads (`events.webhook_workers`), never on an
//! I/O core: a session's end only offers its record to a bounded queue
//! (`events.webhook_queue`; full → dropped and counted), so a receiver that
//! is slow, dead or never answers costs the calls nothing. A worker makes
//! one attempt per `events.webhook_timeout_ms` (connect, TLS, request,
//! response head) and retries connection failures, timeouts, 5xx, 408 and
//! 429 up to `events.webhook_retries` times, one second apart, doubling.
//!
//! HTTP/1.1, one request per connection (`Connection: close`), the response
//! head parsed with `httparse` and its body ignored; `https://` through
//! rustls (ring), the server checked against `events.webhook_ca_file` or
//! the system's CA bundle. Host names are resolved by the worker
//! (`getaddrinfo`, bounded by the resolver's own timeouts).
//!
//! Invariants: the queue and the workers are bounded by configuration; the
//! workers start at the first delivery; at shutdown the daemon waits for
//! the queue to empty for at most one attempt's time ([`Webhooks::drain`]).

pub use crate::http::url::{WebhookUrl, MAX_URL_BYTES};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Largest response head read.
const MAX_RESPONSE_HEAD_BYTES: usize = 16 * 1024;
/// Where the system's CA bundle may be, in order.
const SYSTEM_CA_FILES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Where a session's record goes, chosen at its creation.
pub fn choose(
    requested: Option<&str>,
    default: Option<&str>,
    prefixes: &[String],
) -> Result<Option<WebhookUrl>, String> {
    match requested.filter(|r| !r.is_empty()) {
        Some(r) => {
            if prefixes.is_empty() {
                return Err(
                    "sessions may not name their own webhook here (events.session_webhook_prefixes is empty)"
                        .to_string(),
                );
            }
            if !prefixes.iter().any(|p| r.starts_with(p.as_str())) {
                return Err(format!(
                    "`{r}` does not start with one of events.session_webhook_prefixes"
                ));
            }
            WebhookUrl::parse(r).map(Some)
        }
        // Checked at start.
        None => Ok(default.and_then(|d| WebhookUrl::parse(d).ok())),
    }
}

/// The webhook of a session created with `pairs` (query string, custom
/// parameters: the last `webhook_url` wins), else `session.webhook_url`.
pub fn from_pairs(
    pairs: &[(String, String)],
    cfg: &crate::config::Config,
) -> Result<Option<WebhookUrl>, String> {
    let requested = pairs
        .iter()
        .rev()
        .find(|(k, _)| k == "webhook_url")
        .map(|(_, v)| v.as_str());
    choose(
        requested,
        cfg.session.webhook_url.as_deref(),
        &cfg.events.session_webhook_prefixes,
    )
    .map_err(|e| format!("parameter `webhook_url`: {e}"))
}

/// `session.webhook_url`, for sessions that cannot name their own.
pub fn default_for(cfg: &crate::config::Config) -> Option<WebhookUrl> {
    choose(None, cfg.session.webhook_url.as_deref(), &[]).unwrap_or(None)
}

/// Counters of deliveries (always on).
#[derive(Debug, Default)]
pub struct WebhookCounters {
    /// Records delivered (2xx).
    pub delivered: AtomicU64,
    /// Records given up on (every attempt failed, or a final 4xx).
    pub failed: AtomicU64,
    /// Records dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Attempts that failed (retried or not).
    pub failed_attempts: AtomicU64,
    /// Records waiting or being delivered now.
    pub pending: AtomicU64,
}

struct Delivery {
    url: WebhookUrl,
    body: Vec<u8>,
    session: u64,
}

/// What the workers need.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// Worker threads.
    pub workers: usize,
    /// Queue bound.
    pub queue: usize,
    /// Time of one attempt.
    pub timeout: Duration,
    /// Further attempts.
    pub retries: u32,
    /// CA bundle for https.
    pub ca_file: Option<PathBuf>,
}

/// The daemon's webhook queue and workers.
pub struct Webhooks {
    settings: WebhookSettings,
    tx: OnceLock<Option<SyncSender<Delivery>>>,
    tls: OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
    /// Counters.
    pub counters: WebhookCounters,
}

impl Webhooks {
    /// No worker runs until the first delivery.
    pub fn new(settings: WebhookSettings) -> Arc<Self> {
        Arc::new(Webhooks {
            settings,
            tx: OnceLock::new(),
            tls: OnceLock::new(),
            counters: WebhookCounters::default(),
        })
    }

    /// Offers a record for delivery; never blocks (a full queue drops it,
    /// counted and logged).
    pub fn enqueue(self: &Arc<Self>, url: WebhookUrl, body: Vec<u8>, session: u64) {
        let tx = self.tx.get_or_init(|| self.start_workers());
        let Some(tx) = tx else {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.counters.pending.fetch_add(1, Ordering::Relaxed);
        match tx.try_send(Delivery { url, body, session }) {
            Ok(()) => {}
            Err(TrySendError::Full(d) | TrySendError::Disconnected(d)) => {
                self.counters.pending.fetch_sub(1, Ordering::Relaxed);
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "<4>webhook: record of session {} dropped: {} records already wait (events.webhook_queue)",
                    d.session, self.settings.queue
                );
            }
        }
    }

    fn start_workers(self: &Arc<Self>) -> Option<SyncSender<Delivery>> {
        let (tx, rx) = sync_channel::<Delivery>(self.settings.queue);
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for i in 0..self.settings.workers {
            let (me, rx) = (self.clone(), rx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("moshid-webhook-{i}"))
                .spawn(move || me.work(&rx));
            match spawned {
                Ok(_) => started += 1,
                Err(e) => eprintln!("<3>webhook: cannot start worker {i}: {e}"),
            }
        }
        (started > 0).then_some(tx)
    }

    fn work(&self, rx: &Mutex<Receiver<Delivery>>) {
        loop {
            let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
            let Ok(d) = next else { return };
            self.deliver(&d);
            self.counters.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn deliver(&self, d: &Delivery) {
        let attempts = self.settings.retries + 1;
        for attempt in 1..=attempts {
            let outcome = self.post(d);
            let retry = match &outcome {
                Ok(status) if (200..300).contains(status) => {
                    self.counters.delivered.fetch_add(1, Ordering::Relaxed);
                    eprintln!(
                        "<6>webhook: record of session {} delivered to {} ({status}, attempt {attempt})",
                        d.session, d.url.text
                    );
                    return;
                }
                Ok(status) => *status >= 500 || *status == 408 || *status == 429,
                Err(_) => true,
            };
            self.counters
                .failed_attempts
                .fetch_add(1, Ordering::Relaxed);
            let why = match outcome {
                Ok(status) => format!("answered {status}"),
                Err(e) => e,
            };
            eprintln!(
                "<4>webhook: record of session {} to {}: attempt {attempt}/{attempts} failed: {why}",
                d.session, d.url.text
            );
            if !retry || attempt == attempts {
                break;
            }
            std::thread::sleep(Duration::from_secs(1 << (attempt - 1).min(6)));
        }
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        eprintln!(
            "<4>webhook: gave up on the record of session {} to {}",
            d.session, d.url.text
        );
    }

    /// One attempt: the response's status.
    fn post(&self, d: &Delivery) -> Result<u16, String> {
        let deadline = Instant::now() + self.settings.timeout;
        let left = || {
            deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| "timed out".to_string())
        };
        let url = &d.url;
        let addrs: Vec<SocketAddr> = (url.host.as_str(), url.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", url.host))?
            .collect();
        let mut tcp = None;
        let mut last_error = format!("{} resolves to no address", url.host);
        for a in addrs {
            match TcpStream::connect_timeout(&a, left()?) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last_error = format!("connect {a}: {e}"),
            }
        }
        let tcp = tcp.ok_or(last_error)?;
        let _ = tcp.set_nodelay(true);
        let control = tcp.try_clone().map_err(|e| e.to_string())?;
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: moshid/{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nMoshid-Session-Id: {}\r\nConnection: close\r\n\r\n",
            url.target,
            url.host_header,
            env!("CARGO_PKG_VERSION"),
            d.body.len(),
            d.session
        );
        if url.https {
            let config = self.tls_config()?;
            let name = ServerName::try_from(url.host.clone())
                .map_err(|e| format!("`{}` is not a TLS server name: {e}", url.host))?;
            let conn = rustls::ClientConnection::new(config, name).map_err(|e| e.to_string())?;
            let mut s = rustls::StreamOwned::new(conn, tcp);
            exchange(&mut s, &control, &head, &d.body, left)
        } else {
            let mut s = tcp;
            exchange(&mut s, &control, &head, &d.body, left)
        }
    }

    fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        self.tls
            .get_or_init(|| tls_client_config(self.settings.ca_file.as_deref()))
            .clone()
    }

    /// Waits (at most `limit`) until no record waits or is being delivered;
    /// returns how many are left.
    pub fn drain(&self, limit: Duration) -> u64 {
        let deadline = Instant::now() + limit;
        loop {
            let left = self.counters.pending.load(Ordering::Relaxed);
            if left == 0 || Instant::now() >= deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Writes the request and reads the response head, every step bounded by
/// what is left of the attempt's time.
fn exchange<S: Read + Write>(
    s: &mut S,
    control: &TcpStream,
    head: &str,
    body: &[u8],
    left: impl Fn() -> Result<Duration, String>,
) -> Result<u16, String> {
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => "timed out".to_string(),
        _ => e.to_string(),
    };
    control.set_write_timeout(Some(left()?)).map_err(io)?;
    s.write_all(head.as_bytes()).map_err(io)?;
    s.write_all(body).map_err(io)?;
    s.flush().map_err(io)?;
    let mut buf = vec![0u8; MAX_RESPONSE_HEAD_BYTES];
    let mut n = 0;
    loop {
        control.set_read_timeout(Some(left()?)).map_err(io)?;
        let got = s.read(&mut buf[n..]).map_err(io)?;
        if got == 0 {
            return Err("connection closed before a response".to_string());
        }
        n += got;
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf[..n]) {
            Ok(httparse::Status::Complete(_)) => {
                return resp.code.ok_or_else(|| "no status".to_string())
            }
            Ok(httparse::Status::Partial) if n < buf.len() => {}
            Ok(httparse::Status::Partial) => return Err("response head too large".to_string()),
            Err(e) => return Err(format!("bad response: {e}")),
        }
    }
}

/// A TLS client configuration trusting `ca_file`, else the system bundle.
fn tls_client_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    let file = match ca_file {
        Some(f) => f.to_path_buf(),
        None => SYSTEM_CA_FILES
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or_else(|| "no system CA bundle found (set events.webhook_ca_file)".to_string())?,
    };
    let mut roots = rustls::RootCertStore::empty();
    let certs =
        CertificateDer::pem_file_iter(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("{}: {e}", file.display()))?;
        // A bundle may hold certificates webpki cannot use; skip those.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(format!("{}: no usable CA certificate", file.display()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_session_urls_need_a_prefix() {
        let prefixes = vec!["http://127.0.0.1:9/".to_string()];
        assert_eq!(choose(None, None, &prefixes), Ok(None));
        let d = choose(None, Some("http://h/d"), &[]).unwrap().unwrap();
        assert_eq!(d.text, "http://h/d");
        let s = choose(Some("http://127.0.0.1:9/x"), Some("http://h/d"), &prefixes)
            .unwrap()
            .unwrap();
        assert_eq!(s.port, 9);
        assert!(choose(Some("http://10.0.0.1/x"), None, &prefixes)
            .unwrap_err()
            .contains("session_webhook_prefixes"));
        assert!(choose(Some("http://127.0.0.1:9/x"), None, &[])
            .unwrap_err()
            .contains("is empty"));
    }

    /// An `https://` receiver whose certificate the configured CA signed
    /// gets the record; with the system bundle instead (which does not
    /// know that CA) the attempt fails.
    #[test]
    fn delivers_over_tls_to_a_server_the_ca_vouches_for() {
        use rustls::pki_types::PrivateKeyDer;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls");
        let certs: Vec<CertificateDer> = CertificateDer::pem_file_iter(dir.join("server.pem"))
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .unwrap(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut requests = Vec::new();
            for _ in 0..2 {
                let (tcp, _) = listener.accept().unwrap();
                tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let conn = rustls::ServerConnection::new(server.clone()).unwrap();
                let mut s = rustls::StreamOwned::new(conn, tcp);
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                while !req.ends_with(b"}") {
                    match s.read(&mut buf) {
                        Ok(n) if n > 0 => req.extend_from_slice(&buf[..n]),
                        // The client refused our certificate.
                        _ => break,
                    }
                }
                if req.ends_with(b"}") {
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
                    let _ = s.flush();
                }
                requests.push(String::from_utf8_lossy(&req).into_owned());
            }
            requests
        });
        let url = WebhookUrl::parse(&format!("https://127.0.0.1:{}/tls", addr.port())).unwrap();
        let settings = |ca_file| WebhookSettings {
            workers: 1,
            queue: 4,
            timeout: Duration::from_secs(10),
            retries: 0,
            ca_file,
        };
        let trusted = Webhooks::new(settings(Some(dir.join("ca.pem"))));
        trusted.enqueue(url.clone(), br#"{"tls":true}"#.to_vec(), 3);
        assert_eq!(trusted.drain(Duration::from_secs(10)), 0);
        let untrusted = Webhooks::new(settings(None));
        untrusted.enqueue(url, br#"{"tls":false}"#.to_vec(), 4);
        assert_eq!(untrusted.drain(Duration::from_secs(10)), 0);
        let requests = server.join().unwrap();
        assert!(
            requests[0].starts_with("POST /tls HTTP/1.1\r\n"),
            "{}",
            requests[0]
        );
        assert!(requests[0].ends_with(r#"{"tls":true}"#));
        assert!(!requests[1].contains("tls"), "{}", requests[1]);
        assert_eq!(trusted.counters.delivered.load(Ordering::Relaxed), 1);
        assert_eq!(untrusted.counters.failed.load(Ordering::Relaxed), 1);
    }

    /// A receiver that answers 503 then 204: one failed attempt, then
    /// delivered, the body as sent.
    #[test]
    fn retries_then_delivers() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut bodies = Vec::new();
            for status in ["503 Service Unavailable", "204 No Content"] {
                let (mut s, _) = listener.accept().unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                while !req.ends_with(b"}") {
                    let n = s.read(&mut buf).unwrap();
                    assert!(n > 0);
                    req.extend_from_slice(&buf[..n]);
                }
                write!(s, "HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").unwrap();
                bodies.push(String::from_utf8(req).unwrap());
            }
            bodies
        });
        let hooks = Webhooks::new(WebhookSettings {
            workers: 1,
            queue: 4,
            timeout: Duration::from_secs(10),
            retries: 2,
            ca_file: None,
        });
        let url = WebhookUrl::parse(&format!("http://{addr}/hook")).unwrap();
        hooks.enqueue(url, br#"{"x":1}"#.to_vec(), 9);
        let bodies = server.join().unwrap();
        assert_eq!(hooks.drain(Duration::from_secs(10)), 0);
        assert!(
            bodies[1].starts_with("POST /hook HTTP/1.1\r\n"),
            "{}",
            bodies[1]
        );
        assert!(bodies[1].contains("\r\nMoshid-Session-Id: 9\r\n"));
        assert!(bodies[1].ends_with("\r\n\r\n{\"x\":1}"));
        let c = &hooks.counters;
        assert_eq!(c.delivered.load(Ordering::Relaxed), 1);
        assert_eq!(c.failed_attempts.load(Ordering::Relaxed), 1);
        assert_eq!(c.failed.load(Ordering::Relaxed), 0);
    }
}
