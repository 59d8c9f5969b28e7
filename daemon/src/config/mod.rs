//! The daemon's configuration: a JSON file (every bound lives here), command
//! line overrides, and validation at start with errors that name the key.
//!
//! Invariants: a [`Config`] returned by [`Config::load`] has passed
//! [`Config::validate`]; no value in it is guessed — conflicting settings are
//! refused. Unknown keys are refused (serde's `deny_unknown_fields`), so a
//! typo cannot silently leave a default in place.

pub mod events;
pub mod keys;
pub mod realtime;
pub mod sip;

use crate::engine::grouping::{MaxGroups, MAX_FIXED_GROUPS};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid JSON, or has unknown keys or wrong types.
    #[error("config {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// serde's message (names the key).
        source: serde_json::Error,
    },
    /// A value outside what the daemon supports.
    #[error("config key `{key}`: {why}")]
    Invalid {
        /// Dotted key.
        key: &'static str,
        /// What is wrong.
        why: String,
    },
}

fn invalid(key: &'static str, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        why: why.into(),
    }
}

/// Which model backend steps the streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// CUDA when a driver is present, otherwise the CPU.
    Auto,
    /// The float32 CPU reference.
    Cpu,
    /// The GPU backend.
    Cuda,
    /// The GPU backend on the kernels' CPU emulator: the CUDA path (buckets,
    /// graphs, device weights) without a GPU, for tests and rehearsals;
    /// far slower than either real backend, never for serving.
    Emu,
}

/// `model.*`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Checkpoint folder; `null` runs the embedded demo checkpoint.
    pub dir: Option<PathBuf>,
    /// Backend choice.
    pub backend: Backend,
    /// Concurrent streams the model is built for; `null`: as many as the
    /// GPU's free memory holds (CUDA), [`CPU_DEFAULT_SLOTS`] on the CPU.
    pub max_slots: Option<usize>,
    /// Where the demo checkpoint is written on first use.
    pub cache_dir: Option<PathBuf>,
    /// A Hugging Face hub repository (`kyutai/NAME[@REVISION]`) to fetch
    /// into the hub cache and serve, instead of `dir`.
    pub repo: Option<String>,
    /// Start even when the CPU backend's predicted step at batch 1 is over
    /// the budget (offline or test use; admission still applies).
    pub allow_slow: bool,
    /// Serve a built-in shape (`moshi-7b`, `hibiki-2b`, `hibiki-1b`,
    /// `hibiki-zero-3b`, or the tiny `moshi-tiny`) with random weights
    /// instead of a checkpoint: for measuring (see `random_weights.rs`).
    pub random_weights: Option<String>,
    /// The CUDA backend's settings.
    pub cuda: CudaConfig,
    /// The folder whose files sessions may name as `voice_prompt` (models
    /// with prompts: PersonaPlex); `null`: voice prompts are refused.
    pub voice_dir: Option<PathBuf>,
}

/// Slots of the CPU backend when `model.max_slots` is not given.
pub const CPU_DEFAULT_SLOTS: usize = 8;

/// Number format of the CUDA backend's LM (`model.cuda.precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CudaPrecision {
    /// bf16 weights and GEMM inputs, f32 accumulation and norms (serving).
    Bf16,
    /// f32 throughout: the exact reference mode (for checking, 2× the memory).
    F32,
}

/// Element type of the LM's KV cache (`model.cuda.kv_cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheType {
    /// bfloat16 (with `bf16` precision).
    Bf16,
    /// fp8 e4m3: half the memory, twice the streams (with `bf16` precision).
    Fp8,
    /// float32 (with `f32` precision).
    F32,
}

/// `model.cuda.*`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CudaConfig {
    /// GPU ordinal.
    pub device: usize,
    /// The LM's number format.
    pub precision: CudaPrecision,
    /// The temporal transformer's KV cache; `null`: bf16, or f32 with f32 precision.
    pub kv_cache: Option<KvCacheType>,
    /// Capture one CUDA graph per batch-size bucket and replay it.
    pub graphs: bool,
    /// Device memory left free when `model.max_slots` is derived, in MiB
    /// (CUDA graphs, the context, fragmentation).
    pub memory_reserve_mib: u64,
    /// Where compiled kernels (PTX) are cached; `null`: `<cache_dir>/ptx`.
    pub ptx_cache_dir: Option<PathBuf>,
    /// Folders holding CUDA's headers (`cuda_bf16.h`) for NVRTC; empty:
    /// `$MOSHID_CUDA_INCLUDE`, `$CUDA_HOME/include`, `/usr/local/cuda/include`.
    pub include_dirs: Vec<PathBuf>,
    /// Synchronise after every kernel launch and GEMM, so that a failing
    /// kernel is named with its grid, block and arguments; turns graphs off.
    /// For finding a fault, not for serving (every step pays the waits).
    pub debug_sync: bool,
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            device: 0,
            precision: CudaPrecision::Bf16,
            kv_cache: None,
            graphs: true,
            memory_reserve_mib: 4096,
            ptx_cache_dir: None,
            include_dirs: Vec::new(),
            debug_sync: false,
        }
    }
}

