//! The debug-sync mode (`CudaOpenOptions::debug_sync`, the daemon's
//! `model.cuda.debug_sync`, `MOSHID_CUDA_DEBUG_SYNC=1` for the GPU tests):
//! the stream is synchronised after every kernel launch and GEMM, so that an
//! asynchronous failure (an illegal address, a trap, a launch that the
//! driver rejects late) is reported by the call that caused it, naming the
//! kernel, its grid and block and every argument (pointers against the
//! allocations they point into), or the GEMM and its cuBLAS arguments.
//!
//! Invariants: nothing is synchronised while capturing (a captured launch
//! runs only when its graph does; the mode is meant with graphs off, which
//! the daemon arranges); outside the mode nothing here runs, and an error
//! found at a plain `synchronize` says how to find its kernel.

use super::calls::call;
use super::CudaDevice;
use crate::device::{
    describe_args, describe_gemm, Arg, DevPtr, DeviceError, DeviceResult, Gemm, KernelId,
};

impl CudaDevice {
    /// The allocation (start, bytes) at or before `p`, if any.
    fn alloc_at(&self, p: DevPtr) -> Option<(DevPtr, usize)> {
        let i = self.allocs.partition_point(|a| a.ptr <= p);
        i.checked_sub(1)
            .map(|i| (self.allocs[i].ptr, self.allocs[i].bytes))
    }

    /// `kernel<<<grid, block>>>(args)` for an error message.
    pub(super) fn describe_launch(
        &self,
        kernel: KernelId,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> String {
        let name = self
            .kernels
            .get(kernel.0 as usize)
            .map_or("an unknown kernel", |k| k.name);
        format!(
            "`{name}`<<<{grid:?}, {block}>>>{}",
            describe_args(args, &|p| self.alloc_at(p))
        )
    }

    /// A GEMM and its cuBLAS arguments for an error message.
    pub(super) fn describe_gemm_call(&self, g: &Gemm) -> String {
        let cublas = super::cublas_args::gemm_ex(g)
            .map(|e| format!("{e:?}"))
            .unwrap_or_else(|e| e.to_string());
        format!(
            "{}; cublasGemmEx {cublas}",
            describe_gemm(g, &|p| self.alloc_at(p))
        )
    }

    /// In debug-sync mode (and not capturing): waits for the stream and
    /// turns its error into one that names `what` (built only on failure).
    pub(super) fn debug_sync_after(&self, what: impl FnOnce(&Self) -> String) -> DeviceResult<()> {
        if !self.debug_sync || self.capturing {
            return Ok(());
        }
        self.bind()?;
        let stream = self.cu_stream();
        // SAFETY: our stream.
        let r = call("cuStreamSynchronize", || unsafe {
            cudarc::driver::result::stream::synchronize(stream)
        });
        r.map_err(|e| DeviceError::Call {
            call: "debug_sync",
            why: format!("{} failed: {e}", what(self)),
        })
    }

    /// The hint a plain `synchronize` error carries.
    pub(super) fn sync_hint(&self) -> &'static str {
        if self.debug_sync {
            ""
        } else {
            " (an earlier launch or GEMM failed asynchronously: open the device with debug_sync \
             — model.cuda.debug_sync, MOSHID_CUDA_DEBUG_SYNC=1 for the tests — to name it)"
        }
    }
}
