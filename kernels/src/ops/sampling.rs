//! Token sampling (sampling.cu): one block per slot-step, guidance mixed in,
//! greedy or temperature + top-k with the slot's own xoshiro256++ state.

use super::{dim, int};
use crate::device::{Arg, DevPtr, Device, DeviceError, DeviceResult, KernelId, NULL};

/// `SAMPLE_THREADS` of sampling.cu.
pub const SAMPLE_THREADS: u32 = 512;

/// The sampling kernel of one device.
#[derive(Debug, Clone, Copy)]
pub struct SampleKernels {
    sample: KernelId,
}

/// Where one sampling launch reads and writes.
#[derive(Debug, Clone, Copy)]
pub struct SampleArgs {
    /// Logits, `ld` floats per batch row.
    pub logits: DevPtr,
    /// Candidates per row.
    pub vocab: usize,
    /// Row stride of `logits`.
    pub ld: usize,
    /// `SlotStep[n_steps]` (rows of the logits, guidance row).
    pub steps: DevPtr,
    /// Slot-steps.
    pub n_steps: usize,
    /// `SlotParams[max_slots]`.
    pub params: DevPtr,
    /// Audio (true) or text (false) temperature and top-k.
    pub audio: bool,
    /// `[max_slots][4]` u64 RNG states.
    pub rng: DevPtr,
    /// Output token of step j at `out + j · out_stride` (u32).
    pub out: DevPtr,
    /// Stride of `out`, in tokens.
    pub out_stride: usize,
}

impl SampleKernels {
    /// Resolves the kernel.
    pub fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(SampleKernels {
            sample: dev.kernel("sample_tokens")?,
        })
    }

    /// One token per active slot-step.
    pub fn sample<D: Device + ?Sized>(&self, dev: &mut D, a: &SampleArgs) -> DeviceResult<()> {
        const WHAT: &str = "sample_tokens";
        if [a.logits, a.steps, a.params, a.rng, a.out].contains(&NULL) {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        if a.vocab == 0 || a.ld < a.vocab {
            return Err(DeviceError::shape(
                WHAT,
                format!("vocab {} with row stride {}", a.vocab, a.ld),
            ));
        }
        dev.launch(
            self.sample,
            (dim(WHAT, a.n_steps)?, 1, 1),
            SAMPLE_THREADS,
            &[
                Arg::Ptr(a.logits),
                Arg::I32(int(WHAT, a.vocab)?),
                Arg::I32(int(WHAT, a.ld)?),
                Arg::Ptr(a.steps),
                Arg::Ptr(a.params),
                Arg::I32(a.audio as i32),
                Arg::Ptr(a.rng),
                Arg::Ptr(a.out),
                Arg::I32(int(WHAT, a.out_stride)?),
            ],
        )
    }
}
