//! The process heap (glibc's malloc, which Rust's allocations and libopus's
//! both go through): reading it (`mallinfo2`) and giving its free pages back
//! to the system (`malloc_trim`) at `runtime.heap_trim_ms`.
//!
//! Why trim: each thread allocates from its own arena, and an arena returns
//! memory to the system only from its top. Sessions come and go at
//! different times, so chunks freed after a peak sit between live ones and
//! their pages stay resident: without trimming, the resident size stays at
//! the largest footprint since start (bounded: ~390 KiB per session and at
//! most `max_slots` sessions) instead of what the daemon holds now
//! (measured in a 7-minute soak: idle at the end, 59.6 MiB allocated, 12.8
//! MiB free in the arenas, RSS 74.4 MiB). `malloc_trim(0)` walks every
//! arena and `madvise(MADV_DONTNEED)`s the whole pages inside its free
//! chunks, so the resident size comes back towards what is allocated (the
//! same soak with it: 66.6 MiB idle at the end). Each trim took ~1.2 ms.
//! mimalloc, which returns pages by itself, was measured too: ~100 MiB
//! under the same load (glibc ~75) and 90 MiB idle at the end; see
//! bench/reports/README.md.
//!
//! The slow creep of the resident size over a long soak was not the arenas
//! but the model's zeroed state becoming resident page by page: see
//! `moshid_model::alloc`.
//!
//! Invariants: only the main thread trims, never an I/O core or the engine
//! (the trim takes each arena's lock for the walk, so a thread allocating
//! at that moment waits; the hot path allocates nothing, so frames never
//! do). Reading takes the same locks, at scrape time only. On other C
//! libraries both are absent: [`read`] gives `None`, [`trim`] does nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// glibc's totals over every arena, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapBytes {
    /// Bytes in chunks handed out and not yet freed (arenas and
    /// separately mapped large chunks).
    pub in_use: u64,
    /// Bytes of free chunks the allocator keeps in its arenas (resident
    /// or not: a trimmed page stays in the free chunk, unmapped).
    pub free: u64,
    /// Bytes of the arenas (in-use and free chunks, excluding `mapped`).
    pub arena: u64,
    /// Bytes of chunks mapped one by one (large allocations).
    pub mapped: u64,
}

/// Trims done and the time they took (the main thread is their only writer).
static TRIMS: AtomicU64 = AtomicU64::new(0);
static TRIM_NS: AtomicU64 = AtomicU64::new(0);

/// The heap now, where glibc is the allocator.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn read() -> Option<HeapBytes> {
    // SAFETY: mallinfo2 takes no arguments, only reads the allocator's own
    // state under its locks and returns a plain struct by value.
    let m = unsafe { libc::mallinfo2() };
    Some(HeapBytes {
        in_use: (m.uordblks + m.hblkhd) as u64,
        free: m.fordblks as u64,
        arena: m.arena as u64,
        mapped: m.hblkhd as u64,
    })
}

/// The heap now, where glibc is the allocator.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn read() -> Option<HeapBytes> {
    None
}

/// Gives the whole free pages of every arena back to the system; counts
/// the trim and its time.
pub fn trim() {
    let start = Instant::now();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only rearranges the allocator's own free memory
    // under its locks; it never touches an allocated chunk.
    unsafe {
        libc::malloc_trim(0);
    }
    let ns = start.elapsed().as_nanos() as u64;
    TRIMS.store(TRIMS.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    TRIM_NS.store(TRIM_NS.load(Ordering::Relaxed) + ns, Ordering::Relaxed);
}

/// (trims done, microseconds they took in all).
pub fn trims() -> (u64, u64) {
    (
        TRIMS.load(Ordering::Relaxed),
        TRIM_NS.load(Ordering::Relaxed) / 1000,
    )
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_shows_in_use_and_a_trim_is_counted() {
        let before = read().expect("glibc reports its heap");
        let block = vec![1u8; 4 << 20];
        let during = read().expect("glibc reports its heap");
        assert!(
            during.in_use >= before.in_use + (4 << 20),
            "{before:?} → {during:?}"
        );
        drop(block);
        let after = read().expect("glibc reports its heap");
        assert!(after.in_use < during.in_use, "{during:?} → {after:?}");
        let (n, _) = trims();
        trim();
        assert_eq!(trims().0, n + 1);
    }
}
