//! The real [`Device`]: one GPU through cudarc's driver API, the NVRTC
//! modules of [`compile`], cuBLAS and CUDA graphs, all loaded dynamically.
//!
//! [`CudaDevice::open`] looks for libcuda first (its absence is
//! [`DeviceError::NoDriver`], never a panic), retains the device's primary
//! context (the one cuBLAS's runtime also uses), creates one non-blocking
//! stream, compiles every module of [`compile::MODULES`] for the device's
//! architecture to SASS and PTX (cached on disk, keyed by the driver's
//! version too), loads the SASS (the PTX when it does not load) and resolves
//! every kernel into a table indexed by [`KernelId`], and creates a cuBLAS
//! handle bound to the stream with its own workspace.
//!
//! **Untested on a GPU**: it compiles and its host-side checks are tested
//! here; the `#[ignore]`d tests (GEMMs in `cublas.rs`, a graph replay in
//! `capture.rs`) and the per-kernel tests run on it with
//! `MOSHID_TEST_DEVICE=cuda` are for `scripts/gpu-check`.
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
//!
//! The files: `calls.rs` (cudarc calls without panics), `symbols.rs` (the
//! library symbols checked at open), `memory.rs` (allocations, pinned host
//! buffers, copies and fills, range checks), `args.rs` (argument packing and
//! PTX `.entry` parsing), `launch.rs` (the kernel table and launches),
//! `cublas.rs` (the cuBLAS handle and its workspace), `events.rs` (timing
//! events for the profiler), `cublas_args.rs` (the
//! pure translation of a row-major GEMM into `cublasGemmEx` arguments,
//! checked on the CPU), `debug.rs` (the debug-sync mode that names a failing
//! kernel), `capture.rs` (graph capture, instantiation and launch).
//!
//! [`compile`]: crate::compile
//! [`compile::MODULES`]: crate::compile::MODULES

mod args;
mod calls;
mod capture;
mod cublas;
pub mod cublas_args;
mod debug;
mod events;
#[cfg(test)]
mod gpu_test;
mod launch;
mod memory;
mod symbols;

pub use args::{entry_params, PackedArgs, MAX_ARGS};

use super::{
    Arg, DevPtr, Device, DeviceError, DeviceResult, EventId, Gemm, GraphId, HostBuf, KernelId,
};
use crate::compile::Arch;
use calls::{bind_for_cleanup, call, guarded};
use cudarc::cublas::sys as blas;
use cudarc::driver::{sys, CudaContext, CudaStream};
use launch::Kernel;
use memory::{Alloc, HostRecord};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use symbols::{missing_symbols, DRIVER_SYMBOLS};

/// Default cuBLAS workspace: 32 MiB, NVIDIA's recommendation for Hopper
/// (4 MiB before it); part of `plan::FIXED_BYTES`.
pub const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// How to open a device.
#[derive(Debug, Clone)]
pub struct CudaOpenOptions {
    /// Folders NVRTC searches for `#include <…>` (CUDA's own headers). When
    /// none holds `cuda_bf16.h`, [`compile::find_cuda_include`] adds one;
    /// CUDA 13's `include/cccl` is added next to it ([`compile::cuda_include_dirs`]).
    ///
    /// [`compile::find_cuda_include`]: crate::compile::find_cuda_include
    /// [`compile::cuda_include_dirs`]: crate::compile::cuda_include_dirs
    pub include_dirs: Vec<PathBuf>,
    /// Kernel cache folder (PTX and cubins); `None` compiles every time.
    pub cache_dir: Option<PathBuf>,
    /// Bytes of the cuBLAS workspace.
    pub cublas_workspace_bytes: usize,
    /// FMA contraction in the kernels (NVRTC's `--fmad`): on when serving;
    /// off for the exactness tests (see `compile::CompileConfig::fmad`).
    pub fmad: bool,
    /// Synchronise after every launch and GEMM and name the one that fails
    /// (see `debug.rs`): for finding a failing kernel, not for serving.
    pub debug_sync: bool,
}

impl Default for CudaOpenOptions {
    fn default() -> Self {
        CudaOpenOptions {
            include_dirs: Vec::new(),
            cache_dir: None,
            cublas_workspace_bytes: CUBLAS_WORKSPACE_BYTES,
            fmad: true,
            debug_sync: false,
        }
    }
}

