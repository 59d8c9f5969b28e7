//! A prompt prefill (PersonaPlex): every input of every prompt frame is
//! given, so the frames need no depformer and no sampling, and the temporal
//! transformer can run over all their positions as causal passes of many
//! rows instead of one step per frame.
//!
//! [`PrefillFrames`] holds what NVIDIA's `LMGen.step` is given at each
//! prefill frame (all rows: text, the model's audio, the user's audio), and
//! optionally a voice replayed from a `.pt` file (its first frames feed
//! stored embeddings, then its token ring replaces the slot's).
//! [`PrefillFrames::simulate`] runs the fork's token-ring bookkeeping
//! (`prepare_step_input` and `process_transformer_output`, lm.py:727-958)
//! over those frames without the network: it gives the input of each
//! transformer position and the ring and forced flags the slot holds
//! afterwards. Because every target of a prefill frame is given, no sampled
//! value ever reaches the ring, so the simulation is exact.
//!
//! [`Lm::prefill_pass`] runs positions `t0..t0 + n` of one slot through the
//! temporal transformer in one pass (rows at consecutive positions of the
//! same KV row: the ring has [`super::prefill_headroom`] spare entries so no
//! key a query still sees is overwritten), optionally computing their text
//! logits (for diagnosis; the official code discards them).
//! [`Lm::install_prefill`] then gives the slot the ring, flags and offset,
//! exactly the state a frame-by-frame prefill leaves.
//!
//! Snapshots: [`Lm::snapshot_slot`] copies what a prefilled slot holds (KV
//! rows of the positions a later query can see, token ring, flags, offset)
//! and [`Lm::restore_slot`] writes it into another slot, which then behaves
//! exactly like the slot that ran the prefill.

use super::gen::LmState;
use super::linear::linear;
use super::transformer::AttnRow;
use super::{Lm, PREFILL_CHUNK_POSITIONS};
use crate::ops::rms_norm;

/// A voice replayed from NVIDIA's `.pt` file: `embeddings` (`[frames − 1,
/// dim]`) feed positions `0..frames − 1` directly, and after frame
/// `frames − 1` the token ring becomes `cache` (`[num_codebooks, CT]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// Voice frames `N` (one more than the stored embeddings).
    pub frames: usize,
    /// `[N − 1, dim]` float32.
    pub embeddings: Vec<f32>,
    /// `[num_codebooks, CT]` token ring after the voice frames.
    pub cache: Vec<u32>,
}

/// The input of one transformer position of a prefill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionInput {
    /// Tokens `[num_codebooks]` at this offset of [`Simulated::tokens`].
    Tokens(usize),
    /// Row `i` of [`Replay::embeddings`].
    Embedding(usize),
}

/// What the prefill's bookkeeping gives, before any network pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulated {
    /// The input of each transformer position `0..positions`.
    pub inputs: Vec<PositionInput>,
    /// Token inputs, `num_codebooks` per [`PositionInput::Tokens`].
    pub tokens: Vec<u32>,
    /// The ring after the last frame, `[num_codebooks, CT]`.
    pub cache: Vec<u32>,
    /// Its forced flags.
    pub forced: Vec<bool>,
}

impl Simulated {
    /// Transformer positions (frames − 1: the first frame has no pass).
    pub fn positions(&self) -> usize {
        self.inputs.len()
    }
}

/// What NVIDIA's `LMGen` is given at every prefill frame.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillFrames {
    /// Tokens per stream: text, then every audio codebook.
    pub codebooks: usize,
    /// `[frames, codebooks]`: all rows of each frame (for replayed voice
    /// frames, the dummy tokens `step_embeddings` gives).
    pub given: Vec<u32>,
    /// The replayed voice, whose frames are the first `replay.frames`.
    pub replay: Option<Replay>,
}

impl PrefillFrames {
    /// Frames.
    pub fn frames(&self) -> usize {
        self.given.len() / self.codebooks.max(1)
    }

