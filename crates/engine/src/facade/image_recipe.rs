//! `dynocap image build NAME --from BASE` with steps: the steps run inside a jail sandbox of
//! the base image (never on the host), as the guest's root, with the network the user gives;
//! then the sandbox's overlay upper directory becomes one layer of a new image
//! ([`crate::image::recipe_layer`]) and the sandbox is destroyed, whatever happened.
//!
//! A copy step puts the host file or directory into the sandbox's `/tmp` as the sandbox user
//! (through the agent's file operations, which never follow a symlink) and a root step moves
//! it into place, so the copy is in the sandbox for the steps after it.
//!
//! The upper directory is read while the guest still runs but has finished every step (and
//! synced): the supervisor keeps the sandbox's disk mounted in a mount namespace of its own,
//! which the host reaches through `/proc/<supervisor>/root`.
//!
//! A build that is stopped destroys its sandbox itself; one whose process is killed outright
//! (SIGKILL) cannot. So every build holds an flock on `images/.build-sandboxes/<sandbox>.lock`
//! while its sandbox may exist, and the next recipe build or `image rm` destroys the sandbox
//! of each mark no one holds ([`Engine::reap_dead_builds`]): it would otherwise run its step
//! on until its TTL, and keep its base image in use.
//!
//! A build is bounded in time as a whole (`--timeout`, [`RECIPE_TIMEOUT_DEFAULT`]): its
//! steps share the bound, each given what is left of it, and the sandbox lives that long
//! plus [`LAYER_MARGIN`] for making the layer after the last step.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use dynocap_proto::files::{FileOp, PutItem, MAX_WRITE};

use super::sandboxes::OnOutput;
use crate::facade::sandboxes::Engine;
use crate::foundation::error::{Error, Result};
use crate::image::recipe_layer::{self, HostFile, RecipeSpec, Step, TreeEntry};
use crate::image::store::{BuiltImage, ImageStore};
use crate::image::unpack::Limits;
use crate::model::backend_choice::BackendChoice;
use crate::model::lifecycle::Kind;
use crate::model::spec::{check_range, ExecSpec, RunSpec, TTL_MAX};

/// The bound in seconds of a whole recipe build (its steps together) without `--timeout`.
pub const RECIPE_TIMEOUT_DEFAULT: u64 = 3_600;
/// The shortest bound a build may be given: starting its sandbox and a step take seconds.
pub const RECIPE_TIMEOUT_MIN: u64 = 60;
/// The longest: a sandbox's longest life.
pub const RECIPE_TIMEOUT_MAX: u64 = TTL_MAX;
/// What the build sandbox lives beyond the build's bound: after the last step come `sync`
/// (bounded by [`SYNC_TIMEOUT`]) and reading the sandbox's upper directory into a layer,
/// which needs the sandbox alive; a step that used the whole bound still leaves them time.
/// Cut so the sandbox's TTL stays within [`TTL_MAX`] and the host's TTL ceiling
/// ([`sandbox_ttl`]): near those, the margin is what is left below them.
pub const LAYER_MARGIN: u64 = 900;
/// `sync` after the last step: the sandbox's disk written out before its layer is read.
const SYNC_TIMEOUT: u64 = 600;

/// What `image build … --from` was asked for.
#[derive(Debug, Clone)]
pub struct RecipeRequest {
    pub name: String,
    pub base: String,
    pub steps: Vec<Step>,
    /// `none` (default), `filtered` or `nat`, for the `--run` and `--apt` steps.
    pub network: Option<String>,
    pub allow_hosts: Vec<String>,
    pub limits: Limits,
    /// The build sandbox's memory and disk (`None`: a sandbox's defaults); what the steps
    /// may use, not part of what the image is.
    pub memory_mb: Option<u64>,
    pub disk_mb: Option<u64>,
    /// The bound in seconds of the whole build, its steps together (`None`:
    /// [`RECIPE_TIMEOUT_DEFAULT`]); like the sandbox's size, not part of the recipe's id.
    pub timeout_seconds: Option<u64>,
    /// The build sandbox's name ([`build_sandbox_name`]): a caller that is interrupted
    /// destroys it by this name.
    pub sandbox: String,
}

