//! `moshid-loadgen`: the load generator capacity planning relies on.
//!
//! N simulated callers talk to a moshid (or any Kyutai-protocol server) over
//! WebSocket, each sending real audio in Ogg Opus at real-time pace, and the
//! tool measures what serving adds to every frame's latency, how many frames
//! miss their deadline, how many sessions are refused, and what the daemon's
//! CPU per stream costs next to bare Opus decode + encode. In ramp mode it
//! raises N step by step until a criterion breaks and reports the largest N
//! that held. See bench/reports/README.md for a run and how to read it.
//!
//! ```text
//! moshid-loadgen --spawn target/release/moshid --serve-args "--max-slots 64" \
//!     --ramp 1:64:x2 --refine 2 --step-seconds 15
//! moshid-loadgen --url ws://127.0.0.1:8998/api/chat --pid 1234 --streams 8
//! ```
//!
//! Definitions (also written into the report):
//! - added latency of frame i = arrival of the answer its step released −
//!   the moment frame i's last sample was captured (see [`stats`]); the
//!   model's own delay (1 frame) is not included;
//! - deadline miss = an answer later than `--budget-ms` (default 160 ms: the
//!   engine ticks each phase group every 80 ms at a fixed phase, so a frame
//!   waits up to one period for its tick by design; the budget allows one
//!   more period for the step, encoding and the network), or a frame never
//!   answered;
//! - daemon CPU per stream-second = utime + stime of the daemon over the step
//!   / (accepted sessions × audio seconds each).
//!
//! `moshid-loadgen soak …` is the soak runner instead: sessions arriving
//! and leaving at random for a long time (see [`soak`]).
//!
//! Module map: [`plan`] (ramp, criteria), [`stream`] (one caller),
//! [`audio`] (signal, shared encoding, bare-Opus floor), [`daemon`] (spawn,
//! `/capacity`), [`stats`] (percentiles, answer matching), [`sys`] (/proc),
//! [`report`] (JSON, SVG).

mod audio;
mod daemon;
mod demo_answers;
mod plan;
mod report;
mod soak;
mod stats;
mod stream;
mod sys;
mod wire;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Parser;

use audio::{EncodedAudio, OpusFloor, Rng};
use daemon::EngineCounters;
use plan::Criteria;
use report::{Report, RunConfig, StepReport};
use stream::{Outcome, StepShared};
use wire::Protocol;

