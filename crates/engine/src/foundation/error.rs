//! The error type every engine operation returns: a stable code (docs/mcp.md, "Errors") plus a
//! message that tells a person what went wrong and what to do about it.

use std::fmt;
use std::sync::Arc;

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

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
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
    /// The lower-level failure this one reports ([`Context`]), for code that walks the
    /// chain ([`std::error::Error::source`]). The message already says it in words, so it
    /// does not cross the supervisor's socket and takes no part in equality.
    #[serde(skip)]
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl PartialEq for Error {
    fn eq(&self, other: &Self) -> bool {
        self.code == other.code && self.message == other.message && self.words == other.words
    }
}

impl Eq for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            words: None,
            source: None,
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

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn std::error::Error + 'static))
    }
}

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

/// Context on a lower-level failure (an `io::Error`, an `Errno`, another crate's error): on
/// `Err`, an `internal` [`Error`] whose message is "`what`: the failure" and whose
/// [`source`](std::error::Error::source) is the failure itself. For a step of the engine's own
/// plumbing that the caller cannot fix; a failure with a code of its own belongs in a
/// [`Coded`] enum instead.
pub trait Context<T> {
    /// `what`: the step that failed, naming what it worked on ("creating /x/y").
    fn context(self, what: impl fmt::Display) -> Result<T>;
    /// [`Context::context`] with the words made only on failure (a `format!` of paths).
    fn with_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E> Context<T> for std::result::Result<T, E>
where
    E: std::error::Error + Send + Sync + 'static,
{
    fn context(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|failure| with_cause(what, failure))
    }

    fn with_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|failure| with_cause(what(), failure))
    }
}

fn with_cause(
    what: impl fmt::Display,
    failure: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    let mut err = Error::internal(format!("{what}: {failure}"));
    err.source = Some(Arc::new(failure));
    err
}

/// The agent channel is the supervisor's own plumbing to DynoCap's own program in the
/// guest: a frame that does not arrive or decode is never the caller's to fix. Its text
/// names the message ("malformed hello message: ...").
impl Coded for dynocap_proto::ProtoError {
    fn code(&self) -> ErrorCode {
        match self {
            Self::Frame(_) | Self::BadMessage { .. } | Self::Io(_) => ErrorCode::Internal,
        }
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

    fn refused() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::EACCES)
    }

    #[test]
    fn context_names_the_step_and_keeps_the_failure_as_its_source() {
        let failed: std::result::Result<(), _> = Err(refused());
        let err = failed.context("creating /x/state").expect_err("failed");
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(
            err.message,
            format!("creating /x/state: {}", refused()),
            "the step, then the failure's own text"
        );
        let source = std::error::Error::source(&err).expect("a source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the io::Error itself");
        assert_eq!(io.raw_os_error(), Some(libc::EACCES));
    }

    #[test]
    fn with_context_makes_its_words_only_on_failure() {
        let mut made = 0;
        let ok: std::result::Result<u32, std::io::Error> = Ok(7);
        let value = ok
            .with_context(|| {
                made += 1;
                "never shown"
            })
            .expect("ok");
        assert_eq!((value, made), (7, 0));
        let failed: std::result::Result<u32, _> = Err(nix::errno::Errno::ENOSPC);
        let err = failed
            .with_context(|| format!("writing {}", "/x/patch"))
            .expect_err("failed");
        assert_eq!(
            err.message,
            "writing /x/patch: ENOSPC: No space left on device"
        );
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn the_source_stays_on_this_side_of_the_socket() {
        let err = Err::<(), _>(refused())
            .context("reading")
            .expect_err("failed");
        let json = serde_json::to_string(&err).expect("encodes");
        assert!(!json.contains("source"), "{json}");
        let back: Error = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back, err, "equal without the source");
        assert!(std::error::Error::source(&back).is_none());
    }

    #[test]
    fn an_agent_channel_failure_keeps_its_text_and_is_internal() {
        let failure = dynocap_proto::ProtoError::BadMessage {
            what: "hello",
            detail: "expected value".to_owned(),
        };
        let text = failure.to_string();
        let err = Error::from(failure);
        assert_eq!((err.code, err.message), (ErrorCode::Internal, text));
    }
}
