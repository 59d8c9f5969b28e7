//! Interop of `moshid::codec` with Kyutai's `sphn` Ogg Opus streams.
//!
//! Fixtures in `tests/data` were written by `sphn.OpusStreamWriter` (see
//! `make_ogg_fixtures.py`); the last test runs sphn itself, in the tests'
//! Python (`scripts/setup --tests` installs sphn there): without it the
//! test fails, unless `MOSHID_SKIP` names sphn.

mod codec_common;

use codec_common::*;
use moshid::codec::{
    DecoderConfig, EncoderConfig, OggOpusDecoder, OggOpusEncoder, ENCODER_PACKET_SAMPLES,
    FRAME_SAMPLES,
};
use moshid_testkit::peers::{need_python, python};

const FIXTURES: [&str; 2] = ["sphn_sine440_1s", "sphn_chirp_2s"];
/// Lowest acceptable (correlation, SNR dB) against the original signal. Opus
/// (VOIP mode, ~25 kbit/s) keeps a sine nearly intact (measured 0.998 / 24 dB)
/// but smears a 200 Hz - 4 kHz chirp (measured 0.89 / 5.9 dB, same in sphn).
fn quality_floor(kind: &str) -> (f64, f64) {
    match kind {
        "sine440" => (0.99, 20.0),
        _ => (0.85, 4.5),
    }
}

/// libopus's lookahead at 24 kHz is 156 samples, but the measured delay
/// depends a little on the coding mode (SILK/hybrid vs CELT): allow a few.
const LAG_TOLERANCE: usize = 3;

/// A pure tone matches equally well one period (24000 / 440 samples) later,
/// so its lag only says something modulo the period.
fn lag_ok(kind: &str, lag: usize, expected: usize) -> bool {
    if kind == "sine440" {
        let period = 24_000.0 / 440.0;
        let off = (lag as f64 - expected as f64).rem_euclid(period);
        off.min(period - off) <= LAG_TOLERANCE as f64
    } else {
        lag.abs_diff(expected) <= LAG_TOLERANCE
    }
}

struct Fixture {
    kind: String,
    stream: Vec<u8>,
    original: Vec<f32>,
    sphn_decoded_samples: usize,
    sphn_decoded_rms: f64,
}

fn load(name: &str) -> Fixture {
    let meta = fixture_meta(name);
    let input_samples = meta["input_samples"].as_u64().unwrap() as usize;
    Fixture {
        kind: meta["signal"].as_str().unwrap().to_string(),
        stream: fixture_bytes(name),
        original: signal(meta["signal"].as_str().unwrap(), input_samples),
        sphn_decoded_samples: meta["sphn_decoded_samples"].as_u64().unwrap() as usize,
        sphn_decoded_rms: meta["sphn_decoded_rms"].as_f64().unwrap(),
    }
}

fn no_trim() -> DecoderConfig {
    DecoderConfig {
        trim_pre_skip: false,
        ..DecoderConfig::default()
    }
}

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64).sqrt()
}

#[test]
fn sphn_fixture_layout_is_what_the_encoder_mimics() {
    // One packet per page, two 40 ms packets per 80 ms frame, granule in
    // cumulative 48 kHz samples, OpusHead pre-skip 3840.
    for name in FIXTURES {
        let pages = split_pages(&fixture_bytes(name));
        assert_eq!(pages[0].header_type, 0x02);
        assert!(page_packets(&pages[0])[0].starts_with(b"OpusHead"));
        assert!(page_packets(&pages[1])[0].starts_with(b"OpusTags"));
        for (i, page) in pages.iter().enumerate() {
            assert_eq!(page.sequence, i as u32);
            assert_eq!(page.serial, 42);
            assert_eq!(page_packets(page).len(), 1);
        }
        for (k, page) in pages[2..].iter().enumerate() {
            assert_eq!(page.header_type, 0);
            assert_eq!(page.granule, 1920 * (k as i64 + 1));
            let packet = &page_packets(page)[0];
            assert_eq!(
                opus::packet::get_nb_samples(packet, 24_000).unwrap(),
                ENCODER_PACKET_SAMPLES
            );
        }
    }
}

