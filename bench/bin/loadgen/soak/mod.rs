//! `moshid-loadgen soak`: a long run with sessions arriving and leaving at
//! random, to show what stays flat — memory, descriptors, every
//! per-session table — and that latency does not drift.
//!
//! ```text
//! moshid-loadgen soak --spawn target/release/moshid \
//!     --serve-args "--max-slots 32 --cache-dir /tmp/moshid-cache" \
//!     --minutes 24 --metrics-on-at 12 --rate 14
//! ```
//!
//! Sessions arrive as a Poisson process (`--rate` per second, seeded). Each
//! draws a length — short (`--short`, 0.4–1.6 s), medium (2–6 s) or long
//! (`--long`: longer than the model's context, `--context-frames`, so its
//! ring KV cache wraps) — and an ending: dropped TCP mid-stream
//! (`--abrupt`), or, evenly, the end-of-input message with the server's
//! record or a WebSocket close. At `--metrics-on-at` minutes the stage
//! metrics are switched on at run time (`POST /admin/metrics`).
//!
//! Recorded: every second, the daemon's RSS, open descriptors, threads, CPU
//! time and from `/metrics` every per-session table, the connection tables
//! and engine counters; per minute, sessions started and ended (by ending),
//! refusals, errors, added-latency percentiles of the answers that arrived
//! in that minute (as defined for the ramp), deadline misses. After the
//! last session: the daemon must be idle with every table at 0. Written to
//! `--out` (default `bench/reports/<UTC date>-soak/`): `soak.json`,
//! `minutes.csv`, `timeline.csv` and SVG figures; see [`summary`].
//!
//! Module map: [`caller`] (one session), [`probe`] (reading the daemon),
//! [`summary`] (per-minute records, checks, files).

mod caller;
mod probe;
mod summary;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use clap::Parser;

use crate::audio::{speech_like, EncodedAudio, Rng};
use caller::{Ending, Outcome, Plan};

/// Sessions arriving and leaving at random for a long time; memory,
/// descriptors, tables and latency per minute.
#[derive(Debug, Parser)]
#[command(name = "moshid-loadgen soak")]
pub struct SoakArgs {
    #[command(flatten)]
    pub(crate) target: crate::daemon::TargetArgs,
    /// Length of the run.
    #[arg(long, default_value_t = 24.0)]
    minutes: f64,
    /// Minutes not judged for flatness (allocators and caches settling).
    #[arg(long, default_value_t = 3)]
    warmup_minutes: usize,
    /// Switch stage metrics on at this minute (negative: never; 0: from the start).
    #[arg(long, default_value_t = 12.0, allow_hyphen_values = true)]
    metrics_on_at: f64,
    /// Session arrivals per second.
    #[arg(long, default_value_t = 14.0)]
    rate: f64,
    /// Share of short sessions (0.4–1.6 s).
    #[arg(long, default_value_t = 0.89)]
    short: f64,
    /// Share of long sessions (past the model's context); the rest are medium (2–6 s).
    #[arg(long, default_value_t = 0.01)]
    long: f64,
    /// Share of sessions whose TCP connection is dropped after their last frame.
    #[arg(long, default_value_t = 0.15)]
    abrupt: f64,
    /// The model's context in frames (the demo model's: 250, i.e. 20 s).
    #[arg(long, default_value_t = 250)]
    context_frames: usize,
    /// Sessions at once beyond which an arrival is skipped (counted).
    #[arg(long, default_value_t = 64)]
    max_concurrent: usize,
    /// Deadline of an answer after its frame was complete (ms).
    #[arg(long, default_value_t = 160.0)]
    budget_ms: f64,
    /// Frames the model answers late.
    #[arg(long, default_value_t = 1)]
    model_delay_frames: usize,
    /// Seed of arrivals, plans and audio offsets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output folder (default: bench/reports/<UTC date>-soak/).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Scheduling priority (nice) of the load generator, its autogroup and
    /// a spawned daemon, as for the ramp (0: unchanged).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    nice: i32,
}

