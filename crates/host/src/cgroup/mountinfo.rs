//! Parsing `/proc/self/mountinfo` (see proc(5)): where cgroup hierarchies are mounted is read
//! from here, never assumed.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use crate::error::HostError;

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountEntry {
    /// Root of the mount within its filesystem (for cgroupfs: the cgroup it exposes).
    pub root: PathBuf,
    /// Where it is mounted, relative to this process's root.
    pub mount_point: PathBuf,
    /// Filesystem type, e.g. `cgroup`, `cgroup2`, `overlay`.
    pub fs_type: String,
    /// Per-superblock options, e.g. `rw,cpu,cpuacct` for a v1 cgroup hierarchy.
    pub super_options: String,
}

/// Reads and parses this process's mount table.
pub(crate) fn read_self() -> Result<Vec<MountEntry>, HostError> {
    let path = Path::new("/proc/self/mountinfo");
    let text = std::fs::read(path).map_err(|e| HostError::io("read", path, e))?;
    Ok(parse(&text))
}

/// Parses mountinfo text; malformed lines are skipped.
pub(crate) fn parse(text: &[u8]) -> Vec<MountEntry> {
    text.split(|&b| b == b'\n').filter_map(parse_line).collect()
}

fn parse_line(line: &[u8]) -> Option<MountEntry> {
    // 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    // (1)(2)(3)   (4)   (5)      (6)      (7...)  - (8)    (9)         (10)
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let separator = fields.iter().position(|f| *f == b"-")?;
    if separator < 6 {
        return None;
    }
    let root = fields.get(3)?;
    let mount_point = fields.get(4)?;
    let fs_type = fields.get(separator + 1)?;
    let super_options = fields.get(separator + 3)?;
    Some(MountEntry {
        root: unescape(root).into(),
        mount_point: unescape(mount_point).into(),
        fs_type: String::from_utf8_lossy(fs_type).into_owned(),
        super_options: String::from_utf8_lossy(super_options).into_owned(),
    })
}

/// Undoes the kernel's octal escaping of space, tab, newline and backslash (`\040` ...).
fn unescape(field: &[u8]) -> OsString {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| {
                let value = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                u8::try_from(value).ok()
            });
        match octal {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    OsString::from_vec(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_and_optional_tags() {
        let text = b"32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime shared:9 master:2 - cgroup cgroup rw,cpu\n\
                     41 31 0:38 /a\\040b /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n\
                     garbage line\n";
        let entries = parse(text);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].mount_point, PathBuf::from("/sys/fs/cgroup/cpu"));
        assert_eq!(entries[0].fs_type, "cgroup");
        assert_eq!(entries[0].super_options, "rw,cpu");
        assert_eq!(entries[1].root, PathBuf::from("/a b"));
        assert_eq!(entries[1].fs_type, "cgroup2");
    }

    #[test]
    fn unescapes_octal_only() {
        assert_eq!(unescape(b"a\\040b\\011c"), OsString::from("a b\tc"));
        assert_eq!(unescape(b"back\\\\x\\9"), OsString::from("back\\\\x\\9"));
        assert_eq!(unescape(b"end\\04"), OsString::from("end\\04"));
    }

    #[test]
    fn reads_this_process() {
        let entries = read_self().expect("mountinfo");
        assert!(entries.iter().any(|e| e.mount_point == Path::new("/")));
    }
}
