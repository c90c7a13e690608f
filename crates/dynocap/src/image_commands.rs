//! `dynocap image build|import|ls|inspect|rm`: the CLI face of the engine's image store. A build
//! shows a spinner with mmdebstrap's current stage on a terminal and plain lines otherwise
//! (an import, its layers), and a Ctrl-C (or SIGTERM) stops either cleanly: nothing
//! half-made stays behind.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dynocap_engine::image::build::{short, Origin};
use dynocap_engine::image_admin::ImageInfo;
use dynocap_engine::{Engine, Error};

use crate::cli::{ImageBuildArgs, ImageCommand, ImageImportArgs, ImagePullArgs, PullWhen};
use crate::output::{print_json, say, sayln, table, warnln};

pub async fn image(engine: Engine, json: bool, command: ImageCommand) -> Result<ExitCode, Error> {
    match command {
        ImageCommand::Build(args) => {
            let recipe = args.from.is_some()
                || args.file.is_some()
                || !(args.run.is_empty()
                    && args.apt.is_empty()
                    && args.copy.is_empty()
                    && args.env.is_empty());
            if recipe {
                build_recipe(engine, json, &args).await
            } else {
                build(engine, json, args.name).await
            }
        }
        ImageCommand::Import(args) => import(engine, json, args).await,
        ImageCommand::Pull(args) => pull(engine, json, args).await,
        ImageCommand::Ls => {
            let images = engine.image_ls()?;
            if json {
                print_json(&serde_json::json!({ "images": images }));
            } else {
                let rows: Vec<Vec<String>> = images.iter().map(row).collect();
                say!("{}", table(HEADERS, &rows));
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Inspect(args) => {
            let image = engine.image_inspect(&args.name)?;
            if json {
                print_json(&serde_json::json!({ "image": image }));
            } else {
                say!("{}", inspect_text(&image));
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Rm(args) => {
            let removed = engine.image_rm(&args.name).await?;
            if json {
                print_json(&serde_json::json!({ "removed": removed }));
            } else {
                sayln!("removed image {} ({})", removed.name, short(&removed.id));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

const HEADERS: &[&str] = &[
    "NAME", "ID", "SIZE", "SHARED", "CREATED", "KERNEL", "USED_BY", "SOURCE",
];

fn row(image: &ImageInfo) -> Vec<String> {
    vec![
        image.name.clone(),
        short(&image.id).to_owned(),
        format!("{:.0} MiB", image.size_bytes as f64 / (1024.0 * 1024.0)),
        format!("{:.0} MiB", image.shared_bytes as f64 / (1024.0 * 1024.0)),
        image.created.clone(),
        image.kernel.clone().unwrap_or_else(|| "-".into()),
        if image.used_by.is_empty() {
            "-".into()
        } else {
            image.used_by.join(",")
        },
        source_text(image),
    ]
}

fn source_text(image: &ImageInfo) -> String {
    match &image.source {
        Some(source) => described_source(source),
        None => "built".into(),
    }
}

/// `image inspect` for a person: one `key: value` line each, the config's lists as JSON
/// arrays (as the image's own config spells them).
fn inspect_text(image: &ImageInfo) -> String {
    let mut lines = vec![
        ("name", image.name.clone()),
        ("id", image.id.clone()),
        ("created", image.created.clone()),
        ("size", format!("{} bytes", image.size_bytes)),
        ("kernel", image.kernel.clone().unwrap_or_else(|| "-".into())),
        ("source", source_text(image)),
        (
            "used by",
            if image.used_by.is_empty() {
                "-".into()
            } else {
                image.used_by.join(", ")
            },
        ),
        ("path", image.path.clone()),
    ];
    let list = |items: &Option<Vec<String>>| {
        items
            .as_ref()
            .map(|items| serde_json::to_string(items).unwrap_or_default())
    };
    if let Some(config) = &image.config {
        let fields = [
            ("env (applied)", list(&config.env)),
            ("working dir (raw sandboxes)", config.working_dir.clone()),
            ("user (commands run as sandbox)", config.user.clone()),
            ("entrypoint (not run)", list(&config.entrypoint)),
            ("cmd (not run)", list(&config.cmd)),
        ];
        lines.extend(
            fields
                .into_iter()
                .filter_map(|(key, value)| value.map(|v| (key, v))),
        );
    }
    let mut text = String::new();
    for (key, value) in lines {
        // Image config values are the image author's text: no terminal control reaches it.
        let value: String = value.chars().filter(|c| !c.is_control()).collect();
        text.push_str(&format!("{key}: {value}\n"));
    }
    text
}

/// Sets the returned flag on Ctrl-C or SIGTERM (until the returned task is aborted), so a
/// long image operation stops cleanly instead of dying half-way.
fn cancel_on_signal() -> Result<(Arc<AtomicBool>, tokio::task::JoinHandle<()>), Error> {
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|err| Error::internal(format!("watching for SIGTERM: {err}")))?;
    let watcher = tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        flag.store(true, Ordering::SeqCst);
    });
    Ok((cancel, watcher))
}

async fn import(engine: Engine, json: bool, args: ImageImportArgs) -> Result<ExitCode, Error> {
    let (cancel, watcher) = cancel_on_signal()?;
    let limits = dynocap_engine::image::unpack::Limits {
        max_bytes: args.max_bytes,
        max_files: args.max_files,
    };
    let imported = tokio::task::spawn_blocking(move || {
        let progress = |line: &str| warnln!("image import: {line}");
        engine
            .image_import(&args.path, args.name.as_deref(), limits, &progress, &cancel)
            .map(|imported| (imported, engine))
    })
    .await
    .map_err(|err| Error::internal(format!("the image import thread failed: {err}")))?;
    watcher.abort();
    let (imported, engine) = imported?;
    let image = &imported.image;
    if json {
        let info = engine.image_ls()?.into_iter().find(|i| i.id == image.id());
        print_json(&serde_json::json!({
            "image": info,
            "origin": if imported.present { "present" } else { "imported" },
            "stats": imported.stats,
        }));
    } else {
        let stats = &imported.stats;
        sayln!(
            "image {} ({}) {}: {}",
            image.name(),
            short(image.id()),
            if imported.present {
                "already imported"
            } else {
                "imported"
            },
            image.rootfs().display()
        );
        if stats.devices_skipped > 0 || stats.setid_cleared > 0 {
            sayln!(
                "left out {} device nodes and fifos; cleared set-id bits on {} files",
                stats.devices_skipped,
                stats.setid_cleared
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// An image's origin for `image ls`: the reference it was pulled by and its manifest digest,
/// or the file it was imported from.
fn described_source(source: &dynocap_engine::image::store::ImageSource) -> String {
    if source.is_registry() {
        let digest = source.manifest_digest.as_deref().unwrap_or_default();
        let digest = digest.get(..19).unwrap_or(digest);
        format!("pulled {} ({digest})", source.path)
    } else if source.is_recipe() {
        format!("built from {}", source.path)
    } else {
        format!("imported {} ({})", source.path, source.format)
    }
}

/// A recipe build: every line of the steps' output on stderr as it comes, the result on
/// stdout.
async fn build_recipe(
    engine: Engine,
    json: bool,
    args: &ImageBuildArgs,
) -> Result<ExitCode, Error> {
    let request = crate::recipe_file::request(args)?;
    let say = |line: &str| warnln!("image build {}: {line}", request.name);
    let on_output = |_channel, data: &[u8]| {
        use std::io::Write as _;
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(data);
        let _ = err.flush();
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|err| Error::internal(format!("watching for SIGTERM: {err}")))?;
    let built = tokio::select! {
        built = engine.image_build_recipe(&request, &say, &on_output) => built?,
        // Interrupted: the build sandbox goes now rather than at the end of its TTL (a
        // half-made image directory is removed by the next build of the name).
        _ = async {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        } => {
            let _ = engine.destroy(&request.sandbox).await;
            return Err(Error::conflict("the image build was stopped; nothing was kept"));
        }
    };
    let image = &built.image;
    if json {
        let info = engine.image_ls()?.into_iter().find(|i| i.id == image.id());
        print_json(&serde_json::json!({
            "image": info,
            "origin": if built.present { "present" } else { "built" },
        }));
    } else if built.present {
        sayln!(
            "image {} ({}) is up to date: its recipe was built already",
            image.name(),
            short(image.id())
        );
    } else {
        sayln!("image {} ({}) built", image.name(), short(image.id()));
    }
    Ok(ExitCode::SUCCESS)
}

/// Pulls the image a start boots (`run` or `task start --image`, else `DYNOCAP_IMAGE`) first
/// when `when` says so:
/// a registry reference this host lacks (`missing`), or one it may have (`always`), as
/// `dynocap image pull REF` would, its progress lines to `say` (the command's stderr). A name
/// that is no reference (a built or imported image, `host`) is never pulled; `never` leaves a
/// missing image to the start, which says how to pull it. A registry `DYNOCAP_REGISTRIES`
/// does not allow fails the pull, naming the variable. The pull is the on-demand one (no
/// signal handler of its own: `run` may be served by a long-lived process, whose signals are
/// not the command's); one stopped half-way resumes from its blobs on the next.
pub async fn pull_for_start(
    engine: &Engine,
    image: Option<&str>,
    when: PullWhen,
    say: &(dyn Fn(&str) + Sync),
) -> Result<(), Error> {
    // No --image: the one the start boots by default (DYNOCAP_IMAGE), pulled alike.
    let default;
    let image = match image {
        Some(image) => image,
        None => {
            default = engine.config().images.default_name();
            default.as_str()
        }
    };
    let reference = dynocap_engine::image::store::is_reference(image);
    if when == PullWhen::Always && !reference {
        return Err(Error::invalid(format!(
            "--pull always needs --image to be a registry reference \
             (registry.example/repo:tag); \"{}\" is an image of this host's own: leave \
             --pull out to start on it",
            dynocap_engine::image::oci::printable(image)
        )));
    }
    if !reference || when == PullWhen::Never {
        return Ok(());
    }
    let present = match engine.image_inspect(image) {
        Ok(_) => true,
        Err(err) if err.code == dynocap_engine::ErrorCode::NotFound => false,
        Err(err) => return Err(err),
    };
    if present && when == PullWhen::Missing {
        return Ok(());
    }
    if present {
        say(&format!("dynocap: pulling {image} again (--pull always)"));
    } else {
        say(&format!(
            "dynocap: pulling {image}, which this host does not have (--pull missing)"
        ));
    }
    let progress = |line: &str| say(&format!("image pull: {line}"));
    let pulled = engine
        .image_pull_on_demand(image, &progress)
        .await
        .map_err(|err| {
            let why = if present {
                "pulling it again failed"
            } else {
                "this host does not have it and pulling it failed"
            };
            Error::new(err.code, format!("--image {image}: {why}: {}", err.message))
        })?;
    say(&format!(
        "dynocap: {image} is {} ({})",
        if pulled.present {
            "up to date"
        } else {
            "pulled"
        },
        short(pulled.image.id())
    ));
    Ok(())
}

async fn pull(engine: Engine, json: bool, args: ImagePullArgs) -> Result<ExitCode, Error> {
    let credentials = match (&args.username, args.password_stdin) {
        (Some(username), true) => Some(dynocap_engine::image::pull::Credentials {
            username: username.clone(),
            password: dynocap_engine::image::pull::read_password(std::io::stdin().lock())?,
        }),
        _ => None,
    };
    let (cancel, watcher) = cancel_on_signal()?;
    let limits = dynocap_engine::image::unpack::Limits {
        max_bytes: args.max_bytes,
        max_files: args.max_files,
    };
    let progress = |line: &str| warnln!("image pull: {line}");
    let pulled = engine
        .image_pull(
            &args.reference,
            args.name.as_deref(),
            credentials,
            limits,
            &progress,
            &cancel,
        )
        .await;
    watcher.abort();
    let pulled = pulled?;
    let image = &pulled.image;
    if json {
        let info = engine.image_ls()?.into_iter().find(|i| i.id == image.id());
        print_json(&serde_json::json!({
            "image": info,
            "origin": if pulled.present { "present" } else { "pulled" },
            "stats": pulled.stats,
            "transfer": pulled.transfer,
        }));
    } else {
        let t = &pulled.transfer;
        sayln!(
            "image {} ({}) {}: {} blobs downloaded ({} bytes), {} layers already stored",
            image.name(),
            short(image.id()),
            if pulled.present {
                "already pulled"
            } else {
                "pulled"
            },
            t.blobs_downloaded,
            t.bytes_downloaded,
            t.layers_present
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn build(engine: Engine, json: bool, name: String) -> Result<ExitCode, Error> {
    let cancel = Arc::new(AtomicBool::new(false));
    // From here a Ctrl-C no longer kills this process: the build sees the flag, stops
    // mmdebstrap (its own process group) and removes its temporary directory.
    let watcher = {
        let cancel = Arc::clone(&cancel);
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|err| Error::internal(format!("watching for SIGTERM: {err}")))?;
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            cancel.store(true, Ordering::SeqCst);
        })
    };
    let flag = Arc::clone(&cancel);
    let built = tokio::task::spawn_blocking(move || {
        let spinner = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            bar.set_message(format!("building image {name}"));
            bar
        });
        let progress = |line: &str| match &spinner {
            Some(bar) => bar.set_message(format!("{name}: {line}")),
            None => warnln!("image build {name}: {line}"),
        };
        let outcome = engine.image_build(&name, &progress, &flag);
        if let Some(bar) = &spinner {
            bar.finish_and_clear();
        }
        outcome.map(|outcome| (outcome, engine))
    })
    .await
    .map_err(|err| Error::internal(format!("the image build thread failed: {err}")))?;
    watcher.abort();
    let (outcome, engine) = built?;
    let image = &outcome.image;
    if json {
        let info = engine.image_ls()?.into_iter().find(|i| i.id == image.id());
        print_json(&serde_json::json!({
            "image": info,
            "origin": match outcome.origin {
                Origin::Present => "present",
                Origin::Cache => "cache",
                Origin::Built => "built",
            },
        }));
    } else {
        let how = match outcome.origin {
            Origin::Present => "already built",
            Origin::Cache => "copied from the image cache",
            Origin::Built => "built",
        };
        sayln!(
            "image {} ({}) {how}: {}",
            image.name(),
            short(image.id()),
            image.rootfs().display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
