//! moshid-testkit: what moshid's end-to-end suites and its load generator
//! share to drive the real `moshid serve` from outside, as its users do.
//!
//! - [`daemon`]: one builder that starts the binary, reads where it listens
//!   and stops it ([`daemon!`] for a test, [`DaemonBuilder::new`] for tools).
//! - [`http`]: plain and TLS requests; [`capacity`]: `/capacity` and
//!   waiting for idle; [`metrics`]: `/metrics` parsed.
//! - [`records`]: the daemon's typed log records ([`moshid::log_record`]),
//!   read back and waited for — the facts tests wait on.
//! - [`chat`]: the blocking `/api/chat` client and what it records;
//!   [`ogg`]: checks of the Ogg stream it received.
//! - [`audio`]: deterministic test signals; [`wait`]: bounded polling and
//!   clients that start together.
//! - [`peers`]: external programs a test needs (sipp, ffmpeg, haproxy…):
//!   missing, they fail the test unless `MOSHID_SKIP` names them.
//! - [`sip`]: the SIP suites' network namespace and sipp runs.
//!
//! Invariant: every wait is bounded (socket timeouts, deadlines), so a hung
//! daemon fails a test instead of hanging it; a helper that fails panics
//! with what it saw (and the daemon's stderr tail), as a test wants.

pub mod audio;
pub mod capacity;
pub mod chat;
pub mod daemon;
pub mod http;
pub mod metrics;
pub mod ogg;
pub mod peers;
pub mod records;
pub mod sip;
pub mod wait;

use std::time::Duration;

pub use daemon::{Daemon, DaemonBuilder};
pub use moshid::log_record::Record;

/// The first start writes the demo checkpoint and warms the engine up.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on any single socket read or write, and on the HTTP requests.
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on waiting for the daemon to be idle again, or for a condition
/// on `/capacity` or `/metrics`.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on waiting for a session to end once its client stopped sending.
pub const SESSION_END_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on waiting for a log record.
pub const RECORD_TIMEOUT: Duration = Duration::from_secs(30);
/// One model frame.
pub const FRAME: Duration = Duration::from_millis(80);

/// A [`DaemonBuilder`] for the `moshid` binary of the calling test crate
/// (`CARGO_BIN_EXE_moshid`), its temp folders under `CARGO_TARGET_TMPDIR`.
#[macro_export]
macro_rules! daemon {
    () => {
        $crate::DaemonBuilder::for_tests(env!("CARGO_BIN_EXE_moshid"), env!("CARGO_TARGET_TMPDIR"))
    };
}

/// A config whose sessions end by themselves shortly after their client
/// stops sending (the idle timeout is how a session ends with its
/// metadata: a client's WebSocket close ends it without any).
pub fn config_with_idle_timeout(idle_ms: u64) -> String {
    format!(r#"{{"session": {{"idle_timeout_ms": {idle_ms}}}}}"#)
}

/// What most end-to-end tests use: `use moshid_testkit::prelude::*;`.
pub mod prelude {
    pub use crate::audio::{print_gaps, signal, tone};
    pub use crate::capacity::is_idle;
    pub use crate::chat::{
        connect_ws, kind, next_binary, ChatClient, NotStarted, Pace, SessionLog,
    };
    pub use crate::http::{
        http_request, http_request_with, json_request, open_stream, tls_client, ClientStream,
    };
    pub use crate::ogg::{assert_audio_in_order, ogg_pages};
    pub use crate::records::LogRecord;
    pub use crate::wait::start_together;
    pub use crate::{
        config_with_idle_timeout, daemon, Daemon, Record, FRAME, IDLE_TIMEOUT, IO_TIMEOUT,
        READY_TIMEOUT, RECORD_TIMEOUT, SESSION_END_TIMEOUT,
    };
}
