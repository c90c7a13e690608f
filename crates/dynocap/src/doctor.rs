//! `dynocap doctor`: what this machine supports, and for each missing piece what to install
//! or enable. Every check is a real probe (open the device, run the tool), not a guess.
//! `dynocap doctor --repair` rebuilds a damaged catalog instead (`repair.rs`).

mod repair;

use std::process::ExitCode;

pub use repair::run as repair;

use dynocap_backend_vm::elf;
use dynocap_engine::Config;
use serde::Serialize;

use crate::output::{print_json, say, sayln, table};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub status: Status,
    pub detail: String,
    /// What to do when `ok` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// A missing optional piece does not stop the default backend.
    pub required: bool,
}

/// What a check found, as the table shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Status {
    Ok,
    /// A required piece is missing: sandboxes cannot start.
    Missing,
    /// Sandboxes start, but something will not work as expected (see the hint).
    Warning,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Missing => "MISSING",
            Status::Warning => "warning",
        }
    }
}

impl Check {
    fn new(name: &str, required: bool, ok: bool, detail: String, hint: &str) -> Self {
        let status = match (ok, required) {
            (true, _) => Status::Ok,
            (false, true) => Status::Missing,
            (false, false) => Status::Warning,
        };
        Self {
            name: name.into(),
            ok,
            status,
            detail,
            hint: (!ok).then(|| hint.to_owned()),
            required,
        }
    }
}

