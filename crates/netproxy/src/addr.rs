//! Address classes: which IP addresses the proxy may connect to after resolving a name.
//!
//! Only [`AddrClass::Public`] is reachable through the proxy without a resolve override. The
//! classifier is deliberately conservative: anything special-purpose (IANA registries of
//! special-purpose v4 and v6 addresses) or unallocated is not public, and v6 forms that embed
//! a v4 address are classified by that v4 address, so `::ffff:127.0.0.1` is loopback.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Serialize;

/// What an IP address is, as far as egress is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum AddrClass {
    /// Globally routable unicast: the only class the proxy connects to by itself.
    Public,
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// 10/8, 172.16/12, 192.168/16, fc00::/7, fec0::/10 (site-local), 64:ff9b:1::/48.
    Private,
    /// 169.254/16, fe80::/10.
    LinkLocal,
    /// 100.64/10 (RFC 6598, carrier-grade NAT).
    SharedCgnat,
    /// 224/4, ff00::/8.
    Multicast,
    /// Cloud instance metadata services (169.254.169.254, fd00:ec2::254, 100.100.100.200, ...).
    Metadata,
    /// 0.0.0.0/8 ("this network"), ::.
    Unspecified,
    /// 255.255.255.255.
    Broadcast,
    /// 192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32, 3fff::/20.
    Documentation,
    /// 198.18/15, 2001:2::/48.
    Benchmarking,
    /// Everything else special-purpose or unallocated: 240/4, 192.0.0/24, 192.88.99/24,
    /// Teredo and the rest of 2001::/23, 100::/64, 5f00::/16, v6 outside 2000::/3.
    Reserved,
}

impl AddrClass {
    /// Whether the proxy may connect to an address of this class without an override.
    pub fn is_public(self) -> bool {
        self == AddrClass::Public
    }

    /// The class as a noun phrase for refusal messages: "resolves to {description}".
    pub fn description(self) -> &'static str {
        match self {
            AddrClass::Public => "a public address",
            AddrClass::Loopback => "a loopback address",
            AddrClass::Private => "a private address",
            AddrClass::LinkLocal => "a link-local address",
            AddrClass::SharedCgnat => "a shared (CGNAT) address",
            AddrClass::Multicast => "a multicast address",
            AddrClass::Metadata => "a cloud metadata address",
            AddrClass::Unspecified => "an unspecified address",
            AddrClass::Broadcast => "the broadcast address",
            AddrClass::Documentation => "a documentation address",
            AddrClass::Benchmarking => "a benchmarking address",
            AddrClass::Reserved => "a reserved address",
        }
    }
}

impl fmt::Display for AddrClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

/// Classifies `ip`. v6 addresses that embed a v4 address (v4-mapped `::ffff:0:0/96`,
/// v4-compatible `::/96`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) are classified as the
/// embedded v4 address, because that is where the packets end up.
pub fn classify(ip: IpAddr) -> AddrClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// Cloud metadata endpoints, checked before the wider ranges that contain them.
const METADATA_V4: [Ipv4Addr; 4] = [
    // AWS, GCP, Azure, OpenStack, Oracle, DigitalOcean, ...
    Ipv4Addr::new(169, 254, 169, 254),
    // AWS ECS task metadata.
    Ipv4Addr::new(169, 254, 170, 2),
    // Alibaba Cloud.
    Ipv4Addr::new(100, 100, 100, 200),
    // Oracle Cloud (legacy).
    Ipv4Addr::new(192, 0, 0, 192),
];

