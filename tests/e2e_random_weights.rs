//! End-to-end tests of `moshid serve --random-weights SHAPE`: the tiny shape
//! serves a conversation on the CPU backend and on the CUDA backend's
//! emulated device (weights made on the device, as on a GPU), says that its
//! weights are random wherever a user looks (`GET /v1/model`, the `ready`
//! line, the listening lines), and a full-size shape on the CPU backend or
//! an unknown shape is refused in words before anything is served.

use moshid_testkit::prelude::*;
use std::process::{Command, Stdio};

/// Sessions end 1.5 s after their last message; at most 4 frames in flight.
const CHAT_CONFIG: &str = r#"{"session": {"idle_timeout_ms": 1500, "max_frames_in_flight": 4}}"#;

/// A conversation with the tiny shape on `backend`, and every place that
/// must say the weights are random.
fn serves_a_marked_conversation(backend: &str, slots: &str) {
    let daemon = daemon!()
        .args([
            "--backend",
            backend,
            "--random-weights",
            "moshi-tiny",
            "--max-slots",
            slots,
        ])
        .config(CHAT_CONFIG)
        .start();
    let model = daemon.get_json("/v1/model");
    assert_eq!(model["model"]["random_weights"], "moshi-tiny", "{model:#}");
    assert_eq!(
        model["model"]["name"], "random weights: moshi-tiny",
        "{model:#}"
    );
    assert!(
        model["model"]["backend"]
            .as_str()
            .unwrap()
            .starts_with(backend),
        "{model:#}"
    );
    // The ready line is written before the daemon says where it listens,
    // so it is in the log once `start` returned.
    let log = daemon.stderr();
    let ready = log
        .lines()
        .find(|l| l.starts_with("<6>ready:"))
        .unwrap_or_else(|| panic!("no ready line: {log}"));
    assert!(
        ready.contains("RANDOM WEIGHTS (moshi-tiny)"),
        "the ready line must say so: {ready}"
    );
    // The emulator is far slower than real time: its frames go as fast as
    // the daemon takes them (backpressure, no drop).
    let pace = if backend == "emu" {
        Pace::Burst
    } else {
        Pace::RealTime
    };
    let client = ChatClient::start(daemon.addr, "seed=3");
    let log = client.run(&signal(1, 12), pace);
    log.assert_complete(12, backend);
    daemon.wait_idle();
}

#[test]
fn tiny_random_weights_serve_a_conversation_on_the_cpu() {
    serves_a_marked_conversation("cpu", "2");
}

#[test]
fn tiny_random_weights_are_made_on_the_emulated_gpu_and_serve_a_conversation() {
    serves_a_marked_conversation("emu", "2");
}

/// `moshid serve ARGS` that must refuse to start: its exit status and stderr.
fn refused(args: &[&str]) -> (Option<i32>, String) {
    let cache = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_moshid"))
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--cache-dir"])
        .arg(cache.path())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running moshid serve");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("listening on"),
        "it must not serve: {stdout}"
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_full_size_shape_is_refused_on_the_cpu_in_words() {
    for extra in [&[][..], &["--allow-slow"][..]] {
        let mut args = vec!["--backend", "cpu", "--random-weights", "moshi-7b"];
        args.extend_from_slice(extra);
        let (code, err) = refused(&args);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("--backend cuda"), "the way out: {err}");
        assert!(err.contains("RANDOM WEIGHTS (moshi-7b)"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn an_unknown_shape_is_refused_naming_the_key_and_the_shapes() {
    let (code, err) = refused(&["--random-weights", "gpt-4"]);
    assert_eq!(code, Some(2), "{err}");
    for want in ["model.random_weights", "`gpt-4`", "moshi-7b", "moshi-tiny"] {
        assert!(err.contains(want), "missing {want:?}: {err}");
    }
}

#[test]
fn random_weights_replace_a_checkpoint_not_join_one() {
    let (code, err) = refused(&["--random-weights", "moshi-tiny", "--model", "/nonexistent"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--random-weights") && err.contains("--model"),
        "{err}"
    );
}
