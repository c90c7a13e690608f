//! The bodies of the proxy's fuzz targets (`crates/netproxy/fuzz`): everything a sandbox sends
//! the proxy is hostile, and three readers see it before anything else decides. Each body
//! drives the reader the way [`crate::Proxy`] does, with the input arriving in pieces whose
//! sizes come from the input itself, and asserts what the proxy relies on. The unit test below
//! runs them on pseudo-random and mutated input, so every `cargo test` exercises them too.
//!
//! - [`request_head`]: the bounded HTTP request head, its request line, the CONNECT host.
//! - [`client_hello`]: the first bytes in a TLS tunnel, a ClientHello across records, and
//!   its judgement against the CONNECT host.
//! - [`tls_watch`]: the rest of the handshake in both directions, watched for later
//!   ClientHellos.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, ReadBuf};

use crate::host::normalize_host;
use crate::http::{self, Request};
use crate::sniff;
use crate::tls::{is_hello_retry_request, parse_client_hello, Hello};
use crate::watch::TlsWatch;
use crate::Limits;

/// The CONNECT host the tunnels of [`client_hello`] and [`tls_watch`] were opened to.
const HOST: &str = "example.com";

/// Reads the request head from `data` (its first byte sets the head's bound, from 1 byte to
/// past the proxy's 8 KiB), then parses it and canonicalises a CONNECT host, as the proxy does.
pub fn request_head(data: &[u8]) {
    let Some((&bound, input)) = data.split_first() else {
        return;
    };
    let max = 1 + usize::from(bound) * 64;
    let mut buf = Vec::new();
    let outcome = ready(http::read_head(&mut Trickle::new(input), &mut buf, max));
    // What was read is the client's bytes, in order, and never more than the bound.
    assert!(
        buf.len() <= max,
        "read {} bytes past the bound {max}",
        buf.len()
    );
    assert!(
        input.starts_with(&buf),
        "the buffer is not what the client sent"
    );
    let Ok(end) = outcome else {
        return;
    };
    assert!(end <= buf.len());
    let head = &buf[..end];
    assert!(
        head.ends_with(b"\n\n") || head.ends_with(b"\r\n\r\n"),
        "a head that does not end in an empty line"
    );
    if let Ok(Request::Connect { host, port }) = http::parse_request(head) {
        assert_ne!(port, 0, "port 0 accepted");
        assert!(!host.is_empty(), "an empty CONNECT host accepted");
        // The allowlist holds canonical names and is matched against the canonical host:
        // canonicalising must be idempotent, or an entry and a host could never meet.
        if let Ok(name) = normalize_host(&host) {
            assert_eq!(normalize_host(&name).as_deref(), Ok(name.as_str()));
        }
    }
}

/// Reads and judges the tunnel's first bytes as a ClientHello (bounded as the proxy bounds
/// it), and checks that the whole-buffer parser decides no prefix differently from the whole:
/// the proxy parses the buffer again each time more bytes arrive.
pub fn client_hello(data: &[u8]) {
    let max = Limits::default().max_client_hello;
    let mut buf = Vec::new();
    let judged = ready(sniff::client_hello(
        &mut Trickle::new(data),
        &mut buf,
        HOST,
        max,
    ));
    assert!(
        data.starts_with(&buf),
        "the buffer is not what the client sent"
    );
    if let Ok(consumed) = judged {
        assert!(consumed <= buf.len());
    }

    let whole = parse_client_hello(data);
    if let Ok(Hello::Complete { consumed, .. }) = &whole {
        assert!(*consumed <= data.len());
    }
    let mut end = 0;
    while end < data.len() {
        end = (end + usize::from(data[end]).max(1)).min(data.len());
        match parse_client_hello(&data[..end]) {
            Ok(Hello::Incomplete) => {}
            Err(err) => {
                assert!(
                    whole.is_err(),
                    "a prefix was refused ({err}), the whole was not"
                );
                break;
            }
            complete => {
                assert_eq!(complete, whole, "a prefix and the whole parse differently");
                break;
            }
        }
    }
    // The server's first message, read to tell a HelloRetryRequest from a ServerHello.
    std::hint::black_box(is_hello_retry_request(data));
}

