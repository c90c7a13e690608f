//! Task benchmarks, each beside the floor a user would reach by hand, in one run:
//! 1. `task start` vs `git clone --no-local` + copying the untracked files;
//! 2. `task diff` after 50 changed files vs plain `git diff` on the same tree;
//! 3. `task finish` of that 50-file patch, and its verification step vs `git apply --check`
//!    of the same patch on a checkout;
//! 4. the supervisor's peak resident memory during an import.
//!
//! On a generated 20,000-file / 200 MB repository with 500 commits, and on a real source tree
//! (a crate from ~/.cargo/registry, committed into a repository).
//!
//! Run with `scripts/bench.sh` (builds the release binaries first). Needs root.
//!
//! `DYNOCAP_BENCH_TASKS=verify` times only finish's verification beside `git apply --check`
//! (3 above), on the same trees, without starting a sandbox: the baseline copy is written by
//! the import's own tar writer and indexed as a task start does. Needs neither root nor the
//! release binaries. With `DYNOCAP_BENCH_TREE=DIR` as well, the generated tree is made in
//! `DIR` once and reused by later runs (for profiling the verification over and over).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use dynocap_e2e::bench::{
    dynocap_ok, pairs, proc_kib, release_bins, report_pairs, supervisor_processes,
};

/// Timed task starts per tree, each beside a clone.
const STARTS: usize = 5;

fn main() {
    let verify_only = std::env::var("DYNOCAP_BENCH_TASKS").is_ok_and(|mode| mode == "verify");
    let bins = if verify_only {
        PathBuf::new()
    } else {
        release_bins()
    };
    let work = tempfile::Builder::new()
        .prefix("dctb")
        .tempdir_in("/tmp")
        .expect("temp dir");

    // The history plays no part in verification: fewer commits make the same tree sooner.
    let commits = if verify_only { 20 } else { 500 };
    let kept = std::env::var_os("DYNOCAP_BENCH_TREE")
        .filter(|_| verify_only)
        .map(PathBuf::from);
    let generated = kept
        .clone()
        .unwrap_or_else(|| work.path().join("generated"));
    if kept.is_some() && generated.join(".git").exists() {
        println!("reusing the tree in {}", generated.display());
    } else {
        let started = Instant::now();
        generate_repo(&generated, 20_000, 10 * 1024, commits);
        println!(
            "generated 20,000 files / 200 MB / {commits} commits in {:.1}s",
            started.elapsed().as_secs_f64()
        );
    }
    let bench = |label: &str, project: &Path| {
        if verify_only {
            bench_verification_only(label, project, work.path());
        } else {
            bench_tree(label, project, &bins, work.path());
        }
    };
    bench("generated 20k files / 200 MB", &generated);

    match real_crate_source() {
        Some(source) => {
            let real = work.path().join("real");
            copy_tree(&source, &real);
            git(&real, &["init", "-q", "-b", "main"]);
            git(&real, &["add", "-A"]);
            git(&real, &["commit", "-q", "-m", "import"]);
            bench(
                &format!(
                    "real tree {}",
                    source.file_name().unwrap_or_default().to_string_lossy()
                ),
                &real,
            );
        }
        None => {
            println!("real tree: no crate source in ~/.cargo/registry/src; run `cargo fetch` first")
        }
    }
}