/// Simulated callers against moshid's /api/chat: latency, deadline misses,
/// refusals and daemon CPU per stream, at one load or over a ramp.
#[derive(Debug, Parser)]
#[command(name = "moshid-loadgen")]
struct Args {
    #[command(flatten)]
    target: daemon::TargetArgs,
    /// What the callers speak: chat (Kyutai's /api/chat, Ogg Opus),
    /// realtime (the OpenAI Realtime API on /v1/realtime, base64 PCM16 in
    /// JSON), or both as a list (`chat,realtime`: each step runs once per
    /// protocol against the same daemon, so their costs compare in one run;
    /// with --streams only).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "chat")]
    protocol: Vec<Protocol>,
    /// Run this many callers once.
    #[arg(long, required_unless_present = "ramp", conflicts_with = "ramp")]
    streams: Option<usize>,
    /// Numbers of callers to try in turn: START:END:STEP, START:END:xFACTOR
    /// or a comma list; stops at the first step that breaks --stop-on.
    #[arg(long)]
    ramp: Option<String>,
    /// After a ramp breaks, bisect between the last N that held and the
    /// first that broke, at most this many more steps.
    #[arg(long, default_value_t = 0)]
    refine: usize,
    /// Audio seconds each caller sends per step.
    #[arg(long, default_value_t = 10.0)]
    step_seconds: f64,
    /// Deadline of an answer after its frame was complete, in ms.
    #[arg(long, default_value_t = 160.0)]
    budget_ms: f64,
    /// What breaks a step: comma list of p99 (p99 added latency over the
    /// budget), miss (any deadline miss), refused (any refusal), error (any
    /// caller failure), or none.
    #[arg(long, default_value = "p99,miss,refused,error")]
    stop_on: String,
    /// Send jitter: each frame goes out uniformly 0..JITTER ms after it is
    /// complete (order kept).
    #[arg(long, default_value_t = 0.0)]
    jitter_ms: f64,
    /// Probability that a frame is lost on the send side (never sent).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Seed of phase offsets, jitter, loss and the generated speech.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Send this WAV (any format; converted to 24 kHz mono, looped) instead
    /// of the generated speech-like signal.
    #[arg(long)]
    wav: Option<PathBuf>,
    /// Output folder (default: bench/reports/<UTC date>/).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Interval of /capacity polls during the run, in ms.
    #[arg(long, default_value_t = 250)]
    poll_ms: u64,
    /// Frames the model answers late (1 for Moshi and the demo model).
    #[arg(long, default_value_t = 1)]
    model_delay_frames: usize,
    /// Audio seconds of the bare-Opus floor measurement.
    #[arg(long, default_value_t = 20.0)]
    floor_seconds: f64,
    /// For a daemon serving the embedded demo: the floor encodes the demo
    /// model's own answers to the sent audio (stepped here on the CPU from
    /// the demo checkpoint in this cache folder), i.e. what the daemon
    /// encodes, instead of the answers a caller decoded (audio that has been
    /// through Opus once, which libopus encodes more cheaply). The
    /// decoded-answer floor and its ratios are reported too.
    #[arg(long, value_name = "CACHE_DIR")]
    floor_demo_answers: Option<PathBuf>,
    /// Seconds of the daemon's idle CPU measurement before the ramp.
    #[arg(long, default_value_t = 5.0)]
    idle_seconds: f64,
    /// Scheduling priority (nice, -20..19) for the load generator, its
    /// session's autogroup and a spawned daemon: on a machine shared with
    /// other work, e.g. -10 lets them have the CPU first (0: unchanged).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    nice: i32,
    /// Seconds a caller waits to connect and get its handshake.
    #[arg(long, default_value_t = 10.0)]
    connect_timeout: f64,
    /// Seconds a caller waits for answers after its last frame.
    #[arg(long, default_value_t = 2.0)]
    drain_seconds: f64,
}

/// Answering sessions the demo-answer floor encodes (`--floor-demo-answers`).
const DEMO_FLOOR_STREAMS: usize = 8;

/// What every step needs.
struct Ctx {
    /// The chat endpoint (the other protocols' are on the same address).
    url: String,
    addr: std::net::SocketAddr,
    pid: Option<u32>,
    audio: Arc<EncodedAudio>,
    frames: usize,
    budget_ms: f64,
    model_delay: usize,
    jitter_ms: f64,
    loss: f64,
    connect_timeout: Duration,
    drain: Duration,
    criteria: Criteria,
    idle_ms_per_s: Option<f64>,
    gauge: Arc<AtomicUsize>,
}

fn main() -> ExitCode {
    // `moshid-loadgen soak …`: the long run with random arrivals (soak/).
    if std::env::args().nth(1).as_deref() == Some("soak") {
        return soak::main();
    }
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moshid-loadgen: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn secs(s: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s).with_context(|| format!("{what}: {s}"))
}

fn run(args: Args) -> Result<()> {
    let started = SystemTime::now();
    let machine = sys::machine();
    let criteria = Criteria::parse(&args.stop_on)?;
    let (plan, ramping) = match (&args.ramp, args.streams) {
        (Some(spec), _) => (plan::parse_ramp(spec)?, true),
        (None, Some(n)) if n > 0 => (vec![n], false),
        _ => bail!("give --streams N (N >= 1) or --ramp"),
    };
    if ramping && args.protocol.len() > 1 {
        bail!("--protocol with more than one protocol needs --streams, not --ramp");
    }
    if !(0.0..1.0).contains(&args.loss) {
        bail!("--loss must be in [0, 1)");
    }
    if args.step_seconds < 0.5 {
        bail!("--step-seconds must be at least 0.5");
    }
    let frames = (args.step_seconds * 1000.0 / moshid::FRAME_MS).ceil() as usize;
    let autogroup_nice = if args.nice != 0 {
        sys::favour_self(args.nice).context("--nice (needs CAP_SYS_NICE for < 0)")?
    } else {
        None
    };
    let result = measure(&args, criteria, plan, ramping, frames, started, machine);
    sys::restore_autogroup(autogroup_nice);
    result
}