/// Feeds `data` to a TLS watch as client and server bytes (each piece's first byte says
/// which, and its size), as the relay does until the watch ends or refuses the tunnel.
pub fn tls_watch(data: &[u8]) {
    let watch = TlsWatch::new(HOST, Limits::default().max_client_hello);
    let mut sent = Vec::new();
    let mut forwarded = Vec::new();
    let mut rest = data;
    while let Some((&control, tail)) = rest.split_first() {
        if watch.finished() {
            break;
        }
        let len = usize::from(control >> 1).max(1).min(tail.len());
        let (piece, tail) = tail.split_at(len);
        rest = tail;
        if control & 1 == 0 {
            sent.extend_from_slice(piece);
            match watch.client_bytes(piece) {
                Ok(pass) => forwarded.extend_from_slice(&pass),
                // A refused tunnel is closed; nothing held is forwarded.
                Err(_) => break,
            }
            // Upstream gets the client's bytes in order, never one it did not send.
            assert!(
                sent.starts_with(&forwarded),
                "forwarded bytes the client did not send"
            );
        } else {
            watch.server_bytes(piece);
        }
    }
}

/// Runs a future that can only be ready: every reader here is an in-memory [`Trickle`].
fn ready<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("a read of in-memory bytes waited"),
    }
}

/// A client that sends `data` in pieces: each read returns as many bytes as the next unread
/// byte says (at least one), so the input chooses where reads split it.
struct Trickle<'a> {
    data: &'a [u8],
}

impl<'a> Trickle<'a> {
    fn new(data: &'a [u8]) -> Trickle<'a> {
        Trickle { data }
    }
}

impl AsyncRead for Trickle<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let Some(&first) = self.data.first() else {
            return Poll::Ready(Ok(()));
        };
        let len = usize::from(first)
            .max(1)
            .min(self.data.len())
            .min(buf.remaining());
        let (piece, rest) = self.data.split_at(len);
        buf.put_slice(piece);
        self.data = rest;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::build::hello_for;

    /// xorshift: deterministic pseudo-random bytes without a dependency.
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.max(1);
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[0]
            })
            .collect()
    }

    /// `valid` with one byte flipped where `seed` says.
    fn mutated(valid: &[u8], seed: u64) -> Vec<u8> {
        let mut bytes = valid.to_vec();
        let flips = noise(seed, 2);
        let at = usize::from(flips[0]) * 7 % bytes.len();
        bytes[at] ^= flips[1].max(1);
        bytes
    }

    /// `bytes` as pieces of [`tls_watch`]'s input, from the server or from the client.
    fn pieces(from_server: bool, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in bytes.chunks(127) {
            let len = u8::try_from(chunk.len()).expect("chunks of at most 127 bytes");
            out.push(len << 1 | u8::from(from_server));
            out.extend_from_slice(chunk);
        }
        out
    }

    /// A handshake record holding a ServerHello with `random`.
    fn server_hello(random: [u8; 32]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&random);
        body.extend_from_slice(&[0, 0x13, 0x01, 0, 0, 0]);
        let mut record = vec![22, 3, 3, 0, 0, 2, 0, 0];
        record[4] = u8::try_from(body.len() + 4).expect("a short record");
        record[7] = u8::try_from(body.len()).expect("a short message");
        record.extend_from_slice(&body);
        record
    }

    #[test]
    fn random_and_mutated_input_never_breaks_a_reader() {
        let head =
            b"\x80CONNECT Example.COM.:443 HTTP/1.1\r\nHost: example.com\r\n\r\n\x16\x03\x01";
        let hello = hello_for(HOST, 40);
        // After the first ClientHello: a HelloRetryRequest, the second ClientHello it asks
        // for, the real ServerHello, and the client going encrypted.
        let mut exchange = pieces(true, &server_hello(crate::tls::HELLO_RETRY_RANDOM));
        exchange.extend(pieces(false, &hello));
        exchange.extend(pieces(true, &server_hello([7; 32])));
        exchange.extend(pieces(
            false,
            &[20, 3, 3, 0, 1, 1, 23, 3, 3, 0, 2, 0xaa, 0xbb],
        ));
        // The inputs mutated are ones the readers accept, so mutations start deep inside them.
        assert!(matches!(
            http::parse_request(&head[1..]),
            Ok(Request::Connect { .. })
        ));
        assert!(matches!(
            parse_client_hello(&hello),
            Ok(Hello::Complete { .. })
        ));
        for seed in 1..1500u64 {
            let random = noise(seed, 600);
            for body in [request_head, client_hello, tls_watch] {
                body(&random);
            }
            request_head(&mutated(head, seed));
            client_hello(&mutated(&hello, seed));
            tls_watch(&mutated(&exchange, seed));
        }
    }
}
