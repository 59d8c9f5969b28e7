//! The I/O cores' side of the data path: per-core context, session
//! mailboxes, and the loop that routes the engine's records.

pub mod app;
pub mod conn;
pub mod core;
pub mod listener;
pub mod mailbox;
