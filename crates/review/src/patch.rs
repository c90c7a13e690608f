//! The host's own reading of a guest-produced patch (`git diff --binary`, baseline → working
//! tree): a strict parser ([`parse`]) and the review built on it ([`review`], [`summarize`]) —
//! file and line counts plus the paths a reviewer must look at (docs/mcp.md "Diff", `kind`;
//! the rules are the table in `patch/rules.rs`).
//!
//! The patch is hostile: a prompt-injected agent controls every byte of it. So nothing the
//! guest wrote is taken on faith — no stats, no header the guest could have made up. The parser
//! accepts only the grammar `git diff` emits and refuses everything else with
//! [`PatchError::Malformed`]; in particular it refuses any text between or around file entries,
//! which `git apply` would otherwise skip over or read as a traditional (non-git) patch. Every
//! file name that appears in an entry (`diff --git`, `---`/`+++`, `rename`/`copy` lines) must
//! name the same file, hunks end where their header's counts say (a content line that looks
//! like a header is content), and a path that could reach outside the repository or into a
//! `.git` directory (in any spelling a case-insensitive file system resolves to it) is
//! refused. Any other name git can write is read as it is (newlines, control characters,
//! bytes that are not UTF-8) and flagged later. What was summarised is therefore what
//! `git apply` would act on.
//!
//! A refusal never hides the change: the patch is read section by section (each `diff --git`
//! line starts one), so the review counts an unreadable section as changed files, flags the
//! names it seems to touch, and reports the refusal next to a summary of everything else. An entry that changes
//! content must state the file's mode (git writes it on the `index` line), so a symlink cannot
//! be retargeted by a hunk posing as a regular file: `git apply` refuses a wrong file type.
//! The one thing a patch does not state is the type of a purely renamed or copied file (no
//! `index` line): a renamed symlink is not flagged unless its content or mode changes too.
//!
//! Memory stays linear in the input: the parsed form borrows the hunk bodies from the patch.
//! Malformed input is an error, never a panic.

mod names;
mod rules;
mod sensitive;
mod toml_keys;

#[cfg(test)]
mod tests;

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

/// The largest patch accepted unless the caller says otherwise.
pub const DEFAULT_MAX_PATCH_BYTES: usize = 64 * 1024 * 1024;

/// The longest path accepted (Linux's `PATH_MAX`); longer names cannot be a real checkout.
pub(crate) const MAX_PATH_BYTES: usize = 4096;

/// Git's file modes, the only ones a patch may state.
pub(crate) const MODE_REGULAR: u32 = 0o100_644;
pub(crate) const MODE_EXECUTABLE: u32 = 0o100_755;
pub(crate) const MODE_SYMLINK: u32 = 0o120_000;
pub(crate) const MODE_GITLINK: u32 = 0o160_000;

/// The review header of a diff (docs/mcp.md "Diff").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiffSummary {
    /// Files changed, as `git diff --stat` counts them: distinct paths, so a type change
    /// (a file replaced by a symlink: two patch entries for one path) counts once.
    pub files: u64,
    /// `+` lines in all hunks (binary files count 0).
    pub additions: u64,
    /// `-` lines in all hunks (binary files count 0).
    pub deletions: u64,
    /// One entry per (path, kind), in patch order.
    pub sensitive_paths: Vec<SensitivePath>,
}

/// A changed path a reviewer should look at, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SensitivePath {
    /// Repository-relative, without the `a/`/`b/` prefix.
    pub path: String,
    pub kind: SensitiveKind,
    /// One line for a person; bounded, with no control characters.
    pub reason: String,
}

/// The sensitive kinds of docs/mcp.md ("Sensitive paths"); each kind's rules are the
/// table in `patch/rules.rs` (and the README section generated from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SensitiveKind {
    GitHook,
    GitConfig,
    CiWorkflow,
    PackageScript,
    AgentConfig,
    Symlink,
    ExecBit,
    /// Build and tool configuration that runs code (Dockerfile, conftest.py, .envrc, …).
    BuildConfig,
    /// Instructions a coding agent reads (GEMINI.md, .cursorrules, …).
    AgentInstructions,
    /// A name with control, invisible or bidirectional characters, or a look-alike of a
    /// sensitive name.
    UnusualPath,
    /// An entry the host could not read: counted, never dropped.
    UnreadableEntry,
}

impl SensitiveKind {
    /// Every kind, in the order the README lists them.
    pub const ALL: [SensitiveKind; 11] = [
        SensitiveKind::GitHook,
        SensitiveKind::GitConfig,
        SensitiveKind::CiWorkflow,
        SensitiveKind::PackageScript,
        SensitiveKind::BuildConfig,
        SensitiveKind::AgentConfig,
        SensitiveKind::AgentInstructions,
        SensitiveKind::Symlink,
        SensitiveKind::ExecBit,
        SensitiveKind::UnusualPath,
        SensitiveKind::UnreadableEntry,
    ];

    /// The `kind` string of the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            SensitiveKind::GitHook => "git-hook",
            SensitiveKind::GitConfig => "git-config",
            SensitiveKind::CiWorkflow => "ci-workflow",
            SensitiveKind::PackageScript => "package-script",
            SensitiveKind::AgentConfig => "agent-config",
            SensitiveKind::Symlink => "symlink",
            SensitiveKind::ExecBit => "exec-bit",
            SensitiveKind::BuildConfig => "build-config",
            SensitiveKind::AgentInstructions => "agent-instructions",
            SensitiveKind::UnusualPath => "unusual-path",
            SensitiveKind::UnreadableEntry => "unreadable-entry",
        }
    }
}

/// The sensitive-kinds table as README markdown (the README's copy is checked against it).
pub fn kinds_markdown() -> String {
    rules::markdown()
}

#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error(
        "the diff is {size} bytes, over the {} limit; remove generated or large files from \
         /workspace, or add them to .gitignore",
        human_bytes(*limit)
    )]
    TooLarge { size: usize, limit: usize },
    #[error("malformed patch, line {line}: {reason}")]
    Malformed { line: usize, reason: String },
    /// The review's refusal (see [`review`]): one or more malformed entries, already worded.
    #[error("{0}")]
    Refused(String),
}

