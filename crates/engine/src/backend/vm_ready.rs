//! Whether the `vm` backend can start a sandbox on this machine, decided the way its first
//! start decides: the image's kernel found as a boot finds it, QEMU looked up on `PATH`, and
//! the accelerator chosen by the backend's own [`dynocap_backend_vm::accel::choose`] (which
//! reads `DYNOCAP_VM_ACCEL` and runs the KVM probe, or reads its recorded answer). For
//! `dynocap doctor`: a report that says "ready" must not be followed by a start that refuses.

use super::readiness::Readiness;
use crate::host::home::Home;
use crate::image::{self, store::ImageStore, Image};
use crate::model::config::Config;
use dynocap_backend_vm::accel::{self, AccelChoice, Kvm, ENV};
use dynocap_backend_vm::Accel;

/// What TCG costs, for the sentences that offer it.
const TCG_COST: &str = "software emulation: no KVM needed, but a VM boots in tens of seconds \
                        and its commands run many times slower than in the jail";

/// The verdict, as doctor reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct VmReadiness {
    ready: bool,
    /// What was found (the image, the accelerator and how it was chosen, or what is missing).
    detail: String,
    /// What to install or set when not ready.
    hint: Option<String>,
}

impl VmReadiness {
    fn ready(detail: String) -> Self {
        Self {
            ready: true,
            detail,
            hint: None,
        }
    }

    fn not_ready(detail: String, hint: String) -> Self {
        Self {
            ready: false,
            detail,
            hint: Some(hint),
        }
    }
}

/// `dynocap doctor`'s "vm backend" row. Required when `chosen` (`DYNOCAP_BACKEND=vm` makes
/// every sandbox a VM); otherwise a warning, since `--backend vm` can still ask for one.
pub(super) fn start_check(config: &Config, chosen: bool) -> Readiness {
    const NAME: &str = "vm backend";
    // Probed (a few seconds, once per kernel) where sandboxes may be VMs without asking:
    // `vm` chosen, or `auto` deciding for a built default image.
    let default = config.images.default_name();
    let probe = chosen || default != image::DEFAULT_IMAGE;
    let home = match Home::without_pool(&config.home) {
        Ok(home) => home,
        Err(err) => {
            return Readiness::new(
                NAME,
                chosen,
                false,
                err.message,
                "set DYNOCAP_HOME to a readable directory",
            )
        }
    };
    let vm = check(&home, config, probe);
    if chosen && default == image::DEFAULT_IMAGE {
        // Every start that names no image gets `host`, which no VM boots.
        return Readiness::new(
            NAME,
            true,
            false,
            format!(
                "DYNOCAP_BACKEND=vm, but the default image \"{default}\" is the host's \
                 own directories, which no VM boots: a start without --image fails; {}",
                vm.detail
            ),
            &format!(
                "set DYNOCAP_IMAGE to a built image with a kernel (`dynocap image build \
                 debian`, then DYNOCAP_IMAGE=debian), or pass --image to every start{}",
                vm.hint.map(|h| format!("; then {h}")).unwrap_or_default()
            ),
        );
    }
    Readiness::new(
        NAME,
        chosen,
        vm.ready,
        vm.detail,
        vm.hint.as_deref().unwrap_or(""),
    )
}

/// Whether a `vm` sandbox of the default image (or, where that is the host's own
/// directories, of the newest built image with a kernel) can start in `home`. With `probe`,
/// a KVM probe not run yet runs now (up to [`dynocap_backend_vm::probe::TIMEOUT`] on a
/// machine whose KVM hangs), as a first start would; without it, only a recorded answer
/// counts, so that a report for a home that does not use VMs costs no probe.
fn check(home: &Home, config: &Config, probe: bool) -> VmReadiness {
    let image = match image_to_check(home, config) {
        Ok(image) => image,
        Err(not_ready) => return not_ready,
    };
    let mut readiness = check_image(home, config, &image, probe);
    if config.images.default_name() == image::DEFAULT_IMAGE {
        readiness.detail = format!(
            "with `--image {}` (the default image \"{}\" cannot be a VM): {}",
            image.name,
            image::DEFAULT_IMAGE,
            readiness.detail
        );
    }
    readiness
}

