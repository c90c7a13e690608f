//! [`Check`]: one capability of the machine as a probe found it, with how to enable it. The
//! jail's probe and the host cgroup probe report in it, and `dynocap doctor` shows it.

/// One capability of the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Usable as the jail needs it.
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// How to enable it, when it is not ok.
    pub hint: Option<String>,
}

impl Check {
    /// A capability that is there.
    pub fn ok(detail: impl Into<String>) -> Check {
        Check {
            ok: true,
            detail: detail.into(),
            hint: None,
        }
    }

    /// A capability that is not, with how to enable it.
    pub fn missing(detail: impl Into<String>, hint: impl Into<String>) -> Check {
        Check {
            ok: false,
            detail: detail.into(),
            hint: Some(hint.into()),
        }
    }
}