fn bench_tree(label: &str, project: &Path, bins: &Path, scratch: &Path) {
    // Untracked, not ignored files: part of what a task brings.
    for i in 0..20 {
        std::fs::write(project.join(format!("untracked-{i}.txt")), vec![b'u'; 4096])
            .expect("write");
    }
    let home = tempfile::Builder::new()
        .prefix("dch")
        .tempdir_in("/tmp")
        .expect("home");
    let home_str = home.path().to_str().expect("utf-8 temp path");
    let dynocap =
        |args: &[&str]| dynocap_ok(&bins.join("dynocap"), &[("DYNOCAP_HOME", home_str)], args);
    let project_arg = project.to_str().expect("utf-8 path");

    // Each side's leftovers (the started task, the clone) are removed before the next pair,
    // untimed: the start is timed, not the `rm` of the one before.
    let peak_rss_kib = std::cell::Cell::new(0);
    let leftovers: std::cell::RefCell<(Vec<String>, Vec<PathBuf>)> = Default::default();
    let clear = || {
        let (tasks, clones) = &mut *leftovers.borrow_mut();
        for name in tasks.drain(..) {
            dynocap(&["rm", &name, "--force", "--purge"]);
        }
        for clone in clones.drain(..) {
            std::fs::remove_dir_all(&clone).expect("cleanup");
        }
    };
    let start = pairs(
        STARTS,
        Duration::from_millis(200),
        clear,
        |i| {
            let name = format!("b{i}");
            let watcher = RssWatcher::start(home.path().to_owned());
            dynocap(&[
                "task",
                "start",
                project_arg,
                "--name",
                &name,
                "--memory-mb",
                "4096",
            ]);
            peak_rss_kib.set(peak_rss_kib.get().max(watcher.stop()));
            leftovers.borrow_mut().0.push(name);
        },
        |i| {
            let dest = scratch.join(format!("clone-{i}"));
            let out = Command::new("git")
                .args(["clone", "-q", "--no-local", project_arg])
                .arg(&dest)
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .output()
                .expect("git clone");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let untracked = git(
                project,
                &["ls-files", "-z", "--others", "--exclude-standard"],
            );
            for path in untracked.split('\0').filter(|p| !p.is_empty()) {
                std::fs::copy(project.join(path), dest.join(path)).expect("copy untracked");
            }
            leftovers.borrow_mut().1.push(dest);
        },
    );
    report_pairs(
        &format!("{label}: task start"),
        &start,
        "git clone --no-local + untracked copy",
    );
    // The last started task stays for the diff benchmark; the last clone goes.
    let last = leftovers.borrow_mut().0.pop().expect("a started task");
    clear();
    let last = last.as_str();
    let peak_rss_kib = peak_rss_kib.get();

    // Change 50 files in the last started task and in a plain clone, then diff both.
    let change = "for f in $(git ls-files | grep -v '^untracked' | head -50); do echo changed >> \"$f\"; done";
    dynocap(&["task", "exec", last, "--timeout", "600", "--", change]);
    let clone = changed_clone(scratch, "diff-floor", project_arg, "--no-local", change);
    // Before each pair the same 50 files change again on both sides, so that every timed
    // diff has 50 changes to find (the agent's journal makes a diff of an unchanged tree
    // cheap, which would flatter it), and the clone's index stays older than the changes,
    // as a checkout someone works in has.
    let rechange = || {
        dynocap(&["task", "exec", last, "--timeout", "600", "--", change]);
        sh_in(&clone, change);
    };
    let diff = pairs(
        5,
        Duration::from_millis(100),
        rechange,
        |_| {
            dynocap(&["--json", "task", "diff", last]);
        },
        |_| {
            git(&clone, &["diff", "--binary"]);
        },
    );
    report_pairs(
        &format!("{label}: task diff (50 files changed)"),
        &diff,
        "git diff --binary",
    );
    println!(
        "{label}: supervisor peak RSS during import {:.1} MiB",
        peak_rss_kib as f64 / 1024.0
    );

    // Finish of the same 50-file patch, and its verification step beside `git apply --check`
    // of that patch on a pristine checkout. The host's baseline copy is taken before finish
    // removes the sandbox's files, to time the verification again on its own.
    let baseline_copy = scratch.join("baseline-copy.tar");
    let baseline = find_file(home.path(), "baseline.tar").expect("the task's baseline.tar");
    std::fs::copy(&baseline, &baseline_copy).expect("copy baseline.tar");
    // Its offset index too, which verification reads when there is one.
    let index = dynocap_review::tar_index::index_path(&baseline);
    let index_copy = dynocap_review::tar_index::index_path(&baseline_copy);
    match std::fs::copy(&index, &index_copy) {
        Ok(_) => println!("{label}: the baseline has an offset index"),
        Err(err) => println!("{label}: no offset index ({err}): verification reads every header"),
    }
    let started = Instant::now();
    let finished = dynocap(&["--json", "task", "finish", last]);
    let finish = started.elapsed();
    let result: serde_json::Value =
        serde_json::from_slice(&finished.stdout).expect("finish prints JSON");
    assert_eq!(result["verified"], true, "{result}");
    let patch = PathBuf::from(result["patchPath"].as_str().expect("patchPath"));
    git(&clone, &["checkout", "-q", "--", "."]);
    println!(
        "{label}: task finish (50-file patch) {:.0} ms (target < 1000 ms)",
        finish.as_secs_f64() * 1e3
    );
    bench_verification(label, &baseline_copy, &patch, &clone, scratch);
    let _ = Command::new(bins.join("dynocap"))
        .args(["rm", last, "--force", "--purge"])
        .env("DYNOCAP_HOME", home.path())
        .output();
    let _ = std::fs::remove_file(&baseline_copy);
    let _ = std::fs::remove_file(&index_copy);
    let _ = std::fs::remove_dir_all(&clone);
}

/// Finish's verification of `patch` against `baseline_tar` beside `git apply --check` of it
/// on `checkout` (pristine).
fn bench_verification(
    label: &str,
    baseline_tar: &Path,
    patch: &Path,
    checkout: &Path,
    scratch: &Path,
) {
    // Interleaved, each after a moment of idle: a finish verifies once, and the scratch
    // directory it leaves to a background thread must not be charged to the next sample.
    // Fifteen pairs: the ratio of the medians of nine moved by 0.1x from run to run.
    let timed = pairs(
        15,
        Duration::from_millis(300),
        || {},
        |_| {
            dynocap_engine::finish::verify(baseline_tar, patch, &scratch.join("verify-scratch"))
                .expect("the patch verifies");
        },
        |_| {
            git(
                checkout,
                &["apply", "--check", patch.to_str().expect("utf-8 path")],
            );
        },
    );
    report_pairs(
        &format!("{label}: finish's verification (50-file patch)"),
        &timed,
        "git apply --check on a checkout",
    );
    println!("target: verification ratio <= 1.5x");
}

