//! Splitting a task's diff over several git processes, one per CPU.
//!
//! The changed paths, in the order `git diff --raw` lists them (the order the patch prints
//! them in), are cut into contiguous parts of about equal bytes. Each part is diffed by a git
//! of its own, limited to that part's paths, and the parts' patches are sent in order. With
//! `--no-renames` every file's patch stands alone, so the parts concatenated are the whole
//! diff's patch byte for byte: the split changes when the patch is made, never what it says.
//!
//! A part is named by its paths as literal pathspecs, and a pathspec also matches what lies
//! under it. So a diff where one changed path is a directory of another (a file that became a
//! directory) is never split, and neither is one whose paths would not fit on a command line.

use std::collections::HashSet;

/// Most parts a diff is split into: past this, each git's own start (reading the index)
/// costs more than the CPUs give back on the machines this runs on.
pub const MAX_PARTS: usize = 4;

/// A split must take at least this many bytes off the first part's share to be made: about
/// what the diff of that many bytes costs against starting another git.
pub const MIN_GAIN_BYTES: u64 = 2 << 20;

/// The bytes a changed path costs besides its blobs: its entry's lookup and its patch's
/// header, so that many small files weigh something.
pub const PER_PATH_BYTES: u64 = 4 << 10;

/// All parts' paths together stay well under the kernel's limit on a command line (a quarter
/// of the stack limit, 2 MiB by default), beside the environment and git's own arguments.
const MAX_PATH_BYTES: usize = 256 << 10;

/// No diff is looked at for a split unless some file in it may be this large: smaller files
/// make a diff cheap enough that the listing and sizing a split needs would not pay.
pub const MIN_LARGEST_FILE: u64 = 1 << 20;

/// One changed path and what diffing it costs, in bytes (its blobs' sizes and
/// [`PER_PATH_BYTES`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weighed {
    pub path: Vec<u8>,
    pub bytes: u64,
}

/// How many CPUs this process may run on (the cgroup's quota and the affinity mask included).
pub fn parallelism() -> usize {
    static PARALLELISM: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    *PARALLELISM
}

/// The parts to diff `changes` (in the diff's own order) in, for `cpus` CPUs: `None` when
/// one git should diff them all.
pub fn plan(changes: &[Weighed], cpus: usize) -> Option<Vec<Vec<Vec<u8>>>> {
    let most = cpus.min(MAX_PARTS).min(changes.len());
    if most < 2 {
        return None;
    }
    let path_bytes: usize = changes.iter().map(|c| c.path.len() + 1).sum();
    if path_bytes > MAX_PATH_BYTES || any_is_a_directory_of_another(changes) {
        return None;
    }
    let weights: Vec<u64> = changes.iter().map(|c| c.bytes).collect();
    let total = weights.iter().fold(0_u64, |t, w| t.saturating_add(*w));
    let cap = smallest_cap(&weights, most);
    if total.saturating_sub(cap) < MIN_GAIN_BYTES {
        return None;
    }
    let mut parts: Vec<Vec<Vec<u8>>> = vec![Vec::new()];
    let mut load = 0_u64;
    for change in changes {
        let current = parts.last_mut().expect("parts starts with one part");
        if !current.is_empty() && load.saturating_add(change.bytes) > cap {
            parts.push(Vec::new());
            load = 0;
        }
        load = load.saturating_add(change.bytes);
        parts
            .last_mut()
            .expect("a part was just made or was there")
            .push(change.path.clone());
    }
    (parts.len() > 1).then_some(parts)
}

