//! The real [`Device`]: one GPU through cudarc's driver API, the NVRTC
//! modules of [`compile`], cuBLAS and CUDA graphs, all loaded dynamically.
//!
//! [`CudaDevice::open`] looks for libcuda first (its absence is
//! [`DeviceError::NoDriver`], never a panic), retains the device's primary
//! context (the one cuBLAS's runtime also uses), creates one non-blocking
//! stream, compiles every module of [`compile::MODULES`] for the device's
//! architecture (PTX cache on disk), loads them and resolves every kernel into
//! a table indexed by [`KernelId`], and creates a cuBLAS handle bound to the
//! stream with its own workspace.
//!
//! **Untested on a GPU**: it compiles and its host-side checks are tested
//! here; the `#[ignore]`d tests at the end (GEMMs, a graph replay) are for
//! `scripts/gpu-check`.
//!
//! Invariants:
//! - One stream. Every copy, fill, launch, GEMM and graph launch is issued on
//!   it, `upload` and `download` included (stream-ordered copies followed by a
//!   stream synchronisation), so work runs in issue order and never races
//!   with the legacy default stream.
//! - Capturable: `copy_to_device`, `copy_to_host`, `copy_on_device`,
//!   `memset_zero`, `launch`, `gemm`. Not capturable, and refused with
//!   [`DeviceError::Capture`] while capturing before the driver sees them:
//!   `alloc`, `alloc_host`, `upload`, `download`, `synchronize`, a nested
//!   `begin_capture`, and `launch_graph` (the driver cannot capture a graph
//!   launch; **unlike the emulator**, which nests the graph); as on the
//!   emulator, refusing one discards the capture (`end_capture` then fails).
//!   Capture is in thread-local mode: an unsafe call made by this thread
//!   still fails the capture instead of being silently left out of the
//!   graph, and other threads (other devices of the daemon) are not
//!   disturbed by it. A capturable call that fails while capturing ends the
//!   capture and discards it, so the stream is usable again.
//! - What allocates device memory: `alloc` (cuMemAlloc, rounded up to 256
//!   bytes, zeroed on the stream), `open` (cuBLAS's workspace, set with
//!   `cublasSetWorkspace_v2` *after* `cublasSetStream_v2`, which would reset
//!   it; with it cuBLAS does not allocate, so GEMMs are capturable) and
//!   `end_capture` (graph instantiation and upload). Nothing is freed before
//!   the device is dropped; dropping it synchronises, then destroys graphs,
//!   the cuBLAS handle and every allocation.
//! - Host buffers (`alloc_host`) are page-locked by `cuMemHostAlloc` with
//!   flags 0 (not write-combined: results are read back through them) and
//!   keep the context alive, so they may outlive the device. As on the
//!   emulator, the device keeps every host buffer it handed out alive until
//!   it is dropped (a graph replays its copies by address, and a copy may be
//!   in flight when the `HostBuf` is dropped). Copies take only host buffers
//!   of this device; copies and fills check that their device range lies
//!   inside one allocation, GEMMs that their operands do (and are aligned for
//!   their type), launches that their non-null pointer arguments point into
//!   one.
//! - A launch takes at most [`MAX_ARGS`] arguments, packed into an array on
//!   the stack (no heap allocation per launch) and checked against the
//!   parameter sizes of the kernel's PTX `.entry` declaration.
//! - Nothing panics: every cudarc call runs under `catch_unwind`, and the
//!   driver and cuBLAS symbols used are looked up at `open`, so an old library
//!   is an error there rather than a panic at first use.
//!
//! GEMM numerics: compute type `CUBLAS_COMPUTE_32F` (f32 accumulation, f32
//! alpha and beta from the host), math mode `CUBLAS_DEFAULT_MATH` with
//! `CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION`: f32 operands stay IEEE
//! f32 (no TF32, so they match the CPU reference), bf16 operands use tensor
//! cores, and split-K partial sums are reduced in f32 even when C is bf16.

use super::{
    check_gemm, Arg, DType, DevPtr, Device, DeviceError, DeviceResult, Gemm, GraphId, HostAlloc,
    HostBuf, KernelId,
};
use crate::compile::{self, Arch, CompileConfig};
use cudarc::cublas::result::CublasError;
use cudarc::cublas::sys as blas;
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream, DriverError};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

/// Most arguments one launch takes.
pub const MAX_ARGS: usize = 24;

/// Default cuBLAS workspace: 32 MiB, NVIDIA's recommendation for Hopper
/// (4 MiB before it); part of `plan::FIXED_BYTES`.
pub const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// Device allocations are rounded up to, and aligned on, this many bytes.
const ALLOC_ALIGN: usize = 256;

/// The capture mode (see the module doc).
const CAPTURE_MODE: sys::CUstreamCaptureMode =
    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;

/// How to open a device.
#[derive(Debug, Clone)]
pub struct CudaOpenOptions {
    /// Folders NVRTC searches for `#include <…>` (CUDA's own headers). When
    /// none holds `cuda_bf16.h`, [`compile::find_cuda_include`] adds one.
    pub include_dirs: Vec<PathBuf>,
    /// PTX cache folder; `None` compiles every time.
    pub cache_dir: Option<PathBuf>,
    /// Bytes of the cuBLAS workspace.
    pub cublas_workspace_bytes: usize,
}

impl Default for CudaOpenOptions {
    fn default() -> Self {
        CudaOpenOptions {
            include_dirs: Vec::new(),
            cache_dir: None,
            cublas_workspace_bytes: CUBLAS_WORKSPACE_BYTES,
        }
    }
}

/// Driver symbols called here (directly or through cudarc), checked at open.
const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemGetInfo_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8Async",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuGraphInstantiateWithFlags",
    "cuGraphUpload",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuGetErrorName",
    "cuGetErrorString",
];

/// cuBLAS symbols called here, checked at open.
const CUBLAS_SYMBOLS: &[&str] = &[
    "cublasCreate_v2",
    "cublasDestroy_v2",
    "cublasSetStream_v2",
    "cublasSetWorkspace_v2",
    "cublasSetMathMode",
    "cublasGemmEx",
];

/// The symbols of `$names` missing from the library `$lib` (a cudarc `culib()`).
macro_rules! missing_symbols {
    ($lib:expr, $names:expr) => {{
        let lib = $lib;
        $names
            .iter()
            .filter(|n| {
                // SAFETY: only the symbol's address is looked up; nothing is called.
                unsafe { lib.get::<unsafe extern "C" fn()>(n.as_bytes()) }.is_err()
            })
            .map(|n| n.to_string())
            .collect::<Vec<String>>()
    }};
}

/// One resolved kernel.
struct Kernel {
    name: &'static str,
    func: CudaFunction,
    /// Byte size of each parameter, from the PTX (`None`: not parsed, unchecked).
    params: Option<Vec<u16>>,
}

/// One device allocation.
#[derive(Debug, Clone, Copy)]
struct Alloc {
    ptr: DevPtr,
    /// Bytes asked for (ranges are checked against this).
    bytes: usize,
}

/// A host buffer handed out by this device, which keeps its memory alive
/// (a captured graph copies to and from it by address).
struct HostRecord {
    addr: usize,
    bytes: usize,
    _mem: Arc<PinnedMem>,
}

