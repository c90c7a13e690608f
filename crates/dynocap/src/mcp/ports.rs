//! Port forwards over MCP: the `publish` parameter of `dynocap_run` and
//! `dynocap_task_start`, and the `dynocap_port` tool. Opening a listener on the host is the
//! host's decision: refused (`policy_denied`) unless the server was started with
//! `DYNOCAP_MCP_ALLOW_PUBLISH=1`, and always on 127.0.0.1 (a caller never names an address).
//! Listing and removing need no flag.

use std::net::{IpAddr, Ipv4Addr};

use serde_json::{json, Value};

use dynocap_engine::ports::{ForwardRequest, MAX_FORWARDS};
use dynocap_engine::{Engine, Error};

use super::args::Args;
use super::output::Output;
use super::tools::{Hints, Kind, Param, ToolDef};

const HINTS_PORT: Hints = Hints {
    read_only: false,
    destructive: false,
    idempotent: false,
    open_world: false,
};

/// The `publish` parameter of the start tools.
pub fn publish_param() -> Param {
    Param {
        name: "publish",
        kind: Kind::PortList,
        required: false,
        description: "Ports to forward from the host once the sandbox is up: [{guestPort, \
                      hostPort?}], at most 32. Each listens on 127.0.0.1:hostPort on the host \
                      (hostPort 0 or absent: a free port) and reaches 127.0.0.1:guestPort in \
                      the sandbox, whatever its network; the result's forwards list the URLs \
                      to give the user. Needs DYNOCAP_MCP_ALLOW_PUBLISH=1 on the host.",
    }
}

/// `dynocap_port`.
pub fn port_tool() -> ToolDef {
    ToolDef {
        name: "dynocap_port",
        title: "Forward a port to a sandbox",
        description: "Lists, opens or removes a sandbox's or task's port forwards. With \
guestPort, forwards 127.0.0.1:hostPort on the host (hostPort 0 or absent: a free port) to \
127.0.0.1:guestPort inside the sandbox, through DynoCap's own channel to the guest, so it \
works in every network mode; give the user the forward's url to open what the sandbox serves. \
remove: true stops the forward of guestPort. Without guestPort, lists the forwards. Returns \
{forwards: [{guestPort, hostAddress, hostPort, url}]} (all of the sandbox's, after the call), \
with forward (the one opened) or removed (the one stopped). Forwards end with their sandbox. \
Opening one needs DYNOCAP_MCP_ALLOW_PUBLISH=1 on the host (else policy_denied); a host port \
in use is refused with conflict.",
        params: vec![
            Param {
                name: "name",
                kind: Kind::String {
                    default: None,
                    pattern: None,
                },
                required: true,
                description: "Raw sandbox name, or task name or ID.",
            },
            Param {
                name: "guestPort",
                kind: Kind::OptionalInteger { min: 1, max: 65535 },
                required: false,
                description: "The port a server listens on inside the sandbox. Absent: list \
                              the forwards.",
            },
            Param {
                name: "hostPort",
                kind: Kind::Integer {
                    min: 0,
                    max: 65535,
                    default: 0,
                },
                required: false,
                description: "The port on the host's 127.0.0.1 (default 0: a free one, given \
                              in the result).",
            },
            Param {
                name: "remove",
                kind: Kind::Boolean { default: false },
                required: false,
                description: "Stop the forward of guestPort instead of opening one.",
            },
        ],
        output_schema: json!({
            "type": "object",
            "properties": {
                "forwards": forwards_schema("The sandbox's forwards after the call, oldest first."),
                "forward": forward_schema(),
                "removed": forward_schema()
            },
            "required": ["forwards"]
        }),
        hints: HINTS_PORT,
    }
}

/// One forward in results.
pub fn forward_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "guestPort": { "type": "integer" },
            "hostAddress": { "type": "string", "description": "127.0.0.1 unless the user chose another address with the CLI." },
            "hostPort": { "type": "integer" },
            "url": { "type": "string", "description": "http://hostAddress:hostPort/ (on 127.0.0.1 for a forward on every address), for the user to open on this host." }
        },
        "required": ["guestPort", "hostAddress", "hostPort", "url"]
    })
}

/// A list of forwards in results.
pub fn forwards_schema(description: &str) -> Value {
    json!({ "type": "array", "items": forward_schema(), "description": description })
}

/// The forwards a start's `publish` asks for, checked strictly: each item an object of
/// `guestPort` (1-65535) and optional `hostPort` (0-65535), nothing else.
pub fn publish_requests(args: &Args<'_>) -> Result<Vec<ForwardRequest>, Error> {
    let Some(value) = args.value("publish")? else {
        return Ok(Vec::new());
    };
    let Value::Array(items) = value else {
        return Err(Error::invalid(
            "publish must be an array of {guestPort, hostPort?} objects",
        ));
    };
    if items.len() > MAX_FORWARDS {
        return Err(Error::invalid(format!(
            "publish has {} entries; give at most {MAX_FORWARDS}",
            items.len()
        )));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let Value::Object(fields) = item else {
                return Err(Error::invalid(format!(
                    "publish[{i}] must be an object {{guestPort, hostPort?}}"
                )));
            };
            if let Some(other) = fields
                .keys()
                .find(|k| *k != "guestPort" && *k != "hostPort")
            {
                return Err(Error::invalid(format!(
                    "publish[{i}] does not take {other:?}; its fields are guestPort and hostPort (forwards always listen on 127.0.0.1)"
                )));
            }
            let port = |name: &str, min: u64| -> Result<Option<u16>, Error> {
                match fields.get(name) {
                    None | Some(Value::Null) => Ok(None),
                    Some(value) => value
                        .as_u64()
                        .filter(|n| (min..=65535).contains(n))
                        .and_then(|n| u16::try_from(n).ok())
                        .map(Some)
                        .ok_or_else(|| {
                            Error::invalid(format!(
                                "publish[{i}].{name} must be a whole number from {min} to 65535, not {value}"
                            ))
                        }),
                }
            };
            let guest_port = port("guestPort", 1)?.ok_or_else(|| {
                Error::invalid(format!(
                    "publish[{i}] needs guestPort, the port the server listens on in the sandbox"
                ))
            })?;
            Ok(ForwardRequest {
                guest_port,
                host_port: port("hostPort", 0)?.unwrap_or(0),
                host_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            })
        })
        .collect()
}

