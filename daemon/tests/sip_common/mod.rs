//! Shared by the SIP end-to-end tests: a network namespace of the test's
//! own (only `lo`, a default route over it, so every peer writes 127.0.0.1
//! into its SDP), the peers' binaries (installed by `scripts/setup --tests`
//! when missing), and sipp runs of the scenarios in `tests/data/sip/`.
//!
//! Each test re-runs itself, alone, inside `unshare -n` (or `unshare -rn`
//! where only a user namespace may be made); the daemon and the peers it
//! starts there share that namespace and see no other network. Every wait
//! is bounded (sipp's own `-timeout`, the daemon helpers' deadlines).

#![allow(dead_code)] // each test binary uses a subset

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

/// Set inside the namespace.
const NETNS_ENV: &str = "MOSHID_SIP_TEST_NETNS";

/// One namespaced test at a time (each runs a daemon and real-time peers).
static SERIAL: Mutex<()> = Mutex::new(());

/// Whether `bin` is on the PATH.
fn have(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether the peer `bin` can run: installs the test packages with
/// `scripts/setup --tests` when it is missing; `false` (the test is
/// skipped, saying so) only when it is still missing after that.
pub fn need(bin: &str) -> bool {
    if std::env::var_os(NETNS_ENV).is_some() || have(bin) {
        return true;
    }
    let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/setup");
    let status = Command::new(&setup).arg("--tests").status();
    if have(bin) {
        return true;
    }
    println!(
        "SKIPPED: `{bin}` is not installed and `scripts/setup --tests` could not install it ({status:?}); \
         install Debian's sip-tester / baresip-core / linphone-cli to run this test"
    );
    false
}

/// Runs test `name` again inside a network namespace of its own and checks
/// that it passed there. Returns `true` when called inside (run the test
/// body), `false` outside (the body ran in the child).
pub fn inside_netns(name: &str) -> bool {
    if std::env::var_os(NETNS_ENV).is_some() {
        return true;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // -n needs CAP_SYS_ADMIN (root, as in CI); -rn maps the user to root
    // in a user namespace of its own.
    let flags = ["-n", "-rn"]
        .into_iter()
        .find(|f| {
            Command::new("unshare")
                .args([f, "true"])
                .status()
                .is_ok_and(|s| s.success())
        })
        .expect("cannot make a network namespace with `unshare -n` or `unshare -rn` (util-linux)");
    let exe = std::env::current_exe().expect("the test binary");
    let script = r#"ip link set lo up && ip route add default dev lo && exec "$0" "$@""#;
    let out = Command::new("unshare")
        .args([flags, "sh", "-c", script])
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(NETNS_ENV, "1")
        .output()
        .expect("running the test in its namespace");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("---- {name} in its network namespace (unshare {flags}) ----\n{stdout}");
    if !stderr.is_empty() {
        eprintln!("{stderr}");
    }
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name} failed in its network namespace ({})",
        out.status
    );
    false
}

/// The SIP tests' daemon configuration: SIP on an ephemeral loopback port
/// (plus `extra_sip` keys), RTP given up after 5 s without packets, plus
/// `extra` top-level keys.
pub fn sip_config(extra_sip: &str, extra: &str) -> String {
    let sep = if extra_sip.is_empty() { "" } else { ", " };
    let sep2 = if extra.is_empty() { "" } else { ", " };
    format!(
        r#"{{"sip": {{"enabled": true, "address": "127.0.0.1:0"{sep}{extra_sip}}}, "rtp": {{"inactivity_timeout_ms": 5000}}{sep2}{extra}}}"#
    )
}

/// A free UDP port on loopback (for a peer's SIP socket).
pub fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("a free UDP port")
}

/// `seconds` of a 440 Hz tone as raw G.711 μ-law at 8 kHz (sipp's
/// `rtp_stream` plays raw payload bytes), written under `dir`.
pub fn ulaw_file(dir: &Path, seconds: u32) -> PathBuf {
    let n = 8000 * seconds as usize;
    let bytes: Vec<u8> = (0..n)
        .map(|i| {
            let x = (2.0 * std::f32::consts::PI * 440.0 * i as f32 / 8000.0).sin() * 8000.0;
            moshid_telephony::g711::linear_to_ulaw(x as i16)
        })
        .collect();
    let path = dir.join("tone.ulaw");
    std::fs::write(&path, bytes).expect("writing the tone");
    path
}

/// A finished sipp run.
pub struct SippRun {
    /// Its exit status, stdout and stderr.
    pub output: Output,
    /// Its error log (unexpected messages), if any.
    pub errors: String,
}

