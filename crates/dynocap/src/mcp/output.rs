//! A tool's successful result, shaped as docs/mcp.md says: the result object as
//! `structuredContent` and its text item. A leaf: the tool modules build it, the dispatch in
//! `calls` returns it.

use serde::Serialize;
use serde_json::Value;

use dynocap_engine::Error;

/// A successful tool result.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The result object (docs/mcp.md, "Objects").
    pub structured: Value,
    /// The text content item: the same JSON, or the diff's header line and patch.
    pub text: String,
}

impl Output {
    pub(crate) fn json<T: Serialize>(value: &T) -> Result<Self, Error> {
        let structured = serde_json::to_value(value)
            .map_err(|err| Error::internal(format!("cannot encode the result: {err}")))?;
        let text = structured.to_string();
        Ok(Self { structured, text })
    }
}
