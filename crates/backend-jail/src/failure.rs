//! The guest init's error type: a readable sentence ("mounting the overlay on /x: EPERM")
//! that travels to the supervisor through the error pipe and becomes
//! [`JailError::GuestSetup`](crate::JailError::GuestSetup).

use std::fmt;

use nix::errno::Errno;

/// What failed in the guest init, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure(String);

impl Failure {
    /// `what` failed with `errno`.
    pub fn new(what: impl fmt::Display, errno: Errno) -> Failure {
        Failure(format!("{what}: {errno}"))
    }

    /// A failure explained in words only.
    pub fn message(text: impl Into<String>) -> Failure {
        Failure(text.into())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Adds "what was being done" to an `Errno`.
pub(crate) trait Context<T> {
    fn context<S: fmt::Display>(self, what: impl FnOnce() -> S) -> Result<T, Failure>;
}

impl<T> Context<T> for Result<T, Errno> {
    fn context<S: fmt::Display>(self, what: impl FnOnce() -> S) -> Result<T, Failure> {
        self.map_err(|errno| Failure::new(what(), errno))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_like_a_sentence() {
        let r: Result<(), Errno> = Err(Errno::EPERM);
        let f = r
            .context(|| "mounting the overlay on /s/root")
            .expect_err("an error");
        assert_eq!(
            f.to_string(),
            "mounting the overlay on /s/root: EPERM: Operation not permitted"
        );
    }
}
