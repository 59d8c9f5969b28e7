//! The receiving end of a lane.

use std::fmt;

use rtrb::Consumer;

/// The receiving end of a lane: reads records in push order, never blocks.
pub struct LaneReceiver<T> {
    consumer: Consumer<T>,
}

impl<T: Copy> LaneReceiver<T> {
    pub(super) fn new(consumer: Consumer<T>) -> Self {
        Self { consumer }
    }

    /// Copies the oldest record into `out` and removes it from the lane.
    /// Returns `false`, leaving `out` untouched, if the lane is empty.
    pub fn pop_into(&mut self, out: &mut T) -> bool {
        self.consumer
            .pop_entire_slice(std::slice::from_mut(out))
            .is_ok()
    }

    /// Lends the oldest record to `read` in place, then removes it.
    /// Returns `None` if the lane is empty. If `read` panics, the record
    /// stays in the lane.
    pub fn pop_with<R>(&mut self, read: impl FnOnce(&T) -> R) -> Option<R> {
        let chunk = self.consumer.read_chunk(1).ok()?;
        let result = read(&chunk.as_slices().0[0]);
        chunk.commit_all();
        Some(result)
    }

    /// Lends every record available at the time of the call to `read`, in
    /// order and in place, then removes them all at once. Returns how many.
    ///
    /// Records pushed during the call are left for the next call, so a fast
    /// sender cannot keep this looping. The freed slots become visible to
    /// the sender only when `drain` returns. If `read` panics, no record
    /// of this call is removed.
    pub fn drain(&mut self, mut read: impl FnMut(&T)) -> usize {
        let available = self.consumer.slots();
        if available == 0 {
            return 0;
        }
        let Ok(chunk) = self.consumer.read_chunk(available) else {
            // Unreachable: only this end removes records, so the
            // `available` records counted above are still there.
            return 0;
        };
        let (first, second) = chunk.as_slices();
        first.iter().chain(second).for_each(&mut read);
        chunk.commit_all();
        available
    }
}

impl<T> LaneReceiver<T> {
    /// Number of records waiting to be read. May grow at any time as the
    /// sender pushes.
    pub fn len(&self) -> usize {
        self.consumer.slots()
    }

    /// `true` if no record is waiting right now.
    pub fn is_empty(&self) -> bool {
        self.consumer.is_empty()
    }

    /// The lane's fixed capacity, in records.
    pub fn capacity(&self) -> usize {
        self.consumer.buffer().capacity()
    }

    /// `true` once the sender has been dropped; stays `true`. Records it
    /// pushed before being dropped are still readable, so to read
    /// everything: see `true` here first, then drain.
    pub fn is_abandoned(&self) -> bool {
        self.consumer.is_abandoned()
    }

    /// `true` if the sender has been dropped and every record it pushed has
    /// been read: nothing will ever arrive on this lane again.
    pub fn is_finished(&self) -> bool {
        // Abandonment first: its Acquire load makes every push visible, so
        // an empty lane after it is empty for good.
        self.is_abandoned() && self.is_empty()
    }
}

impl<T> fmt::Debug for LaneReceiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaneReceiver")
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .field("abandoned", &self.is_abandoned())
            .finish()
    }
}
