//! Programs and Python packages a test needs that nobody here wrote (sipp,
//! baresip, linphonec, haproxy, ffmpeg, chromium, sphn, huggingface_hub,
//! the openai and Pipecat packages, network namespaces…): the "peers".
//! `scripts/setup --tests` installs them once; tests never install anything.
//!
//! The one policy: a missing peer FAILS the test, saying how to install it,
//! unless the variable `MOSHID_SKIP` names it (`MOSHID_SKIP=sipp,linphonec`).
//! Then the test is skipped and says so on stderr in one fixed form,
//!
//! ```text
//! SKIPPED test=<test name> peer=<peer>: <why>
//! ```
//!
//! written past the test harness's capture, so CI counts it
//! (`.ci/run`'s closing line). A peer that is present runs, named or not.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The variable naming the peers whose tests may be skipped.
pub const SKIP_VAR: &str = "MOSHID_SKIP";

/// The Python interpreter of the tests' virtual environment, which
/// `scripts/setup --tests` makes at `.cache/test-venv` (overridden by
/// `MOSHID_PYTHON`; without either, `python3` from the PATH).
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("MOSHID_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = workspace_root().join(".cache/test-venv/bin/python3");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// The repository's root folder.
pub fn workspace_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Whether `peer` may be skipped (named in `MOSHID_SKIP`).
pub fn skip_allowed(peer: &str) -> bool {
    std::env::var(SKIP_VAR)
        .unwrap_or_default()
        .split([',', ' '])
        .any(|p| p.trim() == peer)
}

/// The one decision: `Ok` runs the test (`true`); a missing peer skips it
/// (`false`, said on stderr) when `MOSHID_SKIP` names it, and fails it
/// otherwise, with `why` and how to install it.
pub fn require(peer: &str, available: Result<(), String>) -> bool {
    let Err(why) = available else {
        return true;
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("<unnamed>")
        .to_string();
    if skip_allowed(peer) {
        let line = format!("SKIPPED test={test} peer={peer}: {why}\n");
        // Past libtest's capture: CI counts these lines.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        return false;
    }
    panic!(
        "{test} needs {peer}, which is missing: {why}. Install the tests' peers with \
         `scripts/setup --tests` ({}), or set {SKIP_VAR}={peer} to skip the tests that need it",
        install_hint(peer)
    );
}

/// Requires the program `bin` on the PATH (see [`require`]).
pub fn need_program(bin: &str) -> bool {
    require(bin, on_path(bin))
}

/// Requires the Python module `module` in [`python`] (see [`require`]).
pub fn need_python(module: &str) -> bool {
    need_python_package(module, module)
}

/// Requires the Python module `module` in [`python`], which the peer
/// `peer` provides (`pipecat` for `pipecat.services…`): `MOSHID_SKIP`
/// names the peer (see [`require`]).
pub fn need_python_package(peer: &str, module: &str) -> bool {
    let py = python();
    let ok = Command::new(&py)
        .args(["-c", &format!("import {module}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    require(
        peer,
        if ok {
            Ok(())
        } else {
            Err(format!("{} cannot import {module}", py.display()))
        },
    )
}

/// Whether `bin` is an executable on the PATH.
pub fn on_path(bin: &str) -> Result<(), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).any(|dir| {
        let p = dir.join(bin);
        std::fs::metadata(&p).is_ok_and(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.is_file() && m.permissions().mode() & 0o111 != 0
        })
    });
    if found {
        Ok(())
    } else {
        Err(format!("`{bin}` is not on the PATH"))
    }
}

/// Where a peer comes from, for the failure message.
fn install_hint(peer: &str) -> &'static str {
    match peer {
        "sipp" => "Debian package sip-tester",
        "baresip" => "Debian package baresip-core",
        "linphonec" => "Debian package linphone-cli",
        "haproxy" => "Debian package haproxy",
        "ffmpeg" => "Debian package ffmpeg",
        "chromium" => "Debian package chromium, or MOSHID_CHROMIUM",
        "ip" => "Debian package iproute2",
        "unshare" => "util-linux, run as root or where user namespaces are allowed",
        "systemd-analyze" | "systemd-sysusers" | "systemd-tmpfiles" => "Debian package systemd",
        "sphn" | "numpy" | "huggingface_hub" | "openai" | "pipecat" => {
            "pip packages in the tests' virtual environment .cache/test-venv"
        }
        _ => "see scripts/setup",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn present_runs_and_a_missing_peer_fails_unless_named() {
        assert!(require("sh", on_path("sh")));
        assert!(on_path("surely-not-a-program-moshid").is_err());
        let failed =
            std::panic::catch_unwind(|| require("surely-not-a-peer", Err("missing".into())));
        assert!(failed.is_err(), "a missing peer that is not named fails");
    }
}
