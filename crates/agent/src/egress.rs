//! The guest end of `filtered` networking: a listener on `127.0.0.1:<port>` whose every
//! connection becomes a tunnel to the host's proxy, and the settings that point commands'
//! HTTP clients at it (proxy variables, and the CA bundle when the host adds certificates).
//!
//! The listener decides nothing: the host's proxy allows or refuses each connection. It
//! exists only while the host asks for it (a `filtered` sandbox, or a `none` task's clone).
//! The host's extra CAs also join the guest's own system bundles ([`mod@trust`]), so TLS
//! clients that read no variable trust them too, and apt's `http://` sources become
//! `https://` ones ([`mod@apt`]).

mod apt;
mod trust;

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use dynocap_proto::tunnel::{self, Inbox};
use dynocap_proto::{
    to_payload, EgressRequest, Frame, FrameKind, GuestRequest, Response, GUEST_STREAM_BIT,
};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::outbox::Outbox;

/// Where the CA bundle goes: owned by the guest's root (the image's /etc is not), readable by
/// every command, writable by none.
pub const CA_BUNDLE_DIR: &str = "/var/lib/dynocap-egress";
pub const CA_BUNDLE: &str = "/var/lib/dynocap-egress/ca-certificates.crt";
/// Tunnels open at once; a connection beyond this is closed at once, so a guest cannot make
/// the agent hold unbounded buffers.
const MAX_TUNNELS: usize = 256;

/// The variables that point HTTP clients at the listener, and TLS clients at the bundle
/// (their names: [`dynocap_proto::proxy_env`]).
pub fn proxy_env(port: u16, ca_bundle: bool) -> Vec<(String, String)> {
    use dynocap_proto::proxy_env::{
        CA_BUNDLE_VARIABLES, GIT_CONFIG_PREFIX, NO_PROXY_VARIABLES, PROXY_URL_VARIABLES,
    };
    let proxy = format!("http://127.0.0.1:{port}");
    let mut env: Vec<(String, String)> = PROXY_URL_VARIABLES
        .iter()
        .map(|key| ((*key).to_owned(), proxy.clone()))
        .collect();
    env.extend(
        NO_PROXY_VARIABLES
            .iter()
            .map(|key| ((*key).to_owned(), "localhost,127.0.0.1".to_owned())),
    );
    env.extend([
        (format!("{GIT_CONFIG_PREFIX}COUNT"), "1".to_owned()),
        (format!("{GIT_CONFIG_PREFIX}KEY_0"), "http.proxy".to_owned()),
        (format!("{GIT_CONFIG_PREFIX}VALUE_0"), proxy),
    ]);
    if ca_bundle {
        env.extend(
            CA_BUNDLE_VARIABLES
                .iter()
                .map(|key| ((*key).to_owned(), CA_BUNDLE.to_owned())),
        );
    }
    env
}

/// Commands' extra environment, shared by the listener's owner and every exec.
#[derive(Debug, Clone, Default)]
pub struct EgressEnv(Arc<RwLock<Vec<(String, String)>>>);

impl PartialEq for EgressEnv {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for EgressEnv {}

impl EgressEnv {
    pub fn get(&self) -> Vec<(String, String)> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, env: Vec<(String, String)>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = env;
    }
}

/// The tunnels the guest opened, by stream id: where the host's frames for them go.
pub type Tunnels = Arc<Mutex<HashMap<u32, Inbox>>>;

fn lock(tunnels: &Tunnels) -> std::sync::MutexGuard<'_, HashMap<u32, Inbox>> {
    // Every update is one insert or remove, so the map is consistent after a panic.
    tunnels.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why an `Egress` request could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// A step of writing the CA bundle commands trust.
    #[error("cannot {what} {CA_BUNDLE}: {source}")]
    CaBundle {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("cannot listen on 127.0.0.1:{port} for the egress proxy: {source}")]
    Listen { port: u16, source: std::io::Error },
}

/// The listener, while there is one.
#[derive(Default)]
pub struct Egress {
    listener: Mutex<Option<JoinHandle<()>>>,
    pub tunnels: Tunnels,
}

