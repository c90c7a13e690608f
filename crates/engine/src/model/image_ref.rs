//! Which image a sandbox boots, as its record keeps it.

use serde::{Deserialize, Serialize};

/// The image every sandbox gets unless another is asked for (`--image`, `DYNOCAP_IMAGE`).
pub const DEFAULT_IMAGE: &str = "host";

/// Which image a sandbox uses, as its record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRef {
    pub name: String,
    /// Content id of a built image; `None` for `host`, which is made from the host itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The built image whose kernel a vm boots this image with: the one the person named
    /// (`--kernel`), or the one lent to an image without a kernel (a container image) when
    /// the sandbox was made. `None`: the image's own kernel (or a jail, which boots none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelRef>,
}

/// A built image lending its kernel, by name and content id: resolved once, when the sandbox
/// is created, as its image is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelRef {
    pub name: String,
    pub id: String,
}

impl ImageRef {
    pub fn host() -> ImageRef {
        ImageRef {
            name: DEFAULT_IMAGE.into(),
            id: None,
            kernel: None,
        }
    }

    /// A built image, by name and content id, with its own kernel (if any).
    pub fn built(name: impl Into<String>, id: impl Into<String>) -> ImageRef {
        ImageRef {
            name: name.into(),
            id: Some(id.into()),
            kernel: None,
        }
    }

    /// Whether a sandbox of this reference needs the built image `id`: as its root, or for
    /// the kernel it boots.
    pub fn needs(&self, id: &str) -> bool {
        self.id.as_deref() == Some(id) || self.kernel.as_ref().is_some_and(|k| k.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_without_a_named_kernel_reads_and_writes_as_before() {
        let old = r#"{"name":"debian","id":"abc"}"#;
        let image: ImageRef = serde_json::from_str(old).expect("parse");
        assert_eq!(image, ImageRef::built("debian", "abc"));
        assert_eq!(serde_json::to_string(&image).expect("json"), old);
    }

    #[test]
    fn an_image_is_needed_as_the_root_or_as_the_kernel() {
        let mut image = ImageRef::built("tiny", "t1");
        assert!(image.needs("t1"));
        assert!(!image.needs("k1"));
        image.kernel = Some(KernelRef {
            name: "debian".into(),
            id: "k1".into(),
        });
        assert!(image.needs("k1"));
        assert!(!ImageRef::host().needs("k1"));
    }
}
