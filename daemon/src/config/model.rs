//! `model.*`: the checkpoint (a folder, a hub repository or the embedded
//! demo), the backend and its slots, and the CUDA backend's settings.

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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

impl ModelConfig {
    /// Checks the section's bounds; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let m = self;
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
        Ok(())
    }
}
