//! A task's checkpoints and forks on the jail backend. A checkpoint taken while a job writes,
//! the workspace broken, the checkpoint restored (the job is ended and named), and the finish
//! saves a verified patch of the restored state. Three forks of one task, each changing its
//! own file, and a fork of one of them, finish with verified patches holding the shared work
//! and their own change only, against the original import; `ls` names each one's parent and
//! checkpoint. A fork that fails after its copy leaves no record and no files, and its source
//! runs on; a supervisor killed while its disk is frozen for a checkpoint leaves the task
//! `unsaved` with its work, which `task finish` recovers (the repair thaws the disk). A restore
//! after an upgrade renamed a new binary over the supervisor's runs the supervisor it had.
//!
//! On the vm (one task, TCG): a checkpoint is a frozen read-only qcow2 layer holding what was
//! written, the broken workspace restored from it, and a fork of the restored task's current
//! state; the source and the fork finish with their own verified patches, the fork after its
//! source is gone for good (the layers they share outlive it). A vm fork that fails after its
//! disk is made leaves no record and no files, and a supervisor killed right after freezing
//! its layer for a checkpoint leaves the task's work for `task finish` to recover.

use serde_json::Value;

use dynocap_e2e::*;

fn started(test: &str, home: TestHome, project: &std::path::Path, name: &str) -> Option<TestHome> {
    if !require_root(test) {
        return None;
    }
    let path = project.to_string_lossy();
    home.json(&["task", "start", &path, "--name", name]);
    Some(home)
}

