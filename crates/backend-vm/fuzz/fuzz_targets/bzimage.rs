//! Fuzzes the extraction of a kernel ELF from an image's bzImage: its setup header, the LZ4
//! payload and the ELF inside. Any bytes give the minimal ELF or an error, never a panic, and
//! the ELF's pieces lie within the length it reports.
#![no_main]

use dynocap_backend_vm::vmlinux;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(elf) = vmlinux::extract(data) {
        assert!(elf
            .pieces
            .iter()
            .all(|(offset, bytes)| offset + bytes.len() <= elf.len));
    }
});
