//! Hot-path discipline: after construction, decoding, frame cutting and
//! encoding never touch the Rust allocator (counted by a global allocator
//! wrapper, per thread). libopus's internal C allocations are not
//! visible here; libopus 1.3 uses the stack for its per-call scratch.
//! The session's events are on, with a subscriber attached (see
//! `events_rig`): one text piece per encoded frame. Each frame is framed
//! for the WebSocket as the chat session does it ([`WsOut`]: the encoder's
//! pages written in place behind the frame header, then the text message),
//! and the buffer is reused for the next frame.

mod codec_common;

mod alloc_count;
mod events_rig;

use alloc_count::count_allocations;

use codec_common::*;
use moshid::codec::{
    CodecError, DecoderConfig, EncoderConfig, FrameCutter, OggOpusDecoder, OggOpusEncoder,
    DEFAULT_CUTTER_CAPACITY_SAMPLES, FRAME_SAMPLES,
};
use moshid::transport::ws_out::{self, WsOut};

#[test]
fn the_counter_sees_allocations() {
    assert_eq!(
        count_allocations(|| drop(std::hint::black_box(Vec::<u8>::with_capacity(10)))),
        1
    );
}

#[test]
fn steady_state_does_not_allocate() {
    // Per-session setup: allocations allowed here.
    let stream = fixture_bytes("sphn_chirp_2s");
    let meta = fixture_meta("sphn_chirp_2s");
    let message_bytes: Vec<usize> = meta["message_bytes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let mut decoder = OggOpusDecoder::new(DecoderConfig::default()).unwrap();
    let mut cutter = FrameCutter::new(DEFAULT_CUTTER_CAPACITY_SAMPLES).unwrap();
    let mut encoder = OggOpusEncoder::new(EncoderConfig::default()).unwrap();
    let mut frame = [0f32; FRAME_SAMPLES];
    let max_frame_bytes = encoder.max_output_bytes_per_frame();
    let mut wire =
        WsOut::with_capacity(ws_out::message_bytes(max_frame_bytes) + ws_out::message_bytes(64));
    let (mut frames, mut sent_bytes) = (0usize, 0usize);
    let mut events = events_rig::EventsRig::new();
    // Warm-up of the subscriber's SSE buffer path.
    events.frame();

    // The whole session, message by message as the client sent them.
    let allocations = count_allocations(|| {
        let mut pos = 0;
        for &n in &message_bytes {
            decoder.push_bytes(&stream[pos..pos + n]).unwrap();
            pos += n;
            while let Some(pcm) = decoder.next_pcm().unwrap() {
                let mut rest = pcm;
                while !rest.is_empty() {
                    rest = &rest[cutter.push(rest)..];
                    while cutter.pop_frame(&mut frame) {
                        wire.clear(); // written to the socket
                        wire.push_with(0x01, max_frame_bytes, |out| {
                            encoder.encode_frame(&frame, out)
                        })
                        .unwrap();
                        wire.push(0x02, b" hello").unwrap();
                        sent_bytes += wire.as_bytes().len();
                        events.frame();
                        frames += 1;
                    }
                }
            }
        }
        // Error paths do not allocate either.
        assert!(matches!(decoder.push_bytes(&[0u8; 8]), Ok(())));
        assert!(matches!(
            decoder.next_pcm(),
            Err(CodecError::BadCapturePattern { .. })
        ));
    });
    assert_eq!(frames, (25 * FRAME_SAMPLES - FRAME_SAMPLES) / FRAME_SAMPLES);
    assert!(sent_bytes > 0);
    // Every frame's text piece (and the DTMF digits) reached the subscriber.
    assert!(events.rendered as usize > frames);
    assert_eq!(allocations, 0, "allocations on the hot path");
}
