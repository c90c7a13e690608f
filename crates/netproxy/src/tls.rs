//! A strict parser of the TLS ClientHello, enough to read its SNI (RFC 8446 §4.1.2, RFC 6066
//! §3). It reassembles the handshake message across records and is fed the client's bytes as
//! they arrive; anything that is not a well-formed ClientHello is an error, never a guess.

/// TLS record content type of handshake messages.
const CONTENT_HANDSHAKE: u8 = 22;
/// Handshake message type of ClientHello.
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
/// Largest plaintext record fragment (RFC 8446 §5.1).
const MAX_RECORD_LEN: usize = 1 << 14;
/// Extension type of server_name.
const EXT_SERVER_NAME: u16 = 0;
/// server_name entry type of host_name.
const NAME_TYPE_HOST: u8 = 0;

/// Why the client's first bytes are not an acceptable ClientHello.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    #[error("not a TLS handshake record (first byte {0:#04x})")]
    NotHandshake(u8),
    #[error("malformed TLS record: {0}")]
    BadRecord(&'static str),
    #[error("the first handshake message is not a ClientHello (type {0})")]
    NotClientHello(u8),
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
}

/// Result of feeding the bytes received so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A prefix of a possibly valid ClientHello: read more.
    Incomplete,
    /// A whole ClientHello.
    Complete {
        /// The host_name in server_name, as sent (not canonicalised), if any.
        server_name: Option<Vec<u8>>,
        /// Bytes of the buffer taken by the records that carried the ClientHello.
        consumed: usize,
    },
}

/// Parses the ClientHello at the start of `buf`, which holds everything the client sent so
/// far. Records are checked as they complete, so garbage is refused without waiting for more.
pub fn parse_client_hello(buf: &[u8]) -> Result<Hello, HelloError> {
    let mut message = Vec::new();
    let mut pos = 0;
    loop {
        let Some(header) = buf.get(pos..pos + 5) else {
            check_partial_header(&buf[pos..])?;
            return Ok(Hello::Incomplete);
        };
        check_partial_header(header)?;
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 {
            return Err(HelloError::BadRecord("empty handshake record"));
        }
        if len > MAX_RECORD_LEN {
            return Err(HelloError::BadRecord("record longer than 16 KiB"));
        }
        let Some(fragment) = buf.get(pos + 5..pos + 5 + len) else {
            return Ok(Hello::Incomplete);
        };
        message.extend_from_slice(fragment);
        pos += 5 + len;
        if let Some(&kind) = message.first() {
            if kind != HANDSHAKE_CLIENT_HELLO {
                return Err(HelloError::NotClientHello(kind));
            }
        }
        if message.len() < 4 {
            continue;
        }
        let body_len =
            usize::from(message[1]) << 16 | usize::from(message[2]) << 8 | usize::from(message[3]);
        let whole = 4 + body_len;
        if message.len() < whole {
            continue;
        }
        if message.len() > whole {
            // The client sends nothing else in handshake records before the server answers.
            return Err(HelloError::BadRecord(
                "handshake data after the ClientHello in the same flight",
            ));
        }
        let server_name = parse_body(&message[4..])?;
        return Ok(Hello::Complete {
            server_name,
            consumed: pos,
        });
    }
}

/// Checks the record header bytes present (all five or fewer).
fn check_partial_header(header: &[u8]) -> Result<(), HelloError> {
    if let Some(&kind) = header.first() {
        if kind != CONTENT_HANDSHAKE {
            return Err(HelloError::NotHandshake(kind));
        }
    }
    // legacy_record_version is 0x0301 (or 0x0300 from very old clients); 0x03xx in any case.
    if let Some(&major) = header.get(1) {
        if major != 3 {
            return Err(HelloError::BadRecord("record version is not 3.x"));
        }
    }
    Ok(())
}

