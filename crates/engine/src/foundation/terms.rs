//! The engine's own names for what a message points its reader to: a request parameter
//! ([`Param`]), an operation ([`Op`]) or a boolean option. How a reader spells them (`--ttl` or
//! `ttlSeconds`, `dynocap task exec NAME` or `dynocap_task_exec`) is the business of the
//! surface that speaks to them, the `dynocap` binary's CLI and MCP server: an error that names
//! one keeps its text as [`Piece`]s ([`Error::words`]), which that surface renders.
//!
//! A message is written once, as text with its terms in place:
//! `Error::worded(code, |w| format!("{} is too long", w.param(Param::TtlSeconds)))`. What
//! [`Words`] returns stands for the term in that text and is read back into pieces at once.

use crate::foundation::error::{Error, ErrorCode};

/// A request parameter, by what it sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Param {
    TtlSeconds,
    MemoryMb,
    DiskMb,
    Cpus,
    TimeoutSeconds,
    /// An MCP parameter only: the CLI streams everything.
    MaxOutputBytes,
}

impl Param {
    const ALL: [Param; 6] = [
        Self::TtlSeconds,
        Self::MemoryMb,
        Self::DiskMb,
        Self::Cpus,
        Self::TimeoutSeconds,
        Self::MaxOutputBytes,
    ];

    /// The engine's name, for a message no surface renders (a log line).
    pub fn name(self) -> &'static str {
        match self {
            Self::TtlSeconds => "ttl_seconds",
            Self::MemoryMb => "memory_mb",
            Self::DiskMb => "disk_mb",
            Self::Cpus => "cpus",
            Self::TimeoutSeconds => "timeout_seconds",
            Self::MaxOutputBytes => "max_output_bytes",
        }
    }
}

/// An operation a message may point to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
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
    const ALL: [Op; 8] = [
        Self::Run,
        Self::Exec,
        Self::Destroy,
        Self::TaskStart,
        Self::TaskExec,
        Self::TaskDiff,
        Self::TaskFinish,
        Self::Rm,
    ];

    /// The engine's name, for a message no surface renders (a log line).
    pub fn name(self) -> &'static str {
        match self {
            Self::Run => "run",
            Self::Exec => "exec",
            Self::Destroy => "destroy",
            Self::TaskStart => "task start",
            Self::TaskExec => "task exec",
            Self::TaskDiff => "task diff",
            Self::TaskFinish => "task finish",
            Self::Rm => "rm",
        }
    }

    /// Whether the operation is on an existing sandbox or task (named by the piece's target).
    pub fn takes_target(self) -> bool {
        !matches!(self, Self::Run | Self::TaskStart)
    }
}

/// A part of a message: its own text, or a term each surface spells its way.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Piece {
    Text(String),
    Param(Param),
    /// `op`, on the sandbox or task `target` where it takes one.
    Op {
        op: Op,
        target: String,
    },
    /// A boolean option turned on (`force`).
    Flag(String),
}

impl Piece {
    /// The piece in the engine's own names (see [`Error::message`]).
    pub fn plain(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::Param(param) => param.name().to_owned(),
            Self::Op { op, target } if op.takes_target() => format!("{} {target}", op.name()),
            Self::Op { op, .. } => op.name().to_owned(),
            Self::Flag(name) => name.clone(),
        }
    }
}

/// What a message's text is written with: each method returns a stand-in for its term, which
/// [`Error::worded`] reads back. Private-use characters delimit them, which no message's own
/// text holds.
pub struct Words {
    targets: std::cell::RefCell<Vec<String>>,
    flags: std::cell::RefCell<Vec<String>>,
}

const OPEN: char = '\u{F8F0}';
const CLOSE: char = '\u{F8F1}';

impl Words {
    /// The parameter `param`.
    pub fn param(&self, param: Param) -> String {
        let index = Param::ALL.iter().position(|p| *p == param).unwrap_or(0);
        format!("{OPEN}p{index}{CLOSE}")
    }

    /// The operation `op`, on `target` where it takes one.
    pub fn op(&self, op: Op, target: &str) -> String {
        let index = Op::ALL.iter().position(|o| *o == op).unwrap_or(0);
        let mut targets = self.targets.borrow_mut();
        targets.push(target.to_owned());
        format!("{OPEN}o{index}.{}{CLOSE}", targets.len() - 1)
    }

