//! The project's one ELF reader: a kernel module's `depends=` list from its `.modinfo`
//! section (the way `modinfo` does: images need not ship `modules.dep`, which only `depmod`
//! makes), how a program is linked (the initramfs and images without the host's libc have no
//! loader, so the agent must be static; `dynocap doctor` says which it is), and a kernel's
//! program headers and whether its notes name a PVH entry point (so QEMU can boot the ELF
//! directly, see [`crate::vmlinux`]).
//!
//! Only 64-bit little-endian ELF is read: the hosts DynoCap runs on (x86-64, aarch64). Every
//! offset and size comes from the file, so every read is bounds-checked and a damaged file is
//! an error naming what is wrong, never a panic or a guess.

use std::fmt;

/// The modules `module` (the bytes of a `.ko`) needs loaded first, by name (`-` spelled `_`).
pub fn depends(module: &[u8]) -> Result<Vec<String>, String> {
    let section = modinfo_section(module)?;
    let mut deps = Vec::new();
    for field in section.split(|b| *b == 0) {
        if let Some(list) = field.strip_prefix(b"depends=") {
            let list = std::str::from_utf8(list).map_err(|_| "depends= is not UTF-8")?;
            deps.extend(
                list.split(',')
                    .filter(|d| !d.is_empty())
                    .map(normalize_name),
            );
        }
    }
    Ok(deps)
}

pub const PT_LOAD: u32 = 1;
pub const PT_DYNAMIC: u32 = 2;
pub const PT_INTERP: u32 = 3;
pub const PT_NOTE: u32 = 4;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
/// The size of an ELF64 dynamic section entry (`d_tag`, `d_val`).
const DYN_ENTRY_SIZE: usize = 16;

/// How an executable is linked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Linkage {
    /// Runs without a loader or shared libraries.
    Static,
    /// Needs a loader (`interpreter`, e.g. glibc's `/lib64/ld-linux-x86-64.so.2`) and/or
    /// `needed` shared libraries.
    Dynamic {
        interpreter: Option<String>,
        needed: usize,
    },
}

impl fmt::Display for Linkage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Linkage::Static => f.write_str("statically linked"),
            Linkage::Dynamic {
                interpreter,
                needed,
            } => {
                f.write_str("dynamically linked")?;
                if let Some(interpreter) = interpreter {
                    write!(f, " (loader {interpreter}")?;
                } else {
                    f.write_str(" (no loader")?;
                }
                write!(f, ", {needed} shared libraries)")
            }
        }
    }
}

/// How the program `bytes` is linked. A program header `PT_INTERP` (a loader to run it) or a
/// `DT_NEEDED` entry in its dynamic section (a shared library to load) makes it dynamic:
/// either one needs files a static image lacks. A static-PIE binary (Rust's musl default) has
/// a dynamic section for its own relocations, but neither of these.
pub fn linkage(program: &[u8]) -> Result<Linkage, String> {
    let headers = program_headers(program)?;
    if headers.is_empty() {
        return Err("no program headers: not an executable".into());
    }
    let mut interpreter = None;
    let mut needed = 0;
    for (index, ph) in headers.iter().enumerate() {
        if ph.kind != PT_INTERP && ph.kind != PT_DYNAMIC {
            continue;
        }
        let contents = slice(program, ph.offset, ph.file_size)
            .map_err(|_| format!("program header {index} points past the end of the file"))?;
        if ph.kind == PT_INTERP {
            let path = contents.split(|&b| b == 0).next().unwrap_or_default();
            interpreter = Some(String::from_utf8_lossy(path).into_owned());
        } else {
            needed += count_needed(contents)?;
        }
    }
    if interpreter.is_none() && needed == 0 {
        Ok(Linkage::Static)
    } else {
        Ok(Linkage::Dynamic {
            interpreter,
            needed,
        })
    }
}

/// `DT_NEEDED` entries of a dynamic section, up to its `DT_NULL`.
fn count_needed(section: &[u8]) -> Result<usize, String> {
    let mut needed = 0;
    for entry in section.chunks_exact(DYN_ENTRY_SIZE) {
        match u64_at(entry, 0, 8)? {
            DT_NULL => break,
            DT_NEEDED => needed += 1,
            _ => {}
        }
    }
    Ok(needed)
}

