//! One layer of a pull whose blob the store lacks: downloaded and unpacked at once.
//!
//! The blob's bytes go, as they arrive, to its `blobs/.partial-*` file (the state a stopped
//! pull resumes from) and, through a bounded channel, to the layer store's unpacker on a
//! blocking thread, so gunzip, the diff id's hash and the files' writes overlap the download
//! instead of following it, and the blob is never read back. The order of a pull that reads
//! the whole blob first is kept: the layer is kept (staged, see [`LayerStore::stage`]) only
//! once its blob is whole, checked against its digest (by the client, as the bytes come) and
//! its size, and renamed to `blobs/sha256/<hex>`. The pull installs its staged layers
//! together once it has them all (one sync for all their files), and removes their blobs
//! just before (removed first, their pages are dropped instead of written to the disk by that
//! sync; a crash in between costs only their download again).

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use futures_core::Stream;
use oci_client::manifest::OciDescriptor;
use oci_client::{Client, Reference};
use tokio::io::AsyncWriteExt;

use crate::foundation::error::{Context, Error, Result};
use crate::foundation::failpoint;
use crate::image::import::stage_blob;
use crate::image::layers::{LayerStore, Unpacked};
use crate::image::oci::Digest;
use crate::image::unpack::Limits;

use super::IDLE_TIMEOUT_ENV;

/// Chunks (as the client reads them, up to tens of KiB each) on their way to the unpacker:
/// enough to ride out a burst, small enough that a slow unpacker slows the download instead
/// of filling memory.
const CHUNKS_IN_FLIGHT: usize = 64;
/// The least a layer's download must bring in each window of [`IDLE_TIMEOUT_ENV`] seconds
/// (or all that is left of the layer, when that is less): about 1 KiB/s at the default 60 s.
/// The client's read timeout ends a registry that sends nothing, but one that sends a byte
/// every few seconds would hold a pull forever; raising the variable lowers the rate asked.
pub(super) const MIN_BYTES_PER_WINDOW: u64 = 64 << 10;

/// What one layer's download needs.
pub(super) struct Fetch<'a> {
    pub n: usize,
    pub client: &'a Client,
    pub reference: &'a Reference,
    pub descriptor: &'a OciDescriptor,
    pub digest: &'a Digest,
    pub size: u64,
    pub diff_id: &'a Digest,
    pub store: &'a LayerStore,
    pub limits: Limits,
    pub stopped: &'a Arc<AtomicBool>,
    /// The registry as the reference names it, and [`IDLE_TIMEOUT_ENV`]'s window.
    pub registry: &'a str,
    pub idle: Duration,
    /// The client's error in words (its causes, a stall said as such).
    pub explain: &'a (dyn Fn(&(dyn std::error::Error + 'static)) -> String + Sync),
}

/// Why a download ended early.
enum Ended {
    Failed(Error),
    /// The unpacker stopped reading (after this many bytes): its own error says why, or
    /// the store had the layer already (another job of the same image, or another pull,
    /// put in the same diff id meanwhile) and it read nothing.
    UnpackerGone(u64),
}

