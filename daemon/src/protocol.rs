//! Message kinds of Kyutai's Moshi WebSocket protocol, as moshid speaks it.
//!
//! Every message is a WebSocket *binary* message whose first byte is the kind;
//! the rest is the payload. Text WebSocket messages are not part of the
//! protocol. Kinds this module does not know are ignored by readers, so a
//! newer server can add kinds without breaking older clients.
//!
//! | byte | kind        | payload                                              |
//! |------|-------------|------------------------------------------------------|
//! | 0x00 | handshake   | anything (a version); sent first once the session is ready |
//! | 0x01 | audio       | bytes of one Ogg Opus stream (24 kHz mono), any chunking |
//! | 0x02 | text        | a UTF-8 piece of the transcript                      |
//! | 0x03 | control     | one control byte (not used by this client)           |
//! | 0x04 | metadata    | UTF-8 JSON                                           |
//! | 0x05 | error       | UTF-8 message; the server closes after it            |
//! | 0x06 | ping        | nothing                                              |

/// The kind byte that starts every protocol message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageKind {
    Handshake = 0x00,
    Audio = 0x01,
    Text = 0x02,
    Control = 0x03,
    Metadata = 0x04,
    Error = 0x05,
    Ping = 0x06,
}

impl MessageKind {
    /// The kind for a first byte, or `None` for a kind this client ignores.
    pub fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            0x00 => Self::Handshake,
            0x01 => Self::Audio,
            0x02 => Self::Text,
            0x03 => Self::Control,
            0x04 => Self::Metadata,
            0x05 => Self::Error,
            0x06 => Self::Ping,
            _ => return None,
        })
    }

    /// The byte that starts a message of this kind.
    pub fn byte(self) -> u8 {
        self as u8
    }
}

/// Splits a binary message into its kind byte and payload; `None` when empty.
pub fn split_message(message: &[u8]) -> Option<(u8, &[u8])> {
    message
        .split_first()
        .map(|(&kind, payload)| (kind, payload))
}

/// Builds a message: the kind byte followed by `payload`.
pub fn encode_message(kind: MessageKind, payload: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(1 + payload.len());
    message.push(kind.byte());
    message.extend_from_slice(payload);
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_unknown_is_none() {
        for byte in 0u8..=6 {
            assert_eq!(MessageKind::from_byte(byte).unwrap().byte(), byte);
        }
        assert_eq!(MessageKind::from_byte(7), None);
        assert_eq!(MessageKind::from_byte(0xff), None);
    }

    #[test]
    fn split_and_encode() {
        assert_eq!(split_message(&[]), None);
        let message = encode_message(MessageKind::Text, b"hi");
        assert_eq!(split_message(&message), Some((0x02, &b"hi"[..])));
    }
}
