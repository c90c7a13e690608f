//! The kernel file QEMU boots: the ELF inside the image's bzImage, entered through its PVH
//! entry point, where the kernel has one; else the bzImage itself.
//!
//! Why: to boot a bzImage on microvm, QEMU keeps a copy of the whole file in its own
//! anonymous memory for fw_cfg (14 MiB for Debian's cloud kernel, per VM, never reclaimable),
//! and the guest then spends time and RAM decompressing itself. An ELF with a PVH note is
//! loaded by QEMU straight from a mapping of the file: its pages are the host's page cache,
//! shared by every VM booting that kernel and reclaimable, and the guest starts in the
//! decompressed kernel.
//!
//! The ELF is extracted once per kernel, keyed by the bzImage's bytes, and written with only
//! what its program headers reference (no section headers, no relocation table; the gaps
//! between segments are holes), so the file QEMU maps holds nothing it does not load. A kernel
//! that cannot be extracted (no PVH note, a compressor this crate does not unpack) is recorded
//! as such with the reason, logged once, and boots as a bzImage.

use std::fs;
use std::io::{Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::cache::{self, Key};
use crate::elf;
use crate::error::{Result, VmError};

/// Bump when the extracted file's making changes.
const FORMAT: &str = "dynocap-vmlinux-pvh-2";

/// The file to pass QEMU as `-kernel` for the bzImage at `bzimage`: the cached PVH ELF, or
/// the bzImage when the kernel cannot boot that way (the reason is logged when first found,
/// and recorded in the cache so later boots do not try again).
///
/// The artefacts are keyed by the bzImage's bytes (two images with the same kernel share one
/// ELF, and its page cache). Hashing 14 MiB on every boot cost tens of milliseconds, so the
/// content key is also recorded per file identity (device, inode, size, mtime and ctime: a
/// file written in place gets a new ctime), and a known kernel file is not read at all.
pub fn boot_file(cache_dir: &Path, bzimage: &Path) -> Result<PathBuf> {
    let memo_name = format!("vmlinux-of-{}", identity(bzimage)?);
    let memo = fs::read_to_string(cache_dir.join(&memo_name)).unwrap_or_default();
    if let Some(found) = lookup(cache_dir, memo.trim(), bzimage) {
        return Ok(found);
    }
    let bytes = fs::read(bzimage).map_err(|err| VmError::io("reading the kernel", bzimage, err))?;
    let mut key = Key::new(FORMAT);
    key.add(&bytes);
    let key = key.hex();
    let found = match lookup(cache_dir, &key, bzimage) {
        Some(found) => found,
        None => build(cache_dir, &key, bzimage, &bytes)?,
    };
    cache::get_or_build(cache_dir, &memo_name, |temp| {
        cache::write_new(temp, key.as_bytes())
    })?;
    Ok(found)
}

/// The identity of `file` as a key: which file it is and whether it changed.
fn identity(file: &Path) -> Result<String> {
    let meta = fs::metadata(file).map_err(|err| VmError::io("reading the kernel", file, err))?;
    let mut key = Key::new("dynocap-file-identity-1");
    key.add(file.as_os_str().as_encoded_bytes());
    for field in [meta.dev(), meta.ino(), meta.size()] {
        key.add(&field.to_le_bytes());
    }
    for field in [
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec(),
    ] {
        key.add(&field.to_le_bytes());
    }
    Ok(key.hex())
}

/// What the cache holds for the kernel whose content key is `key`: its ELF, or `bzimage`
/// itself where a refusal is recorded; `None` if neither (or `key` is not a key).
fn lookup(cache_dir: &Path, key: &str, bzimage: &Path) -> Option<PathBuf> {
    if key.len() != 64 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let elf = cache_dir.join(format!("vmlinux-{key}.elf"));
    if elf.is_file() {
        return Some(elf);
    }
    cache_dir
        .join(format!("vmlinux-{key}.none"))
        .is_file()
        .then(|| bzimage.to_owned())
}

/// Extracts the ELF of the kernel `bytes` into the cache under `key`, or records why not.
fn build(cache_dir: &Path, key: &str, bzimage: &Path, bytes: &[u8]) -> Result<PathBuf> {
    match extract(bytes) {
        Ok(elf) => cache::get_or_build(cache_dir, &format!("vmlinux-{key}.elf"), |temp| {
            write_sparse(temp, &elf)?;
            fs::set_permissions(temp, fs::Permissions::from_mode(0o444))
                .map_err(|err| VmError::io("making read-only", temp, err))
        }),
        Err(why) => {
            tracing::warn!(
                "booting {} as a bzImage, not as its ELF through the PVH entry (which spares \
                 QEMU a {} MiB copy of it per VM): {why}",
                bzimage.display(),
                bytes.len() >> 20
            );
            cache::get_or_build(cache_dir, &format!("vmlinux-{key}.none"), |temp| {
                cache::write_new(temp, why.as_bytes())
            })?;
            Ok(bzimage.to_owned())
        }
    }
}

/// The kernel ELF inside `bzimage`, reduced to what its program headers reference, if it has
/// a PVH entry point; else why not.
pub fn extract(bzimage: &[u8]) -> std::result::Result<MinimalElf, String> {
    let payload = payload(bzimage)?;
    let kernel = decompress(payload)?;
    if !elf::has_pvh_entry(&kernel)? {
        return Err("the kernel has no PVH entry point (no XEN_ELFNOTE_PHYS32_ENTRY note)".into());
    }
    MinimalElf::of(&kernel)
}

/// The compressed kernel inside a bzImage, as its setup header places it (boot protocol 2.08
/// or later: `payload_offset` and `payload_length`).
fn payload(bzimage: &[u8]) -> std::result::Result<&[u8], String> {
    let field = |off: usize, len: usize| -> std::result::Result<u64, String> {
        let bytes = bzimage
            .get(off..off + len)
            .ok_or("the file is too short for a bzImage setup header")?;
        let mut buf = [0_u8; 8];
        buf[..len].copy_from_slice(bytes);
        Ok(u64::from_le_bytes(buf))
    };
    if bzimage.get(0x202..0x206) != Some(b"HdrS") {
        return Err("not a bzImage (no HdrS setup header)".into());
    }
    let version = field(0x206, 2)?;
    if version < 0x208 {
        return Err(format!(
            "boot protocol {}.{:02} predates payload_offset (2.08)",
            version >> 8,
            version & 0xff
        ));
    }
    // A setup_sects of 0 means 4 (the boot protocol's oldest rule).
    let setup_sects = match field(0x1f1, 1)? {
        0 => 4,
        n => n,
    };
    let start = (setup_sects + 1) * 512 + field(0x248, 4)?;
    let len = field(0x24c, 4)?;
    usize::try_from(start)
        .ok()
        .zip(usize::try_from(len).ok())
        .and_then(|(start, len)| bzimage.get(start..start.checked_add(len)?))
        .ok_or_else(|| "the payload lies outside the file".into())
}

/// The LZ4 "legacy" frame magic, which the kernel's build (`lz4 -l`) writes.
const LZ4_LEGACY_MAGIC: [u8; 4] = [0x02, 0x21, 0x4c, 0x18];
/// The largest block the legacy format decompresses to.
const LZ4_LEGACY_BLOCK: usize = 8 << 20;
/// More than any kernel ELF is: a corrupt size field must not make us allocate gigabytes.
const MAX_KERNEL: usize = 512 << 20;

/// Decompresses the payload: the compressed stream followed by the uncompressed size as four
/// little-endian bytes (the kernel build's `size_append`).
fn decompress(payload: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let (stream, size) = payload
        .split_last_chunk::<4>()
        .ok_or("the payload is too short")?;
    let size = usize::try_from(u32::from_le_bytes(*size)).map_err(|_| "size overflows")?;
    if size > MAX_KERNEL {
        return Err(format!("the payload claims {size} bytes uncompressed"));
    }
    let named = [
        (&[0x1f, 0x8b][..], "gzip"),
        (&[0xfd, b'7', b'z', b'X', b'Z', 0][..], "xz"),
        (&[0x28, 0xb5, 0x2f, 0xfd][..], "zstd"),
        (&b"BZh"[..], "bzip2"),
        (&[0x5d, 0, 0][..], "lzma"),
        (&[0x89, b'L', b'Z', b'O'][..], "lzo"),
    ];
    if !stream.starts_with(&LZ4_LEGACY_MAGIC) {
        let what = named
            .iter()
            .find(|(magic, _)| stream.starts_with(magic))
            .map_or("an unknown compressor", |(_, name)| name);
        return Err(format!(
            "the kernel is compressed with {what}; only LZ4 (Debian's choice) is unpacked"
        ));
    }
    let out = unlz4_legacy(stream, size)?;
    if out.len() != size {
        return Err(format!(
            "the payload unpacked to {} bytes, not the {size} it names",
            out.len()
        ));
    }
    Ok(out)
}

/// The LZ4 legacy format: the magic, then blocks, each a little-endian compressed length and
/// an LZ4 block of at most 8 MiB uncompressed. The magic may recur (concatenated streams).
fn unlz4_legacy(mut stream: &[u8], size: usize) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(size);
    while let Some((word, rest)) = stream.split_first_chunk::<4>() {
        stream = rest;
        if *word == LZ4_LEGACY_MAGIC {
            continue;
        }
        let len = usize::try_from(u32::from_le_bytes(*word)).map_err(|_| "size overflows")?;
        let block = stream
            .get(..len)
            .ok_or("an LZ4 block runs past the payload")?;
        stream = &stream[len..];
        let start = out.len();
        // `size` is at most MAX_KERNEL: this bounds what a corrupt payload makes us allocate.
        if start > size {
            return Err(format!(
                "the payload unpacks to more than the {size} bytes it names"
            ));
        }
        out.resize(start + LZ4_LEGACY_BLOCK, 0);
        let n = lz4_flex::block::decompress_into(block, &mut out[start..])
            .map_err(|err| format!("a corrupt LZ4 block: {err}"))?;
        out.truncate(start + n);
    }
    if !stream.is_empty() {
        return Err("trailing bytes after the last LZ4 block".into());
    }
    Ok(out)
}

