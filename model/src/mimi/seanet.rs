//! The SEANet encoder and decoder (official `SEANetEncoder` /
//! `SEANetDecoder`, causal, no norm, constant padding, ELU), streaming and
//! batched over the active slots.
//!
//! Layout follows the official `nn.Sequential` so tensor names match:
//! encoder `conv, [res…, ELU, down-conv] per ratio (reversed), ELU, conv`;
//! decoder `conv, [ELU, tr-conv, res…] per ratio, ELU, conv`. A residual block
//! is `x + conv₁ₓ₁(ELU(conv_k,dil(ELU(x))))` (or a 1×1 shortcut conv when
//! `true_skip` is false).
//!
//! Invariants: activations are time-major `[n][t][c]` in [`Buffers::a`] on
//! entry and on exit; the other buffers are scratch, sized by
//! [`Seanet::scratch_need`]; only the listed slots' states change.

use super::act::{elu_inplace, elu_into};
use super::conv::{ConvState, ConvTrState, StreamingConv1d, StreamingConvTr1d};
use crate::config::SeanetConfig;
use crate::weights::{CheckpointError, TensorSpec, Weights};

/// Activation scratch shared by the SEANets and the resamplers.
#[derive(Debug, Clone)]
pub(crate) struct Buffers {
    /// Current activation.
    pub(crate) a: Vec<f32>,
    /// Next activation.
    pub(crate) b: Vec<f32>,
    /// Residual-branch scratch.
    pub(crate) t1: Vec<f32>,
    /// Residual-branch scratch (hidden width).
    pub(crate) t2: Vec<f32>,
    /// im2col / transposed-conv products.
    pub(crate) col: Vec<f32>,
}

impl Buffers {
    pub(crate) fn new(act: usize, col: usize) -> Self {
        Buffers {
            a: vec![0.0; act],
            b: vec![0.0; act],
            t1: vec![0.0; act],
            t2: vec![0.0; act],
            col: vec![0.0; col],
        }
    }
}

#[derive(Debug, Clone)]
enum Block {
    Conv(usize),
    ConvTr(usize),
    Elu,
    Res {
        conv1: usize,
        conv2: usize,
        shortcut: Option<usize>,
    },
}

/// A SEANet encoder or decoder.
#[derive(Debug, Clone)]
pub(crate) struct Seanet {
    convs: Vec<StreamingConv1d>,
    convtrs: Vec<StreamingConvTr1d>,
    blocks: Vec<Block>,
    /// Channels of the input.
    c_in: usize,
}

/// Per-slot state of a [`Seanet`].
#[derive(Debug, Clone)]
pub(crate) struct SeanetState {
    convs: Vec<ConvState>,
    convtrs: Vec<ConvTrState>,
}

struct Builder {
    prefix: &'static str,
    idx: usize,
    net: Seanet,
}

impl Builder {
    fn conv(&mut self, c_in: usize, c_out: usize, kernel: usize, stride: usize) {
        let name = format!("{}.{}.conv.conv", self.prefix, self.idx);
        self.net.convs.push(StreamingConv1d::new(
            name, c_in, c_out, kernel, stride, 1, true, false,
        ));
        self.net.blocks.push(Block::Conv(self.net.convs.len() - 1));
        self.idx += 1;
    }

    fn convtr(&mut self, c_in: usize, c_out: usize, kernel: usize, stride: usize) {
        let name = format!("{}.{}.convtr.convtr", self.prefix, self.idx);
        self.net.convtrs.push(StreamingConvTr1d::new(
            name, c_in, c_out, kernel, stride, false, true,
        ));
        self.net
            .blocks
            .push(Block::ConvTr(self.net.convtrs.len() - 1));
        self.idx += 1;
    }

    fn elu(&mut self) {
        self.net.blocks.push(Block::Elu);
        self.idx += 1;
    }

