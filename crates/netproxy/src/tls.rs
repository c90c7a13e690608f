//! A strict parser of the TLS handshake bytes the proxy judges: the client's ClientHello
//! (RFC 8446 §4.1.2, RFC 6066 §3), reassembled across records and fed the client's bytes as
//! they arrive, with every extension walked; and enough of the server's first message to tell
//! a HelloRetryRequest from a ServerHello. Anything that is not well formed is an error, never
//! a guess: what the proxy judges must be what the server will read.

/// TLS record content type of handshake messages.
pub(crate) const CONTENT_HANDSHAKE: u8 = 22;
/// Handshake message type of ClientHello.
pub(crate) const HANDSHAKE_CLIENT_HELLO: u8 = 1;
/// Handshake message type of ServerHello (and of HelloRetryRequest, RFC 8446 §4.1.3).
pub(crate) const HANDSHAKE_SERVER_HELLO: u8 = 2;
/// Largest plaintext record fragment (RFC 8446 §5.1).
const MAX_RECORD_LEN: usize = 1 << 14;
/// Extension type of server_name.
const EXT_SERVER_NAME: u16 = 0;
/// server_name entry type of host_name.
const NAME_TYPE_HOST: u8 = 0;
/// The ServerHello.random that marks a HelloRetryRequest: SHA-256("HelloRetryRequest").
pub(crate) const HELLO_RETRY_RANDOM: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
    0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];

/// Extensions that carry the real server name where the proxy cannot read it: a server that
/// honours one may route the connection by a name other than the SNI the proxy checked.
const CONCEALING_EXTENSIONS: [(u16, &str); 8] = [
    (0xfe0d, "encrypted_client_hello"),
    // The codepoints of the ECH implementation drafts 08 to 12, still in deployed clients.
    (0xfe08, "encrypted_client_hello (draft 08)"),
    (0xfe09, "encrypted_client_hello (draft 09)"),
    (0xfe0a, "encrypted_client_hello (draft 10)"),
    (0xfe0b, "encrypted_client_hello (draft 11)"),
    (0xfe0c, "encrypted_client_hello (draft 12)"),
    // Only ever valid inside an encrypted inner ClientHello.
    (0xfd00, "ech_outer_extensions"),
    (0xffce, "encrypted_server_name (ESNI)"),
];

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

/// What the proxy judges of one ClientHello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// The one host_name in server_name, as sent (not canonicalised), if the extension is there.
    pub server_name: Option<Vec<u8>>,
    /// Every extension type, in the order sent (each at most once).
    pub extensions: Vec<u16>,
}

impl ClientHello {
    /// The first extension that hides the destination from the proxy, with its name.
    pub fn concealing_extension(&self) -> Option<(u16, &'static str)> {
        self.extensions.iter().find_map(|kind| {
            CONCEALING_EXTENSIONS
                .iter()
                .find(|(code, _)| code == kind)
                .copied()
        })
    }
}

/// Result of feeding the bytes received so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A prefix of a possibly valid ClientHello: read more.
    Incomplete,
    /// A whole ClientHello.
    Complete {
        hello: ClientHello,
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
        let Some(whole) = message_len(&message) else {
            continue;
        };
        if message.len() < whole {
            continue;
        }
        if message.len() > whole {
            // The client sends nothing else in handshake records before the server answers.
            return Err(HelloError::BadRecord(
                "handshake data after the ClientHello in the same flight",
            ));
        }
        let hello = parse_client_hello_body(&message[4..])?;
        return Ok(Hello::Complete {
            hello,
            consumed: pos,
        });
    }
}

/// The length of the handshake message at the start of `message`, header included, once its
/// four-byte header is there.
pub(crate) fn message_len(message: &[u8]) -> Option<usize> {
    let header = message.get(..4)?;
    Some(4 + (usize::from(header[1]) << 16 | usize::from(header[2]) << 8 | usize::from(header[3])))
}

