//! What each tool does: parse its arguments, apply the host policy, call the engine and
//! shape the result as docs/mcp.md says (`structuredContent` plus the same JSON as text; the
//! diff's text is its header line, a newline and the patch). SDK-free, so the MCP SDK can
//! change without touching the tools.

use std::path::PathBuf;

use serde_json::{json, Map, Value};

use std::time::Duration;

use dynocap_engine::catalog::Kind;
use dynocap_engine::jobs::{JobQuery, JobReport, JobState};
use dynocap_engine::spec::{ExecSpec, OutputEncoding, RunSpec, EXEC_OUTPUT_MCP_DEFAULT};
use dynocap_engine::task_spec::{Progress, Source, TaskStartSpec};
use dynocap_engine::{Engine, Error, ExecResult};
use dynocap_review::diff_view::{self, Selection};

use super::args::Args;
use super::log::Log;
pub use super::output::Output;
use super::policy::{HostImages, Policy, Refusal};
use super::tools::{definitions, ToolDef};

mod forks;

/// The progress callback the engine calls during long steps.
pub type ProgressFn<'a> = &'a (dyn Fn(Progress) + Send + Sync);

/// The tools, the policy they obey and the engine they drive.
pub struct Tools {
    engine: Engine,
    policy: Policy,
    log: Log,
    defs: Vec<ToolDef>,
    /// How long an exec call waits for its command before answering with its job.
    wait_bound: Duration,
}

/// The server's wait bound unless `DYNOCAP_MCP_WAIT_SECONDS` sets another: below the 60 s
/// request timeout common MCP clients keep whatever progress arrives.
pub const WAIT_SECONDS_DEFAULT: u64 = 45;

impl Tools {
    pub fn new(engine: Engine, policy: Policy, log: Log) -> Self {
        Self {
            engine,
            policy,
            log,
            defs: definitions(),
            wait_bound: Duration::from_secs(WAIT_SECONDS_DEFAULT),
        }
    }

    /// Exec calls answer with their job once `wait_bound` passes.
    pub fn with_wait_bound(mut self, wait_bound: Duration) -> Self {
        self.wait_bound = wait_bound;
        self
    }

    pub fn definitions(&self) -> &[ToolDef] {
        &self.defs
    }

    pub fn find(&self, name: &str) -> Option<&ToolDef> {
        self.defs.iter().find(|t| t.name == name)
    }

