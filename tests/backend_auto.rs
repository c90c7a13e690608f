//! Choosing a backend through the CLI: `DYNOCAP_BACKEND=auto` probes KVM once for an image's
//! kernel, records the answer and reuses it, `dynocap doctor` says what `auto` picks and why,
//! and a sandbox gets that backend. Whatever this machine's KVM does (here it hangs, so `auto`
//! is the jail), the tests check that the pick follows the recorded answer. doctor's `vm
//! backend` check says ready only where the first vm start succeeds, and `--backend` on `run`
//! and `task start` overrides the variable.

use std::path::PathBuf;

use dynocap_e2e::*;
use serde_json::Value;

/// The detail of doctor's `backend` check.
fn backend_detail(home: &TestHome) -> String {
    let out = home
        .command()
        .args(["--json", "doctor"])
        .output()
        .expect("spawn");
    // doctor exits non-zero when a required piece is missing; the checks are printed anyway.
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|err| {
        panic!(
            "doctor printed no JSON ({err}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let check = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "backend")
        .unwrap_or_else(|| panic!("no backend check: {report:#}"));
    assert_eq!(check["ok"], true, "{check:#}");
    check["detail"].as_str().expect("detail").to_owned()
}

/// The probe's recorded answers in the home's vm cache.
fn records(home: &TestHome) -> Vec<PathBuf> {
    std::fs::read_dir(home.path().join("cache/vm"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("kvm-probe-"))
        })
        .collect()
}

#[test]
fn auto_probes_kvm_once_records_the_answer_and_doctor_says_why() {
    let test = "auto_probes_kvm_once_records_the_answer_and_doctor_says_why";
    if !require_root(test) || !images::require_mmdebstrap(test) {
        return;
    }
    let have_qemu = std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if !have_qemu {
        let why = "qemu-system-x86_64 is not installed (scripts/install-deps.sh installs it)";
        assert!(std::env::var_os("CI").is_none(), "{test}: {why}");
        eprintln!("SKIPPED {test}: {why}");
        return;
    }
    let (home, _) = images::debian_home();

    // The default image is `host`: the jail, with no probe.
    let detail = backend_detail(&home);
    assert!(
        detail.starts_with("auto picks jail: the image \"host\""),
        "{detail}"
    );
    assert!(records(&home).is_empty(), "nothing was probed for host");

    // With a built image with a kernel as the default, the probe runs once. Its bound (a few
    // seconds) keeps a hanging KVM from holding doctor; the pick follows its answer.
    let home = home.with_env("DYNOCAP_IMAGE", "debian");
    let detail = backend_detail(&home);
    let recorded = records(&home);
    assert_eq!(recorded.len(), 1, "one answer for one kernel: {recorded:?}");
    let answer = std::fs::read_to_string(&recorded[0]).expect("the answer");
    eprintln!("probe answer here: {answer}; doctor: {detail}");
    let (picked, said) = match answer.trim() {
        "boots" => ("vm", "KVM boots the \"debian\" image's kernel"),
        "fails" => ("jail", "KVM does not boot the \"debian\" image's kernel"),
        other => panic!("the recorded answer is {other:?}"),
    };
    assert!(
        detail.starts_with(&format!("auto picks {picked}: {said}")),
        "{detail}"
    );
    assert!(detail.contains("probed now"), "{detail}");
    assert!(
        detail.contains(&recorded[0].display().to_string()),
        "doctor names where the answer is: {detail}"
    );

    // The next question reads the record: no second probe, and the record decides (flipped by
    // hand, the pick flips with it).
    let detail = backend_detail(&home);
    assert!(!detail.contains("probed now"), "{detail}");
    assert!(
        detail.starts_with(&format!("auto picks {picked}")),
        "{detail}"
    );
    std::fs::write(&recorded[0], "boots").expect("write");
    let detail = backend_detail(&home);
    assert!(
        detail.starts_with(
            "auto picks vm: KVM boots the \"debian\" image's kernel here (recorded in"
        ),
        "{detail}"
    );
    // Even where KVM boots, a sandbox of the `host` image is a jail: `auto` decides by the
    // sandbox's image, and its supervisor boots what the record names.
    let host = home.sandbox("hosty", &["--image", "host", "--network", "none"]);
    assert_eq!(host["backend"], "jail", "{host:#}");
    assert_eq!(home.sh("hosty", "echo up"), "up\n");
    std::fs::write(&recorded[0], "fails").expect("write");
    let detail = backend_detail(&home);
    assert!(
        detail.starts_with("auto picks jail: KVM does not boot"),
        "{detail}"
    );
    assert!(
        detail.contains("DYNOCAP_VM_ACCEL=tcg"),
        "the way to VMs anyway: {detail}"
    );

    // A sandbox started under auto gets what doctor said, and its record names it.
    let started = home.sandbox("auto", &["--network", "none"]);
    assert_eq!(started["backend"], "jail", "{started:#}");
    assert_eq!(started["image"], "debian", "{started:#}");
    assert_eq!(records(&home).len(), 1, "still one answer");
}

/// doctor's `vm backend` check, from `dynocap --json doctor` with `env` set.
fn vm_check(home: &TestHome, env: &[(&str, &str)]) -> (Value, bool, Option<i32>) {
    let out = home
        .command()
        .envs(env.iter().copied())
        .args(["--json", "doctor"])
        .output()
        .expect("spawn");
    let report: Value = serde_json::from_slice(&out.stdout).expect("doctor prints JSON");
    let check = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "vm backend")
        .unwrap_or_else(|| panic!("no vm backend check: {report:#}"))
        .clone();
    let ready = report["ready"].as_bool().expect("ready");
    (check, ready, out.status.code())
}

