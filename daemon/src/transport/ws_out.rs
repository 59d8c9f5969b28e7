//! `WsOut`: a session's outgoing WebSocket messages, framed in place into one
//! buffer that is written to the socket with one write.
//!
//! Why: handing each answer to tungstenite as a `Message` costs an allocation
//! per message (its `Bytes`), a copy into tungstenite's own write buffer and
//! the framing of each message apart. Here the codec writes its Ogg pages
//! straight behind a frame header reserved in this buffer, the text piece
//! follows as a second message, and the session writes the whole batch
//! (every output frame the engine answered since the last write, both
//! messages of each) with one `write_all`: no allocation, no copy between
//! codec and socket, one system call per 80 ms frame per stream.
//!
//! Invariants:
//! * The buffer is allocated once, in [`WsOut::with_capacity`], and never
//!   grows; a message that does not fit is refused ([`Full`]) before
//!   anything is written, so the buffer only ever holds whole frames.
//! * Frames are what RFC 6455 §5.2 asks of a server: FIN set, opcode binary
//!   (Kyutai's protocol: a kind byte, then the body) or text (the JSON
//!   events of the Realtime API: the body alone, which the caller keeps
//!   UTF-8), no mask, the payload length in its minimal encoding.
//! * The session writes these bytes only while tungstenite's own write
//!   buffer is empty (it flushes it first), so frames never interleave.

/// The buffer cannot hold the message (write it out and try again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// Why [`WsOut::push_with`] wrote nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum PushError<E> {
    /// Not enough room for the largest body `fill` may write.
    Full,
    /// `fill` failed.
    Fill(E),
}

/// First header byte: FIN, no extension bits, opcode 0x2 (binary).
const FIN_BINARY: u8 = 0x82;
/// First header byte: FIN, no extension bits, opcode 0x1 (text).
const FIN_TEXT: u8 = 0x81;

/// Header bytes of an unmasked frame whose payload is `payload_bytes` long.
pub const fn header_bytes(payload_bytes: usize) -> usize {
    if payload_bytes < 126 {
        2
    } else if payload_bytes <= u16::MAX as usize {
        4
    } else {
        10
    }
}

/// Wire bytes of one binary message: its kind byte then `body_bytes`.
pub const fn message_bytes(body_bytes: usize) -> usize {
    header_bytes(1 + body_bytes) + 1 + body_bytes
}

/// Wire bytes of one text message of `body_bytes`.
pub const fn text_message_bytes(body_bytes: usize) -> usize {
    header_bytes(body_bytes) + body_bytes
}

/// Writes the header of an unmasked frame (first byte `fin_opcode`) of
/// `payload_bytes` into `out` (which holds `header_bytes(payload_bytes)`
/// bytes).
fn write_header(out: &mut [u8], fin_opcode: u8, payload_bytes: usize) {
    out[0] = fin_opcode;
    match header_bytes(payload_bytes) {
        2 => out[1] = payload_bytes as u8,
        4 => {
            out[1] = 126;
            out[2..4].copy_from_slice(&(payload_bytes as u16).to_be_bytes());
        }
        _ => {
            out[1] = 127;
            out[2..10].copy_from_slice(&(payload_bytes as u64).to_be_bytes());
        }
    }
}

/// One session's outgoing frames, waiting for their write.
pub struct WsOut {
    buf: Box<[u8]>,
    len: usize,
}

impl WsOut {
    /// A buffer of `capacity_bytes`, allocated now and never again.
    pub fn with_capacity(capacity_bytes: usize) -> Self {
        WsOut {
            buf: vec![0u8; capacity_bytes].into_boxed_slice(),
            len: 0,
        }
    }

    /// Whether no frame waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes still free.
    pub fn free_bytes(&self) -> usize {
        self.buf.len() - self.len
    }

    /// The frames written so far, in order, ready for the socket.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Forgets every frame (after they were written).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends one binary message: `kind`, then `body`.
    pub fn push(&mut self, kind: u8, body: &[u8]) -> Result<(), Full> {
        self.push_with(kind, body.len(), |out| {
            out[..body.len()].copy_from_slice(body);
            Ok::<usize, std::convert::Infallible>(body.len())
        })
        .map_err(|_| Full)
    }

