//! The per-frame transfer layout: for a bucket of `b` slot-steps, one
//! contiguous region of inputs (host → device: step descriptors, transformer
//! rows, PCM) and one of outputs (device → host: PCM, tokens, ready flags),
//! each moved by a single copy per frame.
//!
//! Invariant: the host staging buffer and the device buffer use the same
//! layout for a given bucket, every section starts at a 256-byte boundary,
//! and the layout of the largest bucket bounds every other (buffers are
//! sized once from it).

use crate::ops::types::{RowInfo, SlotStep};

const ALIGN: usize = 256;

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// Byte offsets of one bucket's sections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Slot-steps.
    pub bucket: usize,
    /// LM SlotStep[b].
    pub steps: usize,
    /// Mimi encode SlotStep[b].
    pub enc_steps: usize,
    /// Mimi decode SlotStep[b].
    pub dec_steps: usize,
    /// End-of-input flags i32[b].
    pub eos: usize,
    /// Temporal RowInfo[b · rps].
    pub rows: usize,
    /// Depformer RowInfo[dep_q][b · rps].
    pub dep_rows: usize,
    /// Input PCM f32[b][frame_samples].
    pub pcm_in: usize,
    /// Bytes of the input region.
    pub in_bytes: usize,
    /// Output PCM f32[b][frame_samples].
    pub pcm_out: usize,
    /// Undelayed frames u32[b][1 + dep_q].
    pub tokens: usize,
    /// Ready flags i32[b].
    pub ready: usize,
    /// Bytes of the output region.
    pub out_bytes: usize,
}

impl Layout {
    /// The layout for `bucket` slot-steps of a model with `rps` rows per
    /// slot-step, `dep_q` generated codebooks and `frame_samples` per frame.
    pub fn new(bucket: usize, rps: usize, dep_q: usize, frame_samples: usize) -> Layout {
        let step = std::mem::size_of::<SlotStep>();
        let row = std::mem::size_of::<RowInfo>();
        let rows = bucket * rps;
        let mut at = 0;
        let mut take = |bytes: usize| {
            let o = at;
            at += align(bytes);
            o
        };
        let steps = take(bucket * step);
        let enc_steps = take(bucket * step);
        let dec_steps = take(bucket * step);
        let eos = take(bucket * 4);
        let rows_at = take(rows * row);
        let dep_rows = take(dep_q * rows * row);
        let pcm_in = take(bucket * frame_samples * 4);
        let in_bytes = at;
        let mut at = 0;
        let mut take = |bytes: usize| {
            let o = at;
            at += align(bytes);
            o
        };
        let pcm_out = take(bucket * frame_samples * 4);
        let tokens = take(bucket * (1 + dep_q) * 4);
        let ready = take(bucket * 4);
        Layout {
            bucket,
            steps,
            enc_steps,
            dec_steps,
            eos,
            rows: rows_at,
            dep_rows,
            pcm_in,
            in_bytes,
            pcm_out,
            tokens,
            ready,
            out_bytes: at,
        }
    }

    /// Byte offset of depformer step `k`'s rows.
    pub fn dep_rows_at(&self, k: usize, rps: usize) -> usize {
        self.dep_rows + k * self.bucket * rps * std::mem::size_of::<RowInfo>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_aligned_disjoint_and_grow_with_the_bucket() {
        let mut last = (0, 0);
        for b in [1, 2, 3, 8, 64] {
            let l = Layout::new(b, 2, 8, 1920);
            let ins = [
                l.steps,
                l.enc_steps,
                l.dec_steps,
                l.eos,
                l.rows,
                l.dep_rows,
                l.pcm_in,
            ];
            for w in ins.windows(2) {
                assert!(w[0] < w[1]);
            }
            assert!(ins.iter().all(|o| o % ALIGN == 0));
            assert!(l.pcm_in + b * 1920 * 4 <= l.in_bytes);
            assert!(l.dep_rows_at(7, 2) + b * 2 * 20 <= l.pcm_in);
            assert!(l.ready + b * 4 <= l.out_bytes);
            assert!(l.in_bytes > last.0 && l.out_bytes > last.1);
            last = (l.in_bytes, l.out_bytes);
        }
    }
}
