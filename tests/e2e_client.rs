//! End-to-end test of `moshid client` as a new user runs it: a WAV file in,
//! the real binary against a real `moshid serve`, a WAV file and text out.

use moshid_testkit::prelude::*;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Bound on one `moshid client` run (2 s of audio, plus connection and the
/// client's wait for trailing answers).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(90);

/// A 2 s linear chirp, 200 → 2000 Hz, 16 kHz mono 16-bit.
fn write_chirp(path: &Path) {
    moshid_testkit::audio::write_wav(path, 16_000, 2.0, |t| {
        // Phase of a chirp from f0 to f1 over 2 s: 2π (f0 t + (f1 − f0) t² / 4).
        let phase = 2.0 * std::f64::consts::PI * (200.0 * t + 1800.0 * t * t / 4.0);
        0.4 * phase.sin()
    });
}

/// Runs the `moshid` binary with `args`; killed (and the test failed)
/// after `timeout`.
fn run_moshid(args: &[&str], timeout: Duration) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_moshid"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning moshid");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => out.expect("waiting for moshid"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!(
                "`moshid {}` did not finish within {timeout:?}",
                args.join(" ")
            );
        }
    }
}

#[test]
fn moshid_client_streams_a_wav_file() {
    let daemon = daemon!().start();
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("chirp.wav");
    let output = dir.path().join("reply.wav");
    write_chirp(&input);
    let url = daemon.chat_url("");

    let out = run_moshid(
        &[
            "client",
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
            "--url",
            &url,
            "--param",
            "seed=5",
        ],
        CLIENT_TIMEOUT,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "moshid client failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    assert!(
        !stdout.trim().is_empty(),
        "no text on stdout; stderr: {stderr}"
    );

    let reader = hound::WavReader::open(&output).expect("the output WAV");
    let spec = reader.spec();
    assert_eq!(spec.sample_rate, 24_000, "{spec:?}");
    assert_eq!(spec.channels, 1, "{spec:?}");
    // 2 s = 25 frames of 80 ms in; the model answers every frame after the
    // first (one frame of delay): 24 frames of 1920 samples.
    let samples = reader.len() as usize;
    assert_eq!(
        samples,
        24 * 1920,
        "output length {samples} samples; stderr: {stderr}"
    );
    let pcm: Vec<i16> = hound::WavReader::open(&output)
        .unwrap()
        .into_samples::<i16>()
        .map(|s| s.expect("a sample"))
        .collect();
    assert!(pcm.iter().any(|&s| s != 0), "the output is silent");

    let cap = daemon.wait_idle();
    assert_eq!(cap["capacity"]["admitted_total"], 1, "{cap:#}");
    assert_eq!(cap["engine"]["frames_stepped"], 25, "{cap:#}");
}

#[test]
fn moshid_client_says_when_no_daemon_listens() {
    // A port that was just free: nothing listens on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("chirp.wav");
    let output = dir.path().join("reply.wav");
    write_chirp(&input);
    let url = format!("ws://127.0.0.1:{port}/api/chat");
    let out = run_moshid(
        &[
            "client",
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
            "--url",
            &url,
        ],
        CLIENT_TIMEOUT,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit status {}", out.status);
    assert!(
        stderr.contains("is `moshid serve` running?"),
        "unhelpful error: {stderr}"
    );
    assert!(!output.exists(), "an output file was left behind");
}
