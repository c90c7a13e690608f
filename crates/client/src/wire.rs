//! The messages on a command server's socket (`SOCK_SEQPACKET`, so each is one packet).
//!
//! The client sends one [`Request`]: the served commands read neither stdin nor the working
//! directory. The server checks the request and the client (see `cli_server` in
//! `dynocap-core`) and answers [`Message::Accepted`], or [`Message::NotServed`] for anything
//! it does not serve, a malformed request included. The command runs only once the client
//! answers [`Message::Go`] with its stdout and stderr attached (`SCM_RIGHTS`): a client that
//! gave up waiting for `Accepted` (a stopped or stuck server) closes the connection instead
//! and runs the command itself, and the server, reading the end of the connection where `Go`
//! would be, runs nothing; no descriptor of the client's is then left in flight, where a
//! server that never reads it would keep the client's output open. While the command runs
//! the server sends [`Message::Alive`] every so often, then [`Message::Exited`] or
//! [`Message::Killed`] once it has ended; meanwhile the client may send [`Message::Signal`]
//! for a signal it is sent (Ctrl-C), which ends the command as it would have ended the
//! client's own process.

use std::ffi::OsString;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// The most a request may take: a client with a larger environment runs its command itself.
pub const MAX_REQUEST: usize = 256 * 1024;

/// The descriptors `Go` carries: stdout, then stderr.
pub const PASSED_FDS: usize = 2;

/// The most descriptors one message can carry (`SCM_MAX_FD`): room is made for all of them,
/// so that a message with too many is received whole, its descriptors closed, and refused.
const MAX_PASSED_FDS: usize = 253;

const REQUEST_MAGIC: &[u8; 4] = b"DCQ1";

/// A command as the client would run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub umask: u32,
    /// Its whole argv, `argv[0]` included (clap names the program after it in messages).
    pub args: Vec<OsString>,
    /// Its environment as `rendezvous::Context` keeps it, each entry `KEY=VALUE`.
    pub env: Vec<OsString>,
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(REQUEST_MAGIC);
        out.extend_from_slice(&self.umask.to_le_bytes());
        for list in [&self.args, &self.env] {
            put_len(&mut out, list.len());
            for item in list {
                put_len(&mut out, item.len());
                out.extend_from_slice(item.as_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut input = Reader(bytes);
        if input.take(REQUEST_MAGIC.len())? != REQUEST_MAGIC {
            return Err("not a dynocap command request".to_owned());
        }
        let umask = input.u32()?;
        let mut lists = [Vec::new(), Vec::new()];
        for list in &mut lists {
            let count = input.len()?;
            for _ in 0..count {
                let len = input.len()?;
                list.push(OsString::from_vec(input.take(len)?.to_vec()));
            }
        }
        if !input.0.is_empty() {
            return Err("trailing bytes after the request".to_owned());
        }
        let [args, env] = lists;
        if args.is_empty() {
            return Err("a request without argv[0]".to_owned());
        }
        if env.iter().any(|entry| !entry.as_bytes().contains(&b'=')) {
            return Err("an environment entry without '='".to_owned());
        }
        Ok(Self { umask, args, env })
    }
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    // Requests are bounded by MAX_REQUEST, far below u32::MAX.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("a truncated request".to_owned());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, String> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn len(&mut self) -> Result<usize, String> {
        usize::try_from(self.u32()?).map_err(|_| "a length beyond this machine".to_owned())
    }
}

/// Everything but the request: five bytes, a tag and a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// Server: it will run the command (in this process, whose pid this is) on [`Message::Go`].
    Accepted(i32),
    /// Client: run it; from here the command is the server's, and the client waits for its end.
    Go,
    /// Server: the command is still running (sent every so often, so that a client can tell a
    /// long command from a server that stopped answering).
    Alive,
    /// Server: it does not run this command (not one it serves, a client unlike itself, or a
    /// request it cannot read); the client runs it itself. Nothing ran.
    NotServed,
    /// Server: the command ended with this exit code.
    Exited(i32),
    /// Server: the command was ended by this signal.
    Killed(i32),
    /// Client: it was sent this signal, which ends the command instead.
    Signal(i32),
}

