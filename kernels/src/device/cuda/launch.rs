//! The kernel table and launches: at `open`, every module of
//! [`compile::MODULES`] is compiled (or read from the cache) to PTX and to
//! the device's SASS, loaded — the cubin first, the PTX when the cubin does
//! not load (a failure of both names both causes) — and resolved into a
//! table indexed by [`KernelId`], with each kernel's parameter sizes read
//! from its PTX; a launch is checked against them. Every function is loaded
//! at `open` (`cuFuncLoad`), not at its first launch, so that a first
//! launch inside a stream capture does not fail the capture.
//!
//! Invariants: a launch reaches `cuLaunchKernel` only with a known kernel,
//! arguments matching its PTX declaration in number and size (where it was
//! parsed), a grid and block within CUDA's limits, and every non-null
//! pointer argument inside an allocation of this device.

use super::args::{entry_params, PackedArgs};
use super::calls::{call, guarded, CallError};
use super::{CudaDevice, CudaOpenOptions};
use crate::compile::{self, CompileConfig};
use crate::device::{Arg, DeviceError, DeviceResult, KernelId};
use cudarc::driver::{sys, CudaFunction};

/// The first driver with `cuFuncLoad` (CUDA 12.4). On 12.2 and 12.3, where
/// lazy loading is already the default, set `CUDA_MODULE_LOADING=EAGER`
/// for graphs to capture a kernel's first launch.
const FUNC_LOAD_DRIVER: i32 = 12040;

/// One resolved kernel.
pub(super) struct Kernel {
    pub(super) name: &'static str,
    func: CudaFunction,
    /// Byte size of each parameter, from the PTX (`None`: not parsed, unchecked).
    params: Option<Vec<u16>>,
}

impl CudaDevice {
    pub(super) fn load_kernels(&mut self, opts: &CudaOpenOptions) -> DeviceResult<()> {
        // The daemon's include search (CUDA 13's include/cccl added).
        let include_dirs = compile::cuda_include_dirs(&opts.include_dirs)?;
        let nvrtc = compile::nvrtc_version()?;
        // SASS runs on devices of its major architecture with a minor
        // revision at least its own; beyond that only PTX can be JIT-compiled.
        let sass = self.arch.compute_capability().0 == self.capability.0;
        let compiled = compile::compile_all(&CompileConfig {
            arch: self.arch,
            include_dirs,
            cache_dir: opts.cache_dir.clone(),
            fmad: opts.fmad,
            cubin: sass,
            driver_version: Some(self.driver_version),
        })?;
        self.bind()?;
        let driver = (self.driver_version / 1000, self.driver_version % 1000 / 10);
        for c in &compiled {
            // The cubin first: it needs no JIT, so no driver as new as
            // NVRTC's PTX ISA; the PTX when the cubin does not load.
            let mut cubin_error = None;
            let mut module = None;
            if let Some(bin) = &c.cubin {
                let image = cudarc::nvrtc::Ptx::from_binary(bin.clone());
                match guarded("cuModuleLoadData", || self.ctx.load_module(image))? {
                    Ok(m) => {
                        self.load_report.push(format!(
                            "{}: SASS {} (cubin, {} bytes)",
                            c.module.file,
                            c.arch,
                            bin.len()
                        ));
                        module = Some(m);
                    }
                    Err(e) => cubin_error = Some(e.describe()),
                }
            }
            let module = match module {
                Some(m) => m,
                None => {
                    let ptx = cudarc::nvrtc::Ptx::from_src(c.ptx.clone());
                    let m = guarded("cuModuleLoadData", || self.ctx.load_module(ptx))?.map_err(|e| {
                        DeviceError::Call {
                            call: "cuModuleLoadData",
                            why: format!(
                                "{} for {}: the PTX did not load: {} (PTX from NVRTC {}.{} needs a driver \
                                 supporting CUDA {}.{}; this one supports {}.{}){}",
                                c.module.file,
                                c.arch,
                                e.describe(),
                                nvrtc.0,
                                nvrtc.1,
                                nvrtc.0,
                                nvrtc.1,
                                driver.0,
                                driver.1,
                                cubin_error
                                    .as_ref()
                                    .map_or(String::new(), |w| format!("; nor did its cubin: {w}"))
                            ),
                        }
                    })?;
                    self.load_report.push(format!(
                        "{}: PTX for {} (JIT-compiled by the driver){}",
                        c.module.file,
                        c.arch,
                        cubin_error.map_or_else(
                            || " (no cubin: the device's architecture is newer than any known)"
                                .to_string(),
                            |w| format!(" (the cubin did not load: {w})")
                        )
                    ));
                    m
                }
            };
            for &name in c.module.kernels {
                let func = call("cuModuleGetFunction", || module.load_function(name))?;
                if self.driver_version >= FUNC_LOAD_DRIVER {
                    // Lazy loading (CUDA_MODULE_LOADING=LAZY, the default
                    // since 12.2) would load the function at its first
                    // launch, and a first launch inside a stream capture
                    // fails the capture (thread-local mode: loading is an
                    // unsafe call). Load it now.
                    // SAFETY: a function of a module this device holds.
                    call("cuFuncLoad", || unsafe {
                        sys::cuFuncLoad(func.cu_function()).result()
                    })?;
                }
                self.kernels.push(Kernel {
                    name,
                    func,
                    params: entry_params(&c.ptx, name),
                });
            }
        }
        Ok(())
    }

