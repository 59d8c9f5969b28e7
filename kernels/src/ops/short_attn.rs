//! RoPE, KV write and attention over a short cache in one launch
//! (short_attn.cu): the depformer's attention, which attends over at most
//! [`SA_MAX_KEYS`] positions of a per-frame cache and writes one new position
//! per row and call. Same semantics as [`AttnKernels::rope_kv_write`]
//! followed by [`AttnKernels::attend`], one launch instead of two.
//!
//! [`AttnKernels::rope_kv_write`]: super::attention::AttnKernels::rope_kv_write
//! [`AttnKernels::attend`]: super::attention::AttnKernels::attend

use super::attention::{AttnShape, KvType};
use super::{dim, int};
use crate::device::{Arg, DevPtr, Device, DeviceError, DeviceResult, KernelId, NULL};

/// `SA_THREADS` of short_attn.cu.
pub const SA_THREADS: u32 = 128;
/// `SA_MAX_KEYS` of short_attn.cu: the longest window.
pub const SA_MAX_KEYS: usize = 32;
/// `SA_MAX_HEAD_DIM` of short_attn.cu.
pub const SA_MAX_HEAD_DIM: usize = 256;
/// Query heads per block (`SA_WARPS`).
const SA_WARPS: usize = SA_THREADS as usize / 32;

/// The short-attention kernels of one device.
#[derive(Debug, Clone, Copy)]
pub struct ShortAttnKernels {
    f32: KernelId,
    bf16: KernelId,
}

impl ShortAttnKernels {
    /// Resolves the kernels.
    pub fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(ShortAttnKernels {
            f32: dev.kernel("short_attn_f32")?,
            bf16: dev.kernel("short_attn_bf16")?,
        })
    }

    /// Whether a stack of this shape and cache type can use the fused
    /// kernel: a window of at most [`SA_MAX_KEYS`] positions, an f32 or bf16
    /// cache, a head width it holds. The caller also guarantees one new
    /// position per row and call (`RowInfo::last == pos`).
    pub fn takes(s: &AttnShape, kv: KvType) -> bool {
        let hd = s.dim / s.heads.max(1);
        matches!(kv, KvType::F32 | KvType::Bf16)
            && s.heads > 0
            && s.dim.is_multiple_of(s.heads)
            && hd.is_multiple_of(2)
            && hd <= SA_MAX_HEAD_DIM
            && s.kv_heads > 0
            && s.heads.is_multiple_of(s.kv_heads)
            && s.capacity > 0
            && s.context.min(s.capacity) <= SA_MAX_KEYS
    }

    /// Rotates q and k of every active row (`freqs`: `head_dim / 2`
    /// frequencies, or NULL for none), writes k and v at ring index
    /// `pos % capacity`, and attends over the row's window into `out`
    /// (`[rows][dim]`, the cache's type). `qkv` is not modified.
    #[allow(clippy::too_many_arguments)]
    pub fn attend<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        kv: KvType,
        qkv: DevPtr,
        freqs: DevPtr,
        row_info: DevPtr,
        k_cache: DevPtr,
        v_cache: DevPtr,
        s: &AttnShape,
        out: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "short_attn";
        if !Self::takes(s, kv) {
            return Err(DeviceError::shape(
                WHAT,
                format!("{s:?} with a {kv:?} cache"),
            ));
        }
        if [qkv, row_info, k_cache, v_cache, out].contains(&NULL) {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        let kernel = match kv {
            KvType::F32 => self.f32,
            _ => self.bf16,
        };
        let hd = s.dim / s.heads;
        dev.launch(
            kernel,
            (
                dim(WHAT, s.heads.div_ceil(SA_WARPS))?,
                dim(WHAT, s.rows)?,
                1,
            ),
            SA_THREADS,
            &[
                Arg::Ptr(qkv),
                Arg::Ptr(freqs),
                Arg::Ptr(row_info),
                Arg::Ptr(k_cache),
                Arg::Ptr(v_cache),
                Arg::I32(int(WHAT, s.heads)?),
                Arg::I32(int(WHAT, s.dim)?),
                Arg::I32(int(WHAT, s.kv_dim())?),
                Arg::I32(int(WHAT, hd)?),
                Arg::I32(int(WHAT, s.capacity)?),
                Arg::I32(int(WHAT, s.context)?),
                Arg::I32(s.rope_interleaved as i32),
                Arg::F32(1.0 / (hd as f32).sqrt()),
                Arg::Ptr(out),
            ],
        )
    }
}
