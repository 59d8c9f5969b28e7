//! Host-side launch code for the individual kernels: device opening, module
//! loading, launch geometry and typed wrappers (norms, RoPE + KV write,
//! attention, SiLU gating, GELU, ELU, sampling, RVQ, streaming convs; not yet
//! the token-cache, embedding, add and cast kernels).
//!
//! **Untested on a GPU.** Everything here compiles against cudarc's driver
//! API (dynamically loaded, so it builds without CUDA), and the geometry is
//! checked against the `#define`s of the `.cu` sources, but no wrapper has
//! been run: the GPU tests at the end of this file are `#[ignore]`d and are
//! meant for `scripts/gpu-check` on a machine with a GPU. Nothing in the
//! daemon calls this module; there is no GPU `StreamingModel`.
//!
//! Conventions (those of `cuda/common.cuh`): bf16 buffers are `CudaSlice<u16>`
//! holding bf16 bits (the workspace's cudarc has no `f16` feature), fp8 e4m3
//! buffers `CudaSlice<u8>`; `SlotStep`, `RowInfo`, `SlotParams` are the
//! `#[repr(C)]` twins of the CUDA structs; an optional pointer argument is
//! passed as a null device pointer. Every wrapper checks the sizes it can
//! (buffer lengths, head width, codebook width) and returns
//! [`LaunchError::Shape`] rather than launching out of bounds.
//!
//! Invariant: a wrapper's grid and block are exactly the geometry its
//! kernel's comment documents; block sizes are the constants below, equal to
//! the sources' `#define`s (a test reads them).

use crate::compile::{self, Arch, CompileError, CompiledModule};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchConfig,
};
use cudarc::driver::{PushKernelArg, ValidAsZeroBits};
use std::collections::HashMap;
use std::sync::Arc;

/// `NORM_THREADS` of norm.cu.
pub const NORM_THREADS: u32 = 256;
/// `ROPE_THREADS` of attention.cu.
pub const ROPE_THREADS: u32 = 128;
/// `ATT_THREADS` of attention.cu.
pub const ATT_THREADS: u32 = 128;
/// `ATT_MAX_HEAD_DIM` of attention.cu.
pub const ATT_MAX_HEAD_DIM: usize = 256;
/// `EW_THREADS` of elementwise.cu.
pub const EW_THREADS: u32 = 256;
/// `TOK_THREADS` of embed.cu.
pub const TOK_THREADS: u32 = 128;
/// `EMB_THREADS` of embed.cu.
pub const EMB_THREADS: u32 = 256;
/// `SAMPLE_THREADS` of sampling.cu.
pub const SAMPLE_THREADS: u32 = 512;
/// `CONV_THREADS` of conv.cu.
pub const CONV_THREADS: u32 = 128;
/// `RVQ_THREADS` of quantizer.cu.
pub const RVQ_THREADS: u32 = 256;
/// `RVQ_DEC_THREADS` of quantizer.cu.
pub const RVQ_DEC_THREADS: u32 = 128;
/// `RVQ_MAX_DIM` of quantizer.cu.
pub const RVQ_MAX_DIM: usize = 512;
/// Grid cap of the grid-stride element-wise kernels.
pub const EW_MAX_BLOCKS: u32 = 8192;

/// One slot-step of a batch (`struct SlotStep` of common.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotStep {
    /// Slot index.
    pub slot: i32,
    /// 0: padding or masked.
    pub active: i32,
    /// Batch row of the conditioned logits.
    pub row_cond: i32,
    /// Batch row of the guidance logits, or −1.
    pub row_null: i32,
}

/// One row of a transformer stack (`struct RowInfo` of common.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowInfo {
    /// Cache row.
    pub kv: i32,
    /// Position of the row's query and key.
    pub pos: i32,
    /// Newest position written into the cache row by this call.
    pub last: i32,
    /// Index of the row's SlotStep.
    pub step: i32,
    /// 0: masked.
    pub active: i32,
}

/// Per-slot sampling parameters (`struct SlotParams` of common.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SlotParams {
    /// Text temperature.
    pub temp_text: f32,
    /// Audio temperature.
    pub temp_audio: f32,
    /// Text top-k (0: all).
    pub top_k_text: i32,
    /// Audio top-k (0: all).
    pub top_k_audio: i32,
    /// Sample (1) or argmax (0).
    pub use_sampling: i32,
    /// Guidance coefficient.
    pub cfg_coef: f32,
}