    /// Runs one call of `tool`. Dropping the future cancels the call (the engine's futures
    /// are cancel-safe: an exec is killed, a start leaves nothing behind).
    pub async fn call(
        &self,
        tool: &ToolDef,
        arguments: Option<Map<String, Value>>,
        progress: ProgressFn<'_>,
    ) -> Result<Output, Error> {
        let args = Args::new(tool, arguments)?;
        match tool.name {
            "dynocap_task_start" if args.string("fromTask")?.is_some() => {
                self.task_fork(&args, progress).await
            }
            "dynocap_task_start" => self.task_start(&args, progress).await,
            "dynocap_checkpoint" => self.checkpoint(&args).await,
            "dynocap_task_exec" => {
                let name = args.required_string("name")?;
                let spec = exec_spec(&args, "/workspace")?;
                self.exec_job(Kind::Task, &name, &spec, &args, progress)
                    .await
            }
            "dynocap_diff" => {
                let target = args.required_string("target")?;
                let selection = Selection {
                    paths: args.string_list("paths")?,
                    stat: args.boolean("stat")?.unwrap_or(false),
                };
                let diff = self.engine.task_diff(&target).await?;
                let view = diff_view::view(&diff.patch, diff_view::DEFAULT_SHOWN_BYTES, &selection);
                let mut header = serde_json::to_value(&diff.summary)
                    .map_err(|err| Error::internal(format!("cannot encode the diff: {err}")))?;
                if let Value::Object(fields) = &mut header {
                    fields.insert("changes".into(), json!(view.changes));
                    fields.insert("omittedFiles".into(), json!(view.omitted));
                    if !diff.generated.is_empty() {
                        fields.insert("generated".into(), json!(diff.generated));
                    }
                }
                let text = format!("{header}\n{}", view.patch);
                if let Value::Object(fields) = &mut header {
                    fields.insert("patch".into(), Value::String(view.patch));
                }
                Ok(Output {
                    structured: header,
                    text,
                })
            }
            "dynocap_task_finish" => {
                let id = args.required_string("id")?;
                let include_generated = args.boolean("includeGenerated")?.unwrap_or(false);
                Output::json(&self.engine.task_finish(&id, include_generated).await?)
            }
            "dynocap_ls" => Output::json(&self.engine.ls()?),
            "dynocap_rm" => {
                let target = args.required_string("target")?;
                let force = args.boolean("force")?.unwrap_or(false);
                let purge = args.boolean("purge")?.unwrap_or(false);
                Output::json(&self.engine.rm(&target, force, purge).await?)
            }
            "dynocap_run" => {
                // Malformed input is invalid_argument before any host rule is applied.
                let mut spec = RunSpec::raw(
                    &args.required_string("name")?,
                    args.string("network")?.as_deref(),
                    args.integer("ttlSeconds")?,
                    args.integer("cpus")?,
                    args.integer("memoryMB")?,
                    args.integer("diskMB")?,
                )?;
                let choice = self.image_and_hosts(&args, spec.network.as_str()).await?;
                if choice.auto_asked {
                    return Err(Error::invalid(
                        "image \"auto\" (the image a project's devcontainer.json names) is for \
                         dynocap_task_start with a projectPath; name an image here",
                    ));
                }
                spec.image = choice.image;
                spec.allow_hosts = choice.allow_hosts;
                let publish = self.publish(&args)?;
                // The pool is refilled once the client has its answer (see `refills_pool`).
                let mut info = self.engine.run_leaving_pool(&spec).await?;
                info.forwards = self.engine.publish(&info.name, &publish).await?;
                Output::json(&info)
            }
            "dynocap_exec" => {
                let name = args.required_string("name")?;
                let spec = exec_spec(&args, "/")?;
                self.exec_job(Kind::Raw, &name, &spec, &args, progress)
                    .await
            }
            "dynocap_job" => {
                let name = args.required_string("name")?;
                let wait = args.integer("waitSeconds")?.unwrap_or(0);
                let query = JobQuery {
                    job: args.required_string("job")?,
                    wait_ms: Duration::from_secs(wait)
                        .min(self.wait_bound)
                        .as_millis()
                        .try_into()
                        .unwrap_or(u64::MAX),
                    stdout_offset: args.integer("stdoutOffset")?.unwrap_or(0),
                    stderr_offset: args.integer("stderrOffset")?.unwrap_or(0),
                    kill: args.boolean("kill")?.unwrap_or(false),
                    page_bytes: 0,
                };
                let mut report = self.engine.job(&name, &query).await?;
                if let Some(result) = report.result.as_deref_mut() {
                    self.spell_fixes(result);
                }
                job_output(report)
            }
            "dynocap_ps" => Output::json(&json!({ "sandboxes": self.engine.ps()? })),
            "dynocap_destroy" => {
                let name = args.required_string("name")?;
                Output::json(&json!({ "destroyed": self.engine.destroy(&name).await? }))
            }
            "dynocap_read_file" | "dynocap_write_file" | "dynocap_edit_file"
            | "dynocap_list_files" => super::files::call(&self.engine, &args).await,
            "dynocap_port" => {
                let name = args.required_string("name")?;
                let call = super::ports::PortCall::parse(&args)?;
                if matches!(call, super::ports::PortCall::Open(_)) {
                    self.enforce(tool, self.policy.check_publish())?;
                }
                call.run(&self.engine, &name).await
            }
            other => Err(Error::internal(format!(
                "tool {other} has no implementation"
            ))),
        }
    }