/// A kernel ELF with only the bytes its headers and program headers reference, each at its
/// original offset (QEMU reads segments by offset; the alignment stays what the ELF says).
#[derive(Debug, PartialEq, Eq)]
pub struct MinimalElf {
    /// (file offset, bytes), in the order they are written: the segments, then the ELF
    /// header and the program header table, which win where a segment covers them.
    pub pieces: Vec<(usize, Vec<u8>)>,
    /// The file's length: the end of the last piece.
    pub len: usize,
}

impl MinimalElf {
    fn of(kernel: &[u8]) -> std::result::Result<MinimalElf, String> {
        let headers = elf::program_headers(kernel)?;
        let field = |off: usize, len: usize| -> std::result::Result<usize, String> {
            let mut buf = [0_u8; 8];
            buf[..len].copy_from_slice(kernel.get(off..off + len).ok_or("short ELF header")?);
            usize::try_from(u64::from_le_bytes(buf)).map_err(|_| "offset overflows".into())
        };
        // The ELF header without section headers: nothing needs them to load the kernel.
        let mut header = kernel.get(..0x40).ok_or("short ELF header")?.to_vec();
        header[0x28..0x30].fill(0); // e_shoff
        header[0x3a..0x40].fill(0); // e_shentsize, e_shnum, e_shstrndx
        let phoff = field(0x20, 8)?;
        let table_len = headers.len() * field(0x36, 2)?;
        let table = kernel
            .get(phoff..phoff + table_len)
            .ok_or("the program header table lies outside the file")?;
        let mut pieces = Vec::new();
        for ph in headers.iter().filter(|ph| ph.file_size > 0) {
            let bytes = ph
                .offset
                .checked_add(ph.file_size)
                .and_then(|end| kernel.get(ph.offset..end))
                .ok_or("a segment lies outside the file")?;
            pieces.push((ph.offset, bytes.to_vec()));
        }
        pieces.push((0, header));
        pieces.push((phoff, table.to_vec()));
        let len = pieces
            .iter()
            .map(|(off, bytes)| off + bytes.len())
            .max()
            .unwrap_or(0);
        Ok(MinimalElf { pieces, len })
    }
}