impl SippRun {
    /// Asserts that every call of the run succeeded.
    pub fn assert_ok(&self, what: &str) {
        let stdout = String::from_utf8_lossy(&self.output.stdout);
        let tail: String = stdout
            .lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            self.output.status.success(),
            "sipp {what}: {}\nstdout (tail):\n{tail}\nstderr:\n{}\nerrors:\n{}",
            self.output.status,
            String::from_utf8_lossy(&self.output.stderr),
            self.errors
        );
    }
}

/// Runs the scenario `name` (`tests/data/sip/NAME.xml`, with `subs`
/// replaced) against `target` (`ip:port`): `calls` calls, at most
/// `calls` at once, at `rate` per second.
pub fn sipp(
    dir: &Path,
    target: std::net::SocketAddr,
    name: &str,
    subs: &[(&str, String)],
    calls: u32,
    rate: u32,
) -> SippRun {
    sipp_with(dir, target, name, subs, calls, rate, &[])
}

/// Writes scenario `name` (`tests/data/sip/NAME.xml`, with `subs`
/// replaced) into a run folder of its own under `dir` (named with `tag`):
/// `(folder, scenario file, error log path)`.
fn prepare(
    dir: &Path,
    name: &str,
    subs: &[(&str, String)],
    tag: u16,
) -> (PathBuf, PathBuf, PathBuf) {
    let template = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/sip")
        .join(format!("{name}.xml"));
    let mut xml = std::fs::read_to_string(&template).expect("reading the scenario");
    for (k, v) in subs {
        xml = xml.replace(k, v);
    }
    let run_dir = dir.join(format!("sipp-{name}-{tag}"));
    std::fs::create_dir_all(&run_dir).unwrap();
    let scenario = run_dir.join(format!("{name}.xml"));
    std::fs::write(&scenario, xml).unwrap();
    let errors = run_dir.join("errors.log");
    (run_dir, scenario, errors)
}

/// [`sipp`] with further command-line options (`-auth_uri …`).
pub fn sipp_with(
    dir: &Path,
    target: std::net::SocketAddr,
    name: &str,
    subs: &[(&str, String)],
    calls: u32,
    rate: u32,
    extra: &[&str],
) -> SippRun {
    let (run_dir, scenario, errors) = prepare(dir, name, subs, free_udp_port());
    let output = Command::new("sipp")
        .current_dir(&run_dir)
        .arg("-sf")
        .arg(&scenario)
        .args(["-s", "moshi", "-i", "127.0.0.1", "-mi", "127.0.0.1", "-p"])
        .arg(free_udp_port().to_string())
        .args(["-m", &calls.to_string(), "-l", &calls.to_string()])
        .args(["-r", &rate.to_string()])
        .args([
            "-nostdin",
            "-timeout",
            "120s",
            "-timeout_error",
            "-trace_err",
            "-error_file",
        ])
        .arg(&errors)
        .args(extra)
        .arg(target.to_string())
        .output()
        .expect("running sipp");
    SippRun {
        output,
        errors: std::fs::read_to_string(&errors).unwrap_or_default(),
    }
}

/// sipp answering calls (a scenario that starts by receiving): spawned on
/// a port of its own, it serves `calls` calls and exits.
pub struct SippServer {
    child: std::process::Child,
    errors: PathBuf,
    /// Where it listens (`127.0.0.1:port`).
    pub addr: std::net::SocketAddr,
}

impl SippServer {
    /// Starts scenario `name` (`tests/data/sip/NAME.xml`, with `subs`
    /// replaced) for `calls` calls; `timeout_s` bounds the whole run.
    pub fn spawn(
        dir: &Path,
        name: &str,
        subs: &[(&str, String)],
        calls: u32,
        timeout_s: u32,
    ) -> SippServer {
        let port = free_udp_port();
        let (run_dir, scenario, errors) = prepare(dir, name, subs, port);
        let child = Command::new("sipp")
            .current_dir(&run_dir)
            .arg("-sf")
            .arg(&scenario)
            .args([
                "-i",
                "127.0.0.1",
                "-mi",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .args(["-m", &calls.to_string()])
            .args([
                "-nostdin",
                "-timeout",
                &format!("{timeout_s}s"),
                "-timeout_error",
            ])
            .args(["-trace_err", "-error_file"])
            .arg(&errors)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starting sipp");
        // sipp binds its port at once; give it a moment before calls come.
        std::thread::sleep(std::time::Duration::from_millis(300));
        SippServer {
            child,
            errors,
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    /// Waits for sipp to finish (its own `-timeout` bounds the wait).
    pub fn wait(self) -> SippRun {
        let output = self.child.wait_with_output().expect("waiting for sipp");
        SippRun {
            output,
            errors: std::fs::read_to_string(&self.errors).unwrap_or_default(),
        }
    }
}

/// The `key=value` field of a log line, as a number.
pub fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric `{key}=` in {line:?}"))
}