impl CudaConfig {
    /// The KV cache type in effect.
    pub fn kv(&self) -> KvCacheType {
        self.kv_cache.unwrap_or(match self.precision {
            CudaPrecision::Bf16 => KvCacheType::Bf16,
            CudaPrecision::F32 => KvCacheType::F32,
        })
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            dir: None,
            backend: Backend::Auto,
            max_slots: None,
            cache_dir: None,
            repo: None,
            allow_slow: false,
            random_weights: None,
            cuda: CudaConfig::default(),
            voice_dir: None,
        }
    }
}

/// `runtime.*`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Number of I/O cores (glommio executors).
    pub io_cores: usize,
    /// CPUs for the I/O cores, in order; `null` picks from the allowed set.
    pub io_cpus: Option<Vec<usize>>,
    /// CPU for the engine thread; `null` picks one not used by an I/O core
    /// when there is one.
    pub engine_cpu: Option<usize>,
    /// How often the heap's free pages are given back to the system, in
    /// milliseconds (glibc's `malloc_trim`, on the main thread; 0: never).
    /// Without it the resident size follows the largest footprint the
    /// daemon ever had (see `heap.rs`).
    pub heap_trim_ms: u64,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            io_cores: 1,
            io_cpus: None,
            engine_cpu: None,
            heap_trim_ms: 10_000,
        }
    }
}

/// `engine.*`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Most phase groups: a number 1..=4 or `"auto"` (up to 16). The engine
    /// uses as many as load allows, each ticking 80/G ms after the previous.
    #[serde(with = "max_groups_serde")]
    pub phase_groups: MaxGroups,
    /// Time kept free in each group's budget, in milliseconds.
    pub budget_margin_ms: f64,
    /// Frames a slot may have queued at the engine before new ones are dropped.
    pub queued_frames_per_slot: usize,
    /// Model steps per batch size during warm-up.
    pub warmup_steps: usize,
    /// Frames of prompt prefill work (voice encodes, transformer positions)
    /// the engine does per tick, before stepping the tick's streams.
    pub prompt_frames_per_tick: usize,
    /// Prefilled prompt states kept for reuse (one per voice and role text).
    pub prompt_cache_entries: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            phase_groups: MaxGroups::Auto,
            budget_margin_ms: 10.0,
            queued_frames_per_slot: 4,
            warmup_steps: 3,
            prompt_frames_per_tick: 8,
            prompt_cache_entries: 16,
        }
    }
}

/// `engine.phase_groups` as JSON: a number, or `"auto"`.
mod max_groups_serde {
    use super::MaxGroups;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &MaxGroups, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(v, s)
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(usize),
        Word(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<MaxGroups, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Number(n) => Ok(MaxGroups::Fixed(n)),
            Raw::Word(w) => w.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// `listen.*`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenConfig {
    /// Address of the WebSocket + HTTP control listener.
    pub address: SocketAddr,
    /// Open connections per I/O core beyond which new ones are closed at once.
    pub max_connections_per_core: usize,
    /// Open connections from one client IP address per I/O core beyond which
    /// new ones from that address are closed at once (0: no per-address
    /// limit; `null`: 0 on a loopback listener, [`AUTO_CONNECTIONS_PER_IP`]
    /// otherwise). Counted per core, so a client may hold up to this many on
    /// each core. Behind a load balancer every connection comes from the
    /// balancer's address: set it to 0 there.
    pub max_connections_per_ip: Option<usize>,
    /// Connections per I/O core that have not completed their first request
    /// or handshake (HTTP head and body, WebSocket upgrade, AudioSocket UUID,
    /// and whatever a listener adds before it), across every listener of the
    /// core. A new connection over it closes the oldest of them. Never more
    /// than `max_connections_per_core` apply.
    pub max_pending_per_core: usize,
    /// Such connections from one client IP address per I/O core; a new one
    /// over it closes that address's oldest (0: no per-address budget;
    /// `null`: 0 on a loopback listener, [`AUTO_PENDING_PER_IP`] otherwise).
    pub max_pending_per_ip: Option<usize>,
    /// Address of the HAProxy agent-check responder (`null`: none). It
    /// answers every connection with one line (`up ready N%`, `drain` or
    /// `maint`) and closes; no token, it discloses only that line.
    pub agent_address: Option<SocketAddr>,
    /// Bearer token required when the listener is not on loopback.
    pub token: Option<String>,
    /// Largest HTTP request head, in bytes.
    pub max_head_bytes: usize,
    /// Largest HTTP request body, in bytes.
    pub max_body_bytes: usize,
    /// Time allowed from accept to a complete request (head and body; for a
    /// WebSocket, its upgrade request), in milliseconds.
    pub head_timeout_ms: u64,
    /// PEM certificate chain (leaf first): with `tls_key_file`, every
    /// connection on `address` is TLS (`https://`, `wss://`). Reloaded on
    /// SIGHUP.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file` (PKCS#8, PKCS#1 or SEC1).
    pub tls_key_file: Option<PathBuf>,
    /// Time allowed for a TLS handshake, in milliseconds (counted before
    /// `head_timeout_ms`).
    pub tls_handshake_timeout_ms: u64,
    /// Connections the kernel queues for `accept` per listening socket
    /// (this listener's and AudioSocket's, one per I/O core); Linux caps it
    /// at `net.core.somaxconn`. A full queue drops new clients' SYNs, which
    /// they retry only after a second.
    pub backlog: u32,
}

/// `listen.max_connections_per_ip` when `null` and the listener is not on
/// loopback: per core, well above what one browser, office NAT or PBX holds,
/// far below what locks others out.
pub const AUTO_CONNECTIONS_PER_IP: usize = 128;
/// `listen.max_pending_per_ip` when `null` and the listener is not on
/// loopback: per core; a browser opens at most 6 connections to a host at
/// once, and a prompt client is pending for milliseconds.
pub const AUTO_PENDING_PER_IP: usize = 16;

impl ListenConfig {
    /// `max_connections_per_ip` with `null` resolved (see the key), never
    /// above `max_connections_per_core`; 0: no per-address limit.
    pub fn connections_per_ip(&self) -> usize {
        self.resolve(self.max_connections_per_ip, AUTO_CONNECTIONS_PER_IP)
            .min(self.max_connections_per_core)
    }

