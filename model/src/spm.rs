//! SentencePiece piece tables: read a `.model` file and turn text token ids
//! into the text the official Moshi/Hibiki server streams to its clients.
//!
//! A SentencePiece `.model` file is a serialized protobuf `ModelProto`. Only its
//! field 1 matters here, the repeated `SentencePiece` messages
//! (`1: piece` string, `2: score` float, `3: type` enum); a piece's id is its
//! position in that list. Every other field (`trainer_spec` = 2,
//! `normalizer_spec` = 3, `self_test_data` = 4, `denormalizer_spec` = 5, and
//! anything newer) is skipped by its wire type. The reader is hand-written: no
//! protobuf crate, no code generation.
//!
//! # Text of a token
//!
//! Kyutai's `moshi/server.py` (PyPI `moshi` 0.2.13, `ServerState`) sends every
//! generated text token except ids 0 and 3 (`<unk>` and `<pad>` in Kyutai's
//! tokenizers; the check is on the ids, not on the piece types) as
//! `id_to_piece(id).replace("▁", " ")`, one websocket message per token.
//! [`PieceTable::text_for_token`] returns exactly that string, computed once at
//! load so the per-token path is a bounds check and a borrow. Control pieces
//! other than ids 0 and 3 (`<s>`, `</s>`) are printed verbatim, as upstream
//! does.
//!
//! One deliberate difference: upstream prints a BYTE piece as its literal name
//! (`<0x41>`); here a BYTE piece stands for its byte. An ASCII byte piece is
//! text like any other piece (`<0x41>` → `"A"`); a byte ≥ 0x80 is only part of
//! a character, so [`PieceTable::text_for_token`] returns `None` for it and
//! [`PieceTable::token_text`] returns [`TokenText::Byte`]. [`TextDecoder`]
//! joins such bytes across tokens (ids 0 and 3 in between do not interrupt a
//! character) and writes U+FFFD where they do not form UTF-8: its output for a
//! token sequence equals `String::from_utf8_lossy` of the bytes of all printed
//! tokens concatenated.
//!
//! # Invariants
//!
//! - A [`PieceTable`] has at most `u32::MAX + 1` pieces, ids `0..len()`.
//! - Every piece is non-empty and unique, exactly one piece has type
//!   [`PieceKind::Unknown`], and every [`PieceKind::Byte`] piece is spelled
//!   `<0xHH>` with two upper-case hex digits. These are the checks
//!   SentencePiece makes when it loads a model, so any table this module holds
//!   can be written with [`PieceTable::to_model_bytes`] and loaded by the
//!   official library.
//! - Reading never panics on any input, and allocates memory linear in the
//!   input's size (tens of bytes per input byte at worst), never an amount the
//!   input merely claims: a length prefix is checked against the bytes left
//!   before anything is sliced, and files over [`MAX_MODEL_BYTES`] are refused.
//!   Errors say what is wrong and at which byte offset of the input.
//! - `PieceTable::from_bytes(&t.to_model_bytes())` gives back `t` (same pieces,
//!   bit-identical scores, same kinds).

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Id of `<unk>` in Kyutai's tokenizers; never printed (see [`PieceTable::text_for_token`]).
pub const UNK_ID: u32 = 0;
/// Id of `<pad>` in Kyutai's tokenizers; never printed (see [`PieceTable::text_for_token`]).
pub const PAD_ID: u32 = 3;
/// The ids the official server does not send as text.
pub const SKIPPED_TEXT_IDS: [u32; 2] = [UNK_ID, PAD_ID];
/// Largest `.model` file [`PieceTable::from_file`] reads (Kyutai's 32k-piece
/// tokenizer is about 0.5 MB; 256k-piece models are a few MB).
pub const MAX_MODEL_BYTES: u64 = 64 << 20;

const SPACE_MARK: char = '\u{2581}'; // "▁"

