//! Named fault-injection points, so a test can kill, stop or fail a supervisor at an exact
//! step instead of racing a signal against it.
//!
//! Compiled in only with the `failpoints` feature (the end-to-end test crate enables it; a
//! release build has none, and [`hit`] is then an empty inline function). A test arms points
//! through the environment of the process it starts:
//!
//! ```text
//! DYNOCAP_FAILPOINTS="supervisor.finish.after-diff=kill;agent.diff=sleep(5000)"
//! ```
//!
//! Actions: `kill` (SIGKILL this process), `stop` (SIGSTOP it), `exit` (exit code 101 without
//! cleaning up), `error` (the step fails with an `internal` error naming the point) and
//! `sleep(MS)`.

use crate::foundation::error::Result;

/// Runs the action armed for `name`, if any.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) -> Result<()> {
    use std::sync::OnceLock;
    static ARMED: OnceLock<Vec<(String, String)>> = OnceLock::new();
    // Read here, not passed in the engine's `Config`: the points sit deep in the supervisor
    // (finish, save, the start's steps) and the facade, in functions with no configuration at
    // hand, and exist only in the test build; threading a test-only setting through their
    // signatures would shape the production code around the tests.
    let armed = ARMED.get_or_init(|| {
        // env-read-ok: test-only fault injection (see above).
        parse(&std::env::var("DYNOCAP_FAILPOINTS").unwrap_or_default())
    });
    let Some((_, action)) = armed.iter().find(|(point, _)| point == name) else {
        return Ok(());
    };
    eprintln!("failpoint {name}: {action}");
    match action.as_str() {
        "kill" => {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        "stop" => {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
        }
        #[allow(clippy::exit)] // the point of the action: die without running destructors
        "exit" => std::process::exit(101),
        "error" => {
            return Err(Injected {
                name: name.to_owned(),
            }
            .into())
        }
        other => {
            if let Some(ms) = other
                .strip_prefix("sleep(")
                .and_then(|rest| rest.strip_suffix(')'))
                .and_then(|ms| ms.parse::<u64>().ok())
            {
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
        }
    }
    Ok(())
}

/// Runs the action armed for `name`, if any (no-op: built without the `failpoints` feature).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) -> Result<()> {
    Ok(())
}

/// `name=action` pairs separated by `;`.
#[cfg(any(feature = "failpoints", test))]
fn parse(spec: &str) -> Vec<(String, String)> {
    spec.split(';')
        .filter_map(|pair| pair.split_once('='))
        .map(|(name, action)| (name.trim().to_owned(), action.trim().to_owned()))
        .filter(|(name, action)| !name.is_empty() && !action.is_empty())
        .collect()
}

/// The failure an `error` action makes the step return.
#[cfg(feature = "failpoints")]
#[derive(Debug, thiserror::Error)]
#[error("failpoint {name} failed this step")]
struct Injected {
    name: String,
}

#[cfg(feature = "failpoints")]
impl crate::foundation::error::Coded for Injected {
    /// What an unexpected failure of the step would be.
    fn code(&self) -> crate::foundation::error::ErrorCode {
        crate::foundation::error::ErrorCode::Internal
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_pairs_and_skips_junk() {
        assert_eq!(
            super::parse("a.b=kill; c=sleep(5) ;junk;=x;d="),
            vec![
                ("a.b".to_owned(), "kill".to_owned()),
                ("c".to_owned(), "sleep(5)".to_owned())
            ]
        );
    }
}
