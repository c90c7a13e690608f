//! The TLS handshake after the first ClientHello, watched until no plaintext ClientHello can
//! follow: a client may send another one (after a HelloRetryRequest, RFC 8446 §4.1.4, or
//! unasked), and a server routing by name may read it, so every plaintext ClientHello in the
//! tunnel is judged as the first was, and no byte of a handshake message goes upstream before
//! the whole message is in and judged: a message's first bytes (its server_name, say) are held
//! back until its last arrives.
//!
//! The client's stream is split into records. Handshake records are plaintext until the
//! client's change_cipher_spec or its first encrypted record; after that only the second
//! ClientHello a HelloRetryRequest asks for is plaintext (TLS 1.3 may send a change_cipher_spec
//! just before it). The server's records are read only to see that HelloRetryRequest; the
//! proxy reads the server's bytes before it forwards them, so it knows of the request before
//! the client can answer it. Once the server has sent its real ServerHello and the client has
//! gone encrypted, with no retry pending and nothing held, the watch ends and the relay only
//! copies.

use std::sync::{Arc, Mutex, PoisonError};

use crate::sniff::{judge_hello, SniffError};
use crate::tls::{
    is_hello_retry_request, message_len, parse_client_hello_body, Alert, CONTENT_HANDSHAKE,
    HANDSHAKE_CLIENT_HELLO, HANDSHAKE_SERVER_HELLO,
};

const CONTENT_CHANGE_CIPHER_SPEC: u8 = 20;
const CONTENT_APPLICATION_DATA: u8 = 23;
const CONTENT_HEARTBEAT: u8 = 24;
/// Largest record body: 2^14 bytes of plaintext plus the most a TLS 1.2 cipher adds.
const MAX_CIPHERTEXT: usize = (1 << 14) + 2048;

/// Why a later part of a TLS tunnel was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchError {
    #[error("a later TLS ClientHello in the tunnel was refused: {0}")]
    LaterHello(SniffError),
    #[error("after the ClientHello the client sent bytes that are not TLS records ({0})")]
    NotTls(&'static str),
    #[error("a TLS handshake message after the ClientHello is larger than {0} bytes")]
    TooLarge(usize),
}

impl WatchError {
    /// The TLS alert that tells the client why its handshake ends.
    pub(crate) fn alert(&self) -> Option<Alert> {
        match self {
            WatchError::LaterHello(err) => err.alert(),
            WatchError::NotTls(_) | WatchError::TooLarge(_) => Some(Alert::DecodeError),
        }
    }
}

/// One direction's stream cut into records: the fragments of each, with its content type.
#[derive(Default)]
struct Records {
    header: Vec<u8>,
    kind: u8,
    remaining: usize,
}

impl Records {
    /// Feeds `bytes`; calls `fragment(kind, piece, offset, starts_record)` for each piece of a
    /// record body, in order, `offset` being where the piece starts in `bytes`. Stops at the
    /// first error, from the framing or from `fragment`.
    fn feed<E>(
        &mut self,
        bytes: &[u8],
        mut fragment: impl FnMut(u8, &[u8], usize, bool) -> Result<(), E>,
        framing: impl Fn(&'static str) -> E,
    ) -> Result<(), E> {
        let mut at = 0;
        while at < bytes.len() {
            if self.remaining > 0 {
                let n = self.remaining.min(bytes.len() - at);
                self.remaining -= n;
                fragment(self.kind, &bytes[at..at + n], at, false)?;
                at += n;
                continue;
            }
            let n = (5 - self.header.len()).min(bytes.len() - at);
            self.header.extend_from_slice(&bytes[at..at + n]);
            at += n;
            if self.header.len() < 5 {
                break;
            }
            let kind = self.header[0];
            if !(CONTENT_CHANGE_CIPHER_SPEC..=CONTENT_HEARTBEAT).contains(&kind) {
                return Err(framing("an unknown record type"));
            }
            if self.header[1] != 3 {
                return Err(framing("a record version that is not 3.x"));
            }
            let len = usize::from(u16::from_be_bytes([self.header[3], self.header[4]]));
            if len > MAX_CIPHERTEXT {
                return Err(framing("a record longer than TLS allows"));
            }
            self.header.clear();
            self.kind = kind;
            self.remaining = len;
            fragment(kind, &[], at, true)?;
        }
        Ok(())
    }
}

/// Handshake messages reassembled from handshake record fragments, remembering where the
/// bytes of the unfinished one lie in the caller's stream.
#[derive(Default)]
struct Messages {
    partial: Vec<u8>,
    /// For each fragment in `partial`: (its start in `partial`, its start in the stream, len).
    pieces: Vec<(usize, usize, usize)>,
}

impl Messages {
    /// Appends `bytes`, found at `at` in the caller's stream; calls `message(type, body)` for
    /// each message completed.
    fn feed(
        &mut self,
        bytes: &[u8],
        at: usize,
        max: usize,
        mut message: impl FnMut(u8, &[u8]) -> Result<(), WatchError>,
    ) -> Result<(), WatchError> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.pieces.push((self.partial.len(), at, bytes.len()));
        self.partial.extend_from_slice(bytes);
        while let Some(len) = message_len(&self.partial) {
            if len > max {
                return Err(WatchError::TooLarge(max));
            }
            if self.partial.len() < len {
                break;
            }
            let rest = self.partial.split_off(len);
            message(self.partial[0], &self.partial[4..])?;
            self.partial = rest;
            self.pieces.retain_mut(|(start, stream, piece_len)| {
                if *start + *piece_len <= len {
                    return false;
                }
                let cut = len.saturating_sub(*start);
                *start = start.saturating_sub(len);
                *stream += cut;
                *piece_len -= cut;
                true
            });
        }
        Ok(())
    }

