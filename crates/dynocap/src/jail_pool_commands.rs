//! `dynocap jail-pool show|rm`: the home's reflink pool (`DYNOCAP_JAIL_POOL_MB`), the XFS
//! image loop-mounted on the home's `sandboxes/` so that jail checkpoints and forks on an
//! ext4 home clone: what it holds and how full it is, and its removal (refused while a
//! sandbox lives on it). Run on a home from `Home::without_pool`: looking at the pool, or
//! removing it, must not make or mount it first.

use std::process::ExitCode;

use dynocap_engine::jail_pool::JailPool;
use dynocap_engine::{Config, Engine, Error, Home};

use crate::cli::JailPoolCommand;
use crate::output::{print_json, sayln};

pub fn run(json: bool, command: &JailPoolCommand, config: &Config) -> ExitCode {
    match execute(json, command, config) {
        Ok(code) => code,
        Err(err) => crate::output::fail(json, &err),
    }
}

fn execute(json: bool, command: &JailPoolCommand, config: &Config) -> Result<ExitCode, Error> {
    let engine = Engine::new(Home::without_pool(&config.home)?, config.clone())?;
    match command {
        JailPoolCommand::Show => {
            let pool = engine.jail_pool()?;
            if json {
                print_json(&serde_json::json!({ "pool": pool }));
            } else {
                match &pool {
                    None => sayln!(
                        "no reflink pool in this home (DYNOCAP_JAIL_POOL_MB is unset; see \
                         docs/configuration.md)"
                    ),
                    Some(pool) => sayln!("{}", describe(pool)),
                }
            }
        }
        JailPoolCommand::Rm => {
            let removed = engine.jail_pool_rm()?;
            if json {
                print_json(&removed);
            } else if !removed.removed {
                sayln!("no reflink pool in this home: nothing to remove");
            } else {
                sayln!(
                    "removed the reflink pool {}{}: {} MB back to the home's filesystem{}",
                    removed.image.display(),
                    if removed.unmounted {
                        " (unmounted)"
                    } else {
                        ""
                    },
                    removed.freed_mb,
                    if removed.held_by.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " once {} end{}: they still have it mounted in mount namespaces of \
                             their own (supervisors that started while it was mounted)",
                            removed.held_by.join(", "),
                            if removed.held_by.len() == 1 { "s" } else { "" }
                        )
                    }
                );
                if removed.made_again {
                    sayln!(
                        "DYNOCAP_JAIL_POOL_MB is still set: the next start makes the pool again; \
                         unset it to keep the sandboxes on the home's own filesystem"
                    );
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The pool in a few lines, as `show` prints it.
pub fn describe(pool: &JailPool) -> String {
    let state = &pool.pool;
    let mut lines = vec![format!(
        "image:      {} ({})",
        state.image.display(),
        match state.image_mb {
            Some(mb) => format!("{mb} MB"),
            None => "not made yet: the next start makes it".to_owned(),
        }
    )];
    lines.push(format!(
        "configured: {}",
        match state.configured_mb {
            Some(mb) => format!("DYNOCAP_JAIL_POOL_MB={mb}"),
            None => "DYNOCAP_JAIL_POOL_MB is unset".to_owned(),
        }
    ));
    lines.push(format!(
        "mounted:    {}",
        if state.mounted {
            format!("yes, on {}", state.mountpoint.display())
        } else {
            "no".to_owned()
        }
    ));
    if let Some(room) = &state.room {
        lines.push(format!(
            "room:       {} MB used, {} MB free of {} MB ({}% used{})",
            room.used_mb,
            room.free_mb,
            room.size_mb,
            room.used_percent(),
            if room.nearly_full() {
                ", nearly full"
            } else {
                ""
            }
        ));
    }
    if state.mounted {
        let names: Vec<String> = pool
            .on_it
            .iter()
            .map(|s| match (&s.name, &s.kind) {
                (Some(name), Some(kind)) => format!("{name} ({kind}, {})", s.id),
                (None, Some(kind)) => format!("{} ({kind})", s.id),
                _ => format!("{} (no record)", s.id),
            })
            .collect();
        lines.push(format!(
            "sandboxes:  {}",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        ));
    }
    lines.join("\n")
}
