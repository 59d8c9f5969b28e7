//! The CUDA backend of moshid.
//!
//! Not implemented yet: this crate holds its place in the workspace so that the
//! daemon's backend selection has one name to grow into. The README lists the
//! CUDA backend under "not done yet"; the daemon refuses `backend = "cuda"`
//! with an error that says so rather than pretending to run on a GPU.

/// Why the CUDA backend cannot be used in this build.
pub const UNAVAILABLE_REASON: &str = "the CUDA backend is not implemented in this version of moshid";