    /// `max_pending_per_core`, never above `max_connections_per_core`.
    pub fn pending_per_core(&self) -> usize {
        self.max_pending_per_core.min(self.max_connections_per_core)
    }

    /// `max_pending_per_ip` with `null` resolved (see the key), never above
    /// [`pending_per_core`](Self::pending_per_core); 0: no per-address budget.
    pub fn pending_per_ip(&self) -> usize {
        self.resolve(self.max_pending_per_ip, AUTO_PENDING_PER_IP)
            .min(self.pending_per_core())
    }

    fn resolve(&self, value: Option<usize>, auto: usize) -> usize {
        match value {
            Some(v) => v,
            None if self.address.ip().is_loopback() => 0,
            None => auto,
        }
    }
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            address: "127.0.0.1:8998".parse().expect("valid literal"),
            max_connections_per_core: 1024,
            max_connections_per_ip: None,
            max_pending_per_core: 256,
            max_pending_per_ip: None,
            agent_address: None,
            token: None,
            max_head_bytes: 16 * 1024,
            max_body_bytes: 64 * 1024,
            head_timeout_ms: 3_000,
            backlog: 4096,
            tls_cert_file: None,
            tls_key_file: None,
            tls_handshake_timeout_ms: 5_000,
        }
    }
}

/// `session.*`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// Largest WebSocket message accepted, in bytes.
    pub max_message_bytes: usize,
    /// Frames sent to the engine and not yet answered, per session, beyond
    /// which the session stops reading its socket (backpressure).
    pub max_frames_in_flight: usize,
    /// A session that sends nothing for this long is closed, in milliseconds.
    pub idle_timeout_ms: u64,
    /// Longest session, in seconds (0: unlimited).
    pub max_session_seconds: u64,
    /// A client that does not take what is sent to it for this long is
    /// closed (slow consumer), in milliseconds: the daemon never buffers
    /// output without bound.
    pub send_timeout_ms: u64,
    /// On shutdown, how long sessions may go on before they are closed, in
    /// milliseconds.
    pub drain_grace_ms: u64,
    /// After the end of input, the most silent frames fed to a model that
    /// must be drained (Hibiki) before the session ends anyway.
    pub drain_max_frames: usize,
    /// Where every session's final record (with its whole text) is POSTed
    /// as JSON (`http://` or `https://`; `null`: nowhere unless the session
    /// names its own, see `events.session_webhook_prefixes`).
    pub webhook_url: Option<String>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            max_message_bytes: 64 * 1024,
            max_frames_in_flight: 4,
            idle_timeout_ms: 30_000,
            max_session_seconds: 3_600,
            send_timeout_ms: 5_000,
            drain_grace_ms: 30_000,
            drain_max_frames: 250,
            webhook_url: None,
        }
    }
}

/// `defaults.*`: decoding parameters a session gets unless its query says otherwise.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GenDefaults {
    /// Text sampling temperature.
    pub text_temperature: f32,
    /// Text top-k.
    pub text_topk: usize,
    /// Audio sampling temperature.
    pub audio_temperature: f32,
    /// Audio top-k.
    pub audio_topk: usize,
    /// Classifier-free guidance coefficient (models with conditioners).
    pub cfg_coef: f32,
    /// Kyutai's `pad_mult`: the text padding probability is scaled by
    /// `exp(pad_mult)` (0: off).
    pub pad_mult: f32,
    /// Kyutai's repetition penalty on text tokens (1: off).
    pub repetition_penalty: f32,
    /// Counted text tokens the penalty looks back over.
    pub repetition_penalty_context: usize,
}

impl Default for GenDefaults {
    fn default() -> Self {
        GenDefaults {
            text_temperature: 0.7,
            text_topk: 25,
            audio_temperature: 0.8,
            audio_topk: 250,
            cfg_coef: 1.0,
            pad_mult: 0.0,
            repetition_penalty: 1.0,
            repetition_penalty_context: moshid_model::lm::text_rules::DEFAULT_REPETITION_CONTEXT,
        }
    }
}

