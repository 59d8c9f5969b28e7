//! SIP over TCP on one I/O core (RFC 3261 §18): the listener on
//! `sip.address` (the UDP socket's port; `SO_REUSEPORT`, one per core, so a
//! connection never leaves the core that accepted it) and one task per
//! connection, feeding the core's endpoint ([`super::serve`]) with what the
//! [`Framer`] cuts out of the stream.
//!
//! Bounds, as the other TCP listeners have them: at most
//! `sip.max_tcp_connections` per core (beyond, a new connection is closed
//! at once; counted as listener `sip_tcp` in `/metrics`); until its first
//! whole message a connection is pending in the core's connection budget
//! (`listen.max_pending_per_core`, shared with the other listeners: it may
//! be closed to make room for a newer one) and must send it within
//! `listen.head_timeout_ms`; after that, a connection with no call that
//! receives nothing for `sip.tcp_idle_timeout_ms` is closed (RFC 5626 CRLF
//! keep-alives count; a double-CRLF ping gets a CRLF pong); a message is at
//! most `sip.max_message_bytes`; what moshid sends a connection waits in a
//! queue of [`OUT_QUEUE_MESSAGES`], and a peer that lets it fill (it does
//! not read) is closed.
//!
//! Stream faults close the connection: a message without a readable
//! `Content-Length` gets 400 first, one over `sip.max_message_bytes` 513
//! when its head could be read (RFC 3261 §18.3), anything else (a head
//! that never ends, bytes that are not SIP) nothing. The close of a
//! connection ends the calls that came on it (`sip_connection_closed`).
//!
//! Invariants: one task per connection, which alone reads and writes its
//! stream; answers leave in the order the endpoint made them; nothing a
//! connection sends reaches another connection's calls or the UDP ones.

use super::serve::Wire;
use crate::app::CoreApp;
use crate::io::accept::ConnTable;
use crate::io::accept_pace::AcceptPace;
use crate::io::pending::{Pending, PendingEnd};
use crate::log_record::{LogLine, Record};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel::{self, LocalReceiver};
use glommio::net::{TcpListener, TcpStream};
use moshid_telephony::sip::framing::{Frame, FrameError, Framer, PONG};
use moshid_telephony::sip::peer::Peer;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Messages waiting to be written to one connection (a transaction's
/// answers and a dialog's BYE are a few; a peer that lets this many pile
/// up is not reading them).
pub const OUT_QUEUE_MESSAGES: usize = 32;

/// Bytes asked of one read.
const READ_CHUNK: usize = 4096;

/// Why a connection was closed (the log's `reason=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The peer closed it.
    Closed,
    /// A read or write failed (or a write did not finish in time).
    Io,
    /// No first message in time, or closed for a newer connection.
    Pending(PendingEnd),
    /// No call and nothing received for `sip.tcp_idle_timeout_ms`.
    Idle,
    /// A stream fault (see the module docs).
    Fault,
    /// Its send queue filled: it does not read.
    NotReading,
}

impl End {
    fn name(self) -> &'static str {
        match self {
            End::Closed => "peer_closed",
            End::Io => "io_error",
            End::Pending(PendingEnd::TimedOut) => "first_message_timeout",
            End::Pending(PendingEnd::Evicted) => "evicted",
            End::Idle => "idle_timeout",
            End::Fault => "stream_fault",
            End::NotReading => "not_reading",
        }
    }
}

/// Accepts SIP connections on this core until cancelled.
pub async fn accept_loop(listener: TcpListener, wire: Rc<Wire>, app: CoreApp) {
    let cfg = &app.shared.config.sip;
    let table = ConnTable::register(&app.ctx, "sip_tcp", cfg.max_tcp_connections, 0);
    let core = app.ctx.core;
    let pace = AcceptPace::default();
    loop {
        let (stream, peer) = table.accept(&listener, &pace, core).await;
        let guard = match table.try_open(peer.ip()) {
            Ok(g) => g,
            Err(_) => {
                drop(stream);
                table.log_refusal(
                    core,
                    peer.ip(),
                    &"sip.max_tcp_connections reached on this core",
                );
                continue;
            }
        };
        let pending = app.pending.admit(peer.ip());
        let _ = stream.set_nodelay(true);
        let (wire, app) = (wire.clone(), app.clone());
        glommio::spawn_local(async move {
            let _guard = guard;
            connection(stream, peer, wire, app, pending).await;
        })
        .detach();
    }
}