/// One file entry of the patch (one `diff --git` section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePatch<'a> {
    /// The path before the change; `None` for a new file.
    pub old_path: Option<String>,
    /// The path after the change; `None` for a deleted file.
    pub new_path: Option<String>,
    /// The mode the patch says the file had (`old mode`, `deleted file mode`, or the mode on
    /// the `index` line). `git apply` refuses the patch if the file's type differs (but only
    /// warns about a different executable bit). `None` when the patch states none, which only
    /// a new file or a pure rename/copy may do.
    pub old_mode: Option<u32>,
    /// The mode the patch gives the file (`new mode`, `new file mode`). `None`: the patch does
    /// not set one, and the file keeps the mode it has.
    pub new_mode: Option<u32>,
    pub is_new: bool,
    pub is_deleted: bool,
    pub is_rename: bool,
    pub is_copy: bool,
    /// A `GIT binary patch` or `Binary files … differ` entry: no hunks, no line counts.
    pub is_binary: bool,
    pub hunks: Vec<Hunk<'a>>,
    /// Line number (1-based) of the entry's `diff --git` line.
    pub line: usize,
}

impl FilePatch<'_> {
    /// The path the entry is about: the new path, or the old one for a deletion.
    pub fn path(&self) -> &str {
        self.new_path
            .as_deref()
            .or(self.old_path.as_deref())
            .unwrap_or_default()
    }

    pub fn additions(&self) -> u64 {
        self.hunks.iter().map(|h| h.additions).sum()
    }

    pub fn deletions(&self) -> u64 {
        self.hunks.iter().map(|h| h.deletions).sum()
    }
}

/// One `@@ -a,b +c,d @@` hunk; its lines borrow from the patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk<'a> {
    pub old_start: u64,
    pub old_lines: u64,
    pub new_start: u64,
    pub new_lines: u64,
    pub additions: u64,
    pub deletions: u64,
    /// The validated lines after the `@@` line, `\ No newline` markers included.
    body: &'a [u8],
}

impl<'a> Hunk<'a> {
    pub fn lines(&self) -> HunkLines<'a> {
        HunkLines { rest: self.body }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    Context,
    Added,
    Removed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HunkLine<'a> {
    pub kind: LineKind,
    /// The line without its `' '`/`+`/`-` marker and without its newline.
    pub content: &'a [u8],
    /// False when a `\ No newline at end of file` marker follows: the last line of its side.
    pub newline: bool,
}

#[derive(Debug, Clone)]
pub struct HunkLines<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for HunkLines<'a> {
    type Item = HunkLine<'a>;

    fn next(&mut self) -> Option<HunkLine<'a>> {
        loop {
            let (line, rest) = split_line(self.rest)?;
            self.rest = rest;
            let (kind, content) = match line.split_first() {
                Some((b' ', content)) => (LineKind::Context, content),
                Some((b'+', content)) => (LineKind::Added, content),
                Some((b'-', content)) => (LineKind::Removed, content),
                // A marker is consumed with the line it belongs to; nothing else is in a body.
                _ => continue,
            };
            let newline = self.rest.first() != Some(&b'\\');
            if !newline {
                self.rest = split_line(self.rest).map_or(&[][..], |(_, rest)| rest);
            }
            return Some(HunkLine {
                kind,
                content,
                newline,
            });
        }
    }
}

/// Reads `patch` into its file entries, refusing anything `git diff` would not have written.
pub fn parse(patch: &[u8], max_bytes: usize) -> Result<Vec<FilePatch<'_>>, PatchError> {
    let mut files = Vec::new();
    for entry in read_entries(patch, max_bytes)? {
        match entry {
            Entry::Parsed(file) => files.push(file),
            Entry::Unreadable(bad) => return Err(malformed(bad.line, bad.reason)),
        }
    }
    Ok(files)
}

/// One `diff --git` section of the patch (or text outside any), as the host read it.
#[derive(Debug)]
pub(crate) enum Entry<'a> {
    Parsed(FilePatch<'a>),
    Unreadable(Unreadable),
}

/// A section the parser refused: where, why, and what it seems to touch, so that the review
/// can still count and flag it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unreadable {
    /// 1-based line of the problem.
    pub line: usize,
    pub reason: String,
    /// The names its header lines seem to give (best effort, lossy).
    pub names: Vec<String>,
    /// How many files it may change, counted high: never fewer than `git apply` would touch.
    pub files: u64,
}

/// Splits `patch` at its `diff --git` lines and reads each section on its own, so that one
/// unreadable entry neither hides the others nor goes uncounted. (A valid patch has no other
/// line starting `diff --git `: hunk lines start with ` `, `+` or `-`, and base85 data has no
/// spaces.) Only an oversize patch is an error.
pub(crate) fn read_entries(patch: &[u8], max_bytes: usize) -> Result<Vec<Entry<'_>>, PatchError> {
    if patch.len() > max_bytes {
        return Err(PatchError::TooLarge {
            size: patch.len(),
            limit: max_bytes,
        });
    }
    let mut entries = Vec::new();
    let mut start = 0usize;
    let mut start_line = 1usize;
    let mut pos = 0usize;
    let mut line_no = 1usize;
    loop {
        let at_end = pos >= patch.len();
        let at_header = !at_end && patch[pos..].starts_with(b"diff --git ");
        if (at_header || at_end) && pos > start {
            entries.push(read_section(&patch[..pos], start, start_line));
            start = pos;
            start_line = line_no;
        }
        if at_end {
            break;
        }
        pos = patch[pos..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(patch.len(), |i| pos + i + 1);
        line_no += 1;
    }
    if patch.last().is_some_and(|&b| b != b'\n') {
        let reason = "the patch does not end with a newline (truncated?)".to_owned();
        match entries.last_mut() {
            Some(Entry::Unreadable(bad)) => bad.reason = format!("{reason}; {}", bad.reason),
            Some(Entry::Parsed(file)) => {
                let names = file
                    .old_path
                    .iter()
                    .chain(&file.new_path)
                    .cloned()
                    .collect();
                let line = file.line;
                if let Some(last) = entries.last_mut() {
                    *last = Entry::Unreadable(Unreadable {
                        line,
                        reason,
                        names,
                        files: 1,
                    });
                }
            }
            None => {}
        }
    }
    Ok(entries)
}

