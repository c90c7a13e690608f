//! What an image's config asks of the commands run in its sandboxes, and how the supervisor
//! honours it: the config's `Env` under every command's own environment, and its `WorkingDir`
//! as a raw sandbox's default working directory. `User`, `Entrypoint` and `Cmd` are recorded
//! in `image.json` only: every command runs as the sandbox user, and nothing is run at boot.
//!
//! The image's config is guest-supplied data as much as its layers are, so only what a
//! command could have been given itself is taken: valid names, no NUL, each entry and the
//! whole within bounds, and an absolute `WorkingDir`.

use super::oci::ContainerConfig;
use crate::foundation::error::{Error, Result};
use crate::model::spec::{ExecSpec, EXEC_CWD_MAX, EXEC_ENV_ENTRY_MAX};

/// The most of an image's `Env` applied, JSON-encoded: room enough for any toolchain's
/// variables, and small beside what one command's request to the agent may take.
pub const IMAGE_ENV_MAX: usize = 64 * 1024;

/// Variables DynoCap sets for every command that an image's `Env` never replaces: the
/// sandbox user's identity (commands run as that user whatever the config's `User` says) and
/// the terminal the request asked for.
const OWN_ALWAYS: &[&str] = &["HOME", "USER", "LOGNAME", "TERM"];

/// Variables a `filtered` sandbox's agent sets to send clients through its proxy and to trust
/// its CA bundle ([`dynocap_proto::proxy_env`]), and the `ALL_PROXY` spellings it leaves
/// unset: an image's own values would bypass the proxy (and be refused) or drop the bundle, so
/// they are not taken in such a sandbox.
fn set_when_filtered(key: &str) -> bool {
    use dynocap_proto::proxy_env::{
        CA_BUNDLE_VARIABLES, GIT_CONFIG_PREFIX, NO_PROXY_VARIABLES, PROXY_URL_VARIABLES,
    };
    [
        PROXY_URL_VARIABLES,
        NO_PROXY_VARIABLES,
        CA_BUNDLE_VARIABLES,
        &["ALL_PROXY", "all_proxy"],
    ]
    .iter()
    .any(|names| names.contains(&key))
        || key.starts_with(GIT_CONFIG_PREFIX)
}

/// The parts of an image's config a sandbox's commands get.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunConfig {
    /// The config's `Env`, in order, the entries DynoCap could not take left out.
    pub env: Vec<(String, String)>,
    /// The config's `WorkingDir`, when it is an absolute path.
    pub working_dir: Option<String>,
}

impl RunConfig {
    /// What `config` asks of commands; entries that are not usable are left out and named
    /// in `skipped`, for the supervisor's log.
    pub fn from_config(config: &ContainerConfig, skipped: &mut dyn FnMut(String)) -> RunConfig {
        let mut env: Vec<(String, String)> = Vec::new();
        let mut total = 0usize;
        for entry in config.env.iter().flatten() {
            let Some((key, value)) = entry.split_once('=') else {
                skipped(format!("Env entry {entry:?} has no '='"));
                continue;
            };
            if !is_variable_name(key) || value.contains('\0') {
                skipped(format!("Env entry {key:?} is not a usable variable"));
                continue;
            }
            if entry.len() > EXEC_ENV_ENTRY_MAX {
                skipped(format!("Env entry {key} is {} bytes", entry.len()));
                continue;
            }
            let encoded = serde_json::to_string(entry).map_or(usize::MAX, |e| e.len());
            if total.saturating_add(encoded) > IMAGE_ENV_MAX {
                skipped(format!(
                    "Env entry {key} and those after it: the image's Env is over \
                     {IMAGE_ENV_MAX} bytes"
                ));
                break;
            }
            total += encoded;
            // A later entry of the same name wins, as in Docker.
            env.retain(|(k, _)| k != key);
            env.push((key.to_owned(), value.to_owned()));
        }
        let working_dir = config.working_dir.as_deref().and_then(|dir| {
            let usable = dir.starts_with('/') && !dir.contains('\0') && dir.len() <= EXEC_CWD_MAX;
            if !usable {
                skipped(format!("WorkingDir {dir:?} is not an absolute path"));
            }
            (usable && dir != "/").then(|| dir.to_owned())
        });
        RunConfig { env, working_dir }
    }

