//! The control plane's shared state: store, metrics, provider, cluster seam,
//! and the settings every part reads.

use crate::bootstrap::ClusterJoin;
use crate::error::{Result, ServerError};
use crate::metrics::Metrics;
use crate::provider::Provider;
use crate::store::Store;
use knit_api::Cluster;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The local cloud's bridge gateway: where instances reach the host.
pub const LOCAL_GATEWAY: &str = "10.213.0.1";
pub const DEFAULT_PORT: u16 = 7443;

#[derive(Debug, Clone)]
pub struct Settings {
    /// Database, CA, admin token and package mirror live here.
    pub state_dir: PathBuf,
    pub listen: SocketAddr,
    /// Host (IP or name) instances use to reach this server. Default: the
    /// local cloud's gateway when listening on all addresses, else the
    /// listen address.
    pub advertise_host: Option<String>,
    /// Provider calls in flight at once, across all pools.
    pub parallelism: usize,
    pub join_token_ttl: Duration,
    pub max_create_attempts: i64,
    pub reconcile_interval: Duration,
}

impl Settings {
    pub fn new(state_dir: PathBuf) -> Settings {
        Settings {
            state_dir,
            listen: SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)),
            advertise_host: None,
            parallelism: 4,
            join_token_ttl: Duration::from_secs(30 * 60),
            max_create_attempts: 5,
            reconcile_interval: Duration::from_secs(2),
        }
    }

    pub fn db_path(&self) -> PathBuf {
        self.state_dir.join("knit.db")
    }
    pub fn pki_dir(&self) -> PathBuf {
        self.state_dir.join("pki")
    }
    pub fn admin_token_path(&self) -> PathBuf {
        self.state_dir.join("admin-token")
    }
    pub fn mirror_dir(&self) -> PathBuf {
        self.state_dir.join("mirror")
    }
}

pub struct ControlPlane {
    pub store: Store,
    pub metrics: Metrics,
    pub provider: Option<Arc<dyn Provider>>,
    pub cluster: Arc<dyn ClusterJoin>,
    pub settings: Settings,
    pub ca_pem: String,
    pub admin_token: String,
    /// `https://<advertise host>:<port>`: the base instances use.
    pub advertise_url: String,
    pub mirror_dir: PathBuf,
    pub(crate) wake: tokio::sync::Notify,
    pub(crate) plan_lock: tokio::sync::Mutex<()>,
    pub(crate) in_flight: std::sync::Mutex<HashSet<String>>,
    pub(crate) parallelism: Arc<tokio::sync::Semaphore>,
}

impl ControlPlane {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        provider: Option<Arc<dyn Provider>>,
        cluster: Arc<dyn ClusterJoin>,
        settings: Settings,
        ca_pem: String,
        admin_token: String,
        advertise_url: String,
    ) -> ControlPlane {
        let parallelism = Arc::new(tokio::sync::Semaphore::new(settings.parallelism.max(1)));
        ControlPlane {
            store,
            metrics: Metrics::default(),
            provider,
            cluster,
            mirror_dir: settings.mirror_dir(),
            settings,
            ca_pem,
            admin_token,
            advertise_url,
            wake: tokio::sync::Notify::new(),
            plan_lock: tokio::sync::Mutex::new(()),
            in_flight: std::sync::Mutex::new(HashSet::new()),
            parallelism,
        }
    }

    pub fn provider(&self) -> Result<&Arc<dyn Provider>> {
        self.provider.as_ref().ok_or_else(|| ServerError::Provider {
            provider: "none".to_string(),
            message: "this server runs without a provider (--provider none)".to_string(),
        })
    }

    pub fn cluster_doc(&self) -> Result<Cluster> {
        Ok(self.store.cluster()?.unwrap_or_default())
    }

    /// The hex digest recorded beside a mirror file (`<file>.sha256`).
    pub fn mirror_sha256(&self, relative: &str) -> Result<Option<String>> {
        let path = self.mirror_dir.join(format!("{relative}.sha256"));
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(text.split_whitespace().next().map(str::to_string)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ServerError::io(format!("read {}", path.display()), e)),
        }
    }

    /// Wakes the reconciler (after a change to a pool).
    pub fn wake(&self) {
        self.wake.notify_one();
    }
}