    fn res(&mut self, cfg: &SeanetConfig, dim: usize, dilation: usize) {
        let p = format!("{}.{}", self.prefix, self.idx);
        let hidden = dim / cfg.compress;
        let convs = &mut self.net.convs;
        convs.push(StreamingConv1d::new(
            format!("{p}.block.1.conv.conv"),
            dim,
            hidden,
            cfg.residual_kernel_size,
            1,
            dilation,
            true,
            false,
        ));
        convs.push(StreamingConv1d::new(
            format!("{p}.block.3.conv.conv"),
            hidden,
            dim,
            1,
            1,
            1,
            true,
            false,
        ));
        let shortcut = if cfg.true_skip {
            None
        } else {
            convs.push(StreamingConv1d::new(
                format!("{p}.shortcut.conv.conv"),
                dim,
                dim,
                1,
                1,
                1,
                true,
                false,
            ));
            Some(convs.len() - 1)
        };
        let base = convs.len() - if shortcut.is_some() { 3 } else { 2 };
        self.net.blocks.push(Block::Res {
            conv1: base,
            conv2: base + 1,
            shortcut,
        });
        self.idx += 1;
    }
}

impl Seanet {
    fn builder(prefix: &'static str, c_in: usize) -> Builder {
        Builder {
            prefix,
            idx: 0,
            net: Seanet {
                convs: Vec::new(),
                convtrs: Vec::new(),
                blocks: Vec::new(),
                c_in,
            },
        }
    }

    /// The encoder (`encoder.model.*`): audio `[t][channels]` → latent `[t/hop][dimension]`.
    pub(crate) fn encoder(cfg: &SeanetConfig) -> Self {
        let nf = cfg.n_filters;
        let mut b = Self::builder("encoder.model", cfg.channels);
        b.conv(cfg.channels, nf, cfg.kernel_size, 1);
        let mut mult = 1;
        for &ratio in cfg.ratios.iter().rev() {
            for j in 0..cfg.n_residual_layers {
                b.res(cfg, mult * nf, cfg.dilation_base.pow(j as u32));
            }
            b.elu();
            b.conv(mult * nf, mult * nf * 2, ratio * 2, ratio);
            mult *= 2;
        }
        b.elu();
        b.conv(mult * nf, cfg.dimension, cfg.last_kernel_size, 1);
        b.net
    }

    /// The decoder (`decoder.model.*`): latent `[t][dimension]` → audio `[t·hop][channels]`.
    pub(crate) fn decoder(cfg: &SeanetConfig) -> Self {
        let nf = cfg.n_filters;
        let mut mult = 1usize << cfg.ratios.len();
        let mut b = Self::builder("decoder.model", cfg.dimension);
        b.conv(cfg.dimension, mult * nf, cfg.kernel_size, 1);
        for &ratio in &cfg.ratios {
            b.elu();
            b.convtr(mult * nf, mult * nf / 2, ratio * 2, ratio);
            for j in 0..cfg.n_residual_layers {
                b.res(cfg, mult * nf / 2, cfg.dilation_base.pow(j as u32));
            }
            mult /= 2;
        }
        b.elu();
        b.conv(nf, cfg.channels, cfg.last_kernel_size, 1);
        b.net
    }

    pub(crate) fn specs(&self, out: &mut Vec<TensorSpec>) {
        // In checkpoint order (block by block); within a block, conv order.
        for block in &self.blocks {
            match *block {
                Block::Conv(i) => self.convs[i].specs(out),
                Block::ConvTr(i) => self.convtrs[i].specs(out),
                Block::Elu => {}
                Block::Res {
                    conv1,
                    conv2,
                    shortcut,
                } => {
                    self.convs[conv1].specs(out);
                    self.convs[conv2].specs(out);
                    if let Some(s) = shortcut {
                        self.convs[s].specs(out);
                    }
                }
            }
        }
    }

    pub(crate) fn load(&mut self, weights: &mut Weights) -> Result<(), CheckpointError> {
        for c in &mut self.convs {
            c.load(weights)?;
        }
        for c in &mut self.convtrs {
            c.load(weights)?;
        }
        Ok(())
    }

