//! What the agent's command line configures for every request it serves: the user and HOME
//! of commands, the private state directory, the cgroup each command gets, and the proxy
//! settings commands see. Built once in `main` and shared, read-only, by every request.

use std::path::PathBuf;
use std::sync::Arc;

use crate::cgroup::ExecCgroups;
use crate::egress::EgressEnv;
use crate::spawn::ExecUser;
use crate::statedir;

/// What the command line configures for every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Commands run as this user (when it differs from the agent's).
    pub exec_user: Option<ExecUser>,
    /// HOME of commands; `/home/sandbox` (or `/` without it) when unset.
    pub home: Option<PathBuf>,
    /// The agent's private directory: received files and the baseline repository.
    pub state_dir: PathBuf,
    /// Where each command gets its own cgroup (`--cgroup-fd`); without it a timeout kills
    /// only the command's process group.
    pub exec_cgroups: Option<Arc<ExecCgroups>>,
    /// Proxy settings every command gets while the egress listener runs.
    pub egress_env: EgressEnv,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            exec_user: None,
            home: None,
            state_dir: PathBuf::from(statedir::DEFAULT_STATE_DIR),
            exec_cgroups: None,
            egress_env: EgressEnv::default(),
        }
    }
}
