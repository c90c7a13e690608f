//! Fuzzes the project's ELF reader, which reads an image's kernel, its modules and the agent:
//! any bytes give an answer or an error, never a panic.
#![no_main]

use dynocap_backend_vm::elf;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    drop(elf::program_headers(data));
    drop(elf::depends(data));
    drop(elf::linkage(data));
    drop(elf::has_pvh_entry(data));
});
