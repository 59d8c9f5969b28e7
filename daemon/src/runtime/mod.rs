//! Start-up and shutdown: load the model, place the engine thread and the
//! I/O executors on their CPUs, bind the listeners, serve until SIGTERM or
//! SIGINT, then drain.
//!
//! Files: [`cpus`] (where the threads run), [`model`] (loading the model),
//! [`cores`] (the I/O cores and their listeners); here, the order of it all.
//!
//! Invariants: the engine thread is pinned with core_affinity and the I/O
//! cores are glommio executors with `Placement::Fixed`, on CPUs validated
//! against the process's allowed set. The daemon reports ready only after the
//! engine has measured its step times and every core has bound its listener
//! and warmed its timers. Shutdown stops admission first, lets sessions end
//! up to the grace period, then closes the rest with a reason, and joins
//! every thread before returning.

pub mod cores;
pub mod cpus;
pub mod model;

pub use cpus::{allowed_cpus, place, CpuPlan};
pub use model::{default_cache_dir, load_model, LoadedModel};

use crate::api::ApiShared;
use crate::app::Shared;
use crate::config::Config;
use crate::engine::thread::Engine;
use crate::engine::{core_links, EngineShared};
use crate::tls::ServerTls;
use crate::transport::sip::status::SipShared;
use anyhow::{anyhow, bail, Context, Result};
use cores::{CoreShared, Listening};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Lifecycle of the whole daemon, read by every core's housekeeping task.
const RUNNING: u8 = 0;
const DRAINING: u8 = 1;
const CLOSING: u8 = 2;

/// How often each core looks at the lifecycle and retries pending closes.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_millis(50);

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
    let tls = ServerTls::from_config(&config.listen)?;
    if let Some(t) = &tls {
        eprintln!("<6>tls: serving https:// and wss:// ({})", t.summary());
    }
    // SIGHUP reloads the certificate (and never terminates the daemon).
    let _sighup =
        crate::tls::SighupReloader::start(tls.clone()).context("installing the SIGHUP handler")?;
    let max_slots = loaded.model.max_slots();
    let engine = engine_shared(&config, max_slots, &mut hooks);
    let (links, ports) = core_links(config.runtime.io_cores, config.lane_capacity_frames());
    log_start(&config, &loaded.description, &placement, &allowed);
    let engine_thread = {
        let mut e = Engine::new(
            loaded.model,
            links,
            engine.clone(),
            config.engine.queued_frames_per_slot,
            config.engine.warmup_steps,
        );
        e.set_prompt_bounds(
            config.engine.prompt_cache_entries,
            config.engine.prompt_frames_per_tick,
        );
        if let Some(hook) = hooks.on_tick.take() {
            e.set_tick_hook(hook);
        }
        start_engine(e, placement.engine_cpu)?
    };
    let shared = Arc::new(Shared::new(config.clone(), loaded.pieces, loaded.info));
    let api = Arc::new(ApiShared {
        rtp: Arc::default(),
        sip: Arc::new(SipShared::new(&config.sip)),
        model: loaded.about,
        tls,
    });
    check_transports(&config, &shared)?;
    let with = CoreShared {
        engine: engine.clone(),
        shared: shared.clone(),
        api,
        lifecycle: Arc::new(AtomicU8::new(RUNNING)),
    };
    let asked = Listening {
        http: config.listen.address,
        audiosocket: config
            .audiosocket
            .enabled
            .then_some(config.audiosocket.address),
        sip: config.sip.enabled.then_some(config.sip.address),
    };
    let (executors, listening) = cores::start_all(&placement.io_cpus, asked, ports, &with)?;
    wait_until_warm(&engine, &engine_thread)?;
    log_ready(&config, &engine, max_slots, listening, &with.api.model);
    if let Some(f) = hooks.on_ready.take() {
        f(listening.http);
    }

    // Serve until asked to stop, giving the heap's free pages back now and then.
    serve_until_stopped(&stop, config.runtime.heap_trim_ms);
    if let Some(f) = hooks.on_stopping.take() {
        f();
    }
    drain(&config, &engine, &with.lifecycle);
    for ex in executors {
        let _ = ex.join();
    }
    engine.stop.store(true, Ordering::Release);
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

