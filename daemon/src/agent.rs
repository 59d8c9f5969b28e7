//! HAProxy agent-check responder: a small TCP port (`listen.agent_address`)
//! that answers every connection with one line computed from the capacity
//! model, then closes.
//!
//! * `up ready N%`: sessions are admitted; `N` is the admissible share of the
//!   slots (`admissible_sessions / max_slots`, at least 1 %), which HAProxy
//!   applies as a percentage of the server's configured weight. `ready`
//!   cancels a DRAIN or MAINT state this agent set earlier (HAProxy keeps an
//!   agent's `drain` until the agent itself says `ready`).
//! * `drain`: no session would be admitted now (full, over budget) or the
//!   daemon is draining for shutdown. Open sessions stay where they are.
//! * `maint`: the daemon is not ready yet (loading the model, warming up).
//!
//! Invariants: the responder runs on its own plain thread, so a busy I/O
//! core never delays it; it holds nothing per connection after replying
//! (what the peer sends is read, at most 4 KiB for at most ~100 ms, and
//! dropped); each reply takes the admission lock once. It has no
//! authentication (the protocol has none): expose it to the balancers only.

use crate::engine::EngineShared;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// The engine's shared state, set once it exists (before that: `maint`).
pub type EngineCell = Arc<OnceLock<Arc<EngineShared>>>;

/// The agent line (without its newline) for a daemon in this state.
///
/// `ready`: warm-up done; `accepting`: admission open (false while
/// draining); `admissible`: sessions that would be admitted now.
pub fn agent_line(ready: bool, accepting: bool, admissible: usize, max_slots: usize) -> String {
    if !ready {
        return "maint".to_string();
    }
    if !accepting || admissible == 0 || max_slots == 0 {
        return "drain".to_string();
    }
    let share = (admissible.min(max_slots) * 100)
        .div_ceil(max_slots)
        .clamp(1, 100);
    format!("up ready {share}%")
}

/// The agent line for the engine in `cell` (`maint` while it does not exist).
pub fn agent_reply(cell: &OnceLock<Arc<EngineShared>>) -> String {
    let Some(engine) = cell.get() else {
        return agent_line(false, false, 0, 0);
    };
    if !engine.ready.load(Ordering::Acquire) {
        return agent_line(false, false, 0, engine.max_slots);
    }
    let cap = engine.capacity();
    agent_line(true, cap.accepting, cap.admissible_sessions, cap.max_slots)
}

/// A running responder; [`AgentServer::stop`] ends it.
pub struct AgentServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl AgentServer {
    /// Binds `addr` and answers from `cell` on a thread of its own.
    pub fn start(addr: SocketAddr, cell: EngineCell) -> std::io::Result<AgentServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("moshid-agent".into())
            .spawn(move || serve(listener, cell, flag))?;
        eprintln!("<6>agent-check: answering on {addr}");
        Ok(AgentServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address (the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops answering and joins the thread.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        let Some(thread) = self.thread.take() else {
            return;
        };
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => [127, 0, 0, 1].into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        if TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok() {
            let _ = thread.join();
        } else {
            eprintln!("<4>agent-check: could not wake the responder on {wake}; leaving it to process exit");
        }
    }
}

impl Drop for AgentServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn serve(listener: TcpListener, cell: EngineCell, stop: Arc<AtomicBool>) {
    let mut warned = false;
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        match conn {
            Ok(stream) => {
                warned = false;
                reply(stream, &cell);
            }
            Err(e) => {
                if !warned {
                    eprintln!("<4>agent-check: accept failed: {e}");
                    warned = true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn reply(mut stream: TcpStream, cell: &OnceLock<Arc<EngineShared>>) {
    // A dozen bytes into a fresh socket's send buffer: the write does not
    // block in practice; the timeout bounds a pathological peer.
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let mut line = agent_reply(cell);
    line.push('\n');
    let _ = stream.write_all(line.as_bytes());
    let _ = stream.shutdown(Shutdown::Write);
    // Read what the peer sent (an `agent-send` string) before closing:
    // closing with unread bytes would reset the connection, possibly before
    // HAProxy has read the line. Bounded in bytes and time.
    let deadline = std::time::Instant::now() + Duration::from_millis(100);
    let mut sink = [0u8; 512];
    for _ in 0..8 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match stream.read(&mut sink) {
            Ok(n) if n > 0 => continue,
            _ => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_follow_the_capacity_model() {
        assert_eq!(agent_line(false, false, 0, 8), "maint");
        assert_eq!(agent_line(false, true, 8, 8), "maint");
        assert_eq!(agent_line(true, false, 8, 8), "drain", "draining");
        assert_eq!(agent_line(true, true, 0, 8), "drain", "full");
        assert_eq!(agent_line(true, true, 8, 8), "up ready 100%");
        assert_eq!(agent_line(true, true, 3, 8), "up ready 38%");
        assert_eq!(
            agent_line(true, true, 1, 4096),
            "up ready 1%",
            "never 0% while admitting"
        );
        assert_eq!(agent_line(true, true, 9, 8), "up ready 100%");
    }

    #[test]
    fn replies_from_the_engine_state_over_tcp() {
        let cell: EngineCell = Arc::new(OnceLock::new());
        let server = AgentServer::start("127.0.0.1:0".parse().unwrap(), cell.clone()).unwrap();
        let ask = || {
            let mut s = TcpStream::connect(server.local_addr()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            text
        };
        assert_eq!(ask(), "maint\n", "no engine yet");
        // With HAProxy's `agent-send`, the peer writes first; it still gets the line.
        let mut s = TcpStream::connect(server.local_addr()).unwrap();
        s.write_all(b"moshid/gpu0\n").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        assert_eq!(text, "maint\n");
        let engine = Arc::new(EngineShared::new(4, 1, 10.0, 1));
        cell.set(engine.clone()).ok().unwrap();
        assert_eq!(ask(), "maint\n", "not warmed up");
        for b in 1..=4 {
            engine.step_times.set(b, 1000 * b as u32);
        }
        engine.ready.store(true, Ordering::Release);
        engine.admission().set_accepting(true);
        assert_eq!(ask(), "up ready 100%\n");
        let params = moshid_model::streaming::SessionParams::default;
        for _ in 0..3 {
            engine
                .admission()
                .admit(params(), &engine.step_times, engine.budget_ms)
                .unwrap();
        }
        assert_eq!(ask(), "up ready 25%\n");
        engine
            .admission()
            .admit(params(), &engine.step_times, engine.budget_ms)
            .unwrap();
        assert_eq!(ask(), "drain\n", "full");
        engine.admission().set_accepting(false);
        assert_eq!(ask(), "drain\n", "draining");
        server.stop();
    }
}
