//! Malformed and hostile input to `OggOpusDecoder`: every case is a typed
//! error (or a clean decode), never a panic, never unbounded buffering.

mod codec_common;

use codec_common::*;
use moshid::codec::{CodecError, DecoderConfig, OggOpusDecoder, OpusHeadError, MAX_PACKET_SAMPLES};

fn fixture_pages() -> Vec<Page> {
    split_pages(&fixture_bytes("sphn_sine440_1s"))
}

fn decoder() -> OggOpusDecoder {
    OggOpusDecoder::new(DecoderConfig::default()).unwrap()
}

/// Pushes everything and drains; returns the samples and the first error.
fn run(decoder: &mut OggOpusDecoder, stream: &[u8]) -> (usize, Option<CodecError>) {
    let mut samples = 0;
    if let Err(e) = decoder.push_bytes(stream) {
        return (samples, Some(e));
    }
    loop {
        match decoder.next_pcm() {
            Ok(Some(pcm)) => samples += pcm.len(),
            Ok(None) => return (samples, None),
            Err(e) => return (samples, Some(e)),
        }
    }
}

fn first_error(stream: &[u8]) -> CodecError {
    let mut d = decoder();
    run(&mut d, stream).1.expect("an error")
}

fn head_packet(channels: u8, pre_skip_48k: u16, gain_q8_db: i16) -> Vec<u8> {
    let mut h = b"OpusHead".to_vec();
    h.push(1);
    h.push(channels);
    h.extend_from_slice(&pre_skip_48k.to_le_bytes());
    h.extend_from_slice(&24_000u32.to_le_bytes());
    h.extend_from_slice(&gain_q8_db.to_le_bytes());
    h.push(0);
    h
}

const TAGS: &[u8] = b"OpusTags\x04\x00\x00\x00test\x00\x00\x00\x00";

/// Header pages with the given OpusHead, then `audio` packets one per page.
fn stream_with(head: &[u8], audio: &[&[u8]]) -> Vec<u8> {
    let mut pages = vec![
        Page::with_packets(2, 0, 7, 0, &[head]),
        Page::with_packets(0, 0, 7, 1, &[TAGS]),
    ];
    for (i, p) in audio.iter().enumerate() {
        pages.push(Page::with_packets(
            0,
            1920 * (i as i64 + 1),
            7,
            2 + i as u32,
            &[p],
        ));
    }
    concat_pages(&pages)
}

#[test]
fn bad_capture_pattern_is_detected_from_the_first_bytes() {
    let mut d = decoder();
    d.push_bytes(b"Og").unwrap();
    assert_eq!(d.next_pcm(), Ok(None));
    d.push_bytes(b"X").unwrap();
    assert_eq!(
        d.next_pcm(),
        Err(CodecError::BadCapturePattern { found: *b"OgX\0" })
    );
    assert_eq!(
        first_error(b"GET / HTTP/1.1\r\n"),
        CodecError::BadCapturePattern { found: *b"GET " }
    );
    assert_eq!(
        first_error(b"OggS\x01"),
        CodecError::UnsupportedOggVersion { version: 1 }
    );
    assert_eq!(
        first_error(b"OggS\x00\x08"),
        CodecError::BadHeaderType { header_type: 8 }
    );
}

#[test]
fn garbage_between_pages_is_rejected() {
    let mut stream = concat_pages(&fixture_pages()[..3]);
    stream.extend_from_slice(&[0u8; 5]);
    stream.extend_from_slice(&fixture_pages()[3].to_bytes());
    let mut d = decoder();
    let (samples, err) = run(&mut d, &stream);
    assert_eq!(samples, 0); // the only audio packet lies within the 1920-sample pre-skip
    assert!(
        matches!(err, Some(CodecError::BadCapturePattern { .. })),
        "{err:?}"
    );
}

