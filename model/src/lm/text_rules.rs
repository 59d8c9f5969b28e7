//! Kyutai's per-session text sampling rules, as their Rust server applies
//! them (moshi-core `lm_generate_multistream.rs`, `apply_repetition_penalty`
//! and the `pad_mult` callback of `sample_f`), on every backend:
//!
//! - **repetition penalty** `(context, penalty)`: walking the slot's text
//!   tokens from the most recent, skipping the padding id, 0 (end of
//!   padding) and `text_card` (the start token), the first `context` of
//!   them are looked at (repeats counted), and each distinct token's logit is
//!   divided by `penalty` when it is ≥ 0, multiplied by it otherwise; done
//!   on the text logits before sampling;
//! - **pad_mult** `m`: the padding token's probability is multiplied by
//!   `exp(m)` before top-k selection and the draw. In logit space that is
//!   `logit[pad] += m · T` for temperature `T`; greedy decoding (which
//!   Kyutai's server never uses with these keys) takes `T = 1`, the argmax of
//!   the scaled probabilities.
//!
//! The history holds the last [`MAX_REPETITION_CONTEXT`] counted tokens of a
//! slot in a fixed ring (no allocation per step); a slot's tokens are those
//! its steps chose, the prompt's forced text not included.

use super::sampling::Sampler;

/// The longest `repetition_penalty_context` a session may ask for.
pub const MAX_REPETITION_CONTEXT: usize = 512;
/// The context Kyutai's server reports when a session gives a penalty alone.
pub const DEFAULT_REPETITION_CONTEXT: usize = 32;

/// A slot's text rules.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TextRules {
    /// Added to the padding token's logit (`pad_mult · T`; 0: off).
    pub pad_bonus: f32,
    /// `(context, penalty)`; `None` (or a penalty of 1): off.
    pub repetition: Option<(usize, f32)>,
}

impl TextRules {
    /// The rules for `pad_mult` and a repetition penalty under `text`.
    pub fn new(pad_mult: f32, repetition: Option<(usize, f32)>, text: &Sampler) -> Self {
        let t = if text.use_sampling && text.temp > 0.0 {
            text.temp
        } else {
            1.0
        };
        TextRules {
            pad_bonus: pad_mult * t,
            repetition: repetition.filter(|&(c, p)| c > 0 && p != 1.0),
        }
    }

    /// Whether the rules change anything.
    pub fn is_off(&self) -> bool {
        self.pad_bonus == 0.0 && self.repetition.is_none()
    }
}

/// The ids the penalty never counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkippedIds {
    /// The text padding id.
    pub pad: u32,
    /// The start token (`text_card`).
    pub start: u32,
}

impl SkippedIds {
    /// Whether `t` is counted by the penalty.
    pub fn counts(&self, t: u32) -> bool {
        t != self.pad && t != 0 && t != self.start
    }
}

/// A slot's recent counted text tokens.
#[derive(Debug, Clone)]
pub struct TextHistory {
    ring: Vec<u32>,
    len: usize,
    head: usize,
}

impl Default for TextHistory {
    fn default() -> Self {
        TextHistory {
            ring: vec![0; MAX_REPETITION_CONTEXT],
            len: 0,
            head: 0,
        }
    }
}

impl TextHistory {
    /// Forgets every token.
    pub fn clear(&mut self) {
        self.len = 0;
        self.head = 0;
    }

    /// Records a chosen token (skipped ids are not recorded).
    pub fn push(&mut self, t: u32, skip: SkippedIds) {
        if !skip.counts(t) {
            return;
        }
        self.ring[self.head] = t;
        self.head = (self.head + 1) % self.ring.len();
        self.len = (self.len + 1).min(self.ring.len());
    }

    /// The last `n` counted tokens, most recent first.
    pub fn recent(&self, n: usize) -> impl Iterator<Item = u32> + '_ {
        let cap = self.ring.len();
        (0..n.min(self.len)).map(move |i| self.ring[(self.head + cap - 1 - i) % cap])
    }
}

/// Applies `rules` to a slot's text `logits` in place (`seen` is scratch of
/// at least the vocabulary's length, all false; left all false).
pub fn apply(
    logits: &mut [f32],
    rules: &TextRules,
    hist: &TextHistory,
    pad: u32,
    seen: &mut [bool],
) {
    if let Some((context, penalty)) = rules.repetition {
        for t in hist.recent(context) {
            let i = t as usize;
            if i >= logits.len() || seen[i] {
                continue;
            }
            seen[i] = true;
            let l = &mut logits[i];
            if *l >= 0.0 {
                *l /= penalty;
            } else {
                *l *= penalty;
            }
        }
        for t in hist.recent(context) {
            if let Some(s) = seen.get_mut(t as usize) {
                *s = false;
            }
        }
    }
    if let Some(l) = logits.get_mut(pad as usize) {
        *l += rules.pad_bonus;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SKIP: SkippedIds = SkippedIds { pad: 3, start: 10 };

    #[test]
    fn penalty_as_kyutai_computes_it() {
        let mut h = TextHistory::default();
        for t in [5, 3, 7, 5, 0, 8, 10, 9] {
            h.push(t, SKIP);
        }
        // Counted, most recent first: 9 8 5 7 5; context 4 sees 9 8 5 7.
        let rules = TextRules {
            pad_bonus: 0.0,
            repetition: Some((4, 2.0)),
        };
        let mut logits = vec![1.0, 1.0, 1.0, 1.0, 1.0, 4.0, 1.0, -3.0, 2.0, -1.0, 1.0];
        let mut seen = vec![false; 11];
        apply(&mut logits, &rules, &h, 3, &mut seen);
        assert_eq!(
            logits,
            [1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 1.0, -6.0, 1.0, -2.0, 1.0]
        );
        assert!(seen.iter().all(|s| !s));
    }

    #[test]
    fn pad_bonus_is_pad_mult_times_temperature() {
        let s = Sampler {
            use_sampling: true,
            temp: 0.7,
            top_k: 25,
        };
        let r = TextRules::new(2.0, Some((32, 1.0)), &s);
        assert!((r.pad_bonus - 1.4).abs() < 1e-6);
        assert_eq!(r.repetition, None);
        assert_eq!(TextRules::new(-1.0, None, &Sampler::GREEDY).pad_bonus, -1.0);
    }
}
