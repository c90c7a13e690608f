//! The raw sandbox object, as results and listings show it, and the time format they use.

use serde::Serialize;

use crate::model::lifecycle::State;

/// The raw sandbox object (docs/mcp.md, "Sandbox").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
    pub name: String,
    pub state: State,
    pub backend: String,
    pub network: String,
    pub cpus: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskMB")]
    pub disk_mb: u64,
    pub ttl_seconds: u64,
    pub created_at: String,
    pub expires_at: String,
    /// Hosts the egress proxy lets through (HTTPS), for a `filtered` sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_allowlist: Option<Vec<String>>,
    /// The image the sandbox boots (`host` or a built image's name).
    pub image: String,
    /// The built image's content id (none for `host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// The image whose kernel its vm boots when not the image's own: named (`--kernel`), or
    /// lent to a container image by the newest image on the host that has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// What a running sandbox lost and what to do (its network ended), when that needs saying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Its running jobs (commands that outlive the call that started them), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<RunningJob>,
    /// Its port forwards (host listeners carried to guest ports), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forwards: Vec<PortForward>,
}

/// A port forward: connections to `host_address:host_port` on the host reach
/// `127.0.0.1:guest_port` inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortForward {
    pub guest_port: u16,
    pub host_address: String,
    pub host_port: u16,
    /// `http://ADDRESS:PORT/`, for a person to open (IPv6 addresses in brackets); a forward
    /// on every address (`0.0.0.0`, `::`) is given with the loopback address it also listens
    /// on, which a browser opens (a wildcard address is not one to connect to).
    pub url: String,
}

impl PortForward {
    pub fn new(guest_port: u16, host: std::net::SocketAddr) -> Self {
        let reachable = match host.ip() {
            std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
                std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, host.port()))
            }
            std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
                std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, host.port()))
            }
            _ => host,
        };
        Self {
            guest_port,
            host_address: host.ip().to_string(),
            host_port: host.port(),
            url: format!("http://{reachable}/"),
        }
    }

    /// As listings show it: `127.0.0.1:8080->8000`.
    pub fn short(&self) -> String {
        let address = match self.host_address.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(_)) => format!("[{}]", self.host_address),
            _ => self.host_address.clone(),
        };
        format!("{address}:{}->{}", self.host_port, self.guest_port)
    }
}

/// A running job as listings show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunningJob {
    pub job: String,
    /// The start of its command, on one line.
    pub command: String,
    pub started_at: String,
    /// How long it has run, as of the listing.
    #[serde(default)]
    pub running_seconds: u64,
}

/// A time as results show it: RFC 3339, to the second, in UTC.
pub fn rfc3339(time: chrono::DateTime<chrono::Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::PortForward;

    #[test]
    fn a_forward_s_url_is_one_to_open() {
        let at = |addr: &str| PortForward::new(8000, addr.parse().unwrap());
        let loopback = at("127.0.0.1:8080");
        assert_eq!(loopback.url, "http://127.0.0.1:8080/");
        assert_eq!(loopback.short(), "127.0.0.1:8080->8000");
        assert_eq!(at("[::1]:8080").url, "http://[::1]:8080/");
        // Every address: listed as such, opened on loopback.
        let all = at("0.0.0.0:8080");
        assert_eq!(
            (all.host_address.as_str(), all.url.as_str()),
            ("0.0.0.0", "http://127.0.0.1:8080/")
        );
        assert_eq!(all.short(), "0.0.0.0:8080->8000");
        assert_eq!(at("[::]:8080").url, "http://[::1]:8080/");
    }
}