impl Message {
    pub fn encode(self) -> [u8; 5] {
        let (tag, number) = match self {
            Message::Accepted(n) => (b'A', n),
            Message::Go => (b'O', 0),
            Message::Alive => (b'L', 0),
            Message::NotServed => (b'N', 0),
            Message::Exited(n) => (b'X', n),
            Message::Killed(n) => (b'K', n),
            Message::Signal(n) => (b'G', n),
        };
        let [a, b, c, d] = number.to_le_bytes();
        [tag, a, b, c, d]
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let [tag, a, b, c, d] = <[u8; 5]>::try_from(bytes).ok()?;
        let number = i32::from_le_bytes([a, b, c, d]);
        match tag {
            b'A' => Some(Message::Accepted(number)),
            b'O' => Some(Message::Go),
            b'L' => Some(Message::Alive),
            b'N' => Some(Message::NotServed),
            b'X' => Some(Message::Exited(number)),
            b'K' => Some(Message::Killed(number)),
            b'G' => Some(Message::Signal(number)),
            _ => None,
        }
    }
}

/// Sends `request`.
pub fn send_request(socket: BorrowedFd<'_>, request: &Request) -> io::Result<()> {
    let bytes = request.encode();
    if bytes.len() > MAX_REQUEST {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the command and environment are too large for one request",
        ));
    }
    nix::sys::socket::send(
        socket.as_raw_fd(),
        &bytes,
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
    )?;
    Ok(())
}

/// Receives a request; `None` if the peer hung up first. A request larger than
/// [`MAX_REQUEST`], carrying descriptors, or not well formed is an error, and whatever
/// descriptors it carried are closed.
pub fn recv_request(socket: BorrowedFd<'_>) -> io::Result<Option<Request>> {
    let mut buf = vec![0u8; MAX_REQUEST];
    let (len, fds) = recv_with_fds(socket, &mut buf)?;
    if len == 0 && fds.is_empty() {
        return Ok(None);
    }
    if !fds.is_empty() {
        return Err(invalid(format!(
            "a request with {} descriptors (they come with Go)",
            fds.len()
        )));
    }
    Request::decode(&buf[..len]).map(Some).map_err(invalid)
}

/// Sends [`Message::Go`] with `fds` attached.
pub fn send_go(socket: BorrowedFd<'_>, fds: [RawFd; PASSED_FDS]) -> io::Result<()> {
    let bytes = Message::Go.encode();
    let rights = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(&bytes)],
        &rights,
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
        None,
    )?;
    Ok(())
}

/// Receives [`Message::Go`] and its descriptors (close-on-exec); `None` if the peer hung up
/// first. Anything else, or `Go` with other than its two descriptors, is an error.
pub fn recv_go(socket: BorrowedFd<'_>) -> io::Result<Option<[OwnedFd; PASSED_FDS]>> {
    let mut buf = [0u8; 16];
    let (len, fds) = recv_with_fds(socket, &mut buf)?;
    if len == 0 && fds.is_empty() {
        return Ok(None);
    }
    if Message::decode(&buf[..len]) != Some(Message::Go) {
        return Err(invalid("a message other than Go".to_owned()));
    }
    let count = fds.len();
    fds.try_into().map(Some).map_err(|_| {
        invalid(format!(
            "Go with {count} descriptors instead of {PASSED_FDS}"
        ))
    })
}

