//! RoPE + ring KV-cache writes and single-query attention (attention.cu).
//!
//! A call is two or three launches: [`AttnKernels::rope_kv_write`] (rotates q
//! in place inside `qkv`, writes k and v at ring index `pos % capacity` of
//! each active row's cache row), then [`AttnKernels::attend_split`] (one
//! query per row over its window of the ring, the window cut into `splits`
//! runs of keys that blocks take in parallel: Flash-Decoding) and, with more
//! than one split, the combine that merges them. They are separate kernels
//! so that every write of a call is complete before any attention reads
//! (Mimi writes two positions per call). One kernel serves bf16, fp8 and f32
//! caches and grouped-query heads (a block reads a key/value head once for
//! the query heads that share it).
//!
//! The number of splits is chosen on the host ([`attn_splits`]) from the
//! blocks a call has without splitting, the keys and the device's
//! multiprocessors, so it is fixed per batch bucket (graphs replay fixed
//! launch shapes).

use super::{dim, int};
use crate::device::{Arg, DType, DevPtr, Device, DeviceError, DeviceResult, KernelId, NULL};

/// `ROPE_THREADS` of attention.cu.
pub const ROPE_THREADS: u32 = 128;
/// `ATT_THREADS` of attention.cu.
pub const ATT_THREADS: u32 = 128;
/// `ATT_MAX_HEAD_DIM` of attention.cu.
pub const ATT_MAX_HEAD_DIM: usize = 256;
/// `ATT_VEC` of attention.cu: head widths are multiples of it.
pub const ATT_VEC: usize = 8;
/// `ATT_HEADS_PER_BLOCK` of attention.cu: query heads of one key/value head
/// per block.
pub const ATT_HEADS_PER_BLOCK: usize = 2;
/// `ATT_MAX_SPLITS` of attention.cu: the most splits of one call.
pub const ATT_MAX_SPLITS: usize = 32;
/// Fewest keys a split is given (fewer would spend more on merging than on
/// reading).
pub const ATT_MIN_KEYS_PER_SPLIT: usize = 64;
/// Blocks per multiprocessor a call aims at before it splits keys no more.
pub const ATT_BLOCKS_PER_SM: usize = 4;
/// 2^120: the factor the fp8 reads leave out (attention.cu).
const FP8_READ_FACTOR: f32 = f32::from_bits(0x7b80_0000);

/// How many splits a call of `rows` rows attending up to `keys` keys uses on
/// a device of `sms` multiprocessors: enough blocks to fill the device
/// ([`ATT_BLOCKS_PER_SM`] each), each split at least
/// [`ATT_MIN_KEYS_PER_SPLIT`] keys, at most [`ATT_MAX_SPLITS`].
pub fn attn_splits(s: &AttnShape, keys: usize, sms: usize) -> usize {
    let blocks = s.kv_heads.max(1) * head_blocks(s) * s.rows.max(1);
    let target = ATT_BLOCKS_PER_SM * sms.max(1);
    if blocks >= target {
        return 1;
    }
    target
        .div_ceil(blocks)
        .min(keys / ATT_MIN_KEYS_PER_SPLIT)
        .clamp(1, ATT_MAX_SPLITS)
}

/// f32 of the partial results of a call with `splits` splits (0 with one).
pub fn attn_partial_floats(s: &AttnShape, splits: usize) -> usize {
    if splits <= 1 {
        return 0;
    }
    let hd = s.dim / s.heads.max(1);
    s.rows * s.heads * splits * (hd + 2)
}

/// Blocks per key/value head: query heads of the group over
/// [`ATT_HEADS_PER_BLOCK`].
fn head_blocks(s: &AttnShape) -> usize {
    (s.heads / s.kv_heads.max(1)).div_ceil(ATT_HEADS_PER_BLOCK)
}

/// Element type of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvType {
    /// float32.
    F32,
    /// bfloat16.
    Bf16,
    /// fp8 e4m3, values stored divided by `scale`.
    Fp8 {
        /// The cache's scale.
        scale: f32,
    },
}

impl KvType {
    /// Bytes per cached value.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::Bf16 => 2,
            KvType::Fp8 { .. } => 1,
        }
    }
}