/// A cursor over a byte slice where every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], HelloError> {
        if self.bytes.len() < n {
            return Err(HelloError::Malformed(what));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, HelloError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, HelloError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one-byte length prefix.
    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let len = usize::from(self.u8(what)?);
        self.take(len, what)
    }

    /// A vector with a two-byte length prefix.
    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let len = usize::from(self.u16(what)?);
        self.take(len, what)
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// The ClientHello body after the handshake header; returns the SNI host_name if present.
fn parse_body(body: &[u8]) -> Result<Option<Vec<u8>>, HelloError> {
    let mut r = Reader { bytes: body };
    let version = r.u16("truncated legacy_version")?;
    if version >> 8 != 3 {
        return Err(HelloError::Malformed("legacy_version is not 3.x"));
    }
    r.take(32, "truncated random")?;
    let session_id = r.vec8("truncated legacy_session_id")?;
    if session_id.len() > 32 {
        return Err(HelloError::Malformed(
            "legacy_session_id longer than 32 bytes",
        ));
    }
    let suites = r.vec16("truncated cipher_suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(HelloError::Malformed(
            "cipher_suites empty or of odd length",
        ));
    }
    let compression = r.vec8("truncated legacy_compression_methods")?;
    if compression.is_empty() {
        return Err(HelloError::Malformed("no compression methods"));
    }
    if r.is_empty() {
        // A TLS 1.2 ClientHello may omit extensions; then it has no SNI.
        return Ok(None);
    }
    let mut extensions = Reader {
        bytes: r.vec16("truncated extensions")?,
    };
    if !r.is_empty() {
        return Err(HelloError::Malformed("bytes after the extensions"));
    }
    let mut seen = Vec::new();
    let mut server_name = None;
    while !extensions.is_empty() {
        let kind = extensions.u16("truncated extension type")?;
        let data = extensions.vec16("truncated extension")?;
        if seen.contains(&kind) {
            return Err(HelloError::Malformed("an extension appears twice"));
        }
        seen.push(kind);
        if kind == EXT_SERVER_NAME {
            server_name = Some(parse_server_name(data)?);
        }
    }
    Ok(server_name)
}

/// The server_name extension data: a list with exactly one host_name.
fn parse_server_name(data: &[u8]) -> Result<Vec<u8>, HelloError> {
    let mut r = Reader { bytes: data };
    let mut list = Reader {
        bytes: r.vec16("truncated server_name list")?,
    };
    if !r.is_empty() {
        return Err(HelloError::Malformed("bytes after the server_name list"));
    }
    let mut host = None;
    while !list.is_empty() {
        let kind = list.u8("truncated server_name entry")?;
        let name = list.vec16("truncated server_name entry")?;
        if kind == NAME_TYPE_HOST {
            if host.is_some() {
                return Err(HelloError::Malformed(
                    "two host_name entries in server_name",
                ));
            }
            if name.is_empty() {
                return Err(HelloError::Malformed("empty host_name in server_name"));
            }
            host = Some(name.to_vec());
        }
    }
    host.ok_or(HelloError::Malformed("server_name without a host_name"))
}

