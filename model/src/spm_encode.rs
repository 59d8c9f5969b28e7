//! SentencePiece encoding (text → token ids) of unigram models, as
//! `SentencePieceProcessor.encode` computes it: PersonaPlex's role prompt is
//! tokenized by the server (`tokenizer.encode(wrap_with_system_tags(text))`,
//! no BOS/EOS).
//!
//! Normalisation (`normalizer.cc`): the model's precompiled character map
//! (a Darts-clone double-array trie of UTF-8 prefixes and the
//! NUL-terminated replacements after it; `nmt_nfkc` for Kyutai's
//! tokenizers) replaces the longest matching prefix, or passes one
//! character through; then, with the spec's defaults, leading, trailing and
//! repeated spaces are dropped, `▁` is prepended (`add_dummy_prefix`) and
//! spaces become `▁`. Encoding (`unigram_model.cc`, `EncodeOptimized`):
//! the best-scoring segmentation into `NORMAL`, `USER_DEFINED` and `UNUSED`
//! pieces (scores summed in float32, a later candidate replacing an equal
//! one only when strictly better), a character no piece starts with is one
//! `<unk>` scored `min_score − 10`; with `byte_fallback` an unknown piece
//! becomes its UTF-8 bytes' `<0xHH>` pieces.
//!
//! Refused: BPE and other model types, `treat_whitespace_as_suffix`, a
//! character map that points outside itself.

use crate::spm::{PieceKind, PieceTable, Reader, SpmError};
use std::collections::HashMap;

/// A tokenizer that encodes text.
#[derive(Debug, Clone)]
pub struct Encoder {
    table: PieceTable,
    /// Piece bytes → id, for the piece kinds the segmentation uses.
    pieces: HashMap<Box<[u8]>, u32>,
    max_piece: usize,
    min_score: f32,
    max_score: f32,
    /// Darts units and the replacement blob.
    trie: Vec<u32>,
    normalized: Vec<u8>,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    escape_whitespaces: bool,
    byte_fallback: bool,
}

/// Why a model cannot encode.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The file is not a SentencePiece model.
    #[error("{0}")]
    Model(#[from] SpmError),
    /// A model this encoder does not implement.
    #[error("tokenizer: {0}")]
    Unsupported(String),
}

fn unsupported<T>(why: impl Into<String>) -> Result<T, EncodeError> {
    Err(EncodeError::Unsupported(why.into()))
}

struct Spec {
    model_type: u64,
    byte_fallback: bool,
    ws_suffix: bool,
    charsmap: Vec<u8>,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    escape_whitespaces: bool,
}

fn read_spec(bytes: &[u8]) -> Result<Spec, SpmError> {
    let mut s = Spec {
        model_type: 1,
        byte_fallback: false,
        ws_suffix: false,
        charsmap: Vec::new(),
        add_dummy_prefix: true,
        remove_extra_whitespaces: true,
        escape_whitespaces: true,
    };
    let mut r = Reader::new(bytes, 0);
    while !r.is_empty() {
        let at = r.offset();
        let (field, wire) = r.tag()?;
        match (field, wire) {
            (2 | 3, 2) => {
                let (base, body) = r.len_delimited()?;
                let mut m = Reader::new(body, base);
                while !m.is_empty() {
                    let at = m.offset();
                    let (f, w) = m.tag()?;
                    match (field, f, w) {
                        (2, 3, 0) => s.model_type = m.varint()?,
                        (2, 35, 0) => s.byte_fallback = m.varint()? != 0,
                        (2, 24, 0) => s.ws_suffix = m.varint()? != 0,
                        (3, 2, 2) => s.charsmap = m.len_delimited()?.1.to_vec(),
                        (3, 3, 0) => s.add_dummy_prefix = m.varint()? != 0,
                        (3, 4, 0) => s.remove_extra_whitespaces = m.varint()? != 0,
                        (3, 5, 0) => s.escape_whitespaces = m.varint()? != 0,
                        _ => m.skip(w, at)?,
                    }
                }
            }
            _ => r.skip(wire, at)?,
        }
    }
    Ok(s)
}