#[test]
fn a_restored_checkpoint_is_what_the_finish_saves_and_its_running_job_is_ended() {
    let project = one_commit_project("a.txt", "a\n");
    let test = "a_restored_checkpoint_is_what_the_finish_saves_and_its_running_job_is_ended";
    let Some(home) = started(test, TestHome::new(), project.path(), "cp") else {
        return;
    };
    // Shared work, and an "install" outside the workspace.
    home.task_sh(
        "cp",
        "echo shared >> a.txt && mkdir -p ~/deps && head -c 8000000 /dev/urandom > ~/deps/blob",
    );
    // A job writing all along: the checkpoint is taken under it.
    let job = home.task_job(
        "cp",
        300,
        "i=0; while :; do i=$((i+1)); echo $i > ~/counter; sleep 0.02; done",
    );
    let made = home.json(&["task", "checkpoint", "cp", "good"]);
    assert_eq!(made["label"], "good");
    assert!(
        made["bytes"].as_u64().expect("bytes") >= 8_000_000,
        "the checkpoint holds what was written: {made:#}"
    );
    let listed = home.json(&["task", "checkpoints", "cp"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed:#}");
    assert_eq!(listed[0]["label"], "good");
    // A second one under the default label, then deleted.
    let second = home.json(&["task", "checkpoint", "cp"]);
    assert_eq!(second["label"], "cp-1");
    let left = home.json(&["task", "checkpoint", "cp", "cp-1", "--delete"]);
    assert_eq!(left.as_array().map(Vec::len), Some(1), "{left:#}");

    // Broken: the workspace and the install.
    home.task_sh("cp", "rm -f a.txt ~/deps/blob && echo junk > junk.txt");
    let restored = home.json(&["task", "restore", "cp", "good"]);
    assert_eq!(restored["label"], "good");
    let ended: Vec<&str> = restored["jobsEnded"]
        .as_array()
        .expect("jobsEnded")
        .iter()
        .filter_map(|j| j["job"].as_str())
        .collect();
    assert_eq!(ended, [job.as_str()], "{restored:#}");
    let after = home.task_sh(
        "cp",
        "cat a.txt; test -e junk.txt && echo junk; wc -c < ~/deps/blob",
    );
    assert_eq!(after, "a\nshared\n8000000\n");
    // The task runs on: new work after the restore is in the patch too.
    home.task_sh("cp", "echo after > after.txt");
    let finish = home.json(&["task", "finish", "cp"]);
    let patch = verified_patch(&finish);
    assert_eq!(patch_files(&patch), ["a.txt", "after.txt"], "{patch}");
    assert!(patch.contains("+shared"), "{patch}");
    assert!(!patch.contains("junk"), "{patch}");
}

/// An upgrade renames a new build over the binary a running supervisor was started from; a
/// restore then executes the supervisor anew, which must be its own build (the one the
/// sandbox's state belongs to), not a path that names another file or none.
#[test]
fn a_restore_after_the_binary_was_replaced_runs_the_supervisor_it_had() {
    let test = "a_restore_after_the_binary_was_replaced_runs_the_supervisor_it_had";
    if !require_root(test) {
        return;
    }
    let bins = tempfile::tempdir().expect("bin dir");
    let core = bins.path().join("dynocap-core");
    std::fs::copy(bin_dir().join("dynocap-core"), &core).expect("copy dynocap-core");
    let project = one_commit_project("a.txt", "a\n");
    let home = TestHome::new()
        .with_env("DYNOCAP_BIN", &core.to_string_lossy())
        .with_env("DYNOCAP_CLI_SERVER", "0");
    let Some(home) = started(test, home, project.path(), "up") else {
        return;
    };
    home.task_sh("up", "echo kept > kept.txt");
    home.json(&["task", "checkpoint", "up", "before"]);
    home.task_sh("up", "rm kept.txt");
    // The upgrade: a new file renamed over the old path, as package managers install.
    let upgrade = bins.path().join("dynocap-core.new");
    std::fs::copy(bin_dir().join("dynocap-core"), &upgrade).expect("copy the upgrade");
    std::fs::rename(&upgrade, &core).expect("rename the upgrade over the binary");

    let restored = home.json(&["task", "restore", "up", "before"]);
    assert_eq!(restored["label"], "before", "{restored:#}");
    assert_eq!(home.task_sh("up", "cat kept.txt"), "kept\n");
    let finish = home.json(&["task", "finish", "up"]);
    assert_eq!(patch_files(&verified_patch(&finish)), ["kept.txt"]);
}

#[test]
fn forks_finish_with_their_own_change_on_top_of_the_shared_work() {
    let project = one_commit_project("base.txt", "base\n");
    let test = "forks_finish_with_their_own_change_on_top_of_the_shared_work";
    let Some(home) = started(test, TestHome::new(), project.path(), "src") else {
        return;
    };
    home.task_sh("src", "echo shared >> base.txt && echo deps > ~/installed");
    home.json(&["task", "checkpoint", "src", "ready"]);
    // After the checkpoint: in the source and the forks of its current state, not in the
    // fork of the checkpoint.
    home.task_sh("src", "echo later > later.txt");
    let one = home.json(&["task", "fork", "src", "f1"]);
    assert_eq!(one["forkedFrom"]["task"], "src", "{one:#}");
    home.json(&["task", "fork", "src", "f2"]);
    let three = home.json(&["task", "fork", "src", "f3", "--checkpoint", "ready"]);
    assert_eq!(three["forkedFrom"]["checkpoint"], "ready", "{three:#}");
    for (fork, file) in [("f1", "one.txt"), ("f2", "two.txt"), ("f3", "three.txt")] {
        // The install came along, as the guest's own user's.
        assert_eq!(
            home.task_sh(fork, "cat ~/installed; id -un"),
            "deps\nsandbox\n"
        );
        home.task_sh(fork, &format!("echo {fork} > {file}"));
    }
    // A fork of a fork, and the first source removed for good while its forks live.
    home.json(&["task", "fork", "f3", "f3a"]);
    home.task_sh("f3a", "echo deeper > deeper.txt");
    let listing = home.json(&["ls"]);
    let tasks = listing["tasks"].as_array().expect("tasks");
    let parent_of = |name: &str| {
        tasks
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| t["forkedFrom"].clone())
            .unwrap_or_default()
    };
    assert_eq!(parent_of("f3a")["task"], "f3");
    assert_eq!(parent_of("f3")["checkpoint"], "ready");
    assert_eq!(parent_of("src"), Value::Null);
    home.json(&["rm", "src", "--force", "--purge"]);

    let expect = [
        ("f1", vec!["base.txt", "later.txt", "one.txt"]),
        ("f2", vec!["base.txt", "later.txt", "two.txt"]),
        ("f3", vec!["base.txt", "three.txt"]),
        ("f3a", vec!["base.txt", "deeper.txt", "three.txt"]),
    ];
    for (fork, files) in expect {
        let finish = home.json(&["task", "finish", fork]);
        let patch = verified_patch(&finish);
        assert_eq!(patch_files(&patch), files, "{fork}: {patch}");
        assert!(patch.contains("+shared"), "{fork}: {patch}");
    }
}

#[test]
fn an_interrupted_fork_or_checkpoint_leaves_the_source_and_nothing_half_made() {
    let project = one_commit_project("a.txt", "a\n");
    let test = "an_interrupted_fork_or_checkpoint_leaves_the_source_and_nothing_half_made";
    let failing = TestHome::new().with_env("DYNOCAP_FAILPOINTS", "supervisor.fork.copied=error");
    let Some(home) = started(test, failing, project.path(), "src") else {
        return;
    };
    home.task_sh("src", "echo work >> a.txt");
    let err = home.json_err(&["task", "fork", "src", "half"]);
    assert!(
        err["message"]
            .as_str()
            .is_some_and(|m| m.contains("supervisor.fork.copied")),
        "{err:#}"
    );
    home.assert_only_tasks(&["src"]);
    let src_dir = home.path().join("sandboxes").join(home.sandbox_id("src"));
    let leftovers: Vec<_> = std::fs::read_dir(src_dir.join("checkpoints"))
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "nothing half-made: {leftovers:?}");
    assert_eq!(home.task_sh("src", "cat a.txt"), "a\nwork\n");

    // Killed while its disk is frozen for a checkpoint.
    let project = one_commit_project("a.txt", "a\n");
    let killing =
        TestHome::new().with_env("DYNOCAP_FAILPOINTS", "supervisor.checkpoint.copied=kill");
    let Some(home) = started(test, killing, project.path(), "frozen") else {
        return;
    };
    home.task_sh("frozen", "echo kept >> a.txt");
    home.json_err(&["task", "checkpoint", "frozen", "never"]);
    let finish = home.json(&["task", "finish", "frozen"]);
    let patch = verified_patch(&finish);
    assert!(patch.contains("+kept"), "the work is recovered: {patch}");
    assert!(
        wait_until(10, || home.none_mounted("frozen")),
        "nothing of the frozen disk stays mounted"
    );
}

