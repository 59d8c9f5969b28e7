//! What the SIP suites share: a network namespace of the test's own (only
//! `lo`, a default route over it, so every peer writes 127.0.0.1 into its
//! SDP), sipp runs of the scenarios in `tests/data/sip/`, and the
//! daemon's SIP configuration.
//!
//! Each test re-runs itself, alone, inside `unshare -n` (or `unshare -rn`
//! where only a user namespace may be made); the daemon and the peers it
//! starts there share that namespace and see no other network. Every wait
//! is bounded (sipp's own `-timeout`, the daemon helpers' deadlines).

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use crate::peers::{need_program, require};
use crate::wait::poll_until;

/// Set inside the namespace.
const NETNS_ENV: &str = "MOSHID_SIP_TEST_NETNS";

/// One namespaced test at a time (each runs a daemon and real-time peers).
static SERIAL: Mutex<()> = Mutex::new(());

/// The scenarios' folder.
fn scenarios() -> PathBuf {
    crate::peers::workspace_root().join("tests/data/sip")
}

/// Whether the SIP peer `bin` (sipp, baresip, linphonec) can run: always
/// inside the namespace (the parent checked); outside, see
/// [`crate::peers::require`].
pub fn need(bin: &str) -> bool {
    std::env::var_os(NETNS_ENV).is_some() || need_program(bin)
}

/// The `unshare` flags that make a network namespace here: `-n` needs
/// CAP_SYS_ADMIN (root, as in CI); `-rn` maps the user to root in a user
/// namespace of its own.
fn netns_flags() -> Result<&'static str, String> {
    crate::peers::on_path("ip")?;
    ["-n", "-rn"]
        .into_iter()
        .find(|f| {
            Command::new("unshare")
                .args([f, "true"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .ok_or_else(|| "cannot make a network namespace with `unshare -n` or `unshare -rn`".into())
}

/// Runs test `name` again inside a network namespace of its own and checks
/// that it passed there. Returns `true` when called inside (run the test
/// body), `false` outside (the body ran in the child, or the test was
/// skipped because no namespace can be made and `MOSHID_SKIP` names
/// `unshare`).
pub fn inside_netns(name: &str) -> bool {
    if std::env::var_os(NETNS_ENV).is_some() {
        return true;
    }
    let flags = netns_flags();
    if !require("unshare", flags.clone().map(|_| ())) {
        return false;
    }
    let flags = flags.expect("checked");
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
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
    // Indented, so that CI's count of `test result:` lines sees only the
    // outer run's.
    let indented: String = stdout.lines().map(|l| format!("  {l}\n")).collect();
    println!("---- {name} in its network namespace (unshare {flags}) ----\n{indented}");
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

/// Whether a UDP socket of this network namespace is bound to `port` on
/// IPv4 (`/proc/net/udp`), without touching the port.
pub fn udp_port_bound(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
    let want = format!(":{port:04X}");
    table.lines().skip(1).any(|l| {
        l.split_whitespace()
            .nth(1)
            .is_some_and(|local| local.ends_with(&want))
    })
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

/// Writes scenario `name` (`NAME.xml` of the scenarios' folder, with
/// `subs` replaced) into a run folder of its own under `dir` (named with
/// `tag`): `(folder, scenario file, error log path)`.
fn prepare(
    dir: &Path,
    name: &str,
    subs: &[(&str, String)],
    tag: u16,
) -> (PathBuf, PathBuf, PathBuf) {
    let template = scenarios().join(format!("{name}.xml"));
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

/// A sipp command for `scenario` on local `port`: `-m calls`, bounded by
/// its own `-timeout`, unexpected messages logged to `errors`.
fn sipp_command(
    run_dir: &Path,
    scenario: &Path,
    port: u16,
    calls: u32,
    timeout_s: u32,
    errors: &Path,
) -> Command {
    let mut cmd = Command::new("sipp");
    cmd.current_dir(run_dir)
        .arg("-sf")
        .arg(scenario)
        .args(["-i", "127.0.0.1", "-mi", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .args(["-m", &calls.to_string()])
        .args([
            "-nostdin",
            "-timeout",
            &format!("{timeout_s}s"),
            "-timeout_error",
            "-trace_err",
            "-error_file",
        ])
        .arg(errors);
    cmd
}

/// Runs the scenario `name` (with `subs` replaced) against `target`:
/// `calls` calls, at most `calls` at once, at `rate` per second.
pub fn sipp(
    dir: &Path,
    target: SocketAddr,
    name: &str,
    subs: &[(&str, String)],
    calls: u32,
    rate: u32,
) -> SippRun {
    sipp_with(dir, target, name, subs, calls, rate, &[])
}

/// [`sipp`] with further command-line options (`-auth_uri …`).
pub fn sipp_with(
    dir: &Path,
    target: SocketAddr,
    name: &str,
    subs: &[(&str, String)],
    calls: u32,
    rate: u32,
    extra: &[&str],
) -> SippRun {
    let (run_dir, scenario, errors) = prepare(dir, name, subs, free_udp_port());
    let output = sipp_command(&run_dir, &scenario, free_udp_port(), calls, 120, &errors)
        .args(["-s", "moshi", "-l", &calls.to_string()])
        .args(["-r", &rate.to_string()])
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
    child: Child,
    errors: PathBuf,
    /// Where it listens (`127.0.0.1:port`).
    pub addr: SocketAddr,
}

impl SippServer {
    /// Starts scenario `name` (with `subs` replaced) for `calls` calls;
    /// `timeout_s` bounds the whole run. Returns once sipp has bound its
    /// port.
    pub fn spawn(
        dir: &Path,
        name: &str,
        subs: &[(&str, String)],
        calls: u32,
        timeout_s: u32,
    ) -> SippServer {
        let port = free_udp_port();
        let (run_dir, scenario, errors) = prepare(dir, name, subs, port);
        let mut child = sipp_command(&run_dir, &scenario, port, calls, timeout_s, &errors)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting sipp");
        poll_until(
            "sipp to bind its port",
            Duration::from_secs(10),
            || {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("sipp exited ({status}) before binding port {port}");
                }
                udp_port_bound(port).then_some(())
            },
            || format!("port {port} is not bound"),
        );
        SippServer {
            child,
            errors,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_udp_port_is_seen_without_touching_it() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = s.local_addr().unwrap().port();
        assert!(udp_port_bound(port));
        drop(s);
        assert!(!udp_port_bound(port));
    }
}
