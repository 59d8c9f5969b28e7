//! Bounded SPSC lanes of fixed-size `Copy` records.
//!
//! # Invariants
//!
//! * One [`LaneSender`] and one [`LaneReceiver`] per lane. Each is `Send`
//!   (when `T` is) but not `Sync`: one thread at a time uses each end.
//! * Capacity is fixed at creation, counted in records, and is at least 1.
//!   The storage (`capacity_records * size_of::<T>()` bytes) is allocated
//!   once by [`lane`] and freed when both ends are dropped.
//! * FIFO, lossless: records are read in push order, each exactly once.
//! * Never blocking: a push into a full lane fails with [`PushError::Full`]
//!   and leaves the records already in the lane untouched; a pop from an
//!   empty lane returns at once.
//! * No allocation, lock or syscall per record.
//! * Copies per record: [`LaneSender::try_push`] copies it once into the
//!   ring; [`LaneSender::try_push_with`] fills the ring slot in place.
//!   [`LaneReceiver::pop_into`] copies it once out of the ring;
//!   [`LaneReceiver::pop_with`] and [`LaneReceiver::drain`] read it in place.
//! * Abandonment is sticky: once an end sees its peer dropped, it always
//!   will. Records pushed before the sender was dropped stay readable.
//!
//! # Ordering
//!
//! Everything the sending thread wrote before a successful push is visible
//! to the receiving thread once it reads that record (rtrb publishes the
//! write index with `Release` and loads it with `Acquire`).
//!
//! rtrb 0.4's `is_abandoned()` is an `Acquire` load that pairs with the
//! `Release` read-modify-write made when the peer is dropped (rtrb issue
//! #114 concerned 0.3), so no extra fence is needed here: after
//! [`LaneReceiver::is_abandoned`] returns `true`, every record the sender
//! pushed is visible to the receiver.

mod error;
mod receiver;
mod sender;

pub use error::{PushError, ZeroCapacity};
pub use receiver::LaneReceiver;
pub use sender::LaneSender;

/// Creates a lane holding at most `capacity_records` records.
///
/// This is the only allocation a lane ever makes.
///
/// # Errors
///
/// [`ZeroCapacity`] if `capacity_records` is 0.
///
/// # Panics
///
/// Panics (in rtrb) if `capacity_records` exceeds `usize::MAX / 2`.
pub fn lane<T: Copy>(
    capacity_records: usize,
) -> Result<(LaneSender<T>, LaneReceiver<T>), ZeroCapacity> {
    if capacity_records == 0 {
        return Err(ZeroCapacity);
    }
    let (producer, consumer) = rtrb::RingBuffer::new(capacity_records);
    Ok((LaneSender::new(producer), LaneReceiver::new(consumer)))
}

#[cfg(test)]
mod tests;