/// `SentencePiece.Type` in `sentencepiece_model.proto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PieceKind {
    /// `NORMAL` (1), the default when the field is absent.
    Normal,
    /// `UNKNOWN` (2), `<unk>`.
    Unknown,
    /// `CONTROL` (3), e.g. `<s>`, `</s>`, `<pad>`.
    Control,
    /// `USER_DEFINED` (4).
    UserDefined,
    /// `UNUSED` (5).
    Unused,
    /// `BYTE` (6), `<0xHH>` for byte fallback.
    Byte,
}

impl PieceKind {
    /// The enum value in the protobuf schema.
    pub fn proto_value(self) -> u32 {
        match self {
            PieceKind::Normal => 1,
            PieceKind::Unknown => 2,
            PieceKind::Control => 3,
            PieceKind::UserDefined => 4,
            PieceKind::Unused => 5,
            PieceKind::Byte => 6,
        }
    }

    /// The kind for a protobuf enum value, `None` for values the schema lacks.
    pub fn from_proto_value(v: u64) -> Option<Self> {
        Some(match v {
            1 => PieceKind::Normal,
            2 => PieceKind::Unknown,
            3 => PieceKind::Control,
            4 => PieceKind::UserDefined,
            5 => PieceKind::Unused,
            6 => PieceKind::Byte,
            _ => return None,
        })
    }
}

/// A problem in the protobuf encoding itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("truncated varint")]
    TruncatedVarint,
    #[error("varint longer than 10 bytes or larger than 2^64 - 1")]
    VarintOverflow,
    #[error("invalid field number {0} (must be 1..=536870911)")]
    BadFieldNumber(u64),
    #[error("unsupported wire type {0} (only 0, 1, 2 and 5 are read; 3/4 are deprecated groups)")]
    BadWireType(u8),
    #[error("length-delimited field claims {len} bytes but only {left} are left")]
    LengthOverrun { len: u64, left: usize },
    #[error("truncated fixed{bits} value ({left} bytes left)")]
    TruncatedFixed { bits: u8, left: usize },
    #[error("field {field} has wire type {got}, expected {expected}")]
    WrongWireType {
        field: &'static str,
        got: u8,
        expected: u8,
    },
    #[error("piece string is not valid UTF-8")]
    PieceNotUtf8,
    #[error("unknown piece type {0} (expected 1..=6)")]
    UnknownPieceType(u64),
    #[error("SentencePiece message without a piece string (field 1)")]
    MissingPiece,
}

/// What is wrong with one piece of an otherwise well-encoded table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PieceProblem {
    #[error("piece is empty")]
    Empty,
    #[error("duplicate of piece {first}")]
    Duplicate { first: usize },
    #[error("second UNKNOWN piece (the first is piece {first}); exactly one is allowed")]
    SecondUnknown { first: usize },
    #[error("BYTE piece is not of the form <0xHH> with upper-case hex digits")]
    BadByte,
}

/// Where a piece was in the input, if it came from bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At(pub Option<usize>);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(offset) => write!(f, " at byte {offset}"),
            None => Ok(()),
        }
    }
}

/// Everything that can go wrong reading or building a [`PieceTable`].
#[derive(Debug, thiserror::Error)]
pub enum SpmError {
    #[error("cannot read SentencePiece model {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("SentencePiece model {} is larger than {max} bytes", path.display())]
    TooLarge { path: PathBuf, max: u64 },
    #[error("malformed SentencePiece model: {kind} at byte {offset}")]
    Malformed { offset: usize, kind: WireError },
    #[error("invalid SentencePiece model: piece {id} {piece:?}{at}: {problem}")]
    InvalidPiece {
        id: usize,
        piece: String,
        at: At,
        problem: PieceProblem,
    },
    #[error("invalid SentencePiece model: no piece has type UNKNOWN (exactly one is required)")]
    NoUnknown,
    #[error("invalid SentencePiece model: {0} pieces, more than u32 ids can address")]
    TooManyPieces(usize),
}

/// How a token reads as text; see [`PieceTable::token_text`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenText<'a> {
    /// Not printed: ids 0 and 3, and ids out of range.
    Skip,
    /// Whole text (`▁` already replaced by a space; ASCII byte pieces too).
    Text(&'a str),
    /// A BYTE piece for a byte ≥ 0x80: part of a multi-byte UTF-8 character.
    Byte(u8),
}

