//! `dynocap job`: a sandbox's jobs (commands started with `--background`, or MCP execs that
//! outlived their call) listed, one shown or followed to its end, or killed. Job output is
//! guest data: it goes through the same neutraliser as `exec`'s on a terminal.

use std::process::ExitCode;
use std::time::Duration;

use dynocap_engine::control::OutputChannel;
use dynocap_engine::exec::sanitize_line;
use dynocap_engine::jobs::{JobQuery, JobReport, JobState};
use dynocap_engine::{Engine, Error};

use crate::cli::JobArgs;
use crate::exec_output::LiveOutput;
use crate::output::{print_json, say, table, warnln, Streams};

/// How long one poll of `--follow` waits for the job's end before printing what came.
const FOLLOW_POLL: Duration = Duration::from_millis(500);

/// The most of each stream one poll of `--follow` carries: it pages through the output, so
/// every byte is printed as it was, however much came between two polls.
const FOLLOW_PAGE: u64 = 1024 * 1024;

pub async fn job(engine: &Engine, json: bool, args: JobArgs) -> Result<ExitCode, Error> {
    let Some(id) = args.job else {
        if args.follow || args.kill {
            return Err(Error::invalid(
                "--follow and --kill need a job: dynocap job NAME JOB",
            ));
        }
        let jobs = engine.jobs(&args.name).await?;
        if json {
            print_json(&serde_json::json!({ "jobs": jobs.iter().map(plain).collect::<Vec<_>>() }));
        } else {
            let rows: Vec<Vec<String>> = jobs.iter().map(row).collect();
            say!(
                "{}",
                table(&["JOB", "STATE", "EXIT", "SECONDS", "COMMAND"], &rows)
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    // `--follow` prints every byte as it came (pages of it, base64 on the way); a look at
    // once prints the head and tail, as an exec's result does. `--json` prints the report.
    let paged = args.follow && !json;
    let mut query = JobQuery {
        job: id,
        kill: args.kill,
        page_bytes: if paged { FOLLOW_PAGE } else { 0 },
        ..JobQuery::default()
    };
    let streams = Streams::of_process();
    let live = LiveOutput::new(&streams, false);
    loop {
        let report = engine.job(&args.name, &query).await?;
        query.kill = false;
        // `--json` prints one report (with `--follow`, at the end): of the whole output, as
        // a look once the job ended gives it, so the offsets stay at its start.
        if !json {
            query.stdout_offset = report.stdout_offset;
            query.stderr_offset = report.stderr_offset;
        }
        if json && !args.follow {
            print_json(&plain(&report));
            return Ok(ExitCode::from(exit_code(&report)));
        }
        let mut more = false;
        if report.paged {
            use base64::Engine as _;
            for (channel, text) in [
                (OutputChannel::Stdout, &report.stdout),
                (OutputChannel::Stderr, &report.stderr),
            ] {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|err| Error::internal(format!("a job's page is not base64: {err}")))?;
                // A full page: more may be kept past it, read at once rather than waited for.
                more |= bytes.len() as u64 >= FOLLOW_PAGE;
                live.write(channel, &bytes);
            }
        } else if !json {
            live.write(OutputChannel::Stdout, report.stdout.as_bytes());
            live.write(OutputChannel::Stderr, report.stderr.as_bytes());
        }
        // `dynocap job … --follow | head`: nobody reads on; the job goes on, unfollowed.
        if args.follow && live.is_reader_gone() {
            return Ok(ExitCode::from(crate::exec_output::READER_GONE_EXIT));
        }
        if more {
            query.wait_ms = 0;
            continue;
        }
        if !args.follow || report.state != JobState::Running {
            live.finish();
            if json {
                print_json(&plain(&report));
            } else {
                print_state(&report);
                if let Some(result) = &report.result {
                    streams
                        .stderr()
                        .write_str(&crate::exec_output::refusal_notes(result));
                }
            }
            return Ok(ExitCode::from(exit_code(&report)));
        }
        query.wait_ms = u64::try_from(FOLLOW_POLL.as_millis()).unwrap_or(500);
    }
}

/// A report without the ended command's whole Exec object (its output is the report's).
fn plain(report: &JobReport) -> serde_json::Value {
    let mut report = report.clone();
    let result = report.result.take();
    let error = report.error.take();
    let mut value = serde_json::to_value(&report).unwrap_or_default();
    if let serde_json::Value::Object(fields) = &mut value {
        fields.insert(
            "running".into(),
            serde_json::json!(report.state == JobState::Running),
        );
        if let Some(err) = error {
            fields.insert("error".into(), serde_json::json!(err.message));
        }
        if let Some(result) = result {
            fields.insert("oomKilled".into(), serde_json::json!(result.oom_killed));
            // What the sandbox's network refused while the job ran, as an exec's result has.
            if !result.network_refusals.is_empty() {
                fields.insert(
                    "networkRefusals".into(),
                    serde_json::json!(result.network_refusals),
                );
            }
            if result.network_refusals_omitted > 0 {
                fields.insert(
                    "networkRefusalsOmitted".into(),
                    serde_json::json!(result.network_refusals_omitted),
                );
            }
        }
    }
    value
}

fn state_word(state: JobState) -> &'static str {
    match state {
        JobState::Running => "running",
        JobState::Exited => "exited",
        JobState::Killed => "killed",
        JobState::TimedOut => "timed out",
        JobState::Failed => "failed",
    }
}

fn row(report: &JobReport) -> Vec<String> {
    let exit = match (report.exit_code, &report.signal) {
        (Some(code), _) => code.to_string(),
        (None, Some(signal)) => signal.clone(),
        (None, None) => "-".to_owned(),
    };
    vec![
        report.job.clone(),
        state_word(report.state).to_owned(),
        exit,
        (report.duration_ms / 1000).to_string(),
        sanitize_line(&report.command, 60),
    ]
}

/// The job's state on stderr, after its output.
fn print_state(report: &JobReport) {
    let mut line = format!("dynocap: {} {}", report.job, state_word(report.state));
    match (report.exit_code, &report.signal) {
        (Some(code), _) => line.push_str(&format!(", exit code {code}")),
        (None, Some(signal)) => line.push_str(&format!(", signal {signal}")),
        (None, None) => {}
    }
    if let Some(err) = &report.error {
        line.push_str(&format!(": {}", err.message));
    }
    if report.truncated {
        line.push_str("; output was cut to its head and tail");
    }
    let dropped = report.stdout_dropped + report.stderr_dropped;
    if report.output_evicted {
        line.push_str(&format!(
            "; its output ({dropped} bytes) was dropped to make room for newer jobs' output \
             within the sandbox's 256 MiB of kept job output"
        ));
    } else if dropped > 0 {
        line.push_str(&format!(
            "; {dropped} bytes past the sandbox's bound on kept job output were dropped"
        ));
    }
    warnln!("{line}");
}

/// As `exec`'s: the job's exit code, 124 for its timeout, 128 + a signal; 0 while it runs.
fn exit_code(report: &JobReport) -> u8 {
    match report.state {
        JobState::Running => 0,
        JobState::TimedOut => 124,
        JobState::Failed => 1,
        JobState::Exited | JobState::Killed => match (report.exit_code, &report.signal) {
            (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
            (None, Some(signal)) => signal
                .parse::<nix::sys::signal::Signal>()
                .map_or(255, |s| u8::try_from(128 + s as i32).unwrap_or(255)),
            (None, None) => 1,
        },
    }
}
