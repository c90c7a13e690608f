//! `dynocap cp` out of a raw sandbox: a file and a directory arrive with their content and
//! modes (set-id bits cleared); guest symlinks (one to `/etc/passwd`, one climbing out with
//! `..`) arrive as symlinks inside the destination, never followed, and a FIFO is skipped
//! with a note, with nothing written beside the destination; an existing host symlink at a
//! name the copy makes is refused, not written through; a guest file the sandbox user cannot
//! read is refused; the byte and entry bounds stop a copy with an error naming them.
//! `dynocap cp` in: a file and a directory (a file of several pieces, a symlink kept as a
//! link) arrive owned by the sandbox user with their modes, and a guest symlink at a name the
//! copy makes is refused rather than followed. A task copies relative to its /workspace.
//! A directory of 5,000 files (more than one guest listing carries, at two levels) goes out
//! and in whole, and only `--max-entries` stops such a copy, both ways round. A host directory
//! swapped for a symlink while a copy in runs never leads it out of the source. On the vm
//! backend, a file and a directory go out and in, and a guest symlink pointing out of the
//! destination arrives as a symlink, never followed.

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::Path;

use dynocap_e2e::*;

fn booted(test: &str, name: &str) -> Option<TestHome> {
    if !require_root(test) {
        return None;
    }
    let home = TestHome::new();
    home.sandbox(name, &[]);
    Some(home)
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).expect("stat").mode() & 0o7777
}

/// `dynocap cp ARGS`, asserting its success: stderr.
fn cp(home: &TestHome, args: &[&str]) -> String {
    let mut all = vec!["cp"];
    all.extend_from_slice(args);
    let out = home.run(&all);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "dynocap cp {args:?} failed: {stderr}");
    stderr
}

