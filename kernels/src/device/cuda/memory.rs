//! Device memory: allocations (`cuMemAlloc`, zeroed on the stream),
//! page-locked host buffers (`cuMemHostAlloc`), the copies and fills between
//! them, and the range checks every copy, fill, GEMM and launch passes.
//!
//! Invariants: an allocation is rounded up to [`ALLOC_ALIGN`] bytes and
//! aligned on it; `allocs` stays sorted by address and nothing in it is
//! freed before the device is dropped. A host buffer's memory lives until
//! both its [`HostBuf`] and the device's record of it are gone. A device
//! range passes only inside one allocation (an empty range anywhere), a host
//! range only inside a live host buffer of this device.

use super::calls::{bind_for_cleanup, call, guarded, CallError};
use super::CudaDevice;
use crate::device::{check_inside, DevPtr, Device, DeviceError, DeviceResult, HostAlloc, HostBuf};
use cudarc::driver::{sys, CudaContext};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Device allocations are rounded up to, and aligned on, this many bytes.
pub(super) const ALLOC_ALIGN: usize = 256;

/// One device allocation.
#[derive(Debug, Clone, Copy)]
pub(super) struct Alloc {
    pub(super) ptr: DevPtr,
    /// Bytes asked for (ranges are checked against this).
    pub(super) bytes: usize,
}

/// A host buffer handed out by this device, which keeps its memory alive
/// (a captured graph copies to and from it by address).
pub(super) struct HostRecord {
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

impl CudaDevice {
    /// Checks that `[ptr, ptr + bytes)` lies inside one allocation (an empty
    /// range anywhere passes, as on the emulator).
    pub(super) fn check_range(
        &self,
        what: &'static str,
        ptr: DevPtr,
        bytes: usize,
    ) -> DeviceResult<()> {
        // `allocs` is sorted by start: the candidate is the last one at or
        // before `ptr`.
        let i = self.allocs.partition_point(|a| a.ptr <= ptr);
        let alloc = i
            .checked_sub(1)
            .map(|i| (self.allocs[i].ptr, self.allocs[i].bytes));
        check_inside(what, ptr, bytes, alloc)
    }

    /// Checks that `buf` is a live host buffer of this device and that
    /// `offset + bytes` fits it; returns the host address at `offset`.
    pub(super) fn check_host(
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
            return Err(DeviceError::shape(
                what,
                "the host buffer was not allocated by this device's alloc_host",
            ));
        }
        if offset
            .checked_add(bytes)
            .is_none_or(|end| end > buf.bytes())
        {
            return Err(DeviceError::shape(
                what,
                format!(
                    "bytes {offset}..+{bytes} do not fit a host buffer of {}",
                    buf.bytes()
                ),
            ));
        }
        Ok(buf.as_ptr().wrapping_add(offset))
    }

    pub(super) fn alloc_inner(&mut self, bytes: usize) -> DeviceResult<DevPtr> {
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

    pub(super) fn alloc_host_inner(&mut self, bytes: usize) -> DeviceResult<HostBuf> {
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

    pub(super) fn upload_inner(&self, dst: DevPtr, src: &[u8]) -> DeviceResult<()> {
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

    pub(super) fn download_inner(&self, src: DevPtr, dst: &mut [u8]) -> DeviceResult<()> {
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

    pub(super) fn copy_to_device_inner(
        &self,
        dst: DevPtr,
        src: &HostBuf,
        src_offset: usize,
        bytes: usize,
    ) -> DeviceResult<()> {
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
    }

    pub(super) fn copy_to_host_inner(
        &self,
        dst: &HostBuf,
        dst_offset: usize,
        src: DevPtr,
        bytes: usize,
    ) -> DeviceResult<()> {
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
    }

    pub(super) fn copy_on_device_inner(
        &self,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
    ) -> DeviceResult<()> {
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
    }

    pub(super) fn memset_zero_inner(&self, dst: DevPtr, bytes: usize) -> DeviceResult<()> {
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
    }
}