/// Shape of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    /// Model width (heads × head_dim).
    pub dim: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (`heads / kv_repeat`; `heads` without grouped-query
    /// attention). `qkv` rows hold `dim + 2 · kv_dim` values and the caches
    /// `kv_dim` per position, `kv_dim = kv_heads · head_dim`.
    pub kv_heads: usize,
    /// RoPE over interleaved pairs (`rope`) or over the two halves of each
    /// head (`rope_concat`); unused without rotary frequencies.
    pub rope_interleaved: bool,
    /// Ring length of each cache row.
    pub capacity: usize,
    /// Attention context (keys a query may see, itself included).
    pub context: usize,
    /// Rows of `qkv` (and of `RowInfo`).
    pub rows: usize,
}

impl AttnShape {
    /// The width of a head, or why the shape has no kernel.
    pub fn head_dim(&self) -> DeviceResult<usize> {
        const WHAT: &str = "attention";
        if self.heads == 0 || !self.dim.is_multiple_of(self.heads) {
            return Err(DeviceError::shape(
                WHAT,
                format!("dim {} over {} heads", self.dim, self.heads),
            ));
        }
        let hd = self.dim / self.heads;
        if !hd.is_multiple_of(ATT_VEC) || hd > ATT_MAX_HEAD_DIM {
            return Err(DeviceError::shape(
                WHAT,
                format!(
                    "head_dim {hd} must be a multiple of {ATT_VEC} and at most {ATT_MAX_HEAD_DIM}"
                ),
            ));
        }
        if self.capacity == 0 || self.context == 0 {
            return Err(DeviceError::shape(WHAT, "empty cache or context"));
        }
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(DeviceError::shape(
                WHAT,
                format!(
                    "{} key/value heads for {} query heads",
                    self.kv_heads, self.heads
                ),
            ));
        }
        Ok(hd)
    }

    /// Width of the keys (and values) of one position.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * (self.dim / self.heads.max(1))
    }

    /// Values per `qkv` row: queries, keys, values.
    pub fn qkv_dim(&self) -> usize {
        self.dim + 2 * self.kv_dim()
    }
}

/// The attention kernels of one device.
#[derive(Debug, Clone, Copy)]
pub struct AttnKernels {
    rope_bf16: KernelId,
    rope_fp8: KernelId,
    rope_f32: KernelId,
    att_bf16: KernelId,
    att_fp8: KernelId,
    att_f32: KernelId,
    att_bf16_f32out: KernelId,
    combine_bf16: KernelId,
    combine_f32: KernelId,
}

