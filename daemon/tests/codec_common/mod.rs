//! Helpers shared by the codec integration tests (not a test crate itself).
//! The Ogg page code here is written independently of `moshid::codec` (its
//! own bit-by-bit CRC), so that the tests check the codec against it.
#![allow(dead_code)]

use moshid::codec::{CodecError, DecoderConfig, OggOpusDecoder, SAMPLE_RATE_HZ};

pub const FIXTURE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");

pub fn fixture_bytes(name: &str) -> Vec<u8> {
    std::fs::read(format!("{FIXTURE_DIR}/{name}.ogg")).expect("fixture .ogg")
}

pub fn fixture_meta(name: &str) -> serde_json::Value {
    let text =
        std::fs::read_to_string(format!("{FIXTURE_DIR}/{name}.json")).expect("fixture .json");
    serde_json::from_str(&text).expect("fixture json")
}

/// Same formulas as `tests/data/make_ogg_fixtures.py::signal`.
pub fn signal(kind: &str, n_samples: usize) -> Vec<f32> {
    let rate = f64::from(SAMPLE_RATE_HZ);
    let duration_s = n_samples as f64 / rate;
    (0..n_samples)
        .map(|i| {
            let t = i as f64 / rate;
            let x = match kind {
                "sine440" => 0.5 * (2.0 * std::f64::consts::PI * 440.0 * t).sin(),
                "chirp" => {
                    let (f0, f1) = (200.0, 4000.0);
                    let k = (f1 - f0) / duration_s;
                    0.4 * (2.0 * std::f64::consts::PI * (f0 * t + 0.5 * k * t * t)).sin()
                }
                _ => panic!("unknown signal {kind}"),
            };
            x as f32
        })
        .collect()
}

/// Deterministic xorshift64* generator (no external crates).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
}

/// Feeds `stream` to a fresh decoder in chunks whose sizes are drawn by
/// `next_chunk`, draining after each push; returns all PCM or the first error.
pub fn decode_chunked(
    stream: &[u8],
    config: DecoderConfig,
    mut next_chunk: impl FnMut() -> usize,
) -> Result<Vec<f32>, CodecError> {
    let mut decoder = OggOpusDecoder::new(config)?;
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < stream.len() {
        let n = next_chunk().clamp(1, stream.len() - pos);
        decoder.push_bytes(&stream[pos..pos + n])?;
        pos += n;
        while let Some(pcm) = decoder.next_pcm()? {
            assert!(!pcm.is_empty());
            out.extend_from_slice(pcm);
        }
    }
    Ok(out)
}

/// How well `decoded` matches `reference` delayed by some lag in
/// `0..=max_lag` (decoded[i] ~ reference[i + lag]), skipping `warmup` samples.
#[derive(Debug, Clone, Copy)]
pub struct Match {
    pub lag: usize,
    pub correlation: f64,
    pub snr_db: f64,
}

pub fn best_match(decoded: &[f32], reference: &[f32], max_lag: usize, warmup: usize) -> Match {
    let mut best = Match {
        lag: 0,
        correlation: f64::MIN,
        snr_db: f64::MIN,
    };
    for lag in 0..=max_lag {
        let n = decoded.len().min(reference.len().saturating_sub(lag));
        if n <= warmup + 100 {
            continue;
        }
        let d = &decoded[warmup..n];
        let r = &reference[warmup + lag..n + lag];
        let (mut dr, mut dd, mut rr) = (0f64, 0f64, 0f64);
        for (&a, &b) in d.iter().zip(r) {
            let (a, b) = (f64::from(a), f64::from(b));
            dr += a * b;
            dd += a * a;
            rr += b * b;
        }
        let correlation = dr / (dd * rr).sqrt().max(1e-12);
        if correlation > best.correlation {
            // SNR of decoded against the best-scaled reference.
            let gain = dr / rr.max(1e-12);
            let noise: f64 = d
                .iter()
                .zip(r)
                .map(|(&a, &b)| (f64::from(a) - gain * f64::from(b)).powi(2))
                .sum();
            let snr_db = 10.0 * (gain * gain * rr / noise.max(1e-12)).log10();
            best = Match {
                lag,
                correlation,
                snr_db,
            };
        }
    }
    best
}

