//! The documentation cannot drift from the code or the repository:
//!
//! - every key the configuration accepts (enumerated from its own
//!   definitions, [`moshid::config::keys`]) has its row in
//!   `docs/configuration.md`, the page names no key the daemon refuses, each
//!   row's default is the daemon's, and the page's defaults block is
//!   `Config::default()`;
//! - every route of the router's table ([`moshid::api::routes::ROUTES`]) has its
//!   row in `docs/api.md`, and the page names no other;
//! - `docs/layout.md` names every top-level folder and every module of the
//!   daemon, and nothing else;
//! - every relative link in `README.md` and `docs/` points at a file (and a
//!   heading) that exists, the README stays a front door that holds the two
//!   commands, and every page of `docs/` is reachable from it.
//!
//! Invariants: the checks read the pages as they are in the working tree
//! and the code's own tables (nothing hand-kept here); each test collects
//! every problem before it fails, so one run names them all.

mod docs_common;

use docs_common::markdown::{anchors, code_spans, links, prose_lines, sole_code, tables, Table};
use docs_common::{docs_pages, read, repo_root};
use moshid::api::routes::ROUTES;
use moshid::config::keys::{config_keys, ConfigKey, KeyKind};
use moshid::config::Config;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
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

/// The tables of `page` (under `docs/`) whose first header is `first`.
fn tables_headed(page: &str, first: &str) -> Vec<Table> {
    let text = read(&repo_root().join("docs").join(page));
    let found: Vec<Table> = tables(&text)
        .into_iter()
        .filter(|t| t.headers.first().is_some_and(|h| h == first))
        .collect();
    assert!(
        !found.is_empty(),
        "docs/{page} has no table headed `{first}`"
    );
    found
}

/// One row of a reference table: the page and line it is on, the name in
/// its first cell, and its cells.
struct NamedRow {
    at: String,
    name: String,
    cells: Vec<String>,
}

/// The rows of the tables of `page` headed `first`, each named by its first
/// cell (one code span); a row without such a name, or a name given twice,
/// is a problem.
fn named_rows(page: &str, first: &str, problems: &mut Vec<String>) -> Vec<NamedRow> {
    let mut seen = BTreeSet::new();
    let mut rows = Vec::new();
    for table in tables_headed(page, first) {
        for (line_no, cells) in table.rows {
            let at = format!("{page}:{line_no}");
            let Some(name) = cells.first().and_then(|c| sole_code(c)).map(str::to_string) else {
                problems.push(format!("{at}: the first cell is not one code span"));
                continue;
            };
            if !seen.insert(name.clone()) {
                problems.push(format!("{at}: `{name}` has two rows"));
            }
            rows.push(NamedRow { at, name, cells });
        }
    }
    rows
}

/// Whether two JSON values are the same, numbers within float rounding (a
/// default of `0.7` is an `f32` in the daemon).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            (x - y).abs() <= 1e-6 * x.abs().max(y.abs()).max(1.0)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_json(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

/// The daemon's default at a dotted key, when `Config::default()` has one
/// there (not inside a list or a `null` section).
fn default_at<'a>(defaults: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.')
        .try_fold(defaults, |v, part| v.as_object()?.get(part))
}

/// Whether a key needs its own row: every key but a section that is always
/// there (whose keys have rows); a section that may be `null` or is a list
/// is a key of its own.
fn needs_a_row(key: &ConfigKey) -> bool {
    !matches!(key.kind, KeyKind::Section(_)) || key.nullable || key.list
}

/// What is wrong with one row of the configuration page.
fn check_config_row(key: &ConfigKey, cells: &[String], defaults: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let name = &key.name;
    let (default_cell, accepted) = (&cells[1], &cells[2]);
    if let Some(want) = default_at(defaults, name) {
        let written = code_spans(default_cell)
            .first()
            .map(|c| serde_json::from_str::<Value>(c));
        match written {
            Some(Ok(v)) if same_json(&v, want) => {}
            Some(Ok(v)) => problems.push(format!(
                "`{name}`: the page says default {v}, the daemon {want}"
            )),
            _ => problems.push(format!(
                "`{name}`: the default cell should start with `{want}`"
            )),
        }
    }
    if key.nullable && !code_spans(accepted).contains(&"null") {
        problems.push(format!(
            "`{name}` accepts `null`: say so in its Accepted cell"
        ));
    }
    if let KeyKind::Choice(words) = key.kind {
        let spans = code_spans(accepted);
        for w in words.iter().filter(|w| !spans.contains(w)) {
            problems.push(format!(
                "`{name}` accepts `{w}`: its Accepted cell does not name it"
            ));
        }
    }
    problems
}

