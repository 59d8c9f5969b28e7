//! The emulator [`Device`]: the kernels of `cuda/` compiled for the host and
//! run on the CPU, so that the GPU model's launch sequence and its kernels
//! are checked against the golden fixtures where there is no GPU (CI).
//!
//! The native half is built by `build.rs` from the very `.cu` sources NVRTC
//! compiles, with `emu/cuda_emu.h` standing in for CUDA's headers and
//! built-ins and `emu/emu_runtime.cpp` running a launch: blocks one after
//! another on the calling thread, each CUDA thread of a block a fiber, with
//! `__syncthreads` and warp shuffles honoured and their misuse (a deadlock, a
//! divergent barrier, a shuffle waiting for an exited lane) reported as an
//! error instead of a hang. Threads (and blocks) run in reverse order by
//! default, so that a missing barrier shows; [`EmuDevice::set_order`] picks
//! forward or seeded shuffled orders.
//!
//! Invariants:
//! - Memory: an allocation is zeroed, 256-byte aligned and followed by a
//!   guard page (a kernel running past its buffer faults rather than
//!   corrupting another); a [`DevPtr`] is its host address. Nothing is freed
//!   before the device is dropped. [`Device::memory`] counts against a limit
//!   set at construction (default [`DEFAULT_MEMORY`]).
//! - Everything a launch, copy, fill or GEMM touches is checked first: device
//!   ranges must lie inside one allocation of this device, host ranges inside
//!   a live host buffer of this device; every non-null pointer argument of a
//!   launch must point into an allocation and be aligned for its target
//!   type, and the arguments must match the kernel's parameters in number and
//!   C type (read from the compiled kernel's signature). Any mismatch is
//!   [`DeviceError::Shape`] and nothing runs. What a kernel does with the
//!   pointers it was given stays its own business: the guard pages catch the
//!   common overrun, nothing catches an index into a neighbouring buffer.
//! - Work runs when issued (one stream, issue order trivially); while
//!   capturing it is recorded instead, arguments by value and host-buffer
//!   copies by address (as CUDA graphs do; the device keeps every host buffer
//!   it handed out alive, so a replay never reads freed memory). What CUDA
//!   refuses during capture is refused here too ([`DeviceError::Capture`]):
//!   `alloc`, `alloc_host`, `upload`, `download`, `synchronize`, a nested
//!   `begin_capture`; any error while capturing discards the capture.
//! - A kernel that fails at run time (deadlock, bad warp operation) leaves
//!   the device faulted, as a CUDA context after an illegal access: that
//!   launch and every later call return the error, `synchronize` included.
//! - GEMMs are computed on the CPU with f32 accumulation (bf16 operands
//!   widened, a bf16 C rounded to nearest even), C never read when beta is 0.
//! - The device is `Send`: the scheduler's state (fiber stacks, `__shared__`
//!   variables) is per OS thread, so devices on different threads, tests
//!   running in parallel included, never share it.

use super::{
    check_gemm, Arg, DType, DevPtr, Device, DeviceError, DeviceResult, Gemm, GraphId, HostAlloc,
    HostBuf, KernelId,
};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_void, CStr};
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

/// Memory limit of [`EmuDevice::new`]: 16 GiB (address space: pages are
/// committed only when touched).
pub const DEFAULT_MEMORY: usize = 16 << 30;

/// The C ABI of `emu/emu_runtime.cpp` and the generated registry.
mod ffi {
    use std::ffi::{c_char, c_void};

    /// `emu::kernel_info` of `cuda_emu.h`.
    #[repr(C)]
    pub struct KernelInfo {
        pub name: *const c_char,
        /// `void (*)(void**)`, only ever handed back to `moshid_emu_launch`.
        pub thunk: *const c_void,
        pub n_params: u32,
        pub kinds: *const u8,
        pub aligns: *const u8,
        pub max_threads: u32,
    }

