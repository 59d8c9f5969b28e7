//! Drives the GPU LM alone (user codes in, undelayed frames out), on any
//! device, for the LM fixtures: `lm_tokens_out`, `lm_text_logits` and
//! `lm_tokens_out_slot_reuse` are made by feeding the LM the fixture's Mimi
//! codes directly. Descriptors are computed here as `GpuModel` computes them.

use moshid_kernels::device::{as_bytes, as_bytes_mut, Device};
use moshid_kernels::model::lm::{GpuLm, LmKernels, LmStepIo};
use moshid_kernels::model::tensor::WeightLoader;
use moshid_kernels::model::Precision;
use moshid_kernels::ops::attention::KvType;
use moshid_kernels::ops::types::{RowInfo, SlotStep};
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::lm::{Conditioning, GenParams};

/// The GPU LM with its own step buffers.
pub struct LmDriver<D: Device> {
    pub dev: D,
    lm: GpuLm,
    k: LmKernels,
    max_slots: usize,
    rps: usize,
    dep_q: usize,
    n_user: usize,
    text_card: usize,
    io: LmStepIo,
    offset: Vec<usize>,
    cfg: Vec<Option<f32>>,
}

/// One slot's step result.
pub struct SlotOut {
    /// The undelayed frame, once ready.
    pub tokens: Option<Vec<u32>>,
    /// Text logits after guidance.
    pub logits: Vec<f32>,
}

impl<D: Device> LmDriver<D> {
    /// Loads the LM of a checkpoint folder for `max_slots` slots.
    pub fn load(
        mut dev: D,
        dir: &CheckpointDir,
        precision: Precision,
        kv: KvType,
        max_slots: usize,
    ) -> Self {
        let cfg = &dir.lm;
        let mut w = dir.open_lm_weights().unwrap();
        let conditioning = Conditioning::load(cfg, &mut w).unwrap();
        let lm = {
            let mut loader = WeightLoader::checkpoint(&mut w);
            GpuLm::load(
                &mut dev,
                cfg,
                &mut loader,
                conditioning,
                precision.dtype(),
                kv,
                max_slots,
                max_slots,
            )
            .unwrap()
        };
        w.finish().unwrap();
        let rps = lm.rows_per_slot();
        let rows = max_slots * rps;
        let row = std::mem::size_of::<RowInfo>();
        let io = LmStepIo {
            steps: dev
                .alloc(max_slots * std::mem::size_of::<SlotStep>())
                .unwrap(),
            rows: dev.alloc(rows * row).unwrap(),
            dep_rows: (0..cfg.dep_q)
                .map(|_| dev.alloc(rows * row).unwrap())
                .collect(),
            user_codes: dev.alloc(max_slots * cfg.num_user_codebooks() * 4).unwrap(),
            out: dev.alloc(max_slots * (1 + cfg.dep_q) * 4).unwrap(),
            ready: dev.alloc(max_slots * 4).unwrap(),
        };
        LmDriver {
            k: LmKernels::resolve(&dev).unwrap(),
            dev,
            lm,
            max_slots,
            rps,
            dep_q: cfg.dep_q,
            n_user: cfg.num_user_codebooks(),
            text_card: cfg.text_card,
            io,
            offset: vec![0; max_slots],
            cfg: vec![None; max_slots],
        }
    }

    /// Starts a stream in `slot`.
    pub fn reset(&mut self, slot: usize, p: &GenParams) {
        let guided = self.lm.reset_slot(&mut self.dev, slot, p).unwrap().unwrap();
        self.offset[slot] = 0;
        self.cfg[slot] = guided.then_some(p.cfg_coef);
    }

    /// One step of the slots with `exec` set; `codes` is `[max_slots][n_user]`.
    pub fn step(&mut self, codes: &[u32], exec: &[bool]) -> Vec<Option<SlotOut>> {
        let active: Vec<usize> = (0..self.max_slots).filter(|&s| exec[s]).collect();
        let b = active.len();
        let mut out = (0..self.max_slots).map(|_| None).collect::<Vec<_>>();
        if b == 0 {
            return out;
        }
        let (rps, nu) = (self.rps, self.n_user);
        let mut steps = vec![SlotStep::default(); b];
        let mut rows = vec![RowInfo::default(); b * rps];
        let mut user = vec![0u32; b * nu];
        for (j, &s) in active.iter().enumerate() {
            let t = self.offset[s] as i32;
            steps[j] = SlotStep {
                slot: s as i32,
                active: 1,
                row_cond: (j * rps) as i32,
                row_null: if self.cfg[s].is_some() {
                    (j * rps + 1) as i32
                } else {
                    -1
                },
            };
            for i in 0..rps {
                rows[j * rps + i] = RowInfo {
                    kv: (s * rps + i) as i32,
                    pos: t,
                    last: t,
                    step: j as i32,
                    active: (i == 0 || self.cfg[s].is_some()) as i32,
                };
            }
            user[j * nu..(j + 1) * nu].copy_from_slice(&codes[s * nu..(s + 1) * nu]);
        }
        let dev = &mut self.dev;
        dev.upload(self.io.steps, as_bytes(&steps)).unwrap();
        dev.upload(self.io.rows, as_bytes(&rows)).unwrap();
        for k in 0..self.dep_q {
            let dep: Vec<RowInfo> = rows
                .iter()
                .enumerate()
                .map(|(r, ri)| RowInfo {
                    kv: r as i32,
                    pos: k as i32,
                    last: k as i32,
                    ..*ri
                })
                .collect();
            dev.upload(self.io.dep_rows[k], as_bytes(&dep)).unwrap();
        }
        dev.upload(self.io.user_codes, as_bytes(&user)).unwrap();
        self.lm.issue_step(dev, &self.k, b, &self.io).unwrap();
        dev.synchronize().unwrap();
        let w = 1 + self.dep_q;
        let mut tokens = vec![0u32; b * w];
        let mut ready = vec![0i32; b];
        dev.download(self.io.out, as_bytes_mut(&mut tokens))
            .unwrap();
        dev.download(self.io.ready, as_bytes_mut(&mut ready))
            .unwrap();
        for (j, &s) in active.iter().enumerate() {
            self.offset[s] += 1;
            let tc = self.text_card;
            let mut logits = vec![0.0f32; tc];
            dev.download(self.lm.text_logits_row(j * rps), as_bytes_mut(&mut logits))
                .unwrap();
            if let Some(coef) = self.cfg[s] {
                let mut null = vec![0.0f32; tc];
                dev.download(
                    self.lm.text_logits_row(j * rps + 1),
                    as_bytes_mut(&mut null),
                )
                .unwrap();
                for (o, n) in logits.iter_mut().zip(&null) {
                    *o = n + (*o - n) * coef;
                }
            }
            out[s] = Some(SlotOut {
                tokens: (ready[j] != 0).then(|| tokens[j * w..(j + 1) * w].to_vec()),
                logits,
            });
        }
        out
    }
}
