//! The one interface between the GPU model and whatever runs its kernels.
//!
//! [`Device`] is the driver API reduced to what a frame step needs: memory
//! allocated once, stream-ordered copies through page-locked host buffers,
//! kernel launches by name, GEMMs, and graph capture/replay. Two
//! implementations:
//! - [`cuda::CudaDevice`]: the real thing, through cudarc (driver API,
//!   NVRTC-compiled modules, cuBLAS, CUDA graphs), dynamically loaded;
//! - [`emu::EmuDevice`]: the same `.cu` sources compiled for the host by the
//!   system C++ compiler and run block by block, a thread per fiber, with
//!   `__syncthreads` and warp shuffles honoured. It exists so that the GPU
//!   model, its launch sequence and its kernels are checked against the
//!   golden fixtures on machines with no GPU (CI); it is a test device, not
//!   a backend the daemon serves from.
//!
//! Invariants every implementation keeps:
//! - Work is ordered as it is issued (one stream); [`Device::synchronize`]
//!   waits for all of it. Nothing issued after `begin_capture` runs until the
//!   captured graph is launched; arguments are captured by value, so a graph
//!   replays with the same pointers and scalars, and changing data is passed
//!   through device buffers written by captured copies.
//! - Allocations are zeroed, 256-byte aligned and live as long as the device:
//!   there is no free. The GPU model allocates everything it needs at load.
//! - A [`HostBuf`] is page-locked where that matters (CUDA), so copies from
//!   and to it are asynchronous: its contents are only meaningful to the host
//!   after `synchronize`.

pub mod cuda;
mod describe;
pub mod emu;
mod phase;

pub use describe::{describe_args, describe_gemm};
pub use phase::{EventId, Phase, StackPhases};

/// A device address: a `CUdeviceptr` on CUDA, a host address on the emulator.
/// 0 is the null pointer that kernels take for "absent".
pub type DevPtr = u64;

/// The null device pointer (an optional kernel argument left out).
pub const NULL: DevPtr = 0;

/// One kernel argument, passed by value as the kernel's parameter of the same
/// C type (`Ptr`: any pointer; `I32`: int; `U32`: unsigned; `F32`: float;
/// `U64`: size_t / unsigned long long).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// A device pointer.
    Ptr(DevPtr),
    /// `int`.
    I32(i32),
    /// `unsigned int`.
    U32(u32),
    /// `float`.
    F32(f32),
    /// `size_t` / `unsigned long long`.
    U64(u64),
}

/// A loaded kernel, resolved once by name ([`Device::kernel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelId(pub u32);

/// A captured graph ([`Device::end_capture`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphId(pub u32);

/// Element type of a GEMM operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// IEEE float32.
    F32,
    /// bfloat16 (bits in a u16).
    Bf16,
}

impl DType {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
        }
    }
}

/// Row-major `C[m][n] = alpha · A[m][k] · B[n][k]ᵀ + beta · C[m][n]`, f32
/// accumulation. B is laid out as a PyTorch `Linear` weight (`[out][in]`), so
/// `A · Bᵀ` is `x · Wᵀ`. Leading dimensions are in elements between rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    /// Rows of A and C.
    pub m: usize,
    /// Rows of B, columns of C.
    pub n: usize,
    /// Columns of A and B.
    pub k: usize,
    /// A.
    pub a: DevPtr,
    /// A's element type.
    pub a_type: DType,
    /// A's row stride.
    pub lda: usize,
    /// B.
    pub b: DevPtr,
    /// B's element type.
    pub b_type: DType,
    /// B's row stride.
    pub ldb: usize,
    /// C.
    pub c: DevPtr,
    /// C's element type.
    pub c_type: DType,
    /// C's row stride.
    pub ldc: usize,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of C's old value (0: C is only written).
    pub beta: f32,
}

/// Why a device call failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// No libcuda on this machine.
    #[error("no CUDA driver (libcuda) could be loaded")]
    NoDriver,
    /// A driver, runtime or cuBLAS call failed.
    #[error("{call}: {why}")]
    Call {
        /// The call.
        call: &'static str,
        /// Its error.
        why: String,
    },
    /// Compiling the kernels failed.
    #[error(transparent)]
    Compile(#[from] crate::compile::CompileError),
    /// A kernel the device does not have.
    #[error("kernel `{0}` is not loaded")]
    UnknownKernel(String),
    /// Arguments that do not fit the kernel or the call.
    #[error("{what}: {why}")]
    Shape {
        /// The kernel or call.
        what: &'static str,
        /// What is wrong.
        why: String,
    },
    /// Out of device memory.
    #[error("out of device memory: {asked} bytes asked, {free} free")]
    OutOfMemory {
        /// Bytes asked for.
        asked: usize,
        /// Bytes free.
        free: usize,
    },
    /// A capture-state error (nested capture, end without begin, …).
    #[error("graph capture: {0}")]
    Capture(String),
}

