//! The host's extra CAs (`DYNOCAP_EXTRA_CA`) in the guest's own trust store: each system CA
//! bundle the guest has (wherever its distribution keeps it) gets them appended, and the
//! directory its distribution's update tool reads local CAs from gets a copy, so a bundle
//! made again later (`update-ca-certificates`, `update-ca-trust` after an apt or dnf
//! upgrade) keeps them. apt, curl, git, pip and cargo then trust them with no variable set.
//!
//! The agent writes as the guest's root, inside the guest: a bundle it cannot write (the
//! `host` image's, a read-only bind of the host's own files) is left as it is; the jail binds
//! a bundle that already holds the extra CAs over that one (see the engine's jail backend),
//! which is why a bundle already holding every extra certificate is not written again. The
//! host's own files are never written: inside the guest they are read-only.

use std::path::{Path, PathBuf};

use crate::fsutil::replace_file;

use dynocap_proto::trust::LOCAL_ANCHORS;
pub use dynocap_proto::trust::SYSTEM_BUNDLES;

/// Whether `path` (as [`join_system_bundles`] reports it: a link followed) is a system
/// bundle, rather than a local CA directory's copy.
pub fn is_system_bundle(path: &Path) -> bool {
    SYSTEM_BUNDLES.iter().any(|bundle| {
        Path::new(bundle) == path || std::fs::canonicalize(bundle).is_ok_and(|real| real == path)
    })
}

/// Largest bundle read: distributions' bundles are about 200 KB.
const BUNDLE_MAX: u64 = 8 << 20;

/// What happened to one file.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The extra CAs were added.
    Joined(PathBuf),
    /// It already held every one of them.
    Present(PathBuf),
    /// It could not be changed (read-only, as the host's are): why.
    Skipped(PathBuf, String),
}

/// The PEM certificate blocks of `text`, each with its whitespace normalised, so the same
/// certificate compares equal however its lines end.
fn certificates(text: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let block = &rest[start..start + len + END.len()];
        found.push(block.split_whitespace().collect::<String>());
        rest = &rest[start + len + END.len()..];
    }
    found
}

/// Adds `extra` (PEM) to every system bundle of the guest and to its distribution's local
/// CA directory. Each file is replaced whole (a new file renamed over it), so a reader sees
/// the old bundle or the new one, never half of one.
pub fn join_system_bundles(extra: &str) -> Vec<Outcome> {
    let wanted = certificates(extra);
    if wanted.is_empty() {
        return Vec::new();
    }
    let mut outcomes = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    for path in SYSTEM_BUNDLES {
        // A link (Fedora's ca-bundle.crt, Alpine's cert.pem) is followed: the file it names
        // is the bundle, written once however many names lead to it.
        let Ok(real) = std::fs::canonicalize(path) else {
            continue;
        };
        if seen.contains(&real) {
            continue;
        }
        seen.push(real.clone());
        outcomes.push(join_one(&real, extra, &wanted));
    }
    for anchor in LOCAL_ANCHORS {
        let anchor = Path::new(anchor);
        if anchor.parent().is_some_and(Path::is_dir) {
            outcomes.push(match replace_file(anchor, extra.as_bytes()) {
                Ok(()) => Outcome::Joined(anchor.to_owned()),
                Err(err) => Outcome::Skipped(anchor.to_owned(), err.to_string()),
            });
        }
    }
    outcomes
}

fn join_one(path: &Path, extra: &str, wanted: &[String]) -> Outcome {
    let read = std::fs::metadata(path).and_then(|meta| {
        if !meta.is_file() || meta.len() > BUNDLE_MAX {
            return Err(std::io::Error::other(format!(
                "not a regular file of at most {BUNDLE_MAX} bytes"
            )));
        }
        std::fs::read_to_string(path)
    });
    let bundle = match read {
        Ok(bundle) => bundle,
        Err(err) => return Outcome::Skipped(path.to_owned(), err.to_string()),
    };
    let held = certificates(&bundle);
    if wanted.iter().all(|cert| held.contains(cert)) {
        return Outcome::Present(path.to_owned());
    }
    let mut joined = bundle;
    if !joined.is_empty() && !joined.ends_with('\n') {
        joined.push('\n');
    }
    joined.push_str(extra);
    if !joined.ends_with('\n') {
        joined.push('\n');
    }
    match replace_file(path, joined.as_bytes()) {
        Ok(()) => Outcome::Joined(path.to_owned()),
        Err(err) => Outcome::Skipped(path.to_owned(), err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    const A: &str = "-----BEGIN CERTIFICATE-----\nAAAA\nAAAA\n-----END CERTIFICATE-----\n";
    const B: &str = "-----BEGIN CERTIFICATE-----\r\nBBBB\r\n-----END CERTIFICATE-----";

    #[test]
    fn only_system_bundles_are_named_for_node() {
        assert!(is_system_bundle(Path::new(
            "/etc/ssl/certs/ca-certificates.crt"
        )));
        assert!(is_system_bundle(Path::new(
            "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem"
        )));
        for anchor in LOCAL_ANCHORS {
            assert!(!is_system_bundle(Path::new(anchor)), "{anchor}");
        }
    }

    #[test]
    fn certificates_compare_whatever_their_line_ends() {
        assert_eq!(certificates(&format!("junk\n{A}{B}\n")).len(), 2);
        assert_eq!(
            certificates(B),
            certificates("-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n")
        );
        assert!(certificates("-----BEGIN CERTIFICATE-----\nCC").is_empty());
    }

    #[test]
    fn a_bundle_gets_the_extra_certificates_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bundle = dir.path().join("ca-certificates.crt");
        std::fs::write(&bundle, A.trim_end()).expect("write");
        let wanted = certificates(B);
        assert_eq!(
            join_one(&bundle, B, &wanted),
            Outcome::Joined(bundle.clone())
        );
        let joined = std::fs::read_to_string(&bundle).expect("read");
        assert_eq!(joined, format!("{}\n{B}\n", A.trim_end()));
        assert_eq!(
            std::fs::metadata(&bundle)
                .expect("meta")
                .permissions()
                .mode()
                & 0o777,
            0o644
        );
        // Again: nothing to add, nothing written.
        assert_eq!(
            join_one(&bundle, B, &wanted),
            Outcome::Present(bundle.clone())
        );
        assert_eq!(std::fs::read_to_string(&bundle).expect("read"), joined);
        // No temporary file is left beside it.
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
    }

    #[test]
    fn a_bundle_that_cannot_be_written_is_left_as_it_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("none/ca.crt");
        assert!(matches!(
            join_one(&missing, B, &certificates(B)),
            Outcome::Skipped(..)
        ));
        let dir_as_bundle = dir.path().to_owned();
        assert!(matches!(
            join_one(&dir_as_bundle, B, &certificates(B)),
            Outcome::Skipped(..)
        ));
    }
}
