//! Errors reported by lanes.

use std::fmt;

/// Why a push did not put the record in the lane. The record is unchanged
/// and the lane's contents are untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PushError {
    /// Every slot holds an unread record: the receiver is behind.
    Full,
    /// The receiver was dropped: nobody will ever read this lane again.
    Abandoned,
}

impl fmt::Display for PushError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PushError::Full => "lane full",
            PushError::Abandoned => "lane receiver dropped",
        })
    }
}

impl std::error::Error for PushError {}

/// A lane was requested with a capacity of 0 records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ZeroCapacity;

impl fmt::Display for ZeroCapacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("lane capacity must be at least 1 record")
    }
}

impl std::error::Error for ZeroCapacity {}
