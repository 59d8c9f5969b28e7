//! One session's event ring: a fixed array of event records written by the
//! session's task and read by any number of subscribers on any core, with
//! no lock and no waiting on either side.
//!
//! The writer never waits for a reader: a record overwrites the one
//! `capacity` places before it whether it was read or not, and a reader
//! that fell that far behind learns how many records it lost. Each slot is a
//! sequence lock: a stamp (`seq + 1` once record `seq` is complete,
//! [`WRITING`] while it is being replaced) and the record's words, all
//! atomics, so a torn read is detected and counted as lost, never returned.
//!
//! Invariants:
//! * One writer: [`EventRing::push`] is only called by the session's
//!   [`EventSink`](super::EventSink), which is neither `Clone` nor shared.
//! * `head` counts the records ever pushed; records `head − capacity ..
//!   head` are readable until overwritten; a reader at `next < head −
//!   capacity` has lost `head − capacity − next` records.
//! * Push is four relaxed stores and two release stores (one per word, the
//!   stamp twice, the head), one release fence: no allocation, no lock, no
//!   read-modify-write, no system call.
//! * Capacity is a power of two, fixed at creation (`events.ring_events`).

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Words in one record (see [`super::event::Event`] for their meaning).
pub const WORDS: usize = 3;

/// Stamp of a slot being rewritten.
const WRITING: u64 = u64::MAX;

/// One slot: 32 bytes, never straddling a cache line.
#[repr(align(32))]
#[derive(Default)]
struct Slot {
    stamp: AtomicU64,
    words: [AtomicU64; WORDS],
}

/// A fixed ring of records, one writer, many lossy readers.
pub struct EventRing {
    slots: Box<[Slot]>,
    mask: u64,
    head: AtomicU64,
}

/// Why a record could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    /// It was overwritten (the reader fell `capacity` records behind).
    Overwritten,
    /// It has not been pushed yet.
    NotYet,
}

impl EventRing {
    /// A ring of `capacity` records (a power of two, at least 2).
    pub fn new(capacity: usize) -> Self {
        assert!(
            capacity >= 2 && capacity.is_power_of_two(),
            "event ring capacity {capacity} must be a power of two ≥ 2 (validated in config)"
        );
        EventRing {
            slots: (0..capacity).map(|_| Slot::default()).collect(),
            mask: capacity as u64 - 1,
            head: AtomicU64::new(0),
        }
    }

    /// Records the ring holds.
    pub fn capacity(&self) -> u64 {
        self.mask + 1
    }

    /// Records ever pushed (the sequence number of the next one).
    #[inline]
    pub fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// Publishes one record. Single writer (see the module invariants).
    #[inline]
    pub(super) fn push(&self, words: [u64; WORDS]) {
        // Only this writer stores `head`: its own last value.
        let seq = self.head.load(Ordering::Relaxed);
        let slot = &self.slots[(seq & self.mask) as usize];
        slot.stamp.store(WRITING, Ordering::Relaxed);
        // Orders the stamp above before the word stores below for a reader
        // that sees any of the new words (its acquire fence pairs with this).
        fence(Ordering::Release);
        for (w, v) in slot.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        slot.stamp.store(seq + 1, Ordering::Release);
        self.head.store(seq + 1, Ordering::Release);
    }

    /// Reads record `seq`, or says why it cannot be read.
    #[inline]
    pub fn read(&self, seq: u64) -> Result<[u64; WORDS], ReadError> {
        let slot = &self.slots[(seq & self.mask) as usize];
        let before = slot.stamp.load(Ordering::Acquire);
        if before != seq + 1 {
            return Err(if before == WRITING || before > seq + 1 {
                ReadError::Overwritten
            } else {
                ReadError::NotYet
            });
        }
        let words = std::array::from_fn(|i| slot.words[i].load(Ordering::Relaxed));
        // Pairs with the writer's release fence: if any word above came from
        // a later record, the stamp below is no longer `seq + 1`.
        fence(Ordering::Acquire);
        if slot.stamp.load(Ordering::Relaxed) != before {
            return Err(ReadError::Overwritten);
        }
        Ok(words)
    }
}

/// A reader's place in one ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The sequence number of the next record to read.
    pub next: u64,
}

impl Cursor {
    /// Hands every readable record from `next` up to the ring's head to
    /// `f` (with its sequence number) and returns how many records were
    /// lost on the way (overwritten before they could be read).
    pub fn drain(&mut self, ring: &EventRing, mut f: impl FnMut(u64, [u64; WORDS])) -> u64 {
        let head = ring.head();
        let oldest = head.saturating_sub(ring.capacity());
        let mut lost = 0;
        if self.next < oldest {
            lost += oldest - self.next;
            self.next = oldest;
        }
        while self.next < head {
            match ring.read(self.next) {
                Ok(words) => f(self.next, words),
                // Overwritten while we read: the writer lapped us.
                Err(_) => lost += 1,
            }
            self.next += 1;
        }
        lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn reads_in_order_and_counts_what_was_overwritten() {
        let r = EventRing::new(4);
        let mut c = Cursor { next: 0 };
        assert_eq!(c.drain(&r, |_, _| panic!("empty")), 0);
        for i in 0..3u64 {
            r.push([i, i * 10, i * 100]);
        }
        let mut got = Vec::new();
        assert_eq!(c.drain(&r, |s, w| got.push((s, w[1]))), 0);
        assert_eq!(got, vec![(0, 0), (1, 10), (2, 20)]);
        for i in 3..13u64 {
            r.push([i, i * 10, i * 100]);
        }
        got.clear();
        // 10 pushed, 4 kept: 6 lost.
        assert_eq!(c.drain(&r, |s, w| got.push((s, w[2]))), 6);
        assert_eq!(got, vec![(9, 900), (10, 1000), (11, 1100), (12, 1200)]);
        assert_eq!(r.read(3), Err(ReadError::Overwritten));
        assert_eq!(r.read(13), Err(ReadError::NotYet));
        assert_eq!(c.next, 13);
    }

    /// A writer thread pushes records whose words are all derived from their
    /// sequence number while a reader drains concurrently: every record read
    /// is whole (never torn), in order, and read + lost = pushed.
    #[test]
    fn concurrent_reader_never_sees_a_torn_record() {
        const N: u64 = 200_000;
        let r = Arc::new(EventRing::new(8));
        let writer = {
            let r = r.clone();
            std::thread::spawn(move || {
                for i in 0..N {
                    r.push([i, i ^ 0x5555_5555_5555_5555, !i]);
                }
            })
        };
        let mut c = Cursor { next: 0 };
        let (mut read, mut lost, mut last) = (0u64, 0u64, None);
        while c.next < N {
            lost += c.drain(&r, |seq, w| {
                assert_eq!(w, [seq, seq ^ 0x5555_5555_5555_5555, !seq], "torn record");
                assert!(last.is_none_or(|l| l < seq), "out of order");
                last = Some(seq);
                read += 1;
            });
        }
        writer.join().unwrap();
        assert_eq!(read + lost, N);
        assert!(read > 0);
    }
}
