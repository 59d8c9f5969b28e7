//! The daemon's imports run one way: `daemon/src` is cut into the layers of
//! [`LAYERS`] (top to bottom, as the crate's own doc lists them), and a file
//! may name only modules of its own layer or of layers below it, with no
//! circle between modules of one layer. Every module of `daemon/src` has to
//! be placed in a layer: a new top-level module fails here until it is.
//!
//! The check reads the sources as text: `use` trees and every path that
//! starts with `crate::`, `super::` or `self::` (in code, not in comments or
//! strings), `super` resolved through inline `mod` blocks; test modules
//! inside `src` count like any other code. Its own tests plant an upward
//! import and a circle into small trees, and into a copy of the real one,
//! and see each refused.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, top to bottom. A unit is a top-level module (`engine`) or,
/// where a folder holds modules of different layers, a module inside it
/// (`transport/link`); `lib` stands for the crate root's own items (the
/// frame constants).
const LAYERS: &[(&str, &[&str])] = &[
    ("start-up", &["main", "cli"]),
    (
        "start-up",
        &[
            "runtime",
            "check_checkpoint",
            "client",
            "agent",
            "systemd",
            "backend",
        ],
    ),
    ("start-up", &["preflight"]),
    ("api", &["api"]),
    (
        "transports",
        &[
            "transport/ws_chat",
            "transport/media_streams",
            "transport/audiosocket",
            "transport/sip",
        ],
    ),
    ("transports", &["transport/rtp"]),
    (
        "transport core",
        &[
            "transport",
            "transport/link",
            "transport/line",
            "transport/ws_out",
        ],
    ),
    ("session API", &["tls", "app"]),
    ("session API", &["io"]),
    ("session API", &["events", "session"]),
    ("configuration", &["config"]),
    ("engine", &["engine"]),
    (
        "leaves",
        &[
            "codec",
            "http",
            "metrics",
            "heap",
            "protocol",
            "hub",
            "random_weights",
            "log_record",
        ],
    ),
    ("crate root", &["lib"]),
];

/// One import that breaks the rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Finding {
    file: String,
    line: usize,
    what: String,
}

/// A module path as segments below the crate root.
type ModPath = Vec<String>;

/// Reads every `.rs` file below `src` as (path relative to `src`, text).
fn read_tree(src: &Path) -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                let text = std::fs::read_to_string(&p).unwrap();
                out.push((rel, text));
            }
        }
    }
    let mut out = Vec::new();
    walk(src, src, &mut out);
    out
}

/// The module a file defines (`io/mod.rs` → `io`, `lib.rs` → root).
fn module_of(file: &str) -> ModPath {
    let stem = file.trim_end_matches(".rs");
    let mut segs: ModPath = stem.split('/').map(str::to_string).collect();
    if matches!(
        segs.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        let last = segs.pop().unwrap();
        if segs.is_empty() && last == "main" {
            segs.push(last);
        }
    }
    segs
}

/// The source with comments, strings and character literals blanked out
/// (newlines kept, so byte offsets and line numbers stay right).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if b[i..].starts_with(b"//") {
            let end = src[i..].find('\n').map_or(b.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            let mut j = i;
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if !ident_before && (b[i..].starts_with(b"r\"") || b[i..].starts_with(b"r#")) {
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let start = i + 2 + hashes;
            let end = b[start..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |n| start + n + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if b[i] == b'\'' {
            // A character literal ('a', '\n', '\u{..}'), not a lifetime.
            let lit = if b.get(i + 1) == Some(&b'\\') {
                src[i + 2..].find('\'').map(|n| i + 2 + n + 1)
            } else {
                let ch = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + ch) == Some(&b'\'')).then_some(i + 2 + ch)
            };
            match lit {
                Some(end) => {
                    blank(&mut out, i, end);
                    i = end;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).expect("blanking keeps UTF-8 (only ASCII bytes replaced)")
}

/// The paths a `use` tree names (`a::{b, c::{d}}` → `a::b`, `a::c::d`).
fn expand_use_tree(tree: &str) -> Vec<String> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    fn rec(prefix: &str, s: &str, out: &mut Vec<String>) {
        let s = s.trim();
        if s.is_empty() {
            return;
        }
        let Some(open) = s.find('{') else {
            let path = s.split(" as ").next().unwrap().trim();
            out.push(format!("{prefix}{path}"));
            return;
        };
        let head = &s[..open];
        let body = &s[open + 1..s.rfind('}').unwrap_or(s.len())];
        let mut depth = 0;
        let mut part = String::new();
        for c in body.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if c == ',' && depth == 0 {
                rec(&format!("{prefix}{head}"), &part, out);
                part.clear();
            } else {
                part.push(c);
            }
        }
        rec(&format!("{prefix}{head}"), &part, out);
    }
    rec("", &tree, &mut out);
    out
}

