//! Fallible allocation of the large buffers made at load: weights, KV caches,
//! streaming state.
//!
//! Rust's `vec![0.0; n]` aborts the process when the allocator says no (a
//! checkpoint too big for `RLIMIT_AS`, a cgroup limit): the user sees
//! "memory allocation of N bytes failed" and a core dump. Every buffer whose
//! size follows the model or `max_slots` goes through here instead, and a
//! refusal becomes an [`AllocError`] that says what was being allocated and
//! how much, which the caller passes up as an ordinary error.
//!
//! Zeroed vectors are resident when returned: `alloc_zeroed` hands out the
//! kernel's shared zero page for a large block, and each 4 KiB page would
//! otherwise become the process's own only when first written — a KV
//! ring's pages the first time a call in that slot reaches their positions,
//! a slot's whole state the first time a peak of sessions uses it. The
//! resident size then creeps up for as long as the daemon runs (a 24-minute
//! soak before this: +7.4 % after warm-up, slowing down as fewer slots and
//! ring positions were left untouched), and those page faults land in the
//! engine's step. Writing every page once at load makes the daemon's memory
//! what the footprint says from its first minute, and a machine without
//! that memory fails at start rather than hours later.
//!
//! Invariants: a returned vector has exactly the asked length; every page
//! of a zeroed vector has been written once (so it is resident).

use std::alloc::Layout;

/// An allocation the system refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "out of memory: cannot allocate {what} ({bytes} bytes, {gib:.2} GiB)",
    gib = *bytes as f64 / (1u64 << 30) as f64
)]
pub struct AllocError {
    /// What the buffer was for, e.g. "the LM's KV caches for 8 slots".
    pub what: String,
    /// Its size.
    pub bytes: u64,
}

impl AllocError {
    fn new(what: impl Into<String>, bytes: u64) -> Self {
        AllocError {
            what: what.into(),
            bytes,
        }
    }
}

/// Element types whose all-zero bit pattern is a valid value (so a zeroed
/// allocation is an initialised vector).
///
/// # Safety
/// Implement only for types for which every byte being 0 is a valid value.
pub unsafe trait ZeroIsValid: Copy {}
// SAFETY: 0.0, and the integer 0, are all-zero bit patterns.
unsafe impl ZeroIsValid for f32 {}
// SAFETY: as above.
unsafe impl ZeroIsValid for u32 {}
// SAFETY: as above.
unsafe impl ZeroIsValid for u8 {}
// SAFETY: as above.
unsafe impl ZeroIsValid for u16 {}

/// A vector of `n` zeros, or an error naming `what`.
pub fn zeroed<T: ZeroIsValid>(
    n: usize,
    what: impl FnOnce() -> String,
) -> Result<Vec<T>, AllocError> {
    let bytes = (n as u64).saturating_mul(std::mem::size_of::<T>() as u64);
    if n == 0 || std::mem::size_of::<T>() == 0 {
        return Ok(Vec::new());
    }
    let Ok(layout) = Layout::array::<T>(n) else {
        return Err(AllocError::new(what(), bytes));
    };
    // SAFETY: `layout` has a non-zero size (n > 0 and T is not zero-sized,
    // both checked above).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if ptr.is_null() {
        return Err(AllocError::new(what(), bytes));
    }
    prefault(ptr as *mut u8, layout.size());
    // SAFETY: `ptr` was allocated by the global allocator with the layout of
    // `[T; n]` (so capacity `n` matches it), and its `n` elements are
    // initialised: all-zero bytes are a valid `T` (`ZeroIsValid`).
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// Bytes between two writes of [`prefault`] (the smallest page size).
const PAGE_BYTES: usize = 4096;

/// Writes a zero into every page of the zeroed block `ptr..ptr + len`, so
/// that each is the process's own (resident) from now on.
fn prefault(ptr: *mut u8, len: usize) {
    for offset in (0..len).step_by(PAGE_BYTES) {
        // SAFETY: `offset < len`, inside the block just allocated (not yet
        // shared with anyone); it already holds 0, so writing 0 changes no
        // value. Volatile: the compiler must not drop a store of the value
        // the allocation already has.
        unsafe { std::ptr::write_volatile(ptr.add(offset), 0) };
    }
}

/// An empty vector with room for exactly `n` values, or an error naming `what`.
pub fn with_capacity<T>(n: usize, what: impl FnOnce() -> String) -> Result<Vec<T>, AllocError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        AllocError::new(
            what(),
            (n as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        )
    })?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_has_the_length_and_zeros() {
        let v: Vec<f32> = zeroed(1000, || "x".into()).unwrap();
        assert_eq!(v.len(), 1000);
        assert!(v.iter().all(|&x| x == 0.0));
        let e: Vec<u32> = zeroed(0, || "nothing".into()).unwrap();
        assert!(e.is_empty());
    }

    #[test]
    fn an_impossible_size_is_an_error_naming_it() {
        let e = zeroed::<f32>(usize::MAX / 2, || "the test's buffer".into()).unwrap_err();
        assert!(e.to_string().contains("the test's buffer"), "{e}");
        assert!(e.to_string().starts_with("out of memory"), "{e}");
        let e = with_capacity::<f32>(usize::MAX / 8, || "weights".into()).unwrap_err();
        assert_eq!(e.what, "weights");
        assert!(e.bytes > 1 << 60);
    }
}