#[test]
fn decodes_sphn_fixtures_in_any_chunking() {
    for name in FIXTURES {
        let fx = load(name);
        let whole = decode_chunked(&fx.stream, no_trim(), || usize::MAX).unwrap();
        // Same sample count and level as sphn's own reader (which does not trim).
        assert_eq!(whole.len(), fx.sphn_decoded_samples, "{name}");
        let level = rms(&whole);
        assert!(
            (level - fx.sphn_decoded_rms).abs() < 1e-3 * fx.sphn_decoded_rms.max(1e-3),
            "{name}: rms {level} vs sphn {}",
            fx.sphn_decoded_rms
        );

        // Chunking never changes the output.
        let mut rng = Rng::new(0x5eed);
        for pcm in [
            decode_chunked(&fx.stream, no_trim(), || 1).unwrap(),
            decode_chunked(&fx.stream, no_trim(), || 7).unwrap(),
            decode_chunked(&fx.stream, no_trim(), || rng.range(1, 600)).unwrap(),
        ] {
            assert_eq!(pcm, whole, "{name}");
        }

        // With pre-skip trimming: 3840 / 2 samples fewer, same audio after it.
        let trimmed = decode_chunked(&fx.stream, DecoderConfig::default(), || 7).unwrap();
        assert_eq!(trimmed.len(), fx.original.len() - 3840 / 2, "{name}");
        assert_eq!(&trimmed[..], &whole[1920..], "{name}");

        // The audio is the original signal, delayed by the encoder lookahead.
        // decoded[i] ~ original[i - 156]: match against the original padded by 400.
        let m = best_match(
            &whole,
            &[vec![0f32; 400], fx.original.clone()].concat(),
            400,
            1920,
        );
        println!("{name}: {m:?}");
        assert!(lag_ok(&fx.kind, m.lag, 400 - 156), "{name}: {m:?}");
        let (min_correlation, min_snr_db) = quality_floor(&fx.kind);
        assert!(
            m.correlation > min_correlation && m.snr_db > min_snr_db,
            "{name}: {m:?}"
        );
    }
}

fn encode_signal(original: &[f32]) -> (Vec<u8>, Vec<usize>) {
    let mut encoder = OggOpusEncoder::new(EncoderConfig::default()).unwrap();
    let mut out = vec![0u8; encoder.max_output_bytes_per_frame()];
    let mut stream = Vec::new();
    let mut message_bytes = Vec::new();
    for frame in original.chunks_exact(FRAME_SAMPLES) {
        let n = encoder
            .encode_frame(frame.try_into().unwrap(), &mut out)
            .unwrap();
        assert!(n > 0);
        message_bytes.push(n);
        stream.extend_from_slice(&out[..n]);
    }
    (stream, message_bytes)
}

#[test]
fn encoder_output_has_sphn_layout() {
    let original = signal("sine440", 13 * FRAME_SAMPLES);
    let (stream, message_bytes) = encode_signal(&original);
    let pages = split_pages(&stream);
    assert_eq!(pages.len(), 2 + 2 * 13);
    assert_eq!(pages[0].header_type, 0x02);
    let head = &page_packets(&pages[0])[0];
    assert_eq!(&head[..8], b"OpusHead");
    assert_eq!(head.len(), 19);
    assert_eq!((head[8], head[9], head[18]), (1, 1, 0));
    assert_eq!(
        u16::from_le_bytes([head[10], head[11]]),
        312,
        "pre-skip = libopus lookahead at 48 kHz"
    );
    assert!(page_packets(&pages[1])[0].starts_with(b"OpusTags"));
    for (i, page) in pages.iter().enumerate() {
        assert_eq!(page.sequence, i as u32);
        assert_eq!(page.serial, 42);
        assert_eq!(page_packets(page).len(), 1);
        if i >= 2 {
            assert_eq!(page.header_type, 0);
            assert_eq!(page.granule, 1920 * (i as i64 - 1));
            let packet = &page_packets(page)[0];
            assert_eq!(
                opus::packet::get_nb_samples(packet, 24_000).unwrap(),
                ENCODER_PACKET_SAMPLES
            );
        } else {
            assert_eq!(page.granule, 0);
        }
    }
    // The first message carries the two header pages too.
    assert_eq!(message_bytes.len(), 13);
    let header_bytes = 28 + 19 + 28 + 22;
    assert!(message_bytes[0] > header_bytes);

    // The `ogg` crate (independent parser, checks CRCs) reads the same packets.
    let mut reader = ogg::PacketReader::new(std::io::Cursor::new(stream.clone()));
    let mut n_packets = 0;
    while let Some(p) = reader.read_packet().unwrap() {
        let page = &pages[n_packets];
        assert_eq!(p.data, page_packets(page)[0]);
        assert_eq!(p.absgp_page(), page.granule as u64);
        n_packets += 1;
    }
    assert_eq!(n_packets, pages.len());
}

