//! Kernels and launches: the table of the kernels compiled into this binary
//! (read once from the registry), the thread [`Order`] of a launch, and
//! running a validated launch through `moshid_emu_launch`.
//!
//! Invariants: a [`KernelId`](crate::device::KernelId) is an index into the
//! table, which never changes after it is read; a launch passes at most
//! [`MAX_LAUNCH_ARGS`] arguments from fixed arrays on the stack (no
//! allocation per launch), each in an 8-byte slot holding its value in the
//! low bytes; a kernel that fails at run time leaves the device faulted.

use super::{ffi, EmuDevice};
use crate::device::{describe_args, Arg, DevPtr, DeviceError, DeviceResult};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

/// One kernel of the compiled table.
pub(super) struct Kernel {
    pub(super) name: &'static str,
    thunk: *const c_void,
    /// Parameter kinds: `p` pointer, `i` int, `u` unsigned, `f` float, `U`
    /// 64-bit integer, `?` unsupported.
    pub(super) kinds: &'static [u8],
    /// Alignment of each pointer parameter's target (1 for scalars).
    pub(super) aligns: &'static [u8],
    pub(super) max_threads: u32,
}

// SAFETY: `thunk` is the address of a function in the static library's code,
// never dereferenced on the Rust side; the slices and names point into the
// library's read-only tables. Nothing here is mutable or thread-bound.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

pub(super) struct Table {
    pub(super) kernels: Vec<Kernel>,
    pub(super) by_name: HashMap<&'static str, u32>,
}

/// The kernels compiled into this binary, read once.
pub(super) fn table() -> &'static Table {
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
    /// One warp at a time, warps in a pseudo-random order per pass from this
    /// seed, each running as far as it can (through its warp operations, up
    /// to a block barrier) before the next starts: as warps drift apart on a
    /// GPU. Shows a warp that overwrites shared memory another warp has yet
    /// to read (a missing `__syncthreads` between two uses of one buffer),
    /// which the lane-by-lane orders cannot.
    WarpsAhead(u32),
}

impl Order {
    fn code(self) -> u32 {
        match self {
            Order::Reverse => 0,
            Order::Forward => 1,
            Order::Shuffled(seed) => 2 + seed % (0x7fff_fffd),
            Order::WarpsAhead(seed) => 0x8000_0000 | (2 + seed % 0x7fff_fffd),
        }
    }
}

/// Most arguments a launch passes (the runtime reads them from a fixed array).
pub(super) const MAX_LAUNCH_ARGS: usize = 32;

impl EmuDevice {
    /// The allocation (start, bytes) at or before `p`, if any.
    pub(super) fn alloc_at(&self, p: DevPtr) -> Option<(DevPtr, usize)> {
        self.allocs
            .range(..=p)
            .next_back()
            .map(|(&b, a)| (b, a.bytes))
    }

    /// Runs a validated launch.
    pub(super) fn run(
        &mut self,
        kernel: u32,
        grid: [u32; 3],
        block: u32,
        args: &[Arg],
    ) -> DeviceResult<()> {
        let k = &table().kernels[kernel as usize];
        if args.len() > MAX_LAUNCH_ARGS {
            return Err(DeviceError::shape(
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
            let msg = format!(
                "`{}`<<<{grid:?}, {block}>>>{}: {msg}",
                k.name,
                describe_args(args, &|p| self.alloc_at(p))
            );
            self.fault = Some(msg.clone());
            return Err(DeviceError::Call {
                call: "emulator launch",
                why: msg,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
