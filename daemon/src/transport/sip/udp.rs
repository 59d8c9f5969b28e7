//! SIP over UDP on one I/O core: the socket (`SO_REUSEPORT`, one per core,
//! so the kernel keeps each peer on one core), a receiver task feeding the
//! [`Endpoint`], and a timer task driving its retransmissions and call
//! ends every [`TICK`].
//!
//! Invariants: the receiver is never cancelled mid-read while the daemon
//! serves (a cancelled io_uring read could lose a datagram); a datagram
//! over `sip.max_message_bytes` is dropped and counted, never parsed;
//! what the endpoint queues is sent by whichever task made it, in order.

use super::endpoint::Endpoint;
use crate::io::app::CoreApp;
use glommio::net::UdpSocket;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How often timers are looked at (T1 is 500 ms; 20 ms keeps every
/// retransmission within 4 % of its time).
pub const TICK: Duration = Duration::from_millis(20);

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

async fn flush(socket: &UdpSocket, endpoint: &RefCell<Endpoint>) {
    let out = endpoint.borrow_mut().take_out();
    for (to, bytes) in out {
        // A failed send is a lost datagram: the timers resend what matters.
        let _ = socket.send_to(&bytes, to).await;
    }
}

/// Serves SIP over UDP on this core until cancelled.
pub async fn serve(socket: UdpSocket, app: CoreApp) {
    let local = socket.local_addr().unwrap_or(app.shared.config.sip.address);
    let max_bytes = app.shared.config.sip.max_message_bytes;
    let socket = Rc::new(socket);
    let endpoint = Rc::new(RefCell::new(Endpoint::new(app.clone(), local)));
    // Lives as long as this task (the core drops both at its end).
    let _timer = {
        let (socket, endpoint) = (socket.clone(), endpoint.clone());
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(TICK).await;
                endpoint.borrow_mut().tick(Instant::now());
                flush(&socket, &endpoint).await;
            }
        })
    };
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
                endpoint
                    .borrow_mut()
                    .on_datagram(&buf[..n], src, Instant::now());
                flush(&socket, &endpoint).await;
            }
            Err(_) => glommio::timer::sleep(Duration::from_millis(5)).await,
        }
    }
}