    extern "C" {
        pub fn moshid_emu_kernel_count() -> usize;
        pub fn moshid_emu_kernel(i: usize) -> *const KernelInfo;
        pub fn moshid_emu_launch(
            thunk: *const c_void,
            grid: *const u32,
            block: u32,
            args: *mut *mut c_void,
            order: u32,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        pub fn moshid_emu_alloc(
            bytes: usize,
            map: *mut *mut c_void,
            map_len: *mut usize,
        ) -> *mut c_void;
        pub fn moshid_emu_free(map: *mut c_void, map_len: usize);
        pub fn moshid_emu_switches() -> u64;
    }
}

/// One kernel of the compiled table.
struct Kernel {
    name: &'static str,
    thunk: *const c_void,
    /// Parameter kinds: `p` pointer, `i` int, `u` unsigned, `f` float, `U`
    /// 64-bit integer, `?` unsupported.
    kinds: &'static [u8],
    /// Alignment of each pointer parameter's target (1 for scalars).
    aligns: &'static [u8],
    max_threads: u32,
}

// SAFETY: `thunk` is the address of a function in the static library's code,
// never dereferenced on the Rust side; the slices and names point into the
// library's read-only tables. Nothing here is mutable or thread-bound.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

struct Table {
    kernels: Vec<Kernel>,
    by_name: HashMap<&'static str, u32>,
}

/// The kernels compiled into this binary, read once.
fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        // SAFETY: the registry functions only read the generated static tables.
        let n = unsafe { ffi::moshid_emu_kernel_count() };
        let mut kernels = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: i < count, so the registry returns a valid row of a
            // static table: a NUL-terminated name and two arrays of n_params
            // bytes, all of static storage duration and never written.
            let k = unsafe {
                let info = &*ffi::moshid_emu_kernel(i);
                let np = info.n_params as usize;
                Kernel {
                    name: CStr::from_ptr(info.name)
                        .to_str()
                        .expect("kernel names are ASCII"),
                    thunk: info.thunk,
                    kinds: std::slice::from_raw_parts(info.kinds, np),
                    aligns: std::slice::from_raw_parts(info.aligns, np),
                    max_threads: info.max_threads,
                }
            };
            kernels.push(k);
        }
        let by_name = kernels
            .iter()
            .enumerate()
            .map(|(i, k)| (k.name, i as u32))
            .collect();
        Table { kernels, by_name }
    })
}

/// Every kernel name the emulator has, in the registry's order.
pub fn kernel_names() -> Vec<&'static str> {
    table().kernels.iter().map(|k| k.name).collect()
}

/// The order in which the threads of a block (and the blocks of a grid) run
/// between synchronisation points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// Highest index first (the default: a read of what a lower thread writes
    /// without a barrier in between sees the old value).
    #[default]
    Reverse,
    /// Index order.
    Forward,
    /// A pseudo-random permutation per pass, from this seed.
    Shuffled(u32),
}

impl Order {
    fn code(self) -> u32 {
        match self {
            Order::Reverse => 0,
            Order::Forward => 1,
            Order::Shuffled(seed) => 2 + seed % (u32::MAX - 2),
        }
    }
}

/// A device allocation: the mapping of `moshid_emu_alloc`.
struct DevAlloc {
    bytes: usize,
    map: usize,
    map_len: usize,
}