// SAFETY: plain #[repr(C)] structs of 4-byte scalars, laid out as their CUDA
// twins in common.cuh (sizes checked by a test); every bit pattern is valid.
unsafe impl DeviceRepr for SlotStep {}
// SAFETY: as above.
unsafe impl DeviceRepr for RowInfo {}
// SAFETY: as above.
unsafe impl DeviceRepr for SlotParams {}
// SAFETY: all-zero bits are a valid value of each (an inactive step / row).
unsafe impl ValidAsZeroBits for SlotStep {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for RowInfo {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for SlotParams {}

/// Why a launch (or the device set-up) failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// No libcuda on this machine.
    #[error("no CUDA driver (libcuda) could be loaded")]
    NoDriver,
    /// A driver call failed.
    #[error("CUDA driver: {0:?}")]
    Driver(#[from] DriverError),
    /// Compiling the kernels failed.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// A kernel the loaded modules do not have.
    #[error("kernel `{0}` is not loaded")]
    UnknownKernel(&'static str),
    /// Arguments that do not fit the kernel.
    #[error("{kernel}: {why}")]
    Shape {
        /// The kernel.
        kernel: &'static str,
        /// What is wrong.
        why: String,
    },
    /// cudarc panicked.
    #[error("CUDA call panicked: {0}")]
    Panicked(String),
}

fn shape(kernel: &'static str, why: impl Into<String>) -> LaunchError {
    LaunchError::Shape {
        kernel,
        why: why.into(),
    }
}

fn need<T>(
    kernel: &'static str,
    what: &str,
    s: &CudaSlice<T>,
    n: usize,
) -> Result<(), LaunchError> {
    if s.len() < n {
        return Err(shape(
            kernel,
            format!("`{what}` holds {} elements, needs {n}", s.len()),
        ));
    }
    Ok(())
}

fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn to_u32(kernel: &'static str, what: &str, n: usize) -> Result<u32, LaunchError> {
    u32::try_from(n).map_err(|_| shape(kernel, format!("{what} = {n} is too large")))
}

fn ew_grid(n: usize) -> (u32, u32, u32) {
    let blocks = n
        .div_ceil(EW_THREADS as usize)
        .clamp(1, EW_MAX_BLOCKS as usize);
    (blocks as u32, 1, 1)
}

/// Opens device `ordinal` and tells which architecture to compile for.
/// Looks for libcuda first: its absence is [`LaunchError::NoDriver`], not a panic.
pub fn open_device(ordinal: usize) -> Result<(Arc<CudaContext>, Arch), LaunchError> {
    // SAFETY: `is_culib_present` only dlopens the candidate names of libcuda
    // (running their initialisers, as any load would) and closes them.
    let present = std::panic::catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() })
        .map_err(|_| LaunchError::Panicked("looking for libcuda".into()))?;
    if !present {
        return Err(LaunchError::NoDriver);
    }
    let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
        .map_err(|_| LaunchError::Panicked("CudaContext::new".into()))??;
    let (major, minor) = ctx.compute_capability()?;
    let arch = Arch::from_compute_capability(major as u32, minor as u32)?;
    Ok((ctx, arch))
}

/// Every kernel function, loaded from compiled modules.
pub struct Kernels {
    functions: HashMap<&'static str, CudaFunction>,
}

impl Kernels {
    /// Loads the PTX of `compiled` (from [`compile::compile_all`]) into `ctx`.
    pub fn load(
        ctx: &Arc<CudaContext>,
        compiled: &[CompiledModule],
    ) -> Result<Kernels, LaunchError> {
        let mut functions = HashMap::new();
        for c in compiled {
            let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(c.ptx.clone()))?;
            for &k in c.module.kernels {
                functions.insert(k, module.load_function(k)?);
            }
        }
        Ok(Kernels { functions })
    }

    /// Compiles (or reads from `cache_dir`) every module for `arch` and loads it.
    pub fn compile_and_load(
        ctx: &Arc<CudaContext>,
        arch: Arch,
        include_dirs: Vec<std::path::PathBuf>,
        cache_dir: Option<std::path::PathBuf>,
    ) -> Result<Kernels, LaunchError> {
        let compiled = compile::compile_all(&compile::CompileConfig {
            arch,
            include_dirs,
            cache_dir,
        })?;
        Kernels::load(ctx, &compiled)
    }

    fn f(&self, name: &'static str) -> Result<&CudaFunction, LaunchError> {
        self.functions
            .get(name)
            .ok_or(LaunchError::UnknownKernel(name))
    }
}

/// A null device pointer for optional arguments.
const NULL: u64 = 0;

macro_rules! opt_arg {
    ($b:expr, $opt:expr) => {
        match $opt {
            Some(s) => $b.arg(s),
            None => $b.arg(&NULL),
        }
    };
}

/// Element type of a KV cache buffer, selecting the kernel variant.
pub trait KvElem: DeviceRepr {
    /// `rope_kv_write_*` kernel.
    const ROPE: &'static str;
    /// `attn_decode_*` kernel writing bf16 (LM) or `None`.
    const ATTN_BF16_OUT: Option<&'static str>;
    /// `attn_decode_*` kernel writing f32 (Mimi) or `None`.
    const ATTN_F32_OUT: Option<&'static str>;
}

/// bf16 bits.
impl KvElem for u16 {
    const ROPE: &'static str = "rope_kv_write_bf16";
    const ATTN_BF16_OUT: Option<&'static str> = Some("attn_decode_bf16");
    const ATTN_F32_OUT: Option<&'static str> = Some("attn_decode_bf16_f32out");
}

/// fp8 e4m3 bits.
impl KvElem for u8 {
    const ROPE: &'static str = "rope_kv_write_fp8";
    const ATTN_BF16_OUT: Option<&'static str> = Some("attn_decode_fp8");
    const ATTN_F32_OUT: Option<&'static str> = None;
}

impl KvElem for f32 {
    const ROPE: &'static str = "rope_kv_write_f32";
    const ATTN_BF16_OUT: Option<&'static str> = None;
    const ATTN_F32_OUT: Option<&'static str> = Some("attn_decode_f32");
}

/// Shape of one attention launch.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Model width.
    pub dim: usize,
    /// Heads.
    pub heads: usize,
    /// Ring length of the cache.
    pub capacity: usize,
    /// Attention window.
    pub context: usize,
    /// Rows in the launch.
    pub rows: usize,
    /// Cache rows the cache buffers hold.
    pub cache_rows: usize,
}

impl AttnShape {
    fn head_dim(&self) -> usize {
        self.dim / self.heads.max(1)
    }

    fn check(&self, kernel: &'static str) -> Result<(), LaunchError> {
        let hd = self.head_dim();
        if self.heads == 0
            || !self.dim.is_multiple_of(self.heads)
            || !hd.is_multiple_of(2)
            || hd > ATT_MAX_HEAD_DIM
        {
            return Err(shape(
                kernel,
                format!(
                    "dim {} / heads {} must give an even head width ≤ 256",
                    self.dim, self.heads
                ),
            ));
        }
        if self.capacity == 0 || self.context == 0 {
            return Err(shape(kernel, "capacity and context must be positive"));
        }
        Ok(())
    }
}