impl Egress {
    /// Applies an [`EgressRequest`]: starts or stops the listener, writes the CA bundle and
    /// sets commands' proxy settings.
    pub async fn configure(
        &self,
        req: EgressRequest,
        env: &EgressEnv,
        outbox: &Outbox,
    ) -> Result<Response, EgressError> {
        // The old listener must be gone (its socket closed) before the port is bound again:
        // an aborted task is only dropped when the runtime next polls it.
        if let Some(task) = self.stop() {
            let _ = task.await;
        }
        env.set(Vec::new());
        // The extra CAs join the system bundles with or without a listener: a `nat` guest
        // gets them alone (no port), a `filtered` one with its listener.
        // The first system bundle that holds them, for Node below.
        let mut holding: Option<std::path::PathBuf> = None;
        if let Some(extra) = &req.extra_ca {
            // Where the guest's bundle cannot take them (read-only) the variables still point
            // at the bundle written below: the log says which.
            for outcome in trust::join_system_bundles(extra) {
                match outcome {
                    trust::Outcome::Joined(path) | trust::Outcome::Present(path) => {
                        if trust::is_system_bundle(&path) && holding.is_none() {
                            holding = Some(path.clone());
                        }
                        log!("the extra CAs are in {}", path.display())
                    }
                    trust::Outcome::Skipped(path, why) => {
                        log!("the extra CAs did not join {}: {why}", path.display())
                    }
                }
            }
        }
        let Some(port) = req.listen_port else {
            // A `nat` guest's clients read the system bundle, but Node.js (npm, pnpm, yarn)
            // never does: it trusts its own copy of Mozilla's CAs plus this file.
            if let Some(bundle) = holding {
                env.set(vec![(
                    "NODE_EXTRA_CA_CERTS".to_owned(),
                    bundle.display().to_string(),
                )]);
            }
            return Ok(Response::Egress { listening: false });
        };
        if let Some(pem) = &req.ca_bundle {
            write_ca_bundle(pem)?;
        }
        // The proxy carries HTTPS only: apt's plain-HTTP mirrors would all be refused. apt
        // reads the system bundle; an image with none (no ca-certificates) has it told where
        // the bundle the host sent is.
        let apt_ca = (req.ca_bundle.is_some() && holding.is_none()).then_some(CA_BUNDLE);
        for line in apt::use_https(apt_ca) {
            log!("{line}");
        }
        if req.host_listens {
            // A jail's supervisor took the port in this network itself: its connections
            // reach the proxy without passing through here.
            env.set(proxy_env(port, req.ca_bundle.is_some()));
            return Ok(Response::Egress { listening: true });
        }
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|source| EgressError::Listen { port, source })?;
        let task = tokio::spawn(accept_loop(
            listener,
            Arc::clone(&self.tunnels),
            outbox.clone(),
        ));
        *self.listener.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
        env.set(proxy_env(port, req.ca_bundle.is_some()));
        Ok(Response::Egress { listening: true })
    }

    /// Stops accepting and ends every open tunnel. Returns the aborted listener task, which
    /// holds the listening socket until it is dropped: await it to be sure the port is free.
    pub fn stop(&self) -> Option<JoinHandle<()>> {
        let task = self
            .listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = &task {
            task.abort();
        }
        for (_, inbox) in lock(&self.tunnels).drain() {
            inbox.close("the sandbox's egress was turned off");
        }
        task
    }

    /// Routes a frame of a guest-opened stream. Frames for a tunnel that is gone (its last
    /// frames crossing its end) are dropped.
    pub async fn route(&self, frame: Frame, outbox: &Outbox) {
        let id = frame.stream;
        let violation = tunnel::route(&mut lock(&self.tunnels), frame).err();
        if let Some(tunnel::Violation(why)) = violation {
            log!("tunnel {id:#x}: {why}");
            outbox.send_error(id, why).await;
        }
    }
}

