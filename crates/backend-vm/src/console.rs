//! The guest's serial console, relayed into `console.log` with a bound: QEMU writes it to a
//! socketpair, and a host thread copies it to the file until [`MAX_LOG`] and discards the
//! rest. A guest with root in it can print without end; the host's disk must not fill.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread::JoinHandle;

use crate::error::{Result, VmError};

/// The most a console log grows to (the boot messages and a panic fit many times over).
pub const MAX_LOG: u64 = 8 << 20;

/// Starts the relay from `source` (our end of the console socketpair) into `log` (appended:
/// a recovery boot adds to the first boot's log). It ends when QEMU closes its end.
pub fn relay(source: UnixStream, log: &Path) -> Result<JoinHandle<()>> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|err| VmError::io("opening", log, err))?;
    std::thread::Builder::new()
        .name("vm-console".into())
        .spawn(move || copy_bounded(source, file, MAX_LOG))
        .map_err(|err| VmError::Unavailable(format!("starting the console relay: {err}")))
}

/// Copies until end of file, writing while `file` is under `max` bytes. Always reads on, so
/// QEMU never waits on a full socket.
fn copy_bounded(mut source: impl Read, mut file: File, max: u64) {
    let mut written = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut buf = [0_u8; 16 * 1024];
    let mut marked = false;
    loop {
        let n = match source.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        let room = usize::try_from(max.saturating_sub(written)).unwrap_or(usize::MAX);
        let take = n.min(room);
        if take > 0 && file.write_all(&buf[..take]).is_ok() {
            written += take as u64;
        }
        if take < n && !marked {
            marked = true;
            let _ =
                file.write_all(b"\n[dynocap: console log limit reached; the rest is dropped]\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_stops_growing_at_its_bound_and_the_source_is_drained() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("console.log");
        let (ours, mut qemu) = UnixStream::pair().unwrap();
        let relay = relay(ours, &log).unwrap();
        let chunk = vec![b'x'; 64 * 1024];
        // Four times the bound: the writer would block for good if the relay stopped reading.
        for _ in 0..(4 * MAX_LOG / chunk.len() as u64) {
            qemu.write_all(&chunk).unwrap();
        }
        drop(qemu);
        relay.join().unwrap();
        let text = std::fs::read(&log).unwrap();
        let marker = b"\n[dynocap: console log limit reached; the rest is dropped]\n";
        assert_eq!(text.len() as u64, MAX_LOG + marker.len() as u64);
        assert!(text.ends_with(marker));
    }
}
