//! How a path name is compared with the names in the sensitive table, and what makes a name
//! unusual.
//!
//! The patch is written on Linux but may be applied on macOS or Windows, whose file systems
//! treat many different byte strings as one name: `.GitHub`, `.github.`, `GITHUB~1` and
//! `.gıthub` can all open `.github` there. So each component is compared in a normal form:
//! NFKC, full Unicode case folding, the code points HFS+ ignores dropped, the dotless i folded
//! the way NTFS upcases it, an NTFS stream suffix (`:$DATA`) and trailing dots and spaces
//! stripped (Windows drops them); and an 8.3 short name (`GITHUB~1`) matches every name it
//! could abbreviate.

use unicode_normalization::UnicodeNormalization;

/// One path component, in its normal form.
#[derive(Debug, Clone)]
pub(super) struct Component {
    pub folded: String,
    /// The `PREFIX` of an 8.3 short name `PREFIX~N[.EXT]`, folded.
    short: Option<String>,
}

impl Component {
    pub fn new(raw: &str) -> Self {
        let folded = fold(raw);
        let short = short_name_prefix(&folded).map(str::to_owned);
        Component { folded, short }
    }

    /// Whether this component can name `name` (ASCII, as the table writes it) on some file
    /// system the patch may be applied on.
    pub fn is(&self, name: &str) -> bool {
        self.folded.eq_ignore_ascii_case(name)
            || self
                .short
                .as_deref()
                .is_some_and(|prefix| short_base(name).starts_with(prefix))
    }

    /// Whether the name ends with `suffix` (ASCII) in its normal form.
    pub fn ends_with(&self, suffix: &str) -> bool {
        let (folded, suffix) = (self.folded.as_bytes(), suffix.as_bytes());
        folded.len() > suffix.len()
            && folded[folded.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
    }

    /// The component as a plain reading sees it: ASCII case aside, exactly as written. A
    /// name that matches a rule only in its normal form is a look-alike.
    pub fn plain(raw: &str) -> Self {
        Component {
            folded: raw.to_ascii_lowercase(),
            short: None,
        }
    }
}

/// A path's components (`\` separates too, as on Windows).
pub(super) fn components(path: &str) -> Vec<Component> {
    path.split(['/', '\\']).map(Component::new).collect()
}

/// A path's components read plainly (see [`Component::plain`]).
pub(super) fn plain_components(path: &str) -> Vec<Component> {
    path.split(['/', '\\']).map(Component::plain).collect()
}

/// The normal form of one component (see the module doc).
pub(super) fn fold(component: &str) -> String {
    // ASCII is its own NFKC, and its case fold is its lowercase: the common case stays cheap
    // for patches of many files.
    let mut out = if component.is_ascii() {
        component.to_ascii_lowercase()
    } else {
        let nfkc: String = component.nfkc().collect();
        caseless::default_case_fold_str(&nfkc)
            .nfkc()
            .filter(|&c| !is_ignorable(c))
            // NTFS upcases U+0131 to `I`, so `.gıt` is `.GIT` there.
            .map(|c| if c == '\u{0131}' { 'i' } else { c })
            .collect()
    };
    // NTFS reads `name:stream` (`.git::$INDEX_ALLOCATION`) as a stream of `name`.
    if let Some(colon) = out.find(':') {
        out.truncate(colon);
    }
    while out.ends_with(['.', ' ']) {
        out.pop();
    }
    out
}

/// Whether a component is, on some file system, git's own directory `.git`.
pub(super) fn is_git_dir(component: &str) -> bool {
    Component::new(component).is(".git")
}

/// `PREFIX` of `PREFIX~N[.EXT]` (up to six characters, then `~` and digits).
fn short_name_prefix(folded: &str) -> Option<&str> {
    let (prefix, rest) = folded.split_once('~')?;
    let digits = rest.split_once('.').map_or(rest, |(digits, _)| digits);
    let prefix_ok = (1..=6).contains(&prefix.chars().count());
    let digits_ok = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    (prefix_ok && digits_ok).then_some(prefix)
}

/// What Windows builds a short name from: the name without leading dots, without its
/// extension, without spaces and dots, lowercased (comparisons are on folded names).
fn short_base(name: &str) -> String {
    let name = name.trim_start_matches('.');
    let stem = name.rsplit_once('.').map_or(name, |(stem, _)| stem);
    stem.chars()
        .filter(|&c| c != ' ' && c != '.')
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// Code points that file systems or terminals drop from a name: HFS+'s ignorable list (git's
/// `is_hfs_dotgit`) and the other zero-width format characters.
fn is_ignorable(c: char) -> bool {
    matches!(c, '\u{00ad}' | '\u{034f}' | '\u{180e}' | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{feff}')
}

/// Characters that reorder displayed text (Trojan Source): a name using them shows a reviewer
/// a name other than the one it has.
pub(crate) fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Why a path's name is unusual (control, invisible or bidirectional characters, bytes that
/// were not UTF-8, leading or trailing spaces, trailing dots), or `None`.
pub(super) fn unusual(path: &str) -> Option<String> {
    if let Some(c) = path.chars().find(|&c| c.is_control()) {
        return Some(format!(
            "its name contains the control character {}",
            code(c)
        ));
    }
    if let Some(c) = path.chars().find(|&c| is_bidi_control(c)) {
        return Some(format!(
            "its name contains the bidirectional control {}, which can make it display as \
             another name",
            code(c)
        ));
    }
    if let Some(c) = path.chars().find(|&c| is_ignorable(c) || c == '\u{3164}') {
        return Some(format!(
            "its name contains the invisible character {}",
            code(c)
        ));
    }
    if path.contains('\u{fffd}') {
        return Some("its name has bytes that are not UTF-8 (shown as U+FFFD)".to_owned());
    }
    for component in path.split('/') {
        if component.starts_with(char::is_whitespace) || component.ends_with(char::is_whitespace) {
            return Some("a name in it starts or ends with a space".to_owned());
        }
        if component.ends_with('.') {
            return Some(
                "a name in it ends with a dot, which Windows drops when it writes the file"
                    .to_owned(),
            );
        }
    }
    None
}

/// `U+202E`.
pub(crate) fn code(c: char) -> String {
    format!("U+{:04X}", u32::from(c))
}
