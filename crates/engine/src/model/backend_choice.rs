//! Which backend a new sandbox asks for.

/// The backend a new sandbox asks for: the CLI's `--backend`, else `DYNOCAP_BACKEND` (see
/// `Config::backend_choice`), else
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
}
