//! `dynocap port`: a sandbox's or task's port forwards listed, added or removed, and the
//! `--publish GUEST[:[ADDR:]HOST]` values `run` and `task start` take. A forward listens on the host
//! (127.0.0.1 unless `--address` says otherwise) and carries each connection to the guest
//! port through the sandbox's agent, in every network mode.

use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;

use clap::Args;
use dynocap_engine::ports::{ForwardRequest, PortForward};
use dynocap_engine::{Engine, Error};

use crate::output::{print_json, say, table};

/// `dynocap port`.
#[derive(Debug, Args)]
pub struct PortArgs {
    /// Name (or id) of the raw sandbox or task.
    pub name: String,
    /// The port a server listens on inside the sandbox (1-65535); without it, the sandbox's
    /// forwards are listed.
    #[arg(value_name = "GUESTPORT", value_parser = guest_port, conflicts_with = "remove")]
    pub guest_port: Option<u16>,
    /// The host port to listen on (default 0: a free one, printed).
    #[arg(value_name = "HOSTPORT", value_parser = host_port, requires = "guest_port")]
    pub host_port: Option<u16>,
    /// The host address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 opens
    /// the sandbox's server to the network).
    #[arg(long, value_name = "ADDR", value_parser = host_address, requires = "guest_port")]
    pub address: Option<IpAddr>,
    /// Stop forwarding this guest port.
    #[arg(long, value_name = "GUESTPORT", value_parser = guest_port)]
    pub remove: Option<u16>,
}

