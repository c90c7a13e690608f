//! A sandbox's egress on the host side: what it may reach ([`EgressSpec`], fixed when the
//! sandbox is created and kept in its record), and, in the supervisor, the proxy that enforces
//! it for every tunnel the guest opens, with each decision logged to `network.jsonl`.
//!
//! On a jail whose network namespace the supervisor may join (a root supervisor), the
//! proxy's listener is a socket of the supervisor's own in the guest's network
//! ([`GuestListener`]): a guest's connection reaches the proxy as a socket, with no agent and
//! no channel between them, and once nothing reads its bytes any more they move in the kernel
//! (`Proxy::serve_socket`). Otherwise (a VM, a rootless jail) the agent listens and carries
//! each connection here as a tunnel over its channel.
//!
//! The guest decides nothing: its agent only carries connections here. The allowlist comes
//! from the person running DynoCap (`DYNOCAP_EGRESS_ALLOW`, `--allow-host`, whose entries may
//! name a registry such as `@pypi`: see `HostPattern::parse_entry`), from DynoCap's defaults
//! (the npm registry) and from the task's own git host; never from the guest.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use dynocap_netproxy::{
    CommandRefusals, DecisionSink, HostPattern, JsonlSink, Policy, Proxy, RefusalWindow,
    ResolveOverrides, Rule, Summary, SummarySink,
};
use dynocap_proto::{EgressRequest, Request, Response};

use crate::foundation::error::{Coded, Context, Error, ErrorCode, Result};
use crate::model::config::EgressConfig;
pub use crate::model::egress_spec::EgressSpec;
use crate::model::spec::Network;
use crate::supervisor::agent_conn::{AgentConn, TunnelHandler};

// Log lines keep the target they had before the engine's layer folders: people, the e2e
// tests and log filters read them by it.
const LOG_TARGET: &str = "dynocap_engine::egress";

/// The port the guest's egress listener takes on its loopback.
pub const PROXY_PORT: u16 = 3128;
/// Hosts every `filtered` sandbox may reach: the registry npm uses by default.
pub const DEFAULT_ALLOW: &[&str] = &["registry.npmjs.org"];
/// Tunnels served at once. The agent opens at most 256; this bounds the host's share even if
/// something else in the guest spoke for it.
const MAX_TUNNELS: usize = 512;
/// Connections the supervisor's own listener in a jail serves at once: the agent's bound when
/// it listens. A connection beyond it is closed at once.
const MAX_GUEST_CONNECTIONS: usize = 256;
/// Largest `DYNOCAP_EXTRA_CA` file.
const EXTRA_CA_MAX: u64 = 256 * 1024;
/// Largest bundle sent to the guest: it travels in one request, under the frame bound (1 MiB).
const CA_BUNDLE_MAX: usize = 900 * 1024;

impl EgressSpec {
    /// The spec from the operator's configuration, hosts the person starting the sandbox
    /// added, and the task's git host. `filtered` selects whether the allowlist applies at all
    /// (a `none` task still clones through the proxy, opened to its git host alone).
    pub fn from_config(
        config: &EgressConfig,
        filtered: bool,
        added: &[String],
        git_hosts: &[String],
    ) -> Result<Self> {
        let mut allow: Vec<String> = Vec::new();
        if filtered {
            let configured = config.allow.clone().unwrap_or_default();
            // Each entry with where it came from: an entry of the host's variable is the
            // host's to fix, which its error says.
            let entries = DEFAULT_ALLOW
                .iter()
                .map(|s| ((*s).to_owned(), false))
                .chain(git_hosts.iter().map(|h| (h.clone(), false)))
                .chain(split_list(&configured).map(|e| (e, true)))
                .chain(added.iter().map(|h| (h.clone(), false)));
            for (entry, configured) in entries {
                // The pattern's error names the entry and the fix. A named registry (`@pypi`)
                // is recorded as its hosts, so the allowlist shown is the one enforced.
                let patterns = HostPattern::parse_entry(&entry).map_err(|err| {
                    Error::invalid(if configured {
                        format!(
                            "egress allowlist: DYNOCAP_EGRESS_ALLOW={configured_text}: {err}; \
                             correct or remove the entry in the environment DynoCap runs in",
                            configured_text = config.allow.as_deref().unwrap_or_default()
                        )
                    } else {
                        format!("egress allowlist: {err}")
                    })
                })?;
                for pattern in patterns {
                    let text = pattern.to_string();
                    if !allow.contains(&text) {
                        allow.push(text);
                    }
                }
            }
        } else {
            Self::refuse_hosts(added)?;
        }
        let resolve_setting = config.resolve.clone().unwrap_or_default();
        let resolve: Vec<String> = split_list(&resolve_setting).collect();
        let spec = Self {
            allow,
            resolve,
            extra_ca: config.extra_ca(),
        };
        spec.overrides()?;
        if let Some(path) = &spec.extra_ca {
            read_extra_ca(path)?;
        }
        Ok(spec)
    }

