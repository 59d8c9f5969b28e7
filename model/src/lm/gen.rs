//! Per-slot generation state and the batched step (`LMGen._step`): the
//! delayed token cache, offsets, execution mask, resets, guidance rows and
//! sampling.
//!
//! Token cache: per slot, `num_codebooks × (max_delay + 2)` entries used as a
//! ring per codebook (the official `cache`). At offset `t` user codebook `k`
//! is written at `(t + delay[k]) % CT`; the input of codebook `k` is the
//! initial token while `t <= delay[k]`, else entry `t % CT`; the sampled text
//! and audio tokens are written at `(t + 1) % CT`; the output of a slot whose
//! new offset `t + 1 > max_delay` is entry `(t + 1 − max_delay + delay[k]) % CT`
//! for the text and the `dep_q` generated codebooks.
//!
//! PersonaPlex (NVIDIA's `LMGen`, see [`super::persona`]) differs in two
//! ways, both kept here so that one step serves both families: the user's
//! codes of step `t` are written one entry later, at `(t + delay[k] + 1) %
//! CT` (the ring is one entry longer), and a token ring entry can be
//! *forced* (NVIDIA's `provided`): when the entry the step would write
//! (`(t + 1) % CT`) is forced, the text token or depformer step takes the
//! stored value instead of the sampled one (and feeds it to the next
//! depformer step); the flags of entry `t % CT` are cleared after the step.
//! Only a prompt prefill forces entries; for Kyutai's models none is ever
//! set and the step is moshi 0.2.13's.
//!
//! Rows: an active slot contributes one row, two with guidance (conditioned
//! row first, null row second, adjacent). Temporal KV cache row of slot `s`,
//! sub-row `j` is `s · rows_per_slot + j`; the depformer's per-frame cache is
//! indexed by batch row.

use super::conditioner::cfg_mix;
use super::linear::linear;
use super::sampling::{slot_rng, Sampler, SlotRng};
use super::text_rules::{self, SkippedIds, TextHistory, TextRules};
use super::transformer::{AttnRow, StackScratch};
use super::{GenParams, Lm, LmStepOutput, ParamError};
use crate::alloc::{self, AllocError};
use crate::ops::rms_norm;

/// A cache entry that was never written (the official `ungenerated_token_id`);
/// never read back by construction.
const UNGENERATED: u32 = u32::MAX;

struct Slot {
    /// Steps run since the last reset.
    offset: usize,
    /// `[num_codebooks, CT]` token ring.
    cache: Vec<u32>,
    /// `[num_codebooks, CT]`: entries a prompt forced (PersonaPlex).
    forced: Vec<bool>,
    /// Guidance coefficient when guidance is on.
    cfg_coef: Option<f32>,
    text: Sampler,
    audio: Sampler,
    rng: SlotRng,
    rules: TextRules,
    history: TextHistory,
}

struct Scratch {
    /// Active slots, in slot order.
    active: Vec<usize>,
    /// First batch row of each active slot.
    row0: Vec<usize>,
    /// Active-slot index of each batch row.
    row_slot: Vec<usize>,
    /// Temporal attention rows.
    rows: Vec<AttnRow>,
    /// Depformer attention rows.
    dep_rows: Vec<AttnRow>,
    /// Input tokens `[active, num_codebooks]`.
    tokens: Vec<u32>,
    x: Vec<f32>,
    tout: Vec<f32>,
    text_logits: Vec<f32>,
    dx: Vec<f32>,
    tmp: Vec<f32>,
    dlogits: Vec<f32>,
    mix: Vec<f32>,
    /// Previous token of each active slot (depformer input).
    prev: Vec<u32>,
    /// Sampled text token of each active slot.
    text: Vec<u32>,
    /// Sampled audio tokens `[active, dep_q]`.
    audio: Vec<u32>,
    cand: Vec<(f64, u32)>,
    /// The repetition penalty's scratch (`text_card`, all false).
    seen: Vec<bool>,
    stack: StackScratch,
    cond_tmp: Vec<f32>,
    /// The unused guidance vector of a model without guidance rows.
    null_tmp: Vec<f32>,
    dep_kv: Vec<f32>,
}

/// Scratch of a prefill pass (models with a prompt prefill only).
pub(crate) struct PrefillScratch {
    pub(crate) x: Vec<f32>,
    pub(crate) tout: Vec<f32>,
    pub(crate) rows: Vec<AttnRow>,
    stack: StackScratch,
}

