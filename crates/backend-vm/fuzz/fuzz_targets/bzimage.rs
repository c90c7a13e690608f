//! Fuzzes the extraction of a kernel ELF from an image's bzImage: its setup header, the LZ4
//! payload and the ELF inside. Any bytes give the minimal ELF or an error, never a panic, and
//! the ELF's pieces lie within the length it reports.
#![no_main]

use dynocap_backend_vm::vmlinux;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    // An even first byte: the rest is the whole file. An odd one: the rest is the payload of a
    // well-formed setup header, so the fuzzing goes into the LZ4 stream and the ELF.
    let file = if choice & 1 == 0 {
        rest.to_vec()
    } else {
        bzimage_around(rest)
    };
    if let Ok(elf) = vmlinux::extract(&file) {
        assert!(elf
            .pieces
            .iter()
            .all(|(offset, bytes)| offset + bytes.len() <= elf.len));
    }
});

/// A bzImage (boot protocol 2.08) with one setup sector whose payload is `payload`.
fn bzimage_around(payload: &[u8]) -> Vec<u8> {
    let mut file = vec![0_u8; 1024];
    file[0x1f1] = 1; // setup_sects: the payload starts after 2 sectors
    file[0x202..0x206].copy_from_slice(b"HdrS");
    file[0x206..0x208].copy_from_slice(&0x208_u16.to_le_bytes());
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    file[0x24c..0x250].copy_from_slice(&len.to_le_bytes()); // payload_length
    file.extend_from_slice(payload);
    file
}
