//! A writer for the `newc` cpio format, the one the kernel unpacks an initramfs from
//! (Documentation/driver-api/early-userspace/buffer-format.rst). Only what an initramfs needs:
//! directories, regular files and symlinks, all owned by root, with zero timestamps so the
//! same inputs always give the same bytes (the archive is cached by its inputs' hash).

use std::io::{self, Write};

const MAGIC: &[u8; 6] = b"070701";
const TRAILER: &str = "TRAILER!!!";
const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;
const S_IFCHR: u32 = 0o020_000;

/// Writes entries in the order given; parents must come before their children.
pub struct CpioWriter<W: Write> {
    out: W,
    written: u64,
    next_ino: u32,
    /// The device number of the entry being written (device nodes only).
    rdev: (u32, u32),
}

impl<W: Write> CpioWriter<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            written: 0,
            next_ino: 1,
            rdev: (0, 0),
        }
    }

    /// A directory; `path` is relative to the archive's root (`lib/modules`).
    pub fn dir(&mut self, path: &str, mode: u32) -> io::Result<()> {
        self.entry(path, S_IFDIR | (mode & 0o7777), 2, b"")
    }

    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> io::Result<()> {
        self.entry(path, S_IFREG | (mode & 0o7777), 1, data)
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> io::Result<()> {
        self.entry(path, S_IFLNK | 0o777, 1, target.as_bytes())
    }

    /// A character device node (`dev/console` is 5:1).
    pub fn char_dev(&mut self, path: &str, mode: u32, major: u32, minor: u32) -> io::Result<()> {
        self.rdev = (major, minor);
        let written = self.entry(path, S_IFCHR | (mode & 0o7777), 1, b"");
        self.rdev = (0, 0);
        written
    }

    /// Writes the trailer and returns the sink.
    pub fn finish(mut self) -> io::Result<W> {
        // The trailer has inode 0 like GNU cpio's.
        self.header(TRAILER, 0, 0, 1, 0)?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn entry(&mut self, path: &str, mode: u32, nlink: u32, data: &[u8]) -> io::Result<()> {
        if path.is_empty() || path.starts_with('/') || path.contains('\0') || path == TRAILER {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cpio entry name {path:?} must be relative, non-empty and NUL-free"),
            ));
        }
        let size = u32::try_from(data.len()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cpio entry {path} is larger than 4 GiB, which newc cannot hold"),
            )
        })?;
        let ino = self.next_ino;
        self.next_ino += 1;
        self.header(path, ino, mode, nlink, size)?;
        self.write(data)?;
        self.pad()
    }

    fn header(&mut self, name: &str, ino: u32, mode: u32, nlink: u32, size: u32) -> io::Result<()> {
        let namesize = u32::try_from(name.len() + 1)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "cpio name too long"))?;
        // ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor namesize check
        let (rmajor, rminor) = self.rdev;
        let fields = [
            ino, mode, 0, 0, nlink, 0, size, 0, 0, rmajor, rminor, namesize, 0,
        ];
        let mut header = Vec::with_capacity(110 + name.len() + 4);
        header.extend_from_slice(MAGIC);
        for field in fields {
            header.extend_from_slice(format!("{field:08x}").as_bytes());
        }
        header.extend_from_slice(name.as_bytes());
        header.push(0);
        self.write(&header)?;
        self.pad()
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Header+name and data each end on a 4-byte boundary.
    fn pad(&mut self) -> io::Result<()> {
        let rem = self.written % 4;
        if rem != 0 {
            let zeros = [0_u8; 3];
            let n = usize::try_from(4 - rem).expect("padding is at most 3 bytes");
            self.write(&zeros[..n])?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One entry read back: name, mode, nlink, (rdev major, minor), data.
    pub(crate) type Entry = (String, u32, u32, (u32, u32), Vec<u8>);

    /// An independent reader of the format, strict about magic, alignment and the trailer.
    pub(crate) fn parse(bytes: &[u8]) -> Vec<Entry> {
        let mut pos = 0;
        let mut entries = Vec::new();
        let align = |n: usize| n.div_ceil(4) * 4;
        loop {
            assert_eq!(&bytes[pos..pos + 6], MAGIC, "magic at {pos}");
            let field = |i: usize| {
                let text = std::str::from_utf8(&bytes[pos + 6 + i * 8..pos + 14 + i * 8]).unwrap();
                u32::from_str_radix(text, 16).unwrap()
            };
            let (mode, nlink, size, namesize) = (field(1), field(4), field(6), field(11));
            assert_eq!(field(2), 0, "uid");
            assert_eq!(field(5), 0, "mtime");
            let name_start = pos + 110;
            let name_end = name_start + namesize as usize;
            assert_eq!(bytes[name_end - 1], 0, "name is NUL-terminated");
            let name = String::from_utf8(bytes[name_start..name_end - 1].to_vec()).unwrap();
            let data_start = align(name_end);
            let data_end = data_start + size as usize;
            if name == TRAILER {
                assert_eq!(align(data_end), bytes.len(), "nothing after the trailer");
                return entries;
            }
            let rdev = (field(9), field(10));
            entries.push((
                name,
                mode,
                nlink,
                rdev,
                bytes[data_start..data_end].to_vec(),
            ));
            pos = align(data_end);
        }
    }

    #[test]
    fn entries_read_back_as_written() {
        let mut w = CpioWriter::new(Vec::new());
        w.dir("lib", 0o755).unwrap();
        w.file("init", 0o755, b"\x7fELF binary").unwrap();
        w.file("lib/a.ko", 0o644, b"abcde").unwrap();
        w.file("lib/empty", 0o600, b"").unwrap();
        w.symlink("sbin", "lib").unwrap();
        w.char_dev("console", 0o600, 5, 1).unwrap();
        w.file("after", 0o644, b"z").unwrap();
        let bytes = w.finish().unwrap();
        assert_eq!(bytes.len() % 4, 0);
        let entries = parse(&bytes);
        assert_eq!(
            entries,
            vec![
                ("lib".into(), 0o040_755, 2, (0, 0), vec![]),
                (
                    "init".into(),
                    0o100_755,
                    1,
                    (0, 0),
                    b"\x7fELF binary".to_vec()
                ),
                ("lib/a.ko".into(), 0o100_644, 1, (0, 0), b"abcde".to_vec()),
                ("lib/empty".into(), 0o100_600, 1, (0, 0), vec![]),
                ("sbin".into(), 0o120_777, 1, (0, 0), b"lib".to_vec()),
                ("console".into(), 0o020_600, 1, (5, 1), vec![]),
                ("after".into(), 0o100_644, 1, (0, 0), b"z".to_vec()),
            ]
        );
    }

    #[test]
    fn same_inputs_give_the_same_bytes() {
        let build = || {
            let mut w = CpioWriter::new(Vec::new());
            w.file("init", 0o755, b"x").unwrap();
            w.finish().unwrap()
        };
        assert_eq!(build(), build());
    }

    #[test]
    fn bad_names_are_refused() {
        let mut w = CpioWriter::new(Vec::new());
        for name in ["", "/init", "a\0b", TRAILER] {
            assert!(w.file(name, 0o644, b"").is_err(), "{name:?}");
        }
    }
}
