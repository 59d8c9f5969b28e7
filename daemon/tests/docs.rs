//! The documentation cannot drift from the repository: every relative link
//! in `README.md` and `docs/` points at a file (and a heading) that exists,
//! the README stays a front door that holds the two commands, and every
//! page of `docs/` is reachable from it.
//!
//! Invariants: the checks read the files as they are in the working tree
//! (nothing is generated); each test collects every problem before it
//! fails, so one run names them all.

mod docs_common;

use docs_common::markdown::{anchors, links, prose_lines};
use docs_common::{docs_pages, read, repo_root};
use std::path::{Component, Path, PathBuf};

/// The most lines the README may have: a front door, the rest is in `docs/`.
const README_MAX_LINES: usize = 300;

/// `path` with `.` and `..` resolved lexically (the target may not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with one link `target` written in `file`, if anything.
fn check_link(root: &Path, file: &Path, target: &str) -> Option<String> {
    let (path, fragment) = match target.split_once('#') {
        Some((p, f)) => (p, Some(f)),
        None => (target, None),
    };
    let resolved = if path.is_empty() {
        file.to_path_buf()
    } else {
        normalize(&file.parent().unwrap_or(root).join(path))
    };
    if !resolved.starts_with(root) {
        return Some(format!("`{target}` leaves the repository"));
    }
    if !resolved.exists() {
        return Some(format!("`{target}`: no such file or folder"));
    }
    let fragment = fragment.filter(|f| !f.is_empty())?;
    if resolved.extension().is_some_and(|e| e == "md") {
        let text = read(&resolved);
        if !anchors(&text).contains(fragment) {
            return Some(format!("`{target}`: no heading `#{fragment}` there"));
        }
    }
    None
}

/// Whether a link target is an address elsewhere (`https:`, `mailto:`).
fn is_external(target: &str) -> bool {
    target.split_once(':').is_some_and(|(scheme, _)| {
        !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphabetic())
    })
}

#[test]
fn every_relative_link_resolves() {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    files.extend(docs_pages(&root));
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = read(file);
        for (line_no, line) in prose_lines(&text) {
            for target in links(line) {
                if is_external(&target) {
                    continue;
                }
                checked += 1;
                if let Some(why) = check_link(&root, file, &target) {
                    let shown = file.strip_prefix(&root).unwrap_or(file).display();
                    problems.push(format!("{shown}:{line_no}: {why}"));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} relative links found: is the parser broken?"
    );
    assert!(
        problems.is_empty(),
        "links that point nowhere:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_readme_is_a_front_door_with_the_two_commands() {
    let root = repo_root();
    let text = read(&root.join("README.md"));
    let lines = text.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines (at most {README_MAX_LINES}): move the detail into docs/"
    );
    for command in ["scripts/run", "scripts/test"] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(command)),
            "README.md no longer shows `{command}` as a command"
        );
    }
}

#[test]
fn every_docs_page_is_linked_from_the_readme() {
    let root = repo_root();
    let readme = read(&root.join("README.md"));
    let linked: Vec<PathBuf> = prose_lines(&readme)
        .flat_map(|(_, line)| links(line))
        .filter(|t| !is_external(t))
        .map(|t| normalize(&root.join(t.split('#').next().unwrap_or(""))))
        .collect();
    let missing: Vec<String> = docs_pages(&root)
        .into_iter()
        .filter(|p| !linked.contains(p))
        .map(|p| p.strip_prefix(&root).unwrap_or(&p).display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "docs pages the README does not link to: {missing:?}"
    );
}

#[test]
fn the_markdown_helpers_find_links_and_anchors() {
    let text = "# Top\n\n## `sip.auth`: digest (RFC 8760)\n\n```\n[not](a-link.md)\n```\n\
                See [a](b.md#c) and `[no](code.md)`, ![pic](p.svg).\n## Top\n";
    let found: Vec<String> = prose_lines(text).flat_map(|(_, l)| links(l)).collect();
    assert_eq!(found, ["b.md#c", "p.svg"]);
    let a = anchors(text);
    for want in ["top", "sipauth-digest-rfc-8760", "top-1"] {
        assert!(a.contains(want), "{want} not in {a:?}");
    }
}