/// All per-slot state of a batch and every scratch buffer of a step.
pub struct LmState {
    max_slots: usize,
    rows_per_slot: usize,
    slots: Vec<Slot>,
    /// Fused condition vector of each KV row `[max_slots · rows_per_slot, dim]`.
    cond: Vec<f32>,
    /// Temporal KV cache `[max_slots · rows_per_slot, kv_row_len]`.
    kv: Vec<f32>,
    sc: Scratch,
    /// Empty for models without a prompt prefill.
    pf: PrefillScratch,
}

impl LmState {
    /// Slots in the state.
    pub fn max_slots(&self) -> usize {
        self.max_slots
    }

    /// Steps slot `slot` has run since its last reset.
    pub fn offset(&self, slot: usize) -> usize {
        self.slots[slot].offset
    }

    /// Whether the slot runs with classifier-free guidance (two rows).
    pub fn uses_cfg(&self, slot: usize) -> bool {
        self.slots[slot].cfg_coef.is_some()
    }

    pub(crate) fn rows_per_slot(&self) -> usize {
        self.rows_per_slot
    }

    pub(crate) fn prefill_scratch(&mut self) -> &mut PrefillScratch {
        &mut self.pf
    }

    /// The pass's rows, its scratch and the KV caches, borrowed together.
    pub(crate) fn prefill_parts(
        &mut self,
    ) -> (&mut [f32], &[AttnRow], &mut StackScratch, &mut [f32]) {
        (
            &mut self.pf.x,
            &self.pf.rows,
            &mut self.pf.stack,
            &mut self.kv,
        )
    }

    fn kv_row_len(&self) -> usize {
        self.kv.len() / (self.max_slots * self.rows_per_slot).max(1)
    }

    pub(crate) fn kv_row(&self, row: usize) -> &[f32] {
        let n = self.kv_row_len();
        &self.kv[row * n..(row + 1) * n]
    }

    pub(crate) fn kv_row_mut(&mut self, row: usize) -> &mut [f32] {
        let n = self.kv_row_len();
        &mut self.kv[row * n..(row + 1) * n]
    }

    /// The slot's token ring and forced flags.
    pub(crate) fn ring(&self, slot: usize) -> (&[u32], &[bool]) {
        let s = &self.slots[slot];
        (&s.cache, &s.forced)
    }

    /// Gives the slot a token ring, forced flags and offset (a prefill's).
    pub(crate) fn set_ring(&mut self, slot: usize, offset: usize, cache: &[u32], forced: &[bool]) {
        let s = &mut self.slots[slot];
        s.offset = offset;
        s.cache.copy_from_slice(cache);
        s.forced.copy_from_slice(forced);
    }
}

impl Lm {
    /// Rows per slot: two when the model has conditioners (guidance possible).
    fn rows_per_slot(&self) -> usize {
        self.conditioning.rows_per_slot()
    }

    pub(crate) fn cache_len(&self) -> usize {
        self.cfg.max_delay() + 2 + self.user_lag()
    }

    /// How many entries later than the step's own the user's codes are
    /// written (1 for PersonaPlex, see the module doc).
    pub(crate) fn user_lag(&self) -> usize {
        usize::from(self.cfg.model_type == crate::config::ModelType::PersonaPlex)
    }

    /// A state for `max_slots` slots, each reset with [`GenParams::default`].
    /// Everything a step needs is allocated here. Panics when the memory
    /// cannot be had: loaders use [`Lm::try_new_state`].
    pub fn new_state(&self, max_slots: usize) -> LmState {
        self.try_new_state(max_slots)
            .unwrap_or_else(|e| panic!("LM state for {max_slots} slots: {e}"))
    }

