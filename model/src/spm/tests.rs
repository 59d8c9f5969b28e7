//! Tests of the SentencePiece model reader ([`super`]): the tiny golden
//! tokenizer in `shared/golden` read and round-tripped, invalid tables and
//! malformed wire data refused (never a panic), and the byte-joining decoder.

use super::*;

const TINY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/golden/tokenizer_tiny.model"
);

fn tiny_bytes() -> Vec<u8> {
    std::fs::read(TINY).expect("golden tokenizer_tiny.model")
}

#[test]
fn reads_golden_tokenizer() {
    let missing = PieceTable::from_file("/nonexistent/tok.model").unwrap_err();
    assert!(matches!(missing, SpmError::Io { .. }));
    assert!(missing.to_string().contains("/nonexistent/tok.model"));
    let t = PieceTable::from_file(TINY).unwrap();
    assert_eq!(t.len(), 128);
    assert!(!t.is_empty());
    assert_eq!(t.unk_id(), 0);
    let expect = [
        (0, "<unk>", PieceKind::Unknown, 0.0),
        (1, "<s>", PieceKind::Control, 0.0),
        (2, "</s>", PieceKind::Control, 0.0),
        (3, "<pad>", PieceKind::Control, 0.0),
        (4, "▁you", PieceKind::Normal, -2.746_599_4),
        (8, "▁bonjour", PieceKind::Normal, -3.410_664_8),
        (33, "z", PieceKind::Normal, -3.510_743_4),
        (57, "▁", PieceKind::Normal, -3.513_143_3),
        (127, "▁x127", PieceKind::Normal, -30.127),
    ];
    for (id, piece, kind, score) in expect {
        assert_eq!(t.piece(id), Some(piece), "id {id}");
        assert_eq!(t.kind(id), Some(kind), "id {id}");
        assert_eq!(t.score(id), Some(score), "id {id}");
    }
}

#[test]
fn text_matches_official_server() {
    let t = PieceTable::from_file(TINY).unwrap();
    assert_eq!(t.text_for_token(4), Some(" you"));
    assert_eq!(t.text_for_token(8), Some(" bonjour"));
    assert_eq!(t.text_for_token(33), Some("z"));
    assert_eq!(t.text_for_token(57), Some(" "));
    // Upstream skips only ids 0 and 3; <s> and </s> are printed verbatim.
    assert_eq!(t.text_for_token(UNK_ID), None);
    assert_eq!(t.text_for_token(PAD_ID), None);
    assert_eq!(t.token_text(PAD_ID), TokenText::Skip);
    assert_eq!(t.text_for_token(1), Some("<s>"));
    assert_eq!(t.text_for_token(2), Some("</s>"));
    // Out of range.
    assert_eq!(t.text_for_token(128), None);
    assert_eq!(t.token_text(u32::MAX), TokenText::Skip);
    assert_eq!(t.piece(128), None);
    assert_eq!(t.kind(128), None);
    assert_eq!(t.score(u32::MAX), None);
    for id in 0..128 {
        let expected =
            (!SKIPPED_TEXT_IDS.contains(&id)).then(|| t.piece(id).unwrap().replace('▁', " "));
        assert_eq!(t.text_for_token(id).map(str::to_owned), expected);
    }
}

#[test]
fn round_trip_golden() {
    let bytes = tiny_bytes();
    let t = PieceTable::from_bytes(&bytes).unwrap();
    let written = t.to_model_bytes();
    let back = PieceTable::from_bytes(&written).unwrap();
    assert_eq!(back, t);
    // Pieces 0..=58 (written by the SentencePiece trainer) are encoded
    // byte for byte the same; the fixture script appended 59..=127 with
    // an explicit `type: NORMAL`, which the writer omits.
    let prefix_len = |b: &[u8]| {
        let mut r = Reader::new(b, 0);
        for _ in 0..59 {
            let (field, wire) = r.tag().unwrap();
            assert_eq!(field, 1);
            r.skip(wire, 0).unwrap();
        }
        r.offset()
    };
    let n = prefix_len(&bytes);
    assert_eq!(prefix_len(&written), n);
    assert_eq!(&written[..n], &bytes[..n]);
}

fn mixed_table() -> PieceTable {
    let mut pieces: Vec<(String, f32, PieceKind)> = vec![
        ("<unk>".into(), 0.0, PieceKind::Unknown),
        ("<s>".into(), 0.0, PieceKind::Control),
        ("</s>".into(), -0.0, PieceKind::Control),
        ("<pad>".into(), f32::MIN_POSITIVE, PieceKind::Control),
        ("▁héllo▁▁wörld".into(), -1.5, PieceKind::Normal),
        ("<mark>".into(), 0.0, PieceKind::UserDefined),
        ("zzz".into(), -100.0, PieceKind::Unused),
        ("日本".into(), f32::MAX, PieceKind::Normal),
    ];
    for b in 0..=255u8 {
        pieces.push((format!("<0x{b:02X}>"), 0.0, PieceKind::Byte));
    }
    PieceTable::from_pieces(pieces).unwrap()
}

