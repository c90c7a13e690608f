//! The git side of `task apply`: every command it runs on the user's repository, all through
//! [`HardenedGit`], and none that touches the user's `HEAD`, index or working tree.
//!
//! The commit is built with index plumbing on a temporary index (`read-tree`, `apply
//! --cached`, `write-tree`, then `commit-tree`) and published by creating the branch only if
//! it does not exist yet (`update-ref` with an empty old value). So a failure at any step
//! leaves no branch behind (at most unreachable objects, which `git gc` prunes), and no step
//! converts work-tree content: no clean or smudge filter, hook or fsmonitor the repository
//! names ever runs. For the same reason, whether a file has uncommitted changes is decided by
//! comparing its bytes with the index's blob here, never by `git status`/`diff-files`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::foundation::error::{Coded, Error, ErrorCode, Result};
use crate::host::hardened_git::{GitError, HardenedGit};
use crate::supervisor::exec::sanitize_line;

use super::branch_name;

/// Longest any one git command may run on the user's repository.
const GIT_TIMEOUT: Duration = Duration::from_secs(600);

/// Most paths passed to one git command.
const PATHS_PER_COMMAND: usize = 500;

/// The identity a commit gets when neither the repository nor the user's git configuration
/// names one.
const FALLBACK_NAME: &str = "DynoCap";
const FALLBACK_EMAIL: &str = "dynocap@localhost";

/// A git work tree of the user's, named by its top directory.
pub struct Repo {
    dir: PathBuf,
}

/// How a path the patch touches differs from the user's last commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uncommitted {
    /// The index differs from `HEAD` (`git add`ed, not committed).
    Staged,
    /// The working tree's file differs from the index.
    Modified,
    /// The index has it, the working tree does not.
    Deleted,
    /// The working tree has it, git does not track it.
    Untracked,
    /// A merge left it unresolved.
    Unmerged,
}

impl Uncommitted {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Staged => "staged, not committed",
            Self::Modified => "modified, not committed",
            Self::Deleted => "deleted, not committed",
            Self::Untracked => "untracked",
            Self::Unmerged => "unmerged",
        }
    }
}

/// One index or tree entry: mode and object id.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Blob {
    mode: String,
    id: String,
}

