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
//! - Work runs when issued (one stream, issue order trivially), or in the
//!   deferred mode ([`EmuDevice::set_deferred`]) at the next synchronisation,
//!   with the host buffers it writes poisoned until then; while capturing it
//!   is recorded instead, arguments by value and host-buffer copies by
//!   address (as CUDA graphs do; the device keeps every host buffer it
//!   handed out alive, so a replay never reads freed memory). What CUDA
//!   refuses during capture is refused here too ([`DeviceError::Capture`]):
//!   `alloc`, `alloc_host`, `upload`, `download`, `synchronize`, a nested
//!   `begin_capture`; any error while capturing discards the capture.
//! - A kernel that fails at run time (deadlock, bad warp operation) leaves
//!   the device faulted, as a CUDA context after an illegal access: that
//!   launch and every later call return the error, `synchronize` included.
//! - GEMMs pass the checks both devices share (`check_gemm`: types cuBLAS
//!   computes, C overlapping neither A nor B) and are computed on the CPU
//!   with f32 accumulation (bf16 operands widened, a bf16 C rounded to
//!   nearest even), C never read when beta is 0.
//! - Shared memory is poisoned at the start of every block (`cuda_emu.h`).
//! - Timing events are stream operations like the rest (recorded into a
//!   graph while capturing, run in order): each holds the host clock of the
//!   moment the stream reached it; elapsed times are read only with nothing
//!   pending (as CUDA's "not ready").
//! - The device is `Send`: the scheduler's state (fiber stacks, `__shared__`
//!   variables) is per OS thread, so devices on different threads, tests
//!   running in parallel included, never share it.
//!
//! The files: `ffi.rs` (the C ABI of the native half), `launch.rs` (the
//! kernel table, thread orders and running a launch), `checks.rs` (the
//! validation of ranges, host buffers, GEMM operands and launches), `ops.rs`
//! (stream operations, run or recorded, and graph replay), `gemm.rs` (the
//! CPU GEMM and bf16 conversions).

mod checks;
mod ffi;
mod gemm;
mod launch;
mod ops;

pub use launch::{kernel_names, Order};

use super::{
    check_gemm, Arg, DevPtr, Device, DeviceError, DeviceResult, EventId, Gemm, GraphId, HostAlloc,
    HostBuf, KernelId,
};
use launch::table;
use ops::{capture_error, Op};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

/// The garbage word (little-endian, repeated from a variable's start) that
/// fills shared memory at every block start and host buffers a deferred
/// copy will write (`EMU_SHARED_POISON_WORD` of `cuda_emu.h`): NaN as an
/// f32 and as the high bf16 of a pair, -4534017 as an int.
pub const POISON: u32 = 0xffba_d0ff;

/// Memory limit of [`EmuDevice::new`]: 16 GiB (address space: pages are
/// committed only when touched).
pub const DEFAULT_MEMORY: usize = 16 << 30;

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
    /// Deferred execution: stream work waits here until the next
    /// synchronisation (see [`EmuDevice::set_deferred`]).
    deferred: bool,
    pending: Vec<Op>,
    /// Timing events: when the stream last reached each (host clock).
    events: Vec<Option<std::time::Instant>>,
}

impl Default for EmuDevice {
    fn default() -> Self {
        EmuDevice::new()
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
            deferred: false,
            pending: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Deferred execution, as a GPU may do it: copies, fills, launches,
    /// GEMMs and graph launches are queued and run only at the next
    /// synchronisation (`synchronize`, `upload`, `download`), in order; a
    /// host buffer a queued copy writes is filled with garbage until then,
    /// and a queued copy from a host buffer reads it only then. A host that
    /// reads results before synchronising, or rewrites an input buffer
    /// while the copy from it may still be in flight, gets wrong results
    /// here as it would on a GPU — where immediate execution hides it. A
    /// kernel that fails at run time is reported at the synchronisation
    /// (as CUDA reports asynchronous errors). Each queued launch copies its
    /// arguments: a test mode, not for measuring. Switching it off runs
    /// what is queued.
    pub fn set_deferred(&mut self, deferred: bool) -> DeviceResult<()> {
        self.deferred = deferred;
        if !deferred {
            return self.flush();
        }
        Ok(())
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
            .map_err(|e| DeviceError::shape("alloc_host", e.to_string()))?;
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
        self.flush()?;
        self.check_range("upload", dst, src.len())?;
        // SAFETY: dst..dst + len lies inside an allocation of this device,
        // which no Rust reference covers; src is a distinct host slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn download(&mut self, src: DevPtr, dst: &mut [u8]) -> DeviceResult<()> {
        self.faulted()?;
        self.not_capturing("download")?;
        self.flush()?;
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
        if self.capture.is_none() && !self.deferred {
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
        self.not_capturing("synchronize")?;
        self.flush()
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

    fn event_create(&mut self) -> DeviceResult<EventId> {
        self.not_capturing("event_create")?;
        self.events.push(None);
        Ok(EventId(self.events.len() as u32 - 1))
    }

    fn event_record(&mut self, event: EventId) -> DeviceResult<()> {
        let op = if (event.0 as usize) < self.events.len() {
            Ok(Op::Event(event.0))
        } else {
            Err(DeviceError::shape(
                "event_record",
                format!("no event #{}", event.0),
            ))
        };
        self.checked(op)
    }

    fn event_elapsed_ms(&mut self, start: EventId, end: EventId) -> DeviceResult<f32> {
        self.faulted()?;
        let at = |e: EventId| self.events.get(e.0 as usize).copied().flatten();
        match (at(start), at(end)) {
            // As CUDA's "not ready": queued work may still re-record them.
            _ if !self.pending.is_empty() => Err(DeviceError::Call {
                call: "event_elapsed_ms",
                why: "work is pending: synchronize first".into(),
            }),
            (Some(a), Some(b)) => Ok(if b >= a {
                (b - a).as_secs_f32() * 1e3
            } else {
                -((a - b).as_secs_f32() * 1e3)
            }),
            _ => Err(DeviceError::Call {
                call: "event_elapsed_ms",
                why: format!("event #{} or #{} was never recorded", start.0, end.0),
            }),
        }
    }

    fn graph_nodes(&self, graph: GraphId) -> Option<usize> {
        self.graphs.get(graph.0 as usize).map(|ops| ops.len())
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
    fn the_device_is_send() {
        fn send<T: Send>() {}
        send::<EmuDevice>();
    }
}