/// What a call of `dynocap_port` asks for, before the policy is applied.
pub enum PortCall {
    List,
    Open(ForwardRequest),
    Remove(u16),
}

impl PortCall {
    pub fn parse(args: &Args<'_>) -> Result<Self, Error> {
        let guest_port = args.integer("guestPort")?;
        let host_port = args.integer("hostPort")?;
        let remove = args.boolean("remove")?.unwrap_or(false);
        let port = |n: u64| u16::try_from(n).map_err(|_| Error::invalid("a port is at most 65535"));
        match (guest_port, remove) {
            (None, true) => Err(Error::invalid(
                "remove needs guestPort: the guest port whose forward to stop",
            )),
            (None, false) if host_port.is_some() => Err(Error::invalid(
                "hostPort needs guestPort: the port inside the sandbox to forward to",
            )),
            (None, false) => Ok(Self::List),
            (Some(_), true) if host_port.is_some() => Err(Error::invalid(
                "remove takes guestPort alone; a forward is removed by its guest port",
            )),
            (Some(guest), true) => Ok(Self::Remove(port(guest)?)),
            (Some(guest), false) => Ok(Self::Open(ForwardRequest {
                guest_port: port(guest)?,
                host_port: port(host_port.unwrap_or(0))?,
                host_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            })),
        }
    }

    /// Runs the call (the policy already allowed it).
    pub async fn run(self, engine: &Engine, name: &str) -> Result<Output, Error> {
        let mut result = serde_json::Map::new();
        match self {
            Self::List => {}
            Self::Open(request) => {
                let forward = engine.port_add(name, &request).await?;
                result.insert("forward".into(), to_value(&forward)?);
            }
            Self::Remove(guest_port) => {
                let removed = engine.port_remove(name, guest_port).await?;
                result.insert("removed".into(), to_value(&removed)?);
            }
        }
        let forwards = engine.ports(name).await?;
        result.insert("forwards".into(), to_value(&forwards)?);
        Output::json(&Value::Object(result))
    }
}

fn to_value<T: serde::Serialize>(value: &T) -> Result<Value, Error> {
    serde_json::to_value(value)
        .map_err(|err| Error::internal(format!("cannot encode the result: {err}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::mcp::tools::definitions;

    fn parse(tool: &str, arguments: Value) -> Result<Vec<ForwardRequest>, Error> {
        let defs = definitions();
        let tool = defs.iter().find(|t| t.name == tool).unwrap();
        let Value::Object(map) = arguments else {
            panic!("arguments are an object")
        };
        publish_requests(&Args::new(tool, Some(map))?)
    }

    #[test]
    fn publish_is_parsed_strictly_and_always_on_loopback() {
        for tool in ["dynocap_run", "dynocap_task_start"] {
            let parsed = parse(
                tool,
                json!({"name": "a", "publish": [{"guestPort": 8000}, {"guestPort": 3000, "hostPort": 8080}]}),
            )
            .unwrap();
            assert_eq!(
                parsed,
                [
                    ForwardRequest {
                        guest_port: 8000,
                        host_port: 0,
                        host_address: IpAddr::V4(Ipv4Addr::LOCALHOST)
                    },
                    ForwardRequest {
                        guest_port: 3000,
                        host_port: 8080,
                        host_address: IpAddr::V4(Ipv4Addr::LOCALHOST)
                    }
                ]
            );
        }
        let many: Vec<Value> = (1..=33).map(|p| json!({ "guestPort": p })).collect();
        for (bad, says) in [
            (
                json!({"guestPort": 8000, "hostAddress": "0.0.0.0"}),
                "127.0.0.1",
            ),
            (json!({"guestPort": 0}), "from 1 to 65535"),
            (json!({"guestPort": 70000}), "from 1 to 65535"),
            (json!({"guestPort": 80.5}), "whole number"),
            (json!({"hostPort": 8080}), "needs guestPort"),
            (json!({"guestPort": 80, "hostPort": -1}), "from 0 to 65535"),
            (json!(8000), "must be an object"),
        ] {
            let err = parse("dynocap_run", json!({"name": "a", "publish": [bad]})).unwrap_err();
            assert_eq!(err.code, dynocap_engine::ErrorCode::InvalidArgument);
            assert!(err.message.contains(says), "{}", err.message);
        }
        let err = parse("dynocap_run", json!({"name": "a", "publish": many})).unwrap_err();
        assert!(err.message.contains("at most 32"), "{}", err.message);
        let err = parse("dynocap_run", json!({"name": "a", "publish": "8000"})).unwrap_err();
        assert!(err.message.contains("must be an array"), "{}", err.message);
        assert!(parse("dynocap_run", json!({"name": "a"}))
            .unwrap()
            .is_empty());
    }
}
