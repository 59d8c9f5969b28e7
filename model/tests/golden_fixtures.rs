//! Which fixture folders the golden tests run.

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