/// The smallest load such that `weights`, cut greedily in order, fill at most `parts` parts
/// of at most that load each.
fn smallest_cap(weights: &[u64], parts: usize) -> u64 {
    let fits = |cap: u64| {
        let (mut used, mut load) = (1, 0_u64);
        for &weight in weights {
            if load > 0 && load.saturating_add(weight) > cap {
                used += 1;
                load = 0;
            }
            load = load.saturating_add(weight);
        }
        used <= parts
    };
    let mut low = weights.iter().copied().max().unwrap_or(0);
    let mut high = weights.iter().fold(0_u64, |t, w| t.saturating_add(*w));
    while low < high {
        let mid = low + (high - low) / 2;
        if fits(mid) {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    low
}

/// Whether a changed path is a proper directory prefix of another (`a` and `a/b`): the
/// pathspec of the first would match the second too.
fn any_is_a_directory_of_another(changes: &[Weighed]) -> bool {
    let paths: HashSet<&[u8]> = changes.iter().map(|c| c.path.as_slice()).collect();
    changes.iter().any(|change| {
        change
            .path
            .iter()
            .enumerate()
            .any(|(at, &byte)| byte == b'/' && paths.contains(&change.path[..at]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    fn weighed(path: &str, mib: u64) -> Weighed {
        Weighed {
            path: path.as_bytes().to_vec(),
            bytes: mib << 20,
        }
    }

    fn names(parts: &[Vec<Vec<u8>>]) -> Vec<Vec<String>> {
        parts
            .iter()
            .map(|part| {
                part.iter()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn two_large_files_go_to_two_parts_in_order() {
        let changes = [
            weighed("a.txt", 0),
            weighed("big-one.c", 9),
            weighed("m.rs", 0),
            weighed("z/big-two.c", 9),
            weighed("z/zz", 0),
        ];
        let parts = plan(&changes, 2).expect("worth splitting");
        assert_eq!(
            names(&parts),
            [
                vec!["a.txt", "big-one.c", "m.rs"],
                vec!["z/big-two.c", "z/zz"]
            ]
        );
        let flat: Vec<Vec<u8>> = parts.concat();
        let order: Vec<Vec<u8>> = changes.iter().map(|c| c.path.clone()).collect();
        assert_eq!(flat, order, "every path once, in the diff's order");
    }

    #[test]
    fn no_split_when_it_would_not_pay_or_not_be_exact() {
        // One CPU, one path, or too little to gain.
        let two = [weighed("a", 9), weighed("b", 9)];
        assert!(plan(&two, 1).is_none());
        assert!(plan(&two[..1], 4).is_none());
        assert!(plan(&[weighed("a", 1), weighed("b", 1)], 2).is_none());
        // All the weight in one file: another part gains nothing.
        assert!(plan(&[weighed("a", 30), weighed("b", 0), weighed("c", 1)], 2).is_none());
        // `d` (a file deleted) and `d/x` (a file added where it was): `d` would match both.
        assert!(plan(&[weighed("d", 9), weighed("d/x", 9)], 2).is_none());
        // Paths that would not fit on a command line.
        let long: Vec<Weighed> = (0..300)
            .map(|i| Weighed {
                path: format!("{i:0>1000}").into_bytes(),
                bytes: 1 << 20,
            })
            .collect();
        assert!(plan(&long, 2).is_none());
        // A shared prefix that is not a directory is no obstacle.
        assert!(plan(&[weighed("d", 9), weighed("dx/y", 9)], 2).is_some());
    }

    #[test]
    fn parts_are_as_even_as_contiguous_parts_can_be() {
        let changes: Vec<Weighed> = [5, 1, 1, 1, 1, 1, 5, 3, 3]
            .iter()
            .enumerate()
            .map(|(i, &mib)| weighed(&format!("f{i}"), mib))
            .collect();
        let parts = plan(&changes, 3).expect("worth splitting");
        let load = |part: &Vec<Vec<u8>>| -> u64 {
            part.iter()
                .map(|p| changes.iter().find(|c| &c.path == p).expect("known").bytes >> 20)
                .sum()
        };
        let loads: Vec<u64> = parts.iter().map(load).collect();
        assert_eq!(loads.iter().sum::<u64>(), 21);
        assert_eq!(*loads.iter().max().expect("parts"), 8, "{loads:?}");
        assert!(plan(&changes, 64).expect("split").len() <= MAX_PARTS);
    }

    /// `git ARGS` in `dir` (no global or user configuration: no `HOME`), started as the
    /// agent starts its children.
    async fn git(dir: &Path, args: &[&str]) -> Vec<u8> {
        let mut argv = vec![c"env".to_owned(), c"git".to_owned()];
        for arg in ["-c", "user.name=t", "-c", "user.email=t@t"]
            .iter()
            .chain(args)
        {
            argv.push(CString::new(*arg).expect("no NUL"));
        }
        let cwd = CString::new(dir.as_os_str().as_bytes()).expect("no NUL");
        let spec = crate::command::program_spec(c"/usr/bin/env", argv, &cwd);
        let (_tx, mut stop) = tokio::sync::mpsc::channel(1);
        let (out, finished) = crate::command::run(&spec, 16 << 20, &mut stop)
            .await
            .expect("git runs");
        assert!(finished.success(), "git {args:?}: {}", finished.describe());
        out
    }

    /// The patch of the index against `HEAD`, as a part of a split task diff makes it.
    async fn diff(repo: &Path, paths: &[&str]) -> Vec<u8> {
        let mut args = vec![
            "--literal-pathspecs",
            "diff",
            "--cached",
            "--binary",
            "--full-index",
            "--no-renames",
            "HEAD",
            "--",
        ];
        args.extend_from_slice(paths);
        git(repo, &args).await
    }

    /// The claim the split rests on, checked with git itself: for every way of cutting the
    /// raw list into contiguous parts, the parts' patches concatenated are the whole patch.
    #[tokio::test]
    async fn contiguous_parts_of_the_raw_list_concatenate_to_the_whole_patch() {
        let dir = tempfile::tempdir().expect("temp dir");
        let repo = dir.path();
        git(repo, &["init", "-q", "-b", "main"]).await;
        let write = |path: &str, content: &[u8]| {
            let path = repo.join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, content).expect("write");
        };
        write("a b.txt", b"one\ntwo\n");
        write("bin.dat", &[0, 1, 2, 3, 255, 0, 7]);
        write("dir/x.rs", b"fn x() {}\n");
        write("dir-y/q\"uote.txt", b"q\n");
        write("gone.txt", b"bye\n");
        write("mode.sh", b"#!/bin/sh\n");
        write("z/deep/last.txt", b"last\n");
        write("t", b"a file, then a directory\n");
        std::os::unix::fs::symlink("a b.txt", repo.join("link")).expect("symlink");
        std::fs::write(repo.join("\u{e9}t\u{e9}.txt"), b"accent\n").expect("write");
        git(repo, &["add", "-A"]).await;
        git(repo, &["commit", "-q", "-m", "base"]).await;
        write("a b.txt", b"one\n2\nthree\n");
        write("bin.dat", &[0, 1, 2, 4, 255, 0, 7, 9]);
        write("dir/x.rs", b"fn x() { y() }\n");
        write("dir-y/q\"uote.txt", b"Q\n");
        std::fs::remove_file(repo.join("gone.txt")).expect("rm");
        write("new/file.txt", b"new\n");
        std::fs::set_permissions(
            repo.join("mode.sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        std::fs::remove_file(repo.join("link")).expect("rm link");
        std::os::unix::fs::symlink("dir", repo.join("link")).expect("symlink");
        write("z/deep/last.txt", b"very last\n");
        std::fs::remove_file(repo.join("t")).expect("rm t");
        write("t/inner", b"inside\n");
        std::fs::write(repo.join("\u{e9}t\u{e9}.txt"), b"accent!\n").expect("write");
        git(repo, &["add", "-A"]).await;
        let whole = diff(repo, &[]).await;
        let raw = git(
            repo,
            &["diff", "--cached", "--raw", "-z", "--no-renames", "HEAD"],
        )
        .await;
        let (changes, complete) = crate::bigfiles::parse_raw(&raw);
        assert!(complete, "a complete list");
        let paths: Vec<String> = changes
            .iter()
            .map(|c| String::from_utf8(c.path.clone()).expect("utf-8 here"))
            .collect();
        assert_eq!(paths.len(), 12, "{paths:?}");
        for cut in 1..paths.len() {
            let first: Vec<&str> = paths[..cut].iter().map(String::as_str).collect();
            let second: Vec<&str> = paths[cut..].iter().map(String::as_str).collect();
            let mut joined = diff(repo, &first).await;
            joined.extend(diff(repo, &second).await);
            // Between `t` (deleted) and `t/inner` (added), the pathspec `t` takes both: why
            // `plan` never splits such a diff.
            let between_file_and_directory = paths[cut - 1] == "t" && paths[cut] == "t/inner";
            assert_eq!(
                joined == whole,
                !between_file_and_directory,
                "cut before {}",
                paths[cut]
            );
        }
    }
}
