//! Which changed paths a reviewer must look at (the kinds of docs/mcp.md, "Sensitive paths"),
//! and a reason for each that a person understands.
//!
//! The rules are the table in `rules.rs`; this file applies them. Names are compared in the
//! normal form of `names.rs`, because the patch may be applied on a Mac or a Windows box:
//! `.HUSKY/pre-commit` or `GITHUB~1/workflows/x.yml` is a hook or a workflow there.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::names;
use super::rules::{Check, Rule, When, RULES};
use super::toml_keys;
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
        by_name(path, action, Some(file), found);
        toml_rules(file, path, action, baseline, found);
    }
    if let Some(new) = new {
        symlink(file, new, baseline, found);
        exec_bit(file, new, found);
    }
    package_json(file, baseline, found);
}

/// An entry the parser could not read: flagged as such, and each name it seems to touch is
/// judged by its name alone (content rules flag it outright, since nothing can be compared).
pub(super) fn classify_unreadable(names: &[String], line: usize, why: &str, found: &mut Found) {
    for path in names {
        by_name(path, Action::Changes, None, found);
        for rule in RULES {
            if let When::TomlKeys(..) = rule.when {
                if rule.when.matches(&names::components(path)) {
                    let reason = format!(
                        "{} (its content could not be read)",
                        Action::Changes.describe(rule.what, path)
                    );
                    found.add(path, rule.kind, &reason);
                }
            }
        }
        if names::components(path)
            .last()
            .is_some_and(|c| c.is("package.json"))
        {
            let reason = format!("changes {} (its content could not be read)", shown(path));
            found.add(path, check_rule(Check::NpmScripts).kind, &reason);
        }
    }
    let rule = check_rule(Check::UnreadableEntry);
    let reason = format!(
        "the entry at line {line} could not be read ({why}); it is counted as one changed \
         file and the patch is not verified"
    );
    match names.first() {
        Some(path) => found.add(path, rule.kind, &reason),
        None => found.add(&format!("(patch line {line})"), rule.kind, &reason),
    }
}

/// The rule of the table that a [`Check`] implements.
fn check_rule(check: Check) -> &'static Rule {
    RULES
        .iter()
        .find(|r| matches!(r.when, When::Check(c, _) if c == check))
        .expect("every check has a row in the table (rules.rs)")
}

/// The kinds a path's name alone decides (the name rules of the table), git's own directory,
/// unusual names, and what the `+` lines of git's own config files set.
fn by_name(path: &str, action: Action<'_>, file: Option<&FilePatch<'_>>, found: &mut Found) {
    let components = names::components(path);
    let mut kinds = Vec::new();
    for rule in RULES {
        if matches!(rule.when, When::TomlKeys(..)) || !rule.when.matches(&components) {
            continue;
        }
        if !kinds.contains(&rule.kind) {
            kinds.push(rule.kind);
            let mut reason = action.describe(rule.what, path);
            if rule.kind == SensitiveKind::GitConfig && action.has_new_side() {
                if let Some(file) =
                    file.filter(|_| components.last().is_some_and(|c| c.is(".gitattributes")))
                {
                    let drivers = attribute_drivers(file);
                    if !drivers.is_empty() {
                        reason.push_str(&format!(" and sets {}", drivers.join(", ")));
                    }
                }
            }
            found.add(path, rule.kind, &reason);
        }
    }
    if components.iter().any(|c| c.is(".git")) {
        let rule = check_rule(Check::GitDir);
        let reason = format!(
            "{}; git's own directory is never part of a patch, so the host refused it",
            action.describe("a file inside git's own directory:", path)
        );
        found.add(path, rule.kind, &reason);
    }
    let is_git_config = components.last().is_some_and(|c| c.is(".gitconfig"))
        || (components.len() >= 2
            && components[components.len() - 1].is("config")
            && components[components.len() - 2].is(".git"));
    if let Some(file) = file.filter(|_| is_git_config && action.has_new_side()) {
        for value in added_lines(file).filter_map(hooks_path_setting) {
            let reason = if value.is_empty() {
                "sets core.hooksPath".to_owned()
            } else {
                format!("sets core.hooksPath to {}", shown(&value))
            };
            found.add(path, check_rule(Check::HooksPath).kind, &reason);
        }
    }
    let unusual = check_rule(Check::UnusualName).kind;
    if let Some(why) = names::unusual(path) {
        found.add(
            path,
            unusual,
            &format!("{}: {why}", action.describe("a file", path)),
        );
    }
    let plain = names::plain_components(path);
    if name_matches(&components)
        .into_iter()
        .any(|hit| !name_matches(&plain).contains(&hit))
    {
        let normal: Vec<&str> = components.iter().map(|c| c.folded.as_str()).collect();
        let reason = format!(
            "{}: a look-alike of {}, which case-insensitive or Windows file systems may open \
             as that file",
            action.describe("a file", path),
            shown(&normal.join("/"))
        );
        found.add(path, unusual, &reason);
    }
}

