//! The names of the variables a `filtered` sandbox's agent sets for every command: the ones
//! that send HTTP clients through its proxy listener and the ones that point TLS clients at
//! its CA bundle. The agent sets them; the host keeps an image's own values of them out of
//! such a sandbox, so both read this one list.

/// Set to the listener's URL: the common variables in both spellings, and the settings npm,
/// pip and cargo read instead of them (a project's config could otherwise point elsewhere).
pub const PROXY_URL_VARIABLES: &[&str] = &[
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "https_proxy",
    "http_proxy",
    "npm_config_proxy",
    "npm_config_https_proxy",
    "PIP_PROXY",
    "CARGO_HTTP_PROXY",
];

/// Set to the hosts that do not go through the proxy (the guest's loopback).
pub const NO_PROXY_VARIABLES: &[&str] = &["NO_PROXY", "no_proxy"];

/// Set to the CA bundle's path when the sandbox has one. npm ignores `NODE_EXTRA_CA_CERTS`
/// for connections through a proxy; its own setting takes the whole bundle.
pub const CA_BUNDLE_VARIABLES: &[&str] = &[
    "SSL_CERT_FILE",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "CARGO_HTTP_CAINFO",
    "npm_config_cafile",
];

/// git takes its proxy from `GIT_CONFIG_COUNT` and the numbered `GIT_CONFIG_KEY_n` /
/// `GIT_CONFIG_VALUE_n` pairs, all of which start with this.
pub const GIT_CONFIG_PREFIX: &str = "GIT_CONFIG_";