/// The engine's shared state with the configured metrics switch, the
/// Prometheus recorder installed once as the process's `metrics` recorder,
/// and the `on_engine` hook called.
fn engine_shared(config: &Config, max_slots: usize, hooks: &mut Hooks) -> Arc<EngineShared> {
    let mut engine = EngineShared::new(
        max_slots,
        config.engine.phase_groups,
        config.engine.budget_margin_ms,
        config.runtime.io_cores,
    );
    if config.model.backend == crate::config::Backend::Emu {
        // The emulator's step times say nothing of a GPU's, nor of real
        // time: priced, they would refuse every stream.
        engine.budget_ms = f64::INFINITY;
        eprintln!(
            "<4>engine: the emu backend's step times are not a GPU's: admission admits up to the slots, however slow the steps"
        );
    }
    let engine = Arc::new(engine);
    engine.metrics.set_enabled(config.metrics.enabled);
    engine.metrics.exporter().install_global();
    if let Some(f) = hooks.on_engine.take() {
        f(&engine);
    }
    engine
}

/// The start's log lines: the model, the metrics switch, the CPUs.
fn log_start(config: &Config, model: &str, placement: &CpuPlan, allowed: &[usize]) {
    eprintln!("<6>model: {model}");
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
}

/// The engine thread: pinned to `cpu`, warms up, then ticks.
fn start_engine(mut engine: Engine, cpu: usize) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("moshid-engine".into())
        .spawn(move || {
            if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
                eprintln!("<4>engine: could not pin to CPU {cpu}");
            }
            engine.warm_up();
            engine.run();
        })
        .context("starting the engine thread")
}

/// Checks the enabled telephony transports' session parameters against
/// the model, so that a bad one stops the start instead of every call.
fn check_transports(config: &Config, shared: &Shared) -> Result<()> {
    if config.audiosocket.enabled {
        crate::transport::audiosocket::check_params(shared).map_err(|e| anyhow!("{e}"))?;
    }
    if config.sip.enabled {
        crate::transport::sip::check_params(shared).map_err(|e| anyhow!("{e}"))?;
    }
    Ok(())
}

/// Waits until the engine has measured its step times (it is ready then).
fn wait_until_warm(engine: &EngineShared, thread: &JoinHandle<()>) -> Result<()> {
    let warm_deadline = Instant::now() + Duration::from_secs(600);
    while !engine.ready.load(Ordering::Acquire) {
        if thread.is_finished() {
            bail!("the engine thread stopped during warm-up");
        }
        if Instant::now() > warm_deadline {
            bail!("engine warm-up took over 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// The ready log lines, and the "listening on" lines of the telephony
/// listeners on stdout.
fn log_ready(
    config: &Config,
    engine: &EngineShared,
    max_slots: usize,
    listening: Listening,
    model: &crate::api::model::ModelDescription,
) {
    let cap = engine.capacity();
    // Random weights say so on the ready line too.
    let random_marker = model
        .random_weights
        .as_deref()
        .and_then(|n| crate::random_weights::resolve(n).ok())
        .map_or_else(String::new, |s| format!("; {}", s.marker()));
    eprintln!(
        "<6>ready: {} slots, {} phase group(s), budget {:.1} ms, predicted step {:.2} ms at batch 1, {:.2} ms at batch {}{random_marker}",
        max_slots,
        config.engine.phase_groups,
        engine.budget_ms,
        engine.step_times.predict_ms(1),
        engine.step_times.predict_ms(max_slots),
        max_slots
    );
    eprintln!(
        "<6>capacity: {} sessions admissible now",
        cap.admissible_sessions
    );
    if let Some(a) = listening.audiosocket {
        eprintln!(
            "<6>audiosocket: listening on {a} ({} I/O core(s))",
            config.runtime.io_cores
        );
        println!("audiosocket listening on {a}");
    }
    if let Some(a) = listening.sip {
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
}

/// Stops admission, lets sessions end for up to `session.drain_grace_ms`,
/// then has the cores close the rest.
fn drain(config: &Config, engine: &EngineShared, lifecycle: &AtomicU8) {
    eprintln!(
        "<6>stopping: no new sessions; draining {} active",
        engine.admission().active()
    );
    engine.admission().set_accepting(false);
    lifecycle.store(DRAINING, Ordering::Release);
    let grace = Duration::from_millis(config.session.drain_grace_ms);
    let drain_deadline = Instant::now() + grace;
    while engine.admission().active() > 0 && Instant::now() < drain_deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = engine.admission().active();
    if left > 0 {
        eprintln!("<6>stopping: grace period over, closing {left} session(s)");
    }
    lifecycle.store(CLOSING, Ordering::Release);
}
