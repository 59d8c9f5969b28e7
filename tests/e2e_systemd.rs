//! systemd integration, end to end: the real `moshid serve` with
//! `NOTIFY_SOCKET` pointing at a datagram socket this test reads and
//! `WATCHDOG_USEC` set, as systemd starts a `Type=notify` unit with
//! `WatchdogSec=`; and the shipped unit files checked by
//! `systemd-analyze verify` (plus the sysusers.d / tmpfiles.d pair applied to
//! a scratch root).
//!
//! Timing assertions are loose counts over windows, never tight deadlines.

use std::io::ErrorKind;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use moshid_testkit::peers::need_program;
use moshid_testkit::prelude::*;

/// The daemon's `WATCHDOG_USEC`: 2 s, so a ping is due every second.
const WATCHDOG: Duration = Duration::from_secs(2);
/// `session.drain_grace_ms` of the daemon under test.
const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// One notification datagram and when it arrived.
struct Note {
    at: Instant,
    text: String,
}

impl Note {
    fn has(&self, line: &str) -> bool {
        self.text.lines().any(|l| l == line)
    }
}

/// Collects datagrams from the notify socket until the receiver is dropped.
fn listen(sock: UnixDatagram) -> mpsc::Receiver<Note> {
    let (tx, rx) = mpsc::channel();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        loop {
            match sock.recv(&mut buf) {
                Ok(n) => {
                    let note = Note {
                        at: Instant::now(),
                        text: String::from_utf8_lossy(&buf[..n]).into_owned(),
                    };
                    if tx.send(note).is_err() {
                        return;
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => panic!("notify socket: {e}"),
            }
        }
    });
    rx
}

/// The daemon as systemd starts a `Type=notify` unit with `WatchdogSec=`:
/// `NOTIFY_SOCKET` and `WATCHDOG_USEC` set, no `WATCHDOG_PID`.
fn start(notify_socket: &Path) -> Daemon {
    daemon!()
        .config(&format!(
            r#"{{"session": {{"drain_grace_ms": {}}}}}"#,
            DRAIN_GRACE.as_millis()
        ))
        .env("NOTIFY_SOCKET", notify_socket)
        .env("WATCHDOG_USEC", WATCHDOG.as_micros().to_string())
        // As `systemd-run` without a PID: libsystemd's rules apply.
        .env_remove("WATCHDOG_PID")
        // Readiness is what this test watches, on the notify socket.
        .wait_ready(false)
        .start()
}

/// Waits for a datagram carrying `line`, keeping every datagram seen in `seen`.
fn wait_for(
    rx: &mpsc::Receiver<Note>,
    seen: &mut Vec<Note>,
    line: &str,
    within: Duration,
) -> Instant {
    if let Some(n) = seen.iter().find(|n| n.has(line)) {
        return n.at;
    }
    let deadline = Instant::now() + within;
    while let Ok(note) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        let at = note.at;
        let hit = note.has(line);
        seen.push(note);
        if hit {
            return at;
        }
    }
    let texts: Vec<&str> = seen.iter().map(|n| n.text.as_str()).collect();
    panic!("no {line} within {within:?}; datagrams so far: {texts:?}");
}

fn drain_into(rx: &mpsc::Receiver<Note>, seen: &mut Vec<Note>, for_: Duration) {
    let deadline = Instant::now() + for_;
    while let Ok(note) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        seen.push(note);
    }
}

