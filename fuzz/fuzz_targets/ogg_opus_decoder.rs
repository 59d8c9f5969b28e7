//! The Ogg Opus demuxer and decoder: arbitrary bytes, pushed in arbitrary
//! splits. Input: `[flags, split_seed, stream...]`; flags bit 0 rewrites the
//! page CRCs (to get past them), bit 1 trims the pre-skip.
//!
//! Checked: no panic; the input buffer stays within its bound; every PCM
//! packet fits the frame cutter's spare room (`MAX_PACKET_SAMPLES`), which
//! the WebSocket session relies on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid::codec::{DecoderConfig, OggOpusDecoder, MAX_PACKET_SAMPLES};
use moshid_fuzz::{chunks, fix_ogg_crcs};

fuzz_target!(|data: &[u8]| {
    let [flags, seed, stream @ ..] = data else {
        return;
    };
    let mut stream = stream.to_vec();
    if flags & 1 != 0 {
        fix_ogg_crcs(&mut stream);
    }
    let config = DecoderConfig {
        // As the WebSocket session sets it (64 KiB messages).
        max_buffered_bytes: 64 * 1024 + DecoderConfig::default().max_page_bytes,
        trim_pre_skip: flags & 2 != 0,
        ..DecoderConfig::default()
    };
    let mut dec = OggOpusDecoder::new(config).expect("valid config");
    for chunk in chunks(&stream, *seed) {
        if dec.push_bytes(chunk).is_err() {
            return; // errors are final for the stream
        }
        assert!(dec.buffered_bytes() <= config.max_buffered_bytes);
        loop {
            match dec.next_pcm() {
                Ok(Some(pcm)) => assert!(
                    pcm.len() <= MAX_PACKET_SAMPLES,
                    "{} samples in one packet",
                    pcm.len()
                ),
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
