//! RoPE + ring KV-cache writes and single-query attention (attention.cu).
//!
//! A call is two launches: [`AttnKernels::rope_kv_write`] (rotates q in place
//! inside `qkv`, writes k and v at ring index `pos % capacity` of each active
//! row's cache row) and then [`AttnKernels::attend`] (one query per row over
//! its window of the ring). They are separate kernels so that every write of
//! a call is complete before any attention reads (Mimi writes two positions
//! per call).

use super::{dim, int};
use crate::device::{Arg, DType, DevPtr, Device, DeviceError, DeviceResult, KernelId, NULL};

/// `ROPE_THREADS` of attention.cu.
pub const ROPE_THREADS: u32 = 128;
/// `ATT_THREADS` of attention.cu.
pub const ATT_THREADS: u32 = 128;
/// `ATT_MAX_HEAD_DIM` of attention.cu.
pub const ATT_MAX_HEAD_DIM: usize = 256;

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
    fn head_dim(&self) -> DeviceResult<usize> {
        const WHAT: &str = "attention";
        if self.heads == 0 || !self.dim.is_multiple_of(self.heads) {
            return Err(DeviceError::shape(
                WHAT,
                format!("dim {} over {} heads", self.dim, self.heads),
            ));
        }
        let hd = self.dim / self.heads;
        if !hd.is_multiple_of(2) || hd > ATT_MAX_HEAD_DIM {
            return Err(DeviceError::shape(
                WHAT,
                format!("head_dim {hd} must be even and at most {ATT_MAX_HEAD_DIM}"),
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
}

impl AttnKernels {
    /// Resolves the kernels.
    pub fn resolve<D: Device + ?Sized>(dev: &D) -> DeviceResult<Self> {
        Ok(AttnKernels {
            rope_bf16: dev.kernel("rope_kv_write_bf16")?,
            rope_fp8: dev.kernel("rope_kv_write_fp8")?,
            rope_f32: dev.kernel("rope_kv_write_f32")?,
            att_bf16: dev.kernel("attn_decode_bf16")?,
            att_fp8: dev.kernel("attn_decode_fp8")?,
            att_f32: dev.kernel("attn_decode_f32")?,
            att_bf16_f32out: dev.kernel("attn_decode_bf16_f32out")?,
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
    /// Supported pairs: bf16 → bf16, fp8 → bf16, f32 → f32, bf16 → f32.
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
        const WHAT: &str = "attn_decode";
        let hd = s.head_dim()?;
        if qkv == NULL || row_info == NULL || k_cache == NULL || v_cache == NULL || out == NULL {
            return Err(DeviceError::shape(WHAT, "null operand"));
        }
        let scale = 1.0 / (hd as f32).sqrt();
        let head = [
            Arg::Ptr(qkv),
            Arg::Ptr(k_cache),
            Arg::Ptr(v_cache),
            Arg::Ptr(row_info),
            Arg::I32(int(WHAT, s.dim)?),
            Arg::I32(int(WHAT, s.kv_dim())?),
            Arg::I32(int(WHAT, hd)?),
            Arg::I32(int(WHAT, s.capacity)?),
            Arg::I32(int(WHAT, s.context)?),
            Arg::F32(scale),
        ];
        let grid = (dim(WHAT, s.heads)?, dim(WHAT, s.rows)?, 1);
        let plain = |k: KernelId, dev: &mut D| {
            let mut args = [Arg::Ptr(out); 11];
            args[..10].copy_from_slice(&head);
            dev.launch(k, grid, ATT_THREADS, &args)
        };
        match (kv, out_type) {
            (KvType::Bf16, DType::Bf16) => plain(self.att_bf16, dev),
            (KvType::F32, DType::F32) => plain(self.att_f32, dev),
            (KvType::Bf16, DType::F32) => plain(self.att_bf16_f32out, dev),
            (KvType::Fp8 { scale: kv_scale }, DType::Bf16) => {
                let mut args = [Arg::Ptr(out); 12];
                args[..10].copy_from_slice(&head);
                args[10] = Arg::F32(kv_scale);
                dev.launch(self.att_fp8, grid, ATT_THREADS, &args)
            }
            (kv, o) => Err(DeviceError::shape(
                WHAT,
                format!("no kernel for a {kv:?} cache with {o:?} output"),
            )),
        }
    }
}
