//! The CUDA backend of moshid: the GPU model, its kernels and the devices
//! that run them.
//!
//! What this crate holds:
//! - `cuda/*.cu`: the kernels (norms, RoPE and the ring KV cache,
//!   single-query attention, SiLU gating, embeddings with the delayed token
//!   cache, top-k sampling with a per-slot RNG, Mimi's streaming
//!   convolutions and RVQ), mirroring the CPU reference in `moshid-model`;
//! - [`compile`]: their NVRTC compile path to PTX and cubins, cached (cudarc,
//!   dynamically loaded, so this crate builds where there is no CUDA at all);
//!   [`ptxas`]: the resource report of `ptxas -v` (`scripts/check-kernels`,
//!   the compile gate that needs no GPU);
//! - [`device`]: the one interface the model runs on — [`device::cuda`] (a
//!   GPU through the driver API, cuBLAS and CUDA graphs) and [`device::emu`]
//!   (the same `.cu` sources compiled for the host, so that CI checks the
//!   GPU model against the CPU reference without a GPU);
//! - [`ops`]: typed launches of every kernel; [`model`]: Mimi and the LM as
//!   launch sequences and [`model::GpuModel`], the engine's
//!   `StreamingModel` on a device, with one CUDA graph per batch bucket;
//! - [`profile`]: the step profile of `gpu-bench --profile` (timing events
//!   per phase, the analytic bytes and FLOPs of each phase, the device's
//!   measured rates);
//! - [`plan`]: host-side memory planning (weights, KV cache, per-slot state,
//!   `max_slots` from free memory, batch buckets); [`rng`]: the per-slot
//!   xoshiro256++ state the sampling kernel advances, seeded as the CPU
//!   backend's generator; [`shapes`]: the published model shapes for timing.
//!
//! The CUDA device has not run on a GPU yet (`scripts/gpu-check` is what a
//! machine with one runs); everything else is tested on the emulator.

pub mod compile;
pub mod device;
pub mod model;
pub mod ops;
pub mod plan;
pub mod profile;
pub mod ptxas;
pub mod rng;
pub mod shapes;
