//! The GPU model: Mimi and the LM as launch sequences on a
//! [`Device`](crate::device::Device), behind the engine's `StreamingModel`.
//!
//! - [`GpuModel`] (`streaming.rs`): one frame per active slot — Mimi encode
//!   → LM step → Mimi decode — issued as one launch sequence per bucket of
//!   slot-steps, captured once as a graph per bucket and replayed;
//! - `lm/`: the temporal transformer, the depformer, the token cache and
//!   sampling; `mimi/`: the streaming codec;
//! - `tensor.rs`: weights from a checkpoint or a seeded random fill, and the
//!   GEMM that applies them; `staging.rs`: the pinned double buffer that
//!   checkpoint bytes reach the device through; `io.rs`: the per-frame
//!   transfer layout; `arena.rs`: the device memory of prompt snapshots.

pub mod arena;
mod error;
pub(crate) mod io;
pub mod lm;
pub mod mimi;
mod prompt;
pub mod staging;
mod streaming;
pub mod tensor;

pub use error::GpuError;
pub use streaming::GpuModel;

use crate::device::DType;
use crate::ops::attention::KvType;
use crate::plan::{BucketPolicy, KvDtype};

/// Number format of the LM's weights and of the activations feeding its GEMMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// bf16 weights and GEMM inputs, f32 accumulation, norms and softmax:
    /// what serving uses.
    Bf16,
    /// f32 throughout: the exact reference mode (matches the CPU backend
    /// within float rounding), for checking the kernels and the sequence.
    F32,
}

impl Precision {
    /// The element type of weights and GEMM inputs.
    pub fn dtype(self) -> DType {
        match self {
            Precision::Bf16 => DType::Bf16,
            Precision::F32 => DType::F32,
        }
    }
}

/// The fp8 KV cache stores `x / FP8_KV_SCALE` (one scale for every layer;
/// e4m3 spans ±448, and keys and values of these models stay well inside).
pub const FP8_KV_SCALE: f32 = 1.0;

/// How a [`GpuModel`] is built.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuOptions {
    /// Slots (concurrent streams).
    pub max_slots: usize,
    /// The LM's number format (Mimi always runs in f32).
    pub precision: Precision,
    /// The temporal transformer's KV cache (bf16 or fp8 with bf16
    /// precision, f32 with f32 precision).
    pub kv: KvDtype,
    /// Capture one graph per bucket and replay it (true), or issue every
    /// launch each frame (false).
    pub graphs: bool,
    /// Batch-size buckets.
    pub buckets: BucketPolicy,
    /// Device memory for prompt snapshots (models with prompts only; see
    /// [`arena`]); 0: snapshots are refused.
    pub prompt_cache_bytes: usize,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            max_slots: 1,
            precision: Precision::Bf16,
            kv: KvDtype::Bf16,
            graphs: true,
            buckets: BucketPolicy::default(),
            prompt_cache_bytes: 0,
        }
    }
}

impl GpuOptions {
    fn kv_type(&self) -> KvType {
        match self.kv {
            KvDtype::Bf16 => KvType::Bf16,
            KvDtype::Fp8E4m3 => KvType::Fp8 {
                scale: FP8_KV_SCALE,
            },
            KvDtype::F32 => KvType::F32,
        }
    }
}
