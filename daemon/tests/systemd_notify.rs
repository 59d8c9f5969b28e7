//! systemd integration, end to end: the real `moshid serve` with
//! `NOTIFY_SOCKET` pointing at a datagram socket this test reads and
//! `WATCHDOG_USEC` set, as systemd starts a `Type=notify` unit with
//! `WatchdogSec=`; and the shipped unit files checked by
//! `systemd-analyze verify` (plus the sysusers.d / tmpfiles.d pair applied to
//! a scratch root).
//!
//! Timing assertions are loose counts over windows, never tight deadlines.

use std::io::{BufRead, BufReader, ErrorKind};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use tungstenite::Message;

/// The daemon's `WATCHDOG_USEC`: 2 s, so a ping is due every second.
const WATCHDOG: Duration = Duration::from_secs(2);
/// `session.drain_grace_ms` of the daemon under test.
const DRAIN_GRACE: Duration = Duration::from_millis(500);
const READY_TIMEOUT: Duration = Duration::from_secs(120);

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

struct Daemon {
    child: Child,
    addr: SocketAddr,
    stderr: PathBuf,
}

impl Daemon {
    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &Path, notify_socket: &Path) -> Daemon {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"session": {{"drain_grace_ms": {}}}}}"#,
            DRAIN_GRACE.as_millis()
        ),
    )
    .unwrap();
    let stderr = dir.join("stderr.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_moshid"))
        .args(["serve", "--listen", "127.0.0.1:0", "--cache-dir"])
        .arg(tmp.join("demo-cache"))
        .arg("--config")
        .arg(&config)
        .env("NOTIFY_SOCKET", notify_socket)
        .env("WATCHDOG_USEC", WATCHDOG.as_micros().to_string())
        // As `systemd-run` without a PID: libsystemd's rules apply.
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .expect("spawning moshid serve");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut daemon = Daemon {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        stderr,
    };
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                if let Some(a) = line.trim().strip_prefix("moshid listening on http://") {
                    daemon.addr = a.parse().unwrap();
                    return daemon;
                }
            }
            Err(e) => panic!(
                "moshid did not report listening ({e:?}); stderr:\n{}",
                daemon.stderr()
            ),
        }
    }
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
    let mut daemon = start(dir.path(), &sock_path);
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
    let stream = TcpStream::connect(daemon.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let (mut ws, _) =
        tungstenite::client(format!("ws://{}/api/chat", daemon.addr), stream).unwrap();
    match ws.read().unwrap() {
        Message::Binary(b) => assert_eq!(&b[..], &[0u8], "handshake"),
        other => panic!("expected the handshake, got {other:?}"),
    }
    let sigterm_at = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &daemon.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());

    let stopping_at = wait_for(&rx, &mut seen, "STOPPING=1", Duration::from_secs(5));
    assert!(stopping_at >= sigterm_at);
    let stopping = seen.iter().find(|n| n.has("STOPPING=1")).unwrap();
    assert!(
        stopping.text.contains("STATUS=draining: 1 session(s) left"),
        "{:?}",
        stopping.text
    );

    // The session is closed after the grace period, with its record and reason.
    let mut metadata = None;
    let mut close_reason = None;
    loop {
        match ws.read() {
            Ok(Message::Binary(b)) if b.first() == Some(&0x04) => {
                metadata = Some(serde_json::from_slice::<serde_json::Value>(&b[1..]).unwrap());
            }
            Ok(Message::Close(frame)) => {
                close_reason = frame.map(|f| f.reason.to_string());
            }
            Ok(_) => {}
            Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => break,
            Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("session read: {e}; stderr:\n{}", daemon.stderr()),
        }
    }
    let closed_after = sigterm_at.elapsed();
    let metadata = metadata.expect("end metadata (0x04) before the close");
    assert_eq!(
        metadata["session"]["end_reason"]["kind"], "server_shutdown",
        "{metadata}"
    );
    assert_eq!(close_reason.as_deref(), Some("server_shutdown"));
    assert!(
        closed_after >= DRAIN_GRACE - Duration::from_millis(100),
        "closed {closed_after:?} after SIGTERM, before the {DRAIN_GRACE:?} grace"
    );

    // Exit status 0.
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(s) = daemon.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "moshid did not exit; stderr:\n{}",
            daemon.stderr()
        );
        thread::sleep(Duration::from_millis(20));
    };
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
    assert!(log.contains("reason=server_shutdown"), "{log}");
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
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("systemd-analyze is not installed: skipping `systemd-analyze verify` (the unit files were checked for their keys only)");
    } else {
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
    for (tool, file, extra) in tools {
        match Command::new(tool)
            .arg(format!("--root={}", root.display()))
            .args(&extra)
            .arg(units.join(file))
            .output()
        {
            Err(_) => println!("{tool} is not installed: skipping the check of {file}"),
            Ok(out) => assert!(
                out.status.success(),
                "{tool} {file}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }
    if root.join("etc/passwd").exists() {
        let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert!(passwd.lines().any(|l| l.starts_with("moshid:")), "{passwd}");
        assert!(root.join("var/cache/moshid").is_dir() && root.join("etc/moshid").is_dir());
    }
    // The example config parses and validates.
    let example = std::fs::read(units.join("moshid.example.json")).unwrap();
    let cfg: moshid::config::Config = serde_json::from_slice(&example).unwrap();
    cfg.validate().unwrap();
}
