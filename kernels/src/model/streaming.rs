//! [`GpuModel`]: the engine's `StreamingModel` on a device.
//!
//! One step: the host compacts the active slots into slot-steps `0..n`
//! (bucket `b ≥ n`, padding inactive), writes their descriptors, rows and
//! PCM into the pinned input staging with the bucket's [`Layout`], then the
//! device runs — one copy in, Mimi encode (slots not at end of input),
//! end-of-stream user codes, the LM, Mimi decode (slots whose LM frame is
//! ready), one copy out — replayed from the bucket's captured graph, or
//! issued launch by launch when graphs are off. The host synchronizes once,
//! reads tokens, ready flags and PCM back, and scatters them into the batch.
//!
//! Host mirrors: a slot's offset (steps since reset) and whether it uses
//! guidance are kept on the host too, so every row and descriptor of a step
//! is computed without reading the device; the device's ready flags are
//! checked against them.
//!
//! The first frame of a stream is handled as the CPU backend (and the
//! official server) does: it is encoded and stepped, then the slot's Mimi
//! state is reset. The CPU resets it before that step's decode; here it is
//! reset after the step, which is the same because no model decodes on its
//! first step (`max_delay ≥ 1` is checked at load).
//!
//! Invariants: everything is allocated at load; [`StreamingModel::step`]
//! allocates nothing and makes one synchronisation; batching never mixes
//! slots (every kernel reads only its own slot's state and rows).

use super::io::Layout;
use super::lm::{GpuLm, LmKernels, LmStepIo};
use super::mimi::GpuMimi;
use super::tensor::WeightLoader;
use super::{GpuError, GpuOptions};
use crate::device::{DevPtr, Device, GraphId, HostBuf};
use crate::ops::types::{RowInfo, SlotStep};
use crate::plan::{bucket_for, buckets};
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::config::{LmConfig, MimiConfig};
use moshid_model::lm::Conditioning;
use moshid_model::streaming::{Batch, ModelError, SessionParams, SlotFault, StreamingModel};
use moshid_model::weights::Weights;

/// One bucket: its layout, device pointers and captured graph.
struct BucketPlan {
    layout: Layout,
    lm_io: LmStepIo,
    graph: Option<GraphId>,
}

/// Mimi + LM on a device for `max_slots` streams.
pub struct GpuModel<D: Device> {
    pub(super) dev: D,
    pub(super) lm: GpuLm,
    pub(super) mimi: GpuMimi,
    pub(super) k: LmKernels,
    opts: GpuOptions,
    pub(super) max_slots: usize,
    pub(super) frame_samples: usize,
    pub(super) nq: usize,
    dep_q: usize,
    max_delay: usize,
    card: u32,
    rps: usize,
    buckets: Vec<usize>,
    plans: Vec<BucketPlan>,
    host_in: HostBuf,
    host_out: HostBuf,
    dev_in: DevPtr,
    dev_out: DevPtr,
    user_codes: DevPtr,
    pub(super) offset: Vec<usize>,
    pub(super) cfg_on: Vec<bool>,
    cfg_coef: Vec<f32>,
    pub(super) first_frame: Vec<bool>,
    /// Slot-step index of each slot in the last step, or usize::MAX.
    pub(super) last_step: Vec<usize>,
    /// Active slots of the current step, in slot order.
    active: Vec<usize>,
    /// Prompt prefills (PersonaPlex; see prompt.rs).
    pub(super) prompts: super::prompt::GpuPrompts,
}

fn check_shapes(lm: &LmConfig, nq: usize) -> Result<(), GpuError> {
    if lm.dep_q != nq || lm.num_user_codebooks() != nq {
        return Err(GpuError::Unsupported(format!(
            "generated ({}) and user ({}) codebooks must both equal Mimi's {nq}",
            lm.dep_q,
            lm.num_user_codebooks()
        )));
    }
    if lm.max_delay() == 0 {
        return Err(GpuError::Unsupported(
            "a model whose outputs are ready at its first step (all delays 0)".into(),
        ));
    }
    Ok(())
}