/// Resolves a path written in module `at` to segments below the crate
/// root; `None` for paths into other crates.
fn resolve(path: &str, at: &[String]) -> Option<ModPath> {
    let segs: Vec<&str> = path
        .split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let (first, rest) = segs.split_first()?;
    match *first {
        "crate" => Some(rest.iter().map(|s| s.to_string()).collect()),
        "super" | "self" => {
            let mut base: ModPath = at.to_vec();
            let mut rest: &[&str] = &segs;
            while let Some((&s, tail)) = rest.split_first() {
                match s {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = tail;
            }
            base.extend(rest.iter().map(|s| s.to_string()));
            Some(base)
        }
        _ => None,
    }
}

/// Every path into the crate a file names: (line, resolved path, as written).
fn imports(file: &str, text: &str) -> Vec<(usize, ModPath, String)> {
    let code = code_only(text);
    let module = module_of(file);
    // Inline `mod name {` blocks: (start, end, name), for `super`.
    let mut blocks = Vec::new();
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(n) = code[from..].find("mod ") {
        let at = from + n;
        from = at + 4;
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
            continue;
        }
        let after = code[at + 4..].trim_start();
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let rest = after[name.len()..].trim_start();
        if name.is_empty() || !rest.starts_with('{') {
            continue;
        }
        let open = code.len() - rest.len();
        let mut depth = 0;
        let mut end = code.len();
        for (k, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k;
                        break;
                    }
                }
                _ => {}
            }
        }
        blocks.push((open, end, name));
    }
    let module_at = |pos: usize| -> ModPath {
        let mut m = module.clone();
        for (start, end, name) in &blocks {
            if *start <= pos && pos <= *end {
                m.push(name.clone());
            }
        }
        m
    };
    let line_of = |pos: usize| code[..pos].matches('\n').count() + 1;
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    // `use` trees.
    let mut from = 0;
    while let Some(n) = code[from..].find("use ") {
        let at = from + n;
        from = at + 4;
        if at > 0 && is_ident(bytes[at - 1]) {
            continue;
        }
        let Some(semi) = code[at..].find(';') else {
            break;
        };
        let tree = &code[at + 4..at + semi];
        for path in expand_use_tree(tree) {
            if let Some(r) = resolve(&path, &module_at(at)) {
                out.push((line_of(at), r, path));
            }
        }
    }
    // Paths in code: `crate::…`, `super::…`, `self::…`.
    for start_word in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(n) = code[from..].find(start_word) {
            let at = from + n;
            from = at + start_word.len();
            if at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b':') {
                continue;
            }
            let len = code[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(code.len() - at);
            let path = code[at..at + len].trim_end_matches(':');
            if let Some(r) = resolve(path, &module_at(at)) {
                out.push((line_of(at), r, path.to_string()));
            }
        }
    }
    out
}

/// The unit a module path belongs to: the longest declared prefix; paths
/// to the crate root's own items belong to `lib`.
fn unit_of(path: &[String], units: &BTreeMap<String, usize>) -> Option<String> {
    for n in (1..=path.len().min(2)).rev() {
        let name = path[..n].join("/");
        if units.contains_key(&name) {
            return Some(name);
        }
    }
    None
}

