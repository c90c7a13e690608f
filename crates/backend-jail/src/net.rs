//! Networking inside the jail: the new network namespace has only `lo`, down; bring it up so
//! the guest can use 127.0.0.1 (the agent's proxy listener lives there).

use std::os::fd::AsRawFd;

use nix::errno::Errno;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

/// Sets `IFF_UP` (and `IFF_RUNNING`) on `lo` via `SIOCGIFFLAGS`/`SIOCSIFFLAGS`.
pub(crate) fn loopback_up() -> Result<(), Errno> {
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is a plain C struct (name array plus a union of integers and pointers);
    // all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = libc::c_char::from_ne_bytes([*src]);
    }
    // SAFETY: SIOCGIFFLAGS reads the name from and writes the flags into `req`, which is a
    // valid, exclusively borrowed ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(Errno::last());
    }
    let up =
        libc::c_short::try_from(libc::IFF_UP | libc::IFF_RUNNING).map_err(|_| Errno::EINVAL)?;
    // SAFETY: SIOCGIFFLAGS just initialised the flags member of the union.
    unsafe { req.ifr_ifru.ifru_flags |= up };
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(Errno::last());
    }
    Ok(())
}
