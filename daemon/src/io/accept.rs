//! Accepting connections on one I/O core: the listening socket (`bind`,
//! with `SO_REUSEPORT` and the configured backlog) and the table of open
//! connections per listener and per client address ([`ConnTable`]), which
//! every accept loop (HTTP, AudioSocket, SIP over TCP) goes through.
//!
//! Invariants: the number of open connections per core is bounded by
//! configuration (beyond it new connections are closed at once), and so is
//! the number per client IP address on each core
//! (`listen.max_connections_per_ip`, counted per core) with a table that
//! never holds more entries than there are open connections. Refusals and
//! accept errors are counted in [`ListenerCounters`] (exported by
//! `/metrics`) and logged at most once per [`CONNECTION_LOG_PERIOD`].

use super::accept_pace::AcceptPace;
use super::core::CoreContext;
use super::log_gate::{LogGate, CONNECTION_LOG_PERIOD};
use crate::metrics::connections::{bump, set, ListenerCounters};
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

    /// The table of listener `name` on `ctx`'s core, its counters published
    /// in the metrics registry.
    pub fn register(
        ctx: &CoreContext,
        name: &'static str,
        max_open: usize,
        max_per_ip: usize,
    ) -> Rc<Self> {
        let counters = ListenerCounters::new(ctx.core, name, max_open, max_per_ip);
        Self::new(ctx.engine.metrics.register_listener(counters))
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

#[cfg(test)]
mod tests {
    use super::{ConnRefusal, ConnTable, ListenerCounters};
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
}
