//! The jail backend (crate `dynocap-backend-jail`): Linux namespaces, an overlay root,
//! seccomp and cgroups, with the sandbox's disk an ext4 image the supervisor mounts.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dynocap_backend_jail::JailError;

use super::{agent_args, Backend, BootSpec, Guest, HostDisk, LayerSync, OomCounter, Readiness};
use crate::foundation::error::{Coded, Error, ErrorCode, Result};
use crate::host::usernet;
use crate::image::{AGENT_STATE_DIR, SANDBOX_GID, SANDBOX_HOME, SANDBOX_UID};
use crate::model::spec::Network;

/// Linux namespaces, overlay root, seccomp, cgroups (crate `dynocap-backend-jail`).
pub struct JailBackend;

struct JailGuest {
    jail: dynocap_backend_jail::Jail,
    /// pasta, for a `nat` guest.
    usernet: Option<dynocap_host::UserNet>,
    /// The disk templates and this guest's disk size, for the spare its teardown leaves the
    /// next start of that size (see `dynocap_backend_jail::make_spare_disk`).
    spare_disk: Option<(std::path::PathBuf, u64)>,
    /// The disk's size, for its reservation; `None` without a disk limit.
    disk_bytes: Option<u64>,
    /// The sandbox's state directory, which holds the disk's image and where the supervisor
    /// mounted it.
    state_dir: PathBuf,
    /// Where the supervisor mounted the project's package cache, if the guest has it.
    cache: Option<PathBuf>,
    /// The hold on the project's cache (shared with its other jails) while the guest has it;
    /// after `jail`, so the cache is unmounted before it goes.
    _cache_hold: Option<std::fs::File>,
}

/// The jail's disk as the supervisor mounted it, under the sandbox's state directory, and
/// the project's package cache where it mounted that.
struct MountedDisk {
    state_dir: PathBuf,
    cache: Option<PathBuf>,
}

impl HostDisk for MountedDisk {
    fn sync(&self) -> Result<()> {
        dynocap_backend_jail::sync_disk(&self.state_dir)
            .map_err(|err| JailFailure::SaveFiles(err).into())
    }

    fn failure(&self) -> Option<String> {
        dynocap_backend_jail::disk_failure(&self.state_dir).or_else(|| {
            self.cache
                .as_deref()
                .and_then(dynocap_backend_jail::cache_failure)
        })
    }

    fn cache_full(&self) -> Option<String> {
        let mountpoint = self.cache.as_deref()?;
        let room = dynocap_backend_jail::cache_room(mountpoint)?;
        crate::host::project_cache::full_note(room.free_bytes, room.total_bytes, room.free_inodes)
    }

    fn snapshot(&self, dest: &Path, during: &mut dyn FnMut() -> Result<()>) -> Result<u64> {
        let mut fault = None;
        let copied = dynocap_backend_jail::snapshot_disk(&self.state_dir, dest, || {
            during().map_err(|err| {
                let io = std::io::Error::other(err.message.clone());
                fault = Some(err);
                io
            })
        });
        match (copied, fault) {
            (Ok(bytes), _) => Ok(bytes),
            (Err(_), Some(err)) => Err(err),
            (Err(err), None) => Err(JailFailure::SaveFiles(err).into()),
        }
    }
}

