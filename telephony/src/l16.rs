//! L16: 16-bit signed linear PCM in network byte order (RFC 3551 §4.5.11).
//!
//! Invariants: no allocation; an odd trailing byte is ignored (callers treat
//! odd payloads as malformed before decoding).

use super::g711::f32_to_i16;

/// Decodes big-endian samples into `out` (as many as both hold); returns
/// the count.
pub fn decode(payload: &[u8], out: &mut [f32]) -> usize {
    let n = (payload.len() / 2).min(out.len());
    for (o, b) in out[..n].iter_mut().zip(payload.chunks_exact(2)) {
        *o = i16::from_be_bytes([b[0], b[1]]) as f32 * (1.0 / 32768.0);
    }
    n
}

/// Encodes `pcm` as big-endian samples into `out`; returns the bytes written.
pub fn encode(pcm: &[f32], out: &mut [u8]) -> usize {
    let n = pcm.len().min(out.len() / 2);
    for (o, &x) in out.chunks_exact_mut(2).zip(&pcm[..n]) {
        o.copy_from_slice(&f32_to_i16(x).to_be_bytes());
    }
    2 * n
}

#[cfg(test)]
mod tests {
    #[test]
    fn big_endian_round_trip() {
        let payload = [0x00, 0x01, 0xFF, 0xFF, 0x80, 0x00, 0x7F, 0xFF];
        let mut pcm = [0f32; 4];
        assert_eq!(super::decode(&payload, &mut pcm), 4);
        assert_eq!(pcm[0], 1.0 / 32768.0);
        assert_eq!(pcm[1], -1.0 / 32768.0);
        assert_eq!(pcm[2], -1.0);
        let mut back = [0u8; 8];
        assert_eq!(super::encode(&pcm, &mut back), 8);
        assert_eq!(back, payload);
    }
}