    /// Refuses hosts added to a sandbox whose network is not `filtered`.
    pub fn refuse_hosts(added: &[String]) -> Result<()> {
        if added.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid(
                "allowed hosts only apply to network \"filtered\"; pass network filtered or drop them",
            ))
        }
    }

    /// The policy once the sandbox is up: HTTPS to the allowlist.
    pub fn policy(&self) -> Result<Policy> {
        Policy::https_hosts(&self.allow).map_err(|err| EgressFailure::RecordedAllowlist(err).into())
    }

    pub fn overrides(&self) -> Result<ResolveOverrides> {
        ResolveOverrides::parse(&self.resolve.join(",")).map_err(|err| {
            Error::invalid(format!(
                "DYNOCAP_RESOLVE: {err}; use host:port:address entries separated by commas, as curl's --resolve"
            ))
        })
    }

    /// The extra CA certificates alone (`DYNOCAP_EXTRA_CA`), checked, or `None` when there
    /// are none: what joins the guest's own system bundles.
    pub fn extra_ca_pem(&self) -> Result<Option<String>> {
        self.extra_ca.as_deref().map(read_extra_ca).transpose()
    }

    /// The CA bundle the guest gets: the system's certificates plus the extra ones, or
    /// `None` when there are no extra ones (the guest keeps its own store).
    pub fn ca_bundle(&self) -> Result<Option<String>> {
        let Some(extra) = &self.extra_ca else {
            return Ok(None);
        };
        let extra = read_extra_ca(extra)?;
        let (path, mut bundle) = host_system_bundle(dynocap_proto::trust::SYSTEM_BUNDLES);
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str(&extra);
        if bundle.len() > CA_BUNDLE_MAX {
            return Err(Error::invalid(format!(
                "the guest's CA bundle ({} plus DYNOCAP_EXTRA_CA) is {} bytes, over the {CA_BUNDLE_MAX} one request carries; give DYNOCAP_EXTRA_CA only the CAs the sandbox needs",
                path.unwrap_or("the host's system CA bundle"),
                bundle.len()
            )));
        }
        Ok(Some(bundle))
    }
}

/// The host's own system CA bundle, which the guest's CA variables name with the extra CAs
/// added: the first of `candidates` (the places distributions keep it, Debian's first) that
/// holds anything, so a Fedora or openSUSE host's public CAs are in it as a Debian host's
/// are. With none, the bundle is the extra CAs alone.
fn host_system_bundle<'a>(candidates: &[&'a str]) -> (Option<&'a str>, String) {
    candidates
        .iter()
        .find_map(|path| {
            let text = std::fs::read_to_string(path).ok()?;
            (!text.trim().is_empty()).then_some((Some(*path), text))
        })
        .unwrap_or_default()
}

/// The extra CAs (`DYNOCAP_EXTRA_CA`, checked) a sandbox without an egress record gets in
/// its system bundles: a `nat` one, whose clients reach their servers directly and need
/// the host's CAs as much as a `filtered` one's. `None` for every other network (`none`
/// reaches nothing; a `filtered` sandbox's CAs come with its [`EgressSpec`]).
pub fn direct_extra_ca(config: &EgressConfig, network: Network) -> Result<Option<String>> {
    match network {
        Network::Nat => config.extra_ca().as_deref().map(read_extra_ca).transpose(),
        Network::None | Network::Filtered => Ok(None),
    }
}

/// The hosts of a project's remotes that `DYNOCAP_MCP_GIT_HOSTS` (or its default) names:
/// they join a `filtered` task's allowlist, so `git fetch` and `git push` of the project's
/// own remotes work over HTTPS and nothing else is added.
pub fn remote_hosts(config: &EgressConfig, remote_urls: &[String]) -> Vec<String> {
    let listed: Vec<String> = split_list(config.git_hosts())
        .filter_map(|h| dynocap_netproxy::normalize_host(&h).ok())
        .collect();
    let mut hosts = Vec::new();
    for url in remote_urls {
        if let Ok(url) = crate::foundation::git_url::GitUrl::parse(url) {
            let host = url.host();
            if listed.iter().any(|h| h == host) && !hosts.iter().any(|h| h == host) {
                hosts.push(host.to_owned());
            }
        }
    }
    hosts
}

