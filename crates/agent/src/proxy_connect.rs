//! `dynocap-agent proxy-connect LISTENER HOST PORT`: ssh's ProxyCommand inside the guest. It
//! asks the egress listener for a `CONNECT HOST:PORT` tunnel and then relays stdin and stdout
//! over it, so an SSH clone goes through the host's proxy like every other connection.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::process::ExitCode;

/// Longest proxy response head read before the tunnel starts.
const MAX_HEAD: usize = 16 * 1024;

pub fn run(args: &[String]) -> ExitCode {
    let [listener, host, port] = args else {
        eprintln!("usage: dynocap-agent proxy-connect 127.0.0.1:PORT HOST PORT");
        return ExitCode::from(2);
    };
    match connect(listener, host, port) {
        Ok(stream) => relay(stream),
        Err(message) => {
            eprintln!("dynocap: {message}");
            ExitCode::from(1)
        }
    }
}

fn connect(listener: &str, host: &str, port: &str) -> Result<TcpStream, String> {
    if host.is_empty()
        || host
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        || port.parse::<u16>().is_err()
    {
        return Err(format!("{host}:{port} is not a host and port"));
    }
    let mut stream = TcpStream::connect(listener)
        .map_err(|err| format!("cannot reach the egress proxy at {listener}: {err}"))?;
    let _ = stream.set_nodelay(true);
    let request = format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|err| format!("cannot talk to the egress proxy: {err}"))?;
    // Byte by byte, so no byte of the tunnelled stream is read into a buffer here.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD {
            return Err("the egress proxy's answer is too long".into());
        }
        match stream.read(&mut byte) {
            Ok(0) => return Err("the egress proxy closed the connection".into()),
            Ok(_) => head.push(byte[0]),
            Err(err) => return Err(format!("reading the egress proxy's answer: {err}")),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) == Some("200") {
        return Ok(stream);
    }
    // The refusal's reason is in the body.
    let mut body = Vec::new();
    let _ = stream.take(4096).read_to_end(&mut body);
    let reason = String::from_utf8_lossy(&body);
    Err(format!(
        "the egress proxy refused {host}:{port}: {} {}",
        status.trim(),
        reason.trim()
    ))
}

fn relay(stream: TcpStream) -> ExitCode {
    let Ok(mut upstream_write) = stream.try_clone() else {
        eprintln!("dynocap: cannot share the proxy connection between two threads");
        return ExitCode::from(1);
    };
    let sender = std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut upstream_write);
        let _ = upstream_write.shutdown(Shutdown::Write);
    });
    // Straight to descriptor 1: `Stdout` is line-buffered, and a binary record that does not
    // end in a newline would wait in its buffer while ssh waits for it.
    let stdout = match std::io::stdout().as_fd().try_clone_to_owned() {
        Ok(fd) => std::fs::File::from(fd),
        Err(err) => {
            eprintln!("dynocap: cannot write to stdout: {err}");
            return ExitCode::from(1);
        }
    };
    let mut upstream_read = stream;
    let _ = std::io::copy(&mut upstream_read, &mut &stdout);
    drop(sender);
    ExitCode::SUCCESS
}
