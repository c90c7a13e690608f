//! DynoCap's `vm` backend: each sandbox is a QEMU microVM (KVM where it boots a guest, else
//! TCG when asked for) whose PID 1 is the same static `dynocap-agent` the jail runs, reached
//! over virtio-serial.
//!
//! The guest boots the image's own kernel straight from the host (no firmware, no
//! bootloader) with an initramfs this crate builds: the agent as `/init` plus the few kernel
//! modules it needs. The agent mounts the root disk — a qcow2 layer over a read-only ext4 made
//! from the image — switches root into it and serves the channel.
//!
//! Modules: [`cpio`] (archive writer), [`elf`] and [`kernel`] (which kernel, which
//! modules), [`initramfs`], [`disk`], [`cache`] (content-addressed artefacts), [`qemu`]
//! (command line and process), [`layers`] (the disk's chain of qcow2 layers: freezes for checkpoints
//! and forks), [`netns`] (a `nat` guest's namespace for pasta), [`qmp`], [`console`] (the bounded console log), [`accel`] and [`probe`] (KVM or TCG), [`vmlinux`]
//! (the kernel ELF QEMU boots through its PVH entry), [`vm`] (the running guest), [`migrate`]
//! (a running guest saved, and resumed by another QEMU: live forks).

pub mod accel;
pub mod cache;
pub mod cache_gc;
pub mod console;
pub mod cpio;
pub mod disk;
pub mod elf;
mod error;
pub mod initramfs;
pub mod kernel;
pub mod layers;
pub mod migrate;
pub mod netns;
pub mod probe;
pub mod qemu;
pub mod qmp;
pub mod vm;
pub mod vmlinux;

pub use accel::AccelChoice;
pub use error::{Result, VmError};
pub use qemu::Accel;
pub use vm::{cleanup_leftovers, Vm, VmPaths, VmSpec};