#[derive(Debug, Clone, PartialEq)]
enum Out {
    Skip,
    Text(Box<str>),
    Byte(u8),
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    piece: Box<str>,
    score: f32,
    kind: PieceKind,
    out: Out,
}

/// The pieces of a SentencePiece model, indexed by token id, with the text of
/// each token precomputed. See the module documentation for the invariants.
#[derive(Debug, Clone, PartialEq)]
pub struct PieceTable {
    entries: Vec<Entry>,
    unk_id: u32,
}

impl PieceTable {
    /// Reads a `.model` file (at most [`MAX_MODEL_BYTES`]).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, SpmError> {
        let path = path.as_ref();
        let io_err = |source| SpmError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io_err)?;
        let mut bytes = Vec::new();
        // `take` bounds the read even if the size on disk lies or grows.
        file.take(MAX_MODEL_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io_err)?;
        if bytes.len() as u64 > MAX_MODEL_BYTES {
            return Err(SpmError::TooLarge {
                path: path.to_path_buf(),
                max: MAX_MODEL_BYTES,
            });
        }
        Self::from_bytes(&bytes)
    }

    /// Parses a serialized `ModelProto`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SpmError> {
        let mut pieces = Vec::new();
        let mut offsets = Vec::new();
        let mut r = Reader::new(bytes, 0);
        while !r.is_empty() {
            let at = r.offset();
            let (field, wire) = r.tag()?;
            if field == 1 {
                expect_wire("ModelProto.pieces (1)", wire, WIRE_LEN, at)?;
                let (body_at, body) = r.len_delimited()?;
                pieces.push(parse_piece(body, body_at)?);
                offsets.push(at);
            } else {
                r.skip(wire, at)?;
            }
        }
        Self::build(pieces, Some(&offsets))
    }

    /// Builds a table from `(piece, score, kind)` in id order, with the same
    /// checks as [`PieceTable::from_bytes`].
    pub fn from_pieces<I, S>(pieces: I) -> Result<Self, SpmError>
    where
        I: IntoIterator<Item = (S, f32, PieceKind)>,
        S: Into<Box<str>>,
    {
        let pieces = pieces
            .into_iter()
            .map(|(p, s, k)| (p.into(), s, k))
            .collect();
        Self::build(pieces, None)
    }

    fn build(
        pieces: Vec<(Box<str>, f32, PieceKind)>,
        offsets: Option<&[usize]>,
    ) -> Result<Self, SpmError> {
        if u32::try_from(pieces.len().saturating_sub(1)).is_err() {
            return Err(SpmError::TooManyPieces(pieces.len()));
        }
        let invalid = |id: usize, piece: &str, problem| SpmError::InvalidPiece {
            id,
            piece: piece.to_owned(),
            at: At(offsets.and_then(|o| o.get(id).copied())),
            problem,
        };
        let mut seen: HashMap<&str, usize> = HashMap::with_capacity(pieces.len());
        let mut unk: Option<usize> = None;
        for (id, (piece, _, kind)) in pieces.iter().enumerate() {
            if piece.is_empty() {
                return Err(invalid(id, piece, PieceProblem::Empty));
            }
            if let Some(&first) = seen.get(&**piece) {
                return Err(invalid(id, piece, PieceProblem::Duplicate { first }));
            }
            seen.insert(piece, id);
            if *kind == PieceKind::Unknown {
                if let Some(first) = unk {
                    return Err(invalid(id, piece, PieceProblem::SecondUnknown { first }));
                }
                unk = Some(id);
            }
            if *kind == PieceKind::Byte && parse_byte_piece(piece).is_none() {
                return Err(invalid(id, piece, PieceProblem::BadByte));
            }
        }
        drop(seen);
        let unk_id = unk.ok_or(SpmError::NoUnknown)? as u32;
        let entries = pieces
            .into_iter()
            .enumerate()
            .map(|(id, (piece, score, kind))| {
                let out = if SKIPPED_TEXT_IDS.contains(&(id as u32)) {
                    Out::Skip
                } else if kind == PieceKind::Byte {
                    // Validated above.
                    let b = parse_byte_piece(&piece).unwrap_or(0);
                    if b.is_ascii() {
                        Out::Text(char::from(b).to_string().into())
                    } else {
                        Out::Byte(b)
                    }
                } else {
                    Out::Text(piece.replace(SPACE_MARK, " ").into())
                };
                Entry {
                    piece,
                    score,
                    kind,
                    out,
                }
            })
            .collect();
        Ok(PieceTable { entries, unk_id })
    }

    /// Number of pieces (the vocabulary size).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table has no pieces (never true for a valid table).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The id of the single UNKNOWN piece.
    pub fn unk_id(&self) -> u32 {
        self.unk_id
    }

    fn entry(&self, id: u32) -> Option<&Entry> {
        self.entries.get(usize::try_from(id).ok()?)
    }

    /// The piece as stored, like `id_to_piece` (`▁` not replaced).
    pub fn piece(&self, id: u32) -> Option<&str> {
        self.entry(id).map(|e| &*e.piece)
    }

    /// The piece's score.
    pub fn score(&self, id: u32) -> Option<f32> {
        self.entry(id).map(|e| e.score)
    }

    /// The piece's type.
    pub fn kind(&self, id: u32) -> Option<PieceKind> {
        self.entry(id).map(|e| e.kind)
    }

    /// How token `id` reads as text; [`TokenText::Skip`] for ids 0, 3 and ids
    /// out of range. Allocates nothing.
    pub fn token_text(&self, id: u32) -> TokenText<'_> {
        match self.entry(id).map(|e| &e.out) {
            None | Some(Out::Skip) => TokenText::Skip,
            Some(Out::Text(t)) => TokenText::Text(t),
            Some(Out::Byte(b)) => TokenText::Byte(*b),
        }
    }

    /// The text the official server sends for token `id`:
    /// `piece.replace("▁", " ")`, or `None` for ids 0 and 3 and ids out of
    /// range. BYTE pieces read as their byte when it is ASCII and give `None`
    /// when it is not (use [`TextDecoder`] to join those). Allocates nothing.
    pub fn text_for_token(&self, id: u32) -> Option<&str> {
        match self.token_text(id) {
            TokenText::Text(t) => Some(t),
            TokenText::Skip | TokenText::Byte(_) => None,
        }
    }

    /// Serializes the table as a `ModelProto` that SentencePiece loads: the
    /// pieces (field 1, encoded as SentencePiece itself writes them: type
    /// omitted when NORMAL), a minimal `trainer_spec` (unigram, vocab size,
    /// `byte_fallback` when there are BYTE pieces, `unk_id`) and a
    /// `normalizer_spec` naming the identity normalization.
    pub fn to_model_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.iter().map(|e| e.piece.len() + 12).sum());
        let mut msg = Vec::new();
        for e in &self.entries {
            msg.clear();
            put_bytes(&mut msg, 1, e.piece.as_bytes());
            put_tag(&mut msg, 2, WIRE_FIXED32);
            msg.extend_from_slice(&e.score.to_le_bytes());
            if e.kind != PieceKind::Normal {
                put_tag(&mut msg, 3, WIRE_VARINT);
                put_varint(&mut msg, u64::from(e.kind.proto_value()));
            }
            put_bytes(&mut out, 1, &msg);
        }
        // TrainerSpec: model_type = 3 (UNIGRAM = 1), vocab_size = 4,
        // unk_id = 40, byte_fallback = 35.
        msg.clear();
        put_tag(&mut msg, 3, WIRE_VARINT);
        put_varint(&mut msg, 1);
        put_tag(&mut msg, 4, WIRE_VARINT);
        put_varint(&mut msg, self.entries.len() as u64);
        if self.entries.iter().any(|e| e.kind == PieceKind::Byte) {
            put_tag(&mut msg, 35, WIRE_VARINT);
            put_varint(&mut msg, 1);
        }
        put_tag(&mut msg, 40, WIRE_VARINT);
        put_varint(&mut msg, u64::from(self.unk_id));
        put_bytes(&mut out, 2, &msg);
        // NormalizerSpec: name = 1.
        msg.clear();
        put_bytes(&mut msg, 1, b"identity");
        put_bytes(&mut out, 3, &msg);
        out
    }
}

