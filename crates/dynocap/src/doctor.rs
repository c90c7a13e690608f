//! `dynocap doctor`: what this machine supports, and for each missing piece what to install
//! or enable. Every check is a real probe (open the device, run the tool), not a guess.
//! `dynocap doctor --repair` rebuilds a damaged catalog instead (`repair.rs`).
//!
//! Doctor looks and changes nothing: it reads the home without making or mounting its reflink
//! pool (`DYNOCAP_JAIL_POOL_MB`), whose row says what the pool is and what the next start
//! does with it.
//!
//! The backends' rows are the backends' own: doctor asks each backend the engine has
//! (`backend::all`) what this machine must have for it and whether its sandboxes start here,
//! and names none of them itself.

mod repair;

use std::process::ExitCode;

pub use repair::run as repair;

use dynocap_backend_vm::elf;
use dynocap_engine::backend::{Backend, Readiness};
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
        Readiness::new(name, required, ok, detail, hint).into()
    }
}

impl From<Readiness> for Check {
    fn from(row: Readiness) -> Self {
        let status = match (row.ok, row.required) {
            (true, _) => Status::Ok,
            (false, true) => Status::Missing,
            (false, false) => Status::Warning,
        };
        Self {
            name: row.name,
            ok: row.ok,
            status,
            detail: row.detail,
            hint: row.hint,
            required: row.required,
        }
    }
}

