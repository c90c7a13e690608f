//! apt behind the `filtered` proxy, which carries HTTPS only: a container image's apt sources
//! (Debian's and Ubuntu's official images) name their mirrors as `http://`, which the proxy
//! refuses. While the guest's egress goes through the proxy, the agent (guest root) switches
//! each `http://` source of the guest's own apt configuration to `https://` (deb.debian.org,
//! security.debian.org and the usual mirrors serve both; the archive's signatures are what
//! apt checks either way), and, when the image has no system CA bundle of its own (no
//! `ca-certificates`) but the host sent one, tells apt to verify against that.
//!
//! Only the guest's files change, in its own writable layer: the image, and the host, never.

use std::path::{Path, PathBuf};

/// apt's one-line sources file.
const SOURCES_LIST: &str = "/etc/apt/sources.list";
/// Its directory of `*.list` (one-line) and `*.sources` (deb822) files.
const SOURCES_DIR: &str = "/etc/apt/sources.list.d";
/// apt's configuration directory, and the file the CA setting goes in.
const CONF_DIR: &str = "/etc/apt/apt.conf.d";
const CONF_FILE: &str = "/etc/apt/apt.conf.d/00dynocap-egress";
/// Largest sources file read: they are a few hundred bytes.
const SOURCES_MAX: u64 = 1 << 20;

/// Switches the guest's `http://` apt sources to `https://` and, with `ca_bundle`, points
/// apt's HTTPS at it. Returns what was changed or could not be, for the agent's log; an image
/// without apt changes nothing.
pub fn use_https(ca_bundle: Option<&str>) -> Vec<String> {
    let mut said = Vec::new();
    if !Path::new("/etc/apt").is_dir() {
        return said;
    }
    let mut files = vec![PathBuf::from(SOURCES_LIST)];
    if let Ok(entries) = std::fs::read_dir(SOURCES_DIR) {
        let mut listed: Vec<PathBuf> = entries
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| {
                path.extension()
                    .is_some_and(|ext| ext == "list" || ext == "sources")
            })
            .collect();
        listed.sort();
        files.extend(listed);
    }
    for file in files {
        // Regular files only, never through a link: the agent writes as the guest's root.
        let Ok(meta) = std::fs::symlink_metadata(&file) else {
            continue;
        };
        if !meta.is_file() || meta.len() > SOURCES_MAX {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let deb822 = file.extension().is_some_and(|ext| ext == "sources");
        let Some(switched) = switch_sources(&text, deb822) else {
            continue;
        };
        match crate::fsutil::replace_file(&file, switched.as_bytes()) {
            Ok(()) => said.push(format!(
                "apt: {} names its mirrors over https:// (the proxy carries HTTPS only)",
                file.display()
            )),
            Err(err) => said.push(format!("apt: cannot switch {}: {err}", file.display())),
        }
    }
    let Some(bundle) = ca_bundle else {
        // One an earlier sandbox wrote (and an image built in it kept) would name a bundle
        // this one may not have.
        if let Err(err) = crate::fsutil::remove_if_regular(Path::new(CONF_FILE)) {
            said.push(format!("apt: cannot remove {CONF_FILE}: {err}"));
        }
        return said;
    };
    if Path::new(CONF_DIR).is_dir() {
        let conf = format!(
            "// DynoCap: apt's HTTPS trusts what the sandbox's other clients trust.\n\
             Acquire::https::CaInfo \"{bundle}\";\n"
        );
        if let Err(err) = crate::fsutil::replace_file(Path::new(CONF_FILE), conf.as_bytes()) {
            said.push(format!("apt: cannot write {CONF_FILE}: {err}"));
        }
    }
    said
}

/// `text` with every `http://` source switched to `https://`, or `None` when it names none.
/// One-line format: the URI after `deb`/`deb-src` and its `[options]`; deb822: each URI of a
/// `URIs:` field, on its line and its continuation lines. Comments stay as they are.
fn switch_sources(text: &str, deb822: bool) -> Option<String> {
    let mut out = String::with_capacity(text.len() + 16);
    let mut changed = false;
    let mut in_uris = false;
    for line in text.split_inclusive('\n') {
        let switched = if deb822 {
            let continuation = line.starts_with([' ', '\t']);
            if !continuation {
                in_uris = line
                    .split_once(':')
                    .is_some_and(|(key, _)| key.trim().eq_ignore_ascii_case("URIs"));
            }
            if in_uris && !line.trim_start().starts_with('#') {
                let (head, values) = match (continuation, line.split_once(':')) {
                    (false, Some((key, rest))) => (format!("{key}:"), rest),
                    _ => (String::new(), line),
                };
                Some(format!("{head}{}", switch_words(values)))
            } else {
                None
            }
        } else {
            switch_one_line(line)
        };
        match switched {
            Some(new) if new != line => {
                changed = true;
                out.push_str(&new);
            }
            _ => out.push_str(line),
        }
    }
    changed.then_some(out)
}