#[test]
fn crc_mismatch_names_the_page() {
    let mut stream = fixture_bytes("sphn_sine440_1s");
    let pages = fixture_pages();
    let page2_at = pages[0].to_bytes().len() + pages[1].to_bytes().len();
    stream[page2_at + 40] ^= 0x10; // a body byte of page 2
    match first_error(&stream) {
        CodecError::CrcMismatch {
            sequence: 2,
            expected,
            computed,
        } => assert_ne!(expected, computed),
        e => panic!("{e:?}"),
    }
}

#[test]
fn truncated_pages_wait_then_complete_or_fail() {
    let stream = fixture_bytes("sphn_sine440_1s");
    let meta = fixture_meta("sphn_sine440_1s");
    let total = meta["input_samples"].as_u64().unwrap() as usize - 1920;
    // A cut in the middle of a page only waits for more bytes.
    let cut = stream.len() - 50;
    let mut d = decoder();
    let (before, err) = run(&mut d, &stream[..cut]);
    assert_eq!(err, None);
    assert!(d.buffered_bytes() > 0);
    let (after, err) = run(&mut d, &stream[cut..]);
    assert_eq!(err, None);
    assert_eq!(before + after, total);
    assert_eq!(d.buffered_bytes(), 0);

    // A page that lost bytes swallows the next page's start: an error.
    let pages = fixture_pages();
    let mut broken = concat_pages(&pages[..4]);
    let page4 = pages[4].to_bytes();
    broken.extend_from_slice(&page4[..page4.len() - 10]);
    broken.extend_from_slice(&concat_pages(&pages[5..]));
    let err = first_error(&broken);
    assert!(
        matches!(err, CodecError::CrcMismatch { sequence: 4, .. }),
        "{err:?}"
    );
}

#[test]
fn oversized_page_is_refused_before_its_body_arrives() {
    let config = DecoderConfig {
        max_page_bytes: 1000,
        max_buffered_bytes: 4000,
        ..DecoderConfig::default()
    };
    let mut page = Page::with_packets(2, 0, 1, 0, &[&[0u8; 0]]);
    page.lacing = vec![255; 255];
    page.body = vec![0; 255 * 255];
    let bytes = page.to_bytes();
    let mut d = OggOpusDecoder::new(config).unwrap();
    d.push_bytes(&bytes[..27 + 255]).unwrap(); // header and lacing only
    assert_eq!(
        d.next_pcm(),
        Err(CodecError::PageTooLarge {
            page_bytes: 27 + 255 + 255 * 255,
            max_page_bytes: 1000
        })
    );
    assert_eq!(d.next_pcm(), Err(CodecError::StreamFailed));
    assert_eq!(d.push_bytes(b"OggS"), Err(CodecError::StreamFailed));
}

#[test]
fn oversized_packet_across_pages_is_refused() {
    let config = DecoderConfig {
        max_packet_bytes: 4096,
        ..DecoderConfig::default()
    };
    let head = head_packet(1, 0, 0);
    let mut pages = vec![
        Page::with_packets(2, 0, 7, 0, &[&head]),
        Page::with_packets(0, 0, 7, 1, &[TAGS]),
    ];
    for i in 0..3u32 {
        let flags = if i == 0 { 0 } else { 1 };
        pages.push(Page {
            header_type: flags,
            granule: -1,
            serial: 7,
            sequence: 2 + i,
            lacing: vec![255; 10],
            body: vec![0x0b; 2550],
        });
    }
    let mut d = OggOpusDecoder::new(config).unwrap();
    let (_, err) = run(&mut d, &concat_pages(&pages));
    assert_eq!(
        err,
        Some(CodecError::PacketTooLarge {
            max_packet_bytes: 4096
        })
    );
}

