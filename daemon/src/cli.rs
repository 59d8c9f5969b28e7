//! The command line: `moshid serve`, `moshid client`, `moshid check-checkpoint`,
//! `moshid pull`.
//!
//! `serve` with no arguments runs the embedded demo checkpoint on the CPU on
//! 127.0.0.1:8998. Command-line values override the config file's; the
//! result is validated as a whole before anything starts.

use crate::client::ClientArgs;
use crate::config::{Backend, Config};
use crate::runtime::{self, Hooks};
use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// moshid: real-time Moshi/Hibiki serving.
#[derive(Parser)]
#[command(
    name = "moshid",
    version,
    about = "Real-time Moshi/Hibiki serving daemon"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// Run the daemon (no arguments: the embedded demo model on 127.0.0.1:8998).
    Serve(ServeArgs),
    /// Stream a WAV file to a daemon in real time and write what comes back.
    Client(ClientArgs),
    /// Validate a checkpoint folder from its headers (reads no weights), and
    /// say whether this machine can serve it.
    CheckCheckpoint {
        /// The checkpoint folder.
        dir: PathBuf,
        /// Judge this machine for this config file's backend, slots and budget.
        #[arg(long, short = 'c')]
        config: Option<PathBuf>,
        /// Backend to judge (default: the config's, `auto`).
        #[arg(long, value_enum)]
        backend: Option<Backend>,
        /// Slots to judge.
        #[arg(long)]
        max_slots: Option<usize>,
    },
    /// Fetch a checkpoint from the Hugging Face hub into its cache
    /// (OWNER/NAME[@REVISION]; HF_ENDPOINT, HF_TOKEN, HF_HOME as the official tools).
    Pull {
        /// The repository, e.g. kyutai/moshiko-pytorch-bf16 or kyutai/NAME@REVISION.
        repo: String,
    },
}

/// `moshid serve` options (each overrides the config file).
#[derive(Args, Debug, Default)]
pub struct ServeArgs {
    /// JSON config file.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Checkpoint folder (default: the embedded demo).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// A hub repository to fetch (into the hub cache) and serve:
    /// OWNER/NAME[@REVISION] (`model.repo`).
    #[arg(long, conflicts_with = "model")]
    pub model_repo: Option<String>,
    /// Serve a built-in shape with random weights instead of a checkpoint,
    /// for measuring: moshi-7b, hibiki-2b, hibiki-1b, hibiki-zero-3b (made on
    /// the GPU), or moshi-tiny (anywhere) (`model.random_weights`).
    #[arg(long, value_name = "SHAPE", conflicts_with_all = ["model", "model_repo"])]
    pub random_weights: Option<String>,
    /// Start even if the CPU backend cannot run the model in real time
    /// (`model.allow_slow`; admission still refuses what it cannot carry).
    #[arg(long)]
    pub allow_slow: bool,
    /// Listen address, e.g. 127.0.0.1:8998 (port 0 picks a free port).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Backend.
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// Concurrent streams.
    #[arg(long)]
    pub max_slots: Option<usize>,
    /// I/O cores.
    #[arg(long)]
    pub io_cores: Option<usize>,
    /// Most phase groups: 1..=4 or `auto`.
    #[arg(long)]
    pub phase_groups: Option<crate::engine::grouping::MaxGroups>,
    /// Where the demo checkpoint is cached.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Bearer token for a non-loopback listener.
    #[arg(long)]
    pub token: Option<String>,
    /// Record per-core stage metrics from the start (`metrics.enabled`;
    /// switchable at run time with `POST /admin/metrics`).
    #[arg(long)]
    pub metrics: bool,
}

impl ServeArgs {
    /// The config file (or defaults) with the command line applied, validated.
    pub fn resolve(&self) -> Result<Config, String> {
        let mut cfg = match &self.config {
            Some(p) => Config::load(p).map_err(|e| e.to_string())?,
            None => Config::default(),
        };
        if let Some(m) = &self.model {
            cfg.model.dir = Some(m.clone());
            cfg.model.repo = None;
        }
        if let Some(r) = &self.model_repo {
            cfg.model.repo = Some(r.clone());
            cfg.model.dir = None;
        }
        if let Some(shape) = &self.random_weights {
            cfg.model.random_weights = Some(shape.clone());
            cfg.model.dir = None;
            cfg.model.repo = None;
        }
        if self.allow_slow {
            cfg.model.allow_slow = true;
        }
        if let Some(a) = self.listen {
            cfg.listen.address = a;
        }
        if let Some(b) = self.backend {
            cfg.model.backend = b;
        }
        if let Some(n) = self.max_slots {
            cfg.model.max_slots = Some(n);
        }
        if let Some(n) = self.io_cores {
            cfg.runtime.io_cores = n;
            if cfg.runtime.io_cpus.as_ref().is_some_and(|c| c.len() != n) {
                return Err(
                    "--io-cores conflicts with `runtime.io_cpus` in the config file".into(),
                );
            }
        }
        if let Some(n) = self.phase_groups {
            cfg.engine.phase_groups = n;
        }
        if let Some(d) = &self.cache_dir {
            cfg.model.cache_dir = Some(d.clone());
        }
        if let Some(t) = &self.token {
            cfg.listen.token = Some(t.clone());
        }
        if self.metrics {
            cfg.metrics.enabled = true;
        }
        cfg.validate().map_err(|e| e.to_string())?;
        Ok(cfg)
    }
}

