//! The task subcommands (`task start|exec|diff|finish`) and `ls`/`rm`: engine calls plus
//! output a person can read — a progress bar while a project imports (on a terminal only),
//! flagged paths before the patch, colour only on a terminal.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::process::ExitCode;

use dynocap_engine::apply::ApplySpec;
use dynocap_engine::exec::sanitize_line;
use dynocap_engine::git_url::GitUrl;
use dynocap_engine::image::devcontainer::{self, AutoImage};
use dynocap_engine::import::ProjectDir;
use dynocap_engine::task_spec::{
    DiffResult, FinishResult, Progress, Source, TaskInfo, TaskStartSpec,
};
use dynocap_engine::{Engine, Error};

use crate::cli::{RmArgs, TaskApplyArgs, TaskCommand, TaskStartArgs};
use crate::output::{
    print_json, sandbox_notes, sandbox_rows, say, sayln, table, warnln, SANDBOX_HEADERS,
};

pub async fn task(engine: &Engine, json: bool, command: TaskCommand) -> Result<ExitCode, Error> {
    match command {
        TaskCommand::Start(args) => start(engine, json, args).await,
        TaskCommand::Exec(args) => {
            let code = crate::commands::exec(
                engine,
                json,
                &args.name,
                args.cwd.as_deref(),
                args.exec,
                true,
                &crate::output::Streams::of_process(),
            )
            .await?;
            Ok(ExitCode::from(code))
        }
        TaskCommand::Diff(args) => {
            let diff = engine.task_diff(&args.name).await?;
            if json {
                print_json(&diff);
            } else {
                print_diff(&diff);
            }
            Ok(ExitCode::SUCCESS)
        }
        TaskCommand::Finish(args) => {
            let result = engine
                .task_finish(&args.name, args.include_generated)
                .await?;
            if json {
                print_json(&result);
            } else {
                print_finish(&result);
            }
            Ok(ExitCode::SUCCESS)
        }
        TaskCommand::Apply(args) => apply(engine, json, args).await,
        TaskCommand::Checkpoint(args) => crate::fork_commands::checkpoint(engine, json, args).await,
        TaskCommand::Checkpoints(args) => {
            crate::fork_commands::checkpoints(engine, json, &args.name).await
        }
        TaskCommand::Restore(args) => crate::fork_commands::restore(engine, json, args).await,
        TaskCommand::Fork(args) => crate::fork_commands::fork(engine, json, args).await,
    }
}

async fn apply(engine: &Engine, json: bool, args: TaskApplyArgs) -> Result<ExitCode, Error> {
    let to = args
        .to
        .as_deref()
        .map(|path| {
            std::path::absolute(path)
                .map_err(|err| Error::invalid(format!("cannot resolve {}: {err}", path.display())))
        })
        .transpose()?;
    let spec = ApplySpec {
        target: args.name,
        branch: args.branch,
        accept_sensitive: args.accept_sensitive,
        to,
    };
    let applied = engine.task_apply(&spec).await?;
    if json {
        print_json(&applied);
        return Ok(ExitCode::SUCCESS);
    }
    sayln!(
        "task {} applied to {} on the new branch {}",
        escape(applied.name.as_deref().unwrap_or(&applied.id)),
        escape(&applied.repository),
        escape(&applied.branch)
    );
    sayln!(
        "commit {} (on {}), {} {} changed:",
        applied.commit,
        applied.base_commit,
        applied.files.len(),
        if applied.files.len() == 1 {
            "path"
        } else {
            "paths"
        }
    );
    for file in &applied.files {
        sayln!("  {}", escape(file));
    }
    for p in &applied.sensitive_paths_accepted {
        sayln!(
            "  sensitive, accepted: {:<18} {}  {}",
            p.kind.as_str(),
            escape(&p.path),
            escape(&p.reason)
        );
    }
    if !applied.generated.is_empty() {
        match (&applied.generated_patch_path, applied.generated_included) {
            (_, true) => {
                sayln!("generated files, committed (the task finished with --include-generated):")
            }
            (Some(path), false) => sayln!(
                "generated files, left out of the commit (their patch is {}):",
                escape(path)
            ),
            (None, false) => sayln!("generated files, left out of the commit:"),
        }
        say!("{}", generated_lines(&applied.generated));
    }
    sayln!(
        "your current branch and working tree are unchanged; see it with: git -C {} show {}",
        escape(&applied.repository),
        escape(&applied.branch)
    );
    Ok(ExitCode::SUCCESS)
}