    /// [`Lm::new_state`], with the caches (the part that grows with the
    /// context and `max_slots`) allocated fallibly.
    pub fn try_new_state(&self, max_slots: usize) -> Result<LmState, AllocError> {
        let cfg = &self.cfg;
        let rps = self.rows_per_slot();
        let rows = max_slots * rps;
        let k = cfg.num_codebooks();
        let dd = cfg.depformer.dim;
        let slots = (0..max_slots)
            .map(|_| Slot {
                offset: 0,
                cache: vec![UNGENERATED; k * self.cache_len()],
                forced: vec![false; k * self.cache_len()],
                cfg_coef: None,
                text: Sampler::GREEDY,
                audio: Sampler::GREEDY,
                rng: slot_rng(0),
                rules: TextRules::default(),
                history: TextHistory::default(),
            })
            .collect();
        let sc = Scratch {
            active: Vec::with_capacity(max_slots),
            row0: Vec::with_capacity(max_slots),
            row_slot: Vec::with_capacity(rows),
            rows: Vec::with_capacity(rows),
            dep_rows: Vec::with_capacity(rows),
            tokens: vec![0; max_slots * k],
            x: vec![0.0; rows * cfg.dim],
            tout: vec![0.0; rows * cfg.dim],
            text_logits: vec![0.0; rows * cfg.text_card],
            dx: vec![0.0; rows * dd],
            tmp: vec![0.0; rows * self.depformer.emb_width()],
            dlogits: vec![0.0; rows * cfg.card],
            mix: vec![0.0; cfg.card],
            prev: vec![0; max_slots],
            text: vec![0; max_slots],
            audio: vec![0; max_slots * cfg.dep_q],
            cand: vec![(0.0, 0); cfg.card.max(cfg.text_card)],
            seen: vec![false; cfg.text_card],
            stack: StackScratch::new(
                rows,
                &[self.temporal.shape(), self.depformer.stack().shape()],
            ),
            cond_tmp: vec![0.0; cfg.dim],
            null_tmp: vec![0.0; cfg.dim],
            dep_kv: alloc::zeroed(rows * self.depformer.stack().kv_row_len(), || {
                format!("the depformer's KV caches for {max_slots} slots")
            })?,
        };
        let pf_rows = if super::prefill_headroom(cfg) > 0 {
            super::PREFILL_CHUNK_POSITIONS
        } else {
            0
        };
        let pf = PrefillScratch {
            x: vec![0.0; pf_rows * cfg.dim],
            tout: vec![0.0; pf_rows * cfg.dim],
            rows: Vec::with_capacity(pf_rows),
            stack: StackScratch::new(pf_rows, &[self.temporal.shape()]),
        };
        let mut st = LmState {
            pf,
            max_slots,
            rows_per_slot: rps,
            slots,
            cond: vec![0.0; rows * cfg.dim],
            kv: alloc::zeroed(rows * self.temporal.kv_row_len(), || {
                format!(
                    "the LM's KV caches for {max_slots} slots (context {})",
                    cfg.context
                )
            })?,
            sc,
        };
        let defaults = GenParams::default();
        for s in 0..max_slots {
            self.reset_slot(&mut st, s, &defaults)
                .expect("the default parameters are valid for every model");
        }
        Ok(st)
    }

    /// Starts a new stream in `slot` with `params`. The slot is then exactly
    /// as a slot of a fresh state; on error the slot is left as it was.
    pub fn reset_slot(
        &self,
        state: &mut LmState,
        slot: usize,
        params: &GenParams,
    ) -> Result<(), ParamError> {
        if slot >= state.max_slots {
            return Err(ParamError::NoSuchSlot {
                slot,
                max_slots: state.max_slots,
            });
        }
        let d = self.cfg.dim;
        let rps = state.rows_per_slot;
        let row = slot * rps;
        // The guidance row exists only when the model has conditioners; its
        // vector is computed into the scratch otherwise and dropped.
        let (cond, null) = state.cond[row * d..(row + rps) * d].split_at_mut(d);
        let null: &mut [f32] = if null.is_empty() {
            &mut state.sc.null_tmp
        } else {
            null
        };
        let setup = self
            .conditioning
            .prepare(params, cond, null, &mut state.sc.cond_tmp)?;
        let s = &mut state.slots[slot];
        s.offset = 0;
        s.cache.fill(UNGENERATED);
        s.forced.fill(false);
        s.cfg_coef = setup.cfg_coef;
        s.text = setup.text;
        s.audio = setup.audio;
        s.rng = slot_rng(setup.seed);
        s.rules = setup.rules;
        s.history.clear();
        Ok(())
    }

    /// Advances every slot with `active[s]` by one frame. `user_codes` is
    /// `[max_slots, num_user_codebooks]` (rows of inactive slots are ignored);
    /// each code must be at most `card` (`card` itself is the initial /
    /// end-of-stream id). Allocates nothing.
    pub fn step(
        &self,
        state: &mut LmState,
        user_codes: &[u32],
        active: &[bool],
        out: &mut LmStepOutput,
    ) {
        let ms = state.max_slots;
        assert_eq!(active.len(), ms, "`active` must have one entry per slot");
        assert_eq!(
            user_codes.len(),
            ms * self.cfg.num_user_codebooks(),
            "`user_codes` must be max_slots × num_user_codebooks"
        );
        assert_eq!(
            out.max_slots(),
            ms,
            "output sized for another number of slots"
        );
        let n = self.gather_rows(state, user_codes, active, out);
        if n == 0 {
            return;
        }
        self.embed_rows(state);
        self.temporal_and_text_head(state, n);
        self.sample_text(state, out);
        self.run_depformer(state, n);
        self.commit_frame(state, out);
    }

