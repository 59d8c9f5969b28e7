//! NVIDIA's `.pt` voice prompts (a PyTorch zip pickle), read by moshid's
//! restricted unpickler (`moshid_model::persona::pt::read_pt`) and checked
//! against a PersonaPlex-shaped config (`replay_from_pt`).
//!
//! Checked: no panic, no code executed (the reader evaluates two known
//! callables only); an accepted file's tensors hold as many values as their
//! shapes say.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid_model::config::LmConfig;
use moshid_model::persona::{pt::read_pt, replay_from_pt};

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = read_pt(data) {
        let n: usize = v.embeddings.shape.iter().product();
        assert_eq!(n, v.embeddings.values.len());
        let n: usize = v.cache.shape.iter().product();
        assert_eq!(n, v.cache.values.len());
    }
    let cfg = LmConfig::personaplex_7b();
    if let Ok(r) = replay_from_pt(data, &cfg) {
        assert_eq!(r.embeddings.len(), (r.frames - 1) * cfg.dim);
    }
});
