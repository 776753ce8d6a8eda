//! knit's embedded Kubernetes API subset: the part of a Kubernetes control
//! plane that nodes and `kubectl` talk to when no kube-apiserver exists.
//!
//! It serves HTTPS with a cluster CA generated at first start (persisted in
//! the data dir), authenticates bootstrap tokens, client certificates and an
//! admin credential, stores objects durably (SQLite, or PostgreSQL shared by
//! several servers) with one increasing resourceVersion, supports list +
//! watch with bookmarks, and runs the
//! controllers joining needs: kubelet-client CSR approval and signing,
//! `cluster-info` JWS signing, and node lifecycle (stale Lease → Unknown).
//!
//! ```no_run
//! # async fn demo() -> Result<(), knit_cluster::ClusterError> {
//! use std::time::Duration;
//! let cfg = knit_cluster::ClusterConfig::new("/var/lib/knit/cluster", "0.0.0.0:6443".parse().unwrap());
//! let cluster = knit_cluster::EmbeddedCluster::start(cfg).await?;
//! let token = cluster.create_bootstrap_token(Some("node-1"), Duration::from_secs(3600), &[])?;
//! println!("{} {} {}", cluster.endpoint(), cluster.ca_pin(), token.token());
//! cluster.shutdown().await;
//! # Ok(()) }
//! ```

mod admission;
mod api;
mod auth;
pub mod conn;
mod controllers;
mod disruption;
mod error;
mod ipam;
mod metrics;
mod paging;
mod patch;
mod pki;
mod pod_controllers;
mod pods;
mod resources;
mod selector;
mod store;
mod table;
pub mod tls;
mod tokens;
mod util;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::ServiceExt;

pub use controllers::{KUBELET_CLIENT_SIGNER, NOT_READY_TAINT, UNREACHABLE_TAINT};
pub use error::{ApiStatus, ClusterError};
pub use pki::spki_pin;
pub use resources::{served_version, set_served_version};
pub use tokens::BootstrapToken;

/// How the embedded cluster runs.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Holds the CA (`pki/`), the store (`cluster.db`) and `admin.kubeconfig`.
    pub data_dir: PathBuf,
    /// Where to listen, e.g. `0.0.0.0:6443`, or port 0 for an ephemeral one.
    pub listen: SocketAddr,
    /// Host or IP clients use; defaults to the listen IP, or 127.0.0.1 when
    /// listening on all addresses.
    pub advertise_address: Option<String>,
    /// More names/IPs for the serving certificate.
    pub extra_sans: Vec<String>,
    /// Lifetime of kubelet client certificates issued from CSRs.
    pub cert_ttl: Duration,
    /// A node whose Lease is older than this goes Ready=Unknown (40 s in
    /// Kubernetes).
    pub node_grace_period: Duration,
    /// Interval of BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Connections open at once on the API, in all and from one client
    /// address; over either a new connection is closed at once.
    pub connections: conn::ListenerLimits,
    /// TLS handshake and request head timeouts, HTTP/2 streams and pings.
    pub http: conn::HttpLimits,
    /// Where the connection counters go (`knit_connections_*`); the API's
    /// own `/metrics` has them too.
    pub connection_metrics: conn::ConnectionMetrics,
    /// Where the objects live: `None` is `cluster.db` (SQLite) in
    /// `data_dir`; a PostgreSQL datastore is shared with the other servers
    /// on it, whose changes this server's watches follow. (An SQLite file
    /// given here must be the cluster's own: its schema version is the
    /// file's.)
    pub datastore: Option<knit_db::Datastore>,
    /// The cluster's pod CIDR (IPv4), cut into one subnet per Node
    /// (`spec.podCIDR`) as kube-controller-manager's node IPAM does;
    /// default: the Cluster spec's default `network.podCidr`.
    pub pod_cidr: String,
    /// Mask size of each node's subnet (kube-controller-manager's
    /// `--node-cidr-mask-size`, 24 by default).
    pub node_cidr_mask_size: u8,
    /// Changes kept in memory (and, on PostgreSQL, in the change log): a
    /// watch may resume, and a paged list continue, from any
    /// resourceVersion among the last this many changes; older ones get
    /// 410 Gone. Default 20,000.
    pub change_history: usize,
}