/// Checks the tree against `layers`; every finding is a broken rule.
fn check(tree: &[(String, String)], layers: &[(&str, &[&str])]) -> Vec<Finding> {
    let mut units = BTreeMap::new();
    for (rank, (_, names)) in layers.iter().enumerate() {
        for name in *names {
            units.insert(name.to_string(), rank);
        }
    }
    let root_unit = "lib".to_string();
    let mut findings = BTreeSet::new();
    // Upward imports: (file, line, from, to) → the first path written.
    let mut upward: BTreeMap<(String, usize, String, String), String> = BTreeMap::new();
    // Unit graph, for circles inside a layer: edge → first place seen.
    let mut edges: BTreeMap<(String, String), (String, usize)> = BTreeMap::new();
    let top_modules: BTreeSet<String> = tree
        .iter()
        .filter_map(|(f, _)| module_of(f).first().cloned())
        .collect();
    for (file, text) in tree {
        let module = module_of(file);
        let Some(from) = (if module.is_empty() {
            Some(root_unit.clone())
        } else {
            unit_of(&module, &units)
        }) else {
            findings.insert(Finding {
                file: file.clone(),
                line: 1,
                what: format!(
                    "module `{}` is in no layer: place it in LAYERS",
                    module.join("::")
                ),
            });
            continue;
        };
        for (line, path, written) in imports(file, text) {
            if path.is_empty() {
                continue;
            }
            let to = if top_modules.contains(&path[0]) {
                match unit_of(&path, &units) {
                    Some(u) => u,
                    None => continue, // reported for its own file
                }
            } else {
                root_unit.clone() // an item of the crate root
            };
            if to == from {
                continue;
            }
            let (rf, rt) = (units[&from], units[&to]);
            if rt < rf {
                upward
                    .entry((file.clone(), line, from.clone(), to.clone()))
                    .or_insert(written);
            } else if rt == rf {
                edges
                    .entry((from.clone(), to))
                    .or_insert((file.clone(), line));
            }
        }
    }
    for ((file, line, from, to), written) in upward {
        findings.insert(Finding {
            file,
            line,
            what: format!(
                "`{from}` ({}) imports `{to}` ({}), a layer above it: `{written}`",
                layers[units[&from]].0, layers[units[&to]].0
            ),
        });
    }
    // Circles between units of one layer.
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        next.entry(a.as_str()).or_default().push(b.as_str());
    }
    for ((a, b), (file, line)) in &edges {
        // Is there a way back from b to a?
        let mut seen = BTreeSet::new();
        let mut stack = vec![b.as_str()];
        let mut back = false;
        while let Some(u) = stack.pop() {
            if u == a {
                back = true;
                break;
            }
            if seen.insert(u) {
                stack.extend(next.get(u).into_iter().flatten());
            }
        }
        if back {
            findings.insert(Finding {
                file: file.clone(),
                line: *line,
                what: format!("`{a}` imports `{b}`, which imports `{a}` back (a circle)"),
            });
        }
    }
    findings.into_iter().collect()
}