    pub(crate) fn new_state(&self, max_slots: usize) -> SeanetState {
        SeanetState {
            convs: self.convs.iter().map(|c| c.new_state(max_slots)).collect(),
            convtrs: self
                .convtrs
                .iter()
                .map(|c| c.new_state(max_slots))
                .collect(),
        }
    }

    pub(crate) fn reset(&self, st: &mut SeanetState, slot: usize) {
        for (c, s) in self.convs.iter().zip(&mut st.convs) {
            c.reset(s, slot);
        }
        for (c, s) in self.convtrs.iter().zip(&mut st.convtrs) {
            c.reset(s, slot);
        }
    }

    /// `(activation floats, column floats)` needed for `n` slots of `t_in` steps.
    pub(crate) fn scratch_need(&self, n: usize, t_in: usize) -> (usize, usize) {
        let (mut t, mut c) = (t_in, self.c_in);
        let (mut act, mut col) = (n * t * c, 0);
        for block in &self.blocks {
            match *block {
                Block::Conv(i) => {
                    let cv = &self.convs[i];
                    col = col.max(cv.col_need(n, t));
                    t = cv.out_len(t);
                    c = cv.c_out;
                }
                Block::ConvTr(i) => {
                    let cv = &self.convtrs[i];
                    col = col.max(cv.col_need(n, t));
                    t = cv.out_len(t);
                    c = cv.c_out;
                }
                Block::Elu => {}
                Block::Res {
                    conv1,
                    conv2,
                    shortcut,
                } => {
                    for k in [Some(conv1), Some(conv2), shortcut].into_iter().flatten() {
                        let cv = &self.convs[k];
                        col = col.max(cv.col_need(n, t));
                        act = act.max(n * t * cv.c_out);
                    }
                }
            }
            act = act.max(n * t * c);
        }
        (act, col)
    }

    /// Runs the network on `[n][t_in][c_in]` in `bufs.a` for `slots`; the
    /// result `[n][t_out][c_out]` is left in `bufs.a`. Returns `t_out`.
    pub(crate) fn forward(
        &self,
        st: &mut SeanetState,
        slots: &[usize],
        bufs: &mut Buffers,
        t_in: usize,
    ) -> usize {
        let n = slots.len();
        let (mut t, mut c) = (t_in, self.c_in);
        let Buffers { a, b, t1, t2, col } = bufs;
        for block in &self.blocks {
            match *block {
                Block::Elu => {
                    elu_inplace(&mut a[..n * t * c]);
                }
                Block::Conv(i) => {
                    let cv = &self.convs[i];
                    let t_out = cv.out_len(t);
                    cv.forward(&mut st.convs[i], slots, a, t, col, b);
                    std::mem::swap(a, b);
                    t = t_out;
                    c = cv.c_out;
                }
                Block::ConvTr(i) => {
                    let cv = &self.convtrs[i];
                    let t_out = cv.out_len(t);
                    cv.forward(&mut st.convtrs[i], slots, a, t, col, b);
                    std::mem::swap(a, b);
                    t = t_out;
                    c = cv.c_out;
                }
                Block::Res {
                    conv1,
                    conv2,
                    shortcut,
                } => {
                    let len = n * t * c;
                    elu_into(&mut t1[..len], &a[..len]);
                    let c1 = &self.convs[conv1];
                    c1.forward(&mut st.convs[conv1], slots, t1, t, col, t2);
                    elu_inplace(&mut t2[..n * t * c1.c_out]);
                    self.convs[conv2].forward(&mut st.convs[conv2], slots, t2, t, col, t1);
                    match shortcut {
                        Some(s) => {
                            self.convs[s].forward(&mut st.convs[s], slots, a, t, col, b);
                            for ((x, u), v) in a[..len].iter_mut().zip(&b[..len]).zip(&t1[..len]) {
                                *x = u + v;
                            }
                        }
                        None => {
                            for (x, v) in a[..len].iter_mut().zip(&t1[..len]) {
                                *x += v;
                            }
                        }
                    }
                }
            }
        }
        t
    }
}
