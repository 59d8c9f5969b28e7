//! SIP over a stream (RFC 3261 §18.3): cutting a TCP connection's bytes
//! into messages.
//!
//! A message is its head (start line and headers, up to the first empty
//! line) and `Content-Length` bytes of body; over a stream
//! `Content-Length` is mandatory. CR and LF bytes between messages are
//! skipped, and a double CRLF there is an RFC 5626 keep-alive ping (the
//! connection answers a single CRLF, the pong).
//!
//! Invariants: the buffer never holds more than `max_bytes` of one message
//! (plus what one read adds), so a connection costs at most that; a fault
//! ([`FrameError`]) leaves the framer unusable: the connection is closed
//! after the answer the fault allows (400 when `Content-Length` is missing
//! or bad, 513 when the message is over the limit but its head could be
//! read). Nothing here panics on any input (fuzzed:
//! `fuzz/fuzz_targets/sip_tcp_framing.rs`).

/// What [`Framer::next_frame`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// One whole message (head and body).
    Message(Vec<u8>),
    /// A double CRLF between messages: answer [`PONG`].
    Ping,
}

/// The answer to a keep-alive ping (RFC 5626 §3.5.1).
pub const PONG: &[u8] = b"\r\n";

/// Why the stream cannot go on; the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// A head without a (readable) `Content-Length`: `head` (up to and with
    /// the empty line) can be answered 400.
    NoContentLength {
        /// The message's head.
        head: Vec<u8>,
        /// Missing or not a number.
        why: &'static str,
    },
    /// Over `max_bytes`: `head` is the message's head when it could be read
    /// (answered 513), `None` when the head itself is too long.
    TooLarge {
        /// The message's head, if complete.
        head: Option<Vec<u8>>,
    },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::NoContentLength { why, .. } => f.write_str(why),
            FrameError::TooLarge { head: Some(_) } => {
                f.write_str("message over sip.max_message_bytes")
            }
            FrameError::TooLarge { head: None } => {
                f.write_str("message head over sip.max_message_bytes")
            }
        }
    }
}

/// One connection's reassembly buffer.
pub struct Framer {
    buf: Vec<u8>,
    /// Bytes of `buf` in use.
    len: usize,
    max_bytes: usize,
    failed: bool,
}

/// Where the first head ends (the start of the body): after an empty line,
/// CRLF CRLF, or LF LF from a sloppy peer.
fn head_end(data: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i + 1 < data.len() {
        if data[i] == b'\n' {
            if data[i + 1] == b'\n' {
                return Some(i + 2);
            }
            if data[i + 1] == b'\r' && data.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
        i += 1;
    }
    None
}

/// The `Content-Length` (or compact `l`) of a head: `Ok(None)` when there
/// is none.
fn content_length(head: &[u8]) -> Result<Option<usize>, &'static str> {
    let mut found = None;
    for line in head.split(|&b| b == b'\n').skip(1) {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let name = line[..colon].trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") || name.eq_ignore_ascii_case(b"l") {
            let value = std::str::from_utf8(line[colon + 1..].trim_ascii())
                .map_err(|_| "bad Content-Length")?;
            let n: usize = value.parse().map_err(|_| "bad Content-Length")?;
            if found.is_some_and(|f| f != n) {
                return Err("two different Content-Length headers");
            }
            found = Some(n);
        }
    }
    Ok(found)
}

/// `head` without its `Content-Length` lines: what a 513 is built from
/// (the message parser would refuse a head whose body is missing).
pub fn without_content_length(head: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len());
    for line in head.split_inclusive(|&b| b == b'\n') {
        let name = line
            .iter()
            .position(|&b| b == b':')
            .map(|c| line[..c].trim_ascii());
        let length = name.is_some_and(|n| {
            n.eq_ignore_ascii_case(b"content-length") || n.eq_ignore_ascii_case(b"l")
        });
        if !length {
            out.extend_from_slice(line);
        }
    }
    out
}

impl Framer {
    /// A framer for messages of at most `max_bytes` (head and body).
    pub fn new(max_bytes: usize) -> Framer {
        Framer {
            buf: Vec::new(),
            len: 0,
            max_bytes,
            failed: false,
        }
    }

    /// Room to read into (at least `min` bytes; the buffer grows to at most
    /// `max_bytes` + `min`, as the bytes of a message that is too large
    /// are refused before more are read).
    pub fn spare(&mut self, min: usize) -> &mut [u8] {
        if self.buf.len() < self.len + min {
            self.buf.resize(self.len + min, 0);
        }
        &mut self.buf[self.len..]
    }