    /// Whether a call of `tool` that ended so leaves the warm pool to refill after its reply
    /// ([`Tools::refill_pool`]): a `run` that succeeded gave a pool sandbox, or its new one
    /// took room under the ceilings.
    pub fn refills_pool(tool: &ToolDef, succeeded: bool) -> bool {
        tool.name == "dynocap_run" && succeeded
    }

    /// Blocks until the sandboxes have been quiet for a moment (see
    /// `Engine::wait_for_lull`): the refill then does not run beside the client's next calls.
    pub fn wait_for_lull(&self) {
        self.engine.wait_for_lull();
    }

    /// Tops the warm pool up again (if there is one). Failures are logged by the engine; the
    /// next start tries again.
    pub async fn refill_pool(&self) {
        self.engine.rebalance_pool().await;
    }

    async fn task_start(&self, args: &Args<'_>, progress: ProgressFn<'_>) -> Result<Output, Error> {
        let tool = args.tool();
        if args.string("checkpoint")?.is_some() {
            return Err(self.refuse(
                tool,
                Refusal::invalid_argument(
                    "fork.checkpoint",
                    "checkpoint names a checkpoint of the task given as fromTask; give fromTask too",
                ),
            ));
        }
        if args.boolean("live")? == Some(true) {
            return Err(self.refuse(
                tool,
                Refusal::invalid_argument(
                    "fork.live",
                    "live is for a fork (it keeps the running processes of the task given as \
                     fromTask); give fromTask too",
                ),
            ));
        }
        let project_path = args.string("projectPath")?;
        let repository_url = args.string("repositoryUrl")?;
        let ssh_key = args.string("sshKeyPath")?;
        // Malformed input first (invalid_argument), then the host rules (policy_denied).
        if let Some(raw) = &project_path {
            if !raw.starts_with('/') {
                return Err(self.refuse(
                    tool,
                    Refusal::invalid_argument(
                        "roots.absolute",
                        format!(
                            "projectPath {raw:?} must be an absolute host path, such as /srv/app"
                        ),
                    ),
                ));
            }
        }
        let exclusive = match (&project_path, &repository_url) {
            (Some(_), Some(_)) => Some("give either projectPath or repositoryUrl, not both"),
            (None, None) => {
                Some("give projectPath (a local project directory) or repositoryUrl (a git URL)")
            }
            _ => None,
        };
        if let Some(message) = exclusive {
            return Err(self.refuse(tool, Refusal::invalid_argument("source.exclusive", message)));
        }
        if ssh_key.is_some() && project_path.is_some() {
            return Err(self.refuse(
                tool,
                Refusal::invalid_argument(
                    "ssh-key.source",
                    "sshKeyPath only applies to cloning a repositoryUrl, not to a projectPath",
                ),
            ));
        }
        // Parsed once, by the policy that judges it, and the spec is built from the result:
        // the engine clones this very value. (So a refused URL is reported before a
        // malformed value of the other arguments.)
        let repository_url = repository_url
            .as_deref()
            .map(|raw| self.enforce(tool, self.policy.check_repository_url(raw)))
            .transpose()?;
        let mut spec = TaskStartSpec::new(
            project_path.as_ref().map(PathBuf::from),
            repository_url,
            args.string("history")?.as_deref(),
            args.string("name")?,
            args.string("network")?.as_deref(),
            args.integer("ttlSeconds")?,
            args.integer("cpus")?,
            args.integer("memoryMB")?,
            args.integer("diskMB")?,
        )?;
        let choice = self.image_and_hosts(args, spec.network.as_str()).await?;
        spec.image = choice.image;
        spec.allow_hosts = choice.allow_hosts;
        spec.no_cache = args.boolean("noCache")?.unwrap_or(false);
        let mut project = None;
        if let Some(raw) = &project_path {
            // The engine imports through the very descriptor checked here, not a path.
            let dir = self.enforce(tool, self.policy.check_project_path(raw))?;
            spec.source = Source::ProjectPath(dir.path().to_path_buf());
            project = Some(dir);
        }
        if let Some(raw) = &ssh_key {
            spec.ssh_key_path = Some(self.enforce(tool, self.policy.check_ssh_key(raw))?);
        }
        let mut image_note = None;
        if let (Some(dir), true) = (&project, choice.project_chooses) {
            let (image, note) = self.project_image(dir.path(), choice.auto_asked).await;
            spec.image = image;
            image_note = note;
        } else if project.is_none() && choice.auto_asked {
            // Asked for, the reason it could not be had is in the result, as for a project.
            image_note = Some(
                "a task cloned from repositoryUrl has no project on this host to read a \
                 devcontainer.json from; the task runs on the server's default image"
                    .to_owned(),
            );
        }
        let publish = self.publish(args)?;
        let mut info = self.engine.task_start_in(&spec, project, progress).await?;
        info.image_note = image_note;
        let target = info.name.clone().unwrap_or_else(|| info.id.clone());
        info.forwards = self.engine.publish(&target, &publish).await?;
        Output::json(&info)
    }

