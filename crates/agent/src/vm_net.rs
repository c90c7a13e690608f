//! The VM guest's network interfaces as the first stage sets them up: `lo` always, and for a
//! `nat` guest its one NIC with the static address, default route and resolver the host put on
//! the kernel command line (`dynocap.net=ADDR/PREFIX,GATEWAY,RESOLVER`). No DHCP client and
//! no `ip` binary: a handful of ioctls, so any image works.
//!
//! The guest owns its kernel: guest root may change all of this afterwards. That is fine: the
//! NIC leads only to QEMU's user networking, and what the host enforces lives outside the
//! guest (see the engine's `vm_backend`).

use std::fs;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

/// Why the guest's network could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("dynocap.net={0:?} is not ADDR/PREFIX,GATEWAY,RESOLVER")]
    BadNatSetting(String),
    #[error("no network interface appeared within {0}s (is virtio_net in the initramfs?)")]
    NoInterface(u64),
    #[error("opening a socket to configure interfaces: {0}")]
    Socket(#[source] Errno),
    #[error("interface name {0:?} is too long")]
    NameTooLong(String),
    #[error("giving {nic} the address {addr}: {source}")]
    Address {
        nic: String,
        addr: Ipv4Addr,
        source: Errno,
    },
    #[error("setting {nic}'s netmask {mask}: {source}")]
    Netmask {
        nic: String,
        mask: Ipv4Addr,
        source: Errno,
    },
    #[error("bringing up {nic}: {source}")]
    LinkUp { nic: String, source: Errno },
    #[error("adding the default route via {gateway}: {source}")]
    DefaultRoute { gateway: Ipv4Addr, source: Errno },
    #[error("replacing {}: {source}", path.display())]
    ReplaceResolvConf { path: PathBuf, source: io::Error },
    #[error("writing {}: {source}", path.display())]
    WriteResolvConf { path: PathBuf, source: io::Error },
}

/// A `nat` guest's settings, from `dynocap.net=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatConfig {
    pub addr: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
    pub dns: Ipv4Addr,
}