/// The policy of a clone: the git host alone, on the port its URL's scheme uses.
pub fn clone_policy(host: &str, ssh: bool) -> Result<Policy> {
    let pattern = HostPattern::parse(host)
        .map_err(|err| Error::invalid(format!("the repository's host {host:?}: {err}")))?;
    let mut policy = Policy::deny_all();
    policy.push(if ssh {
        Rule::ssh(pattern)
    } else {
        Rule::https(pattern)
    });
    Ok(policy)
}

fn split_list(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
}

/// Reads and checks `DYNOCAP_EXTRA_CA`: a regular file of PEM certificates, each of which
/// must parse as an X.509 certificate. Returns the certificates alone, PEM again: what joins
/// the guest's system bundles. Anything else the file holds (a private key beside the
/// certificate, comments) never reaches the guest, and a block that is not a certificate is
/// refused here: appended to a bundle it would make OpenSSL refuse the whole bundle, and with
/// it every TLS connection in the guest.
fn read_extra_ca(path: &Path) -> Result<String> {
    use base64::Engine as _;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::CertificateDer;

    let hint = "point DYNOCAP_EXTRA_CA at a PEM file of CA certificates";
    let shown = path.display();
    // Read by processes that do not share the caller's working directory (the command
    // server works from `/`, a sandbox's supervisor reads it again as it boots or restores
    // it, the MCP server from wherever its client started it): a relative path would name
    // a different file in each.
    if path.is_relative() {
        return Err(Error::invalid(format!(
            "DYNOCAP_EXTRA_CA={shown} is a relative path, which DynoCap's long-lived processes \
             would read from another directory than yours; give the file's absolute path"
        )));
    }
    let meta = std::fs::metadata(path).map_err(|err| {
        Error::invalid(format!(
            "DYNOCAP_EXTRA_CA={shown} cannot be read: {err}; {hint}"
        ))
    })?;
    if !meta.is_file() || meta.len() > EXTRA_CA_MAX {
        return Err(Error::invalid(format!(
            "DYNOCAP_EXTRA_CA={shown} is not a regular file of at most {EXTRA_CA_MAX} bytes; {hint}"
        )));
    }
    let bytes = std::fs::read(path).map_err(|err| {
        Error::invalid(format!(
            "DYNOCAP_EXTRA_CA={shown} cannot be read: {err}; {hint}"
        ))
    })?;
    let mut pem = String::new();
    for (index, cert) in CertificateDer::pem_slice_iter(&bytes).enumerate() {
        let number = index + 1;
        let cert = cert.map_err(|err| {
            Error::invalid(format!(
                "DYNOCAP_EXTRA_CA={shown}: certificate {number} is not valid PEM ({err}); {hint}"
            ))
        })?;
        // webpki's own reading of a trust anchor: what a TLS library makes of it.
        rustls::RootCertStore::empty()
            .add(cert.clone())
            .map_err(|err| {
                // rustls words every certificate error as a peer's: say only what it found.
                let found = match err {
                    rustls::Error::InvalidCertificate(why) => format!("{why:?}"),
                    other => other.to_string(),
                };
                Error::invalid(format!(
                    "DYNOCAP_EXTRA_CA={shown}: certificate {number} is not an X.509 \
                     certificate ({found}); {hint}"
                ))
            })?;
        let encoded = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in encoded.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    if pem.is_empty() {
        return Err(Error::invalid(format!(
            "DYNOCAP_EXTRA_CA={shown} holds no PEM certificate (-----BEGIN CERTIFICATE-----); {hint}"
        )));
    }
    Ok(pem)
}

/// The supervisor's proxy for one sandbox.
pub struct Egress {
    proxy: Arc<Proxy>,
    summary: Arc<SummarySink>,
    /// The refusals of the commands running now, for their results.
    commands: Arc<CommandRefusals>,
    ca_bundle: Option<String>,
    /// The extra CAs alone, which the agent adds to the guest's system bundles.
    extra_ca: Option<String>,
    /// The guest listens and its tunnels come here: a later `open` only swaps the policy.
    listening: AtomicBool,
    /// The jail's network namespace, where the supervisor makes the listener itself; `None`
    /// for a VM, or once joining it failed (the agent listens then).
    netns: Mutex<Option<File>>,
    /// The supervisor's listener in the guest's network, while open.
    guest_listener: Mutex<Option<GuestListener>>,
}

impl Egress {
    /// A proxy that allows nothing yet, logging to `log` (`network.jsonl`). `netns`: the
    /// guest's network namespace when it shares the host's kernel (a jail), where the
    /// supervisor listens itself if it may join it.
    pub fn new(spec: &EgressSpec, log: &Path, netns: Option<File>) -> Result<Self> {
        let jsonl = JsonlSink::create(log).context(format_args!("creating {}", log.display()))?;
        let summary = Arc::new(SummarySink::new());
        let commands = Arc::new(CommandRefusals::new());
        let sink: Arc<dyn DecisionSink> =
            Arc::new(((jsonl, Arc::clone(&summary)), Arc::clone(&commands)));
        let proxy = Arc::new(
            Proxy::new(Policy::deny_all(), spec.overrides()?, sink)
                .with_allow_hint(crate::supervisor::exec::allow_hint),
        );
        Ok(Self {
            proxy,
            summary,
            commands,
            ca_bundle: spec.ca_bundle()?,
            extra_ca: spec.extra_ca_pem()?,
            listening: AtomicBool::new(false),
            netns: Mutex::new(netns),
            guest_listener: Mutex::new(None),
        })
    }

    /// Applies `policy` and has the guest listen, so commands reach the proxy.
    pub async fn open(&self, conn: &AgentConn, policy: Policy) -> Result<()> {
        self.proxy.set_policy(policy);
        // From the clone's policy to the task's: the proxy decides every connection anew, so
        // the guest's listener and its open tunnels stay as they are.
        if self.listening.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if let Some(listener) = self.listen_in_guest() {
            *lock(&self.guest_listener) = Some(listener);
            let configured = self.configure_guest(conn, Some(PROXY_PORT), true).await;
            if configured.is_err() {
                self.listening.store(false, Ordering::Release);
                drop(lock(&self.guest_listener).take());
            }
            return configured;
        }
        let proxy = Arc::clone(&self.proxy);
        let active = Arc::new(AtomicUsize::new(0));
        let handler: TunnelHandler = Arc::new(move |tunnel, outgoing| {
            let proxy = Arc::clone(&proxy);
            let active = Arc::clone(&active);
            tokio::spawn(async move {
                // The proxy reads and writes the tunnel's frames in place: no pipe between
                // them to copy every byte into and out of.
                let mut stream = tunnel.into_stream(outgoing);
                if active.fetch_add(1, Ordering::AcqRel) < MAX_TUNNELS {
                    proxy.serve(&mut stream).await;
                } else {
                    // Finishing at once ends the tunnel: the guest's client sees EOF.
                    tracing::warn!(target: LOG_TARGET, "{MAX_TUNNELS} tunnels are open; closing a new one");
                }
                stream.finish().await;
                active.fetch_sub(1, Ordering::AcqRel);
            });
        });
        conn.serve_tunnels(handler);
        let configured = self.configure_guest(conn, Some(PROXY_PORT), false).await;
        if configured.is_err() {
            self.listening.store(false, Ordering::Release);
        }
        configured
    }

    /// Stops the guest's listener and refuses every later tunnel.
    pub async fn close(&self, conn: &AgentConn) -> Result<()> {
        self.proxy.set_policy(Policy::deny_all());
        self.listening.store(false, Ordering::Release);
        conn.refuse_tunnels();
        // Its open connections end as the agent's tunnels do when it stops listening.
        drop(lock(&self.guest_listener).take());
        self.configure_guest(conn, None, false).await
    }

    /// The supervisor's own listener on the proxy port in the guest's network, serving each
    /// connection with the proxy; `None` when there is no namespace to join, or joining or
    /// binding failed (the agent listens then, and says why if it cannot either).
    fn listen_in_guest(&self) -> Option<GuestListener> {
        let mut netns = lock(&self.netns);
        let made = GuestListener::start(netns.as_ref()?, Arc::clone(&self.proxy));
        match made {
            Ok(listener) => Some(listener),
            Err(err) => {
                tracing::info!(target: LOG_TARGET,
                    "the agent carries the egress connections: no listener of the supervisor's own in the guest's network ({err})");
                // Not tried again: a later open of the same sandbox would fail alike.
                *netns = None;
                None
            }
        }
    }

    pub fn summary(&self) -> Summary {
        self.summary.snapshot()
    }

    /// Collects the connections refused from now until the window closes: one command's.
    pub fn refusal_window(&self) -> RefusalWindow {
        self.commands.open()
    }

    /// Has the agent listen on `port` (or stop), or with `host_listens` only give commands
    /// the settings for the supervisor's listener.
    async fn configure_guest(
        &self,
        conn: &AgentConn,
        port: Option<u16>,
        host_listens: bool,
    ) -> Result<()> {
        let request = Request::Egress(EgressRequest {
            listen_port: port,
            ca_bundle: port.and(self.ca_bundle.clone()),
            extra_ca: port.and(self.extra_ca.clone()),
            host_listens,
        });
        let stream = conn.open(&request).await?;
        match crate::supervisor::workspace::finish_stream(stream, "configuring the guest's egress")
            .await?
        {
            Response::Egress { .. } => Ok(()),
            other => Err(EgressFailure::UnexpectedAnswer(Box::new(other)).into()),
        }
    }
}

/// Has the guest's agent add `extra_ca` to the guest's system bundles, with no listener and
/// no proxy settings: an egress request that only carries the CAs (see [`direct_extra_ca`]).
pub async fn join_system_bundles(conn: &AgentConn, extra_ca: String) -> Result<()> {
    let request = Request::Egress(EgressRequest {
        listen_port: None,
        ca_bundle: None,
        extra_ca: Some(extra_ca),
        host_listens: false,
    });
    let stream = conn.open(&request).await?;
    match crate::supervisor::workspace::finish_stream(stream, "adding the extra CAs to the guest")
        .await?
    {
        Response::Egress { .. } => Ok(()),
        other => Err(EgressFailure::UnexpectedAnswer(Box::new(other)).into()),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each update is one assignment: the value is whole after a panic.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The proxy's listener as a socket of the supervisor's in a jail's network namespace, on
/// `127.0.0.1:PROXY_PORT` there, and the task serving what it accepts. A jail shares the
/// host's kernel: a socket made in its namespace is reached by the guest's clients wherever
/// the process holding it runs. Dropping it closes the listener and ends its open
/// connections (each still gets its decision).
struct GuestListener {
    task: tokio::task::JoinHandle<()>,
    /// Told when the listener is dropped: the task ends its connections and waits for them.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl GuestListener {
    fn start(netns: &File, proxy: Arc<Proxy>) -> std::io::Result<Self> {
        let socket = socket_in(netns)?;
        let socket = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(socket));
        // As the agent's listener (tokio's bind): a port just left in TIME_WAIT binds again.
        socket.set_reuseaddr(true)?;
        socket.bind(std::net::SocketAddr::from(([127, 0, 0, 1], PROXY_PORT)))?;
        let listener = socket.listen(1024)?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(serve_guest_connections(listener, proxy, stopped));
        Ok(Self {
            task,
            stop: Some(stop),
        })
    }
}

impl Drop for GuestListener {
    fn drop(&mut self) {
        match self.stop.take().map(|stop| stop.send(())) {
            Some(Ok(())) => {}
            // The task is gone (its runtime ended): nothing to end.
            _ => self.task.abort(),
        }
    }
}

/// A TCP socket made in the network namespace `netns`, by a short-lived thread that joins it
/// (a socket belongs to the namespace it was made in; binding and accepting need no more).
fn socket_in(netns: &File) -> std::io::Result<OwnedFd> {
    let netns = netns.try_clone()?;
    std::thread::Builder::new()
        .name("egress-netns".into())
        .spawn(move || {
            nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)?;
            let fd = nix::sys::socket::socket(
                nix::sys::socket::AddressFamily::Inet,
                nix::sys::socket::SockType::Stream,
                nix::sys::socket::SockFlag::SOCK_NONBLOCK
                    | nix::sys::socket::SockFlag::SOCK_CLOEXEC,
                None,
            )?;
            Ok(fd)
        })?
        .join()
        .map_err(|_| std::io::Error::other("the thread joining the guest's network panicked"))?
        .map_err(|err: nix::Error| std::io::Error::from(err))
}

/// Accepts the guest's connections and serves each with the proxy until told to stop; then
/// stops accepting, shuts down the connections still open (their clients see them end, as
/// when the agent stops listening) and waits for their decisions.
async fn serve_guest_connections(
    listener: tokio::net::TcpListener,
    proxy: Arc<Proxy>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let mut connections = tokio::task::JoinSet::new();
    // A second descriptor of each open connection's socket, to shut it down from here.
    let mut open: HashMap<tokio::task::Id, OwnedFd> = HashMap::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(done) = connections.join_next_with_id(), if !connections.is_empty() => {
                let id = match done {
                    Ok((id, ())) => id,
                    Err(err) => err.id(),
                };
                open.remove(&id);
            }
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        // Out of descriptors, say: the guest's clients wait in the backlog.
                        tracing::warn!(target: LOG_TARGET, "the egress listener: {err}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if connections.len() >= MAX_GUEST_CONNECTIONS {
                    tracing::warn!(target: LOG_TARGET, "{MAX_GUEST_CONNECTIONS} egress connections are open; closing a new one");
                    continue;
                }
                let _ = stream.set_nodelay(true);
                let Ok(second) = stream.as_fd().try_clone_to_owned() else {
                    tracing::warn!(target: LOG_TARGET, "out of descriptors; closing a new egress connection");
                    continue;
                };
                let proxy = Arc::clone(&proxy);
                let handle = connections.spawn(async move {
                    proxy.serve_socket(stream).await;
                });
                open.insert(handle.id(), second);
            }
        }
    }
    drop(listener);
    for fd in open.values() {
        // SAFETY: the descriptor is ours (a duplicate), open for the call.
        unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
    }
    while connections.join_next().await.is_some() {}
}

