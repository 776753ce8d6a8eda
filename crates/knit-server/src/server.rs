//! Starting the control plane: state directory, CA, admin token, store,
//! HTTPS listener and reconciler.

use crate::api::{router, Peer};
use crate::bootstrap::ClusterJoin;
use crate::control::{ControlPlane, Settings, LOCAL_GATEWAY};
use crate::error::{Result, ServerError};
use crate::pki::{load_or_create_token, Pki};
use crate::provider::Provider;
use crate::store::Store;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::watch;
use tower::ServiceExt;

/// A running server; dropping it does not stop it, call [`Server::shutdown`].
pub struct Server {
    pub addr: SocketAddr,
    /// URL the CLI on this machine uses.
    pub local_url: String,
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

/// Creates the state directory (0700) and everything in it that is missing.
pub async fn start(
    settings: Settings,
    provider: Option<Arc<dyn Provider>>,
    cluster: Arc<dyn ClusterJoin>,
) -> Result<Server> {
    use std::os::unix::fs::PermissionsExt;
    let dir = &settings.state_dir;
    std::fs::create_dir_all(dir)
        .map_err(|e| ServerError::io(format!("create {}", dir.display()), e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| ServerError::io(format!("chmod {}", dir.display()), e))?;
    std::fs::create_dir_all(settings.mirror_dir())
        .map_err(|e| ServerError::io(format!("create {}", settings.mirror_dir().display()), e))?;
    let pki = Pki::load_or_create(&settings.pki_dir())?;
    let admin_token = load_or_create_token(&settings.admin_token_path())?;
    let store = Store::open(&settings.db_path())?;
    if store.cluster()?.is_none() {
        store.put_cluster(&knit_api::Cluster::default())?;
    }
    // `apiServer: external` in the stored spec: nodes join that cluster.
    let spec = store.cluster()?.unwrap_or_default();
    let cluster = crate::external::select(&spec, cluster, settings.join_token_ttl).await?;

    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| ServerError::io(format!("listen on {}", settings.listen), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| ServerError::io("local address", e))?;
    let advertise_host = settings.advertise_host.clone().unwrap_or_else(|| {
        if addr.ip().is_unspecified() {
            LOCAL_GATEWAY.to_string()
        } else {
            addr.ip().to_string()
        }
    });
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
    if addr.ip().is_unspecified() {
        sans.push(LOCAL_GATEWAY.to_string());
    }
    let tls = tokio_rustls::TlsAcceptor::from(pki.server_config(&sans)?);
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
    // Snapshot builds cut off by the previous server's end.
    crate::snapshot::recover(&control)?;
    let (shutdown, rx) = watch::channel(false);
    let app = router(control.clone());
    let accept = tokio::spawn(accept_loop(listener, tls, app, rx.clone()));
    let reconciler = tokio::spawn(control.clone().run_reconciler(rx));
    tracing::info!(%addr, advertise = %control.advertise_url, "knit server listening");
    Ok(Server {
        addr,
        local_url,
        control,
        shutdown,
        tasks: vec![accept, reconciler],
    })
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    tls: tokio_rustls::TlsAcceptor,
    app: axum::Router,
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
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let tls = tls.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let stream = match tls.accept(tcp).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            let service = hyper::service::service_fn(
                move |mut request: hyper::Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(Peer(peer));
                    app.clone().oneshot(request.map(axum::body::Body::new))
                },
            );
            if let Err(e) = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}
