//! Who a SIP message came from and how to answer it: the transport (UDP,
//! the TCP connection it arrived on, or the core's own UDP socket for what
//! moshid starts) and the peer's address.
//!
//! Why moshid's own requests (outbound calls, REGISTER) leave from a
//! socket of their own, [`Transport::UdpOut`]: every core binds
//! `sip.address` with `SO_REUSEPORT`, and the kernel hands a datagram to
//! one of those sockets by a hash of its addresses, not to the core that
//! sent the request it answers. A per-core socket on a port of its own
//! (named in its Via and Contact) brings every answer, and every request
//! within a dialog moshid started, back to the core that keeps it.
//!
//! A TCP connection is named by its remote address: every connection of a
//! core is accepted on the same local address, so while it is open no
//! other connection has that remote address. Responses (RFC 3261
//! §18.2.2) and moshid's requests within a dialog go back the way the
//! dialog came: to the datagram's source over UDP, over the same
//! connection over TCP.

use std::fmt;
use std::net::SocketAddr;

/// The transport a message came over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Datagrams on the core's UDP socket.
    Udp,
    /// A connection accepted on the core's TCP listener.
    Tcp,
    /// Datagrams on the core's own socket for what moshid starts
    /// (outbound calls, registrations): on a port of its own, so that
    /// their answers come back to this core.
    UdpOut,
}

impl Transport {
    /// The Via transport token (`SIP/2.0/UDP`, `SIP/2.0/TCP`).
    pub fn via_token(self) -> &'static str {
        match self {
            Transport::Udp | Transport::UdpOut => "UDP",
            Transport::Tcp => "TCP",
        }
    }

    /// Whether the transport delivers in order and retransmits itself
    /// (RFC 3261 §17: no timers A, E, G; timers I, J, K are 0).
    pub fn is_reliable(self) -> bool {
        matches!(self, Transport::Tcp)
    }
}

/// A message's source, and where its answers go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer {
    /// UDP or TCP.
    pub transport: Transport,
    /// The peer's address (the datagram's source, the connection's remote end).
    pub addr: SocketAddr,
}

impl Peer {
    /// A UDP source.
    pub fn udp(addr: SocketAddr) -> Peer {
        Peer {
            transport: Transport::Udp,
            addr,
        }
    }

    /// A TCP connection's remote end.
    pub fn tcp(addr: SocketAddr) -> Peer {
        Peer {
            transport: Transport::Tcp,
            addr,
        }
    }

    /// A peer reached over the core's own outbound socket.
    pub fn udp_out(addr: SocketAddr) -> Peer {
        Peer {
            transport: Transport::UdpOut,
            addr,
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.transport {
            Transport::Udp => write!(f, "{}", self.addr),
            Transport::Tcp => write!(f, "tcp:{}", self.addr),
            Transport::UdpOut => write!(f, "out:{}", self.addr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_are_told_apart() {
        let a: SocketAddr = "127.0.0.1:5070".parse().unwrap();
        assert_ne!(Peer::udp(a), Peer::tcp(a));
        assert_eq!(Peer::udp(a).to_string(), "127.0.0.1:5070");
        assert_eq!(Peer::tcp(a).to_string(), "tcp:127.0.0.1:5070");
        assert_ne!(Peer::udp(a), Peer::udp_out(a));
        assert_eq!(Peer::udp_out(a).to_string(), "out:127.0.0.1:5070");
        assert!(Transport::Tcp.is_reliable() && !Transport::Udp.is_reliable());
        assert!(!Transport::UdpOut.is_reliable());
        assert_eq!(Transport::UdpOut.via_token(), "UDP");
    }
}