/// AWS instance metadata over IPv6 (Nitro).
const METADATA_V6: [Ipv6Addr; 1] = [Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254)];

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn classify_v4(ip: Ipv4Addr) -> AddrClass {
    if METADATA_V4.contains(&ip) {
        return AddrClass::Metadata;
    }
    if ip == Ipv4Addr::BROADCAST {
        return AddrClass::Broadcast;
    }
    const TABLE: [([u8; 4], u32, AddrClass); 17] = [
        ([0, 0, 0, 0], 8, AddrClass::Unspecified),
        ([10, 0, 0, 0], 8, AddrClass::Private),
        ([100, 64, 0, 0], 10, AddrClass::SharedCgnat),
        ([127, 0, 0, 0], 8, AddrClass::Loopback),
        ([169, 254, 0, 0], 16, AddrClass::LinkLocal),
        ([172, 16, 0, 0], 12, AddrClass::Private),
        // IETF protocol assignments (DS-Lite, NAT64 discovery, ...).
        ([192, 0, 0, 0], 24, AddrClass::Reserved),
        ([192, 0, 2, 0], 24, AddrClass::Documentation),
        // Deprecated 6to4 relay anycast.
        ([192, 88, 99, 0], 24, AddrClass::Reserved),
        ([192, 168, 0, 0], 16, AddrClass::Private),
        ([198, 18, 0, 0], 15, AddrClass::Benchmarking),
        ([198, 51, 100, 0], 24, AddrClass::Documentation),
        ([203, 0, 113, 0], 24, AddrClass::Documentation),
        ([224, 0, 0, 0], 4, AddrClass::Multicast),
        ([240, 0, 0, 0], 4, AddrClass::Reserved),
        // AS112 and AMT anycast are global in the registry but never a package host.
        ([192, 31, 196, 0], 24, AddrClass::Reserved),
        ([192, 52, 193, 0], 24, AddrClass::Reserved),
    ];
    TABLE
        .iter()
        .find(|(net, prefix, _)| in_v4(ip, *net, *prefix))
        .map_or(AddrClass::Public, |(_, _, class)| *class)
}

fn in_v6(ip: Ipv6Addr, net: [u16; 8], prefix: u32) -> bool {
    let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
    u128::from(ip) & mask == u128::from(Ipv6Addr::from(net)) & mask
}

/// The v4 address at bits 96..128.
fn low_v4(ip: Ipv6Addr) -> Ipv4Addr {
    let o = ip.octets();
    Ipv4Addr::new(o[12], o[13], o[14], o[15])
}