/// Host memory of [`Device::alloc_host`], shared by the [`HostBuf`] and the
/// device (which keeps it alive for recorded copies).
struct HostMem {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: plain heap memory owned by this value; it is written only through
// raw pointers by the device's copy calls and by the HostBuf's owner, whose
// accesses the `Device` contract orders (copies, then `synchronize`, then
// host reads).
unsafe impl Send for HostMem {}
// SAFETY: as above; `HostMem` itself exposes no references.
unsafe impl Sync for HostMem {}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc_host` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A [`HostBuf`]'s view of a [`HostMem`].
struct EmuHost {
    mem: Arc<HostMem>,
    bytes: usize,
}

impl HostAlloc for EmuHost {
    fn ptr(&self) -> *mut u8 {
        self.mem.ptr.as_ptr()
    }

    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// One stream operation, as run or as recorded in a graph.
#[derive(Debug, Clone)]
enum Op {
    ToDevice {
        dst: DevPtr,
        src: usize,
        bytes: usize,
    },
    ToHost {
        dst: usize,
        src: DevPtr,
        bytes: usize,
    },
    OnDevice {
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
    },
    Zero {
        dst: DevPtr,
        bytes: usize,
    },
    Launch {
        kernel: u32,
        grid: [u32; 3],
        block: u32,
        args: Vec<Arg>,
    },
    Gemm(Gemm),
    Graph(u32),
}

/// The emulator device (see the module doc).
pub struct EmuDevice {
    /// By start address.
    allocs: BTreeMap<u64, DevAlloc>,
    used: usize,
    limit: usize,
    hosts: Vec<(usize, usize, Arc<HostMem>)>,
    /// `Some` while capturing.
    capture: Option<Vec<Op>>,
    graphs: Vec<Arc<[Op]>>,
    /// The run-time error of a failed kernel: the device is unusable since.
    fault: Option<String>,
    order: Order,
    switches: u64,
    launches: u64,
    /// GEMM operands widened to f32 (grown on first use, then reused, so a
    /// steady-state step allocates nothing).
    gemm_scratch: Vec<f32>,
}

/// Most arguments a launch passes (the runtime reads them from a fixed array).
const MAX_LAUNCH_ARGS: usize = 32;

impl Default for EmuDevice {
    fn default() -> Self {
        EmuDevice::new()
    }
}

fn shape(what: &'static str, why: impl Into<String>) -> DeviceError {
    DeviceError::Shape {
        what,
        why: why.into(),
    }
}

fn capture_error(why: impl Into<String>) -> DeviceError {
    DeviceError::Capture(why.into())
}

fn kind_name(k: u8) -> &'static str {
    match k {
        b'p' => "a pointer",
        b'i' => "int",
        b'u' => "unsigned int",
        b'f' => "float",
        b'U' => "a 64-bit integer",
        _ => "a type the emulator cannot pass",
    }
}

fn arg_kind(a: &Arg) -> u8 {
    match a {
        Arg::Ptr(_) => b'p',
        Arg::I32(_) => b'i',
        Arg::U32(_) => b'u',
        Arg::F32(_) => b'f',
        Arg::U64(_) => b'U',
    }
}

impl EmuDevice {
    /// A device with [`DEFAULT_MEMORY`] of memory.
    pub fn new() -> EmuDevice {
        EmuDevice::with_memory(DEFAULT_MEMORY)
    }

    /// A device whose allocations may total `limit` bytes.
    pub fn with_memory(limit: usize) -> EmuDevice {
        EmuDevice {
            allocs: BTreeMap::new(),
            used: 0,
            limit,
            hosts: Vec::new(),
            capture: None,
            graphs: Vec::new(),
            fault: None,
            order: Order::default(),
            switches: 0,
            launches: 0,
            gemm_scratch: Vec::new(),
        }
    }

    /// The thread (and block) order of later launches.
    pub fn set_order(&mut self, order: Order) {
        self.order = order;
    }

    /// Fiber switches made by this device's launches so far.
    pub fn fiber_switches(&self) -> u64 {
        self.switches
    }

    /// Kernel launches run so far (graph replays count each of theirs).
    pub fn launches(&self) -> u64 {
        self.launches
    }

    fn faulted(&self) -> DeviceResult<()> {
        match &self.fault {
            None => Ok(()),
            Some(f) => Err(DeviceError::Call {
                call: "emulator",
                why: format!("the device faulted earlier: {f}"),
            }),
        }
    }

    fn not_capturing(&mut self, call: &str) -> DeviceResult<()> {
        if self.capture.take().is_some() {
            return Err(capture_error(format!(
                "{call} is not allowed while capturing (the capture is discarded)"
            )));
        }
        Ok(())
    }

    /// Checks that `[ptr, ptr + bytes)` lies inside one allocation.
    fn check_range(&self, what: &'static str, ptr: DevPtr, bytes: usize) -> DeviceResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        let end = ptr.checked_add(bytes as u64);
        match self.allocs.range(..=ptr).next_back() {
            Some((&base, a)) if end.is_some_and(|e| e <= base + a.bytes as u64) => Ok(()),
            Some((&base, a)) if ptr < base + a.bytes as u64 => Err(shape(
                what,
                format!(
                    "{bytes} bytes at {ptr:#x} run past the end of the allocation of {} bytes at {base:#x}",
                    a.bytes
                ),
            )),
            _ => Err(shape(
                what,
                format!("{ptr:#x} is not inside any allocation of this device"),
            )),
        }
    }

    /// Checks a host range `[offset, offset + bytes)` of a buffer of this device.
    fn check_host(
        &self,
        what: &'static str,
        buf: &HostBuf,
        offset: usize,
        bytes: usize,
    ) -> DeviceResult<usize> {
        let addr = buf.as_ptr() as usize;
        if !self.hosts.iter().any(|h| h.0 == addr) {
            return Err(shape(what, "the host buffer was not made by this device"));
        }
        if offset.checked_add(bytes).is_none_or(|e| e > buf.bytes()) {
            return Err(shape(
                what,
                format!(
                    "bytes {offset}..{} of a host buffer of {}",
                    offset.saturating_add(bytes),
                    buf.bytes()
                ),
            ));
        }
        Ok(addr + offset)
    }

    /// Checks a GEMM operand of `rows` rows of `cols` elements, `ld` apart.
    fn check_operand(
        &self,
        ptr: DevPtr,
        t: DType,
        rows: usize,
        cols: usize,
        ld: usize,
    ) -> DeviceResult<()> {
        if !ptr.is_multiple_of(t.bytes() as u64) {
            return Err(shape("gemm", format!("operand {ptr:#x} is misaligned")));
        }
        let elems = (rows - 1).checked_mul(ld).and_then(|v| v.checked_add(cols));
        let bytes = elems.and_then(|e| e.checked_mul(t.bytes()));
        match bytes {
            Some(b) => self.check_range("gemm", ptr, b),
            None => Err(shape("gemm", "operand extent overflows")),
        }
    }

    /// Validates a launch; returns the kernel.
    fn check_launch(
        &self,
        kernel: KernelId,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> DeviceResult<&'static Kernel> {
        let k = table()
            .kernels
            .get(kernel.0 as usize)
            .ok_or_else(|| DeviceError::UnknownKernel(format!("#{}", kernel.0)))?;
        let name = k.name;
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Err(shape(name, format!("empty grid {grid:?}")));
        }
        if grid.0 > i32::MAX as u32 || grid.1 > 65_535 || grid.2 > 65_535 {
            return Err(shape(name, format!("grid {grid:?} beyond CUDA's limits")));
        }
        if block == 0 || block > 1024 {
            return Err(shape(name, format!("block of {block} threads (1..=1024)")));
        }
        if block > k.max_threads {
            return Err(shape(
                name,
                format!(
                    "block of {block} threads over the kernel's launch bounds ({})",
                    k.max_threads
                ),
            ));
        }
        if args.len() != k.kinds.len() {
            return Err(shape(
                name,
                format!(
                    "{} arguments given, the kernel takes {}",
                    args.len(),
                    k.kinds.len()
                ),
            ));
        }
        for (i, (a, (&kind, &align))) in args.iter().zip(k.kinds.iter().zip(k.aligns)).enumerate() {
            if arg_kind(a) != kind {
                return Err(shape(
                    name,
                    format!(
                        "argument {i} is {a:?}, the kernel takes {}",
                        kind_name(kind)
                    ),
                ));
            }
            if let Arg::Ptr(p) = *a {
                if p == super::NULL {
                    continue;
                }
                if p % align.max(1) as u64 != 0 {
                    return Err(shape(
                        name,
                        format!("argument {i}: {p:#x} is not aligned to {align} bytes"),
                    ));
                }
                if let Err(DeviceError::Shape { why, .. }) = self.check_range(name, p, 1) {
                    return Err(shape(name, format!("argument {i}: {why}")));
                }
            }
        }
        Ok(k)
    }

    fn issue(&mut self, op: Op) -> DeviceResult<()> {
        match &mut self.capture {
            Some(ops) => {
                ops.push(op);
                Ok(())
            }
            None => self.execute(&op),
        }
    }

    /// Records or runs an op that passed its checks; while capturing, a
    /// failed check discards the capture.
    fn checked(&mut self, op: DeviceResult<Op>) -> DeviceResult<()> {
        self.faulted()?;
        match op {
            Ok(op) => self.issue(op),
            Err(e) => {
                self.capture = None;
                Err(e)
            }
        }
    }

    fn execute(&mut self, op: &Op) -> DeviceResult<()> {
        self.faulted()?;
        match *op {
            Op::ToDevice { dst, src, bytes } => {
                // SAFETY: src lies in a live host buffer of this device and dst
                // in one of its allocations (checked when issued; neither is
                // ever freed while the device lives); distinct memory.
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) }
            }
            Op::ToHost { dst, src, bytes } => {
                // SAFETY: as above, the other way; the host reads the buffer
                // only after `synchronize` (the `Device` contract).
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) }
            }
            Op::OnDevice { dst, src, bytes } => {
                // SAFETY: both ranges lie inside allocations of this device
                // (checked when issued); `copy` allows them to overlap.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) }
            }
            Op::Zero { dst, bytes } => {
                // SAFETY: the range lies inside an allocation (checked when issued).
                unsafe { std::ptr::write_bytes(dst as *mut u8, 0, bytes) }
            }
            Op::Gemm(g) => gemm(&g, &mut self.gemm_scratch),
            Op::Graph(id) => {
                let ops = self.graphs[id as usize].clone();
                for op in ops.iter() {
                    self.execute(op)?;
                }
            }
            Op::Launch {
                kernel,
                grid,
                block,
                ref args,
            } => self.run(kernel, grid, block, args)?,
        }
        Ok(())
    }

    /// Runs a validated launch.
    fn run(&mut self, kernel: u32, grid: [u32; 3], block: u32, args: &[Arg]) -> DeviceResult<()> {
        let k = &table().kernels[kernel as usize];
        if args.len() > MAX_LAUNCH_ARGS {
            return Err(shape(
                k.name,
                format!("{} arguments (at most {MAX_LAUNCH_ARGS})", args.len()),
            ));
        }
        // Fixed arrays on the stack: no allocation per launch.
        let mut slots = [0u64; MAX_LAUNCH_ARGS];
        for (slot, a) in slots.iter_mut().zip(args) {
            *slot = match *a {
                Arg::Ptr(p) => p,
                Arg::I32(v) => v as u32 as u64,
                Arg::U32(v) => v as u64,
                Arg::F32(v) => v.to_bits() as u64,
                Arg::U64(v) => v,
            };
        }
        let mut ptrs = [std::ptr::null_mut::<c_void>(); MAX_LAUNCH_ARGS];
        for (p, s) in ptrs.iter_mut().zip(slots.iter_mut()) {
            *p = s as *mut u64 as *mut c_void;
        }
        let mut err = [0 as c_char; 1024];
        // SAFETY: the thunk reads parameter i from ptrs[i] as the kernel's
        // declared type; each slot is 8 bytes holding a value of that type in
        // its low bytes (little endian), kinds checked by `check_launch`.
        // Pointer arguments are null or point into live allocations of this
        // device, aligned for their targets; the kernel's accesses through
        // them are the kernel's contract with its launcher (see the module
        // doc). grid and block were checked; err is writable for its length.
        let before = unsafe { ffi::moshid_emu_switches() };
        // SAFETY: as above.
        let rc = unsafe {
            ffi::moshid_emu_launch(
                k.thunk,
                grid.as_ptr(),
                block,
                ptrs.as_mut_ptr(),
                self.order.code(),
                err.as_mut_ptr(),
                err.len(),
            )
        };
        // SAFETY: reads a thread-local counter.
        self.switches += unsafe { ffi::moshid_emu_switches() } - before;
        self.launches += 1;
        if rc != 0 {
            // SAFETY: the runtime wrote a NUL-terminated message into err.
            let msg = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy();
            let msg = format!("{}<<<{grid:?}, {block}>>>: {msg}", k.name);
            self.fault = Some(msg.clone());
            return Err(DeviceError::Call {
                call: "emulator launch",
                why: msg,
            });
        }
        Ok(())
    }
}

impl Drop for EmuDevice {
    fn drop(&mut self) {
        for a in self.allocs.values() {
            // SAFETY: each mapping came from moshid_emu_alloc and is freed
            // once; nothing references device memory after the device.
            unsafe { ffi::moshid_emu_free(a.map as *mut c_void, a.map_len) }
        }
    }
}

fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Round to nearest even, NaN to 0x7fff (as `__float2bfloat16_rn`).
fn f32_to_bf16(f: f32) -> u16 {
    let x = f.to_bits();
    if x & 0x7fff_ffff > 0x7f80_0000 {
        return 0x7fff;
    }
    let hi = x >> 16;
    let rem = x & 0xffff;
    let up = rem > 0x8000 || (rem == 0x8000 && hi & 1 == 1);
    (hi + up as u32) as u16
}

/// Rows `r0..r0 + rows` of a `cols`-wide operand with row stride `ld`, as f32.
///
/// # Safety
/// The rows must lie inside a live allocation, aligned for `t`.
unsafe fn widen(
    p: DevPtr,
    t: DType,
    r0: usize,
    rows: usize,
    ld: usize,
    cols: usize,
    out: &mut [f32],
) {
    for r in 0..rows {
        let row = &mut out[r * cols..(r + 1) * cols];
        let start = (r0 + r) * ld;
        match t {
            DType::F32 => {
                let src = (p as *const f32).add(start);
                for (c, o) in row.iter_mut().enumerate() {
                    *o = src.add(c).read();
                }
            }
            DType::Bf16 => {
                let src = (p as *const u16).add(start);
                for (c, o) in row.iter_mut().enumerate() {
                    *o = bf16_to_f32(src.add(c).read());
                }
            }
        }
    }
}

/// f32 dot product, eight running sums (vectorisable).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// A validated GEMM (see [`Gemm`]): B is widened 64 rows at a time, so both
/// operands of the inner product over k are contiguous.
fn gemm(g: &Gemm, scratch: &mut Vec<f32>) {
    const NB: usize = 64;
    let need = (g.m + NB) * g.k;
    if scratch.len() < need {
        scratch.resize(need, 0.0);
    }
    let (a, b) = scratch.split_at_mut(g.m * g.k);
    let b = &mut b[..NB * g.k];
    // SAFETY: the operands were checked to lie inside live allocations,
    // aligned (`check_operand`); they are read through raw pointers only, so
    // C may alias them without a Rust reference being invalidated.
    unsafe { widen(g.a, g.a_type, 0, g.m, g.lda, g.k, a) };
    for n0 in (0..g.n).step_by(NB) {
        let nb = NB.min(g.n - n0);
        // SAFETY: as above.
        unsafe { widen(g.b, g.b_type, n0, nb, g.ldb, g.k, b) };
        for i in 0..g.m {
            let ar = &a[i * g.k..(i + 1) * g.k];
            for j in 0..nb {
                let acc = dot(ar, &b[j * g.k..(j + 1) * g.k]);
                let idx = i * g.ldc + n0 + j;
                // SAFETY: C was checked like A and B; element idx lies in it.
                unsafe {
                    match g.c_type {
                        DType::F32 => {
                            let p = (g.c as *mut f32).add(idx);
                            let old = if g.beta != 0.0 {
                                g.beta * p.read()
                            } else {
                                0.0
                            };
                            p.write(g.alpha * acc + old);
                        }
                        DType::Bf16 => {
                            let p = (g.c as *mut u16).add(idx);
                            let old = if g.beta != 0.0 {
                                g.beta * bf16_to_f32(p.read())
                            } else {
                                0.0
                            };
                            p.write(f32_to_bf16(g.alpha * acc + old));
                        }
                    }
                }
            }
        }
    }
}

impl Device for EmuDevice {
    fn name(&self) -> String {
        "emulator".into()
    }

    fn memory(&self) -> DeviceResult<(usize, usize)> {
        Ok((self.limit.saturating_sub(self.used), self.limit))
    }

    fn alloc(&mut self, bytes: usize) -> DeviceResult<DevPtr> {
        self.not_capturing("alloc")?;
        let rounded = bytes.div_ceil(256) * 256;
        let free = self.limit.saturating_sub(self.used);
        if rounded > free {
            return Err(DeviceError::OutOfMemory { asked: bytes, free });
        }
        let (mut map, mut map_len) = (std::ptr::null_mut(), 0usize);
        // SAFETY: the runtime maps fresh zeroed memory and writes the mapping
        // into the two out-parameters, valid locals.
        let p = unsafe { ffi::moshid_emu_alloc(bytes, &mut map, &mut map_len) };
        if p.is_null() {
            return Err(DeviceError::OutOfMemory { asked: bytes, free });
        }
        self.used += rounded;
        let addr = p as u64;
        self.allocs.insert(
            addr,
            DevAlloc {
                bytes,
                map: map as usize,
                map_len,
            },
        );
        Ok(addr)
    }

    fn alloc_host(&mut self, bytes: usize) -> DeviceResult<HostBuf> {
        self.not_capturing("alloc_host")?;
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 64)
            .map_err(|e| shape("alloc_host", e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or(
            DeviceError::OutOfMemory {
                asked: bytes,
                free: 0,
            },
        )?;
        let mem = Arc::new(HostMem { ptr, layout });
        self.hosts.push((ptr.as_ptr() as usize, bytes, mem.clone()));
        Ok(HostBuf::new(Box::new(EmuHost { mem, bytes })))
    }

    fn upload(&mut self, dst: DevPtr, src: &[u8]) -> DeviceResult<()> {
        self.faulted()?;
        self.not_capturing("upload")?;
        self.check_range("upload", dst, src.len())?;
        // SAFETY: dst..dst + len lies inside an allocation of this device,
        // which no Rust reference covers; src is a distinct host slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn download(&mut self, src: DevPtr, dst: &mut [u8]) -> DeviceResult<()> {
        self.faulted()?;
        self.not_capturing("download")?;
        self.check_range("download", src, dst.len())?;
        // SAFETY: as in `upload`, the other way.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn copy_to_device(
        &mut self,
        dst: DevPtr,
        src: &HostBuf,
        src_offset: usize,
        bytes: usize,
    ) -> DeviceResult<()> {
        let op = self
            .check_host("copy_to_device", src, src_offset, bytes)
            .and_then(|src| {
                self.check_range("copy_to_device", dst, bytes)?;
                Ok(Op::ToDevice { dst, src, bytes })
            });
        self.checked(op)
    }

    fn copy_to_host(
        &mut self,
        dst: &HostBuf,
        dst_offset: usize,
        src: DevPtr,
        bytes: usize,
    ) -> DeviceResult<()> {
        let op = self
            .check_host("copy_to_host", dst, dst_offset, bytes)
            .and_then(|dst| {
                self.check_range("copy_to_host", src, bytes)?;
                Ok(Op::ToHost { dst, src, bytes })
            });
        self.checked(op)
    }

    fn copy_on_device(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) -> DeviceResult<()> {
        let op = self
            .check_range("copy_on_device", dst, bytes)
            .and_then(|_| self.check_range("copy_on_device", src, bytes))
            .map(|_| Op::OnDevice { dst, src, bytes });
        self.checked(op)
    }

    fn memset_zero(&mut self, dst: DevPtr, bytes: usize) -> DeviceResult<()> {
        let op = self
            .check_range("memset_zero", dst, bytes)
            .map(|_| Op::Zero { dst, bytes });
        self.checked(op)
    }

    fn kernel(&self, name: &str) -> DeviceResult<KernelId> {
        table()
            .by_name
            .get(name)
            .map(|&i| KernelId(i))
            .ok_or_else(|| DeviceError::UnknownKernel(name.to_string()))
    }

    fn launch(
        &mut self,
        kernel: KernelId,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> DeviceResult<()> {
        if self.capture.is_none() {
            // Run at once from the caller's arguments: no copy, no allocation.
            self.faulted()?;
            self.check_launch(kernel, grid, block, args)?;
            return self.run(kernel.0, [grid.0, grid.1, grid.2], block, args);
        }
        let op = self
            .check_launch(kernel, grid, block, args)
            .map(|_| Op::Launch {
                kernel: kernel.0,
                grid: [grid.0, grid.1, grid.2],
                block,
                args: args.to_vec(),
            });
        self.checked(op)
    }

    fn gemm(&mut self, g: &Gemm) -> DeviceResult<()> {
        let check = check_gemm(g)
            .and_then(|_| self.check_operand(g.a, g.a_type, g.m, g.k, g.lda))
            .and_then(|_| self.check_operand(g.b, g.b_type, g.n, g.k, g.ldb))
            .and_then(|_| self.check_operand(g.c, g.c_type, g.m, g.n, g.ldc))
            .map(|_| Op::Gemm(*g));
        self.checked(check)
    }

    fn synchronize(&mut self) -> DeviceResult<()> {
        self.faulted()?;
        self.not_capturing("synchronize")
    }

    fn begin_capture(&mut self) -> DeviceResult<()> {
        self.faulted()?;
        if self.capture.take().is_some() {
            return Err(capture_error(
                "begin_capture while capturing (the capture is discarded)",
            ));
        }
        self.capture = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&mut self) -> DeviceResult<GraphId> {
        self.faulted()?;
        let ops = self
            .capture
            .take()
            .ok_or_else(|| capture_error("end_capture without begin_capture"))?;
        self.graphs.push(ops.into());
        Ok(GraphId(self.graphs.len() as u32 - 1))
    }

    fn launch_graph(&mut self, graph: GraphId) -> DeviceResult<()> {
        // CUDA refuses a graph launched into a capturing stream; so does the
        // emulator (and discards the capture), so both devices agree.
        self.not_capturing("launch_graph")?;
        let op = if (graph.0 as usize) < self.graphs.len() {
            Ok(Op::Graph(graph.0))
        } else {
            Err(capture_error(format!("unknown graph #{}", graph.0)))
        };
        self.checked(op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        // 1 + 3·2^-8 is halfway between two bf16: ties to the even one above.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(f32::NAN), 0x7fff);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        assert_eq!(bf16_to_f32(0xbf80), -1.0);
    }

    #[test]
    fn every_listed_kernel_is_in_the_emulator() {
        let names = kernel_names();
        for m in crate::compile::MODULES {
            for k in m.kernels {
                assert!(
                    names.contains(k),
                    "{k} of {} is not in the emulator",
                    m.file
                );
            }
        }
        let own = names.iter().filter(|n| !n.starts_with("emu_selftest_"));
        assert_eq!(
            own.count(),
            crate::compile::MODULES
                .iter()
                .map(|m| m.kernels.len())
                .sum::<usize>()
        );
    }

    #[test]
    fn the_device_is_send() {
        fn send<T: Send>() {}
        send::<EmuDevice>();
    }
}