/// Writes `elf` to a new file at `path`: the pieces at their offsets, the rest holes.
fn write_sparse(path: &Path, elf: &MinimalElf) -> Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|err| VmError::io("creating", path, err))?;
    let written = (|| -> std::io::Result<()> {
        for (off, bytes) in &elf.pieces {
            file.seek(SeekFrom::Start(*off as u64))?;
            file.write_all(bytes)?;
        }
        file.set_len(elf.len as u64)?;
        file.sync_all()
    })();
    written.map_err(|err| VmError::io("writing", path, err))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel-like ELF64: two PT_LOAD segments (the second 8 KiB further on, after a gap
    /// holding bytes nothing references), a PT_NOTE inside the first with Xen notes (`pvh`:
    /// one of them the PVH entry), and section headers at the end.
    fn fake_kernel(pvh: bool) -> Vec<u8> {
        let mut notes = Vec::new();
        for kind in [6_u32, if pvh { 0x12 } else { 0x11 }] {
            notes.extend_from_slice(&4_u32.to_le_bytes());
            notes.extend_from_slice(&4_u32.to_le_bytes());
            notes.extend_from_slice(&kind.to_le_bytes());
            notes.extend_from_slice(b"Xen\0");
            notes.extend_from_slice(&0x0100_0000_u32.to_le_bytes());
        }
        let mut elf = vec![0_u8; 0x1000];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[0x20..0x28].copy_from_slice(&0x40_u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56_u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&3_u16.to_le_bytes());
        let text: Vec<u8> = (0..0x3000_u32)
            .map(|i| u8::try_from(i % 251).unwrap())
            .collect();
        let note_off = 0x1000 + 0x800;
        elf.extend_from_slice(&text);
        elf[note_off..note_off + notes.len()].copy_from_slice(&notes);
        // The gap: bytes no header points at (as the kernel's relocation table is).
        elf.extend(std::iter::repeat_n(0xee_u8, 0x2000));
        let data_off = elf.len();
        elf.extend(std::iter::repeat_n(0x5a_u8, 0x1000));
        let shoff = elf.len();
        elf.extend(std::iter::repeat_n(0xcc_u8, 0x80));
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64_u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&2_u16.to_le_bytes());
        let mut ph = |i: usize, kind: u32, off: usize, size: usize| {
            let base = 0x40 + i * 56;
            elf[base..base + 4].copy_from_slice(&kind.to_le_bytes());
            elf[base + 8..base + 16].copy_from_slice(&(off as u64).to_le_bytes());
            elf[base + 0x20..base + 0x28].copy_from_slice(&(size as u64).to_le_bytes());
            elf[base + 0x28..base + 0x30].copy_from_slice(&(size as u64 * 2).to_le_bytes());
        };
        ph(0, elf::PT_LOAD, 0x1000, text.len());
        ph(1, elf::PT_LOAD, data_off, 0x1000);
        ph(2, elf::PT_NOTE, note_off, notes.len());
        elf
    }

    /// A bzImage around `payload` (setup header, boot protocol 2.15, one setup sector).
    fn fake_bzimage(payload: &[u8]) -> Vec<u8> {
        let mut image = vec![0_u8; 2 * 512];
        image[0x1f1] = 1;
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x206..0x208].copy_from_slice(&0x20f_u16.to_le_bytes());
        // The payload 0x40 bytes into the protected-mode part, as the decompressor's own code
        // sits before it in a real one.
        image.extend_from_slice(&[0x90; 0x40]);
        image[0x248..0x24c].copy_from_slice(&0x40_u32.to_le_bytes());
        image[0x24c..0x250].copy_from_slice(&u32::try_from(payload.len()).unwrap().to_le_bytes());
        image.extend_from_slice(payload);
        image.extend_from_slice(&[0; 16]);
        image
    }

    /// `data` as the kernel build packs it: LZ4 legacy blocks of `block` bytes, then the size.
    fn lz4_legacy(data: &[u8], block: usize) -> Vec<u8> {
        let mut out = LZ4_LEGACY_MAGIC.to_vec();
        for chunk in data.chunks(block) {
            let compressed = lz4_flex::block::compress(chunk);
            out.extend_from_slice(&u32::try_from(compressed.len()).unwrap().to_le_bytes());
            out.extend_from_slice(&compressed);
        }
        out.extend_from_slice(&u32::try_from(data.len()).unwrap().to_le_bytes());
        out
    }

    /// The pieces of `minimal` laid out as a file.
    fn flatten(minimal: &MinimalElf) -> Vec<u8> {
        let mut file = vec![0_u8; minimal.len];
        for (off, bytes) in &minimal.pieces {
            file[*off..off + bytes.len()].copy_from_slice(bytes);
        }
        file
    }

    #[test]
    fn the_pvh_elf_is_extracted_with_only_its_segments() {
        let kernel = fake_kernel(true);
        // Several blocks, to cross block boundaries.
        let bzimage = fake_bzimage(&lz4_legacy(&kernel, 0x1000));
        let minimal = extract(&bzimage).unwrap();
        let file = flatten(&minimal);
        let headers = elf::program_headers(&file).unwrap();
        assert_eq!(headers, elf::program_headers(&kernel).unwrap());
        for ph in &headers {
            let range = ph.offset..ph.offset + ph.file_size;
            assert_eq!(file[range.clone()], kernel[range]);
        }
        assert!(elf::has_pvh_entry(&file).unwrap());
        // No section headers, and nothing past the last segment.
        assert_eq!(file[0x28..0x30], [0; 8]);
        assert_eq!(file[0x3c..0x3e], [0; 2]);
        let data = &headers[1];
        assert_eq!(file.len(), data.offset + data.file_size);
        // The gap nothing references is left out (a hole once written).
        let text = &headers[0];
        let gap = &file[text.offset + text.file_size..data.offset];
        assert!(
            !gap.is_empty() && gap.iter().all(|b| *b == 0),
            "the gap was copied"
        );
    }

    /// A segment that covers the ELF header (offset 0, as some linkers lay them out) does not
    /// bring back the section header fields.
    #[test]
    fn a_segment_over_the_header_keeps_the_header_minimal() {
        let mut kernel = fake_kernel(true);
        kernel[0x40 + 8..0x40 + 16].copy_from_slice(&0_u64.to_le_bytes());
        kernel[0x40 + 0x20..0x40 + 0x28].copy_from_slice(&0x4000_u64.to_le_bytes());
        let minimal = extract(&fake_bzimage(&lz4_legacy(&kernel, 1 << 20))).unwrap();
        let file = flatten(&minimal);
        assert_eq!(file[0x28..0x30], [0; 8], "e_shoff");
        assert_eq!(file[0x3c..0x3e], [0; 2], "e_shnum");
        assert_eq!(file[0x40..0x4000], kernel[0x40..0x4000]);
        assert_eq!(
            elf::program_headers(&file).unwrap(),
            elf::program_headers(&kernel).unwrap()
        );
    }

    #[test]
    fn kernels_that_cannot_boot_as_pvh_say_why() {
        let err = extract(&fake_bzimage(&lz4_legacy(&fake_kernel(false), 1 << 20))).unwrap_err();
        assert!(err.contains("no PVH entry"), "{err}");
        let mut gzip = vec![0x1f, 0x8b, 8, 0];
        gzip.extend_from_slice(&[0; 8]);
        let err = extract(&fake_bzimage(&gzip)).unwrap_err();
        assert!(err.contains("gzip"), "{err}");
        assert!(extract(b"MZ not a kernel")
            .unwrap_err()
            .contains("not a bzImage"));
        // A size trailer that does not match what the blocks unpack to.
        let mut payload = lz4_legacy(&fake_kernel(true), 1 << 20);
        let n = payload.len();
        payload[n - 4..].copy_from_slice(&1_u32.to_le_bytes());
        assert!(extract(&fake_bzimage(&payload))
            .unwrap_err()
            .contains("not the 1"));
        // A block cut short.
        let mut payload = lz4_legacy(&fake_kernel(true), 1 << 20);
        payload.remove(20);
        assert!(extract(&fake_bzimage(&payload)).is_err());
    }

    #[test]
    fn the_elf_is_cached_by_content_and_a_refusal_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let bzimage = dir.path().join("vmlinuz");
        fs::write(
            &bzimage,
            fake_bzimage(&lz4_legacy(&fake_kernel(true), 0x1000)),
        )
        .unwrap();
        let elf_path = boot_file(&cache, &bzimage).unwrap();
        assert_ne!(elf_path, bzimage);
        let bytes = fs::read(&elf_path).unwrap();
        assert!(elf::has_pvh_entry(&bytes).unwrap());
        let meta = fs::metadata(&elf_path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o444);
        assert_eq!(
            boot_file(&cache, &bzimage).unwrap(),
            elf_path,
            "found again"
        );
        // The content key is recorded for this file: an ELF removed from the cache is found
        // missing and made again.
        fs::remove_file(&elf_path).unwrap();
        assert_eq!(boot_file(&cache, &bzimage).unwrap(), elf_path, "made again");
        // Another kernel written over the same file gets its own key (its ctime changed); one
        // without PVH boots as the bzImage, and the reason is recorded beside the ELF.
        fs::write(
            &bzimage,
            fake_bzimage(&lz4_legacy(&fake_kernel(false), 0x1000)),
        )
        .unwrap();
        assert_eq!(boot_file(&cache, &bzimage).unwrap(), bzimage);
        assert_eq!(boot_file(&cache, &bzimage).unwrap(), bzimage, "recorded");
        let names: Vec<String> = fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let with = |suffix: &str| -> Vec<&String> {
            names.iter().filter(|n| n.ends_with(suffix)).collect()
        };
        assert_eq!(with(".elf").len(), 1, "{names:?}");
        assert_eq!(with(".none").len(), 1, "{names:?}");
        let memos = names
            .iter()
            .filter(|n| n.starts_with("vmlinux-of-"))
            .count();
        assert_eq!(memos, 2, "{names:?}");
        assert_eq!(names.len(), 4, "{names:?}: no temporary file is left");
        let reason = fs::read_to_string(cache.join(with(".none")[0])).unwrap();
        assert!(reason.contains("no PVH entry"), "{reason}");
    }

    /// The real thing: the test image's Debian kernel, and the host's own if readable.
    #[test]
    fn real_kernels_extract() {
        // (path, must it extract): Debian's cloud kernel is what images carry; the host's may
        // come from anywhere.
        let mut kernels: Vec<(PathBuf, bool)> = Vec::new();
        let release = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        kernels.push((PathBuf::from(format!("/boot/vmlinuz-{release}")), false));
        let test_image = Path::new("/var/cache/dynocap-test-images/busybox-cloud/boot");
        match fs::read_dir(test_image) {
            Ok(entries) => kernels.extend(entries.map(|e| (e.unwrap().path(), true))),
            Err(err) => eprintln!(
                "SKIP the Debian kernel: {} ({err}); scripts/vm-test-rootfs.sh makes it",
                test_image.display()
            ),
        }
        for (path, must) in kernels {
            let Ok(bytes) = fs::read(&path) else {
                eprintln!("SKIP {}: not readable here", path.display());
                continue;
            };
            match extract(&bytes) {
                Ok(minimal) => {
                    let file = flatten(&minimal);
                    assert!(elf::has_pvh_entry(&file).unwrap(), "{}", path.display());
                    let loads = elf::program_headers(&file).unwrap();
                    assert!(loads.iter().any(|ph| ph.kind == elf::PT_LOAD));
                    eprintln!(
                        "{}: {} MiB bzImage, PVH ELF of {} MiB",
                        path.display(),
                        bytes.len() >> 20,
                        minimal.len >> 20
                    );
                }
                // A kernel of another distribution may well use another compressor: that
                // is a refusal with a reason, never a panic.
                Err(why) => {
                    assert!(!must, "{}: {why}", path.display());
                    eprintln!("{} boots as a bzImage: {why}", path.display());
                }
            }
        }
    }
}