impl AttnKernels {
    /// Resolves the kernels.
    pub fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(AttnKernels {
            rope_bf16: dev.kernel("rope_kv_write_bf16")?,
            rope_fp8: dev.kernel("rope_kv_write_fp8")?,
            rope_f32: dev.kernel("rope_kv_write_f32")?,
            att_bf16: dev.kernel("attn_split_bf16")?,
            att_fp8: dev.kernel("attn_split_fp8")?,
            att_f32: dev.kernel("attn_split_f32")?,
            att_bf16_f32out: dev.kernel("attn_split_bf16_f32out")?,
            combine_bf16: dev.kernel("attn_combine_bf16")?,
            combine_f32: dev.kernel("attn_combine_f32")?,
        })
    }

    /// Rotates q and k of every active row of `qkv` (`[rows][dim + 2·kv_dim]`
    /// f32) by the row's position (`freqs`: head_dim/2 f32, or NULL for no
    /// rotary embedding) and writes k, v into the caches (`[cache
    /// rows][capacity][kv_dim]`).
    #[allow(clippy::too_many_arguments)]
    pub fn rope_kv_write<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        kv: KvType,
        qkv: DevPtr,
        freqs: DevPtr,
        row_info: DevPtr,
        k_cache: DevPtr,
        v_cache: DevPtr,
        s: &AttnShape,
    ) -> DeviceResult<()> {
        const WHAT: &str = "rope_kv_write";
        let hd = s.head_dim()?;
        if qkv == NULL || row_info == NULL || k_cache == NULL || v_cache == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        let common = [
            Arg::Ptr(qkv),
            Arg::Ptr(freqs),
            Arg::Ptr(row_info),
            Arg::Ptr(k_cache),
            Arg::Ptr(v_cache),
            Arg::I32(int(WHAT, s.dim)?),
            Arg::I32(int(WHAT, s.kv_dim())?),
            Arg::I32(int(WHAT, hd)?),
            Arg::I32(int(WHAT, s.capacity)?),
            Arg::I32(s.rope_interleaved as i32),
        ];
        let grid = (dim(WHAT, s.rows)?, 1, 1);
        match kv {
            KvType::F32 => dev.launch(self.rope_f32, grid, ROPE_THREADS, &common),
            KvType::Bf16 => dev.launch(self.rope_bf16, grid, ROPE_THREADS, &common),
            KvType::Fp8 { scale } => {
                let mut args = [Arg::F32(scale); 11];
                args[..10].copy_from_slice(&common);
                dev.launch(self.rope_fp8, grid, ROPE_THREADS, &args)
            }
        }
    }

    /// Attention of each active row's (rotated) query over its cache window,
    /// written to `out` (`[rows][dim]`, `out_type`); inactive rows get zeros.
    /// Supported pairs: bf16 → bf16, fp8 → bf16, f32 → f32, bf16 → f32. One
    /// split (see [`AttnKernels::attend_split`]).
    #[allow(clippy::too_many_arguments)]
    pub fn attend<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        kv: KvType,
        out_type: DType,
        qkv: DevPtr,
        k_cache: DevPtr,
        v_cache: DevPtr,
        row_info: DevPtr,
        s: &AttnShape,
        out: DevPtr,
    ) -> DeviceResult<()> {
        let caches = (k_cache, v_cache, row_info);
        self.attend_split(dev, kv, out_type, qkv, caches, s, (1, NULL), out)
    }

    /// [`AttnKernels::attend`] with each row's window cut into `splits`
    /// runs of keys taken by blocks in parallel and merged by a second
    /// launch: `partial` holds [`attn_partial_floats`] f32 (NULL with one
    /// split).
    #[allow(clippy::too_many_arguments)]
    pub fn attend_split<D: Device + ?Sized>(
        &self,
        dev: &mut D,
        kv: KvType,
        out_type: DType,
        qkv: DevPtr,
        (k_cache, v_cache, row_info): (DevPtr, DevPtr, DevPtr),
        s: &AttnShape,
        (splits, partial): (usize, DevPtr),
        out: DevPtr,
    ) -> DeviceResult<()> {
        const WHAT: &str = "attn_split";
        let hd = s.head_dim()?;
        if qkv == NULL || row_info == NULL || k_cache == NULL || v_cache == NULL || out == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        if splits == 0 || splits > ATT_MAX_SPLITS || (splits > 1 && partial == NULL) {
            return Err(DeviceError::shape(
                WHAT,
                format!(
                    "{splits} splits (1..={ATT_MAX_SPLITS}, more than one with a partial buffer)"
                ),
            ));
        }
        let (kernel, combine, kv_scale) = match (kv, out_type) {
            (KvType::Bf16, DType::Bf16) => (self.att_bf16, self.combine_bf16, 1.0),
            (KvType::F32, DType::F32) => (self.att_f32, self.combine_f32, 1.0),
            (KvType::Bf16, DType::F32) => (self.att_bf16_f32out, self.combine_f32, 1.0),
            (KvType::Fp8 { scale }, DType::Bf16) => {
                (self.att_fp8, self.combine_bf16, scale * FP8_READ_FACTOR)
            }
            (kv, o) => {
                return Err(DeviceError::shape(
                    WHAT,
                    format!("no kernel for a {kv:?} cache with {o:?} output"),
                ))
            }
        };
        let qk_scale = kv_scale * std::f32::consts::LOG2_E / (hd as f32).sqrt();
        let (dim_, hd_) = (int(WHAT, s.dim)?, int(WHAT, hd)?);
        let args = [
            Arg::Ptr(qkv),
            Arg::Ptr(k_cache),
            Arg::Ptr(v_cache),
            Arg::Ptr(row_info),
            Arg::I32(dim_),
            Arg::I32(int(WHAT, s.kv_dim())?),
            Arg::I32(hd_),
            Arg::I32(int(WHAT, s.capacity)?),
            Arg::I32(int(WHAT, s.context)?),
            Arg::F32(qk_scale),
            Arg::F32(kv_scale),
            Arg::Ptr(if splits > 1 { partial } else { NULL }),
            Arg::Ptr(out),
        ];
        let grid = (
            dim(WHAT, s.kv_heads * head_blocks(s))?,
            dim(WHAT, s.rows)?,
            dim(WHAT, splits)?,
        );
        dev.launch(kernel, grid, ATT_THREADS, &args)?;
        if splits == 1 {
            return Ok(());
        }
        let grid = (dim(WHAT, s.heads)?, dim(WHAT, s.rows)?, 1);
        let args = [
            Arg::Ptr(partial),
            Arg::Ptr(row_info),
            Arg::I32(dim_),
            Arg::I32(hd_),
            Arg::I32(int(WHAT, splits)?),
            Arg::F32(kv_scale),
            Arg::Ptr(out),
        ];
        dev.launch(combine, grid, ATT_THREADS, &args)
    }
}
