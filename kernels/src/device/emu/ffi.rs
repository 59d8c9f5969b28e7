//! The C ABI of `emu/emu_runtime.cpp` and the generated registry: the
//! kernel table (one [`KernelInfo`] row per kernel, static and read-only),
//! launches, device mappings and the fiber-switch counter.
//!
//! Invariants: declarations only, matching `emu::kernel_info` of
//! `cuda_emu.h` and the `extern "C"` functions of `emu_runtime.cpp` exactly;
//! every call's safety argument is made at its call site.

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