    pub(super) fn launch_inner(
        &self,
        kernel: KernelId,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> DeviceResult<()> {
        let k = self
            .kernels
            .get(kernel.0 as usize)
            .ok_or_else(|| DeviceError::UnknownKernel(format!("#{}", kernel.0)))?;
        let mut packed = PackedArgs::new(args)?;
        if let Some(params) = &k.params {
            let ok = params.len() == packed.len()
                && params
                    .iter()
                    .zip(packed.sizes())
                    .all(|(&p, &a)| p == a as u16);
            if !ok {
                return Err(DeviceError::shape(
                    "launch",
                    format!(
                        "`{}` takes parameters of {params:?} bytes, given {:?}",
                        k.name,
                        packed.sizes()
                    ),
                ));
            }
        }
        if block == 0
            || block > 1024
            || grid.0 == 0
            || grid.1 == 0
            || grid.2 == 0
            || grid.0 > i32::MAX as u32
            || grid.1 > 65_535
            || grid.2 > 65_535
        {
            return Err(DeviceError::shape(
                "launch",
                format!("`{}`: grid {grid:?} block {block}", k.name),
            ));
        }
        // As on the emulator: a pointer argument is null or points into an
        // allocation of this device (a stray one would fault the context).
        for (i, a) in args.iter().enumerate() {
            if let Arg::Ptr(p) = *a {
                if p != crate::device::NULL && self.check_range("launch", p, 1).is_err() {
                    return Err(DeviceError::shape(
                        "launch",
                        format!(
                            "`{}` argument {i}: {p:#x} is not inside any allocation of this device",
                            k.name
                        ),
                    ));
                }
            }
        }
        let func = k.func.cu_function();
        let stream = self.cu_stream();
        self.bind()?;
        let mut ptrs = packed.pointers();
        let n = packed.len();
        // SAFETY: `func` is a function of a module this device keeps loaded;
        // the parameter array points at `packed`, alive on this frame until the
        // call returns (the driver copies the values at launch, and at capture
        // for a graph); the count and sizes match the kernel's PTX declaration
        // (checked above, when it was parsed). What the kernel addresses
        // through pointer arguments is the caller's contract (the `ops` layer).
        call("cuLaunchKernel", || unsafe {
            cudarc::driver::result::launch_kernel(
                func,
                grid,
                (block, 1, 1),
                0,
                stream,
                &mut ptrs[..n],
            )
        })
    }
}