fn classify_v6(ip: Ipv6Addr) -> AddrClass {
    if ip == Ipv6Addr::UNSPECIFIED {
        return AddrClass::Unspecified;
    }
    if ip == Ipv6Addr::LOCALHOST {
        return AddrClass::Loopback;
    }
    if METADATA_V6.contains(&ip) {
        return AddrClass::Metadata;
    }
    // Forms that carry a v4 address: the packets reach that v4 address.
    if in_v6(ip, [0, 0, 0, 0, 0, 0xffff, 0, 0], 96)
        || in_v6(ip, [0; 8], 96)
        || in_v6(ip, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96)
    {
        return classify_v4(low_v4(ip));
    }
    if in_v6(ip, [0x2002, 0, 0, 0, 0, 0, 0, 0], 16) {
        let o = ip.octets();
        return classify_v4(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    const TABLE: [([u16; 8], u32, AddrClass); 12] = [
        ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, AddrClass::Private),
        ([0x100, 0, 0, 0, 0, 0, 0, 0], 64, AddrClass::Reserved),
        ([0x2001, 0x2, 0, 0, 0, 0, 0, 0], 48, AddrClass::Benchmarking),
        (
            [0x2001, 0xdb8, 0, 0, 0, 0, 0, 0],
            32,
            AddrClass::Documentation,
        ),
        // Teredo, ORCHID and the other IETF protocol assignments.
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, AddrClass::Reserved),
        ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, AddrClass::Documentation),
        // SRv6 segment identifiers.
        ([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16, AddrClass::Reserved),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, AddrClass::Private),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, AddrClass::LinkLocal),
        // Deprecated site-local: private in practice.
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, AddrClass::Private),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, AddrClass::Multicast),
        // Global unicast; everything outside it is unallocated.
        ([0x2000, 0, 0, 0, 0, 0, 0, 0], 3, AddrClass::Public),
    ];
    TABLE
        .iter()
        .find(|(net, prefix, _)| in_v6(ip, *net, *prefix))
        .map_or(AddrClass::Reserved, |(_, _, class)| *class)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> AddrClass {
        classify(s.parse().expect("test address parses"))
    }

    #[test]
    fn v4_classes() {
        let cases = [
            ("0.0.0.0", AddrClass::Unspecified),
            ("0.1.2.3", AddrClass::Unspecified),
            ("10.0.0.1", AddrClass::Private),
            ("10.255.255.255", AddrClass::Private),
            ("100.63.255.255", AddrClass::Public),
            ("100.64.0.1", AddrClass::SharedCgnat),
            ("100.127.255.255", AddrClass::SharedCgnat),
            ("100.128.0.0", AddrClass::Public),
            ("100.100.100.200", AddrClass::Metadata),
            ("127.0.0.1", AddrClass::Loopback),
            ("127.255.0.9", AddrClass::Loopback),
            ("169.254.0.1", AddrClass::LinkLocal),
            ("169.254.169.254", AddrClass::Metadata),
            ("169.254.170.2", AddrClass::Metadata),
            ("172.15.255.255", AddrClass::Public),
            ("172.16.0.1", AddrClass::Private),
            ("172.31.255.255", AddrClass::Private),
            ("172.32.0.0", AddrClass::Public),
            ("192.0.0.8", AddrClass::Reserved),
            ("192.0.0.192", AddrClass::Metadata),
            ("192.0.2.1", AddrClass::Documentation),
            ("192.88.99.1", AddrClass::Reserved),
            ("192.168.1.1", AddrClass::Private),
            ("198.18.0.1", AddrClass::Benchmarking),
            ("198.19.255.255", AddrClass::Benchmarking),
            ("198.20.0.0", AddrClass::Public),
            ("198.51.100.7", AddrClass::Documentation),
            ("203.0.113.9", AddrClass::Documentation),
            ("224.0.0.1", AddrClass::Multicast),
            ("239.255.255.250", AddrClass::Multicast),
            ("240.0.0.1", AddrClass::Reserved),
            ("255.255.255.254", AddrClass::Reserved),
            ("255.255.255.255", AddrClass::Broadcast),
            ("1.1.1.1", AddrClass::Public),
            ("8.8.8.8", AddrClass::Public),
            ("104.16.0.1", AddrClass::Public),
        ];
        for (addr, want) in cases {
            assert_eq!(class(addr), want, "{addr}");
        }
    }

    #[test]
    fn v6_classes() {
        let cases = [
            ("::", AddrClass::Unspecified),
            ("::1", AddrClass::Loopback),
            ("fe80::1", AddrClass::LinkLocal),
            ("febf:ffff::1", AddrClass::LinkLocal),
            ("fec0::1", AddrClass::Private),
            ("fc00::1", AddrClass::Private),
            ("fd12:3456::1", AddrClass::Private),
            ("fd00:ec2::254", AddrClass::Metadata),
            ("fd00:ec2::253", AddrClass::Private),
            ("ff02::1", AddrClass::Multicast),
            ("ff0e::101", AddrClass::Multicast),
            ("2001:db8::1", AddrClass::Documentation),
            ("3fff:0fff::1", AddrClass::Documentation),
            ("2001:2::1", AddrClass::Benchmarking),
            ("2001::1", AddrClass::Reserved),
            ("2001:10::1", AddrClass::Reserved),
            ("100::1", AddrClass::Reserved),
            ("5f00::1", AddrClass::Reserved),
            ("64:ff9b:1::1", AddrClass::Private),
            ("4000::1", AddrClass::Reserved),
            ("2606:4700::1111", AddrClass::Public),
            ("2a00:1450::1", AddrClass::Public),
        ];
        for (addr, want) in cases {
            assert_eq!(class(addr), want, "{addr}");
        }
    }

    #[test]
    fn v6_forms_with_embedded_v4_take_the_v4_class() {
        let cases = [
            ("::ffff:127.0.0.1", AddrClass::Loopback),
            ("::ffff:10.1.2.3", AddrClass::Private),
            ("::ffff:169.254.169.254", AddrClass::Metadata),
            ("::ffff:100.64.0.1", AddrClass::SharedCgnat),
            ("::ffff:0.0.0.0", AddrClass::Unspecified),
            ("::ffff:255.255.255.255", AddrClass::Broadcast),
            ("::ffff:224.0.0.1", AddrClass::Multicast),
            ("::ffff:8.8.8.8", AddrClass::Public),
            ("::127.0.0.1", AddrClass::Loopback),
            ("::192.168.0.1", AddrClass::Private),
            ("64:ff9b::127.0.0.1", AddrClass::Loopback),
            ("64:ff9b::169.254.169.254", AddrClass::Metadata),
            ("64:ff9b::8.8.4.4", AddrClass::Public),
            ("2002:7f00:1::", AddrClass::Loopback),
            ("2002:a9fe:a9fe::1", AddrClass::Metadata),
            ("2002:0808:0808::1", AddrClass::Public),
        ];
        for (addr, want) in cases {
            assert_eq!(class(addr), want, "{addr}");
        }
    }

    #[test]
    fn only_public_is_public() {
        assert!(AddrClass::Public.is_public());
        assert!(!AddrClass::Metadata.is_public());
        assert_eq!(
            AddrClass::Loopback.to_string(),
            "a loopback address",
            "refusals read 'resolves to a loopback address (...)'"
        );
    }
}