    /// A start's `publish`: parsed strictly, allowed by the host policy, and checked against
    /// the host's ports before anything boots.
    fn publish(
        &self,
        args: &Args<'_>,
    ) -> Result<Vec<dynocap_engine::ports::ForwardRequest>, Error> {
        let publish = super::ports::publish_requests(args)?;
        if !publish.is_empty() {
            self.enforce(args.tool(), self.policy.check_publish())?;
            Engine::check_publish(&publish)?;
        }
        Ok(publish)
    }

    /// The images on this host now (`dynocap image ls`, oldest first): one built after the
    /// server started is offered too.
    fn host_images(&self) -> Result<HostImages, Error> {
        Ok(HostImages::from_listing(
            self.engine.image_ls()?.into_iter().map(|image| {
                let built = image.built_here();
                (image.name, built)
            }),
        ))
    }

    /// Pulls an image reference that `DYNOCAP_MCP_IMAGES` allows and the host lacks, as
    /// `dynocap image pull` would: only from `DYNOCAP_REGISTRIES`, with the server user's
    /// Docker config for credentials.
    async fn pull_on_demand(&self, reference: &str) -> Result<(), Error> {
        let progress = |line: &str| tracing::info!("image pull: {line}");
        self.engine
            .image_pull_on_demand(reference, &progress)
            .await
            .map(|_| ())
    }

    /// The image a task start with no `image` (or `image: "auto"`) runs on: the one the
    /// project's devcontainer.json names, where `DYNOCAP_MCP_IMAGES` offers it (pulled on
    /// demand as a named one would be); else the server's default, and why (`imageNote`).
    /// A project without a devcontainer.json says nothing unless `auto` was asked for.
    async fn project_image(
        &self,
        project: &std::path::Path,
        asked: bool,
    ) -> (Option<String>, Option<String>) {
        use dynocap_engine::image::devcontainer;
        let on_host = match self.host_images() {
            Ok(images) => images,
            Err(err) => return (None, Some(format!("cannot list the host's images: {err}"))),
        };
        if !asked && matches!(devcontainer::read(project), Ok(None)) {
            return (None, None);
        }
        let auto = devcontainer::choose(project, &on_host.names);
        let Some(wanted) = auto.image.clone().or_else(|| auto.missing.clone()) else {
            return (None, auto.note);
        };
        let image = match self.policy.check_image(&wanted, &on_host) {
            Ok(image) => image,
            Err(refusal) => {
                self.log.warn(format_args!(
                    "the project's devcontainer.json names an image the policy refuses: {refusal}"
                ));
                return (
                    None,
                    Some(format!(
                        "the project's devcontainer.json names the image {wanted}, which this \
                         server does not offer: {}; the task runs on the server's default image",
                        refusal.message
                    )),
                );
            }
        };
        if on_host.contains(&image) {
            return self.unless_without_git(image, auto.note);
        }
        if !dynocap_engine::image::store::is_reference(&image) {
            return (None, auto.note);
        }
        match self.pull_on_demand(&image).await {
            Ok(()) => {
                let note = format!(
                    "the image {image} that the project's devcontainer.json names, pulled now"
                );
                self.unless_without_git(image, Some(note))
            }
            Err(err) => (
                None,
                Some(format!(
                    "the project's devcontainer.json names the image {image}, which could not \
                     be pulled ({}); the task runs on the server's default image",
                    err.message
                )),
            ),
        }
    }

