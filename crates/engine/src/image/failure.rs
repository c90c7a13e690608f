//! The image layer's one failure enum, in a module of its own so that the image modules
//! share it without importing `image.rs` (which declares them).

use std::path::PathBuf;

use crate::foundation::error::{Coded, ErrorCode};

/// What failed with the images on the host: finding, building, copying or removing one. The
/// image layer's one failure enum, for this module and its `build` and `store`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ImageFailure {
    /// A record names an image build that is no longer in the store.
    #[error(
        "image {name} ({short_id}) is gone from {}; rebuild it with `dynocap image build {name}`",
        .images_dir.display()
    )]
    Gone {
        name: String,
        short_id: String,
        images_dir: PathBuf,
    },
    #[error("locking {}: {source}", .path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("installing the image skeleton at {}: {source}", .root.display())]
    InstallSkeleton {
        root: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the image installed at {} cannot be read back", .dir.display())]
    Unreadable { dir: PathBuf },
    #[error("removing {}: {source}; remove it by hand", .path.display())]
    RemoveBuildDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `cp` failed: `stderr` is what it said.
    #[error("copying {} to {}: {stderr}", .from.display(), .to.display())]
    Copy {
        from: PathBuf,
        to: PathBuf,
        stderr: String,
    },
    #[error("reading {}: {source}", .dir.display())]
    ReadStore {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} has no parent", .dir.display())]
    NoParent { dir: PathBuf },
}

impl Coded for ImageFailure {
    /// The image store is DynoCap's on the host: what fails in it is the operator's to fix
    /// (a gone image says how), never a caller's request.
    fn code(&self) -> ErrorCode {
        match self {
            Self::Gone { .. }
            | Self::Lock { .. }
            | Self::InstallSkeleton { .. }
            | Self::Unreadable { .. }
            | Self::RemoveBuildDir { .. }
            | Self::Copy { .. }
            | Self::ReadStore { .. }
            | Self::NoParent { .. } => ErrorCode::Internal,
        }
    }
}
