//! `dynocap image pull` and the pulls the MCP server makes on demand: the engine's face of
//! [`crate::image::pull`], with the host's policy (`DYNOCAP_REGISTRIES`, `DYNOCAP_RESOLVE`,
//! `DYNOCAP_EXTRA_CA`, `DYNOCAP_PULL_IDLE_TIMEOUT`, the user's Docker config file) from the
//! engine's configuration.

use std::sync::atomic::AtomicBool;

use crate::facade::sandboxes::Engine;
use crate::foundation::error::Result;
use crate::image::pull::{self, Credentials, PullPolicy, Pulled};
use crate::image::store::ImageStore;
use crate::image::unpack::Limits;

impl Engine {
    /// Pulls `reference` from its registry as `name` (default: the reference itself). The
    /// credentials are used for this pull only and never written anywhere.
    pub async fn image_pull(
        &self,
        reference: &str,
        name: Option<&str>,
        credentials: Option<Credentials>,
        limits: Limits,
        progress: &(dyn Fn(&str) + Sync),
        cancel: &AtomicBool,
    ) -> Result<Pulled> {
        let config = self.config();
        let policy = PullPolicy {
            registries: config.images.registries.clone(),
            resolve: config.egress.resolve.clone(),
            extra_ca: config.egress.extra_ca(),
            docker_config: config.images.docker_config.clone(),
            idle_timeout: config.images.pull_idle_timeout.clone(),
        };
        let store = ImageStore::for_home(self.home(), config.images.cache_dir());
        pull::pull(
            &store,
            reference,
            name,
            credentials,
            &policy,
            limits,
            progress,
            cancel,
        )
        .await
    }

    /// Pulls `reference` under its own name with the default limits and no credentials but
    /// the Docker config's, never cancelled: the pull a task start makes of an image it needs (the
    /// one a project's devcontainer.json names, or one the MCP server offers).
    pub async fn image_pull_on_demand(
        &self,
        reference: &str,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<Pulled> {
        let cancel = AtomicBool::new(false);
        self.image_pull(reference, None, None, Limits::default(), progress, &cancel)
            .await
    }
}
