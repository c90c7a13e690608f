//! Files that tools generate (`__pycache__/`, `node_modules/`, a root `target/`, …): the one
//! table of them, which entries of a patch fall under it, and the patch split into what is
//! kept and what is left out, with the left-out part summarised as groups.
//!
//! A project without a `.gitignore` for `__pycache__/` that runs its tests in a task ends up
//! with a patch full of base85 `.pyc` entries: they bury the real edits in a bounded diff and
//! would be committed by `task apply`. Only what the project does not track can be
//! generated: a file the task added, or one the baseline has untracked (the `__pycache__/`
//! of a local test run, which the import brought as git neither tracks nor ignores it, and
//! which the task's test run rewrites). A tracked file shows as a change, never as
//! generated, and neither does anything beneath a generated-looking directory the project
//! tracks files in (a project that commits its `target/` owns it). Ignored files never reach
//! the patch.
//!
//! The table is kept short on purpose: a name is in it only when a directory or file of that
//! name is, in practice, never hand-written source. `dist/` and `build/` are not (libraries
//! commit their `dist/`, many projects keep build scripts in `build/`), and `target/` counts
//! only at the project's root (a Rust or Maven project's output; a nested `target` is as
//! likely a module of that name).

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::patch::FilePatch;

/// How a rule matches a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// A directory of this name at any depth.
    Dir(&'static str),
    /// A directory whose name ends so, at any depth.
    DirSuffix(&'static str),
    /// A directory of this name at the project's root only.
    RootDir(&'static str),
    /// A file whose name ends so, anywhere.
    FileSuffix(&'static str),
    /// A file of this name, anywhere.
    FileName(&'static str),
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// How the rule is shown (`__pycache__/`, `*.pyc`, `/target/`).
    pub pattern: &'static str,
    pub matches: Match,
    /// What writes it.
    pub tool: &'static str,
}

/// The table: directory rules first, so a `.pyc` inside `__pycache__/` is counted under the
/// directory. docs/tasks.md ("Generated files") lists it for users, checked by a test.
pub const TABLE: &[Rule] = &[
    Rule {
        pattern: "__pycache__/",
        matches: Match::Dir("__pycache__"),
        tool: "Python bytecode",
    },
    Rule {
        pattern: ".pytest_cache/",
        matches: Match::Dir(".pytest_cache"),
        tool: "pytest",
    },
    Rule {
        pattern: ".mypy_cache/",
        matches: Match::Dir(".mypy_cache"),
        tool: "mypy",
    },
    Rule {
        pattern: ".ruff_cache/",
        matches: Match::Dir(".ruff_cache"),
        tool: "ruff",
    },
    Rule {
        pattern: ".hypothesis/",
        matches: Match::Dir(".hypothesis"),
        tool: "Hypothesis",
    },
    Rule {
        pattern: ".tox/",
        matches: Match::Dir(".tox"),
        tool: "tox",
    },
    Rule {
        pattern: ".nox/",
        matches: Match::Dir(".nox"),
        tool: "nox",
    },
    Rule {
        pattern: ".venv/",
        matches: Match::Dir(".venv"),
        tool: "Python virtual environments",
    },
    Rule {
        pattern: "*.egg-info/",
        matches: Match::DirSuffix(".egg-info"),
        tool: "setuptools",
    },
    Rule {
        pattern: "node_modules/",
        matches: Match::Dir("node_modules"),
        tool: "npm, yarn, pnpm",
    },
    Rule {
        pattern: ".next/",
        matches: Match::Dir(".next"),
        tool: "Next.js",
    },
    Rule {
        pattern: ".parcel-cache/",
        matches: Match::Dir(".parcel-cache"),
        tool: "Parcel",
    },
    Rule {
        pattern: ".gradle/",
        matches: Match::Dir(".gradle"),
        tool: "Gradle",
    },
    Rule {
        pattern: "/target/",
        matches: Match::RootDir("target"),
        tool: "Cargo, Maven",
    },
    Rule {
        pattern: "*.pyc",
        matches: Match::FileSuffix(".pyc"),
        tool: "Python bytecode",
    },
    Rule {
        pattern: "*.pyo",
        matches: Match::FileSuffix(".pyo"),
        tool: "Python bytecode",
    },
    Rule {
        pattern: ".coverage",
        matches: Match::FileName(".coverage"),
        tool: "coverage.py",
    },
];

/// Where a path falls under the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matched<'p> {
    pub rule: &'static Rule,
    /// The generated directory the path is beneath (`pkg/__pycache__`), or `None` for a rule
    /// on file names.
    pub dir: Option<&'p str>,
    /// The path's first directory (`pkg`), or `.` for a match at the root.
    pub top: &'p str,
}

/// The first rule of the table `path` falls under, if any.
pub fn rule_for(path: &str) -> Option<Matched<'_>> {
    let parts: Vec<&str> = path.split('/').collect();
    let (name, dirs) = parts.split_last()?;
    let top = |depth: usize| if depth == 0 { "." } else { parts[0] };
    for rule in TABLE {
        let found = match rule.matches {
            Match::Dir(want) => dirs.iter().position(|d| *d == want),
            Match::DirSuffix(suffix) => dirs
                .iter()
                .position(|d| d.len() > suffix.len() && d.ends_with(suffix)),
            Match::RootDir(want) => (dirs.first() == Some(&want)).then_some(0),
            Match::FileSuffix(suffix) => {
                if name.len() > suffix.len() && name.ends_with(suffix) {
                    return Some(Matched {
                        rule,
                        dir: None,
                        top: top(dirs.len()),
                    });
                }
                None
            }
            Match::FileName(want) => {
                if *name == want {
                    return Some(Matched {
                        rule,
                        dir: None,
                        top: top(dirs.len()),
                    });
                }
                None
            }
        };
        if let Some(depth) = found {
            let len: usize = parts[..=depth].iter().map(|p| p.len() + 1).sum::<usize>() - 1;
            return Some(Matched {
                rule,
                dir: Some(&path[..len]),
                top: top(depth),
            });
        }
    }
    None
}

/// What the project has, as the generated rules ask it.
pub trait Project {
    /// Whether the project tracks anything beneath the directory `dir`: such a directory is
    /// its own.
    fn tracks_beneath(&self, dir: &str) -> bool;
    /// Whether `path`, a file the baseline has, is one the project does not track.
    fn untracked(&self, path: &str) -> bool;
}

/// A closure saying which directories the project tracks files beneath, for a baseline of
/// tracked files only.
impl<F: Fn(&str) -> bool> Project for F {
    fn tracks_beneath(&self, dir: &str) -> bool {
        self(dir)
    }

    fn untracked(&self, _path: &str) -> bool {
        false
    }
}

/// Whether `file` is generated: added by the task, or a change to or the deletion of a file
/// the baseline has untracked (never a rename or copy), under the table, and not beneath a
/// directory the project tracks files in.
pub fn generated<'f>(file: &'f FilePatch<'_>, project: &dyn Project) -> Option<Matched<'f>> {
    if file.is_rename || file.is_copy {
        return None;
    }
    let path = if file.is_new {
        file.new_path.as_deref()?
    } else {
        let path = file.path();
        if !project.untracked(path) {
            return None;
        }
        path
    };
    let matched = rule_for(path)?;
    match matched.dir {
        Some(dir) if project.tracks_beneath(dir) => None,
        _ => Some(matched),
    }
}

/// Generated files of one pattern under one top directory, left out of (or, when asked,
/// kept in) a patch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GeneratedGroup {
    /// The table's pattern (`__pycache__/`).
    pub pattern: String,
    /// The project's top directory they are in (`pkg`), `.` for the root.
    pub under: String,
    pub files: u64,
    /// Bytes of patch text their entries take.
    pub patch_bytes: u64,
}

/// A patch cut into the entries kept and the generated ones, as byte ranges of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// In patch order, adjacent ranges merged (text before the first entry is kept).
    pub kept: Vec<Range<usize>>,
    pub generated: Vec<Range<usize>>,
    /// The generated entries summarised, sorted by pattern then directory.
    pub groups: Vec<GeneratedGroup>,
}