/// What a path's name matches: the name rules of the table (by index), and `package.json`
/// and `.git` (judged in code). Compared between the normal and the plain reading of a
/// name, it tells a look-alike from a name that is plainly what it says.
fn name_matches(components: &[names::Component]) -> Vec<usize> {
    let mut hits: Vec<usize> = RULES
        .iter()
        .enumerate()
        .filter(|(_, rule)| rule.when.matches(components))
        .map(|(i, _)| i)
        .collect();
    if components.last().is_some_and(|c| c.is("package.json")) {
        hits.push(RULES.len());
    }
    if components.iter().any(|c| c.is(".git")) {
        hits.push(RULES.len() + 1);
    }
    hits
}

/// The TOML rules of the table (`Cargo.toml`, `pyproject.toml`): flagged when the watched
/// tables or keys differ between the two sides, or when the sides cannot be rebuilt.
fn toml_rules(
    file: &FilePatch<'_>,
    path: &str,
    action: Action<'_>,
    baseline: &dyn Fn(&str) -> Option<Vec<u8>>,
    found: &mut Found,
) {
    let components = names::components(path);
    for rule in RULES {
        let When::TomlKeys(_, keys) = rule.when else {
            continue;
        };
        if !rule.when.matches(&components) {
            continue;
        }
        let (before, after) = sides(file, action, baseline);
        let watched = |side: Result<Vec<u8>, String>| {
            side.map(|text| toml_keys::watched(&String::from_utf8_lossy(&text), keys))
        };
        let reason = match (watched(before), watched(after)) {
            (Ok(before), Ok(after)) if before == after => continue,
            (Ok(before), Ok(after)) => {
                let changed = after
                    .iter()
                    .filter(|l| !before.contains(l))
                    .chain(before.iter().filter(|l| !after.contains(l)))
                    .next()
                    .map(|l| l.split(' ').next().unwrap_or_default().to_owned())
                    .unwrap_or_default();
                format!(
                    "{} and changes its build settings ({})",
                    action.describe(rule.what, path),
                    shown(&changed)
                )
            }
            (Err(why), _) | (_, Err(why)) => format!(
                "{}; its build settings could not be compared: {why}",
                action.describe(rule.what, path)
            ),
        };
        found.add(path, rule.kind, &reason);
    }
}

