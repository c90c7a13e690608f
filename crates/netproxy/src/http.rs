//! The HTTP proxy side of a conversation: reading the bounded request head, parsing its
//! request line, and the few responses the proxy sends (200 to a CONNECT, or a refusal with a
//! reason body that curl, git and npm show).

use tokio::io::{AsyncRead, AsyncReadExt};

/// What the client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// `CONNECT host:port`; the host is as sent (maybe a bracketed v6 literal).
    Connect { host: String, port: u16 },
    /// Any other method: plain HTTP through the proxy. Host and port are read from an
    /// absolute URI for the log, when there is one (empty and 0 otherwise).
    Other {
        method: String,
        host: String,
        port: u16,
    },
}

/// Why the request head could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HeadError {
    #[error("the request head is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the client closed the connection before the end of the request head")]
    Closed,
    #[error("not an HTTP proxy request (binary data in the request line)")]
    NotHttp,
    #[error("reading the request head: {0}")]
    Io(#[from] std::io::Error),
}

/// Why a request line was refused with 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad request line: {0}")]
pub(crate) struct BadRequest(pub &'static str);

/// Reads into `buf` until it holds a whole request head (ending in an empty line) and returns
/// the head's length; bytes after it (a client that sends its ClientHello without waiting for
/// the 200) stay in `buf`. Refuses early when the first line is visibly not HTTP.
pub(crate) async fn read_head<S: AsyncRead + Unpin>(
    client: &mut S,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<usize, HeadError> {
    let mut scanned = 0;
    loop {
        if let Some(end) = find_head_end(buf, scanned) {
            return Ok(end);
        }
        let first_line_end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
        let first_line = &buf[..first_line_end];
        if first_line
            .iter()
            .any(|&b| !(b == b'\t' || b == b'\r' || (0x20..0x7f).contains(&b)))
        {
            return Err(HeadError::NotHttp);
        }
        if buf.len() >= max {
            return Err(HeadError::TooLarge(max));
        }
        // Rescan the last three bytes: the terminator may straddle two reads.
        scanned = buf.len().saturating_sub(3);
        let room = max - buf.len();
        let before = buf.len();
        let n = (&mut *client).take(room as u64).read_buf(buf).await?;
        if n == 0 {
            buf.truncate(before);
            return Err(HeadError::Closed);
        }
    }
}

/// The end of a head terminated by CRLF CRLF (or a bare LF LF), searching from `from`.
fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    let tail = buf.get(from..)?;
    let crlf = tail
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| from + i + 4);
    let lf = tail
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| from + i + 2);
    // The earlier terminator ends the head; what follows belongs to the tunnel.
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Parses the request line of `head`.
pub(crate) fn parse_request(head: &[u8]) -> Result<Request, BadRequest> {
    let line_end = head
        .iter()
        .position(|&b| b == b'\n')
        .ok_or(BadRequest("no line end"))?;
    let line = std::str::from_utf8(&head[..line_end])
        .map_err(|_| BadRequest("not ASCII"))?
        .trim_end_matches('\r');
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(BadRequest("expected METHOD TARGET HTTP/1.1"));
    };
    if method.is_empty()
        || !method
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(BadRequest("the method is not a token"));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(BadRequest("only HTTP/1.1 and HTTP/1.0 are spoken"));
    }
    if method != "CONNECT" {
        let (host, port) = absolute_uri_authority(target).unwrap_or_default();
        return Ok(Request::Other {
            method: method.to_owned(),
            host,
            port,
        });
    }
    let (host, port) = target
        .rsplit_once(':')
        .ok_or(BadRequest("CONNECT target must be host:port"))?;
    if host.is_empty() {
        return Err(BadRequest("CONNECT target has an empty host"));
    }
    // Digits only (RFC 3986 `port = *DIGIT`): `u16::from_str` also takes a leading '+'.
    if !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(BadRequest("CONNECT target has an invalid port"));
    }
    let port = match port.parse::<u16>() {
        Ok(0) | Err(_) => return Err(BadRequest("CONNECT target has an invalid port")),
        Ok(port) => port,
    };
    Ok(Request::Connect {
        host: host.to_owned(),
        port,
    })
}

