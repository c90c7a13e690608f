//! What a sandbox's egress allows, as its record keeps it. How the allowlist is built from
//! the operator's environment and turned into the proxy's policy is the egress module's.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What a sandbox's egress allows, as recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressSpec {
    /// Host patterns reachable on 443 once the sandbox is up (`filtered` only).
    pub allow: Vec<String>,
    /// Resolve overrides, `host:port:addr` (`DYNOCAP_RESOLVE`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resolve: Vec<String>,
    /// Extra CA certificates the guest trusts (`DYNOCAP_EXTRA_CA`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_ca: Option<PathBuf>,
}