/// Entry point of `moshid-loadgen soak ARGS`.
pub fn main() -> ExitCode {
    let args = SoakArgs::parse_from(std::env::args().skip(1));
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moshid-loadgen soak: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Draws one session's plan.
fn plan(args: &SoakArgs, rng: &mut Rng, audio_frames: usize) -> Plan {
    let kind = rng.unit();
    let (frames, long) = if kind < args.long {
        let extra = rng.range(50.0, 310.0) as usize;
        (args.context_frames + extra, true)
    } else if kind < args.long + args.short {
        (rng.range(5.0, 21.0) as usize, false)
    } else {
        (rng.range(25.0, 76.0) as usize, false)
    };
    let ending = if rng.unit() < args.abrupt {
        Ending::Abrupt
    } else if rng.unit() < 0.5 {
        Ending::EndOfInput
    } else {
        Ending::Close
    };
    Plan {
        frames,
        ending,
        first_frame: (rng.next_u64() % audio_frames as u64) as usize,
        long,
    }
}

fn run(args: SoakArgs) -> Result<()> {
    let autogroup = if args.nice != 0 {
        crate::sys::favour_self(args.nice).context("--nice (needs CAP_SYS_NICE for < 0)")?
    } else {
        None
    };
    let result = soak(args);
    crate::sys::restore_autogroup(autogroup);
    result
}

fn soak(args: SoakArgs) -> Result<()> {
    let started = SystemTime::now();
    let machine = crate::sys::machine();
    if !(args.rate > 0.0 && args.minutes > 0.0) {
        bail!("--rate and --minutes must be positive");
    }
    if !(0.0..=1.0).contains(&(args.short + args.long)) || !(0.0..=1.0).contains(&args.abrupt) {
        bail!("--short + --long and --abrupt must be shares in [0, 1]");
    }
    let target = args.target.target(args.nice)?;
    let (spawned, url, pid, addr) = (target.spawned, target.url, target.pid, target.addr);
    probe::http_body(addr, "/metrics").context("GET /metrics")?;
    if args.metrics_on_at != 0.0 {
        probe::switch_metrics(addr, false).context("switching stage metrics off at the start")?;
    } else {
        probe::switch_metrics(addr, true).context("switching stage metrics on at the start")?;
    }

    // 60 s of speech-like audio, shared; each session starts somewhere in it.
    let audio_frames = 750;
    let audio = EncodedAudio::encode(&speech_like(60.0, args.seed), audio_frames)?;
    let epoch = Instant::now();
    let shared = Arc::new(caller::Shared {
        url: url.clone(),
        audio,
        epoch,
        connect_timeout: Duration::from_secs(10),
        drain: Duration::from_secs(5),
        model_delay: args.model_delay_frames,
        context_frames: args.context_frames,
    });

    let mut rng = Rng::new(args.seed ^ 0x736f_616b);
    let end = epoch + Duration::from_secs_f64(args.minutes * 60.0);
    let metrics_on_at = (args.metrics_on_at > 0.0)
        .then(|| epoch + Duration::from_secs_f64(args.metrics_on_at * 60.0));
    let mut metrics_switched = metrics_on_at.is_none();
    let running = Arc::new(AtomicUsize::new(0));
    let (done_tx, done_rx) = mpsc::channel::<Outcome>();
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut readings: Vec<probe::Reading> = Vec::new();
    let mut concurrency: Vec<(f64, usize)> = Vec::new();
    let mut skipped: Vec<f64> = Vec::new();
    let mut next_arrival = epoch;
    let mut next_reading = epoch;
    let mut last_print = epoch;
    eprintln!(
        "soak: {:.0} min, {:.1} sessions/s, metrics on at {}",
        args.minutes,
        args.rate,
        metrics_on_at.map_or("never".into(), |_| format!("{} min", args.metrics_on_at))
    );
    loop {
        let now = Instant::now();
        let arriving = now < end;
        if !arriving && running.load(Ordering::Acquire) == 0 {
            break;
        }
        if now > end + Duration::from_secs(120) {
            eprintln!(
                "soak: {} sessions still running 120 s after the end; giving up on them",
                running.load(Ordering::Acquire)
            );
            break;
        }
        if metrics_on_at.is_some_and(|at| !metrics_switched && now >= at) {
            probe::switch_metrics(addr, true).context("switching stage metrics on")?;
            metrics_switched = true;
            eprintln!("soak: stage metrics switched on");
        }
        while arriving && next_arrival <= now {
            let t_s = next_arrival.duration_since(epoch).as_secs_f64();
            // Exponential inter-arrival times: a Poisson process.
            next_arrival += Duration::from_secs_f64(-(1.0 - rng.unit()).ln() / args.rate);
            if running.load(Ordering::Acquire) >= args.max_concurrent {
                skipped.push(t_s);
                continue;
            }
            let p = plan(&args, &mut rng, audio_frames);
            let (shared, tx, counter) = (shared.clone(), done_tx.clone(), running.clone());
            running.fetch_add(1, Ordering::AcqRel);
            let spawned = std::thread::Builder::new()
                .name("soak-caller".into())
                .stack_size(256 * 1024)
                .spawn(move || {
                    let out = caller::run(&shared, p);
                    counter.fetch_sub(1, Ordering::AcqRel);
                    let _ = tx.send(out);
                });
            if let Err(e) = spawned {
                running.fetch_sub(1, Ordering::AcqRel);
                bail!("cannot start a session thread: {e}");
            }
        }
        while let Ok(o) = done_rx.try_recv() {
            outcomes.push(o);
        }
        if now >= next_reading {
            let t_s = now.duration_since(epoch).as_secs_f64();
            readings.push(probe::read(addr, pid, t_s));
            concurrency.push((t_s, running.load(Ordering::Acquire)));
            next_reading += Duration::from_secs(1);
        }
        if now.duration_since(last_print) >= Duration::from_secs(60) {
            last_print = now;
            let r = readings.last().cloned().unwrap_or_default();
            eprintln!(
                "soak: {:>5.1} min: {} sessions done, {} running; RSS {:.1} MiB, {} fds, tables {:?}",
                now.duration_since(epoch).as_secs_f64() / 60.0,
                outcomes.len(),
                running.load(Ordering::Acquire),
                r.rss_kib as f64 / 1024.0,
                r.fds,
                r.tables
            );
        }
        let wake = [next_arrival, next_reading, now + Duration::from_millis(50)]
            .into_iter()
            .filter(|t| *t > now)
            .min()
            .unwrap_or(now + Duration::from_millis(5));
        std::thread::sleep(wake.saturating_duration_since(Instant::now()));
    }
    while let Ok(o) = done_rx.try_recv() {
        outcomes.push(o);
    }
    // Idle again: every table must come back to 0.
    let idle_deadline = Instant::now() + Duration::from_secs(30);
    let mut final_reading;
    loop {
        let t_s = epoch.elapsed().as_secs_f64();
        final_reading = probe::read(addr, pid, t_s);
        let idle = final_reading.scraped
            && final_reading.active_sessions == 0.0
            && final_reading.tables.iter().all(|&t| t == 0.0);
        if idle || Instant::now() >= idle_deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    readings.push(final_reading.clone());
    let (date, stamp) = crate::utc(started);
    let out_dir = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("reports")
            .join(format!("{date}-soak"))
    });
    let input = summary::Input {
        args: &args,
        serve_args: args.target.serve_args_list(),
        url,
        pid,
        started_utc: stamp,
        machine,
        metrics_on_at_s: metrics_on_at.map(|t| t.duration_since(epoch).as_secs_f64()),
        outcomes: &outcomes,
        readings: &readings,
        concurrency: &concurrency,
        skipped: &skipped,
        final_reading,
    };
    let report = summary::build(&input);
    let written = summary::write(&out_dir, &report, &input)?;
    summary::print(&report);
    for path in written {
        println!("wrote {path}");
    }
    drop(spawned);
    Ok(())
}
