//! HAProxy in front of two real `moshid serve` daemons on loopback, with the
//! shipped `deploy/haproxy.cfg` (only its addresses rewritten): new WebSocket
//! sessions land on the daemon with room, and a draining daemon gets none.
//!
//! * Daemon A (`--max-slots 1`) holds a session opened directly, so its agent
//!   says `drain`; daemon B is free. Sessions opened through HAProxy must all
//!   get their handshake and all be on B (with `balance leastconn` alone,
//!   HAProxy — which does not see A's direct session — would send about
//!   half of them to A, which would refuse them).
//! * Everything closed, A says `up ready 100%` again and HAProxy puts it back
//!   (the `ready` word cancels the agent's own DRAIN).
//! * B, holding a direct session, gets SIGTERM: its agent says `drain`, a new
//!   session through HAProxy lands on A, HAProxy never tries B (its session
//!   and connection-error counters do not move), and B's own session ends
//!   with `server_shutdown` after the grace period; B exits 0.
//!
//! Needs `haproxy` (`scripts/setup --tests` installs it): without it this
//! test fails, saying so.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use moshid_testkit::peers::need_program;
use moshid_testkit::prelude::*;

/// B's `session.drain_grace_ms`: long enough for the drain phase below.
const B_GRACE_MS: u64 = 6000;

/// HAProxy, with its log; killed when dropped.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the daemon's HAProxy agent says now (`up ready 100%`, `drain`).
fn agent_line(d: &Daemon) -> String {
    let mut s = TcpStream::connect_timeout(&d.agent(), IO_TIMEOUT).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.trim().to_string()
}

/// Opens `/api/chat` at `addr`: `Ok` on the handshake, `Err` with what
/// came instead.
fn open_session(addr: SocketAddr) -> Result<ChatClient, String> {
    ChatClient::connect(addr, "").map_err(|e| format!("{e:?}"))
}

/// HAProxy's per-server statistics (`show stat` on the admin socket).
struct Stats(PathBuf);

impl Stats {
    fn server(&self, name: &str) -> HashMap<String, String> {
        let mut s = UnixStream::connect(&self.0)
            .unwrap_or_else(|e| panic!("HAProxy stats socket {}: {e}", self.0.display()));
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.write_all(b"show stat\n").unwrap();
        let mut csv = String::new();
        s.read_to_string(&mut csv).unwrap();
        let mut lines = csv.lines();
        let header: Vec<&str> = lines
            .next()
            .unwrap()
            .trim_start_matches("# ")
            .split(',')
            .collect();
        for line in lines {
            let row: HashMap<String, String> = header
                .iter()
                .zip(line.split(','))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            if row.get("pxname").map(String::as_str) == Some("moshid")
                && row.get("svname").map(String::as_str) == Some(name)
            {
                return row;
            }
        }
        panic!("no server {name} in:\n{csv}");
    }

    fn status(&self, name: &str) -> String {
        self.server(name)["status"].clone()
    }

    fn counter(&self, name: &str, column: &str) -> u64 {
        self.server(name)[column].parse().unwrap_or(0)
    }

