//! Shared by the GPU-model tests: fixture folders and the comparison of a
//! [`GpuModel`] with the CPU reference backend on the same inputs, through
//! the engine's `StreamingModel` interface, on any device.

#![allow(dead_code, unused_imports)]

pub mod compare;
pub mod device;
pub mod fixtures;
pub mod lm_driver;
pub mod lm_golden;