impl Repo {
    /// The repository whose work tree's top is `dir`. Git looks at `dir` itself only, never at
    /// a repository that merely contains it.
    pub fn open(dir: &Path) -> Result<Self> {
        let dir = dir.canonicalize().map_err(|err| {
            Error::invalid(format!(
                "cannot open the repository {}: {err}",
                dir.display()
            ))
        })?;
        let repo = Self { dir };
        let inside = repo
            .git()
            .args(["rev-parse", "--is-inside-work-tree"])
            .run()
            .map_err(|err| {
                Error::invalid(format!(
                    "{} is not the top of a git work tree ({}); name the directory that holds \
                     the repository's .git",
                    repo.dir.display(),
                    sanitize_line(&err.to_string(), 500)
                ))
            })?;
        if inside.trim_ascii() != b"true" {
            return Err(Error::invalid(format!(
                "{} is a bare repository; name a clone with a working tree",
                repo.dir.display()
            )));
        }
        Ok(repo)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn git(&self) -> HardenedGit {
        HardenedGit::new(&self.dir).timeout(GIT_TIMEOUT)
    }

    /// Whether `id` names a commit this repository has.
    pub fn has_commit(&self, id: &str) -> Result<bool> {
        let out = self
            .git()
            .args(["rev-parse", "--quiet", "--verify"])
            .arg(format!("{id}^{{commit}}"))
            .output()
            .map_err(|err| self.failed(&err))?;
        Ok(out.status.success())
    }

    /// The content of `path` in `commit`, if it is a blob there.
    pub fn blob_at(&self, commit: &str, path: &str) -> Option<Vec<u8>> {
        self.git()
            .args(["cat-file", "blob"])
            .arg(format!("{commit}:{path}"))
            .run()
            .ok()
    }

    /// Refuses a name `git check-ref-format --branch` refuses here, saying which rule it
    /// breaks, and an `@{-N}` that git expands to the name of a branch checked out before
    /// (see [`super::branch_name`]).
    pub fn check_branch_name(&self, branch: &str) -> Result<()> {
        let shown = branch_name::shown(branch);
        let out = self
            .git()
            .args(["check-ref-format", "--branch"])
            .arg(branch)
            .output()
            .map_err(|err| self.failed(&err))?;
        if !out.status.success() {
            return Err(Error::invalid(format!(
                "\"{shown}\" is not a valid git branch name: it {}; pick another with --branch",
                branch_name::problem(branch)
            )));
        }
        if branch_name::expanded(branch, &out.stdout) {
            let read_as = String::from_utf8_lossy(&out.stdout);
            return Err(Error::invalid(format!(
                "\"{shown}\" is git's shorthand for a branch checked out before (git reads it \
                 as \"{}\"), not a name for a new branch; give the new branch's name with \
                 --branch",
                branch_name::shown(read_as.trim_end_matches('\n'))
            )));
        }
        Ok(())
    }

    pub fn branch_exists(&self, branch: &str) -> Result<bool> {
        let out = self
            .git()
            .args(["rev-parse", "--quiet", "--verify"])
            .arg(format!("refs/heads/{branch}"))
            .output()
            .map_err(|err| self.failed(&err))?;
        Ok(out.status.success())
    }

    /// The paths among `paths` whose state in the work tree or index differs from `HEAD`, and
    /// how. A file a git filter converts on checkout shows as modified: refusing then is the
    /// safe side, and running the filter to find out is what this module never does.
    pub fn uncommitted(&self, paths: &[String]) -> Result<Vec<(String, Uncommitted)>> {
        if paths.is_empty() {
            return Ok(Vec::new());
        }
        let head = match self.has_commit("HEAD")? {
            true => self.entries(&["ls-tree", "-r", "-z", "HEAD", "--"], paths, parse_tree)?,
            false => HashMap::new(),
        };
        let index = self.entries(&["ls-files", "-s", "-z", "--"], paths, parse_index)?;
        let mut found = Vec::new();
        for path in paths {
            let in_index = index.get(path.as_str());
            let state = match in_index {
                Some((_, stage)) if *stage != 0 => Some(Uncommitted::Unmerged),
                _ if in_index.map(|(blob, _)| blob) != head.get(path.as_str()) => {
                    Some(Uncommitted::Staged)
                }
                _ => self.work_tree_state(path, in_index.map(|(blob, _)| blob))?,
            };
            if let Some(state) = state {
                found.push((path.clone(), state));
            }
        }
        Ok(found)
    }

    /// How the work tree's `path` differs from the index entry `indexed`, if it does.
    fn work_tree_state(&self, path: &str, indexed: Option<&Blob>) -> Result<Option<Uncommitted>> {
        let on_disk = self.dir.join(path);
        let meta = match on_disk.symlink_metadata() {
            Ok(meta) => Some(meta),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(RepoFailure::Read {
                    path: on_disk,
                    source,
                }
                .into())
            }
        };
        let (blob, meta) = match (indexed, meta) {
            (None, None) => return Ok(None),
            (None, Some(_)) => return Ok(Some(Uncommitted::Untracked)),
            (Some(_), None) => return Ok(Some(Uncommitted::Deleted)),
            (Some(blob), Some(meta)) => (blob, meta),
        };
        let content = match blob.mode.as_str() {
            // A submodule: its own repository, which the patch's hunks do not reach into.
            "160000" => return Ok(None),
            "120000" if meta.file_type().is_symlink() => {
                std::fs::read_link(&on_disk).map(|target| target.as_os_str().as_bytes().to_vec())
            }
            "100644" | "100755"
                if meta.is_file()
                    && (meta.permissions().mode() & 0o111 != 0) == (blob.mode == "100755") =>
            {
                std::fs::read(&on_disk)
            }
            _ => return Ok(Some(Uncommitted::Modified)),
        }
        .map_err(|source| RepoFailure::Read {
            path: on_disk.clone(),
            source,
        })?;
        let size = self
            .git()
            .args(["cat-file", "-s", &blob.id])
            .run()
            .map_err(|err| self.failed(&err))?;
        if String::from_utf8_lossy(&size).trim() != content.len().to_string() {
            return Ok(Some(Uncommitted::Modified));
        }
        let committed = self
            .git()
            .args(["cat-file", "blob", &blob.id])
            .run()
            .map_err(|err| self.failed(&err))?;
        Ok((committed != content).then_some(Uncommitted::Modified))
    }