    /// Appends one binary message: `kind`, then the body `fill` writes at the
    /// start of the slice it is given (`max_body_bytes` long) and whose
    /// length it returns. Nothing is appended if `fill` fails, or if the
    /// buffer cannot hold `max_body_bytes` (then `fill` is not called).
    pub fn push_with<E>(
        &mut self,
        kind: u8,
        max_body_bytes: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<(), PushError<E>> {
        self.push_frame(FIN_BINARY, Some(kind), max_body_bytes, fill)
    }

    /// Appends one text message whose body `fill` writes, as
    /// [`WsOut::push_with`] does (the body must be UTF-8).
    pub fn push_text_with<E>(
        &mut self,
        max_body_bytes: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<(), PushError<E>> {
        self.push_frame(FIN_TEXT, None, max_body_bytes, fill)
    }

    /// Appends one text message: `body`.
    pub fn push_text(&mut self, body: &str) -> Result<(), Full> {
        self.push_text_with(body.len(), |out| {
            out[..body.len()].copy_from_slice(body.as_bytes());
            Ok::<usize, std::convert::Infallible>(body.len())
        })
        .map_err(|_| Full)
    }

    /// One frame: the header, the `prefix` byte if any, the body.
    fn push_frame<E>(
        &mut self,
        fin_opcode: u8,
        prefix: Option<u8>,
        max_body_bytes: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<(), PushError<E>> {
        let prefix_bytes = usize::from(prefix.is_some());
        let slot = header_bytes(prefix_bytes + max_body_bytes);
        if self.free_bytes() < slot + prefix_bytes + max_body_bytes {
            return Err(PushError::Full);
        }
        let start = self.len;
        let body_at = start + slot + prefix_bytes;
        let body = &mut self.buf[body_at..body_at + max_body_bytes];
        let n = fill(body).map_err(PushError::Fill)?;
        assert!(n <= max_body_bytes, "fill wrote past its slice");
        let payload = prefix_bytes + n;
        let header = header_bytes(payload);
        // A shorter payload than reserved for needs a shorter header: move
        // the body down (it is then under 126 or 65536 bytes, a short copy).
        if header < slot {
            self.buf
                .copy_within(body_at..body_at + n, start + header + prefix_bytes);
        }
        write_header(&mut self.buf[start..start + header], fin_opcode, payload);
        if let Some(kind) = prefix {
            self.buf[start + header] = kind;
        }
        self.len = start + header + payload;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tungstenite::protocol::frame::FrameHeader;

    /// Parses `bytes` as a run of frames, as a client does.
    fn frames(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut cursor = std::io::Cursor::new(bytes);
        let mut out = Vec::new();
        while (cursor.position() as usize) < bytes.len() {
            let frame_start = cursor.position() as usize;
            let (header, len) = FrameHeader::parse(&mut cursor).unwrap().unwrap();
            assert!(header.is_final && header.mask.is_none());
            assert_eq!(
                header.opcode,
                tungstenite::protocol::frame::coding::OpCode::Data(
                    tungstenite::protocol::frame::coding::Data::Binary
                )
            );
            let at = cursor.position() as usize;
            let payload = &bytes[at..at + len as usize];
            // Minimal length encoding (RFC 6455 §5.2).
            assert_eq!(header_bytes(payload.len()), at - frame_start);
            out.push((payload[0], payload[1..].to_vec()));
            cursor.set_position((at + len as usize) as u64);
        }
        out
    }

    #[test]
    fn frames_parse_back_with_minimal_lengths() {
        let mut w = WsOut::with_capacity(300_000);
        let sizes = [0usize, 1, 124, 125, 126, 1000, 65_534, 65_535, 70_000];
        for (i, &n) in sizes.iter().enumerate() {
            let body: Vec<u8> = (0..n).map(|j| (i + j) as u8).collect();
            if i % 2 == 0 {
                w.push(i as u8, &body).unwrap();
            } else {
                // Reserve for more than is written: the header shrinks.
                w.push_with(i as u8, n + 300, |out| {
                    out[..n].copy_from_slice(&body);
                    Ok::<_, ()>(n)
                })
                .unwrap();
            }
        }
        let got = frames(w.as_bytes());
        assert_eq!(got.len(), sizes.len());
        for (i, ((kind, body), &n)) in got.iter().zip(&sizes).enumerate() {
            assert_eq!(*kind, i as u8);
            assert_eq!(body.len(), n);
            assert!(body.iter().enumerate().all(|(j, &b)| b == (i + j) as u8));
        }
        assert_eq!(
            w.as_bytes().len(),
            sizes.iter().map(|&n| message_bytes(n)).sum::<usize>()
        );
    }

    #[test]
    fn text_frames_carry_the_body_alone() {
        let mut w = WsOut::with_capacity(200_000);
        let sizes = [0usize, 125, 126, 70_000];
        for &n in &sizes {
            let body = "x".repeat(n);
            w.push_text_with(n + 200, |out| {
                out[..n].copy_from_slice(body.as_bytes());
                Ok::<_, ()>(n)
            })
            .unwrap();
        }
        w.push_text("{}").unwrap();
        let mut cursor = std::io::Cursor::new(w.as_bytes());
        for &n in sizes.iter().chain(&[2]) {
            let start = cursor.position() as usize;
            let (header, len) = FrameHeader::parse(&mut cursor).unwrap().unwrap();
            assert!(header.is_final && header.mask.is_none());
            assert_eq!(
                header.opcode,
                tungstenite::protocol::frame::coding::OpCode::Data(
                    tungstenite::protocol::frame::coding::Data::Text
                )
            );
            assert_eq!(len as usize, n);
            assert_eq!(cursor.position() as usize - start, header_bytes(n));
            cursor.set_position(cursor.position() + len);
        }
        assert_eq!(
            w.as_bytes().len(),
            sizes
                .iter()
                .chain(&[2])
                .map(|&n| text_message_bytes(n))
                .sum::<usize>()
        );
    }

    #[test]
    fn refuses_what_does_not_fit_and_keeps_whole_frames() {
        let mut w = WsOut::with_capacity(10);
        assert_eq!(w.push(1, &[7; 7]), Ok(()));
        assert_eq!(w.as_bytes(), &[0x82, 8, 1, 7, 7, 7, 7, 7, 7, 7]);
        assert_eq!(w.push(1, &[]), Err(Full));
        let mut called = false;
        assert_eq!(
            w.push_with(2, 0, |_| {
                called = true;
                Ok::<_, ()>(0)
            }),
            Err(PushError::Full)
        );
        assert!(!called);
        w.clear();
        assert!(w.is_empty());
        assert_eq!(
            w.push_with(3, 4, |_| Err::<usize, _>("codec")),
            Err(PushError::Fill("codec"))
        );
        assert!(w.is_empty());
    }
}