/// Reads the section `input[start..]` (which starts at line `start_line`).
fn read_section(input: &[u8], start: usize, start_line: usize) -> Entry<'_> {
    let mut lines = Lines {
        input,
        pos: start,
        line_no: start_line - 1,
    };
    let result = match lines.next() {
        Some(line) => match line.strip_prefix(b"diff --git ") {
            Some(header) => parse_file(&mut lines, header).and_then(|file| match lines.next() {
                None => Ok(file),
                Some(line) => Err(lines.error(format!(
                    "expected a 'diff --git' line, found {}",
                    snippet(line)
                ))),
            }),
            None => Err(lines.error(format!(
                "expected a 'diff --git' line, found {}",
                snippet(line)
            ))),
        },
        None => Err(lines.eof("an empty section")),
    };
    match result {
        Ok(file) => Entry::Parsed(file),
        Err(err) => {
            let (line, reason) = match err {
                PatchError::Malformed { line, reason } => (line, reason),
                other => (start_line, other.to_string()),
            };
            let section = &input[start..];
            let is_entry = section.starts_with(b"diff --git ");
            let labels = section
                .split(|&b| b == b'\n')
                .filter(|l| l.starts_with(b"+++ "))
                .count();
            let labels = u64::try_from(labels).unwrap_or(u64::MAX);
            Entry::Unreadable(Unreadable {
                line,
                reason,
                names: guess_names(section),
                files: if is_entry { labels.max(1) } else { labels },
            })
        }
    }
}

/// The names an unreadable section seems to give, read leniently: its `diff --git` line and
/// its `---`/`+++`/rename/copy lines, decoded if quoted, without their `a/`/`b/` prefix.
fn guess_names(section: &[u8]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut add = |bytes: &[u8]| {
        let bytes = bytes
            .strip_prefix(b"a/")
            .or_else(|| bytes.strip_prefix(b"b/"))
            .unwrap_or(bytes);
        let name = String::from_utf8_lossy(bytes).into_owned();
        if !name.is_empty() && name != "/dev/null" && !names.contains(&name) {
            names.push(name);
        }
    };
    let decode = |v: &[u8]| -> Vec<u8> {
        let v = v.strip_suffix(b"\t").unwrap_or(v);
        match unquote(v) {
            Ok((name, _)) => name,
            Err(_) => v.to_vec(),
        }
    };
    // Every line, hunks included: a traditional patch smuggled into a section is what
    // `git apply` would act on.
    for line in section.split(|&b| b == b'\n') {
        if let Some(header) = line.strip_prefix(b"diff --git ") {
            match header_same_name(header) {
                Some(name) => add(&name),
                None => add(&decode(header)),
            }
            continue;
        }
        for prefix in [
            &b"--- "[..],
            b"+++ ",
            b"rename from ",
            b"rename to ",
            b"copy from ",
            b"copy to ",
        ] {
            if let Some(v) = line.strip_prefix(prefix) {
                add(&decode(v));
            }
        }
    }
    names.truncate(16);
    names
}

/// The host's review of a patch: the summary, and why the patch must not be trusted if it
/// must not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Review {
    /// Always filled in, from the entries the host could read and (counted high, flagged) the
    /// ones it could not.
    pub summary: DiffSummary,
    /// The first reason the patch is refused (with how many others), or `None`.
    pub refusal: Option<String>,
}

/// Reads `patch` and summarises it for review, refused parts included: a patch the parser
/// refuses still gets every entry counted and every name it can find flagged, so that a
/// refusal never looks like an empty change.
pub fn review(
    patch: &[u8],
    max_bytes: usize,
    baseline: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Review {
    let entries = match read_entries(patch, max_bytes) {
        Ok(entries) => entries,
        Err(err) => {
            let headers = patch
                .split(|&b| b == b'\n')
                .filter(|l| l.starts_with(b"diff --git "))
                .count();
            let mut summary = DiffSummary {
                files: u64::try_from(headers).unwrap_or(u64::MAX),
                ..DiffSummary::default()
            };
            let mut found = sensitive::Found::default();
            sensitive::classify_unreadable(&[], 1, &err.to_string(), &mut found);
            summary.sensitive_paths = found.into_vec();
            return Review {
                summary,
                refusal: Some(err.to_string()),
            };
        }
    };
    let mut distinct: HashSet<&str> = HashSet::new();
    let mut files = 0u64;
    let mut summary = DiffSummary::default();
    let mut found = sensitive::Found::default();
    let mut refusals = Vec::new();
    for entry in &entries {
        match entry {
            Entry::Parsed(file) => {
                // A lossy name (U+FFFD) may stand for several real ones: count each.
                let path = file.path();
                if path.contains('\u{fffd}') || distinct.insert(path) {
                    files += 1;
                }
                summary.additions += file.additions();
                summary.deletions += file.deletions();
                sensitive::classify(file, baseline, &mut found);
            }
            Entry::Unreadable(bad) => {
                files = files.saturating_add(bad.files);
                sensitive::classify_unreadable(&bad.names, bad.line, &bad.reason, &mut found);
                refusals.push(malformed(bad.line, bad.reason.clone()).to_string());
            }
        }
    }
    summary.files = files;
    summary.sensitive_paths = found.into_vec();
    let refusal = refusals.first().map(|first| match refusals.len() {
        1 => first.clone(),
        n => format!("{first} (and {} more unreadable entries)", n - 1),
    });
    Review { summary, refusal }
}

/// Parses `patch` and summarises it for review. `baseline` returns the imported (pre-change)
/// content of a path when the host has it; it is used to judge `package.json` scripts and
/// symlink targets, and a path it cannot provide is flagged conservatively. A patch the host
/// refuses is an error; [`review`] gives its summary too.
pub fn summarize(
    patch: &[u8],
    max_bytes: usize,
    baseline: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Result<DiffSummary, PatchError> {
    if patch.len() > max_bytes {
        return Err(PatchError::TooLarge {
            size: patch.len(),
            limit: max_bytes,
        });
    }
    let review = review(patch, max_bytes, baseline);
    match review.refusal {
        None => Ok(review.summary),
        Some(reason) => Err(PatchError::Refused(reason)),
    }
}

/// Applies `hunks` to `old` exactly where they say (no fuzz, no offsets): the content
/// `git apply` produces when the hunks apply in place, which they do for a patch made from
/// the same baseline.
pub(crate) fn apply_hunks(old: &[u8], hunks: &[Hunk<'_>]) -> Result<Vec<u8>, String> {
    let mut old_lines = Vec::new();
    let mut rest = old;
    while let Some((_, tail)) = split_line(rest) {
        let len = rest.len() - tail.len();
        old_lines.push(&rest[..len]);
        rest = tail;
    }
    let same = |old_line: &[u8], line: &HunkLine<'_>| match old_line.strip_suffix(b"\n") {
        Some(text) => line.newline && text == line.content,
        None => !line.newline && old_line == line.content,
    };
    let mut out = Vec::with_capacity(old.len());
    let mut next = 0usize;
    for hunk in hunks {
        let start = usize::try_from(hunk.old_start).map_err(|_| "hunk start out of range")?;
        let start = if hunk.old_lines == 0 {
            start
        } else {
            start.saturating_sub(1)
        };
        if start < next || start > old_lines.len() {
            return Err(format!(
                "hunk at old line {} is out of place",
                hunk.old_start
            ));
        }
        out.extend(old_lines[next..start].iter().copied().flatten());
        next = start;
        for line in hunk.lines() {
            match line.kind {
                LineKind::Context | LineKind::Removed => {
                    let Some(old_line) = old_lines.get(next) else {
                        return Err(format!(
                            "hunk at old line {} runs past the end",
                            hunk.old_start
                        ));
                    };
                    if !same(old_line, &line) {
                        return Err(format!(
                            "hunk at old line {} does not match line {}",
                            hunk.old_start,
                            next + 1
                        ));
                    }
                    next += 1;
                    if line.kind == LineKind::Context {
                        out.extend_from_slice(old_line);
                    }
                }
                LineKind::Added => {
                    out.extend_from_slice(line.content);
                    if line.newline {
                        out.push(b'\n');
                    }
                }
            }
        }
    }
    out.extend(old_lines[next..].iter().copied().flatten());
    Ok(out)
}

/// `text` made safe to show: control and bidirectional-override characters become spaces,
/// and at most `max_chars` characters are kept (then `…`).
pub(crate) fn sanitize(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars.saturating_mul(4)));
    for (i, c) in text.chars().enumerate() {
        if i == max_chars {
            out.push('…');
            break;
        }
        out.push(if c.is_control() || is_bidi_control(c) {
            ' '
        } else {
            c
        });
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The parser.

struct Lines<'a> {
    input: &'a [u8],
    pos: usize,
    /// The number of the line `next` returned last (1-based; 0 before the first).
    line_no: usize,
}

impl<'a> Lines<'a> {
    fn peek(&self) -> Option<&'a [u8]> {
        split_line(self.input.get(self.pos..)?).map(|(line, _)| line)
    }

    fn next(&mut self) -> Option<&'a [u8]> {
        let (line, rest) = split_line(self.input.get(self.pos..)?)?;
        self.pos = self.input.len() - rest.len();
        self.line_no += 1;
        Some(line)
    }

    /// An error about the line `next` returned last.
    fn error(&self, reason: impl Into<String>) -> PatchError {
        malformed(self.line_no, reason)
    }

    /// An error about input that ended too early.
    fn eof(&self, reason: &str) -> PatchError {
        malformed(
            self.line_no + 1,
            format!("the patch ends early: {reason} (truncated?)"),
        )
    }
}

