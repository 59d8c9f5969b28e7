//! Mimi, Kyutai's streaming neural audio codec, in float32 on the CPU,
//! batched over independent streams ("slots").
//!
//! One call of [`Mimi::encode_step`] turns one frame of audio
//! ([`Mimi::frame_samples`] samples, 1920 for the real Mimi) into one code per
//! codebook, one call of [`Mimi::decode_step`] turns one frame of codes into
//! one frame of audio, exactly as the official `MimiModel.encode`/`decode` in
//! streaming mode with one frame per call:
//!
//! - encode: SEANet encoder (`hop` samples → one latent) → encoder transformer
//!   (`downsample_stride` steps per call) → learnt down-sampling conv →
//!   split RVQ codes;
//! - decode: split RVQ latent → learnt channel-wise up-sampling transposed
//!   conv → decoder transformer → SEANet decoder.
//!
//! Files: `conv.rs` (streaming conv and transposed conv), `seanet.rs`,
//! `transformer.rs`, `quantizer.rs`, `resample.rs`, `linear.rs` (matrix products
//! over weights packed at load), `act.rs` (vectorizable ELU/GELU/dot).
//!
//! Invariants: a [`Mimi`] is immutable after [`Mimi::load`]; every per-stream
//! quantity (conv histories, transposed-conv tails, KV rings and step
//! counters, the replicate-padding flag) lives in a [`MimiState`] indexed by
//! slot, and every scratch buffer is allocated by [`Mimi::new_state`] for
//! `max_slots`, so the step functions never allocate. Active slots are packed
//! into contiguous rows so that matrix products run once over all of them; a
//! slot's result does not depend on which other slots run with it, and an
//! inactive slot is neither read nor written.

mod act;
mod conv;
mod linear;
mod quantizer;
mod resample;
mod seanet;
mod transformer;

/// Floats of one im2col chunk of the convolutions (bigger products are split).
pub(crate) use conv::COL_CAP;

use crate::config::MimiConfig;
use crate::weights::{CheckpointError, TensorSpec, Weights};
use conv::{ConvState, ConvTrState, StreamingConv1d, StreamingConvTr1d};
use quantizer::{QuantScratch, SplitRvq};
use seanet::{Buffers, Seanet, SeanetState};
use transformer::{MimiTransformer, TransformerScratch, TransformerState};

/// The Mimi codec: weights and shapes, immutable after loading.
#[derive(Debug, Clone)]
pub struct Mimi {
    frame_samples: usize,
    /// Encoder-rate steps per token frame.
    stride: usize,
    dim: usize,
    encoder: Seanet,
    encoder_transformer: MimiTransformer,
    downsample: Option<StreamingConv1d>,
    quantizer: SplitRvq,
    upsample: Option<StreamingConvTr1d>,
    decoder_transformer: MimiTransformer,
    decoder: Seanet,
}

/// All per-slot streaming state of a [`Mimi`] (encoder and decoder side) and
/// the scratch of one step, for up to `max_slots` slots.
#[derive(Debug, Clone)]
pub struct MimiState {
    max_slots: usize,
    encoder: SeanetState,
    encoder_transformer: TransformerState,
    downsample: Option<ConvState>,
    upsample: Option<ConvTrState>,
    decoder_transformer: TransformerState,
    decoder: SeanetState,
    bufs: Buffers,
    tr_scratch: TransformerScratch,
    q_scratch: QuantScratch,
    slots: Vec<usize>,
    codes: Vec<u32>,
}

impl Mimi {
    /// The architecture for `cfg`, without weights.
    fn skeleton(cfg: &MimiConfig, num_codebooks: usize) -> Mimi {
        let stride = cfg.downsample_stride();
        let dim = cfg.seanet.dimension;
        Mimi {
            frame_samples: cfg.frame_samples(),
            stride,
            dim,
            encoder: Seanet::encoder(&cfg.seanet),
            encoder_transformer: MimiTransformer::new("encoder_transformer", &cfg.transformer),
            downsample: (stride > 1).then(|| resample::downsample(dim, stride)),
            quantizer: SplitRvq::new(&cfg.quantizer, num_codebooks),
            upsample: (stride > 1).then(|| resample::upsample(dim, stride)),
            decoder_transformer: MimiTransformer::new("decoder_transformer", &cfg.transformer),
            decoder: Seanet::decoder(&cfg.seanet),
        }
    }

