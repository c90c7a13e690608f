//! How a command string becomes `/bin/sh`'s argument vector, whatever its length.
//!
//! The kernel refuses any single argument or environment string of [`ARG_STRLEN_MAX`] bytes
//! or more (`MAX_ARG_STRLEN`, with its NUL), so `sh -c COMMAND` fails to execute for a
//! command of 128 KiB or more, which the protocol allows. Such a command is cut into pieces
//! under that size, passed as positional parameters, and put back together by a fixed
//! script that clears them before the command runs:
//!
//! ```text
//! sh -c 'eval "set --;${1}${2}${3}"' sh PIECE1 PIECE2 PIECE3
//! ```
//!
//! The expansion happens once, before `eval` runs, so the command sees what `sh -c COMMAND`
//! would show it: `$0` is `sh`, no positional parameters, no extra variables, stdin unchanged;
//! `exit`, `exec` and traps behave the same. Only the shell's own messages differ (they name
//! `eval`). Commands under the limit keep the plain `sh -c COMMAND`.

use std::ffi::CString;

/// Longest string the kernel accepts in argv or envp, its NUL included: `MAX_ARG_STRLEN`,
/// 32 pages, counted with the smallest page size Linux has (4 KiB).
pub const ARG_STRLEN_MAX: usize = 32 * 4096;

/// Longest piece a command is cut into (room for the NUL).
const PIECE_MAX: usize = ARG_STRLEN_MAX - 1;

/// A command with a NUL byte, which no argument vector can carry.
#[derive(Debug, thiserror::Error)]
#[error("command contains a NUL byte")]
pub struct NulInCommand;

/// The argument vector that runs `command` (without NUL bytes) with `sh`.
pub fn shell_argv(command: &[u8]) -> Result<Vec<CString>, NulInCommand> {
    let arg = |bytes: &[u8]| CString::new(bytes).map_err(|_| NulInCommand);
    if command.len() <= PIECE_MAX {
        return Ok(vec![c"sh".to_owned(), c"-c".to_owned(), arg(command)?]);
    }
    let pieces: Vec<&[u8]> = command.chunks(PIECE_MAX).collect();
    // ${N} rather than $N: past nine pieces $10 would be ${1}0.
    let joined: String = (1..=pieces.len()).map(|n| format!("${{{n}}}")).collect();
    let mut argv = vec![
        c"sh".to_owned(),
        c"-c".to_owned(),
        arg(format!("eval \"set --;{joined}\"").as_bytes())?,
        // $0, as `sh -c` sets it.
        c"sh".to_owned(),
    ];
    for piece in pieces {
        argv.push(arg(piece)?);
    }
    Ok(argv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command;
    use crate::reaper::ExitStatus;

    /// Runs the argv the way the agent does (through its spawn path and reaper: a std
    /// `Command` would race the reaper thread other tests start for the child's status).
    async fn run(script: &str) -> (Option<ExitStatus>, String) {
        crate::init::setup();
        let argv = shell_argv(script.as_bytes()).expect("argv");
        let spec = command::program_spec(c"/bin/sh", argv, c"/");
        let (_stop_tx, mut stop) = tokio::sync::mpsc::channel(1);
        let Ok((out, finished)) = command::run(&spec, 1024, &mut stop).await else {
            panic!("sh did not run");
        };
        (finished.status, String::from_utf8_lossy(&out).into_owned())
    }

    /// A command of exactly `len` bytes: a long no-op comment-like filler, then `tail`.
    fn padded(len: usize, tail: &str) -> String {
        let head = ": ";
        let filler = len - head.len() - tail.len() - 1;
        format!("{head}{};{tail}", "x".repeat(filler))
    }

    #[test]
    fn short_commands_keep_plain_sh_c() {
        let argv = shell_argv(b"echo hi").expect("argv");
        assert_eq!(
            argv,
            [c"sh".to_owned(), c"-c".to_owned(), c"echo hi".to_owned()]
        );
        let at_limit = "x".repeat(PIECE_MAX);
        assert_eq!(shell_argv(at_limit.as_bytes()).expect("argv").len(), 3);
        assert!(shell_argv(b"a\0b").is_err());
    }

    #[tokio::test]
    async fn long_commands_run_as_written() {
        for len in [PIECE_MAX + 1, 200 * 1024, 256 * 1024, 9 * PIECE_MAX + 7] {
            let script = padded(len, " echo \"ok $0 $#\"; exit 3");
            assert_eq!(script.len(), len);
            let argv = shell_argv(script.as_bytes()).expect("argv");
            assert!(argv.iter().all(|a| a.as_bytes().len() < ARG_STRLEN_MAX));
            let ran = run(&script).await;
            assert_eq!(
                ran,
                (Some(ExitStatus::Exited(3)), "ok sh 0\n".to_owned()),
                "{len} bytes"
            );
        }
    }

    #[tokio::test]
    async fn pieces_join_exactly_even_inside_quotes_and_multibyte_text() {
        // Cut points fall inside a quoted string of multi-byte characters: the bytes must
        // come back unchanged, with no separator between pieces.
        let word = "é\"'$ ".repeat(PIECE_MAX / 3);
        let script = format!("printf %s '{}' | wc -c", word.replace('\'', "'\\''"));
        assert!(script.len() > 2 * PIECE_MAX);
        let (status, out) = run(&script).await;
        assert_eq!(status, Some(ExitStatus::Exited(0)));
        assert_eq!(out.trim(), word.len().to_string());
    }
}