/// Host and port of `http://host[:port]/...` (for the log of a refused plain request).
fn absolute_uri_authority(target: &str) -> Option<(String, u16)> {
    let (scheme, rest) = target.split_once("://")?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => 0,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || authority.starts_with('[') => {
            match port.parse::<u16>() {
                Ok(port) => Some((host.to_owned(), port)),
                Err(_) => Some((authority.to_owned(), default_port)),
            }
        }
        _ => Some((authority.to_owned(), default_port)),
    }
}

/// The reply that opens a tunnel.
pub(crate) const CONNECTED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// Longest reason phrase of a refusal's status line.
const MAX_PHRASE_CHARS: usize = 512;

/// A refusal: status line, the reason in `X-Dynocap-Refusal`, and a text body. The status
/// line's reason phrase carries the reason and `fix` too: some clients show only the status
/// line (pip: `Tunnel connection failed: 403 Forbidden (dynocap: …)`).
pub(crate) fn refusal_response(
    status: u16,
    reason: &str,
    fix: Option<&str>,
    body: &str,
) -> Vec<u8> {
    let phrase = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    let explained = match fix {
        Some(fix) => format!("{phrase} (dynocap: {reason}; {fix})"),
        None => format!("{phrase} (dynocap: {reason})"),
    };
    let phrase: String = header_safe(&explained)
        .chars()
        .take(MAX_PHRASE_CHARS)
        .collect();
    let header_value = header_safe(reason);
    format!(
        "HTTP/1.1 {status} {phrase}\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\n\
         X-Dynocap-Refusal: {header_value}\r\n\
         Connection: close\r\n\
         \r\n\
         {body}",
        body.len()
    )
    .into_bytes()
}