#[test]
fn header_packets_are_required_and_validated() {
    let pages = fixture_pages();
    // No OpusHead: the stream starts with the tags page.
    assert_eq!(
        first_error(&concat_pages(&pages[1..])),
        CodecError::MissingOpusHead
    );
    // Audio right after the head.
    let mut no_tags = pages.clone();
    no_tags.remove(1);
    for (i, p) in no_tags.iter_mut().enumerate() {
        p.sequence = i as u32;
    }
    assert_eq!(
        first_error(&concat_pages(&no_tags)),
        CodecError::MissingOpusTags
    );

    let audio: &[u8] = &page_packets(&pages[2])[0];
    let bad = |mutate: fn(&mut Vec<u8>)| {
        let mut h = head_packet(1, 0, 0);
        mutate(&mut h);
        first_error(&stream_with(&h, &[audio]))
    };
    assert_eq!(
        bad(|h| h[9] = 3),
        CodecError::BadOpusHead(OpusHeadError::UnsupportedChannelCount { channel_count: 3 })
    );
    assert_eq!(
        bad(|h| h[9] = 0),
        CodecError::BadOpusHead(OpusHeadError::UnsupportedChannelCount { channel_count: 0 })
    );
    assert_eq!(
        bad(|h| h[18] = 1),
        CodecError::BadOpusHead(OpusHeadError::UnsupportedMappingFamily { family: 1 })
    );
    assert_eq!(
        bad(|h| h[8] = 0x10),
        CodecError::BadOpusHead(OpusHeadError::UnsupportedVersion { version: 0x10 })
    );
    assert_eq!(
        bad(|h| h.truncate(12)),
        CodecError::BadOpusHead(OpusHeadError::TooShort { len_bytes: 12 })
    );
}

#[test]
fn ogg_structure_violations() {
    let pages = fixture_pages();
    // Sequence gap (page 3 lost).
    let mut gap = pages.clone();
    gap.remove(3);
    assert_eq!(
        first_error(&concat_pages(&gap)),
        CodecError::SequenceGap {
            expected: 3,
            found: 4
        }
    );
    // A page of another logical stream.
    let mut other = pages.clone();
    other[3].serial = 43;
    assert_eq!(
        first_error(&concat_pages(&other)),
        CodecError::UnexpectedSerial {
            expected: 42,
            found: 43
        }
    );
    // Continued-packet flag without a pending packet.
    let mut cont = pages.clone();
    cont[3].header_type = 1;
    assert_eq!(
        first_error(&concat_pages(&cont)),
        CodecError::ContinuationMismatch {
            sequence: 3,
            page_continued: true,
            packet_pending: false
        }
    );
    // A pending packet (page ends in a 255 lacing) but the next page is not continued.
    let mut pend = pages.clone();
    pend[3].lacing.push(255);
    pend[3].body.extend_from_slice(&[0; 255]);
    assert_eq!(
        first_error(&concat_pages(&pend)),
        CodecError::ContinuationMismatch {
            sequence: 4,
            page_continued: false,
            packet_pending: true
        }
    );
    // Pages after the end of stream.
    let mut eos = pages.clone();
    eos[3].header_type = 4;
    assert_eq!(
        first_error(&concat_pages(&eos)),
        CodecError::PageAfterEndOfStream { sequence: 4 }
    );
}

#[test]
fn bad_audio_packets() {
    let head = head_packet(1, 0, 0);
    assert_eq!(
        first_error(&stream_with(&head, &[&[]])),
        CodecError::EmptyPacket
    );
    // TOC code 3 (arbitrary frame count) announcing 0 frames: invalid.
    match first_error(&stream_with(&head, &[&[0x03, 0x00]])) {
        CodecError::OpusDecode(f) => assert_eq!(f.code, opus::ErrorCode::InvalidPacket),
        e => panic!("{e:?}"),
    }
}

#[test]
fn buffer_full_refuses_the_chunk_and_keeps_the_stream() {
    let config = DecoderConfig {
        max_page_bytes: 1000,
        max_buffered_bytes: 1000,
        ..DecoderConfig::default()
    };
    let stream = fixture_bytes("sphn_sine440_1s");
    let mut d = OggOpusDecoder::new(config).unwrap();
    assert!(
        matches!(d.push_bytes(&stream), Err(CodecError::BufferFull { incoming_bytes, .. }) if incoming_bytes == stream.len())
    );
    // Smaller chunks, drained in between, go through.
    let mut samples = 0;
    for chunk in stream.chunks(500) {
        d.push_bytes(chunk).unwrap();
        while let Some(pcm) = d.next_pcm().unwrap() {
            samples += pcm.len();
        }
    }
    assert_eq!(samples, 13 * 1920 - 1920);
    assert!(OggOpusDecoder::new(DecoderConfig {
        max_page_bytes: 2000,
        max_buffered_bytes: 1000,
        ..config
    })
    .is_err());
}

