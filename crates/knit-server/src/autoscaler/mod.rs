//! knit as a cloud provider of the real cluster-autoscaler: the gRPC
//! `CloudProvider` service of its externalgrpc provider
//! (`proto/externalgrpc.proto`), served on `--autoscaler-listen` with
//! mutual TLS. The autoscaler sees each auto-scaling pool as a node group;
//! what each call does to the pool is in [`service`] and
//! docs/autoscaling.md.
//!
//! Only a client whose certificate knit's CA issued
//! ([`crate::pki::Pki::client_certificate`], through `knit autoscaler
//! cloud-config`) gets past the TLS handshake.

pub(crate) mod service;
pub(crate) mod template;

// Its settings are the control plane's (`Settings::autoscaler`).
pub use crate::control::AutoscalerSettings;
use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::pki::Pki;
use knit_cluster::conn::{Admission, Gate, HttpLimits};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The code generated from the protos at build time (`build.rs`).
pub mod proto {
    /// cluster-autoscaler's externalgrpc contract.
    #[allow(clippy::all, missing_docs)]
    pub mod externalgrpc {
        tonic::include_proto!("clusterautoscaler.cloudprovider.v1.externalgrpc");
    }

    /// The part of Kubernetes' protobuf schema a template node is written
    /// with, in its packages (`k8s.io.api.core.v1` …).
    #[allow(clippy::all, missing_docs)]
    pub mod k8s {
        pub mod io {
            pub mod api {
                pub mod core {
                    pub mod v1 {
                        tonic::include_proto!("k8s.io.api.core.v1");
                    }
                }
            }
            pub mod apimachinery {
                pub mod pkg {
                    pub mod api {
                        pub mod resource {
                            tonic::include_proto!("k8s.io.apimachinery.pkg.api.resource");
                        }
                    }
                    pub mod apis {
                        pub mod meta {
                            pub mod v1 {
                                tonic::include_proto!("k8s.io.apimachinery.pkg.apis.meta.v1");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The autoscaler service's port by default (`--autoscaler-listen`), on
/// loopback.
pub const DEFAULT_PORT: u16 = 7445;
/// The Common Name of the client certificates `knit autoscaler
/// cloud-config` gets.
pub const CLIENT_CN: &str = "knit autoscaler client";

/// The bound listener and its TLS configuration, made before the control
/// plane takes the CA.
pub struct Bound {
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    pub addr: SocketAddr,
}

/// Binds the service's address and makes its serving certificate (for
/// `hosts` and the listen address), clients verified against knit's CA.
/// `None` when the service is off, or its default address is taken.
pub async fn bind(
    settings: Option<&AutoscalerSettings>,
    pki: &Pki,
    hosts: &[String],
) -> Result<Option<Bound>> {
    let Some(settings) = settings else {
        return Ok(None);
    };
    let listener = match TcpListener::bind(settings.listen).await {
        Ok(l) => l,
        Err(e) if !settings.required => {
            tracing::warn!(listen = %settings.listen, error = %e, "the autoscaler service is not served: its address is taken (--autoscaler-listen chooses another)");
            return Ok(None);
        }
        Err(e) => {
            return Err(ServerError::io(
                format!("listen on {} (autoscaler service)", settings.listen),
                e,
            ))
        }
    };
    let addr = listener
        .local_addr()
        .map_err(|e| ServerError::io("local address", e))?;
    let mut hosts = hosts.to_vec();
    if !addr.ip().is_unspecified() {
        hosts.push(addr.ip().to_string());
    }
    let tls = pki.mutual_tls_config(&hosts)?;
    Ok(Some(Bound {
        listener,
        tls,
        addr,
    }))
}

/// One accepted, handshaken connection: what tonic serves. Its place in
/// the listener's gate is given back when tonic drops it.
struct Conn {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    peer: SocketAddr,
    _admission: Admission,
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = SocketAddr;
    fn connect_info(&self) -> SocketAddr {
        self.peer
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Serves the `CloudProvider` service on `bound` until `shutdown` says so.
/// A client that does not present a certificate of knit's CA fails the
/// handshake and is never served. Connections are admitted by `gate` (over
/// its limits one is closed at once) and served with `http`'s handshake
/// timeout, HTTP/2 stream limit and keep-alive.
pub async fn serve(
    bound: Bound,
    control: Arc<ControlPlane>,
    gate: Arc<Gate>,
    http: HttpLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Conn>>(16);
    let acceptor = tokio_rustls::TlsAcceptor::from(bound.tls);
    let listener = bound.listener;
    let mut stop = shutdown.clone();
    let accepting = tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop.changed() => return,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "autoscaler service: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Over a limit: closed now, counted and logged by the gate.
            let Ok(admission) = gate.admit(peer.ip()) else {
                drop(tcp);
                continue;
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(http.handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx
                            .send(Ok(Conn {
                                stream,
                                peer,
                                _admission: admission,
                            }))
                            .await;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(%peer, error = %e, "autoscaler service: TLS handshake refused (a client needs a certificate from `knit autoscaler cloud-config`)");
                    }
                    Err(_) => {
                        tracing::warn!(%peer, "autoscaler service: TLS handshake timed out");
                    }
                }
            });
        }
    });
    let incoming = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|conn| (conn, rx))
    });
    let service = proto::externalgrpc::cloud_provider_server::CloudProviderServer::new(
        service::Autoscaler::new(control),
    );
    let stopped = async move {
        let _ = shutdown.changed().await;
    };
    if let Err(e) = tonic::transport::Server::builder()
        .max_concurrent_streams(http.http2_max_streams.max(1))
        .http2_keepalive_interval(Some(http.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(http.http2_keepalive_timeout))
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, stopped)
        .await
    {
        tracing::error!(error = %e, "autoscaler service stopped");
    }
    accepting.abort();
}