pub fn run(json: bool, config: &Config) -> ExitCode {
    let mut checks = jail_checks();
    checks.push(agent_check(config));
    checks.push(tool_check(
        "git",
        true,
        &["git", "--version"],
        "install git (apt-get install git); tasks import and diff projects with it",
    ));
    checks.push(pasta_check());
    checks.push(tool_check(
        "mmdebstrap",
        false,
        &["mmdebstrap", "--version"],
        "apt-get install mmdebstrap; needed only to build images (dynocap image build debian)",
    ));
    checks.push(images_check(config));
    checks.push(ceilings_check(config));
    checks.push(backend_check(config));
    checks.push(vm_check(config));
    let ready = checks.iter().all(|c| c.ok || !c.required);
    if json {
        print_json(&serde_json::json!({ "ready": ready, "checks": checks }));
    } else {
        let rows: Vec<Vec<String>> = checks
            .iter()
            .map(|c| {
                let text = match &c.hint {
                    Some(hint) => format!("{} — {hint}", c.detail),
                    None => c.detail.clone(),
                };
                vec![c.name.clone(), c.status.label().to_owned(), text]
            })
            .collect();
        say!("{}", table(&["CHECK", "STATUS", "DETAIL"], &rows));
        sayln!(
            "{}",
            if ready {
                "ready: sandboxes can run here"
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
    let from = |name: &str, check: dynocap_host::Check| Check {
        name: name.to_owned(),
        ok: check.ok,
        detail: check.detail,
        status: if check.ok {
            Status::Ok
        } else {
            Status::Missing
        },
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

/// Built images in this DYNOCAP_HOME, and which one a start gets by default.
fn images_check(config: &Config) -> Check {
    let default = config.images.default_name();
    let listed = dynocap_engine::Home::from_config(&config.home).and_then(|home| {
        dynocap_engine::image::store::ImageStore::for_home(&home, None)
            .list()
            .map(|images| (home, images))
    });
    let (home, images) = match listed {
        Ok(found) => found,
        Err(err) => {
            return Check::new(
                "images",
                false,
                false,
                err.message,
                "set DYNOCAP_HOME to a readable directory",
            )
        }
    };
    let built: Vec<String> = images
        .iter()
        .map(|i| {
            format!(
                "{} {} (kernel {})",
                i.name(),
                dynocap_engine::image::build::short(i.id()),
                i.meta.kernel.as_deref().unwrap_or("none")
            )
        })
        .collect();
    let default_ok = default == dynocap_engine::image::DEFAULT_IMAGE
        || images.iter().any(|i| i.name() == default);
    let detail = format!(
        "built: {}; default image {default}{}",
        if built.is_empty() {
            "none".to_owned()
        } else {
            built.join(", ")
        },
        if config.images.default.is_some() {
            " (DYNOCAP_IMAGE)"
        } else {
            ""
        }
    );
    let hint = format!(
        "DYNOCAP_IMAGE={default} is not built in {}; build it with `dynocap image build {default}`",
        home.images_dir().display()
    );
    Check::new("images", false, default_ok, detail, &hint)
}

/// Which backend sandboxes get here, and why: `DYNOCAP_BACKEND`, or what `auto` picks.
fn backend_check(config: &Config) -> Check {
    let chosen = config.backend.clone().unwrap_or_default();
    if let Err(err) = config.backend_choice() {
        return Check::new(
            "backend",
            true,
            false,
            err.message,
            "set DYNOCAP_BACKEND to jail, vm or auto, or unset it (auto)",
        );
    }
    if !matches!(chosen.as_str(), "" | "auto") {
        return Check::new(
            "backend",
            false,
            true,
            match chosen.as_str() {
                "vm" => {
                    "vm (DYNOCAP_BACKEND); whether VMs start here: the vm backend check".to_owned()
                }
                _ => format!("{chosen} (DYNOCAP_BACKEND)"),
            },
            "",
        );
    }
    match dynocap_engine::Home::from_config(&config.home) {
        Ok(home) => {
            let auto = dynocap_engine::backend::auto::choose(&home, &config.images.default_name());
            Check::new(
                "backend",
                false,
                true,
                format!("auto picks {}: {}", auto.backend, auto.why),
                "",
            )
        }
        Err(err) => Check::new(
            "backend",
            false,
            false,
            format!("auto cannot decide: {}", err.message),
            "set DYNOCAP_HOME to a readable directory",
        ),
    }
}

/// Whether a `vm` sandbox starts here, decided as its first start decides (the image's kernel,
/// QEMU, `DYNOCAP_VM_ACCEL` and the KVM probe). Required when `DYNOCAP_BACKEND=vm` makes every
/// sandbox a VM; otherwise a warning, since `--backend vm` can still ask for one.
fn vm_check(config: &Config) -> Check {
    let required = config.backend.as_deref() == Some("vm");
    // Probed (a few seconds, once per kernel) where sandboxes may be VMs without asking:
    // `vm` selected, or `auto` deciding for a built default image.
    let default = config.images.default_name();
    let probe = required || default != dynocap_engine::image::DEFAULT_IMAGE;
    match dynocap_engine::Home::from_config(&config.home) {
        Ok(home) => {
            let vm = dynocap_engine::vm_ready::check(&home, config, probe);
            if required && default == dynocap_engine::image::DEFAULT_IMAGE {
                // Every start that names no image gets `host`, which no VM boots.
                return Check::new(
                    "vm backend",
                    true,
                    false,
                    format!(
                        "DYNOCAP_BACKEND=vm, but the default image \"{default}\" is the host's \
                         own directories, which no VM boots: a start without --image fails; {}",
                        vm.detail
                    ),
                    &format!(
                        "set DYNOCAP_IMAGE to a built image with a kernel (`dynocap image build \
                         debian`, then DYNOCAP_IMAGE=debian), or pass --image to every start{}",
                        vm.hint.map(|h| format!("; then {h}")).unwrap_or_default()
                    ),
                );
            }
            Check::new(
                "vm backend",
                required,
                vm.ready,
                vm.detail,
                vm.hint.as_deref().unwrap_or(""),
            )
        }
        Err(err) => Check::new(
            "vm backend",
            required,
            false,
            err.message,
            "set DYNOCAP_HOME to a readable directory",
        ),
    }
}

/// The host ceilings in force (`DYNOCAP_MAX_*`), so the person can see what callers get.
fn ceilings_check(config: &Config) -> Check {
    match dynocap_engine::ceilings::Ceilings::from_config(&config.ceilings) {
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

/// The guest agent: found, and linked so that it starts in any image. A glibc build only
/// starts where the host's loader and libc are (the `host` image).
fn agent_check(config: &Config) -> Check {
    // The static agent's target on this architecture (x86_64-unknown-linux-musl here).
    let musl = format!("{}-unknown-linux-musl", std::env::consts::ARCH);
    let build = format!(
        "build the static agent with `cargo build --release --target {musl} -p dynocap-agent` \
         and install target/{musl}/release/dynocap-agent beside dynocap (or point DYNOCAP_AGENT at it)"
    );
    let path = match dynocap_engine::supervisor::agent_binary(config) {
        Ok(path) => path,
        Err(err) => return Check::new("guest agent", true, false, err.message, &build),
    };
    let linkage = std::fs::read(&path)
        .map_err(|err| format!("reading it: {err}"))
        .and_then(|bytes| elf::linkage(&bytes));
    let shown = path.display();
    match linkage {
        Ok(elf::Linkage::Static) => Check::new(
            "guest agent",
            true,
            true,
            format!("{shown}: statically linked, starts in any image"),
            "",
        ),
        Ok(dynamic) => Check::new(
            "guest agent",
            false,
            false,
            format!("{shown}: {dynamic}; it starts in the host image only, not in an image without that libc"),
            &build,
        ),
        Err(err) => Check::new(
            "guest agent",
            true,
            false,
            format!("{shown}: {err}"),
            &build,
        ),
    }
}

/// pasta (package `passt`) gives `nat` sandboxes their network. It prints no version of its
/// own ("unknown version" on Debian 12), so the package's version is reported.
fn pasta_check() -> Check {
    let hint = dynocap_host::PASTA_MISSING;
    match dynocap_host::find_pasta() {
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