/// `metrics.*`: per-core stage metrics (`GET /metrics` always serves the
/// cheap gauges; stage timings are recorded only while the switch is on).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Whether stage timings are recorded from the start (`--metrics`).
    pub enabled: bool,
    /// Whether `POST /admin/metrics` may turn the recording on and off at
    /// run time (`false`: it answers 403 and `enabled` holds until restart).
    pub runtime_switch: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: false,
            runtime_switch: true,
        }
    }
}

/// `rtp.*`: the RTP telephony transport (`POST /v1/rtp/sessions`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RtpConfig {
    /// Whether RTP sessions can be created.
    pub enabled: bool,
    /// Address the sessions' UDP sockets bind to (port chosen by the
    /// kernel); `null`: the listener's address.
    pub bind_address: Option<std::net::IpAddr>,
    /// A session that receives no RTP for this long ends, in milliseconds
    /// (counted from its creation until the first packet).
    pub inactivity_timeout_ms: u64,
    /// Smallest jitter buffer target depth, in milliseconds.
    pub jitter_min_ms: u32,
    /// Largest jitter buffer target depth, in milliseconds.
    pub jitter_max_ms: u32,
    /// RTP sessions alive at once (each also needs a model slot).
    pub max_sessions: usize,
}

impl Default for RtpConfig {
    fn default() -> Self {
        RtpConfig {
            enabled: true,
            bind_address: None,
            inactivity_timeout_ms: 30_000,
            jitter_min_ms: 40,
            jitter_max_ms: 120,
            max_sessions: 256,
        }
    }
}

/// `audiosocket.*`: the Asterisk AudioSocket listener (TCP, one per I/O core).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AudioSocketConfig {
    /// Whether the listener runs.
    pub enabled: bool,
    /// Address every I/O core binds (`SO_REUSEPORT`); port 0 picks one.
    pub address: SocketAddr,
    /// Largest message payload accepted, in bytes (a bigger one is refused
    /// with error code 0x04 from its header alone).
    pub max_payload_bytes: usize,
    /// Time allowed for the UUID message after the connection opens, in
    /// milliseconds.
    pub uuid_timeout_ms: u64,
    /// Open AudioSocket connections per I/O core beyond which new ones are
    /// closed at once.
    pub max_connections_per_core: usize,
    /// Addresses allowed to connect (Asterisk's); empty: anyone, which is
    /// accepted only on a loopback address (the protocol carries no
    /// credentials).
    pub allowed_peers: Vec<std::net::IpAddr>,
    /// Session parameters of every call (`text_temperature`, `seed`,
    /// `condition.NAME`, … as in a chat query), checked against the model
    /// at start.
    pub params: std::collections::BTreeMap<String, String>,
}

impl Default for AudioSocketConfig {
    fn default() -> Self {
        AudioSocketConfig {
            enabled: false,
            address: "127.0.0.1:9092".parse().expect("valid literal"),
            max_payload_bytes: 8192,
            uuid_timeout_ms: 5_000,
            max_connections_per_core: 1024,
            allowed_peers: Vec::new(),
            params: Default::default(),
        }
    }
}

/// `media_streams.*`: the Media Streams WebSocket (`/v1/media-stream`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MediaStreamsConfig {
    /// Whether `/v1/media-stream` is served.
    pub enabled: bool,
    /// `mark` events waiting for their echo, per stream, beyond which the
    /// stream is closed (protocol error).
    pub max_pending_marks: usize,
}