async fn start(engine: &Engine, json: bool, args: TaskStartArgs) -> Result<ExitCode, Error> {
    let project = match (&args.path, &args.repository_url) {
        (Some(path), _) => {
            Some(std::path::absolute(path).map_err(|err| {
                Error::invalid(format!("cannot resolve {}: {err}", path.display()))
            })?)
        }
        (None, Some(_)) => None,
        (None, None) => Some(
            std::env::current_dir()
                .map_err(|err| Error::internal(format!("reading the working directory: {err}")))?,
        ),
    };
    // Parsed once, here: the engine clones this value, not the string.
    let repository_url = args
        .repository_url
        .as_deref()
        .map(GitUrl::parse)
        .transpose()?;
    let mut spec = TaskStartSpec::new(
        project,
        repository_url,
        args.history.as_deref(),
        args.name,
        args.network.as_deref(),
        args.ttl_seconds,
        args.cpus,
        args.memory_mb,
        args.disk_mb,
    )?;
    // Parsed: the URL's credentials need not stay where `ps` shows them.
    if let Source::RepositoryUrl(url) = &spec.source {
        if let Some(credentials) = url.credentials() {
            if let Err(err) = crate::scrub_args::blank(credentials.expose()) {
                warnln!(
                    "warning: the repository URL's credentials stay visible in this command's \
                     arguments (ps) while it runs: {err}"
                );
            }
        }
    }
    spec.allow_hosts = args.allow_hosts;
    let image_note = match args.image.as_deref() {
        Some(AUTO_IMAGE) => {
            let auto = auto_image(engine, &spec.source, args.pull).await?;
            spec.image = auto.image;
            auto.note
        }
        image => {
            let say = |line: &str| warnln!("{line}");
            crate::image_commands::pull_for_start(engine, image, args.pull, &say).await?;
            spec.image = args.image;
            None
        }
    };
    spec.backend = args.backend;
    spec.kernel = args.kernel;
    spec.no_cache = args.no_cache;
    let publish = args.publish.clone();
    Engine::check_publish(&publish)?;
    spec.ssh_key_path = args
        .ssh_key
        .map(|key| {
            std::path::absolute(&key)
                .map_err(|err| Error::invalid(format!("cannot resolve {}: {err}", key.display())))
        })
        .transpose()?;
    // Opened once, here: the supervisor imports through this descriptor (as the MCP server
    // does after its policy check), so the directory named now is the one that comes.
    let dir = match &spec.source {
        Source::ProjectPath(path) => Some(ProjectDir::open(path)?),
        Source::RepositoryUrl(_) => None,
        Source::RefusedUrl(text) => return Err(Source::refused(text)),
    };
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} ({eta})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar
    });
    let report = |progress: Progress| {
        if let Some(bar) = &bar {
            bar.set_message(progress.message);
            if let Some(total) = progress.total {
                bar.set_length(total);
            }
            bar.set_position(progress.done);
        }
    };
    // Watched from before the start begins, so that no Ctrl-C falls between.
    let mut ending = EndingSignals::watch()?;
    let started = tokio::select! {
        started = engine.task_start_in(&spec, dir, &report) => started,
        signal = ending.next() => {
            // Leaving the select drops the start, whose guard stops the supervisor with its
            // guest and removes the record and every file the start made.
            if let Some(bar) = &bar {
                bar.finish_and_clear();
            }
            warnln!("dynocap: the task start was cancelled ({signal}); nothing of it is left");
            return Ok(end_by(signal));
        }
    };
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let mut info = started?;
    info.image_note = image_note;
    let target = info.name.clone().unwrap_or_else(|| info.id.clone());
    info.forwards = engine.publish(&target, &publish).await?;
    if json {
        print_json(&info);
    } else {
        say!("{}", table(TASK_HEADERS, &[task_row(&info)]));
        say!(
            "{}",
            crate::port_commands::forward_lines(&target, &info.forwards)
        );
        warn_skipped(engine, &info);
        if let Some(note) = &info.image_note {
            warnln!("dynocap: image {}: {note}", info.image);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--image auto`: the project names its environment.
const AUTO_IMAGE: &str = "auto";

/// The image `--image auto` starts on: the one the project's devcontainer.json names, when
/// this host has it or can pull it (a reference in a registry `DYNOCAP_REGISTRIES` allows);
/// otherwise the default image, with the reason.
async fn auto_image(
    engine: &Engine,
    source: &Source,
    pull: crate::cli::PullWhen,
) -> Result<AutoImage, Error> {
    let Source::ProjectPath(path) = source else {
        return Ok(AutoImage {
            image: None,
            note: Some(
                "a task cloned from a repository URL has no project on this host to read a \
                 devcontainer.json from; the task runs on the default image"
                    .to_owned(),
            ),
            missing: None,
        });
    };
    let on_host: Vec<String> = engine.image_ls()?.into_iter().map(|i| i.name).collect();
    let auto = devcontainer::choose(path, &on_host);
    // --pull always: the project's image pulled again when it is a registry reference the
    // host has, so the task boots what the registry has now.
    let again = (pull == crate::cli::PullWhen::Always)
        .then_some(auto.image.as_deref())
        .flatten()
        .filter(|r| dynocap_engine::image::store::is_reference(r));
    let (reference, again) = match (auto.missing.as_deref(), again) {
        (Some(missing), _) => (missing, false),
        (None, Some(present)) => (present, true),
        (None, None) => return Ok(without_git_fallback(engine, auto)),
    };
    if !dynocap_engine::image::store::is_reference(reference) {
        return Ok(without_git_fallback(engine, auto));
    }
    if pull == crate::cli::PullWhen::Never {
        return Ok(AutoImage {
            note: Some(format!(
                "the project's devcontainer.json names the image {reference}, which this host \
                 does not have, and --pull never pulls nothing; the task runs on the default \
                 image"
            )),
            ..auto
        });
    }
    if again {
        warnln!(
            "dynocap: pulling {reference} again (--pull always), which the project's \
             devcontainer.json names"
        );
        let progress = |line: &str| warnln!("image pull: {line}");
        return Ok(
            match engine.image_pull_on_demand(reference, &progress).await {
                Ok(pulled) => without_git_fallback(
                    engine,
                    AutoImage {
                        image: Some(pulled.image.name().to_owned()),
                        note: Some(format!(
                            "the image {reference} that the project's devcontainer.json names, \
                         pulled again now"
                        )),
                        missing: None,
                    },
                ),
                Err(err) => AutoImage {
                    note: Some(format!(
                        "the image {reference} that the project's devcontainer.json names, as \
                     this host has it: pulling it again failed ({})",
                        err.message
                    )),
                    ..without_git_fallback(engine, auto)
                },
            },
        );
    }
    warnln!("dynocap: pulling {reference}, which the project's devcontainer.json names");
    let progress = |line: &str| warnln!("image pull: {line}");
    match engine.image_pull_on_demand(reference, &progress).await {
        Ok(pulled) => Ok(without_git_fallback(
            engine,
            AutoImage {
                image: Some(pulled.image.name().to_owned()),
                note: Some(format!(
                    "the image {reference} that the project's devcontainer.json names, pulled \
                     now"
                )),
                missing: None,
            },
        )),
        Err(err) => Ok(AutoImage {
            note: Some(format!(
                "the project's devcontainer.json names the image {reference}, which this host \
                 does not have and could not pull ({}); the task runs on the default image",
                err.message
            )),
            ..auto
        }),
    }
}

/// The project's image, unless it has no git, which a task needs: then the default image,
/// the note saying why (an image the user names with `--image` is refused instead).
fn without_git_fallback(engine: &Engine, auto: AutoImage) -> AutoImage {
    match &auto.image {
        Some(image) if engine.image_lacks_git(image) => AutoImage {
            image: None,
            note: Some(format!(
                "{}, has no git, which a task needs (its baseline is a git commit in the \
                 guest); the task runs on the default image",
                auto.note.as_deref().unwrap_or(image)
            )),
            missing: None,
        },
        _ => auto,
    }
}

/// The signals that end a command as they would end any process: Ctrl-C, `kill`, a closed
/// terminal. While watched, they no longer end the process at once, so a command can undo
/// what it started first.
struct EndingSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl EndingSignals {
    fn watch() -> Result<Self, Error> {
        use tokio::signal::unix::{signal, SignalKind};
        let watch = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|err| Error::internal(format!("watching for {name}: {err}")))
        };
        Ok(Self {
            interrupt: watch(SignalKind::interrupt(), "SIGINT")?,
            terminate: watch(SignalKind::terminate(), "SIGTERM")?,
            hangup: watch(SignalKind::hangup(), "SIGHUP")?,
        })
    }

    /// The first of them to come.
    async fn next(&mut self) -> nix::sys::signal::Signal {
        use nix::sys::signal::Signal;
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
            _ = self.hangup.recv() => Signal::SIGHUP,
        }
    }
}

/// Ends this process by `signal`, as it would have ended had the signal not been watched,
/// so that its parent (a shell) sees the same; should the signal not end it, the exit code a
/// shell gives such an end.
fn end_by(signal: nix::sys::signal::Signal) -> ExitCode {
    use nix::sys::signal::{raise, sigaction, SaFlags, SigAction, SigHandler, SigSet};
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: restoring the default disposition installs no handler of ours; nothing else in
    // this process depends on the runtime's handler any longer, as it ends here.
    unsafe {
        let _ = sigaction(signal, &default);
    }
    let _ = raise(signal);
    ExitCode::from(u8::try_from(128 + signal as i32).unwrap_or(u8::MAX))
}

/// Names, on stderr, the project paths that did not come as they are: the start succeeded,
/// but the copy the agent works on differs from the project there.
fn warn_skipped(engine: &Engine, task: &TaskInfo) {
    let skipped = &task.source.skipped;
    if skipped.is_empty() {
        return;
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "warning: {} {} of the project did not come into the task as {} on disk:",
        skipped.total,
        if skipped.total == 1 { "path" } else { "paths" },
        if skipped.total == 1 {
            "it is"
        } else {
            "they are"
        },
    );
    for path in &skipped.paths {
        let _ = writeln!(
            err,
            "  {:<15} {}  {}",
            path.kind.as_str(),
            escape(&path.path),
            path.reason
        );
    }
    let listed = u64::try_from(skipped.paths.len()).unwrap_or(u64::MAX);
    if skipped.total > listed {
        let _ = writeln!(
            err,
            "  ... and {} more, all listed in {}",
            skipped.total - listed,
            engine.home().supervisor_log(&task.id).display()
        );
    }
}

pub fn ls(engine: &Engine, json: bool) -> Result<ExitCode, Error> {
    let listing = engine.ls()?;
    if json {
        print_json(&listing);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = listing.tasks.iter().map(task_row).collect();
    sayln!("TASKS");
    say!("{}", table(TASK_HEADERS, &rows));
    for task in &listing.tasks {
        if let Some(origin) = &task.forked_from {
            sayln!(
                "  {}: forked from {}{}",
                escape(task.name.as_deref().unwrap_or(&task.id)),
                escape(&origin.task),
                origin
                    .checkpoint
                    .as_deref()
                    .map(|label| format!(" at its checkpoint {}", escape(label)))
                    .unwrap_or_default()
            );
        }
        if let Some(result) = &task.result {
            sayln!(
                "  {}: {} files changed, {}{}; results in {}",
                escape(task.name.as_deref().unwrap_or(&task.id)),
                result.files,
                if result.verified {
                    "verified"
                } else {
                    "NOT verified"
                },
                match result.sensitive_paths {
                    0 => String::new(),
                    n => format!(", {n} sensitive paths to review"),
                },
                result.results_dir
            );
        }
        if let Some(note) = &task.note {
            sayln!(
                "  {}: {}",
                task.name.as_deref().unwrap_or(&task.id),
                sanitize_line(note, 1000)
            );
        }
        say!(
            "{}",
            crate::output::job_lines(task.name.as_deref().unwrap_or(&task.id), &task.jobs)
        );
        say!(
            "{}",
            crate::port_commands::forward_lines(
                task.name.as_deref().unwrap_or(&task.id),
                &task.forwards
            )
        );
    }
    sayln!("\nSANDBOXES");
    say!(
        "{}{}",
        table(SANDBOX_HEADERS, &sandbox_rows(&listing.sandboxes)),
        sandbox_notes(&listing.sandboxes)
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn rm(engine: &Engine, json: bool, args: RmArgs) -> Result<ExitCode, Error> {
    if args.purge {
        if let Ok(task) = engine.task_info(&args.name) {
            if task.state == dynocap_engine::catalog::State::Unsaved {
                // Said before it happens: this is the one command that discards kept work.
                warnln!(
                    "dynocap: discarding the unsaved work of task {} (its kept files in {}), as --purge asks",
                    task.name.as_deref().unwrap_or(&task.id),
                    engine.home().sandbox_dir(&task.id).display()
                );
            }
        }
    }
    // The project's cache, known before the record that names it goes. The name is read as
    // a task's only: never as a cache's id or project, which `cache rm` also takes.
    let cache = if args.purge {
        engine.task_cache(&args.name).ok().flatten()
    } else {
        None
    };
    // The task's own name, as the cache lists its tasks.
    let this = engine
        .task_info(&args.name)
        .map(|t| t.name.unwrap_or(t.id))
        .unwrap_or_else(|_| args.name.clone());
    if let (true, Some(cache)) = (args.cache, &cache) {
        // Checked first, so a cache in use refuses the whole command, not half of it.
        let others: Vec<&String> = cache.in_use_by.iter().filter(|t| **t != this).collect();
        if !others.is_empty() {
            return Err(Error::conflict(format!(
                "the package cache of {} is in use by the running task(s) {}; finish them \
                 first, or rm --purge without --cache",
                crate::cache_commands::project(cache),
                others
                    .iter()
                    .map(|t| t.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    let result = engine.rm(&args.name, args.force, args.purge).await?;
    match &cache {
        Some(cache) if args.cache => {
            engine.cache_rm(Some(&cache.id))?;
            warnln!(
                "dynocap: removed the package cache of {} ({})",
                crate::cache_commands::project(cache),
                crate::cache_commands::size(cache.bytes)
            );
        }
        // The project's last task is gone; its cache stays for the next one, and says so.
        Some(cache) if cache.tasks.iter().all(|t| *t == this) => warnln!(
            "dynocap: the package cache of {} ({}, {}) stays for the project's next task; \
             `dynocap cache rm {}` removes it",
            crate::cache_commands::project(cache),
            crate::cache_commands::size(cache.bytes),
            cache.path,
            cache.id
        ),
        None if args.cache && result.purged => {
            warnln!("dynocap: the task's project has no package cache to remove")
        }
        _ => {}
    }
    if json {
        print_json(&result);
    } else {
        let mut said = Vec::new();
        // Purged, its patch and logs were saved and then deleted with its results.
        match (result.destroyed, result.purged) {
            (true, false) => said.push("ended the running task (patch and logs kept)".to_owned()),
            (true, true) => said.push("ended the running task".to_owned()),
            _ => {}
        }
        if let Some(name) = &result.released {
            said.push(format!("released the name {name}"));
        }
        if result.purged {
            said.push("deleted its record and results".to_owned());
        }
        if let Some(kept) = &result.kept_work {
            said.push(format!(
                "its unsaved work stays in {kept}: finish the task by its id to recover it, or rm --purge to discard it"
            ));
        }
        sayln!(
            "{}",
            if said.is_empty() {
                "nothing to do".to_owned()
            } else {
                said.join("; ")
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

const TASK_HEADERS: &[&str] = &[
    "ID", "NAME", "STATE", "BACKEND", "IMAGE", "FILES", "SKIPPED", "SOURCE", "EXPIRES",
];

fn task_row(task: &TaskInfo) -> Vec<String> {
    vec![
        task.id.clone(),
        task.name.clone().unwrap_or_else(|| "-".into()),
        task.state.as_str().to_owned(),
        task.backend.clone(),
        task.image.clone(),
        task.source.files.to_string(),
        task.source.skipped.total.to_string(),
        task.source
            .project_path
            .clone()
            .or_else(|| task.source.repository_url.clone())
            .unwrap_or_default(),
        task.expires_at.clone(),
    ]
}

/// The header as a list of flagged paths, then the patch (coloured on a terminal). The patch
/// is guest data: see [`patch_line`].
fn print_diff(diff: &DiffResult) {
    let colour = std::io::stdout().is_terminal();
    let mut out = String::new();
    let s = &diff.summary;
    let _ = writeln!(
        out,
        "{} files changed, {} additions, {} deletions",
        s.files, s.additions, s.deletions
    );
    if s.sensitive_paths.is_empty() {
        let _ = writeln!(out, "no sensitive paths");
    } else {
        let _ = writeln!(
            out,
            "sensitive paths (review these before applying the patch):"
        );
        for p in &s.sensitive_paths {
            let _ = writeln!(
                out,
                "  {:<18} {}  {}",
                p.kind.as_str(),
                escape(&p.path),
                escape(&p.reason)
            );
        }
    }
    if !diff.generated.is_empty() {
        let _ = writeln!(
            out,
            "generated files, not shown (task finish leaves them out unless --include-generated):"
        );
        out.push_str(&generated_lines(&diff.generated));
    }
    let _ = writeln!(out);
    for line in diff.patch.lines() {
        let shown = patch_line(line, colour);
        let painted = match (colour, line.chars().next()) {
            (true, Some('+')) if !line.starts_with("+++") => format!("\x1b[32m{shown}\x1b[0m"),
            (true, Some('-')) if !line.starts_with("---") => format!("\x1b[31m{shown}\x1b[0m"),
            (true, Some('@')) => format!("\x1b[36m{shown}\x1b[0m"),
            (true, Some('d')) if line.starts_with("diff --git") => format!("\x1b[1m{shown}\x1b[0m"),
            _ => shown,
        };
        let _ = writeln!(out, "{painted}");
    }
    say!("{out}");
}

/// One line of the patch as shown: its header lines (names) always escaped, its content lines
/// escaped on a terminal and exact otherwise (so that a pipe gets the real bytes).
fn patch_line(line: &str, terminal: bool) -> String {
    let content = matches!(line.as_bytes().first(), Some(b' ' | b'+' | b'-'))
        && !line.starts_with("+++ ")
        && !line.starts_with("--- ");
    if terminal || !content {
        escape(line)
    } else {
        line.to_owned()
    }
}

fn print_finish(result: &FinishResult) {
    sayln!(
        "task {} {}{}",
        escape(result.name.as_deref().unwrap_or(&result.id)),
        result.state.as_str(),
        if result.already_finished {
            " (it had already ended: this is the result it saved then)"
        } else {
            ""
        }
    );
    sayln!(
        "{} files changed, {} additions, {} deletions",
        result.files,
        result.additions,
        result.deletions
    );
    for p in &result.sensitive_paths {
        sayln!(
            "  sensitive: {:<18} {}  {}",
            p.kind.as_str(),
            escape(&p.path),
            escape(&p.reason)
        );
    }
    if let Some(err) = &result.verify_error {
        sayln!("NOT verified: {}", escape(err));
    } else {
        sayln!("verified: the patch applies to the imported state");
    }
    if !result.generated.is_empty() {
        match (&result.generated_patch_path, result.generated_included) {
            (_, true) => sayln!("generated files, kept in the patch (--include-generated):"),
            // Too late for --include-generated: the task's patch was saved when it ended.
            (Some(path), false) if result.already_finished => sayln!(
                "generated files, left out of the patch when the task ended (kept in {}; \
                 `git apply` it after the task's patch to have them):",
                escape(path)
            ),
            (Some(path), false) => sayln!(
                "generated files, left out of the patch (kept in {}; finish with \
                 --include-generated to keep them in):",
                escape(path)
            ),
            (None, false) => sayln!("generated files, left out of the patch:"),
        }
        say!("{}", generated_lines(&result.generated));
    }
    if !result.jobs_cut_off.is_empty() {
        sayln!("jobs cut off by the task's end:");
        for job in &result.jobs_cut_off {
            sayln!(
                "  {} (running {}s since {}): {}",
                job.job,
                job.running_seconds,
                job.started_at,
                sanitize_line(&job.command, 80)
            );
        }
    }
    for job in &result.jobs {
        let dropped = job.stdout_dropped + job.stderr_dropped;
        sayln!(
            "job {} output: {} and {}{}",
            job.job,
            escape(&job.stdout_path),
            escape(&job.stderr_path),
            match dropped {
                0 => String::new(),
                n => format!(" ({n} bytes past the sandbox's bound on job output were not kept)"),
            }
        );
    }
    sayln!("patch:   {}", escape(&result.patch_path));
    sayln!("log:     {}", escape(&result.log_path));
    sayln!("summary: {}", escape(&result.summary_path));
    sayln!("{}", next_step(result));
}

/// One line per group of generated files: `  __pycache__/ under pkg: 3 files, 12,345 bytes of patch`.
fn generated_lines(groups: &[dynocap_review::generated::GeneratedGroup]) -> String {
    let mut out = String::new();
    for group in groups {
        let _ = writeln!(
            out,
            "  {} under {}: {} {}, {} bytes of patch",
            escape(&group.pattern),
            escape(&group.under),
            group.files,
            if group.files == 1 { "file" } else { "files" },
            group.patch_bytes
        );
    }
    out
}

/// What to do with the patch: apply a verified one; inspect, never apply, an unverified one
/// (its summary may be incomplete: the host could not read all of it).
fn next_step(result: &FinishResult) -> String {
    let patch = escape(&result.patch_path);
    match result.verify_error {
        // `task apply` refuses an empty patch: no step to offer.
        None if result.files == 0 => "the task changed nothing to apply".to_owned(),
        None => format!(
            "apply it to a new branch of your project with: dynocap task apply {} (or by hand: \
             git apply {patch})",
            escape(result.name.as_deref().unwrap_or(&result.id))
        ),
        Some(_) => format!(
            "do not apply this patch: inspect it with less {patch} before doing anything with it"
        ),
    }
}

/// Shows guest text so that it cannot drive or deceive the terminal: control characters as
/// escapes (`\u{1b}`), bidirectional and invisible format characters as `<U+202E>`.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\t' {
            out.extend(c.escape_default());
        } else if is_invisible_format(c) {
            out.push_str(&format!("<U+{:04X}>", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// Characters a terminal renders as nothing or as a reordering of the text around them
/// (Trojan Source): bidi embeddings, overrides, isolates and marks, zero-width characters.
fn is_invisible_format(c: char) -> bool {
    matches!(c, '\u{00ad}' | '\u{061c}' | '\u{180e}' | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{206a}'..='\u{206f}' | '\u{feff}')
}

#[cfg(test)]
mod tests {
    use super::{escape, patch_line};

    #[test]
    fn patch_names_are_always_escaped_and_content_only_on_a_terminal() {
        let rlo = "\u{202e}";
        for header in [
            format!("diff --git a/x{rlo} b/x{rlo}"),
            format!("+++ b/x{rlo}"),
            format!("--- a/x{rlo}"),
            format!("rename to x{rlo}"),
        ] {
            for terminal in [true, false] {
                let shown = patch_line(&header, terminal);
                assert!(shown.ends_with("x<U+202E>"), "{shown}");
            }
        }
        let content = format!("+let x = 1; {rlo}// \x1b[2J");
        assert_eq!(patch_line(&content, false), content);
        assert_eq!(
            patch_line(&content, true),
            "+let x = 1; <U+202E>// \\u{1b}[2J"
        );
    }

    #[test]
    fn escape_neutralises_terminal_sequences() {
        assert_eq!(escape("a\x1b[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(escape("tab\tok"), "tab\tok");
        assert_eq!(escape("new\nline\r"), "new\\nline\\r");
        assert_eq!(escape("\u{9b}31m"), "\\u{9b}31m");
    }

    #[test]
    fn escape_shows_bidi_and_invisible_characters() {
        for c in ('\u{202a}'..='\u{202e}')
            .chain('\u{2066}'..='\u{2069}')
            .chain(['\u{200e}', '\u{200f}', '\u{061c}', '\u{200b}', '\u{feff}'])
        {
            let shown = escape(&format!("a{c}b"));
            assert_eq!(shown, format!("a<U+{:04X}>b", u32::from(c)));
        }
        assert_eq!(escape("café ✓ 日本"), "café ✓ 日本");
    }
}