/// `dynocap cp ARGS`, asserting its failure: the error's message.
fn cp_fails(home: &TestHome, args: &[&str]) -> String {
    let mut all = vec!["cp"];
    all.extend_from_slice(args);
    let error = home.json_err(&all);
    error["message"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn files_and_directories_come_out_with_their_modes_and_no_set_id() {
    let Some(home) = booted(
        "files_and_directories_come_out_with_their_modes_and_no_set_id",
        "cpo",
    ) else {
        return;
    };
    home.sh(
        "cpo",
        "mkdir -p /tmp/src/sub && printf 'one\\n' > /tmp/src/a && chmod 4755 /tmp/src/a \
         && head -c 1500000 /dev/urandom > /tmp/src/sub/big && chmod 640 /tmp/src/sub/big \
         && chmod 2750 /tmp/src/sub && printf 'single' > /tmp/one && chmod 6711 /tmp/one \
         && cksum < /tmp/src/sub/big",
    );
    let host = tempfile::tempdir().expect("tempdir");
    // A file to a missing name: the copy has that name.
    cp(
        &home,
        &["cpo:/tmp/one", &host.path().join("f").to_string_lossy()],
    );
    assert_eq!(std::fs::read(host.path().join("f")).expect("f"), b"single");
    assert_eq!(mode(&host.path().join("f")), 0o711);
    // A file to an existing directory: it goes inside.
    cp(&home, &["cpo:/tmp/one", &host.path().to_string_lossy()]);
    assert_eq!(
        std::fs::read(host.path().join("one")).expect("one"),
        b"single"
    );
    // A directory to a missing name: created as the copy.
    let tree = host.path().join("tree");
    cp(&home, &["cpo:/tmp/src", &tree.to_string_lossy()]);
    assert_eq!(std::fs::read(tree.join("a")).expect("a"), b"one\n");
    assert_eq!(mode(&tree.join("a")), 0o755);
    assert_eq!(mode(&tree.join("sub")), 0o750);
    assert_eq!(mode(&tree.join("sub/big")), 0o640);
    let big = std::fs::read(tree.join("sub/big")).expect("big");
    assert_eq!(big.len(), 1_500_000);
    // A directory to an existing directory: it goes inside; `SRC/.`: its contents.
    cp(&home, &["cpo:/tmp/src", &host.path().to_string_lossy()]);
    assert!(host.path().join("src/sub/big").is_file());
    let contents = host.path().join("contents");
    std::fs::create_dir(&contents).expect("mkdir");
    cp(&home, &["cpo:/tmp/src/.", &contents.to_string_lossy()]);
    assert!(contents.join("a").is_file() && contents.join("sub/big").is_file());
    assert!(!contents.join("src").exists());
}

#[test]
fn guest_symlinks_and_fifos_never_reach_outside_the_destination() {
    let Some(home) = booted(
        "guest_symlinks_and_fifos_never_reach_outside_the_destination",
        "cph",
    ) else {
        return;
    };
    home.sh(
        "cph",
        "mkdir -p /tmp/h/d && cd /tmp/h && ln -s /etc/passwd evil && ln -s ../../.. up \
         && mkfifo pipe && echo data > d/file && ln -s ../../../canary d/canary \
         && echo latin > \"$(printf 'caf\\351')\" && ln -s \"$(printf 't\\377')\" odd \
         && ln -s \"$(head -c 3000 /dev/zero | tr '\\0' '\\377')\" long",
    );
    let host = tempfile::tempdir().expect("tempdir");
    let canary = host.path().join("canary");
    std::fs::write(&canary, "untouched").expect("canary");
    let dest = host.path().join("out");
    let stderr = cp(&home, &["cph:/tmp/h", &dest.to_string_lossy()]);
    let evil = std::fs::symlink_metadata(dest.join("evil")).expect("evil");
    assert!(evil.file_type().is_symlink());
    assert_eq!(
        std::fs::read_link(dest.join("evil")).expect("link"),
        Path::new("/etc/passwd")
    );
    assert_eq!(
        std::fs::read_link(dest.join("up")).expect("link"),
        Path::new("../../..")
    );
    assert!(std::fs::symlink_metadata(dest.join("d/canary"))
        .expect("canary link")
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read(dest.join("d/file")).expect("file"), b"data\n");
    assert!(!dest.join("pipe").exists() && std::fs::symlink_metadata(dest.join("pipe")).is_err());
    assert!(
        stderr.contains("skipped") && stderr.contains("pipe"),
        "{stderr}"
    );
    // Names and targets that are not UTF-8 (one of 3000 such bytes, whose U+FFFDs are longer
    // than a path) are skipped with a note, and the rest of the tree still comes out.
    assert!(
        stderr.contains("caf\u{fffd}\": its guest name or symlink target is not UTF-8")
            && stderr.contains("odd\": its guest name or symlink target is not UTF-8")
            && stderr.contains("long\": its guest name or symlink target is not UTF-8"),
        "{stderr}"
    );
    assert!(std::fs::symlink_metadata(dest.join("odd")).is_err());
    assert_eq!(
        std::fs::read_dir(&dest).expect("ls").count(),
        3,
        "evil, up and d only"
    );
    assert_eq!(std::fs::read(&canary).expect("canary"), b"untouched");
    let mut names: Vec<_> = std::fs::read_dir(host.path())
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["canary", "out"]);
    assert!(!std::fs::symlink_metadata(dest.join("d"))
        .expect("d")
        .file_type()
        .is_fifo());

    // Copied again into the same place, a guest file lands where the host has a symlink the
    // user did not name: refused, and the canary it points at is untouched.
    let again = host.path().join("again");
    std::fs::create_dir(&again).expect("mkdir");
    std::os::unix::fs::symlink(&canary, again.join("file")).expect("symlink");
    let message = cp_fails(&home, &["cph:/tmp/h/d/file", &again.to_string_lossy()]);
    assert!(message.contains("not a plain file"), "{message}");
    std::os::unix::fs::symlink(host.path(), again.join("d")).expect("symlink");
    let message = cp_fails(&home, &["cph:/tmp/h/d", &again.to_string_lossy()]);
    assert!(message.contains("is a symlink"), "{message}");
    assert_eq!(std::fs::read(&canary).expect("canary"), b"untouched");
    assert!(!host.path().join("file").exists());
}

#[test]
fn unreadable_guest_files_and_the_byte_bound_refuse_the_copy() {
    let Some(home) = booted(
        "unreadable_guest_files_and_the_byte_bound_refuse_the_copy",
        "cpr",
    ) else {
        return;
    };
    let user = home.sh("cpr", "id -u").trim().to_owned();
    let host = tempfile::tempdir().expect("tempdir");
    if user != "0" {
        let message = cp_fails(
            &home,
            &["cpr:/proc/1/environ", &host.path().to_string_lossy()],
        );
        assert!(
            message.to_lowercase().contains("permission denied"),
            "{message}"
        );
        assert!(!host.path().join("environ").exists());
    } else {
        eprintln!("the sandbox user is root here: the unreadable-file case is not run");
    }
    home.sh("cpr", "head -c 300000 /dev/zero > /tmp/z");
    // A copy that stops leaves the file it would have replaced as it was, and nothing else.
    std::fs::write(host.path().join("z"), "precious\n").expect("write");
    let message = cp_fails(
        &home,
        &[
            "cpr:/tmp/z",
            &host.path().join("z").to_string_lossy(),
            "--max-bytes",
            "100000",
        ],
    );
    assert!(
        message.contains("100000 bytes") && message.contains("--max-bytes"),
        "{message}"
    );
    assert_eq!(
        std::fs::read_to_string(host.path().join("z")).expect("read"),
        "precious\n"
    );
    let names: Vec<String> = std::fs::read_dir(host.path())
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["z"], "nothing of the stopped copy is left");
    // Within the bound the copy replaces it whole.
    cp(
        &home,
        &["cpr:/tmp/z", &host.path().join("z").to_string_lossy()],
    );
    assert_eq!(
        std::fs::read(host.path().join("z")).expect("read"),
        vec![0u8; 300000]
    );
    home.sh(
        "cpr",
        "mkdir /tmp/many && touch /tmp/many/1 /tmp/many/2 /tmp/many/3 /tmp/many/4",
    );
    let message = cp_fails(
        &home,
        &[
            "cpr:/tmp/many",
            &host.path().join("many").to_string_lossy(),
            "--max-entries",
            "3",
        ],
    );
    assert!(
        message.contains("more than 3 entries") && message.contains("--max-entries"),
        "{message}"
    );
    // Three entries fit a bound of three, counted once each.
    home.sh("cpr", "rm /tmp/many/4");
    cp(
        &home,
        &[
            "cpr:/tmp/many",
            &host.path().join("few").to_string_lossy(),
            "--max-entries",
            "3",
        ],
    );
    std::fs::write(host.path().join("in"), [7u8; 4096]).expect("write");
    let message = cp_fails(
        &home,
        &[
            &host.path().join("in").to_string_lossy(),
            "cpr:/tmp/in",
            "--max-bytes",
            "1000",
        ],
    );
    assert!(message.contains("1000 bytes"), "{message}");
    assert_eq!(
        home.sh("cpr", "test -e /tmp/in && echo yes || echo no")
            .trim(),
        "no"
    );
}