    /// The boolean option `name` turned on.
    pub fn flag(&self, name: &str) -> String {
        let mut flags = self.flags.borrow_mut();
        flags.push(name.to_owned());
        format!("{OPEN}f{}{CLOSE}", flags.len() - 1)
    }

    /// `text` read back into pieces.
    fn pieces(&self, text: &str) -> Vec<Piece> {
        let targets = self.targets.borrow();
        let flags = self.flags.borrow();
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find(OPEN) {
            let Some(len) = rest[start..].find(CLOSE) else {
                break;
            };
            if start > 0 {
                pieces.push(Piece::Text(rest[..start].to_owned()));
            }
            let token = &rest[start + OPEN.len_utf8()..start + len];
            let number = |s: &str| s.parse::<usize>().unwrap_or(0);
            let piece = match token.split_at(1) {
                ("p", index) => Param::ALL.get(number(index)).copied().map(Piece::Param),
                ("o", spec) => {
                    let (index, target) = spec.split_once('.').unwrap_or((spec, "0"));
                    Op::ALL.get(number(index)).map(|op| Piece::Op {
                        op: *op,
                        target: targets.get(number(target)).cloned().unwrap_or_default(),
                    })
                }
                ("f", index) => flags.get(number(index)).cloned().map(Piece::Flag),
                _ => None,
            };
            pieces.extend(piece);
            rest = &rest[start + len + CLOSE.len_utf8()..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        pieces
    }
}

impl Error {
    /// An error whose text names parameters or operations, written by `text` with the stand-ins
    /// [`Words`] gives: [`Error::words`] holds it for each surface to render, and
    /// [`Error::message`] has it in the engine's own names.
    pub fn worded(code: ErrorCode, text: impl FnOnce(&Words) -> String) -> Self {
        let words = Words {
            targets: Default::default(),
            flags: Default::default(),
        };
        let pieces = words.pieces(&text(&words));
        let message: String = pieces.iter().map(Piece::plain).collect();
        let mut err = Self::new(code, message);
        if pieces.iter().any(|p| !matches!(p, Piece::Text(_))) {
            err.words = Some(pieces);
        }
        err
    }

    /// The message with each term as `term` spells it: what a surface shows.
    pub fn render(&self, term: impl Fn(&Piece) -> String) -> String {
        match &self.words {
            Some(pieces) => pieces
                .iter()
                .map(|piece| match piece {
                    Piece::Text(text) => text.clone(),
                    other => term(other),
                })
                .collect(),
            None => self.message.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_keeps_its_terms_as_pieces() {
        let err = Error::worded(ErrorCode::Conflict, |w| {
            format!(
                "{} 9 is too much; use {} or pass {}",
                w.param(Param::TtlSeconds),
                w.op(Op::TaskExec, "t"),
                w.flag("force")
            )
        });
        assert_eq!(
            err.words.as_deref(),
            Some(
                &[
                    Piece::Param(Param::TtlSeconds),
                    Piece::Text(" 9 is too much; use ".into()),
                    Piece::Op {
                        op: Op::TaskExec,
                        target: "t".into()
                    },
                    Piece::Text(" or pass ".into()),
                    Piece::Flag("force".into()),
                ][..]
            )
        );
        assert_eq!(
            err.message,
            "ttl_seconds 9 is too much; use task exec t or pass force"
        );
        assert_eq!(
            err.render(|p| format!("<{}>", p.plain())),
            "<ttl_seconds> 9 is too much; use <task exec t> or pass <force>"
        );
        // Through the supervisor's socket and back.
        let json = serde_json::to_string(&err).unwrap();
        assert_eq!(serde_json::from_str::<Error>(&json).unwrap(), err);
        let plain = Error::worded(ErrorCode::Conflict, |_| "plain".to_owned());
        assert_eq!(plain.words, None);
        assert_eq!(plain.render(|_| unreachable!()), "plain");
    }

    #[test]
    fn every_term_reads_back() {
        let words = Words {
            targets: Default::default(),
            flags: Default::default(),
        };
        for param in Param::ALL {
            assert_eq!(words.pieces(&words.param(param)), [Piece::Param(param)]);
        }
        for op in Op::ALL {
            let piece = Piece::Op {
                op,
                target: "x".into(),
            };
            assert_eq!(words.pieces(&words.op(op, "x")), [piece]);
        }
    }
}
