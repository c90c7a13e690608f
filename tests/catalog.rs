//! The catalog through the real binary: first use of a fresh home by several processes at
//! once, a damaged catalog that names itself and its remedy, and `doctor --repair`
//! rebuilding it from the record files while sandboxes and tasks keep running.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use dynocap_e2e::*;
use serde_json::Value;

#[test]
fn six_runs_at_once_on_a_fresh_home_all_succeed() {
    if !require_root("six_runs_at_once_on_a_fresh_home_all_succeed") {
        return;
    }
    for round in 0..2 {
        let home = TestHome::new();
        let runs: Vec<_> = (0..6)
            .map(|i| {
                home.command()
                    .args(["--json", "run", &format!("par{i}"), "--ttl", "300"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn dynocap run")
            })
            .collect();
        for (i, run) in runs.into_iter().enumerate() {
            let out = run.wait_with_output().expect("wait for dynocap run");
            assert!(
                out.status.success(),
                "round {round}, run par{i} failed:\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let ps = home.json(&["ps"]);
        let mut names: Vec<&str> = ps["sandboxes"]
            .as_array()
            .expect("sandboxes")
            .iter()
            .filter(|s| s["state"] == "running")
            .map(|s| s["name"].as_str().expect("name"))
            .collect();
        names.sort_unstable();
        assert_eq!(names, ["par0", "par1", "par2", "par3", "par4", "par5"]);
    }
}

/// Damages the catalog at the given path, leaving the damage for the next command.
type Damage = fn(&Path);

/// Ways the catalog gets damaged.
const DAMAGE: &[(&str, Damage)] = &[
    ("truncated", |db| {
        remove_sidecars(db);
        // Half a page: the header survives, the schema on the rest of page 1 does not.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(db)
            .expect("open");
        file.set_len(2048).expect("truncate");
    }),
    ("random bytes", |db| {
        // Over the catalog and its WAL and index, in place, as a disk error would.
        for file in [db.to_owned(), sidecar(db, "-wal"), sidecar(db, "-shm")] {
            if let Ok(meta) = std::fs::metadata(&file) {
                let len = usize::try_from(meta.len()).expect("small file");
                std::fs::write(&file, noise(len)).expect("overwrite");
            }
        }
    }),
    ("a directory", |db| {
        remove_sidecars(db);
        std::fs::remove_file(db).expect("rm");
        std::fs::create_dir(db).expect("mkdir");
    }),
    ("its WAL a directory", |db| {
        let wal = sidecar(db, "-wal");
        let _ = std::fs::remove_file(&wal);
        std::fs::create_dir(&wal).expect("mkdir");
    }),
];

#[test]
fn a_damaged_catalog_names_itself_and_doctor_repair_brings_everything_back() {
    if !require_root("a_damaged_catalog_names_itself_and_doctor_repair_brings_everything_back") {
        return;
    }
    let home = TestHome::new();
    let db = home.path().join("catalog.db");
    let project = tempfile::tempdir().expect("project dir");
    small_project(project.path());
    let project_arg = project.path().to_str().expect("utf-8 temp path");

    let done = home.json(&["task", "start", project_arg, "--name", "done"]);
    task_sh(&home, "done", "echo finished > notes.txt");
    let finished = home.json(&["task", "finish", "done"]);
    assert_eq!(finished["verified"], true, "{finished:#}");
    let live = home.json(&["task", "start", project_arg, "--name", "live"]);
    task_sh(&home, "live", "echo live > live.txt");
    home.sandbox("box", &["--ttl", "900"]);
    let ids = [
        done["id"].as_str().expect("id").to_owned(),
        live["id"].as_str().expect("id").to_owned(),
    ];

    // The results are self-contained: the task's record is there beside its patch.
    let results = home.path().join("results").join(&ids[0]);
    for file in ["patch.diff", "exec.jsonl", "summary.json", "record.json"] {
        assert!(
            results.join(file).is_file(),
            "{file} in {}",
            results.display()
        );
    }
    let record: Value =
        serde_json::from_slice(&std::fs::read(results.join("record.json")).expect("read"))
            .expect("record.json is JSON");
    assert_eq!(record["record"]["state"], "finished");
    assert_eq!(record["record"]["name"], "done");

    for (how, damage) in DAMAGE {
        damage(&db);
        for args in [
            vec!["ls"],
            vec!["ps"],
            vec!["run", "another"],
            vec!["task", "start", project_arg],
        ] {
            let err = home.json_err(&args);
            assert_names_catalog_and_remedy(&err, &db, &format!("{how}: {args:?}"));
        }
        let report = home.json(&["doctor", "--repair"]);
        assert_eq!(report["repaired"], true, "{how}: {report:#}");
        assert!(!report["damage"].is_null(), "{how}: {report:#}");
        assert!(
            report["movedAside"][0]
                .as_str()
                .is_some_and(|p| p.contains("catalog.db.damaged-")),
            "{how}: {report:#}"
        );
        assert_eq!(report["skipped"], serde_json::json!([]), "{how}");
        assert_everything_is_back(&home, &ids, how);
    }

    // Damage that leaves the catalog readable needs no repair: an empty file (SQLite takes
    // it for a new catalog, which is filled from the record files), or a damaged WAL and
    // index over a current main file. Either way nothing may be silently different.
    remove_sidecars(&db);
    std::fs::write(&db, b"").expect("empty the catalog");
    assert_everything_is_back(&home, &ids, "empty");
    for file in ["-wal", "-shm"] {
        let path = sidecar(&db, file);
        let len = usize::try_from(std::fs::metadata(&path).expect("stat").len()).expect("len");
        std::fs::write(&path, noise(len)).expect("overwrite");
    }
    let ls = home
        .command()
        .args(["--json", "ls"])
        .output()
        .expect("spawn");
    if !ls.status.success() {
        let err: Value = serde_json::from_slice(&ls.stdout).expect("JSON error");
        assert_names_catalog_and_remedy(&err["error"], &db, "damaged WAL and index");
        home.json(&["doctor", "--repair"]);
    }
    assert_everything_is_back(&home, &ids, "damaged WAL and index");

    // The survivors still end normally, and a healthy catalog needs no repair.
    assert_eq!(home.json(&["destroy", "box"])["destroyed"], "box");
    let end = home.json(&["task", "finish", "live"]);
    assert_eq!(
        (end["state"].as_str(), end["verified"].as_bool()),
        (Some("finished"), Some(true)),
        "{end:#}"
    );
    let patch = std::fs::read_to_string(end["patchPath"].as_str().expect("patchPath"))
        .expect("read the patch");
    assert!(patch.contains("+live"), "{patch}");
    let ls = home.json(&["ls"]);
    assert_eq!(ls["sandboxes"], serde_json::json!([]));
    let states: Vec<&str> = ls["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["state"].as_str().expect("state"))
        .collect();
    assert_eq!(states, ["finished", "finished"]);
    let healthy = home.json(&["doctor", "--repair"]);
    assert_eq!(
        (&healthy["repaired"], &healthy["damage"]),
        (&Value::Bool(false), &Value::Null)
    );
    // The destroyed sandbox's record goes once its teardown ends, which `destroy` does not
    // wait for (it answers once the guest is dead).
    let mut text = String::new();
    assert!(
        wait_until(30, || {
            text = String::from_utf8(home.run(&["doctor", "--repair"]).stdout).expect("utf-8");
            text.contains("is healthy (2 records); nothing to repair")
        }),
        "{text}"
    );
}

#[test]
fn a_catalog_this_user_cannot_open_says_which_access_is_missing() {
    if !require_root("a_catalog_this_user_cannot_open_says_which_access_is_missing") {
        return;
    }
    const NOBODY: u32 = 65534;
    let home = TestHome::new();
    home.json(&["ls"]);
    let db = home.path().join("catalog.db");
    chown_tree(home.path(), NOBODY);
    std::os::unix::fs::chown(&db, Some(0), Some(0)).expect("chown");
    chmod(&db, 0o600);

    use std::os::unix::process::CommandExt;
    let out = home
        .command()
        .args(["--json", "ls"])
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .expect("spawn dynocap as nobody");
    chown_tree(home.path(), 0);
    assert!(!out.status.success());
    let err: Value = serde_json::from_slice(&out.stdout).expect("JSON error");
    let message = err["error"]["message"].as_str().expect("message");
    assert_names_catalog_and_remedy(&err["error"], &db, "unreadable");
    assert!(
        message.contains("cannot be used")
            && message.contains("Permission denied")
            && message.contains("read and write access"),
        "{message}"
    );
}

/// After a repair (or none needed): the finished task with its results, the live task and
/// the raw sandbox, each usable.
fn assert_everything_is_back(home: &TestHome, ids: &[String; 2], how: &str) {
    let ls = home.json(&["ls"]);
    let mut tasks: Vec<(&str, &str)> = ls["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| {
            (
                t["name"].as_str().expect("name"),
                t["state"].as_str().expect("state"),
            )
        })
        .collect();
    // Records created within the same second list in id order, which is random.
    tasks.sort_unstable();
    assert_eq!(tasks, [("done", "finished"), ("live", "running")], "{how}");
    let boxes: Vec<(&str, &str)> = ls["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().expect("name"),
                s["state"].as_str().expect("state"),
            )
        })
        .collect();
    assert_eq!(boxes, [("box", "running")], "{how}");

    let result = home.json(&["task", "finish", &ids[0]]);
    assert_eq!(result["name"], "done", "{how}");
    assert!(
        PathBuf::from(result["patchPath"].as_str().expect("patchPath")).is_file(),
        "{how}: {result:#}"
    );
    assert_eq!(home.sh("box", "echo alive"), "alive\n", "{how}");
    assert_eq!(task_sh(home, "live", "cat live.txt"), "live\n", "{how}");
}

fn assert_names_catalog_and_remedy(err: &Value, db: &Path, what: &str) {
    assert_eq!(err["code"], "internal", "{what}: {err}");
    let message = err["message"].as_str().expect("message");
    assert!(
        message.contains(&format!("the catalog {}", db.display()))
            && message.contains("run `dynocap doctor --repair` to rebuild it"),
        "{what}: the message names the catalog and the remedy: {message}"
    );
}

fn task_sh(home: &TestHome, name: &str, command: &str) -> String {
    let result = home.exec_in_task(name, command, 30);
    assert_eq!(result["exitCode"], 0, "`{command}` failed: {result:#}");
    result["stdout"].as_str().expect("stdout").to_owned()
}

fn small_project(dir: &Path) {
    git(dir, &["init", "-q", "-b", "main"]);
    write(&dir.join("README.md"), "# small\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "first"]);
}

fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn remove_sidecars(db: &Path) {
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(sidecar(db, suffix));
    }
}

fn noise(len: usize) -> Vec<u8> {
    // Not a SQLite header, whatever the seed.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}

fn chown_tree(dir: &Path, uid: u32) {
    std::os::unix::fs::chown(dir, Some(uid), Some(uid)).expect("chown");
    for entry in std::fs::read_dir(dir).expect("list") {
        let path = entry.expect("entry").path();
        if path.is_dir() && !path.is_symlink() {
            chown_tree(&path, uid);
        } else {
            std::os::unix::fs::lchown(&path, Some(uid), Some(uid)).expect("chown");
        }
    }
}
