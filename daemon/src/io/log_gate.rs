//! A gate that lets a recurring log line through at most once per period:
//! what a flood of bad connections logs must not grow with the flood.
//!
//! Invariants: single-threaded (`Cell`, one per core and purpose); the first
//! event always passes; after that at most one event passes per `period`.
//! The caller prints the counts it keeps itself (totals, or what happened
//! since the last line), so nothing is lost by the lines that are held back.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// The period of the connection-related log lines of an I/O core.
pub const CONNECTION_LOG_PERIOD: Duration = Duration::from_secs(10);

/// Lets one log line through per period.
#[derive(Debug)]
pub struct LogGate {
    period: Duration,
    last: Cell<Option<Instant>>,
}

impl LogGate {
    /// A gate that opens at most once per `period`.
    pub const fn new(period: Duration) -> Self {
        LogGate {
            period,
            last: Cell::new(None),
        }
    }

    /// Whether a line may be logged at `now` (and, if so, starts a new period).
    pub fn due(&self, now: Instant) -> bool {
        let due = self
            .last
            .get()
            .is_none_or(|t| now.saturating_duration_since(t) >= self.period);
        if due {
            self.last.set(Some(now));
        }
        due
    }

    /// The period, in whole seconds (for the log line's own explanation).
    pub fn period_secs(&self) -> u64 {
        self.period.as_secs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period() {
        let g = LogGate::new(Duration::from_secs(10));
        let t = Instant::now();
        assert!(g.due(t));
        assert!(!g.due(t + Duration::from_secs(1)));
        assert!(!g.due(t + Duration::from_millis(9_999)));
        assert!(g.due(t + Duration::from_secs(10)));
        assert!(!g.due(t + Duration::from_secs(11)));
        assert_eq!(g.period_secs(), 10);
    }
}