impl ClusterConfig {
    pub fn new(data_dir: impl Into<PathBuf>, listen: SocketAddr) -> ClusterConfig {
        ClusterConfig {
            data_dir: data_dir.into(),
            listen,
            advertise_address: None,
            extra_sans: Vec::new(),
            cert_ttl: Duration::from_secs(365 * 24 * 3600),
            node_grace_period: Duration::from_secs(40),
            bookmark_interval: Duration::from_secs(60),
            connections: conn::ListenerLimits {
                max_connections: DEFAULT_MAX_CONNECTIONS,
                max_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            },
            http: conn::HttpLimits {
                header_timeout: Duration::from_secs(30),
                ..conn::HttpLimits::default()
            },
            connection_metrics: conn::ConnectionMetrics::default(),
            datastore: None,
            pod_cidr: knit_api::pool::ClusterNetwork::default().pod_cidr,
            node_cidr_mask_size: 24,
            change_history: store::HISTORY,
        }
    }
}

/// Stops a running cluster; cheap to clone.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<watch::Sender<bool>>);

impl ShutdownHandle {
    pub fn shutdown(&self) {
        self.0.send_replace(true);
    }
}

/// Async workers of the API server's own runtime. One: its requests are
/// short (a Lease update, a Node read; the datastore's waits are handed
/// off through the blocking pool or `block_in_place`), and with two, each
/// of a kubelet's requests woke the idle worker only for it to park again
/// — 1,000 heartbeating nodes cost 10–21 % less CPU on one worker, with
/// the same join and list latencies (docs/benchmarks.md).
const API_WORKERS: usize = 1;
/// Threads for store work (SQLite, patches) at most; more requests wait.
const API_BLOCKING_THREADS: usize = 64;
/// Open API connections at most by default (each kubelet keeps one or
/// two).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Open API connections from one client address at most by default (a
/// node's kubelet and kube-proxy keep a few; HAProxy in front of several
/// servers is one address for all: `--max-connections-per-address`).
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;

pub struct EmbeddedCluster {
    endpoint: String,
    local_addr: SocketAddr,
    ca: Arc<pki::Ca>,
    store: Arc<store::Store>,
    admin_kubeconfig: PathBuf,
    metrics: Arc<metrics::Metrics>,
    shutdown: ShutdownHandle,
    /// Fires when the server and controllers have ended.
    stopped: Option<tokio::sync::oneshot::Receiver<()>>,
}

/// Every Node as this server keeps it (what `GET /api/v1/nodes` answers),
/// shared rather than copied ([`EmbeddedCluster::node_reader`]). The
/// embedding process reads each Node's Ready condition every reconcile
/// pass: 1,000 Nodes listed through the API every 2 s were serialized,
/// encrypted and parsed again for that.
#[derive(Clone)]
pub struct NodeReader {
    store: Arc<store::Store>,
}

impl NodeReader {
    /// Every Node. May read the datastore (when nothing is kept in
    /// memory): call it off the async workers.
    pub fn nodes(&self) -> Result<Vec<Arc<serde_json::Value>>, ClusterError> {
        Ok(self.store.list_shared("nodes", None)?.0)
    }
}

/// A follower of the Node changes ([`EmbeddedCluster::node_changes`]).
pub struct NodeChanges {
    feed: tokio::sync::broadcast::Receiver<Arc<store::Change>>,
    store: Arc<store::Store>,
}

/// One [`NodeChanges`] step.
#[derive(Debug, Clone)]
pub enum NodeChange {
    /// A Node was created or changed: its name and the object as stored.
    Changed(String, Arc<serde_json::Value>),
    Deleted(String),
    /// Changes were missed (the follower fell behind, or the store
    /// restarted its feed): what the follower knows may be stale.
    Missed,
}

impl NodeChanges {
    /// The next Node change, as soon as it is stored.
    pub async fn next(&mut self) -> NodeChange {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match self.feed.recv().await {
                Ok(c) if c.resource == "nodes" => {
                    return match c.kind {
                        store::EventType::Deleted => NodeChange::Deleted(c.name.clone()),
                        _ => NodeChange::Changed(c.name.clone(), c.object.clone()),
                    }
                }
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => return NodeChange::Missed,
                Err(RecvError::Closed) => {
                    self.feed = self.store.subscribe();
                    return NodeChange::Missed;
                }
            }
        }
    }
}

impl Drop for EmbeddedCluster {
    fn drop(&mut self) {
        // Its runtime thread serves until told: the owner going is that.
        self.shutdown.shutdown();
    }
}

