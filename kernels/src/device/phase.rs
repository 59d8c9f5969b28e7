//! The phases of a frame step, as the model marks them ([`Device::phase`])
//! for the profiler (`crate::profile`), and the timing events a device
//! records for it.
//!
//! A phase is a *section of the launch sequence*, not a kind of call: the
//! model says where each section starts, and every launch, GEMM and fill
//! issued until the next mark belongs to it, whatever kernel it runs — so a
//! kernel added to a section later is counted there without touching the
//! profiler. Copies between host and device are the one exception: they
//! always belong to [`Phase::Copies`].
//!
//! Invariants: [`Phase::ALL`] lists every phase once, in the order a step
//! runs them; [`Phase::name`] is unique and stable (the profile's JSON keys).
//!
//! [`Device::phase`]: super::Device::phase

/// A timing event of a device ([`super::Device::event_create`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId(pub u32);

/// A section of a frame step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Work issued outside a marked section (slot resets, set-up).
    Other,
    /// The step's copies between host and device.
    Copies,
    /// Mimi encoder: SEANet convolutions and the down-sampling conv.
    MimiEncSeanet,
    /// Mimi encoder transformer.
    MimiEncXfmr,
    /// Mimi encoder: split RVQ codes.
    MimiEncRvq,
    /// Temporal transformer: every linear layer.
    LmGemm,
    /// Temporal transformer: RoPE, KV writes, attention.
    LmAttn,
    /// LM element-wise work: token cache, embeddings, norms, gating.
    LmSmall,
    /// Out-norm and the text head (one GEMM).
    LmHead,
    /// Text token sampling.
    LmSample,
    /// Depformer: input projections, its stack's linear layers, heads.
    DepGemm,
    /// Depformer: KV writes and attention over this frame's positions.
    DepAttn,
    /// Depformer element-wise work: embeddings, norms, gating, casts.
    DepSmall,
    /// Audio token sampling.
    DepSample,
    /// Mimi decoder: codebook look-up and output projections.
    MimiDecRvq,
    /// Mimi decoder transformer.
    MimiDecXfmr,
    /// Mimi decoder: the up-sampling conv and SEANet convolutions.
    MimiDecSeanet,
}

impl Phase {
    /// Every phase, in step order ([`Phase::Other`] last).
    pub const ALL: [Phase; 17] = [
        Phase::Copies,
        Phase::MimiEncSeanet,
        Phase::MimiEncXfmr,
        Phase::MimiEncRvq,
        Phase::LmSmall,
        Phase::LmGemm,
        Phase::LmAttn,
        Phase::LmHead,
        Phase::LmSample,
        Phase::DepGemm,
        Phase::DepAttn,
        Phase::DepSmall,
        Phase::DepSample,
        Phase::MimiDecRvq,
        Phase::MimiDecXfmr,
        Phase::MimiDecSeanet,
        Phase::Other,
    ];

    /// The phase's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Other => "other",
            Phase::Copies => "copies",
            Phase::MimiEncSeanet => "mimi.enc.seanet",
            Phase::MimiEncXfmr => "mimi.enc.xfmr",
            Phase::MimiEncRvq => "mimi.enc.rvq",
            Phase::LmGemm => "lm.gemm",
            Phase::LmAttn => "lm.attn",
            Phase::LmSmall => "lm.small",
            Phase::LmHead => "lm.head",
            Phase::LmSample => "lm.sample",
            Phase::DepGemm => "dep.gemm",
            Phase::DepAttn => "dep.attn",
            Phase::DepSmall => "dep.small",
            Phase::DepSample => "dep.sample",
            Phase::MimiDecRvq => "mimi.dec.rvq",
            Phase::MimiDecXfmr => "mimi.dec.xfmr",
            Phase::MimiDecSeanet => "mimi.dec.seanet",
        }
    }
}

/// The three phases of one transformer stack's calls (the temporal
/// transformer's or the depformer's), so that one stack implementation
/// marks either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackPhases {
    /// Linear layers.
    pub gemm: Phase,
    /// RoPE, KV writes, attention.
    pub attn: Phase,
    /// Norms and gating.
    pub small: Phase,
}

impl StackPhases {
    /// The temporal transformer's.
    pub const TEMPORAL: StackPhases = StackPhases {
        gemm: Phase::LmGemm,
        attn: Phase::LmAttn,
        small: Phase::LmSmall,
    };
    /// The depformer's.
    pub const DEPFORMER: StackPhases = StackPhases {
        gemm: Phase::DepGemm,
        attn: Phase::DepAttn,
        small: Phase::DepSmall,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_phase_is_listed() {
        let mut names: Vec<&str> = Phase::ALL.iter().map(|p| p.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Phase::ALL.len());
    }
}