/// RoPE on q and k, and this step's keys and values into the ring caches
/// (`rope_kv_write_*`): grid (rows), block ROPE_THREADS. `freqs`: head_dim/2
/// frequencies or `None`. `kv_scale` is used by the fp8 variant only.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write<KV: KvElem>(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    s: AttnShape,
    qkv: &mut CudaSlice<f32>,
    freqs: Option<&CudaSlice<f32>>,
    rows: &CudaSlice<RowInfo>,
    k_cache: &mut CudaSlice<KV>,
    v_cache: &mut CudaSlice<KV>,
    kv_scale: f32,
) -> Result<(), LaunchError> {
    let name = KV::ROPE;
    s.check(name)?;
    need(name, "qkv", qkv, s.rows * 3 * s.dim)?;
    need(name, "rows", rows, s.rows)?;
    need(name, "k_cache", k_cache, s.cache_rows * s.capacity * s.dim)?;
    need(name, "v_cache", v_cache, s.cache_rows * s.capacity * s.dim)?;
    if let Some(f) = freqs {
        need(name, "freqs", f, s.head_dim() / 2)?;
    }
    let (dim, hd, cap) = (s.dim as i32, s.head_dim() as i32, s.capacity as i32);
    let mut b = stream.launch_builder(k.f(name)?);
    b.arg(qkv);
    opt_arg!(b, freqs);
    b.arg(rows)
        .arg(k_cache)
        .arg(v_cache)
        .arg(&dim)
        .arg(&hd)
        .arg(&cap);
    if name == "rope_kv_write_fp8" {
        b.arg(&kv_scale);
    }
    let c = cfg((to_u32(name, "rows", s.rows)?, 1, 1), ROPE_THREADS);
    // SAFETY: the argument list matches the kernel's signature (types and
    // order, fp8's extra scale included); every buffer was checked above to
    // hold what the geometry addresses; row fields are the caller's contract
    // (kv < cache_rows, 0 ≤ pos).
    unsafe { b.launch(c) }?;
    Ok(())
}

/// Single-query attention over the ring caches (`attn_decode_*`): grid
/// (heads, rows), block ATT_THREADS. Output bf16 bits (`u16`, the LM) or f32
/// (Mimi), chosen by `Out`.
#[allow(clippy::too_many_arguments)]
pub fn attn_decode<KV: KvElem, Out: DeviceRepr + AttnOut>(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    s: AttnShape,
    qkv: &CudaSlice<f32>,
    k_cache: &CudaSlice<KV>,
    v_cache: &CudaSlice<KV>,
    rows: &CudaSlice<RowInfo>,
    kv_scale: f32,
    out: &mut CudaSlice<Out>,
) -> Result<(), LaunchError> {
    let name = Out::kernel::<KV>().ok_or(shape(
        "attn_decode",
        "no kernel for this cache/output type pair",
    ))?;
    s.check(name)?;
    need(name, "qkv", qkv, s.rows * 3 * s.dim)?;
    need(name, "rows", rows, s.rows)?;
    need(name, "k_cache", k_cache, s.cache_rows * s.capacity * s.dim)?;
    need(name, "v_cache", v_cache, s.cache_rows * s.capacity * s.dim)?;
    need(name, "out", out, s.rows * s.dim)?;
    let (dim, hd, cap, ctx) = (
        s.dim as i32,
        s.head_dim() as i32,
        s.capacity as i32,
        s.context as i32,
    );
    // As the reference: 1 / sqrt(head_dim) in f32.
    let scale = 1.0 / (s.head_dim() as f32).sqrt();
    let mut b = stream.launch_builder(k.f(name)?);
    b.arg(qkv).arg(k_cache).arg(v_cache).arg(rows);
    b.arg(&dim).arg(&hd).arg(&cap).arg(&ctx).arg(&scale);
    if name == "attn_decode_fp8" {
        b.arg(&kv_scale);
    }
    b.arg(out);
    let c = cfg(
        (
            to_u32(name, "heads", s.heads)?,
            to_u32(name, "rows", s.rows)?,
            1,
        ),
        ATT_THREADS,
    );
    // SAFETY: arguments match the kernel's signature; buffers hold what the
    // geometry addresses (checked above); head_dim ≤ 256 as the kernel requires.
    unsafe { b.launch(c) }?;
    Ok(())
}

/// The output element of an attention launch.
pub trait AttnOut {
    /// The kernel for a cache type.
    fn kernel<KV: KvElem>() -> Option<&'static str>;
}

impl AttnOut for u16 {
    fn kernel<KV: KvElem>() -> Option<&'static str> {
        KV::ATTN_BF16_OUT
    }
}

impl AttnOut for f32 {
    fn kernel<KV: KvElem>() -> Option<&'static str> {
        KV::ATTN_F32_OUT
    }
}

/// RMSNorm rows (`rms_norm_bf16` for `u16` output, `rms_norm_f32` for f32):
/// grid (rows), block NORM_THREADS.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm<Out: DeviceRepr + NormOut>(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    x: &CudaSlice<f32>,
    alpha: &CudaSlice<f32>,
    eps: f32,
    dim: usize,
    n_rows: usize,
    rows: Option<&CudaSlice<RowInfo>>,
    y: &mut CudaSlice<Out>,
) -> Result<(), LaunchError> {
    let name = Out::RMS;
    need(name, "x", x, n_rows * dim)?;
    need(name, "alpha", alpha, dim)?;
    need(name, "y", y, n_rows * dim)?;
    if let Some(r) = rows {
        need(name, "rows", r, n_rows)?;
    }
    let d = dim as i32;
    let mut b = stream.launch_builder(k.f(name)?);
    b.arg(x).arg(alpha).arg(&eps).arg(&d);
    opt_arg!(b, rows);
    b.arg(y);
    // SAFETY: arguments match the kernel's signature; sizes checked above.
    unsafe { b.launch(cfg((to_u32(name, "rows", n_rows)?, 1, 1), NORM_THREADS)) }?;
    Ok(())
}

