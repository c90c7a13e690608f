//! `dynocap image pull REF`: an OCI or Docker image from a registry over HTTPS, made into an
//! image of the store from the shared [`layers`](super::layers) store.
//!
//! The distribution protocol (manifests, manifest lists, token and basic authentication) is
//! `oci-client`'s. DynoCap adds the host's policy around it: only registries in
//! `DYNOCAP_REGISTRIES`, and every connection the client makes (the registry, a token realm,
//! a blob redirect) goes through [`RegistryGate`], a CONNECT proxy on loopback that allows
//! only those hosts and resolves names with `DYNOCAP_RESOLVE` first; TLS trusts the system's
//! CAs plus `DYNOCAP_EXTRA_CA`. Credentials (flags, or the user's Docker config file) live in
//! memory for the pull only: nothing of them is written.
//!
//! Blobs are downloaded to `blobs/.partial-*`, checked against their digests, and renamed to
//! `blobs/sha256/<hex>`; each layer is unpacked (staged beside the layer store, keyed by its
//! diff id) from the bytes as they arrive ([`stream`]) and kept once its blob is whole. A
//! layer the store has already is not downloaded, so an image on a base already pulled
//! fetches only its own layers, and a pull that was stopped resumes from the blobs and layers
//! it finished.
//!
//! Installs are durable, and cost one wait for the disk per pull: once every layer is staged
//! and the image assembled from them (hard links), one `syncfs` writes all their files, then
//! the layers are renamed into the store and the image into place, each rename made durable by
//! an `fsync` of its directory. Each unpacked file's writeback is started as it is closed
//! ([`unpack`](super::unpack)), so that sync finds most of the pull's data on the disk already
//! and its wait overlaps the downloads. A pull that fails (or is stopped) still installs the
//! layers it finished, with a sync of their own, so the next one starts from them; the blobs
//! of staged layers are removed just before the sync (their pages dropped, never written).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use dynocap_netproxy::{normalize_host, HostPattern, ResolveOverrides, RESOLVE_ENV};
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::build::{remove_dead_builds, sync_filesystem, BuildLock, Staging};
use super::failure::ImageFailure;
use super::import::{assemble_image, stage_blob, Budget};
use super::layers::{Layer, LayerStore, StagedLayer, Unpacked};
use super::oci::{self, Digest};
use super::store::{self, BuiltImage, ImageMeta, ImageSource, ImageStore};
use super::unpack::{Limits, Stats};
use crate::foundation::error::{Context, Error, Result};
use crate::foundation::failpoint;

mod stream;

/// Bump when a pull's result changes for the same image: a new id instead of an old result.
const PULL_REVISION: &str = "1";
/// The variable naming the registries a pull may use.
pub const REGISTRIES_ENV: &str = "DYNOCAP_REGISTRIES";
/// Blobs downloaded at once.
const PARALLEL_DOWNLOADS: usize = 4;
/// The variable naming CA certificates a pull trusts besides the system's.
const EXTRA_CA_ENV: &str = "DYNOCAP_EXTRA_CA";
/// The variable saying how long a registry may send nothing before a pull gives up on it.
pub const IDLE_TIMEOUT_ENV: &str = "DYNOCAP_PULL_IDLE_TIMEOUT";
/// How long a registry may send nothing (while a connection is made, or in the middle of an
/// answer) when [`IDLE_TIMEOUT_ENV`] is unset: a registry that stalls ends the pull with an
/// error instead of holding it forever.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How many idle timeouts the manifest and config may take in all.
const RESOLVE_WINDOWS: u32 = 4;

/// What the host allows a pull, as the binary read it from its environment.
#[derive(Debug, Clone, Default)]
pub struct PullPolicy {
    /// `DYNOCAP_REGISTRIES`: `,`-separated hosts (`host`, `host:port`, `*.domain`).
    pub registries: Option<String>,
    /// `DYNOCAP_RESOLVE`, curl's `--resolve` syntax.
    pub resolve: Option<String>,
    /// `DYNOCAP_EXTRA_CA`: PEM certificates trusted besides the system's.
    pub extra_ca: Option<PathBuf>,
    /// The user's Docker config file (`$DOCKER_CONFIG/config.json` or
    /// `~/.docker/config.json`), read for credentials when none are given.
    pub docker_config: Option<PathBuf>,
    /// `DYNOCAP_PULL_IDLE_TIMEOUT` as given: whole seconds (unset: 60).
    pub idle_timeout: Option<String>,
}

/// A user name and password given for this pull only.
#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, <hidden>)", self.username)
    }
}

/// A finished pull.
#[derive(Debug, Clone)]
pub struct Pulled {
    pub image: BuiltImage,
    /// The store had this very image already.
    pub present: bool,
    pub stats: Stats,
    pub transfer: Transfer,
}

/// What a pull fetched and what it found in the store.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Transfer {
    /// Blobs downloaded now, and their bytes.
    pub blobs_downloaded: u64,
    pub bytes_downloaded: u64,
    /// Layers already in the store (another image's, or an earlier pull's).
    pub layers_present: u64,
    /// Blobs a stopped pull had downloaded, used instead of downloading again.
    pub blobs_resumed: u64,
}

