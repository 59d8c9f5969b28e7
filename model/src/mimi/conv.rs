//! Streaming causal 1-D convolutions (the official `StreamingConv1d` and
//! `StreamingConvTranspose1d`), batched over the active slots.
//!
//! Activations are time-major: a batch is `[n][t][c]` (slot, step, channel),
//! the active slots' rows packed one after the other.
//!
//! - [`StreamingConv1d`]: each slot keeps the last `history = (k−1)·d + 1 − s`
//!   input steps (`previous`); a call sees `previous ++ x` and produces
//!   `t/s` outputs, with no padding. With `replicate` (the learnt down-sampler)
//!   a fresh slot's `previous` is filled with its first input sample instead of
//!   zeros. The product runs as im2col + one packed matrix product
//!   ([`PackedLinear`]) over every active slot's
//!   output rows (chunked so the column buffer stays bounded).
//! - [`StreamingConvTr1d`]: the full transposed output of a call has
//!   `t·s + (k − s)` steps; its first `k − s` steps receive the previous
//!   call's tail (`partial`), and its last `k − s` steps, minus the bias, become
//!   the new `partial` (so the bias is counted once per output step).
//!
//! Invariants: only the slots passed to `forward` are read or changed in the
//! state; `forward` never allocates (every scratch slice comes from the
//! caller, sized with `col_need`); a cleared slot is as good as new.

use super::linear::PackedLinear;
use crate::weights::{CheckpointError, TensorSpec, Weights};

/// Upper bound (in floats) for one im2col chunk; bigger products are split
/// into row chunks.
pub(crate) const COL_CAP: usize = 1 << 18;

/// Streaming memory of one module: `per_slot` floats for each slot.
#[derive(Debug, Clone)]
pub(crate) struct SlotBuf {
    per_slot: usize,
    data: Vec<f32>,
}

impl SlotBuf {
    pub(crate) fn new(max_slots: usize, per_slot: usize) -> Self {
        SlotBuf {
            per_slot,
            data: vec![0.0; max_slots * per_slot],
        }
    }

    /// [`SlotBuf::new`] for the large buffers (KV rings): an error naming
    /// `what` instead of an abort when the memory cannot be had.
    pub(crate) fn try_new(
        max_slots: usize,
        per_slot: usize,
        what: impl FnOnce() -> String,
    ) -> Result<Self, crate::alloc::AllocError> {
        Ok(SlotBuf {
            per_slot,
            data: crate::alloc::zeroed(max_slots * per_slot, what)?,
        })
    }

    pub(crate) fn get(&self, slot: usize) -> &[f32] {
        &self.data[slot * self.per_slot..(slot + 1) * self.per_slot]
    }

    pub(crate) fn get_mut(&mut self, slot: usize) -> &mut [f32] {
        &mut self.data[slot * self.per_slot..(slot + 1) * self.per_slot]
    }

    pub(crate) fn clear(&mut self, slot: usize) {
        self.get_mut(slot).fill(0.0);
    }
}

/// A causal streaming convolution (groups = 1).
#[derive(Debug, Clone)]
pub(crate) struct StreamingConv1d {
    /// Tensor name prefix (`….conv.conv`), `.weight`/`.bias` appended.
    name: String,
    pub(crate) c_in: usize,
    pub(crate) c_out: usize,
    kernel: usize,
    pub(crate) stride: usize,
    dilation: usize,
    has_bias: bool,
    replicate: bool,
    /// `[c_out] × [kernel][c_in]` (the checkpoint's `[c_out][c_in][kernel]`
    /// reordered to match the im2col rows).
    w: PackedLinear,
    bias: Vec<f32>,
}

/// Per-slot state of a [`StreamingConv1d`].
#[derive(Debug, Clone)]
pub(crate) struct ConvState {
    /// `[history][c_in]` per slot.
    prev: SlotBuf,
    /// Whether the slot has not run yet (used by replicate padding).
    first: Vec<bool>,
}

