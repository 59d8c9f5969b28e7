//! What a session tells its subscribers, as fixed-size records in its
//! [`EventRing`](super::ring::EventRing), and how a subscriber writes them
//! as Server-Sent Events.
//!
//! A record is three words: kind and two small payload fields, the output
//! frame index (text pieces), and the time in microseconds since the
//! session started. A text piece is carried as its token id: the subscriber
//! looks the text up in the daemon's piece table, so the session copies no
//! text into the ring.
//!
//! Rendering appends to the caller's buffer (`std::io::Write` on a `Vec`):
//! once the buffer has grown to a record's size, writing one allocates
//! nothing.

use super::ring::WORDS;
use moshid_model::spm::PieceTable;
use std::io::Write as _;

/// The life of a session as its subscribers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SessionState {
    /// Admitted, waiting for media (RTP: no packet latched yet).
    Waiting = 1,
    /// Media flows both ways.
    Active = 2,
    /// The input is over; the answers in flight are being sent.
    Draining = 3,
}

impl SessionState {
    /// The name in events and listings.
    pub fn label(self) -> &'static str {
        match self {
            SessionState::Waiting => "waiting",
            SessionState::Active => "active",
            SessionState::Draining => "draining",
        }
    }

    fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            1 => SessionState::Waiting,
            2 => SessionState::Active,
            3 => SessionState::Draining,
            _ => return None,
        })
    }
}

/// One thing that happened in a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The model produced a text piece with output frame `frame`.
    Text {
        /// Index of the model's output frame (0 = the first answer); its
        /// audio starts `frame × 80 ms` into the session's output.
        frame: u64,
        /// Microseconds since the session started, when the session got it.
        at_us: u64,
        /// The text token (its text is the piece table's).
        token: u32,
    },
    /// A DTMF digit from the caller.
    Dtmf {
        /// Microseconds since the session started.
        at_us: u64,
        /// `0`–`9`, `*`, `#`, `A`–`D`, or `?`.
        digit: u8,
        /// Its length in milliseconds, where the transport says (0 otherwise).
        duration_ms: u32,
    },
    /// The session changed state.
    State {
        /// Microseconds since the session started.
        at_us: u64,
        /// The new state.
        state: SessionState,
    },
}

const KIND_TEXT: u64 = 1;
const KIND_DTMF: u64 = 2;
const KIND_STATE: u64 = 3;

impl Event {
    /// The record's words.
    #[inline]
    pub fn encode(self) -> [u64; WORDS] {
        match self {
            Event::Text {
                frame,
                at_us,
                token,
            } => [KIND_TEXT | (token as u64) << 8, frame, at_us],
            Event::Dtmf {
                at_us,
                digit,
                duration_ms,
            } => [
                KIND_DTMF | (digit as u64) << 8 | (duration_ms as u64) << 32,
                0,
                at_us,
            ],
            Event::State { at_us, state } => [KIND_STATE | (state as u64) << 8, 0, at_us],
        }
    }

    /// The event a record holds (`None` for words no session writes).
    pub fn decode(words: [u64; WORDS]) -> Option<Event> {
        let [w0, frame, at_us] = words;
        match w0 & 0xff {
            KIND_TEXT => Some(Event::Text {
                frame,
                at_us,
                token: (w0 >> 8) as u32,
            }),
            KIND_DTMF => Some(Event::Dtmf {
                at_us,
                digit: (w0 >> 8) as u8,
                duration_ms: (w0 >> 32) as u32,
            }),
            KIND_STATE => Some(Event::State {
                at_us,
                state: SessionState::from_code((w0 >> 8) as u32 & 0xff)?,
            }),
            _ => None,
        }
    }

    /// Appends the event as one SSE message with id `seq + 1` (what a client
    /// sends back as `Last-Event-ID` to resume after it). A text piece whose
    /// token has no text (the piece table changed? never in one daemon) is
    /// written with an empty text.
    pub fn write_sse(&self, seq: u64, pieces: &PieceTable, out: &mut Vec<u8>) {
        // Writing into a Vec cannot fail.
        let _ = match *self {
            Event::Text {
                frame,
                at_us,
                token,
            } => {
                let _ = write!(
                    out,
                    "id: {}\nevent: text\ndata: {{\"frame\":{frame},\"audio_ms\":{},\"at_ms\":{:.1},\"token\":{token},\"text\":",
                    seq + 1,
                    frame * crate::FRAME_MS as u64,
                    at_us as f64 / 1000.0
                );
                let _ =
                    serde_json::to_writer(&mut *out, pieces.text_for_token(token).unwrap_or(""));
                out.write_all(b"}\n\n")
            }
            Event::Dtmf {
                at_us,
                digit,
                duration_ms,
            } => {
                let digit = if digit.is_ascii_graphic() && digit != b'"' && digit != b'\\' {
                    digit as char
                } else {
                    '?'
                };
                write!(
                    out,
                    "id: {}\nevent: dtmf\ndata: {{\"digit\":\"{digit}\",\"duration_ms\":{duration_ms},\"at_ms\":{:.1}}}\n\n",
                    seq + 1,
                    at_us as f64 / 1000.0
                )
            }
            Event::State { at_us, state } => write!(
                out,
                "id: {}\nevent: state\ndata: {{\"state\":\"{}\",\"at_ms\":{:.1}}}\n\n",
                seq + 1,
                state.label(),
                at_us as f64 / 1000.0
            ),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshid_model::spm::PieceKind;

    #[test]
    fn round_trips_and_renders() {
        let events = [
            Event::Text {
                frame: 7,
                at_us: 612_345,
                token: 2,
            },
            Event::Dtmf {
                at_us: 9,
                digit: b'#',
                duration_ms: 160,
            },
            Event::State {
                at_us: 1,
                state: SessionState::Draining,
            },
        ];
        for e in events {
            assert_eq!(Event::decode(e.encode()), Some(e));
        }
        assert_eq!(Event::decode([0, 0, 0]), None);
        assert_eq!(Event::decode([KIND_STATE | 9 << 8, 0, 0]), None);

        let pieces = PieceTable::from_pieces([
            ("<unk>".to_string(), 0.0, PieceKind::Unknown),
            ("a".to_string(), 0.0, PieceKind::Normal),
            ("▁say\"hi\"".to_string(), 0.0, PieceKind::Normal),
        ])
        .unwrap();
        let mut out = Vec::new();
        events[0].write_sse(41, &pieces, &mut out);
        events[1].write_sse(42, &pieces, &mut out);
        events[2].write_sse(43, &pieces, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "id: 42\nevent: text\ndata: {\"frame\":7,\"audio_ms\":560,\"at_ms\":612.3,\"token\":2,\"text\":\" say\\\"hi\\\"\"}\n\n\
             id: 43\nevent: dtmf\ndata: {\"digit\":\"#\",\"duration_ms\":160,\"at_ms\":0.0}\n\n\
             id: 44\nevent: state\ndata: {\"state\":\"draining\",\"at_ms\":0.0}\n\n"
        );
        // Every data line is JSON.
        for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
    }
}
