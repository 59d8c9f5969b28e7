//! Log records: the facts the daemon reports about its sessions, calls,
//! connections and reloads (a session's end, a SIP call's start, an RTP
//! session's counters…), each one line in one grammar that people read in
//! the journal and programs (tests, log shippers) parse:
//!
//! ```text
//! <6>sip call end call_id=a84b4c76e66710 session=7 reason=bye_from_peer seconds=3.1
//! <6>audiosocket call end id=3 … digits="12#" reason=idle_timeout error_code=-
//! ```
//!
//! * `<P>`: the syslog priority (journald and `systemd-cat` read it);
//! * the record's name, one of [`Record`]'s: words without `=`;
//! * `key=value` fields, in the order the writer gave them. A value is bare
//!   when it is non-empty and has no space, quote, backslash or control
//!   character, and written as a quoted string (Rust's `{:?}` escapes)
//!   otherwise, or always for fields written with [`LogLine::quoted`].
//!   `-` stands for "none".
//!
//! Invariants: [`parse`] reads back exactly the name and fields
//! [`LogLine`] wrote (checked below); a record is written with one
//! `write` call on stderr, so it is never interleaved with another thread's
//! line; the set of names is closed ([`Record::ALL`]), so a reader matches a
//! name exactly instead of searching free text. Other log lines (start-up,
//! warnings, rate-limited summaries) are prose for people and are not
//! records.

use std::fmt::{Display, Write as _};
use std::io::Write as _;

/// The kinds of record, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Record {
    /// Any transport's session ended: its [`crate::session::record::SessionRecord`].
    SessionEnd,
    /// An RTP session was allocated (control API or a SIP call).
    RtpSessionStart,
    /// An RTP session's media changed (a SIP re-INVITE).
    RtpSessionMedia,
    /// An RTP session ended, with its packet counters.
    RtpSessionEnd,
    /// A SIP call (either direction) was set up.
    SipCallStart,
    /// A SIP call's media changed by re-INVITE.
    SipCallReinvite,
    /// A SIP call ended.
    SipCallEnd,
    /// moshid placed a SIP call (`POST /v1/sip/calls`).
    SipCallPlaced,
    /// A call moshid placed was not answered usably.
    SipCallFailed,
    /// A SIP request was refused before any call (malformed, not allowed,
    /// failed authentication); rate-limited per core.
    SipRequestRefused,
    /// A registration of `sip.registrations` was granted (first time).
    SipRegistered,
    /// A registration of `sip.registrations` failed.
    SipRegisterFailed,
    /// A SIP TCP connection closed.
    SipTcpClose,
    /// An AudioSocket call ended, with its counters.
    AudiosocketCallEnd,
    /// A Media Streams WebSocket ended, with its counters.
    MediaStreamEnd,
    /// What a SIGHUP did (TLS certificate reloaded, failed, nothing to do).
    SighupReload,
}

impl Record {
    /// Every kind, for readers that look a name up.
    pub const ALL: [Record; 16] = [
        Record::SessionEnd,
        Record::RtpSessionStart,
        Record::RtpSessionMedia,
        Record::RtpSessionEnd,
        Record::SipCallStart,
        Record::SipCallReinvite,
        Record::SipCallEnd,
        Record::SipCallPlaced,
        Record::SipCallFailed,
        Record::SipRequestRefused,
        Record::SipRegistered,
        Record::SipRegisterFailed,
        Record::SipTcpClose,
        Record::AudiosocketCallEnd,
        Record::MediaStreamEnd,
        Record::SighupReload,
    ];