impl Default for MediaStreamsConfig {
    fn default() -> Self {
        MediaStreamsConfig {
            enabled: true,
            max_pending_marks: 256,
        }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Model and backend.
    pub model: ModelConfig,
    /// Cores.
    pub runtime: RuntimeConfig,
    /// Engine.
    pub engine: EngineConfig,
    /// Listener and control API.
    pub listen: ListenConfig,
    /// Per-session bounds.
    pub session: SessionConfig,
    /// Decoding defaults.
    pub defaults: GenDefaults,
    /// Stage metrics.
    pub metrics: MetricsConfig,
    /// RTP transport.
    pub rtp: RtpConfig,
    /// Asterisk AudioSocket transport.
    pub audiosocket: AudioSocketConfig,
    /// Media Streams WebSocket transport.
    pub media_streams: MediaStreamsConfig,
    /// The OpenAI Realtime endpoints.
    pub realtime: realtime::RealtimeConfig,
    /// Live session events and webhooks.
    pub events: events::EventsConfig,
    /// The SIP endpoint.
    pub sip: sip::SipConfig,
}

impl Config {
    /// Reads a config file (missing keys take their defaults) and validates it.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let cfg: Config = serde_json::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks every bound; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let m = &self.model;
        if m.dir.is_some() && m.repo.is_some() {
            return Err(invalid(
                "model.repo",
                "conflicts with `model.dir`: serve a folder or a hub repository, not both",
            ));
        }
        if let Some(r) = &m.repo {
            crate::hub::RepoRef::parse(r).map_err(|e| invalid("model.repo", e.to_string()))?;
        }
        if let Some(shape) = &m.random_weights {
            if m.dir.is_some() || m.repo.is_some() {
                return Err(invalid(
                    "model.random_weights",
                    "conflicts with `model.dir` and `model.repo`: random weights replace a checkpoint",
                ));
            }
            crate::random_weights::check_name(shape)
                .map_err(|e| invalid("model.random_weights", e.to_string()))?;
        }
        if m.max_slots.is_some_and(|n| n == 0 || n > 4096) {
            return Err(invalid(
                "model.max_slots",
                "must be between 1 and 4096 (or null)",
            ));
        }
        match (m.cuda.precision, m.cuda.kv()) {
            (CudaPrecision::Bf16, KvCacheType::F32) => {
                return Err(invalid(
                    "model.cuda.kv_cache",
                    "an f32 KV cache needs `model.cuda.precision` f32",
                ))
            }
            (CudaPrecision::F32, KvCacheType::Bf16 | KvCacheType::Fp8) => {
                return Err(invalid(
                    "model.cuda.kv_cache",
                    "with `model.cuda.precision` f32 the KV cache is f32",
                ))
            }
            _ => {}
        }
        let r = &self.runtime;
        if r.io_cores == 0 || r.io_cores > 256 {
            return Err(invalid("runtime.io_cores", "must be between 1 and 256"));
        }
        if let Some(cpus) = &r.io_cpus {
            if cpus.len() != r.io_cores {
                return Err(invalid(
                    "runtime.io_cpus",
                    format!("lists {} CPUs for {} I/O cores", cpus.len(), r.io_cores),
                ));
            }
            let mut seen = cpus.clone();
            seen.sort_unstable();
            seen.dedup();
            if seen.len() != cpus.len() {
                return Err(invalid("runtime.io_cpus", "lists a CPU twice"));
            }
        }
        let e = &self.engine;
        if let MaxGroups::Fixed(n) = e.phase_groups {
            if !(1..=MAX_FIXED_GROUPS).contains(&n) {
                return Err(invalid(
                    "engine.phase_groups",
                    "must be between 1 and 4, or \"auto\"",
                ));
            }
        }
        if !(0.0..crate::FRAME_MS).contains(&e.budget_margin_ms) {
            return Err(invalid(
                "engine.budget_margin_ms",
                format!(
                    "must be at least 0 and below the frame period {} ms",
                    crate::FRAME_MS
                ),
            ));
        }
        if e.prompt_frames_per_tick == 0 || e.prompt_frames_per_tick > 4096 {
            return Err(invalid(
                "engine.prompt_frames_per_tick",
                "must be between 1 and 4096",
            ));
        }
        if e.prompt_cache_entries > 4096 {
            return Err(invalid(
                "engine.prompt_cache_entries",
                "must be at most 4096",
            ));
        }
        if e.queued_frames_per_slot == 0 || e.queued_frames_per_slot > 64 {
            return Err(invalid(
                "engine.queued_frames_per_slot",
                "must be between 1 and 64",
            ));
        }
        if e.warmup_steps == 0 || e.warmup_steps > 100 {
            return Err(invalid("engine.warmup_steps", "must be between 1 and 100"));
        }
        let l = &self.listen;
        if l.max_connections_per_core == 0 {
            return Err(invalid(
                "listen.max_connections_per_core",
                "must be positive",
            ));
        }
        if let Some(n) = l
            .max_connections_per_ip
            .filter(|&n| n > l.max_connections_per_core)
        {
            return Err(invalid(
                "listen.max_connections_per_ip",
                format!(
                    "{n} exceeds listen.max_connections_per_core ({}): it would never apply",
                    l.max_connections_per_core
                ),
            ));
        }
        if !(1..=65_535).contains(&l.backlog) {
            return Err(invalid("listen.backlog", "must be between 1 and 65535"));
        }
        if l.max_pending_per_core == 0 {
            return Err(invalid("listen.max_pending_per_core", "must be positive"));
        }
        if let Some(n) = l.max_pending_per_ip.filter(|&n| n > l.pending_per_core()) {
            return Err(invalid(
                "listen.max_pending_per_ip",
                format!(
                    "{n} exceeds listen.max_pending_per_core ({}): it would never apply",
                    l.pending_per_core()
                ),
            ));
        }
        if let Some(agent) = l.agent_address {
            if agent.port() != 0 && agent.port() == l.address.port() {
                return Err(invalid(
                    "listen.agent_address",
                    format!("uses port {}, the port of listen.address", agent.port()),
                ));
            }
        }
        match (&l.tls_cert_file, &l.tls_key_file) {
            (Some(_), None) => {
                return Err(invalid(
                    "listen.tls_key_file",
                    "is required with `listen.tls_cert_file`",
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "listen.tls_cert_file",
                    "is required with `listen.tls_key_file`",
                ))
            }
            _ => {}
        }
        if l.tls_handshake_timeout_ms == 0 {
            return Err(invalid(
                "listen.tls_handshake_timeout_ms",
                "must be positive",
            ));
        }
        if !l.address.ip().is_loopback() && l.token.as_deref().is_none_or(str::is_empty) {
            return Err(invalid(
                "listen.token",
                format!(
                    "is required when listening on {} (not loopback): set a bearer token",
                    l.address
                ),
            ));
        }
        if l.max_head_bytes < 512 || l.max_body_bytes == 0 || l.head_timeout_ms == 0 {
            return Err(invalid(
                "listen.max_head_bytes",
                "max_head_bytes ≥ 512, max_body_bytes and head_timeout_ms positive",
            ));
        }
        let s = &self.session;
        if s.max_message_bytes < 1024 {
            return Err(invalid(
                "session.max_message_bytes",
                "must be at least 1024",
            ));
        }
        if s.max_frames_in_flight == 0 {
            return Err(invalid("session.max_frames_in_flight", "must be positive"));
        }
        if s.max_frames_in_flight > e.queued_frames_per_slot {
            // More in flight than the engine queues would turn backpressure
            // into dropped frames: the engine answers the excess `Dropped`.
            return Err(invalid(
                "session.max_frames_in_flight",
                format!(
                    "must not exceed engine.queued_frames_per_slot ({})",
                    e.queued_frames_per_slot
                ),
            ));
        }
        if s.idle_timeout_ms == 0 {
            return Err(invalid("session.idle_timeout_ms", "must be positive"));
        }
        if s.send_timeout_ms == 0 {
            return Err(invalid("session.send_timeout_ms", "must be positive"));
        }
        let rtp = &self.rtp;
        if rtp.inactivity_timeout_ms < 100 {
            return Err(invalid("rtp.inactivity_timeout_ms", "must be at least 100"));
        }
        if !(10..=1000).contains(&rtp.jitter_min_ms) {
            return Err(invalid("rtp.jitter_min_ms", "must be between 10 and 1000"));
        }
        if rtp.jitter_max_ms < rtp.jitter_min_ms || rtp.jitter_max_ms > 2000 {
            return Err(invalid(
                "rtp.jitter_max_ms",
                format!(
                    "must be between rtp.jitter_min_ms ({}) and 2000",
                    rtp.jitter_min_ms
                ),
            ));
        }
        if rtp.max_sessions == 0 {
            return Err(invalid("rtp.max_sessions", "must be positive"));
        }
        if rtp.bind_address.is_some_and(|a| a.is_multicast()) {
            return Err(invalid("rtp.bind_address", "must be a unicast address"));
        }
        let a = &self.audiosocket;
        if !(1920..=65535).contains(&a.max_payload_bytes) {
            return Err(invalid(
                "audiosocket.max_payload_bytes",
                "must be between 1920 (20 ms at 48 kHz) and 65535 (the header's limit)",
            ));
        }
        if a.uuid_timeout_ms == 0 {
            return Err(invalid("audiosocket.uuid_timeout_ms", "must be positive"));
        }
        if a.max_connections_per_core == 0 {
            return Err(invalid(
                "audiosocket.max_connections_per_core",
                "must be positive",
            ));
        }
        if a.enabled {
            if a.address.port() != 0 && a.address.port() == l.address.port() {
                return Err(invalid(
                    "audiosocket.address",
                    format!("uses port {}, the port of listen.address", a.address.port()),
                ));
            }
            if !a.address.ip().is_loopback() && a.allowed_peers.is_empty() {
                return Err(invalid(
                    "audiosocket.allowed_peers",
                    format!(
                        "is required when listening on {} (not loopback): AudioSocket carries no credentials, list Asterisk's addresses",
                        a.address
                    ),
                ));
            }
        }
        events::validate(&self.events, s.webhook_url.as_deref())
            .map_err(|(key, why)| invalid(key, why))?;
        sip::validate(&self.sip, l.address).map_err(|(key, why)| invalid(key, why))?;
        realtime::validate(&self.realtime).map_err(|(key, why)| invalid(key, why))?;
        if self.media_streams.max_pending_marks == 0 {
            return Err(invalid(
                "media_streams.max_pending_marks",
                "must be positive",
            ));
        }
        let d = &self.defaults;
        if !(d.text_temperature >= 0.0 && d.audio_temperature >= 0.0) {
            return Err(invalid(
                "defaults.text_temperature",
                "temperatures must be ≥ 0",
            ));
        }
        if d.text_topk == 0 || d.audio_topk == 0 {
            return Err(invalid(
                "defaults.text_topk",
                "top-k values must be positive",
            ));
        }
        if d.cfg_coef.is_nan() || d.cfg_coef < 0.0 {
            return Err(invalid("defaults.cfg_coef", "must be ≥ 0"));
        }
        if !(-10.0..=10.0).contains(&d.pad_mult) {
            return Err(invalid("defaults.pad_mult", "must be between -10 and 10"));
        }
        if !(0.1..=10.0).contains(&d.repetition_penalty) {
            return Err(invalid(
                "defaults.repetition_penalty",
                "must be between 0.1 and 10",
            ));
        }
        let max_ctx = moshid_model::lm::text_rules::MAX_REPETITION_CONTEXT;
        if d.repetition_penalty_context == 0 || d.repetition_penalty_context > max_ctx {
            return Err(invalid(
                "defaults.repetition_penalty_context",
                format!("must be between 1 and {max_ctx}"),
            ));
        }
        // `metrics.*` are two independent booleans: every combination is
        // usable (wrong types and unknown keys are refused by the parser,
        // which names the key).
        Ok(())
    }