fn text(value: &Value, key: &str) -> String {
    value[key].as_str().unwrap_or_default().to_owned()
}

/// doctor says the vm backend is ready only where its first start succeeds: it runs the same
/// KVM probe the start runs (or reads its recorded answer) and the same accelerator choice.
/// Where KVM does not boot the kernel (this machine's paravirtual KVM; elsewhere the recorded
/// answer is set to say so) the check is MISSING under DYNOCAP_BACKEND=vm, names
/// DYNOCAP_VM_ACCEL=tcg and its cost, and the first start fails as a machine problem
/// (`internal`), not as the caller's `invalid_argument`. Each real knob turns the verdict:
/// the recorded answer, DYNOCAP_VM_ACCEL=tcg, =kvm and a bad value.
#[test]
fn doctor_reports_the_vm_backend_as_its_first_start_finds_it() {
    let test = "doctor_reports_the_vm_backend_as_its_first_start_finds_it";
    if !require_root(test) || !images::require_mmdebstrap(test) || !backend::require_qemu(test) {
        return;
    }
    let (home, _) = images::debian_home();
    let home = home
        .with_env("DYNOCAP_BACKEND", "vm")
        .with_env("DYNOCAP_IMAGE", "debian")
        .with_env("DYNOCAP_VM_ACCEL", "auto");

    // The probe runs once, as the first start would run it, and doctor follows its answer.
    let (check, ready, status) = vm_check(&home, &[]);
    let recorded = records(&home);
    assert_eq!(recorded.len(), 1, "doctor probed once: {recorded:?}");
    let answer = std::fs::read_to_string(&recorded[0]).expect("the answer");
    eprintln!("probe answer here: {answer}; doctor: {check:#}");
    assert_eq!(check["required"], true, "DYNOCAP_BACKEND=vm: {check:#}");
    match answer.trim() {
        "boots" => assert!(
            check["ok"] == true && text(&check, "detail").contains("boots under KVM"),
            "{check:#}"
        ),
        "fails" => assert!(check["ok"] == false && !ready, "{check:#}"),
        other => panic!("the recorded answer is {other:?}"),
    }

    // KVM that does not boot the kernel: not ready, and what to set, and what it costs.
    std::fs::write(&recorded[0], "fails").expect("write");
    let (check, ready, status_now) = vm_check(&home, &[]);
    assert!(!ready && status_now == Some(1), "{check:#}");
    assert_eq!(
        (&check["ok"], &check["status"]),
        (&Value::Bool(false), &"missing".into())
    );
    let (detail, hint) = (text(&check, "detail"), text(&check, "hint"));
    assert!(detail.contains("KVM does not boot"), "{detail}");
    assert!(
        detail.contains(&recorded[0].display().to_string()),
        "{detail}"
    );
    assert!(
        hint.contains("DYNOCAP_VM_ACCEL=tcg") && hint.contains("slower"),
        "{hint}"
    );
    if answer.trim() == "fails" {
        assert_eq!(status, Some(1));
    }
    // ...and the first start refuses as a machine problem, leaving nothing.
    let err = home.json_err(&["run", "first"]);
    assert_eq!(err["code"], "internal", "{err:#}");
    assert!(
        text(&err, "message").contains("DYNOCAP_VM_ACCEL=tcg"),
        "{err:#}"
    );
    assert_eq!(home.json(&["ps"]), serde_json::json!({ "sandboxes": [] }));

    // KVM that boots it: ready, on KVM.
    std::fs::write(&recorded[0], "boots").expect("write");
    let (check, _, _) = vm_check(&home, &[]);
    assert!(
        check["ok"] == true && text(&check, "detail").contains("boots under KVM"),
        "{check:#}"
    );
    std::fs::write(&recorded[0], "fails").expect("write");

    // TCG asked for: ready, with its cost said.
    let (check, _, _) = vm_check(&home, &[("DYNOCAP_VM_ACCEL", "tcg")]);
    let detail = text(&check, "detail");
    assert!(check["ok"] == true && detail.contains("TCG"), "{check:#}");
    assert!(detail.contains("slower"), "{detail}");
    // ...but not for a start that names no image when the default is `host`, which no VM
    // boots: that start is refused as the caller's (`invalid_argument`), and doctor says so.
    let host_tcg = [("DYNOCAP_VM_ACCEL", "tcg"), ("DYNOCAP_IMAGE", "host")];
    let (check, ready, _) = vm_check(&home, &host_tcg);
    assert!(check["ok"] == false && !ready, "{check:#}");
    assert!(
        text(&check, "detail").contains("a start without --image fails")
            && text(&check, "hint").contains("DYNOCAP_IMAGE"),
        "{check:#}"
    );
    let out = home
        .command()
        .envs(host_tcg)
        .args(["--json", "run", "hostvm"])
        .output()
        .expect("spawn");
    let refused: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(refused["error"]["code"], "invalid_argument", "{refused:#}");
    // KVM forced where the probe saw it fail: starts would time out.
    let (check, _, _) = vm_check(&home, &[("DYNOCAP_VM_ACCEL", "kvm")]);
    assert!(check["ok"] == false, "{check:#}");
    let detail = text(&check, "detail");
    assert!(
        detail.contains("forces KVM") || detail.contains("/dev/kvm"),
        "{detail}"
    );
    let (check, _, _) = vm_check(&home, &[("DYNOCAP_VM_ACCEL", "fast")]);
    assert!(
        check["ok"] == false && text(&check, "detail").contains("DYNOCAP_VM_ACCEL=fast"),
        "{check:#}"
    );

    // Where nothing asks for VMs (the jail selected, the host image the default), an
    // unknown answer is not probed for doctor: the check says so, as a warning.
    std::fs::remove_file(&recorded[0]).expect("remove");
    let (check, ready, _) = vm_check(
        &home,
        &[("DYNOCAP_BACKEND", "jail"), ("DYNOCAP_IMAGE", "host")],
    );
    assert!(ready, "an optional check: {check:#}");
    assert_eq!(
        (&check["required"], &check["status"]),
        (&Value::Bool(false), &"warning".into())
    );
    assert!(
        text(&check, "detail").contains("not known yet"),
        "{check:#}"
    );
    assert!(
        text(&check, "detail").contains("--image debian"),
        "{check:#}"
    );
    assert!(
        records(&home).is_empty(),
        "doctor probed for a home without VMs"
    );
}

