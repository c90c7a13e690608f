//! The task subcommands (`task start|exec|diff|finish`) and `ls`/`rm`: engine calls plus
//! output a person can read — a progress bar while a project imports (on a terminal only),
//! flagged paths before the patch, colour only on a terminal.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use dynocap_engine::exec::sanitize_line;
use dynocap_engine::task_spec::{DiffResult, FinishResult, Progress, TaskInfo, TaskStartSpec};
use dynocap_engine::{Engine, Error};

use crate::cli::{RmArgs, TaskCommand, TaskStartArgs};
use crate::output::{print_json, sandbox_rows, table, SANDBOX_HEADERS};

pub async fn task(engine: &Engine, json: bool, command: TaskCommand) -> Result<ExitCode, Error> {
    match command {
        TaskCommand::Start(args) => start(engine, json, args).await,
        TaskCommand::Exec(args) => crate::commands::exec(engine, json, args, true).await,
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
            let result = engine.task_finish(&args.name).await?;
            if json {
                print_json(&result);
            } else {
                print_finish(&result);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
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
    let spec = TaskStartSpec::new(
        project,
        args.repository_url,
        args.history.as_deref(),
        args.name,
        args.network.as_deref(),
        args.ttl_seconds,
        args.cpus,
        args.memory_mb,
        args.disk_mb,
    )?;
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
    let started = engine.task_start(&spec, &report).await;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let info = started?;
    if json {
        print_json(&info);
    } else {
        print!("{}", table(TASK_HEADERS, &[task_row(&info)]));
        warn_skipped(engine, &info);
    }
    Ok(ExitCode::SUCCESS)
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
    println!("TASKS");
    print!("{}", table(TASK_HEADERS, &rows));
    for task in &listing.tasks {
        if let Some(note) = &task.note {
            println!(
                "  {}: {}",
                task.name.as_deref().unwrap_or(&task.id),
                sanitize_line(note, 1000)
            );
        }
    }
    println!("\nSANDBOXES");
    print!(
        "{}",
        table(SANDBOX_HEADERS, &sandbox_rows(&listing.sandboxes))
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn rm(engine: &Engine, json: bool, args: RmArgs) -> Result<ExitCode, Error> {
    if args.purge {
        if let Ok(task) = engine.task_info(&args.name) {
            if task.state == dynocap_engine::catalog::State::Unsaved {
                // Said before it happens: this is the one command that discards kept work.
                eprintln!(
                    "dynocap: discarding the unsaved work of task {} (its kept files in {}), as --purge asks",
                    task.name.as_deref().unwrap_or(&task.id),
                    engine.home().sandbox_dir(&task.id).display()
                );
            }
        }
    }
    let result = engine.rm(&args.name, args.force, args.purge).await?;
    if json {
        print_json(&result);
    } else {
        let mut said = Vec::new();
        if result.destroyed {
            said.push("ended the running task (patch and logs kept)".to_owned());
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
        println!(
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
    "ID", "NAME", "STATE", "FILES", "SKIPPED", "SOURCE", "EXPIRES",
];

fn task_row(task: &TaskInfo) -> Vec<String> {
    vec![
        task.id.clone(),
        task.name.clone().unwrap_or_else(|| "-".into()),
        task.state.as_str().to_owned(),
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
/// is guest data: on a terminal its control characters are shown escaped, never interpreted.
fn print_diff(diff: &DiffResult) {
    let colour = std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
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
            let kind = serde_json::to_value(p.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:<15} {}  {}",
                kind,
                escape(&p.path),
                escape(&p.reason)
            );
        }
    }
    let _ = writeln!(out);
    for line in diff.patch.lines() {
        let shown = if colour {
            escape(line)
        } else {
            line.to_owned()
        };
        let painted = match (colour, line.chars().next()) {
            (true, Some('+')) if !line.starts_with("+++") => format!("\x1b[32m{shown}\x1b[0m"),
            (true, Some('-')) if !line.starts_with("---") => format!("\x1b[31m{shown}\x1b[0m"),
            (true, Some('@')) => format!("\x1b[36m{shown}\x1b[0m"),
            (true, Some('d')) if line.starts_with("diff --git") => format!("\x1b[1m{shown}\x1b[0m"),
            _ => shown,
        };
        let _ = writeln!(out, "{painted}");
    }
}

fn print_finish(result: &FinishResult) {
    println!(
        "task {} {}",
        result.name.as_deref().unwrap_or(&result.id),
        result.state.as_str()
    );
    println!(
        "{} files changed, {} additions, {} deletions",
        result.files, result.additions, result.deletions
    );
    for p in &result.sensitive_paths {
        let kind = serde_json::to_value(p.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        println!(
            "  sensitive: {:<15} {}  {}",
            kind,
            escape(&p.path),
            escape(&p.reason)
        );
    }
    match &result.verify_error {
        None => println!("verified: the patch applies to the imported state"),
        Some(err) => println!("NOT verified: {}", escape(err)),
    }
    println!("patch:   {}", result.patch_path);
    println!("log:     {}", result.log_path);
    println!("summary: {}", result.summary_path);
    println!(
        "apply it in your project with: git apply {}",
        result.patch_path
    );
}

/// Shows control characters as escapes so guest text cannot drive the terminal.
fn escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() && c != '\t' {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escape_neutralises_terminal_sequences() {
        assert_eq!(escape("a\x1b[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(escape("tab\tok"), "tab\tok");
    }
}