    /// Every tensor (name and shape) a checkpoint for `cfg` holds.
    pub fn tensor_specs(cfg: &MimiConfig) -> Vec<TensorSpec> {
        let m = Self::skeleton(cfg, 1);
        let mut out = Vec::new();
        m.encoder.specs(&mut out);
        m.decoder.specs(&mut out);
        m.encoder_transformer.specs(&mut out);
        m.decoder_transformer.specs(&mut out);
        if let Some(d) = &m.downsample {
            d.specs(&mut out);
        }
        if let Some(u) = &m.upsample {
            u.specs(&mut out);
        }
        m.quantizer.specs(&mut out);
        out
    }

    /// Loads the weights for `cfg`, using the first `num_codebooks` codebooks.
    /// Takes exactly the tensors of [`Mimi::tensor_specs`].
    ///
    /// # Panics
    /// If `num_codebooks` is 0 or more than the checkpoint's `n_q`.
    pub fn load(
        cfg: &MimiConfig,
        weights: &mut Weights,
        num_codebooks: usize,
    ) -> Result<Mimi, CheckpointError> {
        let mut m = Self::skeleton(cfg, num_codebooks);
        m.encoder.load(weights)?;
        m.decoder.load(weights)?;
        m.encoder_transformer.load(weights)?;
        m.decoder_transformer.load(weights)?;
        if let Some(d) = &mut m.downsample {
            d.load(weights)?;
        }
        if let Some(u) = &mut m.upsample {
            u.load(weights)?;
        }
        m.quantizer.load(weights)?;
        Ok(m)
    }

    /// Codebooks per frame.
    pub fn num_codebooks(&self) -> usize {
        self.quantizer.used()
    }

    /// Entries per codebook.
    pub fn cardinality(&self) -> usize {
        self.quantizer.bins()
    }

    /// Audio samples per frame.
    pub fn frame_samples(&self) -> usize {
        self.frame_samples
    }

    /// A state for up to `max_slots` streams, every slot fresh. Panics when
    /// the memory cannot be had: loaders use [`Mimi::try_new_state`].
    pub fn new_state(&self, max_slots: usize) -> MimiState {
        self.try_new_state(max_slots)
            .unwrap_or_else(|e| panic!("Mimi state for {max_slots} slots: {e}"))
    }

    /// [`Mimi::new_state`] with the transformers' KV rings (the part that
    /// grows with the context) allocated fallibly.
    pub fn try_new_state(&self, max_slots: usize) -> Result<MimiState, crate::alloc::AllocError> {
        let n = max_slots;
        let s = self.stride;
        let (ea, ec) = self.encoder.scratch_need(n, self.frame_samples);
        let (da, dc) = self.decoder.scratch_need(n, s);
        let mut act = ea.max(da).max(n * s * self.dim);
        let mut col = ec.max(dc);
        if let Some(d) = &self.downsample {
            col = col.max(d.col_need(n, s));
        }
        if let Some(u) = &self.upsample {
            col = col.max(u.col_need(n, 1));
        }
        act = act.max(n * self.frame_samples);
        Ok(MimiState {
            max_slots,
            encoder: self.encoder.new_state(n),
            encoder_transformer: self.encoder_transformer.try_new_state(n)?,
            downsample: self.downsample.as_ref().map(|d| d.new_state(n)),
            upsample: self.upsample.as_ref().map(|u| u.new_state(n)),
            decoder_transformer: self.decoder_transformer.try_new_state(n)?,
            decoder: self.decoder.new_state(n),
            bufs: Buffers::new(act, col.max(1)),
            tr_scratch: self.encoder_transformer.new_scratch(n * s),
            q_scratch: self.quantizer.new_scratch(n),
            slots: Vec::with_capacity(n),
            codes: vec![0; n * self.num_codebooks()],
        })
    }

    /// Makes `slot` as good as new (encoder and decoder side).
    pub fn reset_slot(&self, state: &mut MimiState, slot: usize) {
        assert!(slot < state.max_slots, "slot {slot} out of range");
        self.encoder.reset(&mut state.encoder, slot);
        self.encoder_transformer
            .reset(&mut state.encoder_transformer, slot);
        if let (Some(d), Some(st)) = (&self.downsample, &mut state.downsample) {
            d.reset(st, slot);
        }
        if let (Some(u), Some(st)) = (&self.upsample, &mut state.upsample) {
            u.reset(st, slot);
        }
        self.decoder_transformer
            .reset(&mut state.decoder_transformer, slot);
        self.decoder.reset(&mut state.decoder, slot);
    }

    fn gather_slots(state: &mut MimiState, active: &[bool]) {
        assert_eq!(active.len(), state.max_slots, "one `active` flag per slot");
        state.slots.clear();
        state.slots.extend(
            active
                .iter()
                .enumerate()
                .filter(|(_, &a)| a)
                .map(|(s, _)| s),
        );
    }

