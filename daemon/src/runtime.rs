//! Start-up and shutdown: load the model, place the engine thread and the
//! I/O executors on their CPUs, bind the listeners, serve until SIGTERM or
//! SIGINT, then drain.
//!
//! Invariants: the engine thread is pinned with core_affinity and the I/O
//! cores are glommio executors with `Placement::Fixed`, on CPUs validated
//! against the process's allowed set. The daemon reports ready only after the
//! engine has measured its step times and every core has bound its listener
//! and warmed its timers. Shutdown stops admission first, lets sessions end
//! up to the grace period, then closes the rest with a reason, and joins
//! every thread before returning.

use crate::api::router::accept_loop;
use crate::api::ApiShared;
use crate::app::{CoreApp, Shared};
use crate::config::Config;
use crate::engine::thread::Engine;
use crate::engine::{core_links, CorePort, EngineShared};
use crate::io::core::{dispatch_loop, CoreContext};
use crate::session::params::ModelInfo;
use crate::transport::sip::status::SipShared;
use anyhow::{anyhow, bail, Context, Result};
use glommio::{LocalExecutorBuilder, Placement};
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::spm::PieceTable;
use moshid_model::streaming::StreamingModel;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Lifecycle of the whole daemon, read by every core's housekeeping task.
const RUNNING: u8 = 0;
const DRAINING: u8 = 1;
const CLOSING: u8 = 2;

/// How often each core looks at the lifecycle and retries pending closes.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_millis(50);

/// Where the CPUs go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuPlan {
    /// CPU of each I/O core.
    pub io_cpus: Vec<usize>,
    /// CPU of the engine thread.
    pub engine_cpu: usize,
}

/// Chooses CPUs from the allowed set (or checks the configured ones).
pub fn place(config: &Config, allowed: &[usize]) -> Result<CpuPlan> {
    if allowed.is_empty() {
        bail!("no CPU is available to this process");
    }
    let r = &config.runtime;
    let io_cpus = match &r.io_cpus {
        Some(cpus) => {
            for c in cpus {
                if !allowed.contains(c) {
                    bail!("config key `runtime.io_cpus`: CPU {c} is not available to this process (allowed: {allowed:?})");
                }
            }
            cpus.clone()
        }
        None => {
            if r.io_cores > allowed.len() {
                bail!(
                    "config key `runtime.io_cores`: {} I/O cores but only {} CPUs are available ({allowed:?})",
                    r.io_cores,
                    allowed.len()
                );
            }
            allowed[..r.io_cores].to_vec()
        }
    };
    let engine_cpu = match r.engine_cpu {
        Some(c) if !allowed.contains(&c) => {
            bail!("config key `runtime.engine_cpu`: CPU {c} is not available to this process (allowed: {allowed:?})")
        }
        Some(c) => c,
        // The first allowed CPU no I/O core uses; on a machine with fewer
        // CPUs than threads, the last one (shared).
        None => allowed
            .iter()
            .copied()
            .find(|c| !io_cpus.contains(c))
            .unwrap_or(*allowed.last().expect("checked non-empty")),
    };
    Ok(CpuPlan {
        io_cpus,
        engine_cpu,
    })
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    core_affinity::get_core_ids()
        .map(|ids| ids.into_iter().map(|c| c.id).collect())
        .unwrap_or_else(|| {
            (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
        })
}

/// The loaded model and what the sessions need to know of it.
pub struct LoadedModel {
    /// The backend.
    pub model: Box<dyn StreamingModel>,
    /// Token text.
    pub pieces: PieceTable,
    /// Conditioning.
    pub info: ModelInfo,
    /// Where it came from (for the log).
    pub description: String,
    /// What `GET /v1/model` says of it.
    pub about: crate::api::model::ModelDescription,
}

/// The default cache folder for the demo checkpoint.
pub fn default_cache_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("moshid");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join(".cache").join("moshid");
    }
    std::env::temp_dir().join("moshid-cache")
}