/// What failed setting up a sandbox's egress after its request was accepted.
#[derive(Debug, thiserror::Error)]
enum EgressFailure {
    /// The allowlist was checked when the sandbox was made: one that no longer parses was
    /// changed behind DynoCap's back.
    #[error("the recorded allowlist is invalid: {0}")]
    RecordedAllowlist(#[source] dynocap_netproxy::PatternError),
    #[error("the guest agent answered an egress request with {0:?}")]
    UnexpectedAnswer(Box<Response>),
}

impl Coded for EgressFailure {
    fn code(&self) -> ErrorCode {
        match self {
            Self::RecordedAllowlist(_) | Self::UnexpectedAnswer(_) => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Read, Write};
    use std::time::Duration;

    fn spec(allow: &str, added: &[&str]) -> Result<EgressSpec> {
        let config = EgressConfig {
            allow: Some(allow.to_owned()),
            ..EgressConfig::default()
        };
        let added: Vec<String> = added.iter().map(|h| (*h).to_owned()).collect();
        EgressSpec::from_config(&config, true, &added, &[])
    }

    /// A real CA certificate (EC P-256, made with openssl for these tests; its key is gone).
    const TEST_CA: &str = "\
-----BEGIN CERTIFICATE-----\n\
MIIBlTCCATugAwIBAgIUAqW60ZcbxORpVt/Q/aQ0DHA+aSkwCgYIKoZIzj0EAwIw\n\
HzEdMBsGA1UEAwwUZHlub2NhcCB1bml0IHRlc3QgQ0EwIBcNMjYxMjA3MTMyMzQw\n\
WhgPMjEyNjExMTMxMzIzNDBaMB8xHTAbBgNVBAMMFGR5bm9jYXAgdW5pdCB0ZXN0\n\
IENBMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE5zu3rKKDvJHvVJsinUcv/JOR\n\
UhxCimytpsfQDIbgph+LK+6ZXPe/wFqPfaxttUukwH6OD5dQLsRz/aOd248lvKNT\n\
MFEwHQYDVR0OBBYEFJoynBKtuoIVPpdAx5u4Gux0RHdiMB8GA1UdIwQYMBaAFJoy\n\
nBKtuoIVPpdAx5u4Gux0RHdiMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwID\n\
SAAwRQIgP5sjbBtDw+oHMn0s2q4mQlQUAQlIeKt8dgZYwfRsk2UCIQCVrYU2OTx5\n\
aQJhoHQ95ED8a9sFimjsFWbgHaDbxh31wg==\n\
-----END CERTIFICATE-----\n\
";

    fn extra_ca(content: &str) -> Result<String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, content).expect("write");
        read_extra_ca(&path)
    }