#[test]
fn vm_checkpoints_restores_and_forks_are_layers_the_guests_share() {
    let test = "vm_checkpoints_restores_and_forks_are_layers_the_guests_share";
    let Some(home) = TestHome::on(Backend::Vm, test) else {
        return;
    };
    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    home.json(&["task", "start", &path, "--name", "v"]);
    home.task_sh(
        "v",
        "echo shared >> a.txt && mkdir -p ~/deps && head -c 4000000 /dev/urandom > ~/deps/blob",
    );
    let made = home.json(&["task", "checkpoint", "v", "good"]);
    assert!(
        made["bytes"].as_u64().expect("bytes") >= 4_000_000,
        "the frozen layer holds what was written: {made:#}"
    );
    let state = home.path().join("sandboxes").join(home.sandbox_id("v"));
    let layer = std::fs::read_to_string(state.join("checkpoints/good/layer")).expect("its layer");
    let frozen = state.join("checkpoints/good").join(layer.trim());
    let meta = std::fs::metadata(&frozen).expect("the frozen layer");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(meta.permissions().mode() & 0o777, 0o444, "read-only");
    assert!(meta.nlink() >= 2, "shared with the task's own chain");

    home.task_sh("v", "rm -f a.txt ~/deps/blob && echo junk > junk.txt");
    // A job runs when the guest stops for the restore: it is ended and kept, as on the jail,
    // and its command's cut-off is not taken for a failure of the task's disk.
    let job = home.task_job("v", 600, "echo running; sleep 300");
    // `dynocap job`'s exit status is the job's: read its JSON whatever it is.
    let job_report = |job: &str| -> Value {
        let out = home.run(&["--json", "job", "v", job]);
        serde_json::from_slice(&out.stdout).expect("a Job object")
    };
    assert!(
        wait_until(120, || job_report(&job)["stdout"] == "running\n"),
        "the job's output reaches the host"
    );
    let restored = home.json(&["task", "restore", "v", "good"]);
    assert_eq!(restored["label"], "good", "{restored:#}");
    assert_eq!(
        restored["jobsEnded"][0]["job"],
        job.as_str(),
        "{restored:#}"
    );
    assert_eq!(restored["commandsEnded"], 0, "{restored:#}");
    let report = job_report(&job);
    assert_eq!(
        (&report["state"], &report["stdout"]),
        (&Value::from("failed"), &Value::from("running\n")),
        "{report:#}"
    );
    let record = home.json(&["ls"])["tasks"][0].clone();
    assert_eq!(
        (&record["state"], &record["note"]),
        (&Value::from("running"), &Value::Null),
        "{record:#}"
    );
    let after = home.task_sh(
        "v",
        "cat a.txt; test -e junk.txt && echo junk; wc -c < ~/deps/blob",
    );
    assert_eq!(after, "a\nshared\n4000000\n");
    assert_eq!(
        std::fs::metadata(&frozen).expect("still there").len(),
        meta.len(),
        "never written"
    );

    // A fork of the restored task as it is now; the source goes on on a layer of its own.
    home.task_sh("v", "echo after > after.txt");
    let fork = home.json(&["task", "fork", "v", "vf"]);
    assert_eq!(fork["forkedFrom"]["task"], "v", "{fork:#}");
    home.task_sh("v", "echo source > source.txt");
    assert_eq!(
        home.task_sh("vf", "echo fork > fork.txt; ls; wc -c < ~/deps/blob"),
        "a.txt\nafter.txt\nfork.txt\n4000000\n"
    );
    let finish = home.json(&["task", "finish", "v"]);
    let patch = verified_patch(&finish);
    assert_eq!(
        patch_files(&patch),
        ["a.txt", "after.txt", "source.txt"],
        "{patch}"
    );
    assert!(
        patch.contains("+shared") && !patch.contains("junk"),
        "{patch}"
    );
    home.json(&["rm", "v", "--force", "--purge"]);
    assert!(!state.exists(), "the source's files are gone");
    let finish = home.json(&["task", "finish", "vf"]);
    let patch = verified_patch(&finish);
    assert_eq!(
        patch_files(&patch),
        ["a.txt", "after.txt", "fork.txt"],
        "{patch}"
    );
    assert!(patch.contains("+shared"), "{patch}");
}