/// One packet into `buf`, and the descriptors it carried; a packet larger than `buf`, or
/// with more descriptors than one message can carry, is an error.
fn recv_with_fds(socket: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = nix::cmsg_space!([RawFd; MAX_PASSED_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            // SAFETY: SCM_RIGHTS just installed these descriptors in this process, and
            // nothing else refers to them yet.
            fds.extend(
                received
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    if msg.flags.intersects(MsgFlags::MSG_TRUNC) {
        return Err(invalid(format!(
            "a message larger than {} bytes",
            iov[0].len()
        )));
    }
    if msg.flags.intersects(MsgFlags::MSG_CTRUNC) {
        return Err(invalid(
            "a message with more descriptors than one can carry".to_owned(),
        ));
    }
    Ok((msg.bytes, fds))
}

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// Sends `message` without waiting: a peer whose socket buffer is full (it is stopped, or
/// not reading) is an error (`WouldBlock`), not a wait.
pub fn send_message(socket: BorrowedFd<'_>, message: Message) -> io::Result<()> {
    let bytes = message.encode();
    nix::sys::socket::send(
        socket.as_raw_fd(),
        &bytes,
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
    )?;
    Ok(())
}

/// The next message; `None` once the peer has hung up. `Err(WouldBlock)` on a non-blocking
/// socket with nothing to read.
pub fn recv_message(socket: BorrowedFd<'_>) -> io::Result<Option<Message>> {
    let mut buf = [0u8; 16];
    let len = nix::sys::socket::recv(socket.as_raw_fd(), &mut buf, MsgFlags::empty())?;
    if len == 0 {
        return Ok(None);
    }
    Message::decode(&buf[..len])
        .map(Some)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "an unknown message"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    use std::os::fd::AsFd;

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .expect("socketpair")
    }

    fn sample() -> Request {
        Request {
            umask: 0o027,
            args: vec!["dynocap".into(), "exec".into(), "a b".into(), "".into()],
            env: vec!["DYNOCAP_HOME=/h".into(), "EMPTY=".into(), "K=v=w".into()],
        }
    }

    #[test]
    fn a_request_crosses_and_go_brings_the_descriptors() {
        let (client, server) = pair();
        send_request(client.as_fd(), &sample()).expect("send");
        let request = recv_request(server.as_fd())
            .expect("recv")
            .expect("a request");
        assert_eq!(request, sample());
        let files: Vec<std::fs::File> = (0..PASSED_FDS).map(|_| tempfile_in_tmp()).collect();
        let raw = [0, 1].map(|i| files[i].as_raw_fd());
        send_go(client.as_fd(), raw).expect("send go");
        let fds = recv_go(server.as_fd()).expect("recv go").expect("go");
        for (fd, file) in fds.iter().zip(&files) {
            let ours = nix::sys::stat::fstat(fd).expect("fstat");
            let theirs = nix::sys::stat::fstat(file).expect("fstat");
            assert_eq!((ours.st_dev, ours.st_ino), (theirs.st_dev, theirs.st_ino));
        }
    }

    /// Sends `bytes` with `count` descriptors (copies of one file).
    fn send_raw(socket: &OwnedFd, bytes: &[u8], count: usize) {
        let file = tempfile_in_tmp();
        let fds = vec![file.as_raw_fd(); count];
        let rights = [ControlMessage::ScmRights(&fds)];
        let cmsgs: &[ControlMessage<'_>] = if count == 0 { &[] } else { &rights };
        sendmsg::<()>(
            socket.as_raw_fd(),
            &[IoSlice::new(bytes)],
            cmsgs,
            MsgFlags::empty(),
            None,
        )
        .expect("sendmsg");
    }

    #[test]
    fn a_request_with_descriptors_or_cut_short_and_a_go_without_its_two_are_refused() {
        let (client, server) = pair();
        for count in [1, 2, 3, MAX_PASSED_FDS] {
            send_raw(&client, &sample().encode(), count);
            let err = recv_request(server.as_fd()).expect_err("descriptors");
            assert!(
                err.to_string().contains(&format!("{count} descriptors")),
                "{err}"
            );
        }
        for count in [0, 1, 3, 64] {
            send_raw(&client, &Message::Go.encode(), count);
            let err = recv_go(server.as_fd()).expect_err("not two");
            assert!(
                err.to_string()
                    .contains(&format!("Go with {count} descriptors")),
                "{err}"
            );
        }
        send_raw(&client, &Message::Alive.encode(), 2);
        assert!(recv_go(server.as_fd()).is_err(), "not Go");
        send_raw(&client, &[b'x'; 64], 0);
        assert!(recv_go(server.as_fd()).is_err(), "larger than any message");

        let encoded = sample().encode();
        for cut in [0, 3, 8, encoded.len() - 1] {
            assert!(Request::decode(&encoded[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = encoded.clone();
        extra.push(0);
        assert!(Request::decode(&extra).is_err());
        // A length field far beyond the packet.
        let mut oversized = REQUEST_MAGIC.to_vec();
        oversized.extend_from_slice(&0u32.to_le_bytes());
        oversized.extend_from_slice(&u32::MAX.to_le_bytes());
        oversized.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Request::decode(&oversized).is_err());
    }

    #[test]
    fn a_hang_up_before_the_request_is_none() {
        let (client, server) = pair();
        drop(client);
        assert!(recv_request(server.as_fd()).expect("recv").is_none());
        assert!(recv_message(server.as_fd()).expect("recv").is_none());
    }

    #[test]
    fn messages_round_trip() {
        let (a, b) = pair();
        for message in [
            Message::Accepted(4242),
            Message::Go,
            Message::Alive,
            Message::NotServed,
            Message::Exited(0),
            Message::Exited(141),
            Message::Killed(2),
            Message::Signal(15),
        ] {
            send_message(a.as_fd(), message).expect("send");
            assert_eq!(recv_message(b.as_fd()).expect("recv"), Some(message));
        }
        assert_eq!(Message::decode(b"Z\0\0\0\0"), None);
        assert_eq!(Message::decode(b"X\0\0"), None);
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "dcwire{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&path)
            .expect("temp file");
        std::fs::remove_file(&path).expect("unlink");
        file
    }
}