/// Page-locked host memory from `cuMemHostAlloc`, freed when the last of the
/// [`HostBuf`] and the device's record of it is dropped.
struct PinnedMem {
    ptr: *mut u8,
    ctx: Arc<CudaContext>,
}

// SAFETY: the allocation is host memory owned by this value alone, which
// exposes no references to it (only its address); the context is Send +
// Sync; `cuMemFreeHost` may be called from any thread once the context is
// current there (done in `drop`).
unsafe impl Send for PinnedMem {}
// SAFETY: as above: nothing is reachable through `&PinnedMem` but the address.
unsafe impl Sync for PinnedMem {}

/// A [`HostBuf`]'s view of a [`PinnedMem`].
struct PinnedHost {
    mem: Arc<PinnedMem>,
    bytes: usize,
}

impl HostAlloc for PinnedHost {
    fn ptr(&self) -> *mut u8 {
        self.mem.ptr
    }

    fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for PinnedMem {
    fn drop(&mut self) {
        let (ctx, ptr) = (&self.ctx, self.ptr);
        let _ = catch_unwind(AssertUnwindSafe(|| {
            bind_for_cleanup(ctx);
            // SAFETY: `ptr` came from `cuMemHostAlloc` in this context and is
            // freed once, here; the device holds a reference until it has
            // synchronised its stream and destroyed its graphs, so nothing
            // copies into or out of it any more.
            if !ptr.is_null() {
                let _ = unsafe { sys::cuMemFreeHost(ptr as *mut c_void) };
            }
        }));
    }
}

/// A GPU, its stream, its kernels and its cuBLAS handle (see the module doc).
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Vec<Kernel>,
    blas: blas::cublasHandle_t,
    workspace: DevPtr,
    /// Sorted by address.
    allocs: Vec<Alloc>,
    host: Vec<HostRecord>,
    graphs: Vec<sys::CUgraphExec>,
    capturing: bool,
    name: String,
    arch: Arch,
    capability: (u32, u32),
    driver_version: i32,
}

// SAFETY: the raw handles (cuBLAS handle, graph execs, functions, stream) are
// used only through `&mut self`, or `&self` for plain fields, so never from two
// threads at once, which is all CUDA and cuBLAS ask of them; every call makes
// the context current on the calling thread first.
unsafe impl Send for CudaDevice {}

/// What a failed call reports.
trait CallError {
    fn describe(&self) -> String;
}

impl CallError for DriverError {
    fn describe(&self) -> String {
        let text = catch_unwind(AssertUnwindSafe(|| {
            self.error_string()
                .map(|s| s.to_string_lossy().into_owned())
                .ok()
        }))
        .ok()
        .flatten();
        match text {
            Some(t) => format!("{:?} ({t})", self.0),
            None => format!("{:?}", self.0),
        }
    }
}

impl CallError for CublasError {
    fn describe(&self) -> String {
        format!("{:?}", self.0)
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// Makes `ctx` current for clean-up even when cudarc holds an error recorded
/// by an earlier drop, which `bind_to_thread` returns (and clears) instead of
/// binding.
fn bind_for_cleanup(ctx: &CudaContext) {
    if ctx.bind_to_thread().is_err() {
        let _ = ctx.bind_to_thread();
    }
}

/// Runs a cudarc call, turning a panic into an error (its own result is kept).
fn guarded<T>(call: &'static str, f: impl FnOnce() -> T) -> DeviceResult<T> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| DeviceError::Call {
        call,
        why: format!("cudarc panicked: {}", panic_message(p.as_ref())),
    })
}

/// Runs a cudarc call; its error or panic becomes [`DeviceError::Call`].
fn call<T, E: CallError>(name: &'static str, f: impl FnOnce() -> Result<T, E>) -> DeviceResult<T> {
    guarded(name, f)?.map_err(|e| DeviceError::Call {
        call: name,
        why: e.describe(),
    })
}

fn shape(what: &'static str, why: impl Into<String>) -> DeviceError {
    DeviceError::Shape {
        what,
        why: why.into(),
    }
}

/// Launch arguments as values on the stack, each in an 8-byte slot holding
/// the argument's bytes first (what `cuLaunchKernel` reads through each
/// parameter pointer: 4 bytes for int / unsigned / float, 8 for pointers and
/// size_t).
#[derive(Debug, Clone, Copy)]
pub struct PackedArgs {
    values: [u64; MAX_ARGS],
    sizes: [u8; MAX_ARGS],
    len: usize,
}