#[test]
fn chained_streams_restart_the_headers() {
    let one = fixture_bytes("sphn_sine440_1s");
    let mut second = fixture_pages();
    for p in &mut second {
        p.serial = 99;
    }
    let stream = [one.clone(), concat_pages(&second), one].concat();
    let mut d = decoder();
    let (samples, err) = run(&mut d, &stream);
    assert_eq!(err, None);
    assert_eq!(samples, 3 * (13 * 1920 - 1920));
}

#[test]
fn stereo_is_downmixed_and_gain_applied() {
    let original = signal("sine440", 12 * 960);
    let mut enc =
        opus::Encoder::new(24_000, opus::Channels::Stereo, opus::Application::Audio).unwrap();
    let mut packets = Vec::new();
    for chunk in original.chunks_exact(960) {
        let interleaved: Vec<f32> = chunk.iter().flat_map(|&s| [s, s]).collect();
        packets.push(enc.encode_vec_float(&interleaved, 4000).unwrap());
    }
    let refs: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
    let decode = |gain_q8_db: i16| {
        let mut d = decoder();
        d.push_bytes(&stream_with(&head_packet(2, 0, gain_q8_db), &refs))
            .unwrap();
        let mut out = Vec::new();
        while let Some(pcm) = d.next_pcm().unwrap() {
            out.extend_from_slice(pcm);
        }
        assert_eq!(d.head().unwrap().channel_count, 2);
        out
    };
    let plain = decode(0);
    assert_eq!(plain.len(), original.len());
    let m = best_match(
        &plain,
        &[vec![0f32; 400], original.clone()].concat(),
        400,
        1920,
    );
    assert!(m.correlation > 0.99, "{m:?}");
    // -6.02 dB in Q7.8 halves the amplitude.
    let quiet = decode(-1541);
    let ratio: f64 = quiet[1920..]
        .iter()
        .zip(&plain[1920..])
        .map(|(&q, &p)| f64::from(q) * f64::from(p))
        .sum::<f64>()
        / plain[1920..]
            .iter()
            .map(|&p| f64::from(p) * f64::from(p))
            .sum::<f64>();
    assert!((ratio - 0.5).abs() < 0.01, "gain ratio {ratio}");
}

/// Random bytes, random chunking, small limits: no panics, bounded output.
#[test]
fn fuzz_random_bytes() {
    let mut rng = Rng::new(1);
    let config = DecoderConfig {
        max_page_bytes: 4096,
        max_packet_bytes: 2048,
        max_buffered_bytes: 8192,
        trim_pre_skip: true,
    };
    let mut errors = 0;
    for _ in 0..5000 {
        let len = rng.range(0, 600);
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        if rng.range(0, 1) == 1 && len >= 4 {
            bytes[..4].copy_from_slice(b"OggS"); // get past the capture pattern
        }
        let mut d = OggOpusDecoder::new(config).unwrap();
        let mut pos = 0;
        while pos < bytes.len() {
            let n = rng.range(1, 64).min(bytes.len() - pos);
            if d.push_bytes(&bytes[pos..pos + n]).is_err() {
                errors += 1;
                break;
            }
            pos += n;
            match d.next_pcm() {
                Ok(Some(pcm)) => assert!(pcm.len() <= MAX_PACKET_SAMPLES),
                Ok(None) => {}
                Err(_) => {
                    errors += 1;
                    break;
                }
            }
            assert!(d.buffered_bytes() <= config.max_buffered_bytes);
        }
    }
    assert!(errors > 4000, "{errors}");
}

