//! Device memory for prompt snapshots (PersonaPlex's prefilled states): one
//! allocation made when the model is loaded, sized by the serving bound
//! (`engine.prompt_cache_mib`, part of the CUDA memory plan), handed out in
//! [`GRANULE_BYTES`] granules as lists of extents and given back when a
//! snapshot is dropped.
//!
//! Why on the device: a session whose prompt is cached starts with a
//! stream-ordered device → device copy of the state (about 2 × its bytes of
//! HBM traffic: ~50 µs for the ~105 MB of a 200-frame prompt of the 7B
//! model on an H200), where a host copy of the same bytes moves over PCIe at
//! a few tens of GB/s (milliseconds of the one stream every slot's step
//! shares). The price is device memory the KV slots cannot use; the bound
//! is explicit and planned (docs/models.md, "The prompt cache").
//!
//! Invariants: extents never overlap and lie inside the allocation; the
//! free list is sorted by offset and coalesced; a span holds whole granules
//! and gives them back exactly once (on drop). Every copy into or out of the
//! arena is issued on the model's one stream, so an extent given back and
//! handed out again is written only after every earlier copy out of it ran.

use crate::device::{DevPtr, Device, DeviceResult, NULL};
use std::sync::{Arc, Mutex};

/// The arena's unit of allocation.
pub const GRANULE_BYTES: usize = 64 << 10;

/// `bytes` rounded up to whole granules.
pub fn rounded(bytes: usize) -> usize {
    bytes.div_ceil(GRANULE_BYTES) * GRANULE_BYTES
}

/// The snapshot memory of a model.
#[derive(Debug)]
pub struct SnapshotArena {
    base: DevPtr,
    bytes: usize,
    /// Free `(offset, len)` ranges, sorted, coalesced.
    free: Mutex<Vec<(usize, usize)>>,
}

impl SnapshotArena {
    /// An arena of `bytes` (rounded down to granules) on `dev`; none is
    /// allocated for 0.
    pub fn new<D: Device + ?Sized>(dev: &mut D, bytes: usize) -> DeviceResult<Arc<Self>> {
        let bytes = bytes / GRANULE_BYTES * GRANULE_BYTES;
        let base = if bytes > 0 { dev.alloc(bytes)? } else { NULL };
        let free = if bytes > 0 {
            vec![(0, bytes)]
        } else {
            Vec::new()
        };
        Ok(Arc::new(SnapshotArena {
            base,
            bytes,
            free: Mutex::new(free),
        }))
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes not held by any span.
    pub fn free_bytes(&self) -> usize {
        self.lock().iter().map(|&(_, n)| n).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(usize, usize)>> {
        // The list is consistent between calls (nothing here panics midway).
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A span of `bytes` (rounded up to granules), made of the lowest free
    /// extents; `None` when less is free.
    pub fn take(self: &Arc<Self>, bytes: usize) -> Option<ArenaSpan> {
        let need = rounded(bytes.max(1));
        let mut free = self.lock();
        if free.iter().map(|&(_, n)| n).sum::<usize>() < need {
            return None;
        }
        let mut extents = Vec::new();
        let mut left = need;
        while left > 0 {
            let (at, n) = free[0];
            let used = n.min(left);
            extents.push((at, used));
            if used == n {
                free.remove(0);
            } else {
                free[0] = (at + used, n - used);
            }
            left -= used;
        }
        Some(ArenaSpan {
            arena: self.clone(),
            extents,
            bytes: need,
        })
    }

    fn give_back(&self, extents: &[(usize, usize)]) {
        let mut free = self.lock();
        free.extend_from_slice(extents);
        free.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(free.len());
        for &(at, n) in free.iter() {
            match merged.last_mut() {
                Some(last) if last.0 + last.1 == at => last.1 += n,
                _ => merged.push((at, n)),
            }
        }
        *free = merged;
    }
}

/// Granules of the arena held by one snapshot: a byte range `0..bytes` laid
/// over its extents in order.
#[derive(Debug)]
pub struct ArenaSpan {
    arena: Arc<SnapshotArena>,
    extents: Vec<(usize, usize)>,
    bytes: usize,
}

impl ArenaSpan {
    /// Whether the span lies in `arena` (a snapshot is restored only into
    /// the model whose device memory holds it).
    pub fn is_in(&self, arena: &Arc<SnapshotArena>) -> bool {
        Arc::ptr_eq(&self.arena, arena)
    }

    /// Bytes held (whole granules).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Calls `f(device address, offset in the range, length)` for each
    /// contiguous device piece of the span's bytes `at..at + len`.
    pub fn pieces(
        &self,
        at: usize,
        len: usize,
        mut f: impl FnMut(DevPtr, usize, usize) -> DeviceResult<()>,
    ) -> DeviceResult<()> {
        assert!(at + len <= self.bytes, "a range past the span's end");
        let (mut start, mut done) = (0, 0);
        for &(off, n) in &self.extents {
            let end = start + n;
            if done < len && at + done < end {
                let within = at + done - start;
                let piece = (n - within).min(len - done);
                f(self.arena.base + (off + within) as u64, done, piece)?;
                done += piece;
            }
            start = end;
        }
        Ok(())
    }
}

impl Drop for ArenaSpan {
    fn drop(&mut self) {
        self.arena.give_back(&self.extents);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::emu::EmuDevice;

    #[test]
    fn spans_take_granules_and_give_them_back_coalesced() {
        let mut dev = EmuDevice::new();
        let a = SnapshotArena::new(&mut dev, 10 * GRANULE_BYTES + 5).unwrap();
        assert_eq!(a.bytes(), 10 * GRANULE_BYTES);
        let s1 = a.take(3 * GRANULE_BYTES - 1).unwrap();
        assert_eq!(s1.bytes(), 3 * GRANULE_BYTES);
        let s2 = a.take(4 * GRANULE_BYTES).unwrap();
        let s3 = a.take(3 * GRANULE_BYTES).unwrap();
        assert!(a.take(1).is_none(), "the arena is full");
        drop(s1);
        drop(s3);
        // 6 granules free in two holes: a 5-granule span spans both.
        let s4 = a.take(5 * GRANULE_BYTES).unwrap();
        assert_eq!(s4.extents.len(), 2);
        let mut seen = Vec::new();
        s4.pieces(GRANULE_BYTES, 3 * GRANULE_BYTES, |p, at, n| {
            seen.push((p - a.base, at, n));
            Ok(())
        })
        .unwrap();
        let g = GRANULE_BYTES as u64;
        assert_eq!(
            seen,
            vec![
                (g, 0, 2 * GRANULE_BYTES),
                (7 * g, 2 * GRANULE_BYTES, GRANULE_BYTES)
            ]
        );
        drop(s2);
        drop(s4);
        assert_eq!(a.free_bytes(), 10 * GRANULE_BYTES);
        assert_eq!(*a.lock(), vec![(0, 10 * GRANULE_BYTES)]);
    }

    #[test]
    fn an_empty_arena_holds_nothing() {
        let mut dev = EmuDevice::new();
        let a = SnapshotArena::new(&mut dev, GRANULE_BYTES - 1).unwrap();
        assert_eq!(a.bytes(), 0);
        assert!(a.take(1).is_none());
    }
}