/// A task's package caches for the jail (see `host::project_cache`): the project's image,
/// which the supervisor mounts and whose directories it binds, the directories of the sandbox
/// user's home they hang from (which must be the user's own), and the hold on the cache this
/// guest keeps while it has it. None for an unprivileged supervisor, which cannot make the
/// idmapped mounts they need, nor while a vm guest of the project has the image: the task
/// then goes without (the log says why).
fn cache_spec(spec: &BootSpec) -> Result<JailCache> {
    let Some(cache) = &spec.project_cache else {
        return Ok(JailCache::default());
    };
    let ids = dynocap_host::IdMap::for_current_process_in_range(spec.id_range)
        .map_err(JailFailure::HostIds)?;
    if ids.is_rootless() {
        tracing::warn!(
            "no package caches: binding them needs an idmapped mount, which only a supervisor running as root can make"
        );
        return Ok(JailCache::default());
    }
    let Some(hold) = cache.hold(false)? else {
        tracing::warn!(
            "no package caches: a vm guest of the project has its cache image {} now",
            cache.image().display()
        );
        return Ok(JailCache::default());
    };
    let home = Path::new(SANDBOX_HOME);
    let with_apt = spec.image.root.join("var/cache/apt/archives").is_dir();
    let spots = crate::host::project_cache::ProjectCache::spots(with_apt)
        .map(|spot| {
            let (uid, gid) = if spot.root_owned {
                (0, 0)
            } else {
                (SANDBOX_UID, SANDBOX_GID)
            };
            dynocap_backend_jail::CacheSpot {
                name: spot.name.to_owned(),
                uid,
                gid,
                target: home.join(spot.guest),
            }
        })
        .collect();
    let dirs = crate::host::project_cache::HOME_PARENTS
        .iter()
        .map(|dir| dynocap_backend_jail::GuestDir {
            path: home.join(dir),
            uid: SANDBOX_UID,
            gid: SANDBOX_GID,
            mode: 0o755,
        })
        .collect();
    let jail_cache = dynocap_backend_jail::CacheSpec {
        image: cache.image(),
        mountpoint: cache.mountpoint(),
        spots,
        legacy: cache.legacy_data(),
        guest_wrote: Some(cache.guest_wrote()),
    };
    Ok(JailCache {
        spec: Some(jail_cache),
        dirs,
        hold: Some(hold),
    })
}

/// A task's package caches as [`cache_spec`] makes them for the jail.
#[derive(Default)]
struct JailCache {
    spec: Option<dynocap_backend_jail::CacheSpec>,
    /// The directories of the sandbox user's home the caches hang from.
    dirs: Vec<dynocap_backend_jail::GuestDir>,
    /// The hold on the project's cache, kept while the guest has it.
    hold: Option<std::fs::File>,
}

/// System CA bundles the image may bind from the host (the `host` image binds the host's
/// `/etc/ssl/certs`): Debian's, Ubuntu's, Arch's, Alpine's path.
const HOST_CA_BUNDLES: &[&str] = &["/etc/ssl/certs/ca-certificates.crt"];

/// For each system CA bundle the image binds from the host (read-only, so the guest's agent
/// cannot add the extra CAs to it), a copy of it with `extra` appended, written in the
/// sandbox's state directory and bound over it. The host's own file is only read.
fn ca_bundle_binds(
    image_binds: &[(PathBuf, PathBuf)],
    extra: &str,
    state_dir: &Path,
) -> Result<Vec<dynocap_backend_jail::RoBind>> {
    let mut binds = Vec::new();
    for (index, bundle) in HOST_CA_BUNDLES.iter().enumerate() {
        let bundle = Path::new(bundle);
        let Some(host) = image_binds.iter().find_map(|(source, target)| {
            let rest = bundle.strip_prefix(target).ok()?;
            Some(source.join(rest))
        }) else {
            continue;
        };
        let Ok(mut joined) = std::fs::read_to_string(&host) else {
            // Not on this host: nothing of the host's is there to cover.
            continue;
        };
        if !joined.is_empty() && !joined.ends_with('\n') {
            joined.push('\n');
        }
        joined.push_str(extra);
        let copy = state_dir.join(format!("ca-bundle-{index}.crt"));
        std::fs::write(&copy, joined).map_err(|source| JailFailure::CaBundle {
            path: copy.clone(),
            source,
        })?;
        binds.push(dynocap_backend_jail::RoBind {
            source: copy,
            target: bundle.to_owned(),
        });
    }
    Ok(binds)
}

