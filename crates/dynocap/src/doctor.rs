//! `dynocap doctor`: what this machine supports, and for each missing piece what to install
//! or enable. Every check is a real probe (open the device, run the tool), not a guess.
//! `dynocap doctor --repair` rebuilds a damaged catalog instead (`repair.rs`).

mod repair;

use std::process::ExitCode;

pub use repair::run as repair;

use serde::Serialize;

use crate::output::{print_json, table};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
    /// What to do when `ok` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// A missing optional piece does not stop the default backend.
    pub required: bool,
}

impl Check {
    fn new(name: &str, required: bool, ok: bool, detail: String, hint: &str) -> Self {
        Self {
            name: name.into(),
            ok,
            detail,
            hint: (!ok).then(|| hint.to_owned()),
            required,
        }
    }
}

pub fn run(json: bool) -> ExitCode {
    let mut checks = jail_checks();
    checks.push(agent_check());
    checks.push(tool_check(
        "git",
        true,
        &["git", "--version"],
        "install git (apt-get install git); tasks import and diff projects with it",
    ));
    checks.push(pasta_check());
    checks.push(kvm_check());
    checks.push(ceilings_check());
    checks.push(tool_check(
        "qemu",
        false,
        &["qemu-system-x86_64", "--version"],
        "install QEMU for the vm backend (apt-get install qemu-system-x86)",
    ));
    let ready = checks.iter().all(|c| c.ok || !c.required);
    if json {
        print_json(&serde_json::json!({ "ready": ready, "checks": checks }));
    } else {
        let rows: Vec<Vec<String>> = checks
            .iter()
            .map(|c| {
                let status = match (c.ok, c.required) {
                    (true, _) => "ok",
                    (false, true) => "MISSING",
                    (false, false) => "missing (optional)",
                };
                let text = match &c.hint {
                    Some(hint) => format!("{} — {hint}", c.detail),
                    None => c.detail.clone(),
                };
                vec![c.name.clone(), status.to_owned(), text]
            })
            .collect();
        print!("{}", table(&["CHECK", "STATUS", "DETAIL"], &rows));
        println!(
            "{}",
            if ready {
                "ready: the jail backend can run sandboxes here"
            } else {
                "not ready: fix the MISSING items above"
            }
        );
    }
    if ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn jail_checks() -> Vec<Check> {
    let probe = dynocap_backend_jail::probe();
    let from = |name: &str, check: dynocap_backend_jail::Check| Check {
        name: name.to_owned(),
        ok: check.ok,
        detail: check.detail,
        hint: if check.ok { None } else { check.hint },
        required: true,
    };
    vec![
        Check::new("kernel", true, true, probe.kernel.clone(), ""),
        from("user namespaces", probe.user_namespaces),
        from("overlay in user namespace", probe.overlay_in_userns),
        from("mount API", probe.mount_api),
        from("seccomp", probe.seccomp),
        from(
            &format!("cgroups ({:?})", probe.cgroups.layout).to_lowercase(),
            probe.cgroups.check,
        ),
    ]
}

/// The host ceilings in force (`DYNOCAP_MAX_*`), so the person can see what callers get.
fn ceilings_check() -> Check {
    match dynocap_engine::ceilings::Ceilings::from_env() {
        Ok(ceilings) => {
            let detail = ceilings
                .entries()
                .iter()
                .map(|(var, value, unit)| format!("{var}={value} ({unit})"))
                .collect::<Vec<_>>()
                .join(", ");
            Check::new("host ceilings", true, true, detail, "")
        }
        Err(err) => Check::new(
            "host ceilings",
            true,
            false,
            err.message,
            "fix or unset that variable; sandboxes cannot start until then",
        ),
    }
}

fn agent_check() -> Check {
    match dynocap_engine::supervisor::agent_binary() {
        Ok(path) => Check::new("guest agent", true, true, path.display().to_string(), ""),
        Err(err) => Check::new(
            "guest agent",
            true,
            false,
            err.message,
            "build it with `cargo build --release -p dynocap-agent` and install it beside dynocap",
        ),
    }
}

/// pasta (package `passt`) gives `nat` sandboxes their network. It prints no version of its
/// own ("unknown version" on Debian 12), so the package's version is reported.
fn pasta_check() -> Check {
    let hint = "network \"nat\" needs pasta: apt install passt";
    match dynocap_backend_jail::find_pasta() {
        Ok(path) => {
            let package = std::process::Command::new("dpkg-query")
                .args(["-W", "-f=${Version}", "passt"])
                .output()
                .ok()
                .filter(|out| out.status.success())
                .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
                .filter(|v| !v.is_empty());
            let detail = match package {
                Some(version) => format!(
                    "{} (passt {version}); network \"nat\" uses it",
                    path.display()
                ),
                None => format!("{}; network \"nat\" uses it", path.display()),
            };
            Check::new("pasta", false, true, detail, hint)
        }
        Err(_) => Check::new(
            "pasta",
            false,
            false,
            "pasta not found on PATH: network \"nat\" is unavailable".into(),
            hint,
        ),
    }
}

fn tool_check(name: &str, required: bool, argv: &[&str], hint: &str) -> Check {
    match std::process::Command::new(argv[0])
        .args(&argv[1..])
        .output()
    {
        Ok(out) if out.status.success() => {
            let version = String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_owned();
            Check::new(name, required, true, version, hint)
        }
        Ok(out) => Check::new(
            name,
            required,
            false,
            format!("{} exited with {}", argv[0], out.status),
            hint,
        ),
        Err(err) => Check::new(
            name,
            required,
            false,
            format!("{} not found: {err}", argv[0]),
            hint,
        ),
    }
}

/// /dev/kvm must open read-write and answer KVM_GET_API_VERSION.
fn kvm_check() -> Check {
    const HINT: &str = "the vm backend falls back to software emulation (TCG); enable virtualisation or add your user to the kvm group";
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(file) => file,
        Err(err) => return Check::new("kvm", false, false, format!("/dev/kvm: {err}"), HINT),
    };
    const KVM_GET_API_VERSION: libc::c_ulong = 0xAE00;
    // SAFETY: KVM_GET_API_VERSION takes no argument and only reads the open descriptor.
    let version = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            KVM_GET_API_VERSION,
            0,
        )
    };
    if version == 12 {
        Check::new("kvm", false, true, "/dev/kvm answers (API 12); whether a guest kernel boots on it is checked when the vm backend starts".into(), HINT)
    } else {
        Check::new(
            "kvm",
            false,
            false,
            format!("/dev/kvm answered API version {version}"),
            HINT,
        )
    }
}
