//! Where instances come from. The reconciler speaks only this trait; the
//! local cloud (knit-local) is the implementation that exists today.

use crate::error::Result;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Largest file [`Provider::read_file`] returns (`knit logs`).
pub const READ_FILE_MAX_BYTES: usize = 16 << 20;
/// How long [`Provider::read_file`] may take.
pub const READ_FILE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a provider call about one instance (get, list, stop, start,
/// delete) may take before the reconciler gives up on it for this pass.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// How long making one instance may take (disks from snapshots included).
pub const CREATE_TIMEOUT: Duration = Duration::from_secs(900);

/// Whether `e` is a read or call that went past its time or size limit
/// (from [`within`] or a bounded read), rather than a plain failure.
pub fn is_limit_error(e: &crate::error::ServerError) -> bool {
    matches!(e, crate::error::ServerError::Provider { message, .. }
        if message.contains(" did not finish within ") || message.contains(" is larger than "))
}

/// `call` unless it takes longer than `limit`: then a provider error
/// naming `what` and the limit. Every provider call of the reconciler goes
/// through this, so a provider that never answers holds up nothing else.
pub async fn within<T>(
    provider: &str,
    what: &str,
    limit: Duration,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(outcome) => outcome,
        Err(_) => Err(crate::error::ServerError::Provider {
            provider: provider.to_string(),
            message: format!("{what} did not finish within {} s", limit.as_secs()),
        }),
    }
}

/// Tag every knit-made instance carries: the pool it belongs to.
pub const TAG_POOL: &str = "knit.dev/pool";
/// Tag carrying knit's own instance name (the store's key), so that an
/// instance made just before a crash is found again by name.
pub const TAG_NAME: &str = "knit.dev/name";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskTemplate {
    pub size_gib: i64,
    /// virtio | nvme.
    pub interface: String,
    pub snapshot_id: Option<String>,
}

/// Everything a provider needs to make one instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceTemplate {
    /// knit's name for the instance; unique, chosen before creation.
    pub name: String,
    pub instance_type: String,
    /// `host` or an image directory.
    pub image: String,
    pub system_disk_gib: i64,
    pub data_disks: Vec<DiskTemplate>,
    pub user_data: String,
    pub region: String,
    pub zone: Option<String>,
    pub vpc: String,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderInstance {
    /// The provider's instance id (`i-…`).
    pub id: String,
    /// knit's name (the `knit.dev/name` tag), when the instance carries one.
    pub name: Option<String>,
    /// Provider's state word (e.g. Running, Stopped).
    pub state: String,
    pub ip: Option<String>,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSnapshot {
    pub id: String,
    pub size_bytes: u64,
}

#[async_trait]
pub trait Provider: Send + Sync {
    /// Short name for messages and events (`local`).
    fn name(&self) -> &str;
    /// The host's address on the instances' network (the local cloud's
    /// bridge gateway for its subnet): where instances reach the control
    /// plane by default. `None`: the provider has no such address.
    fn gateway(&self) -> Option<std::net::IpAddr> {
        None
    }
    async fn create(&self, template: &InstanceTemplate) -> Result<ProviderInstance>;
    async fn get(&self, id: &str) -> Result<Option<ProviderInstance>>;
    async fn list(&self) -> Result<Vec<ProviderInstance>>;
    async fn start(&self, id: &str) -> Result<()>;
    async fn stop(&self, id: &str) -> Result<()>;
    /// New system disk from `image` (a pool's `image`: `host` or an image
    /// directory), data disks kept, new user data. An image the provider
    /// cannot use is refused before the instance is touched.
    async fn reimage(&self, id: &str, image: &str, user_data: &str) -> Result<()>;
    /// Refuses an image (a pool's `image`) the provider cannot use, naming
    /// it and the rule; changes nothing.
    async fn check_image(&self, image: &str) -> Result<()>;
    /// Renames an instance (its name and hostname), running or stopped.
    async fn rename(&self, id: &str, name: &str) -> Result<()>;
    /// Sets root's login password inside a running instance. The password
    /// must never reach a log, an event, an error, a process's argv or any
    /// store.
    async fn set_password(&self, id: &str, password: &str) -> Result<()>;
    async fn delete(&self, id: &str) -> Result<()>;
    /// A file from inside the instance (`knit logs`), at most
    /// [`READ_FILE_MAX_BYTES`] within [`READ_FILE_TIMEOUT`] where the
    /// provider can bound it (see [`Provider::read_file_limited`]).
    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>>;

    /// A file from inside the instance, refused when larger than
    /// `max_bytes` or slower than `limit` (a FIFO, /dev/zero, a hung file
    /// system). Providers that can read with a bound override this; the
    /// default bounds the time and checks the size after the read.
    async fn read_file_limited(
        &self,
        id: &str,
        path: &str,
        max_bytes: usize,
        limit: Duration,
    ) -> Result<Vec<u8>> {
        let what = format!("reading {path} inside {id}");
        let data = within(self.name(), &what, limit, self.read_file(id, path)).await?;
        if data.len() > max_bytes {
            return Err(crate::error::ServerError::Provider {
                provider: self.name().to_string(),
                message: format!("{path} inside {id} is larger than {max_bytes} bytes"),
            });
        }
        Ok(data)
    }

    /// Restarts a running instance (node repair). Default: stop, then
    /// start.
    async fn reboot(&self, id: &str) -> Result<()> {
        self.stop(id).await?;
        self.start(id).await
    }
    /// Snapshot of one data disk of a (stopped) instance, by its index
    /// among the instance's data disks. `name` is recorded with it before
    /// the copy starts, so that [`Provider::snapshots_named`] finds it even
    /// when the caller died before the id came back.
    async fn snapshot_create(
        &self,
        id: &str,
        data_disk_index: usize,
        name: &str,
    ) -> Result<ProviderSnapshot>;
    async fn snapshot_delete(&self, snapshot_id: &str) -> Result<()>;
    /// The ids of the provider's snapshots carrying `name`, made whole or
    /// not. A provider that keeps no snapshot names has none to find.
    async fn snapshots_named(&self, name: &str) -> Result<Vec<String>> {
        let _ = name;
        Ok(Vec::new())
    }

    /// Runs a command inside a running instance (the snapshot builder's
    /// steps): exit status, stdout, stderr. Providers without a way in
    /// refuse.
    async fn exec(&self, id: &str, argv: &[String]) -> Result<(i32, Vec<u8>, Vec<u8>)> {
        let _ = (id, argv);
        Err(crate::error::ServerError::Provider {
            provider: self.name().to_string(),
            message: "running commands inside instances is not supported".to_string(),
        })
    }

    /// What the add-existing preflight reads about an instance (account,
    /// VPC, security groups, ENIs, OS, disks …). Providers that cannot
    /// tell refuse.
    async fn facts(&self, id: &str) -> Result<crate::preflight::InstanceFacts> {
        let _ = id;
        Err(crate::error::ServerError::Provider {
            provider: self.name().to_string(),
            message: "instance attributes for preflight are not supported".to_string(),
        })
    }

    /// The instance knit named `name`, if the provider has it.
    async fn find_by_name(&self, name: &str) -> Result<Option<ProviderInstance>> {
        Ok(self.list().await?.into_iter().find(|i| {
            i.name.as_deref() == Some(name)
                || i.tags.get(TAG_NAME).map(String::as_str) == Some(name)
        }))
    }
}