/// The line at the start of `s` (without its newline) and what follows it.
fn split_line(s: &[u8]) -> Option<(&[u8], &[u8])> {
    if s.is_empty() {
        return None;
    }
    Some(match s.iter().position(|&b| b == b'\n') {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, &[]),
    })
}

fn malformed(line: usize, reason: impl Into<String>) -> PatchError {
    PatchError::Malformed {
        line,
        reason: reason.into(),
    }
}

/// A bounded, printable excerpt of a guest-written line for an error message.
fn snippet(line: &[u8]) -> String {
    format!(
        "'{}'",
        sanitize(&String::from_utf8_lossy(&line[..line.len().min(240)]), 60)
    )
}

/// `--- ` / `+++ ` operands.
#[derive(Debug, PartialEq, Eq)]
enum Label {
    DevNull,
    Path(String),
}

/// What the extended header lines of one entry said.
#[derive(Default)]
struct Headers<'a> {
    old_mode: Option<u32>,
    new_mode: Option<u32>,
    deleted_file_mode: Option<u32>,
    new_file_mode: Option<u32>,
    similarity: Option<u8>,
    dissimilarity: Option<u8>,
    rename_from: Option<String>,
    rename_to: Option<String>,
    copy_from: Option<String>,
    copy_to: Option<String>,
    index: Option<Option<u32>>,
    old_label: Option<Label>,
    new_label: Option<Label>,
    hunks: Vec<Hunk<'a>>,
    binary: bool,
}

fn set_once<T>(
    lines: &Lines<'_>,
    slot: &mut Option<T>,
    value: T,
    what: &str,
) -> Result<(), PatchError> {
    if slot.is_some() {
        return Err(lines.error(format!("a second '{what}' line in one file entry")));
    }
    *slot = Some(value);
    Ok(())
}