/// Whether a ServerHello body (after the handshake header) is a HelloRetryRequest: the
/// client answers one with a second ClientHello.
pub(crate) fn is_hello_retry_request(server_hello: &[u8]) -> bool {
    server_hello.get(2..34) == Some(&HELLO_RETRY_RANDOM[..])
}

/// A fatal TLS alert record (RFC 8446 §6), sent to a client whose handshake the proxy ends so
/// that it reports why instead of a bare end of stream.
pub(crate) fn fatal_alert(description: Alert) -> [u8; 7] {
    [21, 3, 3, 0, 2, 2, description as u8]
}

/// The alert descriptions the proxy sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alert {
    /// The hello was well formed, and refused by policy.
    AccessDenied = 49,
    /// The hello was not well formed.
    DecodeError = 50,
    /// The hello was allowed; the upstream could not be reached.
    InternalError = 80,
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

/// The ClientHello body after the handshake header: every field's framing checked, every
/// extension walked.
pub(crate) fn parse_client_hello_body(body: &[u8]) -> Result<ClientHello, HelloError> {
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
    let mut hello = ClientHello {
        server_name: None,
        extensions: Vec::new(),
    };
    if r.is_empty() {
        // A TLS 1.2 ClientHello may omit extensions; then it has no SNI.
        return Ok(hello);
    }
    let mut extensions = Reader {
        bytes: r.vec16("truncated extensions")?,
    };
    if !r.is_empty() {
        return Err(HelloError::Malformed("bytes after the extensions"));
    }
    while !extensions.is_empty() {
        let kind = extensions.u16("truncated extension type")?;
        let data = extensions.vec16("truncated extension")?;
        // RFC 8446 §4.2: a type appears at most once; servers differ in which copy they use.
        if hello.extensions.contains(&kind) {
            return Err(HelloError::Malformed("an extension appears twice"));
        }
        hello.extensions.push(kind);
        if kind == EXT_SERVER_NAME {
            hello.server_name = Some(parse_server_name(data)?);
        }
    }
    Ok(hello)
}