/// Loads the configured checkpoint (or random weights of a shape, or the
/// demo) on the configured backend.
pub fn load_model(config: &Config) -> Result<LoadedModel> {
    let cache = config
        .model
        .cache_dir
        .clone()
        .unwrap_or_else(default_cache_dir);
    let random = match config.model.random_weights.as_deref() {
        Some(n) => Some(
            crate::random_weights::resolve(n)
                .map_err(|e| anyhow!("config key `model.random_weights`: {e}"))?,
        ),
        None => None,
    };
    let (dir, demo) = match (random, &config.model.dir) {
        (Some(shape), _) => {
            eprintln!("<4>model: {}", shape.marker());
            (crate::random_weights::prepare(shape, &cache)?, false)
        }
        (None, Some(d)) => (
            CheckpointDir::open(d)
                .with_context(|| format!("loading the checkpoint in {}", d.display()))?,
            false,
        ),
        (None, None) => {
            let d = moshid_model::demo::ensure_demo(&cache).with_context(|| {
                format!("writing the demo checkpoint under {}", cache.display())
            })?;
            (d, true)
        }
    };
    dir.check()
        .with_context(|| format!("checking the checkpoint in {}", dir.dir.display()))?;
    let built = crate::backend::build(config, &dir, &cache)?;
    eprintln!("<6>backend: {}", built.description);
    let mut about = crate::api::model::ModelDescription::new(
        &dir,
        demo,
        &built.description,
        built.model.max_slots(),
    );
    if let Some(shape) = random {
        about.name = format!("random weights: {}", shape.name);
        about.random_weights = Some(shape.name.to_string());
    }
    let model = built.model;
    let pieces = match &dir.tokenizer {
        Some(p) => PieceTable::from_file(p).map_err(|e| anyhow!("{}: {e}", p.display()))?,
        // A folder without a tokenizer: no token is printed as text.
        None => PieceTable::from_pieces([(
            "<unk>".to_string(),
            0.0,
            moshid_model::spm::PieceKind::Unknown,
        )])
        .map_err(|e| anyhow!("placeholder piece table: {e}"))?,
    };
    let info = ModelInfo {
        conditioners: dir
            .lm
            .conditioners
            .iter()
            .map(|c| (c.name.clone(), c.possible_values.clone()))
            .collect(),
        is_hibiki: dir.lm.model_type == moshid_model::config::ModelType::Hibiki,
        drain_text_eos: match moshid_model::lm::end_of_stream_of(&dir.lm) {
            moshid_model::lm::EndOfStream::DrainUntilText { text_eos_id, .. } => Some(text_eos_id),
            moshid_model::lm::EndOfStream::WithInput => None,
        },
        prompts: if model.takes_prompts() {
            let tok = dir
                .tokenizer
                .as_ref()
                .ok_or_else(|| anyhow!("a model with prompts needs its tokenizer"))?;
            let encoder = moshid_model::spm_encode::Encoder::from_file(tok)
                .map_err(|e| anyhow!("{}: {e}", tok.display()))?;
            Some(std::sync::Arc::new(crate::session::prompt::PromptSetup {
                voice_dir: config.model.voice_dir.clone(),
                encoder,
                lm: dir.lm.clone(),
                frame_samples: model.frame_samples(),
            }))
        } else {
            None
        },
    };
    let description = if let Some(shape) = random {
        format!(
            "the {:?} shape {} (dim {}, {} layers, context {}): {}",
            dir.lm.model_type,
            shape.name,
            dir.lm.dim,
            dir.lm.num_layers,
            dir.lm.context,
            shape.marker()
        )
    } else if demo {
        format!(
            "the embedded demo checkpoint ({}; random weights, no speech)",
            dir.dir.display()
        )
    } else {
        format!("{} ({:?})", dir.dir.display(), dir.lm.model_type)
    };
    Ok(LoadedModel {
        model,
        pieces,
        info,
        description,
        about,
    })
}

/// Called once with the engine's shared state (see [`Hooks::on_engine`]).
pub type EngineHook = Box<dyn FnOnce(&Arc<EngineShared>) + Send>;

/// Hooks into the daemon's life (systemd notification, tests).
#[derive(Default)]
pub struct Hooks {
    /// Called once when the daemon is ready, with the listening address.
    pub on_ready: Option<Box<dyn FnOnce(SocketAddr) + Send>>,
    /// Called at every engine tick.
    pub on_tick: Option<crate::engine::thread::TickHook>,
    /// Called when a drain starts.
    pub on_stopping: Option<Box<dyn FnOnce() + Send>>,
    /// Called once with the engine's shared state, before the engine starts
    /// (systemd status lines, the HAProxy agent-check responder).
    pub on_engine: Option<EngineHook>,
}

/// Waits for `stop` (a signal, or its sender gone); every `heap_trim_ms`
/// (0: never) meanwhile, trims the heap ([`crate::heap`]).
fn serve_until_stopped(stop: &mpsc::Receiver<()>, heap_trim_ms: u64) {
    if heap_trim_ms == 0 {
        let _ = stop.recv();
        return;
    }
    let period = Duration::from_millis(heap_trim_ms);
    while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(period) {
        crate::heap::trim();
    }
}