#[test]
fn a_directory_longer_than_a_listing_goes_out_and_in_whole() {
    let Some(home) = booted(
        "a_directory_longer_than_a_listing_goes_out_and_in_whole",
        "cpl",
    ) else {
        return;
    };
    // 2,600 files and a directory of 2,400: each level more than a listing's 2,000 entries.
    home.sh(
        "cpl",
        "mkdir -p /tmp/big/d && cd /tmp/big && seq 1 2600 | xargs touch \
         && (cd d && seq 1 2400 | xargs touch) && echo last > 2600 && echo deep > d/2400",
    );
    let host = tempfile::tempdir().expect("tempdir");
    let out = host.path().join("big");
    let stderr = cp(&home, &["cpl:/tmp/big", &out.to_string_lossy()]);
    assert!(
        stderr.contains("copied 5000 files, 2 directories"),
        "{stderr}"
    );
    let count = |dir: &Path| std::fs::read_dir(dir).expect("read_dir").count();
    assert_eq!((count(&out), count(&out.join("d"))), (2601, 2400));
    assert_eq!(std::fs::read(out.join("2600")).expect("2600"), b"last\n");
    assert_eq!(std::fs::read(out.join("d/2400")).expect("2400"), b"deep\n");
    let stderr = cp(&home, &[&out.to_string_lossy(), "cpl:/tmp/back"]);
    assert!(
        stderr.contains("copied 5000 files, 2 directories"),
        "{stderr}"
    );
    assert_eq!(
        home.sh(
            "cpl",
            "find /tmp/back -type f | wc -l; cat /tmp/back/2600 /tmp/back/d/2400"
        )
        .split_whitespace()
        .collect::<Vec<_>>(),
        ["5000", "last", "deep"]
    );
    // Only the entry bound stops it, either way, and says so.
    for (from, to) in [
        (
            "cpl:/tmp/big".to_owned(),
            host.path().join("cut").to_string_lossy().into_owned(),
        ),
        (
            out.to_string_lossy().into_owned(),
            "cpl:/tmp/cut".to_owned(),
        ),
    ] {
        let message = cp_fails(&home, &[&from, &to, "--max-entries", "4000"]);
        assert!(
            message.contains("more than 4000 entries") && message.contains("--max-entries"),
            "{message}"
        );
    }
}

