//! The SEANet encoder and decoder on the device (CPU reference:
//! model/src/mimi/seanet.rs, whose block structure and tensor names this
//! mirrors): encoder `conv, [res…, ELU, down-conv] per ratio (reversed),
//! ELU, conv`; decoder `conv, [ELU, tr-conv, res…] per ratio, ELU, conv`; a
//! residual block is `x + conv₁ₓ₁(ELU(conv_k,dil(ELU(x))))` (or a 1×1
//! shortcut conv of x when `true_skip` is false).
//!
//! Every ELU runs inside the conv that follows it (the convs apply it to
//! the inputs they read), and a residual block's skip inside its last conv
//! (which adds it to its outputs), so a block is two or three conv launches
//! and no element-wise pass.
//!
//! Invariants: activations are time-major `[n][t][c]`; the network reads its
//! input buffer only through its convs (so the caller's PCM is never
//! written) and may write its last conv straight into the caller's output;
//! in between it ping-pongs between the scratch buffers `a` and `b`, with
//! `t1` for the residual branches, `tail` for transposed convs and `part`
//! for split-K partial sums. Only active steps' slots are read or written.

use super::conv::{ConvAct, GpuConv, GpuConvTr};
use super::weights::{Mem, Source};
use crate::device::{DevPtr, Device, DeviceResult};
use crate::model::GpuError;
use crate::ops::conv::{ConvKernels, ConvShape, ConvTrShape};
use crate::ops::elementwise::EwKernels;
use moshid_model::config::SeanetConfig;
use moshid_model::weights::TensorSpec;

#[derive(Debug, Clone, Copy)]
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

/// The scratch buffers a SEANet call works in (each of [`GpuSeanet::act_need`]
/// floats, `tail` of [`GpuSeanet::tail_need`], `part` of
/// [`GpuSeanet::part_need`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeanetBufs {
    pub(crate) a: DevPtr,
    pub(crate) b: DevPtr,
    pub(crate) t1: DevPtr,
    pub(crate) tail: DevPtr,
    pub(crate) part: DevPtr,
}

/// A SEANet encoder or decoder.
#[derive(Debug, Clone)]
pub(crate) struct GpuSeanet {
    convs: Vec<GpuConv>,
    convtrs: Vec<GpuConvTr>,
    blocks: Vec<Block>,
    c_in: usize,
}

struct Builder {
    prefix: &'static str,
    idx: usize,
    net: GpuSeanet,
}

fn shape(c_in: usize, c_out: usize, kernel: usize, stride: usize, dilation: usize) -> ConvShape {
    ConvShape {
        c_in,
        c_out,
        kernel,
        stride,
        dilation,
    }
}

impl Builder {
    fn push_conv(&mut self, name: String, s: ConvShape) -> usize {
        self.net.convs.push(GpuConv::new(name, s, true, false));
        self.net.convs.len() - 1
    }

    fn conv(&mut self, c_in: usize, c_out: usize, kernel: usize, stride: usize) {
        let name = format!("{}.{}.conv.conv", self.prefix, self.idx);
        let i = self.push_conv(name, shape(c_in, c_out, kernel, stride, 1));
        self.net.blocks.push(Block::Conv(i));
        self.idx += 1;
    }

    fn convtr(&mut self, c_in: usize, c_out: usize, kernel: usize, stride: usize) {
        let name = format!("{}.{}.convtr.convtr", self.prefix, self.idx);
        let s = ConvTrShape {
            c_in,
            c_out,
            kernel,
            stride,
            depthwise: false,
        };
        self.net.convtrs.push(GpuConvTr::new(name, s, true));
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
        let k = cfg.residual_kernel_size;
        let conv1 = self.push_conv(
            format!("{p}.block.1.conv.conv"),
            shape(dim, hidden, k, 1, dilation),
        );
        let conv2 = self.push_conv(
            format!("{p}.block.3.conv.conv"),
            shape(hidden, dim, 1, 1, 1),
        );
        let shortcut = (!cfg.true_skip)
            .then(|| self.push_conv(format!("{p}.shortcut.conv.conv"), shape(dim, dim, 1, 1, 1)));
        self.net.blocks.push(Block::Res {
            conv1,
            conv2,
            shortcut,
        });
        self.idx += 1;
    }
}

