//! AudioSocket framing: a 3-byte header (kind, payload length as u16
//! big-endian) and the payload.
//!
//! Kinds, as Asterisk defines them (`enum ast_audiosocket_msg_kind` in
//! `include/asterisk/res_audiosocket.h`, and the protocol page
//! <https://docs.asterisk.org/Configuration/Channel-Drivers/AudioSocket/>):
//! `0x00` hangup, `0x01` UUID (16 bytes), `0x03` DTMF (one ASCII
//! character), `0x10` slin 8 kHz, `0x11` 12 kHz, `0x12` 16 kHz, `0x13`
//! 24 kHz, `0x14` 32 kHz, `0x15` 44.1 kHz, `0x16` 48 kHz, `0x17` 96 kHz,
//! `0x18` 192 kHz (signed 16-bit little-endian mono), `0xff` error (payload:
//! an optional application-specific code). Asterisk releases before the
//! higher rates send `0x10` only; one short-lived revision used `0x11` for
//! 16 kHz — the current table is the one above.
//!
//! The daemon's error codes (payload of the `0xff` it sends) are in
//! [`error_code`]; Asterisk's own codes towards the server are `0x01`
//! (calling party hung up), `0x02` (frame forwarding error) and `0x04`
//! (memory error).
//!
//! Invariants: [`parse`] is pure and total (every input gives a frame, "need
//! more bytes" or an error; fuzzable), it never reads a payload longer than
//! the limit, and a header announcing one is refused before its payload
//! arrives.

/// Header bytes.
pub const HEADER_BYTES: usize = 3;
/// Bytes of a UUID payload.
pub const UUID_BYTES: usize = 16;

/// Message kinds.
pub mod kind {
    /// Hang up (either direction).
    pub const HANGUP: u8 = 0x00;
    /// The call's UUID (first message from Asterisk).
    pub const UUID: u8 = 0x01;
    /// One DTMF digit (ASCII).
    pub const DTMF: u8 = 0x03;
    /// slin, 8 kHz.
    pub const SLIN_8K: u8 = 0x10;
    /// slin, 192 kHz (the last audio kind).
    pub const SLIN_192K: u8 = 0x18;
    /// An error (payload: an optional code).
    pub const ERROR: u8 = 0xFF;
}

/// Codes the daemon sends in its `0xff` payload (one byte).
pub mod error_code {
    /// A length that cannot be the kind's (UUID not 16 bytes, DTMF not 1,
    /// audio empty or odd).
    pub const BAD_LENGTH: u8 = 0x01;
    /// A kind that is not in the protocol.
    pub const UNKNOWN_KIND: u8 = 0x02;
    /// Something other than the UUID came first, or a second UUID.
    pub const UUID_FIRST: u8 = 0x03;
    /// A payload over `audiosocket.max_payload_bytes`.
    pub const PAYLOAD_TOO_LARGE: u8 = 0x04;
    /// The audio kind (rate) changed during the call.
    pub const FORMAT_CHANGED: u8 = 0x05;
    /// No UUID within `audiosocket.uuid_timeout_ms`.
    pub const UUID_TIMEOUT: u8 = 0x06;
    /// Nothing received for `session.idle_timeout_ms`.
    pub const IDLE_TIMEOUT: u8 = 0x07;
    /// No capacity: every slot is held, or the daemon is draining.
    pub const REFUSED: u8 = 0x10;
    /// `audiosocket.params` are not usable with this model.
    pub const BAD_PARAMETERS: u8 = 0x11;
    /// The model failed for this stream.
    pub const MODEL_FAULT: u8 = 0x12;
    /// The engine did not answer in time.
    pub const ENGINE_STALLED: u8 = 0x13;
    /// Anything else on the daemon's side.
    pub const INTERNAL: u8 = 0x14;
}

/// The sample rate of an audio kind, `None` for other kinds.
pub fn audio_rate_hz(kind: u8) -> Option<u32> {
    Some(match kind {
        0x10 => 8_000,
        0x11 => 12_000,
        0x12 => 16_000,
        0x13 => 24_000,
        0x14 => 32_000,
        0x15 => 44_100,
        0x16 => 48_000,
        0x17 => 96_000,
        0x18 => 192_000,
        _ => return None,
    })
}

/// One parsed message, borrowing its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// `0x00`.
    Hangup,
    /// `0x01` with its 16 bytes.
    Uuid([u8; UUID_BYTES]),
    /// `0x03` with its character.
    Dtmf(u8),
    /// An audio kind, its rate and its samples (an even, non-zero length).
    Audio {
        /// The kind byte (answered with the same).
        kind: u8,
        /// Its rate.
        rate_hz: u32,
        /// slin little-endian bytes.
        payload: &'a [u8],
    },
    /// `0xff` with its optional code.
    Error(Option<u8>),
}

/// A message the daemon refuses; the session answers `0xff` with `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what}")]
pub struct FrameError {
    /// The [`error_code`].
    pub code: u8,
    /// What was wrong (logged, and in the session's end reason).
    pub what: &'static str,
}

fn refuse<T>(code: u8, what: &'static str) -> Result<T, FrameError> {
    Err(FrameError { code, what })
}