/// Everything after the setup of `run`: floor, daemon, steps, outputs.
fn measure(
    args: &Args,
    criteria: Criteria,
    plan: Vec<usize>,
    ramping: bool,
    frames: usize,
    started: SystemTime,
    machine: sys::Machine,
) -> Result<()> {
    // Audio, encoded once (the floor is measured after the ramp).
    let (pcm, audio_name) = match &args.wav {
        Some(path) => (
            moshid::client::wav::read_wav_24k_mono(path)?.samples,
            path.display().to_string(),
        ),
        None => (
            audio::speech_like(20.0, args.seed),
            format!(
                "generated speech-like signal, 20 s looped, seed {}",
                args.seed
            ),
        ),
    };
    let audio = Arc::new(EncodedAudio::encode(&pcm, frames)?);
    let floor_audio = secs(args.floor_seconds, "--floor-seconds")?;

    // The daemon.
    let target = args.target.target(args.nice)?;
    let (spawned, url, pid, addr) = (target.spawned, target.url, target.pid, target.addr);
    EngineCounters::read(addr).with_context(|| format!("GET http://{addr}/capacity"))?;

    let idle_ms_per_s = pid.and_then(|pid| {
        let c0 = sys::process_cpu_ms(pid)?;
        let t = Instant::now();
        std::thread::sleep(secs(args.idle_seconds, "--idle-seconds").ok()?);
        let c1 = sys::process_cpu_ms(pid)?;
        Some((c1 - c0) / t.elapsed().as_secs_f64())
    });
    if let Some(idle) = idle_ms_per_s {
        eprintln!("daemon idle CPU: {idle:.1} ms per second");
    }

    let ctx = Ctx {
        url: url.clone(),
        addr,
        pid,
        audio,
        frames,
        budget_ms: args.budget_ms,
        model_delay: args.model_delay_frames,
        jitter_ms: args.jitter_ms,
        loss: args.loss,
        connect_timeout: secs(args.connect_timeout, "--connect-timeout")?,
        drain: secs(args.drain_seconds, "--drain-seconds")?,
        criteria,
        idle_ms_per_s,
        gauge: Arc::new(AtomicUsize::new(0)),
    };
    let epoch = Instant::now();
    let poller = daemon::Poller::start(
        addr,
        Duration::from_millis(args.poll_ms.max(20)),
        epoch,
        ctx.gauge.clone(),
    )?;
    let mut rng = Rng::new(args.seed ^ 0x6c6f_6164_6765_6e00);

    let mut steps: Vec<StepReport> = Vec::new();
    let mut held: Option<usize> = None;
    let mut broke: Option<usize> = None;
    let mut answer_pcm: Vec<f32> = Vec::new();
    for &n in &plan {
        let mut ok = true;
        for &protocol in &args.protocol {
            let keep = answer_pcm.is_empty() && protocol == Protocol::Chat;
            let (step, answer) = run_step(&ctx, n, protocol, &mut rng, keep)?;
            answer_pcm.extend(answer.unwrap_or_default());
            ok &= step.held;
            steps.push(step);
        }
        if ok {
            held = Some(n);
        } else {
            broke = Some(n);
            if ramping {
                break;
            }
        }
    }
    let mut refine = if ramping { args.refine } else { 0 };
    while refine > 0 {
        let (low, Some(high)) = (held.unwrap_or(0), broke) else {
            break;
        };
        if high - low < 2 {
            break;
        }
        let n = low + (high - low) / 2;
        let (step, _) = run_step(&ctx, n, args.protocol[0], &mut rng, false)?;
        if step.held {
            held = Some(n);
        } else {
            broke = Some(n);
        }
        steps.push(step);
        refine -= 1;
    }
    let polls = poller.finish();
    drop(spawned);
    steps.sort_by_key(|s| s.streams);

    // The floor, with the daemon gone: decoding what was sent, encoding
    // what came back (or what was sent, if no answer was kept).
    let answer_frames: Vec<[f32; moshid::FRAME_SAMPLES]> = answer_pcm
        .chunks_exact(moshid::FRAME_SAMPLES)
        .map(|c| c.try_into().expect("exact chunk"))
        .collect();
    let floor_sent = audio::bare_opus_floor(&ctx.audio, ctx.audio.pcm(), floor_audio)?;
    let (floor, floor_basis) = if answer_frames.len() >= 12 {
        (
            audio::bare_opus_floor(&ctx.audio, &answer_frames, floor_audio)?,
            format!(
                "decode of the sent audio + encode of the daemon's answer audio ({:.1} s kept \
                 from one caller of the first step, looped)",
                answer_frames.len() as f64 * moshid::FRAME_MS / 1000.0
            ),
        )
    } else {
        (
            floor_sent,
            "decode + encode of the sent audio (no answer audio kept)".into(),
        )
    };
    // With --floor-demo-answers the floor encodes the model's raw answers;
    // the decoded-answer floor stays in the report beside it.
    let (floor, floor_basis, floor_decoded) = match &args.floor_demo_answers {
        Some(cache) => {
            let raw = demo_answers::demo_answers(ctx.audio.pcm(), cache, DEMO_FLOOR_STREAMS)?;
            if raw.iter().any(|a| a.is_empty()) {
                bail!("the demo model gave no answer audio");
            }
            // One floor per answering session, weighted by its audio.
            let part = floor_audio / DEMO_FLOOR_STREAMS as u32;
            let floors = raw
                .iter()
                .map(|answer| audio::bare_opus_floor(&ctx.audio, answer, part))
                .collect::<Result<Vec<_>>>()?;
            (
                audio::OpusFloor::mean(&floors),
                format!(
                    "decode of the sent audio + encode of the demo model's own answers to it \
                     ({DEMO_FLOOR_STREAMS} sessions of {:.1} s, each with its own sampling seed, \
                     stepped on the CPU from {} with the daemon's default sampling)",
                    raw[0].len() as f64 * moshid::FRAME_MS / 1000.0,
                    cache.display()
                ),
                Some((floor, floor_basis)),
            )
        }
        None => (floor, floor_basis, None),
    };
    for step in &mut steps {
        set_ratios(step, &floor);
        if let Some((decoded, _)) = &floor_decoded {
            let f = decoded.total_ms_per_stream_s;
            step.ratio_to_bare_opus_excl_engine_decoded_answers = step
                .cpu_ms_per_stream_s_excl_engine
                .filter(|_| f > 0.0)
                .map(|v| v / f);
        }
    }

    let (date, stamp) = utc(started);
    let out_dir = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("reports")
            .join(date)
    });
    let report = Report {
        tool: format!("moshid-loadgen {}", env!("CARGO_PKG_VERSION")),
        started_utc: stamp,
        machine,
        config: RunConfig {
            url,
            daemon_pid: pid,
            spawned: args.target.spawn.clone(),
            serve_args: args.target.serve_args_list(),
            plan,
            step_seconds: frames as f64 * moshid::FRAME_MS / 1000.0,
            budget_ms: args.budget_ms,
            stop_on: criteria.names(),
            jitter_ms: args.jitter_ms,
            loss: args.loss,
            seed: args.seed,
            audio: audio_name,
            model_delay_frames: args.model_delay_frames,
            nice: args.nice,
            latency_definition: "arrival of the answer released by frame i's step (answer j <-> \
                the (j + model_delay)-th frame sent, counted in 1920-sample units of decoded audio) \
                minus the moment frame i's last sample was captured; callers start at seeded \
                uniform phase offsets in [0, 80) ms"
                .into(),
        },
        opus_floor: floor,
        opus_floor_basis: floor_basis,
        opus_floor_sent_audio: floor_sent,
        opus_floor_decoded_answers: floor_decoded.as_ref().map(|(f, _)| *f),
        opus_floor_decoded_answers_basis: floor_decoded.map(|(_, b)| b),
        daemon_idle_cpu_ms_per_s: idle_ms_per_s,
        steps,
        loadavg_1m_at_end: sys::loadavg_1m(),
        largest_streams_held: held.filter(|h| broke.is_none_or(|b| *h < b)),
        first_streams_broken: broke,
    };
    let written = report::write(&out_dir, &report, &polls)?;
    print_summary(&report);
    for path in written {
        println!("wrote {path}");
    }
    Ok(())
}