/// The server_name extension data: a list of exactly one entry, a non-empty host_name.
/// RFC 6066 allows one name per type, and host_name is the only type; a server reading a list
/// of several may pick any of them, so only a list with one name says where the client goes.
fn parse_server_name(data: &[u8]) -> Result<Vec<u8>, HelloError> {
    let mut r = Reader { bytes: data };
    let mut list = Reader {
        bytes: r.vec16("truncated server_name list")?,
    };
    if !r.is_empty() {
        return Err(HelloError::Malformed("bytes after the server_name list"));
    }
    if list.is_empty() {
        return Err(HelloError::Malformed("an empty server_name list"));
    }
    let kind = list.u8("truncated server_name entry")?;
    let name = list.vec16("truncated server_name entry")?;
    if kind != NAME_TYPE_HOST {
        return Err(HelloError::Malformed(
            "a server_name entry that is not a host_name",
        ));
    }
    if name.is_empty() {
        return Err(HelloError::Malformed("empty host_name in server_name"));
    }
    if !list.is_empty() {
        return Err(HelloError::Malformed("more than one name in server_name"));
    }
    Ok(name.to_vec())
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
        let (hello, consumed) = complete_hello(buf);
        (hello.server_name, consumed)
    }

    fn complete_hello(buf: &[u8]) -> (ClientHello, usize) {
        match parse_client_hello(buf).unwrap() {
            Hello::Complete { hello, consumed } => (hello, consumed),
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
            Err(HelloError::Malformed("more than one name in server_name"))
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

#[cfg(test)]
mod judged_fields {
    use super::build::*;
    use super::*;

    fn parsed(extensions: Vec<u8>) -> Result<ClientHello, HelloError> {
        match parse_client_hello(&records(&client_hello(Some(extensions)), 1 << 14))? {
            Hello::Complete { hello, .. } => Ok(hello),
            Hello::Incomplete => panic!("expected a complete ClientHello"),
        }
    }

    /// One server_name entry: name type, name.
    type NameEntry<'a> = (u8, &'a [u8]);

    /// server_name data holding `entries` as given.
    fn server_name_list(entries: &[NameEntry]) -> Vec<u8> {
        let mut list = Vec::new();
        for (kind, name) in entries {
            list.push(*kind);
            list.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
            list.extend_from_slice(name);
        }
        let mut data = u16::try_from(list.len()).unwrap().to_be_bytes().to_vec();
        data.extend_from_slice(&list);
        extension(0, &data)
    }

    #[test]
    fn every_extension_is_listed_in_order() {
        let mut ext = extension(0x0a0a, &[]); // GREASE: unknown, allowed, listed
        ext.extend_from_slice(&sni("a.example"));
        ext.extend_from_slice(&extension(43, &[2, 3, 4]));
        ext.extend_from_slice(&extension(0xff01, &[0])); // renegotiation_info
        let hello = parsed(ext).unwrap();
        assert_eq!(hello.extensions, vec![0x0a0a, 0, 43, 0xff01]);
        assert_eq!(hello.server_name, Some(b"a.example".to_vec()));
        assert_eq!(hello.concealing_extension(), None);
    }

    #[test]
    fn ech_esni_and_their_drafts_are_concealing() {
        for (code, name) in [
            (0xfe0d, "encrypted_client_hello"),
            (0xfe0a, "encrypted_client_hello (draft 10)"),
            (0xfd00, "ech_outer_extensions"),
            (0xffce, "encrypted_server_name (ESNI)"),
        ] {
            // The outer SNI names an allowed host; the extension comes after it.
            let mut ext = sni("allowed.example");
            ext.extend_from_slice(&extension(code, &[0, 1, 2, 3]));
            let hello = parsed(ext).unwrap();
            assert_eq!(hello.server_name, Some(b"allowed.example".to_vec()));
            assert_eq!(
                hello.concealing_extension(),
                Some((code, name)),
                "{code:#06x}"
            );
        }
        // ESNI without any SNI at all: still found.
        let hello = parsed(extension(0xffce, &[9; 40])).unwrap();
        assert_eq!(hello.concealing_extension().map(|c| c.0), Some(0xffce));
    }

    #[test]
    fn server_name_holds_exactly_one_host_name() {
        let cases: [(&[NameEntry], &str); 4] = [
            (&[], "an empty server_name list"),
            (
                &[(1, b"a.example")],
                "a server_name entry that is not a host_name",
            ),
            (
                &[(0, b"a.example"), (1, b"b.example")],
                "more than one name in server_name",
            ),
            (
                &[(0, b"a.example"), (0, b"b.example")],
                "more than one name in server_name",
            ),
        ];
        for (entries, problem) in cases {
            assert_eq!(
                parsed(server_name_list(entries)),
                Err(HelloError::Malformed(problem)),
                "{entries:?}"
            );
        }
        // Bytes after the list, inside the extension, are refused too.
        let mut data = server_name_list(&[(0, b"a.example")]);
        data.extend_from_slice(&[0]);
        let len = u16::try_from(data.len() - 4).unwrap().to_be_bytes();
        data[2..4].copy_from_slice(&len);
        assert!(matches!(parsed(data), Err(HelloError::Malformed(_))));
    }

    #[test]
    fn hello_retry_request_is_told_from_a_server_hello() {
        let mut body = vec![3, 3];
        body.extend_from_slice(&HELLO_RETRY_RANDOM);
        assert!(is_hello_retry_request(&body));
        body[10] ^= 1;
        assert!(!is_hello_retry_request(&body));
        assert!(!is_hello_retry_request(&[3, 3, 0xcf]));
    }

    #[test]
    fn alerts_are_fatal_records() {
        assert_eq!(fatal_alert(Alert::AccessDenied), [21, 3, 3, 0, 2, 2, 49]);
    }
}