#[test]
fn the_configuration_page_names_every_key_with_its_default() {
    let keys: BTreeMap<String, ConfigKey> = config_keys()
        .into_iter()
        .map(|k| (k.name.clone(), k))
        .collect();
    let defaults = serde_json::to_value(Config::default()).expect("the defaults serialize");
    let mut problems = Vec::new();
    let rows = named_rows("configuration.md", "Key", &mut problems);
    for row in &rows {
        let (at, name) = (&row.at, &row.name);
        match keys.get(name) {
            None => problems.push(format!("{at}: `{name}` is not a key the daemon accepts")),
            Some(_) if row.cells.len() < 4 => {
                problems.push(format!("{at}: `{name}`: 4 cells expected"))
            }
            Some(key) => problems.extend(
                check_config_row(key, &row.cells, &defaults)
                    .into_iter()
                    .map(|p| format!("{at}: {p}")),
            ),
        }
    }
    let on_page: BTreeSet<&String> = rows.iter().map(|r| &r.name).collect();
    for key in keys
        .values()
        .filter(|k| needs_a_row(k) && !on_page.contains(&k.name))
    {
        problems.push(format!(
            "`{}` is accepted by the daemon but has no row",
            key.name
        ));
    }
    assert!(
        problems.is_empty(),
        "docs/configuration.md:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_configuration_pages_defaults_block_is_the_daemons() {
    let text = read(&repo_root().join("docs/configuration.md"));
    let block: String = text
        .split("```json\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/configuration.md has a ```json block of the defaults")
        .to_string();
    let written: Value = serde_json::from_str(&block).expect("the defaults block is JSON");
    let daemon = serde_json::to_value(Config::default()).expect("the defaults serialize");
    assert!(
        same_json(&written, &daemon),
        "the defaults block of docs/configuration.md differs from Config::default():\n{}",
        serde_json::to_string_pretty(&daemon).unwrap_or_default()
    );
}

#[test]
fn the_api_page_names_every_route() {
    let served: BTreeSet<String> = ROUTES
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    let mut problems = Vec::new();
    let rows = named_rows("api.md", "route", &mut problems);
    for row in &rows {
        let (at, route) = (&row.at, &row.name);
        if !served.contains(route) {
            problems.push(format!("{at}: `{route}` is not a route the router serves"));
        }
        let switch = ROUTES
            .iter()
            .find(|r| &format!("{} {}", r.method, r.path) == route)
            .and_then(|r| r.switch);
        if let Some(key) = switch.map(|s| s.key()) {
            if !row.cells.iter().any(|c| code_spans(c).contains(&key)) {
                problems.push(format!("{at}: `{route}` exists only while `{key}`: say so"));
            }
        }
    }
    let on_page: BTreeSet<String> = rows.into_iter().map(|r| r.name).collect();
    for route in served.difference(&on_page) {
        problems.push(format!("`{route}` is served but has no row"));
    }
    assert!(problems.is_empty(), "docs/api.md:\n{}", problems.join("\n"));
}

/// The names in the first cells of the tables of `docs/layout.md` headed
/// `first`, without a trailing `/`.
fn layout_names(first: &str, problems: &mut Vec<String>) -> BTreeSet<String> {
    named_rows("layout.md", first, problems)
        .into_iter()
        .map(|r| r.name.trim_end_matches('/').to_string())
        .collect()
}

#[test]
fn the_layout_page_names_every_folder_and_module() {
    let root = repo_root();
    let folders: BTreeSet<String> = std::fs::read_dir(&root)
        .expect("the repository is readable")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && n != "target")
        .collect();
    let lib = read(&root.join("daemon/src/lib.rs"));
    let modules: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("pub mod ")
                .or(l.trim().strip_prefix("mod "))
        })
        .filter_map(|l| l.strip_suffix(';'))
        .map(str::to_string)
        .collect();
    let mut problems = Vec::new();
    let pages = [
        layout_names("folder", &mut problems),
        layout_names("module", &mut problems),
    ];
    for ((what, actual), page) in [("folder", &folders), ("module", &modules)]
        .into_iter()
        .zip(pages)
    {
        for missing in actual.difference(&page) {
            problems.push(format!("the {what} `{missing}` has no row"));
        }
        for extra in page.difference(actual) {
            problems.push(format!(
                "the {what} `{extra}` named by the page does not exist"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/layout.md:\n{}",
        problems.join("\n")
    );
}
