//! The control plane's shared state: store, metrics, provider, cluster seam,
//! and the settings every part reads.

use crate::bootstrap::ClusterJoin;
use crate::error::{Result, ServerError};
use crate::metrics::Metrics;
use crate::provider::{BoundedProvider, Provider};
use crate::store::fence::Fence;
use crate::store::{now_ms, Lease, Store};
use knit_api::Cluster;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const DEFAULT_PORT: u16 = 7443;
/// The web console's port (`knit server --console-listen`).
pub const DEFAULT_CONSOLE_PORT: u16 = 7444;

#[derive(Debug, Clone)]
pub struct Settings {
    /// Database, CA, admin token and package mirror live here.
    pub state_dir: PathBuf,
    /// The first address to listen on (port 0: an ephemeral one).
    pub listen: SocketAddr,
    /// More addresses to listen on, on the same port as `listen` (the CLI's
    /// default: loopback, then the provider's gateway).
    pub also_listen: Vec<std::net::IpAddr>,
    /// Host (IP or name) instances use to reach this server. Default: the
    /// provider's gateway when the server listens there (or on all
    /// addresses), else the listen address.
    pub advertise_host: Option<String>,
    /// The connection limits of the HTTPS listener.
    pub limits: ConnectionLimits,
    /// Provider calls in flight at once, across all pools.
    pub parallelism: usize,
    pub join_token_ttl: Duration,
    pub max_create_attempts: i64,
    pub reconcile_interval: Duration,
    /// The web console (`/ui/`) on a TLS port of its own; `None`: none.
    pub console: Option<ConsoleSettings>,
    /// Where the state lives: SQLite in the state directory (default), or
    /// PostgreSQL shared with other servers (then one leads: see `ha`).
    pub datastore: knit_db::Datastore,
    /// How long the leader lease lasts without renewal: a leader that
    /// stops renewing is replaced after at most this (plus one renewal).
    pub lease_ttl: Duration,
    /// A drain stops waiting for a pod being deleted on a node that is not
    /// Ready this long after the deletion was due (Cluster API's skip-wait
    /// for unreachable nodes; default 60 s, `--drain-skip-wait-seconds`).
    pub drain_skip_wait: Duration,
    /// cluster-autoscaler's externalgrpc service (mutual TLS); `None`: off.
    pub autoscaler: Option<AutoscalerSettings>,
    /// The key file that seals the secrets servers share in a shared
    /// datastore (`--secrets-key-file`, see `sealed`); needed on PostgreSQL,
    /// unused on SQLite.
    pub secrets_key_file: Option<PathBuf>,
}

/// Where the web console listens and how long a sign-in lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSettings {
    pub listen: SocketAddr,
    /// A session's lifetime from sign-in (not extended by use).
    pub session_ttl: Duration,
    /// false: a listen address already taken only logs a warning and the
    /// server runs without the console (the CLI's default address, which
    /// another server on the machine may hold); true: the start fails.
    pub required: bool,
}

impl ConsoleSettings {
    pub fn new(listen: SocketAddr) -> ConsoleSettings {
        ConsoleSettings {
            listen,
            session_ttl: Duration::from_secs(8 * 3600),
            required: true,
        }
    }
}

