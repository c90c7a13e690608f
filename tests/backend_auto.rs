//! `DYNOCAP_BACKEND=auto` through the CLI: the KVM probe runs once for an image's kernel, its
//! answer is recorded and reused, `dynocap doctor` says what `auto` picks and why, and a
//! sandbox gets that backend. Whatever this machine's KVM does (here it hangs, so `auto` is
//! the jail), the test checks that the pick follows the recorded answer.

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
