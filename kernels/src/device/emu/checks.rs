//! What every launch, copy, fill and GEMM is checked against before it runs
//! or is recorded: device ranges inside one allocation of this device, host
//! ranges inside a live host buffer of this device, GEMM operands aligned
//! and in range, and a launch's grid, block and arguments against the
//! kernel's compiled signature.
//!
//! Invariants: the checks only read the device's state; any mismatch is
//! [`DeviceError::Shape`] (an unknown kernel [`DeviceError::UnknownKernel`]),
//! and a pointer argument that is not null points into an allocation and is
//! aligned for its target type.

use super::launch::{table, Kernel};
use super::EmuDevice;
use crate::device::{
    check_inside, Arg, DType, DevPtr, DeviceError, DeviceResult, HostBuf, KernelId,
};

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
    /// Checks that `[ptr, ptr + bytes)` lies inside one allocation.
    pub(super) fn check_range(
        &self,
        what: &'static str,
        ptr: DevPtr,
        bytes: usize,
    ) -> DeviceResult<()> {
        let alloc = self.allocs.range(..=ptr).next_back();
        check_inside(what, ptr, bytes, alloc.map(|(&base, a)| (base, a.bytes)))
    }

    /// Checks a host range `[offset, offset + bytes)` of a buffer of this device.
    pub(super) fn check_host(
        &self,
        what: &'static str,
        buf: &HostBuf,
        offset: usize,
        bytes: usize,
    ) -> DeviceResult<usize> {
        let addr = buf.as_ptr() as usize;
        if !self.hosts.iter().any(|h| h.0 == addr) {
            return Err(DeviceError::shape(
                what,
                "the host buffer was not made by this device",
            ));
        }
        if offset.checked_add(bytes).is_none_or(|e| e > buf.bytes()) {
            return Err(DeviceError::shape(
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
    pub(super) fn check_operand(
        &self,
        ptr: DevPtr,
        t: DType,
        rows: usize,
        cols: usize,
        ld: usize,
    ) -> DeviceResult<()> {
        if !ptr.is_multiple_of(t.bytes() as u64) {
            return Err(DeviceError::shape(
                "gemm",
                format!("operand {ptr:#x} is misaligned"),
            ));
        }
        let elems = (rows - 1).checked_mul(ld).and_then(|v| v.checked_add(cols));
        let bytes = elems.and_then(|e| e.checked_mul(t.bytes()));
        match bytes {
            Some(b) => self.check_range("gemm", ptr, b),
            None => Err(DeviceError::shape("gemm", "operand extent overflows")),
        }
    }

    /// Validates a launch; returns the kernel.
    pub(super) fn check_launch(
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
            return Err(DeviceError::shape(name, format!("empty grid {grid:?}")));
        }
        if grid.0 > i32::MAX as u32 || grid.1 > 65_535 || grid.2 > 65_535 {
            return Err(DeviceError::shape(
                name,
                format!("grid {grid:?} beyond CUDA's limits"),
            ));
        }
        if block == 0 || block > 1024 {
            return Err(DeviceError::shape(
                name,
                format!("block of {block} threads (1..=1024)"),
            ));
        }
        if block > k.max_threads {
            return Err(DeviceError::shape(
                name,
                format!(
                    "block of {block} threads over the kernel's launch bounds ({})",
                    k.max_threads
                ),
            ));
        }
        if args.len() != k.kinds.len() {
            return Err(DeviceError::shape(
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
                return Err(DeviceError::shape(
                    name,
                    format!(
                        "argument {i} is {a:?}, the kernel takes {}",
                        kind_name(kind)
                    ),
                ));
            }
            if let Arg::Ptr(p) = *a {
                if p == crate::device::NULL {
                    continue;
                }
                if p % align.max(1) as u64 != 0 {
                    return Err(DeviceError::shape(
                        name,
                        format!("argument {i}: {p:#x} is not aligned to {align} bytes"),
                    ));
                }
                if let Err(DeviceError::Shape { why, .. }) = self.check_range(name, p, 1) {
                    return Err(DeviceError::shape(name, format!("argument {i}: {why}")));
                }
            }
        }
        Ok(k)
    }
}
