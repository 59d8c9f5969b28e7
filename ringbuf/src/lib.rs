//! Frame lanes and the doorbell: how audio frames cross between the pinned
//! I/O cores and the engine thread.
//!
//! * [`lane()`] creates a bounded single-producer single-consumer queue of
//!   fixed-size `Copy` records (one per direction per I/O core), built on
//!   [`rtrb`]. Pushing never blocks: a full lane is reported to the caller.
//!   Invariants: [`mod@lane`].
//! * [`Doorbell`] lets a plain thread (the engine) wake one async task (an
//!   I/O core's output task) without spinning, sleeping or locking.
//!   Invariants: [`mod@doorbell`].
//!
//! After construction, moving a record through a lane allocates nothing,
//! takes no lock and makes no syscall. Ringing a doorbell costs one atomic
//! read-modify-write, plus the executor's wake when the task must be woken.
//!
//! The crate has no `unsafe` code: rtrb's safe slice and chunk API already
//! copies a record exactly once (or not at all, for the in-place variants).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod doorbell;
pub mod lane;

pub use doorbell::{Closed, Doorbell, Wait};
pub use lane::{lane, LaneReceiver, LaneSender, PushError, ZeroCapacity};
