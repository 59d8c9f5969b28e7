//! Asterisk AudioSocket: the `AudioSocket()` dialplan application (and the
//! `AudioSocket/` channel driver) connects to the daemon over TCP and
//! streams the call as signed 16-bit linear PCM; the daemon answers with
//! the model's audio, same kind and rate, one 20 ms message per 20 ms.
//!
//! ```text
//! exten => 100,1,Answer()
//!  same => n,AudioSocket(40325ec2-5efd-4bd3-805f-53576e581d13,moshid-host:9092)
//! ```
//!
//! Files: `moshid_telephony::audiosocket` (framing, kinds, error codes;
//! pure), [`session`] (one call); [`crate::transport::line`] (line audio ↔
//! model frames, the packet queue and the pacer) and
//! [`crate::transport::link`] (the engine side) are shared with the Media
//! Streams transport.
//!
//! Listening: with `audiosocket.enabled`, every I/O core binds
//! `audiosocket.address` (`SO_REUSEPORT`: the kernel spreads calls over the
//! cores; a call never leaves the core that accepted it). The protocol
//! carries no credentials, so a listener off loopback requires
//! `audiosocket.allowed_peers` (Asterisk's addresses); other peers are
//! closed at once, as are connections beyond
//! `audiosocket.max_connections_per_core`. Until its UUID message has come
//! a call is pending in the core's connection budget, shared with the other
//! listeners (`listen.max_pending_per_core`): it may be closed to make room
//! for a newer connection.
//!
//! Invariants: one task per connection; no state is shared between calls
//! but the core's context; a malformed message ends only its own call
//! (with an `0xff` error message); nothing per packet allocates (see
//! [`session`]).

pub mod session;

use crate::app::CoreApp;
use crate::io::accept::ConnTable;
use crate::io::accept_pace::AcceptPace;
use glommio::net::TcpListener;
use std::net::IpAddr;

/// Whether `ip` may open a call (`allowed` empty: anyone who can reach the
/// listener, which validation restricts to loopback).
pub fn peer_allowed(allowed: &[IpAddr], ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    allowed.is_empty() || allowed.iter().any(|a| a.to_canonical() == ip)
}

/// Checks `audiosocket.params` against the model at start, so that a bad
/// parameter stops the daemon instead of failing every call.
pub fn check_params(shared: &crate::app::Shared) -> Result<(), String> {
    let cfg = &shared.config;
    let pairs: Vec<(String, String)> = cfg
        .audiosocket
        .params
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    crate::session::params::session_params(&pairs, &cfg.defaults, &shared.model_info)
        .map(|_| ())
        .map_err(|e| format!("config key `audiosocket.params`: {e}"))
}

/// Accepts AudioSocket connections on this core until the task is cancelled.
///
/// A call is pending in the core's budget (see
/// [`PendingBudget`](crate::io::pending::PendingBudget)) until its UUID
/// message has come.
pub async fn accept_loop(listener: TcpListener, app: CoreApp) {
    let cfg = &app.shared.config.audiosocket;
    let table = ConnTable::register(&app.ctx, "audiosocket", cfg.max_connections_per_core, 0);
    let core = app.ctx.core;
    let pace = AcceptPace::default();
    loop {
        let (stream, peer) = table.accept(&listener, &pace, core).await;
        if !peer_allowed(&cfg.allowed_peers, peer.ip()) {
            drop(stream);
            table.refuse_not_allowed(core, peer.ip(), &"not in audiosocket.allowed_peers");
            continue;
        }
        let guard = match table.try_open(peer.ip()) {
            Ok(g) => g,
            Err(_) => {
                drop(stream);
                table.log_refusal(
                    core,
                    peer.ip(),
                    &"audiosocket.max_connections_per_core reached on this core",
                );
                continue;
            }
        };
        let pending = app.pending.admit(peer.ip());
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        glommio::spawn_local(async move {
            let _guard = guard;
            session::run(stream, peer, app, pending).await;
        })
        .detach();
    }
}

#[cfg(test)]
mod tests {
    use super::peer_allowed;

    #[test]
    fn allowed_peers() {
        let a: std::net::IpAddr = "10.0.0.5".parse().unwrap();
        assert!(peer_allowed(&[], a));
        assert!(peer_allowed(&[a], "::ffff:10.0.0.5".parse().unwrap()));
        assert!(!peer_allowed(&[a], "10.0.0.6".parse().unwrap()));
    }
}