/// Runs `moshid serve`.
pub fn serve(args: ServeArgs) -> ExitCode {
    let mut cfg = match args.resolve() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let stop_rx = match stop_on_signals() {
        Ok(rx) => rx,
        Err(code) => return code,
    };
    // systemd notifications and the HAProxy agent read the engine once it exists.
    let engine_cell = crate::agent::EngineCell::default();
    let notifier = crate::systemd::Notifier::from_env(engine_cell.clone());
    let agent = match start_agent(&cfg, &engine_cell) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let agent_addr = agent.as_ref().map(|a| a.local_addr());
    // A certificate that cannot be used fails the start before the model
    // loads (minutes for a large one); the runtime loads it again to serve.
    if let Err(e) = crate::tls::ServerTls::from_config(&cfg.listen) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let tls = cfg.listen.tls_cert_file.is_some();
    if let Some(repo) = cfg.model.repo.take() {
        match crate::hub::pull_command_dir(&repo) {
            Ok(dir) => cfg.model.dir = Some(dir),
            Err(e) => {
                eprintln!("error: config key `model.repo`: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let loaded = match runtime::load_model(&cfg) {
        Ok(m) => {
            // Lanes and tables are sized from the slots the model really has
            // (derived from GPU memory when the config left it open).
            cfg.model.max_slots = Some(m.model.max_slots());
            m
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let random = loaded.about.random_weights.clone();
    let stopping_notifier = notifier.clone();
    let hooks = Hooks {
        on_ready: Some(ready_banner(tls, agent_addr, random, notifier.clone())),
        on_tick: notifier.tick_hook(),
        on_stopping: Some(Box::new(move || stopping_notifier.stopping())),
        on_engine: Some(Box::new(move |engine| {
            let _ = engine_cell.set(engine.clone());
        })),
    };
    let result = runtime::run(cfg, loaded, hooks, stop_rx);
    if let Some(agent) = agent {
        agent.stop();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Installs the SIGTERM/SIGINT handlers: a thread that sends on the
/// returned channel at the first signal, which starts the drain.
fn stop_on_signals() -> Result<std::sync::mpsc::Receiver<()>, ExitCode> {
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    match signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ]) {
        Ok(mut signals) => {
            std::thread::Builder::new()
                .name("moshid-signals".into())
                .spawn(move || {
                    if let Some(sig) = signals.forever().next() {
                        eprintln!("<6>signal {sig}: shutting down");
                        let _ = stop_tx.send(());
                    }
                })
                .expect("spawning the signal thread");
            Ok(stop_rx)
        }
        Err(e) => {
            eprintln!("error: cannot install signal handlers: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// Starts the HAProxy agent-check responder when `listen.agent_address`
/// is set. Its port is bound before the model loads, so a balancer sees
/// `maint` during start-up rather than a refused connection.
fn start_agent(
    cfg: &Config,
    engine_cell: &crate::agent::EngineCell,
) -> Result<Option<crate::agent::AgentServer>, ExitCode> {
    let Some(a) = cfg.listen.agent_address else {
        return Ok(None);
    };
    match crate::agent::AgentServer::start(a, engine_cell.clone()) {
        Ok(server) => Ok(Some(server)),
        Err(e) => {
            eprintln!("error: config key `listen.agent_address`: cannot listen on {a}: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// The `on_ready` hook: prints where the daemon listens (and how to try
/// it), then tells systemd it is ready. Stdout is flushed first, so that
/// whoever waits for readiness has the banner.
fn ready_banner(
    tls: bool,
    agent_addr: Option<SocketAddr>,
    random: Option<String>,
    ready_notifier: crate::systemd::Notifier,
) -> Box<dyn FnOnce(SocketAddr) + Send> {
    let (http, ws) = if tls {
        ("https", "wss")
    } else {
        ("http", "ws")
    };
    Box::new(move |addr| {
        println!("moshid listening on {http}://{addr}");
        println!("  in a browser:    {http}://{addr}/");
        println!("  WebSocket chat:  {ws}://{addr}/api/chat");
        println!("  health/capacity: {http}://{addr}/health  {http}://{addr}/capacity");
        if !tls {
            println!("  try it:          moshid client --input speech.wav --output reply.wav --url ws://{addr}/api/chat");
        }
        if let Some(a) = agent_addr {
            println!("  agent-check:     {a} (HAProxy agent-port)");
        }
        if let Some(shape) = &random {
            println!("  random weights:  {shape} (no speech, no meaning; for measuring)");
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
        ready_notifier.ready();
    })
}

/// Entry point of the `moshid` binary.
pub fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve(args) => serve(args),
        Command::Client(args) => crate::client::main_client(args),
        Command::CheckCheckpoint {
            dir,
            config,
            backend,
            max_slots,
        } => {
            // The machine's verdict is judged for this set-up.
            let setup = ServeArgs {
                config,
                backend,
                max_slots,
                ..ServeArgs::default()
            };
            crate::check_checkpoint::main(&dir, setup.resolve())
        }
        Command::Pull { repo } => crate::hub::pull_command(&repo),
    }
}