    /// Polls until `name`'s status starts with `want`; returns every status seen.
    fn wait_status(&self, name: &str, want: &str, within: Duration, haproxy: &Proc) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut seen: Vec<String> = Vec::new();
        loop {
            let s = self.status(name);
            if seen.last() != Some(&s) {
                seen.push(s.clone());
            }
            if s.starts_with(want) {
                return seen;
            }
            assert!(
                Instant::now() < deadline,
                "server {name}: status never {want} within {within:?} (seen {seen:?}); haproxy log:\n{}",
                haproxy.log()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The shipped config with this test's addresses.
fn haproxy_config(dir: &Path, front: u16, a: &Daemon, b: &Daemon) -> String {
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/haproxy.cfg"),
    )
    .unwrap();
    let mut cfg = shipped.clone();
    let edits = [
        (
            "stats socket /run/haproxy-moshid.sock".to_string(),
            format!("stats socket {}/admin.sock", dir.display()),
        ),
        ("bind :8080".to_string(), format!("bind 127.0.0.1:{front}")),
        // Two descriptors per connection: 20000 needs a higher RLIMIT_NOFILE
        // than a test may have.
        ("maxconn 20000".to_string(), "maxconn 1000".to_string()),
        (
            "server gpu0 127.0.0.1:8998 agent-port 9998".to_string(),
            format!("server gpu0 {} agent-port {}", a.addr, a.agent().port()),
        ),
        (
            "server gpu1 127.0.0.1:8999 agent-port 9999".to_string(),
            format!("server gpu1 {} agent-port {}", b.addr, b.agent().port()),
        ),
    ];
    for (from, to) in edits {
        assert!(
            cfg.contains(&from),
            "deploy/haproxy.cfg no longer contains `{from}`: update this test"
        );
        cfg = cfg.replace(&from, &to);
    }
    for key in [
        "balance leastconn",
        "option httpchk GET /ready",
        "agent-check",
        "agent-inter 1s",
        "timeout tunnel",
    ] {
        assert!(shipped.contains(key), "deploy/haproxy.cfg lacks `{key}`");
    }
    cfg
}

#[test]
fn sessions_land_where_there_is_room_and_never_on_a_draining_daemon() {
    if !need_program("haproxy") {
        return;
    }
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tempfile::Builder::new()
        .prefix("moshid-haproxy-")
        .tempdir_in(tmp)
        .unwrap();
    let check = Command::new("haproxy")
        .args(["-c", "-f"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/haproxy.cfg"))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "haproxy -c on deploy/haproxy.cfg: {check:?}"
    );

    let agent_cfg = |grace: u64| {
        format!(
            r#"{{"listen": {{"agent_address": "127.0.0.1:0"}}, "session": {{"drain_grace_ms": {grace}}}}}"#
        )
    };
    let a = daemon!()
        .args(["--max-slots", "1"])
        .config(&agent_cfg(2000))
        .start();
    let mut b = daemon!()
        .args(["--max-slots", "4"])
        .config(&agent_cfg(B_GRACE_MS))
        .start();
    assert_eq!(agent_line(&a), "up ready 100%");
    assert_eq!(agent_line(&b), "up ready 100%");

    let front: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let cfg_path = dir.path().join("haproxy.cfg");
    std::fs::write(&cfg_path, haproxy_config(dir.path(), front.port(), &a, &b)).unwrap();
    let log = dir.path().join("haproxy.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let haproxy = Proc {
        child: Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&cfg_path)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .expect("starting haproxy"),
        log,
    };
    let stats = Stats(dir.path().join("admin.sock"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !stats.0.exists() || UnixStream::connect(&stats.0).is_err() {
        assert!(
            Instant::now() < deadline,
            "haproxy did not start: {}",
            haproxy.log()
        );
        thread::sleep(Duration::from_millis(50));
    }
    stats.wait_status("gpu0", "UP", Duration::from_secs(10), &haproxy);
    stats.wait_status("gpu1", "UP", Duration::from_secs(10), &haproxy);

    // Phase 1: A is full (a session opened directly), B is free.
    let held_a = open_session(a.addr).expect("direct session on A");
    assert_eq!(agent_line(&a), "drain");
    stats.wait_status("gpu0", "DRAIN", Duration::from_secs(10), &haproxy);
    let a_total = stats.counter("gpu0", "stot");
    let mut via_lb = Vec::new();
    for i in 0..3 {
        let ws = open_session(front).unwrap_or_else(|e| {
            panic!(
                "session {i} through HAProxy: {e}; haproxy log:\n{}",
                haproxy.log()
            )
        });
        via_lb.push(ws);
    }
    assert_eq!(
        b.active_sessions(),
        3,
        "every new session on B, the daemon with room"
    );
    assert_eq!(a.active_sessions(), 1, "A kept only its own session");
    assert_eq!(
        stats.counter("gpu0", "stot"),
        a_total,
        "HAProxy sent nothing to A"
    );
    assert_eq!(stats.counter("gpu1", "stot"), 3);

    // Everything closed: A has room again and HAProxy puts it back.
    for c in via_lb.drain(..) {
        c.close();
    }
    held_a.close();
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.active_sessions() + b.active_sessions() > 0 {
        assert!(Instant::now() < deadline, "sessions did not end");
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(agent_line(&a), "up ready 100%");
    stats.wait_status("gpu0", "UP", Duration::from_secs(10), &haproxy);

    // Phase 2: B drains (SIGTERM with a direct session open).
    let held_b = open_session(b.addr).expect("direct session on B");
    let (b_total, b_errors, b_redisp) = (
        stats.counter("gpu1", "stot"),
        stats.counter("gpu1", "econ"),
        stats.counter("gpu1", "wredis"),
    );
    let sigterm_at = Instant::now();
    b.signal("TERM");
    let seen = stats.wait_status("gpu1", "DRAIN", Duration::from_secs(5), &haproxy);
    assert_eq!(agent_line(&b), "drain");
    let on_a = open_session(front).unwrap_or_else(|e| {
        panic!("session through HAProxy while B drains: {e}; statuses of B {seen:?}")
    });
    assert_eq!(a.active_sessions(), 1, "the new session is on A");
    assert_eq!(
        stats.counter("gpu1", "stot"),
        b_total,
        "HAProxy sent nothing to the draining B"
    );
    assert_eq!(
        stats.counter("gpu1", "econ"),
        b_errors,
        "HAProxy did not even try B"
    );
    assert_eq!(stats.counter("gpu1", "wredis"), b_redisp);

    // B's own session ends with server_shutdown after its grace; B exits 0.
    let mut held_b = held_b;
    held_b.wait_closed(IO_TIMEOUT);
    let meta = held_b.log.metadata.clone().expect("end metadata from B");
    assert_eq!(
        meta["session"]["end_reason"]["kind"], "server_shutdown",
        "{meta}"
    );
    assert_eq!(held_b.log.close_reason(), Some("server_shutdown"));
    assert!(sigterm_at.elapsed() >= Duration::from_millis(B_GRACE_MS - 200));
    let exit = b.wait_exit(Duration::from_secs(20));
    assert!(
        exit.success(),
        "B exited {exit:?}; stderr:\n{}",
        b.stderr_tail()
    );
    // B logged exactly the sessions it had (the three from phase 1, its own
    // direct one) and no other.
    let ends = b.records(Record::SessionEnd, &[]);
    assert_eq!(ends.len(), 4, "{}", b.stderr());
    on_a.close();
    drop(haproxy);
}
