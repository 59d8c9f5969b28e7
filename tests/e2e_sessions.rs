//! End-to-end churn: many short sessions come and go against the real
//! `moshid serve`, some ending abruptly; afterwards nothing is left held and
//! the counters add up.

use moshid_testkit::prelude::*;
use std::thread;
use std::time::{Duration, Instant};

const WORKERS: usize = 8;
const SESSIONS_PER_WORKER: usize = 25;

/// How a session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The client sends its frames and waits: the daemon ends the session
    /// (idle timeout) with its metadata.
    Normal,
    /// TCP connection dropped right after the handshake.
    DropAfterHandshake,
    /// TCP connection dropped right after sending, before any answer.
    DropAfterSending,
    /// TCP connection dropped in the middle of an Ogg page.
    DropMidPage,
    /// TCP connection dropped after the first answer, with frames in flight.
    DropAfterFirstAnswer,
    /// A WebSocket close after sending, without waiting for the answers.
    WebSocketClose,
}

fn ending(session: usize) -> Ending {
    const ABRUPT: [Ending; 5] = [
        Ending::DropAfterHandshake,
        Ending::DropAfterSending,
        Ending::DropMidPage,
        Ending::DropAfterFirstAnswer,
        Ending::WebSocketClose,
    ];
    if session % 4 == 3 {
        ABRUPT[(session / 4) % ABRUPT.len()]
    } else {
        Ending::Normal
    }
}

/// Connects, retrying (bounded) while the daemon says it is full, as a
/// client or balancer would: every slot held (a slot comes back only once
/// the engine has processed the previous session's close, which may be just
/// after that session's client saw it end), or one more stream over the
/// step-time budget (the CPU model built for tests, sharing two cores with
/// the other tests' daemons, can measure slow steps for a while).
fn connect_retrying(
    daemon_addr: std::net::SocketAddr,
    query: &str,
    refused: &mut u64,
) -> ChatClient {
    let deadline = Instant::now() + IDLE_TIMEOUT;
    loop {
        match ChatClient::connect(daemon_addr, query) {
            Ok(c) => return c,
            Err(NotStarted::Refused(msg))
                if msg.starts_with("server full") && Instant::now() < deadline =>
            {
                *refused += 1;
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("session not started: {e:?}"),
        }
    }
}

/// What one worker did.
#[derive(Debug, Default)]
struct Tally {
    started: u64,
    refused: u64,
    normal: u64,
}

fn worker(addr: std::net::SocketAddr, index: usize) -> Tally {
    let mut tally = Tally::default();
    for j in 0..SESSIONS_PER_WORKER {
        let session = index * SESSIONS_PER_WORKER + j;
        let who = format!("session {session} ({:?})", ending(session));
        let n = 3 + session % 2;
        let frames = signal((session % 7) as u32, n);
        let mut c = connect_retrying(addr, &format!("seed={session}"), &mut tally.refused);
        tally.started += 1;
        match ending(session) {
            Ending::Normal => {
                // No pacing: the daemon's in-flight bound paces the client.
                let log = c.run(&frames, Pace::Burst);
                log.assert_complete(n, &who);
                tally.normal += 1;
            }
            Ending::DropAfterHandshake => c.drop_connection(),
            Ending::DropAfterSending => {
                c.send_frames(&frames, Pace::Burst);
                c.drop_connection();
            }
            Ending::DropMidPage => {
                c.send_frame(&frames[0]);
                let pages = c.encode(&frames[1]);
                let mut msg = vec![kind::AUDIO];
                msg.extend_from_slice(&pages[..pages.len() / 2]);
                c.send_raw(msg);
                c.drop_connection();
            }
            Ending::DropAfterFirstAnswer => {
                c.send_frames(&frames, Pace::Burst);
                let deadline = Instant::now() + IO_TIMEOUT;
                while c.log.audio_payloads.is_empty() && !c.log.closed {
                    assert!(Instant::now() < deadline, "{who}: no answer");
                    c.receive_until(Instant::now() + Duration::from_millis(20));
                }
                c.drop_connection();
            }
            Ending::WebSocketClose => {
                c.send_frames(&frames, Pace::Burst);
                c.close();
            }
        }
    }
    tally
}

#[test]
fn many_sessions_come_and_go_without_leaking() {
    let daemon = daemon!().config(&config_with_idle_timeout(1000)).start();
    let addr = daemon.addr;
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| thread::spawn(move || worker(addr, w)))
        .collect();
    let mut total = Tally::default();
    for (w, t) in workers.into_iter().enumerate() {
        let tally = t
            .join()
            .unwrap_or_else(|_| panic!("worker {w} failed (its panic is printed above)"));
        total.started += tally.started;
        total.refused += tally.refused;
        total.normal += tally.normal;
    }
    let sessions = (WORKERS * SESSIONS_PER_WORKER) as u64;
    assert_eq!(total.started, sessions);

    let cap = daemon.wait_idle();
    let c = &cap["capacity"];
    assert_eq!(c["free_slots"], c["max_slots"], "{cap:#}");
    assert_eq!(c["admitted_total"], sessions, "{cap:#}");
    assert_eq!(c["refused_total"], total.refused, "{cap:#}");
    assert_eq!(c["accepting"], true, "{cap:#}");
    let e = &cap["engine"];
    assert_eq!(e["dropped_frames"], 0, "{cap:#}");
    assert_eq!(e["lost_outputs"], 0, "{cap:#}");
    assert_eq!(e["faults"], 0, "{cap:#}");

    // The daemon logged the end of every session, refused ones included.
    let ends = daemon.records(Record::SessionEnd, &[]).len() as u64;
    assert_eq!(ends, sessions + total.refused, "session end records");
    let idle_ends = daemon
        .records(Record::SessionEnd, &[("reason", "idle_timeout")])
        .len() as u64;
    assert_eq!(
        idle_ends, total.normal,
        "sessions ended by the idle timeout"
    );

    // And it still serves, then stops cleanly.
    let log = ChatClient::start(addr, "seed=1").run(&signal(0, 3), Pace::Burst);
    log.assert_complete(3, "session after the churn");
    daemon.wait_idle();
    let status = daemon.stop();
    assert!(
        status.success(),
        "moshid serve exited with {status} on SIGTERM"
    );
}

/// With at most as many frames in flight per session as the engine queues
/// per slot, a client sending far faster than real time is slowed down by
/// the daemon (it stops reading its socket) and loses nothing.
#[test]
fn burst_is_backpressured_when_in_flight_fits_the_engine_queue() {
    const FRAMES: usize = 30;
    let daemon = daemon!()
        .config(r#"{"session": {"idle_timeout_ms": 1000, "max_frames_in_flight": 4}}"#)
        .start();
    let log = ChatClient::start(daemon.addr, "seed=3").run(&signal(2, FRAMES), Pace::Burst);
    log.assert_complete(FRAMES, "burst");
    let cap = daemon.wait_idle();
    assert_eq!(cap["engine"]["dropped_frames"], 0, "{cap:#}");
}

/// The same with the default configuration: the in-flight bound may not
/// exceed what the engine queues per slot (the configuration refuses it), so
/// a burst is slowed down, never dropped. (With 8 in flight over a queue of
/// 4, 12 or 13 of 20 frames were dropped.)
#[test]
fn burst_is_backpressured_with_the_default_config() {
    const FRAMES: usize = 20;
    let daemon = daemon!().config(&config_with_idle_timeout(1000)).start();
    let log = ChatClient::start(daemon.addr, "seed=3").run(&signal(2, FRAMES), Pace::Burst);
    log.assert_complete(FRAMES, "burst with the default config");
}
