//! Which fixture folders the golden tests run, and how their tensors are read.

use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

/// Fixture folders outside `../shared/golden` that every golden target runs
/// too: `../shared/golden-next` holds fixtures of features an issue adds,
/// and these are the ones this code implements.
pub const GOLDEN_NEXT: &[&str] = &["hibiki-zero-tiny", "moshi-lora-tiny"];

/// Every folder of `../shared/golden` holding `marker`, the [`GOLDEN_NEXT`]
/// folders of `../shared/golden-next`, and the folders named in
/// `MOSHID_GOLDEN` (colon-separated), each once, in that order. Panics
/// when there is none (a golden run over no fixture would prove nothing)
/// and when `MOSHID_GOLDEN` names a folder without `marker`.
pub fn fixture_dirs(marker: &str) -> Vec<PathBuf> {
    let shared = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared"));
    let root = shared.join("golden");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.extend(
        GOLDEN_NEXT
            .iter()
            .map(|n| shared.join("golden-next").join(n)),
    );
    dirs.retain(|d| d.join(marker).is_file());
    if let Ok(v) = std::env::var("MOSHID_GOLDEN") {
        let named: Vec<PathBuf> = v
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();
        assert!(
            !named.is_empty(),
            "MOSHID_GOLDEN is set but names no folder"
        );
        for d in named {
            assert!(
                d.join(marker).is_file(),
                "MOSHID_GOLDEN names {}, which holds no {marker}",
                d.display()
            );
            dirs.push(d);
        }
    }
    let mut seen = Vec::new();
    dirs.retain(|d| {
        let key = d.canonicalize().unwrap_or_else(|_| d.clone());
        let fresh = !seen.contains(&key);
        seen.push(key);
        fresh
    });
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

/// `‖got − want‖ / ‖want‖` (`‖got − want‖` when `want` is all zeros).
pub fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// PersonaPlex fixture folders: `../shared/golden-next/personaplex-tiny`
/// and the folders of `MOSHID_GOLDEN_PERSONA` (colon-separated; other
/// seeds and `--shape alt` of the same generator).
pub fn persona_dirs() -> Vec<PathBuf> {
    let shared = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared"));
    let mut dirs = vec![shared.join("golden-next/personaplex-tiny")];
    if let Ok(v) = std::env::var("MOSHID_GOLDEN_PERSONA") {
        dirs.extend(v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    for d in &dirs {
        assert!(
            d.join("prompts.json").is_file(),
            "{} is not a PersonaPlex fixture (no prompts.json)",
            d.display()
        );
    }
    dirs
}