fn parse_file<'a>(lines: &mut Lines<'a>, header: &'a [u8]) -> Result<FilePatch<'a>, PatchError> {
    let header_line = lines.line_no;
    let mut h = Headers::default();
    while let Some(line) = lines.peek() {
        if line.starts_with(b"diff --git ") {
            break;
        }
        lines.next();
        let mode = |v: &[u8]| {
            parse_mode(v).ok_or_else(|| lines.error(format!("invalid mode {}", snippet(v))))
        };
        let name = |v: &[u8]| parse_name(v).map_err(|why| lines.error(why));
        if let Some(v) = line.strip_prefix(b"old mode ") {
            set_once(lines, &mut h.old_mode, mode(v)?, "old mode")?;
        } else if let Some(v) = line.strip_prefix(b"new mode ") {
            set_once(lines, &mut h.new_mode, mode(v)?, "new mode")?;
        } else if let Some(v) = line.strip_prefix(b"deleted file mode ") {
            set_once(
                lines,
                &mut h.deleted_file_mode,
                mode(v)?,
                "deleted file mode",
            )?;
        } else if let Some(v) = line.strip_prefix(b"new file mode ") {
            set_once(lines, &mut h.new_file_mode, mode(v)?, "new file mode")?;
        } else if let Some(v) = line.strip_prefix(b"similarity index ") {
            let pct = parse_percent(v).ok_or_else(|| lines.error("invalid similarity index"))?;
            set_once(lines, &mut h.similarity, pct, "similarity index")?;
        } else if let Some(v) = line.strip_prefix(b"dissimilarity index ") {
            let pct = parse_percent(v).ok_or_else(|| lines.error("invalid dissimilarity index"))?;
            set_once(lines, &mut h.dissimilarity, pct, "dissimilarity index")?;
        } else if let Some(v) = line.strip_prefix(b"rename from ") {
            set_once(lines, &mut h.rename_from, name(v)?, "rename from")?;
        } else if let Some(v) = line.strip_prefix(b"rename to ") {
            set_once(lines, &mut h.rename_to, name(v)?, "rename to")?;
        } else if let Some(v) = line.strip_prefix(b"copy from ") {
            set_once(lines, &mut h.copy_from, name(v)?, "copy from")?;
        } else if let Some(v) = line.strip_prefix(b"copy to ") {
            set_once(lines, &mut h.copy_to, name(v)?, "copy to")?;
        } else if let Some(v) = line.strip_prefix(b"index ") {
            let mode = parse_index(v)
                .ok_or_else(|| lines.error(format!("invalid index line {}", snippet(line))))?;
            set_once(lines, &mut h.index, mode, "index")?;
        } else if let Some(v) = line.strip_prefix(b"--- ") {
            h.old_label = Some(parse_label(v, b"a/").map_err(|why| lines.error(why))?);
            let Some(line) = lines.next() else {
                return Err(lines.eof("a '---' line without its '+++' line"));
            };
            let Some(v) = line.strip_prefix(b"+++ ") else {
                return Err(lines.error("a '---' line must be followed by a '+++' line"));
            };
            h.new_label = Some(parse_label(v, b"b/").map_err(|why| lines.error(why))?);
            h.hunks = parse_hunks(lines)?;
            break;
        } else if line.starts_with(b"Binary files ") && line.ends_with(b" differ") {
            h.binary = true;
            break;
        } else if line == b"GIT binary patch" {
            parse_binary(lines)?;
            h.binary = true;
            break;
        } else {
            return Err(lines.error(format!(
                "unexpected line in the file entry that starts at line {header_line}: {}",
                snippet(line)
            )));
        }
    }
    assemble(h, header, header_line).map_err(|why| malformed(header_line, why))
}

/// Checks that the header lines of one entry fit together and builds the entry.
fn assemble<'a>(h: Headers<'a>, header: &[u8], line: usize) -> Result<FilePatch<'a>, String> {
    let is_new = h.new_file_mode.is_some();
    let is_deleted = h.deleted_file_mode.is_some();
    let is_rename = h.rename_from.is_some() || h.rename_to.is_some();
    let is_copy = h.copy_from.is_some() || h.copy_to.is_some();
    if is_new && is_deleted {
        return Err("a file entry cannot both create and delete a file".into());
    }
    if h.old_mode.is_some() != h.new_mode.is_some() {
        return Err("'old mode' and 'new mode' come together".into());
    }
    if h.old_mode.is_some() && h.old_mode == h.new_mode {
        return Err("'old mode' and 'new mode' are the same".into());
    }
    if (is_new || is_deleted) && h.old_mode.is_some() {
        return Err("a new or deleted file cannot also change mode".into());
    }
    if h.rename_from.is_some() != h.rename_to.is_some()
        || h.copy_from.is_some() != h.copy_to.is_some()
    {
        return Err("'rename from'/'rename to' and 'copy from'/'copy to' come in pairs".into());
    }
    if is_rename && is_copy {
        return Err("a file entry cannot be both a rename and a copy".into());
    }
    if (is_new || is_deleted) && (is_rename || is_copy) {
        return Err("a new or deleted file cannot also be a rename or copy".into());
    }
    if h.similarity.is_some() && !(is_rename || is_copy) {
        return Err("'similarity index' without a rename or copy".into());
    }
    let index_mode = h.index.flatten();
    if index_mode.is_some() && (is_new || is_deleted || h.old_mode.is_some()) {
        return Err("the 'index' line states a mode although another line gives it".into());
    }
    match (&h.old_label, is_new) {
        (Some(Label::DevNull), false) => {
            return Err("'--- /dev/null' without 'new file mode'".into())
        }
        (Some(Label::Path(_)), true) => {
            return Err("a new file's '---' line must be /dev/null".into())
        }
        _ => {}
    }
    match (&h.new_label, is_deleted) {
        (Some(Label::DevNull), false) => {
            return Err("'+++ /dev/null' without 'deleted file mode'".into())
        }
        (Some(Label::Path(_)), true) => {
            return Err("a deleted file's '+++' line must be /dev/null".into())
        }
        _ => {}
    }

    // Every line that names the old (new) file must name the same one.
    let mut old_name = None;
    let mut new_name = None;
    let from = h.rename_from.or(h.copy_from);
    let to = h.rename_to.or(h.copy_to);
    let old_label = match h.old_label {
        Some(Label::Path(p)) => Some(p),
        _ => None,
    };
    let new_label = match h.new_label {
        Some(Label::Path(p)) => Some(p),
        _ => None,
    };
    for name in [from, old_label].into_iter().flatten() {
        agree(&mut old_name, name, "old")?;
    }
    for name in [to, new_label].into_iter().flatten() {
        agree(&mut new_name, name, "new")?;
    }
    let (old_path, new_path) = if old_name.is_none() && new_name.is_none() {
        let name = header_same_name(header).ok_or(
            "cannot tell the file name from the 'diff --git' line (its two names differ or it \
             is garbled, and no rename/copy or ---/+++ line names the file)",
        )?;
        let name = validate_path(&name)?;
        (Some(name.clone()), Some(name))
    } else {
        // A new (deleted) file's header names its one path twice.
        let (Some(a), Some(b)) = (
            old_name.as_ref().or(new_name.as_ref()),
            new_name.as_ref().or(old_name.as_ref()),
        ) else {
            return Err("no file name".into());
        };
        if !header_matches(header, a, b) {
            return Err(format!(
                "the 'diff --git' line does not name a/{} b/{} as the lines below it do",
                sanitize(a, 120),
                sanitize(b, 120)
            ));
        }
        (old_name, new_name)
    };
    let (old_path, new_path) = match (is_new, is_deleted) {
        (true, _) => (None, new_path),
        (_, true) => (old_path, None),
        _ => (old_path, new_path),
    };
    if (is_rename || is_copy) && old_path == new_path {
        return Err("a rename or copy must name two different paths".into());
    }
    if !(is_rename || is_copy || is_new || is_deleted) && old_path != new_path {
        return Err("the old and new names differ but there is no rename or copy line".into());
    }

    let old_mode = h.old_mode.or(h.deleted_file_mode).or(index_mode);
    let new_mode = h.new_mode.or(h.new_file_mode);
    let has_content = !h.hunks.is_empty() || h.binary;
    if has_content && !is_new && old_mode.is_none() {
        return Err(
            "the entry changes content but states no mode (no 'index … <mode>' line)".into(),
        );
    }
    if !(is_new || is_deleted || is_rename || is_copy || h.old_mode.is_some() || has_content) {
        return Err("the file entry changes nothing".into());
    }
    if (is_new || is_deleted) && h.hunks.len() > 1 {
        return Err("a new or deleted file has a single hunk".into());
    }
    if is_new
        && h.hunks
            .iter()
            .any(|hk| hk.old_start != 0 || hk.old_lines != 0)
    {
        return Err("a new file's hunk must start at -0,0".into());
    }
    if is_deleted
        && h.hunks
            .iter()
            .any(|hk| hk.new_start != 0 || hk.new_lines != 0)
    {
        return Err("a deleted file's hunk must end at +0,0".into());
    }
    for pair in h.hunks.windows(2) {
        let ordered = |start_a: u64, len_a: u64, start_b: u64, len_b: u64| {
            // An empty range `-5,0` sits after line 5.
            let eff = |start: u64, len: u64| {
                if len == 0 {
                    start.checked_add(1)
                } else {
                    Some(start)
                }
            };
            match (
                eff(start_a, len_a).and_then(|s| s.checked_add(len_a)),
                eff(start_b, len_b),
            ) {
                (Some(end_a), Some(start_b)) => end_a <= start_b,
                _ => false,
            }
        };
        let (a, b) = (&pair[0], &pair[1]);
        if !ordered(a.old_start, a.old_lines, b.old_start, b.old_lines)
            || !ordered(a.new_start, a.new_lines, b.new_start, b.new_lines)
        {
            return Err(format!(
                "hunks overlap or are out of order (at old line {})",
                b.old_start
            ));
        }
    }
    if let Some(ended) = h.hunks.iter().rev().skip(1).find(|hk| hunk_reaches_eof(hk)) {
        return Err(format!(
            "a hunk follows the one ending the file (at old line {})",
            ended.old_start
        ));
    }
    Ok(FilePatch {
        old_path,
        new_path,
        old_mode,
        new_mode,
        is_new,
        is_deleted,
        is_rename,
        is_copy,
        is_binary: h.binary,
        hunks: h.hunks,
        line,
    })
}

