//! Which changed paths a reviewer must look at (CONTRACT.md's `kind` table), and a reason for
//! each that a person understands.
//!
//! Names are matched per path component after folding the way case-insensitive file systems
//! do (ASCII case, the code points HFS+ ignores, NTFS's trailing dots and spaces), because the
//! patch may be applied on a Mac or a Windows box: `.HUSKY/pre-commit` is a hook there.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::{
    apply_hunks, sanitize, FilePatch, LineKind, SensitiveKind, SensitivePath, MODE_EXECUTABLE,
    MODE_SYMLINK,
};

/// Longest reason kept, in characters.
const MAX_REASON_CHARS: usize = 500;
/// Longest path, command or target shown inside a reason, in characters.
const SHOWN_CHARS: usize = 120;
/// At most this many npm script changes are spelled out in one reason.
const SHOWN_SCRIPT_CHANGES: usize = 3;
/// npm runs these by itself (install, pack, publish): listed first.
const LIFECYCLE_SCRIPTS: [&str; 10] = [
    "preinstall",
    "install",
    "postinstall",
    "prepublish",
    "preprepare",
    "prepare",
    "postprepare",
    "prepack",
    "postpack",
    "dependencies",
];

/// The findings so far: one entry per (path, kind), reasons merged.
#[derive(Default)]
pub(super) struct Found {
    entries: Vec<SensitivePath>,
    index: HashMap<(String, SensitiveKind), usize>,
}

impl Found {
    fn add(&mut self, path: &str, kind: SensitiveKind, reason: &str) {
        let reason = sanitize(reason, MAX_REASON_CHARS);
        let key = (path.to_owned(), kind);
        if let Some(entry) = self.index.get(&key).and_then(|&i| self.entries.get_mut(i)) {
            let fits =
                entry.reason.chars().count() + 2 + reason.chars().count() <= MAX_REASON_CHARS;
            if fits && !entry.reason.contains(reason.as_str()) {
                entry.reason.push_str("; ");
                entry.reason.push_str(&reason);
            }
            return;
        }
        self.index.insert(key, self.entries.len());
        self.entries.push(SensitivePath {
            path: path.to_owned(),
            kind,
            reason,
        });
    }

    pub(super) fn into_vec(self) -> Vec<SensitivePath> {
        self.entries
    }
}

