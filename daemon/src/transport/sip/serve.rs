//! SIP on one I/O core: the [`Endpoint`], its UDP sockets ([`super::udp`]:
//! the listening one and the outbound one), its TCP listener and
//! connections ([`super::tcp`]), the timer task that
//! drives the endpoint every [`TICK`] and publishes its counters for
//! `/metrics` ([`crate::metrics::sip`]), and [`Wire::flush`], which sends
//! each message the endpoint queued the way its peer came: a datagram from
//! the UDP socket, or onto the queue of the peer's TCP connection.
//! [`with_wire`] lends the core's wire to the control API on the same core
//! (`POST /v1/sip/calls` places a call through it).
//!
//! Invariants: the endpoint is borrowed only between awaits (never across
//! one), so the tasks of a core take turns on it; what the endpoint queues
//! is sent in order; a TCP connection's queue holds at most
//! [`super::tcp::OUT_QUEUE_MESSAGES`]: a peer that does not read its
//! answers has its connection closed, no other peer waits for it; a
//! message for a connection that is gone is dropped and counted.

use super::endpoint::Endpoint;
use super::status::SipShared;
use crate::app::CoreApp;
use crate::metrics::sip::SipPublished;
use crate::transport::rtp::Registry;
use glommio::channels::local_channel::LocalSender;
use glommio::net::{TcpListener, UdpSocket};
use moshid_telephony::sip::peer::{Peer, Transport};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often timers are looked at (T1 is 500 ms; 20 ms keeps every
/// retransmission within 4 % of its time).
pub const TICK: Duration = Duration::from_millis(20);

thread_local! {
    /// This core's wire, while SIP serves on it.
    static WIRE: RefCell<Option<Rc<Wire>>> = const { RefCell::new(None) };
}

/// This core's wire, when SIP serves on it (the control API's way in).
pub fn current_wire() -> Option<Rc<Wire>> {
    WIRE.with(|w| w.borrow().clone())
}

/// One core's SIP: the endpoint and the ways out of it.
pub struct Wire {
    /// The endpoint (borrowed between awaits only).
    pub endpoint: RefCell<Endpoint>,
    udp: UdpSocket,
    /// The outbound socket (outbound calls, registrations).
    udp_out: UdpSocket,
    /// The open TCP connections' send queues, by remote address.
    tcp: RefCell<HashMap<SocketAddr, LocalSender<Vec<u8>>>>,
    /// Messages dropped: their connection was gone or its queue full.
    pub tcp_dropped: Cell<u64>,
    /// The endpoint's counters as `/metrics` reads them (published every tick).
    published: Arc<SipPublished>,
}

impl Wire {
    /// Sends what the endpoint queued.
    pub async fn flush(&self) {
        let out = self.endpoint.borrow_mut().take_out();
        for (to, bytes) in out {
            match to.transport {
                // A failed send is a lost datagram: the timers resend what matters.
                Transport::Udp => {
                    let _ = self.udp.send_to(&bytes, to.addr).await;
                }
                Transport::UdpOut => {
                    let _ = self.udp_out.send_to(&bytes, to.addr).await;
                }
                Transport::Tcp => self.send_tcp(to.addr, bytes),
            }
        }
    }

    fn send_tcp(&self, to: SocketAddr, bytes: Vec<u8>) {
        let mut conns = self.tcp.borrow_mut();
        let Some(queue) = conns.get(&to) else {
            self.tcp_dropped.set(self.tcp_dropped.get() + 1);
            return;
        };
        if queue.try_send(bytes).is_err() {
            // The peer does not read what it is sent: dropping the queue's
            // sender ends its connection (its task sees the queue close).
            conns.remove(&to);
            self.tcp_dropped.set(self.tcp_dropped.get() + 1);
            eprintln!("<5>sip: closing the TCP connection of {to}: it does not read its answers");
        }
    }

    /// Copies the endpoint's counters for `/metrics`.
    fn publish(&self) {
        let endpoint = self.endpoint.borrow();
        self.published
            .publish(&endpoint.counters, endpoint.calls(), self.tcp_dropped.get());
    }

    /// The UDP socket.
    pub fn udp(&self) -> &UdpSocket {
        &self.udp
    }

    /// The outbound UDP socket.
    pub fn udp_out(&self) -> &UdpSocket {
        &self.udp_out
    }

    /// Registers connection `peer`'s send queue.
    pub fn connected(&self, peer: SocketAddr, queue: LocalSender<Vec<u8>>) {
        self.tcp.borrow_mut().insert(peer, queue);
    }

    /// Connection `peer` is closed: its queue goes, its calls end.
    pub async fn disconnected(&self, peer: SocketAddr) {
        self.tcp.borrow_mut().remove(&peer);
        self.endpoint
            .borrow_mut()
            .on_connection_closed(Peer::tcp(peer));
        self.flush().await;
    }

    /// Whether connection `peer` is still wanted (it was not closed for
    /// not reading).
    pub fn is_connected(&self, peer: SocketAddr) -> bool {
        self.tcp.borrow().contains_key(&peer)
    }
}

/// Clears the core's wire when the SIP task ends.
struct Registered;

impl Drop for Registered {
    fn drop(&mut self) {
        WIRE.with(|w| w.borrow_mut().take());
    }
}

/// Serves SIP on this core, over `udp` and, when given, `tcp`, and starts
/// outbound calls and registrations over `udp_out`, until cancelled.
pub async fn serve(
    udp: UdpSocket,
    udp_out: UdpSocket,
    tcp: Option<TcpListener>,
    app: CoreApp,
    rtp: Arc<Registry>,
    sip: Arc<SipShared>,
) {
    let local = udp.local_addr().unwrap_or(app.shared.config.sip.address);
    let out_local = udp_out
        .local_addr()
        .unwrap_or(SocketAddr::new(local.ip(), 0));
    let wire = Rc::new(Wire {
        endpoint: RefCell::new(Endpoint::new(app.clone(), rtp, sip, local, out_local)),
        udp,
        udp_out,
        tcp: RefCell::new(HashMap::new()),
        tcp_dropped: Cell::new(0),
        published: app.ctx.engine.metrics.register_sip(app.ctx.core),
    });
    // Both live as long as this task (the core drops them all at its end).
    let _timer = {
        let wire = wire.clone();
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(TICK).await;
                // Registrars named by host name are looked up off the core.
                let lookups = wire.endpoint.borrow_mut().take_lookups();
                for (i, host, port) in lookups {
                    let wire = wire.clone();
                    glommio::spawn_local(async move {
                        let found = super::resolve::resolve(&host, port).await;
                        wire.endpoint
                            .borrow_mut()
                            .resolved(i, found, Instant::now());
                    })
                    .detach();
                }
                wire.endpoint.borrow_mut().tick(Instant::now());
                wire.flush().await;
                wire.publish();
            }
        })
    };
    let _tcp =
        tcp.map(|l| glommio::spawn_local(super::tcp::accept_loop(l, wire.clone(), app.clone())));
    let max_bytes = app.shared.config.sip.max_message_bytes;
    let _out = {
        let wire = wire.clone();
        glommio::spawn_local(async move { super::udp::receive(&wire, true, max_bytes).await })
    };
    WIRE.with(|w| *w.borrow_mut() = Some(wire.clone()));
    let _registered = Registered;
    super::udp::receive(&wire, false, max_bytes).await;
}
