//! The sending end of a lane.

use std::fmt;

use rtrb::Producer;

use super::PushError;

/// The sending end of a lane: pushes records, never blocks.
pub struct LaneSender<T> {
    producer: Producer<T>,
}

impl<T: Copy> LaneSender<T> {
    pub(super) fn new(producer: Producer<T>) -> Self {
        Self { producer }
    }

    /// Copies `record` into the lane (one copy of `size_of::<T>()` bytes).
    ///
    /// # Errors
    ///
    /// [`PushError::Abandoned`] if the receiver was dropped, else
    /// [`PushError::Full`] if no slot is free. Either way nothing is written.
    pub fn try_push(&mut self, record: &T) -> Result<(), PushError> {
        self.check_receiver()?;
        self.producer
            .push_entire_slice(std::slice::from_ref(record))
            .map_err(|_| PushError::Full)
    }

    /// Builds the record in place in the lane's next free slot.
    ///
    /// The slot is first set to `T::default()`, then `fill` writes the
    /// fields; the record is published when `fill` returns. No copy of the
    /// record is made (the default store is a plain write). If `fill`
    /// panics, nothing is published.
    ///
    /// # Errors
    ///
    /// As [`try_push`](Self::try_push); `fill` is not called on error.
    pub fn try_push_with(&mut self, fill: impl FnOnce(&mut T)) -> Result<(), PushError>
    where
        T: Default,
    {
        self.check_receiver()?;
        let mut chunk = self.producer.write_chunk(1).map_err(|_| PushError::Full)?;
        let (first, _) = chunk.as_mut_slices();
        fill(&mut first[0]);
        chunk.commit_all();
        Ok(())
    }

    fn check_receiver(&self) -> Result<(), PushError> {
        if self.producer.is_abandoned() {
            Err(PushError::Abandoned)
        } else {
            Ok(())
        }
    }
}

impl<T> LaneSender<T> {
    /// Number of records that can be pushed now without [`PushError::Full`].
    /// May grow at any time as the receiver reads.
    pub fn free_slots(&self) -> usize {
        self.producer.slots()
    }

    /// The lane's fixed capacity, in records.
    pub fn capacity(&self) -> usize {
        self.producer.buffer().capacity()
    }

    /// `true` once the receiver has been dropped; stays `true`.
    pub fn is_abandoned(&self) -> bool {
        self.producer.is_abandoned()
    }
}

impl<T> fmt::Debug for LaneSender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaneSender")
            .field("capacity", &self.capacity())
            .field("free_slots", &self.free_slots())
            .field("abandoned", &self.is_abandoned())
            .finish()
    }
}
