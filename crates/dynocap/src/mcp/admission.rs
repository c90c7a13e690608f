//! Which client messages the MCP SDK may see. Left alone, the SDK hands a request whose params
//! do not fit its method to the catch-all custom request (answered "method not found"),
//! answers well-formed JSON it cannot read with an error that has no id (notifications
//! included), and ends the session on a notification or response that arrives before the
//! request that opens it. The stdio framing passes this gate every message whose envelope is
//! valid, in order; the gate parses it exactly as the SDK will and answers (with the request's
//! id) or drops what the SDK would mishandle. With `server`, the only file that names the SDK.

use rmcp::model::{
    CallToolRequest, CallToolRequestMethod, ClientJsonRpcMessage, ClientRequest, ConstString,
    DiscoverRequest, DiscoverRequestMethod, GetMeta, InitializeRequest, InitializeResultMethod,
    ListToolsRequest, ListToolsRequestMethod, PingRequest, PingRequestMethod, ProtocolVersion,
};
use serde_json::Value;

use super::jsonrpc::{describe, ErrorReply, Message, Rejected, INVALID_PARAMS, METHOD_NOT_FOUND};
use super::stdio::Gate;

/// The methods this server answers. A request for one of them whose params do not fit gets
/// "invalid params"; a request for a method the SDK does not know gets "method not found".
const SERVED: [&str; 5] = [
    InitializeResultMethod::VALUE,
    PingRequestMethod::VALUE,
    DiscoverRequestMethod::VALUE,
    ListToolsRequestMethod::VALUE,
    CallToolRequestMethod::VALUE,
];

/// Client input quoted in a reply or the log is cut to this many characters.
const QUOTE_LIMIT: usize = 200;

pub struct Admission {
    /// The protocol versions the server speaks (the SDK opens an inline session only for one).
    versions: Vec<ProtocolVersion>,
    /// Whether the SDK has left its opening phase, in which it takes requests only.
    open: bool,
}

impl Admission {
    pub fn new(versions: Vec<ProtocolVersion>) -> Self {
        Self {
            versions,
            open: false,
        }
    }

    /// Follows the SDK's opening phase, which ends with `initialize`, or with the first other
    /// request (not ping or discover) whose `_meta` carries the client's capabilities and a
    /// protocol version the server speaks. Only the order of messages decides it, so the gate,
    /// which runs ahead of the SDK, agrees with it.
    fn note(&mut self, request: &ClientRequest) {
        self.open = self.open
            || match request {
                ClientRequest::InitializeRequest(_) => true,
                ClientRequest::PingRequest(_) | ClientRequest::DiscoverRequest(_) => false,
                other => {
                    let meta = other.get_meta();
                    meta.missing_required_keys(&ProtocolVersion::V_2026_07_28)
                        .is_empty()
                        && meta
                            .protocol_version()
                            .is_some_and(|version| self.versions.contains(&version))
                }
            };
    }
}

impl Gate for Admission {
    fn admit(&mut self, line: &[u8], message: &Message) -> Result<(), Rejected> {
        // The SDK parses the same bytes into the same type, so it accepts exactly what passes.
        let parsed = serde_json::from_slice::<ClientJsonRpcMessage>(line);
        match message {
            Message::Request { id, method, params } => match parsed {
                Ok(ClientJsonRpcMessage::Request(request))
                    if !matches!(request.request, ClientRequest::CustomRequest(_)) =>
                {
                    self.note(&request.request);
                    Ok(())
                }
                _ if SERVED.contains(&method.as_str()) => Err(Rejected::Reply(ErrorReply::new(
                    id.clone(),
                    INVALID_PARAMS,
                    params_problem(method, params.as_ref()),
                ))),
                _ => Err(Rejected::Reply(ErrorReply::new(
                    id.clone(),
                    METHOD_NOT_FOUND,
                    format!(
                        "Method not found: {}; this server answers {}",
                        quote(method),
                        SERVED.join(", ")
                    ),
                ))),
            },
            Message::Notification { method } if !self.open => Err(Rejected::Ignore(format!(
                "notification {} before the session was initialized",
                quote(method)
            ))),
            Message::Notification { method } => parsed.map(drop).map_err(|err| {
                Rejected::Ignore(format!(
                    "notification {}: {}",
                    quote(method),
                    quote(&err.to_string())
                ))
            }),
            Message::Response if !self.open => Err(Rejected::Ignore(
                "a response before the session was initialized".to_owned(),
            )),
            Message::Response => parsed.map(drop).map_err(|err| {
                Rejected::Ignore(format!("a response: {}", quote(&err.to_string())))
            }),
        }
    }
}