/// The ratios of a step's CPU per stream to the bare-Opus floor.
fn set_ratios(step: &mut StepReport, floor: &OpusFloor) {
    let f = floor.total_ms_per_stream_s;
    let ratio = |v: Option<f64>| v.filter(|_| f > 0.0).map(|v| v / f);
    step.ratio_to_bare_opus = ratio(step.cpu_ms_per_stream_s);
    step.ratio_to_bare_opus_net_idle = ratio(step.cpu_ms_per_stream_s_net_idle);
    step.ratio_to_bare_opus_excl_engine = ratio(step.cpu_ms_per_stream_s_excl_engine);
}

/// Runs `n` callers at once for one step and measures it; with
/// `keep_answer`, also returns the answer audio the first caller decoded.
fn run_step(
    ctx: &Ctx,
    n: usize,
    protocol: Protocol,
    rng: &mut Rng,
    keep_answer: bool,
) -> Result<(StepReport, Option<Vec<f32>>)> {
    if !daemon::wait_idle(ctx.addr, Duration::from_secs(10)) {
        eprintln!("warning: the daemon still holds sessions from before");
    }
    let shared = Arc::new(StepShared {
        url: match protocol {
            Protocol::Chat => ctx.url.clone(),
            other => other.url(ctx.addr),
        },
        protocol,
        frames: ctx.frames,
        model_delay: ctx.model_delay,
        jitter_ms: ctx.jitter_ms,
        loss: ctx.loss,
        connect_timeout: ctx.connect_timeout,
        drain: ctx.drain,
        audio: ctx.audio.clone(),
        connected: Barrier::new(n + 1),
        go: Barrier::new(n + 1),
        t0: OnceLock::new(),
    });
    let mut callers = Vec::with_capacity(n);
    for i in 0..n {
        let shared = shared.clone();
        let offset = Duration::from_secs_f64(rng.range(0.0, moshid::FRAME_MS / 1000.0));
        let seed = rng.next_u64();
        let handle = std::thread::Builder::new()
            .name(format!("caller-{i}"))
            .stack_size(512 * 1024)
            .spawn(move || stream::run_caller(&shared, offset, seed, keep_answer && i == 0));
        match handle {
            Ok(h) => callers.push(h),
            // The barriers wait for all n: a caller that cannot start would
            // hang the step, so give up on the whole run.
            Err(e) => {
                eprintln!("moshid-loadgen: cannot start caller thread {i}: {e}");
                std::process::exit(2);
            }
        }
    }
    shared.connected.wait();
    let before = EngineCounters::read(ctx.addr).unwrap_or_default();
    let self_pid = std::process::id();
    let cpu0 = ctx.pid.and_then(sys::process_cpu_ms);
    let threads0 = ctx.pid.map(sys::threads_cpu_ms).unwrap_or_default();
    let self0 = sys::process_cpu_ms(self_pid);
    let machine0 = sys::machine_cpu_ms();
    let t0 = Instant::now() + Duration::from_millis(20);
    let _ = shared.t0.set(t0);
    ctx.gauge.store(n, Ordering::Relaxed);
    shared.go.wait();
    // The groups halfway through, while every session streams.
    let halfway = t0 + Duration::from_secs_f64(ctx.frames as f64 * moshid::FRAME_MS / 2000.0);
    std::thread::sleep(halfway.saturating_duration_since(Instant::now()));
    let groups = daemon::get_json(ctx.addr, "/capacity")
        .ok()
        .and_then(|v| report::GroupsSnapshot::from_capacity(&v));
    let mut outcomes: Vec<Outcome> = callers
        .into_iter()
        .map(|h| h.join().expect("caller thread panicked"))
        .collect();
    let cpu1 = ctx.pid.and_then(sys::process_cpu_ms);
    let threads1 = ctx.pid.map(sys::threads_cpu_ms).unwrap_or_default();
    let self1 = sys::process_cpu_ms(self_pid);
    let machine1 = sys::machine_cpu_ms();
    let window_s = t0.elapsed().as_secs_f64();
    ctx.gauge.store(0, Ordering::Relaxed);
    let after = EngineCounters::read(ctx.addr).unwrap_or_default();
    let cpu = CpuSamples {
        daemon: (cpu0, cpu1),
        loadgen: (self0, self1),
        machine_busy: (machine0.map(|m| m.0), machine1.map(|m| m.0)),
    };
    let mut step = summarize_step(ctx, n, &outcomes, before, after, window_s, cpu);
    step.protocol = protocol;
    step.groups = groups;
    step.daemon_thread_cores = threads1
        .iter()
        .map(|(name, ms)| {
            let used = ms - threads0.get(name).copied().unwrap_or(0.0);
            (
                name.clone(),
                (used / 1000.0 / window_s * 1000.0).round() / 1000.0,
            )
        })
        .filter(|(_, cores)| *cores > 0.0)
        .collect();
    // The engine thread steps the model; the rest (I/O cores: WebSocket,
    // Opus, lanes) is what the daemon costs around the model.
    let engine_ms: f64 = threads1
        .iter()
        .filter(|(name, _)| name.contains("engine"))
        .map(|(name, ms)| ms - threads0.get(name).copied().unwrap_or(0.0))
        .sum();
    if step.stream_seconds > 0.0 && step.cpu_ms_per_stream_s.is_some() {
        let engine = engine_ms / step.stream_seconds;
        step.engine_thread_ms_per_stream_s = Some(engine);
        step.cpu_ms_per_stream_s_excl_engine = step.cpu_ms_per_stream_s.map(|c| c - engine);
    }
    eprintln!("{}", step_line(&step));
    if let Some(g) = &step.groups {
        eprintln!("       {}", g.line());
    }
    let p99s: Vec<String> = step
        .per_stream_latency_ms
        .iter()
        .map(|l| fmt_opt(l.as_ref().map(|l| l.p99), 0))
        .collect();
    eprintln!("       per-stream p99 ms: {}", p99s.join(" "));
    let answer = outcomes.first_mut().and_then(|o| o.answer_pcm.take());
    Ok((step, answer))
}