#[test]
fn encoder_round_trips_through_decoder() {
    for kind in ["sine440", "chirp"] {
        let original = signal(kind, 25 * FRAME_SAMPLES);
        let (stream, _) = encode_signal(&original);
        let decoded = decode_chunked(&stream, DecoderConfig::default(), || 13).unwrap();
        // Pre-skip is the real lookahead, so trimmed output is time-aligned.
        assert_eq!(decoded.len(), original.len() - 312 / 2, "{kind}");
        let m = best_match(&decoded, &original, 20, 1920);
        println!("{kind}: {m:?}");
        assert!(lag_ok(kind, m.lag, 0), "{kind}: {m:?}");
        let (min_correlation, min_snr_db) = quality_floor(kind);
        assert!(
            m.correlation > min_correlation && m.snr_db > min_snr_db,
            "{kind}: {m:?}"
        );
    }
}

#[test]
fn encoder_matches_sphn_packets_when_libopus_matches() {
    // sphn 0.2.1 bundles libopus 1.3.1, as does this machine. With equal
    // libopus builds the packets are byte-identical; otherwise only report.
    for name in FIXTURES {
        let fx = load(name);
        let (stream, _) = encode_signal(&fx.original);
        let ours = split_pages(&stream);
        let theirs = split_pages(&fx.stream);
        assert_eq!(ours.len(), theirs.len());
        let same = ours[2..]
            .iter()
            .zip(&theirs[2..])
            .filter(|(a, b)| a.body == b.body)
            .count();
        let first_diff = ours[2..]
            .iter()
            .zip(&theirs[2..])
            .position(|(a, b)| a.body != b.body);
        println!(
            "{name}: {same} of {} audio packets byte-identical to sphn's (first difference: {first_diff:?}; {})",
            ours.len() - 2,
            opus::version()
        );
    }
}

#[test]
fn decoder_is_stable_when_reused() {
    let fx = load(FIXTURES[0]);
    let mut decoder = OggOpusDecoder::new(no_trim()).unwrap();
    let mut first = Vec::new();
    for round in 0..2 {
        let mut out = Vec::new();
        decoder.push_bytes(&fx.stream).unwrap();
        while let Some(pcm) = decoder.next_pcm().unwrap() {
            out.extend_from_slice(pcm);
        }
        assert_eq!(decoder.head().unwrap().pre_skip_48k, 3840);
        if round == 0 {
            first = out;
        } else {
            assert_eq!(out, first);
        }
        decoder.reset().unwrap();
    }
}

/// sphn (Kyutai's Python reader, used by the official server and client)
/// reads what our encoder writes. Runs only where python3 can import sphn.
#[test]
fn sphn_reads_our_encoder_output() {
    if !need_python("sphn") || !need_python("numpy") {
        return;
    }
    for kind in ["sine440", "chirp"] {
        let original = signal(kind, 25 * FRAME_SAMPLES);
        let (stream, message_bytes) = encode_signal(&original);
        let dir = tempfile::tempdir().unwrap();
        let ogg_path = dir.path().join("ours.ogg");
        let pcm_path = dir.path().join("sphn.f32");
        std::fs::write(&ogg_path, &stream).unwrap();
        let sizes: Vec<String> = message_bytes.iter().map(|n| n.to_string()).collect();
        // Feed message by message, as the official client does with our output.
        let script = format!(
            "import sphn, numpy as np\n\
             data = open({ogg:?}, 'rb').read()\n\
             sizes = [{sizes}]\n\
             r = sphn.OpusStreamReader(24000)\n\
             out = []\n\
             pos = 0\n\
             for n in sizes:\n    \
                 out.append(np.asarray(r.append_bytes(data[pos:pos + n]), dtype=np.float32))\n    \
                 pos += n\n\
             np.concatenate(out).astype('<f4').tofile({pcm:?})\n",
            ogg = ogg_path.to_str().unwrap(),
            pcm = pcm_path.to_str().unwrap(),
            sizes = sizes.join(", "),
        );
        let run = std::process::Command::new(python())
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "sphn failed: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let raw = std::fs::read(&pcm_path).unwrap();
        let decoded: Vec<f32> = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        // sphn neither trims pre-skip nor compensates delay: 1920 out per frame in,
        // delayed by the 156-sample lookahead.
        assert_eq!(decoded.len(), original.len());
        let m = best_match(
            &decoded,
            &[vec![0f32; 200], original.clone()].concat(),
            200,
            1920,
        );
        println!("sphn decoding our {kind}: {m:?}");
        assert!(lag_ok(kind, m.lag, 200 - 156), "{kind}: {m:?}");
        let (min_correlation, min_snr_db) = quality_floor(kind);
        assert!(
            m.correlation > min_correlation && m.snr_db > min_snr_db,
            "{kind}: {m:?}"
        );
    }
}