/// `text` with everything but printable ASCII replaced, so it cannot end or split a header.
pub(crate) fn header_safe(text: &str) -> String {
    text.chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_lines() {
        assert_eq!(
            parse_request(b"CONNECT registry.npmjs.org:443 HTTP/1.1\r\nHost: x\r\n\r\n"),
            Ok(Request::Connect {
                host: "registry.npmjs.org".to_owned(),
                port: 443
            })
        );
        assert_eq!(
            parse_request(b"CONNECT [::1]:443 HTTP/1.0\n\n"),
            Ok(Request::Connect {
                host: "[::1]".to_owned(),
                port: 443
            })
        );
    }

    #[test]
    fn other_methods_keep_the_authority_for_the_log() {
        assert_eq!(
            parse_request(b"GET http://user@example.com:8080/x HTTP/1.1\r\n\r\n"),
            Ok(Request::Other {
                method: "GET".to_owned(),
                host: "example.com".to_owned(),
                port: 8080
            })
        );
        assert_eq!(
            parse_request(b"GET http://example.com/ HTTP/1.1\r\n\r\n"),
            Ok(Request::Other {
                method: "GET".to_owned(),
                host: "example.com".to_owned(),
                port: 80
            })
        );
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\n\r\n"),
            Ok(Request::Other {
                method: "GET".to_owned(),
                host: String::new(),
                port: 0
            })
        );
    }

    #[test]
    fn bad_lines() {
        for line in [
            &b"CONNECT example.com HTTP/1.1\r\n\r\n"[..],
            b"CONNECT example.com:0 HTTP/1.1\r\n\r\n",
            b"CONNECT example.com:99999 HTTP/1.1\r\n\r\n",
            b"CONNECT example.com:+443 HTTP/1.1\r\n\r\n",
            b"CONNECT example.com:-443 HTTP/1.1\r\n\r\n",
            b"CONNECT example.com:443\t HTTP/1.1\r\n\r\n",
            b"CONNECT :443 HTTP/1.1\r\n\r\n",
            b"CONNECT example.com:443 HTTP/2.0\r\n\r\n",
            b"CONNECT  example.com:443 HTTP/1.1\r\n\r\n",
            b"CONNECT example.com:443\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\n",
            b"C{NNECT example.com:443 HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                parse_request(line).is_err(),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn the_earlier_terminator_ends_the_head() {
        let buf = b"CONNECT a.example:443 HTTP/1.1\n\nbody\r\n\r\n";
        assert_eq!(find_head_end(buf, 0), Some(32));
        let buf = b"CONNECT a.example:443 HTTP/1.1\r\n\r\nbody\n\n";
        assert_eq!(find_head_end(buf, 0), Some(34));
        assert_eq!(find_head_end(b"CONNECT a:1 HTTP/1.1\r\n", 0), None);
    }

    #[tokio::test]
    async fn head_reading_keeps_what_follows() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let task = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            client
                .write_all(b"CONNECT a.example:443 HTTP/1.1\r\n")
                .await
                .unwrap();
            client
                .write_all(b"Host: a.example:443\r\n\r")
                .await
                .unwrap();
            client.write_all(b"\n\x16\x03\x01").await.unwrap();
            client
        });
        let mut buf = Vec::new();
        let end = read_head(&mut server, &mut buf, 8192).await.unwrap();
        assert_eq!(&buf[end..], b"\x16\x03\x01");
        assert!(buf[..end].ends_with(b"\r\n\r\n"));
        drop(task.await.unwrap());
    }

    #[tokio::test]
    async fn head_reading_refuses_binary_oversize_and_eof() {
        let mut tls: &[u8] = b"\x16\x03\x01\x02\x00\x01";
        assert!(matches!(
            read_head(&mut tls, &mut Vec::new(), 8192).await,
            Err(HeadError::NotHttp)
        ));
        let big = format!(
            "CONNECT a.example:443 HTTP/1.1\r\nX: {}\r\n\r\n",
            "y".repeat(9000)
        );
        assert!(matches!(
            read_head(&mut big.as_bytes(), &mut Vec::new(), 8192).await,
            Err(HeadError::TooLarge(8192))
        ));
        assert!(matches!(
            read_head(
                &mut &b"CONNECT a.example:443 HTTP/1.1\r\n"[..],
                &mut Vec::new(),
                8192
            )
            .await,
            Err(HeadError::Closed)
        ));
    }

    #[test]
    fn refusals_carry_a_safe_header_and_the_body() {
        let r = refusal_response(403, "bad\r\nInjected: yes", None, "dynocap: no\n");
        let text = String::from_utf8(r).unwrap();
        assert!(text.starts_with("HTTP/1.1 403 Forbidden (dynocap: bad??Injected: yes)\r\n"));
        assert!(text.contains("X-Dynocap-Refusal: bad??Injected: yes\r\n"));
        assert!(text.contains("Content-Length: 12\r\n"));
        assert!(text.ends_with("\r\n\r\ndynocap: no\n"));
    }

    #[test]
    fn the_status_line_says_why_and_what_would_allow_it_bounded() {
        let r = refusal_response(
            403,
            "a.example is not on this sandbox's allowlist",
            Some("allow it with --allow-host a.example"),
            "",
        );
        let text = String::from_utf8(r).unwrap();
        assert!(text.starts_with(
            "HTTP/1.1 403 Forbidden (dynocap: a.example is not on this sandbox's allowlist; \
             allow it with --allow-host a.example)\r\n"
        ));
        let long = "x".repeat(5000);
        let r = refusal_response(400, &long, Some("\u{1b}]52;"), "");
        let text = String::from_utf8(r).unwrap();
        let status_line = text.split("\r\n").next().unwrap();
        assert_eq!(
            status_line.len(),
            "HTTP/1.1 400 ".len() + MAX_PHRASE_CHARS,
            "{status_line}"
        );
        assert!(status_line.bytes().all(|b| (b' '..=b'~').contains(&b)));
    }
}
