//! SIP over UDP on one I/O core: the socket (`SO_REUSEPORT`, one per core,
//! so the kernel keeps each peer on one core), the core's own outbound
//! socket (a port of its own, for the calls and registrations moshid
//! starts: see [`moshid_telephony::sip::peer::Transport::UdpOut`]) and their receivers,
//! feeding the core's endpoint ([`super::serve`]).
//!
//! Invariants: the receiver is never cancelled mid-read while the daemon
//! serves (a cancelled io_uring read could lose a datagram); a datagram
//! over `sip.max_message_bytes` is dropped and counted, never parsed.

use super::serve::Wire;
use glommio::net::UdpSocket;
use moshid_telephony::sip::peer::Peer;
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::time::{Duration, Instant};

/// Binds `addr` with `SO_REUSEPORT` (every core binds the same address).
pub fn bind(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    // Room for a burst of INVITEs (50 callers at once) while a core is busy.
    let _ = socket.set_recv_buffer_size(1 << 20);
    socket.bind(&addr.into())?;
    // SAFETY: the descriptor was just made by `socket2` and is handed over
    // whole: nothing else owns or closes it.
    Ok(unsafe { UdpSocket::from_raw_fd(socket.into_raw_fd()) })
}

/// Binds the core's outbound socket: `ip` (the SIP address's), a port the
/// kernel picks, no `SO_REUSEPORT` (its answers must reach this socket).
pub fn bind_out(ip: std::net::IpAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let addr = SocketAddr::new(ip, 0);
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_nonblocking(true)?;
    let _ = socket.set_recv_buffer_size(1 << 20);
    socket.bind(&addr.into())?;
    // SAFETY: the descriptor was just made by `socket2` and is handed over
    // whole: nothing else owns or closes it.
    Ok(unsafe { UdpSocket::from_raw_fd(socket.into_raw_fd()) })
}

/// Receives datagrams from the listening socket (`out` false) or the
/// outbound one (`out` true) into the endpoint until cancelled.
pub async fn receive(wire: &Wire, out: bool, max_bytes: usize) {
    let socket = if out { wire.udp_out() } else { wire.udp() };
    let peer = if out { Peer::udp_out } else { Peer::udp };
    // One byte more than the limit tells an oversized datagram apart.
    let mut buf = vec![0u8; max_bytes + 1];
    let mut oversize = 0u64;
    loop {
        match socket.recv_from(&mut buf).await {
            Ok((n, src)) if n > max_bytes => {
                oversize += 1;
                if oversize.is_power_of_two() {
                    eprintln!(
                        "<5>sip: dropped a datagram from {src} over sip.max_message_bytes ({max_bytes}); {oversize} so far"
                    );
                }
            }
            Ok((n, src)) => {
                wire.endpoint
                    .borrow_mut()
                    .on_message(&buf[..n], peer(src), Instant::now());
                wire.flush().await;
            }
            Err(_) => glommio::timer::sleep(Duration::from_millis(5)).await,
        }
    }
}