    /// Runs the fork's token-ring bookkeeping over the frames (see the
    /// module doc). `delays` has one entry per codebook, `initial` is the
    /// initial token of each codebook (text: `text_card`, audio: `card`),
    /// `ct` the ring length.
    pub fn simulate(&self, delays: &[usize], initial: &[u32], ct: usize) -> Simulated {
        let k_n = self.codebooks;
        assert_eq!(delays.len(), k_n);
        let frames = self.frames();
        let mut cache = vec![u32::MAX; k_n * ct];
        let mut provided = vec![false; k_n * ct];
        let mut out = Simulated {
            inputs: Vec::with_capacity(frames.saturating_sub(1)),
            tokens: Vec::with_capacity(frames.saturating_sub(1) * k_n),
            cache: Vec::new(),
            forced: Vec::new(),
        };
        for o in 0..frames {
            let given = &self.given[o * k_n..(o + 1) * k_n];
            for k in 0..k_n {
                let at = k * ct + (o + delays[k]) % ct;
                cache[at] = given[k];
                provided[at] = true;
            }
            for k in 0..k_n {
                if o <= delays[k] {
                    cache[k * ct + o % ct] = initial[k];
                    provided[k * ct + o % ct] = true;
                }
            }
            if o == 0 {
                for k in 0..k_n {
                    cache[k * ct] = initial[k];
                }
                continue;
            }
            let input = (o - 1) % ct;
            let replayed = self.replay.as_ref().filter(|r| o < r.frames);
            if replayed.is_some() {
                out.inputs.push(PositionInput::Embedding(o - 1));
            } else {
                out.inputs.push(PositionInput::Tokens(out.tokens.len()));
                out.tokens.extend((0..k_n).map(|k| cache[k * ct + input]));
            }
            // Every target of a prefill frame is given: nothing sampled is
            // ever written (`cache[target]` keeps its value).
            debug_assert!((0..k_n).all(|k| provided[k * ct + o % ct]));
            for k in 0..k_n {
                provided[k * ct + input] = false;
            }
            if let Some(r) = self.replay.as_ref().filter(|r| o + 1 == r.frames) {
                cache.copy_from_slice(&r.cache);
            }
        }
        out.cache = cache;
        out.forced = provided;
        out
    }
}

/// A copy of one prefilled slot's LM state (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct LmSnapshot {
    offset: usize,
    cache: Vec<u32>,
    forced: Vec<bool>,
    /// First position held in `kv`.
    first_pos: usize,
    /// Per position `first_pos..offset`, the keys and values of every layer
    /// (`[positions][layers][2][kv_dim]`).
    kv: Vec<f32>,
}

impl LmSnapshot {
    /// Bytes of state held.
    pub fn bytes(&self) -> usize {
        self.kv.len() * 4 + self.cache.len() * 5
    }

    /// Steps the slot had run.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

impl Lm {
    /// Runs prefill positions `t0..t0 + n` of `slot` through the temporal
    /// transformer (rows of `sim`'s inputs, or of `replay`'s embeddings),
    /// writing their keys and values. With `logits` (`[n, text_card]`), also
    /// the text logits of each position. `n` is at most
    /// [`PREFILL_CHUNK_POSITIONS`]; positions must follow the slot's previous
    /// ones.
    #[allow(clippy::too_many_arguments)]
    pub fn prefill_pass(
        &self,
        state: &mut LmState,
        slot: usize,
        sim: &Simulated,
        replay: Option<&Replay>,
        t0: usize,
        n: usize,
        logits: Option<&mut [f32]>,
    ) {
        let cfg = &self.cfg;
        let dim = cfg.dim;
        let nk = cfg.num_codebooks();
        assert!(n <= PREFILL_CHUNK_POSITIONS && t0 + n <= sim.positions());
        let kv_row = slot * state.rows_per_slot();
        let pf = state.prefill_scratch();
        pf.rows.clear();
        for i in 0..n {
            let t = t0 + i;
            let xr = &mut pf.x[i * dim..(i + 1) * dim];
            match sim.inputs[t] {
                PositionInput::Embedding(e) => {
                    let r = replay.expect("a replayed position needs its voice");
                    xr.copy_from_slice(&r.embeddings[e * dim..(e + 1) * dim]);
                }
                PositionInput::Tokens(at) => {
                    let toks = &sim.tokens[at..at + nk];
                    self.embed_tokens(toks, xr);
                }
            }
            pf.rows.push(AttnRow { kv_row, pos: t });
        }
        let (x, rows, stack, kv) = state.prefill_parts();
        self.temporal.forward(0, x, rows, kv, stack);
        if let Some(out) = logits {
            let pf = state.prefill_scratch();
            rms_norm(
                &pf.x[..n * dim],
                &self.out_norm,
                cfg.norm.eps(),
                dim,
                &mut pf.tout[..n * dim],
            );
            linear(
                &pf.tout[..n * dim],
                n,
                &self.text_linear,
                cfg.text_card,
                dim,
                &mut out[..n * cfg.text_card],
            );
        }
    }

