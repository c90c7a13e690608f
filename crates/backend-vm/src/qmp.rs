//! A minimal QMP client: the greeting, capability negotiation, and one command at a time,
//! over the socketpair end the supervisor kept. Every read has a deadline: a QEMU that stopped
//! answering must not hang a destroy.

use std::io::{BufRead, BufReader, Read as _, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde_json::Value;

use crate::error::{Result, VmError};

/// Longest line QMP may send us (events and answers are small; a guest cannot make them big).
const MAX_LINE: u64 = 1 << 20;

pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    negotiated: bool,
}

impl Qmp {
    pub fn new(stream: UnixStream) -> Result<Self> {
        let writer = stream
            .try_clone()
            .map_err(|err| VmError::Qmp(format!("cloning the socket: {err}")))?;
        Ok(Self {
            reader: BufReader::new(stream),
            writer,
            negotiated: false,
        })
    }

    /// Runs `command` and returns its `return` value.
    pub fn execute(&mut self, command: &str, timeout: Duration) -> Result<Value> {
        self.execute_with(command, None, timeout)
    }

    /// Runs `command` with `arguments` and returns its `return` value.
    pub fn execute_with(
        &mut self,
        command: &str,
        arguments: Option<Value>,
        timeout: Duration,
    ) -> Result<Value> {
        self.reader
            .get_ref()
            .set_read_timeout(Some(timeout))
            .map_err(|err| VmError::Qmp(format!("setting a timeout: {err}")))?;
        if !self.negotiated {
            let greeting = self.read_message()?;
            if greeting.get("QMP").is_none() {
                return Err(VmError::Qmp(format!("unexpected greeting {greeting}")));
            }
            self.send_and_wait("qmp_capabilities", None)?;
            self.negotiated = true;
        }
        self.send_and_wait(command, arguments)
    }

    /// Runs `command` with `arguments`, passing QEMU the descriptor `fd` with it (SCM_RIGHTS:
    /// what `getfd` takes).
    pub fn execute_passing_fd(
        &mut self,
        command: &str,
        arguments: Option<Value>,
        fd: std::os::fd::BorrowedFd<'_>,
        timeout: Duration,
    ) -> Result<Value> {
        self.execute("query-status", timeout)?;
        self.send(command, arguments, Some(fd))?;
        self.wait_for(command)
    }

    fn send_and_wait(&mut self, command: &str, arguments: Option<Value>) -> Result<Value> {
        self.send(command, arguments, None)?;
        self.wait_for(command)
    }

    fn send(
        &mut self,
        command: &str,
        arguments: Option<Value>,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<()> {
        use std::os::fd::AsRawFd;
        let mut request = serde_json::json!({ "execute": command });
        if let Some(arguments) = arguments {
            request["arguments"] = arguments;
        }
        let line = request.to_string() + "\n";
        let sent = match fd {
            None => self.writer.write_all(line.as_bytes()),
            Some(fd) => {
                let fds = [fd.as_raw_fd()];
                let control = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
                let iov = [std::io::IoSlice::new(line.as_bytes())];
                match nix::sys::socket::sendmsg::<()>(
                    self.writer.as_raw_fd(),
                    &iov,
                    &control,
                    nix::sys::socket::MsgFlags::empty(),
                    None,
                ) {
                    // A line this short goes whole into a Unix socket with room, or not at all.
                    Ok(n) if n == line.len() => Ok(()),
                    Ok(n) => Err(std::io::Error::other(format!(
                        "only {n} of {} bytes went",
                        line.len()
                    ))),
                    Err(err) => Err(err.into()),
                }
            }
        };
        sent.map_err(|err| VmError::Qmp(format!("sending {command}: {err}")))
    }

    fn wait_for(&mut self, command: &str) -> Result<Value> {
        loop {
            let message = self.read_message()?;
            if let Some(value) = message.get("return") {
                return Ok(value.clone());
            }
            if let Some(error) = message.get("error") {
                return Err(VmError::Qmp(format!("{command}: {error}")));
            }
            // Anything else is an asynchronous event; skip it.
        }
    }

    fn read_message(&mut self) -> Result<Value> {
        let mut line = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)
            .map_err(|err| VmError::Qmp(format!("reading: {err}")))?;
        if n == 0 {
            return Err(VmError::Qmp("QEMU closed the monitor".into()));
        }
        serde_json::from_slice(&line)
            .map_err(|err| VmError::Qmp(format!("a message that is not JSON ({err})")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plays QEMU's side of a session from a script of (expected request, answer lines).
    fn fake_qemu(stream: UnixStream, script: Vec<(&'static str, &'static str)>) {
        std::thread::spawn(move || {
            let mut writer = stream.try_clone().unwrap();
            let mut reader = BufReader::new(stream);
            writer
                .write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n")
                .unwrap();
            for (expect, answer) in script {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let request: Value = serde_json::from_str(&line).unwrap();
                assert_eq!(request["execute"], expect);
                writer.write_all(answer.as_bytes()).unwrap();
            }
        });
    }

    #[test]
    fn negotiates_then_runs_commands_skipping_events() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        fake_qemu(
            theirs,
            vec![
                ("qmp_capabilities", "{\"return\": {}}\r\n"),
                (
                    "query-status",
                    "{\"event\": \"RESUME\"}\r\n{\"return\": {\"status\": \"running\"}}\r\n",
                ),
                ("bogus", "{\"error\": {\"class\": \"CommandNotFound\"}}\r\n"),
            ],
        );
        let mut qmp = Qmp::new(ours).unwrap();
        let status = qmp
            .execute("query-status", Duration::from_secs(10))
            .unwrap();
        assert_eq!(status["status"], "running");
        let err = qmp.execute("bogus", Duration::from_secs(10)).unwrap_err();
        assert!(err.to_string().contains("CommandNotFound"), "{err}");
    }

    #[test]
    fn a_silent_qemu_times_out() {
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let mut qmp = Qmp::new(ours).unwrap();
        assert!(qmp.execute("quit", Duration::from_millis(50)).is_err());
    }
}