impl Split {
    /// The kept entries (or the generated ones) as one patch.
    pub fn join(patch: &[u8], ranges: &[Range<usize>]) -> Vec<u8> {
        let mut out = Vec::with_capacity(ranges.iter().map(|r| r.len()).sum());
        for range in ranges {
            out.extend_from_slice(&patch[range.clone()]);
        }
        out
    }
}

/// Splits `patch` (whose entries the parser read as `files`) into kept and generated entries.
pub fn split(patch: &[u8], files: &[FilePatch<'_>], project: &dyn Project) -> Split {
    let sections = sections(patch, files);
    let mut split = Split::default();
    let mut groups: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
    if let Some(first) = sections.first() {
        push_merged(&mut split.kept, 0..first.start);
    } else {
        push_merged(&mut split.kept, 0..patch.len());
    }
    for (file, range) in files.iter().zip(sections) {
        match generated(file, project) {
            Some(matched) => {
                let group = groups
                    .entry((matched.rule.pattern, matched.top))
                    .or_default();
                group.0 += 1;
                group.1 += range.len() as u64;
                push_merged(&mut split.generated, range);
            }
            None => push_merged(&mut split.kept, range),
        }
    }
    split.groups = groups
        .into_iter()
        .map(|((pattern, under), (files, bytes))| GeneratedGroup {
            pattern: pattern.to_owned(),
            under: under.to_owned(),
            files,
            patch_bytes: bytes,
        })
        .collect();
    split
}

/// A patch judged as it streams in: the entries [`generated`] names are counted as groups and
/// dropped, the rest kept up to a bound, so that a `node_modules/` of hundreds of MiB neither
/// fills memory nor the bound of a shown diff (it made the whole diff fail). An entry is held
/// until it is judged: when whole, or, past [`Sieve::JUDGE_AT`] bytes, by its header (the
/// lines before its `---`, hunks or binary data, which say its paths and whether it is new).
/// Entries start at lines beginning `diff --git `, as git's own reader takes them (no line of
/// a hunk or of base85 data can begin so).
pub struct Sieve<'p> {
    project: &'p (dyn Project + Sync),
    max_kept: usize,
    kept: Vec<u8>,
    /// The start of a line not yet ended, held while it may begin an entry.
    line: Vec<u8>,
    /// The start of the line being read was passed on: what follows until its end is not a
    /// line start.
    mid_line: bool,
    /// The entry not yet judged, from its `diff --git` line.
    entry: Vec<u8>,
    /// How the current entry was judged: `None` while it is held (or before the first).
    current: Option<Judged>,
    groups: BTreeMap<(&'static str, String), (u64, u64)>,
    over: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Judged {
    Kept,
    Generated(&'static str, String),
}

impl<'p> Sieve<'p> {
    /// Bytes of one entry held before it is judged by its header.
    pub const JUDGE_AT: usize = 64 * 1024;
    /// A line start held before it is passed on: longer than any `diff --git` line git
    /// writes for a path it can write.
    const LINE_HELD: usize = 64 * 1024;

    /// Keeps at most `max_kept` bytes; past them, [`Sieve::over`] says so and no more is kept.
    pub fn new(project: &'p (dyn Project + Sync), max_kept: usize) -> Self {
        Self {
            project,
            max_kept,
            kept: Vec::new(),
            line: Vec::new(),
            mid_line: false,
            entry: Vec::new(),
            current: Some(Judged::Kept),
            groups: BTreeMap::new(),
            over: false,
        }
    }

    /// Takes the next bytes of the patch.
    pub fn push(&mut self, mut data: &[u8]) {
        while let Some(newline) = data.iter().position(|&b| b == b'\n') {
            let (line, rest) = data.split_at(newline + 1);
            if self.mid_line {
                // The rest of a line passed on: never the start of an entry.
                self.mid_line = false;
                self.add(line);
            } else if self.line.is_empty() {
                self.take_line(line);
            } else {
                let mut whole = std::mem::take(&mut self.line);
                whole.extend_from_slice(line);
                self.take_line(&whole);
            }
            data = rest;
        }
        if self.mid_line {
            self.add(data);
            return;
        }
        self.line.extend_from_slice(data);
        // A line start that cannot begin an entry, or too long to, goes on at once.
        let header = b"diff --git ";
        let can_begin = self.line.len() < Self::LINE_HELD
            && header.starts_with(&self.line[..self.line.len().min(header.len())]);
        if !can_begin {
            let line = std::mem::take(&mut self.line);
            self.add(&line);
            self.mid_line = true;
        }
    }

    /// Whether the kept entries went past the bound.
    pub fn over(&self) -> bool {
        self.over
    }

    /// The kept patch and the generated groups (sorted by pattern, then directory).
    pub fn finish(mut self) -> (Vec<u8>, Vec<GeneratedGroup>) {
        let line = std::mem::take(&mut self.line);
        self.add(&line);
        self.judge();
        let groups = self
            .groups
            .into_iter()
            .map(|((pattern, under), (files, bytes))| GeneratedGroup {
                pattern: pattern.to_owned(),
                under,
                files,
                patch_bytes: bytes,
            })
            .collect();
        (self.kept, groups)
    }

    fn take_line(&mut self, line: &[u8]) {
        if line.starts_with(b"diff --git ") {
            self.judge();
            self.current = None;
        }
        self.add(line);
    }

    fn add(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        match &self.current {
            Some(Judged::Kept) => self.keep(bytes),
            Some(Judged::Generated(pattern, under)) => {
                let group = self.groups.entry((pattern, under.clone())).or_default();
                group.1 += bytes.len() as u64;
            }
            None => {
                self.entry.extend_from_slice(bytes);
                if self.entry.len() >= Self::JUDGE_AT {
                    self.judge();
                }
            }
        }
    }

    fn keep(&mut self, bytes: &[u8]) {
        if self.kept.len() + bytes.len() > self.max_kept {
            self.over = true;
        }
        if !self.over {
            self.kept.extend_from_slice(bytes);
        }
    }

    /// Judges the held entry (if any), whole or by its header, and passes it on.
    fn judge(&mut self) {
        if self.current.is_some() || self.entry.is_empty() {
            return;
        }
        let entry = std::mem::take(&mut self.entry);
        let judged = match judge_entry(&entry, self.project) {
            Some((pattern, under)) => {
                self.groups.entry((pattern, under.clone())).or_default().0 += 1;
                Judged::Generated(pattern, under)
            }
            None => Judged::Kept,
        };
        self.current = Some(judged);
        self.add(&entry);
    }
}

/// The group `entry` falls in when generated, `None` when kept: parsed whole while it is
/// held whole, else by its header (as the entry of an empty file git writes, or of a change
/// between two empty binary files). What the parser cannot read is kept, for the review to
/// say why.
fn judge_entry(entry: &[u8], project: &dyn Project) -> Option<(&'static str, String)> {
    let group = |text: &[u8]| -> Result<Option<(&'static str, String)>, ()> {
        let files = crate::patch::parse(text, text.len()).map_err(drop)?;
        Ok(files
            .first()
            .and_then(|file| generated(file, project))
            .map(|matched| (matched.rule.pattern, matched.top.to_owned())))
    };
    if entry.len() < Sieve::JUDGE_AT {
        return group(entry).ok().flatten();
    }
    let header = entry_header(entry);
    group(header)
        .or_else(|()| {
            let mut empty = header.to_vec();
            empty.extend_from_slice(EMPTY_BINARY_BODY);
            group(&empty)
        })
        .ok()
        .flatten()
}

/// The body of a change between two empty binary files.
const EMPTY_BINARY_BODY: &[u8] =
    b"GIT binary patch\nliteral 0\nHcmV?d00001\n\nliteral 0\nHcmV?d00001\n\n";

/// An entry's header: its lines before the first `---`, hunk or binary data line (all of it
/// when there is none).
fn entry_header(entry: &[u8]) -> &[u8] {
    let mut at = 0;
    for line in entry.split_inclusive(|&b| b == b'\n') {
        if at > 0
            && (line.starts_with(b"--- ")
                || line.starts_with(b"@@")
                || line.starts_with(b"GIT binary patch")
                || line.starts_with(b"Binary files "))
        {
            break;
        }
        at += line.len();
    }
    &entry[..at]
}

fn push_merged(ranges: &mut Vec<Range<usize>>, range: Range<usize>) {
    if range.is_empty() {
        return;
    }
    match ranges.last_mut() {
        Some(last) if last.end == range.start => last.end = range.end,
        _ => ranges.push(range),
    }
}

/// Each entry's bytes: from its `diff --git` line to the next entry's (or the end).
pub fn sections(patch: &[u8], files: &[FilePatch<'_>]) -> Vec<Range<usize>> {
    let mut starts = Vec::with_capacity(files.len());
    let mut wanted = files.iter().map(|f| f.line).peekable();
    let mut line = 1usize;
    let mut offset = 0usize;
    while wanted.peek().is_some() && offset <= patch.len() {
        while wanted.peek() == Some(&line) {
            starts.push(offset);
            wanted.next();
        }
        match patch[offset.min(patch.len())..]
            .iter()
            .position(|&b| b == b'\n')
        {
            Some(newline) => offset += newline + 1,
            None => break,
        }
        line += 1;
    }
    let mut ends: Vec<usize> = starts.iter().skip(1).copied().collect();
    ends.push(patch.len());
    starts
        .into_iter()
        .zip(ends)
        .map(|(start, end)| start..end)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch;

    fn added(name: &str) -> String {
        format!(
            "diff --git a/{name} b/{name}\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n+++ b/{name}\n@@ -0,0 +1 @@\n+x\n"
        )
    }

    fn modified(name: &str) -> String {
        format!(
            "diff --git a/{name} b/{name}\nindex 1111111..2222222 100644\n--- a/{name}\n+++ b/{name}\n@@ -1 +1 @@\n-x\n+y\n"
        )
    }

    fn binary_added(name: &str) -> String {
        format!(
            "diff --git a/{name} b/{name}\nnew file mode 100644\nindex 0000000000000000000000000000000000000000..3333333333333333333333333333333333333333\nGIT binary patch\nliteral 3\nKcmZQzWB>pF00aO6\n\nliteral 0\nHcmV?d00001\n\n"
        )
    }

    fn pattern(path: &str) -> Option<&'static str> {
        rule_for(path).map(|m| m.rule.pattern)
    }

    #[test]
    fn the_table_names_tool_output_and_nothing_hand_written() {
        assert_eq!(
            pattern("pkg/__pycache__/x.cpython-311.pyc"),
            Some("__pycache__/")
        );
        assert_eq!(pattern("x.pyc"), Some("*.pyc"));
        assert_eq!(pattern("a/b/x.pyo"), Some("*.pyo"));
        assert_eq!(
            pattern("node_modules/left-pad/index.js"),
            Some("node_modules/")
        );
        assert_eq!(pattern("web/node_modules/a/b.js"), Some("node_modules/"));
        assert_eq!(
            pattern(".pytest_cache/v/cache/lastfailed"),
            Some(".pytest_cache/")
        );
        assert_eq!(pattern(".venv/bin/python"), Some(".venv/"));
        assert_eq!(pattern("idna.egg-info/PKG-INFO"), Some("*.egg-info/"));
        assert_eq!(pattern("target/debug/app"), Some("/target/"));
        assert_eq!(pattern(".coverage"), Some(".coverage"));
        // Hand-written source of look-alike names is not generated.
        for source in [
            "src/target/mod.rs",
            "target",
            "dist/index.js",
            "build/build.sh",
            "__pycache__",
            "pyc",
            "notes.pyc.md",
            ".egg-info/x",
            "venv/lib.py",
            "src/node_modules.rs",
            "README.md",
        ] {
            assert_eq!(pattern(source), None, "{source}");
        }
    }

    #[test]
    fn the_documented_table_is_this_table() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/tasks.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let section = doc
            .split("\n## ")
            .find(|s| s.starts_with("Generated files"))
            .unwrap();
        let rows: Vec<(String, String)> = section
            .lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
                match cells.as_slice() {
                    [pattern, _, tool] if pattern.starts_with('`') => {
                        Some((pattern.trim_matches('`').to_owned(), (*tool).to_owned()))
                    }
                    _ => None,
                }
            })
            .collect();
        let table: Vec<(String, String)> = TABLE
            .iter()
            .map(|rule| (rule.pattern.to_owned(), rule.tool.to_owned()))
            .collect();
        assert_eq!(rows, table, "docs/tasks.md, Generated files");
    }

    #[test]
    fn a_match_names_its_directory_and_top() {
        let m = rule_for("pkg/sub/__pycache__/x.pyc").unwrap();
        assert_eq!((m.dir, m.top), (Some("pkg/sub/__pycache__"), "pkg"));
        let m = rule_for("node_modules/a/b.js").unwrap();
        assert_eq!((m.dir, m.top), (Some("node_modules"), "."));
        let m = rule_for("lib/x.pyc").unwrap();
        assert_eq!((m.dir, m.top), (None, "lib"));
        let m = rule_for("x.pyc").unwrap();
        assert_eq!((m.dir, m.top), (None, "."));
    }

    #[test]
    fn only_added_untracked_files_are_generated() {
        let text = [
            modified("pkg/cli.py"),
            binary_added("pkg/__pycache__/cli.cpython-311.pyc"),
            added("pkg/new.py"),
            modified("target/foo"),
            added("target/bar"),
            added("web/node_modules/a.js"),
            added("x.pyc"),
        ]
        .concat();
        let files = patch::parse(text.as_bytes(), text.len()).unwrap();
        // The project tracks `target/foo`: its `target/` is the project's own.
        let tracks = |dir: &str| dir == "target";
        let split = split(text.as_bytes(), &files, &tracks);
        let kept = String::from_utf8(Split::join(text.as_bytes(), &split.kept)).unwrap();
        let left = String::from_utf8(Split::join(text.as_bytes(), &split.generated)).unwrap();
        assert_eq!(
            kept,
            [
                modified("pkg/cli.py"),
                added("pkg/new.py"),
                modified("target/foo"),
                added("target/bar")
            ]
            .concat()
        );
        assert_eq!(
            left,
            [
                binary_added("pkg/__pycache__/cli.cpython-311.pyc"),
                added("web/node_modules/a.js"),
                added("x.pyc")
            ]
            .concat()
        );
        let groups: Vec<(&str, &str, u64)> = split
            .groups
            .iter()
            .map(|g| (g.pattern.as_str(), g.under.as_str(), g.files))
            .collect();
        assert_eq!(
            groups,
            [
                ("*.pyc", ".", 1),
                ("__pycache__/", "pkg", 1),
                ("node_modules/", "web", 1)
            ]
        );
        let pyc = binary_added("pkg/__pycache__/cli.cpython-311.pyc").len() as u64;
        assert_eq!(split.groups[1].patch_bytes, pyc);
        // Both parts are patches the parser reads again, entry for entry.
        assert_eq!(patch::parse(kept.as_bytes(), kept.len()).unwrap().len(), 4);
        assert_eq!(patch::parse(left.as_bytes(), left.len()).unwrap().len(), 3);
    }

    fn binary_modified(name: &str) -> String {
        format!(
            "diff --git a/{name} b/{name}\nindex 1111111111111111111111111111111111111111..3333333333333333333333333333333333333333 100644\nGIT binary patch\nliteral 3\nKcmZQzWB>pF00aO6\n\nliteral 3\nKcmZQzWB>pF00aO6\n\n"
        )
    }

    fn deleted(name: &str) -> String {
        format!(
            "diff --git a/{name} b/{name}\ndeleted file mode 100644\nindex 1111111..0000000\n--- a/{name}\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
        )
    }

    /// A project whose baseline has a local test run's bytecode, untracked: the task's run
    /// rewrites it. What the project does not track is generated, changed or deleted as well
    /// as added; a tracked file under the same directory, and a change to a tracked `.pyc`,
    /// are not.
    #[test]
    fn changes_to_untracked_baseline_files_are_generated() {
        struct Baseline;
        impl Project for Baseline {
            fn tracks_beneath(&self, dir: &str) -> bool {
                dir == "kept/__pycache__"
            }
            fn untracked(&self, path: &str) -> bool {
                // `kept/__pycache__/` also holds a file the project tracks: it is its own.
                (path.starts_with("pkg/") && path != "pkg/cli.py")
                    || path == "kept/__pycache__/notes.txt"
            }
        }
        let text = [
            binary_modified("pkg/__pycache__/cli.cpython-311.pyc"),
            modified("pkg/cli.py"),
            deleted("pkg/__pycache__/old.cpython-311.pyc"),
            binary_modified("pkg/x.pyc"),
            binary_modified("tracked.pyc"),
            modified("kept/__pycache__/notes.txt"),
        ]
        .concat();
        let files = patch::parse(text.as_bytes(), text.len()).unwrap();
        let split = split(text.as_bytes(), &files, &Baseline);
        let kept = String::from_utf8(Split::join(text.as_bytes(), &split.kept)).unwrap();
        assert_eq!(
            kept,
            [
                modified("pkg/cli.py"),
                binary_modified("tracked.pyc"),
                modified("kept/__pycache__/notes.txt")
            ]
            .concat()
        );
        let groups: Vec<(&str, &str, u64)> = split
            .groups
            .iter()
            .map(|g| (g.pattern.as_str(), g.under.as_str(), g.files))
            .collect();
        assert_eq!(groups, [("*.pyc", "pkg", 1), ("__pycache__/", "pkg", 2)]);
    }

    #[test]
    fn a_patch_without_generated_files_is_kept_whole() {
        let text = [modified("a.py"), added("b.py")].concat();
        let files = patch::parse(text.as_bytes(), text.len()).unwrap();
        let split = split(text.as_bytes(), &files, &|_: &str| false);
        assert_eq!(split.kept, vec![0..text.len()]);
        assert!(split.generated.is_empty() && split.groups.is_empty());
        let empty = split_empty();
        assert_eq!((empty.kept.len(), empty.groups.len()), (0, 0));
    }

    /// The sieve, fed in pieces of any size, keeps and groups what [`split`] does, and an
    /// entry larger than [`Sieve::JUDGE_AT`] is judged by its header, generated or not.
    #[test]
    fn the_sieve_judges_as_split_does() {
        let big_generated = added_lines("node_modules/big/index.js", 20_000);
        let big_kept = added_lines("src/big.js", 20_000);
        // A line of a kept entry that holds `diff --git` past its start (after a long run,
        // or where a piece ends) is not an entry of its own.
        let tricky = format!(
            "diff --git a/notes.txt b/notes.txt\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n+++ b/notes.txt\n@@ -0,0 +1,2 @@\n+{}diff --git a/pkg/__pycache__/x.pyc b/pkg/__pycache__/x.pyc\n+xdiff --git a/pkg/__pycache__/y.pyc b/pkg/__pycache__/y.pyc\n",
            "a".repeat(Sieve::LINE_HELD)
        );
        let text = [
            modified("pkg/cli.py"),
            tricky,
            binary_added("pkg/__pycache__/cli.cpython-311.pyc"),
            big_generated.clone(),
            added("pkg/new.py"),
            binary_modified("pkg/__pycache__/old.cpython-311.pyc"),
            deleted("pkg/__pycache__/gone.cpython-311.pyc"),
            modified("target/foo"),
            added("target/bar"),
            big_kept.clone(),
            added("x.pyc"),
            big_binary_modified("pkg/__pycache__/big.cpython-311.pyc"),
            modified_lines("pkg/__pycache__/notes.txt", 20_000),
        ]
        .concat();
        assert!(big_generated.len() > Sieve::JUDGE_AT && big_kept.len() > Sieve::JUDGE_AT);
        struct Baseline;
        impl Project for Baseline {
            fn tracks_beneath(&self, dir: &str) -> bool {
                dir == "target"
            }
            fn untracked(&self, path: &str) -> bool {
                path.contains("__pycache__")
            }
        }
        let files = patch::parse(text.as_bytes(), text.len()).unwrap();
        let split = split(text.as_bytes(), &files, &Baseline);
        let kept = Split::join(text.as_bytes(), &split.kept);
        // The two large pycache entries are generated too.
        assert_eq!(split.groups.iter().map(|g| g.files).sum::<u64>(), 7);
        for piece in [1, 7, 4096, text.len()] {
            let mut sieve = Sieve::new(&Baseline, usize::MAX);
            for chunk in text.as_bytes().chunks(piece) {
                sieve.push(chunk);
            }
            assert!(!sieve.over());
            let (sieved, groups) = sieve.finish();
            assert_eq!(
                String::from_utf8_lossy(&sieved)
                    .lines()
                    .filter(|l| l.starts_with("diff"))
                    .collect::<Vec<_>>(),
                String::from_utf8_lossy(&kept)
                    .lines()
                    .filter(|l| l.starts_with("diff"))
                    .collect::<Vec<_>>(),
                "pieces of {piece}"
            );
            assert!(sieved == kept, "pieces of {piece}");
            assert_eq!(groups, split.groups, "pieces of {piece}");
        }
        // Past its bound the sieve says so; the generated entries never count against it.
        let mut sieve = Sieve::new(&Baseline, kept.len() - 1);
        sieve.push(text.as_bytes());
        assert!(sieve.over());
        let mut sieve = Sieve::new(&Baseline, kept.len());
        sieve.push(text.as_bytes());
        assert!(!sieve.over());
    }

    fn big_binary_modified(name: &str) -> String {
        // Shape-checked, not decoded: `z` says 52 bytes, in 65 base85 characters.
        let data: String = (0..2000)
            .map(|_| format!("z{}\n", "0".repeat(65)))
            .collect();
        format!(
            "diff --git a/{name} b/{name}\nindex 1111111111111111111111111111111111111111..3333333333333333333333333333333333333333 100644\nGIT binary patch\nliteral 104000\n{data}\nliteral 3\nKcmZQzWB>pF00aO6\n\n"
        )
    }

    fn modified_lines(name: &str, lines: usize) -> String {
        let old: String = (0..lines).map(|i| format!("-old {i}\n")).collect();
        let new: String = (0..lines).map(|i| format!("+new {i}\n")).collect();
        format!(
            "diff --git a/{name} b/{name}\nindex 1111111..2222222 100644\n--- a/{name}\n+++ b/{name}\n@@ -1,{lines} +1,{lines} @@\n{old}{new}"
        )
    }

    fn added_lines(name: &str, lines: usize) -> String {
        let body: String = (0..lines).map(|i| format!("+line {i}\n")).collect();
        format!(
            "diff --git a/{name} b/{name}\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n+++ b/{name}\n@@ -0,0 +1,{lines} @@\n{body}"
        )
    }

    fn split_empty() -> Split {
        split(b"", &[], &|_: &str| false)
    }
}