/// The size of an ELF64 program header, which is what `e_phentsize` must say.
pub const PHDR_SIZE: usize = 56;

/// One ELF64 program header: the fields the backend uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramHeader {
    pub kind: u32,
    /// Where the segment's bytes are in the file, and how many there are.
    pub offset: usize,
    pub file_size: usize,
}

/// Where the program header table is (`e_phoff`) and its headers.
pub fn program_headers(elf: &[u8]) -> Result<Vec<ProgramHeader>, String> {
    check_header(elf)?;
    let phoff = usize_at(elf, 0x20, 8)?;
    let phentsize = usize_at(elf, 0x36, 2)?;
    let phnum = usize_at(elf, 0x38, 2)?;
    if phnum > 0 && phentsize < PHDR_SIZE {
        return Err(format!("program header size {phentsize} is too small"));
    }
    (0..phnum)
        .map(|i| {
            let base = i
                .checked_mul(phentsize)
                .and_then(|o| o.checked_add(phoff))
                .ok_or("program header offset overflows")?;
            let kind = u32::try_from(usize_at(elf, base, 4)?)
                .map_err(|_| "program header type does not fit u32")?;
            Ok(ProgramHeader {
                kind,
                offset: usize_at(elf, base + 0x08, 8)?,
                file_size: usize_at(elf, base + 0x20, 8)?,
            })
        })
        .collect()
}

/// Xen's note type for the 32-bit PVH entry point (`XEN_ELFNOTE_PHYS32_ENTRY`), which QEMU
/// looks for to boot a kernel ELF directly.
const XEN_ELFNOTE_PHYS32_ENTRY: usize = 0x12;

/// Whether a `PT_NOTE` segment of `kernel` holds a Xen note with the PVH entry point.
pub fn has_pvh_entry(kernel: &[u8]) -> Result<bool, String> {
    for ph in program_headers(kernel)? {
        if ph.kind != PT_NOTE {
            continue;
        }
        let mut notes = slice(kernel, ph.offset, ph.file_size)?;
        // Each note: name size, descriptor size, type, then name and descriptor, each padded
        // to 4 bytes.
        while notes.len() >= 12 {
            let name_size = usize_at(notes, 0, 4)?;
            let desc_size = usize_at(notes, 4, 4)?;
            let kind = usize_at(notes, 8, 4)?;
            let pad = |n: usize| {
                n.checked_add(3)
                    .map(|n| n & !3)
                    .ok_or("note size overflows")
            };
            let name = slice(notes, 12, name_size)?;
            if name == b"Xen\0" && kind == XEN_ELFNOTE_PHYS32_ENTRY {
                return Ok(true);
            }
            let next = 12_usize
                .checked_add(pad(name_size)?)
                .and_then(|n| n.checked_add(pad(desc_size).ok()?))
                .ok_or("note size overflows")?;
            notes = notes.get(next..).unwrap_or_default();
        }
    }
    Ok(false)
}

fn check_header(elf: &[u8]) -> Result<(), String> {
    if elf.get(..4) != Some(b"\x7fELF") {
        return Err("not an ELF file".into());
    }
    // ELFCLASS64, little-endian: what x86_64 binaries are.
    if elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    Ok(())
}

/// Module names are the same with `-` or `_` (the kernel treats them alike).
pub fn normalize_name(name: &str) -> String {
    name.replace('-', "_")
}