    /// Frame records a lane between one I/O core and the engine holds.
    pub fn lane_capacity_frames(&self) -> usize {
        // Every slot may have its in-flight frames in the lane at once, plus
        // one open and one close record per slot.
        self.model.max_slots.unwrap_or(CPU_DEFAULT_SLOTS) * (self.session.max_frames_in_flight + 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        let cfg: Config = serde_json::from_str(text).map_err(|e| e.to_string())?;
        cfg.validate().map_err(|e| e.to_string())?;
        Ok(cfg)
    }

    #[test]
    fn empty_object_is_the_default() {
        let c = parse("{}").unwrap();
        assert_eq!(c.listen.address.port(), 8998);
        assert_eq!(c.engine.phase_groups, MaxGroups::Auto);
        let c = parse(r#"{"engine": {"phase_groups": 4}}"#).unwrap();
        assert_eq!(c.engine.phase_groups, MaxGroups::Fixed(4));
        let c = parse(r#"{"engine": {"phase_groups": "auto"}}"#).unwrap();
        assert_eq!(c.engine.phase_groups, MaxGroups::Auto);
        assert!(parse(r#"{"engine": {"phase_groups": "many"}}"#).is_err());
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = parse(r#"{"engine": {"phase_grups": 2}}"#).unwrap_err();
        assert!(e.contains("phase_grups"), "{e}");
        let e = parse(r#"{"enigne": {}}"#).unwrap_err();
        assert!(e.contains("enigne"), "{e}");
    }

    #[test]
    fn bounds_are_checked_by_key() {
        let e = parse(r#"{"engine": {"phase_groups": 5}}"#).unwrap_err();
        assert!(e.contains("engine.phase_groups"), "{e}");
        let e = parse(r#"{"model": {"max_slots": 0}}"#).unwrap_err();
        assert!(e.contains("model.max_slots"), "{e}");
        let e = parse(r#"{"runtime": {"io_cores": 2, "io_cpus": [0]}}"#).unwrap_err();
        assert!(e.contains("runtime.io_cpus"), "{e}");
        let e = parse(r#"{"engine": {"phase_groups": 4, "budget_margin_ms": 80}}"#).unwrap_err();
        assert!(e.contains("engine.budget_margin_ms"), "{e}");
    }

    #[test]
    fn rtp_section_is_validated_by_key() {
        let c = parse(r#"{"rtp": {"jitter_min_ms": 20, "jitter_max_ms": 200}}"#).unwrap();
        assert!(c.rtp.enabled);
        let e = parse(r#"{"rtp": {"jitter_min_ms": 80, "jitter_max_ms": 60}}"#).unwrap_err();
        assert!(e.contains("rtp.jitter_max_ms"), "{e}");
        let e = parse(r#"{"rtp": {"inactivity_timeout_ms": 0}}"#).unwrap_err();
        assert!(e.contains("rtp.inactivity_timeout_ms"), "{e}");
        let e = parse(r#"{"rtp": {"max_sessions": 0}}"#).unwrap_err();
        assert!(e.contains("rtp.max_sessions"), "{e}");
        let e = parse(r#"{"rtp": {"bind_address": "239.1.1.1"}}"#).unwrap_err();
        assert!(e.contains("rtp.bind_address"), "{e}");
        let e = parse(r#"{"rtp": {"jitter_mn_ms": 5}}"#).unwrap_err();
        assert!(e.contains("jitter_mn_ms"), "{e}");
    }

    #[test]
    fn per_address_limits_default_on_off_loopback() {
        let c = parse("{}").unwrap();
        assert_eq!(
            (c.listen.connections_per_ip(), c.listen.pending_per_ip()),
            (0, 0)
        );
        assert_eq!(c.listen.pending_per_core(), 256);
        let c = parse(r#"{"listen": {"address": "0.0.0.0:8998", "token": "t"}}"#).unwrap();
        assert_eq!(
            (c.listen.connections_per_ip(), c.listen.pending_per_ip()),
            (AUTO_CONNECTIONS_PER_IP, AUTO_PENDING_PER_IP)
        );
        // Explicit values win, 0 included (behind a load balancer).
        let c = parse(
            r#"{"listen": {"address": "0.0.0.0:8998", "token": "t",
                "max_connections_per_ip": 0, "max_pending_per_ip": 0}}"#,
        )
        .unwrap();
        assert_eq!(
            (c.listen.connections_per_ip(), c.listen.pending_per_ip()),
            (0, 0)
        );
        // Defaults never exceed the per-core bounds they sit under.
        let c = parse(
            r#"{"listen": {"address": "0.0.0.0:8998", "token": "t", "max_connections_per_core": 10}}"#,
        )
        .unwrap();
        assert_eq!(c.listen.pending_per_core(), 10);
        assert_eq!(
            (c.listen.connections_per_ip(), c.listen.pending_per_ip()),
            (10, 10)
        );
        let e = parse(r#"{"listen": {"max_pending_per_core": 0}}"#).unwrap_err();
        assert!(e.contains("listen.max_pending_per_core"), "{e}");
        let e = parse(r#"{"listen": {"max_pending_per_core": 4, "max_pending_per_ip": 5}}"#)
            .unwrap_err();
        assert!(e.contains("listen.max_pending_per_ip"), "{e}");
    }

    #[test]
    fn public_listener_needs_a_token() {
        let e = parse(r#"{"listen": {"address": "0.0.0.0:8998"}}"#).unwrap_err();
        assert!(e.contains("listen.token"), "{e}");
        parse(r#"{"listen": {"address": "0.0.0.0:8998", "token": "s3cret"}}"#).unwrap();
    }

    #[test]
    fn tls_files_come_in_pairs() {
        let e = parse(r#"{"listen": {"tls_cert_file": "/etc/moshid/cert.pem"}}"#).unwrap_err();
        assert!(e.contains("listen.tls_key_file"), "{e}");
        let e = parse(r#"{"listen": {"tls_key_file": "/etc/moshid/key.pem"}}"#).unwrap_err();
        assert!(e.contains("listen.tls_cert_file"), "{e}");
        let e = parse(r#"{"listen": {"tls_handshake_timeout_ms": 0}}"#).unwrap_err();
        assert!(e.contains("listen.tls_handshake_timeout_ms"), "{e}");
        let c =
            parse(r#"{"listen": {"tls_cert_file": "/c.pem", "tls_key_file": "/k.pem"}}"#).unwrap();
        assert_eq!(c.listen.tls_handshake_timeout_ms, 5_000);
    }

    #[test]
    fn per_ip_limit_and_agent_address_are_checked() {
        let e =
            parse(r#"{"listen": {"max_connections_per_core": 8, "max_connections_per_ip": 9}}"#)
                .unwrap_err();
        assert!(e.contains("listen.max_connections_per_ip"), "{e}");
        let e = parse(
            r#"{"listen": {"address": "127.0.0.1:8998", "agent_address": "127.0.0.1:8998"}}"#,
        )
        .unwrap_err();
        assert!(e.contains("listen.agent_address"), "{e}");
        let c =
            parse(r#"{"listen": {"max_connections_per_ip": 4, "agent_address": "0.0.0.0:9998"}}"#)
                .unwrap();
        assert_eq!(c.listen.max_connections_per_ip, Some(4));
        assert_eq!(c.listen.agent_address.map(|a| a.port()), Some(9998));
    }

    #[test]
    fn metrics_section_defaults_and_refusals() {
        let c = parse("{}").unwrap();
        assert!(!c.metrics.enabled);
        assert!(c.metrics.runtime_switch);
        let c = parse(r#"{"metrics": {"enabled": true, "runtime_switch": false}}"#).unwrap();
        assert!(c.metrics.enabled && !c.metrics.runtime_switch);
        let e = parse(r#"{"metrics": {"enabled": "yes"}}"#).unwrap_err();
        assert!(e.contains("invalid type"), "{e}");
        let e = parse(r#"{"metrics": {"enable": true}}"#).unwrap_err();
        assert!(e.contains("enable"), "{e}");
    }

    #[test]
    fn telephony_sections_are_validated_by_key() {
        let c = parse("{}").unwrap();
        assert!(!c.audiosocket.enabled && c.media_streams.enabled);
        let c = parse(r#"{"audiosocket": {"enabled": true, "address": "127.0.0.1:0", "params": {"seed": "7"}}}"#).unwrap();
        assert_eq!(
            c.audiosocket.params.get("seed").map(String::as_str),
            Some("7")
        );
        let e = parse(r#"{"audiosocket": {"max_payload_bytes": 100}}"#).unwrap_err();
        assert!(e.contains("audiosocket.max_payload_bytes"), "{e}");
        let e = parse(r#"{"audiosocket": {"max_payload_bytes": 70000}}"#).unwrap_err();
        assert!(e.contains("audiosocket.max_payload_bytes"), "{e}");
        let e = parse(r#"{"audiosocket": {"uuid_timeout_ms": 0}}"#).unwrap_err();
        assert!(e.contains("audiosocket.uuid_timeout_ms"), "{e}");
        let e =
            parse(r#"{"audiosocket": {"enabled": true, "address": "0.0.0.0:9092"}}"#).unwrap_err();
        assert!(e.contains("audiosocket.allowed_peers"), "{e}");
        parse(r#"{"audiosocket": {"enabled": true, "address": "0.0.0.0:9092", "allowed_peers": ["10.1.2.3"]}}"#).unwrap();
        let e = parse(r#"{"audiosocket": {"enabled": true, "address": "127.0.0.1:8998"}}"#)
            .unwrap_err();
        assert!(e.contains("audiosocket.address"), "{e}");
        let e = parse(r#"{"audiosocket": {"enabeld": true}}"#).unwrap_err();
        assert!(e.contains("enabeld"), "{e}");
        let e = parse(r#"{"media_streams": {"max_pending_marks": 0}}"#).unwrap_err();
        assert!(e.contains("media_streams.max_pending_marks"), "{e}");
    }
}