    /// The project's image and its note, unless the image has no git, which a task needs:
    /// then the server's default image, the note saying why (an `image` the caller names is
    /// refused instead).
    fn unless_without_git(
        &self,
        image: String,
        note: Option<String>,
    ) -> (Option<String>, Option<String>) {
        if !self.engine.image_lacks_git(&image) {
            return (Some(image), note);
        }
        (
            None,
            Some(format!(
                "the project's devcontainer.json names the image {image}, which has no git, \
                 which a task needs (its baseline is a git commit in the guest); the task runs \
                 on the server's default image"
            )),
        )
    }

    /// A start's `image` and `allowHosts` and its `network`, judged by the host policy:
    /// malformed values first (`invalid_argument`), then the host's rules (`policy_denied`).
    async fn image_and_hosts(&self, args: &Args<'_>, network: &str) -> Result<Chosen, Error> {
        let tool = args.tool();
        let image = args.string("image")?;
        // No image, or `auto`: a task's project may name its own (see `project_image`).
        let auto_asked = image.as_deref() == Some(AUTO_IMAGE);
        let project_chooses = image.is_none() || auto_asked;
        let image = image.filter(|_| !auto_asked);
        if let Some(raw) = &image {
            self.enforce(tool, Policy::check_image_shape(raw))?;
        }
        let hosts = args.string_list("allowHosts")?.unwrap_or_default();
        let hosts = self.enforce(tool, self.policy.parse_allow_hosts(network, &hosts))?;
        self.enforce(tool, self.policy.check_network(network))?;
        let allow_hosts = self.enforce(tool, self.policy.check_allow_hosts(&hosts))?;
        let image = match image {
            Some(raw) => {
                // What `dynocap image ls` lists now: an image built after the server started
                // is offered too.
                let on_host = self.host_images()?;
                let image = self.enforce(tool, self.policy.check_image(&raw, &on_host))?;
                if !on_host.contains(&image) && dynocap_engine::image::store::is_reference(&image) {
                    self.pull_on_demand(&image).await?;
                }
                Some(image)
            }
            None => None,
        };
        Ok(Chosen {
            image,
            allow_hosts,
            project_chooses,
            auto_asked,
        })
    }

    /// Runs an exec as a job: its Exec object when it ends within the server's wait bound
    /// (at once with `background`), else `running: true` with its job id and output so far.
    async fn exec_job(
        &self,
        kind: Kind,
        name: &str,
        spec: &ExecSpec,
        args: &Args<'_>,
        progress: ProgressFn<'_>,
    ) -> Result<Output, Error> {
        let wait = match args.boolean("background")?.unwrap_or(false) {
            true => Duration::ZERO,
            false => self.wait_bound,
        };
        let mut report = self
            .engine
            .exec_job(kind, name, spec, wait, Some(progress))
            .await?;
        if let Some(err) = report.error.take() {
            return Err(err);
        }
        match report.result.take() {
            Some(result) if report.state != JobState::Running => self.exec_output(*result),
            _ => {
                let mut value = job_value(report)?;
                if let Value::Object(fields) = &mut value {
                    // The Exec object's own fields, for clients that check its schema.
                    for key in ["state", "command", "startedAt"] {
                        fields.remove(key);
                    }
                    fields.insert("timedOut".into(), json!(false));
                    fields.insert("oomKilled".into(), json!(false));
                }
                Ok(Output {
                    text: value.to_string(),
                    structured: value,
                })
            }
        }
    }