#[test]
fn files_and_directories_go_in_as_the_sandbox_user_never_through_a_guest_symlink() {
    let Some(home) = booted(
        "files_and_directories_go_in_as_the_sandbox_user_never_through_a_guest_symlink",
        "cpi",
    ) else {
        return;
    };
    let user = home.sh("cpi", "id -u").trim().to_owned();
    let host = tempfile::tempdir().expect("tempdir");
    let tree = host.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).expect("mkdir");
    std::fs::write(tree.join("a"), "alpha\n").expect("a");
    chmod(&tree.join("a"), 0o4750);
    let big: Vec<u8> = (0..1_300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(tree.join("sub/big"), &big).expect("big");
    chmod(&tree.join("sub/big"), 0o444);
    std::os::unix::fs::symlink("/etc/passwd", tree.join("link")).expect("symlink");
    std::fs::write(host.path().join("one"), "single").expect("one");
    chmod(&host.path().join("one"), 0o644);
    chmod(&tree, 0o755);
    chmod(&tree.join("sub"), 0o755);

    home.sh("cpi", "mkdir -p /tmp/in");
    cp(
        &home,
        &[&host.path().join("one").to_string_lossy(), "cpi:/tmp/in/f"],
    );
    cp(&home, &[&tree.to_string_lossy(), "cpi:/tmp/in"]);
    let shown = home.sh(
        "cpi",
        "cd /tmp/in && cat f && stat -c '%n %u %a' f tree tree/a tree/sub tree/sub/big \
         && readlink tree/link && cksum < tree/sub/big",
    );
    let expected_cksum = {
        let out = std::process::Command::new("cksum")
            .stdin(std::fs::File::open(tree.join("sub/big")).expect("open"))
            .output()
            .expect("cksum");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(
        shown,
        format!(
            "singlef {user} 644\ntree {user} 755\ntree/a {user} 750\ntree/sub {user} 755\n\
             tree/sub/big {user} 444\n/etc/passwd\n{expected_cksum}"
        )
    );

    // A destination ending in / names a directory to copy into: a missing one and a file
    // are refused, each saying which.
    let one = host.path().join("one").to_string_lossy().into_owned();
    let message = cp_fails(&home, &[&one, "cpi:/tmp/in/missing/"]);
    assert!(
        message.contains("ends with / but is no directory") && message.contains("No such file"),
        "{message}"
    );
    let message = cp_fails(&home, &[&one, "cpi:/tmp/in/f/"]);
    assert!(message.contains("Not a directory"), "{message}");

    // A guest symlink where the copy makes a directory or a file: refused, not followed.
    home.sh(
        "cpi",
        "mkdir -p /tmp/elsewhere /tmp/in2 && ln -s /tmp/elsewhere /tmp/in2/tree \
         && ln -s /tmp/elsewhere/x /tmp/in2/one",
    );
    let message = cp_fails(&home, &[&tree.to_string_lossy(), "cpi:/tmp/in2"]);
    assert!(message.contains("symlink"), "{message}");
    let message = cp_fails(
        &home,
        &[&host.path().join("one").to_string_lossy(), "cpi:/tmp/in2"],
    );
    assert!(message.contains("not a plain file"), "{message}");
    assert_eq!(home.sh("cpi", "ls -A /tmp/elsewhere | wc -l").trim(), "0");

    // A host symlink named as the source is followed, as out of the guest: the copy is a
    // file of its target's content, under the name typed (it was refused, ELOOP).
    let named = host.path().join("named");
    std::os::unix::fs::symlink(host.path().join("one"), &named).expect("symlink");
    cp(&home, &[&named.to_string_lossy(), "cpi:/tmp/in/named"]);
    assert_eq!(
        home.sh("cpi", "test -L /tmp/in/named || cat /tmp/in/named"),
        "single"
    );
}

/// A host directory in the source of a copy in that is swapped for a symlink to a secret
/// directory while the copy runs (a thread exchanges the two with `renameat2`, as an attacker
/// who can write in the source tree would) never leads the copy through the symlink: the
/// secret never reaches the guest. Each copy may come out whole or stop with an error; what
/// the guest holds is never the secret. (Before the copy walked the tree by descriptor, about
/// one copy in seven here carried the secret in.)
#[test]
fn a_copy_in_is_never_led_out_of_the_source_by_a_directory_swapped_for_a_symlink() {
    let Some(home) = booted(
        "a_copy_in_is_never_led_out_of_the_source_by_a_directory_swapped_for_a_symlink",
        "cpr",
    ) else {
        return;
    };
    let host = tempfile::tempdir().expect("tempdir");
    let (src, secret, swap) = (
        host.path().join("src"),
        host.path().join("secret"),
        host.path().join("swap"),
    );
    std::fs::create_dir_all(src.join("a")).expect("mkdir");
    for n in 0..5 {
        std::fs::write(src.join("a").join(format!("f{n}")), "plain\n").expect("write");
    }
    std::fs::create_dir_all(&secret).expect("mkdir");
    std::fs::write(secret.join("s"), "SECRET\n").expect("secret");
    std::fs::create_dir_all(&swap).expect("mkdir");
    std::os::unix::fs::symlink(&secret, swap.join("a")).expect("symlink");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let exchanger = {
        let stop = std::sync::Arc::clone(&stop);
        let one =
            std::ffi::CString::new(src.join("a").to_string_lossy().into_owned()).expect("path");
        let other =
            std::ffi::CString::new(swap.join("a").to_string_lossy().into_owned()).expect("path");
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: renameat2 reads two NUL-terminated paths that outlive the call.
                unsafe {
                    libc::syscall(
                        libc::SYS_renameat2,
                        libc::AT_FDCWD,
                        one.as_ptr(),
                        libc::AT_FDCWD,
                        other.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    );
                }
            }
        })
    };
    let mut carried = 0;
    for _ in 0..40 {
        home.sh("cpr", "rm -rf /tmp/dst");
        let _ = home.run(&["cp", &src.to_string_lossy(), "cpr:/tmp/dst"]);
        if home
            .sh("cpr", "grep -rl SECRET /tmp/dst 2>/dev/null || true")
            .contains("dst")
        {
            carried += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    exchanger.join().expect("exchanger");
    assert_eq!(
        carried, 0,
        "copies that carried the host's secret into the guest"
    );
}

#[test]
fn a_task_copies_relative_to_its_workspace_both_ways() {
    if !require_root("a_task_copies_relative_to_its_workspace_both_ways") {
        return;
    }
    let home = TestHome::new();
    let project = one_commit_project("README", "hello\n");
    home.json(&[
        "task",
        "start",
        &project.path().to_string_lossy(),
        "--name",
        "cpt",
    ]);
    let host = tempfile::tempdir().expect("tempdir");
    cp(&home, &["cpt:README", &host.path().to_string_lossy()]);
    assert_eq!(
        std::fs::read(host.path().join("README")).expect("README"),
        b"hello\n"
    );
    std::fs::write(host.path().join("new.txt"), "from the host\n").expect("write");
    cp(
        &home,
        &[&host.path().join("new.txt").to_string_lossy(), "cpt:."],
    );
    assert_eq!(
        home.task_sh("cpt", "cat new.txt && git status --porcelain new.txt"),
        "from the host\n?? new.txt\n"
    );
}

#[test]
fn a_vm_copies_out_and_in_and_its_symlinks_are_never_followed_on_the_host() {
    let test = "a_vm_copies_out_and_in_and_its_symlinks_are_never_followed_on_the_host";
    let Some(home) = TestHome::on(Backend::Vm, test) else {
        return;
    };
    let info = home.sandbox("cpv", &[]);
    assert_eq!(info["backend"], "vm", "{info:#}");
    home.sh(
        "cpv",
        "mkdir -p /tmp/v/d && echo top > /tmp/v/f && echo deep > /tmp/v/d/g \
         && chmod 750 /tmp/v/d && ln -s ../canary /tmp/v/out",
    );
    let host = tempfile::tempdir().expect("tempdir");
    let canary = host.path().join("canary");
    std::fs::write(&canary, "untouched").expect("canary");
    cp(
        &home,
        &["cpv:/tmp/v/f", &host.path().join("f").to_string_lossy()],
    );
    assert_eq!(std::fs::read(host.path().join("f")).expect("f"), b"top\n");
    let tree = host.path().join("tree");
    cp(&home, &["cpv:/tmp/v", &tree.to_string_lossy()]);
    assert_eq!(std::fs::read(tree.join("d/g")).expect("g"), b"deep\n");
    assert_eq!(mode(&tree.join("d")), 0o750);
    // tree/out -> ../canary names the host's canary: made as a link, never written through.
    assert_eq!(
        std::fs::read_link(tree.join("out")).expect("a symlink"),
        Path::new("../canary")
    );
    assert_eq!(std::fs::read(&canary).expect("canary"), b"untouched");
    cp(&home, &[&tree.to_string_lossy(), "cpv:/tmp/back"]);
    cp(
        &home,
        &[&host.path().join("f").to_string_lossy(), "cpv:/tmp/back/f2"],
    );
    assert_eq!(
        home.sh(
            "cpv",
            "cat /tmp/back/d/g /tmp/back/f2; readlink /tmp/back/out; stat -c %a /tmp/back/d"
        ),
        "deep\ntop\n../canary\n750\n"
    );
    home.json(&["destroy", "cpv"]);
}