/// The verification step alone (`DYNOCAP_BENCH_TASKS=verify`): the baseline copy written by
/// the import's tar writer and indexed as a task start does, the patch of 50 changed files
/// taken by `git diff --binary` in a clone.
fn bench_verification_only(label: &str, project: &Path, scratch: &Path) {
    let baseline_tar = scratch.join("baseline-only.tar");
    let plan = dynocap_engine::import::plan(project, dynocap_engine::import::History::None)
        .expect("plan the import");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&baseline_tar).expect("create"));
    dynocap_engine::import::write_tar(&plan, &mut out, &mut |_, _| {}).expect("write the tar");
    std::io::Write::flush(&mut out).expect("flush the tar");
    drop(out);
    dynocap_engine::workspace::index_baseline(&baseline_tar);
    // Borrowing the project's objects: `git apply --check` reads none, and a copy of them
    // would only take disk.
    let change = "for f in $(git ls-files | head -50); do echo changed >> \"$f\"; done";
    let clone = changed_clone(
        scratch,
        "verify-floor",
        project.to_str().expect("utf-8 path"),
        "--shared",
        change,
    );
    let patch = scratch.join("verify-only.diff");
    std::fs::write(&patch, git(&clone, &["diff", "--binary"])).expect("write the patch");
    git(&clone, &["checkout", "-q", "--", "."]);
    bench_verification(label, &baseline_tar, &patch, &clone, scratch);
    let _ = std::fs::remove_file(&baseline_tar);
    let _ = std::fs::remove_file(dynocap_review::tar_index::index_path(&baseline_tar));
    let _ = std::fs::remove_dir_all(&clone);
}

/// The first file named `name` under `dir`.
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let kind = entry.file_type().ok()?;
        if kind.is_file() && entry.file_name() == name {
            return Some(path);
        }
        if kind.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        }
    }
    None
}

/// Polls the RSS of every supervisor under a DYNOCAP_HOME while a start runs.
struct RssWatcher {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<u64>,
}

impl RssWatcher {
    fn start(home: PathBuf) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                for pid in supervisor_processes(&home) {
                    peak = peak.max(proc_kib(pid, "status", "VmRSS:"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        });
        Self { stop, handle }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().unwrap_or(0)
    }
}

fn generate_repo(dir: &Path, files: usize, size: usize, commits: usize) {
    std::fs::create_dir_all(dir).expect("create");
    git(dir, &["init", "-q", "-b", "main"]);
    let per_commit = files / commits;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for c in 0..commits {
        for f in 0..per_commit {
            let n = c * per_commit + f;
            let path = dir.join(format!("d{:03}/f{n:05}.txt", n / 100));
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            // Printable pseudo-random text: compresses like source code does not.
            let content: Vec<u8> = (0..size)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    b"abcdefghijklmnopqrstuvwxyz \n"[usize::try_from(seed % 28).unwrap_or(0)]
                })
                .collect();
            std::fs::write(path, content).expect("write");
        }
        git(dir, &["add", "-A"]);
        git(dir, &["commit", "-q", "-m", &format!("commit {c}")]);
    }
}

/// The largest crate source under ~/.cargo/registry/src (at least 1 MB), if any.
fn real_crate_source() -> Option<PathBuf> {
    let registry = std::env::var_os("CARGO_HOME")
        .map_or_else(
            || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo"),
            PathBuf::from,
        )
        .join("registry/src");
    let mut best: Option<(u64, PathBuf)> = None;
    for index in std::fs::read_dir(registry).ok()?.flatten() {
        for krate in std::fs::read_dir(index.path()).ok()?.flatten() {
            let size = tree_size(&krate.path());
            if best.as_ref().is_none_or(|(s, _)| size > *s) {
                best = Some((size, krate.path()));
            }
        }
    }
    best.filter(|(size, _)| *size > 1 << 20)
        .map(|(_, path)| path)
}

fn tree_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

fn copy_tree(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(status.success());
}

/// A fresh clone of `project` in `scratch/name` (`how`: `--no-local`, `--shared`) with the
/// shell command `change` run in it.
fn changed_clone(scratch: &Path, name: &str, project: &str, how: &str, change: &str) -> PathBuf {
    let clone = scratch.join(name);
    let _ = std::fs::remove_dir_all(&clone);
    git(
        scratch,
        &[
            "clone",
            "-q",
            how,
            project,
            clone.to_str().expect("utf-8 path"),
        ],
    );
    sh_in(&clone, change);
    // As a checkout someone works in is: its index written after its files, so that git
    // trusts the files' stat data. Files written in the second the index was are "racily
    // clean", and every `git diff` reads them whole again; right after a clone and a change
    // that is every file, and the floor came out at anywhere from 45 to 80 ms for one tree.
    std::thread::sleep(Duration::from_millis(1100));
    git(&clone, &["status", "--porcelain"]);
    clone
}

/// `sh -c script` in `dir`, which must succeed.
fn sh_in(dir: &Path, script: &str) {
    let status = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .status()
        .expect("sh");
    assert!(status.success(), "{script} in {}", dir.display());
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.com")
        .env("GIT_COMMITTER_NAME", "Bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.com")
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
