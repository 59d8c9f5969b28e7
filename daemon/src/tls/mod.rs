//! Built-in TLS for the shared listener (`listen.tls_cert_file`,
//! `listen.tls_key_file`): the page, `wss://` and every endpoint on that port
//! are served over TLS, so a browser on another machine gets a secure
//! context (and with it the microphone) without a proxy.
//!
//! rustls with the ring provider (no cmake, no C toolchain beyond `cc`);
//! futures-rustls runs it over glommio's `TcpStream`. The certificate is
//! held by a resolver that every handshake asks, so [`ServerTls::reload`]
//! (on SIGHUP, see [`SighupReloader`]) swaps it for new handshakes while
//! established connections keep the session keys they have: no session is
//! dropped by a reload.
//!
//! Invariants:
//! - A handshake runs in the connection's own task, never in the accept
//!   loop, and is bounded by `listen.tls_handshake_timeout_ms`; a client that
//!   stalls or fails it is closed and counts only against its own connection.
//! - A reload that fails (unreadable file, no certificate, a key that does
//!   not match the certificate) changes nothing: the certificate in use
//!   stays, and the error is logged with the file it concerns.
//! - Only HTTP/1.1 is offered by ALPN (the listener speaks nothing else).
//! - Failed handshakes are logged at most every [`FAILURE_LOG_PERIOD`] per
//!   core, with the count since start, so a scan cannot flood the journal.

mod reload;

pub use reload::SighupReloader;

use crate::config::ListenConfig;
use crate::io::conn::Conn;
use futures_rustls::TlsAcceptor;
use glommio::net::TcpStream;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::cell::Cell;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// How often one core logs failed handshakes.
pub const FAILURE_LOG_PERIOD: Duration = Duration::from_secs(10);

/// A certificate or key that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("config key `{key}`: cannot read {path}: {source}")]
    Read {
        /// The config key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file holds no usable PEM item of the expected kind.
    #[error("config key `{key}`: {path}: {why}")]
    Content {
        /// The config key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// rustls refused the key or the configuration.
    #[error("config key `listen.tls_key_file`: {path}: {source}")]
    Rustls {
        /// The key file.
        path: PathBuf,
        /// rustls's error.
        source: rustls::Error,
    },
}

/// What a (re)load installed, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSummary {
    /// Certificates in the chain (leaf first).
    pub chain_len: usize,
    /// SHA-256 of the leaf certificate's DER, hex (what `openssl x509
    /// -fingerprint -sha256` prints, without the colons).
    pub leaf_sha256: String,
}

impl std::fmt::Display for CertSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "chain of {} certificate(s), leaf sha256 {}",
            self.chain_len, self.leaf_sha256
        )
    }
}

/// Hands every handshake the certificate in use now.
#[derive(Debug)]
struct CurrentCert(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // A poisoned lock still holds a complete certificate (the writer
        // only ever replaces the Arc).
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// The listener's TLS: the acceptor every core uses and the files it reloads.
pub struct ServerTls {
    acceptor: TlsAcceptor,
    current: Arc<CurrentCert>,
    provider: Arc<CryptoProvider>,
    cert_file: PathBuf,
    key_file: PathBuf,
    handshake_timeout: Duration,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// The listener's TLS from `listen.*`, or `None` when no certificate is
    /// configured (validation has already refused a certificate without a
    /// key and the reverse).
    pub fn from_config(listen: &ListenConfig) -> Result<Option<Arc<ServerTls>>, TlsError> {
        let (Some(cert_file), Some(key_file)) = (&listen.tls_cert_file, &listen.tls_key_file)
        else {
            return Ok(None);
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (key, _) = load_certified_key(cert_file, key_file, &provider)?;
        let current = Arc::new(CurrentCert(RwLock::new(Arc::new(key))));
        let mut config = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Rustls {
                path: key_file.clone(),
                source,
            })?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Arc::new(ServerTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            current,
            provider,
            cert_file: cert_file.clone(),
            key_file: key_file.clone(),
            handshake_timeout: Duration::from_millis(listen.tls_handshake_timeout_ms),
        })))
    }

    /// The certificate in use, described.
    pub fn summary(&self) -> CertSummary {
        let key = self.current.0.read().unwrap_or_else(|p| p.into_inner());
        summarize(&key.cert)
    }

    /// Reads the files again and, if they hold a usable certificate and key,
    /// uses them for every handshake from now on. Established connections
    /// are not touched. On error nothing changes.
    pub fn reload(&self) -> Result<CertSummary, TlsError> {
        let (key, summary) = load_certified_key(&self.cert_file, &self.key_file, &self.provider)?;
        *self.current.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
        Ok(summary)
    }

    /// Runs the server side of a handshake on `tcp`, bounded by
    /// `listen.tls_handshake_timeout_ms`. A client whose first byte cannot
    /// start a TLS record (plain HTTP sent to this port) is handed back as
    /// [`Accepted::Plaintext`], so that it can be told to use `https://`.
    /// Must run inside a glommio executor.
    pub async fn accept(&self, tcp: TcpStream) -> Result<Accepted, HandshakeError> {
        let handshake = async {
            let mut first = [0u8; 1];
            match tcp.peek(&mut first).await {
                Ok(0) => return Err(HandshakeError::Closed),
                Ok(_) if first[0] != TLS_HANDSHAKE_RECORD => return Ok(Accepted::Plaintext(tcp)),
                Ok(_) => {}
                Err(e) => return Err(HandshakeError::Failed(e.into())),
            }
            match self.acceptor.accept(tcp).await {
                Ok(stream) => Ok(Accepted::Tls(Conn::Tls(Box::new(stream)))),
                Err(e) => Err(HandshakeError::Failed(e)),
            }
        };
        match glommio::timer::timeout(self.handshake_timeout, async { Ok(handshake.await) }).await {
            Ok(result) => result,
            Err(_) => Err(HandshakeError::Timeout(self.handshake_timeout)),
        }
    }
}

