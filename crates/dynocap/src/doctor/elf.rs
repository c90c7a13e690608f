//! Whether an executable is statically linked, read from its ELF headers: a program header
//! `PT_INTERP` (a dynamic loader to run it) or a `DT_NEEDED` entry in its dynamic section
//! (a shared library to load) makes it dynamic. A static-PIE binary (Rust's musl default)
//! has a dynamic section for its own relocations, but neither of these.
//!
//! Only 64-bit little-endian ELF is read: the hosts DynoCap runs on (x86-64, aarch64).

use std::fmt;

const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
/// Sizes fixed by the ELF64 format.
const HEADER_LEN: usize = 64;
const DYN_ENTRY_LEN: usize = 16;

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

/// Reads the linkage of the ELF image `bytes`; the error says what is wrong with it.
pub fn linkage(bytes: &[u8]) -> Result<Linkage, String> {
    if bytes.len() < HEADER_LEN || &bytes[..4] != b"\x7fELF" {
        return Err("not an ELF executable".into());
    }
    // EI_CLASS 2 = 64-bit, EI_DATA 1 = little-endian.
    if bytes[4] != 2 || bytes[5] != 1 {
        return Err("not a 64-bit little-endian ELF executable".into());
    }
    let phoff = usize_at(bytes, 0x20)?;
    let phentsize = usize::from(u16_at(bytes, 0x36)?);
    let phnum = usize::from(u16_at(bytes, 0x38)?);
    if phentsize < 56 {
        return Err(format!(
            "program header entries of {phentsize} bytes (ELF64 has 56)"
        ));
    }
    let mut interpreter = None;
    let mut needed = 0;
    for index in 0..phnum {
        let header = index
            .checked_mul(phentsize)
            .and_then(|at| at.checked_add(phoff))
            .ok_or("program header table out of range")?;
        let kind = u32_at(bytes, header)?;
        let offset = usize_at(bytes, header + 0x08)?;
        let size = usize_at(bytes, header + 0x20)?;
        let contents = offset
            .checked_add(size)
            .and_then(|end| bytes.get(offset..end))
            .ok_or_else(|| format!("program header {index} points past the end of the file"))?;
        match kind {
            PT_INTERP => {
                let path = contents.split(|&b| b == 0).next().unwrap_or_default();
                interpreter = Some(String::from_utf8_lossy(path).into_owned());
            }
            PT_DYNAMIC => needed += count_needed(contents)?,
            _ => {}
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
    for entry in section.chunks_exact(DYN_ENTRY_LEN) {
        match u64_at(entry, 0)? {
            DT_NULL => break,
            DT_NEEDED => needed += 1,
            _ => {}
        }
    }
    Ok(needed)
}

fn field<const N: usize>(bytes: &[u8], at: usize) -> Result<[u8; N], String> {
    at.checked_add(N)
        .and_then(|end| bytes.get(at..end))
        .and_then(|slice| slice.try_into().ok())
        .ok_or_else(|| format!("the ELF headers are cut short (at byte {at})"))
}

fn u16_at(bytes: &[u8], at: usize) -> Result<u16, String> {
    field(bytes, at).map(u16::from_le_bytes)
}

fn u32_at(bytes: &[u8], at: usize) -> Result<u32, String> {
    field(bytes, at).map(u32::from_le_bytes)
}

fn u64_at(bytes: &[u8], at: usize) -> Result<u64, String> {
    field(bytes, at).map(u64::from_le_bytes)
}

fn usize_at(bytes: &[u8], at: usize) -> Result<usize, String> {
    let value = u64_at(bytes, at)?;
    usize::try_from(value).map_err(|_| format!("offset {value} does not fit this machine"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 image: the file header, then one program header per `segments`
    /// entry (type, contents), the contents after the headers.
    fn image(segments: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let phoff = HEADER_LEN;
        let mut data_at = phoff + 56 * segments.len();
        let mut bytes = vec![0u8; data_at];
        bytes[..4].copy_from_slice(b"\x7fELF");
        bytes[4] = 2;
        bytes[5] = 1;
        bytes[0x20..0x28].copy_from_slice(&(phoff as u64).to_le_bytes());
        bytes[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        let count = u16::try_from(segments.len()).expect("few segments");
        bytes[0x38..0x3a].copy_from_slice(&count.to_le_bytes());
        for (index, (kind, contents)) in segments.iter().enumerate() {
            let header = phoff + 56 * index;
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
        let elf = image(&[(1, vec![0; 8]), (PT_DYNAMIC, dynamic(&[7, 8, DT_NULL]))]);
        assert_eq!(linkage(&elf), Ok(Linkage::Static));
        assert_eq!(linkage(&image(&[(1, vec![0; 8])])), Ok(Linkage::Static));
    }

    #[test]
    fn a_loader_or_a_needed_library_makes_it_dynamic() {
        let glibc = image(&[
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
        let needs_only = image(&[(PT_DYNAMIC, dynamic(&[DT_NEEDED, DT_NULL]))]);
        assert_eq!(
            linkage(&needs_only),
            Ok(Linkage::Dynamic {
                interpreter: None,
                needed: 1
            })
        );
    }

    #[test]
    fn damaged_or_foreign_files_are_errors_not_guesses() {
        assert!(linkage(b"#!/bin/sh\necho hi\n").is_err());
        let mut elf32 = image(&[]);
        elf32[4] = 1;
        assert!(linkage(&elf32).is_err());
        let mut past_end = image(&[(PT_INTERP, b"/ld\0".to_vec())]);
        past_end.truncate(past_end.len() - 2);
        assert!(linkage(&past_end).unwrap_err().contains("past the end"));
        let mut cut = image(&[(PT_INTERP, b"/ld\0".to_vec())]);
        cut.truncate(HEADER_LEN + 10);
        assert!(linkage(&cut).unwrap_err().contains("cut short"));
    }

    #[test]
    fn this_test_binary_reads_as_what_it_is() {
        let exe = std::fs::read(std::env::current_exe().expect("test binary path"))
            .expect("read the test binary");
        let expected_static = cfg!(target_env = "musl");
        assert_eq!(
            linkage(&exe).expect("an ELF") == Linkage::Static,
            expected_static
        );
    }
}