    /// The entries a listing command prints for exactly `paths` (a literal pathspec also
    /// matches what lies beneath a directory of that name: those are dropped).
    fn entries<T>(
        &self,
        command: &[&str],
        paths: &[String],
        parse: fn(&[u8]) -> Option<(String, T)>,
    ) -> Result<HashMap<String, T>> {
        let wanted: std::collections::HashSet<&str> = paths.iter().map(String::as_str).collect();
        let mut found = HashMap::new();
        // In batches: a patch touching many thousands of files must not exceed ARG_MAX.
        for batch in paths.chunks(PATHS_PER_COMMAND) {
            let out = self
                .git()
                .args(command)
                .args(batch)
                .run()
                .map_err(|err| self.failed(&err))?;
            found.extend(
                out.split(|&b| b == 0)
                    .filter_map(parse)
                    .filter(|(path, _)| wanted.contains(path.as_str())),
            );
        }
        Ok(found)
    }

    /// Builds the commit `patch` applied to `base` makes, with `message`, and returns its id.
    /// `scratch` is an empty directory of the caller's for the temporary index and message.
    pub fn commit_patch(
        &self,
        base: &str,
        patch: &Path,
        message: &str,
        scratch: &Path,
    ) -> Result<String> {
        let index = scratch.join("index");
        // A split index would leave shared-index files in the repository for a throwaway index.
        let on_temp_index = || {
            self.git()
                .index_file(&index)
                .config("core.splitIndex", "false")
        };
        on_temp_index()
            .args(["read-tree", base])
            .run()
            .map_err(|err| self.failed(&err))?;
        on_temp_index()
            .args(["apply", "--cached", "--whitespace=nowarn", "--"])
            .arg(patch)
            .run()
            .map_err(|err| {
                Error::conflict(format!(
                    "the patch does not apply to commit {base} in {}: {}; nothing was changed. \
                     If the project had uncommitted changes when the task started, the patch \
                     is against them: commit them, then apply {} by hand (git apply --3way)",
                    self.dir.display(),
                    sanitize_line(&err.to_string(), 2000),
                    patch.display()
                ))
            })?;
        let tree = on_temp_index()
            .arg("write-tree")
            .run()
            .map_err(|err| self.failed(&err))?;
        let tree = object_id(&tree)?;
        let message_file = scratch.join("message");
        std::fs::write(&message_file, message).map_err(|source| RepoFailure::Write {
            path: message_file.clone(),
            source,
        })?;
        let (name, email) = self.identity();
        let commit = self
            .git()
            .config("user.name", name)
            .config("user.email", email)
            // `commit.gpgSign` would run `gpg.program`, a program the repository may name.
            .config("commit.gpgSign", "false")
            .args(["commit-tree", "--no-gpg-sign", &tree, "-p", base, "-F"])
            .arg(&message_file)
            .run()
            .map_err(|err| self.failed(&err))?;
        object_id(&commit)
    }

    /// Creates `branch` at `commit`, failing if it exists by now.
    pub fn create_branch(&self, branch: &str, commit: &str, reason: &str) -> Result<()> {
        self.git()
            .args(["update-ref", "-m", reason])
            .arg(format!("refs/heads/{branch}"))
            .args([commit, ""])
            .run()
            .map(drop)
            .map_err(|err| {
                Error::conflict(format!(
                    "creating branch {branch} in {} failed: {}; pick another name with --branch",
                    self.dir.display(),
                    sanitize_line(&err.to_string(), 1000)
                ))
            })
    }

    /// Who the commit is by: the repository's `user.name`/`user.email`, else the user's own
    /// git configuration, else DynoCap's.
    fn identity(&self) -> (OsString, OsString) {
        let from_repo = |key: &str| {
            self.git()
                .args(["config", "--get", key])
                .run()
                .ok()
                .and_then(non_empty)
        };
        let name = from_repo("user.name").or_else(|| user_config("user.name"));
        let email = from_repo("user.email").or_else(|| user_config("user.email"));
        (
            name.unwrap_or_else(|| FALLBACK_NAME.into()),
            email.unwrap_or_else(|| FALLBACK_EMAIL.into()),
        )
    }

    fn failed(&self, err: &GitError) -> Error {
        RepoFailure::Git {
            dir: self.dir.clone(),
            said: sanitize_line(&err.to_string(), 2000),
        }
        .into()
    }
}

