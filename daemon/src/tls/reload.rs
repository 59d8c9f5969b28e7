//! SIGHUP: reload the listener's certificate (`systemctl reload moshid`,
//! certbot's deploy hook, `kill -HUP`).
//!
//! Invariants: the handler is installed for the daemon's whole serving life,
//! so SIGHUP never falls back to its default action (terminate) — without
//! TLS it is logged and ignored. The reload runs on this module's own thread,
//! never on an I/O core or the engine; sessions are not touched.

use super::ServerTls;
use crate::log_record::{LogLine, Record};
use signal_hook::consts::SIGHUP;
use signal_hook::iterator::{Handle, Signals};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The thread that reloads on SIGHUP; dropping it stops the thread.
pub struct SighupReloader {
    handle: Handle,
    thread: Option<JoinHandle<()>>,
}

impl SighupReloader {
    /// Installs the SIGHUP handler and starts its thread.
    pub fn start(tls: Option<Arc<ServerTls>>) -> std::io::Result<SighupReloader> {
        let mut signals = Signals::new([SIGHUP])?;
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("moshid-sighup".into())
            .spawn(move || {
                for _ in signals.forever() {
                    let line = LogLine::new(Record::SighupReload);
                    match &tls {
                        // No `listen.tls_cert_file` configured.
                        None => line.field("outcome", "nothing_to_reload"),
                        // Open connections keep the certificate they had.
                        Some(tls) => match tls.reload() {
                            Ok(summary) => line
                                .priority(5)
                                .field("outcome", "tls_reloaded")
                                .quoted("certificate", summary),
                            Err(e) => line
                                .priority(3)
                                .field("outcome", "tls_reload_failed")
                                // The certificate in use stays.
                                .quoted("kept", tls.summary())
                                .quoted("error", e),
                        },
                    }
                    .emit();
                }
            })?;
        Ok(SighupReloader {
            handle,
            thread: Some(thread),
        })
    }
}

impl Drop for SighupReloader {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