impl DeviceError {
    /// A [`DeviceError::Shape`]: `what` was given an invalid shape, range or
    /// argument, and `why`.
    pub fn shape(what: &'static str, why: impl Into<String>) -> Self {
        DeviceError::Shape {
            what,
            why: why.into(),
        }
    }
}

/// Shorthand for device results.
pub type DeviceResult<T> = Result<T, DeviceError>;

/// Types that may be viewed as the bytes of a [`HostBuf`] (plain old data,
/// every bit pattern valid, no padding).
///
/// # Safety
/// Implement only for `#[repr(C)]` or primitive types with no padding bytes
/// for which every bit pattern is a valid value.
pub unsafe trait HostPod: Copy + 'static {}
// SAFETY: primitives: no padding, every bit pattern valid.
unsafe impl HostPod for u8 {}
// SAFETY: as above.
unsafe impl HostPod for u16 {}
// SAFETY: as above.
unsafe impl HostPod for u32 {}
// SAFETY: as above.
unsafe impl HostPod for i32 {}
// SAFETY: as above.
unsafe impl HostPod for u64 {}
// SAFETY: as above.
unsafe impl HostPod for f32 {}

/// Where a [`HostBuf`]'s memory comes from; dropping it frees the memory.
pub trait HostAlloc: Send {
    /// Start of the allocation (aligned to at least 64 bytes).
    fn ptr(&self) -> *mut u8;
    /// Its size in bytes.
    fn bytes(&self) -> usize;
}

/// A host buffer for per-step transfers (page-locked on CUDA), made once.
pub struct HostBuf {
    alloc: Box<dyn HostAlloc>,
}

impl HostBuf {
    /// Wraps an allocation.
    pub fn new(alloc: Box<dyn HostAlloc>) -> HostBuf {
        assert_eq!(
            alloc.ptr() as usize % 64,
            0,
            "host buffers are 64-byte aligned"
        );
        HostBuf { alloc }
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.alloc.bytes()
    }

    /// Start address (for the device's copy calls).
    pub fn as_ptr(&self) -> *mut u8 {
        self.alloc.ptr()
    }

    /// `len` elements of `T` from element `offset` (in units of T).
    ///
    /// Panics when the range does not fit or is misaligned for `T`.
    pub fn slice<T: HostPod>(&self, offset: usize, len: usize) -> &[T] {
        let (p, _) = self.range::<T>(offset, len);
        // SAFETY: the range lies inside the allocation and is aligned for T
        // (checked by `range`); T is plain old data, valid for any bytes.
        // The device writes into the buffer only between a copy call and the
        // next `synchronize`, which take the device mutably; callers read
        // after synchronizing (the module's contract).
        unsafe { std::slice::from_raw_parts(p as *const T, len) }
    }

    /// Mutable view, as [`HostBuf::slice`].
    pub fn slice_mut<T: HostPod>(&mut self, offset: usize, len: usize) -> &mut [T] {
        let (p, _) = self.range::<T>(offset, len);
        // SAFETY: as in `slice`; `&mut self` makes the view unique on the host.
        unsafe { std::slice::from_raw_parts_mut(p as *mut T, len) }
    }

    /// `len` elements of `T` starting at byte `byte_offset` (which must be
    /// aligned for `T`): for layouts whose sections hold different types.
    ///
    /// Panics when the range does not fit or is misaligned for `T`.
    pub fn view<T: HostPod>(&self, byte_offset: usize, len: usize) -> &[T] {
        let (p, _) = self.byte_range::<T>(byte_offset, len);
        // SAFETY: as in `slice`.
        unsafe { std::slice::from_raw_parts(p as *const T, len) }
    }

    /// Mutable view, as [`HostBuf::view`].
    pub fn view_mut<T: HostPod>(&mut self, byte_offset: usize, len: usize) -> &mut [T] {
        let (p, _) = self.byte_range::<T>(byte_offset, len);
        // SAFETY: as in `slice_mut`.
        unsafe { std::slice::from_raw_parts_mut(p as *mut T, len) }
    }