impl CudaOpenOptions {
    /// The options the GPU tests and the GPU runbook open devices with: the
    /// kernel cache in `$TMPDIR/moshid-kernel-cache` (one for every test
    /// process of a run, so NVRTC compiles once), the headers of
    /// `$MOSHID_CUDA_INCLUDE` when set, and debug-sync when
    /// `MOSHID_CUDA_DEBUG_SYNC=1` (a failure names its kernel).
    pub fn from_test_env() -> CudaOpenOptions {
        let mut opts = CudaOpenOptions {
            cache_dir: Some(std::env::temp_dir().join("moshid-kernel-cache")),
            debug_sync: std::env::var("MOSHID_CUDA_DEBUG_SYNC").is_ok_and(|v| v == "1"),
            ..CudaOpenOptions::default()
        };
        if let Some(dir) = std::env::var_os("MOSHID_CUDA_INCLUDE") {
            opts.include_dirs.push(dir.into());
        }
        opts
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
    /// Nodes of each captured graph (before instantiation).
    graph_nodes: Vec<usize>,
    /// Timing events (`events.rs`).
    events: Vec<sys::CUevent>,
    capturing: bool,
    name: String,
    arch: Arch,
    capability: (u32, u32),
    /// Multiprocessors (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`).
    sms: usize,
    driver_version: i32,
    debug_sync: bool,
    /// How each module was loaded (SASS, or PTX and why), one line each.
    load_report: Vec<String>,
}

// SAFETY: the raw handles (cuBLAS handle, graph execs, functions, stream) are
// used only through `&mut self`, or `&self` for plain fields, so never from two
// threads at once, which is all CUDA and cuBLAS ask of them; every call makes
// the context current on the calling thread first.
unsafe impl Send for CudaDevice {}

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
        let sms = call("cuDeviceGetAttribute", || {
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        })?
        .max(1) as usize;
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
            graph_nodes: Vec::new(),
            events: Vec::new(),
            capturing: false,
            name: format!("{gpu} (sm_{}{})", capability.0, capability.1),
            arch,
            capability,
            sms,
            driver_version,
            debug_sync: opts.debug_sync,
            load_report: Vec::new(),
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

    /// How each kernel module was loaded: `norm.cu: SASS sm_90 (cubin)`, or
    /// `…: PTX (the cubin did not load: …)`.
    pub fn load_report(&self) -> &[String] {
        &self.load_report
    }

    /// Whether every launch and GEMM is followed by a synchronisation.
    pub fn debug_sync(&self) -> bool {
        self.debug_sync
    }

    /// Number of captured graphs.
    pub fn graph_count(&self) -> usize {
        self.graphs.len()
    }

    /// Device bytes allocated through [`Device::alloc`] (as asked).
    pub fn allocated_bytes(&self) -> usize {
        self.allocs.iter().map(|a| a.bytes).sum()
    }

    fn bind(&self) -> DeviceResult<()> {
        call("cuCtxSetCurrent", || self.ctx.bind_to_thread())
    }

    fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
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
            self.destroy_events();
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
        self.alloc_inner(bytes)
    }

    fn alloc_host(&mut self, bytes: usize) -> DeviceResult<HostBuf> {
        self.not_capturing("alloc_host")?;
        self.alloc_host_inner(bytes)
    }

    fn upload(&mut self, dst: DevPtr, src: &[u8]) -> DeviceResult<()> {
        self.not_capturing("upload")?;
        self.upload_inner(dst, src)
    }

    fn download(&mut self, src: DevPtr, dst: &mut [u8]) -> DeviceResult<()> {
        self.not_capturing("download")?;
        self.download_inner(src, dst)
    }

    fn copy_to_device(
        &mut self,
        dst: DevPtr,
        src: &HostBuf,
        src_offset: usize,
        bytes: usize,
    ) -> DeviceResult<()> {
        let r = self.copy_to_device_inner(dst, src, src_offset, bytes);
        self.checked(r)
    }

    fn copy_to_host(
        &mut self,
        dst: &HostBuf,
        dst_offset: usize,
        src: DevPtr,
        bytes: usize,
    ) -> DeviceResult<()> {
        let r = self.copy_to_host_inner(dst, dst_offset, src, bytes);
        self.checked(r)
    }

    fn copy_on_device(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) -> DeviceResult<()> {
        let r = self.copy_on_device_inner(dst, src, bytes);
        self.checked(r)
    }

    fn memset_zero(&mut self, dst: DevPtr, bytes: usize) -> DeviceResult<()> {
        let r = self.memset_zero_inner(dst, bytes);
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
        let r = self
            .launch_inner(kernel, grid, block, args)
            .and_then(|_| self.debug_sync_after(|d| d.describe_launch(kernel, grid, block, args)));
        self.checked(r)
    }

    fn gemm(&mut self, g: &Gemm) -> DeviceResult<()> {
        let r = self
            .gemm_inner(g)
            .and_then(|_| self.debug_sync_after(|d| d.describe_gemm_call(g)));
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
        .map_err(|e| match e {
            DeviceError::Call { call, why } => DeviceError::Call {
                call,
                why: format!("{why}{}", self.sync_hint()),
            },
            e => e,
        })
    }

    fn begin_capture(&mut self) -> DeviceResult<()> {
        self.begin_capture_inner()
    }

    fn end_capture(&mut self) -> DeviceResult<GraphId> {
        self.end_capture_inner()
    }

    fn launch_graph(&mut self, graph: GraphId) -> DeviceResult<()> {
        let r = self.launch_graph_inner(graph);
        self.checked(r)
    }

    fn event_create(&mut self) -> DeviceResult<EventId> {
        self.event_create_inner()
    }

    fn event_record(&mut self, event: EventId) -> DeviceResult<()> {
        let r = self.event_record_inner(event);
        self.checked(r)
    }

    fn event_elapsed_ms(&mut self, start: EventId, end: EventId) -> DeviceResult<f32> {
        self.event_elapsed_inner(start, end)
    }

    fn graph_nodes(&self, graph: GraphId) -> Option<usize> {
        self.graph_nodes.get(graph.0 as usize).copied()
    }

    fn multiprocessors(&self) -> usize {
        self.sms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opening says why it cannot, never panics, and its answer matches
    /// the machine: the NVIDIA kernel driver (`/proc/driver/nvidia`, there
    /// whenever a GPU is usable, in a container too) is the witness, found
    /// without the CUDA libraries. Without it: no libcuda (`NoDriver`), or
    /// a libcuda that names the call that failed; with it: the device opens.
    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        let kernel_driver = std::path::Path::new("/proc/driver/nvidia/version").exists();
        match (
            kernel_driver,
            CudaDevice::open(0, &CudaOpenOptions::default()),
        ) {
            (false, Err(DeviceError::NoDriver)) => {}
            (false, Err(DeviceError::Call { call, why })) => {
                assert!(!call.is_empty() && !why.is_empty(), "{call}: {why}")
            }
            (false, Err(e)) => panic!("without a GPU, an error other than the driver's: {e}"),
            (false, Ok(d)) => panic!("{} opened without the NVIDIA kernel driver", d.name()),
            (true, Ok(d)) => assert!(!d.name().is_empty(), "a device without a name"),
            (true, Err(e)) => {
                panic!("the NVIDIA kernel driver is loaded but device 0 did not open: {e}")
            }
        }
    }

    /// The runbook's first step: the device opens (context, stream, every
    /// module compiled and loaded, cuBLAS), and says how.
    #[test]
    #[ignore = "needs a GPU (scripts/gpu-check)"]
    fn the_device_opens_and_reports() {
        let t = std::time::Instant::now();
        let d =
            CudaDevice::open(0, &CudaOpenOptions::from_test_env()).expect("opening CUDA device 0");
        let (free, total) = d.memory().unwrap();
        println!(
            "opened {} in {:.1} s: compute capability {}.{}, kernels for {}, driver CUDA {}.{}, \
             {:.1} of {:.1} GiB free, debug_sync {}",
            d.name(),
            t.elapsed().as_secs_f64(),
            d.compute_capability().0,
            d.compute_capability().1,
            d.arch(),
            d.driver_version() / 1000,
            d.driver_version() % 1000 / 10,
            free as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64,
            d.debug_sync(),
        );
        for line in d.load_report() {
            println!("  {line}");
        }
        assert_eq!(d.load_report().len(), crate::compile::MODULES.len());
        let n: usize = crate::compile::MODULES
            .iter()
            .map(|m| m.kernels.len())
            .sum();
        for m in crate::compile::MODULES {
            for k in m.kernels {
                d.kernel(k).unwrap();
            }
        }
        println!("  {n} kernels resolved");
        // A second open reads the kernel cache the first one wrote.
        let t = std::time::Instant::now();
        drop(CudaDevice::open(0, &CudaOpenOptions::from_test_env()).unwrap());
        println!(
            "reopened from the kernel cache in {:.2} s",
            t.elapsed().as_secs_f64()
        );
    }
}