impl StreamingConv1d {
    /// A convolution skeleton (weights are read by [`Self::load`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: impl Into<String>,
        c_in: usize,
        c_out: usize,
        kernel: usize,
        stride: usize,
        dilation: usize,
        has_bias: bool,
        replicate: bool,
    ) -> Self {
        assert!(kernel >= 1 && stride >= 1 && dilation >= 1);
        assert!(
            (kernel - 1) * dilation + 1 >= stride,
            "effective kernel shorter than the stride"
        );
        StreamingConv1d {
            name: name.into(),
            c_in,
            c_out,
            kernel,
            stride,
            dilation,
            has_bias,
            replicate,
            w: PackedLinear::default(),
            bias: Vec::new(),
        }
    }

    /// Input steps kept between calls.
    pub(crate) fn history(&self) -> usize {
        (self.kernel - 1) * self.dilation + 1 - self.stride
    }

    pub(crate) fn specs(&self, out: &mut Vec<TensorSpec>) {
        out.push(TensorSpec::new(
            format!("{}.weight", self.name),
            &[self.c_out, self.c_in, self.kernel],
        ));
        if self.has_bias {
            out.push(TensorSpec::new(
                format!("{}.bias", self.name),
                &[self.c_out],
            ));
        }
    }

    pub(crate) fn load(&mut self, weights: &mut Weights) -> Result<(), CheckpointError> {
        let (ci, co, k) = (self.c_in, self.c_out, self.kernel);
        let raw = weights.take(&format!("{}.weight", self.name), &[co, ci, k])?;
        self.set_weights(&raw, None);
        if self.has_bias {
            self.bias = weights.take(&format!("{}.bias", self.name), &[co])?;
        }
        Ok(())
    }

    /// Sets the weights from the PyTorch layout `[c_out][c_in][kernel]`.
    pub(crate) fn set_weights(&mut self, raw: &[f32], bias: Option<&[f32]>) {
        let (ci, co, k) = (self.c_in, self.c_out, self.kernel);
        assert_eq!(raw.len(), co * ci * k);
        self.w = PackedLinear::from_fn(co, k * ci, |o, c| raw[(o * ci + c % ci) * k + c / ci]);
        if let Some(b) = bias {
            assert!(self.has_bias && b.len() == co);
            self.bias = b.to_vec();
        }
    }

    pub(crate) fn new_state(&self, max_slots: usize) -> ConvState {
        ConvState {
            prev: SlotBuf::new(max_slots, self.history() * self.c_in),
            first: vec![true; max_slots],
        }
    }

    pub(crate) fn reset(&self, st: &mut ConvState, slot: usize) {
        st.prev.clear(slot);
        st.first[slot] = true;
    }

    /// Output steps for `t_in` input steps.
    pub(crate) fn out_len(&self, t_in: usize) -> usize {
        assert!(
            t_in > 0 && (t_in / self.stride) * self.stride == t_in,
            "steps must be a multiple of the stride"
        );
        t_in / self.stride
    }

    /// Column scratch needed for `n` slots of `t_in` steps.
    pub(crate) fn col_need(&self, n: usize, t_in: usize) -> usize {
        let kc = self.kernel * self.c_in;
        let rows = n * self.out_len(t_in);
        rows.min((COL_CAP / kc).max(1)) * kc
    }

    /// Runs one call for the slots `slots` (their inputs packed in `x` as
    /// `[n][t_in][c_in]`), writing `[n][t_in/stride][c_out]` into `y`.
    pub(crate) fn forward(
        &self,
        st: &mut ConvState,
        slots: &[usize],
        x: &[f32],
        t_in: usize,
        col: &mut [f32],
        y: &mut [f32],
    ) {
        let n = slots.len();
        let (ci, co) = (self.c_in, self.c_out);
        let t_out = self.out_len(t_in);
        let tp = self.history();
        let kc = self.kernel * ci;
        debug_assert!(x.len() >= n * t_in * ci && y.len() >= n * t_out * co);
        if self.replicate && tp > 0 {
            for (j, &s) in slots.iter().enumerate() {
                if st.first[s] {
                    let x0 = &x[j * t_in * ci..j * t_in * ci + ci];
                    for row in st.prev.get_mut(s).chunks_exact_mut(ci) {
                        row.copy_from_slice(x0);
                    }
                }
            }
        }
        let rows = n * t_out;
        let chunk = (col.len() / kc).min(rows);
        assert!(chunk > 0, "column scratch too small");
        let mut r0 = 0;
        while r0 < rows {
            let r1 = (r0 + chunk).min(rows);
            for r in r0..r1 {
                let (j, t) = (r / t_out, r % t_out);
                let prev = st.prev.get(slots[j]);
                let xj = &x[j * t_in * ci..(j + 1) * t_in * ci];
                let dst = &mut col[(r - r0) * kc..(r - r0 + 1) * kc];
                for k in 0..self.kernel {
                    let v = t * self.stride + k * self.dilation;
                    let src = if v < tp {
                        &prev[v * ci..(v + 1) * ci]
                    } else {
                        &xj[(v - tp) * ci..(v - tp + 1) * ci]
                    };
                    dst[k * ci..(k + 1) * ci].copy_from_slice(src);
                }
            }
            let ys = &mut y[r0 * co..r1 * co];
            self.w.forward(col, r1 - r0, ys);
            if self.has_bias {
                for row in ys.chunks_exact_mut(co) {
                    for (v, b) in row.iter_mut().zip(&self.bias) {
                        *v += b;
                    }
                }
            }
            r0 = r1;
        }
        for (j, &s) in slots.iter().enumerate() {
            st.first[s] = false;
            if tp == 0 {
                continue;
            }
            let xj = &x[j * t_in * ci..(j + 1) * t_in * ci];
            let prev = st.prev.get_mut(s);
            let keep = tp.saturating_sub(t_in);
            if keep > 0 {
                prev.copy_within(t_in * ci..tp * ci, 0);
            }
            let from_x = tp - keep;
            prev[keep * ci..].copy_from_slice(&xj[(t_in - from_x) * ci..]);
        }
    }
}