    /// The name written at the start of the line.
    pub fn name(self) -> &'static str {
        match self {
            Record::SessionEnd => "session end",
            Record::RtpSessionStart => "rtp session start",
            Record::RtpSessionMedia => "rtp session media",
            Record::RtpSessionEnd => "rtp session end",
            Record::SipCallStart => "sip call start",
            Record::SipCallReinvite => "sip call reinvite",
            Record::SipCallEnd => "sip call end",
            Record::SipCallPlaced => "sip call placed",
            Record::SipCallFailed => "sip call failed",
            Record::SipRequestRefused => "sip request refused",
            Record::SipRegistered => "sip registered",
            Record::SipRegisterFailed => "sip register failed",
            Record::SipTcpClose => "sip tcp close",
            Record::AudiosocketCallEnd => "audiosocket call end",
            Record::MediaStreamEnd => "media stream end",
            Record::SighupReload => "sighup reload",
        }
    }

    /// The syslog priority it is written with unless the writer says
    /// otherwise ([`LogLine::priority`]).
    pub fn priority(self) -> u8 {
        match self {
            Record::SipRegisterFailed => 4,
            Record::SipRequestRefused => 5,
            Record::SipTcpClose => 7,
            _ => 6,
        }
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<Record> {
        Record::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// One record being written: `LogLine::new(..).field(..)….emit()`.
#[must_use = "a record is written by emit()"]
pub struct LogLine {
    line: String,
    priority: u8,
}

impl LogLine {
    /// A record of kind `record` with no field yet.
    pub fn new(record: Record) -> Self {
        let mut line = String::with_capacity(160);
        line.push_str(record.name());
        LogLine {
            line,
            priority: record.priority(),
        }
    }

    /// Writes it with priority `p` instead of the kind's own.
    pub fn priority(mut self, p: u8) -> Self {
        self.priority = p;
        self
    }

    /// Adds `key=value` (quoted when the value needs it).
    pub fn field(mut self, key: &str, value: impl Display) -> Self {
        debug_assert!(is_key(key), "bad record key {key:?}");
        let start = self.line.len() + 1 + key.len() + 1;
        let _ = write!(self.line, " {key}={value}");
        let value = &self.line[start..];
        if needs_quotes(value) {
            let quoted = format!("{value:?}");
            self.line.truncate(start);
            self.line.push_str(&quoted);
        }
        self
    }

    /// Adds `key=value`, or `key=-` for `None`.
    pub fn opt(self, key: &str, value: Option<impl Display>) -> Self {
        match value {
            Some(v) => self.field(key, v),
            None => self.field(key, "-"),
        }
    }

    /// Adds `key="value"`, quoted whatever it holds (free text, digits).
    pub fn quoted(mut self, key: &str, value: impl Display) -> Self {
        debug_assert!(is_key(key), "bad record key {key:?}");
        let _ = write!(self.line, " {key}={:?}", value.to_string());
        self
    }

    /// The line as written, without the priority (for tests and messages).
    pub fn text(&self) -> &str {
        &self.line
    }

    /// Writes the record to stderr: one line, one `write`.
    pub fn emit(self) {
        let line = format!("<{}>{}\n", self.priority, self.line);
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

fn is_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn needs_quotes(value: &str) -> bool {
    value.is_empty()
        || value
            .chars()
            .any(|c| c == ' ' || c == '"' || c == '\\' || c.is_control() || c.is_whitespace())
}

/// A record read back from a log line.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRecord {
    /// Its kind.
    pub record: Record,
    /// Its syslog priority, when the line had one.
    pub priority: Option<u8>,
    /// Its fields, in the order written, values unquoted.
    pub fields: Vec<(String, String)>,
}

impl ParsedRecord {
    /// The value of field `key` (the first, should a key repeat).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads a record from one log line; `None` for a line that is not one
/// (prose, a truncated record, a name that is not a [`Record`]'s).
pub fn parse(line: &str) -> Option<ParsedRecord> {
    let line = line.trim_end_matches(['\n', '\r']);
    let (priority, rest) = match line.strip_prefix('<') {
        Some(r) => {
            let (p, rest) = r.split_once('>')?;
            (Some(p.parse().ok()?), rest)
        }
        None => (None, line),
    };
    // The name: the words before the first `key=`.
    let name_end = rest
        .match_indices(' ')
        .map(|(i, _)| i)
        .find(|&i| {
            rest[i + 1..]
                .split(' ')
                .next()
                .is_some_and(|w| w.contains('='))
        })
        .unwrap_or(rest.len());
    let record = Record::from_name(&rest[..name_end])?;
    let mut fields = Vec::new();
    let mut s = &rest[name_end..];
    while let Some(r) = s.strip_prefix(' ') {
        let (key, after) = r.split_once('=')?;
        if !is_key(key) {
            return None;
        }
        let (value, tail) = if after.starts_with('"') {
            unquote(after)?
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            (after[..end].to_string(), &after[end..])
        };
        fields.push((key.to_string(), value));
        s = tail;
    }
    s.is_empty().then_some(ParsedRecord {
        record,
        priority,
        fields,
    })
}

/// A `"…"` string with Rust's `{:?}` escapes at the start of `s`: the
/// text and what follows the closing quote.
fn unquote(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &s[i + 1..])),
            '\\' => {
                let (_, e) = chars.next()?;
                out.push(match e {
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    '0' => '\0',
                    '\\' | '"' | '\'' => e,
                    'u' => {
                        let mut hex = String::new();
                        if chars.next()?.1 != '{' {
                            return None;
                        }
                        for (_, h) in chars.by_ref() {
                            if h == '}' {
                                break;
                            }
                            hex.push(h);
                        }
                        char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?
                    }
                    _ => return None,
                });
            }
            c => out.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_reads_back() {
        let line = LogLine::new(Record::AudiosocketCallEnd)
            .field("id", 3)
            .field("peer", "127.0.0.1:5000")
            .quoted("digits", "12#")
            .field("detail", "bad \"ogg\" page\tat 3\\4 \u{1b}")
            .field("empty", "")
            .opt("error_code", None::<u8>)
            .field("eq", "a=b");
        let text = format!("<6>{}", line.text());
        assert!(text.starts_with("<6>audiosocket call end id=3 peer=127.0.0.1:5000 digits=\"12#\""));
        let r = parse(&text).expect("a record");
        assert_eq!(r.record, Record::AudiosocketCallEnd);
        assert_eq!(r.priority, Some(6));
        let want = [
            ("id", "3"),
            ("peer", "127.0.0.1:5000"),
            ("digits", "12#"),
            ("detail", "bad \"ogg\" page\tat 3\\4 \u{1b}"),
            ("empty", ""),
            ("error_code", "-"),
            ("eq", "a=b"),
        ];
        let got: Vec<(&str, &str)> = r
            .fields
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(r.get("digits"), Some("12#"));
    }

    #[test]
    fn names_are_exact_and_prose_is_not_a_record() {
        for r in Record::ALL {
            assert_eq!(Record::from_name(r.name()), Some(r));
            let p = parse(&format!("<{}>{} id=1", r.priority(), r.name())).unwrap();
            assert_eq!((p.record, p.get("id")), (r, Some("1")));
            assert_eq!(parse(r.name()).unwrap().fields, []);
        }
        // "session end" is not "rtp session end", and prose is no record.
        assert_eq!(
            parse("<6>rtp session end id=1").unwrap().record,
            Record::RtpSessionEnd
        );
        for prose in [
            "<6>ready: 4 slots, 1 phase group(s)",
            "<6>session ended id=1",
            "<6>session end id=\"unterminated",
            "<6>session end Id=1",
            "",
        ] {
            assert_eq!(parse(prose), None, "{prose:?}");
        }
    }
}