    /// Where the unfinished message's first byte lies in the stream, if one is unfinished.
    fn unfinished_from(&self) -> Option<usize> {
        self.pieces.first().map(|&(_, stream, _)| stream)
    }

    /// The caller dropped the first `n` bytes of its stream.
    fn forget(&mut self, n: usize) {
        for (_, stream, _) in &mut self.pieces {
            *stream -= n;
        }
    }
}

/// What the server's side tells the client's.
#[derive(Default)]
struct ServerSide {
    records: Records,
    messages: Messages,
    /// A HelloRetryRequest was sent and the ClientHello answering it not yet judged.
    retry_pending: bool,
    /// The server's real ServerHello (or something that ends its plaintext hello) went by.
    done: bool,
}

#[derive(Default)]
struct ClientSide {
    records: Records,
    messages: Messages,
    /// The client sent change_cipher_spec or an encrypted record: its later handshake records
    /// are ciphertext, unless a retry is pending.
    encrypted: bool,
    /// Bytes read but not yet forwarded: from the first byte of an unfinished handshake
    /// message on.
    held: Vec<u8>,
}

#[derive(Default)]
struct State {
    client: ClientSide,
    server: ServerSide,
    finished: bool,
}

impl State {
    fn update_finished(&mut self) {
        self.finished = self.server.done
            && self.client.encrypted
            && !self.server.retry_pending
            && self.client.held.is_empty();
    }
}

/// The watch over one TLS tunnel; clones share it (one for each direction of the relay).
#[derive(Clone)]
pub(crate) struct TlsWatch {
    host: Arc<str>,
    max_message: usize,
    state: Arc<Mutex<State>>,
}

impl TlsWatch {
    /// A watch for a tunnel to `host` (canonical) whose first ClientHello was allowed;
    /// handshake messages larger than `max_message` are refused.
    pub(crate) fn new(host: &str, max_message: usize) -> TlsWatch {
        TlsWatch {
            host: host.into(),
            max_message,
            state: Arc::default(),
        }
    }