impl EmbeddedCluster {
    /// Open (or initialize) the data dir, bind, and serve until shut down.
    ///
    /// The API server and its controllers run on a runtime of their own
    /// (own threads): whatever the embedding process does on its async
    /// workers, even blocking them, never delays a node's lease renewal.
    pub async fn start(cfg: ClusterConfig) -> Result<EmbeddedCluster, ClusterError> {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("knit-cluster".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(API_WORKERS)
                    .max_blocking_threads(API_BLOCKING_THREADS)
                    .thread_name("knit-cluster-api")
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ =
                            started_tx.send(Err(ClusterError::io("the API server's runtime", e)));
                        return;
                    }
                };
                rt.block_on(async move {
                    match EmbeddedCluster::start_here(cfg).await {
                        Ok((cluster, tasks)) => {
                            if started_tx.send(Ok(cluster)).is_err() {
                                return; // the caller is gone; Drop stopped it
                            }
                            for t in tasks {
                                // A task that panicked is already over.
                                let _ = t.await;
                            }
                        }
                        Err(e) => {
                            let _ = started_tx.send(Err(e));
                        }
                    }
                });
                // Watch streams still open end with the runtime.
                rt.shutdown_timeout(Duration::from_secs(5));
                let _ = stopped_tx.send(());
            })
            .map_err(|e| ClusterError::io("the API server's thread", e))?;
        let mut cluster = started_rx.await.map_err(|_| {
            ClusterError::Config("the API server's thread ended while starting".into())
        })??;
        cluster.stopped = Some(stopped_rx);
        Ok(cluster)
    }

    async fn start_here(
        cfg: ClusterConfig,
    ) -> Result<(EmbeddedCluster, Vec<JoinHandle<()>>), ClusterError> {
        let pki_dir = cfg.data_dir.join("pki");
        create_private_dir(&cfg.data_dir)?;
        create_private_dir(&pki_dir)?;
        let pod_cidrs = ipam::PodCidrs::new(&cfg.pod_cidr, cfg.node_cidr_mask_size)?;
        let ca = Arc::new(pki::Ca::load_or_create(&pki_dir)?);
        let datastore = match &cfg.datastore {
            Some(datastore) => datastore.clone(),
            None => knit_db::Datastore::Sqlite(cfg.data_dir.join("cluster.db")),
        };
        let store = Arc::new(store::Store::open_with_history(
            &datastore,
            knit_db::Limits::default(),
            cfg.change_history,
        )?);
        for ns in resources::NAMESPACES {
            if store.get("namespaces", "", ns)?.is_none() {
                let created = store.create(
                    "namespaces",
                    "",
                    json!({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": ns}, "status": {"phase": "Active"}}),
                );
                match created {
                    // Another server sharing the datastore, starting too.
                    Err(e) if e.code == 409 => {}
                    other => {
                        other?;
                    }
                }
            }
        }

        let listener = TcpListener::bind(cfg.listen)
            .await
            .map_err(|e| ClusterError::io(cfg.listen.to_string(), e))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| ClusterError::io(cfg.listen.to_string(), e))?;
        let host = cfg.advertise_address.clone().unwrap_or_else(|| {
            if cfg.listen.ip().is_unspecified() {
                "127.0.0.1".into()
            } else {
                cfg.listen.ip().to_string()
            }
        });
        let host_port = match host.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => format!("[{host}]:{}", local_addr.port()),
            _ => format!("{host}:{}", local_addr.port()),
        };
        let endpoint = format!("https://{host_port}");

        let mut sans: Vec<String> = vec![
            host.clone(),
            // The control plane reaches the API at the address it listens
            // on, which may be neither the advertised host nor loopback.
            cfg.listen.ip().to_string(),
            "127.0.0.1".into(),
            "localhost".into(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
        ];
        if !cfg.listen.ip().is_unspecified() {
            sans.push(cfg.listen.ip().to_string());
        }
        sans.extend(cfg.extra_sans.iter().cloned());
        sans.sort();
        sans.dedup();
        let (server_cert, server_key) =
            ca.issue_server(&sans, Duration::from_secs(365 * 24 * 3600))?;
        let tls = tls::server_config(ca.cert_pem(), &server_cert, &server_key)?;

        let admin_kubeconfig = cfg.data_dir.join("admin.kubeconfig");
        let (admin_cert, admin_key) = ca.issue_client(
            "kubernetes-admin",
            &[auth::MASTERS],
            Duration::from_secs(365 * 24 * 3600),
        )?;
        pki::write_private(
            &admin_kubeconfig,
            &kubeconfig(&endpoint, ca.cert_pem(), &admin_cert, &admin_key)
                .map_err(|e| ClusterError::Config(e.to_string()))?,
        )?;

        let (tx, rx) = watch::channel(false);
        let shutdown = ShutdownHandle(Arc::new(tx));
        let controllers = controllers::Controllers {
            store: store.clone(),
            ca: ca.clone(),
            endpoint: endpoint.clone(),
            cert_ttl: cfg.cert_ttl,
            grace: cfg.node_grace_period,
            pod_cidrs,
        };
        controllers.sync_cluster_info()?;
        let metrics = Arc::new(metrics::Metrics::default());
        metrics.add_connections(&cfg.connection_metrics);
        let mut connections = cfg.connections;
        // The descriptors they may take must exist (the knit server checks
        // the sum of every listener's; this is for the API alone).
        match conn::fit_descriptors(&mut [("kube-api", &mut connections.max_connections)]) {
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "the open-file limit could not be read"),
        }
        connections.max_per_address = connections.max_per_address.min(connections.max_connections);
        let gate = conn::Gate::new("kube-api", connections, cfg.connection_metrics.clone());
        let state = Arc::new(api::AppState {
            store: store.clone(),
            metrics: metrics.clone(),
            server_address: host_port,
            bookmark_interval: cfg.bookmark_interval,
            shutdown: rx.clone(),
        });
        let app = axum::Router::new().fallback(api::handle).with_state(state);
        let tasks = vec![
            tokio::spawn(controllers.run(rx.clone())),
            tokio::spawn(serve(
                listener,
                tokio_rustls::TlsAcceptor::from(tls),
                app,
                gate,
                cfg.http,
                rx,
            )),
        ];
        tracing::info!(%endpoint, ca_pin = ca.pin(), "embedded cluster API serving");
        Ok((
            EmbeddedCluster {
                endpoint,
                local_addr,
                ca,
                store,
                admin_kubeconfig,
                metrics,
                shutdown,
                stopped: None,
            },
            tasks,
        ))
    }

    /// `https://host:port` clients use.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The cluster CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// `sha256:<hex of the CA's SubjectPublicKeyInfo>`.
    pub fn ca_pin(&self) -> &str {
        self.ca.pin()
    }

    /// kubeconfig with a `system:masters` client certificate.
    pub fn admin_kubeconfig_path(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// Mint a bootstrap token (`[a-z0-9]{6}.[a-z0-9]{16}`) valid for `ttl`,
    /// stored as a kube-system Secret. With `node_name`, the CSR approver
    /// only approves a client certificate for that node name. Extra groups
    /// must start with `system:bootstrappers:`.
    pub fn create_bootstrap_token(
        &self,
        node_name: Option<&str>,
        ttl: Duration,
        extra_groups: &[String],
    ) -> Result<BootstrapToken, ClusterError> {
        let token = self.mint_bootstrap_token(node_name, ttl, extra_groups)?;
        // Signed now, so the holder can discover the cluster at once.
        controllers::sign_cluster_info_for(&self.store, &self.ca, &self.endpoint, &token)?;
        Ok(token)
    }

    /// [`EmbeddedCluster::create_bootstrap_token`] for a node given the
    /// cluster's CA with its token (knit's NodeConfig carries it), which
    /// never discovers the CA from cluster-info: the token's signature
    /// there is made in the controllers' next batch (within 200 ms), not at
    /// once. At once, each token rewrote the whole ConfigMap, one signature
    /// per token: a scale-out of N wrote it N times, each bigger.
    pub fn create_bootstrap_token_signed_in_batch(
        &self,
        node_name: Option<&str>,
        ttl: Duration,
    ) -> Result<BootstrapToken, ClusterError> {
        self.mint_bootstrap_token(node_name, ttl, &[])
    }

    /// A new bootstrap token's Secret, checked and stored.
    fn mint_bootstrap_token(
        &self,
        node_name: Option<&str>,
        ttl: Duration,
        extra_groups: &[String],
    ) -> Result<BootstrapToken, ClusterError> {
        if let Some(bad) = extra_groups.iter().find(|g| !tokens::valid_extra_group(g)) {
            return Err(ClusterError::Config(format!(
                "extra group {bad:?} must match system:bootstrappers:[a-z0-9:-]+"
            )));
        }
        if let Some(n) = node_name.filter(|n| !knit_api::validate::is_dns_subdomain(n)) {
            return Err(ClusterError::Config(format!(
                "node name {n:?} is not a DNS subdomain"
            )));
        }
        let token = tokens::new_token(node_name, ttl)?;
        self.store.create(
            "secrets",
            "kube-system",
            tokens::token_secret(&token, extra_groups),
        )?;
        Ok(token)
    }

    /// Revoke a token (its Secret is deleted); unknown ids are not an error.
    pub fn delete_bootstrap_token(&self, id: &str) -> Result<(), ClusterError> {
        match self
            .store
            .delete("secrets", "kube-system", &tokens::secret_name(id))
        {
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Revokes every bootstrap token bound to `node` (its instance is
    /// gone, or it has joined); the number deleted.
    pub fn delete_bootstrap_tokens_of(&self, node: &str) -> Result<usize, ClusterError> {
        delete_tokens_bound_to(&self.store, node)
    }

    /// API request and watch metrics, Prometheus text format (also served
    /// at `/metrics` to admins).
    pub fn metrics_text(&self) -> String {
        self.metrics.text(self.store.current_rv())
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// A reader of every Node as this server keeps it, for the process
    /// embedding the cluster (see [`NodeReader`]).
    pub fn node_reader(&self) -> NodeReader {
        NodeReader {
            store: self.store.clone(),
        }
    }

    /// The Node changes as the store makes them, for the process embedding
    /// the cluster (it reports node status as soon as a Node changes).
    pub fn node_changes(&self) -> NodeChanges {
        NodeChanges {
            feed: self.store.subscribe(),
            store: self.store.clone(),
        }
    }

    /// Stop serving and wait for the server and controllers to end.
    pub async fn shutdown(mut self) {
        self.shutdown.shutdown();
        if let Some(stopped) = self.stopped.take() {
            // An error only means the thread is already gone.
            let _ = stopped.await;
        }
    }
}

fn create_private_dir(dir: &Path) -> Result<(), ClusterError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| ClusterError::io(dir, e))
}

/// A kubeconfig with embedded CA and client certificate.
pub fn kubeconfig(
    server: &str,
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> std::result::Result<String, knit_api::ser::SerializeError> {
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "knit", "cluster": {"server": server, "certificate-authority-data": STANDARD.encode(ca_pem)}}],
        "users": [{"name": "kubernetes-admin", "user": {
            "client-certificate-data": STANDARD.encode(cert_pem),
            "client-key-data": STANDARD.encode(key_pem)}}],
        "contexts": [{"name": "kubernetes-admin@knit", "context": {"cluster": "knit", "user": "kubernetes-admin"}}],
        "current-context": "kubernetes-admin@knit",
    });
    knit_api::ser::yaml("the admin kubeconfig", &doc)
}

