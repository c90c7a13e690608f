//! apt's downloads in the project's package cache, end to end: a task of a Debian image that
//! carries registries' `docker-clean` hook (which removes `/var/cache/apt/archives/*.deb`
//! after every dpkg run) installs a package with `apt` (which deletes what it downloaded
//! by default); the project's next task finds the package in its cache and installs it
//! again without the repository sending it a second time. On the jail and on the vm.
//!
//! The repository is tests/support/tlsfix.rs on a 127.X address, reached as `apt.test`
//! through `DYNOCAP_RESOLVE` by a `filtered` task: nothing leaves loopback. Needs root and
//! mmdebstrap (the debian image).

#[path = "support/tlsfix.rs"]
mod tlsfix;

use dynocap_e2e::backend::Backend;
use dynocap_e2e::images::{debian_home, flat_apt_repository};
use dynocap_e2e::netfix::product;
use dynocap_e2e::TestHome;
use tlsfix::TlsFix;

const NAME: &str = "apt.test";
const PACKAGE: &str = "dynocap-cached";
/// The hook registries' Debian and Ubuntu images carry, as they carry it.
const DOCKER_CLEAN: &str = "DPkg::Post-Invoke { \"rm -f /var/cache/apt/archives/*.deb \
     /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true\"; };";

/// How many times the repository has sent the package's `.deb`.
fn deb_downloads(fix: &TlsFix) -> usize {
    fix.requests()
        .iter()
        .filter(|r| r["status"] == 200 && r["path"].as_str().is_some_and(|p| p.ends_with(".deb")))
        .count()
}

fn install(home: &TestHome, task: &str) {
    let result = home.exec_in_task(
        task,
        &format!(
            "sudo apt update -q && sudo DEBIAN_FRONTEND=noninteractive apt install -y -q {PACKAGE}"
        ),
        300,
    );
    assert_eq!(result["exitCode"], 0, "apt install in {task}: {result:#}");
    assert_eq!(home.task_sh(task, PACKAGE), "cached\n");
}

fn kept_debs(home: &TestHome, task: &str) -> String {
    home.task_sh(
        task,
        "cd /var/cache/apt/archives && find . -name '*.deb' | sort",
    )
}

fn apt_downloads_stay_in_the_projects_cache_on(backend: Backend, test: &str) {
    let home = match backend {
        Backend::Jail => {
            if !(dynocap_e2e::require_root(test) && dynocap_e2e::images::require_mmdebstrap(test)) {
                return;
            }
            debian_home().0
        }
        Backend::Vm => match TestHome::on(Backend::Vm, test) {
            Some(home) => home,
            None => return,
        },
    };
    let fix = TlsFix::start(&[NAME]);
    flat_apt_repository(&fix.www().join("apt"), fix.dir(), PACKAGE, "cached");
    let home = home
        .with_env(product::ENV_RESOLVE, &fix.resolve(&[NAME]))
        .with_env(product::ENV_EXTRA_CA, &fix.ca_cert.display().to_string());
    let steps = format!(
        "rm -f /etc/apt/sources.list /etc/apt/sources.list.d/* && \
         echo 'deb [trusted=yes] https://{NAME}/apt ./' > /etc/apt/sources.list.d/fixture.list && \
         printf '%s\\n' '{DOCKER_CLEAN}' > /etc/apt/apt.conf.d/docker-clean"
    );
    home.json(&[
        "image", "build", "cleandeb", "--from", "debian", "--run", &steps,
    ]);
    let project = tempfile::tempdir().expect("project");
    std::fs::write(project.path().join("README"), "apt\n").expect("write");
    let path = project.path().to_str().expect("utf-8 path");
    let start = |task: &str| {
        home.json(&[
            "task",
            "start",
            path,
            "--name",
            task,
            "--image",
            "cleandeb",
            "--network",
            "filtered",
            product::FLAG_ALLOW_HOST,
            NAME,
        ])
    };

    start("first");
    install(&home, "first");
    assert_eq!(deb_downloads(&fix), 1, "{:#?}", fix.requests());
    let kept = kept_debs(&home, "first");
    assert!(
        kept.starts_with(&format!("./dynocap/{PACKAGE}_1.0_all.deb")),
        "apt (and the image's docker-clean hook) left the cache without the package: {kept:?}"
    );
    home.json(&["task", "finish", "first"]);

    // The project's next task has the package in its cache, and apt takes it from there.
    start("second");
    assert_eq!(kept_debs(&home, "second"), kept);
    install(&home, "second");
    assert_eq!(
        deb_downloads(&fix),
        1,
        "the second install downloaded the package again: {:#?}",
        fix.requests()
    );
    // Nothing of it is in the task's work.
    let diff = home.json(&["task", "diff", "second"]);
    assert_eq!(diff["files"], 0, "{diff:#}");
    home.json(&["task", "finish", "second"]);

    // A sandbox without the cache gets apt as the image has it: no setting of DynoCap's.
    home.json(&["run", "plain", "--image", "cleandeb"]);
    assert_eq!(
        home.sh(
            "plain",
            "ls /etc/apt/apt.conf.d/zz-dynocap-package-cache 2>/dev/null; true"
        ),
        ""
    );
}

#[test]
fn apt_downloads_stay_in_the_projects_cache() {
    apt_downloads_stay_in_the_projects_cache_on(
        Backend::Jail,
        "apt_downloads_stay_in_the_projects_cache",
    );
}

#[test]
fn apt_downloads_stay_in_the_projects_cache_in_a_vm() {
    apt_downloads_stay_in_the_projects_cache_on(
        Backend::Vm,
        "apt_downloads_stay_in_the_projects_cache_in_a_vm",
    );
}