/// The output element of an RMSNorm launch.
pub trait NormOut {
    /// The kernel.
    const RMS: &'static str;
}

impl NormOut for u16 {
    const RMS: &'static str = "rms_norm_bf16";
}

impl NormOut for f32 {
    const RMS: &'static str = "rms_norm_f32";
}

/// LayerNorm rows, f32 (`layer_norm_f32`): grid (rows), block NORM_THREADS.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    bias: &CudaSlice<f32>,
    eps: f32,
    dim: usize,
    n_rows: usize,
    rows: Option<&CudaSlice<RowInfo>>,
    y: &mut CudaSlice<f32>,
) -> Result<(), LaunchError> {
    let name = "layer_norm_f32";
    need(name, "x", x, n_rows * dim)?;
    need(name, "w", w, dim)?;
    need(name, "bias", bias, dim)?;
    need(name, "y", y, n_rows * dim)?;
    let d = dim as i32;
    let mut b = stream.launch_builder(k.f(name)?);
    b.arg(x).arg(w).arg(bias).arg(&eps).arg(&d);
    opt_arg!(b, rows);
    b.arg(y);
    // SAFETY: arguments match the kernel's signature; sizes checked above.
    unsafe { b.launch(cfg((to_u32(name, "rows", n_rows)?, 1, 1), NORM_THREADS)) }?;
    Ok(())
}

/// `act = silu(gate) · value` into bf16 bits (`silu_gate_bf16`): grid-stride.
pub fn silu_gate(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    ff: &CudaSlice<f32>,
    hidden: usize,
    n_rows: usize,
    act: &mut CudaSlice<u16>,
) -> Result<(), LaunchError> {
    let name = "silu_gate_bf16";
    need(name, "ff", ff, n_rows * 2 * hidden)?;
    need(name, "act", act, n_rows * hidden)?;
    let (h, r) = (hidden as i32, n_rows as i32);
    let mut b = stream.launch_builder(k.f(name)?);
    b.arg(ff).arg(&h).arg(&r).arg(act);
    // SAFETY: arguments match the kernel's signature; sizes checked above.
    unsafe { b.launch(cfg(ew_grid(n_rows * hidden), EW_THREADS)) }?;
    Ok(())
}

/// In-place exact GELU (`gelu_f32`) over the first `n` values.
pub fn gelu(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    x: &mut CudaSlice<f32>,
    n: usize,
) -> Result<(), LaunchError> {
    let name = "gelu_f32";
    need(name, "x", x, n)?;
    let mut b = stream.launch_builder(k.f(name)?);
    b.arg(x).arg(&n);
    // SAFETY: (float*, size_t) as the kernel; size checked above.
    unsafe { b.launch(cfg(ew_grid(n), EW_THREADS)) }?;
    Ok(())
}

/// `y = elu(x)` (`elu_f32`) over the first `n` values.
pub fn elu(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    n: usize,
) -> Result<(), LaunchError> {
    let name = "elu_f32";
    need(name, "x", x, n)?;
    need(name, "y", y, n)?;
    let mut b = stream.launch_builder(k.f(name)?);
    b.arg(x).arg(y).arg(&n);
    // SAFETY: (const float*, float*, size_t) as the kernel; sizes checked above.
    unsafe { b.launch(cfg(ew_grid(n), EW_THREADS)) }?;
    Ok(())
}

/// Samples one token per active step (`sample_tokens`): grid (steps), block
/// SAMPLE_THREADS. `audio` picks the audio or text parameters; the token of
/// step `s` goes to `out[s · out_stride]`; `rng` is `[max_slots][4]`.
#[allow(clippy::too_many_arguments)]
pub fn sample_tokens(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    logits: &CudaSlice<f32>,
    vocab: usize,
    ld: usize,
    steps: &CudaSlice<SlotStep>,
    n_steps: usize,
    params: &CudaSlice<SlotParams>,
    audio: bool,
    rng: &mut CudaSlice<u64>,
    out: &mut CudaSlice<u32>,
    out_stride: usize,
) -> Result<(), LaunchError> {
    let name = "sample_tokens";
    if vocab == 0 || ld < vocab {
        return Err(shape(name, format!("vocab {vocab} with row stride {ld}")));
    }
    need(name, "steps", steps, n_steps)?;
    need(name, "out", out, n_steps.saturating_sub(1) * out_stride + 1)?;
    let max_slots = params.len().min(rng.len() / 4);
    if max_slots == 0 {
        return Err(shape(name, "no slot parameters or RNG states"));
    }
    let (v, l, a, os) = (vocab as i32, ld as i32, audio as i32, out_stride as i32);
    let mut b = stream.launch_builder(k.f(name)?);
    b.arg(logits)
        .arg(&v)
        .arg(&l)
        .arg(steps)
        .arg(params)
        .arg(&a)
        .arg(rng)
        .arg(out)
        .arg(&os);
    // SAFETY: arguments match the kernel's signature; steps and out checked
    // above; the caller guarantees each active step's slot < max_slots and its
    // rows < logits.len() / ld (the batch layout's contract).
    unsafe {
        b.launch(cfg(
            (to_u32(name, "steps", n_steps)?.max(1), 1, 1),
            SAMPLE_THREADS,
        ))
    }?;
    Ok(())
}

