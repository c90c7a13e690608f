//! The engine's image commands (`dynocap image build|import|ls|rm`): the store, plus the catalog's
//! word on which images live sandboxes still use.

use std::sync::atomic::AtomicBool;

use serde::Serialize;

use crate::facade::sandboxes::Engine;
use crate::foundation::error::{Error, Result};
use crate::image::build::{self, Outcome};
use crate::image::import::{self, Imported};
use crate::image::layers::LayerStore;
use crate::image::oci::Digest;
use crate::image::store::{BuiltImage, ImageSource, ImageStore};
use crate::image::unpack::Limits;
use crate::store::catalog::{Record, State};

/// One line of `image ls`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageInfo {
    pub name: String,
    pub id: String,
    pub created: String,
    pub size_bytes: u64,
    /// Kernel release inside the image (what the `vm` backend boots), if any.
    pub kernel: Option<String>,
    /// Where an imported image came from (none: built by `image build`).
    pub source: Option<ImageSource>,
    /// Bytes of this image's layers (the shared layer store's) that other images use too:
    /// stored once for all of them. 0 for an image whose rootfs is its own (a debian build).
    pub shared_bytes: u64,
    /// Live sandboxes (and tasks waiting to be recovered) that use this image.
    pub used_by: Vec<String>,
    pub path: String,
    /// An imported image's config as recorded: `Env` and `WorkingDir` are applied to its
    /// sandboxes' commands, `User`, `Entrypoint` and `Cmd` only shown (docs/sandboxes.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<crate::image::oci::ContainerConfig>,
}

impl ImageInfo {
    /// Built on this host by `dynocap image build`: the `debian` image (no source) or a
    /// recipe; not pulled or imported as it came.
    pub fn built_here(&self) -> bool {
        self.source.as_ref().is_none_or(ImageSource::is_recipe)
    }
}

/// A sandbox whose guest needs its image's lower layer: running, or keeping a writable layer
/// that a recovery boots again over the same image.
fn needs_image(record: &Record) -> bool {
    record.state.is_live() || record.state == State::Unsaved
}

impl Engine {
    fn image_store(&self) -> ImageStore {
        ImageStore::for_home(self.home(), self.config().images.cache_dir())
    }

    /// Builds image `name`, or finds it built (see [`build::build`]).
    pub fn image_build(
        &self,
        name: &str,
        progress: &dyn Fn(&str),
        cancel: &AtomicBool,
    ) -> Result<Outcome> {
        build::build(
            &self.image_store(),
            name,
            self.config().images.debian_mirror.as_deref(),
            progress,
            cancel,
        )
    }

    /// Imports an OCI image layout or a `docker save` archive (see [`import::import`]).
    pub fn image_import(
        &self,
        path: &std::path::Path,
        name: Option<&str>,
        limits: Limits,
        progress: &dyn Fn(&str),
        cancel: &AtomicBool,
    ) -> Result<Imported> {
        import::import(&self.image_store(), path, name, limits, progress, cancel)
    }

    /// Every built image, with the sandboxes using it.
    pub fn image_ls(&self) -> Result<Vec<ImageInfo>> {
        let records = self.live_records()?;
        Ok(self
            .image_store()
            .list()?
            .into_iter()
            .map(|image| info(&image, &records))
            .collect())
    }

    /// Whether image `name` (its newest) is known to have no git where the guest agent looks,
    /// so a task cannot start on it (its baseline is a git commit in the guest). False when
    /// it cannot tell (the `host` image, an image not here): the start says so itself.
    pub fn image_lacks_git(&self, name: &str) -> bool {
        crate::image::resolve(self.home(), name)
            .is_ok_and(|image| crate::image::has_program(self.home(), &image, "git") == Some(false))
    }

    /// One image (by name: its newest; or by id), with the sandboxes using it.
    pub fn image_inspect(&self, name_or_id: &str) -> Result<ImageInfo> {
        let image = self.image_store().find(name_or_id)?.ok_or_else(|| {
            Error::not_found(format!(
                "no image named or with id \"{name_or_id}\" (see dynocap image ls)"
            ))
        })?;
        Ok(info(&image, &self.live_records()?))
    }

