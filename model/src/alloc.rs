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
//! Invariants: a returned vector has exactly the asked length; zeroed
//! vectors come from `alloc_zeroed` (the kernel's zero pages, as `vec!`
//! gives), so a large cache costs no time until it is written.

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
    // SAFETY: `ptr` was allocated by the global allocator with the layout of
    // `[T; n]` (so capacity `n` matches it), and its `n` elements are
    // initialised: all-zero bytes are a valid `T` (`ZeroIsValid`).
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
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