/// Mutations of a valid stream with CRCs recomputed, so that damage reaches
/// the packet, header and libopus layers: no panics, bounded output.
#[test]
fn fuzz_mutated_streams_with_valid_crcs() {
    let pages = split_pages(&fixture_bytes("sphn_chirp_2s"));
    let mut rng = Rng::new(2);
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..3000 {
        let mut p = pages.clone();
        for _ in 0..rng.range(1, 4) {
            let i = rng.range(0, p.len() - 1);
            match rng.range(0, 7) {
                0..=2 => {
                    if !p[i].body.is_empty() {
                        let j = rng.range(0, p[i].body.len() - 1);
                        p[i].body[j] = rng.next_u64() as u8;
                    }
                }
                3 => {
                    if !p[i].lacing.is_empty() {
                        let j = rng.range(0, p[i].lacing.len() - 1);
                        p[i].lacing[j] = rng.next_u64() as u8;
                    }
                }
                4 => p[i].header_type = rng.range(0, 7) as u8,
                5 => p[i].sequence = rng.next_u64() as u32 % 64,
                6 => {
                    let n = rng.range(0, p[i].body.len());
                    p[i].body.truncate(n);
                }
                _ => p[i].granule = rng.next_u64() as i64,
            }
        }
        let stream = concat_pages(&p);
        let mut d = OggOpusDecoder::new(DecoderConfig {
            max_packet_bytes: 1024,
            ..DecoderConfig::default()
        })
        .unwrap();
        let mut pos = 0;
        let mut result = Ok(());
        'feed: while pos < stream.len() {
            let n = rng.range(1, 700).min(stream.len() - pos);
            if let Err(e) = d.push_bytes(&stream[pos..pos + n]) {
                result = Err(e);
                break;
            }
            pos += n;
            loop {
                match d.next_pcm() {
                    Ok(Some(pcm)) => {
                        assert!(!pcm.is_empty() && pcm.len() <= MAX_PACKET_SAMPLES);
                        assert!(pcm.iter().all(|s| s.is_finite()));
                    }
                    Ok(None) => break,
                    Err(e) => {
                        result = Err(e);
                        break 'feed;
                    }
                }
            }
        }
        match result {
            Ok(()) => ok += 1,
            Err(_) => failed += 1,
        }
    }
    println!("mutated streams: {ok} decoded, {failed} rejected");
    assert!(ok > 100 && failed > 100, "{ok} / {failed}");
}

/// Non-finite answer samples (a model fault's NaN, an overflow's inf) are
/// encoded as silence: the same bytes as the frame with 0 in their place,
/// whether one packet of the frame holds them or both.
#[test]
fn encoder_encodes_non_finite_samples_as_zero() {
    use moshid::codec::{EncoderConfig, OggOpusEncoder, FRAME_SAMPLES};
    let clean: Vec<f32> = (0..FRAME_SAMPLES)
        .map(|i| 0.3 * (i as f32 * 0.05).sin())
        .collect();
    let mut dirty = clean.clone();
    let mut zeroed = clean.clone();
    for (i, bad) in [
        (3, f32::NAN),
        (1500, f32::INFINITY),
        (1919, f32::NEG_INFINITY),
    ] {
        dirty[i] = bad;
        zeroed[i] = 0.0;
    }
    let encode = |frames: &[&[f32]]| {
        let mut enc = OggOpusEncoder::new(EncoderConfig::default()).unwrap();
        let mut out = vec![0u8; enc.max_output_bytes_per_frame()];
        let mut all = Vec::new();
        for f in frames {
            let f: &[f32; FRAME_SAMPLES] = (*f).try_into().unwrap();
            let n = enc.encode_frame(f, &mut out).unwrap();
            all.extend_from_slice(&out[..n]);
        }
        all
    };
    assert_eq!(
        encode(&[&clean, &dirty, &clean]),
        encode(&[&clean, &zeroed, &clean])
    );
    assert_ne!(encode(&[&clean, &clean]), encode(&[&clean, &zeroed]));
}