/// Pulls `reference` (as given) and stores it as `name` (default: the reference itself).
#[allow(clippy::too_many_arguments)]
pub async fn pull(
    images: &ImageStore,
    reference: &str,
    name: Option<&str>,
    credentials: Option<Credentials>,
    policy: &PullPolicy,
    limits: Limits,
    progress: &(dyn Fn(&str) + Sync),
    cancel: &AtomicBool,
) -> Result<Pulled> {
    let parsed = parse_reference(reference)?;
    let name = match name {
        Some(name) => {
            if let Some(why) = store::unfit_name(name) {
                return Err(Error::invalid(format!(
                    "\"{}\" cannot name an image: {why}; give another with --name, e.g. --name mytool",
                    oci::printable(name)
                )));
            }
            name.to_owned()
        }
        None => reference.to_owned(),
    };
    let registries = allowed_registries(policy.registries.as_deref())?;
    let registry = parsed.resolve_registry().to_owned();
    let (host, port) = host_port(&registry);
    if registries.allows(&host, port).is_none() {
        return Err(not_allowed(&registry, policy.registries.as_deref()));
    }
    let overrides = ResolveOverrides::parse(policy.resolve.as_deref().unwrap_or(""))
        .map_err(|err| Error::invalid(format!("DYNOCAP_RESOLVE: {err}")))?;
    let idle = idle_timeout(policy.idle_timeout.as_deref())?;
    let downloads = Downloads::start()?;
    let gate = RegistryGate::start(registries, overrides, downloads.handle())?;
    // Set when the Docker config keeps this registry's credentials in a helper DynoCap does
    // not run: said if the registry then refuses the pull.
    let mut helper_note = None;
    let auth = match credentials {
        Some(c) => RegistryAuth::Basic(c.username, c.password),
        None => {
            let found = docker_config_auth(policy.docker_config.as_deref(), &registry)?;
            helper_note = found.helper_note;
            found.auth
        }
    };
    let offered = Offered::default();
    let client = client(policy.extra_ca.as_deref(), gate.addr, idle, offered.clone())?;

    progress(&format!("resolving {reference}"));
    // The manifest and the config are small (a few KiB; at most 4 MiB each): their answers,
    // the token's and any list's before them, must all come within a few idle timeouts, so
    // a registry trickling them cannot hold the pull (the layers have their own bound).
    let resolving = client.pull_manifest_and_config_and_list_digest(&parsed, &auth);
    let bound = idle * RESOLVE_WINDOWS;
    let (manifest, manifest_digest, config_text, list_digest) =
        match tokio::time::timeout(bound, resolving).await {
            Ok(answer) => answer.map_err(|err| {
                if is_unknown_image(&err) && !gate.refused_any() {
                    return unknown_image(&registry, reference);
                }
                if let oci_client::errors::OciDistributionError::ImageManifestNotFoundError(_) =
                    &err
                {
                    return no_amd64(reference, &offered.platforms());
                }
                let mut error = gate.explain(&registry, &client_error(&err, idle));
                if let (Some(note), true) = (&helper_note, is_auth_refusal(&error.message)) {
                    error.message.push_str(note);
                }
                error
            })?,
            Err(_) => {
                return Err(gate.explain(
                    &registry,
                    &format!(
                        "the registry took more than {} s to send the image's manifest and \
                         config, so the pull gave up on it ({IDLE_TIMEOUT_ENV}, now {} s, \
                         bounds this at {RESOLVE_WINDOWS} times its value)",
                        bound.as_secs(),
                        idle.as_secs()
                    ),
                ))
            }
        };
    let manifest_digest = Digest::parse(&manifest_digest)?;
    if let Some(wanted) = parsed.digest() {
        // A digest reference names the manifest or the list it was picked from.
        let named = Some(wanted) == list_digest.as_deref()
            || wanted == manifest_digest.to_string().as_str();
        if !named {
            return Err(Error::invalid(format!(
                "the registry answered {reference} with manifest {manifest_digest}, which is \
                 not the digest asked for"
            )));
        }
    }
    if config_text.len() as u64 > oci::MAX_JSON_BYTES {
        return Err(Error::invalid("the image's config is larger than 4 MiB"));
    }
    let config_digest = Digest::parse(&manifest.config.digest)?;
    let actual = hex(&Sha256::digest(config_text.as_bytes()));
    if actual != config_digest.hex {
        return Err(Error::invalid(format!(
            "the image's config does not match its digest {config_digest}"
        )));
    }
    let config: oci::ImageConfig = oci::parse_json(config_text.as_bytes(), "config")?;
    config.check_platform(&oci::printable(reference))?;
    let diff_ids = super::import::diff_ids(&config, manifest.layers.len())?;

    let id = hex(&Sha256::digest(
        format!("dynocap-pull {PULL_REVISION}\nname {name}\nconfig {config_digest}\n").as_bytes(),
    ));
    if let Some(image) = images.get(&name, &id) {
        return Ok(Pulled {
            image,
            present: true,
            stats: Stats::default(),
            transfer: Transfer::default(),
        });
    }
    let layer_store = LayerStore::in_images_dir(images.dir());
    let _shared = layer_store.lock_shared()?;
    sweep_dead_partials(&layer_store.blobs_dir());
    layer_store.sweep_dead_unpacks();
    let mut transfer = Transfer::default();
    // Each layer's slot is `None` until it finished: on an error, those that did are there to
    // install all the same.
    let mut fetched: Vec<Option<Fetched>> = manifest.layers.iter().map(|_| None).collect();
    let outcome = fetch_layers(
        &client,
        &parsed,
        &manifest.layers,
        &diff_ids,
        &layer_store,
        limits,
        idle,
        downloads.handle(),
        &mut transfer,
        progress,
        cancel,
        &mut fetched,
    )
    .await;
    if let Err(err) = outcome {
        // The layers finished go in all the same, so the next pull starts from them.
        let finished: Vec<Fetched> = fetched.into_iter().flatten().collect();
        let store = layer_store.clone();
        match tokio::task::spawn_blocking(move || install_layers(&store, finished)).await {
            Ok(Ok(_)) => {}
            Ok(Err(kept)) => tracing::warn!("keeping the finished layers of a failed pull: {kept}"),
            Err(kept) => tracing::warn!("keeping the finished layers of a failed pull: {kept}"),
        }
        return Err(gate.wrap(&registry, err));
    }
    let fetched = fetched
        .into_iter()
        .map(|l| l.ok_or_else(|| Error::internal("a layer went missing")))
        .collect::<Result<Vec<Fetched>>>()?;

    let store_dir = images.dir().to_owned();
    let images = images.clone();
    let meta_source = ImageSource {
        format: ImageSource::REGISTRY.into(),
        path: reference.to_owned(),
        manifest_digest: Some(manifest_digest.to_string()),
        config_digest: config_digest.to_string(),
    };
    let image_config = config.config;
    let cancelled = cancel.load(Ordering::SeqCst);
    let (image, stats) = tokio::task::spawn_blocking(move || {
        if cancelled {
            install_layers(&LayerStore::in_images_dir(&store_dir), fetched)?;
            return Err(Error::conflict(
                "the pull was stopped; no image was made (the next pull starts from its layers)",
            ));
        }
        install(
            &images,
            &store_dir,
            &name,
            &id,
            fetched,
            limits,
            meta_source,
            image_config,
        )
    })
    .await
    .map_err(|err| Error::internal(format!("the pull's install thread failed: {err}")))??;
    Ok(Pulled {
        image,
        present: false,
        stats,
        transfer,
    })
}

/// A layer of the image as its download left it, and the blob it came from (none for a
/// layer the store had): kept while the layer is only staged, as what a pull stopped before
/// the install resumes from.
struct Fetched {
    unpacked: Unpacked,
    blob: Option<PathBuf>,
}

/// The layers where they are now (bottom first) and those of them still to install. The
/// staged layers' blobs are removed: their layers are about to be synced, and a blob removed
/// first has its pages dropped rather than written to the disk by that sync.
fn release_blobs(fetched: Vec<Fetched>) -> (Vec<Layer>, Vec<StagedLayer>) {
    let mut layers = Vec::with_capacity(fetched.len());
    let mut staged = Vec::new();
    for Fetched { unpacked, blob } in fetched {
        layers.push(unpacked.layer());
        if let Unpacked::Staged(layer) = unpacked {
            if let Some(blob) = blob {
                let _ = std::fs::remove_file(blob);
            }
            staged.push(layer);
        }
    }
    (layers, staged)
}

/// Installs the staged layers of `fetched` (one sync for all) without making an image.
fn install_layers(store: &LayerStore, fetched: Vec<Fetched>) -> Result<Vec<Layer>> {
    let (_, staged) = release_blobs(fetched);
    store.install(staged)
}

/// An image assembled from staged and stored layers, its files and theirs synced, not yet
/// renamed into place; or the image, when the store had it already.
enum Assembled {
    Present(Box<BuiltImage>),
    Built {
        staging: Staging,
        stats: Stats,
        _lock: BuildLock,
    },
}

/// Assembles the rootfs from the fetched layers and installs the layers and the image after
/// one `syncfs` for all of them: the layers by their renames into the store, the image by one
/// rename, each made durable by an fsync of its directory.
#[allow(clippy::too_many_arguments)]
fn install(
    images: &ImageStore,
    store_dir: &Path,
    name: &str,
    id: &str,
    fetched: Vec<Fetched>,
    limits: Limits,
    source: ImageSource,
    config: Option<oci::ContainerConfig>,
) -> Result<(BuiltImage, Stats)> {
    let layer_store = LayerStore::in_images_dir(store_dir);
    let (layers, staged) = release_blobs(fetched);
    let assembled = assemble(
        images,
        &layer_store,
        name,
        id,
        &layers,
        limits,
        source,
        config,
    );
    // The layers go in whatever became of the image, so the next pull starts from them:
    // with the image's sync when it was assembled, else with one of their own.
    let installed = match &assembled {
        Ok(Assembled::Built { .. }) => layer_store.install_synced(staged),
        _ => layer_store.install(staged),
    };
    let assembled = assembled?;
    installed?;
    let (staging, stats) = match assembled {
        Assembled::Present(image) => return Ok((*image, Stats::default())),
        Assembled::Built {
            staging,
            stats,
            _lock,
        } => (staging, stats),
    };
    let target = images.image_dir(name, id);
    // `image.pull.install=kill`: dies with every layer stored and the image assembled.
    failpoint::hit("image.pull.install")?;
    staging.install_synced(&target)?;
    let image = images
        .get(name, id)
        .ok_or(ImageFailure::Unreadable { dir: target })?;
    Ok((image, stats))
}

