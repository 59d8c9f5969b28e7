//! Kyutai's Moshi WebSocket protocol (`/api/chat`), as moshid speaks it:
//! the one definition of its message kinds, for the daemon's chat
//! transport, `moshid client`, the tests and the load generator.
//!
//! Every message is a WebSocket *binary* message whose first byte is the kind;
//! the rest is the payload. Text WebSocket messages are not part of the
//! protocol. Kinds a reader does not know are ignored, so a newer server
//! can add kinds without breaking older clients (Kyutai's browser client
//! throws on an unknown kind, so nothing outside 0x00–0x07 is ever sent).
//!
//! | byte | kind        | payload                                              |
//! |------|-------------|------------------------------------------------------|
//! | 0x00 | handshake   | anything (a version); sent first once the session is ready |
//! | 0x01 | audio       | bytes of one Ogg Opus stream (24 kHz mono), any chunking |
//! | 0x02 | text        | a UTF-8 piece of the transcript                      |
//! | 0x03 | control     | one control byte ([`control`])                       |
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

/// The kind bytes as constants, for `match` patterns.
pub mod kind {
    use super::MessageKind;

    /// Sent by the server when the session is ready.
    pub const HANDSHAKE: u8 = MessageKind::Handshake as u8;
    /// Ogg Opus bytes.
    pub const AUDIO: u8 = MessageKind::Audio as u8;
    /// A UTF-8 text piece.
    pub const TEXT: u8 = MessageKind::Text as u8;
    /// Control (one byte of [`super::control`]).
    pub const CONTROL: u8 = MessageKind::Control as u8;
    /// JSON metadata.
    pub const METADATA: u8 = MessageKind::Metadata as u8;
    /// A UTF-8 error message; the server closes after it.
    pub const ERROR: u8 = MessageKind::Error as u8;
    /// Ping.
    pub const PING: u8 = MessageKind::Ping as u8;
}

/// Control messages (kind `0x03`, first payload byte).
pub mod control {
    /// The client has sent all its audio (Kyutai's "end turn" position).
    pub const END_OF_INPUT: u8 = 0x01;
}

/// The whole message a client sends when its input is finished: the server
/// answers the frames in flight, sends the session's metadata and closes.
pub const END_OF_INPUT_MESSAGE: [u8; 2] = [kind::CONTROL, control::END_OF_INPUT];

impl MessageKind {
    /// The kind for a first byte, or `None` for a kind this reader ignores.
    pub fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            kind::HANDSHAKE => Self::Handshake,
            kind::AUDIO => Self::Audio,
            kind::TEXT => Self::Text,
            kind::CONTROL => Self::Control,
            kind::METADATA => Self::Metadata,
            kind::ERROR => Self::Error,
            kind::PING => Self::Ping,
            _ => return None,
        })
    }

    /// The byte that starts a message of this kind.
    pub fn byte(self) -> u8 {
        self as u8
    }
}

/// What one binary client message asks of the server's session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientMessage<'a> {
    /// Ogg Opus bytes (kind `0x01`), any split of the stream's pages.
    Audio(&'a [u8]),
    /// `0x03 0x01` ([`END_OF_INPUT_MESSAGE`]): the client's input is
    /// finished.
    EndOfInput,
    /// A kind the server accepts and ignores: handshake echoes, text,
    /// control, metadata, ping and unknown kinds.
    Ignored(u8),
    /// An empty message: a protocol error.
    Empty,
}

/// Classifies one binary client message by its first byte (pure: the
/// session acts on the result; fuzzed in `fuzz/`).
pub fn parse_client_message(data: &[u8]) -> ClientMessage<'_> {
    match data.split_first() {
        None => ClientMessage::Empty,
        Some((&kind::AUDIO, payload)) => ClientMessage::Audio(payload),
        Some((&kind::CONTROL, [control::END_OF_INPUT, ..])) => ClientMessage::EndOfInput,
        Some((&k, _)) => ClientMessage::Ignored(k),
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

    #[test]
    fn client_messages_are_classified_by_their_first_bytes() {
        assert_eq!(parse_client_message(&[]), ClientMessage::Empty);
        assert_eq!(
            parse_client_message(&[0x01, 7, 8]),
            ClientMessage::Audio(&[7, 8])
        );
        assert_eq!(
            parse_client_message(&END_OF_INPUT_MESSAGE),
            ClientMessage::EndOfInput
        );
        assert_eq!(
            parse_client_message(&[0x03, 0x02]),
            ClientMessage::Ignored(0x03)
        );
        assert_eq!(parse_client_message(&[0x09]), ClientMessage::Ignored(0x09));
    }
}