/// A causal streaming transposed convolution, dense (groups = 1) or
/// depthwise (groups = channels, one input channel per output channel).
#[derive(Debug, Clone)]
pub(crate) struct StreamingConvTr1d {
    /// Tensor name prefix (`….convtr.convtr`).
    name: String,
    pub(crate) c_in: usize,
    pub(crate) c_out: usize,
    kernel: usize,
    pub(crate) stride: usize,
    depthwise: bool,
    has_bias: bool,
    /// Dense: `[kernel][c_out] × [c_in]` (from `[c_in][c_out][kernel]`).
    w: PackedLinear,
    /// Depthwise: `[c][kernel]` (from `[c][1][kernel]`).
    w_dw: Vec<f32>,
    bias: Vec<f32>,
}

/// Per-slot state of a [`StreamingConvTr1d`].
#[derive(Debug, Clone)]
pub(crate) struct ConvTrState {
    /// `[kernel − stride][c_out]` per slot, without bias.
    partial: SlotBuf,
}

impl StreamingConvTr1d {
    pub(crate) fn new(
        name: impl Into<String>,
        c_in: usize,
        c_out: usize,
        kernel: usize,
        stride: usize,
        depthwise: bool,
        has_bias: bool,
    ) -> Self {
        assert!(stride >= 1 && kernel >= stride);
        assert!(!depthwise || c_in == c_out);
        StreamingConvTr1d {
            name: name.into(),
            c_in,
            c_out,
            kernel,
            stride,
            depthwise,
            has_bias,
            w: PackedLinear::default(),
            w_dw: Vec::new(),
            bias: Vec::new(),
        }
    }

    fn overlap(&self) -> usize {
        self.kernel - self.stride
    }

    fn torch_shape(&self) -> [usize; 3] {
        if self.depthwise {
            [self.c_in, 1, self.kernel]
        } else {
            [self.c_in, self.c_out, self.kernel]
        }
    }

    pub(crate) fn specs(&self, out: &mut Vec<TensorSpec>) {
        out.push(TensorSpec::new(
            format!("{}.weight", self.name),
            &self.torch_shape(),
        ));
        if self.has_bias {
            out.push(TensorSpec::new(
                format!("{}.bias", self.name),
                &[self.c_out],
            ));
        }
    }

    pub(crate) fn load(&mut self, weights: &mut Weights) -> Result<(), CheckpointError> {
        let raw = weights.take(&format!("{}.weight", self.name), &self.torch_shape())?;
        self.set_weights(&raw, None);
        if self.has_bias {
            self.bias = weights.take(&format!("{}.bias", self.name), &[self.c_out])?;
        }
        Ok(())
    }

    /// Sets the weights from the PyTorch layout (`[c_in][c_out/groups][kernel]`).
    pub(crate) fn set_weights(&mut self, raw: &[f32], bias: Option<&[f32]>) {
        let (ci, co, k) = (self.c_in, self.c_out, self.kernel);
        if self.depthwise {
            assert_eq!(raw.len(), ci * k);
            self.w_dw = raw.to_vec();
        } else {
            assert_eq!(raw.len(), ci * co * k);
            self.w = PackedLinear::from_fn(k * co, ci, |c, i| raw[(i * co + c % co) * k + c / co]);
        }
        if let Some(b) = bias {
            assert!(self.has_bias && b.len() == co);
            self.bias = b.to_vec();
        }
    }

