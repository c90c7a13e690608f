//! SSH private keys named by `sshKeyPath`: read once, without following a symlink, and checked
//! to be an unencrypted OpenSSH or PEM private key before anything uses them. The key's content
//! never appears in a message.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use base64::Engine as _;

use crate::foundation::error::{Error, Result};

/// Larger than any SSH private key.
pub const MAX_KEY_BYTES: u64 = 64 * 1024;

/// What a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// A private key usable without a passphrase.
    Plain,
    /// A private key protected by a passphrase.
    Encrypted,
    NotAKey,
}

/// Classifies `bytes` as an OpenSSH or PEM (RSA, EC, DSA) private key.
pub fn classify(bytes: &[u8]) -> KeyKind {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return KeyKind::NotAKey;
    };
    let text = text.trim();
    const KINDS: [&str; 4] = [
        "OPENSSH PRIVATE KEY",
        "RSA PRIVATE KEY",
        "EC PRIVATE KEY",
        "DSA PRIVATE KEY",
    ];
    for kind in KINDS {
        let begin = format!("-----BEGIN {kind}-----");
        let end = format!("-----END {kind}-----");
        let Some(body) = text
            .strip_prefix(begin.as_str())
            .and_then(|rest| rest.strip_suffix(end.as_str()))
        else {
            continue;
        };
        if body.contains("-----") {
            return KeyKind::NotAKey;
        }
        let mut lines: Vec<&str> = body.lines().map(str::trim).collect();
        let mut encrypted = false;
        // Legacy encrypted PEM: "Proc-Type: 4,ENCRYPTED" and "DEK-Info: ..." headers, then a
        // blank line, then the body.
        if kind != "OPENSSH PRIVATE KEY" {
            while let Some(first) = lines.iter().position(|l| !l.is_empty()) {
                if lines[first].contains(':') {
                    encrypted |= lines[first].contains("ENCRYPTED");
                    lines.drain(..=first);
                } else {
                    break;
                }
            }
        }
        let joined: String = lines.concat();
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(joined.as_bytes())
        else {
            return KeyKind::NotAKey;
        };
        if kind == "OPENSSH PRIVATE KEY" {
            let Some(rest) = decoded.strip_prefix(b"openssh-key-v1\0") else {
                return KeyKind::NotAKey;
            };
            // string ciphername: "none" unless a passphrase protects the key.
            let Some(len) = rest.get(..4) else {
                return KeyKind::NotAKey;
            };
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
            return match rest.get(4..4 + len) {
                Some(b"none") => KeyKind::Plain,
                Some(_) => KeyKind::Encrypted,
                None => KeyKind::NotAKey,
            };
        }
        // DER: a SEQUENCE.
        if decoded.len() > 16 && decoded[0] == 0x30 {
            return if encrypted {
                KeyKind::Encrypted
            } else {
                KeyKind::Plain
            };
        }
        return KeyKind::NotAKey;
    }
    KeyKind::NotAKey
}

/// Reads the key at `path` for a clone: a regular file (not a symlink), an SSH private key,
/// without a passphrase.
pub fn read(path: &Path) -> Result<String> {
    let shown = path.display();
    let refuse = |why: &str| {
        Error::invalid(format!(
            "sshKeyPath {shown}: {why}. Name a regular file holding an OpenSSH or PEM private key without a passphrase; its content is not shown"
        ))
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|err| match err.raw_os_error() {
            Some(libc::ELOOP) => refuse("it is a symlink; name the key file itself"),
            _ => refuse(&format!("it cannot be read ({})", err.kind())),
        })?;
    let meta = file.metadata().map_err(|_| refuse("it cannot be read"))?;
    if !meta.is_file() {
        return Err(refuse("it is not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(MAX_KEY_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|_| refuse("it cannot be read"))?;
    if bytes.len() as u64 > MAX_KEY_BYTES {
        return Err(refuse("it is larger than any SSH private key"));
    }
    match classify(&bytes) {
        KeyKind::Plain => String::from_utf8(bytes).map_err(|_| refuse("it is not text")),
        KeyKind::Encrypted => Err(refuse(
            "the key is protected by a passphrase, which a sandbox cannot enter; use a key without one (e.g. a deploy key made with ssh-keygen -N '')",
        )),
        KeyKind::NotAKey => Err(refuse("it does not parse as an SSH private key")),
    }
}