/// [`check`] for a sandbox of `image`.
fn check_image(home: &Home, config: &Config, image: &Image, probe: bool) -> VmReadiness {
    let name = &image.name;
    let kernel = match dynocap_backend_vm::kernel::find(&image.root) {
        Ok(kernel) => kernel,
        Err(err) => {
            return VmReadiness::not_ready(
                format!("the image \"{name}\" cannot boot as a VM: {err}"),
                "build an image with a kernel: `dynocap image build debian`".to_owned(),
            )
        }
    };
    if let Err(err) = accel::qemu_path() {
        return VmReadiness::not_ready(
            err.to_string(),
            "apt-get install qemu-system-x86".to_owned(),
        );
    }
    let cache = home.cache_dir().join("vm");
    let choice = AccelChoice::parse(config.vm_accel.as_deref());
    // `None`: a setting that names no accelerator (`choose` below says so).
    let chosen_setting = choice.as_ref().ok().copied();
    let tcg_hint = format!(
        "set {ENV}=tcg to run VMs under TCG ({TCG_COST}), or use the jail backend \
         (`--backend jail`, DYNOCAP_BACKEND=jail)"
    );
    let recorded = accel::record_path(&cache, &kernel.image).is_ok_and(|p| p.is_file());
    if !probe && !recorded && chosen_setting != Some(AccelChoice::Tcg) {
        return VmReadiness::not_ready(
            format!(
                "whether KVM boots the image \"{name}\"'s kernel here is not known yet: the \
                 first vm start probes it"
            ),
            format!(
                "run `DYNOCAP_BACKEND=vm dynocap doctor` to probe it now (a few seconds), or \
                 set {ENV}=tcg ({TCG_COST})"
            ),
        );
    }
    match choice.and_then(|choice| accel::choose(choice, &cache, &kernel.image)) {
        Ok(Accel::Tcg) => VmReadiness::ready(format!(
            "the image \"{name}\" boots under TCG ({ENV}=tcg): {TCG_COST}"
        )),
        Ok(Accel::Kvm) if chosen_setting == Some(AccelChoice::Kvm) => {
            match accel::kvm_verdict(&cache, &kernel.image) {
                // Forced KVM is used without the probe's say-so: where the probe saw it fail, a
                // start waits out its boot timeout and then fails.
                Ok(Kvm::Fails { .. }) => VmReadiness::not_ready(
                    format!(
                    "{ENV}=kvm forces KVM, but KVM does not boot the image \"{name}\"'s kernel \
                     here (the probe saw no boot within {}s, recorded in {}): starts will time \
                     out",
                    dynocap_backend_vm::probe::TIMEOUT.as_secs(),
                    recorded_at(&cache, &kernel.image)
                ),
                    tcg_hint,
                ),
                _ => {
                    VmReadiness::ready(format!("the image \"{name}\" boots under KVM ({ENV}=kvm)"))
                }
            }
        }
        Ok(Accel::Kvm) => VmReadiness::ready(format!(
            "the image \"{name}\" boots under KVM (the probe found KVM boots its kernel here, \
             recorded in {})",
            recorded_at(&cache, &kernel.image)
        )),
        Err(err) => {
            let why = match (chosen_setting, accel::kvm_verdict(&cache, &kernel.image)) {
                (Some(AccelChoice::Auto), Ok(Kvm::Fails { .. })) => format!(
                    "KVM does not boot its kernel here (the probe saw no boot within {}s, \
                     recorded in {}) and {ENV} names no other accelerator",
                    dynocap_backend_vm::probe::TIMEOUT.as_secs(),
                    recorded_at(&cache, &kernel.image)
                ),
                (Some(AccelChoice::Auto), Ok(Kvm::Absent(why))) => {
                    format!("{why}, and {ENV} names no other accelerator")
                }
                _ => err.to_string(),
            };
            VmReadiness::not_ready(
                format!("a vm sandbox of the image \"{name}\" would not start: {why}"),
                tcg_hint,
            )
        }
    }
}

fn recorded_at(cache: &std::path::Path, kernel: &std::path::Path) -> String {
    accel::record_path(cache, kernel)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|err| format!("(unknown: {err})"))
}

/// The image whose kernel decides: the default one (`DYNOCAP_IMAGE`), unless that is the
/// host's own directories (which no VM boots), then the newest built image with a kernel.
fn image_to_check(home: &Home, config: &Config) -> Result<Image, VmReadiness> {
    let default = config.images.default_name();
    let name = if default == image::DEFAULT_IMAGE {
        let built = ImageStore::for_home(home, None).list().map_err(|err| {
            VmReadiness::not_ready(
                err.message,
                "set DYNOCAP_HOME to a readable directory".to_owned(),
            )
        })?;
        match built.iter().rev().find(|i| i.meta.kernel.is_some()) {
            Some(found) => found.name().to_owned(),
            None => {
                return Err(VmReadiness::not_ready(
                    format!(
                        "no built image has a kernel for a VM to boot (the default image \
                         \"{default}\" is the host's own directories, which only the jail can \
                         use)"
                    ),
                    "build one with `dynocap image build debian`, then start VMs with \
                     `--image debian` (or DYNOCAP_IMAGE=debian)"
                        .to_owned(),
                ))
            }
        }
    } else {
        default
    };
    image::resolve(home, &name)
        .and_then(|found| image::open(home, &found))
        .map_err(|err| {
            VmReadiness::not_ready(
                format!("the image \"{name}\": {}", err.message),
                format!("build it with `dynocap image build {name}`"),
            )
        })
}