/// RVQ encode for one part of the split quantizer (`rvq_encode`): grid
/// (steps), block RVQ_THREADS. `xq` (`[steps][dq]`, the projected latents) is
/// consumed as the residual.
#[allow(clippy::too_many_arguments)]
pub fn rvq_encode(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    xq: &mut CudaSlice<f32>,
    books_t: &CudaSlice<f32>,
    norms: &CudaSlice<f32>,
    steps: &CudaSlice<SlotStep>,
    n_steps: usize,
    n_books: usize,
    dq: usize,
    bins: usize,
    codes: &mut CudaSlice<u32>,
    codes_stride: usize,
    col0: usize,
) -> Result<(), LaunchError> {
    let name = "rvq_encode";
    if dq == 0 || dq > RVQ_MAX_DIM || bins == 0 {
        return Err(shape(
            name,
            format!("codebook width {dq} (1..=512) and {bins} entries"),
        ));
    }
    need(name, "xq", xq, n_steps * dq)?;
    need(name, "books_t", books_t, n_books * dq * bins)?;
    need(name, "norms", norms, n_books * bins)?;
    need(name, "steps", steps, n_steps)?;
    need(name, "codes", codes, n_steps * codes_stride)?;
    if col0 + n_books > codes_stride {
        return Err(shape(name, "codes columns out of the row"));
    }
    // torch.cdist's matrix-product path above 25 entries, as the reference.
    let use_mm = (bins > 25) as i32;
    let (nb, d, nbins, cs, c0) = (
        n_books as i32,
        dq as i32,
        bins as i32,
        codes_stride as i32,
        col0 as i32,
    );
    let mut b = stream.launch_builder(k.f(name)?);
    b.arg(xq)
        .arg(books_t)
        .arg(norms)
        .arg(steps)
        .arg(&nb)
        .arg(&d)
        .arg(&nbins)
        .arg(&use_mm);
    b.arg(codes).arg(&cs).arg(&c0);
    // SAFETY: arguments match the kernel's signature; sizes checked above.
    unsafe { b.launch(cfg((to_u32(name, "steps", n_steps)?, 1, 1), RVQ_THREADS)) }?;
    Ok(())
}

/// Codebook sums for one part of the split quantizer (`rvq_decode`): grid
/// (ceil(dq / 128), steps), block RVQ_DEC_THREADS.
#[allow(clippy::too_many_arguments)]
pub fn rvq_decode(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    codes: &CudaSlice<u32>,
    codes_stride: usize,
    col0: usize,
    books_t: &CudaSlice<f32>,
    steps: &CudaSlice<SlotStep>,
    n_steps: usize,
    n_books: usize,
    dq: usize,
    bins: usize,
    q: &mut CudaSlice<f32>,
    fault: Option<&mut CudaSlice<i32>>,
) -> Result<(), LaunchError> {
    let name = "rvq_decode";
    need(name, "codes", codes, n_steps * codes_stride)?;
    need(name, "books_t", books_t, n_books * dq * bins)?;
    need(name, "steps", steps, n_steps)?;
    need(name, "q", q, n_steps * dq)?;
    if let Some(f) = &fault {
        need(name, "fault", f, n_steps)?;
    }
    let (cs, c0, nb, d, nbins) = (
        codes_stride as i32,
        col0 as i32,
        n_books as i32,
        dq as i32,
        bins as i32,
    );
    let mut b = stream.launch_builder(k.f(name)?);
    b.arg(codes)
        .arg(&cs)
        .arg(&c0)
        .arg(books_t)
        .arg(steps)
        .arg(&nb)
        .arg(&d)
        .arg(&nbins)
        .arg(q);
    opt_arg!(b, fault);
    let grid = (
        to_u32(name, "dq", dq.div_ceil(RVQ_DEC_THREADS as usize))?,
        to_u32(name, "steps", n_steps)?,
        1,
    );
    // SAFETY: arguments match the kernel's signature; sizes checked above.
    unsafe { b.launch(cfg(grid, RVQ_DEC_THREADS)) }?;
    Ok(())
}

/// Shape of one streaming convolution launch.
#[derive(Debug, Clone, Copy)]
pub struct ConvLaunch {
    /// Input channels.
    pub c_in: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel size.
    pub kernel: usize,
    /// Stride.
    pub stride: usize,
    /// Dilation (1 for transposed convs).
    pub dilation: usize,
    /// Input steps per slot-step.
    pub t_in: usize,
    /// Slot-steps in the launch.
    pub n_steps: usize,
    /// Slots the state buffers hold.
    pub max_slots: usize,
}

impl ConvLaunch {
    /// Input history kept per slot.
    pub fn history(&self) -> usize {
        (self.kernel - 1) * self.dilation + 1 - self.stride
    }
}