    /// Step 1: writes each active slot's user codes into its token ring,
    /// reads the frame's input tokens out of it, and gathers the batch rows
    /// (two per slot with guidance). Marks every slot's `stepped` and clears
    /// its `ready`. Returns the number of batch rows.
    fn gather_rows(
        &self,
        state: &mut LmState,
        user_codes: &[u32],
        active: &[bool],
        out: &mut LmStepOutput,
    ) -> usize {
        let cfg = &self.cfg;
        let nu = cfg.num_user_codebooks();
        let nk = cfg.num_codebooks();
        let ct = self.cache_len();
        let lag = self.user_lag();
        let (dep_q, card, tc) = (cfg.dep_q, cfg.card, cfg.text_card);
        let rps = state.rows_per_slot;
        let sc = &mut state.sc;
        sc.active.clear();
        sc.row0.clear();
        sc.row_slot.clear();
        sc.rows.clear();
        for (s, &on) in active.iter().enumerate() {
            out.stepped[s] = on;
            out.ready[s] = false;
            if !on {
                continue;
            }
            let slot = &mut state.slots[s];
            let t = slot.offset;
            for (j, &code) in user_codes[s * nu..(s + 1) * nu].iter().enumerate() {
                assert!(
                    code as usize <= card,
                    "slot {s}: user code {code} above card {card}"
                );
                let k = 1 + dep_q + j;
                let at = k * ct + (t + cfg.delays[k] + lag) % ct;
                slot.cache[at] = code;
                slot.forced[at] = lag > 0;
            }
            let a = sc.active.len();
            sc.active.push(s);
            let toks = &mut sc.tokens[a * nk..(a + 1) * nk];
            for (k, tok) in toks.iter_mut().enumerate() {
                *tok = if t <= cfg.delays[k] {
                    if k == 0 {
                        tc as u32
                    } else {
                        card as u32
                    }
                } else {
                    slot.cache[k * ct + t % ct]
                };
            }
            sc.row0.push(sc.rows.len());
            let n_rows = if slot.cfg_coef.is_some() { 2 } else { 1 };
            for j in 0..n_rows {
                sc.rows.push(AttnRow {
                    kv_row: s * rps + j,
                    pos: t,
                });
                sc.row_slot.push(a);
            }
        }
        sc.rows.len()
    }

    /// Step 2: the input embedding of each batch row, in the official
    /// summation order: audio codebooks 0..n_q, then text, then the fused
    /// condition.
    fn embed_rows(&self, state: &mut LmState) {
        let nk = self.cfg.num_codebooks();
        let dim = self.cfg.dim;
        let sc = &mut state.sc;
        for (r, row) in sc.rows.iter().enumerate() {
            let toks = &sc.tokens[sc.row_slot[r] * nk..(sc.row_slot[r] + 1) * nk];
            let xr = &mut sc.x[r * dim..(r + 1) * dim];
            self.embed_tokens(toks, xr);
            if !self.conditioning.is_empty() {
                let c = &state.cond[row.kv_row * dim..(row.kv_row + 1) * dim];
                for (o, v) in xr.iter_mut().zip(c) {
                    *o += v;
                }
            }
        }
    }

    /// Step 3: the temporal transformer over the `n` batch rows, its output
    /// norm (kept in `tout` for the depformer), and the text head's logits.
    fn temporal_and_text_head(&self, state: &mut LmState, n: usize) {
        let cfg = &self.cfg;
        let (dim, tc) = (cfg.dim, cfg.text_card);
        let sc = &mut state.sc;
        self.temporal
            .forward(0, &mut sc.x, &sc.rows, &mut state.kv, &mut sc.stack);
        rms_norm(
            &sc.x[..n * dim],
            &self.out_norm,
            cfg.norm.eps(),
            dim,
            &mut sc.tout[..n * dim],
        );
        linear(
            &sc.tout[..n * dim],
            n,
            &self.text_linear,
            tc,
            dim,
            &mut sc.text_logits[..n * tc],
        );
    }