#[test]
fn an_interrupted_vm_fork_or_checkpoint_leaves_the_source_whole() {
    let test = "an_interrupted_vm_fork_or_checkpoint_leaves_the_source_whole";
    let Some(home) = TestHome::on(Backend::Vm, test) else {
        return;
    };
    let home = home.with_env(
        "DYNOCAP_FAILPOINTS",
        "supervisor.fork.copied=error;supervisor.checkpoint.copied=kill",
    );
    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    home.json(&["task", "start", &path, "--name", "vs"]);
    home.task_sh("vs", "echo work >> a.txt");
    let err = home.json_err(&["task", "fork", "vs", "half"]);
    assert!(
        err["message"]
            .as_str()
            .is_some_and(|m| m.contains("supervisor.fork.copied")),
        "{err:#}"
    );
    home.assert_only_sandbox_dirs(&["vs"]);
    let state = home.path().join("sandboxes").join(home.sandbox_id("vs"));
    let making: Vec<_> = std::fs::read_dir(state.join("checkpoints"))
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(making.is_empty(), "nothing half-made: {making:?}");
    // The source goes on, on the layer the fork's freeze left it.
    assert_eq!(
        home.task_sh("vs", "echo more >> a.txt; cat a.txt"),
        "a\nwork\nmore\n"
    );

    home.json_err(&["task", "checkpoint", "vs", "never"]);
    let finish = home.json(&["task", "finish", "vs"]);
    let patch = verified_patch(&finish);
    assert!(patch.contains("+more"), "the work is recovered: {patch}");
}

