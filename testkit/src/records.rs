//! The daemon's log records ([`moshid::log_record`]) read back from its
//! stderr: the facts a test waits on (a session's end, a call's start, an
//! RTP session's counters) as typed fields instead of searched text.
//!
//! Invariant: a record is matched by its kind and by field values, exactly
//! ([`LogRecord::matches`]); prose lines are never records.

use std::fmt;

use moshid::log_record::{parse, ParsedRecord, Record};

use crate::wait::poll;
use crate::{Daemon, RECORD_TIMEOUT};

/// One record of the daemon's log.
#[derive(Debug, Clone, PartialEq)]
pub struct LogRecord {
    parsed: ParsedRecord,
    line: String,
}

impl LogRecord {
    /// The record of one log line, if it is one.
    pub fn parse(line: &str) -> Option<LogRecord> {
        Some(LogRecord {
            parsed: parse(line)?,
            line: line.to_string(),
        })
    }

    /// Its kind.
    pub fn kind(&self) -> Record {
        self.parsed.record
    }

    /// Field `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.parsed.get(key)
    }

    /// Field `key`, which must be present.
    pub fn str(&self, key: &str) -> &str {
        self.get(key)
            .unwrap_or_else(|| panic!("no `{key}` in {}", self.line))
    }

    /// Field `key` as a number, which it must be.
    pub fn u64(&self, key: &str) -> u64 {
        let v = self.str(key);
        v.parse()
            .unwrap_or_else(|_| panic!("`{key}={v}` is not a count in {}", self.line))
    }

    /// Field `key` as a decimal number, which it must be.
    pub fn f64(&self, key: &str) -> f64 {
        let v = self.str(key);
        v.parse()
            .unwrap_or_else(|_| panic!("`{key}={v}` is not a number in {}", self.line))
    }

    /// Whether every `(key, value)` of `with` is one of its fields.
    pub fn matches(&self, with: &[(&str, &str)]) -> bool {
        with.iter().all(|(k, v)| self.get(k) == Some(*v))
    }

    /// The line as the daemon wrote it.
    pub fn line(&self) -> &str {
        &self.line
    }
}

impl fmt::Display for LogRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line)
    }
}

/// The records of kind `kind` in `log` with every field of `with`, in order.
pub fn records_in(log: &str, kind: Record, with: &[(&str, &str)]) -> Vec<LogRecord> {
    log.lines()
        .filter_map(LogRecord::parse)
        .filter(|r| r.kind() == kind && r.matches(with))
        .collect()
}

impl Daemon {
    /// The records of kind `kind` with every field of `with`, so far.
    pub fn records(&self, kind: Record, with: &[(&str, &str)]) -> Vec<LogRecord> {
        records_in(&self.stderr(), kind, with)
    }

    /// Waits (bounded by [`RECORD_TIMEOUT`]) for a record of kind `kind`
    /// with every field of `with`; returns the first.
    pub fn wait_record(&self, kind: Record, with: &[(&str, &str)]) -> LogRecord {
        self.wait_records(kind, with, 1).swap_remove(0)
    }

    /// Waits (bounded by [`RECORD_TIMEOUT`]) for `n` records of kind `kind`
    /// with every field of `with`; returns all there are then (at least `n`).
    pub fn wait_records(&self, kind: Record, with: &[(&str, &str)], n: usize) -> Vec<LogRecord> {
        let mut found = Vec::new();
        let done = poll(RECORD_TIMEOUT, || {
            found = self.records(kind, with);
            (found.len() >= n).then_some(())
        });
        if done.is_none() {
            panic!(
                "{n} `{}` record(s) with {with:?} expected within {RECORD_TIMEOUT:?}, {} found; stderr:\n{}",
                kind.name(),
                found.len(),
                self.stderr_tail()
            );
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_by_kind_and_fields() {
        let log = "<6>ready: 4 slots\n\
                   <6>rtp session end id=r1 codec=PCMU received=150\n\
                   <6>session end id=1 transport=rtp slot=0 reason=idle_timeout\n\
                   <6>session end id=2 transport=sip slot=- reason=refused detail=\"sip.max_dialogs\"\n";
        let ends = records_in(log, Record::SessionEnd, &[]);
        assert_eq!(ends.len(), 2, "rtp session end is not a session end");
        let sip = records_in(log, Record::SessionEnd, &[("transport", "sip")]);
        assert_eq!(sip.len(), 1);
        assert_eq!(sip[0].str("detail"), "sip.max_dialogs");
        let rtp = &records_in(log, Record::RtpSessionEnd, &[("codec", "PCMU")])[0];
        assert_eq!(rtp.u64("received"), 150);
        assert_eq!(rtp.get("lost"), None);
    }
}
