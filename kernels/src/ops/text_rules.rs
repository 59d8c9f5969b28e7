//! Kyutai's text sampling rules on the device (text_rules.cu): the
//! repetition penalty and `pad_mult` applied to each slot-step's text
//! logits before sampling, and the history of counted text tokens they
//! read (CPU reference: `moshid_model::lm::text_rules`).

use super::{dim, int};
use crate::device::{Arg, DevPtr, Device, DeviceError, DeviceResult, HostPod, KernelId, NULL};

/// `RULES_THREADS` of text_rules.cu.
pub const RULES_THREADS: u32 = 128;

/// A slot's rules (`struct TextRules` of text_rules.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TextRulesParams {
    /// Added to the padding logit.
    pub pad_bonus: f32,
    /// Tokens looked at (0: no penalty).
    pub context: i32,
    /// The penalty.
    pub penalty: f32,
}

// SAFETY: #[repr(C)] of three 4-byte scalars, no padding, any bits valid.
unsafe impl HostPod for TextRulesParams {}

/// Where the rules of every slot live on the device.
#[derive(Debug, Clone, Copy)]
pub struct TextRulesState {
    /// `TextRulesParams[max_slots]`.
    pub rules: DevPtr,
    /// `[max_slots][cap]` u32.
    pub hist: DevPtr,
    /// `[max_slots]` i32 tokens recorded.
    pub hist_n: DevPtr,
    /// History ring length (a power of two).
    pub cap: usize,
    /// `[max_slots][vocab]` u8 scratch, all zero.
    pub seen: DevPtr,
    /// The text padding id.
    pub pad: u32,
    /// The start token (`text_card`).
    pub start: u32,
}

/// The two kernels.
#[derive(Debug, Clone, Copy)]
pub struct TextRulesKernels {
    apply: KernelId,
    push: KernelId,
}

fn grid(what: &'static str, n: usize) -> DeviceResult<(u32, u32, u32)> {
    Ok((dim(what, n.div_ceil(RULES_THREADS as usize))?, 1, 1))
}

impl TextRulesKernels {
    /// Resolves the kernels.
    pub fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(TextRulesKernels {
            apply: dev.kernel("text_rules_apply")?,
            push: dev.kernel("text_history_push")?,
        })
    }

    /// Applies each slot-step's rules to its text logits (`ld` per row).
    #[allow(clippy::too_many_arguments)]
    pub fn apply<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        st: &TextRulesState,
        steps: DevPtr,
        n_steps: usize,
        logits: DevPtr,
        ld: usize,
        vocab: usize,
    ) -> DeviceResult<()> {
        const WHAT: &str = "text_rules_apply";
        if [steps, logits, st.rules, st.hist, st.hist_n, st.seen].contains(&NULL) {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        dev.launch(
            self.apply,
            grid(WHAT, n_steps)?,
            RULES_THREADS,
            &[
                Arg::Ptr(steps),
                Arg::I32(int(WHAT, n_steps)?),
                Arg::Ptr(logits),
                Arg::I32(int(WHAT, ld)?),
                Arg::I32(int(WHAT, vocab)?),
                Arg::Ptr(st.rules),
                Arg::Ptr(st.hist),
                Arg::Ptr(st.hist_n),
                Arg::I32(int(WHAT, st.cap)?),
                Arg::Ptr(st.seen),
                Arg::I32(int(WHAT, st.pad as usize)?),
            ],
        )
    }

    /// Records each slot-step's chosen text token (`text[n_steps]`).
    pub fn push<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        st: &TextRulesState,
        steps: DevPtr,
        n_steps: usize,
        text: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "text_history_push";
        if [steps, text, st.hist, st.hist_n].contains(&NULL) {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        dev.launch(
            self.push,
            grid(WHAT, n_steps)?,
            RULES_THREADS,
            &[
                Arg::Ptr(steps),
                Arg::I32(int(WHAT, n_steps)?),
                Arg::Ptr(text),
                Arg::Ptr(st.hist),
                Arg::Ptr(st.hist_n),
                Arg::I32(int(WHAT, st.cap)?),
                Arg::I32(int(WHAT, st.pad as usize)?),
                Arg::I32(int(WHAT, st.start as usize)?),
            ],
        )
    }
}