    /// Step 4: each active slot's text token, sampled from its logits
    /// (guidance mixed into the output's logits buffer, then the text rules)
    /// unless the ring entry it would write is forced; it is recorded in the
    /// slot's text history and is the depformer's first input.
    fn sample_text(&self, state: &mut LmState, out: &mut LmStepOutput) {
        let cfg = &self.cfg;
        let ct = self.cache_len();
        let tc = cfg.text_card;
        let sc = &mut state.sc;
        for (a, &s) in sc.active.iter().enumerate() {
            let slot = &mut state.slots[s];
            let r0 = sc.row0[a];
            let dst = &mut out.text_logits[s * tc..(s + 1) * tc];
            let cond = &sc.text_logits[r0 * tc..(r0 + 1) * tc];
            match slot.cfg_coef {
                Some(coef) => cfg_mix(
                    cond,
                    &sc.text_logits[(r0 + 1) * tc..(r0 + 2) * tc],
                    coef,
                    dst,
                ),
                None => dst.copy_from_slice(cond),
            }
            if !slot.rules.is_off() {
                let pad = cfg.existing_text_padding_id;
                text_rules::apply(dst, &slot.rules, &slot.history, pad, &mut sc.seen);
            }
            let mut tok = slot.text.sample(dst, &mut slot.rng, &mut sc.cand);
            let target = (slot.offset + 1) % ct;
            if slot.forced[target] {
                tok = slot.cache[target];
            }
            sc.text[a] = tok;
            sc.prev[a] = tok;
            let skip = SkippedIds {
                pad: cfg.existing_text_padding_id,
                start: tc as u32,
            };
            slot.history.push(tok, skip);
        }
    }

    /// Step 5: the depformer, codebook by codebook over the `n` batch rows;
    /// each slot's audio token is sampled (guidance mixed) unless its ring
    /// entry is forced, and is the next codebook's input.
    fn run_depformer(&self, state: &mut LmState, n: usize) {
        let ct = self.cache_len();
        let (dep_q, card) = (self.cfg.dep_q, self.cfg.card);
        let sc = &mut state.sc;
        for k in 0..dep_q {
            sc.dep_rows.clear();
            sc.dep_rows
                .extend((0..n).map(|r| AttnRow { kv_row: r, pos: k }));
            let prev = &sc.prev;
            self.depformer.step(
                k,
                &sc.tout,
                sc.row_slot.iter().map(|&a| prev[a]),
                &sc.dep_rows,
                &mut sc.dx,
                &mut sc.tmp,
                &mut sc.dep_kv,
                &mut sc.stack,
                &mut sc.dlogits,
            );
            for (a, &s) in sc.active.iter().enumerate() {
                let slot = &mut state.slots[s];
                let r0 = sc.row0[a];
                let cond = &sc.dlogits[r0 * card..(r0 + 1) * card];
                let sampled = match slot.cfg_coef {
                    Some(coef) => {
                        cfg_mix(
                            cond,
                            &sc.dlogits[(r0 + 1) * card..(r0 + 2) * card],
                            coef,
                            &mut sc.mix,
                        );
                        slot.audio.sample(&sc.mix, &mut slot.rng, &mut sc.cand)
                    }
                    None => slot.audio.sample(cond, &mut slot.rng, &mut sc.cand),
                };
                let target = (1 + k) * ct + (slot.offset + 1) % ct;
                let tok = if slot.forced[target] {
                    slot.cache[target]
                } else {
                    sampled
                };
                sc.audio[a * dep_q + k] = tok;
                sc.prev[a] = tok;
            }
        }
    }

    /// Step 6: advances each active slot's offset, clears the forced flags of
    /// the entry just consumed (PersonaPlex), writes the sampled tokens into
    /// the ring, and once past the largest delay emits the undelayed frame.
    fn commit_frame(&self, state: &mut LmState, out: &mut LmStepOutput) {
        let cfg = &self.cfg;
        let nk = cfg.num_codebooks();
        let ct = self.cache_len();
        let lag = self.user_lag();
        let max_delay = cfg.max_delay();
        let dep_q = cfg.dep_q;
        let sc = &mut state.sc;
        for (a, &s) in sc.active.iter().enumerate() {
            let slot = &mut state.slots[s];
            slot.offset += 1;
            let t = slot.offset;
            if lag > 0 {
                for k in 0..nk {
                    slot.forced[k * ct + (t - 1) % ct] = false;
                }
            }
            slot.cache[t % ct] = sc.text[a];
            for k in 0..dep_q {
                slot.cache[(1 + k) * ct + t % ct] = sc.audio[a * dep_q + k];
            }
            if t > max_delay {
                let o = &mut out.tokens[s * (1 + dep_q)..(s + 1) * (1 + dep_q)];
                for (k, v) in o.iter_mut().enumerate() {
                    *v = slot.cache[k * ct + (t - max_delay + cfg.delays[k]) % ct];
                }
                out.ready[s] = true;
            }
        }
    }
}
