//! What the backend reads out of ELF files: a kernel module's `depends=` list from its
//! `.modinfo` section (the way `modinfo` does: images need not ship `modules.dep`, which only
//! `depmod` makes), whether a program needs a dynamic loader (the initramfs has no libc, so
//! the agent must be static), and a kernel's program headers and whether its notes name a PVH
//! entry point (so QEMU can boot the ELF directly, see [`crate::vmlinux`]).

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

/// Whether `program` names a program interpreter (`PT_INTERP`): a dynamically linked binary.
pub fn is_dynamic(program: &[u8]) -> Result<bool, String> {
    const PT_INTERP: u32 = 3;
    Ok(program_headers(program)?
        .iter()
        .any(|ph| ph.kind == PT_INTERP))
}

pub const PT_LOAD: u32 = 1;
pub const PT_NOTE: u32 = 4;

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

fn usize_at(bytes: &[u8], off: usize, width: usize) -> Result<usize, String> {
    let field = slice(bytes, off, width)?;
    let mut buf = [0_u8; 8];
    buf[..width].copy_from_slice(field);
    usize::try_from(u64::from_le_bytes(buf)).map_err(|_| "offset does not fit in usize".into())
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

    #[test]
    fn dynamic_programs_are_told_from_static_ones() {
        // This test binary is dynamically linked (the gnu target); a module has no program
        // headers at all.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(is_dynamic(&me).unwrap());
        assert!(!is_dynamic(&fake_module(b"depends=\0")).unwrap());
        assert!(is_dynamic(b"#!/bin/sh\n").is_err());
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