impl Backend for JailBackend {
    fn name(&self) -> &'static str {
        "jail"
    }

    fn machine_checks(&self) -> Vec<Readiness> {
        super::jail_ready::machine_checks()
    }

    fn boot(&self, spec: &BootSpec) -> Result<Box<dyn Guest>> {
        use dynocap_backend_jail::{GuestDir, JailSpec, Limits, RoBind};
        let nat = spec.network == Network::Nat;
        let mut ro_binds: Vec<RoBind> = spec
            .image
            .ro_binds
            .iter()
            .map(|(source, target)| RoBind {
                source: source.clone(),
                target: target.clone(),
            })
            .collect();
        if let Some(extra) = &spec.extra_ca {
            ro_binds.extend(ca_bundle_binds(
                &spec.image.ro_binds,
                extra,
                &spec.state_dir,
            )?);
        }
        if nat {
            // Checked before anything is built: a missing pasta leaves no sandbox behind.
            usernet::available()?;
            ro_binds.push(RoBind {
                source: usernet::write_resolv_conf(&spec.state_dir)?,
                target: "/etc/resolv.conf".into(),
            });
        }
        let JailCache {
            spec: cache,
            dirs: cache_dirs,
            hold: cache_hold,
        } = cache_spec(spec)?;
        let mut jail_spec = JailSpec {
            name: spec.id.clone(),
            hostname: spec.hostname.clone(),
            image_root: spec.image.root.clone(),
            ro_binds,
            rw_binds: Vec::new(),
            cache,
            state_dir: spec.state_dir.clone(),
            guest_dirs: vec![
                GuestDir {
                    path: SANDBOX_HOME.into(),
                    uid: SANDBOX_UID,
                    gid: SANDBOX_GID,
                    mode: 0o755,
                },
                // The agent's private state (baseline repository, received files): guest
                // root only, so nothing the sandbox user runs can read or move the baseline.
                GuestDir {
                    path: AGENT_STATE_DIR.into(),
                    uid: 0,
                    gid: 0,
                    mode: 0o700,
                },
            ],
            agent_binary: spec.agent_binary.clone(),
            agent_args: agent_args(&spec.image),
            limits: Limits {
                cpu_millis: u64::from(spec.cpus) * 1000,
                memory_bytes: spec.memory_mb * 1024 * 1024,
                pids: spec.pids,
            },
            reuse_layers: spec.reuse_layer,
            layer_ids: match spec.layer_id_range {
                Some(range) if spec.reuse_layer && range != spec.id_range => Some(
                    dynocap_host::IdMap::for_current_process_in_range(range)
                        .map_err(JailFailure::HostIds)?,
                ),
                _ => None,
            },
            disk_bytes: disk_bytes(spec.disk_limit.as_deref(), spec.disk_mb)?,
            disk_templates: Some(disk_templates(&spec.cache_dir)),
            net_raw: !nat,
            idmap_image: spec.image.owned_by_host_root,
            exec_cgroup: spec.exec_cgroup.clone(),
        };
        jail_spec.guest_dirs.extend(cache_dirs);
        let ids = dynocap_host::IdMap::for_current_process_in_range(spec.id_range)
            .map_err(JailFailure::HostIds)?;
        let jail = dynocap_backend_jail::Jail::spawn_with_ids(&jail_spec, ids)
            .map_err(JailFailure::Boot)?;
        // On failure the jail is dropped, which tears it down: no sandbox is left behind.
        let usernet = if nat {
            Some(usernet::start(jail.pid(), &spec.state_dir)?)
        } else {
            None
        };
        let spare_disk = jail_spec.disk_templates.clone().zip(jail_spec.disk_bytes);
        Ok(Box::new(JailGuest {
            jail,
            usernet,
            spare_disk,
            disk_bytes: jail_spec.disk_bytes,
            state_dir: spec.state_dir.clone(),
            cache: jail_spec
                .cache
                .as_ref()
                .map(|cache| cache.mountpoint.clone()),
            _cache_hold: cache_hold,
        }))
    }

    /// An idle jail takes its claimer's hostname and limits (see [`Guest::claim`]).
    fn keeps_a_warm_pool(&self) -> bool {
        true
    }

    /// The default start's disk (see the jail's `start_preparing_disk`), which the start then
    /// waits for and takes if it is of that size. Nothing with disk limits off.
    fn prepare_default_start(
        &self,
        home: &crate::host::home::Home,
        config: &crate::model::config::Config,
    ) -> Result<()> {
        let Some(bytes) = disk_bytes(
            config.disk_limit.as_deref(),
            crate::model::spec::DISK_MB_DEFAULT,
        )?
        else {
            return Ok(());
        };
        dynocap_backend_jail::start_preparing_disk(disk_templates(&home.cache_dir()), bytes)
            .map_err(|err| JailFailure::DiskAhead(err).into())
    }

    fn release_preparations(&self) {
        dynocap_backend_jail::release_prepared_disk();
    }

    fn cleanup_leftovers(&self, id: &str, state_dir: &Path) -> Result<()> {
        dynocap_backend_jail::cleanup_leftovers(id, state_dir).map_err(|source| {
            JailFailure::Cleanup {
                id: id.to_owned(),
                source,
            }
            .into()
        })
    }

    fn cleanup_keeping_layer(&self, id: &str, state_dir: &Path) -> Result<()> {
        dynocap_backend_jail::cleanup_leftovers_keeping_layers(id, state_dir).map_err(|source| {
            JailFailure::CleanupKeepingLayer {
                id: id.to_owned(),
                source,
            }
            .into()
        })
    }
}

