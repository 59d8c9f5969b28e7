//! G.711 μ-law and A-law (ITU-T G.711), table-driven.
//!
//! The tables are computed at compile time from the ITU reference algorithm
//! (the segment search of Sun's public-domain `g711.c`, which is bit-exact
//! with the Recommendation): decoding is one lookup in a 256-entry table,
//! encoding one lookup indexed by the 14-bit (μ-law) or 13-bit (A-law)
//! linear value, i.e. the 16-bit sample shifted right by 2 or 3 — exactly
//! the bits the reference encoder looks at, so the tables reproduce it for
//! every input.
//!
//! Invariants: no allocation, no branches on the sample value beyond the
//! clamp from `f32`; `decode(encode(decode(c))) == decode(c)` for every
//! code, and `encode(decode(c)) == c` for every code except μ-law's negative
//! zero (0x7F, which decodes to 0 and encodes to 0xFF).

/// μ-law code of digital silence (+0).
pub const ULAW_SILENCE: u8 = 0xFF;
/// A-law code of the smallest positive value (+8), the conventional silence.
pub const ALAW_SILENCE: u8 = 0xD5;

const ULAW_BIAS: i32 = 0x84;
const ULAW_CLIP: i32 = 8159;
const SEG_UEND: [i32; 8] = [0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF];
const SEG_AEND: [i32; 8] = [0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF];

const fn search(val: i32, table: &[i32; 8]) -> i32 {
    let mut i = 0;
    while i < 8 {
        if val <= table[i] {
            return i as i32;
        }
        i += 1;
    }
    8
}

/// Reference μ-law encoder on a 14-bit value (the 16-bit sample >> 2).
const fn ulaw_encode_14(v14: i32) -> u8 {
    let (mut v, mask) = if v14 < 0 { (-v14, 0x7F) } else { (v14, 0xFF) };
    if v > ULAW_CLIP {
        v = ULAW_CLIP;
    }
    v += ULAW_BIAS >> 2;
    let seg = search(v, &SEG_UEND);
    if seg >= 8 {
        (0x7F ^ mask) as u8
    } else {
        (((seg << 4) | ((v >> (seg + 1)) & 0xF)) ^ mask) as u8
    }
}

/// Reference μ-law decoder (16-bit result).
const fn ulaw_decode_ref(code: u8) -> i16 {
    let u = !code as i32 & 0xFF;
    let mut t = ((u & 0x0F) << 3) + ULAW_BIAS;
    t <<= (u & 0x70) >> 4;
    (if u & 0x80 != 0 {
        ULAW_BIAS - t
    } else {
        t - ULAW_BIAS
    }) as i16
}

/// Reference A-law encoder on a 13-bit value (the 16-bit sample >> 3).
const fn alaw_encode_13(v13: i32) -> u8 {
    let (v, mask) = if v13 >= 0 {
        (v13, 0xD5)
    } else {
        (-v13 - 1, 0x55)
    };
    let seg = search(v, &SEG_AEND);
    if seg >= 8 {
        (0x7F ^ mask) as u8
    } else {
        let mut a = seg << 4;
        if seg < 2 {
            a |= (v >> 1) & 0xF;
        } else {
            a |= (v >> seg) & 0xF;
        }
        (a ^ mask) as u8
    }
}

/// Reference A-law decoder (16-bit result).
const fn alaw_decode_ref(code: u8) -> i16 {
    let a = (code ^ 0x55) as i32;
    let mut t = (a & 0x0F) << 4;
    let seg = (a & 0x70) >> 4;
    match seg {
        0 => t += 8,
        1 => t += 0x108,
        _ => {
            t += 0x108;
            t <<= seg - 1;
        }
    }
    (if a & 0x80 != 0 { t } else { -t }) as i16
}

const fn build_ulaw_decode() -> [i16; 256] {
    let mut t = [0i16; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = ulaw_decode_ref(i as u8);
        i += 1;
    }
    t
}

const fn build_alaw_decode() -> [i16; 256] {
    let mut t = [0i16; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = alaw_decode_ref(i as u8);
        i += 1;
    }
    t
}

/// Indexed by `(sample >> 2) & 0x3FFF` (two's complement 14-bit).
const fn build_ulaw_encode() -> [u8; 1 << 14] {
    let mut t = [0u8; 1 << 14];
    let mut i = 0;
    while i < (1 << 14) {
        let v = if i >= (1 << 13) {
            i as i32 - (1 << 14)
        } else {
            i as i32
        };
        t[i] = ulaw_encode_14(v);
        i += 1;
    }
    t
}

/// Indexed by `(sample >> 3) & 0x1FFF` (two's complement 13-bit).
const fn build_alaw_encode() -> [u8; 1 << 13] {
    let mut t = [0u8; 1 << 13];
    let mut i = 0;
    while i < (1 << 13) {
        let v = if i >= (1 << 12) {
            i as i32 - (1 << 13)
        } else {
            i as i32
        };
        t[i] = alaw_encode_13(v);
        i += 1;
    }
    t
}

static ULAW_DECODE: [i16; 256] = build_ulaw_decode();
static ALAW_DECODE: [i16; 256] = build_alaw_decode();
static ULAW_ENCODE: [u8; 1 << 14] = build_ulaw_encode();
static ALAW_ENCODE: [u8; 1 << 13] = build_alaw_encode();

/// μ-law code → 16-bit linear.
#[inline]
pub fn ulaw_to_linear(code: u8) -> i16 {
    ULAW_DECODE[code as usize]
}

/// A-law code → 16-bit linear.
#[inline]
pub fn alaw_to_linear(code: u8) -> i16 {
    ALAW_DECODE[code as usize]
}