    fn byte_range<T: HostPod>(&self, start: usize, len: usize) -> (*mut u8, usize) {
        let n = len
            .checked_mul(std::mem::size_of::<T>())
            .expect("host buffer length overflows");
        assert!(
            start.checked_add(n).is_some_and(|end| end <= self.bytes()),
            "host buffer of {} bytes: bytes {start}..{} do not fit",
            self.bytes(),
            start + n
        );
        let p = self.alloc.ptr().wrapping_add(start);
        assert_eq!(
            p as usize % std::mem::align_of::<T>(),
            0,
            "misaligned host view"
        );
        (p, n)
    }

    fn range<T: HostPod>(&self, offset: usize, len: usize) -> (*mut u8, usize) {
        let size = std::mem::size_of::<T>();
        let start = offset
            .checked_mul(size)
            .expect("host buffer offset overflows");
        let n = len.checked_mul(size).expect("host buffer length overflows");
        assert!(
            start.checked_add(n).is_some_and(|end| end <= self.bytes()),
            "host buffer of {} bytes: elements {offset}..{} of {size} bytes do not fit",
            self.bytes(),
            offset + len
        );
        let p = self.alloc.ptr().wrapping_add(start);
        assert_eq!(
            p as usize % std::mem::align_of::<T>(),
            0,
            "misaligned host view"
        );
        (p, n)
    }
}

/// A device that runs the GPU model's kernels, in issue order on one stream.
pub trait Device: Send {
    /// Human-readable name (GPU name and architecture, or "emulator").
    fn name(&self) -> String;

    /// (free, total) device memory in bytes.
    fn memory(&self) -> DeviceResult<(usize, usize)>;

    /// Allocates `bytes` of zeroed device memory that lives as long as the device.
    fn alloc(&mut self, bytes: usize) -> DeviceResult<DevPtr>;

    /// A page-locked host buffer of `bytes` (zeroed).
    fn alloc_host(&mut self, bytes: usize) -> DeviceResult<HostBuf>;

    /// Synchronous copy host → device (set-up only: weights, constants).
    fn upload(&mut self, dst: DevPtr, src: &[u8]) -> DeviceResult<()>;

    /// Synchronous copy device → host (set-up and tests).
    fn download(&mut self, src: DevPtr, dst: &mut [u8]) -> DeviceResult<()>;

    /// Stream-ordered copy of `bytes` from `src` at byte `src_offset` into
    /// `dst` (capturable).
    fn copy_to_device(
        &mut self,
        dst: DevPtr,
        src: &HostBuf,
        src_offset: usize,
        bytes: usize,
    ) -> DeviceResult<()>;

    /// Stream-ordered copy of `bytes` from `src` into `dst` at byte
    /// `dst_offset` (capturable; the host sees it after `synchronize`).
    fn copy_to_host(
        &mut self,
        dst: &HostBuf,
        dst_offset: usize,
        src: DevPtr,
        bytes: usize,
    ) -> DeviceResult<()>;

    /// Stream-ordered device → device copy (capturable).
    fn copy_on_device(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) -> DeviceResult<()>;

    /// Stream-ordered zero fill (capturable).
    fn memset_zero(&mut self, dst: DevPtr, bytes: usize) -> DeviceResult<()>;

    /// Resolves a kernel by its `extern "C"` name.
    fn kernel(&self, name: &str) -> DeviceResult<KernelId>;