/// Serves until `stop` reports a signal, then drains and returns.
pub fn run(
    config: Config,
    loaded: LoadedModel,
    mut hooks: Hooks,
    stop: mpsc::Receiver<()>,
) -> Result<()> {
    let allowed = allowed_cpus();
    let placement = place(&config, &allowed)?;
    crate::io::fd_limit::raise_and_log(&config);
    // TLS first: a bad certificate fails the start before any thread runs.
    let tls = crate::tls::ServerTls::from_config(&config.listen)?;
    if let Some(t) = &tls {
        eprintln!("<6>tls: serving https:// and wss:// ({})", t.summary());
    }
    // SIGHUP reloads the certificate (and never terminates the daemon).
    let _sighup =
        crate::tls::SighupReloader::start(tls.clone()).context("installing the SIGHUP handler")?;
    let max_slots = loaded.model.max_slots();
    // Random weights say so on the ready line too.
    let random_marker = loaded
        .about
        .random_weights
        .as_deref()
        .and_then(|n| crate::random_weights::resolve(n).ok())
        .map_or_else(String::new, |s| format!("; {}", s.marker()));
    let mut engine_shared = EngineShared::new(
        max_slots,
        config.engine.phase_groups,
        config.engine.budget_margin_ms,
        config.runtime.io_cores,
    );
    if config.model.backend == crate::config::Backend::Emu {
        // The emulator's step times say nothing of a GPU's, nor of real
        // time: priced, they would refuse every stream.
        engine_shared.budget_ms = f64::INFINITY;
        eprintln!(
            "<4>engine: the emu backend's step times are not a GPU's: admission admits up to the slots, however slow the steps"
        );
    }
    let engine_shared = Arc::new(engine_shared);
    // Stage metrics: the configured switch, and the Prometheus recorder
    // installed once as the process's `metrics` recorder.
    engine_shared.metrics.set_enabled(config.metrics.enabled);
    engine_shared.metrics.exporter().install_global();
    if let Some(f) = hooks.on_engine.take() {
        f(&engine_shared);
    }
    let (links, ports) = core_links(config.runtime.io_cores, config.lane_capacity_frames());
    eprintln!("<6>model: {}", loaded.description);
    eprintln!(
        "<6>metrics: stage timings {} (GET /metrics; POST /admin/metrics {})",
        if config.metrics.enabled { "on" } else { "off" },
        if config.metrics.runtime_switch {
            "switches them"
        } else {
            "disabled by config"
        }
    );
    eprintln!(
        "<6>cpus: io cores on {:?}, engine on {} (allowed {:?})",
        placement.io_cpus, placement.engine_cpu, allowed
    );

    // Engine thread: pinned, warms up, then ticks.
    let mut engine = Engine::new(
        loaded.model,
        links,
        engine_shared.clone(),
        config.engine.queued_frames_per_slot,
        config.engine.warmup_steps,
    );
    engine.set_prompt_bounds(
        config.engine.prompt_cache_entries,
        config.engine.prompt_frames_per_tick,
    );
    if let Some(hook) = hooks.on_tick.take() {
        engine.set_tick_hook(hook);
    }
    let engine_cpu = placement.engine_cpu;
    let engine_thread = std::thread::Builder::new()
        .name("moshid-engine".into())
        .spawn(move || {
            if !core_affinity::set_for_current(core_affinity::CoreId { id: engine_cpu }) {
                eprintln!("<4>engine: could not pin to CPU {engine_cpu}");
            }
            engine.warm_up();
            engine.run();
        })
        .context("starting the engine thread")?;

    let shared = Arc::new(Shared::new(config.clone(), loaded.pieces, loaded.info));
    let api = Arc::new(ApiShared {
        rtp: Arc::default(),
        sip: Arc::new(SipShared::new(&config.sip)),
        model: loaded.about,
        tls,
    });
    let lifecycle = Arc::new(AtomicU8::new(RUNNING));
    if config.audiosocket.enabled {
        crate::transport::audiosocket::check_params(&shared).map_err(|e| anyhow!("{e}"))?;
    }
    if config.sip.enabled {
        crate::transport::sip::check_params(&shared).map_err(|e| anyhow!("{e}"))?;
    }
    let (bound_tx, bound_rx) = mpsc::channel::<Bound>();
    let mut executors = Vec::new();
    let mut addr = config.listen.address;
    let mut audiosocket_addr = config
        .audiosocket
        .enabled
        .then_some(config.audiosocket.address);
    let mut sip_addr = config.sip.enabled.then_some(config.sip.address);
    for (core, port) in ports.into_iter().enumerate() {
        let cpu = placement.io_cpus[core];
        let ex = spawn_core(
            core,
            cpu,
            addr,
            audiosocket_addr,
            sip_addr,
            port,
            engine_shared.clone(),
            shared.clone(),
            api.clone(),
            lifecycle.clone(),
            bound_tx.clone(),
        )?;
        executors.push(ex);
        // Core 0 binds first so that port 0 resolves once for every core.
        match bound_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok((a, s, sip))) => {
                addr = a;
                audiosocket_addr = s;
                sip_addr = sip;
            }
            Ok(Err(e)) => bail!("{e}"),
            Err(_) => bail!("I/O core {core} did not start"),
        }
    }

    // Ready once the engine has measured its step times.
    let warm_deadline = Instant::now() + Duration::from_secs(600);
    while !engine_shared.ready.load(Ordering::Acquire) {
        if engine_thread.is_finished() {
            bail!("the engine thread stopped during warm-up");
        }
        if Instant::now() > warm_deadline {
            bail!("engine warm-up took over 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let cap = engine_shared.capacity();
    eprintln!(
        "<6>ready: {} slots, {} phase group(s), budget {:.1} ms, predicted step {:.2} ms at batch 1, {:.2} ms at batch {}{random_marker}",
        max_slots,
        config.engine.phase_groups,
        engine_shared.budget_ms,
        engine_shared.step_times.predict_ms(1),
        engine_shared.step_times.predict_ms(max_slots),
        max_slots
    );
    eprintln!(
        "<6>capacity: {} sessions admissible now",
        cap.admissible_sessions
    );
    if let Some(a) = audiosocket_addr {
        eprintln!(
            "<6>audiosocket: listening on {a} ({} I/O core(s))",
            config.runtime.io_cores
        );
        println!("audiosocket listening on {a}");
    }
    if let Some(a) = sip_addr {
        let tcp = config.sip.max_tcp_connections > 0;
        eprintln!(
            "<6>sip: listening on {a} ({}, {} I/O core(s))",
            if tcp { "UDP and TCP" } else { "UDP" },
            config.runtime.io_cores
        );
        if tcp {
            println!("sip listening on udp {a} tcp {a}");
        } else {
            println!("sip listening on udp {a}");
        }
    }
    if let Some(f) = hooks.on_ready.take() {
        f(addr);
    }

    // Serve until asked to stop, giving the heap's free pages back now and then.
    serve_until_stopped(&stop, config.runtime.heap_trim_ms);
    if let Some(f) = hooks.on_stopping.take() {
        f();
    }
    eprintln!(
        "<6>stopping: no new sessions; draining {} active",
        engine_shared.admission().active()
    );
    engine_shared.admission().set_accepting(false);
    lifecycle.store(DRAINING, Ordering::Release);
    let grace = Duration::from_millis(config.session.drain_grace_ms);
    let drain_deadline = Instant::now() + grace;
    while engine_shared.admission().active() > 0 && Instant::now() < drain_deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = engine_shared.admission().active();
    if left > 0 {
        eprintln!("<6>stopping: grace period over, closing {left} session(s)");
    }
    lifecycle.store(CLOSING, Ordering::Release);
    for ex in executors {
        let _ = ex.join();
    }
    engine_shared.stop.store(true, Ordering::Release);
    let _ = engine_thread.join();
    // The last sessions' final records: one attempt's time to reach their webhooks.
    let left = shared
        .events
        .webhooks
        .drain(Duration::from_millis(config.events.webhook_timeout_ms));
    if left > 0 {
        eprintln!("<4>stopping: {left} webhook record(s) not delivered");
    }
    eprintln!("<6>stopped");
    Ok(())
}

/// What a core reports once bound: the listener's address, the
/// AudioSocket listener's and the SIP socket's, if any.
type Bound = Result<(SocketAddr, Option<SocketAddr>, Option<SocketAddr>), String>;

#[allow(clippy::too_many_arguments)]
fn spawn_core(
    core: usize,
    cpu: usize,
    addr: SocketAddr,
    audiosocket_addr: Option<SocketAddr>,
    sip_addr: Option<SocketAddr>,
    port: CorePort,
    engine: Arc<EngineShared>,
    shared: Arc<Shared>,
    api: Arc<ApiShared>,
    lifecycle: Arc<AtomicU8>,
    bound: mpsc::Sender<Bound>,
) -> Result<glommio::ExecutorJoinHandle<()>> {
    LocalExecutorBuilder::new(Placement::Fixed(cpu))
        .name(&format!("moshid-io-{core}"))
        .spawn(move || async move {
            // The first timer of an executor is slow (membarrier registration):
            // take that cost now, not in a session.
            glommio::timer::sleep(Duration::from_millis(1)).await;
            let backlog = shared.config.listen.backlog;
            let listener = match crate::io::accept::bind(addr, backlog) {
                Ok(l) => l,
                Err(e) => {
                    let _ = bound.send(Err(format!(
                        "I/O core {core}: cannot listen on {addr}: {e}"
                    )));
                    return;
                }
            };
            let local = listener.local_addr().unwrap_or(addr);
            // AudioSocket: one more SO_REUSEPORT listener per core.
            let audiosocket = match audiosocket_addr {
                None => None,
                Some(a) => match crate::io::accept::bind(a, backlog) {
                    Ok(l) => Some(l),
                    Err(e) => {
                        let _ = bound.send(Err(format!(
                            "config key `audiosocket.address`: I/O core {core} cannot listen on {a}: {e}"
                        )));
                        return;
                    }
                },
            };
            let audiosocket_local = audiosocket
                .as_ref()
                .map(|l| l.local_addr().unwrap_or(audiosocket_addr.expect("bound")));
            // SIP over UDP: one SO_REUSEPORT socket per core.
            // And the core's own socket for the calls and registrations
            // it starts (their answers must come back to this core).
            let sip = match sip_addr {
                None => None,
                Some(a) => match crate::transport::sip::udp::bind(a)
                    .and_then(|s| Ok((s, crate::transport::sip::udp::bind_out(a.ip())?)))
                {
                    Ok(s) => Some(s),
                    Err(e) => {
                        let _ = bound.send(Err(format!(
                            "config key `sip.address`: I/O core {core} cannot bind UDP {a}: {e}"
                        )));
                        return;
                    }
                },
            };
            let sip_local = sip
                .as_ref()
                .map(|(s, _)| s.local_addr().unwrap_or(sip_addr.expect("bound")));
            // SIP over TCP: a listener per core on the UDP socket's port
            // (port 0 resolved by the UDP bind).
            let sip_tcp = match sip_local {
                Some(a) if shared.config.sip.max_tcp_connections > 0 => {
                    match crate::io::accept::bind(a, backlog) {
                        Ok(l) => Some(l),
                        Err(e) => {
                            let _ = bound.send(Err(format!(
                                "config key `sip.address`: I/O core {core} cannot listen on TCP {a}: {e}"
                            )));
                            return;
                        }
                    }
                }
                _ => None,
            };
            let ctx = CoreContext::new(core, port, engine);
            let app = CoreApp::new(ctx.clone(), shared);
            let dispatcher = glommio::spawn_local(dispatch_loop(ctx.clone()));
            let mut audiosocket_acceptor = audiosocket.map(|l| {
                glommio::spawn_local(crate::transport::audiosocket::accept_loop(l, app.clone()))
            });
            // SIP keeps serving while draining: calls end with BYEs.
            let _sip_task = sip.map(|(s, out)| {
                glommio::spawn_local(crate::transport::sip::serve::serve(
                    s,
                    out,
                    sip_tcp,
                    app.clone(),
                    api.rtp.clone(),
                    api.sip.clone(),
                ))
            });
            let acceptor = glommio::spawn_local(accept_loop(listener, app, api));
            let _ = bound.send(Ok((local, audiosocket_local, sip_local)));
            let mut acceptor = Some(acceptor);
            loop {
                glommio::timer::sleep(HOUSEKEEPING_PERIOD).await;
                ctx.flush_pending_closes();
                let state = lifecycle.load(Ordering::Acquire);
                if state >= DRAINING {
                    if let Some(a) = acceptor.take() {
                        a.cancel().await;
                    }
                    if let Some(a) = audiosocket_acceptor.take() {
                        a.cancel().await;
                    }
                }
                if state >= CLOSING {
                    ctx.notify_shutdown_all();
                }
                // Subscribers on this core leave once their session's `end`
                // is written (bounded by session.send_timeout_ms).
                let watching = crate::events::relay::Relay::current().watching();
                if state >= DRAINING
                    && ctx.live_sessions.get() == 0
                    && ctx.pending_closes() == 0
                    && watching == 0
                {
                    break;
                }
            }
            // Closes are in the lane; the engine stops after every core is done.
            drop(dispatcher);
        })
        .map_err(|e| anyhow!("starting I/O core {core} on CPU {cpu}: {e}"))
}
