//! The I/O cores: one glommio executor per core, pinned to its CPU, each
//! binding its own `SO_REUSEPORT` listeners (HTTP, AudioSocket, SIP over
//! UDP and TCP), running their accept loops and the engine records'
//! dispatch, and following the daemon's lifecycle until it may stop.
//!
//! Invariants: core 0 binds first, so that a port 0 in the configuration
//! resolves once and every other core binds the same port; a core that
//! cannot bind reports why and the start fails; while draining, a core
//! accepts nothing new (SIP keeps serving, so that calls end with BYEs) and
//! stops once it holds no session, no pending close and no subscriber.

use super::{CLOSING, DRAINING, HOUSEKEEPING_PERIOD};
use crate::api::router::accept_loop;
use crate::api::ApiShared;
use crate::app::{CoreApp, Shared};
use crate::engine::{CorePort, EngineShared};
use crate::io::core::{dispatch_loop, CoreContext};
use anyhow::{anyhow, bail, Result};
use glommio::net::{TcpListener, UdpSocket};
use glommio::{ExecutorJoinHandle, LocalExecutorBuilder, Placement, Task};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// Where a core listens (what is asked of it, then what it bound).
#[derive(Debug, Clone, Copy)]
pub struct Listening {
    /// The HTTP and WebSocket listener.
    pub http: SocketAddr,
    /// The AudioSocket listener, when enabled.
    pub audiosocket: Option<SocketAddr>,
    /// The SIP socket (UDP, and TCP on the same port), when enabled.
    pub sip: Option<SocketAddr>,
}

/// What a core reports once bound: where it listens, or why it could not.
type Bound = Result<Listening, String>;

/// Everything every core shares.
#[derive(Clone)]
pub struct CoreShared {
    /// The engine's side.
    pub engine: Arc<EngineShared>,
    /// What every session reaches.
    pub shared: Arc<Shared>,
    /// What the HTTP API reaches.
    pub api: Arc<ApiShared>,
    /// The daemon's lifecycle (running, draining, closing).
    pub lifecycle: Arc<AtomicU8>,
}

/// Starts one I/O core per port, core 0 first; returns their executors
/// and where they listen.
pub fn start_all(
    io_cpus: &[usize],
    asked: Listening,
    ports: Vec<CorePort>,
    with: &CoreShared,
) -> Result<(Vec<ExecutorJoinHandle<()>>, Listening)> {
    let (bound_tx, bound_rx) = mpsc::channel::<Bound>();
    let mut executors = Vec::new();
    let mut listening = asked;
    for (core, port) in ports.into_iter().enumerate() {
        let cpu = io_cpus[core];
        let ex = spawn_core(core, cpu, listening, port, with.clone(), bound_tx.clone())?;
        executors.push(ex);
        // Core 0 binds first so that port 0 resolves once for every core.
        match bound_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(l)) => listening = l,
            Ok(Err(e)) => bail!("{e}"),
            Err(_) => bail!("I/O core {core} did not start"),
        }
    }
    Ok((executors, listening))
}

/// One core's bound sockets.
struct Listeners {
    http: TcpListener,
    audiosocket: Option<TcpListener>,
    /// The shared SIP socket and the core's own for what it starts.
    sip: Option<(UdpSocket, UdpSocket)>,
    sip_tcp: Option<TcpListener>,
}

impl Listeners {
    /// Where they listen.
    fn addresses(&self, asked: Listening) -> Listening {
        Listening {
            http: self.http.local_addr().unwrap_or(asked.http),
            audiosocket: (self.audiosocket.as_ref())
                .map(|l| l.local_addr().unwrap_or(asked.audiosocket.expect("bound"))),
            sip: (self.sip.as_ref())
                .map(|(s, _)| s.local_addr().unwrap_or(asked.sip.expect("bound"))),
        }
    }
}

