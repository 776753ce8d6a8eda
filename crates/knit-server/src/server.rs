//! Starting the control plane: state directory, CA, admin token, store,
//! HTTPS listener and reconciler.

use crate::bootstrap::ClusterJoin;
use crate::control::{ConnectionLimits, ControlPlane, Settings};
use crate::error::{Result, ServerError};
use crate::http::{router, Peer};
use crate::pki::{load_or_create_token, Pki};
use crate::provider::Provider;
use crate::store::Store;
use hyper_util::rt::TokioIo;
use knit_cluster::conn::Gate;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt;

/// A running server; dropping it does not stop it, call [`Server::shutdown`].
pub struct Server {
    /// The first address listened on.
    pub addr: SocketAddr,
    /// Every address listened on.
    pub addrs: Vec<SocketAddr>,
    /// URL the CLI on this machine uses.
    pub local_url: String,
    /// Where the web console listens, when it does.
    pub console_addr: Option<SocketAddr>,
    /// Where cluster-autoscaler's externalgrpc service listens, when it does.
    pub autoscaler_addr: Option<SocketAddr>,
    pub control: Arc<ControlPlane>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Server {
    pub fn ca_pem(&self) -> &str {
        &self.control.ca_pem
    }
    pub fn admin_token(&self) -> &str {
        &self.control.admin_token
    }

    /// Stops accepting, stops the reconciler, waits for both.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// What `knit server init` makes before the first start: the control
/// plane's CA (its certificate's PEM) and the admin token, each made once
/// and read back after.
pub fn init_state(settings: &Settings) -> Result<(String, String)> {
    let pki = Pki::load_or_create(&settings.pki_dir(), &[settings.admin_token_path()])?;
    let token = load_or_create_token(&settings.admin_token_path())?;
    Ok((pki.ca_pem, token))
}

/// The Cluster spec stored in the datastore, read before the server
/// starts: the embedded API is started before [`start`] opens the store,
/// and takes its pod CIDR (node IPAM) from it. `None` on a datastore not
/// made yet (a new SQLite file is not created here).
pub fn stored_cluster(settings: &Settings) -> Result<Option<knit_api::Cluster>> {
    if let knit_db::Datastore::Sqlite(path) = &settings.datastore {
        if !path.exists() {
            return Ok(None);
        }
    }
    Store::open_datastore(&settings.datastore, knit_db::Limits::default())?.cluster()
}

/// Creates the state directory (0700) and everything in it that is missing.
pub async fn start(
    mut settings: Settings,
    provider: Option<Arc<dyn Provider>>,
    cluster: Arc<dyn ClusterJoin>,
) -> Result<Server> {
    use std::os::unix::fs::PermissionsExt;
    fit_descriptors(&mut settings);
    let dir = &settings.state_dir;
    std::fs::create_dir_all(dir)
        .map_err(|e| ServerError::io(format!("create {}", dir.display()), e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| ServerError::io(format!("chmod {}", dir.display()), e))?;
    std::fs::create_dir_all(settings.mirror_dir())
        .map_err(|e| ServerError::io(format!("create {}", settings.mirror_dir().display()), e))?;
    let store = Store::open_datastore(&settings.datastore, knit_db::Limits::default())?;
    tracing::info!(datastore = %settings.datastore.redacted(), "datastore open");
    // Several servers on one datastore share one CA and admin token.
    let sealing = crate::ha::adopt_shared_secrets(&store, &settings)?;
    // The CA is made at the first start only: when the admin token (made
    // with it) exists, or instances that fetched their NodeConfig (whose
    // nodes trust it), a missing CA is refused, never made again.
    let mut state = vec![settings.admin_token_path()];
    if store
        .instances(None)?
        .iter()
        .any(|i| i.report_token_hash.is_some())
    {
        state.push(settings.db_path());
    }
    let mut pki = Pki::load_or_create(&settings.pki_dir(), &state)?;
    let mut admin_token = load_or_create_token(&settings.admin_token_path())?;
    if crate::ha::publish_secrets(&store, &settings, sealing.as_ref())? {
        // Another server made them first: use its.
        pki = Pki::load_or_create(&settings.pki_dir(), &state)?;
        admin_token = load_or_create_token(&settings.admin_token_path())?;
    }
    if store.cluster()?.is_none() {
        store.put_cluster(&knit_api::Cluster::default())?;
    }
    // `apiServer: external` in the stored spec: nodes join that cluster.
    let spec = store.cluster()?.unwrap_or_default();
    let cluster = crate::cluster::external::select(&spec, cluster, settings.join_token_ttl).await?;

    let gateway = provider.as_ref().and_then(|p| p.gateway());
    let (listeners, addrs) = bind_all(&settings).await?;
    let console_listener = bind_console(&settings).await?;
    let console_addr = console_listener
        .as_ref()
        .map(|l| l.local_addr())
        .transpose()
        .map_err(|e| ServerError::io("local address", e))?;
    let addr = addrs[0];
    let advertise_host = advertise_host(&settings, &addrs, gateway);
    let local_host = if addr.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        addr.ip().to_string()
    };
    let mut sans = vec![
        local_host.clone(),
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        advertise_host.clone(),
    ];
    sans.extend(
        addrs
            .iter()
            .filter(|a| !a.ip().is_unspecified())
            .map(|a| a.ip().to_string()),
    );
    if let Some(a) = console_addr.filter(|a| !a.ip().is_unspecified()) {
        sans.push(a.ip().to_string());
    }
    // Listening everywhere: instances may use the gateway even when another
    // host name is advertised.
    if let Some(g) = gateway.filter(|_| addrs.iter().any(|a| a.ip().is_unspecified())) {
        sans.push(g.to_string());
    }
    let tls = tokio_rustls::TlsAcceptor::from(pki.server_config(&sans)?);
    let autoscaler = crate::autoscaler::bind(settings.autoscaler.as_ref(), &pki, &sans).await?;
    let autoscaler_addr = autoscaler.as_ref().map(|a| a.addr);
    let mut settings = settings;
    // The address bound (port 0: the one the kernel chose), for the
    // cloud-config `knit autoscaler cloud-config` prints.
    if let (Some(s), Some(a)) = (settings.autoscaler.as_mut(), autoscaler_addr) {
        s.listen = a;
    }
    let host_port = |h: &str| {
        if h.contains(':') {
            format!("[{h}]:{}", addr.port())
        } else {
            format!("{h}:{}", addr.port())
        }
    };
    let advertise_url = format!("https://{}", host_port(&advertise_host));
    let local_url = format!("https://{}", host_port(&local_host));

    let control = Arc::new(ControlPlane::new(
        store,
        provider,
        cluster,
        settings,
        pki.ca_pem,
        admin_token,
        advertise_url,
    ));
    crate::http::metrics::load_reader_token(&control)?;
    // The admin token file is the first API token (an admin), once.
    crate::api_tokens::seed_first_admin(&control)?;
    let (shutdown, rx) = watch::channel(false);
    let app = router(control.clone());
    let limits = control.settings.limits;
    let http = limits.http();
    // One gate for the API's sockets, one for the console: a flood of one
    // does not shut the other.
    let api_gate = Gate::new(
        "api",
        limits.listener(limits.max_connections),
        control.metrics.connections.clone(),
    );
    let mut tasks = Vec::new();
    for listener in listeners {
        tasks.push(tokio::spawn(accept_loop(
            listener,
            tls.clone(),
            app.clone(),
            api_gate.clone(),
            limits,
            rx.clone(),
        )));
    }
    if let (Some(listener), Some(console)) = (console_listener, &control.settings.console) {
        let (app, feed) =
            crate::http::console::router(control.clone(), console.session_ttl, rx.clone());
        let gate = Gate::new(
            "console",
            limits.listener(limits.console_max_connections),
            control.metrics.connections.clone(),
        );
        tasks.push(tokio::spawn(accept_loop(
            listener,
            tls.clone(),
            app,
            gate,
            limits,
            rx.clone(),
        )));
        tasks.push(feed);
        tracing::info!(address = ?console_addr, "knit web console listening under /ui/");
    }
    if let Some(bound) = autoscaler {
        tracing::info!(address = %bound.addr, "cluster-autoscaler externalgrpc service listening (mutual TLS)");
        let gate = Gate::new(
            "autoscaler",
            limits.listener(limits.autoscaler_max_connections),
            control.metrics.connections.clone(),
        );
        tasks.push(tokio::spawn(crate::autoscaler::serve(
            bound,
            control.clone(),
            gate,
            http,
            rx.clone(),
        )));
    }
    // knit's node events also go to the cluster as Kubernetes Events.
    tasks.push(crate::kube_events::start(&control, rx.clone()));
    // The lease first: the reconciler runs only on the leader. Taking the
    // lead also recovers snapshot builds cut off by a server's end.
    tasks.push(tokio::spawn(control.clone().run_leadership(rx.clone())));
    tasks.push(tokio::spawn(control.clone().run_reconciler(rx)));
    tracing::info!(addresses = ?addrs, advertise = %control.advertise_url, "knit server listening");
    Ok(Server {
        addr,
        addrs,
        local_url,
        console_addr,
        autoscaler_addr,
        control,
        shutdown,
        tasks,
    })
}

/// Binds `settings.listen`, then every address of `settings.also_listen` on
/// the same port (the one the first bind got, for port 0).
async fn bind_all(settings: &Settings) -> Result<(Vec<TcpListener>, Vec<SocketAddr>)> {
    let first = TcpListener::bind(settings.listen)
        .await
        .map_err(|e| ServerError::io(format!("listen on {}", settings.listen), e))?;
    let port = first
        .local_addr()
        .map_err(|e| ServerError::io("local address", e))?
        .port();
    let mut listeners = vec![first];
    for ip in &settings.also_listen {
        let want = SocketAddr::new(*ip, port);
        if listeners
            .iter()
            .any(|l| l.local_addr().is_ok_and(|a| a == want))
        {
            continue;
        }
        let listener = TcpListener::bind(want)
            .await
            .map_err(|e| ServerError::io(format!("listen on {want}"), e))?;
        listeners.push(listener);
    }
    let addrs = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| ServerError::io("local address", e))?;
    Ok((listeners, addrs))
}

/// The web console's listener: `None` without a console, or when its
/// address is taken and the console is not required (then a warning).
async fn bind_console(settings: &Settings) -> Result<Option<TcpListener>> {
    let Some(console) = &settings.console else {
        return Ok(None);
    };
    match TcpListener::bind(console.listen).await {
        Ok(listener) => Ok(Some(listener)),
        Err(e) if !console.required => {
            tracing::warn!(listen = %console.listen, error = %e, "the web console is not served: its address is taken (--console-listen chooses another)");
            Ok(None)
        }
        Err(e) => Err(ServerError::io(
            format!("listen on {} (web console)", console.listen),
            e,
        )),
    }
}

/// The host instances use: as told, else the provider's gateway when the
/// server listens there (or everywhere), else the first specific listen
/// address, else loopback.
pub fn advertise_host(
    settings: &Settings,
    addrs: &[SocketAddr],
    gateway: Option<std::net::IpAddr>,
) -> String {
    if let Some(host) = &settings.advertise_host {
        return host.clone();
    }
    if let Some(g) = gateway {
        if addrs.iter().any(|a| a.ip() == g || a.ip().is_unspecified()) {
            return g.to_string();
        }
    }
    addrs
        .iter()
        .map(|a| a.ip())
        .find(|ip| !ip.is_unspecified())
        .map(|ip| ip.to_string())
        .unwrap_or_else(|| "127.0.0.1".to_string())
}

/// Raises the open-file limit and lowers the listeners' connection limits
/// when they (with headroom) do not fit under it, saying so.
fn fit_descriptors(settings: &mut Settings) {
    let limits = &mut settings.limits;
    let mut fit: Vec<(&str, &mut usize)> = vec![("api", &mut limits.max_connections)];
    if settings.console.is_some() {
        fit.push(("console", &mut limits.console_max_connections));
    }
    if settings.autoscaler.is_some() {
        fit.push(("autoscaler", &mut limits.autoscaler_max_connections));
    }
    if let Err(e) = knit_cluster::conn::fit_descriptors(&mut fit) {
        tracing::warn!(error = %e, "the open-file limit (RLIMIT_NOFILE) could not be read");
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: tokio_rustls::TlsAcceptor,
    app: axum::Router,
    gate: Arc<Gate>,
    limits: ConnectionLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of descriptors and similar: wait instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Over a limit the connection is closed now (counted and logged by
        // the gate): a client waiting in the backlog could wait forever.
        let Ok(admission) = gate.admit(peer.ip()) else {
            drop(tcp);
            continue;
        };
        let tls = tls.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let _admission = admission;
            serve_connection(tcp, peer, tls, app, limits).await;
        });
    }
}

