//! The part of a TOML file a sensitive rule watches (`[build-system]`, `package.build`, …),
//! read line by line without a full TOML parser: the host only needs to know whether the
//! watched part differs between the two sides, and errs towards "it does".
//!
//! Every line is attributed to a dotted key path: a table header sets the prefix, a
//! `key = value` line appends its key, and the continuation lines of a multi-line value belong
//! to the key above them. A line is watched when its path starts with a watched path, or when
//! it is a key whose (inline-table) value may hold one.

/// The watched lines of `text`, each prefixed with its key path, in file order.
pub(super) fn watched(text: &str, patterns: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut table: Vec<String> = Vec::new();
    // Whether the key the current line continues is watched.
    let mut continuing = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if trimmed.starts_with('[') {
            table = split_key(trimmed.trim_matches(['[', ']']));
            continuing = false;
            if starts_with_any(&table, patterns) {
                out.push(format!("[{}]", table.join(".")));
            }
            continue;
        }
        let path = match key_of(trimmed) {
            Some(key) => {
                let mut path = table.clone();
                path.extend(split_key(key));
                continuing = starts_with_any(&path, patterns) || prefix_of_any(&path, patterns);
                path
            }
            None => table.clone(),
        };
        if continuing || starts_with_any(&table, patterns) {
            out.push(format!("{} {}", path.join("."), trimmed));
        }
    }
    out
}

/// The key of a `key = value` line, if it is one.
fn key_of(line: &str) -> Option<&str> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    let plain =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' ' | '"' | '\'');
    (!key.is_empty() && key.chars().all(plain)).then_some(key)
}

/// `a."b.c" . d` → `[a, b.c, d]`, lowercased (TOML keys are case-sensitive, but a look-alike
/// spelling costs a reviewer only a glance).
fn split_key(key: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut quote = None;
    for c in key.chars() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '.') => parts.push(std::mem::take(&mut current)),
            (None, c) if c.is_whitespace() => {}
            (_, c) => current.extend(c.to_lowercase()),
        }
    }
    parts.push(current);
    parts
}

fn matches_pattern(path: &[String], pattern: &str) -> bool {
    let parts: Vec<&str> = pattern.split('.').collect();
    path.len() >= parts.len() && path.iter().zip(&parts).all(|(p, q)| *q == "*" || p == q)
}

/// Whether `path` is at or under a watched path.
fn starts_with_any(path: &[String], patterns: &[&str]) -> bool {
    patterns
        .iter()
        .any(|pattern| matches_pattern(path, pattern))
}

/// Whether a watched path is under `path` (a key whose inline table may set it).
fn prefix_of_any(path: &[String], patterns: &[&str]) -> bool {
    patterns.iter().any(|pattern| {
        let parts: Vec<&str> = pattern.split('.').collect();
        path.len() < parts.len() && path.iter().zip(&parts).all(|(p, q)| *q == "*" || p == q)
    })
}