/// Makes the image of `layers` (bottom first; staged ones are assembled from where they are
/// staged: the rootfs hard-links their files, and the links follow the inodes through the
/// renames that install them) in a staging directory, then syncs the filesystem once for it
/// and every staged layer. Holds the name's build lock until the image is installed.
#[allow(clippy::too_many_arguments)]
fn assemble(
    images: &ImageStore,
    layer_store: &LayerStore,
    name: &str,
    id: &str,
    layers: &[Layer],
    limits: Limits,
    source: ImageSource,
    config: Option<oci::ContainerConfig>,
) -> Result<Assembled> {
    let mut budget = Budget::new(limits);
    for layer in layers {
        budget.add(layer)?;
    }
    let parent = images.name_dir(name);
    let lock = BuildLock::take(&parent, &|_| {})?;
    if let Some(image) = images.get(name, id) {
        return Ok(Assembled::Present(Box::new(image)));
    }
    remove_dead_builds(&parent)?;
    let staging = Staging::new(&parent)?;
    let rootfs = staging.path.join("rootfs");
    std::fs::create_dir(&rootfs).with_context(|| format!("creating {}", rootfs.display()))?;
    let meta = ImageMeta::layered(name, id, source, config);
    assemble_image(layer_store, layers, &staging.path, limits, meta)?;
    // The pull's one wait for the disk: the image's files and directories and every layer
    // staged for it (see `Staging::install` for why before the renames).
    sync_filesystem(&staging.path)?;
    Ok(Assembled::Built {
        staging,
        stats: budget.stats,
        _lock: lock,
    })
}

/// Downloads the blobs of the layers the store lacks (a few at once) and unpacks each (staged)
/// as they come, into `found` (bottom first; a layer that did not finish stays `None`).
/// Returns how the downloads ended: on an error, the layers that finished are in `found` to
/// install all the same.
#[allow(clippy::too_many_arguments)]
async fn fetch_layers(
    client: &Client,
    reference: &Reference,
    descriptors: &[OciDescriptor],
    diff_ids: &[Digest],
    store: &LayerStore,
    limits: Limits,
    idle: Duration,
    downloads: &tokio::runtime::Handle,
    transfer: &mut Transfer,
    progress: &(dyn Fn(&str) + Sync),
    cancel: &AtomicBool,
    found: &mut [Option<Fetched>],
) -> Result<()> {
    let total = descriptors.len();
    let mut tasks = tokio::task::JoinSet::new();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(PARALLEL_DOWNLOADS));
    let stopped = Arc::new(AtomicBool::new(false));
    for (n, (descriptor, diff_id)) in descriptors.iter().zip(diff_ids).enumerate() {
        if let Some(layer) = store.get(diff_id) {
            // A blob left by a pull stopped between installing its layer and removing it.
            if let Ok(digest) = Digest::parse(&descriptor.digest) {
                let _ = std::fs::remove_file(store.blob_path(&digest));
            }
            transfer.layers_present += 1;
            progress(&format!(
                "layer {}/{total}: {diff_id} already stored",
                n + 1
            ));
            found[n] = Some(Fetched {
                unpacked: Unpacked::Stored(layer),
                blob: None,
            });
            continue;
        }
        let digest = Digest::parse(&descriptor.digest)?;
        let size = u64::try_from(descriptor.size).map_err(|_| {
            Error::invalid(format!(
                "layer {digest} has a negative size in its manifest"
            ))
        })?;
        if size > limits.max_bytes {
            return Err(Error::invalid(format!(
                "layer {digest} is {size} bytes, more than the {} an image may be (--max-bytes)",
                limits.max_bytes
            )));
        }
        let job = LayerJob {
            n,
            client: client.clone(),
            reference: reference.clone(),
            descriptor: descriptor.clone(),
            digest,
            size,
            diff_id: diff_id.clone(),
            store: store.clone(),
            limits,
            idle,
            registry: reference.resolve_registry().to_owned(),
            semaphore: Arc::clone(&semaphore),
            stopped: Arc::clone(&stopped),
        };
        tasks.spawn_on(job.run(), downloads);
    }
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        if cancel.load(Ordering::SeqCst) {
            stopped.store(true, Ordering::SeqCst);
        }
        match joined {
            Ok(Ok((n, fetched, resumed, bytes))) => {
                if resumed {
                    transfer.blobs_resumed += 1;
                } else {
                    transfer.blobs_downloaded += 1;
                    transfer.bytes_downloaded += bytes;
                }
                progress(&format!(
                    "layer {}/{total}: {} {}",
                    n + 1,
                    fetched.unpacked.diff_id(),
                    if resumed {
                        "unpacked (downloaded before)"
                    } else {
                        "downloaded and unpacked"
                    }
                ));
                found[n] = Some(fetched);
            }
            Ok(Err(err)) => {
                stopped.store(true, Ordering::SeqCst);
                first_error.get_or_insert(err);
            }
            Err(err) => {
                stopped.store(true, Ordering::SeqCst);
                first_error.get_or_insert(Error::internal(format!("a download failed: {err}")));
            }
        }
    }
    if cancel.load(Ordering::SeqCst) {
        return Err(Error::conflict(
            "the pull was stopped; no image was made (the next pull resumes from what was \
             downloaded)",
        ));
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// One layer's download and unpacking.
struct LayerJob {
    n: usize,
    client: Client,
    reference: Reference,
    descriptor: OciDescriptor,
    digest: Digest,
    size: u64,
    diff_id: Digest,
    store: LayerStore,
    limits: Limits,
    idle: Duration,
    registry: String,
    semaphore: Arc<tokio::sync::Semaphore>,
    stopped: Arc<AtomicBool>,
}

impl LayerJob {
    /// (index, layer, resumed from a stored blob, bytes downloaded).
    async fn run(self) -> Result<(usize, Fetched, bool, u64)> {
        let blob = self.store.blob_path(&self.digest);
        if !blob.is_file() {
            let _permit = self
                .semaphore
                .acquire()
                .await
                .map_err(|_| Error::internal("the download queue closed"))?;
            if self.stopped.load(Ordering::SeqCst) {
                return Err(Error::conflict("the pull was stopped"));
            }
            let idle = self.idle;
            let explain = move |err: &(dyn std::error::Error + 'static)| client_error(err, idle);
            let (unpacked, bytes) = stream::Fetch {
                n: self.n,
                client: &self.client,
                reference: &self.reference,
                descriptor: &self.descriptor,
                digest: &self.digest,
                size: self.size,
                diff_id: &self.diff_id,
                store: &self.store,
                limits: self.limits,
                stopped: &self.stopped,
                registry: &self.registry,
                idle,
                explain: &explain,
            }
            .run()
            .await?;
            return Ok((
                self.n,
                Fetched {
                    unpacked,
                    blob: Some(blob),
                },
                false,
                bytes,
            ));
        }
        // A blob a stopped pull downloaded whole: unpacked from its file.
        failpoint::hit(&format!("image.pull.layer{}", self.n + 1))?;
        let stopped = Arc::clone(&self.stopped);
        let (store, diff_id, media_type, limits) = (
            self.store.clone(),
            self.diff_id.clone(),
            self.descriptor.media_type.clone(),
            self.limits,
        );
        let blob_path = blob.clone();
        let unpacked = tokio::task::spawn_blocking(move || -> Result<Unpacked> {
            let file = std::fs::File::open(&blob_path)
                .with_context(|| format!("opening {}", blob_path.display()))?;
            let stop = || -> Result<()> {
                if stopped.load(Ordering::SeqCst) {
                    Err(Error::conflict("the pull was stopped"))
                } else {
                    Ok(())
                }
            };
            match stage_blob(file, &media_type, &diff_id, &store, limits, &stop) {
                // The blob stays until the pull installs the layer (see `release_blobs`).
                Ok(unpacked @ Unpacked::Staged(_)) => Ok(unpacked),
                Ok(stored) => {
                    let _ = std::fs::remove_file(&blob_path);
                    Ok(stored)
                }
                Err(err) => {
                    // A blob that would not unpack (not a stop): the next pull downloads it
                    // anew, whatever was wrong with it.
                    if !stopped.load(Ordering::SeqCst) {
                        let _ = std::fs::remove_file(&blob_path);
                    }
                    Err(err)
                }
            }
        })
        .await
        .map_err(|err| Error::internal(format!("unpacking a layer failed: {err}")))??;
        Ok((
            self.n,
            Fetched {
                unpacked,
                blob: Some(blob),
            },
            true,
            0,
        ))
    }
}

/// Removes the `.partial-<hex>-<pid>-*` downloads of pulls that died (their pid is gone):
/// a download never resumes from a partial file, only from a whole, checked blob.
fn sweep_dead_partials(blobs: &Path) {
    let Ok(entries) = std::fs::read_dir(blobs) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(".partial-") else {
            continue;
        };
        let pid = rest.split('-').nth(1).and_then(|p| p.parse::<i32>().ok());
        let alive = pid.is_some_and(|pid| {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
        });
        if !alive {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses a reference that names its registry: `registry.example[:port]/repo[:tag][@sha256:…]`.
pub fn parse_reference(text: &str) -> Result<Reference> {
    if !store::is_reference(text) {
        return Err(Error::invalid(format!(
            "\"{}\" is not an image reference DynoCap pulls: {}",
            oci::printable(text),
            unfit_reference(text)
        )));
    }
    text.parse::<Reference>().map_err(|err| {
        Error::invalid(format!(
            "\"{}\" is not an image reference: {err}",
            oci::printable(text)
        ))
    })
}

/// What is wrong with `text`, which [`store::is_reference`] refused, said as what to write
/// instead: Docker's short forms (`alpine:3`, `team/tool:1`) name no registry, a reference
/// without a tag does not mean `:latest` here, and names are lowercase.
fn unfit_reference(text: &str) -> String {
    const FORM: &str = "give the registry, the repository and a tag or digest, e.g. \
                        registry.example/team/tool:1 or docker.io/library/alpine:3";
    let (rest, digest) = match text.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (text, None),
    };
    if digest.is_some_and(|d| Digest::parse(d).is_err()) {
        return format!("its digest is not sha256: and 64 lowercase hex digits; {FORM}");
    }
    let Some((first, path)) = rest.split_once('/') else {
        return short_form(text);
    };
    // Docker's rule for the first component naming a registry: a `.`, a port, or localhost.
    let names_registry = first.contains(['.', ':']) || first.eq_ignore_ascii_case("localhost");
    if !names_registry {
        return short_form(text);
    }
    if first.bytes().any(|b| b.is_ascii_uppercase()) {
        return format!(
            "write the registry's host in lowercase ({})",
            oci::printable(&first.to_ascii_lowercase())
        );
    }
    let last = path.rsplit('/').next().unwrap_or(path);
    let (repo, tag) = match path.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag)),
        _ => (path, None),
    };
    if repo.bytes().any(|b| b.is_ascii_uppercase()) {
        return format!(
            "repository names are lowercase ({}/{})",
            oci::printable(first),
            oci::printable(&repo.to_ascii_lowercase())
        );
    }
    if tag.is_none() && digest.is_none() && !last.is_empty() {
        return format!(
            "it has no tag or digest, and DynoCap does not assume :latest; write the one \
             meant, e.g. {}:latest",
            oci::printable(text)
        );
    }
    FORM.to_owned()
}