/// `--backend` picks a sandbox's backend over DYNOCAP_BACKEND, on `run` and `task start`;
/// `ps` and `ls` show each one's backend; a bad value is refused with the valid ones and
/// makes nothing; `--backend auto` picks what doctor says auto picks.
#[test]
fn the_backend_flag_overrides_the_variable() {
    let test = "the_backend_flag_overrides_the_variable";
    // A home of the debian image with DYNOCAP_BACKEND=vm (under TCG unless DYNOCAP_VM_ACCEL
    // says otherwise).
    let Some(home) = TestHome::on(backend::Backend::Vm, test) else {
        return;
    };
    let jail = home.sandbox("flagjail", &["--backend", "jail"]);
    assert_eq!(jail["backend"], "jail", "{jail:#}");
    assert_eq!(home.sh("flagjail", "echo up"), "up\n");
    let project = tempfile::tempdir().expect("project");
    write(&project.path().join("a.txt"), "a\n");
    let path = project.path().to_str().expect("utf-8");
    let task = home.json(&[
        "task",
        "start",
        path,
        "--name",
        "flagtask",
        "--backend",
        "jail",
    ]);
    assert_eq!(task["backend"], "jail", "{task:#}");

    // A bad value: refused as a command line error, nothing made.
    for args in [
        &["run", "flagbad", "--backend", "qemu"][..],
        &[
            "task",
            "start",
            path,
            "--name",
            "flagbad",
            "--backend",
            "Jail",
        ],
    ] {
        let out = home
            .command()
            .arg("--json")
            .args(args)
            .output()
            .expect("spawn");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(err["error"]["code"], "invalid_argument", "{err:#}");
        assert!(
            text(&err["error"], "message").contains("use jail, vm or auto"),
            "{err:#}"
        );
    }

    // The variable says jail; the flag says vm: a VM, booting the image's own kernel.
    let home = home.with_env("DYNOCAP_BACKEND", "jail");
    let vm = home.sandbox("flagvm", &["--backend", "vm"]);
    assert_eq!(vm["backend"], "vm", "{vm:#}");
    let host_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let guest_kernel = home.sh("flagvm", "uname -r");
    assert_ne!(
        guest_kernel.trim(),
        host_kernel.trim(),
        "a VM runs its own kernel"
    );
    home.json(&["destroy", "flagvm"]);

    // `auto` picks as doctor says it does.
    let detail = home
        .command()
        .env("DYNOCAP_BACKEND", "auto")
        .args(["--json", "doctor"])
        .output()
        .expect("spawn");
    let report: Value = serde_json::from_slice(&detail.stdout).expect("JSON");
    let said = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "backend")
        .map(|c| text(c, "detail"))
        .expect("backend check");
    let picked = if said.starts_with("auto picks vm") {
        "vm"
    } else {
        assert!(said.starts_with("auto picks jail"), "{said}");
        "jail"
    };
    let auto = home.sandbox("flagauto", &["--backend", "auto"]);
    assert_eq!(auto["backend"], picked, "doctor: {said}; {auto:#}");

    // The tables show each one's backend; the refused names made nothing.
    let ps = String::from_utf8(home.run(&["ps"]).stdout).expect("utf-8");
    let row = |table: &str, name: &str| -> Vec<String> {
        table
            .lines()
            .find(|l| l.split_whitespace().any(|w| w == name))
            .unwrap_or_else(|| panic!("no {name} in:\n{table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    // The BACKEND column of the table whose header row starts with `first`.
    let column = |table: &str, first: &str| -> usize {
        table
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|cells| cells.first() == Some(&first))
            .and_then(|cells| cells.iter().position(|c| *c == "BACKEND"))
            .unwrap_or_else(|| panic!("no BACKEND column in:\n{table}"))
    };
    let column_ps = column(&ps, "NAME");
    assert_eq!(row(&ps, "flagjail")[column_ps], "jail", "{ps}");
    assert_eq!(row(&ps, "flagauto")[column_ps], picked, "{ps}");
    assert!(!ps.contains("flagbad"), "{ps}");
    let ls = String::from_utf8(home.run(&["ls"]).stdout).expect("utf-8");
    let column_ls = column(&ls, "ID");
    assert_eq!(row(&ls, "flagtask")[column_ls], "jail", "{ls}");
    assert!(!ls.contains("flagbad"), "{ls}");
}