fn agree(slot: &mut Option<String>, name: String, side: &str) -> Result<(), String> {
    match slot {
        Some(seen) if *seen != name => Err(format!(
            "inconsistent {side} file name: '{}' and '{}'",
            sanitize(seen, 120),
            sanitize(&name, 120)
        )),
        Some(_) => Ok(()),
        None => {
            *slot = Some(name);
            Ok(())
        }
    }
}

fn hunk_reaches_eof(hunk: &Hunk<'_>) -> bool {
    hunk.lines().any(|line| !line.newline)
}

/// The one path of a `diff --git` line whose two names are the same (after their `a/` and
/// `b/`), or `None`. Unquoted names may contain spaces, so the split is where both halves
/// are equal: the middle.
fn header_same_name(header: &[u8]) -> Option<Vec<u8>> {
    if header.first() == Some(&b'"') {
        let (first, used) = unquote(header).ok()?;
        let tail = header.get(used..)?.strip_prefix(b" ")?;
        let (second, used) = unquote(tail).ok()?;
        if used != tail.len() {
            return None;
        }
        let name = first.strip_prefix(b"a/")?;
        return (second.strip_prefix(b"b/")? == name).then(|| name.to_vec());
    }
    // "a/" name " b/" name
    let len = header.len().checked_sub(5)?;
    if len % 2 != 0 {
        return None;
    }
    let half = len / 2;
    let first = header.strip_prefix(b"a/")?.get(..half)?;
    let second = header.get(half + 2..)?.strip_prefix(b" b/")?;
    (first == second).then(|| first.to_vec())
}

/// Whether a `diff --git` line names `a/{old} b/{new}`, each side quoted or not. The names
/// are the lossy (U+FFFD) forms, so the line is compared in that form too.
fn header_matches(header: &[u8], old: &str, new: &str) -> bool {
    fn strip_name<'s>(s: &'s [u8], prefix: &[u8], name: &str) -> Option<&'s [u8]> {
        if s.first() == Some(&b'"') {
            let (decoded, used) = unquote(s).ok()?;
            let decoded = String::from_utf8_lossy(&decoded);
            (decoded.as_bytes().strip_prefix(prefix)? == name.as_bytes())
                .then(|| s.get(used..))
                .flatten()
        } else {
            s.strip_prefix(prefix)?.strip_prefix(name.as_bytes())
        }
    }
    let header = String::from_utf8_lossy(header);
    strip_name(header.as_bytes(), b"a/", old)
        .and_then(|rest| rest.strip_prefix(b" "))
        .and_then(|rest| strip_name(rest, b"b/", new))
        .is_some_and(<[u8]>::is_empty)
}

/// A `rename from`/`copy to`… operand: a path without prefix, C-quoted or not.
fn parse_name(v: &[u8]) -> Result<String, String> {
    if v.first() == Some(&b'"') {
        let (name, used) = unquote(v)?;
        if used != v.len() {
            return Err("text after a quoted file name".into());
        }
        validate_path(&name)
    } else {
        validate_path(v)
    }
}

/// A `---`/`+++` operand: `/dev/null` or `prefix` + path, C-quoted or not. Git appends a tab
/// when the name contains a space.
fn parse_label(v: &[u8], prefix: &[u8]) -> Result<Label, String> {
    let v = v.strip_suffix(b"\t").unwrap_or(v);
    if v == b"/dev/null" {
        return Ok(Label::DevNull);
    }
    let name = if v.first() == Some(&b'"') {
        let (name, used) = unquote(v)?;
        if used != v.len() {
            return Err("text after a quoted file name".into());
        }
        name
    } else {
        v.to_vec()
    };
    let Some(path) = name.strip_prefix(prefix) else {
        return Err(format!(
            "a file name must start with '{}': {}",
            String::from_utf8_lossy(prefix),
            snippet(&name)
        ));
    };
    validate_path(path).map(Label::Path)
}