/// The words for a Docker Hub short form (`alpine:3`, `team/tool:1`): the reference written
/// out.
fn short_form(text: &str) -> String {
    let full = if text.contains('/') {
        format!("docker.io/{text}")
    } else {
        format!("docker.io/library/{text}")
    };
    format!(
        "it names no registry, and DynoCap pulls only references that write theirs out (no \
         default registry): for Docker Hub that is {} (with index.docker.io, auth.docker.io \
         and the host its blobs come from in {REGISTRIES_ENV})",
        oci::printable(&full)
    )
}

fn host_port(registry: &str) -> (String, u16) {
    match registry.rsplit_once(':') {
        Some((host, port)) if !host.contains(']') || host.ends_with(']') => {
            match port.parse::<u16>() {
                Ok(port) => (host.trim_matches(['[', ']']).to_owned(), port),
                Err(_) => (registry.to_owned(), 443),
            }
        }
        _ => (registry.to_owned(), 443),
    }
}

/// The registries a pull may connect to: host patterns, each on port 443 or the port its
/// entry names (`registry.test:5000`).
#[derive(Debug, Clone)]
struct Registries {
    entries: Vec<(HostPattern, u16)>,
}

impl Registries {
    /// Whether `host` (any case) on `port` is listed.
    fn allows(&self, host: &str, port: u16) -> Option<()> {
        let host = normalize_host(host).ok()?;
        self.entries
            .iter()
            .any(|(pattern, p)| *p == port && pattern.matches(&host))
            .then_some(())
    }
}

fn allowed_registries(value: Option<&str>) -> Result<Registries> {
    let mut entries = Vec::new();
    for entry in value.unwrap_or("").split(',').map(str::trim) {
        if entry.is_empty() {
            continue;
        }
        let (host, port) = match entry.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => {
                let port = port.parse::<u16>().ok().filter(|p| *p != 0);
                (host, port)
            }
            _ => (entry, Some(443)),
        };
        let bad = |why: String| {
            Error::invalid(format!(
                "{REGISTRIES_ENV}: entry \"{}\": {why}; list registry hosts (with :port when \
                 not 443) separated by commas, e.g. {REGISTRIES_ENV}=registry.example,ghcr.io",
                oci::printable(entry)
            ))
        };
        let port = port.ok_or_else(|| bad("the port is not a number from 1 to 65535".into()))?;
        let pattern = HostPattern::parse(host).map_err(|err| bad(err.to_string()))?;
        entries.push((pattern, port));
    }
    Ok(Registries { entries })
}

fn not_allowed(registry: &str, value: Option<&str>) -> Error {
    let now = match value.map(str::trim).filter(|v| !v.is_empty()) {
        Some(list) => format!("it allows {list}"),
        None => "it is unset, so no registry is allowed".to_owned(),
    };
    Error::invalid(format!(
        "registry {} is not in {REGISTRIES_ENV} ({now}); the host must add it to pull from it",
        oci::printable(registry)
    ))
}