    pub(crate) fn new_state(&self, max_slots: usize) -> ConvTrState {
        ConvTrState {
            partial: SlotBuf::new(max_slots, self.overlap() * self.c_out),
        }
    }

    pub(crate) fn reset(&self, st: &mut ConvTrState, slot: usize) {
        st.partial.clear(slot);
    }

    pub(crate) fn out_len(&self, t_in: usize) -> usize {
        t_in * self.stride
    }

    /// Scratch needed for `n` slots of `t_in` steps (the per-input-step
    /// products `[rows][kernel][c_out]`, chunked).
    pub(crate) fn col_need(&self, n: usize, t_in: usize) -> usize {
        if self.depthwise {
            return 0;
        }
        let kc = self.kernel * self.c_out;
        (n * t_in).min((COL_CAP / kc).max(1)) * kc
    }

    /// Runs one call for `slots` (inputs `[n][t_in][c_in]` in `x`), writing
    /// `[n][t_in·stride][c_out]` into `y`.
    pub(crate) fn forward(
        &self,
        st: &mut ConvTrState,
        slots: &[usize],
        x: &[f32],
        t_in: usize,
        col: &mut [f32],
        y: &mut [f32],
    ) {
        let n = slots.len();
        let (ci, co, k, s) = (self.c_in, self.c_out, self.kernel, self.stride);
        let pt = self.overlap();
        let t_out = t_in * s;
        assert!(t_in > 0 && t_out >= pt, "a call must cover the overlap");
        debug_assert!(x.len() >= n * t_in * ci && y.len() >= n * t_out * co);
        // Start from the carried overlap; the new tail accumulates in `partial`.
        for (j, &sl) in slots.iter().enumerate() {
            let yj = &mut y[j * t_out * co..(j + 1) * t_out * co];
            let part = st.partial.get_mut(sl);
            yj[..pt * co].copy_from_slice(part);
            yj[pt * co..].fill(0.0);
            part.fill(0.0);
        }
        if self.depthwise {
            for (j, &sl) in slots.iter().enumerate() {
                let yj = &mut y[j * t_out * co..(j + 1) * t_out * co];
                let part = st.partial.get_mut(sl);
                for t in 0..t_in {
                    let xr = &x[(j * t_in + t) * ci..(j * t_in + t + 1) * ci];
                    for kk in 0..k {
                        let r = t * s + kk;
                        let dst = if r < t_out {
                            &mut yj[r * co..(r + 1) * co]
                        } else {
                            &mut part[(r - t_out) * co..(r - t_out + 1) * co]
                        };
                        for c in 0..co {
                            dst[c] += xr[c] * self.w_dw[c * k + kk];
                        }
                    }
                }
            }
        } else {
            let kc = k * co;
            let rows = n * t_in;
            let chunk = (col.len() / kc).min(rows);
            assert!(chunk > 0, "transposed-conv scratch too small");
            let mut r0 = 0;
            while r0 < rows {
                let r1 = (r0 + chunk).min(rows);
                self.w.forward(&x[r0 * ci..r1 * ci], r1 - r0, col);
                for r in r0..r1 {
                    let (j, t) = (r / t_in, r % t_in);
                    let z = &col[(r - r0) * kc..(r - r0 + 1) * kc];
                    let yj = &mut y[j * t_out * co..(j + 1) * t_out * co];
                    let part = st.partial.get_mut(slots[j]);
                    for kk in 0..k {
                        let o = t * s + kk;
                        let dst = if o < t_out {
                            &mut yj[o * co..(o + 1) * co]
                        } else {
                            &mut part[(o - t_out) * co..(o - t_out + 1) * co]
                        };
                        for (d, v) in dst.iter_mut().zip(&z[kk * co..(kk + 1) * co]) {
                            *d += v;
                        }
                    }
                }
                r0 = r1;
            }
        }
        if self.has_bias {
            for (j, &sl) in slots.iter().enumerate() {
                for row in y[j * t_out * co..(j + 1) * t_out * co].chunks_exact_mut(co) {
                    for (v, b) in row.iter_mut().zip(&self.bias) {
                        *v += b;
                    }
                }
                // As the official code: the tail is taken with the bias, then the bias removed.
                for row in st.partial.get_mut(sl).chunks_exact_mut(co) {
                    for (v, b) in row.iter_mut().zip(&self.bias) {
                        *v = (*v + b) - b;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn det(n: usize, seed: f32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as f32 + seed) * 0.7137).sin() * 0.9 + ((i as f32) * 0.013 + seed).cos() * 0.2
            })
            .collect()
    }

    /// Plain (non-streaming) causal convolution: left zero padding of `history`.
    fn conv_ref(c: &StreamingConv1d, raw_w: &[f32], bias: &[f32], x: &[f32], t: usize) -> Vec<f32> {
        let tp = c.history();
        let t_out = t / c.stride;
        let mut y = vec![0.0; t_out * c.c_out];
        for to in 0..t_out {
            for o in 0..c.c_out {
                let mut acc = bias.get(o).copied().unwrap_or(0.0);
                for i in 0..c.c_in {
                    for k in 0..c.kernel {
                        let v = (to * c.stride + k * c.dilation) as isize - tp as isize;
                        if v >= 0 {
                            acc +=
                                x[v as usize * c.c_in + i] * raw_w[(o * c.c_in + i) * c.kernel + k];
                        }
                    }
                }
                y[to * c.c_out + o] = acc;
            }
        }
        y
    }

    fn convtr_ref(
        c: &StreamingConvTr1d,
        raw_w: &[f32],
        bias: &[f32],
        x: &[f32],
        t: usize,
    ) -> Vec<f32> {
        let t_full = (t - 1) * c.stride + c.kernel;
        let mut y = vec![0.0; t_full * c.c_out];
        for r in 0..t_full {
            y[r * c.c_out..(r + 1) * c.c_out].copy_from_slice(&bias[..c.c_out]);
        }
        for ti in 0..t {
            for k in 0..c.kernel {
                let r = ti * c.stride + k;
                for o in 0..c.c_out {
                    if c.depthwise {
                        y[r * c.c_out + o] += x[ti * c.c_in + o] * raw_w[o * c.kernel + k];
                    } else {
                        for i in 0..c.c_in {
                            y[r * c.c_out + o] +=
                                x[ti * c.c_in + i] * raw_w[(i * c.c_out + o) * c.kernel + k];
                        }
                    }
                }
            }
        }
        y.truncate(t * c.stride * c.c_out);
        y
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() < 1e-4, "index {i}: {x} vs {y}");
        }
    }

    /// Feeds `chunks` (in multiples of the stride) through a streaming conv in
    /// slot `slot` of a 3-slot state, one slot at a time.
    fn run_conv(
        c: &StreamingConv1d,
        x: &[f32],
        chunks: &[usize],
        slot: usize,
        tiny_col: bool,
    ) -> Vec<f32> {
        let mut st = c.new_state(3);
        let mut out = Vec::new();
        let mut pos = 0;
        for &len in chunks {
            let xin = &x[pos * c.c_in..(pos + len) * c.c_in];
            let need = if tiny_col {
                c.kernel * c.c_in
            } else {
                c.col_need(1, len)
            };
            let mut col = vec![0.0; need];
            let mut y = vec![0.0; c.out_len(len) * c.c_out];
            c.forward(&mut st, &[slot], xin, len, &mut col, &mut y);
            out.extend_from_slice(&y);
            pos += len;
        }
        out
    }

    #[test]
    fn conv_chunking_matches_one_call() {
        for &(k, s, d) in &[
            (7, 1, 1),
            (3, 1, 2),
            (8, 4, 1),
            (4, 2, 1),
            (1, 1, 1),
            (3, 1, 4),
        ] {
            let (ci, co, t) = (3, 5, 24 * s);
            let mut c = StreamingConv1d::new("c", ci, co, k, s, d, true, false);
            let w = det(co * ci * k, 1.0);
            let b = det(co, 2.0);
            c.set_weights(&w, Some(&b));
            let x = det(t * ci, 3.0);
            let want = conv_ref(&c, &w, &b, &x, t);
            close(&run_conv(&c, &x, &[t], 0, false), &want);
            // Irregular chunks, some shorter than the history.
            let unit = s;
            let chunks: Vec<usize> = [1, 3, 1, 2, 5, 1, 4].iter().map(|m| m * unit).collect();
            let total: usize = chunks.iter().sum();
            let mut chunks = chunks;
            chunks.push(t - total);
            close(&run_conv(&c, &x, &chunks, 2, false), &want);
            close(&run_conv(&c, &x, &chunks, 1, true), &want);
        }
    }

    #[test]
    fn replicate_padding_uses_first_sample() {
        let (ci, k, s) = (2, 4, 2);
        let mut c = StreamingConv1d::new("c", ci, 1, k, s, 1, false, true);
        let w: Vec<f32> = (0..ci * k).map(|i| i as f32 + 1.0).collect();
        c.set_weights(&w, None);
        let x = det(8 * ci, 0.5);
        // Reference: pad left with x[0] replicated.
        let mut padded = Vec::new();
        for _ in 0..c.history() {
            padded.extend_from_slice(&x[..ci]);
        }
        padded.extend_from_slice(&x);
        let mut c0 = StreamingConv1d::new("c", ci, 1, k, s, 1, false, false);
        c0.set_weights(&w, None);
        let want: Vec<f32> =
            conv_ref(&c0, &w, &[], &padded, padded.len() / ci)[c.history() / s..].to_vec();
        close(&run_conv(&c, &x, &[2, 4, 2], 1, false), &want);
    }

    #[test]
    fn convtr_overlap_add_across_calls() {
        for &(k, s, dw) in &[
            (16, 8, false),
            (4, 2, false),
            (4, 2, true),
            (6, 3, false),
            (5, 5, false),
        ] {
            let (ci, co, t) = (4, if dw { 4 } else { 3 }, 12);
            let mut c = StreamingConvTr1d::new("t", ci, co, k, s, dw, !dw);
            let w = det(if dw { ci * k } else { ci * co * k }, 4.0);
            let b = if dw { vec![0.0; co] } else { det(co, 5.0) };
            c.set_weights(&w, if dw { None } else { Some(&b) });
            let x = det(t * ci, 6.0);
            let want = convtr_ref(&c, &w, &b, &x, t);
            for chunks in [vec![12], vec![1; 12], vec![2, 1, 5, 4]] {
                let mut st = c.new_state(2);
                let mut got = Vec::new();
                let mut pos = 0;
                for &len in &chunks {
                    let mut col = vec![0.0; c.col_need(1, len).max(1)];
                    let mut y = vec![0.0; c.out_len(len) * co];
                    c.forward(
                        &mut st,
                        &[1],
                        &x[pos * ci..(pos + len) * ci],
                        len,
                        &mut col,
                        &mut y,
                    );
                    got.extend_from_slice(&y);
                    pos += len;
                }
                close(&got, &want);
            }
        }
    }

    #[test]
    fn batched_slots_match_single_and_reset_is_fresh() {
        let (ci, co, k, s) = (3, 4, 6, 3);
        let mut c = StreamingConv1d::new("c", ci, co, k, s, 1, true, false);
        c.set_weights(&det(co * ci * k, 7.0), Some(&det(co, 8.0)));
        let t = 6;
        let xa = det(4 * t * ci, 9.0);
        let xb = det(4 * t * ci, 10.0);
        // Slot 2 runs xa, slot 0 runs xb, batched (slot order 2, 0).
        let mut st = c.new_state(3);
        let mut ya = Vec::new();
        let mut yb = Vec::new();
        for f in 0..4 {
            let mut x = xa[f * t * ci..(f + 1) * t * ci].to_vec();
            x.extend_from_slice(&xb[f * t * ci..(f + 1) * t * ci]);
            let mut col = vec![0.0; c.col_need(2, t)];
            let mut y = vec![0.0; 2 * (t / s) * co];
            c.forward(&mut st, &[2, 0], &x, t, &mut col, &mut y);
            ya.extend_from_slice(&y[..(t / s) * co]);
            yb.extend_from_slice(&y[(t / s) * co..]);
        }
        close(&ya, &run_conv(&c, &xa, &[t; 4], 0, false));
        close(&yb, &run_conv(&c, &xb, &[t; 4], 0, false));
        // Reset slot 2 and run xb from the start: same as fresh.
        c.reset(&mut st, 2);
        let mut got = Vec::new();
        for f in 0..4 {
            let mut col = vec![0.0; c.col_need(1, t)];
            let mut y = vec![0.0; (t / s) * co];
            c.forward(
                &mut st,
                &[2],
                &xb[f * t * ci..(f + 1) * t * ci],
                t,
                &mut col,
                &mut y,
            );
            got.extend_from_slice(&y);
        }
        assert_eq!(got, yb);
    }
}