/// The error for a recipe's base that is not an image on this host, saying how to get it.
fn missing_base(base: &str) -> Error {
    let shown = crate::image::oci::printable(base);
    if base == crate::model::image_ref::DEFAULT_IMAGE {
        return Error::invalid(format!(
            "\"{shown}\" is the host's own /usr, which no recipe builds on: give a pulled, \
             imported or built image as --from (`dynocap image build debian` makes one)"
        ));
    }
    let how = if crate::image::store::is_reference(base) {
        format!("pull it first with `dynocap image pull {shown}`")
    } else if crate::image::recipe::BUILDABLE.contains(&base) {
        format!("build it first with `dynocap image build {shown}`")
    } else {
        "pull, import or build it first".to_owned()
    };
    Error::not_found(format!(
        "no image {shown} on this host to build on: {how} (dynocap image ls lists the images here)"
    ))
}

/// Refuses a recipe whose base is named by the name the recipe makes (`image build tool
/// --from tool`): a name stands for its newest image, so each build would be on the last
/// one's result, stacking a layer every time and never up to date. A base given by its id is
/// pinned, so building it under its own name is a recipe like any other.
fn check_not_own_base(request: &RecipeRequest, base: &BuiltImage) -> Result<()> {
    if request.base != request.name {
        return Ok(());
    }
    let shown = crate::image::oci::printable(&request.name);
    Err(Error::invalid(format!(
        "image {shown}: --from {shown} names the image this recipe makes, so each build would \
         start from the last one's result and add another layer (never up to date); give the \
         result another name, or pin the base by its id (--from {}, see dynocap image ls)",
        &base.id()[..12]
    )))
}

/// A fresh name for a build sandbox.
pub fn build_sandbox_name() -> String {
    format!("image-build-{:08x}", rand::random::<u32>())
}

/// A finished recipe build.
#[derive(Debug, Clone)]
pub struct RecipeBuilt {
    pub image: BuiltImage,
    /// The store had this very recipe's image already: nothing ran.
    pub present: bool,
}

/// Beside the images: one mark per running recipe build, naming its sandbox.
const BUILD_MARKS: &str = ".build-sandboxes";

/// A running build's mark: `images/.build-sandboxes/<sandbox>.lock`, flocked for as long as
/// this value lives, removed when it is dropped (the build over, its sandbox destroyed).
struct BuildMark {
    path: PathBuf,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl BuildMark {
    fn take(images: &Path, sandbox: &str) -> Result<BuildMark> {
        let dir = images.join(BUILD_MARKS);
        // Locked under a name no reaper reads, then renamed into place: a mark is never seen
        // unlocked while its build lives.
        let staged = dir.join(format!(".{sandbox}.new"));
        let mut tries = 0;
        let file = loop {
            std::fs::create_dir_all(&dir)
                .map_err(|err| Error::internal(format!("creating {}: {err}", dir.display())))?;
            match std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&staged)
            {
                Ok(file) => break file,
                // The last build's mark going took the directory with it meanwhile.
                Err(err) if err.kind() == std::io::ErrorKind::NotFound && tries < 8 => tries += 1,
                Err(err) => {
                    return Err(Error::internal(format!(
                        "creating {}: {err}",
                        staged.display()
                    )))
                }
            }
        };
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, errno)| {
                Error::internal(format!("locking {}: {errno}", staged.display()))
            })?;
        let path = dir.join(format!("{sandbox}.lock"));
        std::fs::rename(&staged, &path)
            .map_err(|err| Error::internal(format!("creating {}: {err}", path.display())))?;
        Ok(BuildMark { path, _lock: lock })
    }
}