/// Binds core `core`'s sockets; the error names the key and the address.
fn bind_listeners(core: usize, asked: Listening, shared: &Shared) -> Result<Listeners, String> {
    let backlog = shared.config.listen.backlog;
    let bind = crate::io::accept::bind;
    let http = bind(asked.http, backlog)
        .map_err(|e| format!("I/O core {core}: cannot listen on {}: {e}", asked.http))?;
    // AudioSocket: one more SO_REUSEPORT listener per core.
    let audiosocket = match asked.audiosocket {
        None => None,
        Some(a) => Some(bind(a, backlog).map_err(|e| {
            format!("config key `audiosocket.address`: I/O core {core} cannot listen on {a}: {e}")
        })?),
    };
    // SIP over UDP: one SO_REUSEPORT socket per core, and the core's own
    // socket for the calls and registrations it starts (their answers must
    // come back to this core).
    let sip = match asked.sip {
        None => None,
        Some(a) => Some(
            crate::transport::sip::udp::bind(a)
                .and_then(|s| Ok((s, crate::transport::sip::udp::bind_out(a.ip())?)))
                .map_err(|e| {
                    format!("config key `sip.address`: I/O core {core} cannot bind UDP {a}: {e}")
                })?,
        ),
    };
    // SIP over TCP: a listener per core on the UDP socket's port (port 0
    // resolved by the UDP bind).
    let sip_local =
        (sip.as_ref()).map(|(s, _)| s.local_addr().unwrap_or(asked.sip.expect("bound")));
    let sip_tcp = match sip_local {
        Some(a) if shared.config.sip.max_tcp_connections > 0 => {
            Some(bind(a, backlog).map_err(|e| {
                format!("config key `sip.address`: I/O core {core} cannot listen on TCP {a}: {e}")
            })?)
        }
        _ => None,
    };
    Ok(Listeners {
        http,
        audiosocket,
        sip,
        sip_tcp,
    })
}

fn spawn_core(
    core: usize,
    cpu: usize,
    asked: Listening,
    port: CorePort,
    with: CoreShared,
    bound: mpsc::Sender<Bound>,
) -> Result<ExecutorJoinHandle<()>> {
    LocalExecutorBuilder::new(Placement::Fixed(cpu))
        .name(&format!("moshid-io-{core}"))
        .spawn(move || async move {
            // The first timer of an executor is slow (membarrier registration):
            // take that cost now, not in a session.
            glommio::timer::sleep(Duration::from_millis(1)).await;
            let listeners = match bind_listeners(core, asked, &with.shared) {
                Ok(l) => l,
                Err(e) => {
                    let _ = bound.send(Err(e));
                    return;
                }
            };
            let addresses = listeners.addresses(asked);
            let ctx = CoreContext::new(core, port, with.engine);
            let app = CoreApp::new(ctx.clone(), with.shared);
            let dispatcher = glommio::spawn_local(dispatch_loop(ctx.clone()));
            let acceptors = serve_listeners(listeners, app, with.api);
            let _ = bound.send(Ok(addresses));
            follow_lifecycle(&ctx, &with.lifecycle, acceptors).await;
            // Closes are in the lane; the engine stops after every core is done.
            drop(dispatcher);
        })
        .map_err(|e| anyhow!("starting I/O core {core} on CPU {cpu}: {e}"))
}

/// A core's accept loops: stopped when the daemon drains. The SIP task
/// is kept to the end: calls end with BYEs.
struct Acceptors {
    http: Option<Task<()>>,
    audiosocket: Option<Task<()>>,
    _sip: Option<Task<()>>,
}

/// Starts the core's tasks on its sockets.
fn serve_listeners(l: Listeners, app: CoreApp, api: Arc<ApiShared>) -> Acceptors {
    let audiosocket = (l.audiosocket)
        .map(|l| glommio::spawn_local(crate::transport::audiosocket::accept_loop(l, app.clone())));
    let sip = l.sip.map(|(s, out)| {
        glommio::spawn_local(crate::transport::sip::serve::serve(
            s,
            out,
            l.sip_tcp,
            app.clone(),
            api.rtp.clone(),
            api.sip.clone(),
        ))
    });
    Acceptors {
        http: Some(glommio::spawn_local(accept_loop(l.http, app, api))),
        audiosocket,
        _sip: sip,
    }
}

/// Follows the daemon's lifecycle: retries pending closes; while draining
/// stops accepting; while closing tells every session to end; returns
/// once draining and nothing is left on the core.
async fn follow_lifecycle(ctx: &Rc<CoreContext>, lifecycle: &AtomicU8, mut acceptors: Acceptors) {
    loop {
        glommio::timer::sleep(HOUSEKEEPING_PERIOD).await;
        ctx.flush_pending_closes();
        let state = lifecycle.load(Ordering::Acquire);
        if state >= DRAINING {
            if let Some(a) = acceptors.http.take() {
                a.cancel().await;
            }
            if let Some(a) = acceptors.audiosocket.take() {
                a.cancel().await;
            }
        }
        if state >= CLOSING {
            ctx.notify_shutdown_all();
        }
        // Subscribers on this core leave once their session's `end`
        // is written (bounded by session.send_timeout_ms).
        let watching = crate::events::relay::Relay::current().watching();
        if state >= DRAINING
            && ctx.live_sessions.get() == 0
            && ctx.pending_closes() == 0
            && watching == 0
        {
            return;
        }
    }
}
