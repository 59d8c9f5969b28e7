//! Hot-path discipline of the AudioSocket and Media Streams transports:
//! after construction, the per-packet work never touches the Rust
//! allocator (counted by a global allocator wrapper, per thread) — framing,
//! line audio in and out, the packet queue, parsing a `media` event,
//! base64 both ways, and building an outgoing event in the reusable
//! `BytesMut` whose bytes are handed off and reclaimed — with the
//! session's events on (a text piece per frame, DTMF digits, a stage
//! sample) and a subscriber attached that renders them as SSE.

mod alloc_count;
mod events_rig;

use alloc_count::count_allocations;

use base64::Engine;
use moshid::transport::line::{LineCodec, LineIn, LineOut};
use moshid::FRAME_SAMPLES;
use moshid_telephony::audiosocket as protocol;
use moshid_telephony::g711::Law;
use moshid_telephony::media_streams as events;

#[test]
fn audiosocket_packets_do_not_allocate() {
    let mut input = LineIn::new(LineCodec::SlinLe, 8_000).unwrap();
    let mut output = LineOut::new(LineCodec::SlinLe, 8_000, 40).unwrap();
    let mut frame = Box::new([0f32; FRAME_SAMPLES]);
    let answer = Box::new([0.1f32; FRAME_SAMPLES]);
    let mut wire = vec![0u8; 3 + 320];
    protocol::write_header(&mut wire, 0x10, 320);
    for (i, b) in wire[3..].iter_mut().enumerate() {
        *b = i as u8;
    }
    let mut tx = vec![0u8; 3 + 320];
    let mut events = events_rig::EventsRig::new();
    let mut round = |input: &mut LineIn, output: &mut LineOut| {
        let mut frames = 0;
        for _ in 0..4 {
            let (frame_msg, used) = protocol::parse(&wire, 8192).unwrap().unwrap();
            assert_eq!(used, wire.len());
            let protocol::Frame::Audio { payload, .. } = frame_msg else {
                panic!("audio expected")
            };
            input.push(payload, 1, &mut frame, |_| frames += 1);
        }
        assert_eq!(frames, 1);
        output.push_frame(&answer);
        events.frame();
        for _ in 0..4 {
            protocol::write_header(&mut tx, 0x10, 320);
            let p = output.front().unwrap();
            tx[3..].copy_from_slice(p);
            output.pop();
        }
        output.silence(&mut tx[3..]);
    };
    // Warm-up (the resamplers' first calls).
    round(&mut input, &mut output);
    let n = count_allocations(|| {
        for _ in 0..50 {
            round(&mut input, &mut output);
        }
    });
    assert_eq!(
        n, 0,
        "allocations in 50 model frames of AudioSocket traffic"
    );
}

#[test]
fn media_stream_events_do_not_allocate() {
    let mut input = LineIn::new(LineCodec::G711(Law::Mu), 8_000).unwrap();
    let mut output = LineOut::new(LineCodec::G711(Law::Mu), 8_000, 40).unwrap();
    let mut frame = Box::new([0f32; FRAME_SAMPLES]);
    let answer = Box::new([0.1f32; FRAME_SAMPLES]);
    let payload = events::BASE64.encode([0x55u8; 160]);
    let text = format!(
        r#"{{"event":"media","sequenceNumber":"3","media":{{"track":"inbound","chunk":"1","timestamp":"5","payload":"{payload}"}},"streamSid":"MZ1"}}"#
    );
    let mut pending = vec![0u8; 48 * 1024];
    let mut out = bytes::BytesMut::with_capacity(4096);
    let mut events = events_rig::EventsRig::new();
    let mut round = |input: &mut LineIn, output: &mut LineOut| {
        let mut frames = 0;
        for _ in 0..4 {
            let e = events::parse(&text).unwrap();
            assert_eq!(e.event.as_str(), "media");
            let media = e.media.unwrap();
            let n = events::BASE64
                .decode_slice(media.payload.as_str(), &mut pending)
                .unwrap();
            input.push(&pending[..n], 1, &mut frame, |_| frames += 1);
        }
        assert_eq!(frames, 1);
        output.push_frame(&answer);
        events.frame();
        for seq in 0..4 {
            out.reserve(4096);
            events::write_media(&mut out, seq, "MZ1", seq, seq * 20, output.front().unwrap());
            output.pop();
            let message = tungstenite::Utf8Bytes::try_from(out.split()).unwrap();
            // The WebSocket copies the frame into its write buffer and drops it.
            assert!(message.len() > 200);
            drop(message);
        }
    };
    round(&mut input, &mut output);
    round(&mut input, &mut output);
    let n = count_allocations(|| {
        for _ in 0..50 {
            round(&mut input, &mut output);
        }
    });
    assert_eq!(
        n, 0,
        "allocations in 50 model frames of Media Streams traffic"
    );
}