pub async fn port(engine: &Engine, json: bool, args: PortArgs) -> Result<ExitCode, Error> {
    if let Some(guest_port) = args.remove {
        let removed = engine.port_remove(&args.name, guest_port).await?;
        if json {
            print_json(&serde_json::json!({ "removed": removed }));
        } else {
            say!("removed {}\n", removed.short());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(guest_port) = args.guest_port else {
        let forwards = engine.ports(&args.name).await?;
        if json {
            print_json(&serde_json::json!({ "forwards": forwards }));
        } else {
            let rows: Vec<Vec<String>> = forwards
                .iter()
                .map(|f| vec![f.short(), f.url.clone()])
                .collect();
            say!("{}", table(&["FORWARD", "URL"], &rows));
        }
        return Ok(ExitCode::SUCCESS);
    };
    let request = ForwardRequest {
        guest_port,
        host_port: args.host_port.unwrap_or(0),
        host_address: args.address.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    };
    let forward = engine.port_add(&args.name, &request).await?;
    if json {
        print_json(&forward);
    } else {
        say!("{}  {}\n", forward.short(), forward.url);
    }
    Ok(ExitCode::SUCCESS)
}

/// Lines saying where a start's published ports are, for under its table.
pub fn forward_lines(name: &str, forwards: &[PortForward]) -> String {
    forwards
        .iter()
        .map(|f| format!("  {name}: forward {}  {}\n", f.short(), f.url))
        .collect()
}

/// The form of a `--publish` value, for its errors.
const PUBLISH_FORM: &str =
    "write GUEST[:[ADDR:]HOST], e.g. 8000, 8000:8080 or 8000:0.0.0.0:8080 ([::1] for IPv6)";

/// A `--publish` value: `GUEST`, `GUEST:HOST` (on 127.0.0.1) or `GUEST:ADDR:HOST` (on ADDR,
/// an IPv6 one in brackets), HOST 0 for a free port.
pub fn publish_spec(text: &str) -> Result<ForwardRequest, String> {
    let (guest, rest) = match text.split_once(':') {
        Some((guest, rest)) => (guest, Some(rest)),
        None => (text, None),
    };
    let guest_port = guest_port(guest).map_err(|err| format!("GUEST {err}; {PUBLISH_FORM}"))?;
    let (address, host) = match rest.map(|rest| rest.rsplit_once(':').ok_or(rest)) {
        None => (None, None),
        Some(Err(host)) => (None, Some(host)),
        Some(Ok((address, host))) => (Some(address), Some(host)),
    };
    let host_address = match address {
        None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        Some(address) => {
            host_address(address).map_err(|err| format!("ADDR {err}; {PUBLISH_FORM}"))?
        }
    };
    let host_port = match host {
        Some(host) => host_port(host).map_err(|err| format!("HOST {err}; {PUBLISH_FORM}"))?,
        None => 0,
    };
    Ok(ForwardRequest {
        guest_port,
        host_port,
        host_address,
    })
}

/// A host address to listen on, as `--address` and a `--publish` ADDR take it: an IP
/// address, an IPv6 one bare or in brackets. A host name is not resolved: which of its
/// addresses a listener would get is the resolver's choice, not the user's.
fn host_address(text: &str) -> Result<IpAddr, String> {
    text.strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or(text)
        .parse::<IpAddr>()
        .map_err(|_| {
            format!(
                "{text:?} is not an IP address; give one of this host's addresses, such as \
                 127.0.0.1 (the default), ::1 or 0.0.0.0 (a host name is not resolved)"
            )
        })
}

fn guest_port(text: &str) -> Result<u16, String> {
    match text.parse::<u64>() {
        Ok(port @ 1..=65535) => Ok(u16::try_from(port).map_err(|_| "out of range")?),
        Ok(_) => Err(
            "must be a port from 1 to 65535 (the port the server listens on in the sandbox)"
                .to_owned(),
        ),
        Err(_) => Err("is not a port number; give one from 1 to 65535".to_owned()),
    }
}

fn host_port(text: &str) -> Result<u16, String> {
    match text.parse::<u64>() {
        Ok(port @ 0..=65535) => Ok(u16::try_from(port).map_err(|_| "out of range")?),
        Ok(_) => Err("must be a port from 1 to 65535, or 0 for a free one".to_owned()),
        Err(_) => {
            Err("is not a port number; give one from 1 to 65535, or 0 for a free one".to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_values_parse_and_bad_ones_say_the_form() {
        let at = |guest_port, host_port, address: &str| ForwardRequest {
            guest_port,
            host_port,
            host_address: address.parse().unwrap(),
        };
        assert_eq!(publish_spec("8000"), Ok(at(8000, 0, "127.0.0.1")));
        assert_eq!(publish_spec("8000:8080"), Ok(at(8000, 8080, "127.0.0.1")));
        assert_eq!(publish_spec("8000:0"), Ok(at(8000, 0, "127.0.0.1")));
        // An address only when the user passes one.
        assert_eq!(
            publish_spec("8000:0.0.0.0:8080"),
            Ok(at(8000, 8080, "0.0.0.0"))
        );
        assert_eq!(publish_spec("8000:[::1]:0"), Ok(at(8000, 0, "::1")));
        assert_eq!(publish_spec("8000:::1:9000"), Ok(at(8000, 9000, "::1")));
        for bad in [
            "0",
            "70000",
            "x",
            "8000:70000",
            "8000:",
            ":8000",
            "8000:localhost:8080",
            "8000:127.0.0.1:",
            "8000:127.0.0.1:x",
            "127.0.0.1:8080:8000",
        ] {
            let err = publish_spec(bad).expect_err(bad);
            assert!(err.contains("GUEST[:[ADDR:]HOST]"), "{bad}: {err}");
        }
    }

    /// `--address` takes what a `--publish` ADDR takes, an IPv6 address in brackets too,
    /// and refuses a host name saying what to give instead.
    #[test]
    fn address_values_parse_as_publish_addrs_do() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            port: PortArgs,
        }
        let parse = |address: &str| {
            Cli::try_parse_from(["port", "web", "8000", "--address", address])
                .map(|cli| cli.port.address)
                .map_err(|err| err.to_string())
        };
        for (given, address) in [
            ("127.0.0.1", "127.0.0.1"),
            ("0.0.0.0", "0.0.0.0"),
            ("::1", "::1"),
            ("[::1]", "::1"),
        ] {
            assert_eq!(parse(given), Ok(Some(address.parse().unwrap())), "{given}");
        }
        for bad in ["localhost", "example.com", "", "[::1", "127.0.0.1:80"] {
            let err = parse(bad).expect_err(bad);
            assert!(
                err.contains("is not an IP address; give one of this host's addresses"),
                "{bad}: {err}"
            );
        }
        assert!(publish_spec("8000:localhost:0")
            .expect_err("a host name")
            .contains("(a host name is not resolved)"));
    }
}
