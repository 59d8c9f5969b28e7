//! Which fixture folders the golden tests run, and how their tensors are read.

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

/// A float32 tensor of a fixture file with its shape; panics naming it when
/// it is absent or of another dtype.
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

/// An int64 tensor of a fixture file with its shape, as [`tensor_f32`].
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
