//! What the float32 CPU backend ([`crate::cpu::CpuModel`]) takes in host
//! memory for a model and a slot count, from the configurations alone — so a
//! machine that cannot hold a checkpoint is told before a weight is read.
//!
//! The figures follow what the backend allocates at load:
//! - weights, every one converted to float32 (the LM's tensors as the
//!   checkpoint lists them; Mimi's as its loader keeps them: the codebooks
//!   in use only, each with its squared norms, as packed distance panels);
//! - per slot: the temporal KV cache at the configured context for each of
//!   the slot's rows (two with guidance rows), the depformer's per-frame KV
//!   cache, Mimi's two transformer KV rings, its streaming convolution
//!   state and its activation buffers, the LM's per-row scratch and logits;
//! - while loading, the largest single tensor twice (a Mimi weight is read
//!   as float32 and then repacked).
//!
//! Invariants: every figure is in bytes; the total for `n` slots is
//! `fixed + weights + transient + n · per_slot`, never counting a buffer
//! twice. `model/tests/footprint.rs` checks these figures against what a
//! real load allocates (a counting allocator over the golden fixtures and
//! the demo), so they cannot drift from the code unseen.

use crate::config::{LmConfig, MimiConfig};
use crate::lm::{depformer_shape, temporal_shape, Lm};
use crate::mimi::Mimi;

/// Host memory the CPU backend needs for one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuFootprint {
    /// LM weights in float32.
    pub lm_weight_bytes: u64,
    /// Mimi weights in float32, as kept after load.
    pub mimi_weight_bytes: u64,
    /// The largest tensor, held twice while it is converted and repacked.
    pub load_transient_bytes: u64,
    /// LM rows per slot (2 with guidance rows).
    pub rows_per_slot: usize,
    /// Temporal and depformer KV caches of one slot (every row), float32.
    pub kv_bytes_per_slot: u64,
    /// Mimi's KV rings, conv state and activation buffers for one slot.
    pub mimi_bytes_per_slot: u64,
    /// LM scratch, logits and token state for one slot.
    pub scratch_bytes_per_slot: u64,
}

/// Buffers that do not grow with the model or the slots: the im2col chunk
/// of Mimi's convolutions ([`crate::mimi`]'s `COL_CAP` floats) and the
/// tables of the SentencePiece pieces, rounded up.
pub const CPU_FIXED_BYTES: u64 = 8 << 20;

fn numel(specs: &[crate::weights::TensorSpec], keep: impl Fn(&str) -> bool) -> u64 {
    specs
        .iter()
        .filter(|t| keep(&t.name))
        .map(|t| t.numel() as u64)
        .sum()
}

