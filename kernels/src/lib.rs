//! The CUDA backend of moshid — the parts that exist so far.
//!
//! What this crate holds:
//! - `cuda/*.cu`: the kernels of the planned backend (norms, RoPE and the
//!   ring KV cache, single-query attention, SiLU gating, embeddings with the
//!   delayed token cache, top-k sampling with a per-slot RNG, Mimi's streaming
//!   convolutions and RVQ), mirroring the CPU reference in `moshid-model`;
//! - [`compile`]: their NVRTC compile path with a PTX cache (cudarc,
//!   dynamically loaded, so this crate builds where there is no CUDA at all);
//! - [`ptxas`]: running `ptxas -v` on the PTX and reading its resource report
//!   (`scripts/check-kernels`, the compile gate that needs no GPU);
//! - [`plan`]: host-side memory planning (weights, KV cache, per-slot state,
//!   scratch, `max_slots`, CUDA-graph buckets and keys);
//! - [`rng`]: the per-slot xoshiro256++ state the sampling kernel advances,
//!   seeded exactly as the CPU backend's generator;
//! - [`launch`]: device opening, module loading and typed launch wrappers
//!   (not yet for the token cache, embeddings, add and cast kernels) —
//!   untested on a GPU (its GPU tests are `#[ignore]`d
//!   for `scripts/gpu-check`), and not called by the daemon.
//!
//! What it does not hold: a `StreamingModel` on the GPU. No kernel here has
//! run on a GPU yet; the daemon refuses `backend = "cuda"` with
//! [`UNAVAILABLE_REASON`].

pub mod compile;
pub mod device;
pub mod launch;
pub mod model;
pub mod ops;
pub mod plan;
pub mod ptxas;
pub mod rng;
pub mod shapes;

/// Why the CUDA backend cannot be used in this build.
pub const UNAVAILABLE_REASON: &str =
    "the CUDA backend is not implemented in this version of moshid (its kernels \
     compile with NVRTC and its memory plan exists, but no model runs on a GPU yet)";