/// Builders of ClientHello bytes, shared by the unit tests here and the proxy tests.
#[cfg(test)]
pub(crate) mod build {
    /// A ClientHello handshake message (header included) with the given extensions.
    pub fn client_hello(extensions: Option<Vec<u8>>) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(32);
        body.extend_from_slice(&[9; 32]);
        body.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]);
        body.extend_from_slice(&[1, 0]);
        if let Some(ext) = extensions {
            body.extend_from_slice(&u16::try_from(ext.len()).unwrap().to_be_bytes());
            body.extend_from_slice(&ext);
        }
        let mut msg = vec![1];
        msg.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
        msg.extend_from_slice(&body);
        msg
    }

    /// One extension.
    pub fn extension(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut out = kind.to_be_bytes().to_vec();
        out.extend_from_slice(&u16::try_from(data.len()).unwrap().to_be_bytes());
        out.extend_from_slice(data);
        out
    }

    /// A server_name extension naming `host`.
    pub fn sni(host: &str) -> Vec<u8> {
        let mut entry = vec![0];
        entry.extend_from_slice(&u16::try_from(host.len()).unwrap().to_be_bytes());
        entry.extend_from_slice(host.as_bytes());
        let mut list = u16::try_from(entry.len()).unwrap().to_be_bytes().to_vec();
        list.extend_from_slice(&entry);
        extension(0, &list)
    }

    /// Wraps `message` in handshake records of at most `chunk` bytes each.
    pub fn records(message: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for part in message.chunks(chunk) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&u16::try_from(part.len()).unwrap().to_be_bytes());
            out.extend_from_slice(part);
        }
        out
    }

    /// A whole single-record ClientHello for `host` with a padding extension of `pad` bytes.
    pub fn hello_for(host: &str, pad: usize) -> Vec<u8> {
        let mut ext = sni(host);
        ext.extend_from_slice(&extension(21, &vec![0; pad]));
        records(&client_hello(Some(ext)), 1 << 14)
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    fn complete(buf: &[u8]) -> (Option<Vec<u8>>, usize) {
        match parse_client_hello(buf).unwrap() {
            Hello::Complete {
                server_name,
                consumed,
            } => (server_name, consumed),
            Hello::Incomplete => panic!("expected a complete ClientHello"),
        }
    }

    #[test]
    fn reads_the_sni() {
        let bytes = hello_for("registry.npmjs.org", 0);
        assert_eq!(
            complete(&bytes),
            (Some(b"registry.npmjs.org".to_vec()), bytes.len())
        );
    }

    #[test]
    fn without_sni_or_without_extensions() {
        let no_sni = records(&client_hello(Some(extension(43, &[2, 3, 4]))), 1 << 14);
        assert_eq!(complete(&no_sni).0, None);
        let no_ext = records(&client_hello(None), 1 << 14);
        assert_eq!(complete(&no_ext).0, None);
    }

    #[test]
    fn reassembles_across_records_and_reports_prefixes_incomplete() {
        let message = client_hello(Some(sni("example.com")));
        let bytes = records(&message, 40);
        assert!(bytes.len() > 2 * 45, "spans several records");
        for cut in 0..bytes.len() {
            assert_eq!(
                parse_client_hello(&bytes[..cut]),
                Ok(Hello::Incomplete),
                "prefix of {cut} bytes"
            );
        }
        assert_eq!(
            complete(&bytes),
            (Some(b"example.com".to_vec()), bytes.len())
        );
        // Bytes after the ClientHello (early data, say) are not consumed.
        let mut more = bytes.clone();
        more.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
        assert_eq!(complete(&more).1, bytes.len());
    }

    #[test]
    fn a_large_hello_spans_two_full_records() {
        let bytes = hello_for("big.example", 20_000);
        assert_eq!(complete(&bytes).0, Some(b"big.example".to_vec()));
    }

    #[test]
    fn garbage_is_refused_at_once() {
        assert_eq!(
            parse_client_hello(b"GET / HTTP/1.1\r\n"),
            Err(HelloError::NotHandshake(b'G'))
        );
        assert_eq!(
            parse_client_hello(b"SSH-2.0-x"),
            Err(HelloError::NotHandshake(b'S'))
        );
        assert!(matches!(
            parse_client_hello(&[22, 9]),
            Err(HelloError::BadRecord(_))
        ));
        assert!(matches!(
            parse_client_hello(&[22, 3, 1, 0, 0]),
            Err(HelloError::BadRecord(_))
        ));
        assert!(matches!(
            parse_client_hello(&[22, 3, 1, 0x40, 1]),
            Err(HelloError::BadRecord(_))
        ));
        // A ServerHello where a ClientHello belongs.
        let mut server_hello = client_hello(Some(sni("a.example")));
        server_hello[0] = 2;
        assert_eq!(
            parse_client_hello(&records(&server_hello, 1 << 14)),
            Err(HelloError::NotClientHello(2))
        );
    }

    #[test]
    fn inconsistent_lengths_are_malformed() {
        // The handshake header claims more body than the extensions fill.
        let mut message = client_hello(Some(sni("a.example")));
        message[3] -= 3;
        assert!(matches!(
            parse_client_hello(&records(&message, 1 << 14)),
            Err(HelloError::BadRecord(_) | HelloError::Malformed(_))
        ));
        // The body is cut short of what the extension lengths say.
        let mut message = client_hello(Some(sni("a.example")));
        let truncated_len = message.len() - 4 - 5;
        message.truncate(message.len() - 5);
        message[1..4].copy_from_slice(&u32::try_from(truncated_len).unwrap().to_be_bytes()[1..]);
        assert!(matches!(
            parse_client_hello(&records(&message, 1 << 14)),
            Err(HelloError::Malformed(_))
        ));
    }

    #[test]
    fn ambiguous_sni_is_malformed() {
        let mut twice = sni("a.example");
        twice.extend_from_slice(&sni("b.example"));
        assert_eq!(
            parse_client_hello(&records(&client_hello(Some(twice)), 1 << 14)),
            Err(HelloError::Malformed("an extension appears twice"))
        );
        let mut list = Vec::new();
        for host in ["a.example", "b.example"] {
            list.push(0);
            list.extend_from_slice(&u16::try_from(host.len()).unwrap().to_be_bytes());
            list.extend_from_slice(host.as_bytes());
        }
        let mut data = u16::try_from(list.len()).unwrap().to_be_bytes().to_vec();
        data.extend_from_slice(&list);
        assert_eq!(
            parse_client_hello(&records(&client_hello(Some(extension(0, &data))), 1 << 14)),
            Err(HelloError::Malformed(
                "two host_name entries in server_name"
            ))
        );
        assert!(matches!(
            parse_client_hello(&records(&client_hello(Some(extension(0, &[]))), 1 << 14)),
            Err(HelloError::Malformed(_))
        ));
    }

    /// The ClientHello curl 7.88.1 (OpenSSL 3.0.19) sent for
    /// `curl --resolve example.com:PORT:127.0.0.1 https://example.com:PORT/`, captured by a
    /// loopback listener and stored as hex: one record, 512 bytes of handshake.
    #[test]
    fn real_client_hello_fixture() {
        let hex = include_str!("../tests/fixtures/client_hello_example_com.hex");
        let bytes: Vec<u8> = hex
            .split_whitespace()
            .collect::<String>()
            .as_bytes()
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect();
        let (sni, consumed) = complete(&bytes);
        assert_eq!(sni, Some(b"example.com".to_vec()));
        assert_eq!(consumed, bytes.len());
    }
}
