//! Which host paths a task start may read, run for real through the CLI: git pointers out of
//! the project (a `.git` file, `commondir`, alternates, a symlink in the git directory) are
//! refused naming the file, a project path swapped for a symlink mid-start imports exactly the
//! directory that was opened and recorded, and no process of the task keeps that directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use dynocap_e2e::*;

/// A repository standing for one in the user's home, with history no guest may see.
fn private_repo(dir: &Path) -> PathBuf {
    let repo = dir.join("private");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    write(&repo.join("diary.txt"), "private\n");
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "private"]);
    repo
}

fn plain_repo(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    write(&dir.join("a.txt"), "a\n");
    dir.to_path_buf()
}

#[test]
fn git_pointers_out_of_the_project_are_refused_naming_the_file() {
    if !require_root("git_pointers_out_of_the_project_are_refused_naming_the_file") {
        return;
    }
    let home = TestHome::new();
    let tmp = tempfile::tempdir().unwrap();
    let private = private_repo(tmp.path());
    let private_git = format!("{}/.git", private.display());

    let gitfile = tmp.path().join("gitfile");
    write(&gitfile.join(".git"), &format!("gitdir: {private_git}\n"));
    write(&gitfile.join("a.txt"), "a\n");
    let relative = tmp.path().join("relative");
    write(&relative.join(".git"), "gitdir: ../private/.git\n");
    let common = plain_repo(&tmp.path().join("common"));
    write(&common.join(".git/commondir"), &format!("{private_git}\n"));
    let alternates = plain_repo(&tmp.path().join("alternates"));
    write(
        &alternates.join(".git/objects/info/alternates"),
        &format!("{private_git}/objects\n"),
    );
    let linked = plain_repo(&tmp.path().join("linked"));
    std::fs::remove_dir_all(linked.join(".git/refs")).unwrap();
    std::os::unix::fs::symlink(private.join(".git/refs"), linked.join(".git/refs")).unwrap();
    let submodule = plain_repo(&tmp.path().join("submodule"));
    write(
        &submodule.join("vendor/lib/.git"),
        &format!("gitdir: {private_git}\n"),
    );

    let cases: [(&Path, &str, &str); 6] = [
        (&gitfile, ".git", &private_git),
        (&relative, ".git", "../private/.git"),
        (&common, ".git/commondir", &private_git),
        (&alternates, ".git/objects/info/alternates", "alternates"),
        (&linked, ".git/refs", "symlink"),
        (&submodule, "vendor/lib/.git", &private_git),
    ];
    for (project, file, says) in cases {
        for history in ["branches", "none"] {
            let err = home.json_err(&[
                "task",
                "start",
                project.to_str().unwrap(),
                "--history",
                history,
            ]);
            assert_eq!(err["code"], "invalid_argument", "{err:#}");
            let message = err["message"].as_str().unwrap();
            let named = format!("{}/{file}", project.display());
            assert!(
                message.contains(&named) && message.contains(says),
                "{named} / {says}: {message}"
            );
        }
    }
    assert_eq!(home.json(&["ls"])["tasks"], serde_json::json!([]));
}

/// Swaps the names `a` and `b` atomically.
fn exchange(a: &Path, b: &Path) {
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let (a, b) = (c(a), c(b));
    // SAFETY: both are NUL-terminated paths that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(rc, 0, "renameat2: {}", std::io::Error::last_os_error());
}

#[test]
fn a_path_swapped_for_a_symlink_imports_the_directory_opened_and_recorded() {
    if !require_root("a_path_swapped_for_a_symlink_imports_the_directory_opened_and_recorded") {
        return;
    }
    let home = TestHome::new();
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let secret = base.join("secret");
    write(&secret.join("id_secret"), "the key\n");
    let project = base.join("proj");
    write(&project.join("mine.txt"), "mine\n");
    let swap = base.join("swap");
    std::os::unix::fs::symlink(&secret, &swap).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let flips = Arc::new(AtomicU64::new(0));
    let flipper = {
        let (stop, flips, project, swap) =
            (stop.clone(), flips.clone(), project.clone(), swap.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                exchange(&project, &swap);
                flips.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let (mut mine, mut theirs) = (0, 0);
    for i in 0..30 {
        let name = format!("race{i}");
        let task = home.json(&[
            "task",
            "start",
            project.to_str().unwrap(),
            "--history",
            "none",
            "--name",
            &name,
        ]);
        let recorded = task["source"]["projectPath"].as_str().unwrap().to_owned();
        let out = home.exec_in_task(&name, "ls -A /workspace", 60);
        let listed: Vec<String> = out["stdout"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .filter(|n| *n != ".git")
            .map(str::to_owned)
            .collect();
        // Whichever directory the path named when opened, that one came, whole, and the task
        // says so: never the other one's files, never a path that names something else.
        if recorded == secret.to_str().unwrap() {
            assert_eq!(listed, ["id_secret"], "{recorded}");
            theirs += 1;
        } else {
            assert!(
                recorded == project.to_str().unwrap() || recorded == swap.to_str().unwrap(),
                "{recorded}"
            );
            assert_eq!(listed, ["mine.txt"], "{recorded}");
            mine += 1;
        }
        // No process of the task holds the project directory after the import.
        for pid in home.supervisor_pids() {
            for p in std::iter::once(pid).chain(descendants(pid)) {
                let Ok(fds) = std::fs::read_dir(format!("/proc/{p}/fd")) else {
                    continue;
                };
                for fd in fds.flatten() {
                    let target = std::fs::read_link(fd.path()).unwrap_or_default();
                    assert!(
                        !target.starts_with(&base),
                        "pid {p} holds {} ({})",
                        target.display(),
                        fd.path().display()
                    );
                }
            }
        }
        home.json(&["rm", "--force", "--purge", &name]);
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    assert!(flips.load(Ordering::Relaxed) > 0);
    assert!(mine + theirs == 30, "{mine} + {theirs}");
}
