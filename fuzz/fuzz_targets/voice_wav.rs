//! WAV voice prompts: the header parser and sample decoder
//! (`moshid_model::persona::wav::read_wav`), then, for 24 kHz audio, the
//! loudness measure and normalisation (`prepare_voice`) on at most 2 s.
//!
//! Checked: no panic; accepted samples are finite; prepared audio is whole
//! frames.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid_model::persona::wav::{prepare_voice, read_wav};

fuzz_target!(|data: &[u8]| {
    let Ok(w) = read_wav(data) else {
        return;
    };
    assert!(w.samples.iter().all(|x| x.is_finite()));
    if w.rate == 24_000 {
        let n = w.samples.len().min(48_000);
        if let Ok((pcm, _, _)) = prepare_voice(&w.samples[..n], 1920) {
            assert_eq!(pcm.len() % 1920, 0);
        }
    }
});
