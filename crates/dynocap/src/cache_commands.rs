//! `dynocap cache ls|rm`: the projects' package caches (pip, npm, cargo, go, apt) that tasks
//! of one project share, as the engine's `caches` lists and removes them.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use dynocap_engine::caches::CacheEntry;
use dynocap_engine::{Engine, Error};

use crate::output::{print_json, say, sayln, table};

#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// List the projects' package caches: project, size, last use, tasks.
    Ls,
    /// Remove a project's package cache (by id, project directory, repository URL or
    /// host/path, or a task's name), or every one with --all; refused while a running task
    /// has it.
    Rm(CacheRmArgs),
}

#[derive(Debug, Args)]
pub struct CacheRmArgs {
    /// The cache's id, a task of its project, or its project as `task start` takes it: a
    /// directory (relative or through a symlink too), or a repository (URL or host/path).
    #[arg(
        value_name = "PROJECT|ID|TASK",
        required_unless_present = "all",
        conflicts_with = "all"
    )]
    pub target: Option<String>,
    /// Remove every project's cache.
    #[arg(long)]
    pub all: bool,
}

pub fn cache(engine: &Engine, json: bool, command: CacheCommand) -> Result<ExitCode, Error> {
    match command {
        CacheCommand::Ls => {
            let caches = engine.caches()?;
            if json {
                print_json(&serde_json::json!({ "caches": caches }));
            } else {
                let rows: Vec<Vec<String>> = caches.iter().map(row).collect();
                say!("{}", table(HEADERS, &rows));
            }
        }
        CacheCommand::Rm(args) => {
            let removed = engine.cache_rm(args.target.as_deref())?;
            if json {
                print_json(&removed);
            } else if removed.removed.is_empty() {
                sayln!("no package caches to remove");
            } else {
                for cache in &removed.removed {
                    sayln!(
                        "removed the package cache of {} ({})",
                        project(cache),
                        size(cache.bytes)
                    );
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

const HEADERS: &[&str] = &["ID", "PROJECT", "SIZE", "LAST_USED", "TASKS"];

fn row(cache: &CacheEntry) -> Vec<String> {
    vec![
        cache.id.clone(),
        project(cache),
        size(cache.bytes),
        cache.last_used.clone().unwrap_or_else(|| "-".into()),
        if cache.tasks.is_empty() {
            "-".into()
        } else {
            cache.tasks.join(",")
        },
    ]
}

/// The project as a person reads it (control characters of a directory name made visible).
pub fn project(cache: &CacheEntry) -> String {
    dynocap_engine::exec::sanitize_line(
        cache.project.as_deref().unwrap_or("(unknown project)"),
        200,
    )
}

pub fn size(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}