fn modinfo_section(elf: &[u8]) -> Result<&[u8], String> {
    if elf.get(..4) != Some(b"\x7fELF") {
        return Err(
            "not an ELF file (a compressed module? only plain .ko files are supported)".into(),
        );
    }
    // ELFCLASS64, little-endian: what x86_64 modules are.
    if elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let shoff = usize_at(elf, 0x28, 8)?;
    let shentsize = usize_at(elf, 0x3a, 2)?;
    let shnum = usize_at(elf, 0x3c, 2)?;
    let shstrndx = usize_at(elf, 0x3e, 2)?;
    if shentsize < 0x40 {
        return Err(format!("section header size {shentsize} is too small"));
    }
    let header = |i: usize| -> Result<(usize, usize, usize), String> {
        let base = i
            .checked_mul(shentsize)
            .and_then(|o| o.checked_add(shoff))
            .ok_or("section header offset overflows")?;
        Ok((
            usize_at(elf, base, 4)?,
            usize_at(elf, base + 0x18, 8)?,
            usize_at(elf, base + 0x20, 8)?,
        ))
    };
    let (_, strtab_off, strtab_size) = header(shstrndx)?;
    let strtab = slice(elf, strtab_off, strtab_size)?;
    for i in 0..shnum {
        let (name_off, off, size) = header(i)?;
        let name = strtab
            .get(name_off..)
            .and_then(|rest| rest.split(|b| *b == 0).next())
            .ok_or("section name out of range")?;
        if name == b".modinfo" {
            return slice(elf, off, size);
        }
    }
    Err("no .modinfo section".into())
}

fn slice(bytes: &[u8], off: usize, len: usize) -> Result<&[u8], String> {
    off.checked_add(len)
        .and_then(|end| bytes.get(off..end))
        .ok_or_else(|| format!("range {off}+{len} is outside the file"))
}

/// The little-endian field of `width` bytes (at most 8) at `off`.
fn u64_at(bytes: &[u8], off: usize, width: usize) -> Result<u64, String> {
    let field = slice(bytes, off, width)?;
    let mut buf = [0_u8; 8];
    buf[..width].copy_from_slice(field);
    Ok(u64::from_le_bytes(buf))
}