    /// Whether the watch has ended: the relay need not call it any more.
    pub(crate) fn finished(&self) -> bool {
        self.lock().finished
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Each call leaves the state consistent before it can fail; a panic in the other
        // direction's task leaves it readable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes the client sent; returns those that may go upstream now, in order (earlier held
    /// bytes first). The rest is held until the handshake message it belongs to is whole and
    /// judged. An error refuses the tunnel: nothing held is ever forwarded.
    pub(crate) fn client_bytes(&self, bytes: &[u8]) -> Result<Vec<u8>, WatchError> {
        let mut guard = self.lock();
        let state = &mut *guard;
        if state.finished {
            return Ok(bytes.to_vec());
        }
        let ClientSide {
            records,
            messages,
            encrypted,
            held,
        } = &mut state.client;
        let server = &mut state.server;
        let host = &*self.host;
        let max = self.max_message;
        let base = held.len();
        held.extend_from_slice(bytes);
        records.feed(
            bytes,
            |kind, fragment, at, starts| match kind {
                CONTENT_HANDSHAKE if !*encrypted || server.retry_pending => {
                    messages.feed(fragment, base + at, max, |kind, body| {
                        if kind == HANDSHAKE_CLIENT_HELLO {
                            let hello = parse_client_hello_body(body)
                                .map_err(|err| WatchError::LaterHello(err.into()))?;
                            judge_hello(&hello, host).map_err(WatchError::LaterHello)?;
                            server.retry_pending = false;
                        }
                        // Other plaintext messages are TLS 1.2's client flight (certificate,
                        // key exchange): nothing in them names a server.
                        Ok(())
                    })
                }
                // RFC 8446 §5.1: no other record may come inside a handshake message. Its
                // bytes are held; letting other records pass them would hold them forever.
                _ if starts && messages.unfinished_from().is_some() => Err(WatchError::NotTls(
                    "another record inside an unfinished handshake message",
                )),
                CONTENT_CHANGE_CIPHER_SPEC | CONTENT_APPLICATION_DATA if starts => {
                    *encrypted = true;
                    Ok(())
                }
                _ => Ok(()),
            },
            WatchError::NotTls,
        )?;
        if held.len() - messages.unfinished_from().unwrap_or(held.len()) > max {
            return Err(WatchError::TooLarge(max));
        }
        let release = messages.unfinished_from().unwrap_or(held.len());
        let pass: Vec<u8> = held.drain(..release).collect();
        messages.forget(release);
        state.update_finished();
        Ok(pass)
    }

    /// Bytes the server sent, before they go to the client.
    pub(crate) fn server_bytes(&self, bytes: &[u8]) {
        let mut guard = self.lock();
        let state = &mut *guard;
        let server = &mut state.server;
        if server.done {
            return;
        }
        let max = self.max_message;
        let ServerSide {
            records,
            messages,
            retry_pending,
            done,
        } = server;
        let read = records.feed(
            bytes,
            |kind, fragment, _, _| {
                if *done {
                    // Past the hello: only record headers are read, to the end of this chunk.
                    return Ok(());
                }
                match kind {
                    CONTENT_HANDSHAKE => messages.feed(fragment, 0, max, |kind, body| {
                        if kind == HANDSHAKE_SERVER_HELLO && is_hello_retry_request(body) {
                            *retry_pending = true;
                        } else {
                            // The real ServerHello, or a server not speaking TLS as expected:
                            // either way no retry can be asked for any more.
                            *done = true;
                        }
                        Ok(())
                    }),
                    // A retry's compatibility change_cipher_spec; the hello continues.
                    CONTENT_CHANGE_CIPHER_SPEC => Ok(()),
                    _ => {
                        *done = true;
                        Ok(())
                    }
                }
            },
            WatchError::NotTls,
        );
        if read.is_err() {
            // A framing error or a message too large from the server: not the proxy's to
            // police, and no HelloRetryRequest can be read from it.
            server.done = true;
        }
        state.update_finished();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::build::{client_hello, hello_for, records, sni};
    use crate::tls::{HelloError, HELLO_RETRY_RANDOM};

    fn record(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![kind, 3, 3];
        out.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    /// A ServerHello handshake message, a HelloRetryRequest when `retry`.
    fn server_hello(retry: bool) -> Vec<u8> {
        let mut body = vec![3, 3];
        if retry {
            body.extend_from_slice(&HELLO_RETRY_RANDOM);
        } else {
            body.extend_from_slice(&[5; 32]);
        }
        body.extend_from_slice(&[0, 0x13, 0x01, 0, 0, 0]);
        let mut msg = vec![2];
        msg.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
        msg.extend_from_slice(&body);
        records(&msg, 1 << 14)
    }

    fn watch() -> TlsWatch {
        TlsWatch::new("a.example", 64 * 1024)
    }

    fn later_refused(result: Result<Vec<u8>, WatchError>) -> SniffError {
        match result {
            Err(WatchError::LaterHello(err)) => err,
            other => panic!("expected a refused later hello, got {other:?}"),
        }
    }

    #[test]
    fn a_second_hello_sent_unasked_is_judged() {
        let w = watch();
        assert!(w.client_bytes(&hello_for("a.example", 0)).is_ok());
        let err = later_refused(w.client_bytes(&hello_for("b.example", 0)));
        assert!(matches!(err, SniffError::SniMismatch { .. }), "{err}");
        // Split over records and writes, byte by byte: judged when whole.
        let w = watch();
        let bad = records(&client_hello(Some(sni("b.example"))), 20);
        let (last, head) = bad.split_last().unwrap();
        for byte in head {
            assert!(w.client_bytes(&[*byte]).is_ok());
        }
        later_refused(w.client_bytes(&[*last]));
    }

    #[test]
    fn a_later_hello_is_held_back_until_judged() {
        let w = watch();
        // A second hello, allowed, in three reads: nothing past its record header passes
        // until it is whole, and then all of it, with what came after it, in order.
        let good = records(&client_hello(Some(sni("a.example"))), 30);
        let mut stream = good.clone();
        stream.extend_from_slice(&record(23, &[7; 10]));
        let (one, rest) = stream.split_at(7);
        let (two, three) = rest.split_at(good.len() - 7 - 1);
        assert_eq!(w.client_bytes(one).unwrap(), &one[..5]);
        assert_eq!(w.client_bytes(two).unwrap(), b"");
        assert_eq!(w.client_bytes(three).unwrap(), &stream[5..]);
        // One refused: its prefix, server_name included, never came out.
        let w = watch();
        let bad = records(&client_hello(Some(sni("b.example"))), 30);
        let (head, last) = bad.split_at(bad.len() - 1);
        assert_eq!(w.client_bytes(head).unwrap(), &head[..5]);
        later_refused(w.client_bytes(last));
    }

    #[test]
    fn the_hello_answering_a_retry_request_is_judged_after_change_cipher_spec() {
        let w = watch();
        w.server_bytes(&server_hello(true));
        // TLS 1.3 middlebox compatibility: change_cipher_spec right before the second hello.
        assert!(w.client_bytes(&record(20, &[1])).is_ok());
        let mut ech = sni("a.example");
        ech.extend_from_slice(&crate::tls::build::extension(0xfe0d, &[1, 2, 3]));
        let err = later_refused(w.client_bytes(&records(&client_hello(Some(ech)), 1 << 14)));
        assert!(
            matches!(err, SniffError::Concealed { code: 0xfe0d, .. }),
            "{err}"
        );

        // The same with the right name passes, and the watch ends after the real hello.
        let w = watch();
        w.server_bytes(&server_hello(true));
        assert!(w.client_bytes(&record(20, &[1])).is_ok());
        assert!(w.client_bytes(&hello_for("a.example", 0)).is_ok());
        assert!(!w.finished());
        w.server_bytes(&server_hello(false));
        assert!(w.client_bytes(&record(23, &[7; 40])).is_ok());
        assert!(w.finished());
        // Once finished nothing is parsed: not even bytes that are not records.
        assert_eq!(w.client_bytes(b"anything").unwrap(), b"anything");
    }

    #[test]
    fn tls12_encrypted_handshake_records_are_not_parsed() {
        let w = watch();
        // Client key exchange in plaintext, then change_cipher_spec, then an encrypted
        // Finished whose first byte happens to be 1 (ClientHello's type). The server's hello
        // is fed last so that the watch is still on when the ciphertext passes.
        assert!(w
            .client_bytes(&record(22, &[16, 0, 0, 3, 2, 0xab, 0xcd]))
            .is_ok());
        assert!(w.client_bytes(&record(20, &[1])).is_ok());
        assert!(w
            .client_bytes(&record(22, &[1, 0xff, 0xff, 0xff, 9, 9]))
            .is_ok());
        assert!(!w.finished());
        w.server_bytes(&server_hello(false));
        assert!(w.finished());
    }

    #[test]
    fn malformed_and_non_tls_bytes_are_refused_while_watching() {
        let w = watch();
        assert!(matches!(
            w.client_bytes(b"GET / HTTP/1.1\r\n"),
            Err(WatchError::NotTls(_))
        ));
        let w = watch();
        let mut broken = client_hello(Some(sni("a.example")));
        broken[4] = 9; // legacy_version 0x0903
        assert!(matches!(
            later_refused(w.client_bytes(&records(&broken, 1 << 14))),
            SniffError::Hello(HelloError::Malformed(_))
        ));
        let w = TlsWatch::new("a.example", 100);
        assert!(matches!(
            w.client_bytes(&record(22, &[1, 0, 1, 0])),
            Err(WatchError::TooLarge(100))
        ));
    }

    #[test]
    fn no_record_may_pass_an_unfinished_handshake_message() {
        let w = watch();
        // The hello's first record of 30 bytes, whole; its message goes on in the next one.
        let hello = records(&client_hello(Some(sni("a.example"))), 30);
        assert!(w.client_bytes(&hello[..35]).is_ok());
        let mut interleaved = record(20, &[1]);
        interleaved.extend_from_slice(&record(23, &[0; 64]));
        assert!(matches!(
            w.client_bytes(&interleaved),
            Err(WatchError::NotTls(_))
        ));
    }

    #[test]
    fn early_data_before_the_server_answers_passes() {
        let w = watch();
        assert!(w.client_bytes(&record(20, &[1])).is_ok());
        assert!(w.client_bytes(&record(23, &[3; 100])).is_ok());
        assert!(!w.finished(), "the server has not answered yet");
        w.server_bytes(&server_hello(false));
        assert!(w.finished());
    }
}
