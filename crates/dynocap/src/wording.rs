//! What a message calls things, on each surface this binary speaks: a parameter is
//! `ttlSeconds` to an MCP caller and `--ttl` at the command line; an operation is the tool
//! `dynocap_task_finish` to one and the command `dynocap task finish NAME` to the other. The
//! engine names them by its own terms ([`dynocap_engine::terms`]); [`text`] spells an error's
//! message for its reader.

use dynocap_engine::terms::{Op, Param, Piece};
use dynocap_engine::Error;

/// Who reads the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    Mcp,
    Cli,
}

/// `err`'s message as `surface`'s reader reads it.
pub fn text(surface: Surface, err: &Error) -> String {
    err.render(|piece| surface.term(piece))
}

/// The request parameter: its MCP name and the CLI flag that sets it.
fn param(param: Param) -> (&'static str, &'static str) {
    match param {
        Param::TtlSeconds => ("ttlSeconds", "--ttl"),
        Param::MemoryMb => ("memoryMB", "--memory-mb"),
        Param::DiskMb => ("diskMB", "--disk-mb"),
        Param::Cpus => ("cpus", "--cpus"),
        Param::TimeoutSeconds => ("timeoutSeconds", "--timeout"),
        // An MCP parameter only: the CLI streams everything.
        Param::MaxOutputBytes => ("maxOutputBytes", "maxOutputBytes"),
    }
}

/// The operation: the MCP tool and the command.
fn op(op: Op) -> (&'static str, &'static str) {
    match op {
        Op::Run => ("dynocap_run", "dynocap run"),
        Op::Exec => ("dynocap_exec", "dynocap exec"),
        Op::Destroy => ("dynocap_destroy", "dynocap destroy"),
        Op::TaskStart => ("dynocap_task_start", "dynocap task start"),
        Op::TaskExec => ("dynocap_task_exec", "dynocap task exec"),
        Op::TaskDiff => ("dynocap_diff", "dynocap task diff"),
        Op::TaskFinish => ("dynocap_task_finish", "dynocap task finish"),
        Op::Rm => ("dynocap_rm", "dynocap rm"),
    }
}

impl Surface {
    /// A term of a message, spelt here: a parameter's name, an operation as this surface's
    /// caller invokes it (the tool's name, or the command line in backquotes, with its target
    /// where the command takes one), a boolean option turned on (`force: true`, `--force`).
    fn term(self, piece: &Piece) -> String {
        match (self, piece) {
            (_, Piece::Text(text)) => text.clone(),
            (Self::Mcp, Piece::Param(p)) => param(*p).0.to_owned(),
            (Self::Cli, Piece::Param(p)) => param(*p).1.to_owned(),
            (Self::Mcp, Piece::Op { op: o, .. }) => op(*o).0.to_owned(),
            (Self::Cli, Piece::Op { op: o, target }) if o.takes_target() => {
                format!("`{} {target}`", op(*o).1)
            }
            (Self::Cli, Piece::Op { op: o, .. }) => format!("`{}`", op(*o).1),
            // The engine names a flag as the CLI spells it (`no-cache`); MCP's are camelCase.
            (Self::Mcp, Piece::Flag(name)) => format!("{}: true", camel(name)),
            (Self::Cli, Piece::Flag(name)) => format!("--{name}"),
        }
    }
}

/// `no-cache` as `noCache`.
fn camel(name: &str) -> String {
    let mut parts = name.split('-');
    let mut out = parts.next().unwrap_or_default().to_owned();
    for part in parts {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(chars.as_str());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynocap_engine::ErrorCode;

    #[test]
    fn each_surface_gets_its_own_names() {
        let err = Error::worded(ErrorCode::Conflict, |w| {
            format!(
                "{} 9 is too much; use {} or pass {}",
                w.param(Param::TtlSeconds),
                w.op(Op::TaskExec, "t"),
                w.flag("force")
            )
        });
        assert_eq!(
            text(Surface::Mcp, &err),
            "ttlSeconds 9 is too much; use dynocap_task_exec or pass force: true"
        );
        assert_eq!(
            text(Surface::Cli, &err),
            "--ttl 9 is too much; use `dynocap task exec t` or pass --force"
        );
        let start = Error::worded(ErrorCode::Conflict, |w| w.op(Op::TaskStart, "t"));
        assert_eq!(text(Surface::Cli, &start), "`dynocap task start`");
        let plain = Error::worded(ErrorCode::Conflict, |_| "plain".to_owned());
        assert_eq!(text(Surface::Cli, &plain), "plain");
        assert_eq!(text(Surface::Mcp, &plain), "plain");
    }

    #[test]
    fn refusals_name_what_the_reader_types() {
        // The name taken by a finished task, as the catalog refuses it.
        let err = Error::worded(ErrorCode::Conflict, |w| {
            format!("free the name with {}", w.op(Op::Rm, "done"))
        });
        assert_eq!(text(Surface::Mcp, &err), "free the name with dynocap_rm");
        assert_eq!(
            text(Surface::Cli, &err),
            "free the name with `dynocap rm done`"
        );
        let spec = dynocap_engine::spec::RunSpec::raw("a", None, Some(29), None, None, None)
            .expect_err("below the minimum");
        assert!(text(Surface::Mcp, &spec).starts_with("ttlSeconds 29 is below"));
        assert!(text(Surface::Cli, &spec).starts_with("--ttl 29 is below"));
        let flag = Error::worded(ErrorCode::PolicyDenied, |w| {
            format!("pass {}", w.flag("no-cache"))
        });
        assert_eq!(text(Surface::Mcp, &flag), "pass noCache: true");
        assert_eq!(text(Surface::Cli, &flag), "pass --no-cache");
    }
}
