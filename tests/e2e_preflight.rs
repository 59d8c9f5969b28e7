//! The start-up preflight, end to end: the real `moshid serve` on a
//! real-sized header-only Moshi 7B folder (15.4 GB of sparse files, the
//! weights a hole) under an address-space limit exits non-zero within
//! seconds with the memory needed and available, no backtrace, and having
//! allocated nothing beyond the headers (its peak resident set, from
//! `wait4`, stays small); a model the CPU cannot run in real time is
//! refused with its predicted step; `check-checkpoint` prints the verdicts
//! for this machine; the demo starts as before (the other suites).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` to its end with `RLIMIT_AS` at `limit` bytes; returns the
/// exit code, stderr, the peak resident set in bytes and the wall time.
fn run_limited(mut cmd: Command, limit: u64) -> (Option<i32>, String, u64, Duration) {
    let err = tempfile::NamedTempFile::new().unwrap();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err.reopen().unwrap());
    // SAFETY: between fork and exec the closure only calls setrlimit, which
    // is async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let rl = libc::rlimit {
                rlim_cur: limit as libc::rlim_t,
                rlim_max: limit as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &rl) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let started = Instant::now();
    // Reaped by wait4 below, which also gives the peak resident set.
    #[allow(clippy::zombie_processes)]
    let child = cmd.spawn().unwrap();
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing through valid pointers; the
    // `Child` is not waited on otherwise (dropping it does not wait).
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let elapsed = started.elapsed();
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    let stderr = std::fs::read_to_string(err.path()).unwrap();
    (code, stderr, usage.ru_maxrss as u64 * 1024, elapsed)
}

fn moshi_7b(dir: &Path) {
    moshid_model::header_only::write_moshi_7b(dir).unwrap();
}

#[test]
fn moshi_7b_under_a_memory_limit_is_refused_in_words_before_loading() {
    let t = tempfile::tempdir().unwrap();
    moshi_7b(t.path());
    // The machine: `ulimit -v 16000000` (KiB).
    let limit = 16_000_000 * 1024;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_moshid"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--model"])
        .arg(t.path());
    let (code, stderr, maxrss, elapsed) = run_limited(cmd, limit);
    eprintln!("{stderr}\n(peak RSS {} MiB, {elapsed:?})", maxrss >> 20);
    assert_eq!(code, Some(1), "{stderr}");
    for want in [
        "not enough memory",
        "slot(s) need",
        "GiB available (RLIMIT_AS",
        "--backend cuda",
    ] {
        assert!(stderr.contains(want), "missing {want:?}:\n{stderr}");
    }
    for never in ["panicked", "backtrace", "memory allocation of"] {
        assert!(!stderr.contains(never), "{never:?} in:\n{stderr}");
    }
    assert!(elapsed < Duration::from_secs(20), "{elapsed:?}");
    // Headers only: the process never came near the weights' size.
    assert!(maxrss < 256 << 20, "peak RSS {} MiB", maxrss >> 20);
}

#[test]
fn a_model_too_slow_for_this_cpu_is_refused_with_its_predicted_step() {
    // Moshi 7B with room for its footprint is still far from real time on
    // any CPU; the speed verdict is reached only when memory fits, so judge
    // it through check-checkpoint, which prints both verdicts.
    let t = tempfile::tempdir().unwrap();
    moshi_7b(t.path());
    let o = Command::new(env!("CARGO_BIN_EXE_moshid"))
        .args(["check-checkpoint", "--backend", "auto", "--max-slots", "1"])
        .arg(t.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for want in [
        "on this machine",
        "cpu memory      1 slot(s) need",
        "cpu speed       predicted step at batch 1:",
        "NOT real time",
        "GB/s",
        "cuda ",
    ] {
        assert!(out.contains(want), "missing {want:?}:\n{out}");
    }
}

#[test]
fn check_checkpoint_on_the_demo_says_it_runs_here() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("demo");
    moshid_model::demo::write_demo(&d, 3).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_moshid"))
        .args(["check-checkpoint", "--backend", "cpu"])
        .arg(&d)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains(": fits") && out.contains(": real time"),
        "{out}"
    );
    assert!(!out.contains("cuda "), "{out}");
}