    /// Removes an image (built, imported or pulled), refused while a sandbox needs it (the
    /// sandbox of a recipe build that died is destroyed first: it needs no image).
    pub async fn image_rm(&self, name_or_id: &str) -> Result<ImageInfo> {
        if name_or_id == crate::image::DEFAULT_IMAGE {
            return Err(Error::invalid(
                "the host image is made from this host's own system directories when a sandbox \
                 starts, not stored: there is nothing to remove (dynocap image ls lists the \
                 images that are)",
            ));
        }
        self.reap_dead_builds().await;
        let store = self.image_store();
        let Some(image) = store.find(name_or_id)? else {
            // What a build of the name that died left (no image of it was ever installed)
            // goes all the same.
            store.remove_name_if_unused(name_or_id)?;
            return Err(Error::not_found(format!(
                "no image named or with id \"{name_or_id}\" (see dynocap image ls)"
            )));
        };
        let records = self.live_records()?;
        let info = info(&image, &records);
        if !info.used_by.is_empty() {
            return Err(Error::conflict(format!(
                "image {} ({}) is in use by {}; destroy or finish {} first",
                image.name(),
                build::short(image.id()),
                info.used_by.join(", "),
                if info.used_by.len() == 1 {
                    "it"
                } else {
                    "them"
                }
            )));
        }
        store.remove(&image)?;
        // Then the layers no image left uses (asked under the layer store's lock, so an
        // image installed meanwhile keeps its own).
        let freed = LayerStore::in_images_dir(store.dir()).free_unused(&|| {
            Ok(store
                .list()?
                .into_iter()
                .flat_map(|image| image.meta.layers)
                .collect())
        })?;
        if freed.layers > 0 {
            tracing::info!("freed {} layers ({} bytes)", freed.layers, freed.bytes);
        }
        Ok(info)
    }

    /// Records whose guest needs its image, after repairing the catalog (a sandbox whose
    /// supervisor died is `lost` and no longer holds its image).
    fn live_records(&self) -> Result<Vec<Record>> {
        let catalog = self.catalog()?;
        self.reconcile(&catalog)?;
        Ok(catalog.list()?.into_iter().filter(needs_image).collect())
    }
}

/// The bytes of `image`'s layers that another image of its store uses too.
fn shared_bytes(image: &BuiltImage) -> u64 {
    if image.meta.layers.is_empty() {
        return 0;
    }
    // `images/<name>/<id>`.
    let Some(images_dir) = image.dir.parent().and_then(|p| p.parent()) else {
        return 0;
    };
    let others: std::collections::HashSet<String> = ImageStore::at(images_dir.to_owned(), None)
        .list()
        .unwrap_or_default()
        .into_iter()
        .filter(|other| other.dir != image.dir)
        .flat_map(|other| other.meta.layers)
        .collect();
    let layers = LayerStore::in_images_dir(images_dir);
    image
        .meta
        .layers
        .iter()
        .filter(|id| others.contains(*id))
        .filter_map(|id| layers.get(&Digest::parse(id).ok()?))
        .map(|layer| layer.meta.size_bytes)
        .sum()
}

fn info(image: &BuiltImage, records: &[Record]) -> ImageInfo {
    ImageInfo {
        name: image.name().to_owned(),
        id: image.id().to_owned(),
        created: image.meta.created.clone(),
        size_bytes: image.meta.size_bytes,
        kernel: image.meta.kernel.clone(),
        source: image.meta.source.clone(),
        shared_bytes: shared_bytes(image),
        used_by: records
            .iter()
            .filter(|r| r.image.needs(image.id()))
            .map(|r| r.name.clone().unwrap_or_else(|| r.id.clone()))
            .collect(),
        path: image.dir.display().to_string(),
        config: image.meta.config.clone(),
    }
}