/// Why the params of a request for a served method do not fit it.
fn params_problem(method: &str, params: Option<&Value>) -> String {
    let detail = match method {
        CallToolRequestMethod::VALUE => call_tool_problem(params),
        _ => None,
    }
    .or_else(|| typed_problem(method, params))
    .unwrap_or_else(|| "they do not fit the method".to_owned());
    format!("Invalid params for {method}: {detail}")
}

/// The faults clients make with `tools/call`, each named with the shape that fixes it.
fn call_tool_problem(params: Option<&Value>) -> Option<String> {
    const SHAPE: &str = r#"{"name": "<tool>", "arguments": {...}}"#;
    let Some(params) = params else {
        return Some(format!("params are missing; send {SHAPE}"));
    };
    let Some(params) = params.as_object() else {
        return Some(format!(
            "params must be an object {SHAPE}, not {}",
            describe(params)
        ));
    };
    match params.get("name") {
        None => return Some(format!("params.name is missing; send {SHAPE}")),
        Some(Value::String(_)) => {}
        Some(other) => {
            return Some(format!(
                "params.name must be a string naming the tool, not {}",
                describe(other)
            ))
        }
    }
    match params.get("arguments") {
        None | Some(Value::Null | Value::Object(_)) => None,
        Some(other) => Some(format!(
            "params.arguments must be an object of the tool's parameters by name, not {}",
            describe(other)
        )),
    }
}

/// What the SDK's own type for the method says is wrong.
fn typed_problem(method: &str, params: Option<&Value>) -> Option<String> {
    let mut request = serde_json::Map::new();
    request.insert("method".to_owned(), Value::from(method));
    if let Some(params) = params {
        request.insert("params".to_owned(), params.clone());
    }
    let request = Value::Object(request);
    let parsed = match method {
        InitializeResultMethod::VALUE => {
            serde_json::from_value::<InitializeRequest>(request).map(drop)
        }
        PingRequestMethod::VALUE => serde_json::from_value::<PingRequest>(request).map(drop),
        DiscoverRequestMethod::VALUE => {
            serde_json::from_value::<DiscoverRequest>(request).map(drop)
        }
        ListToolsRequestMethod::VALUE => {
            serde_json::from_value::<ListToolsRequest>(request).map(drop)
        }
        CallToolRequestMethod::VALUE => {
            serde_json::from_value::<CallToolRequest>(request).map(drop)
        }
        _ => return None,
    };
    parsed.err().map(|err| quote(&err.to_string()))
}

