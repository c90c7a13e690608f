//! The catalog lock: an `flock` on `catalog.lock` in `DYNOCAP_HOME`, so that processes sharing
//! a home agree on who may create or replace the catalog.
//!
//! SQLite's own locks cannot do this job: switching a new database to WAL needs an exclusive
//! lock that its busy handler does not wait for, so processes opening a fresh home at once
//! failed with "database is locked". Creating the catalog takes the lock exclusively (once per
//! new catalog); every other open and every write takes it shared, so a repair (exclusive for
//! its whole run) never races a write into the file it is moving aside. Waits are bounded: a
//! stuck holder turns into an error that says what to look for, never a hang.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::foundation::error::{Coded, ErrorCode, Result};
use crate::host::home::Home;

/// How long to wait for another process to release the lock; as long as SQLite's own busy
/// timeout, since both guard the same short critical sections.
pub(crate) const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// Held while creating or repairing the catalog; excludes every other holder.
pub(crate) struct Exclusive(#[allow(dead_code)] Flock<File>);

/// Held while opening or writing to the catalog; excludes only [`Exclusive`].
pub(crate) struct Shared(#[allow(dead_code)] Flock<File>);

impl Exclusive {
    pub(crate) fn acquire(home: &Home) -> Result<Self> {
        acquire(home, FlockArg::LockExclusiveNonblock).map(Self)
    }
}

impl Shared {
    pub(crate) fn acquire(home: &Home) -> Result<Self> {
        acquire(home, FlockArg::LockSharedNonblock).map(Self)
    }
}

fn acquire(home: &Home, mode: FlockArg) -> Result<Flock<File>> {
    let path = home.catalog_lock_path();
    let mut file = open_lock_file(&path, home.root())?;
    let deadline = Instant::now() + LOCK_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    loop {
        match Flock::lock(file, mode) {
            Ok(lock) => return Ok(lock),
            Err((back, Errno::EINTR)) => file = back,
            Err((back, Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                file = back;
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err((_, Errno::EWOULDBLOCK)) => return Err(LockFailure::Held { path }.into()),
            Err((_, source)) => return Err(LockFailure::Lock { path, source }.into()),
        }
    }
}

fn open_lock_file(path: &Path, root: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| {
            LockFailure::Open {
                path: path.to_owned(),
                home: root.to_owned(),
                source,
            }
            .into()
        })
}

/// What failed taking the catalog lock.
#[derive(Debug, thiserror::Error)]
enum LockFailure {
    #[error(
        "another dynocap process has held the catalog lock {} for over {}s (it creates or \
         repairs the catalog); retry, and if this persists look for a stuck dynocap process \
         with `fuser -v {}`",
        .path.display(),
        LOCK_TIMEOUT.as_secs(),
        .path.display()
    )]
    Held { path: PathBuf },
    #[error("locking the catalog lock {}: {source}", .path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error(
        "cannot open the catalog lock {}: {source}; give this user read and write access to {} \
         (DYNOCAP_HOME), or point DYNOCAP_HOME at a directory of its own",
        .path.display(),
        .home.display()
    )]
    Open {
        path: PathBuf,
        home: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Coded for LockFailure {
    /// The lock is DynoCap's own file: another process holding it, or the host refusing it,
    /// is for the person running DynoCap to resolve (the messages say how).
    fn code(&self) -> ErrorCode {
        match self {
            Self::Held { .. } | Self::Lock { .. } | Self::Open { .. } => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_holders_coexist_and_exclude_an_exclusive_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = Home::at(dir.path().to_owned()).expect("home");
        let first = Shared::acquire(&home).expect("first shared");
        let second = Shared::acquire(&home).expect("second shared");
        let file = open_lock_file(&home.catalog_lock_path(), home.root()).expect("open");
        let Err((file, errno)) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            panic!("an exclusive lock was granted beside shared ones");
        };
        assert_eq!(errno, Errno::EWOULDBLOCK);
        drop((first, second));
        let exclusive = Flock::lock(file, FlockArg::LockExclusiveNonblock);
        assert!(exclusive.is_ok(), "exclusive once the shared holders left");
    }
}