/// The first byte of a TLS handshake record (RFC 8446 §5.1, content type 22).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// A connection after [`ServerTls::accept`].
pub enum Accepted {
    /// The handshake completed.
    Tls(Conn),
    /// The client speaks plain HTTP to the TLS port.
    Plaintext(TcpStream),
}

/// Answers a plain HTTP request made to the TLS port: `GET`/`HEAD` are
/// redirected (308) to the same URL over `https://`, anything else gets a
/// 400 that says to use TLS. Bounded like any request head.
pub async fn answer_plaintext(
    tcp: TcpStream,
    limits: &crate::http::HeadLimits,
    head_timeout: Duration,
) {
    use crate::http;
    let mut stream = Conn::Plain(tcp);
    let mut buf = Vec::new();
    let read = http::deadline(head_timeout, http::read_head(&mut stream, &mut buf, limits)).await;
    let head = match read {
        Ok(head) => head,
        Err(e) => {
            if !matches!(e, http::HttpError::ClosedBeforeHead { .. }) {
                let _ = http::respond_error(&mut stream, &e).await;
            }
            return;
        }
    };
    let host = head.header("host").filter(|h| !h.is_empty());
    match host {
        Some(host) if matches!(head.method.as_str(), "GET" | "HEAD") => {
            let query = head
                .query
                .as_deref()
                .map_or(String::new(), |q| format!("?{q}"));
            let location = format!("https://{host}{}{query}", head.path);
            let _ = http::write_response(
                &mut stream,
                308,
                "text/plain; charset=utf-8",
                b"This port serves https:// only.\n",
                &[("Location", &location)],
            )
            .await;
        }
        _ => {
            let _ = http::write_error(
                &mut stream,
                400,
                "this port serves TLS only: use https:// or wss://",
            )
            .await;
        }
    }
    http::close_gracefully(stream, Duration::from_secs(1)).await;
}

/// Why a handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The client closed before sending anything.
    #[error("connection closed before a TLS handshake")]
    Closed,
    /// The client did not finish within the timeout.
    #[error("no TLS handshake within {0:?}")]
    Timeout(Duration),
    /// The handshake failed (a client that does not trust the certificate,
    /// plain HTTP sent to the TLS port, a scanner).
    #[error("TLS handshake failed: {0}")]
    Failed(std::io::Error),
}

thread_local! {
    /// This core's failed handshakes since start, and when it last logged.
    static FAILURES: Cell<(u64, Option<Instant>)> = const { Cell::new((0, None)) };
}

