//! The first bytes inside an opened tunnel: a whole TLS ClientHello that is judged to go to
//! the CONNECT host, or an SSH-2.0 version line. Reads are bounded; what was read is kept to
//! forward. Nothing here touches the network: the proxy connects upstream only after this
//! judgement allowed the tunnel.

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::host::normalize_host;
use crate::tls::{parse_client_hello, Alert, ClientHello, Hello, HelloError};

/// Longest SSH identification line, CR LF included (RFC 4253 §4.2).
const MAX_SSH_LINE: usize = 255;
const SSH_PREFIX: &[u8] = b"SSH-2.0-";

/// Why the tunnel's first bytes were refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SniffError {
    #[error("the client closed the tunnel before sending {0}")]
    Closed(&'static str),
    #[error("the TLS ClientHello is larger than {0} bytes")]
    HelloTooLarge(usize),
    #[error("{0}")]
    Hello(#[from] HelloError),
    #[error("the TLS ClientHello carries {name} ({code:#06x}): the server would read the real server name from it, where the proxy cannot check it; turn ECH/ESNI off for this client")]
    Concealed { code: u16, name: &'static str },
    #[error("the TLS ClientHello has no SNI (server name); the proxy checks it against the CONNECT host")]
    NoSni,
    #[error("the TLS SNI {sni:?} differs from the CONNECT host {host:?}")]
    SniMismatch { sni: String, host: String },
    #[error("not an SSH-2.0 client (the first line does not start with \"SSH-2.0-\")")]
    NotSsh,
    #[error("reading the client's first bytes: {0}")]
    Io(#[from] std::io::Error),
}

impl SniffError {
    /// The TLS alert that tells a TLS client why its handshake ends, if it sent one.
    pub(crate) fn alert(&self) -> Option<Alert> {
        match self {
            SniffError::Hello(HelloError::NotHandshake(_)) => None,
            SniffError::Hello(_) | SniffError::HelloTooLarge(_) => Some(Alert::DecodeError),
            SniffError::Concealed { .. } | SniffError::NoSni | SniffError::SniMismatch { .. } => {
                Some(Alert::AccessDenied)
            }
            SniffError::Closed(_) | SniffError::NotSsh | SniffError::Io(_) => None,
        }
    }
}

/// Reads until `buf` holds a whole ClientHello and judges it ([`judge_hello`]). `buf` may
/// already hold bytes; on success it holds everything read, and the returned count is how
/// many of them the ClientHello's records took.
pub(crate) async fn client_hello<S: AsyncRead + Unpin>(
    client: &mut S,
    buf: &mut Vec<u8>,
    host: &str,
    max: usize,
) -> Result<usize, SniffError> {
    let (hello, consumed) = loop {
        match parse_client_hello(buf)? {
            Hello::Complete { hello, consumed } => break (hello, consumed),
            Hello::Incomplete if buf.len() >= max => return Err(SniffError::HelloTooLarge(max)),
            Hello::Incomplete => read_more(client, buf, max, "a TLS ClientHello").await?,
        }
    };
    judge_hello(&hello, host)?;
    Ok(consumed)
}

/// Allows a ClientHello only if the server can learn no name from it but `host` (canonical):
/// no extension that hides a name (ECH, ESNI), and an SNI that is `host` in ASCII.
pub(crate) fn judge_hello(hello: &ClientHello, host: &str) -> Result<(), SniffError> {
    if let Some((code, name)) = hello.concealing_extension() {
        return Err(SniffError::Concealed { code, name });
    }
    let raw = hello.server_name.as_deref().ok_or(SniffError::NoSni)?;
    let sni = String::from_utf8_lossy(raw).into_owned();
    // SNI carries A-labels (RFC 6066); a server reading UTF-8 there would not map it as the
    // proxy does. Canonicalising the ASCII makes "Example.COM." equal "example.com".
    match normalize_host(&sni) {
        Ok(name) if raw.is_ascii() && name == host => Ok(()),
        _ => Err(SniffError::SniMismatch {
            sni,
            host: host.to_owned(),
        }),
    }
}

/// Reads until `buf` holds the SSH identification line, refusing anything else.
pub(crate) async fn ssh_banner<S: AsyncRead + Unpin>(
    client: &mut S,
    buf: &mut Vec<u8>,
) -> Result<(), SniffError> {
    loop {
        let common = buf.len().min(SSH_PREFIX.len());
        if buf[..common] != SSH_PREFIX[..common] {
            return Err(SniffError::NotSsh);
        }
        if let Some(newline) = buf.iter().position(|&b| b == b'\n') {
            return if newline >= SSH_PREFIX.len() {
                Ok(())
            } else {
                Err(SniffError::NotSsh)
            };
        }
        if buf.len() >= MAX_SSH_LINE {
            return Err(SniffError::NotSsh);
        }
        read_more(client, buf, MAX_SSH_LINE, "an SSH version line").await?;
    }
}

/// Appends at most `max - buf.len()` bytes; end of stream is [`SniffError::Closed`].
async fn read_more<S: AsyncRead + Unpin>(
    client: &mut S,
    buf: &mut Vec<u8>,
    max: usize,
    what: &'static str,
) -> Result<(), SniffError> {
    let room = max.saturating_sub(buf.len()).max(1);
    let n = (&mut *client).take(room as u64).read_buf(buf).await?;
    if n == 0 {
        return Err(SniffError::Closed(what));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::build::{client_hello as hello_message, hello_for, records, sni};

    async fn check_hello(bytes: &[u8], host: &str) -> Result<Vec<u8>, SniffError> {
        let mut reader = bytes;
        let mut buf = Vec::new();
        let consumed = client_hello(&mut reader, &mut buf, host, 64 * 1024).await?;
        assert_eq!(consumed, buf.len(), "one hello, nothing after it");
        Ok(buf)
    }

    #[tokio::test]
    async fn sni_must_equal_the_connect_host() {
        let bytes = hello_for("Registry.Example.", 0);
        assert_eq!(
            check_hello(&bytes, "registry.example").await.unwrap(),
            bytes
        );
        assert!(matches!(
            check_hello(&bytes, "other.example").await,
            Err(SniffError::SniMismatch { .. })
        ));
        let ip_sni = hello_for("127.0.0.1", 0);
        assert!(matches!(
            check_hello(&ip_sni, "registry.example").await,
            Err(SniffError::SniMismatch { .. })
        ));
        let no_sni = records(&hello_message(None), 1 << 14);
        assert!(matches!(
            check_hello(&no_sni, "registry.example").await,
            Err(SniffError::NoSni)
        ));
    }

    #[tokio::test]
    async fn hello_bounds_and_truncation() {
        let bytes = records(&hello_message(Some(sni("a.example"))), 50);
        assert!(matches!(
            check_hello(&bytes[..bytes.len() - 1], "a.example").await,
            Err(SniffError::Closed(_))
        ));
        // A handshake header announcing 70000 bytes: more than the 64 KiB bound.
        let mut message = vec![1, 0x01, 0x11, 0x70];
        message.resize(4 + 70_000, 0);
        let big = records(&message, 1 << 14);
        assert!(matches!(
            check_hello(&big, "a.example").await,
            Err(SniffError::HelloTooLarge(65536))
        ));
        assert!(matches!(
            check_hello(b"\x00\x01garbage", "a.example").await,
            Err(SniffError::Hello(HelloError::NotHandshake(0)))
        ));
    }

    async fn check_ssh(bytes: &[u8]) -> Result<Vec<u8>, SniffError> {
        let mut reader = bytes;
        let mut buf = Vec::new();
        ssh_banner(&mut reader, &mut buf).await?;
        Ok(buf)
    }

    #[tokio::test]
    async fn ssh_banner_checks() {
        assert!(check_ssh(b"SSH-2.0-OpenSSH_9.2p1\r\n").await.is_ok());
        assert!(matches!(
            check_ssh(b"SSH-1.5-old\r\n").await,
            Err(SniffError::NotSsh)
        ));
        assert!(matches!(
            check_ssh(b"\x16\x03\x01").await,
            Err(SniffError::NotSsh)
        ));
        assert!(matches!(
            check_ssh(b"SSH-2.0\n").await,
            Err(SniffError::NotSsh)
        ));
        let long = format!("SSH-2.0-{}", "x".repeat(300));
        assert!(matches!(
            check_ssh(long.as_bytes()).await,
            Err(SniffError::NotSsh)
        ));
        assert!(matches!(
            check_ssh(b"SSH-2.0-no-newline").await,
            Err(SniffError::Closed(_))
        ));
    }
}