/// Client input (or an error quoting it), cut to a length that fits a log line.
fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTE_LIMIT) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::mcp::jsonrpc;

    fn admit(gate: &mut Admission, line: &str) -> Result<(), Rejected> {
        let message = jsonrpc::read(line.as_bytes()).expect("a valid envelope");
        gate.admit(line.as_bytes(), &message)
    }

    fn reply(gate: &mut Admission, line: &str) -> ErrorReply {
        match admit(gate, line) {
            Err(Rejected::Reply(reply)) => reply,
            other => panic!("{line}: expected a reply, got {other:?}"),
        }
    }

    fn gate() -> Admission {
        Admission::new(ProtocolVersion::KNOWN_VERSIONS.to_vec())
    }

    const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

    #[test]
    fn notifications_and_responses_wait_for_the_session() {
        let mut gate = gate();
        assert!(matches!(
            admit(&mut gate, INITIALIZED),
            Err(Rejected::Ignore(_))
        ));
        let response = r#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
        assert!(matches!(
            admit(&mut gate, response),
            Err(Rejected::Ignore(_))
        ));
        // Ping and an inline request without its metadata leave the SDK waiting.
        admit(&mut gate, r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).unwrap();
        admit(
            &mut gate,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        )
        .unwrap();
        assert!(matches!(
            admit(&mut gate, INITIALIZED),
            Err(Rejected::Ignore(_))
        ));
        admit(&mut gate, INITIALIZE).unwrap();
        admit(&mut gate, INITIALIZED).unwrap();
        admit(&mut gate, response).unwrap();
    }

    #[test]
    fn an_inline_request_with_its_metadata_opens_the_session() {
        let mut gate = gate();
        admit(
            &mut gate,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
        )
        .unwrap();
        admit(&mut gate, INITIALIZED).unwrap();
    }

    #[test]
    fn params_that_do_not_fit_a_served_method_are_invalid_params() {
        let mut gate = gate();
        admit(&mut gate, INITIALIZE).unwrap();
        let cases = [
            (r#""method":"tools/call""#, "params are missing"),
            (
                r#""method":"tools/call","params":null"#,
                "params are missing",
            ),
            (r#""method":"tools/call","params":[1]"#, "not an array"),
            (
                r#""method":"tools/call","params":{}"#,
                "params.name is missing",
            ),
            (
                r#""method":"tools/call","params":{"name":5}"#,
                "params.name must be a string",
            ),
            (
                r#""method":"tools/call","params":{"name":"x","arguments":[]}"#,
                "not an array",
            ),
            (
                r#""method":"tools/call","params":{"name":"x","arguments":"a"}"#,
                "not a string",
            ),
            (
                r#""method":"tools/call","params":{"name":"x","arguments":1}"#,
                "not an integer",
            ),
            (
                r#""method":"tools/call","params":{"name":"x","_meta":1}"#,
                "Invalid params for tools/call",
            ),
            (r#""method":"initialize","params":{}"#, "protocolVersion"),
            (
                r#""method":"tools/list","params":[]"#,
                "Invalid params for tools/list",
            ),
        ];
        for (body, needle) in cases {
            let line = format!(r#"{{"jsonrpc":"2.0","id":"r",{body}}}"#);
            let reply = reply(&mut gate, &line);
            assert_eq!(
                (reply.code, &reply.id),
                (INVALID_PARAMS, &Value::from("r")),
                "{line}"
            );
            assert!(reply.message.contains(needle), "{line}: {}", reply.message);
        }
        admit(
            &mut gate,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x","arguments":{}}}"#,
        )
        .unwrap();
    }

    #[test]
    fn unknown_methods_are_method_not_found_and_bad_notifications_are_dropped() {
        let mut gate = gate();
        admit(&mut gate, INITIALIZE).unwrap();
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"no/such"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"no/such","params":[1]}"#,
        ] {
            let reply = reply(&mut gate, line);
            assert_eq!(
                (reply.code, reply.id),
                (METHOD_NOT_FOUND, Value::from(1)),
                "{line}"
            );
            assert!(reply.message.contains("tools/call"), "{}", reply.message);
        }
        assert!(matches!(
            admit(
                &mut gate,
                r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":[1]}"#
            ),
            Err(Rejected::Ignore(_))
        ));
        // A notification the SDK reads as a custom one reaches it (and is not answered there).
        admit(
            &mut gate,
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}"#,
        )
        .unwrap();
    }

    #[test]
    fn quotes_are_bounded() {
        let long = "é".repeat(QUOTE_LIMIT + 5);
        assert_eq!(quote(&long).chars().count(), QUOTE_LIMIT + 1);
        assert_eq!(quote("short"), "short");
    }
}