    /// Encodes one frame for each active slot.
    ///
    /// `pcm`: `max_slots × frame_samples` (one row per slot); `codes_out`:
    /// `max_slots × num_codebooks`. Rows of inactive slots are neither read
    /// nor written, and their state does not change.
    pub fn encode_step(
        &self,
        state: &mut MimiState,
        pcm: &[f32],
        active: &[bool],
        codes_out: &mut [u32],
    ) {
        let (fs, nq) = (self.frame_samples, self.num_codebooks());
        assert_eq!(
            pcm.len(),
            state.max_slots * fs,
            "pcm must be max_slots × frame_samples"
        );
        assert_eq!(
            codes_out.len(),
            state.max_slots * nq,
            "codes_out must be max_slots × num_codebooks"
        );
        Self::gather_slots(state, active);
        let n = state.slots.len();
        if n == 0 {
            return;
        }
        let st = state;
        for (j, &s) in st.slots.iter().enumerate() {
            st.bufs.a[j * fs..(j + 1) * fs].copy_from_slice(&pcm[s * fs..(s + 1) * fs]);
        }
        let t = self
            .encoder
            .forward(&mut st.encoder, &st.slots, &mut st.bufs, fs);
        debug_assert_eq!(t, self.stride);
        self.encoder_transformer.forward(
            &mut st.encoder_transformer,
            &mut st.tr_scratch,
            &st.slots,
            &mut st.bufs.a,
            t,
        );
        let latent: &[f32] = match (&self.downsample, &mut st.downsample) {
            (Some(d), Some(ds)) => {
                d.forward(
                    ds,
                    &st.slots,
                    &st.bufs.a,
                    t,
                    &mut st.bufs.col,
                    &mut st.bufs.b,
                );
                &st.bufs.b
            }
            _ => &st.bufs.a,
        };
        self.quantizer
            .encode(&mut st.q_scratch, latent, n, &mut st.codes[..n * nq]);
        for (j, &s) in st.slots.iter().enumerate() {
            codes_out[s * nq..(s + 1) * nq].copy_from_slice(&st.codes[j * nq..(j + 1) * nq]);
        }
    }

    /// Decodes one frame of codes for each active slot.
    ///
    /// `codes`: `max_slots × num_codebooks`; `pcm_out`: `max_slots ×
    /// frame_samples`. Rows of inactive slots are neither read nor written,
    /// and their state does not change.
    ///
    /// # Panics
    /// If an active slot's code is not below [`Mimi::cardinality`].
    pub fn decode_step(
        &self,
        state: &mut MimiState,
        codes: &[u32],
        active: &[bool],
        pcm_out: &mut [f32],
    ) {
        let (fs, nq, dim) = (self.frame_samples, self.num_codebooks(), self.dim);
        assert_eq!(
            codes.len(),
            state.max_slots * nq,
            "codes must be max_slots × num_codebooks"
        );
        assert_eq!(
            pcm_out.len(),
            state.max_slots * fs,
            "pcm_out must be max_slots × frame_samples"
        );
        Self::gather_slots(state, active);
        let n = state.slots.len();
        if n == 0 {
            return;
        }
        let st = state;
        for (j, &s) in st.slots.iter().enumerate() {
            st.codes[j * nq..(j + 1) * nq].copy_from_slice(&codes[s * nq..(s + 1) * nq]);
        }
        let t = self.stride;
        match (&self.upsample, &mut st.upsample) {
            (Some(u), Some(us)) => {
                self.quantizer.decode(
                    &mut st.q_scratch,
                    &st.codes[..n * nq],
                    n,
                    &mut st.bufs.b[..n * dim],
                );
                u.forward(
                    us,
                    &st.slots,
                    &st.bufs.b,
                    1,
                    &mut st.bufs.col,
                    &mut st.bufs.a,
                );
            }
            _ => self.quantizer.decode(
                &mut st.q_scratch,
                &st.codes[..n * nq],
                n,
                &mut st.bufs.a[..n * dim],
            ),
        }
        self.decoder_transformer.forward(
            &mut st.decoder_transformer,
            &mut st.tr_scratch,
            &st.slots,
            &mut st.bufs.a,
            t,
        );
        let t_out = self
            .decoder
            .forward(&mut st.decoder, &st.slots, &mut st.bufs, t);
        debug_assert_eq!(t_out, fs);
        for (j, &s) in st.slots.iter().enumerate() {
            pcm_out[s * fs..(s + 1) * fs].copy_from_slice(&st.bufs.a[j * fs..(j + 1) * fs]);
        }
    }
}
