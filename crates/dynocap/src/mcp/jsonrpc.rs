//! JSON-RPC 2.0 envelopes as `dynocap mcp` reads them off stdin: whether a line is one message,
//! which kind, and for one that is not, the error reply, carrying the request's id whenever
//! that can still be read (a client waits on its id; an error with `"id": null` it cannot pair
//! with anything). The rules are JSON-RPC 2.0's, narrowed by MCP: ids are strings or integers,
//! never null, and there are no batches. Notifications and responses are never answered, even
//! when malformed. SDK-free.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Serialize;
use serde_json::{Map, Value};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;

/// A client message whose envelope is valid.
#[derive(Debug, PartialEq)]
pub enum Message {
    Request {
        id: Value,
        method: String,
        /// `None` when absent or null.
        params: Option<Value>,
    },
    Notification {
        method: String,
    },
    /// A result or error the client sends back for a request of the server's.
    Response,
}

/// Why a line does not reach the SDK.
#[derive(Debug, PartialEq)]
pub enum Rejected {
    /// Answer it: it is, or may have been, a request.
    Reply(ErrorReply),
    /// Drop it, saying why in the log: a notification or a response, which are never answered.
    Ignore(String),
}

/// A JSON-RPC error response.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorReply {
    /// The request's id, or null when it cannot be read.
    pub id: Value,
    pub code: i64,
    pub message: String,
}

impl ErrorReply {
    pub fn new(id: Value, code: i64, message: impl Into<String>) -> Self {
        Self {
            id,
            code,
            message: message.into(),
        }
    }

    /// The reply as one newline-terminated line, its members in the usual order.
    pub fn to_line(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Wire<'a> {
            jsonrpc: &'static str,
            id: &'a Value,
            error: WireError<'a>,
        }
        #[derive(Serialize)]
        struct WireError<'a> {
            code: i64,
            message: &'a str,
        }
        let wire = Wire {
            jsonrpc: "2.0",
            id: &self.id,
            error: WireError {
                code: self.code,
                message: &self.message,
            },
        };
        let mut line =
            serde_json::to_vec(&wire).expect("strings, numbers and a JSON value serialize");
        line.push(b'\n');
        line
    }

    /// How the log names it.
    pub fn kind(&self) -> &'static str {
        match self.code {
            PARSE_ERROR => "a parse error",
            INVALID_REQUEST => "an invalid-request error",
            METHOD_NOT_FOUND => "a method-not-found error",
            INVALID_PARAMS => "an invalid-params error",
            _ => "an error",
        }
    }
}

/// Reads one line (without its line ending). Replies never echo the input, only say where
/// and what is wrong with it.
pub fn read(line: &[u8]) -> Result<Message, Rejected> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Err(Rejected::Reply(ErrorReply::new(
            Value::Null,
            PARSE_ERROR,
            "Parse error: the line is empty; send one JSON-RPC message per line",
        )));
    }
    match serde_json::from_slice::<Value>(line) {
        Ok(value) => envelope(value),
        Err(err) => Err(Rejected::Reply(ErrorReply::new(
            recover_id(line),
            PARSE_ERROR,
            parse_problem(line, &err),
        ))),
    }
}

/// The reply to a line longer than `limit` bytes; `head` is its beginning, which may still
/// name the id.
pub fn too_long(head: &[u8], limit: usize) -> ErrorReply {
    ErrorReply::new(
        recover_id(head),
        PARSE_ERROR,
        format!(
            "Parse error: the message is longer than {limit} bytes; send large data in smaller pieces"
        ),
    )
}

fn parse_problem(line: &[u8], err: &serde_json::Error) -> String {
    if let Err(utf8) = std::str::from_utf8(line) {
        return format!(
            "Parse error: the message is not valid UTF-8 (byte {} of the line); JSON-RPC messages are UTF-8 JSON text",
            utf8.valid_up_to() + 1
        );
    }
    if err.to_string().contains("escape") {
        return format!(
            "Parse error: {err}; a \\u escape must stand for a whole Unicode character (a surrogate such as \\ud800 needs its pair)"
        );
    }
    format!("Parse error: {err}; each line must be exactly one JSON-RPC message in JSON")
}