/// Reads `ADDR/PREFIX,GATEWAY,RESOLVER`.
pub fn parse_nat(value: &str) -> Result<NatConfig, NetError> {
    let bad = || NetError::BadNatSetting(value.to_owned());
    let mut parts = value.split(',');
    let (Some(cidr), Some(gateway), Some(dns), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let (addr, prefix) = cidr.split_once('/').ok_or_else(bad)?;
    let prefix: u8 = prefix.parse().map_err(|_| bad())?;
    if !(1..=30).contains(&prefix) {
        return Err(bad());
    }
    Ok(NatConfig {
        addr: addr.parse().map_err(|_| bad())?,
        prefix,
        gateway: gateway.parse().map_err(|_| bad())?,
        dns: dns.parse().map_err(|_| bad())?,
    })
}

/// Sets `IFF_UP` on `lo` (a fresh kernel has it down; the jail backend does this from the
/// host side for its network namespace).
pub fn loopback_up() -> Result<(), NetError> {
    let sock = inet_socket()?;
    link_up(&sock, "lo")
}

/// Waits for the NIC (its driver probes asynchronously), gives it `config`'s address, brings
/// it up, routes everything through the gateway, and writes `root`'s `/etc/resolv.conf`.
pub fn configure_nat(config: &NatConfig, root: &Path, wait: Duration) -> Result<(), NetError> {
    let name = wait_for_nic(wait)?;
    let sock = inet_socket()?;
    let mask = Ipv4Addr::from(u32::MAX << (32 - u32::from(config.prefix)));
    let mut req = ifreq(&name)?;
    req.ifr_ifru.ifru_addr = sockaddr(config.addr);
    // SAFETY: SIOCSIFADDR only reads `req`, a valid ifreq naming the NIC with an AF_INET
    // address.
    unsafe { siocsifaddr(sock.as_raw_fd(), &req) }.map_err(|source| NetError::Address {
        nic: name.clone(),
        addr: config.addr,
        source,
    })?;
    req.ifr_ifru.ifru_netmask = sockaddr(mask);
    // SAFETY: as above, with the netmask.
    unsafe { siocsifnetmask(sock.as_raw_fd(), &req) }.map_err(|source| NetError::Netmask {
        nic: name.clone(),
        mask,
        source,
    })?;
    link_up(&sock, &name)?;
    // SAFETY: rtentry is a plain C struct of integers, sockaddrs and a null-able pointer;
    // all-zero is a valid value (destination and mask 0.0.0.0: the default route).
    let mut route: libc::rtentry = unsafe { std::mem::zeroed() };
    route.rt_dst = sockaddr(Ipv4Addr::UNSPECIFIED);
    route.rt_genmask = sockaddr(Ipv4Addr::UNSPECIFIED);
    route.rt_gateway = sockaddr(config.gateway);
    route.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    // SAFETY: SIOCADDRT only reads `route`, a valid rtentry (rt_dev null: the kernel picks the
    // interface that reaches the gateway).
    unsafe { siocaddrt(sock.as_raw_fd(), &route) }.map_err(|source| NetError::DefaultRoute {
        gateway: config.gateway,
        source,
    })?;
    write_resolv_conf(root, config.dns)
}

/// The first interface other than `lo` to appear.
fn wait_for_nic(wait: Duration) -> Result<String, NetError> {
    let deadline = Instant::now() + wait;
    loop {
        let found = fs::read_dir("/sys/class/net").ok().and_then(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|name| name != "lo")
        });
        if let Some(name) = found {
            return Ok(name);
        }
        if Instant::now() > deadline {
            return Err(NetError::NoInterface(wait.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Replaces the image's resolver configuration on the guest's own disk (a symlink, as
/// systemd-resolved leaves it, is replaced too, never followed).
fn write_resolv_conf(root: &Path, dns: Ipv4Addr) -> Result<(), NetError> {
    let path = root.join("etc/resolv.conf");
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(NetError::ReplaceResolvConf { path, source }),
    }
    fs::write(
        &path,
        format!(
            "# DynoCap: network \"nat\" (DNS through the host's forwarder)\nnameserver {dns}\n"
        ),
    )
    .map_err(|source| NetError::WriteResolvConf { path, source })
}

fn inet_socket() -> Result<OwnedFd, NetError> {
    socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(NetError::Socket)
}

/// An ifreq naming `name`, the rest zero.
fn ifreq(name: &str) -> Result<libc::ifreq, NetError> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(NetError::NameTooLong(name.to_owned()));
    }
    // SAFETY: ifreq is a plain C struct (name array plus a union of integers and pointers);
    // all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = libc::c_char::from_ne_bytes([src]);
    }
    Ok(req)
}

/// Sets `IFF_UP | IFF_RUNNING` on `name`, keeping its other flags.
fn link_up(sock: &OwnedFd, name: &str) -> Result<(), NetError> {
    let fail = |source: Errno| NetError::LinkUp {
        nic: name.to_owned(),
        source,
    };
    let mut req = ifreq(name)?;
    // SAFETY: SIOCGIFFLAGS reads the name from and writes the flags into `req`, which is a
    // valid, exclusively borrowed ifreq.
    unsafe { siocgifflags(sock.as_raw_fd(), &mut req) }.map_err(fail)?;
    let up = libc::c_short::try_from(libc::IFF_UP | libc::IFF_RUNNING)
        .map_err(|_| fail(Errno::EINVAL))?;
    // SAFETY: SIOCGIFFLAGS just initialised the flags member of the union.
    unsafe { req.ifr_ifru.ifru_flags |= up };
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    unsafe { siocsifflags(sock.as_raw_fd(), &req) }.map_err(fail)?;
    Ok(())
}

/// `ip` as the kernel's interface ioctls take it.
fn sockaddr(ip: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::sa_family_t::try_from(libc::AF_INET).expect("AF_INET fits sa_family_t"),
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr are both 16-byte plain C structs; the kernel reads an
    // AF_INET sockaddr as a sockaddr_in, which is what the C API's casts do.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

nix::ioctl_readwrite_bad!(siocgifflags, libc::SIOCGIFFLAGS, libc::ifreq);
nix::ioctl_write_ptr_bad!(siocsifflags, libc::SIOCSIFFLAGS, libc::ifreq);
nix::ioctl_write_ptr_bad!(siocsifaddr, libc::SIOCSIFADDR, libc::ifreq);
nix::ioctl_write_ptr_bad!(siocsifnetmask, libc::SIOCSIFNETMASK, libc::ifreq);
nix::ioctl_write_ptr_bad!(siocaddrt, libc::SIOCADDRT, libc::rtentry);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nat_setting_is_read_strictly() {
        assert_eq!(
            parse_nat("10.0.2.15/24,10.0.2.2,169.254.1.1").unwrap(),
            NatConfig {
                addr: Ipv4Addr::new(10, 0, 2, 15),
                prefix: 24,
                gateway: Ipv4Addr::new(10, 0, 2, 2),
                dns: Ipv4Addr::new(169, 254, 1, 1),
            }
        );
        for bad in [
            "",
            "10.0.2.15,10.0.2.2,169.254.1.1",
            "10.0.2.15/33,10.0.2.2,169.254.1.1",
            "10.0.2.15/24,10.0.2.2",
            "10.0.2.15/24,10.0.2.2,169.254.1.1,x",
            "10.0.2.15/24,gw,169.254.1.1",
        ] {
            assert!(
                matches!(parse_nat(bad), Err(NetError::BadNatSetting(ref v)) if v == bad),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn addresses_are_in_network_order() {
        let sa = sockaddr(Ipv4Addr::new(10, 0, 2, 15));
        // SAFETY: test-only view of the 16 bytes just written.
        let bytes: [u8; 16] = unsafe { std::mem::transmute(sa) };
        assert_eq!(&bytes[4..8], &[10, 0, 2, 15]);
        assert_eq!(
            u16::from_ne_bytes([bytes[0], bytes[1]]),
            u16::try_from(libc::AF_INET).unwrap()
        );
    }
}