/// The content of `path` before and after the entry, from the side of it `action` names.
fn sides(
    file: &FilePatch<'_>,
    action: Action<'_>,
    baseline: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> (Result<Vec<u8>, String>, Result<Vec<u8>, String>) {
    let old = old_content(file, baseline);
    match action {
        Action::Deletes | Action::RenamedTo(_) => (old, Ok(Vec::new())),
        Action::Adds | Action::RenamedFrom(_) | Action::CopiedFrom(_) => {
            (Ok(Vec::new()), old.and_then(|old| rebuild(file, &old)))
        }
        Action::Changes => {
            let after = old.clone().and_then(|old| rebuild(file, &old));
            (old, after)
        }
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
    found.add(path, check_rule(Check::Symlink).kind, &reason);
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
    if file.new_mode == Some(MODE_EXECUTABLE) {
        let reason = match file.old_mode {
            _ if file.is_new => "new executable file".to_owned(),
            Some(old) => format!("mode {old:o} → {MODE_EXECUTABLE:o}"),
            None => "made executable".to_owned(),
        };
        found.add(path, check_rule(Check::NewExecutable).kind, &reason);
    }
    // An executable that keeps its bit but gets new content is a new program all the same.
    let stays_executable = file.old_mode == Some(MODE_EXECUTABLE)
        && file.new_mode.unwrap_or(MODE_EXECUTABLE) == MODE_EXECUTABLE;
    let has_content = !file.hunks.is_empty() || file.is_binary;
    if stays_executable && has_content && !file.is_deleted {
        let reason = format!(
            "changes the content of {}, an executable file (mode {MODE_EXECUTABLE:o})",
            shown(path)
        );
        found.add(path, check_rule(Check::ExecutableContent).kind, &reason);
    }
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
        package_dependencies(file, path, &old_content, found);
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
    names::components(path)
        .last()
        .is_some_and(|name| name.is("package.json"))
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
        check_rule(Check::NpmScripts).kind,
        &format!("{reason}{note}"),
    );
}

/// The dependency fields whose values npm installs from.
const DEPENDENCY_FIELDS: [&str; 6] = [
    "dependencies",
    "devDependencies",
    "optionalDependencies",
    "peerDependencies",
    "overrides",
    "resolutions",
];

/// Flags dependencies the change adds or repoints to git, a local file, a link or a URL:
/// npm runs such a package's install scripts from wherever it points, unreviewed.
fn package_dependencies(
    file: &FilePatch<'_>,
    path: &str,
    old_content: &Result<Vec<u8>, String>,
    found: &mut Found,
) {
    let kind = check_rule(Check::NpmDependencies).kind;
    let parse = |content: &[u8]| -> Result<Map<String, Value>, String> {
        match serde_json::from_slice(content) {
            Ok(Value::Object(package)) => Ok(package),
            Ok(_) => Err("package.json is not a JSON object".to_owned()),
            Err(err) => Err(format!("package.json is not valid JSON ({err})")),
        }
    };
    let starts_new = file.is_new || file.is_rename || file.is_copy;
    let before = match old_content {
        Ok(_) if starts_new => Ok(Map::new()),
        Ok(old) => parse(old),
        Err(why) => Err(why.clone()),
    };
    let after = old_content
        .clone()
        .and_then(|old| rebuild(file, &old))
        .and_then(|new| parse(&new));
    let (before, after) = match (before, after) {
        (Ok(before), Ok(after)) => (before, after),
        // The scripts check already flags a package.json it cannot compare.
        _ => return,
    };
    let mut risky = Vec::new();
    for field in DEPENDENCY_FIELDS {
        let Some(Value::Object(deps)) = after.get(field) else {
            continue;
        };
        let old = before.get(field).and_then(Value::as_object);
        for (name, spec) in deps {
            let text = spec
                .as_str()
                .map_or_else(|| spec.to_string(), str::to_owned);
            let unchanged = old.and_then(|o| o.get(name)) == Some(spec);
            if !unchanged && is_risky_spec(&text) {
                risky.push(format!("'{}' from {}", sanitize(name, 60), shown(&text)));
            }
        }
    }
    if let Some(first) = risky.first() {
        let more = match risky.len() {
            1 => String::new(),
            n => format!(" and {} more", n - 1),
        };
        let reason =
            format!("adds or changes the npm dependency {first}{more}: not from the registry");
        found.add(path, kind, &reason);
    }
}

/// Whether an npm dependency spec points somewhere other than the registry: git, a file, a
/// link, a URL, or a GitHub `owner/repo` shorthand (an `npm:` alias to a registry package and
/// plain version ranges are fine).
fn is_risky_spec(spec: &str) -> bool {
    let spec = spec.trim().to_ascii_lowercase();
    const PREFIXES: [&str; 10] = [
        "git+",
        "git:",
        "git@",
        "github:",
        "gitlab:",
        "bitbucket:",
        "file:",
        "link:",
        "http:",
        "https:",
    ];
    PREFIXES.iter().any(|p| spec.starts_with(p))
        || (spec.contains('/') && !spec.starts_with("npm:") && !spec.starts_with('@'))
        || spec.starts_with('.')
        || spec.starts_with('/')
        || spec.starts_with('~')
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

fn shown(text: &str) -> String {
    sanitize(text, SHOWN_CHARS)
}