fn envelope(value: Value) -> Result<Message, Rejected> {
    let object = match value {
        Value::Object(object) => object,
        Value::Array(items) => {
            let message = if items.is_empty() {
                "Invalid request: an empty array is not a message"
            } else {
                "Invalid request: batches are not supported (MCP removed JSON-RPC batching); send each message on its own line"
            };
            return Err(reply(Value::Null, INVALID_REQUEST, message));
        }
        other => {
            return Err(reply(
                Value::Null,
                INVALID_REQUEST,
                format!(
                    "Invalid request: a message is a JSON object, not {}",
                    describe(&other)
                ),
            ))
        }
    };
    let has_method = object.contains_key("method");
    let has_result = object.contains_key("result");
    let has_error = object.contains_key("error");
    if !has_method && (has_result || has_error) {
        return response(&object, has_result && has_error);
    }
    let id = match object.get("id") {
        None => None,
        Some(id) if is_valid_id(id) => Some(id.clone()),
        Some(Value::Null) => {
            return Err(reply(
                Value::Null,
                INVALID_REQUEST,
                "Invalid request: the id is null; MCP request ids are strings or integers",
            ))
        }
        Some(other) => {
            return Err(reply(
                Value::Null,
                INVALID_REQUEST,
                format!(
                    "Invalid request: the id is {}; use a string or an integer",
                    describe(other)
                ),
            ))
        }
    };
    let reply_id = id.clone().unwrap_or(Value::Null);
    if let Some(problem) = version_problem(&object) {
        return Err(reply(reply_id, INVALID_REQUEST, problem));
    }
    let method = match object.get("method") {
        Some(Value::String(method)) => method.clone(),
        Some(other) => {
            return Err(reply(
                reply_id,
                INVALID_REQUEST,
                format!(
                    "Invalid request: the method is {}; it must be a string",
                    describe(other)
                ),
            ))
        }
        None => {
            return Err(reply(
                reply_id,
                INVALID_REQUEST,
                "Invalid request: no \"method\" (a request names one; a response carries \"result\" or \"error\")",
            ))
        }
    };
    if has_result || has_error {
        return Err(reply(
            reply_id,
            INVALID_REQUEST,
            "Invalid request: a request cannot also carry \"result\" or \"error\"",
        ));
    }
    let params = match object.get("params") {
        None | Some(Value::Null) => None,
        Some(params @ (Value::Object(_) | Value::Array(_))) => Some(params.clone()),
        Some(other) => {
            let problem = format!("the params are {}; they must be an object", describe(other));
            return match id {
                Some(id) => Err(reply(
                    id,
                    INVALID_REQUEST,
                    format!("Invalid request: {problem}"),
                )),
                None => Err(Rejected::Ignore(format!(
                    "notification {method:?}: {problem}"
                ))),
            };
        }
    };
    Ok(match id {
        Some(id) => Message::Request { id, method, params },
        None => Message::Notification { method },
    })
}

/// A result or error from the client: never answered, so any fault is only logged.
fn response(object: &Map<String, Value>, both: bool) -> Result<Message, Rejected> {
    let problem = if let Some(problem) = version_problem(object) {
        problem
    } else if both {
        "a response has either \"result\" or \"error\", not both".to_owned()
    } else {
        match object.get("id") {
            None => "a response without an id".to_owned(),
            // An error about a request the client could not read has a null id.
            Some(Value::Null) if object.contains_key("error") => return Ok(Message::Response),
            Some(id) if is_valid_id(id) => return Ok(Message::Response),
            Some(other) => format!("a response whose id is {}", describe(other)),
        }
    };
    Err(Rejected::Ignore(format!("ignored a response: {problem}")))
}

fn version_problem(object: &Map<String, Value>) -> Option<String> {
    match object.get("jsonrpc") {
        Some(Value::String(version)) if version == "2.0" => None,
        None => Some("Invalid request: \"jsonrpc\": \"2.0\" is missing".to_owned()),
        Some(other) => Some(format!(
            "Invalid request: \"jsonrpc\" must be \"2.0\", not {}",
            describe(other)
        )),
    }
}

fn reply(id: Value, code: i64, message: impl Into<String>) -> Rejected {
    Rejected::Reply(ErrorReply::new(id, code, message))
}

/// A string, or an integer (also written as `1.0`, which clients and the SDK accept).
fn is_valid_id(id: &Value) -> bool {
    match id {
        Value::String(_) => true,
        Value::Number(n) => {
            n.is_i64()
                // Below 2^53 every integral f64 is exact.
                || n.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0)
        }
        _ => false,
    }
}

