//! `dynocap doctor --repair`: rebuild a damaged, missing or empty catalog from the record
//! files, then mark what lost its supervisor meanwhile, as every command would, and report
//! every record with the state it now has. A healthy catalog is left as it is and the report
//! says so; running it again is always safe.

use std::path::PathBuf;
use std::process::ExitCode;

use dynocap_engine::catalog::{Catalog, Record};
use dynocap_engine::repair::RepairReport;
use dynocap_engine::{Config, Engine, Error, Home};
use serde::Serialize;

use crate::output::{fail, print_json, say, sayln, table, warnln};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    catalog: PathBuf,
    /// Whether a new catalog was built.
    repaired: bool,
    /// What was wrong; null when the catalog was healthy.
    damage: Option<String>,
    moved_aside: Vec<PathBuf>,
    /// Every record in the catalog, in the state it has after the repair.
    records: Vec<RecordRow>,
    /// Record files that could not be restored.
    skipped: Vec<Skipped>,
    /// Names that were bound in two record files; the newest record kept each.
    released_names: Vec<ReleasedName>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct RecordRow {
    id: String,
    kind: &'static str,
    name: Option<String>,
    state: &'static str,
    note: Option<String>,
}

#[derive(Debug, Serialize)]
struct Skipped {
    path: PathBuf,
    reason: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ReleasedName {
    id: String,
    name: String,
    kept_by: String,
}

pub fn run(json: bool, config: &Config) -> ExitCode {
    match repair(config) {
        Ok(report) => {
            if json {
                print_json(&report);
            } else {
                print_human(&report);
            }
            ExitCode::SUCCESS
        }
        Err(err) => fail(json, &err),
    }
}

fn repair(config: &Config) -> Result<Report, Error> {
    let home = Home::from_config(&config.home)?;
    let outcome = dynocap_engine::repair::repair(&home)?;
    let records = match reconcile(&home, config) {
        Ok(catalog) => current_states(&catalog, &outcome.records),
        Err(err) => {
            warnln!(
                "dynocap: the catalog is usable, but checking for sandboxes whose supervisor is \
                 gone failed ({err}); the next dynocap command checks again"
            );
            outcome.records.clone()
        }
    };
    Ok(report(outcome, &records))
}

/// The reconciliation every command runs: a live record whose supervisor is gone is marked
/// and its leftovers are removed.
fn reconcile(home: &Home, config: &Config) -> Result<Catalog, Error> {
    let catalog = Catalog::open(home)?;
    Engine::new(home.clone(), config.clone())?.reconcile(&catalog)?;
    Ok(catalog)
}

fn current_states(catalog: &Catalog, records: &[Record]) -> Vec<Record> {
    records
        .iter()
        .map(|record| {
            catalog
                .get(&record.id)
                .ok()
                .flatten()
                .unwrap_or_else(|| record.clone())
        })
        .collect()
}

fn report(outcome: RepairReport, records: &[Record]) -> Report {
    Report {
        repaired: outcome.repaired(),
        catalog: outcome.catalog,
        damage: outcome.damage,
        moved_aside: outcome.moved_aside,
        records: records
            .iter()
            .map(|r| RecordRow {
                id: r.id.clone(),
                kind: r.kind.as_str(),
                name: r.name.clone(),
                state: r.state.as_str(),
                note: r.note.clone(),
            })
            .collect(),
        skipped: outcome
            .skipped
            .into_iter()
            .map(|(path, reason)| Skipped { path, reason })
            .collect(),
        released_names: outcome
            .released_names
            .into_iter()
            .map(|(id, name, kept_by)| ReleasedName { id, name, kept_by })
            .collect(),
    }
}

fn print_human(report: &Report) {
    let catalog = report.catalog.display();
    let Some(damage) = &report.damage else {
        sayln!(
            "the catalog {catalog} is healthy ({}); nothing to repair",
            count(report.records.len(), "record")
        );
        return;
    };
    sayln!("the catalog {catalog} needed repair: {damage}");
    for (i, path) in report.moved_aside.iter().enumerate() {
        let label = if i == 0 { "moved aside:" } else { "" };
        sayln!("{label:<12} {}", path.display());
    }
    sayln!(
        "rebuilt from the record files: {}",
        count(report.records.len(), "record")
    );
    if !report.records.is_empty() {
        let rows: Vec<Vec<String>> = report
            .records
            .iter()
            .map(|r| {
                vec![
                    r.id.clone(),
                    r.kind.to_owned(),
                    r.name.clone().unwrap_or_else(|| "-".to_owned()),
                    r.state.to_owned(),
                    r.note.clone().unwrap_or_default(),
                ]
            })
            .collect();
        say!("{}", table(&["ID", "KIND", "NAME", "STATE", "NOTE"], &rows));
    }
    for released in &report.released_names {
        sayln!(
            "the name \"{}\" was bound in two record files: {} keeps it, {} was restored without it",
            released.name, released.kept_by, released.id
        );
    }
    if !report.skipped.is_empty() {
        sayln!(
            "{} could not be restored (left where they are):",
            count(report.skipped.len(), "record file")
        );
        for skipped in &report.skipped {
            sayln!("  {}: {}", skipped.path.display(), skipped.reason);
        }
    }
}

fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}
