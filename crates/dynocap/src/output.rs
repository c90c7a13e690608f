//! How results reach a person (aligned tables) or a program (`--json`, CONTRACT.md objects),
//! and how errors are reported in either mode.

use std::ffi::OsString;
use std::process::ExitCode;

use dynocap_engine::{Error, SandboxInfo};
use serde::Serialize;

pub fn print_json<T: Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(err) => eprintln!("dynocap: cannot encode the result: {err}"),
    }
}

/// Reports an error: a JSON error object on stdout with `--json`, a readable line on stderr
/// otherwise. Always exits 1, so scripts can tell a refused call from a command's failure
/// only through `--json` (`dynocap exec` uses the command's own exit code on success).
/// The message is the command line's wording of it (`--ttl`, `dynocap task exec NAME`), not
/// the MCP one (`ttlSeconds`, `dynocap_task_exec`).
pub fn fail(json: bool, err: &Error) -> ExitCode {
    let message = err.cli_text();
    if json {
        print_json(&serde_json::json!({ "error": { "code": err.code, "message": message } }));
    }
    eprintln!("dynocap: {}: {message}", err.code.as_str());
    ExitCode::FAILURE
}

/// Reports a command line that does not parse. Help and version requests print as clap prints
/// them. An error is clap's own text without `--json`, and with it (anywhere before `--`) the
/// JSON error object on stdout, `invalid_argument` like every refused value. Exits 2 either
/// way, as clap does, so a usage error stands apart from a refused call (1).
pub fn argument_error(err: &clap::Error, args: &[OsString]) -> ExitCode {
    use clap::error::ErrorKind;
    let asked = matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    );
    let code = ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(2));
    if asked || !crate::cli::json_requested(args) {
        if let Err(print) = err.print() {
            eprintln!("dynocap: cannot print the usage message: {print}");
        }
        return code;
    }
    let message = crate::cli::explain(err, args);
    print_json(&serde_json::json!({ "error": { "code": "invalid_argument", "message": message } }));
    eprintln!("dynocap: invalid_argument: {message}");
    code
}

/// A left-aligned table with a header row.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&headers.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>());
    for row in rows {
        line(row);
    }
    out
}

pub fn sandbox_rows(sandboxes: &[SandboxInfo]) -> Vec<Vec<String>> {
    sandboxes
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.state.as_str().to_owned(),
                s.backend.clone(),
                s.image.clone(),
                s.network.clone(),
                s.cpus.to_string(),
                s.memory_mb.to_string(),
                s.disk_mb
                    .map_or_else(|| "-".to_owned(), |mb| mb.to_string()),
                s.expires_at.clone(),
            ]
        })
        .collect()
}

pub const SANDBOX_HEADERS: &[&str] = &[
    "NAME",
    "STATE",
    "BACKEND",
    "IMAGE",
    "NETWORK",
    "CPUS",
    "MEMORY_MB",
    "DISK_MB",
    "EXPIRES",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let out = table(&["A", "LONGER"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(out, "A    LONGER\nxyz  1\n");
    }
}