    /// Gives `slot` the token ring, forced flags and offset a frame-by-frame
    /// prefill of `sim` leaves (after every position ran through
    /// [`Lm::prefill_pass`]).
    pub fn install_prefill(&self, state: &mut LmState, slot: usize, sim: &Simulated) {
        state.set_ring(slot, sim.positions(), &sim.cache, &sim.forced);
    }

    /// What a snapshot of `slot` holds now: (offset, first position kept,
    /// KV floats per position).
    fn snapshot_extent(&self, state: &LmState, slot: usize) -> (usize, usize, usize) {
        let sh = self.temporal.shape();
        let offset = state.offset(slot);
        // A query at `offset` sees `window − 1` earlier keys.
        let first_pos = offset.saturating_sub(sh.context.saturating_sub(1));
        (offset, first_pos, sh.layers * 2 * sh.kv_dim())
    }

    /// The bytes [`Lm::snapshot_slot`] would hold for `slot` now (its
    /// [`LmSnapshot::bytes`]).
    pub fn snapshot_bytes(&self, state: &LmState, slot: usize) -> usize {
        let (offset, first_pos, per_pos) = self.snapshot_extent(state, slot);
        (offset - first_pos) * per_pos * 4 + state.ring(slot).0.len() * 5
    }

    /// A copy of `slot`'s state: the KV entries of the positions a later
    /// query can see, the token ring, forced flags and offset.
    pub fn snapshot_slot(&self, state: &LmState, slot: usize) -> LmSnapshot {
        let (offset, first_pos, per_pos) = self.snapshot_extent(state, slot);
        let mut kv = vec![0.0; (offset - first_pos) * per_pos];
        for (i, p) in (first_pos..offset).enumerate() {
            self.temporal.read_position(
                state.kv_row(slot * state.rows_per_slot()),
                p,
                &mut kv[i * per_pos..(i + 1) * per_pos],
            );
        }
        let (cache, forced) = state.ring(slot);
        LmSnapshot {
            offset,
            cache: cache.to_vec(),
            forced: forced.to_vec(),
            first_pos,
            kv,
        }
    }

    /// Writes `snap` into `slot` (which was reset with the session's
    /// parameters): it then behaves exactly like the slot the snapshot was
    /// taken from.
    pub fn restore_slot(&self, state: &mut LmState, slot: usize, snap: &LmSnapshot) {
        let sh = self.temporal.shape();
        let per_pos = sh.layers * 2 * sh.kv_dim();
        let row = slot * state.rows_per_slot();
        for (i, p) in (snap.first_pos..snap.offset).enumerate() {
            self.temporal.write_position(
                state.kv_row_mut(row),
                p,
                &snap.kv[i * per_pos..(i + 1) * per_pos],
            );
        }
        state.set_ring(slot, snap.offset, &snap.cache, &snap.forced);
    }

    /// The summed input embedding of one position's tokens (audio codebooks
    /// in order, then text: the official `embed_codes` order).
    pub(crate) fn embed_tokens(&self, toks: &[u32], xr: &mut [f32]) {
        xr.copy_from_slice(self.emb[0].row(toks[1]));
        for (e, &tok) in self.emb.iter().zip(&toks[1..]).skip(1) {
            for (o, v) in xr.iter_mut().zip(e.row(tok)) {
                *o += v;
            }
        }
        for (o, v) in xr.iter_mut().zip(self.text_emb.row(toks[0])) {
            *o += v;
        }
    }
}