fn daemon_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn report(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(|f| format!("daemon/src/{}:{}: {}", f.file, f.line, f.what))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_daemon_imports_run_one_way() {
    let findings = check(&read_tree(&daemon_src()), LAYERS);
    assert!(
        findings.is_empty(),
        "{} imports against the layers:\n{}",
        findings.len(),
        report(&findings)
    );
}

/// A tiny tree: `high` above `mid` above `low`.
fn planted(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect()
}

const TINY: &[(&str, &[&str])] = &[
    ("top", &["high"]),
    ("middle", &["mid", "side"]),
    ("bottom", &["low"]),
    ("root", &["lib"]),
];

#[test]
fn downward_imports_pass() {
    let tree = planted(&[
        (
            "lib.rs",
            "pub mod high; pub mod mid; pub mod low; pub const N: usize = 1;",
        ),
        (
            "high.rs",
            "use crate::{mid::M, low::{self, L}};\nfn f() { crate::low::g(); }",
        ),
        (
            "mid/mod.rs",
            "pub mod inner;\nuse super::low::L;\npub struct M;",
        ),
        (
            "mid/inner.rs",
            "use super::M; use crate::N; use crate::side::S;",
        ),
        ("side.rs", "pub struct S;"),
        ("low.rs", "pub struct L; pub fn g() {}"),
    ]);
    assert_eq!(check(&tree, TINY), vec![]);
}

#[test]
fn a_planted_upward_import_is_refused() {
    for (file, text, what) in [
        (
            "low.rs",
            "use crate::high::H;",
            "`low` (bottom) imports `high` (top)",
        ),
        // Through `super` from a nested file, and inside an inline module.
        (
            "mid/inner.rs",
            "fn f() { super::super::high::g() }",
            "`mid` (middle) imports `high`",
        ),
        (
            "low.rs",
            "mod tests { use super::super::mid::{x, y::{z}}; }",
            "`low` (bottom) imports `mid` (middle)",
        ),
        (
            "mid/mod.rs",
            "use crate::{low::L, high::{H}};",
            "imports `high`",
        ),
    ] {
        let mut files = vec![
            ("lib.rs", "pub mod high; pub mod mid; pub mod low;"),
            ("high.rs", "pub struct H;"),
            ("mid/mod.rs", "pub mod inner;"),
            ("mid/inner.rs", ""),
            ("low.rs", ""),
        ];
        files.retain(|(f, _)| *f != file);
        files.push((file, text));
        let found = check(&planted(&files), TINY);
        assert!(
            found.len() == 1 && found[0].file == file && found[0].what.contains(what),
            "{file}: {text} → {found:?}"
        );
    }
}

#[test]
fn comments_and_strings_are_not_imports() {
    let tree = planted(&[
        ("lib.rs", "pub mod high; pub mod low;"),
        ("high.rs", ""),
        (
            "low.rs",
            "//! See [`crate::high`].\n/* use crate::high::H; */\nconst S: &str = \"crate::high::H\";\nconst R: &str = r#\"super::high\"#;\nfn f<'a>(x: &'a str) -> char { let _ = x; '\"' }\nfn g() -> &'static str { \"use crate::high;\" }",
        ),
    ]);
    assert_eq!(check(&tree, TINY), vec![]);
}

#[test]
fn a_circle_inside_a_layer_is_refused() {
    let tree = planted(&[
        ("lib.rs", "pub mod mid; pub mod side;"),
        ("mid.rs", "use crate::side::S; pub struct M;"),
        (
            "side.rs",
            "pub struct S; fn f() -> crate::mid::M { crate::mid::M }",
        ),
    ]);
    let found = check(&tree, TINY);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found.iter().all(|f| f.what.contains("a circle")),
        "{found:?}"
    );
}

#[test]
fn a_module_in_no_layer_is_refused() {
    let tree = planted(&[("lib.rs", "pub mod stray;"), ("stray.rs", "")]);
    let found = check(&tree, TINY);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].what.contains("in no layer"), "{found:?}");
}

/// The real tree with one upward import planted into a copy of it: the
/// engine naming the HTTP API.
#[test]
fn the_real_tree_with_a_planted_upward_import_is_refused() {
    let mut tree = read_tree(&daemon_src());
    let engine = tree
        .iter_mut()
        .find(|(f, _)| f == "engine/mod.rs")
        .expect("engine/mod.rs");
    engine
        .1
        .push_str("\n#[allow(unused_imports)]\nuse crate::api::router;\n");
    let found = check(&tree, LAYERS);
    assert!(
        found.iter().any(|f| f.file == "engine/mod.rs"
            && f.what.contains("`engine` (engine) imports `api` (api)")),
        "{}",
        report(&found)
    );
}