/// One streaming conv call: optional replicate padding, the product
/// (`conv1d_stream`, grid (ceil(c_out/128), t_out, steps)), then the history
/// update (`conv1d_state_update`, grid (steps)). `first` enables replicate
/// padding (the learnt down-sampler).
#[allow(clippy::too_many_arguments)]
pub fn conv1d(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    s: ConvLaunch,
    x: &CudaSlice<f32>,
    prev: &mut CudaSlice<f32>,
    mut first: Option<&mut CudaSlice<i32>>,
    w: &CudaSlice<f32>,
    bias: Option<&CudaSlice<f32>>,
    steps: &CudaSlice<SlotStep>,
    y: &mut CudaSlice<f32>,
) -> Result<(), LaunchError> {
    let name = "conv1d_stream";
    if s.kernel == 0
        || s.stride == 0
        || s.dilation == 0
        || (s.kernel - 1) * s.dilation + 1 < s.stride
    {
        return Err(shape(name, "effective kernel shorter than the stride"));
    }
    if !s.t_in.is_multiple_of(s.stride) {
        return Err(shape(name, "input steps must be a multiple of the stride"));
    }
    let (hist, t_out) = (s.history(), s.t_in / s.stride);
    need(name, "x", x, s.n_steps * s.t_in * s.c_in)?;
    need(name, "prev", prev, s.max_slots * hist * s.c_in)?;
    need(name, "w", w, s.kernel * s.c_in * s.c_out)?;
    need(name, "steps", steps, s.n_steps)?;
    need(name, "y", y, s.n_steps * t_out * s.c_out)?;
    if let Some(b) = bias {
        need(name, "bias", b, s.c_out)?;
    }
    let ints = [
        s.c_in, s.c_out, s.kernel, s.stride, s.dilation, s.t_in, hist,
    ]
    .map(|v| v as i32);
    let [c_in, c_out, kern, stride, dil, t_in, h] = ints;
    let steps_u = to_u32(name, "steps", s.n_steps)?;
    if let Some(f) = first.as_deref_mut() {
        need(name, "first", f, s.max_slots)?;
        let mut b = stream.launch_builder(k.f("conv1d_replicate_pad")?);
        b.arg(x)
            .arg(&mut *prev)
            .arg(&*f)
            .arg(steps)
            .arg(&c_in)
            .arg(&t_in)
            .arg(&h);
        // SAFETY: arguments match `conv1d_replicate_pad`; sizes checked above.
        unsafe { b.launch(cfg((steps_u, 1, 1), CONV_THREADS)) }?;
    }
    let mut b = stream.launch_builder(k.f(name)?);
    b.arg(x).arg(&*prev).arg(w);
    opt_arg!(b, bias);
    b.arg(steps)
        .arg(&c_in)
        .arg(&c_out)
        .arg(&kern)
        .arg(&stride)
        .arg(&dil)
        .arg(&t_in)
        .arg(&h)
        .arg(&mut *y);
    let grid = (
        to_u32(name, "c_out", s.c_out.div_ceil(CONV_THREADS as usize))?,
        to_u32(name, "t_out", t_out)?,
        steps_u,
    );
    // SAFETY: arguments match `conv1d_stream`; sizes checked above.
    unsafe { b.launch(cfg(grid, CONV_THREADS)) }?;
    let mut b = stream.launch_builder(k.f("conv1d_state_update")?);
    b.arg(x).arg(prev);
    opt_arg!(b, first);
    b.arg(steps).arg(&c_in).arg(&t_in).arg(&h);
    // SAFETY: arguments match `conv1d_state_update`; sizes checked above.
    unsafe { b.launch(cfg((steps_u, 1, 1), CONV_THREADS)) }?;
    Ok(())
}