impl<D: Device> GpuModel<D> {
    /// Loads a checkpoint folder onto `dev`.
    pub fn load(mut dev: D, dir: &CheckpointDir, opts: &GpuOptions) -> Result<Self, GpuError> {
        let nq = dir.mimi_codebooks();
        check_shapes(&dir.lm, nq)?;
        let ms = opts.max_slots;
        let mut mw = Weights::open(&dir.mimi_weights)?;
        let mimi = GpuMimi::load(&mut dev, &dir.mimi, &mut mw, nq, ms, ms)?;
        mw.finish()?;
        let mut lw = dir.open_lm_weights()?;
        let conditioning = Conditioning::load(&dir.lm, &mut lw)?;
        let lm = {
            let mut loader = WeightLoader::checkpoint(&mut lw);
            GpuLm::load(
                &mut dev,
                &dir.lm,
                &mut loader,
                conditioning,
                opts.precision.dtype(),
                opts.kv_type(),
                ms,
                ms,
            )?
        };
        lw.finish()?;
        Self::assemble(dev, lm, mimi, opts)
    }

    /// A model of the given shapes with deterministic random weights (for
    /// timing real shapes without a checkpoint).
    pub fn random(
        mut dev: D,
        lm_cfg: &LmConfig,
        mimi_cfg: &MimiConfig,
        seed: u64,
        opts: &GpuOptions,
    ) -> Result<Self, GpuError> {
        let nq = lm_cfg.dep_q;
        check_shapes(lm_cfg, nq)?;
        let ms = opts.max_slots;
        let mimi = GpuMimi::random(&mut dev, mimi_cfg, nq, ms, ms, seed)?;
        let mut loader = WeightLoader::random(&dev, seed)?;
        let lm = GpuLm::load(
            &mut dev,
            lm_cfg,
            &mut loader,
            Conditioning::random(lm_cfg, seed),
            opts.precision.dtype(),
            opts.kv_type(),
            ms,
            ms,
        )?;
        Self::assemble(dev, lm, mimi, opts)
    }

    fn assemble(mut dev: D, lm: GpuLm, mimi: GpuMimi, opts: &GpuOptions) -> Result<Self, GpuError> {
        let ms = opts.max_slots;
        if ms == 0 {
            return Err(GpuError::Unsupported("max_slots must be at least 1".into()));
        }
        let cfg = lm.config().clone();
        let (fs, nq, dep_q, rps) = (
            mimi.frame_samples(),
            mimi.num_codebooks(),
            cfg.dep_q,
            lm.rows_per_slot(),
        );
        let bucket_sizes = buckets(ms, opts.buckets);
        let largest = Layout::new(ms, rps, dep_q, fs);
        let dev_in = dev.alloc(largest.in_bytes)?;
        let dev_out = dev.alloc(largest.out_bytes)?;
        let host_in = dev.alloc_host(largest.in_bytes)?;
        let host_out = dev.alloc_host(largest.out_bytes)?;
        let user_codes = dev.alloc(ms * nq * 4)?;
        let plans = bucket_sizes
            .iter()
            .map(|&b| {
                let layout = Layout::new(b, rps, dep_q, fs);
                let at = |o: usize| dev_in + o as u64;
                BucketPlan {
                    lm_io: LmStepIo {
                        steps: at(layout.steps),
                        rows: at(layout.rows),
                        dep_rows: (0..dep_q).map(|k| at(layout.dep_rows_at(k, rps))).collect(),
                        user_codes,
                        out: dev_out + layout.tokens as u64,
                        ready: dev_out + layout.ready as u64,
                    },
                    layout,
                    graph: None,
                }
            })
            .collect();
        let k = LmKernels::resolve(&dev)?;
        let mut model = GpuModel {
            max_delay: cfg.max_delay(),
            card: cfg.card as u32,
            lm,
            mimi,
            k,
            opts: opts.clone(),
            max_slots: ms,
            frame_samples: fs,
            nq,
            dep_q,
            rps,
            buckets: bucket_sizes,
            plans,
            host_in,
            host_out,
            dev_in,
            dev_out,
            user_codes,
            offset: vec![0; ms],
            cfg_on: vec![false; ms],
            cfg_coef: vec![1.0; ms],
            first_frame: vec![true; ms],
            last_step: vec![usize::MAX; ms],
            active: Vec::with_capacity(ms),
            prompts: super::prompt::GpuPrompts::new(&mut dev, &cfg, fs, nq, ms)?,
            dev,
        };
        for s in 0..ms {
            model.mimi.reset_slot(&mut model.dev, s)?;
        }
        model.dev.synchronize()?;
        Ok(model)
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// The device, mutably: for tools that wrap it (the profiler's mode and
    /// collection). Work issued on it directly is not part of any step.
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.dev
    }

