//! The delayed token cache and the embedding lookups (embed.cu).
//!
//! Per step: [`EmbedKernels::cache_in`] writes each slot's user codes into its
//! token ring and reads out the tokens due at its offset; the embeddings of
//! those tokens are summed into the temporal input ([`EmbedKernels::sum`]);
//! after sampling, [`EmbedKernels::cache_out`] stores the new tokens, advances
//! the offsets and reads out the undelayed frame.

use super::{dim, int};
use crate::device::{Arg, DType, DevPtr, Device, DeviceError, DeviceResult, KernelId, NULL};

/// `TOK_THREADS` of embed.cu.
pub const TOK_THREADS: u32 = 128;
/// `EMB_THREADS` of embed.cu.
pub const EMB_THREADS: u32 = 256;

/// Shape of the token cache (per model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCacheShape {
    /// Codebooks (text + audio): K.
    pub codebooks: usize,
    /// Ring length per codebook: max_delay + 2.
    pub ring: usize,
    /// Generated audio codebooks.
    pub dep_q: usize,
    /// User codebooks fed per step.
    pub n_user: usize,
    /// Audio cardinality (the initial audio token).
    pub card: usize,
    /// Text cardinality (the initial text token).
    pub text_card: usize,
    /// Largest delay.
    pub max_delay: usize,
    /// Entries later than the step's own that user codes are written (1 for
    /// PersonaPlex, whose `forced` flags are then kept).
    pub lag: usize,
}

/// Device state the token-cache kernels use.
#[derive(Debug, Clone, Copy)]
pub struct TokenCache {
    /// `[max_slots][K][ring]` u32.
    pub cache: DevPtr,
    /// `[max_slots]` i32 steps since reset.
    pub offset: DevPtr,
    /// `[K]` i32 delays.
    pub delays: DevPtr,
    /// `[max_slots][K][ring]` i32 forced flags, or NULL (no lag).
    pub forced: DevPtr,
}

/// The embedding kernels of one device.
#[derive(Debug, Clone, Copy)]
pub struct EmbedKernels {
    cache_in: KernelId,
    cache_out: KernelId,
    force: KernelId,
    sum_bf16: KernelId,
    sum_f32: KernelId,
    add_rows_bf16: KernelId,
    add_rows_f32: KernelId,
    gather_bf16: KernelId,
    gather_f32: KernelId,
    fill_flagged: KernelId,
}

fn tok_grid(what: &'static str, n_steps: usize) -> DeviceResult<(u32, u32, u32)> {
    Ok((dim(what, n_steps.div_ceil(TOK_THREADS as usize))?, 1, 1))
}

