//! Where a configuration key is in its TOML text, and the loader that reports every problem of
//! a file at once.
//!
//! serde stops at the first problem of a document (an unknown key, a value of the wrong
//! type), which hid the rest of a file's mistakes. [`load`] parses the text, and while
//! deserialization fails it records the error with its line and key path, blanks the lines
//! of the offending key (spaces, so every byte offset and line number stays as in the file:
//! the key takes its default) and tries again; then it runs the semantic validation and gives
//! each of its errors the line of the key it names.
//!
//! Invariants: the text handed to the deserializer always has the file's line structure; a
//! TOML syntax error is reported alone (nothing after it can be read reliably); at most
//! [`MAX_ERRORS`] problems are collected.

use serde::de::DeserializeOwned;
use std::collections::HashMap;

/// Most problems collected from one file.
pub const MAX_ERRORS: usize = 100;

/// Lines of the text: for each line, the key path it sets (`mqtt.max_connections`,
/// `lite.parents[1].ttl_s`), or the table it opens.
struct Lines {
    /// Key path -> 1-based line.
    keys: HashMap<String, usize>,
    /// Per 0-based line: the key path set or the table opened on it.
    paths: Vec<Option<String>>,
    /// Per 0-based line: does it open a table (`[x]` or `[[x]]`)?
    headers: Vec<bool>,
}

fn key_of(line: &str) -> Option<&str> {
    let t = line.trim_start();
    if t.is_empty() || t.starts_with('#') || t.starts_with('[') {
        return None;
    }
    let (k, _) = t.split_once('=')?;
    let k = k.trim();
    (!k.is_empty()).then_some(k)
}

fn unquote(k: &str) -> String {
    k.split('.')
        .map(|p| p.trim().trim_matches('"').trim_matches('\''))
        .collect::<Vec<_>>()
        .join(".")
}

impl Lines {
    fn new(text: &str) -> Lines {
        let mut keys = HashMap::new();
        let mut paths = Vec::new();
        let mut headers = Vec::new();
        let mut table = String::new();
        let mut arrays: HashMap<String, usize> = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let t = line.trim();
            if let Some(name) = t.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
                let name = unquote(name);
                let n = arrays.entry(name.clone()).or_insert(0);
                table = format!("{name}[{n}]");
                *n += 1;
                keys.entry(table.clone()).or_insert(i + 1);
                paths.push(Some(table.clone()));
                headers.push(true);
                continue;
            }
            if let Some(name) = t.strip_prefix('[').and_then(|r| r.split(']').next()) {
                table = unquote(name);
                keys.entry(table.clone()).or_insert(i + 1);
                paths.push(Some(table.clone()));
                headers.push(true);
                continue;
            }
            headers.push(false);
            match key_of(line) {
                Some(k) => {
                    let path = if table.is_empty() {
                        unquote(k)
                    } else {
                        format!("{table}.{}", unquote(k))
                    };
                    keys.entry(path.clone()).or_insert(i + 1);
                    paths.push(Some(path));
                }
                None => paths.push(None),
            }
        }
        Lines {
            keys,
            paths,
            headers,
        }
    }

    /// The line of a key path (or of the closest enclosing table named in it).
    fn line_of(&self, path: &str) -> Option<usize> {
        let mut p = path;
        loop {
            if let Some(&l) = self.keys.get(p) {
                return Some(l);
            }
            p = &p[..p.rfind(['.', '['])?];
        }
    }
}

fn line_at(text: &str, byte: usize) -> usize {
    text[..byte.min(text.len())]
        .bytes()
        .filter(|&b| b == b'\n')
        .count()
}

/// Replace lines `from..=to` (0-based) with spaces, keeping their lengths and newlines.
fn blank(text: &mut String, from: usize, to: usize) {
    let mut out = String::with_capacity(text.len());
    for (i, piece) in text.split_inclusive('\n').enumerate() {
        if i >= from && i <= to {
            let body = piece.strip_suffix('\n').unwrap_or(piece);
            out.extend(std::iter::repeat_n(' ', body.len()));
            if piece.ends_with('\n') {
                out.push('\n');
            }
        } else {
            out.push_str(piece);
        }
    }
    *text = out;
}