/// A one-line source with its URI switched; `None` for anything else.
fn switch_one_line(line: &str) -> Option<String> {
    let body = line.trim_start();
    let indent = &line[..line.len() - body.len()];
    let rest = body
        .strip_prefix("deb-src")
        .or_else(|| body.strip_prefix("deb"))
        .filter(|rest| rest.starts_with([' ', '\t']))?;
    let kind = &body[..body.len() - rest.len()];
    // `[ options ]` may hold spaces: the URI is the first word after it.
    let (options, after) = match rest.trim_start().strip_prefix('[') {
        Some(inner) => {
            let close = inner.find(']')?;
            let taken = rest.len() - inner.len() + close + 1;
            (&rest[..taken], &rest[taken..])
        }
        None => ("", rest),
    };
    let spaces = after.len() - after.trim_start().len();
    let uri_start = &after[spaces..];
    let switched = switch_uri(uri_start)?;
    Some(format!(
        "{indent}{kind}{options}{}{switched}",
        &after[..spaces]
    ))
}

/// Each whitespace-separated word of `values` that is an `http://` URI, switched.
fn switch_words(values: &str) -> String {
    let mut out = String::with_capacity(values.len() + 8);
    let mut rest = values;
    while !rest.is_empty() {
        let spaces = rest.len() - rest.trim_start().len();
        out.push_str(&rest[..spaces]);
        rest = &rest[spaces..];
        match switch_uri(rest) {
            Some(switched) => {
                let word = rest.find(char::is_whitespace).unwrap_or(rest.len());
                let tail_len = rest.len() - word;
                out.push_str(&switched[..switched.len() - tail_len]);
                rest = &rest[word..];
            }
            None => {
                let word = rest.find(char::is_whitespace).unwrap_or(rest.len());
                out.push_str(&rest[..word]);
                rest = &rest[word..];
            }
        }
    }
    out
}

/// `text` (starting at a URI) with its `http://` made `https://`; `None` for another scheme.
fn switch_uri(text: &str) -> Option<String> {
    let scheme = text.get(..7)?;
    scheme
        .eq_ignore_ascii_case("http://")
        .then(|| format!("https://{}", &text[7..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_sources_switch_their_uri_only() {
        let text = "# deb http://old.example/ bookworm main\n\
                    deb http://deb.debian.org/debian bookworm main\n\
                    deb-src [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://deb.debian.org/debian bookworm main\n\
                    \tdeb\thttp://security.debian.org/debian-security bookworm-security main\n\
                    deb https://already.example/ ./\n\
                    deb [trusted=yes] HTTP://upper.example/ ./\n\
                    debian http://not-a-source/\n";
        assert_eq!(
            switch_sources(text, false).expect("switched"),
            "# deb http://old.example/ bookworm main\n\
             deb https://deb.debian.org/debian bookworm main\n\
             deb-src [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] https://deb.debian.org/debian bookworm main\n\
             \tdeb\thttps://security.debian.org/debian-security bookworm-security main\n\
             deb https://already.example/ ./\n\
             deb [trusted=yes] https://upper.example/ ./\n\
             debian http://not-a-source/\n"
        );
        assert_eq!(
            switch_sources("deb https://deb.debian.org/debian bookworm main\n", false),
            None
        );
    }

    #[test]
    fn deb822_sources_switch_every_uri_of_their_uris_field() {
        // Debian's own images' file, and a field continued on the next line.
        let text = "Types: deb\n\
                    URIs: http://deb.debian.org/debian\n\
                    Suites: bookworm bookworm-updates\n\
                    Components: main\n\
                    Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\
                    \n\
                    Types: deb\n\
                    uris: http://security.debian.org/debian-security\n \
                    http://mirror.example/security ftp://old.example/\n\
                    # URIs: http://commented.example/\n\
                    Suites: bookworm-security\n\
                    X-Note: http://not-a-uri-field.example/\n";
        assert_eq!(
            switch_sources(text, true).expect("switched"),
            "Types: deb\n\
             URIs: https://deb.debian.org/debian\n\
             Suites: bookworm bookworm-updates\n\
             Components: main\n\
             Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\
             \n\
             Types: deb\n\
             uris: https://security.debian.org/debian-security\n \
             https://mirror.example/security ftp://old.example/\n\
             # URIs: http://commented.example/\n\
             Suites: bookworm-security\n\
             X-Note: http://not-a-uri-field.example/\n"
        );
        assert_eq!(switch_sources("URIs: https://a.example/\n", true), None);
    }
}
