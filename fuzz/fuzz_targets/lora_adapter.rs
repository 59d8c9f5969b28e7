//! LoRA adapter files (`lora.safetensors` as moshi-finetune writes it): the
//! safetensors header, the sorting of tensors into layer pairs and
//! replacements, and the check against Moshi 7B's tensors
//! (`moshid_model::lora::LoraAdapter::open_header` then `check`), from the
//! header alone.
//!
//! Checked: no panic; an accepted adapter covers every linear layer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moshid_model::config::{LmConfig, LoraConfig};
use moshid_model::lm::Lm;
use moshid_model::lora::LoraAdapter;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("moshid-fuzz-lora-{}.safetensors", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let cfg = LmConfig::moshi_7b();
    for rank in [1, 8] {
        let lora = LoraConfig { rank, scaling: 2.0 };
        if let Ok(a) = LoraAdapter::open_header(&path, lora) {
            if let Ok(r) = a.check(&Lm::tensor_specs_used(&cfg), &[]) {
                assert!(r.layers > 0);
            }
        }
    }
    let _ = std::fs::remove_file(&path);
});