#[test]
fn ready_watchdog_status_then_stopping_and_drain() {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tempfile::Builder::new()
        .prefix("moshid-sd-")
        .tempdir_in(tmp)
        .unwrap();
    let sock_path = dir.path().join("notify.sock");
    let rx = listen(UnixDatagram::bind(&sock_path).unwrap());
    let mut daemon = start(&sock_path);
    let mut seen = Vec::new();

    // READY=1 after warm-up, with a first status line; no watchdog ping before it.
    let ready_at = wait_for(&rx, &mut seen, "READY=1", Duration::from_secs(10));
    let ready = seen.iter().find(|n| n.has("READY=1")).unwrap();
    assert!(ready.text.contains("STATUS=serving:"), "{:?}", ready.text);
    assert!(
        !seen.iter().any(|n| n.at < ready_at && n.has("WATCHDOG=1")),
        "WATCHDOG=1 before READY=1"
    );

    // WATCHDOG=1 every WATCHDOG/2 (1 s): about 7 in 7 s. Loose bounds.
    let window = Duration::from_secs(7);
    drain_into(&rx, &mut seen, window);
    let pings: Vec<Instant> = seen
        .iter()
        .filter(|n| n.has("WATCHDOG=1"))
        .map(|n| n.at)
        .collect();
    assert!(
        (4..=14).contains(&pings.len()),
        "{} WATCHDOG=1 in {window:?} (expected about 7); stderr:\n{}",
        pings.len(),
        daemon.stderr()
    );
    // Rate-limited, not one per 80 ms tick; never late enough to trip a 2 s watchdog.
    for pair in pings.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= Duration::from_millis(400),
            "pings {gap:?} apart: not rate-limited"
        );
        assert!(
            gap < WATCHDOG,
            "pings {gap:?} apart: the watchdog would fire"
        );
    }
    let statuses: Vec<&str> = seen
        .iter()
        .flat_map(|n| n.text.lines())
        .filter(|l| l.starts_with("STATUS="))
        .collect();
    assert!(statuses.len() >= 2, "status lines: {statuses:?}");
    assert!(
        statuses.iter().all(|s| s.contains("session(s)")),
        "status lines name the sessions: {statuses:?}"
    );

    // One WebSocket session open, then SIGTERM.
    let mut session = ChatClient::start(daemon.addr, "");
    let sigterm_at = Instant::now();
    daemon.signal("TERM");

    let stopping_at = wait_for(&rx, &mut seen, "STOPPING=1", Duration::from_secs(5));
    assert!(stopping_at >= sigterm_at);
    let stopping = seen.iter().find(|n| n.has("STOPPING=1")).unwrap();
    assert!(
        stopping.text.contains("STATUS=draining: 1 session(s) left"),
        "{:?}",
        stopping.text
    );

    // The session is closed after the grace period, with its record and reason.
    session.wait_closed(Duration::from_secs(20));
    let closed_after = sigterm_at.elapsed();
    assert_eq!(
        session.log.transport_error,
        None,
        "session read; stderr:\n{}",
        daemon.stderr()
    );
    let metadata = session
        .log
        .metadata
        .clone()
        .expect("end metadata (0x04) before the close");
    assert_eq!(
        metadata["session"]["end_reason"]["kind"], "server_shutdown",
        "{metadata}"
    );
    assert_eq!(session.log.close_reason(), Some("server_shutdown"));
    assert!(
        closed_after >= DRAIN_GRACE - Duration::from_millis(100),
        "closed {closed_after:?} after SIGTERM, before the {DRAIN_GRACE:?} grace"
    );

    // Exit status 0.
    let exit = daemon.wait_exit(Duration::from_secs(20));
    assert!(
        exit.success(),
        "exit {exit:?}; stderr:\n{}",
        daemon.stderr()
    );
    let log = daemon.stderr();
    assert!(
        log.contains("<6>systemd: notify socket set, watchdog 2000 ms"),
        "{log}"
    );
    assert!(
        !daemon
            .records(Record::SessionEnd, &[("reason", "server_shutdown")])
            .is_empty(),
        "{log}"
    );
}

/// `systemd-analyze verify` on both units, ExecStart pointed at the binary
/// just built (verify checks that it exists); any diagnostic about them
/// fails. The sysusers.d / tmpfiles.d files are applied to a scratch root.
#[test]
fn unit_files_verify() {
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd");
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tempfile::Builder::new()
        .prefix("moshid-units-")
        .tempdir_in(tmp)
        .unwrap();
    for name in ["moshid.service", "moshid@.service"] {
        let text = std::fs::read_to_string(units.join(name)).unwrap();
        assert!(
            text.contains("ExecStart=/usr/local/bin/moshid serve"),
            "{name}"
        );
        for key in [
            "Type=notify",
            "WatchdogSec=",
            "TimeoutStopSec=",
            "LimitMEMLOCK=",
            "DeviceAllow=/dev/nvidiactl",
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "ProtectHome=yes",
            "PrivateTmp=yes",
            "RestrictAddressFamilies=",
            "SystemCallFilter=io_uring_setup io_uring_enter io_uring_register",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(key)),
                "{name} lacks {key}"
            );
        }
        // TimeoutStopSec must exceed the default drain grace (30 s).
        let stop: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("TimeoutStopSec="))
            .and_then(|v| v.trim_end_matches('s').parse().ok())
            .expect("TimeoutStopSec in seconds");
        let grace = moshid::config::Config::default().session.drain_grace_ms / 1000;
        assert!(
            stop > grace + 5,
            "{name}: TimeoutStopSec={stop}s vs drain grace {grace}s"
        );
        let text = text.replace("/usr/local/bin/moshid", env!("CARGO_BIN_EXE_moshid"));
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    if need_program("systemd-analyze") {
        for unit in ["moshid.service", "moshid@0.service", "moshid@1.service"] {
            let out = Command::new("systemd-analyze")
                .arg("verify")
                .arg(dir.path().join(unit))
                .output()
                .unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let about_us: Vec<&str> = text.lines().filter(|l| l.contains("moshid")).collect();
            assert!(
                out.status.success() && about_us.is_empty(),
                "systemd-analyze verify {unit}:\n{text}"
            );
        }
    }
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    let tools = [
        ("systemd-sysusers", "moshid.sysusers.conf", vec![]),
        ("systemd-tmpfiles", "moshid.tmpfiles.conf", vec!["--create"]),
    ];
    let mut applied = Vec::new();
    for (tool, file, extra) in tools {
        if !need_program(tool) {
            continue;
        }
        let out = Command::new(tool)
            .arg(format!("--root={}", root.display()))
            .args(&extra)
            .arg(units.join(file))
            .output()
            .unwrap_or_else(|e| panic!("running {tool}: {e}"));
        assert!(
            out.status.success(),
            "{tool} {file}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        applied.push(tool);
    }
    if applied.len() == 2 {
        let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert!(passwd.lines().any(|l| l.starts_with("moshid:")), "{passwd}");
        assert!(root.join("var/cache/moshid").is_dir() && root.join("etc/moshid").is_dir());
    }
    // The example config parses and validates.
    let example = std::fs::read(units.join("moshid.example.json")).unwrap();
    let cfg: moshid::config::Config = serde_json::from_slice(&example).unwrap();
    cfg.validate().unwrap();
}