/// CPU readings (ms) at the start and end of a step's window.
struct CpuSamples {
    daemon: (Option<f64>, Option<f64>),
    loadgen: (Option<f64>, Option<f64>),
    machine_busy: (Option<f64>, Option<f64>),
}

fn delta(pair: (Option<f64>, Option<f64>)) -> Option<f64> {
    Some(pair.1? - pair.0?)
}

fn summarize_step(
    ctx: &Ctx,
    n: usize,
    outcomes: &[Outcome],
    before: EngineCounters,
    after: EngineCounters,
    window_s: f64,
    cpu: CpuSamples,
) -> StepReport {
    let refused = outcomes.iter().filter(|o| o.refused.is_some()).count();
    let errors = outcomes.iter().filter(|o| o.error.is_some()).count();
    let accepted: Vec<&Outcome> = outcomes.iter().filter(|o| o.accepted).collect();
    let mut messages: Vec<String> = outcomes
        .iter()
        .filter_map(|o| o.refused.as_ref().or(o.error.as_ref()).cloned())
        .collect();
    messages.dedup();
    messages.truncate(3);
    let mut latencies: Vec<f64> = Vec::new();
    let mut spread: Vec<f64> = Vec::new();
    for o in &accepted {
        let l = o.matcher.latencies();
        latencies.extend_from_slice(l);
        if let Some(min) = l.iter().copied().reduce(f64::min) {
            spread.extend(l.iter().map(|x| x - min));
        }
    }
    let late = latencies.iter().filter(|&&l| l > ctx.budget_ms).count();
    let unanswered: usize = accepted.iter().map(|o| o.matcher.unanswered()).sum();
    let latency = stats::summarize(&mut latencies);
    spread.sort_by(f64::total_cmp);
    let mut lags: Vec<f64> = accepted
        .iter()
        .flat_map(|o| o.send_lag_ms.iter().copied())
        .collect();
    let stream_seconds: f64 = accepted
        .iter()
        .map(|o| o.frames_captured as f64 * moshid::FRAME_MS / 1000.0)
        .sum();
    let daemon_cpu_ms = delta(cpu.daemon);
    let cores = |ms: Option<f64>| ms.map(|ms| ms / 1000.0 / window_s);
    let loadgen_cores = cores(delta(cpu.loadgen));
    let machine_busy_cores = cores(delta(cpu.machine_busy));
    let per_stream = daemon_cpu_ms
        .filter(|_| stream_seconds > 0.0)
        .map(|c| c / stream_seconds);
    let net = per_stream.and_then(|p| {
        ctx.idle_ms_per_s
            .map(|idle| p - idle * window_s / stream_seconds)
    });
    let engine_steps = after.steps.saturating_sub(before.steps);
    let engine_frames = after.frames_stepped.saturating_sub(before.frames_stepped);
    let misses = late + unanswered;
    let broke = ctx.criteria.broken(
        latency.as_ref().map(|l| l.p99),
        ctx.budget_ms,
        misses,
        refused,
        errors,
    );
    StepReport {
        protocol: Protocol::Chat,
        streams: n,
        sessions: accepted.len(),
        refused,
        errors,
        messages,
        frames_per_stream: ctx.frames,
        frames_sent: accepted.iter().map(|o| o.matcher.frames_sent()).sum(),
        frames_lost: accepted.iter().map(|o| o.frames_lost).sum(),
        answers: accepted.iter().map(|o| o.matcher.answers()).sum(),
        latency_ms: latency,
        within_stream_spread_p99_ms: stats::percentile(&spread, 99.0),
        deadline_misses: misses,
        late_answers: late,
        unanswered,
        unmatched_answers: accepted.iter().map(|o| o.matcher.unmatched()).sum(),
        send_lag_ms: stats::summarize(&mut lags),
        stream_seconds,
        window_s,
        daemon_cpu_ms,
        cpu_ms_per_stream_s: per_stream,
        cpu_ms_per_stream_s_net_idle: net,
        ratio_to_bare_opus: None,
        ratio_to_bare_opus_net_idle: None,
        daemon_cores: cores(daemon_cpu_ms),
        loadgen_cores,
        machine_busy_cores,
        other_cores: machine_busy_cores
            .map(|busy| busy - cores(daemon_cpu_ms).unwrap_or(0.0) - loadgen_cores.unwrap_or(0.0)),
        loadavg_1m: sys::loadavg_1m(),
        daemon_thread_cores: Default::default(),
        engine_thread_ms_per_stream_s: None,
        cpu_ms_per_stream_s_excl_engine: None,
        ratio_to_bare_opus_excl_engine: None,
        ratio_to_bare_opus_excl_engine_decoded_answers: None,
        engine_before: before,
        engine_after: after,
        engine_steps,
        engine_frames,
        mean_batch: (engine_steps > 0).then(|| engine_frames as f64 / engine_steps as f64),
        late_ticks: after.late_ticks.saturating_sub(before.late_ticks),
        dropped_frames: after.dropped_frames.saturating_sub(before.dropped_frames),
        held: broke.is_empty(),
        broke,
        per_stream_latency_ms: accepted
            .iter()
            .map(|o| stats::summarize(&mut o.matcher.latencies().to_vec()))
            .collect(),
        groups: None,
    }
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
}

