//! Realtime API client events (`/v1/realtime`, `/v1/realtime/translations`),
//! run through the session's input path as `transport::realtime` does:
//! parse the JSON event; `session.update` applied to the session's
//! settings (and the input format changed); appends' base64 decoded into
//! the session's bounded buffer and cut into model frames under a budget;
//! `response.create`'s parameters checked.
//! Input: `[flags, (u16 length, message)...]`; flags bit 0 picks the
//! translation endpoint, bits 1-3 the frame budget (1 to 8).
//!
//! Checked: no panic; a message the session would end on (not UTF-8, not
//! an event, bad audio) ends the run as it ends the session; decoding
//! never writes past the buffer and leaves whole samples; a take completes
//! at most its budget and the frames are finite; every accepted update
//! renders the session objects.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid::transport::realtime::audio::AudioIn;
use moshid::transport::realtime::client_event::{max_audio_bytes, parse, Kind};
use moshid::transport::realtime::conversation::check_response_params;
use moshid::transport::realtime::settings::{
    apply_update, realtime_session_json, translation_session_json, Described, Endpoint, Settings,
};
use moshid::FRAME_SAMPLES;
use moshid_fuzz::messages;

/// A small `realtime.max_event_bytes` (the size the session's buffer follows).
const MAX_EVENT_BYTES: usize = 16 * 1024;

fuzz_target!(|data: &[u8]| {
    let [flags, rest @ ..] = data else { return };
    let endpoint = if flags & 1 == 0 {
        Endpoint::Conversation
    } else {
        Endpoint::Translation
    };
    let budget = 1 + (flags >> 1 & 7) as usize;
    let mut settings = Settings::default();
    let mut input = AudioIn::new(settings.input, max_audio_bytes(MAX_EVENT_BYTES)).expect("pcm");
    let mut frame = Box::new([0f32; FRAME_SAMPLES]);
    let described = Described {
        id: "sess_1",
        model: "m",
        expires_at: 0,
    };
    for msg in messages(rest) {
        if msg.len() > MAX_EVENT_BYTES {
            return; // the WebSocket refuses it: the session ends
        }
        let Ok(text) = std::str::from_utf8(msg) else {
            return;
        };
        let Ok(event) = parse(text) else { return };
        let _ = event.id();
        match event.kind() {
            Kind::SessionUpdate => {
                let Some(session) = event.session.as_ref() else {
                    continue;
                };
                if let Ok(next) = apply_update(&settings, session, endpoint, "en") {
                    input.set_format(next.input).expect("every format builds");
                    settings = next;
                    let _ = realtime_session_json(&settings, &described).to_string();
                    let _ = translation_session_json("en", &described).to_string();
                }
            }
            Kind::InputAudioAppend | Kind::TranslationAppend => {
                let Some(audio) = event.audio.as_ref() else {
                    return;
                };
                if input.decode(audio.as_str()).is_err() {
                    return;
                }
                while input.has_pending() {
                    let mut finite = true;
                    let n = input.take(budget, &mut frame, |f| {
                        finite &= f.iter().all(|x| x.is_finite())
                    });
                    assert!(n <= budget, "{n} frames over a budget of {budget}");
                    assert!(finite, "a frame with a sample that is not finite");
                }
            }
            Kind::InputAudioClear => input.clear(),
            Kind::InputAudioCommit => input.commit(),
            Kind::ResponseCreate => {
                if let Some(r) = event.response.as_ref() {
                    let _ = check_response_params(r);
                }
            }
            _ => {}
        }
    }
});