/// What an entry does to one of the paths it touches.
#[derive(Debug, Clone, Copy)]
enum Action<'p> {
    Adds,
    Changes,
    Deletes,
    RenamedFrom(&'p str),
    RenamedTo(&'p str),
    CopiedFrom(&'p str),
}

impl Action<'_> {
    /// Whether the path has content after the change.
    fn has_new_side(self) -> bool {
        !matches!(self, Action::Deletes | Action::RenamedTo(_))
    }

    fn describe(self, what: &str, path: &str) -> String {
        let path = shown(path);
        match self {
            Action::Adds => format!("adds {what} {path}"),
            Action::Changes => format!("changes {what} {path}"),
            Action::Deletes => format!("deletes {what} {path}"),
            Action::RenamedFrom(old) => format!("adds {what} {path} (renamed from {})", shown(old)),
            Action::RenamedTo(new) => format!("removes {what} {path} (renamed to {})", shown(new)),
            Action::CopiedFrom(old) => format!("adds {what} {path} (copied from {})", shown(old)),
        }
    }
}

pub(super) fn classify(
    file: &FilePatch<'_>,
    baseline: &dyn Fn(&str) -> Option<Vec<u8>>,
    found: &mut Found,
) {
    let old = file.old_path.as_deref();
    let new = file.new_path.as_deref();
    let mut touched = Vec::with_capacity(2);
    match (old, new) {
        (Some(old), Some(new)) if file.is_rename => {
            touched.push((new, Action::RenamedFrom(old)));
            touched.push((old, Action::RenamedTo(new)));
        }
        (Some(old), Some(new)) if file.is_copy => touched.push((new, Action::CopiedFrom(old))),
        (_, Some(new)) if file.is_new => touched.push((new, Action::Adds)),
        (_, Some(new)) => touched.push((new, Action::Changes)),
        (Some(old), None) => touched.push((old, Action::Deletes)),
        (None, None) => {}
    }
    for &(path, action) in &touched {
        by_name(file, path, action, found);
    }
    if let Some(new) = new {
        symlink(file, new, baseline, found);
        exec_bit(file, new, found);
    }
    package_json(file, baseline, found);
}

/// The kinds a path's name alone decides, plus what the `+` lines of git's own config files
/// set.
fn by_name(file: &FilePatch<'_>, path: &str, action: Action<'_>, found: &mut Found) {
    let components = folded_components(path);
    let Some((name, dirs)) = components.split_last() else {
        return;
    };
    let name = name.as_str();
    let parent = dirs.last().map(String::as_str);
    let has_dir = |dir: &str| dirs.iter().any(|d| d == dir);
    let has_dirs = |a: &str, b: &str| dirs.windows(2).any(|w| w[0] == a && w[1] == b);

    if has_dirs(".git", "hooks") || (parent == Some(".git") && name == "hooks") || has_dir(".husky")
    {
        found.add(
            path,
            SensitiveKind::GitHook,
            &action.describe("git hook", path),
        );
    }
    let is_git_config = name == ".gitconfig" || (parent == Some(".git") && name == "config");
    if is_git_config && action.has_new_side() {
        for value in added_lines(file).filter_map(hooks_path_setting) {
            let reason = if value.is_empty() {
                "sets core.hooksPath".to_owned()
            } else {
                format!("sets core.hooksPath to {}", shown(&value))
            };
            found.add(path, SensitiveKind::GitHook, &reason);
        }
    }

    let git_config = match name {
        ".gitmodules" => Some("git submodules file"),
        ".gitattributes" => Some("git attributes file"),
        _ if is_git_config => Some("git config file"),
        _ => None,
    };
    if let Some(what) = git_config {
        let mut reason = action.describe(what, path);
        if name == ".gitattributes" && action.has_new_side() {
            let drivers = attribute_drivers(file);
            if !drivers.is_empty() {
                reason.push_str(&format!(" and sets {}", drivers.join(", ")));
            }
        }
        found.add(path, SensitiveKind::GitConfig, &reason);
    }

    let ci = has_dirs(".github", "workflows")
        || has_dir(".circleci")
        || has_dir(".buildkite")
        || matches!(
            name,
            ".gitlab-ci.yml"
                | "azure-pipelines.yml"
                | "azure-pipelines.yaml"
                | "jenkinsfile"
                | ".travis.yml"
        );
    if ci {
        found.add(
            path,
            SensitiveKind::CiWorkflow,
            &action.describe("CI configuration", path),
        );
    }

    let script = match name {
        "build.rs" => Some("Cargo build script"),
        "setup.py" => Some("Python setup script"),
        "makefile" | "gnumakefile" => Some("make build file"),
        ".npmrc" => Some("npm configuration"),
        "config" | "config.toml" if parent == Some(".cargo") => Some("Cargo configuration"),
        _ => None,
    };
    if let Some(what) = script {
        found.add(
            path,
            SensitiveKind::PackageScript,
            &action.describe(what, path),
        );
    }

    let agent = [".claude", ".cursor", ".vscode", ".idea"]
        .into_iter()
        .any(has_dir)
        || matches!(name, ".mcp.json" | "agents.md" | "claude.md");
    if agent {
        let what = "coding-agent or editor configuration";
        found.add(
            path,
            SensitiveKind::AgentConfig,
            &action.describe(what, path),
        );
    }
}

fn symlink(
    file: &FilePatch<'_>,
    path: &str,
    baseline: &dyn Fn(&str) -> Option<Vec<u8>>,
    found: &mut Found,
) {
    // Without a `new mode`, the file keeps its type, which git apply checks against `old_mode`.
    let is_link = file.new_mode.or(file.old_mode) == Some(MODE_SYMLINK);
    if !is_link {
        return;
    }
    let retarget = file.old_mode == Some(MODE_SYMLINK) && !file.is_rename && !file.is_copy;
    let verb = if retarget {
        "retargets symlink to"
    } else {
        "adds symlink to"
    };
    let reason = match symlink_target(file, baseline) {
        Ok(target) => {
            let target = String::from_utf8_lossy(&target);
            let outside = if leaves_repository(path, &target) {
                " (outside the repository)"
            } else {
                ""
            };
            format!("{verb} {}{outside}", shown(&target))
        }
        Err(why) => format!("{verb} an unknown target ({why})"),
    };
    found.add(path, SensitiveKind::Symlink, &reason);
}

/// A symlink's content is its target: the whole new content, or (when the baseline is not at
/// hand) the `+` lines of its hunk, which for a one-line target is the same.
fn symlink_target(
    file: &FilePatch<'_>,
    baseline: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Result<Vec<u8>, String> {
    new_content(file, baseline).or_else(|why| {
        let added: Vec<&[u8]> = added_lines(file).collect();
        if added.is_empty() {
            Err(why)
        } else {
            Ok(added.join(&b'\n'))
        }
    })
}

/// Whether `target`, read from the directory holding `link`, leaves the repository: an
/// absolute target, or one whose `..` climb above the root. (Other symlinks on the way are
/// not followed; each is flagged on its own.)
fn leaves_repository(link: &str, target: &str) -> bool {
    let bytes = target.as_bytes();
    let windows_absolute =
        bytes.get(1) == Some(&b':') && bytes.first().is_some_and(u8::is_ascii_alphabetic);
    if target.starts_with(['/', '\\']) || windows_absolute {
        return true;
    }
    let mut depth = link.split('/').count().saturating_sub(1);
    for component in target.split(['/', '\\']) {
        match component {
            "" | "." => {}
            ".." => match depth.checked_sub(1) {
                Some(up) => depth = up,
                None => return true,
            },
            _ => depth += 1,
        }
    }
    false
}

fn exec_bit(file: &FilePatch<'_>, path: &str, found: &mut Found) {
    if file.new_mode != Some(MODE_EXECUTABLE) {
        return;
    }
    let reason = match file.old_mode {
        _ if file.is_new => "new executable file".to_owned(),
        Some(old) => format!("mode {old:o} → {MODE_EXECUTABLE:o}"),
        None => "made executable".to_owned(),
    };
    found.add(path, SensitiveKind::ExecBit, &reason);
}

/// `package-script` for a `package.json` only when its `scripts` really changed: both sides
/// are rebuilt (baseline + hunks) and compared as JSON. When that is not possible the path is
/// flagged anyway, saying why.
fn package_json(
    file: &FilePatch<'_>,
    baseline: &dyn Fn(&str) -> Option<Vec<u8>>,
    found: &mut Found,
) {
    let new = file.new_path.as_deref().filter(|p| is_package_json(p));
    let old = file.old_path.as_deref().filter(|p| is_package_json(p));
    let left_old = file.is_deleted || file.is_rename;
    if new.is_none() && !(old.is_some() && left_old) {
        return;
    }
    let old_content = old_content(file, baseline);
    if let Some(path) = new {
        // A moved or copied file is new where it lands.
        let before = if file.is_new || file.is_rename || file.is_copy {
            Ok(None)
        } else {
            old_content
                .as_deref()
                .map_err(Clone::clone)
                .and_then(scripts_of)
        };
        let after = old_content
            .as_deref()
            .map_err(Clone::clone)
            .and_then(|old| rebuild(file, old))
            .and_then(|content| scripts_of(&content));
        report_scripts(found, path, before, after, "");
    }
    if let (Some(path), true) = (old, left_old) {
        let before = old_content
            .as_deref()
            .map_err(Clone::clone)
            .and_then(scripts_of);
        let note = match file.new_path.as_deref() {
            Some(to) if file.is_rename => format!(" (file renamed to {})", shown(to)),
            _ => String::new(),
        };
        report_scripts(found, path, before, Ok(None), &note);
    }
}

fn is_package_json(path: &str) -> bool {
    folded_components(path)
        .last()
        .is_some_and(|name| name == "package.json")
}

fn report_scripts(
    found: &mut Found,
    path: &str,
    before: Result<Option<Value>, String>,
    after: Result<Option<Value>, String>,
    note: &str,
) {
    let reason = match (before, after) {
        (Ok(before), Ok(after)) => match scripts_change(before.as_ref(), after.as_ref()) {
            Some(reason) => reason,
            None => return,
        },
        (Err(why), _) | (_, Err(why)) => {
            format!(
                "changes {}; its npm scripts could not be compared: {why}",
                shown(path)
            )
        }
    };
    found.add(
        path,
        SensitiveKind::PackageScript,
        &format!("{reason}{note}"),
    );
}

/// The `scripts` field of a package.json (`None` when it has none).
fn scripts_of(content: &[u8]) -> Result<Option<Value>, String> {
    match serde_json::from_slice(content) {
        Ok(Value::Object(mut package)) => Ok(package.remove("scripts")),
        Ok(_) => Err("package.json is not a JSON object".to_owned()),
        Err(err) => Err(format!("package.json is not valid JSON ({err})")),
    }
}

/// What changed between two `scripts` fields, lifecycle scripts first; `None` if nothing did.
fn scripts_change(before: Option<&Value>, after: Option<&Value>) -> Option<String> {
    if before == after {
        return None;
    }
    fn as_map<'v>(
        scripts: Option<&'v Value>,
        empty: &'v Map<String, Value>,
    ) -> Option<&'v Map<String, Value>> {
        match scripts {
            None => Some(empty),
            Some(Value::Object(map)) => Some(map),
            Some(_) => None,
        }
    }
    let empty = Map::new();
    let (Some(before), Some(after)) = (as_map(before, &empty), as_map(after, &empty)) else {
        return Some("changes the npm 'scripts' field, which is not a JSON object".to_owned());
    };
    let mut changes: Vec<(bool, &str, String)> = Vec::new();
    for (name, command) in after {
        let shown_name = sanitize(name, 60);
        match before.get(name) {
            None => changes.push((
                is_lifecycle(name),
                name,
                format!("adds npm script '{shown_name}': {}", shown_command(command)),
            )),
            Some(old) if old != command => changes.push((
                is_lifecycle(name),
                name,
                format!(
                    "changes npm script '{shown_name}' to: {}",
                    shown_command(command)
                ),
            )),
            Some(_) => {}
        }
    }
    for name in before.keys().filter(|name| !after.contains_key(*name)) {
        changes.push((
            is_lifecycle(name),
            name,
            format!("removes npm script '{}'", sanitize(name, 60)),
        ));
    }
    if changes.is_empty() {
        return None;
    }
    changes.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    let mut reason = changes
        .iter()
        .take(SHOWN_SCRIPT_CHANGES)
        .map(|c| c.2.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    if let Some(more) = changes
        .len()
        .checked_sub(SHOWN_SCRIPT_CHANGES)
        .filter(|&n| n > 0)
    {
        reason.push_str(&format!("; and {more} more script changes"));
    }
    Some(reason)
}

fn is_lifecycle(name: &str) -> bool {
    LIFECYCLE_SCRIPTS.contains(&name)
}

fn shown_command(command: &Value) -> String {
    match command {
        Value::String(text) => shown(text),
        other => shown(&other.to_string()),
    }
}

/// The content the entry starts from: empty for a new file, else the baseline's, else (for a
/// deletion, whose single hunk removes every line) the `-` lines.
fn old_content(
    file: &FilePatch<'_>,
    baseline: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Result<Vec<u8>, String> {
    let Some(path) = file.old_path.as_deref() else {
        return Ok(Vec::new());
    };
    if let Some(content) = baseline(path) {
        return Ok(content);
    }
    if file.is_deleted && !file.is_binary {
        let mut content = Vec::new();
        for line in file.hunks.iter().flat_map(|h| h.lines()) {
            content.extend_from_slice(line.content);
            if line.newline {
                content.push(b'\n');
            }
        }
        return Ok(content);
    }
    Err(format!(
        "the baseline content of {} is not available",
        shown(path)
    ))
}

/// The content after the entry: `old` with the hunks applied.
fn rebuild(file: &FilePatch<'_>, old: &[u8]) -> Result<Vec<u8>, String> {
    if file.is_binary {
        return Err("the patch changes it as binary data".to_owned());
    }
    apply_hunks(old, &file.hunks)
        .map_err(|why| format!("the patch does not apply to the baseline ({why})"))
}

fn new_content(
    file: &FilePatch<'_>,
    baseline: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Result<Vec<u8>, String> {
    rebuild(file, &old_content(file, baseline)?)
}

fn added_lines<'f, 'a>(file: &'f FilePatch<'a>) -> impl Iterator<Item = &'a [u8]> + 'f {
    file.hunks
        .iter()
        .flat_map(|h| h.lines())
        .filter(|line| line.kind == LineKind::Added)
        .map(|line| line.content)
}

/// The value an added config line gives `hooksPath` (`""` if it gives none), if it names it.
/// Any section counts: flagging a stray key costs a reviewer a glance, missing one a hook.
fn hooks_path_setting(line: &[u8]) -> Option<String> {
    const KEY: &str = "hookspath";
    let text = String::from_utf8_lossy(line);
    // ASCII lowercasing keeps byte offsets, so `at` indexes `text` too.
    let at = text.to_ascii_lowercase().find(KEY)?;
    let rest = text.get(at + KEY.len()..)?.trim_start_matches([' ', '\t']);
    let value = rest
        .strip_prefix('=')
        .unwrap_or(rest)
        .trim()
        .trim_matches('"');
    Some(value.to_owned())
}

/// The `filter=`/`diff=`/`merge=` drivers that added `.gitattributes` lines set (a few).
fn attribute_drivers(file: &FilePatch<'_>) -> Vec<String> {
    let mut drivers = Vec::new();
    for line in added_lines(file) {
        let text = String::from_utf8_lossy(line);
        // The first field is the path pattern.
        for attr in text.split_ascii_whitespace().skip(1) {
            let lower = attr.to_ascii_lowercase();
            let is_driver = ["filter=", "diff=", "merge="]
                .iter()
                .any(|p| lower.starts_with(p));
            let attr = sanitize(attr, 60);
            if is_driver && !drivers.contains(&attr) {
                if drivers.len() == 3 {
                    return drivers;
                }
                drivers.push(attr);
            }
        }
    }
    drivers
}

/// A path's components as a case-insensitive (HFS+, NTFS) file system compares them; `\`
/// separates too, as on Windows.
fn folded_components(path: &str) -> Vec<String> {
    path.split(['/', '\\']).map(fold).collect()
}

fn fold(component: &str) -> String {
    let mut folded: String = component
        .chars()
        .filter(|&c| !is_hfs_ignorable(c))
        .map(|c| c.to_ascii_lowercase())
        .collect();
    while folded.ends_with(['.', ' ']) {
        folded.pop();
    }
    folded
}

/// Code points HFS+ drops when it compares names (git's `is_hfs_dotgit` list).
fn is_hfs_ignorable(c: char) -> bool {
    matches!(c, '\u{200c}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{206a}'..='\u{206f}' | '\u{feff}')
}

fn shown(text: &str) -> String {
    sanitize(text, SHOWN_CHARS)
}