impl CpuFootprint {
    /// The footprint of `lm` with `mimi`.
    pub fn new(lm: &LmConfig, mimi: &MimiConfig) -> Self {
        let f = 4u64;
        let lm_specs = Lm::tensor_specs(lm);
        let mimi_specs = Mimi::tensor_specs(mimi);
        let lm_weight_bytes = numel(&lm_specs, |_| true) * f;
        // Mimi keeps the codebooks it uses (the LM's codebooks), each as a
        // distance panel of `bins × (dimension + 2)`, not the checkpoint's
        // `embedding_sum` and `cluster_usage` of every codebook.
        let q = &mimi.quantizer;
        let used = (lm.dep_q.max(lm.num_user_codebooks())).min(q.n_q) as u64;
        let mimi_weight_bytes = numel(&mimi_specs, |n| !n.contains("._codebook.")) * f
            + used * q.bins as u64 * (q.dimension as u64 + 2) * f;
        let largest = lm_specs
            .iter()
            .chain(&mimi_specs)
            .map(|t| t.numel() as u64)
            .max()
            .unwrap_or(0);
        let rows_per_slot = if lm.has_conditioners() { 2 } else { 1 };
        let rows = rows_per_slot as u64;

        let dep = depformer_shape(lm);
        let dep_kv = (dep.layers * 2 * dep.capacity * dep.dim) as u64;
        let kv_bytes_per_slot = rows * (lm.kv_bytes_per_stream(4) as u64 + dep_kv * f);

        let tr = &mimi.transformer;
        let mimi_kv = 2 * (tr.num_layers * 2 * tr.context * tr.d_model) as u64;
        // Activations: four buffers of the widest layer (the SEANet's first
        // and last convolutions: a frame's samples × the filters), and the
        // transformer rows of a frame's latent steps.
        let act = 4 * (mimi.frame_samples() * mimi.seanet.n_filters) as u64;
        let steps = mimi.downsample_stride() as u64;
        let tr_rows = steps * (6 * tr.d_model + tr.dim_feedforward) as u64;
        // Conv histories: at most `kernel` steps of the widest channel count
        // per layer, bounded by the activation width (a generous figure).
        let conv_state = (mimi.seanet.ratios.len() as u64 + 2)
            * 2
            * (mimi.seanet.kernel_size.max(mimi.seanet.last_kernel_size)) as u64
            * (mimi.seanet.dimension as u64).max(mimi.seanet.n_filters as u64 * 16);
        let rvq = (2 * q.dimension + q.input_dimension + 2 * q.bins) as u64;
        // The im2col buffer grows with the slots up to its cap (chunks
        // beyond it): counted per slot, at most the cap each. Its widest
        // product is a first-level residual convolution over a frame.
        let sn = &mimi.seanet;
        let col = (mimi.frame_samples()
            * (sn.residual_kernel_size * sn.n_filters).max(sn.kernel_size * sn.channels))
        .min(crate::mimi::COL_CAP) as u64;
        let mimi_bytes_per_slot = (mimi_kv + act + tr_rows + conv_state + rvq + col) * f;

        let t = temporal_shape(lm);
        let stack = |s: &crate::lm::StackShape| (5 * s.dim + 3 * s.hidden) as u64;
        let row = 2 * lm.dim as u64 // input and output of the temporal stack
            + lm.text_card as u64 // text logits
            + 2 * dep.dim as u64 // depformer input and embedding scratch
            + lm.dim as u64 // condition row
            + lm.card as u64 // audio logits
            + stack(&t).max(stack(&dep));
        let per_slot_tokens = (lm.text_card + 4 * lm.num_codebooks() * (lm.max_delay() + 3)) as u64;
        let scratch_bytes_per_slot = (rows * row + per_slot_tokens) * f;

        CpuFootprint {
            lm_weight_bytes,
            mimi_weight_bytes,
            load_transient_bytes: largest * f,
            rows_per_slot,
            kv_bytes_per_slot,
            mimi_bytes_per_slot,
            scratch_bytes_per_slot,
        }
    }

    /// All weights, as held once loaded.
    pub fn weight_bytes(&self) -> u64 {
        self.lm_weight_bytes + self.mimi_weight_bytes
    }

    /// Everything one slot adds.
    pub fn bytes_per_slot(&self) -> u64 {
        self.kv_bytes_per_slot + self.mimi_bytes_per_slot + self.scratch_bytes_per_slot
    }

    /// Peak host bytes to load and run `slots` slots.
    pub fn bytes_for(&self, slots: usize) -> u64 {
        CPU_FIXED_BYTES
            + self.weight_bytes()
            + self.load_transient_bytes
            + slots as u64 * self.bytes_per_slot()
    }

    /// The most slots that fit in `avail` bytes (0 when not even the
    /// weights do).
    pub fn max_slots(&self, avail: u64) -> usize {
        let base = CPU_FIXED_BYTES + self.weight_bytes() + self.load_transient_bytes;
        avail
            .checked_sub(base)
            .map_or(0, |rest| (rest / self.bytes_per_slot().max(1)) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moshi_7b_in_float32() {
        let f = CpuFootprint::new(&LmConfig::moshi_7b(), &MimiConfig::mimi_default());
        let gb = f.lm_weight_bytes as f64 / 1e9;
        // 7.69 G parameters (the bf16 checkpoint is 15.4 GB) in float32.
        assert!((gb - 30.8).abs() < 0.3, "LM weights {gb} GB");
        // The temporal KV cache at context 3000 in float32: 2 × 32 × 3000 × 4096 × 4.
        let kv = f.kv_bytes_per_slot as f64 / (1u64 << 30) as f64;
        assert!((kv - 2.93).abs() < 0.02, "KV per slot {kv} GiB");
        assert_eq!(f.rows_per_slot, 1);
        // 8 slots of Moshi 7B need more than this 24 GB machine has.
        assert!(f.bytes_for(8) > 50 << 30);
        assert_eq!(f.max_slots(16 << 30), 0);
        assert!(f.max_slots(40 << 30) >= 2);
    }
}
