//! The driver and cuBLAS symbols this device calls, looked up when it
//! opens ([`DRIVER_SYMBOLS`] in `open`, [`CUBLAS_SYMBOLS`] in `init_cublas`).
//!
//! Invariants: every driver or cuBLAS function the device calls, directly or
//! through cudarc, belongs in one of these lists (add it here with the call),
//! so that an old library is an error at `open` rather than a panic at first
//! use. The lookup only takes each symbol's address; nothing is called.

/// Driver symbols called here (directly or through cudarc), checked at open.
pub(super) const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemGetInfo_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8Async",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuGraphInstantiateWithFlags",
    "cuGraphUpload",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuGraphGetNodes",
    "cuEventCreate",
    "cuEventRecordWithFlags",
    "cuEventElapsedTime",
    "cuEventDestroy_v2",
    "cuGetErrorName",
    "cuGetErrorString",
];

/// cuBLAS symbols called here, checked at open.
pub(super) const CUBLAS_SYMBOLS: &[&str] = &[
    "cublasCreate_v2",
    "cublasDestroy_v2",
    "cublasSetStream_v2",
    "cublasSetWorkspace_v2",
    "cublasSetMathMode",
    "cublasGemmEx",
];

/// The symbols of `$names` missing from the library `$lib` (a cudarc `culib()`).
macro_rules! missing_symbols {
    ($lib:expr, $names:expr) => {{
        let lib = $lib;
        $names
            .iter()
            .filter(|n| {
                // SAFETY: only the symbol's address is looked up; nothing is called.
                unsafe { lib.get::<unsafe extern "C" fn()>(n.as_bytes()) }.is_err()
            })
            .map(|n| n.to_string())
            .collect::<Vec<String>>()
    }};
}

pub(super) use missing_symbols;
