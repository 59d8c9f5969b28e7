//! SIP's quoted string (RFC 3261 §25.1), read and written by one grammar
//! for every side of moshid: the `Authorization` headers the endpoint
//! verifies, the challenges moshid answers as a client (`WWW-Authenticate`,
//! `Proxy-Authenticate`), and every quoted value moshid writes itself.
//!
//! ```text
//! quoted-string = SWS DQUOTE *(qdtext / quoted-pair) DQUOTE
//! qdtext        = LWS / %x21 / %x23-5B / %x5D-7E / UTF8-NONASCII
//! quoted-pair   = "\" (%x00-09 / %x0B-0C / %x0E-7F)
//! ```
//!
//! Reading unescapes: the value is what the sender meant (`unq()` in RFC
//! 7616 §3.4, the form a digest is computed over). Writing escapes exactly
//! what qdtext cannot hold raw: `"`, `\` and the ASCII control characters
//! other than horizontal tab (0x00-0x08, 0x0B, 0x0C, 0x0E-0x1F, 0x7F).
//! Everything else, tab and non-ASCII text included, is written as it is
//! (a quoted-pair cannot hold a non-ASCII character).
//!
//! Invariants: `read(write(v)) == v` for every value `write` accepts
//! (fuzzed through `fuzz/fuzz_targets/sip_auth_header.rs` and
//! `sip_client_response.rs`); CR and LF can be neither a quoted-pair nor
//! qdtext (only as line folding, which the message parser has already
//! undone), so `read` never yields them and `write` refuses them instead of
//! putting a line break into a header.

/// Why a quoted string could not be read, or a value not written as one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuotedStringError {
    /// No closing `"`.
    #[error("unclosed quote")]
    Unclosed,
    /// `\` at the end, or before CR, LF or a non-ASCII character.
    #[error("bad escape in a quoted string")]
    BadEscape,
    /// A raw control character other than tab.
    #[error("a control character in a quoted string (it must be escaped)")]
    Control,
    /// A value holding CR or LF, which no quoted string can carry.
    #[error("a line break cannot be written in a quoted string")]
    LineBreak,
}

/// Whether `b` may follow `\` (RFC 3261 §25.1 quoted-pair).
fn escapable(b: u8) -> bool {
    b.is_ascii() && b != b'\r' && b != b'\n'
}

/// Whether `c` must be escaped when written.
fn needs_escape(c: char) -> bool {
    c == '"' || c == '\\' || (c.is_ascii_control() && c != '\t')
}

/// Reads the quoted string that starts at `text[start]` (which must be
/// `"`): the unescaped value and the index just past the closing quote.
pub fn read(text: &str, start: usize) -> Result<(String, usize), QuotedStringError> {
    let b = text.as_bytes();
    debug_assert_eq!(b.get(start), Some(&b'"'));
    let mut out = String::new();
    let mut i = start + 1;
    // Runs of unescaped text are copied as slices, so non-ASCII characters
    // (qdtext's UTF8-NONASCII) stay whole; every index cut at is an ASCII
    // byte's, hence a character boundary.
    let mut run = i;
    loop {
        match b.get(i) {
            None => return Err(QuotedStringError::Unclosed),
            Some(b'"') => {
                out.push_str(&text[run..i]);
                return Ok((out, i + 1));
            }
            Some(b'\\') => {
                out.push_str(&text[run..i]);
                match b.get(i + 1) {
                    Some(&c) if escapable(c) => out.push(char::from(c)),
                    _ => return Err(QuotedStringError::BadEscape),
                }
                i += 2;
                run = i;
            }
            Some(&c) if c.is_ascii_control() && c != b'\t' => {
                return Err(QuotedStringError::Control);
            }
            Some(_) => i += 1,
        }
    }
}

/// Appends `value` to `out` as a quoted string.
pub fn write(out: &mut String, value: &str) -> Result<(), QuotedStringError> {
    if value.contains(['\r', '\n']) {
        return Err(QuotedStringError::LineBreak);
    }
    out.reserve(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if needs_escape(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(())
}

/// `value` as a quoted string (see [`write`]).
pub fn quoted(value: &str) -> Result<String, QuotedStringError> {
    let mut out = String::new();
    write(&mut out, value)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(text: &str) -> Result<String, QuotedStringError> {
        let (v, end) = read(text, 0)?;
        assert_eq!(end, text.len(), "{text:?}");
        Ok(v)
    }

    /// What RFC 3261 §25.1 allows, read.
    #[test]
    fn reads_the_grammar() {
        assert_eq!(read_all(r#""""#).unwrap(), "");
        assert_eq!(read_all(r#""a b\tc""#).unwrap(), "a btc", "an escaped `t`");
        assert_eq!(read_all("\"tab\there\"").unwrap(), "tab\there");
        assert_eq!(read_all(r#""a\"b\\c\d""#).unwrap(), "a\"b\\cd");
        assert_eq!(
            read_all("\"caf\u{e9} \u{1F600}\"").unwrap(),
            "caf\u{e9} \u{1F600}"
        );
        // Every quoted-pair: %x00-09 / %x0B-0C / %x0E-7F.
        for c in (0u8..=0x7f).filter(|c| *c != b'\r' && *c != b'\n') {
            let text = format!("\"\\{}\"", char::from(c));
            assert_eq!(
                read_all(&text).unwrap(),
                char::from(c).to_string(),
                "{c:#x}"
            );
        }
        // The index past the closing quote, and what follows is left.
        assert_eq!(read("\"a\", b", 0).unwrap(), ("a".to_string(), 3));
    }

    #[test]
    fn refuses_what_the_grammar_does_not_allow() {
        for (text, why) in [
            ("\"abc", QuotedStringError::Unclosed),
            ("\"a\\\"", QuotedStringError::Unclosed),
            ("\"a\\", QuotedStringError::BadEscape),
            ("\"a\\\r\"", QuotedStringError::BadEscape),
            ("\"a\\\n\"", QuotedStringError::BadEscape),
            ("\"a\\\u{e9}\"", QuotedStringError::BadEscape),
            ("\"a\u{1c}\"", QuotedStringError::Control),
            ("\"a\u{7f}\"", QuotedStringError::Control),
            ("\"a\r\n b\"", QuotedStringError::Control),
            ("\"a\u{0}\"", QuotedStringError::Control),
        ] {
            assert_eq!(read_all(text), Err(why), "{text:?}");
        }
    }

    /// Every value without a line break is written so that it reads back,
    /// escaping only what must be.
    #[test]
    fn writes_what_reads_back() {
        assert_eq!(quoted("pbx.test").unwrap(), "\"pbx.test\"");
        assert_eq!(quoted("a\"b\\c").unwrap(), r#""a\"b\\c""#);
        assert_eq!(quoted("a\u{1c}b").unwrap(), "\"a\\\u{1c}b\"");
        assert_eq!(
            quoted("a\tb \u{85}\u{e9}").unwrap(),
            "\"a\tb \u{85}\u{e9}\""
        );
        let every: String = (0u8..=0x7f)
            .filter(|c| *c != b'\r' && *c != b'\n')
            .map(char::from)
            .chain("\u{85}\u{e9}\u{1F600}".chars())
            .collect();
        assert_eq!(read_all(&quoted(&every).unwrap()).unwrap(), every);
        for v in ["a\rb", "a\nb", "\r\n"] {
            assert_eq!(quoted(v), Err(QuotedStringError::LineBreak), "{v:?}");
        }
    }
}