/// One connection, from accept to close.
async fn connection(
    stream: TcpStream,
    addr: SocketAddr,
    wire: Rc<Wire>,
    app: CoreApp,
    pending: Pending,
) {
    let cfg = &app.shared.config;
    let (queue, out) = local_channel::new_bounded(OUT_QUEUE_MESSAGES);
    wire.connected(addr, queue);
    let mut conn = Conn {
        stream,
        framer: Framer::new(cfg.sip.max_message_bytes),
        peer: Peer::tcp(addr),
        write_timeout: Duration::from_millis(cfg.sip.tcp_idle_timeout_ms),
        messages: 0,
    };
    let first = Duration::from_millis(cfg.listen.head_timeout_ms);
    let idle = Duration::from_millis(cfg.sip.tcp_idle_timeout_ms);
    let end = match pending
        .handshake(first, conn.first_message(&wire, &out))
        .await
    {
        Ok(Ok(())) => conn.serve(&wire, &out, idle).await,
        Ok(Err(end)) => end,
        Err(p) => End::Pending(p),
    };
    // What was answered goes out before the close.
    if !matches!(end, End::Io | End::NotReading) {
        let _ = conn.drain(&out).await;
    }
    // Forgotten before the socket closes: until then no new connection can
    // have this remote address, so the table entry and the calls are ours.
    wire.disconnected(addr).await;
    let _ = conn.stream.close().await;
    LogLine::new(Record::SipTcpClose)
        .field("peer", addr)
        .field("reason", end.name())
        .field("messages", conn.messages)
        .emit();
}

struct Conn {
    stream: TcpStream,
    framer: Framer,
    peer: Peer,
    write_timeout: Duration,
    /// Messages received (the log's `messages=`).
    messages: u64,
}

/// What woke a connection.
enum Wake {
    Read(std::io::Result<usize>),
    Send(Option<Vec<u8>>),
    Idle,
}

impl Conn {
    async fn read_some(&mut self) -> std::io::Result<usize> {
        let n = self.stream.read(self.framer.spare(READ_CHUNK)).await?;
        self.framer.filled(n);
        Ok(n)
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), End> {
        let write = async { Ok(self.stream.write_all(bytes).await) };
        match glommio::timer::timeout(self.write_timeout, write).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(End::Io),
        }
    }

    /// Writes what is queued now, without waiting for more.
    async fn drain(&mut self, out: &LocalReceiver<Vec<u8>>) -> Result<(), End> {
        while let Some(Some(m)) = futures_lite::future::poll_once(out.recv()).await {
            self.write(&m).await?;
        }
        Ok(())
    }

    /// Reads until the first whole message (the pending part of the
    /// connection); pings before it are answered.
    async fn first_message(
        &mut self,
        wire: &Wire,
        out: &LocalReceiver<Vec<u8>>,
    ) -> Result<(), End> {
        loop {
            match self.read_some().await {
                Ok(0) => return Err(End::Closed),
                Ok(_) => {}
                Err(_) => return Err(End::Io),
            }
            if self.on_frames(wire, out).await? {
                return Ok(());
            }
        }
    }

    /// Serves the connection once it has sent a message.
    async fn serve(&mut self, wire: &Wire, out: &LocalReceiver<Vec<u8>>, idle: Duration) -> End {
        let mut last_rx = Instant::now();
        loop {
            if !wire.is_connected(self.peer.addr) {
                return End::NotReading;
            }
            let wait = (last_rx + idle).saturating_duration_since(Instant::now());
            let wake = {
                let read = async { Wake::Read(self.read_some().await) };
                let send = async { Wake::Send(out.recv().await) };
                let timer = async {
                    glommio::timer::sleep(wait).await;
                    Wake::Idle
                };
                futures_lite::future::or(read, futures_lite::future::or(send, timer)).await
            };
            match wake {
                Wake::Read(Ok(0)) => return End::Closed,
                Wake::Read(Err(_)) => return End::Io,
                Wake::Read(Ok(_)) => {
                    last_rx = Instant::now();
                    if let Err(end) = self.on_frames(wire, out).await {
                        return end;
                    }
                }
                Wake::Send(Some(m)) => {
                    if let Err(end) = self.write(&m).await {
                        return end;
                    }
                }
                Wake::Send(None) => return End::NotReading,
                Wake::Idle => {
                    // A call's signalling may be silent for the call's
                    // whole length: only a connection without one idles out.
                    if wire.endpoint.borrow().has_calls_over(self.peer) {
                        last_rx = Instant::now();
                    } else {
                        return End::Idle;
                    }
                }
            }
        }
    }

    /// Hands every whole message read so far to the endpoint and answers
    /// pings; whether there was a message. A fault is answered (after what
    /// was queued before it in `out`) and ends the connection.
    async fn on_frames(&mut self, wire: &Wire, out: &LocalReceiver<Vec<u8>>) -> Result<bool, End> {
        let mut any = false;
        loop {
            match self.framer.next_frame() {
                Ok(None) => return Ok(any),
                Ok(Some(Frame::Ping)) => self.write(PONG).await?,
                Ok(Some(Frame::Message(m))) => {
                    any = true;
                    self.messages += 1;
                    wire.endpoint
                        .borrow_mut()
                        .on_message(&m, self.peer, Instant::now());
                    wire.flush().await;
                }
                Err(fault) => {
                    let (head, code): (&[u8], u16) = match &fault {
                        FrameError::NoContentLength { head, .. } => (head, 400),
                        FrameError::TooLarge { head } => (head.as_deref().unwrap_or(b""), 513),
                    };
                    let answer = wire.endpoint.borrow_mut().stream_fault(
                        head,
                        self.peer,
                        code,
                        &fault.to_string(),
                    );
                    self.drain(out).await?;
                    if let Some(a) = answer {
                        self.write(&a).await?;
                    }
                    return Err(End::Fault);
                }
            }
        }
    }
}
