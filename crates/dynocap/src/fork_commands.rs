//! `task checkpoint|checkpoints|restore|fork`: a task's checkpoints and forks, as the engine's
//! `forks` makes them, printed for a person (or as JSON).

use std::process::ExitCode;

use dynocap_engine::forks::ForkSpec;
use dynocap_engine::spec::Network;
use dynocap_engine::{Engine, Error};

use crate::cli::{TaskCheckpointArgs, TaskForkArgs, TaskRestoreArgs};
use crate::output::{print_json, say, sayln, table};
use crate::terminal::neutralise;

pub async fn checkpoint(
    engine: &Engine,
    json: bool,
    args: TaskCheckpointArgs,
) -> Result<ExitCode, Error> {
    if args.delete {
        let label = args
            .label
            .ok_or_else(|| Error::invalid("--delete needs the LABEL of the checkpoint"))?;
        let left = engine.task_checkpoint_delete(&args.name, &label).await?;
        if json {
            print_json(&left);
        } else {
            sayln!(
                "checkpoint {label} of task {} deleted; {} left",
                args.name,
                left.len()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let started = std::time::Instant::now();
    let info = engine.task_checkpoint(&args.name, args.label).await?;
    if json {
        print_json(&info);
    } else {
        sayln!(
            "checkpoint {} of task {} made in {} ms ({})",
            info.label,
            args.name,
            started.elapsed().as_millis(),
            size(info.bytes)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn checkpoints(engine: &Engine, json: bool, name: &str) -> Result<ExitCode, Error> {
    let list = engine.task_checkpoints(name).await?;
    if json {
        print_json(&list);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|c| vec![c.label.clone(), c.created_at.clone(), size(c.bytes)])
        .collect();
    say!("{}", table(&["LABEL", "CREATED", "SIZE"], &rows));
    Ok(ExitCode::SUCCESS)
}

pub async fn restore(
    engine: &Engine,
    json: bool,
    args: TaskRestoreArgs,
) -> Result<ExitCode, Error> {
    let restored = engine.task_restore(&args.name, &args.label).await?;
    if json {
        print_json(&restored);
        return Ok(ExitCode::SUCCESS);
    }
    sayln!(
        "task {} restored to its checkpoint {}",
        args.name,
        restored.label
    );
    if restored.commands_ended > 0 {
        sayln!(
            "  {} running command(s) were ended",
            restored.commands_ended
        );
    }
    for job in &restored.jobs_ended {
        sayln!(
            "  job {} ({}) was ended after {}s",
            job.job,
            neutralise(&job.command),
            job.running_seconds
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn fork(engine: &Engine, json: bool, args: TaskForkArgs) -> Result<ExitCode, Error> {
    let spec = ForkSpec {
        name: Some(args.new_name),
        checkpoint: args.checkpoint,
        ttl_seconds: args.ttl_seconds,
        network: args.network.as_deref().map(Network::parse).transpose()?,
        allow_hosts: args.allow_hosts,
        live: args.live,
    };
    let started = std::time::Instant::now();
    let info = engine.task_fork(&args.name, &spec, &|_| {}).await?;
    if json {
        print_json(&info);
        return Ok(ExitCode::SUCCESS);
    }
    sayln!(
        "task {} ({}) forked{} from {}{} in {} ms; network {}, expires {}",
        info.name.as_deref().unwrap_or(&info.id),
        info.id,
        if spec.live {
            " live (its processes running)"
        } else {
            ""
        },
        args.name,
        spec.checkpoint
            .as_deref()
            .map(|label| format!(" at its checkpoint {label}"))
            .unwrap_or_default(),
        started.elapsed().as_millis(),
        info.network,
        info.expires_at
    );
    Ok(ExitCode::SUCCESS)
}

fn size(bytes: u64) -> String {
    if bytes >= 10 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes.div_ceil(1024))
    }
}
