//! What a message calls things, on each surface: a parameter is `ttlSeconds` to an MCP
//! caller and `--ttl` at the command line; an operation is the tool `dynocap_task_finish` to
//! one and the command `dynocap task finish NAME` to the other. An engine error that names
//! either is written once, as a function of the [`Surface`], and carries both texts
//! ([`Error::worded`]); the MCP server shows `message`, the CLI its own.

use crate::foundation::error::{Error, ErrorCode};

/// Who reads the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    Mcp,
    Cli,
}

/// A request parameter and the CLI flag that sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    pub mcp: &'static str,
    pub cli: &'static str,
}

pub const TTL_SECONDS: Param = Param {
    mcp: "ttlSeconds",
    cli: "--ttl",
};
pub const MEMORY_MB: Param = Param {
    mcp: "memoryMB",
    cli: "--memory-mb",
};
pub const DISK_MB: Param = Param {
    mcp: "diskMB",
    cli: "--disk-mb",
};
pub const CPUS: Param = Param {
    mcp: "cpus",
    cli: "--cpus",
};
pub const TIMEOUT_SECONDS: Param = Param {
    mcp: "timeoutSeconds",
    cli: "--timeout",
};

/// An operation a message may point to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Run,
    Exec,
    Destroy,
    TaskStart,
    TaskExec,
    TaskDiff,
    TaskFinish,
    Rm,
}

impl Op {
    fn tool(self) -> &'static str {
        match self {
            Self::Run => "dynocap_run",
            Self::Exec => "dynocap_exec",
            Self::Destroy => "dynocap_destroy",
            Self::TaskStart => "dynocap_task_start",
            Self::TaskExec => "dynocap_task_exec",
            Self::TaskDiff => "dynocap_diff",
            Self::TaskFinish => "dynocap_task_finish",
            Self::Rm => "dynocap_rm",
        }
    }

    fn command(self) -> &'static str {
        match self {
            Self::Run => "dynocap run",
            Self::Exec => "dynocap exec",
            Self::Destroy => "dynocap destroy",
            Self::TaskStart => "dynocap task start",
            Self::TaskExec => "dynocap task exec",
            Self::TaskDiff => "dynocap task diff",
            Self::TaskFinish => "dynocap task finish",
            Self::Rm => "dynocap rm",
        }
    }

    /// Whether the operation is on an existing sandbox or task (its name follows it on the CLI).
    fn takes_target(self) -> bool {
        !matches!(self, Self::Run | Self::TaskStart)
    }
}

impl Surface {
    /// The parameter's name here.
    pub fn param(self, param: Param) -> &'static str {
        match self {
            Self::Mcp => param.mcp,
            Self::Cli => param.cli,
        }
    }

    /// `op` as this surface's caller invokes it: the tool's name, or the command line in
    /// backquotes (with `target` where the command takes one).
    pub fn op(self, op: Op, target: &str) -> String {
        match self {
            Self::Mcp => op.tool().to_owned(),
            Self::Cli if op.takes_target() => format!("`{} {target}`", op.command()),
            Self::Cli => format!("`{}`", op.command()),
        }
    }

    /// A boolean option turned on: `force: true`, or `--force`.
    pub fn flag(self, name: &str) -> String {
        match self {
            Self::Mcp => format!("{name}: true"),
            Self::Cli => format!("--{name}"),
        }
    }
}

impl Error {
    /// An error whose text names parameters or operations: `text` is called once per surface.
    pub fn worded(code: ErrorCode, text: impl Fn(Surface) -> String) -> Self {
        let message = text(Surface::Mcp);
        let cli = text(Surface::Cli);
        let mut err = Self::new(code, message);
        if cli != err.message {
            err.cli_message = Some(cli);
        }
        err
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_surface_gets_its_own_names() {
        let err = Error::worded(ErrorCode::Conflict, |s| {
            format!(
                "{} 9 is too much; use {} or pass {}",
                s.param(TTL_SECONDS),
                s.op(Op::TaskExec, "t"),
                s.flag("force")
            )
        });
        assert_eq!(
            err.message,
            "ttlSeconds 9 is too much; use dynocap_task_exec or pass force: true"
        );
        assert_eq!(
            err.cli_text(),
            "--ttl 9 is too much; use `dynocap task exec t` or pass --force"
        );
        assert_eq!(Surface::Cli.op(Op::TaskStart, "t"), "`dynocap task start`");
        let same = Error::worded(ErrorCode::Conflict, |_| "plain".to_owned());
        assert_eq!(same.cli_message, None);
        assert_eq!(same.cli_text(), "plain");
    }
}
