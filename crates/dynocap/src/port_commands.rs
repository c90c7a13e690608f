//! `dynocap port`: a sandbox's or task's port forwards listed, added or removed, and the
//! `--publish GUEST[:HOST]` values `run` and `task start` take. A forward listens on the host
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
    #[arg(long, value_name = "ADDR", requires = "guest_port")]
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

/// The forwards of a start's `--publish` values, all on 127.0.0.1.
pub fn publish_requests(published: &[(u16, u16)]) -> Vec<ForwardRequest> {
    published
        .iter()
        .map(|&(guest_port, host_port)| ForwardRequest {
            guest_port,
            host_port,
            host_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
        })
        .collect()
}

/// Lines saying where a start's published ports are, for under its table.
pub fn forward_lines(name: &str, forwards: &[PortForward]) -> String {
    forwards
        .iter()
        .map(|f| format!("  {name}: forward {}  {}\n", f.short(), f.url))
        .collect()
}

/// A `--publish` value: `GUEST` or `GUEST:HOST`.
pub fn publish_spec(text: &str) -> Result<(u16, u16), String> {
    let (guest, host) = match text.split_once(':') {
        Some((guest, host)) => (guest, Some(host)),
        None => (text, None),
    };
    let guest = guest_port(guest)
        .map_err(|err| format!("GUEST {err}; write GUEST[:HOST], e.g. 8000 or 8000:8080"))?;
    let host = match host {
        Some(host) => host_port(host)
            .map_err(|err| format!("HOST {err}; write GUEST[:HOST], e.g. 8000 or 8000:8080"))?,
        None => 0,
    };
    Ok((guest, host))
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
        assert_eq!(publish_spec("8000"), Ok((8000, 0)));
        assert_eq!(publish_spec("8000:8080"), Ok((8000, 8080)));
        assert_eq!(publish_spec("8000:0"), Ok((8000, 0)));
        for bad in ["0", "70000", "x", "8000:70000", "8000:", ":8000"] {
            let err = publish_spec(bad).expect_err(bad);
            assert!(err.contains("GUEST[:HOST]"), "{bad}: {err}");
        }
    }
}
