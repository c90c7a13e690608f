//! Whether the jail backend can run on this machine: the kernel features a jail is made of
//! (user namespaces, overlay in one, the mount API, seccomp, cgroups), probed now by the
//! jail crate's own probe, as `dynocap doctor`'s first rows. Each is required: without it no
//! jail starts.

use super::readiness::Readiness;

/// The kernel's release, then one row per feature.
pub(super) fn machine_checks() -> Vec<Readiness> {
    let probe = dynocap_backend_jail::probe();
    let row = |name: String, check: dynocap_host::Check| Readiness {
        name,
        required: true,
        ok: check.ok,
        detail: check.detail,
        hint: if check.ok { None } else { check.hint },
    };
    let cgroups = format!("cgroups ({:?})", probe.cgroups.layout).to_lowercase();
    vec![
        Readiness::new("kernel", true, true, probe.kernel, ""),
        row("user namespaces".to_owned(), probe.user_namespaces),
        row(
            "overlay in user namespace".to_owned(),
            probe.overlay_in_userns,
        ),
        row("mount API".to_owned(), probe.mount_api),
        row("seccomp".to_owned(), probe.seccomp),
        row(cgroups, probe.cgroups.check),
    ]
}
