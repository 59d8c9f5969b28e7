//! What the documentation tests share: where the repository is, its pages,
//! and a small Markdown reader (`markdown`).

#![allow(dead_code)]

pub mod markdown;

use std::path::{Path, PathBuf};

/// The repository's root (the daemon crate's parent).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the daemon crate sits in the repository")
        .to_path_buf()
}

/// A text file of the repository, whole.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every Markdown page under `docs/`, sorted.
pub fn docs_pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = Vec::new();
    let mut folders = vec![root.join("docs")];
    while let Some(folder) = folders.pop() {
        let entries =
            std::fs::read_dir(&folder).unwrap_or_else(|e| panic!("{}: {e}", folder.display()));
        for entry in entries {
            let path = entry.expect("a readable folder entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}