/// A value of the user's global git configuration (`~/.gitconfig`, `$XDG_CONFIG_HOME/git`):
/// the user's own file, read outside any repository. `git config --get` runs no program.
fn user_config(key: &str) -> Option<OsString> {
    let mut cmd = Command::new("git");
    cmd.env_clear()
        .current_dir("/")
        .args(["config", "--global", "--get", key])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    for var in ["HOME", "XDG_CONFIG_HOME", "PATH"] {
        // env-read-ok: the child git's environment, passed on as it is (not a setting).
        if let Some(value) = std::env::var_os(var) {
            cmd.env(var, value);
        }
    }
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then_some(out.stdout)
        .and_then(non_empty)
}

fn non_empty(bytes: Vec<u8>) -> Option<OsString> {
    let trimmed = bytes.trim_ascii();
    (!trimmed.is_empty()).then(|| std::ffi::OsStr::from_bytes(trimmed).to_os_string())
}

/// The object id git printed (one line of hex).
fn object_id(out: &[u8]) -> Result<String> {
    let id = String::from_utf8_lossy(out).trim().to_owned();
    match !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        true => Ok(id),
        false => Err(RepoFailure::NotAnObjectId(sanitize_line(&id, 200)).into()),
    }
}

/// What failed working in the user's repository.
#[derive(Debug, thiserror::Error)]
enum RepoFailure {
    #[error("reading {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `said` is git's error, sanitized for the terminal (it can quote the repository).
    #[error("git failed in {}: {said}", .dir.display())]
    Git { dir: PathBuf, said: String },
    /// What git printed instead, sanitized.
    #[error("git printed \"{0}\" where an object id was expected")]
    NotAnObjectId(String),
}

impl Coded for RepoFailure {
    /// The repository was checked before any of this runs (a clean, existing work tree is
    /// the caller's side, refused earlier): what fails here is the host's or git's.
    fn code(&self) -> ErrorCode {
        match self {
            Self::Read { .. } | Self::Write { .. } | Self::Git { .. } | Self::NotAnObjectId(_) => {
                ErrorCode::Internal
            }
        }
    }
}

/// `<mode> SP <type> SP <id> TAB <path>` (`ls-tree -z`).
fn parse_tree(record: &[u8]) -> Option<(String, Blob)> {
    let text = std::str::from_utf8(record).ok()?;
    let (meta, path) = text.split_once('\t')?;
    let mut fields = meta.split(' ');
    let (mode, _kind, id) = (fields.next()?, fields.next()?, fields.next()?);
    Some((
        path.to_owned(),
        Blob {
            mode: mode.to_owned(),
            id: id.to_owned(),
        },
    ))
}

/// `<mode> SP <id> SP <stage> TAB <path>` (`ls-files -s -z`).
fn parse_index(record: &[u8]) -> Option<(String, (Blob, u8))> {
    let text = std::str::from_utf8(record).ok()?;
    let (meta, path) = text.split_once('\t')?;
    let mut fields = meta.split(' ');
    let (mode, id, stage) = (fields.next()?, fields.next()?, fields.next()?);
    Some((
        path.to_owned(),
        (
            Blob {
                mode: mode.to_owned(),
                id: id.to_owned(),
            },
            stage.parse().ok()?,
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_an_object_id_is_internal_and_quoted() {
        assert_eq!(object_id(b"0123abcd\n").expect("an id"), "0123abcd");
        let err = object_id(b"fatal: nope").expect_err("not an id");
        assert_eq!(err.code, crate::ErrorCode::Internal);
        assert_eq!(
            err.message,
            "git printed \"fatal: nope\" where an object id was expected"
        );
    }

    #[test]
    fn listing_records_parse() {
        let (path, blob) = parse_tree(b"100755 blob 0123abcd\tdir/run sh").unwrap();
        assert_eq!(path, "dir/run sh");
        assert_eq!(blob.mode, "100755");
        assert_eq!(blob.id, "0123abcd");
        let (path, (blob, stage)) = parse_index(b"120000 89ab 2\tlink").unwrap();
        assert_eq!(
            (path.as_str(), blob.mode.as_str(), stage),
            ("link", "120000", 2)
        );
        assert!(parse_index(b"garbage").is_none());
        assert!(object_id(b"deadbeef\n").is_ok());
        assert!(object_id(b"fatal: nope").is_err());
    }
}