/// What one client may hold of the server's listeners (the API, the web
/// console, the autoscaler service): the server shares its process (and
/// its file descriptors) with the embedded Kubernetes API, so idle or slow
/// sockets must never pile up. A connection over a limit is closed at once
/// (`knit_connections_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once on the API's listeners together
    /// (`--max-connections`).
    pub max_connections: usize,
    /// Connections open at once from one client address, on each listener
    /// (`--max-connections-per-address`).
    pub max_per_address: usize,
    /// Connections open at once on the web console (`--console-max-connections`).
    pub console_max_connections: usize,
    /// Connections open at once on the autoscaler service
    /// (`--autoscaler-max-connections`).
    pub autoscaler_max_connections: usize,
    /// A TLS handshake not finished in this time closes the connection.
    pub handshake_timeout: Duration,
    /// HTTP/1.1 request headers not complete in this time (from the
    /// connection's start or the end of the last request) close the
    /// connection (`--header-timeout`).
    pub header_timeout: Duration,
    /// A connection with no request in flight (a response still being
    /// sent counts as in flight) for this long is closed; HTTP/2 pings do
    /// not keep it open.
    pub idle_timeout: Duration,
    /// The largest request body; larger ones are answered 413.
    pub max_body_bytes: usize,
    /// HTTP/2 streams open at once on one connection (`--http2-max-streams`).
    pub http2_max_streams: u32,
    /// HTTP/2 keep-alive: a PING after this long without a frame, the
    /// connection closed when its answer does not come in
    /// `http2_keepalive_timeout`.
    pub http2_keepalive_interval: Duration,
    pub http2_keepalive_timeout: Duration,
    /// Node reports: each node (report token) may send `report_burst`
    /// reports at once, then one per `report_refill` (token bucket).
    pub report_burst: u32,
    pub report_refill: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 1024,
            max_per_address: 128,
            console_max_connections: 256,
            autoscaler_max_connections: 64,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_body_bytes: 2 * 1024 * 1024,
            http2_max_streams: knit_cluster::conn::DEFAULT_HTTP2_MAX_STREAMS,
            http2_keepalive_interval: Duration::from_secs(30),
            http2_keepalive_timeout: Duration::from_secs(20),
            // An agent sends two reports a phase, ten phases: room for
            // a rerun besides.
            report_burst: 60,
            report_refill: Duration::from_secs(1),
        }
    }
}

impl ConnectionLimits {
    /// The limits of one listener, `max_connections` in all.
    pub fn listener(&self, max_connections: usize) -> knit_cluster::conn::ListenerLimits {
        knit_cluster::conn::ListenerLimits {
            max_connections,
            max_per_address: self.max_per_address,
        }
    }

    /// The HTTP limits of an admitted connection.
    pub fn http(&self) -> knit_cluster::conn::HttpLimits {
        knit_cluster::conn::HttpLimits {
            handshake_timeout: self.handshake_timeout,
            header_timeout: self.header_timeout,
            http2_max_streams: self.http2_max_streams,
            http2_keepalive_interval: self.http2_keepalive_interval,
            http2_keepalive_timeout: self.http2_keepalive_timeout,
        }
    }
}

