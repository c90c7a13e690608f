//! `dynocap_checkpoint`, and `dynocap_task_start` with `fromTask`: a task's checkpoints and
//! forks over MCP. A fork's network and allowlist go through the same host policy as any
//! start's (`image_and_hosts`), so a fork is never wider than the host allows, whatever its
//! parent had.

use serde_json::{json, Value};

use dynocap_engine::forks::ForkSpec;
use dynocap_engine::spec::Network;
use dynocap_engine::Error;

use super::{Args, Output, ProgressFn, Refusal, Tools};

/// What a fork keeps of its parent, and so may not be given with `fromTask`.
const PARENTS_OWN_STRINGS: &[&str] = &[
    "projectPath",
    "repositoryUrl",
    "sshKeyPath",
    "history",
    "image",
];
const PARENTS_OWN_NUMBERS: &[&str] = &["cpus", "memoryMB", "diskMB"];

impl Tools {
    /// `dynocap_task_start` with `fromTask`.
    pub(super) async fn task_fork(
        &self,
        args: &Args<'_>,
        progress: ProgressFn<'_>,
    ) -> Result<Output, Error> {
        let tool = args.tool();
        let parent = args.required_string("fromTask")?;
        for name in PARENTS_OWN_STRINGS.iter().chain(PARENTS_OWN_NUMBERS) {
            let given = if PARENTS_OWN_NUMBERS.contains(name) {
                args.integer(name)?.is_some()
            } else {
                args.string(name)?.is_some()
            };
            if given {
                return Err(self.refuse(
                    tool,
                    Refusal::invalid_argument(
                        "fork.parents-own",
                        format!(
                            "{name} cannot go with fromTask: a fork keeps its parent's source, \
                             image and limits; give only name, network, allowHosts, ttlSeconds, \
                             checkpoint, live and publish"
                        ),
                    ),
                ));
            }
        }
        if args.boolean("noCache")?.is_some() {
            return Err(self.refuse(
                tool,
                Refusal::invalid_argument(
                    "fork.parents-own",
                    "noCache cannot go with fromTask: a fork has its parent's package caches, \
                     or none when the parent has none",
                ),
            ));
        }
        let network = match args.string("network")? {
            Some(network) => network,
            None => self.engine.task_info(&parent)?.network,
        };
        let chosen = self.image_and_hosts(args, &network).await?;
        let publish = self.publish(args)?;
        let spec = ForkSpec {
            name: args.string("name")?,
            checkpoint: args.string("checkpoint")?,
            ttl_seconds: args.integer("ttlSeconds")?,
            network: Some(Network::parse(&network)?),
            allow_hosts: chosen.allow_hosts,
            live: args.boolean("live")?.unwrap_or(false),
        };
        let mut info = self.engine.task_fork(&parent, &spec, progress).await?;
        let target = info.name.clone().unwrap_or_else(|| info.id.clone());
        info.forwards = self.engine.publish(&target, &publish).await?;
        Output::json(&info)
    }

    /// `dynocap_checkpoint`.
    pub(super) async fn checkpoint(&self, args: &Args<'_>) -> Result<Output, Error> {
        let name = args.required_string("name")?;
        let action = args
            .string("action")?
            .unwrap_or_else(|| "create".to_owned());
        let label = args.string("label")?;
        let needs_label = || {
            label.clone().ok_or_else(|| {
                Error::invalid(format!("action \"{action}\" needs the checkpoint's label"))
            })
        };
        let value = match action.as_str() {
            "create" => {
                let made = self.engine.task_checkpoint(&name, label.clone()).await?;
                json!({ "action": action, "checkpoint": made })
            }
            "list" => {
                let list = self.engine.task_checkpoints(&name).await?;
                json!({ "action": action, "checkpoints": list })
            }
            "delete" => {
                let left = self
                    .engine
                    .task_checkpoint_delete(&name, &needs_label()?)
                    .await?;
                json!({ "action": action, "checkpoints": left })
            }
            "restore" => {
                let restored = self.engine.task_restore(&name, &needs_label()?).await?;
                let mut value = serde_json::to_value(&restored)
                    .map_err(|err| Error::internal(format!("cannot encode the result: {err}")))?;
                if let Value::Object(fields) = &mut value {
                    fields.insert("action".into(), json!(action));
                }
                value
            }
            other => {
                return Err(Error::invalid(format!(
                    "action {other:?} is not create, restore, list or delete"
                )))
            }
        };
        Ok(Output {
            text: value.to_string(),
            structured: value,
        })
    }
}