    /// Drops every bucket's captured graph, so that the next step of each
    /// captures anew (the profiler captures its events with the graph).
    /// The old graphs stay allocated on the device until it is dropped.
    pub fn forget_graphs(&mut self) {
        for p in &mut self.plans {
            p.graph = None;
        }
    }

    /// Nodes of the captured graph of the bucket that serves `n` active
    /// slots, when captured and the device counts them.
    pub fn graph_nodes(&self, n: usize) -> Option<usize> {
        let b = bucket_for(&self.buckets, n)?;
        let p = self.buckets.iter().position(|&x| x == b)?;
        self.dev.graph_nodes(self.plans[p].graph?)
    }

    /// The options it was built with.
    pub fn options(&self) -> &GpuOptions {
        &self.opts
    }

    /// Device bytes: (LM weights, Mimi weights, per-slot state).
    pub fn memory(&self) -> (usize, usize, usize) {
        let (l, m) = (self.lm.memory(), self.mimi.memory());
        (l.weights, m.weights, l.kv_per_slot + m.state_per_slot)
    }

    /// The text logits (`text_card` f32, guidance mixed in as the sampler
    /// sees them) of `slot`'s last step, or false when it did not step then.
    /// Synchronous: for tests and diagnostics, not the frame path.
    pub fn text_logits(&mut self, slot: usize, out: &mut [f32]) -> Result<bool, GpuError> {
        let j = match self.last_step.get(slot) {
            Some(&j) if j != usize::MAX => j,
            _ => return Ok(false),
        };
        let tc = self.lm.config().text_card;
        let out = &mut out[..tc];
        let cond_row = self.lm.text_logits_row(j * self.rps);
        self.dev
            .download(cond_row, crate::device::as_bytes_mut(out))?;
        if self.cfg_on[slot] {
            let mut null = vec![0.0f32; tc];
            let null_row = self.lm.text_logits_row(j * self.rps + 1);
            self.dev
                .download(null_row, crate::device::as_bytes_mut(&mut null))?;
            let coef = self.cfg_coef[slot];
            for (o, n) in out.iter_mut().zip(&null) {
                *o = n + (*o - n) * coef;
            }
        }
        Ok(true)
    }

    /// Writes the step descriptors, rows and PCM of the active slots into
    /// the input staging for `layout`.
    fn stage_inputs(&mut self, batch: &Batch, layout: &Layout) {
        let (b, rps, fs) = (layout.bucket, self.rps, self.frame_samples);
        let n = self.active.len();
        let sz_step = std::mem::size_of::<SlotStep>();
        let sz_row = std::mem::size_of::<RowInfo>();
        for j in 0..b {
            let on = j < n;
            let s = if on { self.active[j] } else { 0 };
            let eoi = on && batch.end_of_input[s];
            let t = if on { self.offset[s] } else { 0 };
            let guided = on && self.cfg_on[s];
            let lm_step = SlotStep {
                slot: s as i32,
                active: on as i32,
                row_cond: (j * rps) as i32,
                row_null: if guided { (j * rps + 1) as i32 } else { -1 },
            };
            let enc = SlotStep {
                active: (on && !eoi) as i32,
                row_null: -1,
                ..lm_step
            };
            let dec = SlotStep {
                active: (on && t + 1 > self.max_delay) as i32,
                row_null: -1,
                ..lm_step
            };
            self.host_in
                .view_mut::<SlotStep>(layout.steps + j * sz_step, 1)[0] = lm_step;
            self.host_in
                .view_mut::<SlotStep>(layout.enc_steps + j * sz_step, 1)[0] = enc;
            self.host_in
                .view_mut::<SlotStep>(layout.dec_steps + j * sz_step, 1)[0] = dec;
            self.host_in.view_mut::<i32>(layout.eos + 4 * j, 1)[0] = eoi as i32;
            for i in 0..rps {
                let r = j * rps + i;
                let active = on && (i == 0 || guided);
                let row = RowInfo {
                    kv: (s * rps + i) as i32,
                    pos: t as i32,
                    last: t as i32,
                    step: j as i32,
                    active: active as i32,
                };
                self.host_in
                    .view_mut::<RowInfo>(layout.rows + r * sz_row, 1)[0] = row;
                for k in 0..self.dep_q {
                    let dep = RowInfo {
                        kv: r as i32,
                        pos: k as i32,
                        last: k as i32,
                        ..row
                    };
                    let at = layout.dep_rows_at(k, rps) + r * sz_row;
                    self.host_in.view_mut::<RowInfo>(at, 1)[0] = dep;
                }
            }
            let pcm = self.host_in.view_mut::<f32>(layout.pcm_in + 4 * j * fs, fs);
            if on && !eoi {
                pcm.copy_from_slice(&batch.input_pcm[s * fs..(s + 1) * fs]);
            }
        }
    }