impl PackedArgs {
    /// Packs `args`; more than [`MAX_ARGS`] is an error.
    pub fn new(args: &[Arg]) -> DeviceResult<PackedArgs> {
        if args.len() > MAX_ARGS {
            return Err(shape(
                "launch",
                format!("{} arguments, at most {MAX_ARGS}", args.len()),
            ));
        }
        let mut p = PackedArgs {
            values: [0; MAX_ARGS],
            sizes: [0; MAX_ARGS],
            len: args.len(),
        };
        for (i, a) in args.iter().enumerate() {
            let (v, n) = match *a {
                Arg::Ptr(v) | Arg::U64(v) => (v, 8),
                Arg::I32(v) => (four(v.to_ne_bytes()), 4),
                Arg::U32(v) => (four(v.to_ne_bytes()), 4),
                Arg::F32(v) => (four(v.to_ne_bytes()), 4),
            };
            p.values[i] = v;
            p.sizes[i] = n;
        }
        Ok(p)
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Byte size of each argument.
    pub fn sizes(&self) -> &[u8] {
        &self.sizes[..self.len]
    }

    /// The parameter array `cuLaunchKernel` takes: one pointer per argument,
    /// into `self` (which must stay in place while the array is used).
    pub fn pointers(&mut self) -> [*mut c_void; MAX_ARGS] {
        let mut out = [std::ptr::null_mut(); MAX_ARGS];
        for (o, v) in out.iter_mut().zip(self.values[..self.len].iter_mut()) {
            *o = v as *mut u64 as *mut c_void;
        }
        out
    }
}

/// Four bytes at the start of an 8-byte slot.
fn four(b: [u8; 4]) -> u64 {
    let mut s = [0u8; 8];
    s[..4].copy_from_slice(&b);
    u64::from_ne_bytes(s)
}

/// Byte sizes of the parameters of `.entry kernel(...)` in `ptx`, or `None`
/// when the declaration is absent or not understood.
pub fn entry_params(ptx: &str, kernel: &str) -> Option<Vec<u16>> {
    let head = format!(".entry {kernel}(");
    let start = ptx.find(&head)? + head.len();
    let end = start + ptx[start..].find(')')?;
    let list = ptx[start..end].trim();
    if list.is_empty() {
        return Some(Vec::new());
    }
    list.split(',').map(param_size).collect()
}

/// Size of one `.param …` declaration: `.param .u64 x`, `.param .u64 .ptr
/// .align 4 x`, `.param .align 8 .b8 x[24]`.
fn param_size(decl: &str) -> Option<u16> {
    let mut words = decl.split_whitespace();
    if words.next()? != ".param" {
        return None;
    }
    let mut elem: Option<u16> = None;
    let mut last = "";
    for w in words {
        let bits = w
            .strip_prefix(".u")
            .or_else(|| w.strip_prefix(".s"))
            .or_else(|| w.strip_prefix(".b"))
            .or_else(|| w.strip_prefix(".f"))
            .and_then(|b| b.parse::<u16>().ok());
        if let Some(bits) = bits {
            elem = Some(bits / 8);
        }
        last = w;
    }
    let elem = elem?;
    match last.find('[') {
        Some(i) => {
            let n: u16 = last[i + 1..].strip_suffix(']')?.parse().ok()?;
            elem.checked_mul(n)
        }
        None => Some(elem),
    }
}

impl CudaDevice {
    /// Opens device `ordinal`: context, stream, kernels (compiled for its
    /// architecture, or read from the PTX cache), cuBLAS.
    pub fn open(ordinal: usize, opts: &CudaOpenOptions) -> DeviceResult<CudaDevice> {
        // SAFETY: `is_culib_present` only dlopens the candidate names of
        // libcuda (running their initialisers, as any load would) and closes them.
        let present = guarded("dlopen libcuda", || unsafe { sys::is_culib_present() })?;
        if !present {
            return Err(DeviceError::NoDriver);
        }
        // SAFETY: libcuda is present (checked above), so `culib` loads it
        // rather than panicking.
        let missing = guarded("dlopen libcuda", || {
            missing_symbols!(unsafe { sys::culib() }, DRIVER_SYMBOLS)
        })?;
        if !missing.is_empty() {
            return Err(DeviceError::Call {
                call: "libcuda",
                why: format!("the driver lacks {missing:?}: it is older than CUDA 12"),
            });
        }
        let ctx = call("cuInit / cuDevicePrimaryCtxRetain", || {
            CudaContext::new(ordinal)
        })?;
        let mut driver_version = 0;
        // SAFETY: the symbol exists (checked above); it writes one int.
        call("cuDriverGetVersion", || unsafe {
            sys::cuDriverGetVersion(&mut driver_version).result()
        })?;
        let (major, minor) = call("cuDeviceGetAttribute", || ctx.compute_capability())?;
        let capability = (major.max(0) as u32, minor.max(0) as u32);
        let gpu = call("cuDeviceGetName", || ctx.name())?;
        let arch = Arch::from_compute_capability(capability.0, capability.1)?;
        let stream = call("cuStreamCreate", || ctx.new_stream())?;
        let mut dev = CudaDevice {
            ctx,
            stream,
            kernels: Vec::new(),
            blas: std::ptr::null_mut(),
            workspace: 0,
            allocs: Vec::new(),
            host: Vec::new(),
            graphs: Vec::new(),
            capturing: false,
            name: format!("{gpu} (sm_{}{})", capability.0, capability.1),
            arch,
            capability,
            driver_version,
        };
        dev.load_kernels(opts)?;
        dev.init_cublas(opts.cublas_workspace_bytes)?;
        Ok(dev)
    }

    /// The architecture the kernels were compiled for.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The device's compute capability.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.capability
    }

    /// The driver's CUDA version (`cuDriverGetVersion`, e.g. 12060).
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    /// Number of captured graphs.
    pub fn graph_count(&self) -> usize {
        self.graphs.len()
    }

    /// Device bytes allocated through [`Device::alloc`] (as asked).
    pub fn allocated_bytes(&self) -> usize {
        self.allocs.iter().map(|a| a.bytes).sum()
    }

    fn load_kernels(&mut self, opts: &CudaOpenOptions) -> DeviceResult<()> {
        let mut include_dirs = opts.include_dirs.clone();
        if !include_dirs.iter().any(|d| d.join("cuda_bf16.h").is_file()) {
            include_dirs.push(compile::find_cuda_include(&include_dirs)?);
        }
        let nvrtc = compile::nvrtc_version()?;
        let compiled = compile::compile_all(&CompileConfig {
            arch: self.arch,
            include_dirs,
            cache_dir: opts.cache_dir.clone(),
        })?;
        self.bind()?;
        for c in &compiled {
            let ptx = cudarc::nvrtc::Ptx::from_src(c.ptx.clone());
            let module =
                guarded("cuModuleLoadData", || self.ctx.load_module(ptx))?.map_err(|e| {
                    DeviceError::Call {
                        call: "cuModuleLoadData",
                        why: format!(
                        "{} for {}: {} (PTX from NVRTC {}.{} needs a driver supporting CUDA {}.{}; \
                         this one supports {}.{})",
                        c.module.file,
                        c.arch,
                        e.describe(),
                        nvrtc.0,
                        nvrtc.1,
                        nvrtc.0,
                        nvrtc.1,
                        self.driver_version / 1000,
                        self.driver_version % 1000 / 10
                    ),
                    }
                })?;
            for &name in c.module.kernels {
                let func = call("cuModuleGetFunction", || module.load_function(name))?;
                self.kernels.push(Kernel {
                    name,
                    func,
                    params: entry_params(&c.ptx, name),
                });
            }
        }
        Ok(())
    }

    fn init_cublas(&mut self, workspace_bytes: usize) -> DeviceResult<()> {
        // SAFETY: as for libcuda in `open`.
        let present = guarded("dlopen libcublas", || unsafe { blas::is_culib_present() })?;
        if !present {
            return Err(DeviceError::Call {
                call: "dlopen libcublas",
                why: format!(
                    "cuBLAS is not installed or not on the library path (tried {:?}); install the CUDA \
                     toolkit's libcublas or the `nvidia-cublas-cu12` wheel and add its lib folder to \
                     LD_LIBRARY_PATH",
                    cudarc::get_lib_name_candidates("cublas")
                ),
            });
        }
        // SAFETY: present (checked above), so `culib` loads it.
        let missing = guarded("dlopen libcublas", || {
            missing_symbols!(unsafe { blas::culib() }, CUBLAS_SYMBOLS)
        })?;
        if !missing.is_empty() {
            return Err(DeviceError::Call {
                call: "libcublas",
                why: format!("cuBLAS lacks {missing:?}: it is older than CUDA 11"),
            });
        }
        self.bind()?;
        self.blas = call("cublasCreate_v2", cudarc::cublas::result::create_handle)?;
        let stream = self.stream.cu_stream() as blas::cudaStream_t;
        // SAFETY: the handle was just created; the stream is ours and lives
        // as long as the handle (both released in `drop`, the handle first).
        call("cublasSetStream_v2", || unsafe {
            cudarc::cublas::result::set_stream(self.blas, stream)
        })?;
        let bytes = workspace_bytes
            .max(ALLOC_ALIGN)
            .next_multiple_of(ALLOC_ALIGN);
        // SAFETY: a plain allocation; freed in `drop` after the handle is destroyed.
        self.workspace = call("cuMemAlloc (cuBLAS workspace)", || unsafe {
            cudarc::driver::result::malloc_sync(bytes)
        })?;
        // SAFETY: the workspace is a live device allocation of `bytes`, 256-byte
        // aligned, used by this handle only (one stream, so never concurrently).
        // Set after `cublasSetStream_v2`, which resets the workspace.
        call("cublasSetWorkspace_v2", || unsafe {
            blas::cublasSetWorkspace_v2(self.blas, self.workspace as usize as *mut c_void, bytes)
                .result()
        })?;
        // SAFETY: a valid handle and a mode of the enum.
        call("cublasSetMathMode", || unsafe {
            blas::cublasSetMathMode(
                self.blas,
                blas::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
            )
            .result()
        })?;
        Ok(())
    }

