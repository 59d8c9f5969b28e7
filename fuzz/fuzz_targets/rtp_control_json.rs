//! The body of `POST /v1/rtp/sessions`: JSON into `CreateRequest`, then its
//! checks (`spec`) and the session parameters it carries (`param_pairs`,
//! `session_params`).
//!
//! Checked: no panic; an accepted spec has payload types in 0..=127 and a
//! DTMF payload type different from the audio one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid::config::GenDefaults;
use moshid::session::params::{session_params, ModelInfo};
use moshid::api::rtp::CreateRequest;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = serde_json::from_slice::<CreateRequest>(data) else {
        return;
    };
    if let Ok(spec) = req.spec() {
        assert!(spec.payload_type < 128);
        if let Some(d) = spec.dtmf_payload_type {
            assert!(d < 128 && d != spec.payload_type);
        }
    }
    if let Ok(pairs) = req.param_pairs() {
        let _ = session_params(&pairs, &GenDefaults::default(), &ModelInfo::default());
    }
});
