//! The I/O cores' side of the data path: per-core context, session
//! mailboxes, and the loop that routes the engine's records.

pub mod accept;
pub mod accept_pace;
pub mod conn;
pub mod core;
pub mod fd_limit;
pub mod log_gate;
pub mod mailbox;
pub mod pending;
