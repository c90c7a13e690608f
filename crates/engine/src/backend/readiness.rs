//! One row of `dynocap doctor` about a backend, which each backend's own probe fills in: a
//! leaf of the backend layer, so that the probes (`jail_ready`, `vm_ready`) need nothing else
//! from it.

/// One row of `dynocap doctor` about a backend: what a probe of this machine found, and what
/// to do when it is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// The row's name ("seccomp", "vm backend").
    pub name: String,
    /// Sandboxes cannot start without it (doctor's `MISSING`); otherwise a warning.
    pub required: bool,
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// What to install or set; `None` when `ok`.
    pub hint: Option<String>,
}

impl Readiness {
    /// A row whose hint, `hint`, is shown only when it is not `ok`.
    pub fn new(name: &str, required: bool, ok: bool, detail: String, hint: &str) -> Self {
        Self {
            name: name.to_owned(),
            required,
            ok,
            detail,
            hint: (!ok).then(|| hint.to_owned()),
        }
    }
}