    /// `n` bytes were read into [`Framer::spare`].
    pub fn filled(&mut self, n: usize) {
        self.len = (self.len + n).min(self.buf.len());
    }

    /// Appends `data` (tests and the fuzz target; the connection reads into
    /// [`Framer::spare`]).
    pub fn push(&mut self, data: &[u8]) {
        self.spare(data.len())[..data.len()].copy_from_slice(data);
        self.filled(data.len());
    }

    /// Bytes buffered and not yet framed.
    pub fn buffered(&self) -> usize {
        self.len
    }

    fn consume(&mut self, n: usize) {
        self.buf.copy_within(n..self.len, 0);
        self.len -= n;
        // A large message's buffer is not kept for a connection's lifetime.
        if self.len == 0 && self.buf.len() > 8192 {
            self.buf = Vec::new();
        }
    }

    /// The next frame in what was read: `Ok(None)` while more bytes are
    /// needed. After an error, every call returns that it failed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.failed {
            return Err(FrameError::TooLarge { head: None });
        }
        // Between messages: CR and LF; CRLF CRLF is a ping.
        loop {
            let data = &self.buf[..self.len];
            if data.starts_with(b"\r\n\r\n") {
                self.consume(4);
                return Ok(Some(Frame::Ping));
            }
            if data.is_empty() || b"\r\n\r\n".starts_with(data) {
                // Perhaps a ping still coming.
                return Ok(None);
            }
            if data[0] == b'\r' || data[0] == b'\n' {
                self.consume(1);
                continue;
            }
            break;
        }
        let data = &self.buf[..self.len];
        let Some(body_start) = head_end(data) else {
            if data.len() > self.max_bytes {
                self.failed = true;
                return Err(FrameError::TooLarge { head: None });
            }
            return Ok(None);
        };
        if body_start > self.max_bytes {
            self.failed = true;
            return Err(FrameError::TooLarge { head: None });
        }
        let head = &data[..body_start];
        let length = match content_length(head) {
            Ok(Some(n)) => n,
            Ok(None) => {
                self.failed = true;
                return Err(FrameError::NoContentLength {
                    head: head.to_vec(),
                    why: "Content-Length is required over TCP (RFC 3261 §18.3)",
                });
            }
            Err(why) => {
                self.failed = true;
                return Err(FrameError::NoContentLength {
                    head: head.to_vec(),
                    why,
                });
            }
        };
        let total = match body_start.checked_add(length) {
            Some(t) if t <= self.max_bytes => t,
            _ => {
                self.failed = true;
                return Err(FrameError::TooLarge {
                    head: Some(head.to_vec()),
                });
            }
        };
        if data.len() < total {
            return Ok(None);
        }
        let message = data[..total].to_vec();
        self.consume(total);
        Ok(Some(Frame::Message(message)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTIONS: &str = "OPTIONS sip:moshi@127.0.0.1 SIP/2.0\r\n\
        Via: SIP/2.0/TCP 127.0.0.1:5070;branch=z9hG4bK-1\r\n\
        From: <sip:a@127.0.0.1>;tag=a\r\nTo: <sip:moshi@127.0.0.1>\r\n\
        Call-ID: c1\r\nCSeq: 1 OPTIONS\r\nContent-Length: 4\r\n\r\nv=0\n";

    fn all(f: &mut Framer) -> Vec<Frame> {
        let mut out = Vec::new();
        while let Ok(Some(fr)) = f.next_frame() {
            out.push(fr);
        }
        out
    }

    #[test]
    fn byte_at_a_time() {
        let mut f = Framer::new(4096);
        let mut got = Vec::new();
        for b in OPTIONS.as_bytes() {
            f.push(std::slice::from_ref(b));
            got.extend(all(&mut f));
        }
        assert_eq!(got, [Frame::Message(OPTIONS.as_bytes().to_vec())]);
        assert_eq!(f.buffered(), 0);
    }

    #[test]
    fn pipelined_messages_and_keep_alives() {
        let mut f = Framer::new(4096);
        let stream = format!("\r\n\r\n{OPTIONS}\r\n{OPTIONS}{OPTIONS}\r\n\r\n\r\n");
        f.push(stream.as_bytes());
        let m = Frame::Message(OPTIONS.as_bytes().to_vec());
        assert_eq!(
            all(&mut f),
            [Frame::Ping, m.clone(), m.clone(), m, Frame::Ping]
        );
        // A lone CRLF (the pong of a peer that pings too) waits: it may be
        // the start of a ping, and then it is skipped.
        assert_eq!(f.buffered(), 2);
        f.push(b"OPT");
        assert_eq!(f.next_frame(), Ok(None));
        assert_eq!(f.buffered(), 3);
    }

    #[test]
    fn ping_split_byte_by_byte() {
        let mut f = Framer::new(4096);
        for b in b"\r\n\r" {
            f.push(std::slice::from_ref(b));
            assert_eq!(f.next_frame(), Ok(None));
        }
        f.push(b"\n");
        assert_eq!(f.next_frame(), Ok(Some(Frame::Ping)));
    }

    #[test]
    fn body_over_several_reads_and_compact_length() {
        let msg = "BYE sip:a SIP/2.0\nl: 10\n\n0123456789";
        let mut f = Framer::new(4096);
        f.push(&msg.as_bytes()[..25]);
        assert_eq!(f.next_frame(), Ok(None));
        f.push(&msg.as_bytes()[25..]);
        assert_eq!(
            f.next_frame(),
            Ok(Some(Frame::Message(msg.as_bytes().to_vec())))
        );
    }

    #[test]
    fn missing_or_bad_content_length_is_refused_with_its_head() {
        for (msg, why) in [
            ("OPTIONS sip:a SIP/2.0\r\nVia: x\r\n\r\n", "required"),
            ("OPTIONS sip:a SIP/2.0\r\nContent-Length: x\r\n\r\n", "bad"),
            (
                "OPTIONS sip:a SIP/2.0\r\nl: 1\r\nContent-Length: 2\r\n\r\nab",
                "two",
            ),
        ] {
            let mut f = Framer::new(4096);
            f.push(msg.as_bytes());
            match f.next_frame() {
                Err(FrameError::NoContentLength { head, why: w }) => {
                    assert!(w.contains(why), "{msg:?}: {w}");
                    assert!(head.ends_with(b"\r\n\r\n"));
                }
                other => panic!("{msg:?}: {other:?}"),
            }
            assert!(f.next_frame().is_err(), "a failed framer stays failed");
        }
    }

    #[test]
    fn oversized_messages() {
        // The body makes it too large: the head is given for a 513.
        let mut f = Framer::new(200);
        f.push(b"INVITE sip:a SIP/2.0\r\nContent-Length: 500\r\n\r\n");
        assert!(matches!(
            f.next_frame(),
            Err(FrameError::TooLarge { head: Some(_) })
        ));
        // A head that never ends.
        let mut f = Framer::new(200);
        let mut failed = false;
        for _ in 0..100 {
            f.push(b"X-Long: aaaaaaaa\r\n");
            if let Err(e) = f.next_frame() {
                assert_eq!(e, FrameError::TooLarge { head: None });
                failed = true;
                break;
            }
        }
        assert!(failed);
        assert!(f.buffered() <= 200 + 18);
        // A huge Content-Length does not overflow.
        let mut f = Framer::new(200);
        f.push(format!("A b SIP/2.0\r\nl: {}\r\n\r\n", usize::MAX).as_bytes());
        assert!(matches!(
            f.next_frame(),
            Err(FrameError::TooLarge { head: Some(_) })
        ));
    }

    #[test]
    fn a_head_without_its_length() {
        let head = b"BYE sip:a SIP/2.0\r\nl: 9\r\nVia: x\r\nContent-Length:  50\r\n\r\n";
        assert_eq!(
            without_content_length(head),
            b"BYE sip:a SIP/2.0\r\nVia: x\r\n\r\n"
        );
    }

    #[test]
    fn garbage_waits_for_the_limit_or_a_head() {
        let mut f = Framer::new(1500);
        f.push(&[0xff, 0, 7, b'\r', 0x80]);
        assert_eq!(f.next_frame(), Ok(None));
        f.push(&vec![0u8; 1600]);
        assert!(f.next_frame().is_err());
        // Binary with an empty line: a "head" without Content-Length
        // (answered 400 if it parses as a request, which it does not).
        let mut f = Framer::new(1500);
        f.push(b"\x00\x01\r\n\r\n");
        assert!(matches!(
            f.next_frame(),
            Err(FrameError::NoContentLength { .. })
        ));
    }
}