    fn bind(&self) -> DeviceResult<()> {
        call("cuCtxSetCurrent", || self.ctx.bind_to_thread())
    }

    fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Refuses a call that cannot be captured, discarding the capture (as
    /// the emulator does).
    fn not_capturing(&mut self, what: &str) -> DeviceResult<()> {
        if self.capturing {
            self.abort_capture();
            Err(DeviceError::Capture(format!(
                "{what} cannot be captured (allocate and upload before begin_capture); \
                 the capture is discarded"
            )))
        } else {
            Ok(())
        }
    }

    /// Passes `r` through; an error while capturing also ends and discards the capture.
    fn checked<T>(&mut self, r: DeviceResult<T>) -> DeviceResult<T> {
        if r.is_err() && self.capturing {
            self.abort_capture();
        }
        r
    }

    fn abort_capture(&mut self) {
        self.capturing = false;
        let stream = self.cu_stream();
        let _ = guarded("cuStreamEndCapture", || {
            bind_for_cleanup(&self.ctx);
            // SAFETY: our stream; ending a capture (valid or invalidated)
            // returns its graph, or null, which is destroyed at once.
            unsafe {
                if let Ok(g) = cudarc::driver::result::stream::end_capture(stream) {
                    if !g.is_null() {
                        let _ = cudarc::driver::result::graph::destroy(g);
                    }
                }
            }
        });
    }

    /// Checks that `[ptr, ptr + bytes)` lies inside one allocation (an empty
    /// range anywhere passes, as on the emulator).
    fn check_range(&self, what: &'static str, ptr: DevPtr, bytes: usize) -> DeviceResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        let i = self.allocs.partition_point(|a| a.ptr <= ptr);
        let inside = i > 0 && {
            let a = self.allocs[i - 1];
            (bytes as u64)
                .checked_add(ptr - a.ptr)
                .is_some_and(|end| end <= a.bytes as u64)
        };
        if inside {
            Ok(())
        } else {
            Err(shape(
                what,
                format!("device range {ptr:#x} + {bytes} bytes is not inside one allocation of this device"),
            ))
        }
    }

    /// Checks that `buf` is a live host buffer of this device and that
    /// `offset + bytes` fits it; returns the host address at `offset`.
    fn check_host(
        &self,
        what: &'static str,
        buf: &HostBuf,
        offset: usize,
        bytes: usize,
    ) -> DeviceResult<*mut u8> {
        let addr = buf.as_ptr() as usize;
        let ours = self
            .host
            .iter()
            .any(|h| h.addr == addr && h.bytes == buf.bytes());
        if !ours {
            return Err(shape(
                what,
                "the host buffer was not allocated by this device's alloc_host",
            ));
        }
        if offset
            .checked_add(bytes)
            .is_none_or(|end| end > buf.bytes())
        {
            return Err(shape(
                what,
                format!(
                    "bytes {offset}..+{bytes} do not fit a host buffer of {}",
                    buf.bytes()
                ),
            ));
        }
        Ok(buf.as_ptr().wrapping_add(offset))
    }

    /// Bytes a row-major `rows × cols` operand with stride `ld` spans.
    fn extent(rows: usize, cols: usize, ld: usize, t: DType) -> Option<usize> {
        (rows - 1)
            .checked_mul(ld)?
            .checked_add(cols)?
            .checked_mul(t.bytes())
    }

    fn gemm_inner(&self, g: &Gemm) -> DeviceResult<()> {
        check_gemm(g)?;
        if g.a_type != g.b_type || (g.c_type != g.a_type && g.c_type != DType::F32) {
            return Err(shape(
                "gemm",
                format!(
                    "types A {:?} B {:?} C {:?}: A and B must agree, C be theirs or f32",
                    g.a_type, g.b_type, g.c_type
                ),
            ));
        }
        for (what, ptr, rows, cols, ld, t) in [
            ("gemm A", g.a, g.m, g.k, g.lda, g.a_type),
            ("gemm B", g.b, g.n, g.k, g.ldb, g.b_type),
            ("gemm C", g.c, g.m, g.n, g.ldc, g.c_type),
        ] {
            if !ptr.is_multiple_of(t.bytes() as u64) {
                return Err(shape(what, format!("operand {ptr:#x} is misaligned")));
            }
            let bytes = Self::extent(rows, cols, ld, t)
                .ok_or_else(|| shape(what, "operand size overflows"))?;
            self.check_range(what, ptr, bytes)?;
        }
        let int = |what: &'static str, v: usize| {
            i32::try_from(v)
                .map_err(|_| shape("gemm", format!("{what} = {v} exceeds a cuBLAS int")))
        };
        let (m, n, k) = (int("m", g.m)?, int("n", g.n)?, int("k", g.k)?);
        let (lda, ldb, ldc) = (int("lda", g.lda)?, int("ldb", g.ldb)?, int("ldc", g.ldc)?);
        let ty = |t: DType| match t {
            DType::F32 => blas::cudaDataType::CUDA_R_32F,
            DType::Bf16 => blas::cudaDataType::CUDA_R_16BF,
        };
        let (alpha, beta) = (g.alpha, g.beta);
        self.bind()?;
        let handle = self.blas;
        // Row-major C (m×n) = A (m×k) · Bᵀ is column-major Cᵀ (n×m) = B · Aᵀ,
        // where B row-major (n×k) is column-major k×n (so op T) and A
        // row-major (m×k) is column-major k×m (op N).
        // SAFETY: the handle is live and bound to our stream; A, B and C lie
        // inside allocations of this device (checked above) with the strides
        // given; alpha and beta are f32 host scalars as the f32 compute type
        // and the default (host) pointer mode require, read during the call.
        call("cublasGemmEx", || unsafe {
            cudarc::cublas::result::gemm_ex(
                handle,
                blas::cublasOperation_t::CUBLAS_OP_T,
                blas::cublasOperation_t::CUBLAS_OP_N,
                n,
                m,
                k,
                &alpha as *const f32 as *const c_void,
                g.b as usize as *const c_void,
                ty(g.b_type),
                ldb,
                g.a as usize as *const c_void,
                ty(g.a_type),
                lda,
                &beta as *const f32 as *const c_void,
                g.c as usize as *mut c_void,
                ty(g.c_type),
                ldc,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
        })
    }

    fn launch_inner(
        &self,
        kernel: KernelId,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> DeviceResult<()> {
        let k = self
            .kernels
            .get(kernel.0 as usize)
            .ok_or_else(|| DeviceError::UnknownKernel(format!("#{}", kernel.0)))?;
        let mut packed = PackedArgs::new(args)?;
        if let Some(params) = &k.params {
            let ok = params.len() == packed.len()
                && params
                    .iter()
                    .zip(packed.sizes())
                    .all(|(&p, &a)| p == a as u16);
            if !ok {
                return Err(shape(
                    "launch",
                    format!(
                        "`{}` takes parameters of {params:?} bytes, given {:?}",
                        k.name,
                        packed.sizes()
                    ),
                ));
            }
        }
        if block == 0
            || block > 1024
            || grid.0 == 0
            || grid.1 == 0
            || grid.2 == 0
            || grid.0 > i32::MAX as u32
            || grid.1 > 65_535
            || grid.2 > 65_535
        {
            return Err(shape(
                "launch",
                format!("`{}`: grid {grid:?} block {block}", k.name),
            ));
        }
        // As on the emulator: a pointer argument is null or points into an
        // allocation of this device (a stray one would fault the context).
        for (i, a) in args.iter().enumerate() {
            if let Arg::Ptr(p) = *a {
                if p != super::NULL && self.check_range("launch", p, 1).is_err() {
                    return Err(shape(
                        "launch",
                        format!(
                            "`{}` argument {i}: {p:#x} is not inside any allocation of this device",
                            k.name
                        ),
                    ));
                }
            }
        }
        let func = k.func.cu_function();
        let stream = self.cu_stream();
        self.bind()?;
        let mut ptrs = packed.pointers();
        let n = packed.len();
        // SAFETY: `func` is a function of a module this device keeps loaded;
        // the parameter array points at `packed`, alive on this frame until the
        // call returns (the driver copies the values at launch, and at capture
        // for a graph); the count and sizes match the kernel's PTX declaration
        // (checked above, when it was parsed). What the kernel addresses
        // through pointer arguments is the caller's contract (the `ops` layer).
        call("cuLaunchKernel", || unsafe {
            cudarc::driver::result::launch_kernel(
                func,
                grid,
                (block, 1, 1),
                0,
                stream,
                &mut ptrs[..n],
            )
        })
    }

    fn release(&mut self) {
        bind_for_cleanup(&self.ctx);
        if self.capturing {
            self.abort_capture();
        }
        // SAFETY (whole block): our stream is synchronised first, so nothing
        // in flight uses what is released next; every handle and pointer was
        // created by this device and is released once (the vectors are drained,
        // the handle and workspace cleared).
        unsafe {
            let _ = cudarc::driver::result::stream::synchronize(self.cu_stream());
            for exec in self.graphs.drain(..) {
                let _ = cudarc::driver::result::graph::exec_destroy(exec);
            }
            if !self.blas.is_null() {
                let _ = cudarc::cublas::result::destroy_handle(self.blas);
                self.blas = std::ptr::null_mut();
            }
            if self.workspace != 0 {
                let _ = cudarc::driver::result::free_sync(self.workspace);
                self.workspace = 0;
            }
            for a in self.allocs.drain(..) {
                let _ = cudarc::driver::result::free_sync(a.ptr);
            }
        }
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let _ = catch_unwind(AssertUnwindSafe(|| self.release()));
    }
}

impl Device for CudaDevice {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn memory(&self) -> DeviceResult<(usize, usize)> {
        self.bind()?;
        call("cuMemGetInfo", cudarc::driver::result::mem_get_info)
    }

    fn alloc(&mut self, bytes: usize) -> DeviceResult<DevPtr> {
        self.not_capturing("alloc")?;
        let rounded =
            bytes
                .max(1)
                .checked_next_multiple_of(ALLOC_ALIGN)
                .ok_or(DeviceError::OutOfMemory {
                    asked: bytes,
                    free: 0,
                })?;
        self.bind()?;
        // SAFETY: a plain allocation, recorded below and freed once in `drop`.
        let r = guarded("cuMemAlloc", || unsafe {
            cudarc::driver::result::malloc_sync(rounded)
        })?;
        let ptr = match r {
            Ok(p) => p,
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let free = self.memory().map(|m| m.0).unwrap_or(0);
                return Err(DeviceError::OutOfMemory { asked: bytes, free });
            }
            Err(e) => {
                return Err(DeviceError::Call {
                    call: "cuMemAlloc",
                    why: e.describe(),
                })
            }
        };
        let i = self.allocs.partition_point(|a| a.ptr < ptr);
        self.allocs.insert(i, Alloc { ptr, bytes });
        if !ptr.is_multiple_of(ALLOC_ALIGN as u64) {
            return Err(DeviceError::Call {
                call: "cuMemAlloc",
                why: format!("returned {ptr:#x}, not {ALLOC_ALIGN}-byte aligned"),
            });
        }
        let stream = self.cu_stream();
        // SAFETY: the whole fresh allocation, on our stream (so before any
        // later use of it).
        call("cuMemsetD8Async", || unsafe {
            cudarc::driver::result::memset_d8_async(ptr, 0, rounded, stream)
        })?;
        Ok(ptr)
    }

    fn alloc_host(&mut self, bytes: usize) -> DeviceResult<HostBuf> {
        self.not_capturing("alloc_host")?;
        self.bind()?;
        let size = bytes.max(64);
        // SAFETY: page-locked host memory (flags 0: not write-combined, not
        // mapped), owned by the `PinnedMem` made below, which frees it.
        let p = call("cuMemHostAlloc", || unsafe {
            cudarc::driver::result::malloc_host(size, 0)
        })? as *mut u8;
        let mem = Arc::new(PinnedMem {
            ptr: p,
            ctx: self.ctx.clone(),
        });
        if p.is_null() || !(p as usize).is_multiple_of(64) {
            return Err(DeviceError::Call {
                call: "cuMemHostAlloc",
                why: format!("returned {p:?}, not 64-byte aligned"),
            });
        }
        // SAFETY: `size` writable bytes at `p`, just allocated, not yet shared.
        unsafe { std::ptr::write_bytes(p, 0, size) };
        self.host.push(HostRecord {
            addr: p as usize,
            bytes,
            _mem: mem.clone(),
        });
        Ok(HostBuf::new(Box::new(PinnedHost { mem, bytes })))
    }

    fn upload(&mut self, dst: DevPtr, src: &[u8]) -> DeviceResult<()> {
        self.not_capturing("upload")?;
        self.check_range("upload", dst, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let stream = self.cu_stream();
        // SAFETY: the destination range is inside an allocation (checked);
        // `src` is borrowed for the whole call, which synchronises the stream
        // before returning, so the copy is complete when the borrow ends.
        call("cuMemcpyHtoDAsync", || unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, src.len(), stream)
                .result()?;
            cudarc::driver::result::stream::synchronize(stream)
        })
    }

