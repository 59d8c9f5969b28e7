//! The `#[repr(C)]` Rust twins of the structs of `cuda/common.cuh` that the
//! host writes into device buffers (step descriptors, transformer rows,
//! per-slot decoding parameters).
//!
//! Invariant: each struct has exactly the size, alignment and field order of
//! its CUDA twin (4-byte scalars, no padding; checked by a test), so a
//! [`HostBuf`](crate::device::HostBuf) of them is copied to the device as is.

use crate::device::HostPod;

/// One slot-step of a batch (`struct SlotStep` of common.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotStep {
    /// Slot index: token cache, RNG, offsets, conv state rows.
    pub slot: i32,
    /// 0: padding or masked slot, nothing is read or written.
    pub active: i32,
    /// Batch row of the conditioned logits / activations.
    pub row_cond: i32,
    /// Batch row of the guidance logits, or −1.
    pub row_null: i32,
}

/// One row of a transformer stack (`struct RowInfo` of common.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowInfo {
    /// Cache row.
    pub kv: i32,
    /// Stream position of the row's query and key.
    pub pos: i32,
    /// Newest position written into the cache row by this call.
    pub last: i32,
    /// Index of the row's SlotStep.
    pub step: i32,
    /// 0: masked.
    pub active: i32,
}

/// Per-slot decoding parameters (`struct SlotParams` of common.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SlotParams {
    /// Text temperature.
    pub temp_text: f32,
    /// Audio temperature.
    pub temp_audio: f32,
    /// Text top-k (0: all).
    pub top_k_text: i32,
    /// Audio top-k (0: all).
    pub top_k_audio: i32,
    /// Sample (1) or argmax (0).
    pub use_sampling: i32,
    /// Guidance coefficient (used where `SlotStep::row_null ≥ 0`).
    pub cfg_coef: f32,
}

// SAFETY: #[repr(C)] structs of 4-byte scalars (no padding, checked by the
// layout test), every bit pattern valid.
unsafe impl HostPod for SlotStep {}
// SAFETY: as above.
unsafe impl HostPod for RowInfo {}
// SAFETY: as above.
unsafe impl HostPod for SlotParams {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, size_of};

    #[test]
    fn structs_have_the_cuda_layout() {
        assert_eq!(size_of::<SlotStep>(), 16);
        assert_eq!(size_of::<RowInfo>(), 20);
        assert_eq!(size_of::<SlotParams>(), 24);
        assert_eq!(align_of::<SlotStep>(), 4);
        assert_eq!(align_of::<RowInfo>(), 4);
        assert_eq!(align_of::<SlotParams>(), 4);
        let r = RowInfo {
            kv: 1,
            pos: 2,
            last: 3,
            step: 4,
            active: 5,
        };
        let base = &r as *const RowInfo as usize;
        let offsets = [
            &r.kv as *const i32 as usize - base,
            &r.pos as *const i32 as usize - base,
            &r.last as *const i32 as usize - base,
            &r.step as *const i32 as usize - base,
            &r.active as *const i32 as usize - base,
        ];
        assert_eq!(offsets, [0, 4, 8, 12, 16]);
        let s = SlotStep::default();
        let base = &s as *const SlotStep as usize;
        assert_eq!(&s.active as *const i32 as usize - base, 4);
        assert_eq!(&s.row_null as *const i32 as usize - base, 12);
    }
}