fn step_line(s: &StepReport) -> String {
    let l = s.latency_ms.as_ref();
    format!(
        "{:?} N={:>3}: sessions {} refused {} errors {} | latency p50 {} p90 {} p99 {} max {} ms | \
         misses {} (late {}, unanswered {}) | cpu {} ms/stream-s ({}x opus; without engine thread {} = {}x) | batch mean {} max {}, predicted step {:.1} ms | \
         send lag p99 {} ms | others {} cores | {}",
        s.protocol,
        s.streams,
        s.sessions,
        s.refused,
        s.errors,
        fmt_opt(l.map(|l| l.p50), 1),
        fmt_opt(l.map(|l| l.p90), 1),
        fmt_opt(l.map(|l| l.p99), 1),
        fmt_opt(l.map(|l| l.max), 1),
        s.deadline_misses,
        s.late_answers,
        s.unanswered,
        fmt_opt(s.cpu_ms_per_stream_s, 2),
        fmt_opt(s.ratio_to_bare_opus, 2),
        fmt_opt(s.cpu_ms_per_stream_s_excl_engine, 2),
        fmt_opt(s.ratio_to_bare_opus_excl_engine, 2),
        fmt_opt(s.mean_batch, 1),
        s.engine_after.max_batch,
        // Halfway through, while every caller streams (the snapshot at the
        // start may come before any group is occupied: 0).
        s.groups.as_ref().map_or(s.engine_before.predicted_step_ms, |g| {
            g.largest_predicted_step_ms()
        }),
        fmt_opt(s.send_lag_ms.as_ref().map(|l| l.p99), 1),
        fmt_opt(s.other_cores, 2),
        if s.held {
            "held".to_string()
        } else {
            format!("BROKE: {}", s.broke.join("; "))
        },
    )
}