impl Drop for BuildMark {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_file(&self.path) {
            tracing::warn!("removing {}: {err}", self.path.display());
        }
        // The last mark takes the directory with it (another build's keeps it).
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Where copied files wait (the sandbox user's) before a root step moves them.
const STEP_USER_DIR: &str = "/tmp";

impl Engine {
    /// Builds (or finds, when its recipe was built before) image `request.name`. `say`
    /// gets one line per step; `on_output` every byte the steps print.
    pub async fn image_build_recipe(
        &self,
        request: &RecipeRequest,
        say: &(dyn Fn(&str) + Send + Sync),
        on_output: OnOutput<'_>,
    ) -> Result<RecipeBuilt> {
        if let Some(why) = crate::image::store::unfit_name(&request.name) {
            return Err(Error::invalid(format!(
                "\"{}\" cannot name a built image: {why}; give another, e.g. `dynocap image \
                 build mytool --from {}`",
                crate::image::oci::printable(&request.name),
                request.base
            )));
        }
        let timeout = recipe_timeout(request.timeout_seconds)?;
        let store = ImageStore::for_home(self.home(), self.config().images.cache_dir());
        let base = store
            .find(&request.base)?
            .ok_or_else(|| missing_base(&request.base))?;
        check_not_own_base(request, &base)?;
        let mut copied = Vec::new();
        // Per step: what a copy step copies, as listed for the id.
        let mut trees: Vec<Option<Copied>> = Vec::new();
        for step in &request.steps {
            check_step(step)?;
            let mut tree = None;
            if let Step::Copy(host, _) = step {
                let host = Path::new(host);
                if host.is_dir() {
                    let (entries, digest) = recipe_layer::host_tree(host, request.limits)?;
                    copied.push(digest);
                    tree = Some(Copied::Tree(entries));
                } else {
                    let file = recipe_layer::host_file(host, request.limits)?;
                    copied.push(file.id());
                    tree = Some(Copied::File(file));
                }
            }
            trees.push(tree);
        }
        let network = request.network.clone().unwrap_or_else(|| "none".to_owned());
        let recipe = RecipeSpec {
            base_name: base.name().to_owned(),
            base_id: base.id().to_owned(),
            steps: request.steps.clone(),
            copied,
            network: network.clone(),
            allow_hosts: request.allow_hosts.clone(),
        };
        if let Some(image) = store.get(&request.name, &recipe.id()) {
            return Ok(RecipeBuilt {
                image,
                present: true,
            });
        }
        // What the sandbox's agent will join into the guest's trust store (a `nat` or
        // `filtered` sandbox is given DYNOCAP_EXTRA_CA), read as the sandbox is given it, and
        // whether it switches apt to HTTPS (`filtered`): its layer leaves both out again. An
        // unreadable file fails the start of the sandbox, saying why; a `none` sandbox is
        // given nothing, so nothing is left out of its layer.
        let mode = crate::model::spec::Network::parse(&network)?;
        let extra_ca = if mode == crate::model::spec::Network::None {
            None
        } else {
            crate::supervisor::egress::direct_extra_ca(
                &self.config().egress,
                crate::model::spec::Network::Nat,
            )
            .unwrap_or(None)
        };
        let host_trust =
            recipe_layer::HostTrust::new(extra_ca, mode == crate::model::spec::Network::Filtered);
        let sandbox = request.sandbox.as_str();
        self.reap_dead_builds().await;
        let _mark = BuildMark::take(store.dir(), sandbox)?;
        // The build's clock starts with its sandbox, whose TTL runs from here too.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout);
        let ceiling = crate::facade::ceilings::Ceilings::from_config(&self.config().ceilings)?;
        above_ttl_ceiling(timeout, ceiling.ttl_seconds)?;
        let mut spec = RunSpec::raw(
            sandbox,
            Some(&network),
            Some(sandbox_ttl(timeout, ceiling.ttl_seconds)),
            None,
            request.memory_mb,
            request.disk_mb,
        )?;
        spec.allow_hosts = request.allow_hosts.clone();
        spec.image = Some(base.name().to_owned());
        spec.backend = Some(BackendChoice::Jail);
        say(&format!(
            "starting a jail sandbox of {} ({})",
            base.name(),
            &base.id()[..12]
        ));
        self.run(&spec).await?;
        let built = self
            .build_in_sandbox(
                sandbox,
                request,
                &trees,
                &recipe,
                &store,
                &base,
                host_trust,
                say,
                on_output,
                (deadline, timeout),
            )
            .await;
        if let Err(err) = self.destroy(sandbox).await {
            tracing::warn!("removing the build sandbox {sandbox}: {err}");
        }
        Ok(RecipeBuilt {
            image: built?,
            present: false,
        })
    }

    /// Destroys the sandbox of every recipe build whose process died without destroying it
    /// (its mark unlocked), and removes the mark. A sandbox that cannot be destroyed now
    /// keeps its mark, for the next call.
    pub async fn reap_dead_builds(&self) {
        let dir = self.home().images_dir().join(BUILD_MARKS);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(sandbox) = name.strip_suffix(".lock") else {
                continue;
            };
            let Ok(file) = std::fs::OpenOptions::new().write(true).open(entry.path()) else {
                continue;
            };
            // Held: its build is running.
            let Ok(_lock) =
                nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            else {
                continue;
            };
            match self.destroy(sandbox).await {
                Ok(_) => tracing::info!("destroyed {sandbox}, the sandbox of a build that died"),
                Err(err) if err.code == crate::foundation::error::ErrorCode::NotFound => {}
                Err(err) => {
                    tracing::warn!("destroying {sandbox}, the sandbox of a build that died: {err}");
                    continue;
                }
            }
            if let Err(err) = std::fs::remove_file(entry.path()) {
                tracing::warn!("removing {}: {err}", entry.path().display());
            }
        }
        let _ = std::fs::remove_dir(&dir);
    }

    #[allow(clippy::too_many_arguments)]
    async fn build_in_sandbox(
        &self,
        sandbox: &str,
        request: &RecipeRequest,
        trees: &[Option<Copied>],
        recipe: &RecipeSpec,
        store: &ImageStore,
        base: &BuiltImage,
        host_trust: recipe_layer::HostTrust,
        say: &(dyn Fn(&str) + Send + Sync),
        on_output: OnOutput<'_>,
        (deadline, timeout): (std::time::Instant, u64),
    ) -> Result<BuiltImage> {
        let mut env: Vec<(String, String)> = Vec::new();
        let total = request.steps.len();
        for (n, step) in request.steps.iter().enumerate() {
            let label = format!("step {}/{total} ({})", n + 1, describe(step));
            say(&label);
            let command = match step {
                Step::Env(key, value) => {
                    env.push((key.clone(), value.clone()));
                    continue;
                }
                Step::Run(command) => as_root(&env, command),
                Step::Apt(packages) => as_root(
                    &env,
                    &format!(
                        "export DEBIAN_FRONTEND=noninteractive; apt-get update && \
                         apt-get install -y --no-install-recommends {}",
                        packages.join(" ")
                    ),
                ),
                Step::Copy(host, guest) => match trees.get(n).and_then(Option::as_ref) {
                    Some(Copied::Tree(tree)) => {
                        self.copy_tree_in(sandbox, n, host, guest, tree).await?
                    }
                    Some(Copied::File(file)) => self.copy_in(sandbox, n, host, guest, file).await?,
                    None => {
                        return Err(Error::internal(format!(
                            "copy step {} has no listing",
                            n + 1
                        )))
                    }
                },
            };
            let left = step_timeout(deadline, std::time::Instant::now());
            let exec = ExecSpec::new(&command, None, "/", Vec::new(), Some(left), false)?;
            let result = self.exec_streaming(sandbox, &exec, on_output).await?;
            if result.exit_code != Some(0) {
                let how = match (&result.exit_code, &result.signal, result.timed_out) {
                    (_, _, true) => timed_out(left, timeout),
                    (Some(code), _, _) => format!("exited with code {code}"),
                    (None, Some(signal), _) => format!("was killed by {signal}"),
                    (None, None, _) => "failed".to_owned(),
                };
                let fix = failure_fix(step, &recipe.network, result.timed_out, result.exit_code);
                return Err(Error::invalid(format!(
                    "image {}: {label} {how}; nothing was built{fix}",
                    request.name
                )));
            }
        }
        let sync = ExecSpec::new("sync", None, "/", Vec::new(), Some(SYNC_TIMEOUT), false)?;
        self.exec(sandbox, &sync).await?;
        let record = self.live_record(sandbox, Kind::Raw)?;
        let pid = record
            .supervisor
            .as_ref()
            .map(|p| p.pid)
            .ok_or_else(|| Error::internal("the build sandbox has no supervisor"))?;
        let state_dir = self.home().sandbox_dir(&record.id);
        let mut upper = PathBuf::from(format!("/proc/{pid}/root"));
        upper.push(state_dir.strip_prefix("/").unwrap_or(&state_dir));
        upper.push("disk/upper");
        say("making the layer");
        let (store, name, base, recipe, limits) = (
            store.clone(),
            request.name.clone(),
            base.clone(),
            recipe.clone(),
            request.limits,
        );
        let (image, skipped) = tokio::task::spawn_blocking(move || {
            recipe_layer::install(&store, &name, &base, &recipe, &upper, limits, &host_trust)
        })
        .await
        .map_err(|err| Error::internal(format!("the image build thread failed: {err}")))??;
        if skipped.special + skipped.reserved_names > 0 {
            say(&format!(
                "left out {} device nodes, fifos or sockets and {} names starting with .wh.",
                skipped.special, skipped.reserved_names
            ));
        }
        Ok(image)
    }

    /// Puts host file `host` into the sandbox's `/tmp` (as the sandbox user, in pieces the
    /// file protocol carries, read one at a time) and returns the command that moves it to
    /// `guest` as root, with the mode the recipe's id was made from. A file whose content is no
    /// longer what the id was made from stops the build.
    async fn copy_in(
        &self,
        sandbox: &str,
        step: usize,
        host: &str,
        guest: &str,
        listed: &HostFile,
    ) -> Result<String> {
        use sha2::Digest as _;
        use std::io::Read as _;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(host)
            .map_err(|err| Error::invalid(format!("--copy {host}: reading it: {err}")))?;
        let mut hasher = sha2::Sha256::new();
        let mut parts = 0usize;
        loop {
            let mut piece = Vec::with_capacity(MAX_WRITE);
            (&mut file)
                .take(MAX_WRITE as u64)
                .read_to_end(&mut piece)
                .map_err(|err| Error::invalid(format!("--copy {host}: reading it: {err}")))?;
            hasher.update(&piece);
            // An empty file is one empty part; otherwise a short piece is the last.
            let last = piece.len() < MAX_WRITE;
            if piece.is_empty() && parts > 0 {
                break;
            }
            // Numbered so that the shell's `*` lists them in order.
            let path = format!("{STEP_USER_DIR}/.dynocap-copy-{step}/{parts:08}");
            self.file(
                sandbox,
                FileOp::Write {
                    path,
                    content: piece,
                    mode: Some(0o600),
                    create_dirs: true,
                },
            )
            .await?;
            parts += 1;
            if last {
                break;
            }
        }
        let now: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if now != listed.sha256 {
            return Err(Error::conflict(format!(
                "--copy {host}:{guest}: {host} changed while the image was built; build again"
            )));
        }
        let mode = listed.mode;
        // The pieces by a pattern, not each by name: a large file has thousands, more than
        // one argument of `sh -c` may hold.
        let stage = quote(&format!("{STEP_USER_DIR}/.dynocap-copy-{step}"));
        let script = format!(
            "set -e; mkdir -p -- \"$(dirname -- {dest})\"; cat {stage}/* > {dest}; \
             rm -rf -- {stage}; chown 0:0 {dest}; chmod {mode:o} {dest}",
            dest = quote(guest),
        );
        Ok(as_root(&[], &script))
    }
}

/// What a copy step copies, as listed for the recipe's id.
enum Copied {
    Tree(Vec<TreeEntry>),
    File(HostFile),
}

impl Engine {
    /// Puts the host directory `host` (listed as `tree`) into the sandbox's `/tmp` as the
    /// sandbox user (the agent makes each entry without following a symlink; links are made
    /// as links, modes set once a directory is filled) and returns the command that makes it
    /// root's and copies it into `guest` as root. A file whose content is no longer what the
    /// recipe's id was made from stops the build.
    async fn copy_tree_in(
        &self,
        sandbox: &str,
        step: usize,
        host: &str,
        guest: &str,
        tree: &[TreeEntry],
    ) -> Result<String> {
        let stage = format!(".dynocap-copy-{step}");
        let at = |rel: &str| {
            if rel.is_empty() {
                stage.clone()
            } else {
                format!("{stage}/{rel}")
            }
        };
        let engine = self;
        let put = move |rel: String, item: PutItem| {
            engine.file(
                sandbox,
                FileOp::Put {
                    path: STEP_USER_DIR.to_owned(),
                    rel,
                    item,
                },
            )
        };
        let mut modes = Vec::new();
        for entry in tree {
            match entry {
                TreeEntry::Dir { rel, mode } => {
                    put(at(rel), PutItem::Dir { mode: None }).await?;
                    modes.push((at(rel), *mode));
                }
                TreeEntry::Symlink { rel, target } => {
                    put(
                        at(rel),
                        PutItem::Symlink {
                            target: target.clone(),
                        },
                    )
                    .await?;
                }
                TreeEntry::File {
                    rel, mode, sha256, ..
                } => {
                    use sha2::Digest as _;
                    use std::io::Read as _;
                    let path = Path::new(host).join(rel);
                    let (mut file, _) = recipe_layer::open_host_file(&path)?;
                    let mut hasher = sha2::Sha256::new();
                    let mut offset = 0u64;
                    loop {
                        let mut piece = Vec::with_capacity(MAX_WRITE);
                        (&mut file)
                            .take(MAX_WRITE as u64)
                            .read_to_end(&mut piece)
                            .map_err(|err| {
                                Error::invalid(format!("--copy: reading {}: {err}", path.display()))
                            })?;
                        hasher.update(&piece);
                        let last = piece.len() < MAX_WRITE;
                        let len = piece.len() as u64;
                        put(
                            at(rel),
                            PutItem::File {
                                content: piece,
                                offset,
                                mode: last.then_some(*mode),
                            },
                        )
                        .await?;
                        offset += len;
                        if last {
                            break;
                        }
                    }
                    let now: String = hasher
                        .finalize()
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect();
                    if now != *sha256 {
                        return Err(Error::conflict(format!(
                            "--copy {host}:{guest}: {} changed while the image was built; \
                             build again",
                            path.display()
                        )));
                    }
                }
            }
        }
        // Deepest first: a directory made read-only is already filled.
        for (rel, mode) in modes.into_iter().rev() {
            put(rel, PutItem::Dir { mode: Some(mode) }).await?;
        }
        // Owned by root before it is copied (links themselves, never what they point at),
        // then copied with modes and links as they are; a directory already at `guest` is
        // merged into, as Docker's COPY does.
        let staged = quote(&format!("{STEP_USER_DIR}/{stage}"));
        let script = format!(
            "set -e; mkdir -p -- {dest}; chown -hR 0:0 {staged}; cp -a {staged}/. {dest}/; \
             rm -rf -- {staged}",
            dest = quote(guest),
        );
        Ok(as_root(&[], &script))
    }
}

/// The build's bound: `timeout_seconds`, else [`RECIPE_TIMEOUT_DEFAULT`], refused (naming
/// `--timeout` and the range) outside [`RECIPE_TIMEOUT_MIN`] to [`RECIPE_TIMEOUT_MAX`].
pub fn recipe_timeout(timeout_seconds: Option<u64>) -> Result<u64> {
    check_range(
        crate::foundation::terms::Param::TimeoutSeconds,
        timeout_seconds.unwrap_or(RECIPE_TIMEOUT_DEFAULT),
        RECIPE_TIMEOUT_MIN,
        RECIPE_TIMEOUT_MAX,
    )
}

/// The build sandbox's TTL for a build bound of `timeout`: the bound plus [`LAYER_MARGIN`],
/// the margin cut to stay within a sandbox's longest life and the host's TTL ceiling
/// (`DYNOCAP_MAX_TTL_SECONDS`, `ceiling`). A bound above the ceiling itself is left for the
/// sandbox's admission to refuse, naming the variable.
fn sandbox_ttl(timeout: u64, ceiling: u64) -> u64 {
    timeout
        .saturating_add(LAYER_MARGIN)
        .min(TTL_MAX)
        .min(ceiling.max(timeout))
}

/// Refuses a build bound above the host's TTL ceiling (`DYNOCAP_MAX_TTL_SECONDS`, `ceiling`):
/// the build's sandbox lives at least that long ([`sandbox_ttl`]), and the sandbox's own
/// refusal would name its TTL, which a build is not given but derives from `--timeout`.
fn above_ttl_ceiling(timeout: u64, ceiling: u64) -> Result<()> {
    use crate::facade::ceilings::MAX_TTL_SECONDS;
    use crate::foundation::terms::Param;
    if timeout <= ceiling {
        return Ok(());
    }
    Err(Error::worded(
        crate::foundation::error::ErrorCode::PolicyDenied,
        |s| {
            format!(
                "the build's bound of {timeout} s ({} or `timeout =` in a --file recipe, \
                 default {RECIPE_TIMEOUT_DEFAULT}) is above the host's ceiling {ceiling} \
                 ({MAX_TTL_SECONDS}={ceiling}) on a sandbox's life, which its sandbox would \
                 need; give the build {} {ceiling} or less, or have the person running \
                 DynoCap raise {MAX_TTL_SECONDS}",
                s.param(Param::TimeoutSeconds),
                s.param(Param::TimeoutSeconds),
            )
        },
    ))
}

/// A step's exec timeout: what is left of the build's bound at `now`, whole seconds rounded
/// up (a step never gets less than it has), at least 1 (an exec's shortest).
fn step_timeout(deadline: std::time::Instant, now: std::time::Instant) -> u64 {
    let left = deadline.saturating_duration_since(now);
    let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    secs.max(1)
}

/// How a step that ran out of the build's time failed.
fn timed_out(step_seconds: u64, timeout: u64) -> String {
    format!("timed out after {step_seconds} s (what was left of the build's {timeout} s)")
}

/// What a build whose step timed out is told to do.
const TIMEOUT_FIX: &str = "; give the build more time with --timeout SECONDS (up to 86400, \
                           default 3600) or `timeout = SECONDS` in a --file recipe";

/// What a build whose step failed is told to do, if anything is clear: more time for one
/// that timed out; the network for an `--apt` step that apt-get failed (its code 100) in a
/// build without one, where it reached no mirror.
fn failure_fix(
    step: &Step,
    network: &str,
    timed_out: bool,
    exit_code: Option<i32>,
) -> &'static str {
    if timed_out {
        TIMEOUT_FIX
    } else if matches!(step, Step::Apt(_)) && network == "none" && exit_code == Some(100) {
        APT_OFFLINE_FIX
    } else {
        ""
    }
}

