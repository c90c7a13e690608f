//! `DYNOCAP_BACKEND=auto` (and unset): `vm` where a VM can serve quickly, else `jail`. A VM
//! needs the sandbox's image (the default one unless the start names another) to be a built
//! image with a kernel (the `host` image is the host's
//! own directories, which only the jail can use) and KVM to boot that kernel here, as the
//! probe recorded once for this kernel, QEMU and host kernel ([`dynocap_backend_vm::accel`]).
//! Emulation (TCG) is never chosen on its own: it is a hundred times slower than the jail.

use crate::host::home::Home;
use crate::image;

/// What `auto` picks, and the sentence that says why (for `dynocap doctor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoChoice {
    pub backend: &'static str,
    pub why: String,
}

impl AutoChoice {
    fn jail(why: String) -> Self {
        Self {
            backend: "jail",
            why,
        }
    }
}

/// Decides for a sandbox of the image `name` in `home`. The first call on a machine whose
/// KVM hangs takes up to [`dynocap_backend_vm::probe::TIMEOUT`]; later ones read the
/// recorded answer.
pub fn choose(home: &Home, name: &str) -> AutoChoice {
    if name == image::DEFAULT_IMAGE {
        return AutoChoice::jail(format!(
            "the image \"{name}\" is made of the host's own directories, which only the \
             jail can use; for VMs build an image with a kernel (`dynocap image build debian`) \
             and make it the default (DYNOCAP_IMAGE=debian)"
        ));
    }
    let opened = image::resolve(home, name).and_then(|found| image::open(home, &found));
    let built = match opened {
        Ok(built) => built,
        Err(err) => return AutoChoice::jail(format!("the image \"{name}\": {}", err.message)),
    };
    let kernel = match dynocap_backend_vm::kernel::find(&built.root) {
        Ok(kernel) => kernel,
        Err(err) => {
            return AutoChoice::jail(format!("the image \"{name}\" cannot boot as a VM: {err}"))
        }
    };
    if let Err(err) = dynocap_backend_vm::accel::qemu_path() {
        return AutoChoice::jail(err.to_string());
    }
    let cache = home.cache_dir().join("vm");
    let recorded = dynocap_backend_vm::accel::record_path(&cache, &kernel.image)
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    use dynocap_backend_vm::accel::Kvm;
    match dynocap_backend_vm::accel::kvm_verdict(&cache, &kernel.image) {
        Ok(Kvm::Boots { cached }) => AutoChoice {
            backend: "vm",
            why: format!(
                "KVM boots the \"{name}\" image's kernel here ({} {recorded})",
                if cached {
                    "recorded in"
                } else {
                    "probed now, recorded in"
                }
            ),
        },
        Ok(Kvm::Fails { cached }) => {
            AutoChoice::jail(format!(
            "KVM does not boot the \"{name}\" image's kernel here: the probe saw no boot within \
             {}s ({} {recorded}); DYNOCAP_BACKEND=vm with DYNOCAP_VM_ACCEL=tcg runs VMs under \
             software emulation (slow)",
            dynocap_backend_vm::probe::TIMEOUT.as_secs(),
            if cached { "recorded in" } else { "probed now, recorded in" }
        ))
        }
        Ok(Kvm::Absent(why)) => AutoChoice::jail(format!(
            "{why}; DYNOCAP_BACKEND=vm with DYNOCAP_VM_ACCEL=tcg runs VMs under software \
             emulation (slow)"
        )),
        Err(err) => AutoChoice::jail(format!("probing KVM: {err}")),
    }
}

#[cfg(test)]
mod tests {
    use dynocap_host::{ROOT_MODE_COUNT, ROOT_MODE_HOST_BASE, ROOT_MODE_RANGES};

    /// A root-started KVM probe runs as an id no sandbox's range holds.
    #[test]
    fn the_probe_runs_as_the_first_id_past_the_sandboxes_pool() {
        let pool_end = u64::from(ROOT_MODE_HOST_BASE)
            + u64::from(ROOT_MODE_RANGES) * u64::from(ROOT_MODE_COUNT);
        assert_eq!(u64::from(dynocap_backend_vm::probe::PROBE_ID), pool_end);
    }
}
