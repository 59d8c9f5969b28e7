//! Just enough Markdown for the documentation tests: the lines outside
//! fenced code blocks, the targets of inline links and images, the anchors
//! GitHub gives headings, and the cells of table rows.
//!
//! Invariants: code (fenced blocks and `inline spans`) never yields a link;
//! anchors follow GitHub's rule (lower case, punctuation other than `-` and
//! `_` dropped, spaces to `-`, a repeated heading gets `-1`, `-2`, …).

use std::collections::HashSet;

/// `(line number, line)` of every line outside fenced code blocks.
pub fn prose_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fence: Option<&str> = None;
    text.lines().enumerate().filter_map(move |(i, line)| {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                None
            }
            (Some(open), Some(m)) if open == m => {
                fence = None;
                None
            }
            (Some(_), _) => None,
            (None, None) => Some((i + 1, line)),
        }
    })
}

/// `line` without its inline code spans.
pub fn without_code(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links and images of one prose line
/// (`[text](target)`, `![alt](target "title")`), and of a reference
/// definition (`[label]: target`).
pub fn links(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut found = Vec::new();
    if let Some(rest) = line.trim_start().strip_prefix('[') {
        if let Some((_, target)) = rest.split_once("]: ") {
            found.extend(target.split_whitespace().next().map(str::to_string));
        }
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or("");
        let target = target.trim_start_matches('<').trim_end_matches('>');
        if !target.is_empty() {
            found.push(target.to_string());
        }
        rest = &after[end..];
    }
    found
}

/// GitHub's anchor for a heading's text.
pub fn slug(heading: &str) -> String {
    let mut text = String::new();
    // A link in a heading counts by its text.
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor the headings of a page give.
pub fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashSet<String> = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(title) = line.get(hashes..).and_then(|t| t.strip_prefix(' ')) else {
            continue;
        };
        if !(1..=6).contains(&hashes) {
            continue;
        }
        let base = slug(title);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The cells of a table row (`| a | b |`), trimmed; `None` for other lines.
/// A `\|` inside a cell is a pipe of the cell's text.
pub fn table_cells(line: &str) -> Option<Vec<String>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                chars.next();
                cells.last_mut().expect("one cell at least").push('|');
            }
            '|' => cells.push(String::new()),
            _ => cells.last_mut().expect("one cell at least").push(c),
        }
    }
    Some(cells.into_iter().map(|c| c.trim().to_string()).collect())
}

/// The inline code spans of `text`, in order.
pub fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// One table of a page: its header cells and its rows' cells, with the
/// line number of each row.
#[derive(Debug)]
pub struct Table {
    /// The header row's cells.
    pub headers: Vec<String>,
    /// `(line number, cells)` of each row after the separator.
    pub rows: Vec<(usize, Vec<String>)>,
}

/// Every table of `text` (outside code blocks).
pub fn tables(text: &str) -> Vec<Table> {
    let lines: Vec<(usize, &str)> = prose_lines(text).collect();
    let mut out: Vec<Table> = Vec::new();
    let mut open = false;
    for (i, &(line_no, line)) in lines.iter().enumerate() {
        let Some(cells) = table_cells(line) else {
            open = false;
            continue;
        };
        let is_separator = |cells: &[String]| {
            cells
                .iter()
                .all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':' | ' ')))
        };
        if is_separator(&cells) {
            continue;
        }
        let next_is_separator = lines
            .get(i + 1)
            .and_then(|(_, l)| table_cells(l))
            .is_some_and(|c| is_separator(&c));
        if next_is_separator {
            out.push(Table {
                headers: cells,
                rows: Vec::new(),
            });
            open = true;
        } else if open {
            out.last_mut()
                .expect("a table is open")
                .rows
                .push((line_no, cells));
        }
    }
    out
}

/// The code of a cell that is exactly one code span (`` `name` ``).
pub fn sole_code(cell: &str) -> Option<&str> {
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    (!inner.contains('`')).then_some(inner)
}