/// Counts a failed handshake on this core and logs it unless one was logged
/// less than [`FAILURE_LOG_PERIOD`] ago.
pub fn note_handshake_failure(core: usize, peer: IpAddr, e: &HandshakeError) {
    if matches!(e, HandshakeError::Closed) {
        // A probe that connects and closes (health checkers do): not news.
        return;
    }
    let now = Instant::now();
    let (count, last) = FAILURES.with(Cell::get);
    let count = count + 1;
    let due = last.is_none_or(|t| now.saturating_duration_since(t) >= FAILURE_LOG_PERIOD);
    FAILURES.with(|f| f.set((count, if due { Some(now) } else { last })));
    if due {
        eprintln!(
            "<5>core {core}: {e} (from {peer}; {count} failed on this core since start; logged at most every {} s)",
            FAILURE_LOG_PERIOD.as_secs()
        );
    }
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        key,
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a PEM chain and key and checks that they belong together.
fn load_certified_key(
    cert_file: &Path,
    key_file: &Path,
    provider: &CryptoProvider,
) -> Result<(CertifiedKey, CertSummary), TlsError> {
    const CERT_KEY: &str = "listen.tls_cert_file";
    const KEY_KEY: &str = "listen.tls_key_file";
    let content = |key, path: &Path, why: String| TlsError::Content {
        key,
        path: path.to_path_buf(),
        why,
    };
    let pem = read(CERT_KEY, cert_file)?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| content(CERT_KEY, cert_file, format!("bad PEM: {e}")))?;
    if chain.is_empty() {
        return Err(content(
            CERT_KEY,
            cert_file,
            "no `BEGIN CERTIFICATE` block".into(),
        ));
    }
    let pem = read(KEY_KEY, key_file)?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        content(
            KEY_KEY,
            key_file,
            format!("no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {e}"),
        )
    })?;
    let summary = summarize(&chain);
    let certified =
        CertifiedKey::from_der(chain, key, provider).map_err(|source| TlsError::Rustls {
            path: key_file.to_path_buf(),
            source,
        })?;
    Ok((certified, summary))
}

fn summarize(chain: &[CertificateDer<'static>]) -> CertSummary {
    let leaf_sha256 = chain.first().map_or_else(String::new, |leaf| {
        ring::digest::digest(&ring::digest::SHA256, leaf.as_ref())
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    });
    CertSummary {
        chain_len: chain.len(),
        leaf_sha256,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let c = dir.join(format!("{name}.crt"));
        let k = dir.join(format!("{name}.key"));
        std::fs::write(&c, cert.cert.pem()).unwrap();
        std::fs::write(&k, cert.key_pair.serialize_pem()).unwrap();
        (c, k)
    }

    fn listen(cert: &Path, key: &Path) -> ListenConfig {
        ListenConfig {
            tls_cert_file: Some(cert.to_path_buf()),
            tls_key_file: Some(key.to_path_buf()),
            ..ListenConfig::default()
        }
    }

    #[test]
    fn loads_reloads_and_keeps_the_old_certificate_on_a_bad_reload() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = write_pair(dir.path(), "a");
        let tls = ServerTls::from_config(&listen(&c, &k)).unwrap().unwrap();
        let first = tls.summary();
        assert_eq!(first.chain_len, 1);
        assert_eq!(first.leaf_sha256.len(), 64);

        // New files at the same paths: the reload takes them.
        let (c2, k2) = write_pair(dir.path(), "b");
        std::fs::rename(&c2, &c).unwrap();
        std::fs::rename(&k2, &k).unwrap();
        let second = tls.reload().unwrap();
        assert_ne!(second.leaf_sha256, first.leaf_sha256);
        assert_eq!(tls.summary(), second);

        // A key of another certificate: refused, the current one stays.
        let (_, other_key) = write_pair(dir.path(), "c");
        std::fs::copy(&other_key, &k).unwrap();
        let e = tls.reload().unwrap_err().to_string();
        assert!(e.contains("listen.tls_key_file"), "{e}");
        assert_eq!(tls.summary(), second);

        // A missing certificate file: named by its key.
        std::fs::remove_file(&c).unwrap();
        let e = tls.reload().unwrap_err().to_string();
        assert!(
            e.contains("listen.tls_cert_file") && e.contains("cannot read"),
            "{e}"
        );
        assert_eq!(tls.summary(), second);
    }

    #[test]
    fn refuses_files_without_the_expected_pem() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = write_pair(dir.path(), "a");
        // The certificate file given as the key and the reverse.
        let e = ServerTls::from_config(&listen(&k, &c))
            .unwrap_err()
            .to_string();
        assert!(e.contains("listen.tls_cert_file"), "{e}");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a pem file\n").unwrap();
        let e = ServerTls::from_config(&listen(&c, &junk))
            .unwrap_err()
            .to_string();
        assert!(e.contains("listen.tls_key_file"), "{e}");
        assert!(ServerTls::from_config(&ListenConfig::default())
            .unwrap()
            .is_none());
    }
}
