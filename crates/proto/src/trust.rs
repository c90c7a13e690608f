//! Where a guest's trust store keeps CAs: the files the agent joins the host's extra CAs
//! (`DYNOCAP_EXTRA_CA`) into, and the engine takes them out of again when a recipe build's
//! layer is made (an image keeps what its recipe made, not what its build sandbox trusted).
//! Guest paths, absolute.

/// System CA bundles, each where a distribution's TLS libraries read it by default: Debian,
/// Ubuntu, Alpine, Arch, Gentoo; Fedora, RHEL, CentOS (the link, and what it points at);
/// openSUSE; Alpine's and LibreSSL's `cert.pem`.
pub const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Where each distribution's bundle tool takes local CAs from, with the file the agent puts
/// the extra CAs in: `update-ca-certificates` (Debian, Ubuntu, Alpine: `*.crt`),
/// `update-ca-trust` (Fedora, RHEL), `trust extract-compat` (Arch), `update-ca-certificates`
/// (openSUSE).
pub const LOCAL_ANCHORS: &[&str] = &[
    "/usr/local/share/ca-certificates/dynocap-extra-ca.crt",
    "/etc/pki/ca-trust/source/anchors/dynocap-extra-ca.pem",
    "/etc/ca-certificates/trust-source/anchors/dynocap-extra-ca.crt",
    "/etc/pki/trust/anchors/dynocap-extra-ca.pem",
];

/// The stem of the agent's anchor files' names: a bundle tool's links to them (Debian's
/// `/etc/ssl/certs/dynocap-extra-ca.pem` and its hash link) name it too.
pub const ANCHOR_STEM: &str = "dynocap-extra-ca";