/// Joins the text of a stream of tokens, decoding BYTE pieces to UTF-8
/// across tokens. Holds at most 3 pending bytes and allocates nothing beyond
/// what `out` needs to grow.
///
/// The output of a sequence of [`TextDecoder::push`] calls followed by
/// [`TextDecoder::finish`] equals `String::from_utf8_lossy` of the bytes of
/// all printed tokens concatenated. Skipped tokens (ids 0, 3, out of range) do
/// not interrupt a pending character.
#[derive(Debug, Clone, Default)]
pub struct TextDecoder {
    pending: [u8; 4],
    len: usize,
}

impl TextDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends the text of token `id` to `out` (possibly nothing, if it is
    /// skipped or an incomplete part of a character).
    pub fn push(&mut self, table: &PieceTable, id: u32, out: &mut String) {
        match table.token_text(id) {
            TokenText::Skip => {}
            TokenText::Text(t) => {
                self.finish(out);
                out.push_str(t);
            }
            TokenText::Byte(b) => self.push_byte(b, out),
        }
    }

    /// Ends the stream: an incomplete pending character becomes U+FFFD.
    pub fn finish(&mut self, out: &mut String) {
        if self.len > 0 {
            out.push(char::REPLACEMENT_CHARACTER);
            self.len = 0;
        }
    }

    /// Whether bytes of an incomplete character are waiting.
    pub fn has_pending(&self) -> bool {
        self.len > 0
    }

    fn push_byte(&mut self, b: u8, out: &mut String) {
        // Invariant: pending[..len] is a strict prefix of a valid UTF-8
        // sequence, so len <= 3 here.
        if self.len >= self.pending.len() {
            self.finish(out);
        }
        self.pending[self.len] = b;
        self.len += 1;
        loop {
            match std::str::from_utf8(&self.pending[..self.len]) {
                Ok(s) => {
                    out.push_str(s);
                    self.len = 0;
                    return;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix is valid UTF-8 by construction.
                    if let Ok(s) = std::str::from_utf8(&self.pending[..valid]) {
                        out.push_str(s);
                    }
                    let Some(bad) = e.error_len() else {
                        // Incomplete: keep the tail and wait for more bytes.
                        self.pending.copy_within(valid..self.len, 0);
                        self.len -= valid;
                        return;
                    };
                    out.push(char::REPLACEMENT_CHARACTER);
                    self.pending.copy_within(valid + bad..self.len, 0);
                    self.len -= valid + bad;
                    if self.len == 0 {
                        return;
                    }
                }
            }
        }
    }
}