    /// Issues one frame for bucket plan `p` (captured or direct).
    fn issue(&mut self, p: usize) -> Result<(), crate::device::DeviceError> {
        let plan = &self.plans[p];
        let l = &plan.layout;
        let b = l.bucket;
        let dev = &mut self.dev;
        let at = |o: usize| self.dev_in + o as u64;
        dev.copy_to_device(self.dev_in, &self.host_in, 0, l.in_bytes)?;
        self.mimi.encode(
            dev,
            b,
            at(l.enc_steps),
            at(l.pcm_in),
            self.user_codes,
            self.nq,
        )?;
        dev.phase(crate::device::Phase::LmSmall);
        self.k.embed.fill_flagged(
            dev,
            self.user_codes,
            self.nq,
            self.nq,
            at(l.eos),
            b,
            self.card,
        )?;
        self.lm.issue_step(dev, &self.k, b, &plan.lm_io)?;
        let codes = self.dev_out + l.tokens as u64 + 4;
        let pcm_out = self.dev_out + l.pcm_out as u64;
        self.mimi
            .decode(dev, b, at(l.dec_steps), codes, 1 + self.dep_q, pcm_out)?;
        dev.copy_to_host(&self.host_out, 0, self.dev_out, l.out_bytes)?;
        dev.phase(crate::device::Phase::Other);
        Ok(())
    }

    /// Runs bucket plan `p`: directly when graphs are off; with graphs, the
    /// bucket's first step runs directly too (so that libraries initialise
    /// lazily outside any capture) and its graph is captured right after —
    /// capturing runs nothing — to be replayed from the next step on.
    fn run_bucket(&mut self, p: usize) -> Result<(), crate::device::DeviceError> {
        match self.plans[p].graph {
            Some(g) if self.opts.graphs => self.dev.launch_graph(g)?,
            _ => self.issue(p)?,
        }
        self.dev.synchronize()?;
        if self.opts.graphs && self.plans[p].graph.is_none() {
            self.dev.begin_capture()?;
            let issued = self.issue(p);
            let captured = self.dev.end_capture();
            issued?;
            self.plans[p].graph = Some(captured?);
        }
        Ok(())
    }

    /// Moves `slot`'s stream position forward by `steps` without computing
    /// them, so that its attention spans as many positions as after `steps`
    /// real steps (up to the context). **For timing only**: the skipped KV
    /// entries hold whatever the cache held, so the slot's outputs are
    /// meaningless until it is reset.
    pub fn fast_forward_for_timing(&mut self, slot: usize, steps: usize) -> Result<(), GpuError> {
        if slot >= self.max_slots {
            return Err(GpuError::Unsupported(format!(
                "slot {slot} ≥ max_slots {}",
                self.max_slots
            )));
        }
        self.offset[slot] += steps;
        self.lm.set_offset(&mut self.dev, slot, self.offset[slot])?;
        Ok(())
    }
}

fn device_fault(e: impl std::fmt::Display) -> ModelError {
    ModelError::Device(e.to_string())
}

impl<D: Device> StreamingModel for GpuModel<D> {
    fn max_slots(&self) -> usize {
        self.max_slots
    }

    fn fill_context_for_timing(&mut self, slot: usize) -> bool {
        let context = self.lm.config().context;
        self.fast_forward_for_timing(slot, context).is_ok()
    }

    fn frame_samples(&self) -> usize {
        self.frame_samples
    }

    fn audio_codebooks(&self) -> usize {
        self.dep_q
    }