    /// Launches a kernel: `grid` blocks of `block` threads (1-D blocks),
    /// static shared memory only. `args` are the kernel's parameters in order.
    fn launch(
        &mut self,
        kernel: KernelId,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> DeviceResult<()>;

    /// A GEMM (cuBLAS on CUDA), stream-ordered and capturable.
    fn gemm(&mut self, g: &Gemm) -> DeviceResult<()>;

    /// Waits for everything issued so far.
    fn synchronize(&mut self) -> DeviceResult<()>;

    /// Starts recording: calls from now on are captured, not run.
    fn begin_capture(&mut self) -> DeviceResult<()>;

    /// Ends recording and instantiates what was captured.
    fn end_capture(&mut self) -> DeviceResult<GraphId>;

    /// Runs a captured graph (stream-ordered).
    fn launch_graph(&mut self, graph: GraphId) -> DeviceResult<()>;

    /// Marks the section of the step that calls issued from now on belong
    /// to, for the profiler (`crate::profile::Profiled`); changes nothing
    /// that runs. Devices ignore it.
    fn phase(&mut self, _phase: Phase) {}

    /// Creates a timing event (not while capturing). Devices that cannot
    /// time refuse (the default).
    fn event_create(&mut self) -> DeviceResult<EventId> {
        Err(no_events())
    }

    /// Records `event` in stream order; while capturing, it becomes a node
    /// of the graph that records it at every replay.
    fn event_record(&mut self, _event: EventId) -> DeviceResult<()> {
        Err(no_events())
    }

    /// Milliseconds from `start` to `end`, both recorded and complete (read
    /// after `synchronize`).
    fn event_elapsed_ms(&mut self, _start: EventId, _end: EventId) -> DeviceResult<f32> {
        Err(no_events())
    }

    /// Nodes of a captured graph as the device built it (CUDA: every node
    /// of the captured graph, cuBLAS's own kernels included), when known.
    fn graph_nodes(&self, _graph: GraphId) -> Option<usize> {
        None
    }

    /// Multiprocessors (CUDA's SMs) that blocks spread over: launch shapes
    /// are sized by it (the attention's splits). One where unknown.
    fn multiprocessors(&self) -> usize {
        1
    }
}

fn no_events() -> DeviceError {
    DeviceError::Call {
        call: "events",
        why: "this device has no timing events".into(),
    }
}

/// A boxed device is a device: tests and tools pick the device at run time
/// (`Box<dyn Device>`) and run the same code on either.
impl<D: Device + ?Sized> Device for Box<D> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn memory(&self) -> DeviceResult<(usize, usize)> {
        (**self).memory()
    }
    fn alloc(&mut self, bytes: usize) -> DeviceResult<DevPtr> {
        (**self).alloc(bytes)
    }
    fn alloc_host(&mut self, bytes: usize) -> DeviceResult<HostBuf> {
        (**self).alloc_host(bytes)
    }
    fn upload(&mut self, dst: DevPtr, src: &[u8]) -> DeviceResult<()> {
        (**self).upload(dst, src)
    }
    fn download(&mut self, src: DevPtr, dst: &mut [u8]) -> DeviceResult<()> {
        (**self).download(src, dst)
    }
    fn copy_to_device(
        &mut self,
        dst: DevPtr,
        src: &HostBuf,
        src_offset: usize,
        bytes: usize,
    ) -> DeviceResult<()> {
        (**self).copy_to_device(dst, src, src_offset, bytes)
    }
    fn copy_to_host(
        &mut self,
        dst: &HostBuf,
        dst_offset: usize,
        src: DevPtr,
        bytes: usize,
    ) -> DeviceResult<()> {
        (**self).copy_to_host(dst, dst_offset, src, bytes)
    }
    fn copy_on_device(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) -> DeviceResult<()> {
        (**self).copy_on_device(dst, src, bytes)
    }
    fn memset_zero(&mut self, dst: DevPtr, bytes: usize) -> DeviceResult<()> {
        (**self).memset_zero(dst, bytes)
    }
    fn kernel(&self, name: &str) -> DeviceResult<KernelId> {
        (**self).kernel(name)
    }
    fn launch(
        &mut self,
        kernel: KernelId,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> DeviceResult<()> {
        (**self).launch(kernel, grid, block, args)
    }
    fn gemm(&mut self, g: &Gemm) -> DeviceResult<()> {
        (**self).gemm(g)
    }
    fn synchronize(&mut self) -> DeviceResult<()> {
        (**self).synchronize()
    }
    fn begin_capture(&mut self) -> DeviceResult<()> {
        (**self).begin_capture()
    }
    fn end_capture(&mut self) -> DeviceResult<GraphId> {
        (**self).end_capture()
    }
    fn launch_graph(&mut self, graph: GraphId) -> DeviceResult<()> {
        (**self).launch_graph(graph)
    }
    fn phase(&mut self, phase: Phase) {
        (**self).phase(phase)
    }
    fn event_create(&mut self) -> DeviceResult<EventId> {
        (**self).event_create()
    }
    fn event_record(&mut self, event: EventId) -> DeviceResult<()> {
        (**self).event_record(event)
    }
    fn event_elapsed_ms(&mut self, start: EventId, end: EventId) -> DeviceResult<f32> {
        (**self).event_elapsed_ms(start, end)
    }
    fn graph_nodes(&self, graph: GraphId) -> Option<usize> {
        (**self).graph_nodes(graph)
    }
    fn multiprocessors(&self) -> usize {
        (**self).multiprocessors()
    }
}

/// Bytes a row-major operand of `rows` rows of `cols` elements of `t`, `ld`
/// elements apart, spans from its first element (`None` on overflow).
pub fn operand_bytes(rows: usize, cols: usize, ld: usize, t: DType) -> Option<usize> {
    rows.checked_sub(1)?
        .checked_mul(ld)?
        .checked_add(cols)?
        .checked_mul(t.bytes())
}

/// Checks a GEMM before either device runs it (shared by devices, so the
/// emulator refuses what cuBLAS would not do): a non-empty product, strides
/// that fit the rows, non-null operands aligned for their type, A and B of
/// one type and C of theirs or f32 (what `cublasGemmEx` computes with
/// `CUBLAS_COMPUTE_32F`), and C overlapping neither A nor B (undefined in
/// cuBLAS, whose tiles read A and B while C is written). A and B may overlap.
pub fn check_gemm(g: &Gemm) -> DeviceResult<()> {
    let bad = |why: String| Err(DeviceError::Shape { what: "gemm", why });
    if g.m == 0 || g.n == 0 || g.k == 0 {
        return bad(format!("empty product {}×{}×{}", g.m, g.n, g.k));
    }
    if g.lda < g.k || g.ldb < g.k || g.ldc < g.n {
        return bad(format!(
            "strides lda {} ldb {} ldc {} too small for m {} n {} k {}",
            g.lda, g.ldb, g.ldc, g.m, g.n, g.k
        ));
    }
    if g.a == NULL || g.b == NULL || g.c == NULL {
        return bad("null operand".into());
    }
    if g.a_type != g.b_type || (g.c_type != g.a_type && g.c_type != DType::F32) {
        return bad(format!(
            "types A {:?} B {:?} C {:?}: A and B must agree, C be theirs or f32",
            g.a_type, g.b_type, g.c_type
        ));
    }
    let mut spans = [(0u64, 0u64); 3];
    for (i, (name, ptr, rows, cols, ld, t)) in [
        ("A", g.a, g.m, g.k, g.lda, g.a_type),
        ("B", g.b, g.n, g.k, g.ldb, g.b_type),
        ("C", g.c, g.m, g.n, g.ldc, g.c_type),
    ]
    .into_iter()
    .enumerate()
    {
        if !ptr.is_multiple_of(t.bytes() as u64) {
            return bad(format!(
                "operand {name} at {ptr:#x} is misaligned for {t:?}"
            ));
        }
        let end = operand_bytes(rows, cols, ld, t).and_then(|b| ptr.checked_add(b as u64));
        match end {
            Some(end) => spans[i] = (ptr, end),
            None => return bad(format!("operand {name}'s extent overflows")),
        }
    }
    let overlap = |(a0, a1): (u64, u64), (b0, b1): (u64, u64)| a0 < b1 && b0 < a1;
    for (name, span) in [("A", spans[0]), ("B", spans[1])] {
        if overlap(spans[2], span) {
            return bad(format!(
                "C ({:#x}..{:#x}) overlaps {name} ({:#x}..{:#x}): undefined in cuBLAS",
                spans[2].0, spans[2].1, span.0, span.1
            ));
        }
    }
    Ok(())
}

/// Checks that `[ptr, ptr + bytes)` lies inside `alloc`, the allocation
/// (start, bytes) that starts at or before `ptr` if there is one (shared by
/// devices; an empty range anywhere passes).
pub(crate) fn check_inside(
    what: &'static str,
    ptr: DevPtr,
    bytes: usize,
    alloc: Option<(DevPtr, usize)>,
) -> DeviceResult<()> {
    if bytes == 0 {
        return Ok(());
    }
    let end = ptr.checked_add(bytes as u64);
    match alloc {
        Some((base, size)) if end.is_some_and(|e| e <= base + size as u64) => Ok(()),
        Some((base, size)) if ptr < base + size as u64 => Err(DeviceError::shape(
            what,
            format!(
                "{bytes} bytes at {ptr:#x} run past the end of the allocation of {size} bytes at {base:#x}"
            ),
        )),
        _ => Err(DeviceError::shape(
            what,
            format!("{ptr:#x} is not inside any allocation of this device"),
        )),
    }
}

/// The bytes of a slice of plain-old-data values (for [`Device::upload`]).
pub fn as_bytes<T: HostPod>(v: &[T]) -> &[u8] {
    // SAFETY: T is plain old data without padding (HostPod's contract), so
    // every byte of the slice is initialised; the length is the slice's size.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// The bytes of a mutable slice of plain-old-data values (for
/// [`Device::download`]); any bytes written form valid values of T.
pub fn as_bytes_mut<T: HostPod>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; every bit pattern is a valid T (HostPod).
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}