/// Decodes a C-quoted string at the start of `s` (git's `quote_c_style`): the bytes and how
/// much of `s` it took, closing quote included.
fn unquote(s: &[u8]) -> Result<(Vec<u8>, usize), String> {
    let bad = |what: &str| Err(format!("bad quoted file name: {what}"));
    if s.first() != Some(&b'"') {
        return bad("no opening quote");
    }
    let mut out = Vec::new();
    let mut i = 1;
    while let Some(&b) = s.get(i) {
        i += 1;
        match b {
            b'"' => return Ok((out, i)),
            b'\\' => {
                let Some(&e) = s.get(i) else {
                    return bad("ends after a backslash");
                };
                i += 1;
                out.push(match e {
                    b'"' | b'\\' => e,
                    b'a' => 0x07,
                    b'b' => 0x08,
                    b'f' => 0x0c,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'v' => 0x0b,
                    b'0'..=b'3' => {
                        let octal =
                            |b: Option<&u8>| b.copied().filter(|b| (b'0'..=b'7').contains(b));
                        let (Some(d1), Some(d2)) = (octal(s.get(i)), octal(s.get(i + 1))) else {
                            return bad("an octal escape needs three digits");
                        };
                        i += 2;
                        ((e - b'0') << 6) | ((d1 - b'0') << 3) | (d2 - b'0')
                    }
                    _ => return bad("unknown escape"),
                });
            }
            _ => out.push(b),
        }
    }
    bad("no closing quote")
}

/// A repository-relative path as the patch wrote it, refused (never normalised) unless it is
/// plainly inside the repository and outside git's own directory. Any other byte string git
/// can write is a name: control characters and newlines (flagged `unusual-path` later), and
/// bytes that are not UTF-8 (kept as U+FFFD, flagged too).
fn validate_path(bytes: &[u8]) -> Result<String, String> {
    if bytes.len() > MAX_PATH_BYTES {
        return Err(format!("a path is longer than {MAX_PATH_BYTES} bytes"));
    }
    if bytes.contains(&0) {
        return Err("a path contains a NUL byte, which no file name can".into());
    }
    let path = String::from_utf8_lossy(bytes).into_owned();
    let shown = || sanitize(&path, 120);
    if path.is_empty() {
        return Err("empty path".into());
    }
    if path.starts_with('/') {
        return Err(format!(
            "path escapes the repository (absolute path): {}",
            shown()
        ));
    }
    // A backslash separates directories on Windows, where the patch may be applied too.
    if path.split(['/', '\\']).any(|c| c == "..") {
        return Err(format!("path escapes the repository: {}", shown()));
    }
    if path.split('/').any(|c| c.is_empty() || c == ".") {
        return Err(format!("path has an empty or '.' component: {}", shown()));
    }
    // git never diffs its own directory; on a case-insensitive or Windows file system any
    // spelling of it (`.GIT`, `.git.`, `GIT~1`, `.gıt`) is that directory.
    if let Some(dir) = path.split(['/', '\\']).find(|c| names::is_git_dir(c)) {
        return Err(format!(
            "path {} is inside git's own directory ('{}'): a patch never writes there, and \
             applied on a case-insensitive file system it would change git's config or hooks",
            shown(),
            sanitize(dir, 40)
        ));
    }
    Ok(path)
}

fn parse_mode(v: &[u8]) -> Option<u32> {
    Some(match v {
        b"100644" => MODE_REGULAR,
        b"100755" => MODE_EXECUTABLE,
        b"120000" => MODE_SYMLINK,
        b"160000" => MODE_GITLINK,
        _ => return None,
    })
}

fn parse_percent(v: &[u8]) -> Option<u8> {
    let digits = v.strip_suffix(b"%")?;
    if digits.is_empty() || digits.len() > 3 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value = digits
        .iter()
        .fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    u8::try_from(value).ok().filter(|&v| v <= 100)
}

/// `index <hex>..<hex>[ <mode>]`: the mode, if any (`Some(None)` when there is none).
fn parse_index(v: &[u8]) -> Option<Option<u32>> {
    let (hashes, mode) = match v.iter().position(|&b| b == b' ') {
        Some(i) => (&v[..i], Some(parse_mode(&v[i + 1..])?)),
        None => (v, None),
    };
    let dots = hashes.windows(2).position(|w| w == b"..")?;
    let is_hash = |h: &[u8]| {
        (4..=64).contains(&h.len()) && h.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    (is_hash(&hashes[..dots]) && is_hash(&hashes[dots + 2..])).then_some(mode)
}

fn parse_hunks<'a>(lines: &mut Lines<'a>) -> Result<Vec<Hunk<'a>>, PatchError> {
    let mut hunks = Vec::new();
    while let Some(line) = lines.peek() {
        if !line.starts_with(b"@@ ") {
            break;
        }
        lines.next();
        hunks.push(parse_hunk(lines, line)?);
    }
    if hunks.is_empty() {
        return match lines.peek() {
            None => Err(lines.eof("'---'/'+++' lines without a hunk")),
            Some(_) => {
                lines.next();
                Err(lines.error("expected a hunk ('@@ -a,b +c,d @@') after the '+++' line"))
            }
        };
    }
    Ok(hunks)
}