    fn reset_slot(&mut self, slot: usize, params: &SessionParams) -> Result<(), ModelError> {
        if slot >= self.max_slots {
            return Err(ModelError::SlotOutOfRange {
                slot,
                max_slots: self.max_slots,
            });
        }
        let guided = self
            .lm
            .reset_slot(&mut self.dev, slot, &params.gen)
            .map_err(device_fault)?
            .map_err(|e| ModelError::Params(e.to_string()))?;
        self.mimi
            .reset_slot(&mut self.dev, slot)
            .map_err(device_fault)?;
        self.cfg_on[slot] = guided;
        self.cfg_coef[slot] = params.gen.cfg_coef;
        self.offset[slot] = 0;
        self.first_frame[slot] = true;
        self.last_step[slot] = usize::MAX;
        self.prompts.reset(slot);
        Ok(())
    }

    fn takes_prompts(&self) -> bool {
        self.prompts.needed()
    }

    fn begin_prompt(
        &mut self,
        slot: usize,
        prompt: &moshid_model::streaming::Prompt,
    ) -> Result<(), ModelError> {
        self.begin_prompt_impl(slot, prompt)
    }

    fn prompt_chunk(
        &mut self,
        slot: usize,
        max_frames: usize,
    ) -> Result<moshid_model::streaming::PromptProgress, ModelError> {
        self.prompt_chunk_impl(slot, max_frames)
    }

    fn snapshot_slot(
        &mut self,
        slot: usize,
    ) -> Result<moshid_model::streaming::SlotSnapshot, ModelError> {
        self.snapshot_impl(slot)
    }

    fn restore_slot(
        &mut self,
        slot: usize,
        snap: &moshid_model::streaming::SlotSnapshot,
    ) -> Result<(), ModelError> {
        self.restore_impl(slot, snap)
    }

    fn step(&mut self, batch: &mut Batch) -> Result<(), ModelError> {
        let fs = self.frame_samples;
        if batch.max_slots() != self.max_slots || batch.frame_samples() != fs {
            return Err(ModelError::BatchShape(format!(
                "batch of {} slots × {} samples for a model of {} × {fs}",
                batch.max_slots(),
                batch.frame_samples(),
                self.max_slots
            )));
        }
        self.active.clear();
        for s in 0..self.max_slots {
            batch.fault[s] = None;
            batch.has_output[s] = false;
            if batch.exec[s] && !self.prompts.ready(s) {
                batch.fault[s] = Some(SlotFault::NoPrompt);
            } else if batch.exec[s] {
                self.active.push(s);
            }
        }
        let n = self.active.len();
        let Some(bucket) = bucket_for(&self.buckets, n) else {
            return Ok(());
        };
        let p = self
            .buckets
            .iter()
            .position(|&b| b == bucket)
            .expect("bucket_for returns one of the buckets");
        let layout = self.plans[p].layout;
        self.stage_inputs(batch, &layout);
        self.run_bucket(p).map_err(device_fault)?;
        let width = 1 + self.dep_q;
        for j in 0..n {
            let s = self.active[j];
            let ready = self.host_out.view::<i32>(layout.ready + 4 * j, 1)[0] != 0;
            debug_assert_eq!(ready, self.offset[s] + 1 > self.max_delay);
            self.offset[s] += 1;
            self.last_step[s] = j;
            if ready {
                let t = self
                    .host_out
                    .view::<u32>(layout.tokens + 4 * j * width, width);
                batch.text_token[s] = t[0];
                let nc = batch.audio_codebooks();
                batch.audio_codes[s * nc..(s + 1) * nc].copy_from_slice(&t[1..1 + nc]);
                let pcm = self.host_out.view::<f32>(layout.pcm_out + 4 * j * fs, fs);
                if pcm.iter().all(|x| x.is_finite()) {
                    batch.output_pcm[s * fs..(s + 1) * fs].copy_from_slice(pcm);
                    batch.has_output[s] = true;
                } else {
                    batch.fault[s] = Some(SlotFault::NonFinite);
                }
            }
        }
        for j in 0..n {
            let s = self.active[j];
            if std::mem::take(&mut self.first_frame[s]) {
                self.mimi
                    .reset_slot(&mut self.dev, s)
                    .map_err(device_fault)?;
            }
        }
        Ok(())
    }
}