/// Bit-by-bit Ogg CRC (independent of the codec's table version).
pub fn ogg_crc(bytes: &[u8]) -> u32 {
    let mut crc = 0u32;
    for &b in bytes {
        crc ^= u32::from(b) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04c1_1db7
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A page as the tests build or see it.
#[derive(Debug, Clone)]
pub struct Page {
    pub header_type: u8,
    pub granule: i64,
    pub serial: u32,
    pub sequence: u32,
    pub lacing: Vec<u8>,
    pub body: Vec<u8>,
}

impl Page {
    /// One page per packet list, lacing computed (packets must fit one page).
    pub fn with_packets(
        header_type: u8,
        granule: i64,
        serial: u32,
        sequence: u32,
        packets: &[&[u8]],
    ) -> Self {
        let mut lacing = Vec::new();
        let mut body = Vec::new();
        for p in packets {
            lacing.extend(std::iter::repeat_n(255u8, p.len() / 255));
            lacing.push((p.len() % 255) as u8);
            body.extend_from_slice(p);
        }
        Self {
            header_type,
            granule,
            serial,
            sequence,
            lacing,
            body,
        }
    }

    /// Serialises with a correct CRC.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(27 + self.lacing.len() + self.body.len());
        out.extend_from_slice(b"OggS");
        out.push(0);
        out.push(self.header_type);
        out.extend_from_slice(&self.granule.to_le_bytes());
        out.extend_from_slice(&self.serial.to_le_bytes());
        out.extend_from_slice(&self.sequence.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.push(self.lacing.len() as u8);
        out.extend_from_slice(&self.lacing);
        out.extend_from_slice(&self.body);
        let crc = ogg_crc(&out);
        out[22..26].copy_from_slice(&crc.to_le_bytes());
        out
    }
}

/// Splits a well-formed stream into pages (panics on malformed input: only
/// for streams the tests trust).
pub fn split_pages(stream: &[u8]) -> Vec<Page> {
    let mut pages = Vec::new();
    let mut pos = 0;
    while pos < stream.len() {
        let p = &stream[pos..];
        assert_eq!(&p[..4], b"OggS", "capture pattern at {pos}");
        let n_seg = p[26] as usize;
        let lacing = p[27..27 + n_seg].to_vec();
        let body_len: usize = lacing.iter().map(|&l| l as usize).sum();
        let crc = u32::from_le_bytes(p[22..26].try_into().unwrap());
        let mut zeroed = p[..27 + n_seg + body_len].to_vec();
        zeroed[22..26].fill(0);
        assert_eq!(crc, ogg_crc(&zeroed), "CRC of page at {pos}");
        pages.push(Page {
            header_type: p[5],
            granule: i64::from_le_bytes(p[6..14].try_into().unwrap()),
            serial: u32::from_le_bytes(p[14..18].try_into().unwrap()),
            sequence: u32::from_le_bytes(p[18..22].try_into().unwrap()),
            body: p[27 + n_seg..27 + n_seg + body_len].to_vec(),
            lacing,
        });
        pos += 27 + n_seg + body_len;
    }
    pages
}

/// Packets of a page whose packets all complete on it.
pub fn page_packets(page: &Page) -> Vec<Vec<u8>> {
    let mut packets = Vec::new();
    let mut cur = Vec::new();
    let mut pos = 0;
    for &l in &page.lacing {
        cur.extend_from_slice(&page.body[pos..pos + l as usize]);
        pos += l as usize;
        if l < 255 {
            packets.push(std::mem::take(&mut cur));
        }
    }
    packets
}

pub fn concat_pages(pages: &[Page]) -> Vec<u8> {
    pages.iter().flat_map(Page::to_bytes).collect()
}
