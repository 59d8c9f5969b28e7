//! Helpers shared by the fuzz targets.

use moshid::codec::ogg_crc::ogg_page_crc;

/// Rewrites the CRC of every complete Ogg page found in `data` (pages are
/// located by their `OggS` capture pattern), so that mutated pages get past
/// the CRC check and exercise what lies behind it.
pub fn fix_ogg_crcs(data: &mut [u8]) {
    let mut i = 0;
    while i + 27 <= data.len() {
        if &data[i..i + 4] != b"OggS" {
            i += 1;
            continue;
        }
        let segments = data[i + 26] as usize;
        let header = 27 + segments;
        if i + header > data.len() {
            return;
        }
        let body: usize = data[i + 27..i + header].iter().map(|&b| b as usize).sum();
        let end = i + header + body;
        if end > data.len() {
            return;
        }
        let crc = ogg_page_crc(&data[i..end]);
        data[i + 22..i + 26].copy_from_slice(&crc.to_le_bytes());
        i = end;
    }
}

/// Splits `data` into chunks whose sizes come from `seed` (1 to ~4 KiB,
/// often small), so the same bytes are tried in many different splits.
pub fn chunks(data: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut state = u32::from(seed).wrapping_mul(2_654_435_761).wrapping_add(1);
    let mut rest = data;
    while !rest.is_empty() {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let size = match (state >> 16) % 4 {
            0 => 1 + (state >> 20) as usize % 8,
            1 => 1 + (state >> 20) as usize % 300,
            2 => 1 + (state >> 20) as usize % 4096,
            _ => rest.len(),
        };
        let (head, tail) = rest.split_at(size.min(rest.len()));
        out.push(head);
        rest = tail;
    }
    out
}

/// Splits `data` into messages, each prefixed by a big-endian 16-bit length
/// (a short last message takes what is left).
pub fn messages(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
        rest = &rest[2..];
        let (msg, tail) = rest.split_at(len.min(rest.len()));
        out.push(msg);
        rest = tail;
    }
    out
}