    /// An exec result as an MCP caller reads it: a refusal that adding its host to the
    /// allowlist would lift says what does that from here. A sandbox's allowlist is fixed when
    /// it starts, so either way it is a new sandbox that reaches the host: one the caller
    /// starts with `allowHosts` when `DYNOCAP_MCP_EGRESS_ALLOW` covers the host, else after
    /// the person running the server changed its environment.
    fn exec_output(&self, mut result: ExecResult) -> Result<Output, Error> {
        self.spell_fixes(&mut result);
        Output::json(&result)
    }

    /// The `fix` of each refusal in `result`, as an MCP caller can act on it (see
    /// [`Self::exec_output`]): for an exec's result and an ended job's alike. A registry's
    /// host (pypi.org) is fixed by the registry (`@pypi`) when the server's list covers all
    /// of it; when it covers the host alone, by the host, saying what the rest needs.
    fn spell_fixes(&self, result: &mut ExecResult) {
        let callable = |wanted: String| {
            self.policy
                .parse_allow_hosts("filtered", &[wanted])
                .and_then(|parsed| self.policy.check_allow_hosts(&parsed))
                .is_ok()
        };
        for refusal in &mut result.network_refusals {
            if refusal.fix.is_none() {
                continue;
            }
            let entry = dynocap_engine::exec::AllowEntry::for_host(&refusal.host);
            let registry = entry.to_string() != refusal.host;
            refusal.fix = Some(if callable(entry.to_string()) {
                format!(
                    "start a new sandbox with allowHosts: [\"{entry}\"] (dynocap_run, \
                     dynocap_task_start): the host's DYNOCAP_MCP_EGRESS_ALLOW allows it{}",
                    entry.note()
                )
            } else if registry && callable(refusal.host.clone()) {
                format!(
                    "start a new sandbox with allowHosts: [\"{host}\"] (dynocap_run, \
                     dynocap_task_start): the host's DYNOCAP_MCP_EGRESS_ALLOW allows it, but \
                     not all of {entry}; for the whole registry, the person running this MCP \
                     server can add {entry} to DYNOCAP_MCP_EGRESS_ALLOW{}",
                    entry.note(),
                    host = refusal.host,
                )
            } else {
                format!(
                    "the person running this MCP server can allow it: add {entry} to \
                     DYNOCAP_MCP_EGRESS_ALLOW in the server's environment (then start a new \
                     sandbox with allowHosts: [\"{entry}\"]), or to DYNOCAP_EGRESS_ALLOW (every \
                     filtered sandbox started after that reaches it){}",
                    entry.note()
                )
            });
        }
    }

    /// Passes an allowed value through; logs and converts a refusal.
    fn enforce<T>(&self, tool: &ToolDef, checked: Result<T, Refusal>) -> Result<T, Error> {
        checked.map_err(|refusal| self.refuse(tool, refusal))
    }

    fn refuse(&self, tool: &ToolDef, refusal: Refusal) -> Error {
        self.log
            .warn(format_args!("policy refused {}: {refusal}", tool.name));
        refusal.into_error()
    }
}

/// A job report as `dynocap_job` returns it (docs/mcp.md, "Job").
fn job_output(report: JobReport) -> Result<Output, Error> {
    let value = job_value(report)?;
    Ok(Output {
        text: value.to_string(),
        structured: value,
    })
}

/// A job report's JSON: `running`, and the ended command's `oomKilled`, disk error and
/// network refusals instead of its whole Exec object (its output is the report's); an error as its message.
fn job_value(mut report: JobReport) -> Result<Value, Error> {
    let result = report.result.take();
    let error = report.error.take();
    let mut value = serde_json::to_value(&report)
        .map_err(|err| Error::internal(format!("cannot encode the job: {err}")))?;
    if let Value::Object(fields) = &mut value {
        fields.insert("running".into(), json!(report.state == JobState::Running));
        if let Some(err) = error {
            fields.insert("error".into(), json!(err.message));
        }
        if let Some(result) = result {
            fields.insert("oomKilled".into(), json!(result.oom_killed));
            if let Some(disk) = result.disk_error {
                fields.insert("diskError".into(), json!(disk));
            }
            // What the sandbox's network refused while the job ran, as in an Exec object.
            if !result.network_refusals.is_empty() {
                fields.insert("networkRefusals".into(), json!(result.network_refusals));
            }
            if result.network_refusals_omitted > 0 {
                fields.insert(
                    "networkRefusalsOmitted".into(),
                    json!(result.network_refusals_omitted),
                );
            }
        }
    }
    Ok(value)
}