impl Settings {
    pub fn new(state_dir: PathBuf) -> Settings {
        Settings {
            datastore: knit_db::Datastore::Sqlite(state_dir.join("knit.db")),
            state_dir,
            listen: SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)),
            also_listen: Vec::new(),
            advertise_host: None,
            limits: ConnectionLimits::default(),
            parallelism: 4,
            join_token_ttl: Duration::from_secs(30 * 60),
            max_create_attempts: 5,
            reconcile_interval: Duration::from_secs(2),
            console: None,
            lease_ttl: Duration::from_secs(8),
            drain_skip_wait: DEFAULT_SKIP_WAIT,
            autoscaler: None,
            secrets_key_file: None,
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

/// The state the control plane's rooms share. Its fields are the crate's
/// own; outside it, the accessors below read what `knit server` and the
/// tests need.
pub struct ControlPlane {
    pub(crate) store: Store,
    pub(crate) metrics: Metrics,
    pub(crate) provider: Option<Arc<dyn Provider>>,
    pub(crate) cluster: Arc<dyn ClusterJoin>,
    pub(crate) settings: Settings,
    pub(crate) ca_pem: String,
    pub(crate) admin_token: String,
    /// `https://<advertise host>:<port>`: the base instances use.
    pub(crate) advertise_url: String,
    pub(crate) mirror_dir: PathBuf,
    pub(crate) wake: tokio::sync::Notify,
    pub(crate) plan_lock: tokio::sync::Mutex<()>,
    pub(crate) in_flight: std::sync::Mutex<HashSet<String>>,
    pub(crate) parallelism: Arc<tokio::sync::Semaphore>,
    /// This server among others on the datastore, and its leader lease.
    pub(crate) leadership: Leadership,
    /// When this server last wrote each API token's last use (by id), so
    /// a busy client costs one write a minute (`http::auth`).
    pub(crate) token_uses: std::sync::Mutex<std::collections::HashMap<String, i64>>,
    /// Each node's report allowance (`crate::join::allow_report`).
    pub(crate) report_limiter: ReportLimiter,
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
            // Every caller gets a provider whose calls are bounded in time
            // and output, whatever the provider itself does.
            provider: provider.map(BoundedProvider::wrap),
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
            leadership: Leadership::new(),
            token_uses: std::sync::Mutex::new(std::collections::HashMap::new()),
            report_limiter: ReportLimiter::default(),
        }
    }

    /// The datastore.
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// `https://<advertise host>:<port>`: the base instances use.
    pub fn advertise_url(&self) -> &str {
        &self.advertise_url
    }

    /// The package mirror's directory.
    pub fn mirror_dir(&self) -> &Path {
        &self.mirror_dir
    }

    /// This server among others on the datastore, and its leader lease.
    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    pub fn provider(&self) -> Result<&Arc<dyn Provider>> {
        self.provider.as_ref().ok_or_else(|| {
            ServerError::from(crate::provider::ProviderError::refused(
                "none",
                "this server runs without a provider (--provider none)",
            ))
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

/// Where the service listens (`knit server --autoscaler-listen`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoscalerSettings {
    pub listen: SocketAddr,
    /// false: an address already taken only logs a warning and the server
    /// runs without the service (the CLI's default address, which another
    /// server on the machine may hold); true: the start fails.
    pub required: bool,
}

/// A pod being deleted on a node that is not Ready stops blocking this
/// long after its deletion was due (Cluster API's
/// `SkipWaitForDeleteTimeoutSeconds` for unreachable nodes): the default of
/// [`crate::Settings::drain_skip_wait`].
pub const DEFAULT_SKIP_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// This server's identity and what it knows of its lease.
pub struct Leadership {
    /// Unique per process start: `<hostname>-<pid>-<random>`.
    pub id: String,
    pub hostname: String,
    pub started_ms: i64,
    lease: Mutex<Option<Lease>>,
}

impl Leadership {
    pub fn new() -> Leadership {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "knit".into());
        let mut random = [0u8; 4];
        // Without randomness the pid still tells processes of one host apart.
        let _ = getrandom::getrandom(&mut random);
        Leadership {
            id: format!("{hostname}-{}-{}", std::process::id(), hex::encode(random)),
            hostname,
            started_ms: now_ms(),
            lease: Mutex::new(None),
        }
    }

    pub(crate) fn set(&self, lease: Option<Lease>) {
        *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = lease;
    }

    /// The lease, while this server holds it by its own clock. Past the
    /// expiry (renewal failing: the datastore down or slow) this server
    /// starts no new leader work; the datastore refuses writes of work
    /// already started.
    pub fn fence(&self) -> Option<Fence> {
        let lease = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        lease
            .as_ref()
            .filter(|l| l.expires_ms > now_ms())
            .map(|l| Fence {
                holder: l.holder.clone(),
                epoch: l.epoch,
            })
    }

    pub fn is_leader(&self) -> bool {
        self.fence().is_some()
    }
}

impl Default for Leadership {
    fn default() -> Self {
        Leadership::new()
    }
}

/// Each node's report allowance: a token bucket per report token (so per
/// node), `burst` reports at once then one per `refill`. Kept in memory:
/// each server of several counts its own share.
#[derive(Default)]
pub struct ReportLimiter {
    buckets: std::sync::Mutex<std::collections::HashMap<String, Bucket>>,
}

struct Bucket {
    tokens: f64,
    at: std::time::Instant,
}

/// Buckets kept before full ones (nodes that went quiet or left) are
/// dropped.
const MAX_BUCKETS: usize = 8192;

impl ReportLimiter {
    /// Takes one report from `key`'s bucket; `Err(wait)` when it is empty:
    /// the time until the next one is allowed.
    pub fn take(
        &self,
        key: &str,
        burst: u32,
        refill: std::time::Duration,
    ) -> std::result::Result<(), std::time::Duration> {
        let now = std::time::Instant::now();
        let burst = f64::from(burst.max(1));
        let per_sec = 1.0 / refill.as_secs_f64().max(1e-3);
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(key) {
            buckets
                .retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * per_sec < burst);
        }
        let b = buckets.entry(key.to_string()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * per_sec).min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(std::time::Duration::from_secs_f64(
                (1.0 - b.tokens) / per_sec,
            ))
        }
    }
}