/// What a connection's watchdog reads: when the last request started or
/// ended, and how many are being answered.
#[derive(Default)]
struct Activity {
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    fn touch(&self, epoch: Instant) {
        self.last_ms
            .store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// Counts a request in flight until its response's body is sent (or
/// dropped): a long response (a watch, logs followed) is not idle.
struct InFlight {
    activity: Arc<Activity>,
    epoch: Instant,
}

impl InFlight {
    fn new(activity: Arc<Activity>, epoch: Instant) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        activity.touch(epoch);
        InFlight { activity, epoch }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.activity.touch(self.epoch);
        self.activity.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that holds its request's [`InFlight`] until it ends.
struct Tracked {
    inner: axum::body::Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    tls: tokio_rustls::TlsAcceptor,
    app: axum::Router,
    limits: ConnectionLimits,
) {
    let stream = match tokio::time::timeout(limits.handshake_timeout, tls.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let epoch = Instant::now();
    let activity = Arc::new(Activity::default());
    let requests = activity.clone();
    let service =
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(Peer(peer));
            let guard = InFlight::new(requests.clone(), epoch);
            let app = app.clone();
            async move {
                let response = app.oneshot(request.map(axum::body::Body::new)).await;
                response.map(|r| {
                    r.map(|inner| Tracked {
                        inner,
                        _in_flight: guard,
                    })
                })
            }
        });
    // The protocol ALPN chose (no sniffing, which waits with no timeout);
    // a client without ALPN speaks HTTP/1.1.
    let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let builder = limits.http().builder(alpn.as_deref().or(Some(b"http/1.1")));
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let tick = (limits.idle_timeout / 4).max(Duration::from_millis(100));
    loop {
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = tokio::time::sleep(tick) => {
                let idle = epoch.elapsed().saturating_sub(Duration::from_millis(
                    activity.last_ms.load(Ordering::Relaxed),
                ));
                if activity.in_flight.load(Ordering::Relaxed) == 0 && idle >= limits.idle_timeout {
                    tracing::debug!(%peer, idle_s = idle.as_secs(), "closing an idle connection");
                    // HTTP/2: GOAWAY first, so the client opens a new
                    // connection instead of failing a request; bounded.
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(5), conn.as_mut()).await;
                    return;
                }
            }
        }
    }
}