#[test]
fn round_trip_from_pieces() {
    let t = mixed_table();
    let back = PieceTable::from_bytes(&t.to_model_bytes()).unwrap();
    assert_eq!(back.len(), t.len());
    for id in 0..t.len() as u32 {
        assert_eq!(back.piece(id), t.piece(id));
        assert_eq!(back.kind(id), t.kind(id));
        assert_eq!(
            back.score(id).map(f32::to_bits),
            t.score(id).map(f32::to_bits)
        );
        assert_eq!(back.token_text(id), t.token_text(id));
    }
    assert_eq!(t.text_for_token(4), Some(" héllo  wörld"));
    assert_eq!(t.text_for_token(5), Some("<mark>"));
    let byte = |b: u8| 8 + u32::from(b);
    assert_eq!(t.piece(byte(0x41)), Some("<0x41>"));
    assert_eq!(t.text_for_token(byte(0x41)), Some("A"));
    assert_eq!(t.text_for_token(byte(0x0A)), Some("\n"));
    assert_eq!(t.text_for_token(byte(0xE2)), None);
    assert_eq!(t.token_text(byte(0xE2)), TokenText::Byte(0xE2));
}

#[test]
fn rejects_invalid_tables() {
    let unk = ("<unk>", 0.0, PieceKind::Unknown);
    let a = ("a", 0.0, PieceKind::Normal);
    let err = |p: Vec<(&str, f32, PieceKind)>| PieceTable::from_pieces(p).unwrap_err();
    assert!(matches!(err(vec![a]), SpmError::NoUnknown));
    assert!(matches!(err(vec![]), SpmError::NoUnknown));
    assert!(matches!(
        err(vec![unk, a, a]),
        SpmError::InvalidPiece {
            id: 2,
            problem: PieceProblem::Duplicate { first: 1 },
            ..
        }
    ));
    assert!(matches!(
        err(vec![unk, ("", 0.0, PieceKind::Normal)]),
        SpmError::InvalidPiece {
            problem: PieceProblem::Empty,
            ..
        }
    ));
    assert!(matches!(
        err(vec![unk, ("<u2>", 0.0, PieceKind::Unknown)]),
        SpmError::InvalidPiece {
            problem: PieceProblem::SecondUnknown { first: 0 },
            ..
        }
    ));
    for bad in ["<0x4a>", "<0x4>", "<0x041>", "0x41", "<0xG1>", "<0x+1>"] {
        assert!(
            matches!(
                err(vec![unk, (bad, 0.0, PieceKind::Byte)]),
                SpmError::InvalidPiece {
                    problem: PieceProblem::BadByte,
                    ..
                }
            ),
            "{bad}"
        );
    }
    // From bytes, the error names the piece's offset.
    let bytes = b"\x0a\x09\x0a\x05<unk>\x18\x02\x0a\x07\x0a\x05<unk>";
    let e = PieceTable::from_bytes(bytes).unwrap_err();
    assert!(matches!(
        e,
        SpmError::InvalidPiece {
            id: 1,
            at: At(Some(11)),
            problem: PieceProblem::Duplicate { first: 0 },
            ..
        }
    ));
    assert_eq!(
        e.to_string(),
        "invalid SentencePiece model: piece 1 \"<unk>\" at byte 11: duplicate of piece 0"
    );
}

fn malformed(bytes: &[u8]) -> (usize, WireError) {
    match PieceTable::from_bytes(bytes) {
        Err(SpmError::Malformed { offset, kind }) => (offset, kind),
        other => panic!("expected Malformed, got {other:?}"),
    }
}