fn usize_at(bytes: &[u8], off: usize, width: usize) -> Result<usize, String> {
    usize::try_from(u64_at(bytes, off, width)?).map_err(|_| "offset does not fit in usize".into())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ELF64 with a `.modinfo` section holding `info`, as a module has.
    pub(crate) fn fake_module(info: &[u8]) -> Vec<u8> {
        let strtab = b"\0.modinfo\0.shstrtab\0";
        let mut elf = vec![0_u8; 0x40];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        let info_off = elf.len();
        elf.extend_from_slice(info);
        let strtab_off = elf.len();
        elf.extend_from_slice(strtab);
        let shoff = elf.len();
        let mut section = |name: u32, off: usize, size: usize| {
            let mut sh = vec![0_u8; 0x40];
            sh[..4].copy_from_slice(&name.to_le_bytes());
            sh[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
            sh[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            elf.extend_from_slice(&sh);
        };
        section(0, 0, 0);
        section(1, info_off, info.len());
        section(10, strtab_off, strtab.len());
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&0x40_u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3_u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&2_u16.to_le_bytes());
        elf
    }

    #[test]
    fn depends_are_read_from_modinfo() {
        let module = fake_module(b"license=GPL\0depends=virtio,virtio-ring\0name=virtio_blk\0");
        assert_eq!(depends(&module).unwrap(), ["virtio", "virtio_ring"]);
        let module = fake_module(b"depends=\0name=virtio_ring\0");
        assert!(depends(&module).unwrap().is_empty());
    }

    /// A minimal ELF64 program: the file header, then one program header per `segments`
    /// entry (type, contents), the contents after the headers.
    fn program(segments: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let phoff = 0x40;
        let mut data_at = phoff + PHDR_SIZE * segments.len();
        let mut bytes = vec![0u8; data_at];
        bytes[..4].copy_from_slice(b"\x7fELF");
        bytes[4] = 2;
        bytes[5] = 1;
        bytes[0x20..0x28].copy_from_slice(&(phoff as u64).to_le_bytes());
        bytes[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        let count = u16::try_from(segments.len()).expect("few segments");
        bytes[0x38..0x3a].copy_from_slice(&count.to_le_bytes());
        for (index, (kind, contents)) in segments.iter().enumerate() {
            let header = phoff + PHDR_SIZE * index;
            bytes[header..header + 4].copy_from_slice(&kind.to_le_bytes());
            bytes[header + 8..header + 16].copy_from_slice(&(data_at as u64).to_le_bytes());
            bytes[header + 0x20..header + 0x28]
                .copy_from_slice(&(contents.len() as u64).to_le_bytes());
            data_at += contents.len();
        }
        for (_, contents) in segments {
            bytes.extend_from_slice(contents);
        }
        bytes
    }

    fn dynamic(tags: &[u64]) -> Vec<u8> {
        tags.iter()
            .flat_map(|tag| [tag.to_le_bytes(), 0u64.to_le_bytes()].concat())
            .collect()
    }

    #[test]
    fn static_pie_has_a_dynamic_section_but_needs_nothing() {
        let elf = program(&[
            (PT_LOAD, vec![0; 8]),
            (PT_DYNAMIC, dynamic(&[7, 8, DT_NULL])),
        ]);
        assert_eq!(linkage(&elf), Ok(Linkage::Static));
        assert_eq!(
            linkage(&program(&[(PT_LOAD, vec![0; 8])])),
            Ok(Linkage::Static)
        );
    }

    #[test]
    fn a_loader_or_a_needed_library_makes_it_dynamic() {
        let glibc = program(&[
            (PT_INTERP, b"/lib64/ld-linux-x86-64.so.2\0".to_vec()),
            (
                PT_DYNAMIC,
                dynamic(&[DT_NEEDED, DT_NEEDED, 5, DT_NULL, DT_NEEDED]),
            ),
        ]);
        assert_eq!(
            linkage(&glibc),
            Ok(Linkage::Dynamic {
                interpreter: Some("/lib64/ld-linux-x86-64.so.2".into()),
                needed: 2,
            })
        );
        // A needed library without a loader cannot run in a static image either.
        let needs_only = program(&[(PT_DYNAMIC, dynamic(&[DT_NEEDED, DT_NULL]))]);
        assert_eq!(
            linkage(&needs_only),
            Ok(Linkage::Dynamic {
                interpreter: None,
                needed: 1
            })
        );
    }

    #[test]
    fn damaged_or_foreign_programs_are_errors_not_guesses() {
        assert!(linkage(b"#!/bin/sh\necho hi\n").is_err());
        assert!(linkage(b"\x7fELF").is_err());
        let mut elf32 = program(&[(PT_LOAD, vec![0; 8])]);
        elf32[4] = 1;
        assert!(linkage(&elf32).is_err());
        let mut big_endian = program(&[(PT_LOAD, vec![0; 8])]);
        big_endian[5] = 2;
        assert!(linkage(&big_endian).is_err());
        let mut past_end = program(&[(PT_INTERP, b"/ld\0".to_vec())]);
        past_end.truncate(past_end.len() - 2);
        assert!(linkage(&past_end).unwrap_err().contains("past the end"));
        let mut cut = program(&[(PT_INTERP, b"/ld\0".to_vec())]);
        cut.truncate(0x40 + 10);
        assert!(linkage(&cut).unwrap_err().contains("outside the file"));
        let mut short_entries = program(&[(PT_INTERP, b"/ld\0".to_vec())]);
        short_entries[0x36..0x38].copy_from_slice(&32u16.to_le_bytes());
        assert!(linkage(&short_entries).unwrap_err().contains("too small"));
        let mut huge_offset = program(&[(PT_INTERP, b"/ld\0".to_vec())]);
        huge_offset[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(linkage(&huge_offset).is_err());
        // A module is ELF but not a program: it has no program headers.
        assert!(linkage(&fake_module(b"depends=\0")).is_err());
    }

    #[test]
    fn this_test_binary_reads_as_what_it_is() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let expected_static = cfg!(target_env = "musl");
        assert_eq!(linkage(&me).unwrap() == Linkage::Static, expected_static);
    }

    #[test]
    fn broken_files_are_errors_not_panics() {
        assert!(depends(b"not elf").is_err());
        assert!(depends(b"\x7fELF\x02\x01").is_err());
        let mut module = fake_module(b"depends=a\0");
        let len = module.len();
        module.truncate(len - 0x40);
        assert!(depends(&module).is_err());
        let mut module = fake_module(b"depends=a\0");
        module[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(depends(&module).is_err());
    }
}