impl GpuSeanet {
    fn builder(prefix: &'static str, c_in: usize) -> Builder {
        Builder {
            prefix,
            idx: 0,
            net: GpuSeanet {
                convs: Vec::new(),
                convtrs: Vec::new(),
                blocks: Vec::new(),
                c_in,
            },
        }
    }

    /// The encoder (`encoder.model.*`): audio `[t][channels]` → `[t/hop][dimension]`.
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

    /// The decoder (`decoder.model.*`): `[t][dimension]` → audio `[t·hop][channels]`.
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
                    for c in [Some(conv1), Some(conv2), shortcut].into_iter().flatten() {
                        self.convs[c].specs(out);
                    }
                }
            }
        }
    }

    pub(crate) fn load<D: Device + ?Sized>(
        &mut self,
        dev: &mut D,
        mem: &mut Mem,
        src: &mut dyn Source,
        max_slots: usize,
    ) -> Result<(), GpuError> {
        for c in &mut self.convs {
            c.load(dev, mem, src, max_slots)?;
        }
        for c in &mut self.convtrs {
            c.load(dev, mem, src, max_slots)?;
        }
        Ok(())
    }

    /// State bytes per slot.
    pub(crate) fn state_bytes(&self) -> usize {
        self.convs.iter().map(GpuConv::state_bytes).sum::<usize>()
            + self
                .convtrs
                .iter()
                .map(GpuConvTr::state_bytes)
                .sum::<usize>()
    }

    /// Floats of each activation buffer for `n` steps of `t_in` input steps.
    pub(crate) fn act_need(&self, n: usize, t_in: usize) -> usize {
        let (mut t, mut c) = (t_in, self.c_in);
        let mut act = n * t * c;
        for block in &self.blocks {
            match *block {
                Block::Conv(i) => {
                    t = self.convs[i].shape.t_out(t);
                    c = self.convs[i].shape.c_out;
                }
                Block::ConvTr(i) => {
                    t = self.convtrs[i].shape.t_out(t);
                    c = self.convtrs[i].shape.c_out;
                }
                Block::Elu => {}
                Block::Res { conv1, .. } => act = act.max(n * t * self.convs[conv1].shape.c_out),
            }
            act = act.max(n * t * c);
        }
        act
    }

    /// Floats of the transposed-conv tail scratch for `n` steps.
    pub(crate) fn tail_need(&self, n: usize) -> usize {
        self.convtrs
            .iter()
            .map(|c| c.tail_need(n))
            .max()
            .unwrap_or(0)
    }

    /// Floats of the split-K scratch for `n` steps of `t_in` input steps
    /// (the largest any conv of the network needs).
    pub(crate) fn part_need(&self, n: usize, t_in: usize) -> usize {
        let mut t = t_in;
        let mut need = 0;
        for block in &self.blocks {
            match *block {
                Block::Conv(i) => {
                    need = need.max(self.convs[i].part_need(n, t));
                    t = self.convs[i].shape.t_out(t);
                }
                Block::ConvTr(i) => {
                    need = need.max(self.convtrs[i].part_need(n, t));
                    t = self.convtrs[i].shape.t_out(t);
                }
                Block::Elu => {}
                Block::Res {
                    conv1,
                    conv2,
                    shortcut,
                } => {
                    for c in [Some(conv1), Some(conv2), shortcut].into_iter().flatten() {
                        need = need.max(self.convs[c].part_need(n, t));
                    }
                }
            }
        }
        need
    }

    /// Output steps for `t_in` input steps.
    pub(crate) fn t_out(&self, t_in: usize) -> usize {
        self.blocks.iter().fold(t_in, |t, b| match *b {
            Block::Conv(i) => self.convs[i].shape.t_out(t),
            Block::ConvTr(i) => self.convtrs[i].shape.t_out(t),
            _ => t,
        })
    }

    /// Runs the network for `n` steps on `input` (`[n][t_in][c_in]`, only
    /// read). The last block, if a conv, writes into `out` when given.
    /// Returns where the result is (`out`, `bufs.a` or `bufs.b`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        ck: &ConvKernels,
        ew: &EwKernels,
        n: usize,
        t_in: usize,
        steps: DevPtr,
        input: DevPtr,
        out: Option<DevPtr>,
        bufs: &SeanetBufs,
    ) -> DeviceResult<DevPtr> {
        let (mut t, mut c) = (t_in, self.c_in);
        let mut cur = input;
        let other = |cur: DevPtr| if cur == bufs.a { bufs.b } else { bufs.a };
        let last = self.blocks.len().saturating_sub(1);
        let plain = ConvAct::plain(bufs.part);
        let elu = ConvAct { elu: true, ..plain };
        // An ELU waiting for the conv after it.
        let mut pending_elu = false;
        for (bi, block) in self.blocks.iter().enumerate() {
            let act = if pending_elu { elu } else { plain };
            match *block {
                Block::Elu if bi < last && self.fuses_elu(bi + 1) => pending_elu = true,
                Block::Elu => {
                    // In place, except on the caller's input.
                    let dst = if cur == input { other(cur) } else { cur };
                    ew.elu(dev, cur, dst, n * t * c)?;
                    cur = dst;
                }
                Block::Conv(i) => {
                    let cv = &self.convs[i];
                    let dst = match out {
                        Some(o) if bi == last => o,
                        _ => other(cur),
                    };
                    cv.forward(dev, ck, n, t, steps, cur, dst, &act)?;
                    t = cv.shape.t_out(t);
                    c = cv.shape.c_out;
                    cur = dst;
                }
                Block::ConvTr(i) => {
                    let cv = &self.convtrs[i];
                    let dst = other(cur);
                    cv.forward(dev, ck, n, t, steps, cur, dst, bufs.tail, &act)?;
                    t = cv.shape.t_out(t);
                    c = cv.shape.c_out;
                    cur = dst;
                }
                Block::Res {
                    conv1,
                    conv2,
                    shortcut,
                } => {
                    let (c1, c2) = (&self.convs[conv1], &self.convs[conv2]);
                    // The block's own ELUs: before conv1 (of x) and conv2.
                    c1.forward(
                        dev,
                        ck,
                        n,
                        t,
                        steps,
                        cur,
                        bufs.t1,
                        &ConvAct { elu: true, ..act },
                    )?;
                    let dst = other(cur);
                    let skip = match shortcut {
                        Some(s) => {
                            self.convs[s].forward(dev, ck, n, t, steps, cur, dst, &act)?;
                            dst
                        }
                        None => cur,
                    };
                    let res = ConvAct {
                        elu: true,
                        res: skip,
                        part: bufs.part,
                    };
                    c2.forward(dev, ck, n, t, steps, bufs.t1, dst, &res)?;
                    cur = dst;
                }
            }
            if !matches!(block, Block::Elu) {
                pending_elu = false;
            }
        }
        Ok(cur)
    }

    /// Whether block `i` applies a preceding ELU itself (a conv or a dense
    /// transposed conv; not a residual block, whose input feeds its skip
    /// unchanged).
    fn fuses_elu(&self, i: usize) -> bool {
        match self.blocks[i] {
            Block::Conv(_) => true,
            Block::ConvTr(c) => !self.convtrs[c].shape.depthwise,
            _ => false,
        }
    }

    /// Issues the reset of `slot`.
    pub(crate) fn reset<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        slot: usize,
        one: DevPtr,
    ) -> DeviceResult<()> {
        for c in &self.convs {
            c.reset(dev, slot, one)?;
        }
        for c in &self.convtrs {
            c.reset(dev, slot)?;
        }
        Ok(())
    }
}
