//! The error state of a VM guest's disks, which the host cannot see inside the guest's
//! kernel: the errors their ext4 recorded (`/sys/fs/ext4/<device>/errors_count`), after which
//! they take no more writes (the first stage mounts them `errors=remount-ro`). Read after every
//! sync the supervisor asks for, so that a failed disk is a task error, never a silent success:
//! the root disk's, then the project's package cache's (see `vm_cache`), as a jail's
//! supervisor reads both on the host.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// A disk whose filesystem recorded errors: what a sync or health request then fails with.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} failed: its filesystem recorded {errors} error(s){}; what it \
     acknowledged before the first stays on it, and what was written since may not have \
     reached it",
    disk.name(),
    first_function.as_ref().map(|func| format!(" (the first in {func})")).unwrap_or_default()
)]
pub struct DiskFailure {
    pub disk: Disk,
    pub errors: u64,
    /// The kernel function that met the first error, when the kernel names it.
    pub first_function: Option<String>,
}

/// Which of the guest's disks failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disk {
    Root,
    /// The project's package cache (a task's second disk).
    Cache,
}

impl Disk {
    fn name(self) -> &'static str {
        match self {
            Disk::Root => "the sandbox's disk",
            Disk::Cache => "the project's package cache",
        }
    }
}

/// What went wrong with the guest's disks, the root's first: it names the failure that
/// matters most to a task.
pub fn failure() -> Option<DiskFailure> {
    root_failure().or_else(cache_failure)
}

/// What went wrong with the project's package cache disk, if the guest has one and its
/// filesystem recorded errors.
pub fn cache_failure() -> Option<DiskFailure> {
    let device = crate::vm_cache::device_name()?;
    failure_in(&Path::new("/sys/fs/ext4").join(device), Disk::Cache)
}

/// What went wrong with the filesystem holding `/`, if it recorded errors; `None` for a
/// healthy one, or one that keeps no count (not ext4).
pub fn root_failure() -> Option<DiskFailure> {
    let dev = std::fs::metadata("/").ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let device = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let device = device.file_name()?.to_string_lossy().into_owned();
    failure_in(&Path::new("/sys/fs/ext4").join(device), Disk::Root)
}

/// The failure the ext4 sysfs directory `ext4` of `disk` records, if any.
fn failure_in(ext4: &Path, disk: Disk) -> Option<DiskFailure> {
    let read = |file: &str| {
        std::fs::read_to_string(ext4.join(file))
            .ok()
            .map(|text| text.trim().to_owned())
    };
    let errors: u64 = read("errors_count")?.parse().ok()?;
    if errors == 0 {
        return None;
    }
    Some(DiskFailure {
        disk,
        errors,
        first_function: read("first_error_func").filter(|f| !f.is_empty()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_above_zero_is_a_failure_naming_the_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(
            failure_in(dir.path(), Disk::Root),
            None,
            "no count, no failure"
        );
        std::fs::write(dir.path().join("errors_count"), "0\n").expect("write");
        assert_eq!(failure_in(dir.path(), Disk::Root), None);
        std::fs::write(dir.path().join("errors_count"), "2\n").expect("write");
        std::fs::write(
            dir.path().join("first_error_func"),
            "ext4_journal_check_start\n",
        )
        .expect("write");
        let failure = failure_in(dir.path(), Disk::Root).expect("a failure");
        assert_eq!(
            failure.to_string(),
            "the sandbox's disk failed: its filesystem recorded 2 error(s) (the first in \
             ext4_journal_check_start); what it acknowledged before the first stays on it, and \
             what was written since may not have reached it"
        );
        assert!(failure_in(dir.path(), Disk::Cache)
            .expect("a failure")
            .to_string()
            .starts_with("the project's package cache failed: its filesystem recorded 2"));
        std::fs::remove_file(dir.path().join("first_error_func")).expect("rm");
        assert!(failure_in(dir.path(), Disk::Root)
            .expect("a failure")
            .to_string()
            .contains("recorded 2 error(s); what"));
    }
}