fn parse_hunk<'a>(lines: &mut Lines<'a>, header: &[u8]) -> Result<Hunk<'a>, PatchError> {
    let Some((old_start, old_lines, new_start, new_lines)) = parse_hunk_header(header) else {
        return Err(lines.error(format!("invalid hunk header {}", snippet(header))));
    };
    if (old_start == 0 && old_lines != 0) || (new_start == 0 && new_lines != 0) {
        return Err(lines.error("a hunk range with lines cannot start at line 0"));
    }
    let body_start = lines.pos;
    let (mut old_left, mut new_left) = (old_lines, new_lines);
    let (mut additions, mut deletions) = (0u64, 0u64);
    // The kind of the last content line, while a `\ No newline` marker may still follow it.
    let mut last: Option<LineKind> = None;
    // Set once a side's last line (one without a newline) went by.
    let (mut old_ended, mut new_ended) = (false, false);
    let end_side = |kind: LineKind, old_ended: &mut bool, new_ended: &mut bool| match kind {
        LineKind::Context => (*old_ended, *new_ended) = (true, true),
        LineKind::Removed => *old_ended = true,
        LineKind::Added => *new_ended = true,
    };
    while old_left > 0 || new_left > 0 {
        let Some(line) = lines.next() else {
            return Err(lines.eof(&format!(
                "the hunk needs {old_left} more old and {new_left} more new lines"
            )));
        };
        let kind = match line.first() {
            Some(b' ') => LineKind::Context,
            Some(b'-') => LineKind::Removed,
            Some(b'+') => LineKind::Added,
            Some(b'\\') if is_no_newline_marker(line) => {
                let Some(kind) = last.take() else {
                    return Err(lines.error("a '\\ No newline' marker that follows no line"));
                };
                end_side(kind, &mut old_ended, &mut new_ended);
                continue;
            }
            _ => {
                return Err(lines.error(format!(
                    "the hunk needs {old_left} more old and {new_left} more new lines, but this \
                     is not a hunk line: {}",
                    snippet(line)
                )));
            }
        };
        let (uses_old, uses_new) = match kind {
            LineKind::Context => (true, true),
            LineKind::Removed => (true, false),
            LineKind::Added => (false, true),
        };
        if (uses_old && old_left == 0) || (uses_new && new_left == 0) {
            return Err(lines.error("the hunk has more lines than its header says"));
        }
        if (uses_old && old_ended) || (uses_new && new_ended) {
            return Err(lines.error("a line after the one marked '\\ No newline at end of file'"));
        }
        if uses_old {
            old_left -= 1;
        }
        if uses_new {
            new_left -= 1;
        }
        match kind {
            LineKind::Added => additions += 1,
            LineKind::Removed => deletions += 1,
            LineKind::Context => {}
        }
        last = Some(kind);
    }
    if let Some(line) = lines.peek() {
        if line.first() == Some(&b'\\') {
            lines.next();
            if !is_no_newline_marker(line) || last.is_none() {
                return Err(lines.error("a misplaced '\\ No newline at end of file' marker"));
            }
        }
    }
    if additions == 0 && deletions == 0 {
        return Err(lines.error("a hunk that changes nothing"));
    }
    let body = lines.input.get(body_start..lines.pos).unwrap_or_default();
    Ok(Hunk {
        old_start,
        old_lines,
        new_start,
        new_lines,
        additions,
        deletions,
        body,
    })
}

/// `\ No newline at end of file`, in whatever language: git apply only checks the `\ ` and
/// a sane length.
fn is_no_newline_marker(line: &[u8]) -> bool {
    line.starts_with(b"\\ ") && line.len() >= 11
}

/// `@@ -a[,b] +c[,d] @@[ section]`.
fn parse_hunk_header(line: &[u8]) -> Option<(u64, u64, u64, u64)> {
    fn number(s: &[u8]) -> Option<(u64, &[u8])> {
        let len = s.iter().take_while(|b| b.is_ascii_digit()).count();
        if len == 0 || len > 19 {
            return None;
        }
        let value = s[..len].iter().try_fold(0u64, |n, d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })?;
        Some((value, &s[len..]))
    }
    fn range(s: &[u8]) -> Option<(u64, u64, &[u8])> {
        let (start, rest) = number(s)?;
        match rest.strip_prefix(b",") {
            Some(rest) => {
                let (count, rest) = number(rest)?;
                Some((start, count, rest))
            }
            None => Some((start, 1, rest)),
        }
    }
    let (old_start, old_lines, rest) = range(line.strip_prefix(b"@@ -")?)?;
    let (new_start, new_lines, rest) = range(rest.strip_prefix(b" +")?)?;
    let rest = rest.strip_prefix(b" @@")?;
    (rest.is_empty() || rest[0] == b' ').then_some((old_start, old_lines, new_start, new_lines))
}

/// A `GIT binary patch` block: a forward and an optional reverse hunk, each `literal N` or
/// `delta N`, base85 lines, then an empty line. The data is checked for shape, not decoded.
fn parse_binary(lines: &mut Lines<'_>) -> Result<(), PatchError> {
    parse_binary_hunk(lines)?;
    if lines
        .peek()
        .is_some_and(|l| l.starts_with(b"literal ") || l.starts_with(b"delta "))
    {
        parse_binary_hunk(lines)?;
    }
    Ok(())
}

fn parse_binary_hunk(lines: &mut Lines<'_>) -> Result<(), PatchError> {
    let Some(line) = lines.next() else {
        return Err(lines.eof("'GIT binary patch' without data"));
    };
    let size = line
        .strip_prefix(b"literal ")
        .or_else(|| line.strip_prefix(b"delta "));
    if !size.is_some_and(|s| !s.is_empty() && s.len() <= 20 && s.iter().all(u8::is_ascii_digit)) {
        return Err(lines.error(format!(
            "expected 'literal N' or 'delta N', found {}",
            snippet(line)
        )));
    }
    let mut data_lines = 0usize;
    loop {
        let Some(line) = lines.next() else {
            return Err(lines.eof("a binary hunk without its closing empty line"));
        };
        if line.is_empty() {
            break;
        }
        if !is_base85_line(line) {
            return Err(lines.error("a malformed line of binary patch data"));
        }
        data_lines += 1;
    }
    if data_lines == 0 {
        return Err(lines.error("a binary hunk without data"));
    }
    Ok(())
}

/// One line of git's base85 data: a length character (`A`–`Z` = 1–26, `a`–`z` = 27–52) and
/// five characters per four bytes.
fn is_base85_line(line: &[u8]) -> bool {
    let Some((&len, data)) = line.split_first() else {
        return false;
    };
    let n = match len {
        b'A'..=b'Z' => len - b'A' + 1,
        b'a'..=b'z' => len - b'a' + 27,
        _ => return false,
    };
    data.len() == usize::from(n).div_ceil(4) * 5
        && data
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&()*+-;<=>?@^_`{|}~".contains(&b))
}

fn is_bidi_control(c: char) -> bool {
    names::is_bidi_control(c)
}

fn human_bytes(n: usize) -> String {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * 1024;
    if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else if n >= KIB && n.is_multiple_of(KIB) {
        format!("{} KiB", n / KIB)
    } else {
        format!("{n}-byte")
    }
}