impl EmbedKernels {
    /// Resolves the kernels.
    pub fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(EmbedKernels {
            cache_in: dev.kernel("token_cache_in")?,
            cache_out: dev.kernel("token_cache_out")?,
            force: dev.kernel("force_tokens")?,
            sum_bf16: dev.kernel("embed_sum")?,
            sum_f32: dev.kernel("embed_sum_f32")?,
            add_rows_bf16: dev.kernel("embed_add_rows")?,
            add_rows_f32: dev.kernel("embed_add_rows_f32")?,
            gather_bf16: dev.kernel("embed_gather_rows")?,
            gather_f32: dev.kernel("embed_gather_rows_f32")?,
            fill_flagged: dev.kernel("fill_flagged_rows")?,
        })
    }

    /// User codes (`[n_steps][n_user]` u32) into each active step's token
    /// ring; the tokens due now into `tokens` (`[n_steps][K]`).
    #[allow(clippy::too_many_arguments)]
    pub fn cache_in<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        tc: &TokenCache,
        sh: &TokenCacheShape,
        steps: DevPtr,
        n_steps: usize,
        user_codes: DevPtr,
        tokens: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "token_cache_in";
        if [steps, user_codes, tokens, tc.cache, tc.offset, tc.delays].contains(&NULL) {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        dev.launch(
            self.cache_in,
            tok_grid(WHAT, n_steps)?,
            TOK_THREADS,
            &[
                Arg::Ptr(steps),
                Arg::I32(int(WHAT, n_steps)?),
                Arg::Ptr(user_codes),
                Arg::I32(int(WHAT, sh.n_user)?),
                Arg::Ptr(tc.cache),
                Arg::Ptr(tc.offset),
                Arg::Ptr(tc.delays),
                Arg::I32(int(WHAT, sh.codebooks)?),
                Arg::I32(int(WHAT, sh.ring)?),
                Arg::I32(int(WHAT, sh.dep_q)?),
                Arg::I32(int(WHAT, sh.card)?),
                Arg::I32(int(WHAT, sh.text_card)?),
                Arg::Ptr(tokens),
                Arg::I32(int(WHAT, sh.lag)?),
                Arg::Ptr(tc.forced),
            ],
        )
    }

    /// The sampled tokens (`text[n_steps]`, `audio[n_steps][dep_q]`) into the
    /// rings, offsets advanced, the undelayed frame into `out`
    /// (`[n_steps][1 + dep_q]`) with `ready[n_steps]` (i32).
    #[allow(clippy::too_many_arguments)]
    pub fn cache_out<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        tc: &TokenCache,
        sh: &TokenCacheShape,
        steps: DevPtr,
        n_steps: usize,
        text: DevPtr,
        audio: DevPtr,
        out: DevPtr,
        ready: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "token_cache_out";
        if [
            steps, text, audio, out, ready, tc.cache, tc.offset, tc.delays,
        ]
        .contains(&NULL)
        {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        dev.launch(
            self.cache_out,
            tok_grid(WHAT, n_steps)?,
            TOK_THREADS,
            &[
                Arg::Ptr(steps),
                Arg::I32(int(WHAT, n_steps)?),
                Arg::Ptr(text),
                Arg::Ptr(audio),
                Arg::Ptr(tc.cache),
                Arg::Ptr(tc.offset),
                Arg::Ptr(tc.delays),
                Arg::I32(int(WHAT, sh.codebooks)?),
                Arg::I32(int(WHAT, sh.ring)?),
                Arg::I32(int(WHAT, sh.dep_q)?),
                Arg::I32(int(WHAT, sh.max_delay)?),
                Arg::Ptr(out),
                Arg::Ptr(ready),
                Arg::Ptr(tc.forced),
            ],
        )
    }

    /// Replaces `tok[s · stride]` by codebook row `k`'s forced target where
    /// it is forced (PersonaPlex; nothing to do without forced flags).
    #[allow(clippy::too_many_arguments)]
    pub fn force<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        tc: &TokenCache,
        sh: &TokenCacheShape,
        steps: DevPtr,
        n_steps: usize,
        k: usize,
        tok: DevPtr,
        stride: usize,
    ) -> DeviceResult<()> {
        const WHAT: &str = "force_tokens";
        if tc.forced == NULL {
            return Ok(());
        }
        dev.launch(
            self.force,
            tok_grid(WHAT, n_steps)?,
            TOK_THREADS,
            &[
                Arg::Ptr(steps),
                Arg::I32(int(WHAT, n_steps)?),
                Arg::Ptr(tc.cache),
                Arg::Ptr(tc.forced),
                Arg::Ptr(tc.offset),
                Arg::I32(int(WHAT, sh.codebooks)?),
                Arg::I32(int(WHAT, sh.ring)?),
                Arg::I32(int(WHAT, k)?),
                Arg::Ptr(tok),
                Arg::I32(int(WHAT, stride)?),
            ],
        )
    }

    /// `x[r] = Σ audio_emb[k][tok[k+1]] + text_emb[tok[0]] (+ cond[kv row])`
    /// for `rows` rows (tables of `dtype`; `cond` may be NULL).
    #[allow(clippy::too_many_arguments)]
    pub fn sum<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        dtype: DType,
        x: DevPtr,
        audio_emb: DevPtr,
        text_emb: DevPtr,
        cond: DevPtr,
        row_info: DevPtr,
        rows: usize,
        tokens: DevPtr,
        codebooks: usize,
        card: usize,
        width: usize,
    ) -> DeviceResult<()> {
        const WHAT: &str = "embed_sum";
        if [x, audio_emb, text_emb, row_info, tokens].contains(&NULL) {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        let k = match dtype {
            DType::Bf16 => self.sum_bf16,
            DType::F32 => self.sum_f32,
        };
        dev.launch(
            k,
            (
                dim(WHAT, width.div_ceil(EMB_THREADS as usize))?,
                dim(WHAT, rows)?,
                1,
            ),
            EMB_THREADS,
            &[
                Arg::Ptr(x),
                Arg::Ptr(audio_emb),
                Arg::Ptr(text_emb),
                Arg::Ptr(cond),
                Arg::Ptr(row_info),
                Arg::Ptr(tokens),
                Arg::I32(int(WHAT, codebooks)?),
                Arg::I32(int(WHAT, card)?),
                Arg::I32(int(WHAT, width)?),
            ],
        )
    }

    /// `x[r] += table[tokens[step(r) · stride]]` (full-rank tables).
    #[allow(clippy::too_many_arguments)]
    pub fn add_rows<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        dtype: DType,
        x: DevPtr,
        table: DevPtr,
        row_info: DevPtr,
        rows: usize,
        tokens: DevPtr,
        stride: usize,
        width: usize,
    ) -> DeviceResult<()> {
        self.rows_op(
            dev,
            "embed_add_rows",
            match dtype {
                DType::Bf16 => self.add_rows_bf16,
                DType::F32 => self.add_rows_f32,
            },
            [x, table, row_info, tokens],
            rows,
            stride,
            width,
        )
    }

    /// `out[r] = table[tokens[step(r) · stride]]` (`[rows][rank]`, low-rank tables).
    #[allow(clippy::too_many_arguments)]
    pub fn gather_rows<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        dtype: DType,
        out: DevPtr,
        table: DevPtr,
        row_info: DevPtr,
        rows: usize,
        tokens: DevPtr,
        stride: usize,
        rank: usize,
    ) -> DeviceResult<()> {
        self.rows_op(
            dev,
            "embed_gather_rows",
            match dtype {
                DType::Bf16 => self.gather_bf16,
                DType::F32 => self.gather_f32,
            },
            [out, table, row_info, tokens],
            rows,
            stride,
            rank,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn rows_op<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        what: &'static str,
        k: KernelId,
        ptrs: [DevPtr; 4],
        rows: usize,
        stride: usize,
        width: usize,
    ) -> DeviceResult<()> {
        if ptrs.contains(&NULL) {
            return Err(DeviceError::shape(what, "null operand"));
        }
        let [a, b, c, d] = ptrs;
        dev.launch(
            k,
            (
                dim(what, width.div_ceil(EMB_THREADS as usize))?,
                dim(what, rows)?,
                1,
            ),
            EMB_THREADS,
            &[
                Arg::Ptr(a),
                Arg::Ptr(b),
                Arg::Ptr(c),
                Arg::Ptr(d),
                Arg::I32(int(what, stride)?),
                Arg::I32(int(what, width)?),
            ],
        )
    }

    /// `codes[s][0..n] = value` where `flags[s]` (i32) is set, for `n_steps` steps.
    #[allow(clippy::too_many_arguments)]
    pub fn fill_flagged<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        codes: DevPtr,
        stride: usize,
        n: usize,
        flags: DevPtr,
        n_steps: usize,
        value: u32,
    ) -> DeviceResult<()> {
        const WHAT: &str = "fill_flagged_rows";
        if codes == NULL || flags == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        dev.launch(
            self.fill_flagged,
            tok_grid(WHAT, n_steps)?,
            TOK_THREADS,
            &[
                Arg::Ptr(codes),
                Arg::I32(int(WHAT, stride)?),
                Arg::I32(int(WHAT, n)?),
                Arg::Ptr(flags),
                Arg::I32(int(WHAT, n_steps)?),
                Arg::U32(value),
            ],
        )
    }
}