fn print_summary(r: &Report) {
    println!(
        "machine: {} x {} ({} CPUs available), kernel {}",
        r.machine.cpuinfo_processors, r.machine.cpu_model, r.machine.nproc, r.machine.kernel
    );
    let (f, sent) = (&r.opus_floor, &r.opus_floor_sent_audio);
    println!(
        "bare Opus on one thread: decode {:.3} + encode {:.3} = {:.3} ms per stream-second \
         ({}); sent audio both ways: {:.3}; daemon idle: {} ms/s",
        f.decode_ms_per_stream_s,
        f.encode_ms_per_stream_s,
        f.total_ms_per_stream_s,
        r.opus_floor_basis,
        sent.total_ms_per_stream_s,
        fmt_opt(r.daemon_idle_cpu_ms_per_s, 1)
    );
    if let Some(d) = &r.opus_floor_decoded_answers {
        println!(
            "bare Opus with the answers as a caller decoded them: decode {:.3} + encode {:.3} = \
             {:.3} ms per stream-second; without the engine thread, per step: {}",
            d.decode_ms_per_stream_s,
            d.encode_ms_per_stream_s,
            d.total_ms_per_stream_s,
            r.steps
                .iter()
                .map(|s| format!(
                    "N={} {}x",
                    s.streams,
                    fmt_opt(s.ratio_to_bare_opus_excl_engine_decoded_answers, 2)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for s in &r.steps {
        println!("{}", step_line(s));
    }
    if let Some(s) = r
        .largest_streams_held
        .and_then(|h| r.steps.iter().find(|s| s.streams == h))
    {
        println!(
            "at N={}: daemon {} ms per stream-second = {}x bare Opus; without its engine \
             thread {} = {}x",
            s.streams,
            fmt_opt(s.cpu_ms_per_stream_s, 2),
            fmt_opt(s.ratio_to_bare_opus, 2),
            fmt_opt(s.cpu_ms_per_stream_s_excl_engine, 2),
            fmt_opt(s.ratio_to_bare_opus_excl_engine, 2),
        );
    }
    match (r.largest_streams_held, r.first_streams_broken) {
        (Some(h), Some(b)) => println!("largest N that held: {h} (broke at {b})"),
        (Some(h), None) => println!("largest N that held: {h} (nothing broke)"),
        (None, Some(b)) => println!("no N held (broke at {b})"),
        (None, None) => {}
    }
}

/// (YYYY-MM-DD, YYYY-MM-DDTHH:MM:SSZ) of `t` in UTC.
fn utc(t: SystemTime) -> (String, String) {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let date = format!("{y:04}-{m:02}-{d:02}");
    let stamp = format!(
        "{date}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    (date, stamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        let at = |s| UNIX_EPOCH + Duration::from_secs(s);
        assert_eq!(utc(at(0)).1, "1970-01-01T00:00:00Z");
        assert_eq!(utc(at(951_782_400)).0, "2000-02-29");
        assert_eq!(utc(at(1_767_225_599)).1, "2025-12-31T23:59:59Z");
    }
}
