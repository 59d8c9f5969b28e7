//! The golden fixture folders, their tensors and their input audio.

use safetensors::SafeTensors;
use std::path::Path;

#[path = "../../../model/tests/golden_fixtures.rs"]
mod dirs;

/// The fixture folders (`../shared/golden`, the implemented
/// `../shared/golden-next` ones and `MOSHID_GOLDEN`'s), as the model
/// crate's golden tests find them.
pub use dirs::{fixture_dirs, persona_dirs, rel_err, tensor_f32, tensor_i64};

/// `pcm_in` of a fixture: `(streams, samples per stream, samples)`.
pub fn input_pcm(dir: &Path) -> (usize, usize, Vec<f32>) {
    let bytes = std::fs::read(dir.join("io.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (pcm, shape) = tensor_f32(&st, "pcm_in");
    (shape[0], shape[2], pcm)
}
