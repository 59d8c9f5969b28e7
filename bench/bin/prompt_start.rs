//! `prompt-start`: how long a prompted session takes to start (connect →
//! handshake) on a daemon serving a model with prompts (PersonaPlex), cold
//! (a (voice, role) pair the daemon has not seen: the prompt runs through
//! the model) and warm (a pair it has: the state comes from the prompt
//! cache).
//!
//! Each round opens one cold session (the role text made unique by this
//! run's process id and the round's number, so a daemon that served an
//! earlier run has not seen it) and one warm session (the same pair every round; the
//! first time it is seen it counts as cold), one after the other, closing
//! each right after its handshake, then waits `--gap-ms`. Run it alone for
//! start times on an idle daemon, or beside `moshid-loadgen --url` on the
//! same daemon for start times under load and the load's latency with
//! prompts arriving (`bench/prompt-start.sh` does both).
//!
//! ```text
//! prompt-start --url ws://127.0.0.1:8998/api/chat --voice voice_a.wav --rounds 10
//! ```
//!
//! Prints one line per session and a summary; `--out FILE` writes the same
//! as JSON. A session that does not start is reported and counted, never
//! retried.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use moshid::client::percent_encode;
use moshid_bench::percentiles::percentile;
use moshid_testkit::chat::{open_session, NotStarted};
use serde_json::json;

#[derive(Debug, Parser)]
#[command(name = "prompt-start")]
struct Args {
    /// Chat endpoint of the daemon (ws://HOST:PORT/api/chat).
    #[arg(long)]
    url: String,
    /// `voice_prompt`: a file name in the daemon's voice folder.
    #[arg(long)]
    voice: String,
    /// `text_prompt` of the warm sessions; the cold ones append their round.
    #[arg(long, default_value = "You enjoy having a good conversation")]
    text: String,
    /// Rounds (one cold and one warm session each).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Pause after each round, in ms.
    #[arg(long, default_value_t = 1000)]
    gap_ms: u64,
    /// Seconds a session may take to start before it counts as failed.
    #[arg(long, default_value_t = 30.0)]
    timeout_s: f64,
    /// Write the sessions and the summary here as JSON.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One session's start: Ok(ms) or why it did not start.
fn start_ms(url: &str, timeout: Duration) -> Result<f64, String> {
    let t = Instant::now();
    match open_session(url, timeout) {
        Ok(mut ws) => {
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let _ = ws.get_ref().set_read_timeout(Some(Duration::from_secs(2)));
            let _ = ws.close(None);
            // Bounded by the socket's read timeout; the answer is not needed.
            let _ = ws.read();
            Ok(ms)
        }
        Err(NotStarted::Refused(why)) => Err(format!("refused: {why}")),
        Err(e) => Err(format!("{e:?}")),
    }
}

fn summary(values: &[f64]) -> serde_json::Value {
    if values.is_empty() {
        return json!({"n": 0});
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    json!({
        "n": v.len(),
        "min_ms": v[0],
        "p50_ms": percentile(&v, 50.0),
        "p90_ms": percentile(&v, 90.0),
        "max_ms": v[v.len() - 1],
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !(args.timeout_s > 0.0 && args.timeout_s.is_finite()) {
        eprintln!("prompt-start: --timeout-s must be a positive number of seconds");
        return ExitCode::from(2);
    }
    let timeout = Duration::from_secs_f64(args.timeout_s);
    let base = args.url.split('?').next().unwrap_or(&args.url).to_string();
    let query = |text: &str| {
        format!(
            "{base}?voice_prompt={}&text_prompt={}",
            percent_encode(&args.voice),
            percent_encode(text)
        )
    };
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    let mut sessions = Vec::new();
    let mut failures = 0usize;
    let mut warm_seen = false;
    for round in 0..args.rounds {
        let unique = format!("{} (run {} round {round})", args.text, std::process::id());
        for (text, is_warm) in [(unique.as_str(), false), (args.text.as_str(), true)] {
            let kind = if is_warm && warm_seen { "warm" } else { "cold" };
            match start_ms(&query(text), timeout) {
                Ok(ms) => {
                    println!("round {round} {kind}: {ms:.1} ms");
                    if kind == "warm" { &mut warm } else { &mut cold }.push(ms);
                    sessions.push(json!({"round": round, "kind": kind, "start_ms": ms}));
                    warm_seen |= is_warm;
                }
                Err(why) => {
                    println!("round {round} {kind}: not started: {why}");
                    failures += 1;
                    sessions.push(json!({"round": round, "kind": kind, "error": why}));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(args.gap_ms));
    }
    let report = json!({
        "voice": args.voice,
        "cold": summary(&cold),
        "warm": summary(&warm),
        "failed": failures,
        "sessions": sessions,
    });
    println!("cold: {}", report["cold"]);
    println!("warm: {}", report["warm"]);
    println!("failed: {failures}");
    if let Some(path) = &args.out {
        let text = serde_json::to_string_pretty(&report).expect("JSON");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("prompt-start: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if failures > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