/// Parses the message at the start of `buf`: `Ok(None)` when more bytes
/// are needed, else the message and the bytes it used. A header with a
/// payload over `max_payload` is refused at once.
pub fn parse(buf: &[u8], max_payload: usize) -> Result<Option<(Frame<'_>, usize)>, FrameError> {
    if buf.len() < HEADER_BYTES {
        return Ok(None);
    }
    let kind = buf[0];
    let len = u16::from_be_bytes([buf[1], buf[2]]) as usize;
    let known = matches!(kind, kind::HANGUP | kind::UUID | kind::DTMF | kind::ERROR)
        || audio_rate_hz(kind).is_some();
    if !known {
        return refuse(error_code::UNKNOWN_KIND, "unknown message kind");
    }
    if len > max_payload {
        return refuse(
            error_code::PAYLOAD_TOO_LARGE,
            "payload longer than audiosocket.max_payload_bytes",
        );
    }
    if buf.len() < HEADER_BYTES + len {
        return Ok(None);
    }
    let payload = &buf[HEADER_BYTES..HEADER_BYTES + len];
    let frame = match kind {
        // A hangup's payload, if any, carries nothing: accepted.
        kind::HANGUP => Frame::Hangup,
        kind::UUID => {
            let Ok(id) = <[u8; UUID_BYTES]>::try_from(payload) else {
                return refuse(error_code::BAD_LENGTH, "a UUID message must carry 16 bytes");
            };
            Frame::Uuid(id)
        }
        kind::DTMF => {
            if len != 1 {
                return refuse(error_code::BAD_LENGTH, "a DTMF message must carry one byte");
            }
            Frame::Dtmf(payload[0])
        }
        kind::ERROR => Frame::Error(payload.first().copied()),
        _ => {
            if len == 0 || !len.is_multiple_of(2) {
                return refuse(
                    error_code::BAD_LENGTH,
                    "audio must be a non-empty whole number of 16-bit samples",
                );
            }
            Frame::Audio {
                kind,
                rate_hz: audio_rate_hz(kind).expect("checked above"),
                payload,
            }
        }
    };
    Ok(Some((frame, HEADER_BYTES + len)))
}

/// Writes a header for `kind` and `len` into `out[..3]`.
pub fn write_header(out: &mut [u8], kind: u8, len: usize) {
    debug_assert!(len <= u16::MAX as usize);
    out[0] = kind;
    out[1..3].copy_from_slice(&(len as u16).to_be_bytes());
}

/// The canonical text form of a UUID (for logs).
pub fn uuid_text(id: &[u8; UUID_BYTES]) -> String {
    let mut s = String::with_capacity(36);
    for (i, b) in id.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0; 3];
        write_header(&mut v, kind, payload.len());
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn kind_table() {
        let rates: Vec<_> = (0x10..=0x18).map(|k| audio_rate_hz(k).unwrap()).collect();
        assert_eq!(
            rates,
            [8_000, 12_000, 16_000, 24_000, 32_000, 44_100, 48_000, 96_000, 192_000]
        );
        assert_eq!(audio_rate_hz(0x19), None);
        assert_eq!(audio_rate_hz(0x03), None);
    }

    #[test]
    fn parses_each_kind() {
        let id = [7u8; 16];
        assert_eq!(
            parse(&msg(0x01, &id), 320).unwrap(),
            Some((Frame::Uuid(id), 19))
        );
        assert_eq!(
            parse(&msg(0x00, &[]), 320).unwrap(),
            Some((Frame::Hangup, 3))
        );
        assert_eq!(
            parse(&msg(0x03, b"#"), 320).unwrap(),
            Some((Frame::Dtmf(b'#'), 4))
        );
        assert_eq!(
            parse(&msg(0xff, &[2]), 320).unwrap(),
            Some((Frame::Error(Some(2)), 4))
        );
        assert_eq!(
            parse(&msg(0xff, &[]), 320).unwrap(),
            Some((Frame::Error(None), 3))
        );
        let audio = msg(0x12, &[0; 640]);
        match parse(&audio, 640).unwrap() {
            Some((
                Frame::Audio {
                    kind,
                    rate_hz,
                    payload,
                },
                used,
            )) => {
                assert_eq!(
                    (kind, rate_hz, payload.len(), used),
                    (0x12, 16_000, 640, 643)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn needs_more_bytes() {
        let audio = msg(0x10, &[0; 320]);
        for cut in [0, 1, 2, 3, 100, 322] {
            assert_eq!(parse(&audio[..cut], 320).unwrap(), None, "cut at {cut}");
        }
    }

    #[test]
    fn refusals_carry_codes() {
        let code = |bytes: &[u8]| parse(bytes, 320).unwrap_err().code;
        assert_eq!(code(&msg(0x01, &[0; 15])), error_code::BAD_LENGTH);
        assert_eq!(code(&msg(0x03, b"12")), error_code::BAD_LENGTH);
        assert_eq!(code(&msg(0x10, &[0; 3])), error_code::BAD_LENGTH);
        assert_eq!(code(&msg(0x10, &[])), error_code::BAD_LENGTH);
        assert_eq!(code(&msg(0x42, &[])), error_code::UNKNOWN_KIND);
        assert_eq!(code(&msg(0x02, &[0; 6])), error_code::UNKNOWN_KIND);
        // Refused from the header alone, before the payload arrives.
        assert_eq!(code(&[0x10, 0x01, 0x42]), error_code::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn uuid_text_form() {
        let id = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0, 1, 2, 3, 4, 5, 6, 7,
        ];
        assert_eq!(uuid_text(&id), "12345678-9abc-def0-0001-020304050607");
    }
}