/// Credentials for `registry` from a Docker config file's `auths` (`auth`: base64 of
/// `user:password`), or anonymous. Credential helpers are not run.
fn docker_config_auth(path: Option<&Path>, registry: &str) -> Result<ConfigAuth> {
    let anonymous = |helper_note| ConfigAuth {
        auth: RegistryAuth::Anonymous,
        helper_note,
    };
    let Some(path) = path else {
        return Ok(anonymous(None));
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(anonymous(None)),
        Err(err) => {
            return Err(Error::invalid(format!(
                "reading the Docker config {}: {err}; a pull reads it for the registry's \
                 credentials: make it readable, set DOCKER_CONFIG to another directory, or \
                 give --username and --password-stdin (then it is not read)",
                path.display()
            )))
        }
    };
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct DockerConfig {
        // Sorted, so that of several keys naming one registry the same is used every time.
        #[serde(default)]
        auths: std::collections::BTreeMap<String, AuthEntry>,
        #[serde(default)]
        creds_store: Option<String>,
        #[serde(default)]
        cred_helpers: std::collections::BTreeMap<String, String>,
    }
    #[derive(serde::Deserialize)]
    struct AuthEntry {
        #[serde(default)]
        auth: Option<String>,
        // What `docker login` writes as `auth`, some tools write as these two.
        #[serde(default)]
        username: Option<String>,
        #[serde(default)]
        password: Option<String>,
        // `docker login` with an OAuth token (Azure, some SSO setups): a refresh token for
        // the registry's token service, which DynoCap does not exchange.
        #[serde(default)]
        identitytoken: Option<String>,
    }
    let config: DockerConfig = serde_json::from_str(&text).map_err(|err| {
        Error::invalid(format!(
            "the Docker config {} is not valid: {err}; a pull reads it for the registry's \
             credentials: correct it, set DOCKER_CONFIG to the directory of a valid \
             config.json, or give --username and --password-stdin (then it is not read)",
            path.display()
        ))
    })?;
    let wanted = |key: &str| {
        let key = key
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        let key = key.split('/').next().unwrap_or(key);
        key == registry
            || (registry == "index.docker.io"
                && matches!(key, "docker.io" | "registry-1.docker.io"))
    };
    let helper = config
        .cred_helpers
        .iter()
        .find(|(k, _)| wanted(k))
        .map(|(_, helper)| helper)
        .or(config.creds_store.as_ref());
    let helper_note = helper.map(|helper| {
        format!(
            " (the Docker config {} keeps credentials in the credential helper \
             docker-credential-{}, which DynoCap does not run: give them with --username and \
             --password-stdin)",
            path.display(),
            oci::printable(helper)
        )
    });
    // The key written as the registry itself first, as Docker looks it up.
    let entry = config
        .auths
        .get(registry)
        .or_else(|| config.auths.iter().find(|(k, _)| wanted(k)).map(|(_, v)| v));
    let Some(entry) = entry else {
        return Ok(anonymous(helper_note));
    };
    if entry
        .identitytoken
        .as_deref()
        .is_some_and(|t| !t.is_empty())
    {
        return Ok(anonymous(Some(format!(
            " (the Docker config {} holds an identity token for {registry}, from a login \
             with an OAuth token, which DynoCap does not exchange: give a user and password \
             or access token with --username and --password-stdin)",
            path.display()
        ))));
    }
    // Docker reads an empty `auth` as no credentials (`docker logout` can leave one).
    let Some(auth) = entry.auth.as_ref().filter(|a| !a.trim().is_empty()) else {
        return Ok(match (&entry.username, &entry.password) {
            (Some(user), Some(password)) => ConfigAuth {
                auth: RegistryAuth::Basic(user.clone(), password.clone()),
                helper_note: None,
            },
            _ => anonymous(helper_note),
        });
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| {
            Error::invalid(format!(
                "the Docker config {} has an auth for {registry} that is not base64 of user:password",
                path.display()
            ))
        })?;
    let (user, password) = decoded.split_once(':').ok_or_else(|| {
        Error::invalid(format!(
            "the Docker config {} has an auth for {registry} without a ':'",
            path.display()
        ))
    })?;
    Ok(ConfigAuth {
        auth: RegistryAuth::Basic(user.to_owned(), password.to_owned()),
        helper_note: None,
    })
}

/// What the Docker config gives a registry: its credentials (else anonymous), and, when it
/// keeps them in a credential helper instead, a note saying so for a refused pull.
struct ConfigAuth {
    auth: RegistryAuth,
    helper_note: Option<String>,
}

/// `DYNOCAP_PULL_IDLE_TIMEOUT`: whole seconds from 1 to a day (unset or blank: 60).
fn idle_timeout(value: Option<&str>) -> Result<Duration> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(DEFAULT_IDLE_TIMEOUT);
    };
    match value.parse::<u64>() {
        Ok(secs) if (1..=86_400).contains(&secs) => Ok(Duration::from_secs(secs)),
        _ => Err(Error::invalid(format!(
            "{IDLE_TIMEOUT_ENV}={} is not valid; give whole seconds from 1 to 86400 (default \
             {}): how long a registry may send nothing before a pull gives up on it",
            oci::printable(value),
            DEFAULT_IDLE_TIMEOUT.as_secs()
        ))),
    }
}

/// The client's error in words: its own and its causes' (the client keeps why a request
/// failed, a refused connection or a timeout, in the error's sources, not in its message),
/// and a registry that stopped sending said as such. The words "timed out" are how reqwest's
/// timeout (its own error type, not one this crate can name) and the system's read as text.
fn client_error(err: &(dyn std::error::Error + 'static), idle: Duration) -> String {
    let mut parts = vec![err.to_string()];
    let mut timed_out = false;
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        let io_timeout = cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::TimedOut);
        timed_out |= io_timeout || text.contains("timed out");
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    let said = parts.join(": ");
    if timed_out {
        format!(
            "the registry sent nothing for {} s, so the pull gave up on it ({IDLE_TIMEOUT_ENV} \
             sets how long a pull waits): {said}",
            idle.as_secs()
        )
    } else {
        said
    }
}

fn client(
    extra_ca: Option<&Path>,
    gate: SocketAddr,
    idle: Duration,
    offered: Offered,
) -> Result<Client> {
    // reqwest is built without a default crypto provider (no aws-lc C build): ring's.
    // Deprecated only for lacking post-quantum key exchange, which a pull (public image
    // bytes, checked against their digests) does not need.
    #[allow(deprecated)]
    let provider = rustls::crypto::ring::default_provider();
    let _ = provider.install_default();
    let mut extra = Vec::new();
    if let Some(path) = extra_ca.filter(|p| !p.as_os_str().is_empty()) {
        let pem = std::fs::read(path)
            .map_err(|err| Error::invalid(format!("DYNOCAP_EXTRA_CA {}: {err}", path.display())))?;
        extra.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data: pem,
        });
    }
    let config = ClientConfig {
        protocol: ClientProtocol::Https,
        extra_root_certificates: extra,
        platform_resolver: Some(Box::new(move |entries| offered.resolve(entries))),
        // Both bound a stall: the connection's (its TCP, the gate's tunnel and the TLS
        // handshake) as a whole, and each read of an answer, the blobs' bodies too.
        connect_timeout: Some(idle),
        read_timeout: Some(idle),
        https_proxy: Some(format!("http://{gate}")),
        // Plain-HTTP requests too (a redirect, or a layer's `urls`, to an http:// address):
        // without this they would go out directly, past the gate and its list.
        http_proxy: Some(format!("http://{gate}")),
        max_concurrent_download: PARALLEL_DOWNLOADS,
        ..ClientConfig::default()
    };
    Client::try_from(config)
        .map_err(|err| Error::internal(format!("making the registry client: {err}")))
}

