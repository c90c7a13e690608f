//! The error type every engine operation returns: a stable code (docs/mcp.md, "Errors") plus a
//! message that tells a person what went wrong and what to do about it.

use std::fmt;

/// Stable error codes (docs/mcp.md, "Errors"). Clients match on these, never on messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidArgument,
    PolicyDenied,
    NotFound,
    Conflict,
    Timeout,
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidArgument => "invalid_argument",
            Self::PolicyDenied => "policy_denied",
            Self::NotFound => "not_found",
            Self::Conflict => "conflict",
            Self::Timeout => "timeout",
            Self::Internal => "internal",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Error {
    pub code: ErrorCode,
    /// What went wrong and what to do: the whole text, with any term (a parameter, an
    /// operation) in the engine's own names. A surface shows [`Error::words`] instead where
    /// there are some (see [`crate::foundation::terms`]).
    pub message: String,
    /// The message as pieces, where it names parameters or operations, which each surface
    /// spells its own way (`--ttl` or `ttlSeconds`). It travels with the error from a
    /// supervisor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub words: Option<Vec<crate::foundation::terms::Piece>>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            words: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Conflict, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Timeout, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for Error {}

/// A failure of one area of the engine (a `thiserror` enum beside the code that fails: the
/// jail backend's, the record files', ...) whose variants name what failed and keep the cause
/// as their `#[source]`.
///
/// [`Coded::code`] is the one place that decides which contract code (docs/mcp.md, "Errors")
/// each variant carries; every `impl` matches its variants exhaustively, with no wildcard, so a
/// new variant cannot get a code by accident. The conversion below is the only way such a
/// failure becomes an [`Error`], so a call site never picks a code itself.
pub(crate) trait Coded: std::error::Error {
    fn code(&self) -> ErrorCode;
}

impl<F: Coded> From<F> for Error {
    /// The message is the failure's text, which shows its cause where the sentence wants it
    /// (as the backends' errors do): `#[source]` keeps the cause for code that inspects it,
    /// the text is for the person reading it.
    fn from(failure: F) -> Self {
        Error::new(failure.code(), failure.to_string())
    }
}

/// Adds context to lower-level failures, turning them into `internal` errors.
pub trait Context<T> {
    fn context(self, what: impl fmt::Display) -> Result<T>;
}

impl<T, E: fmt::Display> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|err| Error::internal(format!("{what}: {err}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_starts_with_the_code() {
        let err = Error::invalid("ttlSeconds 29 is below the minimum 30");
        assert_eq!(
            err.to_string(),
            "invalid_argument: ttlSeconds 29 is below the minimum 30"
        );
    }
}
