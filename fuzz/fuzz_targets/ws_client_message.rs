//! `/api/chat` client messages: kind byte first (0x01 Ogg Opus audio, 0x03
//! 0x01 end of input, others ignored, empty refused), run through the session's input path as
//! `transport::ws_chat` does: decode, cut 80 ms frames.
//! Input: `[flags, (u16 length, message)...]`; flags bit 0 rewrites the Ogg
//! CRCs inside each message.
//!
//! Checked: no panic; the frame cutter always takes a whole decoded packet
//! (the session treats the opposite as impossible).
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid::codec::{
    DecoderConfig, FrameCutter, OggOpusDecoder, FRAME_SAMPLES, MAX_PACKET_SAMPLES,
};
use moshid::protocol::{parse_client_message, ClientMessage};
use moshid_fuzz::{fix_ogg_crcs, messages};

fuzz_target!(|data: &[u8]| {
    let [flags, rest @ ..] = data else { return };
    let config = DecoderConfig {
        max_buffered_bytes: 64 * 1024 + DecoderConfig::default().max_page_bytes,
        trim_pre_skip: false,
        ..DecoderConfig::default()
    };
    let mut dec = OggOpusDecoder::new(config).expect("valid config");
    let mut cutter = FrameCutter::new(FRAME_SAMPLES + MAX_PACKET_SAMPLES).expect("valid size");
    let mut frame = Box::new([0f32; FRAME_SAMPLES]);
    for msg in messages(rest) {
        let mut msg = msg.to_vec();
        if flags & 1 != 0 {
            fix_ogg_crcs(&mut msg);
        }
        match parse_client_message(&msg) {
            ClientMessage::Empty => return, // the session ends with a protocol error
            ClientMessage::EndOfInput => {
                assert_eq!(msg.get(..2), Some(&[0x03, 0x01][..]));
                return; // the session answers what is in flight and ends
            }
            ClientMessage::Ignored(k) => assert_ne!(k, 0x01),
            ClientMessage::Audio(payload) => {
                assert_eq!(msg[0], 0x01);
                if dec.push_bytes(payload).is_err() {
                    return;
                }
                loop {
                    match dec.next_pcm() {
                        Ok(Some(pcm)) => {
                            let n = pcm.len();
                            assert_eq!(cutter.push(pcm), n, "the cutter refused part of a packet");
                        }
                        Ok(None) => break,
                        Err(_) => return,
                    }
                    while cutter.pop_frame(&mut frame) {}
                }
            }
        }
    }
});