/// The value's kind, never the value: replies do not echo input.
pub fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() => "an integer",
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() != 0.0) => "a fractional number",
        // Beyond i64, where `1e300` lands too.
        Value::Number(n) if n.is_u64() || n.as_f64().is_some_and(|f| f.abs() >= 9.2e18) => {
            "an integer out of range"
        }
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The top-level `"id"` of a line that is not valid JSON as a whole: the members before and
/// after it may hold invalid UTF-8, bad escapes or be cut off. `Null` when there is none or it
/// is not a string or integer.
pub fn recover_id(line: &[u8]) -> Value {
    let mut id = None;
    let mut deserializer = serde_json::Deserializer::from_slice(line);
    // An error past the id (the usual case: that is where the line is broken) is expected.
    let _ = IdSeed { id: &mut id }.deserialize(&mut deserializer);
    id.filter(is_valid_id).unwrap_or(Value::Null)
}

/// Visits a top-level object, keeping its `"id"` and skipping every other value without
/// decoding it (skipped strings are not checked for UTF-8 or escapes).
struct IdSeed<'a> {
    id: &'a mut Option<Value>,
}

impl<'de> DeserializeSeed<'de> for IdSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for IdSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON-RPC message object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key == "id" {
                *self.id = Some(map.next_value::<Value>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rejected(line: &[u8]) -> ErrorReply {
        match read(line) {
            Err(Rejected::Reply(reply)) => reply,
            other => panic!(
                "{:?}: expected a reply, got {other:?}",
                String::from_utf8_lossy(line)
            ),
        }
    }

    fn ignored(line: &[u8]) -> String {
        match read(line) {
            Err(Rejected::Ignore(why)) => why,
            other => panic!(
                "{:?}: expected to be ignored, got {other:?}",
                String::from_utf8_lossy(line)
            ),
        }
    }

    #[test]
    fn undecodable_text_is_a_parse_error_with_the_id_when_it_can_be_read() {
        let cases: &[(&[u8], Value)] = &[
            (
                b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"params\":{\"x\":\"\xff\"}}",
                json!(1),
            ),
            (
                b"{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"m\",\"params\":{\"\xff\":1}}",
                json!("a"),
            ),
            (
                b"{\"id\":2,\"params\":{\"x\":\"\\ud800\"},\"method\":\"m\",\"jsonrpc\":\"2.0\"}",
                json!(2),
            ),
            (b"{\"id\":3,\"x\":\"\xe2\x82\"}", json!(3)),
            (b"{\"id\":4,\"x\":\"\xc0\xaf\"}", json!(4)),
            (
                b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/list\"",
                json!(5),
            ),
            // The id itself, or a top-level key before it, cannot be read.
            (b"{\"\xff\":1,\"id\":6}", Value::Null),
            (b"{\"id\":\"\xff\"}", Value::Null),
            (b"{\"id\":{},\"x\":\"\xff\"}", Value::Null),
            (b"{\"x\":\"a\x00b\",\"id\":7}", Value::Null),
            (b"\x00\x01", Value::Null),
            (b"not json", Value::Null),
            (b"[1,", Value::Null),
            (b"\"\\ud800\"", Value::Null),
        ];
        for (line, id) in cases {
            let reply = rejected(line);
            assert_eq!(reply.code, PARSE_ERROR, "{line:?}");
            assert_eq!(&reply.id, id, "{line:?}");
            assert!(
                reply.message.starts_with("Parse error: "),
                "{}",
                reply.message
            );
        }
        assert!(rejected(b"{\"id\":1,\"x\":\"\xff\"}")
            .message
            .contains("not valid UTF-8"));
        assert!(rejected(b"{\"id\":1,\"x\":\"\\ud800\"}")
            .message
            .contains("surrogate"));
    }

    #[test]
    fn blank_lines_are_parse_errors() {
        for line in [&b""[..], b"   ", b"\t \x0c"] {
            let reply = rejected(line);
            assert_eq!(
                (reply.code, reply.id),
                (PARSE_ERROR, Value::Null),
                "{line:?}"
            );
        }
    }

    #[test]
    fn envelope_faults_are_invalid_requests_with_the_id_when_it_is_readable() {
        let cases: &[(Value, Value, &str)] = &[
            (json!([]), Value::Null, "empty array"),
            (
                json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]),
                Value::Null,
                "batches",
            ),
            (json!(5), Value::Null, "not an integer"),
            (json!("x"), Value::Null, "not a string"),
            (json!(null), Value::Null, "not null"),
            (
                json!({"id": 1, "method": "ping"}),
                json!(1),
                "\"jsonrpc\": \"2.0\" is missing",
            ),
            (
                json!({"jsonrpc": "1.0", "id": "a", "method": "ping"}),
                json!("a"),
                "not a string",
            ),
            (
                json!({"jsonrpc": 2.0, "id": 1, "method": "ping"}),
                json!(1),
                "not a number",
            ),
            (
                json!({"jsonrpc": "2.0", "id": 1, "method": 5}),
                json!(1),
                "method is an integer",
            ),
            (
                json!({"jsonrpc": "2.0", "method": ["x"]}),
                Value::Null,
                "method is an array",
            ),
            (
                json!({"jsonrpc": "2.0", "id": 1}),
                json!(1),
                "no \"method\"",
            ),
            (json!({}), Value::Null, "\"jsonrpc\""),
            (
                json!({"jsonrpc": "2.0", "id": 1, "method": "ping", "result": {}}),
                json!(1),
                "cannot also",
            ),
            (
                json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": "x"}),
                json!(1),
                "params are a string",
            ),
            (
                json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": 3}),
                json!(1),
                "params are an integer",
            ),
            (
                json!({"jsonrpc": "2.0", "id": null, "method": "ping"}),
                Value::Null,
                "id is null",
            ),
            (
                json!({"jsonrpc": "2.0", "id": true, "method": "ping"}),
                Value::Null,
                "id is a boolean",
            ),
            (
                json!({"jsonrpc": "2.0", "id": {}, "method": "ping"}),
                Value::Null,
                "id is an object",
            ),
            (
                json!({"jsonrpc": "2.0", "id": [1], "method": "ping"}),
                Value::Null,
                "id is an array",
            ),
            (
                json!({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}),
                Value::Null,
                "id is a fractional",
            ),
            (
                json!({"jsonrpc": "2.0", "id": u64::MAX, "method": "ping"}),
                Value::Null,
                "out of range",
            ),
            (
                json!({"jsonrpc": "2.0", "id": 1e300, "method": "ping"}),
                Value::Null,
                "out of range",
            ),
        ];
        for (message, id, needle) in cases {
            let reply = rejected(message.to_string().as_bytes());
            assert_eq!(reply.code, INVALID_REQUEST, "{message}");
            assert_eq!(&reply.id, id, "{message}");
            assert!(
                reply.message.contains(needle),
                "{message}: {}",
                reply.message
            );
            let line: Value = serde_json::from_slice(&reply.to_line()).unwrap();
            assert_eq!(
                line.as_object().unwrap().get("id"),
                Some(id),
                "the id member is always there"
            );
        }
    }

    #[test]
    fn notifications_and_responses_are_never_answered() {
        let why = ignored(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":"x"}"#);
        assert!(why.contains("notifications/cancelled"), "{why}");
        ignored(br#"{"jsonrpc":"2.0","id":1,"result":{},"error":{}}"#);
        ignored(br#"{"jsonrpc":"2.0","result":{}}"#);
        ignored(br#"{"id":1,"result":{}}"#);
        ignored(br#"{"jsonrpc":"2.0","id":[],"error":{}}"#);
        assert_eq!(
            read(br#"{"jsonrpc":"2.0","id":null,"error":{"code":1,"message":"m"}}"#),
            Ok(Message::Response)
        );
        assert_eq!(
            read(br#"{"jsonrpc":"2.0","id":"s","result":{}}"#),
            Ok(Message::Response)
        );
    }

    #[test]
    fn valid_messages_pass() {
        assert_eq!(
            read(br#" {"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}} "#),
            Ok(Message::Request {
                id: json!(7),
                method: "tools/call".into(),
                params: Some(json!({"name": "x"})),
            })
        );
        assert_eq!(
            read(br#"{"jsonrpc":"2.0","id":"a","method":"ping","params":null}"#),
            Ok(Message::Request {
                id: json!("a"),
                method: "ping".into(),
                params: None
            })
        );
        assert_eq!(
            read(br#"{"jsonrpc":"2.0","id":1.0,"method":"ping"}"#),
            Ok(Message::Request {
                id: json!(1.0),
                method: "ping".into(),
                params: None
            })
        );
        assert_eq!(
            read(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Ok(Message::Notification {
                method: "notifications/initialized".into()
            })
        );
        // A valid escape for a character outside the BMP is not a lone surrogate.
        assert!(
            read(br#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":"\ud83d\ude00"}}"#).is_ok()
        );
    }

    #[test]
    fn a_cut_off_line_still_names_its_id() {
        let reply = too_long(
            br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"x":"aaaa"#,
            10,
        );
        assert_eq!((reply.code, reply.id), (PARSE_ERROR, json!(9)));
        assert_eq!(too_long(b"aaaa", 10).id, Value::Null);
    }
}