impl Fetch<'_> {
    /// Downloads and unpacks the layer; returns it (staged, its blob stored, or the store's
    /// own) and the bytes downloaded.
    pub(super) async fn run(&self) -> Result<(Unpacked, u64)> {
        let blob = self.store.blob_path(self.digest);
        let dir = blob
            .parent()
            .ok_or_else(|| Error::internal("a blob path has no parent"))?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let partial = self.store.blobs_dir().join(format!(
            ".partial-{}-{}-{:08x}",
            self.digest.hex,
            std::process::id(),
            rand::random::<u32>()
        ));
        let (chunks, incoming) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
        let (verdict, verdict_rx) = mpsc::channel::<bool>();
        let unpacker = self.start_unpacker(incoming, verdict_rx, blob.clone());

        let downloaded = match self.download(&partial, chunks).await {
            Ok(bytes) => std::fs::rename(&partial, &blob)
                .with_context(|| format!("storing blob {}", self.digest))
                .map(|()| bytes)
                .map_err(Ended::Failed),
            Err(ended) => Err(ended),
        };
        if downloaded.is_err() {
            let _ = std::fs::remove_file(&partial);
        }
        // The unpacker waits for this before it puts the layer into the store.
        let _ = verdict.send(downloaded.is_ok());
        let unpacked = unpacker
            .await
            .map_err(|err| Error::internal(format!("unpacking a layer failed: {err}")))?;
        match (downloaded, unpacked) {
            (Ok(bytes), Ok(layer)) => Ok((layer, bytes)),
            (Err(Ended::Failed(err)), _) => Err(err),
            (_, Err(err)) => Err(err),
            // Only a layer the store had already: this download's layer is kept only once
            // the download is whole (the verdict).
            (Err(Ended::UnpackerGone(bytes)), Ok(layer)) => Ok((layer, bytes)),
        }
    }

    /// The blocking thread unpacking what `incoming` brings into a staged layer. Before it
    /// keeps the layer it reads what is left of the stream (bytes after a gzip member's end
    /// are part of the blob too) and waits for the download's verdict.
    fn start_unpacker<C: AsRef<[u8]> + Send + 'static>(
        &self,
        incoming: tokio::sync::mpsc::Receiver<C>,
        verdict: mpsc::Receiver<bool>,
        blob: PathBuf,
    ) -> tokio::task::JoinHandle<Result<Unpacked>> {
        let (store, diff_id, media_type, limits, n) = (
            self.store.clone(),
            self.diff_id.clone(),
            self.descriptor.media_type.clone(),
            self.limits,
            self.n,
        );
        let stopped = Arc::clone(self.stopped);
        tokio::task::spawn_blocking(move || {
            let incoming = Arc::new(Mutex::new(incoming));
            let reader = Incoming {
                chunks: Arc::clone(&incoming),
                chunk: None,
                at: 0,
            };
            let stop = || -> Result<()> {
                if stopped.load(Ordering::SeqCst) {
                    Err(Error::conflict("the pull was stopped"))
                } else {
                    Ok(())
                }
            };
            let staged = stage_blob(reader, &media_type, &diff_id, &store, limits, &stop).and_then(
                |unpacked| {
                    if let Unpacked::Staged(_) = unpacked {
                        // The rest of the stream (bytes after a gzip member's end are the
                        // blob's too), and the download's verdict: only a whole, checked
                        // blob's layer is kept.
                        if let Ok(mut chunks) = incoming.lock() {
                            while chunks.blocking_recv().is_some() {}
                        }
                        if verdict.recv() != Ok(true) {
                            return Err(Error::conflict("the layer's download did not finish"));
                        }
                        // `image.pull.layer2=kill`: dies with layer 2's blob stored but its
                        // layer not installed.
                        failpoint::hit(&format!("image.pull.layer{}", n + 1))?;
                    }
                    Ok(unpacked)
                },
            );
            match &staged {
                // Staged: the blob stays until the pull installs the layer.
                Ok(Unpacked::Staged(_)) => {}
                // Stored already, or a blob that would not unpack (not a stop): either way
                // the next pull does not start from it.
                Ok(Unpacked::Stored(_)) => {
                    let _ = std::fs::remove_file(&blob);
                }
                Err(_) if !stopped.load(Ordering::SeqCst) => {
                    let _ = std::fs::remove_file(&blob);
                }
                Err(_) => {}
            }
            staged
        })
    }

    /// Streams the blob into `partial` and `chunks`, bounded by the descriptor's size; the
    /// client checks the bytes against the descriptor's digest as they come (and fails the
    /// stream's end otherwise).
    async fn download<C: AsRef<[u8]>>(
        &self,
        partial: &Path,
        chunks: tokio::sync::mpsc::Sender<C>,
    ) -> std::result::Result<u64, Ended>
    where
        oci_client::client::SizedStream: Stream<Item = io::Result<C>>,
    {
        let failed = |err: &(dyn std::error::Error + 'static)| {
            Ended::Failed(Error::invalid(format!(
                "downloading layer {}: {}",
                self.digest,
                (self.explain)(err)
            )))
        };
        let file = tokio::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(partial)
            .await
            .with_context(|| format!("creating {}", partial.display()))
            .map_err(Ended::Failed)?;
        let mut file = tokio::io::BufWriter::with_capacity(1 << 20, file);
        let mut stream = self
            .client
            .pull_blob_stream(self.reference, self.descriptor)
            .await
            .map_err(|err| failed(&err))?;
        let mut count = 0u64;
        let mut window = Window::new(tokio::time::Instant::now(), self.idle, self.size);
        loop {
            let next = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx));
            let chunk = match tokio::time::timeout_at(window.ends, next).await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(_) => {
                    window
                        .judge(tokio::time::Instant::now(), count)
                        .map_err(|slow| {
                            Ended::Failed(Error::invalid(self.too_slow(&slow, count)))
                        })?;
                    continue;
                }
            };
            let chunk = chunk.map_err(|err| failed(&err))?;
            let bytes = chunk.as_ref();
            count += bytes.len() as u64;
            let now = tokio::time::Instant::now();
            if now >= window.ends {
                window
                    .judge(now, count)
                    .map_err(|slow| Ended::Failed(Error::invalid(self.too_slow(&slow, count))))?;
            }
            if count > self.size {
                return Err(Ended::Failed(Error::invalid(format!(
                    "downloading layer {}: the registry sent more bytes than the layer's \
                     manifest says it has",
                    self.digest
                ))));
            }
            if self.stopped.load(Ordering::SeqCst) {
                return Err(Ended::Failed(Error::conflict("the pull was stopped")));
            }
            file.write_all(bytes)
                .await
                .with_context(|| format!("writing {}", partial.display()))
                .map_err(Ended::Failed)?;
            if chunks.send(chunk).await.is_err() {
                return Err(Ended::UnpackerGone(count));
            }
        }
        // Not synced: the layer made from it is what a stopped pull keeps; a blob a host
        // crash left damaged fails its unpacking's diff id check and is removed then.
        file.flush()
            .await
            .with_context(|| format!("writing {}", partial.display()))
            .map_err(Ended::Failed)?;
        if count != self.size {
            return Err(Ended::Failed(Error::invalid(format!(
                "layer {} as downloaded is {count} bytes, its manifest says {}; the registry \
                 served other bytes",
                self.digest, self.size
            ))));
        }
        Ok(count)
    }
}