/// What the policy let a start have beyond its resources.
struct Chosen {
    /// `None`: the server's default image (`DYNOCAP_IMAGE`, else `host`).
    image: Option<String>,
    allow_hosts: Vec<String>,
    /// No `image` was given, or `auto`: a task's project may choose.
    project_chooses: bool,
    /// `image: "auto"` was given: say why the project's image is not used even when the
    /// project names none.
    auto_asked: bool,
}

/// The `image` that asks for the image a task's project names (its devcontainer.json).
const AUTO_IMAGE: &str = "auto";

fn exec_spec(args: &Args<'_>, default_cwd: &str) -> Result<ExecSpec, Error> {
    let command = args.required_string("command")?;
    let cwd = args.string("cwd")?;
    let encoding = match args.string("outputEncoding")? {
        Some(value) => OutputEncoding::parse(&value)?,
        None => OutputEncoding::Utf8,
    };
    ExecSpec::new(
        &command,
        cwd.as_deref(),
        default_cwd,
        args.string_map("env")?,
        args.integer("timeoutSeconds")?,
        args.boolean("terminal")?.unwrap_or(false),
    )?
    .with_output(
        args.integer("maxOutputBytes")?
            .unwrap_or(EXEC_OUTPUT_MCP_DEFAULT),
        encoding,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::mcp::policy::PolicyInputs;

    fn tools(dir: &std::path::Path) -> Tools {
        let home = dynocap_engine::Home::at(dir.join("state")).unwrap();
        let engine =
            Engine::with_supervisor_exe(home, PathBuf::from("/bin/false"), Default::default());
        let policy = Policy::new(&PolicyInputs::default(), &mut |_| {});
        Tools::new(engine, policy, Log::stderr())
    }

    #[tokio::test]
    async fn every_tool_is_implemented() {
        let dir = tempfile::tempdir().unwrap();
        let tools = tools(dir.path());
        let noop = |_: Progress| {};
        for def in tools.definitions() {
            let result = tools.call(def, None, &noop).await;
            if let Err(err) = &result {
                assert!(!err.message.contains("no implementation"), "{}", def.name);
                // Without arguments, a tool either needs some or works on the empty catalog.
                assert_eq!(
                    err.code,
                    dynocap_engine::ErrorCode::InvalidArgument,
                    "{}: {err}",
                    def.name
                );
            }
        }
        let ls = tools
            .call(tools.find("dynocap_ls").unwrap(), None, &noop)
            .await
            .unwrap();
        assert_eq!(ls.structured, json!({ "tasks": [], "sandboxes": [] }));
        assert_eq!(ls.text, ls.structured.to_string());
    }

    #[tokio::test]
    async fn malformed_input_is_reported_before_policy() {
        let dir = tempfile::tempdir().unwrap();
        let tools = tools(dir.path());
        let noop = |_: Progress| {};
        let start = tools.find("dynocap_task_start").unwrap();
        let args = json!({ "projectPath": "/etc", "ttlSeconds": 29, "network": "nat" });
        let Value::Object(map) = args else { panic!() };
        let err = tools.call(start, Some(map), &noop).await.unwrap_err();
        assert_eq!(
            err.code,
            dynocap_engine::ErrorCode::InvalidArgument,
            "{err}"
        );
        let args = json!({ "projectPath": "/etc", "network": "nat" });
        let Value::Object(map) = args else { panic!() };
        let err = tools.call(start, Some(map), &noop).await.unwrap_err();
        assert_eq!(err.code, dynocap_engine::ErrorCode::PolicyDenied, "{err}");
    }
}