/// A fork's disk keeps the host ids its first source wrote it under, shown to each fork's
/// guest as its own through an idmapped mount at every boot over it: the fork's first, a
/// restore's, a fork of the fork's, and the recovery's after its supervisor was killed. Guest
/// root's files (a set-uid one among them) stay root's, the sandbox user's private ones stay
/// readable by that user alone, and what a fork writes is its own.
#[test]
fn a_forks_files_are_its_guests_own_at_every_boot() {
    let test = "a_forks_files_are_its_guests_own_at_every_boot";
    if !require_root(test) || !dynocap_e2e::images::require_mmdebstrap(test) {
        return;
    }
    let (home, _) = dynocap_e2e::images::debian_home();
    let project = one_commit_project("base.txt", "base\n");
    let path = project.path().to_string_lossy();
    home.json(&["task", "start", &path, "--name", "src", "--image", "debian"]);
    home.task_sh(
        "src",
        "echo shared >> base.txt && echo secret > ~/private && chmod 600 ~/private && \
         sudo sh -c 'mkdir /srv/kept && cp /bin/true /srv/kept/suid && chmod 4755 /srv/kept/suid'",
    );
    let owners = "stat -c '%U %a' ~/private /srv/kept/suid /srv/kept && cat ~/private";
    let expected = "sandbox 600\nroot 4755\nroot 755\nsecret\n";
    home.json(&["task", "fork", "src", "f"]);
    assert_eq!(home.task_sh("f", owners), expected, "the fork's first boot");
    // Private to the sandbox user, as in its source: root's sudo reads it, nobody else.
    assert_eq!(
        home.task_sh(
            "f",
            "sudo -u nobody cat ~/private 2>/dev/null || echo refused"
        ),
        "refused\n"
    );
    home.task_sh(
        "f",
        "echo mine > mine.txt && chmod 600 mine.txt && sudo touch /srv/kept/by-fork",
    );
    assert_eq!(
        home.task_sh("f", "stat -c '%U' mine.txt /srv/kept/by-fork"),
        "sandbox\nroot\n"
    );

    home.json(&["task", "checkpoint", "f", "c"]);
    home.task_sh("f", "rm ~/private mine.txt");
    home.json(&["task", "restore", "f", "c"]);
    assert_eq!(home.task_sh("f", owners), expected, "a restore's boot");

    home.json(&["task", "fork", "f", "g"]);
    assert_eq!(home.task_sh("g", owners), expected, "a fork of the fork");
    assert_eq!(home.task_sh("g", "cat mine.txt"), "mine\n");

    // The recovery reads the workspace as the fork's own: mine.txt is its user's alone.
    let supervisor = home.supervisor_pid("f").expect("f's supervisor");
    // SAFETY: kill has no memory preconditions.
    assert_eq!(unsafe { libc::kill(supervisor, libc::SIGKILL) }, 0);
    assert!(wait_until(10, || !pid_exists(supervisor)));
    let patch = verified_patch(&home.json(&["task", "finish", "f"]));
    assert_eq!(patch_files(&patch), ["base.txt", "mine.txt"], "{patch}");
    assert!(patch.contains("+mine"), "{patch}");
    for task in ["g", "src"] {
        home.json(&["task", "finish", task]);
    }
}
