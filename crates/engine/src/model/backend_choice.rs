//! Which backend a new sandbox asks for.

use crate::foundation::error::{Error, Result};

/// The backend a new sandbox asks for: the CLI's `--backend`, else `DYNOCAP_BACKEND`, else
/// `auto` (the best one this machine supports for the sandbox's image, see
/// the backend module's `auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    Jail,
    Vm,
    Auto,
}

impl BackendChoice {
    /// The values a choice is written as, for messages.
    pub const VALUES: &'static str = "jail, vm or auto";

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "jail" => Some(Self::Jail),
            "vm" => Some(Self::Vm),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }

    /// `DYNOCAP_BACKEND`; `auto` when it is unset or empty.
    pub fn from_env() -> Result<Self> {
        match std::env::var("DYNOCAP_BACKEND").ok().as_deref() {
            None | Some("") => Ok(Self::Auto),
            Some(name) => Self::parse(name).ok_or_else(|| {
                Error::invalid(format!(
                    "DYNOCAP_BACKEND={name} is not a backend; use {}",
                    Self::VALUES
                ))
            }),
        }
    }
}