impl Encoder {
    /// Reads a `.model` file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, EncodeError> {
        let bytes = std::fs::read(path).map_err(|source| SpmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes)
    }

    /// Parses a serialized `ModelProto`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EncodeError> {
        let table = PieceTable::from_bytes(bytes)?;
        let spec = read_spec(bytes)?;
        if spec.model_type != 1 {
            return unsupported(format!(
                "model type {} (only unigram models are encoded)",
                spec.model_type
            ));
        }
        if spec.ws_suffix {
            return unsupported("treat_whitespace_as_suffix");
        }
        let (trie, normalized) = if spec.charsmap.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let cm = &spec.charsmap;
            let n = cm
                .get(..4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                .filter(|&n| n % 4 == 0 && 4 + n <= cm.len())
                .ok_or_else(|| {
                    EncodeError::Unsupported("a broken precompiled character map".into())
                })?;
            let trie = cm[4..4 + n]
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (trie, cm[4 + n..].to_vec())
        };
        let mut pieces = HashMap::new();
        let (mut min_score, mut max_score) = (f32::MAX, f32::MIN);
        let mut max_piece = 0;
        for id in 0..table.len() as u32 {
            let kind = table.kind(id).unwrap_or(PieceKind::Normal);
            let score = table.score(id).unwrap_or(0.0);
            if kind == PieceKind::Normal {
                min_score = min_score.min(score);
                max_score = max_score.max(score);
            }
            if matches!(
                kind,
                PieceKind::Normal | PieceKind::UserDefined | PieceKind::Unused
            ) {
                let p = table.piece(id).unwrap_or_default().as_bytes();
                max_piece = max_piece.max(p.len());
                pieces.insert(p.into(), id);
            }
        }
        Ok(Encoder {
            table,
            pieces,
            max_piece,
            min_score,
            max_score,
            trie,
            normalized,
            add_dummy_prefix: spec.add_dummy_prefix,
            remove_extra_whitespaces: spec.remove_extra_whitespaces,
            escape_whitespaces: spec.escape_whitespaces,
            byte_fallback: spec.byte_fallback,
        })
    }

    /// The pieces.
    pub fn table(&self) -> &PieceTable {
        &self.table
    }

    /// Length and replacement of the longest character-map rule at the
    /// start of `input`, if any.
    fn longest_rule(&self, input: &[u8]) -> Option<(usize, &[u8])> {
        let unit = |i: usize| self.trie.get(i).copied();
        let offset = |u: u32| ((u >> 10) << ((u & (1 << 9)) >> 6)) as usize;
        let mut node = offset(unit(0)?);
        let mut best = None;
        for (i, &c) in input.iter().enumerate() {
            node ^= c as usize;
            let u = unit(node)?;
            if u & ((1 << 31) | 0xFF) != c as u32 {
                break;
            }
            node ^= offset(u);
            if (u >> 8) & 1 == 1 {
                let value = (unit(node)? & ((1 << 31) - 1)) as usize;
                best = Some((i + 1, value));
            }
        }
        let (len, value) = best?;
        let rest = self.normalized.get(value..)?;
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        Some((len, &rest[..end]))
    }

    /// The normalized text (with `▁` for spaces), as `Normalizer::Normalize`.
    pub fn normalize(&self, text: &str) -> String {
        let mut input = text.as_bytes();
        let prefix = |input: &[u8]| -> (Vec<u8>, usize) {
            match self.longest_rule(input) {
                Some((len, rep)) => (rep.to_vec(), len),
                None => {
                    let len = utf8_len(input[0]).min(input.len());
                    (input[..len].to_vec(), len)
                }
            }
        };
        if self.remove_extra_whitespaces {
            while !input.is_empty() {
                let (p, len) = prefix(input);
                if p != b" " {
                    break;
                }
                input = &input[len..];
            }
        }
        let mut out: Vec<u8> = Vec::with_capacity(text.len() * 3 + 3);
        if input.is_empty() {
            return String::new();
        }
        let space: &[u8] = if self.escape_whitespaces {
            "\u{2581}".as_bytes()
        } else {
            b" "
        };
        if self.add_dummy_prefix {
            out.extend_from_slice(space);
        }
        let mut prev_space = self.remove_extra_whitespaces;
        while !input.is_empty() {
            let (p, len) = prefix(input);
            let mut sp: &[u8] = &p;
            while prev_space && sp.first() == Some(&b' ') {
                sp = &sp[1..];
            }
            if !sp.is_empty() {
                for &c in sp {
                    if c == b' ' && self.escape_whitespaces {
                        out.extend_from_slice(space);
                    } else {
                        out.push(c);
                    }
                }
                prev_space = sp.last() == Some(&b' ');
            }
            input = &input[len..];
            if !self.remove_extra_whitespaces {
                prev_space = false;
            }
        }
        if self.remove_extra_whitespaces {
            while out.ends_with(space) {
                out.truncate(out.len() - space.len());
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The token ids of `text` (no BOS/EOS).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let norm = self.normalize(text);
        let b = norm.as_bytes();
        let n = b.len();
        // (best score, start, id) of the best path ending at each byte.
        let mut best: Vec<(f32, Option<usize>, u32)> = vec![(0.0, None, 0); n + 1];
        let unk_score = self.min_score - 10.0;
        let mut start = 0;
        while start < n {
            let here = best[start].0;
            let mblen = utf8_len(b[start]).min(n - start);
            let mut single = false;
            for len in 1..=self.max_piece.min(n - start) {
                let Some(&id) = self.pieces.get(&b[start..start + len]) else {
                    continue;
                };
                let score = if self.table.kind(id) == Some(PieceKind::UserDefined) {
                    len as f32 * self.max_score - 0.1
                } else {
                    self.table.score(id).unwrap_or(0.0)
                };
                let cand = score + here;
                let t = &mut best[start + len];
                if t.1.is_none() || cand > t.0 {
                    *t = (cand, Some(start), id);
                }
                single |= len == mblen;
            }
            if !single {
                let cand = unk_score + here;
                let t = &mut best[start + mblen];
                if t.1.is_none() || cand > t.0 {
                    *t = (cand, Some(start), self.table.unk_id());
                }
            }
            start += mblen;
        }
        let mut out = Vec::new();
        let mut end = n;
        while end > 0 {
            let (_, s, id) = best[end];
            let s = s.unwrap_or(0);
            if id == self.table.unk_id() && self.byte_fallback {
                for &byte in b[s..end].iter().rev() {
                    out.push(self.byte_piece(byte).unwrap_or(id));
                }
            } else {
                out.push(id);
            }
            end = s;
        }
        out.reverse();
        out
    }

    fn byte_piece(&self, byte: u8) -> Option<u32> {
        let name = format!("<0x{byte:02X}>");
        (0..self.table.len() as u32).find(|&i| {
            self.table.kind(i) == Some(PieceKind::Byte) && self.table.piece(i) == Some(&name)
        })
    }
}

/// Bytes of the UTF-8 character starting with `b` (1 for a stray byte).
fn utf8_len(b: u8) -> usize {
    match b {
        0xF0..=0xF7 => 4,
        0xE0..=0xEF => 3,
        0xC0..=0xDF => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_tokenizer_encodes_as_sentencepiece() {
        let e = Encoder::from_file(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/golden/tokenizer_tiny.model"
        )))
        .unwrap();
        assert_eq!(e.normalize("  hello   how  "), "\u{2581}hello\u{2581}how");
        assert_eq!(
            e.encode("<system> hello how are you <system>"),
            [57, 0, 37, 43, 37, 48, 55, 46, 0, 6, 26, 10, 4, 57, 0, 37, 43, 37, 48, 55, 46, 0]
        );
        assert!(e.encode("").is_empty());
    }
}