/// What a build whose `--apt` step failed without a network is told to do.
const APT_OFFLINE_FIX: &str = "; the steps ran with --network none (the default), so apt \
                               reached no mirror: give the build --network nat, or --network \
                               filtered with --allow-host @debian (or the base's mirror)";

fn check_step(step: &Step) -> Result<()> {
    match step {
        Step::Run(command) if command.trim().is_empty() => {
            Err(Error::invalid("--run: the command is empty"))
        }
        Step::Apt(packages) => {
            for package in packages {
                let ok = !package.is_empty()
                    && !package.starts_with('-')
                    && package
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+-.:=~_".contains(c));
                if !ok {
                    return Err(Error::invalid(format!(
                        "--apt {package:?}: not a Debian package name"
                    )));
                }
            }
            Ok(())
        }
        Step::Copy(host, guest) => {
            let host_path = Path::new(host);
            if !host_path.is_file() && !host_path.is_dir() {
                return Err(Error::invalid(format!(
                    "--copy {host}:{guest}: {host} is not a file or directory on this host"
                )));
            }
            let confined = guest.starts_with('/')
                && guest.len() > 1
                && !guest.contains('\0')
                && !guest.split('/').any(|c| c == "..")
                && !guest.ends_with('/');
            if !confined {
                return Err(Error::invalid(format!(
                    "--copy {host}:{guest}: the guest path must be an absolute path without \
                     '..' (and without a trailing '/')"
                )));
            }
            if let Some(own) = recipe_layer::in_dynocap_own(guest) {
                return Err(Error::invalid(format!(
                    "--copy {host}:{guest}: /{own} is DynoCap's own directory in every sandbox, \
                     which no image keeps: copy to another guest path"
                )));
            }
            Ok(())
        }
        Step::Env(key, _) => {
            let ok = !key.is_empty()
                && !key.starts_with(|c: char| c.is_ascii_digit())
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if ok {
                Ok(())
            } else {
                Err(Error::invalid(format!(
                    "--env {key}=…: not a variable name (letters, digits and '_')"
                )))
            }
        }
        Step::Run(_) => Ok(()),
    }
}