/// One streaming transposed-conv call (dense, or depthwise when `depthwise`):
/// the product (`convtr1d_stream` / `convtr1d_dw_stream`, grid
/// (ceil(c_out/128), t_in·stride + overlap, steps)) into `y` and `tail`, then
/// `convtr1d_state_update` (grid (steps)) copies `tail` into `partial`.
#[allow(clippy::too_many_arguments)]
pub fn convtr1d(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    s: ConvLaunch,
    depthwise: bool,
    x: &CudaSlice<f32>,
    partial: &mut CudaSlice<f32>,
    w: &CudaSlice<f32>,
    bias: Option<&CudaSlice<f32>>,
    steps: &CudaSlice<SlotStep>,
    y: &mut CudaSlice<f32>,
    tail: &mut CudaSlice<f32>,
) -> Result<(), LaunchError> {
    let name = if depthwise {
        "convtr1d_dw_stream"
    } else {
        "convtr1d_stream"
    };
    if s.stride == 0 || s.kernel < s.stride || (depthwise && s.c_in != s.c_out) {
        return Err(shape(
            name,
            "needs kernel ≥ stride ≥ 1 (and c_in = c_out when depthwise)",
        ));
    }
    let (overlap, t_out) = (s.kernel - s.stride, s.t_in * s.stride);
    if t_out < overlap {
        return Err(shape(name, "a call must cover the overlap"));
    }
    need(name, "x", x, s.n_steps * s.t_in * s.c_in)?;
    need(name, "partial", partial, s.max_slots * overlap * s.c_out)?;
    need(
        name,
        "w",
        w,
        if depthwise {
            s.c_out * s.kernel
        } else {
            s.kernel * s.c_in * s.c_out
        },
    )?;
    need(name, "steps", steps, s.n_steps)?;
    need(name, "y", y, s.n_steps * t_out * s.c_out)?;
    need(name, "tail", tail, s.n_steps * overlap * s.c_out)?;
    if let Some(b) = bias {
        need(name, "bias", b, s.c_out)?;
    }
    let [c_in, c_out, kern, stride, t_in] =
        [s.c_in, s.c_out, s.kernel, s.stride, s.t_in].map(|v| v as i32);
    let steps_u = to_u32(name, "steps", s.n_steps)?;
    let mut b = stream.launch_builder(k.f(name)?);
    b.arg(x).arg(&*partial).arg(w);
    opt_arg!(b, bias);
    b.arg(steps);
    if depthwise {
        b.arg(&c_out);
    } else {
        b.arg(&c_in).arg(&c_out);
    }
    b.arg(&kern).arg(&stride).arg(&t_in).arg(y).arg(&mut *tail);
    let grid = (
        to_u32(name, "c_out", s.c_out.div_ceil(CONV_THREADS as usize))?,
        to_u32(name, "steps out", t_out + overlap)?,
        steps_u,
    );
    // SAFETY: arguments match the kernel's signature (the depthwise one has a
    // single channel count); sizes checked above.
    unsafe { b.launch(cfg(grid, CONV_THREADS)) }?;
    let n = (overlap * s.c_out) as i32;
    let mut b = stream.launch_builder(k.f("convtr1d_state_update")?);
    b.arg(&*tail).arg(partial).arg(steps).arg(&n);
    // SAFETY: arguments match `convtr1d_state_update`; sizes checked above.
    unsafe { b.launch(cfg((steps_u, 1, 1), CONV_THREADS)) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::MODULES;

    fn define(name: &str) -> u64 {
        let pat = format!("#define {name} ");
        for m in MODULES {
            if let Some(line) = m.source.lines().find(|l| l.starts_with(&pat)) {
                return line[pat.len()..].trim().parse().expect("a numeric #define");
            }
        }
        panic!("#define {name} not found");
    }

    #[test]
    fn geometry_matches_the_sources() {
        let pairs: [(&str, u64); 12] = [
            ("NORM_THREADS", NORM_THREADS as u64),
            ("ROPE_THREADS", ROPE_THREADS as u64),
            ("ATT_THREADS", ATT_THREADS as u64),
            ("ATT_MAX_HEAD_DIM", ATT_MAX_HEAD_DIM as u64),
            ("EW_THREADS", EW_THREADS as u64),
            ("TOK_THREADS", TOK_THREADS as u64),
            ("EMB_THREADS", EMB_THREADS as u64),
            ("SAMPLE_THREADS", SAMPLE_THREADS as u64),
            ("CONV_THREADS", CONV_THREADS as u64),
            ("RVQ_THREADS", RVQ_THREADS as u64),
            ("RVQ_DEC_THREADS", RVQ_DEC_THREADS as u64),
            ("RVQ_MAX_DIM", RVQ_MAX_DIM as u64),
        ];
        for (name, v) in pairs {
            assert_eq!(define(name), v, "{name}");
        }
    }

    #[test]
    fn structs_have_the_cuda_layout() {
        assert_eq!(std::mem::size_of::<SlotStep>(), 16);
        assert_eq!(std::mem::size_of::<RowInfo>(), 20);
        assert_eq!(std::mem::size_of::<SlotParams>(), 24);
        assert_eq!(std::mem::align_of::<RowInfo>(), 4);
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        match open_device(0) {
            Err(LaunchError::NoDriver) => {}
            Ok((_, arch)) => eprintln!("skipped: a GPU is present here ({arch})"),
            Err(e) => eprintln!("skipped: a driver is present but the device did not open: {e}"),
        }
    }

    /// GPU tests: run by `scripts/gpu-check` (`cargo test -p moshid-kernels -- --ignored`).
    mod gpu {
        use super::super::*;
        use moshid_model::ops;

        fn setup() -> (Arc<CudaContext>, Arc<CudaStream>, Kernels) {
            let (ctx, arch) = open_device(0).expect("a GPU");
            let include = compile::find_cuda_include(&[]).expect("CUDA headers");
            let k = Kernels::compile_and_load(&ctx, arch, vec![include], None).expect("kernels");
            let stream = ctx.default_stream();
            (ctx, stream, k)
        }

        fn det(n: usize, seed: f32) -> Vec<f32> {
            (0..n).map(|i| ((i as f32 + seed) * 0.7137).sin()).collect()
        }

        fn rows(n: usize, f: impl Fn(usize) -> RowInfo) -> Vec<RowInfo> {
            (0..n).map(f).collect()
        }

        #[test]
        #[ignore = "needs a GPU (scripts/gpu-check)"]
        fn rms_norm_matches_the_cpu() {
            let (_ctx, st, k) = setup();
            let (n, dim) = (3, 4096);
            let x = det(n * dim, 1.0);
            let alpha = det(dim, 2.0);
            let mut want = vec![0.0; n * dim];
            ops::rms_norm(&x, &alpha, 1e-8, dim, &mut want);
            let dx = st.clone_htod(&x).unwrap();
            let da = st.clone_htod(&alpha).unwrap();
            let mut dy = st.alloc_zeros::<f32>(n * dim).unwrap();
            rms_norm(&k, &st, &dx, &da, 1e-8, dim, n, None, &mut dy).unwrap();
            let got = st.clone_dtoh(&dy).unwrap();
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
            }
        }

        #[test]
        #[ignore = "needs a GPU (scripts/gpu-check)"]
        fn attention_over_a_wrapped_ring_matches_naive() {
            let (_ctx, st, k) = setup();
            let (dim, heads, cap, steps): (usize, usize, usize, usize) = (128, 2, 5, 9);
            let hd = dim / heads;
            let s = AttnShape {
                dim,
                heads,
                capacity: cap,
                context: cap,
                rows: 1,
                cache_rows: 1,
            };
            let mut freqs = vec![0.0; hd / 2];
            ops::rope_freqs(hd, 10_000.0, &mut freqs);
            let dfreqs = st.clone_htod(&freqs).unwrap();
            let mut kc = st.alloc_zeros::<f32>(cap * dim).unwrap();
            let mut vc = st.alloc_zeros::<f32>(cap * dim).unwrap();
            let mut keys: Vec<Vec<f32>> = Vec::new();
            let mut vals: Vec<Vec<f32>> = Vec::new();
            for p in 0..steps {
                let mut qkv = det(3 * dim, p as f32 * 3.0);
                let r = st
                    .clone_htod(&rows(1, |_| RowInfo {
                        kv: 0,
                        pos: p as i32,
                        last: p as i32,
                        step: 0,
                        active: 1,
                    }))
                    .unwrap();
                let mut dq = st.clone_htod(&qkv).unwrap();
                rope_kv_write::<f32>(
                    &k,
                    &st,
                    s,
                    &mut dq,
                    Some(&dfreqs),
                    &r,
                    &mut kc,
                    &mut vc,
                    1.0,
                )
                .unwrap();
                let mut out = st.alloc_zeros::<f32>(dim).unwrap();
                attn_decode::<f32, f32>(&k, &st, s, &dq, &kc, &vc, &r, 1.0, &mut out).unwrap();
                let got = st.clone_dtoh(&out).unwrap();
                // Reference: RoPE on q and k, keep the last `cap` keys.
                for h in 0..heads {
                    ops::rope_interleaved(&mut qkv[h * hd..(h + 1) * hd], &freqs, p as f32);
                    ops::rope_interleaved(
                        &mut qkv[dim + h * hd..dim + (h + 1) * hd],
                        &freqs,
                        p as f32,
                    );
                }
                keys.push(qkv[dim..2 * dim].to_vec());
                vals.push(qkv[2 * dim..].to_vec());
                let start = (p + 1).saturating_sub(cap);
                for h in 0..heads {
                    let q = &qkv[h * hd..(h + 1) * hd];
                    let mut sc: Vec<f32> = (start..=p)
                        .map(|j| {
                            q.iter()
                                .zip(&keys[j][h * hd..])
                                .map(|(a, b)| a * b)
                                .sum::<f32>()
                                / (hd as f32).sqrt()
                        })
                        .collect();
                    ops::softmax_inplace(&mut sc);
                    for e in 0..hd {
                        let want: f32 = (start..=p)
                            .zip(&sc)
                            .map(|(j, w)| w * vals[j][h * hd + e])
                            .sum();
                        assert!(
                            (got[h * hd + e] - want).abs() < 1e-4,
                            "step {p} head {h} elem {e}"
                        );
                    }
                }
            }
        }

        #[test]
        #[ignore = "needs a GPU (scripts/gpu-check)"]
        fn sampling_greedy_top1_and_rng_draws() {
            let (_ctx, st, k) = setup();
            let vocab = 48_000;
            let mut logits = det(2 * vocab, 5.0);
            logits[1234] = 9.0;
            logits[vocab + 77] = 9.0;
            logits[vocab + 4000] = 9.0; // a tie: the first index wins
            let steps = [
                SlotStep {
                    slot: 0,
                    active: 1,
                    row_cond: 0,
                    row_null: -1,
                },
                SlotStep {
                    slot: 1,
                    active: 1,
                    row_cond: 1,
                    row_null: -1,
                },
            ];
            let greedy = SlotParams {
                temp_text: 0.7,
                temp_audio: 0.8,
                top_k_text: 25,
                top_k_audio: 250,
                use_sampling: 0,
                cfg_coef: 1.0,
            };
            let top1 = SlotParams {
                use_sampling: 1,
                top_k_text: 1,
                ..greedy
            };
            let seeds = [crate::rng::seed_state(7), crate::rng::seed_state(8)];
            let mut rng = st.clone_htod(&seeds.concat()).unwrap();
            let dl = st.clone_htod(&logits).unwrap();
            let ds = st.clone_htod(&steps).unwrap();
            let mut out = st.alloc_zeros::<u32>(2).unwrap();
            for (params, draws) in [([greedy, greedy], 0), ([top1, top1], 1)] {
                let dp = st.clone_htod(&params).unwrap();
                sample_tokens(
                    &k, &st, &dl, vocab, vocab, &ds, 2, &dp, false, &mut rng, &mut out, 1,
                )
                .unwrap();
                assert_eq!(st.clone_dtoh(&out).unwrap(), vec![1234, 77]);
                // Greedy leaves the generator alone; a sampled token draws once.
                let mut want = seeds;
                if draws == 1 {
                    for s in &mut want {
                        crate::rng::next_u64(s);
                    }
                }
                assert_eq!(st.clone_dtoh(&rng).unwrap(), want.concat());
                st.memcpy_htod(&want.concat(), &mut rng).unwrap();
            }
        }

        #[test]
        #[ignore = "needs a GPU (scripts/gpu-check)"]
        fn rvq_encode_finds_nearest_and_decode_sums() {
            let (_ctx, st, k) = setup();
            let (n, dq, bins, books) = (4, 256, 2048, 3);
            let book: Vec<f32> = det(books * bins * dq, 9.0);
            let mut books_t = vec![0.0; books * dq * bins];
            let mut norms = vec![0.0; books * bins];
            for c in 0..books {
                for b in 0..bins {
                    let e = &book[(c * bins + b) * dq..(c * bins + b + 1) * dq];
                    norms[c * bins + b] = e.iter().map(|v| v * v).sum();
                    for d in 0..dq {
                        books_t[(c * dq + d) * bins + b] = e[d];
                    }
                }
            }
            let x = det(n * dq, 3.0);
            let steps: Vec<SlotStep> = (0..n as i32)
                .map(|s| SlotStep {
                    slot: s,
                    active: 1,
                    row_cond: s,
                    row_null: -1,
                })
                .collect();
            let mut dx = st.clone_htod(&x).unwrap();
            let dbt = st.clone_htod(&books_t).unwrap();
            let dn = st.clone_htod(&norms).unwrap();
            let ds = st.clone_htod(&steps).unwrap();
            let mut codes = st.alloc_zeros::<u32>(n * books).unwrap();
            rvq_encode(
                &k, &st, &mut dx, &dbt, &dn, &ds, n, books, dq, bins, &mut codes, books, 0,
            )
            .unwrap();
            let got = st.clone_dtoh(&codes).unwrap();
            for r in 0..n {
                let mut res = x[r * dq..(r + 1) * dq].to_vec();
                for c in 0..books {
                    let dist = |b: usize| -> f32 {
                        (0..dq)
                            .map(|d| (res[d] - book[(c * bins + b) * dq + d]).powi(2))
                            .sum()
                    };
                    let best = (0..bins)
                        .min_by(|&a, &b| dist(a).total_cmp(&dist(b)))
                        .unwrap();
                    assert_eq!(got[r * books + c] as usize, best, "row {r} codebook {c}");
                    for d in 0..dq {
                        res[d] -= book[(c * bins + best) * dq + d];
                    }
                }
            }
            let mut q = st.alloc_zeros::<f32>(n * dq).unwrap();
            rvq_decode(
                &k, &st, &codes, books, 0, &dbt, &ds, n, books, dq, bins, &mut q, None,
            )
            .unwrap();
            let q = st.clone_dtoh(&q).unwrap();
            for r in 0..n {
                for d in 0..dq {
                    let want: f32 = (0..books)
                        .map(|c| book[(c * bins + got[r * books + c] as usize) * dq + d])
                        .sum();
                    assert!((q[r * dq + d] - want).abs() < 1e-5);
                }
            }
        }
    }
}
