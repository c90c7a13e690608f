//! What a built image is made from, and its content id.
//!
//! An image is identified by the SHA-256 of its recipe: everything that decides what ends up
//! in the rootfs (suite, variant, package list, mirror, mmdebstrap's version, and the revision
//! of the customisation DynoCap applies after mmdebstrap). Two builds of one recipe get one
//! id, so a built image can be reused (from a shared cache too) without looking inside it,
//! and a changed recipe can never be mistaken for an old image.

use sha2::{Digest, Sha256};

/// Images `dynocap image build` knows how to make.
pub const BUILDABLE: &[&str] = &["debian"];

/// Bump when [`super::build`]'s customisation of the rootfs changes.
const CUSTOMISATION_REVISION: u32 = 1;

/// The distribution's default mirror; `DYNOCAP_DEBIAN_MIRROR` overrides it for the build.
pub const DEFAULT_DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";

/// Packages on top of `minbase`: what a coding agent needs first, and the cloud kernel (with
/// its modules) so the `vm` backend can boot the same rootfs.
pub const DEBIAN_PACKAGES: &[&str] = &[
    "ca-certificates",
    "git",
    "curl",
    "openssh-client",
    "python3",
    "build-essential",
    "linux-image-cloud-amd64",
];

/// One image build's inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    pub name: String,
    pub suite: String,
    pub variant: String,
    pub packages: Vec<String>,
    /// Where mmdebstrap downloads from during the build (on the host).
    pub mirror: String,
    /// The mirror the guest's apt uses: HTTPS, because the `filtered` network's proxy carries
    /// HTTPS only.
    pub guest_mirror: String,
    /// `mmdebstrap --version`, e.g. `mmdebstrap 1.3.5`.
    pub mmdebstrap_version: String,
}

impl Recipe {
    /// The recipe for image `name` with this machine's mirror (`DYNOCAP_DEBIAN_MIRROR`, else
    /// Debian's) and mmdebstrap.
    pub fn for_name(name: &str, mmdebstrap_version: &str, mirror: Option<&str>) -> Option<Recipe> {
        if name != "debian" {
            return None;
        }
        let mirror = mirror
            .filter(|m| !m.trim().is_empty())
            .map(|m| m.trim().trim_end_matches('/').to_owned())
            .unwrap_or_else(|| DEFAULT_DEBIAN_MIRROR.to_owned());
        Some(Recipe {
            name: name.to_owned(),
            suite: "bookworm".into(),
            variant: "minbase".into(),
            packages: DEBIAN_PACKAGES.iter().map(|p| (*p).to_owned()).collect(),
            guest_mirror: https_mirror(&mirror),
            mirror,
            mmdebstrap_version: mmdebstrap_version.trim().to_owned(),
        })
    }

    /// The content id: lowercase hex SHA-256 of the canonical recipe text.
    pub fn id(&self) -> String {
        let digest = Sha256::digest(self.canonical().as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// One `key value` line per input, in a fixed order (packages sorted).
    fn canonical(&self) -> String {
        let mut packages = self.packages.clone();
        packages.sort();
        format!(
            "dynocap-image-recipe 1\nname {}\nsuite {}\nvariant {}\npackages {}\nmirror {}\n\
             guest-mirror {}\nmmdebstrap {}\ncustomisation {CUSTOMISATION_REVISION}\n",
            self.name,
            self.suite,
            self.variant,
            packages.join(","),
            self.mirror,
            self.guest_mirror,
            self.mmdebstrap_version,
        )
    }
}

/// The guest's apt source: the build mirror over HTTPS (`http://` becomes `https://`).
fn https_mirror(mirror: &str) -> String {
    match mirror.strip_prefix("http://") {
        Some(rest) => format!("https://{rest}"),
        None => mirror.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe() -> Recipe {
        Recipe {
            name: "debian".into(),
            suite: "bookworm".into(),
            variant: "minbase".into(),
            packages: vec!["git".into(), "curl".into()],
            mirror: "http://deb.debian.org/debian".into(),
            guest_mirror: "https://deb.debian.org/debian".into(),
            mmdebstrap_version: "mmdebstrap 1.3.5".into(),
        }
    }

    #[test]
    fn the_id_follows_every_input_but_package_order() {
        let base = recipe();
        let id = base.id();
        assert_eq!(id.len(), 64);
        assert!(id
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        let mut reordered = base.clone();
        reordered.packages.reverse();
        assert_eq!(reordered.id(), id);
        let changes: [fn(&mut Recipe); 6] = [
            |r| r.suite = "trixie".into(),
            |r| r.packages.push("vim".into()),
            |r| r.mirror = "http://mirror.example/debian".into(),
            |r| r.guest_mirror = "https://mirror.example/debian".into(),
            |r| r.mmdebstrap_version = "mmdebstrap 1.5.0".into(),
            |r| r.variant = "apt".into(),
        ];
        for change in changes {
            let mut other = base.clone();
            change(&mut other);
            assert_ne!(other.id(), id, "{other:?}");
        }
    }

    #[test]
    fn the_guest_uses_the_mirror_over_https() {
        assert_eq!(
            https_mirror("http://deb.debian.org/debian"),
            "https://deb.debian.org/debian"
        );
        assert_eq!(https_mirror("https://m.example/d"), "https://m.example/d");
    }

    #[test]
    fn only_debian_has_a_recipe() {
        assert!(Recipe::for_name("debian", "mmdebstrap 1.3.5", None).is_some());
        assert!(Recipe::for_name("host", "mmdebstrap 1.3.5", None).is_none());
        assert!(Recipe::for_name("alpine", "mmdebstrap 1.3.5", None).is_none());
    }
}
