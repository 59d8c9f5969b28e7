//! Settings of the transformer building blocks that the LM and Mimi configs
//! both name: norm kinds, feed-forward gating, positional embeddings and the
//! ring KV cache's window.
//!
//! Invariants: `parse` accepts exactly the official spellings and refuses any
//! other with an error naming the key; each variant is one this
//! implementation computes.

use super::{bad, ConfigError};

/// What a streaming attention's ring KV cache shows a query once the ring
/// is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvWindow {
    /// Kyutai's `RingKVCache` (moshi 0.2.13): the last `context` keys.
    #[default]
    Context,
    /// NVIDIA's fork (PersonaPlex): the slot the next write will overwrite
    /// is labelled as a future position, so a query sees `context − 1` keys
    /// (all keys at positions ≥ `end − context + 1`, `end` counting the keys
    /// written so far, the current call's included).
    ContextMinusOne,
}

impl KvWindow {
    /// Keys a query sees once the ring of `context` entries is full.
    pub fn window(self, context: usize) -> usize {
        match self {
            KvWindow::Context => context,
            KvWindow::ContextMinusOne => context.saturating_sub(1).max(1),
        }
    }
}

/// Normalisation layers the official code offers and we compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// RMSNorm with eps 1e-8, computed in float32.
    RmsNormF32,
    /// RMSNorm with eps 1e-5.
    RmsNorm,
    /// LayerNorm with eps 1e-5, affine (weight and bias).
    LayerNorm,
    /// LayerNorm with eps 1e-8 computed in float32 (`LayerNormF32`), affine.
    LayerNormF32,
}

impl NormKind {
    pub(super) fn parse(key: &str, v: &str) -> Result<Self, ConfigError> {
        Ok(match v {
            "rms_norm_f32" => NormKind::RmsNormF32,
            "rms_norm" => NormKind::RmsNorm,
            "layer_norm" => NormKind::LayerNorm,
            "layer_norm_f32" => NormKind::LayerNormF32,
            other => return Err(bad(key, format!("unsupported norm `{other}`"))),
        })
    }

    /// The epsilon the official implementation uses for this norm.
    pub fn eps(self) -> f32 {
        match self {
            NormKind::RmsNormF32 | NormKind::LayerNormF32 => 1e-8,
            NormKind::RmsNorm | NormKind::LayerNorm => 1e-5,
        }
    }

    /// Whether the norm is a LayerNorm (weight and bias) rather than an
    /// RMSNorm (`alpha`).
    pub fn is_layer_norm(self) -> bool {
        matches!(self, NormKind::LayerNorm | NormKind::LayerNormF32)
    }
}

/// Feed-forward block kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// Plain two-layer MLP with GELU (Mimi's transformers).
    None,
    /// SiLU-gated linear unit (the LMs).
    Silu,
}

impl Gating {
    pub(super) fn parse(key: &str, v: &str) -> Result<Self, ConfigError> {
        Ok(match v {
            "none" => Gating::None,
            "silu" => Gating::Silu,
            other => return Err(bad(key, format!("unsupported gating `{other}`"))),
        })
    }

    /// Hidden width of the feed-forward block of a layer of width `dim` for a
    /// configured `dim_feedforward`. Gated blocks follow the official
    /// `ActivationGating`: `21 · dim / 8` when `dim_feedforward` is exactly
    /// `4 · dim`, two thirds of it otherwise.
    pub fn hidden_dim(self, dim: usize, dim_feedforward: usize) -> usize {
        match self {
            Gating::None => dim_feedforward,
            Gating::Silu if dim_feedforward == 4 * dim => 21 * dim / 8,
            Gating::Silu => 2 * dim_feedforward / 3,
        }
    }
}

/// Positional encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PosEmb {
    /// No positional information.
    None,
    /// Rotary embedding over interleaved pairs (`[r0, i0, r1, i1, …]`).
    Rope,
    /// Rotary embedding over the two halves of each head (`[r…, i…]`, the
    /// official `rope_concat`, `RotaryEmbedding(interleave=False)`).
    RopeConcat,
}

impl PosEmb {
    pub(super) fn parse(key: &str, v: &str) -> Result<Self, ConfigError> {
        Ok(match v {
            "none" => PosEmb::None,
            "rope" => PosEmb::Rope,
            "rope_concat" => PosEmb::RopeConcat,
            other => {
                return Err(bad(
                    key,
                    format!("unsupported positional embedding `{other}`"),
                ))
            }
        })
    }

    /// The rotary embedding this encoding applies with `period`, if any.
    pub fn rope(self, period: f32) -> Option<Rope> {
        match self {
            PosEmb::None => None,
            PosEmb::Rope => Some(Rope {
                period,
                interleaved: true,
            }),
            PosEmb::RopeConcat => Some(Rope {
                period,
                interleaved: false,
            }),
        }
    }
}

/// A rotary positional embedding as a transformer stack applies it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    /// `max_period` of the rotation frequencies.
    pub period: f32,
    /// Pairs `(2i, 2i + 1)` of each head (`rope`), or `(i, i + head_dim/2)`
    /// (`rope_concat`).
    pub interleaved: bool,
}
