//! The golden fixture folders and their input audio.

use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

/// The folders named in `MOSHID_GOLDEN` (colon-separated), or else every
/// folder of `../shared/golden` holding `marker`. Panics when there is none:
/// a golden run over no fixture would prove nothing.
pub fn fixture_dirs(marker: &str) -> Vec<PathBuf> {
    if let Ok(v) = std::env::var("MOSHID_GOLDEN") {
        let dirs: Vec<PathBuf> = v
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();
        assert!(!dirs.is_empty(), "MOSHID_GOLDEN is set but names no folder");
        return dirs;
    }
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/golden"));
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.retain(|d| d.join(marker).is_file());
    dirs.sort();
    assert!(
        !dirs.is_empty(),
        "no fixture folder with {marker} under {}: put the golden fixtures there or set MOSHID_GOLDEN",
        root.display()
    );
    dirs
}

/// A float tensor of `io.safetensors` with its shape.
pub fn tensor_f32(st: &SafeTensors, name: &str) -> (Vec<f32>, Vec<usize>) {
    let t = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("io.safetensors: {name}: {e}"));
    assert_eq!(t.dtype(), Dtype::F32, "{name}");
    let v = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (v, t.shape().to_vec())
}

/// An integer tensor of `io.safetensors` with its shape.
pub fn tensor_i64(st: &SafeTensors, name: &str) -> (Vec<i64>, Vec<usize>) {
    let t = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("io.safetensors: {name}: {e}"));
    assert_eq!(t.dtype(), Dtype::I64, "{name}");
    let v = t
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (v, t.shape().to_vec())
}

/// `pcm_in` of a fixture: `(streams, samples per stream, samples)`.
pub fn input_pcm(dir: &Path) -> (usize, usize, Vec<f32>) {
    let bytes = std::fs::read(dir.join("io.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (pcm, shape) = tensor_f32(&st, "pcm_in");
    (shape[0], shape[2], pcm)
}

/// ‖a − b‖ / ‖b‖ (0 when both are zero).
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        num += ((x - y) as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}