/// Threads of the pull's own (a runtime with a worker per core, up to 4) for the layers'
/// downloads and the gate's tunnels. The command's runtime may have one thread (the CLI's
/// does), on which the TLS, the digest checks and the tunnels' copying of every blob at
/// once would queue behind each other while the other cores idle.
struct Downloads {
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl Downloads {
    fn start() -> Result<Downloads> {
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name("dynocap-pull")
            .enable_all()
            .build()
            .context("starting the pull's download threads")?;
        Ok(Downloads {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        })
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl Drop for Downloads {
    fn drop(&mut self) {
        // Not waited for: this may run on an async thread, where blocking is not allowed.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A CONNECT proxy on loopback through which the pull's client makes every connection: it
/// allows only the registries the host listed and resolves with `DYNOCAP_RESOLVE` first, so
/// a token realm or a blob redirect to another host is held to the same list.
struct RegistryGate {
    addr: SocketAddr,
    refused: Arc<Mutex<Vec<String>>>,
    /// Allowed hosts the gate could not connect to, each with why (a name that does not
    /// resolve, a refused connection): the client only sees a failed CONNECT.
    unreachable: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RegistryGate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RegistryGate {
    /// Listens on loopback; the gate and its tunnels run on `runtime`.
    fn start(
        policy: Registries,
        overrides: ResolveOverrides,
        runtime: &tokio::runtime::Handle,
    ) -> Result<RegistryGate> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .context("listening on loopback for the pull's connections")?;
        listener
            .set_nonblocking(true)
            .context("listening on loopback for the pull's connections")?;
        let addr = listener
            .local_addr()
            .context("reading the gate's address")?;
        let refused = Arc::new(Mutex::new(Vec::new()));
        let unreachable = Arc::new(Mutex::new(Vec::new()));
        let shared = Arc::new((
            policy,
            overrides,
            Arc::clone(&refused),
            Arc::clone(&unreachable),
        ));
        let task = runtime.spawn(async move {
            let listener = match TcpListener::from_std(listener) {
                Ok(listener) => listener,
                Err(err) => {
                    tracing::warn!("pull gate: {err}");
                    return;
                }
            };
            // The tunnels are this task's: when the gate is dropped (its pull ended), one to a
            // registry that stopped answering goes with it instead of waiting on it forever.
            let mut tunnels = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                while tunnels.try_join_next().is_some() {}
                let shared = Arc::clone(&shared);
                tunnels.spawn(async move {
                    let (policy, overrides, refused, unreachable) = &*shared;
                    let log = GateLog {
                        refused,
                        unreachable,
                    };
                    if let Err(err) = serve_connect(stream, policy, overrides, log).await {
                        tracing::debug!("pull gate: {err}");
                    }
                });
            }
        });
        Ok(RegistryGate {
            addr,
            refused,
            unreachable,
            task,
        })
    }

    /// Whether the gate refused any host this pull tried to reach.
    fn refused_any(&self) -> bool {
        self.refused.lock().map(|r| !r.is_empty()).unwrap_or(false)
    }

    /// An error of a download: the refused or unreachable hosts added when there were any.
    fn wrap(&self, registry: &str, err: Error) -> Error {
        let refused = self.refused.lock().map(|r| !r.is_empty()).unwrap_or(false);
        let unreachable = self
            .unreachable
            .lock()
            .map(|r| !r.is_empty())
            .unwrap_or(false);
        if refused || unreachable {
            self.explain(registry, &err.message)
        } else {
            err
        }
    }

    /// An error of the client's, with the hosts the gate refused (the client only sees a
    /// refused CONNECT).
    fn explain(&self, registry: &str, message: &str) -> Error {
        let refused = self.refused.lock().map(|r| r.clone()).unwrap_or_default();
        let message = redact(message);
        if refused.is_empty() {
            let unreachable = self
                .unreachable
                .lock()
                .map(|r| r.clone())
                .unwrap_or_default();
            let hint = if !unreachable.is_empty() {
                format!(
                    "; the pull could not connect to {}: check that the name resolves on this \
                     host (or give its address in {RESOLVE_ENV}, as host:port:address) and that \
                     the registry is up",
                    unreachable.join(", ")
                )
            } else if is_auth_refusal(&message) {
                format!(
                    "; the registry {registry} refused the credentials (or asked for some): give \
                     --username and --password-stdin, or log in in the Docker config file"
                )
            } else if is_certificate_refusal(&message) {
                format!(
                    "; the registry's TLS certificate is not one this host trusts for \
                     {registry} (the system's CAs, plus {EXTRA_CA_ENV}): for a registry with a \
                     CA of its own, set {EXTRA_CA_ENV} to that CA's certificate (PEM)"
                )
            } else {
                String::new()
            };
            Error::invalid(format!("pulling from {registry}: {message}{hint}"))
        } else {
            let (plain, listed): (Vec<String>, Vec<String>) = refused
                .into_iter()
                .partition(|host| host.starts_with("http://") || host.starts_with("a plain"));
            if !plain.is_empty() {
                return Error::invalid(format!(
                    "pulling from {registry}: the registry sent the pull to {}, over plain \
                     HTTP, which a pull never uses (only HTTPS to the hosts in \
                     {REGISTRIES_ENV}); the registry or the image is at fault ({message})",
                    plain.join(", ")
                ));
            }
            Error::invalid(format!(
                "pulling from {registry}: the pull needed {}, not in {REGISTRIES_ENV}; the host \
                 must add it ({message})",
                listed.join(", ")
            ))
        }
    }
}

/// Whether the registry answered that it has no such repository, tag or digest.
fn is_unknown_image(err: &oci_client::errors::OciDistributionError) -> bool {
    use oci_client::errors::{OciDistributionError as E, OciErrorCode as C};
    match err {
        E::RegistryError { envelope, .. } => envelope
            .errors
            .iter()
            .any(|e| matches!(e.code, C::ManifestUnknown | C::NameUnknown)),
        _ => false,
    }
}

/// The error for a reference the registry does not have: `not_found`, saying what to check.
fn unknown_image(registry: &str, reference: &str) -> Error {
    Error::not_found(format!(
        "the registry {registry} has no image {} (it answered that the repository, tag or \
         digest is unknown): check the reference's repository and tag or digest (`skopeo \
         list-tags docker://REPOSITORY` lists a repository's tags)",
        oci::printable(reference)
    ))
}

/// The error for a manifest list without a linux/amd64 image: the platforms it has, as the
/// list named them (`offered`, empty when the list's linux/amd64 entry was itself a list).
fn no_amd64(reference: &str, offered: &[String]) -> Error {
    let reference = oci::printable(reference);
    let amd64 = |p: &String| {
        p.strip_prefix(LINUX_AMD64)
            .is_some_and(|variant| variant.is_empty() || variant.starts_with('/'))
    };
    if offered.iter().any(amd64) {
        return Error::invalid(format!(
            "{reference} is a list whose linux/amd64 entry is another list, not an image; \
             DynoCap follows one level: use the digest of the amd64 image itself \
             (REPOSITORY@sha256:…)"
        ));
    }
    let listed = if offered.is_empty() {
        "none marked with a platform".to_owned()
    } else {
        offered.join(", ")
    };
    Error::invalid(format!(
        "{reference} lists images for other platforms only ({listed}), none for linux/amd64, \
         which DynoCap's sandboxes run: use a tag or digest of an amd64 image"
    ))
}

/// The platform a pull picks from a manifest list.
const LINUX_AMD64: &str = "linux/amd64";

/// The platforms of the manifest list a pull met (`os/architecture[/variant]`, in the list's
/// order, attestation entries' `unknown/unknown` left out), kept by the client's platform
/// resolver for the error of a list that has no linux/amd64 image.
#[derive(Clone, Default)]
struct Offered(Arc<Mutex<Vec<String>>>);

impl Offered {
    /// oci-client's `linux_amd64_resolver`, noting what the list offers.
    fn resolve(&self, entries: &[oci_client::manifest::ImageIndexEntry]) -> Option<String> {
        let mut platforms = Vec::new();
        for platform in entries.iter().filter_map(|e| e.platform.as_ref()) {
            let mut text = format!("{}/{}", platform.os, platform.architecture);
            if let Some(variant) = platform.variant.as_deref().filter(|v| !v.is_empty()) {
                text.push('/');
                text.push_str(variant);
            }
            let text = oci::printable(&text);
            if text != "unknown/unknown" && !platforms.contains(&text) {
                platforms.push(text);
            }
        }
        if let Ok(mut offered) = self.0.lock() {
            *offered = platforms;
        }
        oci_client::client::linux_amd64_resolver(entries)
    }

    fn platforms(&self) -> Vec<String> {
        self.0.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

/// The client's words for a registry refusing (or asking for) credentials.
fn is_auth_refusal(message: &str) -> bool {
    let lower = message.to_lowercase();
    lower.contains("401") || lower.contains("unauthorized") || lower.contains("not authorized")
}

/// The TLS client's words for a certificate it does not accept (an unknown issuer, another
/// name, expired).
fn is_certificate_refusal(message: &str) -> bool {
    message.contains("invalid peer certificate")
}

/// Nothing of a credential reaches a message: the client's errors may quote a request.
fn redact(message: &str) -> String {
    let cut: String = message.chars().take(600).collect();
    oci::printable(&cut)
}

/// Where the gate writes down the hosts it refused and those it could not reach.
struct GateLog<'a> {
    refused: &'a Mutex<Vec<String>>,
    unreachable: &'a Mutex<Vec<String>>,
}

/// Adds `entry` to `list` once.
fn note_once(list: &Mutex<Vec<String>>, entry: String) {
    if let Ok(mut list) = list.lock() {
        if !list.contains(&entry) {
            list.push(entry);
        }
    }
}

async fn serve_connect(
    mut client: TcpStream,
    policy: &Registries,
    overrides: &ResolveOverrides,
    log: GateLog<'_>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || client.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let Some(connect) = text.strip_prefix("CONNECT ") else {
        // A plain-HTTP request (the client sends those here too, so that none goes out
        // directly): a registry's redirect or a layer's `urls` to an http:// address, which
        // a pull never follows, whatever host it names. Only its origin is kept, for the
        // error: a redirect's query may carry a signature.
        let url = text.split_whitespace().nth(1).unwrap_or("");
        let origin = url
            .strip_prefix("http://")
            .and_then(|rest| rest.split(['/', '?', '#']).next())
            .map_or_else(
                || "a plain-HTTP address".to_owned(),
                |host| format!("http://{host}"),
            );
        note_once(log.refused, oci::printable(&origin));
        client
            .write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            .await?;
        return Ok(());
    };
    let target = connect.split_whitespace().next().unwrap_or("").to_owned();
    let (host, port) = host_port(&target);
    let host = host.to_ascii_lowercase();
    if target.is_empty() || policy.allows(&host, port).is_none() {
        note_once(log.refused, oci::printable(&target));
        client
            .write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            .await?;
        return Ok(());
    }
    let upstream = match overrides.lookup(&host, port) {
        Some(addrs) => TcpStream::connect(addrs).await,
        None => TcpStream::connect((host.as_str(), port)).await,
    };
    let mut upstream = match upstream {
        Ok(stream) => stream,
        Err(err) => {
            note_once(
                log.unreachable,
                format!("{} ({err})", oci::printable(&target)),
            );
            client
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                .await?;
            return Err(err);
        }
    };
    let _ = upstream.set_nodelay(true);
    client
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// Reads a password from `input` (its first line), for `--password-stdin`.
pub fn read_password(mut input: impl std::io::Read) -> Result<String> {
    use std::io::Read as _;
    let mut text = String::new();
    input
        .by_ref()
        .take(4096)
        .read_to_string(&mut text)
        .context("reading the password from standard input")?;
    let password = text.lines().next().unwrap_or("").to_owned();
    if password.is_empty() {
        return Err(Error::invalid("--password-stdin read no password"));
    }
    Ok(password)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registry_without_the_image_is_not_found_saying_what_to_check() {
        use oci_client::errors::{OciDistributionError, OciEnvelope, OciError, OciErrorCode};
        let answer = |code| OciDistributionError::RegistryError {
            envelope: OciEnvelope {
                errors: vec![OciError {
                    code,
                    message: String::new(),
                    detail: serde_json::Value::Null,
                }],
            },
            url: "https://registry.example/v2/team/tool/manifests/9".to_owned(),
        };
        assert!(is_unknown_image(&answer(OciErrorCode::ManifestUnknown)));
        assert!(is_unknown_image(&answer(OciErrorCode::NameUnknown)));
        assert!(!is_unknown_image(&answer(OciErrorCode::Unauthorized)));
        assert!(!is_unknown_image(&answer(OciErrorCode::Denied)));
        // A list without this platform is not an unknown image.
        let platform = OciDistributionError::ImageManifestNotFoundError("no entry".to_owned());
        assert!(!is_unknown_image(&platform));
        assert!(no_amd64("r.example/t:1", &[])
            .message
            .contains("none for linux/amd64"));
        let err = unknown_image("registry.example", "registry.example/team/tool:9");
        assert_eq!(err.code, crate::foundation::error::ErrorCode::NotFound);
        assert!(
            err.message
                .contains("has no image registry.example/team/tool:9")
                && err.message.contains("tag"),
            "{err}"
        );
    }

    #[test]
    fn references_name_their_registry() {
        let r = parse_reference("registry.example/team/tool:1").expect("ref");
        assert_eq!(r.registry(), "registry.example");
        assert_eq!(r.repository(), "team/tool");
        let r = parse_reference(&format!("127.0.0.5:5000/base@sha256:{}", "a".repeat(64)))
            .expect("digest ref");
        assert_eq!(r.registry(), "127.0.0.5:5000");
        assert!(parse_reference("127.0.0.5:5000/base@sha256:abc").is_err());
        // A host without a dot names a registry when it has a port, as Docker reads it (a
        // compose service `registry:5000`), and the variable can list it.
        let r = parse_reference("registry:5000/team/tool:1").expect("dotless host with a port");
        assert_eq!(r.registry(), "registry:5000");
        assert_eq!(r.repository(), "team/tool");
        let listed = allowed_registries(Some("registry:5000")).expect("list");
        assert!(listed.allows("registry", 5000).is_some());
        assert!(listed.allows("registry", 443).is_none());
        for bad in [
            "alpine",
            "alpine:3",
            "team/tool:1",
            "Registry.example/x:1",
            "r.example/../x:1",
        ] {
            assert!(parse_reference(bad).is_err(), "{bad}");
        }
        // Each mistake is told with what to write instead.
        let said = |text: &str| parse_reference(text).expect_err(text).message;
        for (text, needle) in [
            ("debian:12", "docker.io/library/debian:12"),
            ("debian", "docker.io/library/debian"),
            ("team/tool:1", "docker.io/team/tool:1"),
            (
                "registry.example:5000/team/tool",
                "registry.example:5000/team/tool:latest",
            ),
            (
                "registry.example/Team/Tool:1",
                "lowercase (registry.example/team/tool)",
            ),
            ("Registry.Example/x:1", "lowercase (registry.example)"),
            ("registry.example/x@sha256:abc", "64 lowercase hex digits"),
            (
                "registry.example/x:1:2",
                "e.g. registry.example/team/tool:1",
            ),
        ] {
            let message = said(text);
            assert!(message.contains(needle), "{text}: {message}");
        }
        assert_eq!(host_port("127.0.0.5:5000"), ("127.0.0.5".into(), 5000));
        assert_eq!(
            host_port("registry.example"),
            ("registry.example".into(), 443)
        );
    }

    #[test]
    fn registries_are_allowed_by_the_variable_only() {
        let none = allowed_registries(None).expect("policy");
        assert!(none.allows("registry.example", 443).is_none());
        let some =
            allowed_registries(Some("registry.example, registry.test:5000")).expect("policy");
        assert!(some.allows("registry.example", 443).is_some());
        assert!(some.allows("Registry.Example", 443).is_some());
        assert!(some.allows("registry.example", 5000).is_none());
        assert!(some.allows("registry.test", 5000).is_some());
        assert!(some.allows("registry.test", 443).is_none());
        assert!(some.allows("other.example", 443).is_none());
        for bad in ["127.0.0.5:5000", "registry.test:0", "https://r.example"] {
            let err = allowed_registries(Some(bad)).expect_err(bad);
            assert!(err.message.contains(REGISTRIES_ENV), "{err}");
        }
        let err = not_allowed("other.example", Some("registry.example"));
        assert!(err.message.contains(REGISTRIES_ENV), "{err}");
    }

    #[test]
    fn the_idle_timeout_is_whole_seconds() {
        assert_eq!(idle_timeout(None).expect("unset"), DEFAULT_IDLE_TIMEOUT);
        assert_eq!(
            idle_timeout(Some(" ")).expect("blank"),
            DEFAULT_IDLE_TIMEOUT
        );
        assert_eq!(idle_timeout(Some("5")).expect("5"), Duration::from_secs(5));
        for bad in ["0", "-1", "1.5", "ten", "86401"] {
            let err = idle_timeout(Some(bad)).expect_err(bad);
            assert!(err.message.contains(IDLE_TIMEOUT_ENV), "{err}");
        }
    }

    #[test]
    fn a_timeout_among_the_causes_is_said_as_a_stall() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error sending request")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let idle = Duration::from_secs(7);
        let stalled = Outer(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "deadline",
        ));
        let said = client_error(&stalled, idle);
        assert!(
            said.contains("sent nothing for 7 s") && said.contains(IDLE_TIMEOUT_ENV),
            "{said}"
        );
        assert!(said.ends_with("error sending request: deadline"), "{said}");
        let refused = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        assert_eq!(
            client_error(&refused, idle),
            "error sending request: connection refused"
        );
    }

    #[test]
    fn a_list_without_amd64_is_refused_naming_the_platforms_it_has() {
        let entry = |arch: &str, variant: Option<&str>| {
            serde_json::from_value::<oci_client::manifest::ImageIndexEntry>(serde_json::json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": format!("sha256:{}", arch.len().to_string().repeat(64)),
                "size": 1,
                "platform": {"os": if arch == "unknown" { "unknown" } else { "linux" },
                             "architecture": arch, "variant": variant},
            }))
            .expect("entry")
        };
        let offered = Offered::default();
        let list = [
            entry("arm64", Some("v8")),
            entry("arm", Some("v7")),
            entry("s390x", None),
            entry("unknown", None),
        ];
        assert_eq!(offered.resolve(&list), None);
        assert_eq!(
            offered.platforms(),
            ["linux/arm64/v8", "linux/arm/v7", "linux/s390x"],
            "an attestation's unknown/unknown is not a platform"
        );
        let err = no_amd64("r.example/t:1", &offered.platforms());
        assert!(
            err.message
                .contains("(linux/arm64/v8, linux/arm/v7, linux/s390x), none for linux/amd64"),
            "{err}"
        );
        // An amd64 entry (of any variant) is picked, as oci-client's own resolver picks it.
        let with_amd64 = [entry("arm64", None), entry("amd64", Some("v3"))];
        assert_eq!(
            offered.resolve(&with_amd64).as_deref(),
            Some(with_amd64[1].digest.as_str())
        );
        // Picked, but a list itself: said as such, not as a missing platform.
        let err = no_amd64("r.example/t:1", &offered.platforms());
        assert!(err.message.contains("another list"), "{err}");
    }

    #[test]
    fn docker_config_gives_basic_auth_for_its_registry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        std::fs::write(
            &path,
            format!(r#"{{"auths":{{"https://registry.example/v1/":{{"auth":"{auth}"}}}}}}"#),
        )
        .expect("write");
        match docker_config_auth(Some(&path), "registry.example")
            .expect("auth")
            .auth
        {
            RegistryAuth::Basic(u, p) => assert_eq!((u.as_str(), p.as_str()), ("alice", "s3cret")),
            _ => panic!("not basic"),
        }
        assert!(matches!(
            docker_config_auth(Some(&path), "other.example")
                .expect("auth")
                .auth,
            RegistryAuth::Anonymous
        ));
        assert!(matches!(
            docker_config_auth(Some(&dir.path().join("none.json")), "x")
                .expect("auth")
                .auth,
            RegistryAuth::Anonymous
        ));
        // The two fields some tools write instead of `auth`.
        std::fs::write(
            &path,
            r#"{"auths":{"registry.example":{"username":"bob","password":"pw"}}}"#,
        )
        .expect("write");
        match docker_config_auth(Some(&path), "registry.example")
            .expect("auth")
            .auth
        {
            RegistryAuth::Basic(u, p) => assert_eq!((u.as_str(), p.as_str()), ("bob", "pw")),
            _ => panic!("not basic"),
        }
        // Credentials in a helper, which is not run: anonymous, and a note naming it.
        std::fs::write(
            &path,
            r#"{"auths":{"registry.example":{}},"credsStore":"desktop",
                "credHelpers":{"ghcr.io":"gh"}}"#,
        )
        .expect("write");
        let found = docker_config_auth(Some(&path), "registry.example").expect("auth");
        assert!(matches!(found.auth, RegistryAuth::Anonymous));
        let note = found.helper_note.expect("a note");
        assert!(
            note.contains("docker-credential-desktop") && note.contains("--password-stdin"),
            "{note}"
        );
        let found = docker_config_auth(Some(&path), "ghcr.io").expect("auth");
        assert!(found
            .helper_note
            .expect("a note")
            .contains("docker-credential-gh"));
        // An empty `auth` is no credentials, as Docker reads it: anonymous, not an error.
        std::fs::write(&path, r#"{"auths":{"registry.example":{"auth":""}}}"#).expect("write");
        let found = docker_config_auth(Some(&path), "registry.example").expect("empty auth");
        assert!(matches!(found.auth, RegistryAuth::Anonymous));
        // An OAuth identity token is not sent as a password: anonymous, and a note saying so.
        let token_user = base64::engine::general_purpose::STANDARD.encode("<token>:");
        std::fs::write(
            &path,
            format!(
                r#"{{"auths":{{"registry.example":{{"auth":"{token_user}",
                    "identitytoken":"eyJ.refresh"}}}}}}"#
            ),
        )
        .expect("write");
        let found = docker_config_auth(Some(&path), "registry.example").expect("token");
        assert!(matches!(found.auth, RegistryAuth::Anonymous));
        let note = found.helper_note.expect("a note");
        assert!(
            note.contains("identity token") && note.contains("--password-stdin"),
            "{note}"
        );
        // Several keys for one registry: the one written as the registry wins, every time.
        let entry = |user: &str| {
            let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:pw"));
            format!(r#"{{"auth":"{auth}"}}"#)
        };
        std::fs::write(
            &path,
            format!(
                r#"{{"auths":{{"https://registry.example/v1/":{},"registry.example":{},
                    "http://registry.example":{}}}}}"#,
                entry("url"),
                entry("exact"),
                entry("http")
            ),
        )
        .expect("write");
        match docker_config_auth(Some(&path), "registry.example")
            .expect("auth")
            .auth
        {
            RegistryAuth::Basic(u, _) => assert_eq!(u, "exact"),
            _ => panic!("not basic"),
        }
        // A port is part of the key.
        std::fs::write(
            &path,
            format!(
                r#"{{"auths":{{"https://registry.example:5000":{}}}}}"#,
                entry("ported")
            ),
        )
        .expect("write");
        assert!(matches!(
            docker_config_auth(Some(&path), "registry.example")
                .expect("auth")
                .auth,
            RegistryAuth::Anonymous
        ));
        match docker_config_auth(Some(&path), "registry.example:5000")
            .expect("auth")
            .auth
        {
            RegistryAuth::Basic(u, _) => assert_eq!(u, "ported"),
            _ => panic!("not basic"),
        }
        // A file that is not JSON is an error naming the file.
        std::fs::write(&path, "{\"auths\": {").expect("write");
        let err = docker_config_auth(Some(&path), "registry.example")
            .err()
            .expect("malformed");
        assert!(
            err.message.contains("is not valid") && err.message.contains("DOCKER_CONFIG"),
            "{err}"
        );
    }
}