async fn accept_loop(listener: TcpListener, tunnels: Tunnels, outbox: Outbox) {
    let next = AtomicU32::new(0);
    loop {
        let socket = match listener.accept().await {
            Ok((socket, _)) => socket,
            Err(err) => {
                log!("egress listener: {err}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let (id, tunnel) = {
            let mut map = lock(&tunnels);
            if map.len() >= MAX_TUNNELS {
                log!("egress: {MAX_TUNNELS} connections are open; closing a new one");
                continue;
            }
            let id = loop {
                let id =
                    GUEST_STREAM_BIT | (next.fetch_add(1, Ordering::Relaxed) & !GUEST_STREAM_BIT);
                if !map.contains_key(&id) {
                    break id;
                }
            };
            let (inbox, tunnel) = tunnel::open(id);
            map.insert(id, inbox);
            (id, tunnel)
        };
        outbox
            .send(Frame::new(
                id,
                FrameKind::Open,
                to_payload(&GuestRequest::Tunnel),
            ))
            .await;
        let tunnels = Arc::clone(&tunnels);
        let sender = outbox.sender();
        tokio::spawn(async move {
            // The host logs why a connection failed; the guest's client sees its socket close.
            let _ = tunnel::pump(tunnel, socket, sender).await;
            lock(&tunnels).remove(&id);
        });
    }
}

/// Replaces the bundle with `pem`, never following a link planted where it goes.
fn write_ca_bundle(pem: &str) -> Result<(), EgressError> {
    let fail = |what: &'static str, source| EgressError::CaBundle { what, source };
    std::fs::DirBuilder::new()
        .mode(0o755)
        .recursive(true)
        .create(CA_BUNDLE_DIR)
        .map_err(|err| fail("create the directory of", err))?;
    match std::fs::remove_file(CA_BUNDLE) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(fail("replace", err)),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(CA_BUNDLE)
        .map_err(|err| fail("create", err))?;
    file.write_all(pem.as_bytes())
        .map_err(|err| fail("write", err))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// A port free when probed, below the kernel's ephemeral range (`ip_local_port_range`):
    /// the test frees and binds it again, and meanwhile any socket the rest of the suite binds
    /// to port 0 may be given a freed ephemeral port, but never this one.
    fn free_port() -> u16 {
        let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32768);
        let low = ephemeral_start.saturating_sub(10_000).max(1024);
        // Spread by pid, so that test binaries probing at once start apart.
        let width = u32::from(ephemeral_start.saturating_sub(low)).max(1);
        let offset =
            u16::try_from(std::process::id() % width).expect("below the range's width, a u16");
        (low + offset..ephemeral_start)
            .chain(low..low + offset)
            .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
            .expect("a free port below the ephemeral range")
    }

    fn listen(port: u16) -> EgressRequest {
        EgressRequest {
            listen_port: Some(port),
            ca_bundle: None,
            extra_ca: None,
            host_listens: false,
        }
    }

    /// The agent's runtime has one thread, as here: an aborted listener holds its socket until
    /// the runtime drops it, and binding the port again before that failed (a clone's egress
    /// followed by a filtered sandbox's).
    #[tokio::test]
    async fn reconfiguring_frees_the_port_before_binding_it_again() {
        let (tx, mut rx) = mpsc::channel(16);
        let outbox = Outbox::for_tests(tx);
        let (egress, env) = (Egress::default(), EgressEnv::default());
        // The probed port is free when probed; another process may take it before the first
        // bind (the full suite runs beside other tests), and then another port is probed.
        // Once bound by us, every reconfiguring must bind it again: no port-0 bind elsewhere
        // can take it meanwhile, since it lies below the ephemeral range.
        let mut tries = 0;
        let port = loop {
            let port = free_port();
            match egress.configure(listen(port), &env, &outbox).await {
                Ok(answer) => {
                    assert_eq!(answer, Response::Egress { listening: true });
                    break port;
                }
                Err(EgressError::Listen { source, .. })
                    if source.kind() == std::io::ErrorKind::AddrInUse && tries < 10 =>
                {
                    tries += 1
                }
                Err(err) => panic!("{err}"),
            }
        };
        for _ in 0..2 {
            let answer = egress.configure(listen(port), &env, &outbox).await;
            assert_eq!(
                answer.expect("listening"),
                Response::Egress { listening: true }
            );
        }
        let proxy = format!("http://127.0.0.1:{port}");
        assert!(env.get().contains(&("HTTPS_PROXY".to_owned(), proxy)));

        // A connection is one tunnel opened towards the host.
        let _client = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect to the listener");
        let open = rx.recv().await.expect("an Open frame");
        assert_eq!(open.kind, FrameKind::Open);
        assert_ne!(open.stream & GUEST_STREAM_BIT, 0);

        let stopped = EgressRequest {
            listen_port: None,
            ca_bundle: None,
            extra_ca: None,
            host_listens: false,
        };
        let answer = egress.configure(stopped, &env, &outbox).await;
        assert_eq!(
            answer.expect("stopped"),
            Response::Egress { listening: false }
        );
        assert!(env.get().is_empty(), "no proxy settings without a listener");
        std::net::TcpListener::bind(("127.0.0.1", port)).expect("the port is free again");
        assert!(lock(&egress.tunnels).is_empty(), "its tunnels were closed");
    }

    /// When the host listens in the guest's network itself (a jail's supervisor), commands
    /// get the proxy settings and the agent leaves the port to the host.
    #[tokio::test]
    async fn a_host_listener_gets_the_settings_and_the_port_stays_free() {
        let (tx, _rx) = mpsc::channel(16);
        let outbox = Outbox::for_tests(tx);
        let (egress, env) = (Egress::default(), EgressEnv::default());
        let port = free_port();
        let request = EgressRequest {
            host_listens: true,
            ..listen(port)
        };
        let answer = egress.configure(request, &env, &outbox).await;
        assert_eq!(
            answer.expect("configured"),
            Response::Egress { listening: true }
        );
        let proxy = format!("http://127.0.0.1:{port}");
        assert!(env.get().contains(&("HTTPS_PROXY".to_owned(), proxy)));
        assert!(
            egress.listener.lock().unwrap().is_none(),
            "no listener task"
        );
        // The port is free for the host's socket (as free as it was when probed).
        drop(std::net::TcpListener::bind(("127.0.0.1", port)).expect("nothing bound it"));
    }

    /// The host reads what it always read when the listener cannot bind.
    #[test]
    fn errors_read_as_the_host_has_always_seen_them() {
        let err = EgressError::Listen {
            port: 3128,
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        assert_eq!(
            err.to_string(),
            format!(
                "cannot listen on 127.0.0.1:3128 for the egress proxy: {}",
                std::io::Error::from(std::io::ErrorKind::AddrInUse)
            )
        );
        assert!(std::error::Error::source(&err).is_some());
    }
}