/// What failed in the jail backend, with the jail crate's error as the cause.
#[derive(Debug, thiserror::Error)]
enum JailFailure {
    #[error("saving the sandbox's files: {0}")]
    SaveFiles(#[source] JailError),
    #[error("choosing the jail's host ids: {0}")]
    HostIds(#[source] dynocap_host::HostError),
    #[error("booting the jail: {0}")]
    Boot(#[source] JailError),
    #[error("making a disk ahead: {0}")]
    DiskAhead(#[source] JailError),
    #[error("cleaning up sandbox {id}: {source}")]
    Cleanup {
        id: String,
        #[source]
        source: JailError,
    },
    #[error("stopping what is left of sandbox {id}: {source}")]
    CleanupKeepingLayer {
        id: String,
        #[source]
        source: JailError,
    },
    #[error("starting the hostname thread: {0}")]
    HostnameThread(#[source] JailError),
    #[error("applying the claimed limits: {0}")]
    ClaimLimits(#[source] JailError),
    #[error("naming the claimed sandbox: {0}")]
    ClaimHostname(#[source] JailError),
    #[error("killing the jail: {0}")]
    Kill(#[source] JailError),
    #[error("destroying the jail: {0}")]
    Destroy(#[source] JailError),
    #[error("raising the guest's memory limit: {0}")]
    RaiseMemoryLimit(#[source] JailError),
    #[error("stopping the jail: {0}")]
    StopKeepingLayer(#[source] JailError),
    #[error("writing the guest's CA bundle {}: {source}", path.display())]
    CaBundle {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Coded for JailFailure {
    /// The jail failing under a valid request is the machine's or DynoCap's problem, never
    /// the caller's: the spec was checked before the backend saw it.
    fn code(&self) -> ErrorCode {
        match self {
            Self::SaveFiles(_)
            | Self::HostIds(_)
            | Self::Boot(_)
            | Self::DiskAhead(_)
            | Self::Cleanup { .. }
            | Self::CleanupKeepingLayer { .. }
            | Self::HostnameThread(_)
            | Self::ClaimLimits(_)
            | Self::ClaimHostname(_)
            | Self::Kill(_)
            | Self::Destroy(_)
            | Self::RaiseMemoryLimit(_)
            | Self::StopKeepingLayer(_)
            | Self::CaBundle { .. } => ErrorCode::Internal,
        }
    }
}

/// Where the jail's formatted empty disks are kept, under the home's cache.
fn disk_templates(cache_dir: &Path) -> PathBuf {
    cache_dir.join("disks")
}

/// The jail's disk size: `disk_mb`, unless the person running DynoCap turned disk limits off
/// (`limit`, `DYNOCAP_DISK_LIMIT=off`, for rootless use where a loop mount is impossible).
fn disk_bytes(limit: Option<&str>, disk_mb: u64) -> Result<Option<u64>> {
    Ok(crate::model::config::disk_limit(limit)?.then_some(disk_mb << 20))
}

impl Guest for JailGuest {
    fn take_channel(&mut self) -> Option<OwnedFd> {
        self.jail.take_channel()
    }
    fn network_exit_fd(&self) -> Option<BorrowedFd<'_>> {
        usernet::exit_fd(&self.usernet)
    }
    fn network_exit(&mut self) -> String {
        usernet::exit_of_any(&mut self.usernet)
    }
    fn restart_network(&mut self) -> Result<()> {
        let netns = PathBuf::from(format!("/proc/{}/ns/net", self.jail.pid()));
        match self.usernet.as_mut() {
            Some(usernet) => usernet::restart(usernet, &netns),
            None => Err(Error::internal(
                "this guest has no network process to restart",
            )),
        }
    }
    fn end_network(&mut self) -> Result<()> {
        usernet::stop(&mut self.usernet)
    }
    fn exit_fd(&self) -> BorrowedFd<'_> {
        self.jail.pidfd()
    }
    fn pid(&self) -> i32 {
        self.jail.pid().as_raw()
    }
    fn network_namespace(&self) -> Option<std::fs::File> {
        // The init is our unreaped child: its pid names no other process.
        std::fs::File::open(format!("/proc/{}/ns/net", self.jail.pid())).ok()
    }
    fn prepare_claim(&mut self) -> Result<()> {
        // The claim renames the guest: its thread waits in the guest's UTS namespace.
        self.jail
            .prepare_rename()
            .map_err(|err| JailFailure::HostnameThread(err).into())
    }
    fn disk_room(&self) -> Option<crate::host::disk_room::DiskRoom> {
        let image = dynocap_backend_jail::disk_image(&self.state_dir);
        match self.disk_bytes {
            // A fork's clone shares its source's blocks, and was made only with room for its
            // whole disk: it reserves nothing (see `dynocap_backend_jail::is_clone`).
            Some(_) if dynocap_backend_jail::is_clone(&self.state_dir) => None,
            Some(bytes) if image.exists() => Some(crate::host::disk_room::DiskRoom {
                image,
                bytes,
                layout: crate::host::disk_room::Layout::Fixed,
            }),
            // A kept layer from a start without a limit: the host's filesystem holds it.
            _ => None,
        }
    }
    fn claim(&self, hostname: &str, cpus: u32, memory_mb: u64) -> Result<()> {
        self.jail
            .set_limits(&dynocap_backend_jail::Limits {
                cpu_millis: u64::from(cpus) * 1000,
                memory_bytes: memory_mb * 1024 * 1024,
                pids: crate::model::spec::PIDS_LIMIT,
            })
            .map_err(JailFailure::ClaimLimits)?;
        self.jail
            .set_hostname(hostname)
            .map_err(JailFailure::ClaimHostname)?;
        // A pool guest booted at the lowest priority (its supervisor's); its init leads its
        // own process group, which is all of the idle guest. Best effort, as the lowering was.
        // SAFETY: setpriority sets a scheduling value; no memory is involved.
        unsafe {
            libc::setpriority(libc::PRIO_PGRP, self.jail.pid().as_raw().unsigned_abs(), 0);
        }
        Ok(())
    }
    fn kill(&mut self) -> Result<()> {
        let network = crate::host::usernet::stop(&mut self.usernet);
        self.jail.kill().map_err(JailFailure::Kill)?;
        network
    }
    fn destroy(mut self: Box<Self>) -> Result<()> {
        let network = crate::host::usernet::stop(&mut self.usernet);
        self.jail.destroy().map_err(JailFailure::Destroy)?;
        // After the reply (a teardown's place), so the next start's disk is ready and flushed
        // without anyone waiting for it. Best effort: without a spare, a start copies.
        if let Some((templates, bytes)) = &self.spare_disk {
            if let Err(err) = dynocap_backend_jail::make_spare_disk(templates, *bytes) {
                tracing::warn!("leaving a spare disk for the next start: {err}");
            }
        }
        network
    }
    fn layer_sync(&self) -> LayerSync {
        LayerSync::HostMount(Arc::new(MountedDisk {
            state_dir: self.state_dir.clone(),
            cache: self.cache.clone(),
        }))
    }
    fn oom_counter(&self) -> OomCounter {
        self.jail
            .cgroup_paths()
            .into_iter()
            .find_map(|dir| {
                ["memory.events", "memory.oom_control"]
                    .iter()
                    .map(|file| dir.join(file))
                    .find(|path| path.is_file())
            })
            .map_or(OomCounter::None, OomCounter::HostFile)
    }
    fn raise_memory_limit(&self, bytes: u64) -> Result<()> {
        self.jail
            .raise_memory_limit(bytes)
            .map_err(|err| JailFailure::RaiseMemoryLimit(err).into())
    }
    fn stop_keeping_layer(mut self: Box<Self>) -> Result<()> {
        let network = crate::host::usernet::stop(&mut self.usernet);
        self.jail
            .stop_keeping_layers()
            .map_err(JailFailure::StopKeepingLayer)?;
        network
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jail_failure_is_internal_and_reads_as_before() {
        let err = Error::from(JailFailure::Cleanup {
            id: "sbx-1".into(),
            source: JailError::InvalidSpec("no name".into()),
        });
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(
            err.message,
            "cleaning up sandbox sbx-1: invalid jail spec: no name"
        );
        let err = Error::from(JailFailure::Boot(JailError::InvalidSpec("x".into())));
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(err.message, "booting the jail: invalid jail spec: x");
    }

    #[test]
    fn a_bundle_bound_from_the_host_is_covered_by_a_copy_with_the_extra_cas() {
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = dir.path().join("host/etc/ssl/certs");
        std::fs::create_dir_all(&certs).expect("mkdir");
        let system = "-----BEGIN CERTIFICATE-----\nSYS\n-----END CERTIFICATE-----";
        std::fs::write(certs.join("ca-certificates.crt"), system).expect("write");
        let extra = "-----BEGIN CERTIFICATE-----\nEXTRA\n-----END CERTIFICATE-----\n";
        let image = [(certs.clone(), PathBuf::from("/etc/ssl/certs"))];
        let binds = ca_bundle_binds(&image, extra, dir.path()).expect("binds");
        assert_eq!(binds.len(), 1);
        assert_eq!(
            binds[0].target,
            Path::new("/etc/ssl/certs/ca-certificates.crt")
        );
        assert_eq!(
            std::fs::read_to_string(&binds[0].source).expect("copy"),
            format!("{system}\n{extra}")
        );
        // The host's file is as it was.
        assert_eq!(
            std::fs::read_to_string(certs.join("ca-certificates.crt")).expect("host"),
            system
        );
        // An image that binds no bundle (a built one) gets none: its agent writes its own.
        assert!(ca_bundle_binds(&[], extra, dir.path())
            .expect("binds")
            .is_empty());
    }
}