async fn serve(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    app: axum::Router,
    gate: Arc<conn::Gate>,
    http: conn::HttpLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.changed() => return,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Bounded in all and per client address: idle or slow clients
        // cannot take every descriptor of the process (the knit server
        // shares it). Over a limit the connection is closed now, not left
        // in the backlog (the gate counts and logs it).
        let Ok(admission) = gate.admit(peer.ip()) else {
            drop(tcp);
            continue;
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            let _admission = admission;
            let tls = match tokio::time::timeout(http.handshake_timeout, acceptor.accept(tcp)).await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let ident = api::PeerIdentity(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| pki::cert_identity(c)),
            );
            let svc = hyper::service::service_fn(
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ident.clone());
                    app.clone().oneshot(req.map(axum::body::Body::new))
                },
            );
            // The protocol ALPN chose; a client that sends no complete
            // request head in time is dropped; HTTP/2 streams are capped
            // and peers that vanished (a deleted instance) found by pings
            // instead of holding the connection forever.
            let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            let builder = http.builder(alpn.as_deref().or(Some(b"http/1.1")));
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
            tokio::select! {
                r = conn => if let Err(e) = r { tracing::debug!(%peer, error = %e, "connection ended with an error") },
                _ = stop.changed() => {}
            }
        });
    }
}

/// Deletes the bootstrap token Secrets bound to `node`; the number deleted.
pub(crate) fn delete_tokens_bound_to(
    store: &store::Store,
    node: &str,
) -> Result<usize, ClusterError> {
    // Shared, not copied: one Node registering looked through every
    // token Secret's copy (a fifth of the server's CPU in a 1,000-node join).
    let (secrets, _) = store.list_shared("secrets", Some("kube-system"))?;
    let mut deleted = 0;
    for s in secrets {
        if s["type"].as_str() != Some(tokens::SECRET_TYPE) || tokens::bound_node(&s) != Some(node) {
            continue;
        }
        let name = util::name_of(&s);
        match store.delete("secrets", "kube-system", name) {
            Ok(_) => {
                deleted += 1;
                tracing::info!(secret = name, node, "deleted the bootstrap token of node");
            }
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(deleted)
}
