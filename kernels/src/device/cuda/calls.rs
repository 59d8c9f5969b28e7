//! Running cudarc calls: every call goes through [`guarded`] or [`call`],
//! so a panic inside cudarc becomes a [`DeviceError::Call`] instead of
//! unwinding into the caller, and a driver or cuBLAS error is described by
//! its name and, where the driver has one, its text.
//!
//! Invariants: nothing here panics, [`bind_for_cleanup`] included (it makes
//! the context current even when cudarc holds an error from an earlier drop).

use crate::device::{DeviceError, DeviceResult};
use cudarc::cublas::result::CublasError;
use cudarc::driver::{CudaContext, DriverError};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a failed call reports.
pub(super) trait CallError {
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
pub(super) fn bind_for_cleanup(ctx: &CudaContext) {
    if ctx.bind_to_thread().is_err() {
        let _ = ctx.bind_to_thread();
    }
}

/// Runs a cudarc call, turning a panic into an error (its own result is kept).
pub(super) fn guarded<T>(call: &'static str, f: impl FnOnce() -> T) -> DeviceResult<T> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| DeviceError::Call {
        call,
        why: format!("cudarc panicked: {}", panic_message(p.as_ref())),
    })
}

/// Runs a cudarc call; its error or panic becomes [`DeviceError::Call`].
pub(super) fn call<T, E: CallError>(
    name: &'static str,
    f: impl FnOnce() -> Result<T, E>,
) -> DeviceResult<T> {
    guarded(name, f)?.map_err(|e| DeviceError::Call {
        call: name,
        why: e.describe(),
    })
}