/// `<0xHH>` → the byte, as SentencePiece spells byte pieces.
fn parse_byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    let digits = hex.as_bytes();
    if digits.len() != 2
        || !digits
            .iter()
            .all(|d| d.is_ascii_digit() || (b'A'..=b'F').contains(d))
    {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

const WIRE_VARINT: u8 = 0;
const WIRE_FIXED64: u8 = 1;
const WIRE_LEN: u8 = 2;
const WIRE_FIXED32: u8 = 5;
const MAX_FIELD: u64 = (1 << 29) - 1;

fn expect_wire(field: &'static str, got: u8, expected: u8, at: usize) -> Result<(), SpmError> {
    if got == expected {
        Ok(())
    } else {
        Err(SpmError::Malformed {
            offset: at,
            kind: WireError::WrongWireType {
                field,
                got,
                expected,
            },
        })
    }
}

/// Parses one `SentencePiece` message; `base` is its offset in the input.
fn parse_piece(body: &[u8], base: usize) -> Result<(Box<str>, f32, PieceKind), SpmError> {
    let mut r = Reader::new(body, base);
    let mut piece: Option<&[u8]> = None;
    let mut piece_at = base;
    let mut score = 0.0f32;
    let mut kind = PieceKind::Normal;
    while !r.is_empty() {
        let at = r.offset();
        let (field, wire) = r.tag()?;
        match field {
            1 => {
                expect_wire("SentencePiece.piece (1)", wire, WIRE_LEN, at)?;
                let (_, bytes) = r.len_delimited()?;
                // Repeated occurrences of an optional field: the last one wins.
                piece = Some(bytes);
                piece_at = at;
            }
            2 => {
                expect_wire("SentencePiece.score (2)", wire, WIRE_FIXED32, at)?;
                score = f32::from_le_bytes(r.fixed::<4>()?);
            }
            3 => {
                expect_wire("SentencePiece.type (3)", wire, WIRE_VARINT, at)?;
                let v = r.varint()?;
                kind = PieceKind::from_proto_value(v).ok_or(SpmError::Malformed {
                    offset: at,
                    kind: WireError::UnknownPieceType(v),
                })?;
            }
            _ => r.skip(wire, at)?,
        }
    }
    let piece = piece.ok_or(SpmError::Malformed {
        offset: base,
        kind: WireError::MissingPiece,
    })?;
    let piece = std::str::from_utf8(piece).map_err(|_| SpmError::Malformed {
        offset: piece_at,
        kind: WireError::PieceNotUtf8,
    })?;
    Ok((piece.into(), score, kind))
}

/// A cursor over protobuf wire data. `base` is the offset of `buf[0]` in the
/// whole input, so errors report absolute offsets.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    base: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], base: usize) -> Self {
        Reader { buf, pos: 0, base }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub(crate) fn offset(&self) -> usize {
        self.base + self.pos
    }

    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn err(&self, offset: usize, kind: WireError) -> SpmError {
        SpmError::Malformed { offset, kind }
    }

    pub(crate) fn varint(&mut self) -> Result<u64, SpmError> {
        let start = self.offset();
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(self.err(start, WireError::TruncatedVarint));
            };
            self.pos += 1;
            // The 10th byte may only contribute bit 63.
            if i == 9 && b > 1 {
                return Err(self.err(start, WireError::VarintOverflow));
            }
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(value);
            }
        }
        Err(self.err(start, WireError::VarintOverflow))
    }

    pub(crate) fn tag(&mut self) -> Result<(u64, u8), SpmError> {
        let start = self.offset();
        let tag = self.varint()?;
        let field = tag >> 3;
        let wire = (tag & 7) as u8;
        if field == 0 || field > MAX_FIELD {
            return Err(self.err(start, WireError::BadFieldNumber(field)));
        }
        Ok((field, wire))
    }

    /// A length-delimited payload and its absolute offset.
    pub(crate) fn len_delimited(&mut self) -> Result<(usize, &'a [u8]), SpmError> {
        let start = self.offset();
        let len = self.varint()?;
        let left = self.left();
        match usize::try_from(len) {
            Ok(n) if n <= left => {
                let at = self.offset();
                let bytes = &self.buf[self.pos..self.pos + n];
                self.pos += n;
                Ok((at, bytes))
            }
            _ => Err(self.err(start, WireError::LengthOverrun { len, left })),
        }
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], SpmError> {
        let start = self.offset();
        let left = self.left();
        let Some(bytes) = self.buf.get(self.pos..self.pos + N) else {
            let bits = (N * 8) as u8;
            return Err(self.err(start, WireError::TruncatedFixed { bits, left }));
        };
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        self.pos += N;
        Ok(out)
    }

    /// Skips the value of a field with wire type `wire` whose tag was at `at`.
    pub(crate) fn skip(&mut self, wire: u8, at: usize) -> Result<(), SpmError> {
        match wire {
            WIRE_VARINT => self.varint().map(drop),
            WIRE_FIXED64 => self.fixed::<8>().map(drop),
            WIRE_LEN => self.len_delimited().map(drop),
            WIRE_FIXED32 => self.fixed::<4>().map(drop),
            other => Err(self.err(at, WireError::BadWireType(other))),
        }
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_tag(out, field, WIRE_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests;