/// 16-bit linear → μ-law code (G.711).
#[inline]
pub fn linear_to_ulaw(sample: i16) -> u8 {
    ULAW_ENCODE[((sample >> 2) as u16 & 0x3FFF) as usize]
}

/// 16-bit linear → A-law code (G.711).
#[inline]
pub fn linear_to_alaw(sample: i16) -> u8 {
    ALAW_ENCODE[((sample >> 3) as u16 & 0x1FFF) as usize]
}

/// `f32` in [-1, 1) → 16-bit linear (rounded, clamped).
#[inline]
pub fn f32_to_i16(x: f32) -> i16 {
    (x * 32768.0).round().clamp(-32768.0, 32767.0) as i16
}

/// Which G.711 law.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Law {
    /// μ-law (PCMU, RTP payload type 0).
    Mu,
    /// A-law (PCMA, RTP payload type 8).
    A,
}

impl Law {
    /// Decodes `codes` into `out[..codes.len()]` as `f32` in [-1, 1).
    pub fn decode(self, codes: &[u8], out: &mut [f32]) {
        let table = match self {
            Law::Mu => &ULAW_DECODE,
            Law::A => &ALAW_DECODE,
        };
        for (o, &c) in out.iter_mut().zip(codes) {
            *o = table[c as usize] as f32 * (1.0 / 32768.0);
        }
    }

    /// Encodes `pcm` into `out[..pcm.len()]`.
    pub fn encode(self, pcm: &[f32], out: &mut [u8]) {
        match self {
            Law::Mu => {
                for (o, &x) in out.iter_mut().zip(pcm) {
                    *o = linear_to_ulaw(f32_to_i16(x));
                }
            }
            Law::A => {
                for (o, &x) in out.iter_mut().zip(pcm) {
                    *o = linear_to_alaw(f32_to_i16(x));
                }
            }
        }
    }

    /// The code of silence.
    pub fn silence(self) -> u8 {
        match self {
            Law::Mu => ULAW_SILENCE,
            Law::A => ALAW_SILENCE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // Values of the ITU/Sun reference implementation.
        assert_eq!(ulaw_to_linear(0x00), -32124);
        assert_eq!(ulaw_to_linear(0x80), 32124);
        assert_eq!(ulaw_to_linear(0xFF), 0);
        assert_eq!(ulaw_to_linear(0x7F), 0);
        assert_eq!(ulaw_to_linear(0xFE), 8);
        assert_eq!(ulaw_to_linear(0xF0), 120);
        assert_eq!(linear_to_ulaw(0), 0xFF);
        // The reference rounds small negatives away from zero.
        assert_eq!(linear_to_ulaw(-1), 0x7E);
        assert_eq!(linear_to_ulaw(i16::MAX), 0x80);
        assert_eq!(linear_to_ulaw(i16::MIN), 0x00);
        assert_eq!(alaw_to_linear(0xD5), 8);
        assert_eq!(alaw_to_linear(0x55), -8);
        assert_eq!(alaw_to_linear(0xAA), 32256);
        assert_eq!(alaw_to_linear(0x2A), -32256);
        assert_eq!(linear_to_alaw(0), 0xD5);
        assert_eq!(linear_to_alaw(-1), 0x55);
        assert_eq!(linear_to_alaw(i16::MAX), 0xAA);
        assert_eq!(linear_to_alaw(i16::MIN), 0x2A);
    }

    #[test]
    fn every_code_round_trips() {
        for c in 0..=255u8 {
            let back = linear_to_ulaw(ulaw_to_linear(c));
            if c == 0x7F {
                assert_eq!(back, 0xFF, "μ-law negative zero encodes as +0");
            } else {
                assert_eq!(back, c, "μ-law code {c:#04x}");
            }
            assert_eq!(linear_to_alaw(alaw_to_linear(c)), c, "A-law code {c:#04x}");
        }
    }

    #[test]
    fn tables_match_the_reference_on_every_16_bit_input() {
        for s in i16::MIN..=i16::MAX {
            assert_eq!(
                linear_to_ulaw(s),
                ulaw_encode_14(s as i32 >> 2),
                "μ-law {s}"
            );
            assert_eq!(
                linear_to_alaw(s),
                alaw_encode_13(s as i32 >> 3),
                "A-law {s}"
            );
        }
    }

    #[test]
    fn quantisation_error_is_bounded_by_the_segment_step() {
        for s in (i16::MIN..=i16::MAX).step_by(7) {
            let u = ulaw_to_linear(linear_to_ulaw(s)) as i32;
            let a = alaw_to_linear(linear_to_alaw(s)) as i32;
            let mag = (s as i32).abs();
            // Step sizes grow with the segment: 1/16 of the magnitude plus the
            // smallest step, generously.
            let bound = mag / 16 + 40;
            assert!((u - s as i32).abs() <= bound.max(1100), "μ-law {s} → {u}");
            assert!((a - s as i32).abs() <= bound.max(1100), "A-law {s} → {a}");
        }
    }

    #[test]
    fn float_path() {
        let pcm = [0.0f32, 0.5, -0.5, 0.999, -1.0];
        let mut codes = [0u8; 5];
        let mut back = [0f32; 5];
        for law in [Law::Mu, Law::A] {
            law.encode(&pcm, &mut codes);
            law.decode(&codes, &mut back);
            for (a, b) in pcm.iter().zip(back) {
                assert!((a - b).abs() < 0.04, "{law:?}: {a} → {b}");
            }
        }
        assert_eq!(Law::Mu.silence(), 0xFF);
    }
}