    fn refused(content: &str) -> String {
        let err = extra_ca(content).expect_err("refused");
        assert_eq!(err.code, ErrorCode::InvalidArgument, "{err}");
        assert!(
            err.message.contains("point DYNOCAP_EXTRA_CA at a PEM file"),
            "{err}"
        );
        err.message
    }

    #[test]
    fn the_hosts_bundle_is_found_wherever_its_distribution_keeps_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let at = |name: &str| dir.path().join(name).display().to_string();
        let (debian, empty, fedora) = (at("debian.crt"), at("empty.crt"), at("fedora.crt"));
        std::fs::write(&empty, "\n").expect("write");
        std::fs::write(&fedora, TEST_CA).expect("write");
        // Debian's path missing, an empty file skipped: the next that holds CAs.
        let candidates = [debian.as_str(), empty.as_str(), fedora.as_str()];
        assert_eq!(
            host_system_bundle(&candidates),
            (Some(fedora.as_str()), TEST_CA.to_owned())
        );
        assert_eq!(host_system_bundle(&candidates[..2]), (None, String::new()));
    }

    #[test]
    fn the_extra_ca_is_its_certificates_alone() {
        // A key kept beside the certificate, and comments, never reach the guest.
        let file = format!(
            "# the proxy's CA\n{TEST_CA}\n-----BEGIN PRIVATE KEY-----\n\
             MC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n"
        );
        assert_eq!(extra_ca(&file).expect("read"), TEST_CA);
        // CRLF line ends and two of them: two certificates, PEM as openssl writes it.
        let twice = format!("{TEST_CA}{TEST_CA}").replace('\n', "\r\n");
        assert_eq!(
            extra_ca(&twice).expect("read"),
            format!("{TEST_CA}{TEST_CA}")
        );
    }

    #[test]
    fn an_extra_ca_that_is_not_one_is_refused_with_the_reason() {
        let missing = read_extra_ca(Path::new("/nonexistent/ca.pem")).expect_err("missing");
        assert_eq!(missing.code, ErrorCode::InvalidArgument, "{missing}");
        assert!(
            missing
                .message
                .starts_with("DYNOCAP_EXTRA_CA=/nonexistent/ca.pem cannot be read: No such file"),
            "{missing}"
        );
        for relative in ["ca.pem", "./ca.pem", "~/ca.pem"] {
            let err = read_extra_ca(Path::new(relative)).expect_err("relative");
            assert_eq!(err.code, ErrorCode::InvalidArgument, "{err}");
            assert_eq!(
                err.message,
                format!(
                    "DYNOCAP_EXTRA_CA={relative} is a relative path, which DynoCap's \
                     long-lived processes would read from another directory than yours; give \
                     the file's absolute path"
                )
            );
        }
        let message = refused("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
        assert!(
            message.contains("certificate 1 is not an X.509 certificate (BadEncoding)"),
            "{message}"
        );
        let message = refused(&format!(
            "{TEST_CA}-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n"
        ));
        assert!(
            message.contains("certificate 2 is not valid PEM"),
            "{message}"
        );
        let message = refused(&TEST_CA.replace("-----END CERTIFICATE-----\n", ""));
        assert!(
            message.contains("certificate 1 is not valid PEM"),
            "{message}"
        );
        for nothing in [
            "",
            "garbage\n",
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n",
        ] {
            let message = refused(nothing);
            assert!(message.contains("holds no PEM certificate"), "{message}");
        }
    }

    #[test]
    fn named_registries_are_recorded_as_their_hosts_from_every_list() {
        let spec = spec("@crates, example.com", &["@PYPI", "pypi.org"]).expect("spec");
        assert_eq!(
            spec.allow,
            [
                "registry.npmjs.org",
                "index.crates.io",
                "static.crates.io",
                "crates.io",
                "example.com",
                "pypi.org",
                "files.pythonhosted.org",
            ]
        );
        assert_eq!(
            spec.policy()
                .expect("policy")
                .allows("files.pythonhosted.org", 443),
            Some(dynocap_netproxy::Protocol::Tls)
        );
    }

    #[test]
    fn an_unknown_registry_is_refused_with_the_known_names() {
        const REFUSED: &str = "allowlist entry \"@foo\": there is no registry named @foo; \
             the named registries are @npm, @pypi, @crates, @go, @debian, @rubygems, @maven";
        let err = spec("", &["@foo"]).expect_err("refused");
        assert_eq!(err.code, ErrorCode::InvalidArgument, "{err}");
        assert_eq!(err.message, format!("egress allowlist: {REFUSED}"));
        // One of the host's variable says so: the caller cannot fix it (an MCP caller above
        // all), the person running DynoCap can.
        let err = spec("pypi.org, @foo", &[]).expect_err("refused");
        assert_eq!(err.code, ErrorCode::InvalidArgument, "{err}");
        assert_eq!(
            err.message,
            format!(
                "egress allowlist: DYNOCAP_EGRESS_ALLOW=pypi.org, @foo: {REFUSED}; correct or \
                 remove the entry in the environment DynoCap runs in"
            )
        );
    }

    /// Every decision, in order.
    #[derive(Default)]
    struct Recorded(Mutex<Vec<dynocap_netproxy::Decision>>);

    impl DecisionSink for Recorded {
        fn record(&self, decision: &dynocap_netproxy::Decision) {
            lock(&self.0).push(decision.clone());
        }
    }

    /// A network namespace of the test's own with `lo` up (as a jail's), held by a process
    /// until dropped; `None` without the privilege to make one.
    struct TestNetns(std::process::Child);

    impl TestNetns {
        fn new() -> Option<Self> {
            let mut child = std::process::Command::new("unshare")
                .args([
                    "--net",
                    "sh",
                    "-c",
                    "ip link set lo up && echo up && exec sleep 60",
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .ok()?;
            let mut line = String::new();
            let stdout = child.stdout.take()?;
            std::io::BufReader::new(stdout).read_line(&mut line).ok()?;
            let netns = Self(child);
            (line == "up\n").then_some(netns)
        }

        fn file(&self) -> File {
            File::open(format!("/proc/{}/ns/net", self.0.id())).expect("the namespace")
        }
    }

    impl Drop for TestNetns {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A client in the namespace: connected to the proxy port there.
    fn client_in(netns: &File) -> std::net::TcpStream {
        let client = std::net::TcpStream::from(socket_in(netns).expect("a socket"));
        client.set_nonblocking(false).expect("blocking");
        let sockaddr = nix::sys::socket::SockaddrIn::new(127, 0, 0, 1, PROXY_PORT);
        nix::sys::socket::connect(client.as_raw_fd(), &sockaddr).expect("connect to the proxy");
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        client
    }

    /// The supervisor's listener in a jail's network: a guest's connection there reaches the
    /// proxy and gets its answer; dropping the listener (the egress closed) ends the
    /// connections still open, each with its decision, and frees the port.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_listener_in_the_guests_network_serves_and_closes_its_connections() {
        let Some(netns) = TestNetns::new() else {
            assert!(!nix::unistd::geteuid().is_root(), "root makes namespaces");
            return;
        };
        let file = netns.file();
        let recorded = Arc::new(Recorded::default());
        let proxy = Arc::new(Proxy::new(
            Policy::https_hosts(&["allowed.example"]).expect("policy"),
            ResolveOverrides::none(),
            recorded.clone(),
        ));
        let listener = GuestListener::start(&file, proxy).expect("listening in the namespace");

        let refused_file = file.try_clone().expect("dup");
        let answer = tokio::task::spawn_blocking(move || {
            let mut client = client_in(&refused_file);
            client
                .write_all(b"CONNECT other.example:443 HTTP/1.1\r\nHost: other.example\r\n\r\n")
                .expect("request");
            let mut answer = String::new();
            client.read_to_string(&mut answer).expect("the answer");
            answer
        })
        .await
        .expect("client");
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        assert!(
            answer.contains("other.example is not on this sandbox's allowlist"),
            "{answer}"
        );

        // A connection that sent nothing yet: the proxy waits for its request head.
        let idle_file = file.try_clone().expect("dup");
        let mut idle = tokio::task::spawn_blocking(move || client_in(&idle_file))
            .await
            .expect("client");
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(listener);
        let ended = tokio::task::spawn_blocking(move || {
            let mut rest = Vec::new();
            idle.read_to_end(&mut rest).map(|_| rest)
        })
        .await
        .expect("client");
        assert!(
            ended.is_ok(),
            "the connection ended, not timed out: {ended:?}"
        );
        // Its decision is recorded once its task is done.
        for _ in 0..100 {
            if lock(&recorded.0).len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let decisions = lock(&recorded.0).clone();
        assert_eq!(decisions.len(), 2, "{decisions:?}");
        assert!(decisions.iter().all(|d| !d.allowed), "{decisions:?}");
        // The port is free again: a new listener binds it.
        let again = GuestListener::start(
            &file,
            Arc::new(Proxy::new(
                Policy::deny_all(),
                ResolveOverrides::none(),
                Arc::new(dynocap_netproxy::NullSink),
            )),
        );
        assert!(again.is_ok(), "{:?}", again.err());
    }
}