    /// `spec` as it runs in a sandbox of this image: the image's `Env` first, so that what
    /// the command asked for itself wins (and what DynoCap sets wins over both), and, in a raw
    /// sandbox whose command gave no cwd, the image's `WorkingDir`.
    pub fn apply(&self, mut spec: ExecSpec, raw: bool, filtered: bool) -> Result<ExecSpec> {
        if let (true, true, Some(dir)) = (raw, spec.cwd_defaulted, &self.working_dir) {
            spec.cwd.clone_from(dir);
            spec.cwd_defaulted = false;
        }
        if self.env.is_empty() {
            return Ok(spec);
        }
        let own = |key: &str| {
            OWN_ALWAYS.contains(&key)
                || (filtered && set_when_filtered(key))
                || spec.env.iter().any(|(k, _)| k == key)
        };
        let mut env: Vec<(String, String)> = self
            .env
            .iter()
            .filter(|(key, _)| !own(key))
            .cloned()
            .collect();
        let room = dynocap_proto::MAX_FRAME_LEN - 4096;
        env.append(&mut spec.env);
        let encoded = serde_json::to_vec(&(&spec.command, &spec.cwd, &env))
            .map_err(|err| Error::internal(format!("encoding a command: {err}")))?
            .len();
        if encoded > room {
            return Err(Error::invalid(format!(
                "command, cwd, env and the image's Env take {encoded} bytes once encoded for \
                 the sandbox; the limit is {room}: put long scripts in a file in the sandbox"
            )));
        }
        spec.env = env;
        Ok(spec)
    }
}

fn is_variable_name(key: &str) -> bool {
    !key.is_empty()
        && !key.starts_with(|c: char| c.is_ascii_digit())
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(env: &[&str], dir: Option<&str>) -> RunConfig {
        let config = ContainerConfig {
            env: Some(env.iter().map(|e| (*e).to_owned()).collect()),
            working_dir: dir.map(str::to_owned),
            ..ContainerConfig::default()
        };
        let mut skipped = 0;
        let run = RunConfig::from_config(&config, &mut |_| skipped += 1);
        let bad = env.iter().filter(|e| e.starts_with("bad")).count();
        assert!(skipped >= bad, "every unusable entry is reported: {env:?}");
        run
    }

    fn spec(cwd: Option<&str>, env: &[(&str, &str)]) -> ExecSpec {
        let env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ExecSpec::new("true", cwd, "/", env, None, false).expect("spec")
    }

    fn value<'a>(spec: &'a ExecSpec, key: &str) -> Option<&'a str> {
        spec.env
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn the_image_env_comes_under_the_command_and_dynocaps_own() {
        let run = config(
            &[
                "PATH=/opt/tool/bin:/usr/bin:/bin",
                "HOME=/root",
                "LANG=de_DE.UTF-8",
                "HTTPS_PROXY=http://corp:3128",
                "GIT_CONFIG_KEY_0=x",
                "A=1",
                "A=2",
            ],
            None,
        );
        assert_eq!(run.env.iter().filter(|(k, _)| k == "A").count(), 1);
        let raw = run
            .apply(spec(None, &[("LANG", "C")]), true, false)
            .expect("apply");
        assert_eq!(value(&raw, "PATH"), Some("/opt/tool/bin:/usr/bin:/bin"));
        assert_eq!(value(&raw, "HOME"), None, "the sandbox user's HOME stays");
        assert_eq!(value(&raw, "LANG"), Some("C"), "the command's own wins");
        assert_eq!(value(&raw, "A"), Some("2"));
        assert_eq!(value(&raw, "HTTPS_PROXY"), Some("http://corp:3128"));
        let filtered = run.apply(spec(None, &[]), true, true).expect("apply");
        assert_eq!(value(&filtered, "HTTPS_PROXY"), None);
        assert_eq!(value(&filtered, "GIT_CONFIG_KEY_0"), None);
        assert_eq!(
            value(&filtered, "PATH"),
            Some("/opt/tool/bin:/usr/bin:/bin")
        );
    }

    #[test]
    fn working_dir_is_a_raw_sandboxs_default_only() {
        let run = config(&[], Some("/srv/app"));
        let applied = |cwd, raw| run.apply(spec(cwd, &[]), raw, false).expect("apply").cwd;
        assert_eq!(applied(None, true), "/srv/app");
        assert_eq!(applied(Some("/"), true), "/", "a cwd given is kept");
        assert_eq!(applied(None, false), "/", "a task keeps its own default");
        assert_eq!(config(&[], Some("rel")).working_dir, None);
        assert_eq!(config(&[], Some("/")).working_dir, None);
    }

    #[test]
    fn unusable_entries_are_left_out() {
        let run = config(&["bad", "bad-name=1", "bad1=x\0y", "OK=1"], Some("/w"));
        assert_eq!(run.env, vec![("OK".to_owned(), "1".to_owned())]);
        let long = format!("BIG={}", "x".repeat(IMAGE_ENV_MAX));
        let huge = config(&["OK=1", &long, "bad_after=1"], None);
        assert_eq!(huge.env.len(), 1);
    }
}
