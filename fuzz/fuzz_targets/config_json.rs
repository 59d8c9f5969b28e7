//! The config loader: `serde_json` into `Config`, then `validate`.
//!
//! Checked: no panic; a config that validates still validates after a
//! serialize/parse round trip (what the operator writes is what runs).
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(cfg) = serde_json::from_slice::<Config>(data) else {
        return;
    };
    if cfg.validate().is_err() {
        return;
    }
    let _ = cfg.lane_capacity_frames();
    let text = serde_json::to_string(&cfg).expect("a config serializes");
    let again: Config = serde_json::from_str(&text).expect("a serialized config parses");
    again
        .validate()
        .expect("a valid config stays valid after a round trip");
});
