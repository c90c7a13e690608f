//! Blanks a secret in this process's own command line, as `ps` and `/proc/PID/cmdline` show
//! it: a `task start --repo https://user:TOKEN@host/…` would otherwise show the token to every
//! user of the machine for as long as the start runs (a clone can take minutes).
//!
//! The kernel reads a command line from the process's own memory (the range `arg_start` to
//! `arg_end` in `/proc/self/stat`), so writing there through `/proc/self/mem` changes what it
//! shows; no pointer of the program is involved. The arguments were parsed before, so
//! nothing reads them again.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

/// Replaces every occurrence of `secret` in this process's command line with `*`s of the same
/// length. Best effort: a kernel that does not let a process write its own memory through
/// `/proc/self/mem` leaves the command line as it was, which the returned error says.
pub fn blank(secret: &str) -> std::io::Result<()> {
    if secret.is_empty() {
        return Ok(());
    }
    let (start, end) = argument_range()?;
    let mem = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")?;
    let len = usize::try_from(end.saturating_sub(start))
        .map_err(|_| std::io::Error::other("the argument range is too large"))?;
    let mut args = vec![0_u8; len];
    mem.read_exact_at(&mut args, start)?;
    let needle = secret.as_bytes();
    let mut at = 0;
    while let Some(found) = args[at..]
        .windows(needle.len())
        .position(|window| window == needle)
    {
        let offset = at + found;
        let stars = vec![b'*'; needle.len()];
        mem.write_all_at(&stars, start + offset as u64)?;
        at = offset + needle.len();
        if at + needle.len() > args.len() {
            break;
        }
    }
    Ok(())
}

/// `arg_start` and `arg_end` of `/proc/self/stat` (fields 48 and 49).
fn argument_range() -> std::io::Result<(u64, u64)> {
    let stat = std::io::read_to_string(File::open("/proc/self/stat")?)?;
    // The command name (field 2) is in parentheses and may hold anything; fields are counted
    // from the last `)`, which is followed by field 3.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| std::io::Error::other("/proc/self/stat has no command name"))?;
    let mut fields = rest.split_whitespace().skip(48 - 3);
    let mut next = || -> std::io::Result<u64> {
        fields
            .next()
            .and_then(|field| field.parse().ok())
            .ok_or_else(|| std::io::Error::other("/proc/self/stat has no argument range"))
    };
    let start = next()?;
    let end = next()?;
    Ok((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_covers_this_process_command_line() {
        let (start, end) = argument_range().unwrap();
        let shown = std::fs::read("/proc/self/cmdline").unwrap();
        assert_eq!(usize::try_from(end - start).unwrap(), shown.len());
    }

    #[test]
    fn a_secret_in_the_command_line_is_blanked() {
        // The test binary's own first argument: its path. Blank a part of it and see the
        // command line change, then put nothing back (the test process ends anyway).
        let shown = std::fs::read("/proc/self/cmdline").unwrap();
        let first = shown.split(|b| *b == 0).next().unwrap();
        let name = std::str::from_utf8(first).unwrap();
        let secret = &name[name.len() - 6..];
        blank(secret).unwrap();
        let after = std::fs::read("/proc/self/cmdline").unwrap();
        assert_eq!(after.len(), shown.len());
        assert!(!after.windows(6).any(|w| w == secret.as_bytes()));
        assert!(after.windows(6).any(|w| w == b"******"));
    }
}