#[test]
fn rejects_malformed_wire_data() {
    let unk = b"\x0a\x0b\x0a\x05<unk>\x18\x02\x20\x00"; // unk + skipped varint field 4
    assert!(PieceTable::from_bytes(unk).is_ok());
    // Truncated varint (tag).
    assert_eq!(malformed(b"\x80"), (0, WireError::TruncatedVarint));
    // 11-byte varint, and a 10-byte one above 2^64 - 1.
    let mut long = vec![0x10];
    long.extend_from_slice(&[0xff; 10]);
    long.push(0x01);
    assert_eq!(malformed(&long), (1, WireError::VarintOverflow));
    let mut over = vec![0x10];
    over.extend_from_slice(&[0xff; 9]);
    over.push(0x02);
    assert_eq!(malformed(&over), (1, WireError::VarintOverflow));
    // Field number 0.
    assert_eq!(malformed(b"\x02\x00"), (0, WireError::BadFieldNumber(0)));
    // Groups and wire types 6/7.
    for w in [3u8, 4, 6, 7] {
        assert_eq!(malformed(&[0x10 | w]), (0, WireError::BadWireType(w)));
    }
    // Length past the end (also a huge one: no allocation).
    assert_eq!(
        malformed(b"\x1a\x05abc"),
        (1, WireError::LengthOverrun { len: 5, left: 3 })
    );
    let huge = b"\x1a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01";
    assert_eq!(
        malformed(huge),
        (
            1,
            WireError::LengthOverrun {
                len: u64::MAX,
                left: 0
            }
        )
    );
    // Truncated fixed32 / fixed64.
    assert_eq!(
        malformed(b"\x15\x00\x00"),
        (1, WireError::TruncatedFixed { bits: 32, left: 2 })
    );
    assert_eq!(
        malformed(b"\x11\x00"),
        (1, WireError::TruncatedFixed { bits: 64, left: 1 })
    );
    // Known fields with the wrong wire type.
    assert!(matches!(
        malformed(b"\x08\x01").1,
        WireError::WrongWireType { .. }
    ));
    assert_eq!(
        malformed(b"\x0a\x03\x0a\x01a\x0a\x02\x10\x00"),
        (
            7,
            WireError::WrongWireType {
                field: "SentencePiece.score (2)",
                got: 0,
                expected: 5
            }
        )
    );
    // Unknown piece type, missing piece, invalid UTF-8.
    assert_eq!(
        malformed(b"\x0a\x05\x0a\x01a\x18\x07"),
        (5, WireError::UnknownPieceType(7))
    );
    assert_eq!(malformed(b"\x0a\x02\x18\x02"), (2, WireError::MissingPiece));
    assert_eq!(
        malformed(b"\x0a\x03\x0a\x01\xff"),
        (2, WireError::PieceNotUtf8)
    );
    // Messages name the offset.
    let msg = PieceTable::from_bytes(b"\x0a\x03\x0a\x01\xff")
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        "malformed SentencePiece model: piece string is not valid UTF-8 at byte 2"
    );
    // All unknown wire types are skipped (fixed64, fixed32, varint, bytes).
    let mut ok = b"\x11\x01\x02\x03\x04\x05\x06\x07\x08\x1d\x01\x02\x03\x04".to_vec();
    ok.extend_from_slice(b"\xf8\xff\xff\xff\x0f\x00\x22\x00");
    ok.extend_from_slice(unk);
    assert_eq!(PieceTable::from_bytes(&ok).unwrap().len(), 1);
}

#[test]
fn truncations_and_corruptions_never_panic() {
    let bytes = tiny_bytes();
    // Every prefix: Ok only if it ends on a top-level field boundary and
    // still contains the UNKNOWN piece.
    // Every prefix through trainer_spec (byte 2013 + ~50), then every
    // 101st inside the 240 kB precompiled charsmap.
    let mut oks = 0;
    let prefixes = (0..3000).chain((3000..bytes.len()).step_by(101));
    for n in prefixes {
        if let Ok(t) = PieceTable::from_bytes(&bytes[..n]) {
            assert!(t.len() <= 128);
            oks += 1;
        }
    }
    // The ends of pieces 0..=127, and of trainer_spec (the end of
    // normalizer_spec is the whole file, not a strict prefix).
    assert_eq!(oks, 129);
    // Deterministic byte corruptions of the piece section.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let pieces_end = 2000.min(bytes.len());
    for _ in 0..3000 {
        let mut b = bytes[..pieces_end].to_vec();
        for _ in 0..(1 + next() % 3) {
            let i = (next() % pieces_end as u64) as usize;
            b[i] = next() as u8;
        }
        let cut = (next() % (pieces_end as u64 + 1)) as usize;
        let _ = PieceTable::from_bytes(&b[..cut]);
        let _ = PieceTable::from_bytes(&b);
    }
}

#[test]
fn decoder_joins_bytes_like_lossy_utf8() {
    let t = mixed_table();
    let byte = |b: u8| 8 + u32::from(b);
    let mut d = TextDecoder::new();
    let mut out = String::new();
    // "€" = E2 82 AC, with pads in between, then text.
    for id in [byte(0xE2), PAD_ID, byte(0x82), UNK_ID, byte(0xAC), 4] {
        d.push(&t, id, &mut out);
    }
    assert_eq!(out, "€ héllo  wörld");
    // Incomplete sequence interrupted by text, and at the end.
    out.clear();
    for id in [byte(0xE2), byte(0x82), 7, byte(0xF0)] {
        d.push(&t, id, &mut out);
    }
    assert!(d.has_pending());
    d.finish(&mut out);
    assert!(!d.has_pending());
    assert_eq!(out, "\u{FFFD}日本\u{FFFD}");

    // Random sequences against from_utf8_lossy of the concatenated bytes.
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let n = t.len() as u64 + 3;
    for _ in 0..2000 {
        let mut d = TextDecoder::new();
        let mut out = String::new();
        let mut raw = Vec::new();
        for _ in 0..(next() % 12) {
            // Mostly bytes >= 0x80 so that sequences form and break.
            let id = if next() % 3 == 0 {
                (next() % n) as u32
            } else {
                byte(0x80 + (next() % 0x80) as u8)
            };
            match t.token_text(id) {
                TokenText::Skip => {}
                TokenText::Text(s) => raw.extend_from_slice(s.as_bytes()),
                TokenText::Byte(b) => raw.push(b),
            }
            d.push(&t, id, &mut out);
        }
        d.finish(&mut out);
        assert_eq!(out, String::from_utf8_lossy(&raw), "{raw:x?}");
    }
}
