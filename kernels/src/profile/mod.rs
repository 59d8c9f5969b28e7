//! The step profile (`gpu-bench --profile`): where a frame step's GPU time
//! goes, by phase, against what the hardware could do with the same work.
//!
//! - [`profiler`]: [`Profiled`], a device wrapper that records timing events
//!   at the phase marks the model issues ([`crate::device::Phase`]), inside
//!   captured graphs too, or around every call;
//! - [`roofline`]: the bytes each phase must move and the FLOPs it must do,
//!   computed from the model's shapes alone, and the floor they imply;
//! - [`calibrate`]: the device's copy bandwidth and matrix rates, measured
//!   in the same run, that the floors are taken against.

pub mod calibrate;
pub mod profiler;
pub mod roofline;

pub use profiler::{Collected, ProfileMode, Profiled, StepSample};
