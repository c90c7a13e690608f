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
}

impl ImageRef {
    pub fn host() -> ImageRef {
        ImageRef {
            name: DEFAULT_IMAGE.into(),
            id: None,
        }
    }
}