fn describe(step: &Step) -> String {
    match step {
        Step::Run(command) => format!("--run {command}"),
        Step::Apt(packages) => format!("--apt {}", packages.join(" ")),
        Step::Copy(host, guest) => format!("--copy {host}:{guest}"),
        Step::Env(key, value) => format!("--env {key}={value}"),
    }
}

/// `command` run by `sh` as the guest's root (the agent's `sudo` broker), with the recipe's
/// variables so far.
fn as_root(env: &[(String, String)], command: &str) -> String {
    let vars: Vec<String> = env
        .iter()
        .map(|(k, v)| quote(&format!("{k}={v}")))
        .collect();
    format!(
        "/usr/local/bin/sudo env {} sh -c {}",
        vars.join(" "),
        quote(command)
    )
}

/// One shell word.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_base_says_how_to_get_it() {
        let err = missing_base("host");
        assert_eq!(
            err.code,
            crate::foundation::error::ErrorCode::InvalidArgument
        );
        assert!(err.message.contains("host's own /usr"), "{err}");
        let err = missing_base("registry.example/team/base:1");
        assert!(
            err.message
                .contains("`dynocap image pull registry.example/team/base:1`"),
            "{err}"
        );
        assert!(missing_base("debian")
            .message
            .contains("`dynocap image build debian`"));
        assert!(missing_base("tool")
            .message
            .contains("pull, import or build"));
    }

    #[test]
    fn steps_are_checked_before_anything_runs() {
        assert!(check_step(&Step::Apt(vec!["jq".into(), "libssl3:amd64".into()])).is_ok());
        assert!(check_step(&Step::Apt(vec!["-o=evil".into()])).is_err());
        assert!(check_step(&Step::Apt(vec!["a;b".into()])).is_err());
        assert!(check_step(&Step::Env("PATH_2".into(), "x".into())).is_ok());
        assert!(check_step(&Step::Env("2X".into(), "x".into())).is_err());
        assert!(check_step(&Step::Copy("/etc/hostname".into(), "/a/../b".into())).is_err());
        assert!(check_step(&Step::Copy("/etc/hostname".into(), "rel".into())).is_err());
        // Where DynoCap keeps its own files, which no image holds: refused, not dropped.
        let err =
            check_step(&Step::Copy("/etc/hostname".into(), "/run/dynocap/x".into())).unwrap_err();
        assert!(
            err.message.contains("/run/dynocap is DynoCap's own"),
            "{err}"
        );
        assert!(check_step(&Step::Copy("/etc/hostname".into(), "/run/dynocap-x".into())).is_ok());
        assert!(check_step(&Step::Run(" ".into())).is_err());
    }

    #[test]
    fn the_build_timeout_defaults_and_is_range_checked() {
        assert_eq!(recipe_timeout(None).expect("default"), 3_600);
        assert_eq!(recipe_timeout(Some(60)).expect("min"), 60);
        assert_eq!(recipe_timeout(Some(86_400)).expect("max"), 86_400);
        for (bad, bound) in [
            (59, "below the minimum 60"),
            (86_401, "above the maximum 86400"),
        ] {
            let err = recipe_timeout(Some(bad)).expect_err("out of range");
            assert_eq!(
                err.code,
                crate::foundation::error::ErrorCode::InvalidArgument
            );
            assert!(err.message.contains(bound), "{err}");
            assert!(err.message.contains("from 60 to 86400"), "{err}");
        }
    }

    #[test]
    fn steps_share_the_build_bound_and_get_at_least_a_second() {
        use std::time::{Duration, Instant};
        let start = Instant::now();
        let deadline = start + Duration::from_secs(60);
        assert_eq!(step_timeout(deadline, start), 60);
        // The sandbox outlives the bound by the margin, within a day and the host's ceiling.
        assert_eq!(sandbox_ttl(60, 86_400), 960);
        assert_eq!(sandbox_ttl(86_000, 86_400), 86_400);
        assert_eq!(sandbox_ttl(3_600, 4_000), 4_000);
        assert_eq!(sandbox_ttl(3_600, 1_800), 3_600);
        // A bound above the ceiling is refused here, naming the bound's own parameter.
        assert!(above_ttl_ceiling(1_800, 1_800).is_ok());
        let err = above_ttl_ceiling(3_600, 1_800).unwrap_err();
        assert_eq!(err.code, crate::foundation::error::ErrorCode::PolicyDenied);
        assert!(
            err.message.contains("DYNOCAP_MAX_TTL_SECONDS=1800"),
            "{err}"
        );
        assert!(
            err.message.contains("timeout_seconds 1800 or less"),
            "{err}"
        );
        // A step after 2.5 s of others gets what is left, rounded up.
        assert_eq!(
            step_timeout(deadline, start + Duration::from_millis(2_500)),
            58
        );
        assert_eq!(step_timeout(deadline, deadline), 1);
        assert_eq!(step_timeout(deadline, deadline + Duration::from_secs(5)), 1);
        assert_eq!(
            timed_out(58, 60),
            "timed out after 58 s (what was left of the build's 60 s)"
        );
        assert!(TIMEOUT_FIX.contains(&format!("up to {RECIPE_TIMEOUT_MAX}")));
        assert!(TIMEOUT_FIX.contains(&format!("default {RECIPE_TIMEOUT_DEFAULT}")));
    }

    #[test]
    fn a_failed_step_is_told_the_fix_that_is_clear() {
        let apt = Step::Apt(vec!["jq".into()]);
        assert_eq!(failure_fix(&apt, "none", false, Some(100)), APT_OFFLINE_FIX);
        assert!(APT_OFFLINE_FIX.contains("--network nat"));
        // apt-get missing (127), or a network given: nothing to say about the network.
        assert_eq!(failure_fix(&apt, "none", false, Some(127)), "");
        assert_eq!(failure_fix(&apt, "nat", false, Some(100)), "");
        let run = Step::Run("apt-get update".into());
        assert_eq!(failure_fix(&run, "none", false, Some(100)), "");
        assert_eq!(failure_fix(&run, "none", true, None), TIMEOUT_FIX);
    }

    #[test]
    fn commands_are_quoted_as_one_word() {
        assert_eq!(
            as_root(&[("K".into(), "it's".into())], "echo 'x'"),
            r"/usr/local/bin/sudo env 'K=it'\''s' sh -c 'echo '\''x'\'''"
        );
    }
}