pub fn run(json: bool, config: &Config) -> ExitCode {
    let backends = dynocap_engine::backend::all();
    let mut checks: Vec<Check> = backends
        .iter()
        .flat_map(|backend| backend.machine_checks())
        .map(Check::from)
        .collect();
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
    checks.extend(jail_pool_check(config));
    checks.push(ceilings_check(config));
    checks.push(backend_check(config, &backends));
    checks.extend(
        backends
            .iter()
            .filter_map(|backend| backend.start_check(config, chosen(config, backend.as_ref())))
            .map(Check::from),
    );
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

/// `DYNOCAP_BACKEND` names `backend`, so every sandbox is one of its.
fn chosen(config: &Config, backend: &dyn Backend) -> bool {
    config.backend.as_deref() == Some(backend.name())
}

/// Built images in this DYNOCAP_HOME, and which one a start gets by default.
fn images_check(config: &Config) -> Check {
    let default = config.images.default_name();
    let listed = dynocap_engine::Home::without_pool(&config.home).and_then(|home| {
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

/// The home's reflink pool (`DYNOCAP_JAIL_POOL_MB`), when it is configured or made: its
/// size, whether it is mounted, its used and free room and its sandboxes; a warning when it
/// is nearly full, left over, of another size than configured, or cannot be made.
fn jail_pool_check(config: &Config) -> Option<Check> {
    // A home that cannot be laid out is the images row's to report.
    let home = dynocap_engine::Home::without_pool(&config.home).ok()?;
    let engine = dynocap_engine::Engine::new(home, config.clone()).ok()?;
    match engine.jail_pool() {
        Ok(Some(pool)) => Some(pool_row(&pool)),
        Ok(None) => Some(no_pool_row(engine.jail_disks_clone())),
        Err(err) => Some(Check::new(
            POOL_ROW,
            false,
            false,
            err.message,
            "fix DYNOCAP_JAIL_POOL_MB (a size in MB), or unset it",
        )),
    }
}

const POOL_ROW: &str = "reflink pool";

/// A home without a pool: whether the jail's checkpoints and forks clone there anyway (a home
/// on XFS or btrfs) or copy what each task wrote, and what makes them clones. Information,
/// not a warning: copies work, at a cost that follows what the task wrote.
fn no_pool_row(clones: bool) -> Check {
    let detail = if clones {
        "none, and none needed: the home's filesystem shares extents, so jail checkpoints and \
         forks are clones"
            .to_owned()
    } else {
        "none: the home's filesystem cannot share extents (ext4), so a jail checkpoint or fork \
         copies what the task wrote (seconds per GiB; a fork also sets its whole disk aside); \
         DYNOCAP_JAIL_POOL_MB=16384 (root, xfsprogs) makes them clones in a pool of that many MB \
         set aside in the home, as does a home on XFS or btrfs"
            .to_owned()
    };
    Check::new(POOL_ROW, false, true, detail, "")
}

fn pool_row(pool: &dynocap_engine::jail_pool::JailPool) -> Check {
    let state = &pool.pool;
    let image = state.image.display();
    let sandboxes = match pool.on_it.len() {
        0 => "no sandboxes on it".to_owned(),
        1 => "1 sandbox on it".to_owned(),
        n => format!("{n} sandboxes on it"),
    };
    let shrink = "once it holds no sandbox, `dynocap jail-pool rm` removes it and the next start \
                  makes it anew of DYNOCAP_JAIL_POOL_MB";
    let (ok, detail, hint) = match (state.image_mb, state.configured_mb, &state.room) {
        (None, Some(mb), _) => {
            let fits =
                state.home_free_mb >= mb.saturating_add(dynocap_engine::jail_pool::HEADROOM_MB);
            (
                fits,
                format!(
                    "DYNOCAP_JAIL_POOL_MB={mb}: not made yet; the next start makes {image} \
                     ({mb} MB set aside; the home's filesystem has {} MB free)",
                    state.home_free_mb
                ),
                "the next start is refused: make DYNOCAP_JAIL_POOL_MB smaller, free space on \
                 the home's filesystem, or unset DYNOCAP_JAIL_POOL_MB"
                    .to_owned(),
            )
        }
        (None, None, _) => (
            false,
            format!(
                "mounted on {}, but {image} is gone",
                state.mountpoint.display()
            ),
            "unmount it (umount on that directory) once it holds no sandbox".to_owned(),
        ),
        (Some(size), configured, room) => {
            let mounted = match room {
                Some(room) => format!(
                    "mounted on {}: {} MB used, {} MB free ({}% used), {sandboxes}",
                    state.mountpoint.display(),
                    room.used_mb,
                    room.free_mb,
                    room.used_percent()
                ),
                None => "not mounted: the next start mounts it".to_owned(),
            };
            let detail = format!("{image}, {size} MB, {mounted}");
            match (configured, room) {
                (_, Some(room)) if room.nearly_full() => (
                    false,
                    format!("{detail}; nearly full"),
                    format!(
                        "a fork's writes (its clone sets nothing aside) and new sandboxes may \
                         not fit: free room in it (finish tasks, delete checkpoints, destroy \
                         sandboxes), or make it larger: {shrink}"
                    ),
                ),
                (None, _) => (
                    false,
                    format!("{detail}; DYNOCAP_JAIL_POOL_MB is unset"),
                    format!(
                        "it is left from DYNOCAP_JAIL_POOL_MB and takes {size} MB of the home's \
                         filesystem: set DYNOCAP_JAIL_POOL_MB again to use it, or remove it \
                         (`dynocap jail-pool rm`, once it holds no sandbox)"
                    ),
                ),
                (Some(mb), _) if mb != size => (
                    false,
                    format!("{detail}; DYNOCAP_JAIL_POOL_MB={mb}"),
                    format!("the size is the pool's when it is made: to make it {mb} MB, {shrink}"),
                ),
                _ => (true, detail, String::new()),
            }
        }
    };
    Check::new(POOL_ROW, false, ok, detail, &hint)
}

/// Which backend sandboxes get here, and why: `DYNOCAP_BACKEND`, or what `auto` picks.
fn backend_check(config: &Config, backends: &[Box<dyn Backend>]) -> Check {
    let chosen = config.backend.clone().unwrap_or_default();
    if let Err(err) = config.backend_choice() {
        let mut names: Vec<&str> = backends.iter().map(|backend| backend.name()).collect();
        names.push("auto");
        return Check::new(
            "backend",
            true,
            false,
            err.message,
            &format!(
                "set DYNOCAP_BACKEND to {}, or unset it (auto)",
                one_of(&names)
            ),
        );
    }
    if !matches!(chosen.as_str(), "" | "auto") {
        let note = backends
            .iter()
            .find(|backend| backend.name() == chosen)
            .and_then(|backend| backend.chosen_note());
        return Check::new(
            "backend",
            false,
            true,
            match note {
                Some(note) => format!("{chosen} (DYNOCAP_BACKEND); {note}"),
                None => format!("{chosen} (DYNOCAP_BACKEND)"),
            },
            "",
        );
    }
    match dynocap_engine::Home::without_pool(&config.home) {
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

/// `["a", "b", "c"]` as "a, b or c".
fn one_of(words: &[&str]) -> String {
    match words {
        [] => String::new(),
        [only] => (*only).to_owned(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_home_without_a_pool_is_told_whether_its_forks_clone_or_copy() {
        let clones = no_pool_row(true);
        assert!(clones.ok, "{clones:?}");
        assert!(clones.detail.contains("are clones"), "{clones:?}");
        let copies = no_pool_row(false);
        assert!(copies.ok, "copies work: information, not a warning");
        for needle in [
            "copies what the task wrote",
            "DYNOCAP_JAIL_POOL_MB",
            "XFS or btrfs",
        ] {
            assert!(copies.detail.contains(needle), "{needle:?}: {copies:?}");
        }
    }

    #[test]
    fn one_of_lists_the_choices_as_a_sentence_does() {
        assert_eq!(one_of(&["jail", "vm", "auto"]), "jail, vm or auto");
        assert_eq!(one_of(&["jail", "auto"]), "jail or auto");
        assert_eq!(one_of(&["auto"]), "auto");
    }

    fn pool(
        configured: Option<u64>,
        image_mb: Option<u64>,
        used_free: Option<(u64, u64)>,
    ) -> dynocap_engine::jail_pool::JailPool {
        use dynocap_engine::jail_pool::{JailPool, PoolRoom, PoolState};
        JailPool {
            pool: PoolState {
                image: "/h/jail-pool.xfs".into(),
                mountpoint: "/h/sandboxes".into(),
                configured_mb: configured,
                image_mb,
                mounted: used_free.is_some(),
                home_free_mb: 5000,
                room: used_free.map(|(used_mb, free_mb)| PoolRoom {
                    size_mb: used_mb + free_mb,
                    used_mb,
                    free_mb,
                }),
                sandboxes: Vec::new(),
            },
            on_it: Vec::new(),
        }
    }

    #[test]
    fn the_pool_row_warns_when_full_left_over_resized_or_unmakeable() {
        let ok = pool_row(&pool(Some(2048), Some(2048), Some((100, 1900))));
        assert_eq!(ok.status, Status::Ok, "{ok:?}");
        assert!(
            ok.detail.contains("100 MB used, 1900 MB free (5% used)"),
            "{ok:?}"
        );

        let full = pool_row(&pool(Some(2048), Some(2048), Some((1900, 100))));
        assert_eq!(full.status, Status::Warning, "{full:?}");
        assert!(full.detail.ends_with("nearly full"), "{full:?}");
        assert!(full
            .hint
            .as_deref()
            .is_some_and(|h| h.contains("jail-pool rm")));

        let left = pool_row(&pool(None, Some(2048), None));
        assert_eq!(left.status, Status::Warning, "{left:?}");
        assert!(left.detail.contains("not mounted") && left.detail.contains("unset"));

        let resized = pool_row(&pool(Some(4096), Some(2048), Some((100, 1900))));
        assert_eq!(resized.status, Status::Warning, "{resized:?}");
        assert!(resized
            .hint
            .as_deref()
            .is_some_and(|h| h.contains("4096 MB")));

        let unmade = pool_row(&pool(Some(4096), None, None));
        assert_eq!(unmade.status, Status::Ok, "{unmade:?}");
        assert!(unmade.detail.contains("not made yet"), "{unmade:?}");
        let no_room = pool_row(&pool(Some(8192), None, None));
        assert_eq!(no_room.status, Status::Warning, "{no_room:?}");
        assert!(no_room
            .hint
            .as_deref()
            .is_some_and(|h| h.contains("refused")));
    }

    #[test]
    fn every_backend_is_offered_in_the_hint_for_a_bad_setting() {
        let config = Config {
            backend: Some("bogus".to_owned()),
            ..Config::default()
        };
        let backends = dynocap_engine::backend::all();
        let check = backend_check(&config, &backends);
        assert_eq!(check.status, Status::Missing);
        assert_eq!(
            check.hint.as_deref(),
            Some("set DYNOCAP_BACKEND to jail, vm or auto, or unset it (auto)")
        );
    }
}