/// `lite.parents[0] ("agents").pattern: …` → `lite.parents[0].pattern`: the key path an error
/// of [`Config::validate`] names (the text before the first `:`, without the quoted names).
fn path_of_error(e: &str) -> String {
    let head = e.split(": ").next().unwrap_or(e);
    let mut out = String::new();
    let mut rest = head;
    while let Some(i) = rest.find(" (") {
        out.push_str(&rest[..i]);
        rest = match rest[i..].find(')') {
            Some(j) => &rest[i + j + 1..],
            None => "",
        };
    }
    out.push_str(rest);
    out.split_whitespace().next().unwrap_or("").to_string()
}

/// Parse `text` as a `T` and check it with `validate` (which returns the problems, each
/// starting with the key path it is about), reporting every problem found, each with its
/// line and key path.
pub fn load<T: DeserializeOwned>(
    text: &str,
    validate: impl FnOnce(&T) -> Vec<String>,
) -> Result<T, Vec<String>> {
    if let Err(e) = text.parse::<toml::Table>() {
        let at = e
            .span()
            .map(|s| format!("line {}: ", line_at(text, s.start) + 1))
            .unwrap_or_default();
        return Err(vec![format!("{at}TOML syntax: {}", e.message().trim())]);
    }
    let lines = Lines::new(text);
    let mut doc = text.to_string();
    let mut errors = Vec::new();
    let config = loop {
        match toml::from_str::<T>(&doc) {
            Ok(c) => break Some(c),
            Err(e) if errors.len() < MAX_ERRORS => {
                let Some(span) = e.span() else {
                    errors.push(e.message().trim().to_string());
                    break None;
                };
                let (first, last) = (line_at(&doc, span.start), line_at(&doc, span.end));
                let path = lines.paths.get(first).cloned().flatten();
                errors.push(match &path {
                    Some(p) => format!("line {}: {p}: {}", first + 1, e.message().trim()),
                    None => format!("line {}: {}", first + 1, e.message().trim()),
                });
                // A whole table is wrong (say, a required key missing): blank it up to the
                // next table; otherwise the key's lines.
                let (from, to) = if lines.headers.get(first).copied().unwrap_or(false) {
                    let next = (first + 1..lines.headers.len())
                        .find(|&i| lines.headers[i])
                        .unwrap_or(lines.headers.len());
                    (first, next.saturating_sub(1).max(last))
                } else {
                    (first, last)
                };
                let before = doc.clone();
                blank(&mut doc, from, to);
                if doc == before {
                    break None;
                }
            }
            Err(_) => break None,
        }
    };
    if let Some(c) = &config {
        for e in validate(c) {
            match lines.line_of(&path_of_error(&e)) {
                Some(l) => errors.push(format!("line {l}: {e}")),
                None => errors.push(e),
            }
        }
    }
    // In the file's order (serde visits the sections in the order of the struct's fields).
    errors.sort_by_key(|e| {
        e.strip_prefix("line ")
            .and_then(|r| r.split(':').next())
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(usize::MAX)
    });
    match config {
        Some(c) if errors.is_empty() => Ok(c),
        _ => Err(errors),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn error_paths_drop_the_quoted_names() {
        assert_eq!(
            path_of_error("lite.parents[0] (\"a\").pattern: must contain {lane}"),
            "lite.parents[0].pattern"
        );
        assert_eq!(
            path_of_error("mqtt.receive_maximum: must be at least 1"),
            "mqtt.receive_maximum"
        );
        assert_eq!(
            path_of_error("lite.sweep_interval_ms must be at least 1"),
            "lite.sweep_interval_ms"
        );
    }
}
