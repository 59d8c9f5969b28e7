//! moshid-model: Mimi and the Moshi/Hibiki LM in float32.
//!
//! The crate reads the official configurations and checkpoints, and runs the
//! models frame by frame for a batch of independent streams ("slots"). Its CPU
//! backend is exact against the official implementation and is the oracle for
//! every other backend.

pub mod alloc;
pub mod checkpoint;
pub mod config;
pub mod cpu;
mod cpu_prompt;
pub mod demo;
pub mod footprint;
pub mod header_only;
pub mod lm;
pub mod lora;
pub mod mimi;
pub mod ops;
pub mod persona;
pub mod probe;
pub mod prompt_job;
pub mod spm;
pub mod spm_encode;
pub mod streaming;
pub mod weights;