impl Fetch<'_> {
    /// Why the download of a layer the registry trickles ends, and what the host can do.
    fn too_slow(&self, slow: &Slow, count: u64) -> String {
        let secs = slow.elapsed.as_secs_f64().max(0.001);
        if slow.received == 0 {
            // The words of the client's own read timeout (see `client_error`).
            return format!(
                "downloading layer {}: the registry {} sent nothing for {} s, so the pull gave \
                 up on it ({IDLE_TIMEOUT_ENV} sets how long a pull waits)",
                self.digest,
                self.registry,
                slow.elapsed.as_secs()
            );
        }
        format!(
            "downloading layer {}: the registry {} sent {} bytes in {:.0} s ({:.0} bytes/s; \
             {count} of the layer's {} bytes in all), less than the {} bytes (or the rest of \
             the layer) a pull needs in every {} s, so the pull gave up on it; for a registry \
             this slow, raise {IDLE_TIMEOUT_ENV} (now {} s)",
            self.digest,
            self.registry,
            slow.received,
            secs,
            slow.received as f64 / secs,
            self.size,
            MIN_BYTES_PER_WINDOW,
            self.idle.as_secs(),
            self.idle.as_secs()
        )
    }
}

/// A layer's download judged by its progress: each window of the idle timeout must bring
/// [`MIN_BYTES_PER_WINDOW`], or what was left of the layer when the window began.
#[derive(Debug)]
struct Window {
    idle: Duration,
    size: u64,
    began: tokio::time::Instant,
    ends: tokio::time::Instant,
    /// Bytes downloaded when the window began.
    at_start: u64,
}

/// A window that brought too little.
#[derive(Debug, PartialEq)]
struct Slow {
    received: u64,
    elapsed: Duration,
}

impl Window {
    fn new(now: tokio::time::Instant, idle: Duration, size: u64) -> Window {
        Window {
            idle,
            size,
            began: now,
            ends: now + idle,
            at_start: 0,
        }
    }

    /// At or after the window's end, with `count` bytes downloaded in all: the next window,
    /// or why the download is too slow to go on with.
    fn judge(&mut self, now: tokio::time::Instant, count: u64) -> std::result::Result<(), Slow> {
        let received = count.saturating_sub(self.at_start);
        let wanted = MIN_BYTES_PER_WINDOW.min(self.size.saturating_sub(self.at_start));
        if received < wanted {
            return Err(Slow {
                received,
                elapsed: now.duration_since(self.began),
            });
        }
        self.began = now;
        self.ends = now + self.idle;
        self.at_start = count;
        Ok(())
    }
}

/// The blob's bytes as the unpacker reads them: the download's chunks in order, and the end
/// of the stream when the download ends (the verdict says whether it finished).
struct Incoming<C> {
    chunks: Arc<Mutex<tokio::sync::mpsc::Receiver<C>>>,
    chunk: Option<C>,
    at: usize,
}

impl<C: AsRef<[u8]>> Read for Incoming<C> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(chunk) = &self.chunk {
                let rest = &chunk.as_ref()[self.at..];
                if !rest.is_empty() {
                    let n = rest.len().min(buf.len());
                    buf[..n].copy_from_slice(&rest[..n]);
                    self.at += n;
                    return Ok(n);
                }
            }
            let next = self
                .chunks
                .lock()
                .map_err(|_| io::Error::other("the download's channel is poisoned"))?
                .blocking_recv();
            match next {
                Some(chunk) => {
                    self.chunk = Some(chunk);
                    self.at = 0;
                }
                None => return Ok(0),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_must_bring_the_floor_or_the_rest_of_the_layer() {
        let idle = Duration::from_secs(2);
        let t0 = tokio::time::Instant::now();
        let size = 10 * MIN_BYTES_PER_WINDOW;
        let mut window = Window::new(t0, idle, size);
        // A steady download: the floor in each window goes on, window after window.
        window
            .judge(t0 + idle, MIN_BYTES_PER_WINDOW)
            .expect("the floor is enough");
        assert_eq!(window.ends, t0 + idle * 2);
        // A trickle: one byte short of the floor in the next window ends it.
        let slow = window
            .judge(t0 + idle * 2, 2 * MIN_BYTES_PER_WINDOW - 1)
            .expect_err("a trickle");
        assert_eq!(
            slow,
            Slow {
                received: MIN_BYTES_PER_WINDOW - 1,
                elapsed: idle
            }
        );
        // Less than the floor left: the rest of the layer in the window is enough.
        let mut window = Window::new(t0, idle, 100);
        window.judge(t0 + idle, 100).expect("the whole layer");
        let mut window = Window::new(t0, idle, 100);
        assert_eq!(
            window.judge(t0 + idle, 99),
            Err(Slow {
                received: 99,
                elapsed: idle
            })
        );
    }
}