    fn download(&mut self, src: DevPtr, dst: &mut [u8]) -> DeviceResult<()> {
        self.not_capturing("download")?;
        self.check_range("download", src, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let stream = self.cu_stream();
        // SAFETY: as in `upload`; `dst` is borrowed mutably until the stream
        // has been synchronised.
        call("cuMemcpyDtoHAsync", || unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len(), stream)
                .result()?;
            cudarc::driver::result::stream::synchronize(stream)
        })
    }

    fn copy_to_device(
        &mut self,
        dst: DevPtr,
        src: &HostBuf,
        src_offset: usize,
        bytes: usize,
    ) -> DeviceResult<()> {
        let r = (|| {
            let host = self.check_host("copy_to_device", src, src_offset, bytes)?;
            self.check_range("copy_to_device", dst, bytes)?;
            if bytes == 0 {
                return Ok(());
            }
            self.bind()?;
            let stream = self.cu_stream();
            // SAFETY: both ranges checked; the host buffer is page-locked and
            // lives until its owner drops it, which the trait's contract puts
            // after the copy has run (after `synchronize`).
            call("cuMemcpyHtoDAsync", || unsafe {
                sys::cuMemcpyHtoDAsync_v2(dst, host as *const c_void, bytes, stream).result()
            })
        })();
        self.checked(r)
    }

    fn copy_to_host(
        &mut self,
        dst: &HostBuf,
        dst_offset: usize,
        src: DevPtr,
        bytes: usize,
    ) -> DeviceResult<()> {
        let r = (|| {
            let host = self.check_host("copy_to_host", dst, dst_offset, bytes)?;
            self.check_range("copy_to_host", src, bytes)?;
            if bytes == 0 {
                return Ok(());
            }
            self.bind()?;
            let stream = self.cu_stream();
            // SAFETY: as in `copy_to_device`; the host reads the bytes only
            // after `synchronize` (the trait's contract).
            call("cuMemcpyDtoHAsync", || unsafe {
                sys::cuMemcpyDtoHAsync_v2(host as *mut c_void, src, bytes, stream).result()
            })
        })();
        self.checked(r)
    }

    fn copy_on_device(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) -> DeviceResult<()> {
        let r = (|| {
            self.check_range("copy_on_device", dst, bytes)?;
            self.check_range("copy_on_device", src, bytes)?;
            if bytes == 0 {
                return Ok(());
            }
            self.bind()?;
            let stream = self.cu_stream();
            // SAFETY: both ranges lie inside allocations of this device.
            call("cuMemcpyDtoDAsync", || unsafe {
                cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream)
            })
        })();
        self.checked(r)
    }

    fn memset_zero(&mut self, dst: DevPtr, bytes: usize) -> DeviceResult<()> {
        let r = (|| {
            self.check_range("memset_zero", dst, bytes)?;
            if bytes == 0 {
                return Ok(());
            }
            self.bind()?;
            let stream = self.cu_stream();
            // SAFETY: the range lies inside an allocation of this device.
            call("cuMemsetD8Async", || unsafe {
                cudarc::driver::result::memset_d8_async(dst, 0, bytes, stream)
            })
        })();
        self.checked(r)
    }

    fn kernel(&self, name: &str) -> DeviceResult<KernelId> {
        self.kernels
            .iter()
            .position(|k| k.name == name)
            .map(|i| KernelId(i as u32))
            .ok_or_else(|| DeviceError::UnknownKernel(name.to_string()))
    }

    fn launch(
        &mut self,
        kernel: KernelId,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> DeviceResult<()> {
        let r = self.launch_inner(kernel, grid, block, args);
        self.checked(r)
    }

    fn gemm(&mut self, g: &Gemm) -> DeviceResult<()> {
        let r = self.gemm_inner(g);
        self.checked(r)
    }

    fn synchronize(&mut self) -> DeviceResult<()> {
        self.not_capturing("synchronize")?;
        self.bind()?;
        let stream = self.cu_stream();
        // SAFETY: our stream.
        call("cuStreamSynchronize", || unsafe {
            cudarc::driver::result::stream::synchronize(stream)
        })
    }

    fn begin_capture(&mut self) -> DeviceResult<()> {
        if self.capturing {
            self.abort_capture();
            return Err(DeviceError::Capture(
                "begin_capture while capturing (the capture is discarded)".into(),
            ));
        }
        self.bind()?;
        let stream = self.cu_stream();
        // SAFETY: our stream, not capturing (tracked by `capturing`).
        call("cuStreamBeginCapture", || unsafe {
            cudarc::driver::result::stream::begin_capture(stream, CAPTURE_MODE)
        })?;
        self.capturing = true;
        Ok(())
    }

    fn end_capture(&mut self) -> DeviceResult<GraphId> {
        if !self.capturing {
            return Err(DeviceError::Capture(
                "end_capture without begin_capture (or the capture failed and was discarded)"
                    .into(),
            ));
        }
        if let Err(e) = self.bind() {
            self.abort_capture();
            return Err(e);
        }
        self.capturing = false;
        let stream = self.cu_stream();
        // SAFETY: our stream, capturing since `begin_capture`.
        let graph = call("cuStreamEndCapture", || unsafe {
            cudarc::driver::result::stream::end_capture(stream)
        })?;
        if graph.is_null() {
            return Err(DeviceError::Capture("the capture produced no graph".into()));
        }
        // SAFETY: `graph` is the live graph just captured; it is destroyed
        // once, here, whether instantiation worked or not (an executable
        // graph does not depend on its source graph).
        let exec = call("cuGraphInstantiateWithFlags", || unsafe {
            let exec =
                cudarc::driver::result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0));
            let _ = cudarc::driver::result::graph::destroy(graph);
            exec
        })?;
        // SAFETY: a live executable graph and our stream: uploading it now
        // spares the first launch the set-up.
        let uploaded = call("cuGraphUpload", || unsafe {
            cudarc::driver::result::graph::upload(exec, stream)
        });
        if let Err(e) = uploaded {
            // SAFETY: `exec` is live and not recorded anywhere else.
            let _ = guarded("cuGraphExecDestroy", || unsafe {
                cudarc::driver::result::graph::exec_destroy(exec)
            });
            return Err(e);
        }
        let id = u32::try_from(self.graphs.len())
            .map_err(|_| DeviceError::Capture("too many graphs".into()))?;
        self.graphs.push(exec);
        Ok(GraphId(id))
    }

    fn launch_graph(&mut self, graph: GraphId) -> DeviceResult<()> {
        let r = (|| {
            let exec = *self
                .graphs
                .get(graph.0 as usize)
                .ok_or_else(|| DeviceError::Capture(format!("no graph #{}", graph.0)))?;
            if self.capturing {
                // The driver refuses a graph launch into a capturing stream
                // (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); say so plainly.
                return Err(DeviceError::Capture(
                    "launch_graph while capturing: CUDA cannot capture a graph launch \
                     (the capture is discarded)"
                        .into(),
                ));
            }
            self.bind()?;
            let stream = self.cu_stream();
            // SAFETY: a live executable graph of this device, on our stream;
            // graph launches are serialised by `&mut self`.
            call("cuGraphLaunch", || unsafe {
                cudarc::driver::result::graph::launch(exec, stream)
            })
        })();
        self.checked(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        match CudaDevice::open(0, &CudaOpenOptions::default()) {
            Err(DeviceError::NoDriver) => {}
            Ok(d) => eprintln!("skipped: a GPU is present here ({})", d.name()),
            Err(e) => eprintln!("skipped: a driver is present but the device did not open: {e}"),
        }
    }

    #[test]
    fn arguments_pack_into_their_first_bytes() {
        let args = [
            Arg::Ptr(0x1234_5678_9abc_def0),
            Arg::I32(-2),
            Arg::U32(7),
            Arg::F32(1.5),
            Arg::U64(u64::MAX - 1),
        ];
        let mut p = PackedArgs::new(&args).unwrap();
        assert_eq!(p.len(), 5);
        assert_eq!(p.sizes(), &[8, 4, 4, 4, 8]);
        let ptrs = p.pointers();
        assert!(ptrs[5..].iter().all(|q| q.is_null()));
        // SAFETY: each pointer points at an 8-byte slot of `p`, alive here.
        unsafe {
            assert_eq!(*(ptrs[0] as *const u64), 0x1234_5678_9abc_def0);
            assert_eq!(*(ptrs[1] as *const i32), -2);
            assert_eq!(*(ptrs[2] as *const u32), 7);
            assert_eq!(*(ptrs[3] as *const f32), 1.5);
            assert_eq!(*(ptrs[4] as *const u64), u64::MAX - 1);
        }
        assert!(PackedArgs::new(&[]).unwrap().is_empty());
        assert!(PackedArgs::new(&[Arg::I32(0); MAX_ARGS]).is_ok());
        assert!(matches!(
            PackedArgs::new(&[Arg::I32(0); MAX_ARGS + 1]),
            Err(DeviceError::Shape { what: "launch", .. })
        ));
    }

    #[test]
    fn ptx_entry_parameters_are_read() {
        let ptx = "
.visible .entry other(
\t.param .u32 other_param_0
)
.visible .entry k(
\t.param .u64 .ptr .align 4 k_param_0,
\t.param .u64 k_param_1,
\t.param .f32 k_param_2,
\t.param .u32 k_param_3,
\t.param .align 4 .b8 k_param_4[16],
\t.param .u64 k_param_5
)
{
\tret;
}
.visible .entry none()
{
}
";
        assert_eq!(entry_params(ptx, "k"), Some(vec![8, 8, 4, 4, 16, 8]));
        assert_eq!(entry_params(ptx, "other"), Some(vec![4]));
        assert_eq!(entry_params(ptx, "none"), Some(vec![]));
        assert_eq!(entry_params(ptx, "absent"), None);
        assert_eq!(entry_params(".entry bad(\n.param .weird x\n)", "bad"), None);
    }

    /// Every kernel's PTX declaration is understood, and takes only
    /// parameters an [`Arg`] can pass (4 or 8 bytes: no struct by value).
    /// Runs where NVRTC is present (`scripts/check-kernels` sets it up).
    #[test]
    fn every_kernel_declaration_parses() {
        let include = match compile::nvrtc_version()
            .map_err(|e| e.to_string())
            .and_then(|_| compile::find_cuda_include(&[]).map_err(|e| e.to_string()))
        {
            Ok(p) => p,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        };
        let cfg = CompileConfig {
            arch: Arch::parse("sm_90").unwrap(),
            include_dirs: vec![include],
            cache_dir: None,
        };
        for c in compile::compile_all(&cfg).unwrap() {
            for &k in c.module.kernels {
                let p = entry_params(&c.ptx, k);
                assert!(
                    p.as_ref()
                        .is_some_and(|p| !p.is_empty() && p.len() <= MAX_ARGS),
                    "{k}: {p:?}"
                );
                assert!(p.unwrap().iter().all(|&s| s == 4 || s == 8), "{k}");
            }
        }
    }

    /// GPU tests: run by `scripts/gpu-check` (`--include-ignored`).
    mod gpu {
        use super::super::*;

        fn open() -> CudaDevice {
            let opts = CudaOpenOptions {
                cache_dir: Some(std::env::temp_dir().join("moshid-ptx-cache-tests")),
                ..CudaOpenOptions::default()
            };
            CudaDevice::open(0, &opts).expect("a GPU")
        }

        fn det(n: usize, seed: f32) -> Vec<f32> {
            (0..n).map(|i| ((i as f32 + seed) * 0.7137).sin()).collect()
        }

        fn bytes_of(v: &[f32]) -> Vec<u8> {
            v.iter().flat_map(|x| x.to_ne_bytes()).collect()
        }

        fn floats(b: &[u8]) -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        }

        /// f32 → bf16 bits, round to nearest even (finite inputs).
        fn bf16(x: f32) -> u16 {
            let b = x.to_bits();
            ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
        }

        fn from_bf16(h: u16) -> f32 {
            f32::from_bits((h as u32) << 16)
        }

        /// Row-major `rows × cols` with stride `ld`, padding filled with junk.
        fn strided(rows: usize, cols: usize, ld: usize, seed: f32) -> Vec<f32> {
            let v = det(rows * cols, seed);
            let mut out = vec![1e30; (rows - 1) * ld + cols];
            for r in 0..rows {
                out[r * ld..r * ld + cols].copy_from_slice(&v[r * cols..(r + 1) * cols]);
            }
            out
        }

        /// Host reference `alpha · A · Bᵀ + beta · C` in f64, with the
        /// magnitude `Σ|a·b|` of each entry for the tolerance.
        #[allow(clippy::too_many_arguments)]
        fn reference(
            (m, n, k): (usize, usize, usize),
            a: &[f32],
            lda: usize,
            b: &[f32],
            ldb: usize,
            c: &[f32],
            ldc: usize,
            alpha: f32,
            beta: f32,
        ) -> Vec<(f64, f64)> {
            let mut out = Vec::new();
            for i in 0..m {
                for j in 0..n {
                    let (mut s, mut mag) = (0.0f64, 0.0f64);
                    for p in 0..k {
                        let t = a[i * lda + p] as f64 * b[j * ldb + p] as f64;
                        s += t;
                        mag += t.abs();
                    }
                    let old = c[i * ldc + j] as f64;
                    out.push((
                        alpha as f64 * s + beta as f64 * old,
                        alpha.abs() as f64 * mag + (beta as f64 * old).abs(),
                    ));
                }
            }
            out
        }

        #[test]
        #[ignore = "needs a GPU (scripts/gpu-check)"]
        fn gemm_f32_matches_the_host_product() {
            let mut d = open();
            let (m, n, k, lda, ldb, ldc) = (5, 37, 70, 72, 75, 40);
            let a = strided(m, k, lda, 1.0);
            let b = strided(n, k, ldb, 2.0);
            let c = strided(m, n, ldc, 3.0);
            let (alpha, beta) = (0.75, 0.5);
            let want = reference((m, n, k), &a, lda, &b, ldb, &c, ldc, alpha, beta);
            let [da, db, dc] = [&a, &b, &c].map(|v| {
                let p = d.alloc(v.len() * 4).unwrap();
                d.upload(p, &bytes_of(v)).unwrap();
                p
            });
            d.gemm(&Gemm {
                m,
                n,
                k,
                a: da,
                a_type: DType::F32,
                lda,
                b: db,
                b_type: DType::F32,
                ldb,
                c: dc,
                c_type: DType::F32,
                ldc,
                alpha,
                beta,
            })
            .unwrap();
            let mut out = vec![0u8; c.len() * 4];
            d.download(dc, &mut out).unwrap();
            let got = floats(&out);
            for i in 0..m {
                for j in 0..n {
                    let (w, mag) = want[i * n + j];
                    let g = got[i * ldc + j] as f64;
                    // f32 accumulation over k terms: within k·2⁻²⁴·Σ|a·b| ≈ 4e-6·Σ|a·b|.
                    assert!(
                        (g - w).abs() <= 2e-5 * mag.max(1.0),
                        "C[{i}][{j}] {g} vs {w}"
                    );
                }
                // The padding between rows is left alone.
                if i + 1 < m {
                    assert!(got[i * ldc + n..(i + 1) * ldc].iter().all(|&x| x == 1e30));
                }
            }
        }

        #[test]
        #[ignore = "needs a GPU (scripts/gpu-check)"]
        fn gemm_bf16_matches_the_host_product() {
            let mut d = open();
            let (m, n, k) = (8, 384, 512);
            let round = |v: Vec<f32>| {
                v.into_iter()
                    .map(|x| from_bf16(bf16(x)))
                    .collect::<Vec<_>>()
            };
            let a = round(det(m * k, 4.0));
            let b = round(det(n * k, 5.0));
            let to_bits =
                |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|&x| bf16(x).to_ne_bytes()).collect() };
            let da = d.alloc(a.len() * 2).unwrap();
            let db = d.alloc(b.len() * 2).unwrap();
            d.upload(da, &to_bits(&a)).unwrap();
            d.upload(db, &to_bits(&b)).unwrap();
            let zeros = vec![0.0; m * n];
            let want = reference((m, n, k), &a, k, &b, k, &zeros, n, 1.0, 0.0);
            for c_type in [DType::F32, DType::Bf16] {
                let dc = d.alloc(m * n * c_type.bytes()).unwrap();
                let g = Gemm {
                    m,
                    n,
                    k,
                    a: da,
                    a_type: DType::Bf16,
                    lda: k,
                    b: db,
                    b_type: DType::Bf16,
                    ldb: k,
                    c: dc,
                    c_type,
                    ldc: n,
                    alpha: 1.0,
                    beta: 0.0,
                };
                d.gemm(&g).unwrap();
                let mut out = vec![0u8; m * n * c_type.bytes()];
                d.download(dc, &mut out).unwrap();
                let got: Vec<f32> = match c_type {
                    DType::F32 => floats(&out),
                    DType::Bf16 => out
                        .chunks_exact(2)
                        .map(|c| from_bf16(u16::from_ne_bytes([c[0], c[1]])))
                        .collect(),
                };
                // f32 accumulation of exact bf16 products (within
                // k·2⁻²⁴·Σ|a·b| ≈ 3e-5·Σ|a·b| for k = 512); a bf16 result adds
                // its own rounding (half an ulp: 2⁻⁹ relative).
                for (i, (&g, &(w, mag))) in got.iter().zip(&want).enumerate() {
                    let tol = match c_type {
                        DType::F32 => 1e-4 * mag.max(1.0),
                        DType::Bf16 => 1e-4 * mag.max(1.0) + w.abs() / 256.0,
                    };
                    assert!((g as f64 - w).abs() <= tol, "{c_type:?} C[{i}] {g} vs {w}");
                }
            }
            // Mixed operand types are refused before cuBLAS sees them.
            let c = d.alloc(m * n * 4).unwrap();
            let mixed = Gemm {
                m,
                n,
                k,
                a: da,
                a_type: DType::Bf16,
                lda: k,
                b: db,
                b_type: DType::F32,
                ldb: k,
                c,
                c_type: DType::F32,
                ldc: n,
                alpha: 1.0,
                beta: 0.0,
            };
            assert!(matches!(d.gemm(&mixed), Err(DeviceError::Shape { .. })));
        }

        #[test]
        #[ignore = "needs a GPU (scripts/gpu-check)"]
        fn a_captured_memset_kernel_and_copy_replay() {
            let mut d = open();
            let n = 1000usize;
            let add = d.kernel("add_f32").unwrap();
            let x = d.alloc(n * 4).unwrap();
            let u = d.alloc(n * 4).unwrap();
            let mut input = d.alloc_host(n * 4).unwrap();
            let output = d.alloc_host(n * 4).unwrap();
            // x starts non-zero, so the captured memset is seen to run.
            d.upload(x, &bytes_of(&vec![100.0; n])).unwrap();
            d.synchronize().unwrap();

            // Not capturable: refused, and the capture is discarded (as on
            // the emulator), so the stream is usable again.
            d.begin_capture().unwrap();
            assert!(matches!(d.alloc(16), Err(DeviceError::Capture(_))));
            assert!(matches!(d.end_capture(), Err(DeviceError::Capture(_))));
            d.begin_capture().unwrap();
            assert!(matches!(d.synchronize(), Err(DeviceError::Capture(_))));
            assert!(matches!(d.end_capture(), Err(DeviceError::Capture(_))));
            d.begin_capture().unwrap();
            assert!(matches!(d.begin_capture(), Err(DeviceError::Capture(_))));
            assert!(matches!(d.end_capture(), Err(DeviceError::Capture(_))));
            d.synchronize().unwrap();

            d.begin_capture().unwrap();
            d.memset_zero(x, n * 4).unwrap();
            d.copy_to_device(u, &input, 0, n * 4).unwrap();
            // add_f32 is grid-stride over n with EW_THREADS (256) per block.
            let grid = (n.div_ceil(256) as u32, 1, 1);
            d.launch(
                add,
                grid,
                256,
                &[Arg::Ptr(x), Arg::Ptr(u), Arg::U64(n as u64)],
            )
            .unwrap();
            d.launch(
                add,
                grid,
                256,
                &[Arg::Ptr(x), Arg::Ptr(u), Arg::U64(n as u64)],
            )
            .unwrap();
            d.copy_to_host(&output, 0, x, n * 4).unwrap();
            let g = d.end_capture().unwrap();
            // Nothing ran at capture time.
            let mut now = vec![0u8; n * 4];
            d.download(x, &mut now).unwrap();
            assert!(floats(&now).iter().all(|&v| v == 100.0));

            for round in 0..3 {
                let v = det(n, round as f32);
                input.slice_mut::<f32>(0, n).copy_from_slice(&v);
                d.launch_graph(g).unwrap();
                d.synchronize().unwrap();
                let got = output.slice::<f32>(0, n);
                for (e, (&g, &v)) in got.iter().zip(&v).enumerate() {
                    assert_eq!(g, v + v, "round {round} element {e}");
                }
            }
            // A graph launch cannot be captured: refused, capture discarded.
            d.begin_capture().unwrap();
            assert!(matches!(d.launch_graph(g), Err(DeviceError::Capture(_))));
            assert!(matches!(d.end_capture(), Err(DeviceError::Capture(_))));
            // Wrong argument lists and stray pointers are refused before the
            // driver sees them.
            assert!(matches!(
                d.launch(
                    add,
                    grid,
                    256,
                    &[Arg::Ptr(x), Arg::Ptr(0x10), Arg::U64(n as u64)]
                ),
                Err(DeviceError::Shape { .. })
            ));
            assert!(matches!(
                d.launch(add, grid, 256, &[Arg::Ptr(x), Arg::Ptr(u), Arg::U32(1)]),
                Err(DeviceError::Shape { .. })
            ));
            assert!(matches!(
                d.launch(add, grid, 256, &[Arg::Ptr(x), Arg::Ptr(u)]),
                Err(DeviceError::Shape { .. })
            ));
            assert!(matches!(d.end_capture(), Err(DeviceError::Capture(_))));
        }
    }
}
