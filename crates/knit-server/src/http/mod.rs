//! The REST API. Every route declares what it needs (`knit_api::routes`,
//! added by `routes`, checked by `auth::authorize`): `/api/v1/*` an API
//! token of a role (viewer, operator, admin), `/metrics` any API token or
//! the metrics reader token (`metrics.rs`); the bootstrap and report endpoints take their own
//! per-instance tokens; the package mirror, the system images' registry
//! (`/v2/`), `/healthz` and `/openapi.json` are public (they hold no
//! secret: the mirror serves the same binaries and images to every node).

pub mod api_tokens;
pub mod attach;
pub mod auth;
pub mod autoscaler;
pub mod console;
pub mod events;
pub mod exec;
pub mod metrics;
pub mod mirror;
pub mod node_api;
pub mod nodes;
pub mod openapi;
pub mod pools;
pub mod registry;
mod servers;
pub mod snapshots;
pub mod tokens;

use crate::control::ControlPlane;
use crate::error::ServerError;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use knit_api::views::ErrorView;
use std::net::SocketAddr;
use std::sync::Arc;

/// The state every handler shares.
pub type Cp = Arc<ControlPlane>;

/// The TCP peer of a request, set by the connection loop.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl IntoResponse for ServerError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorView {
            code: self.code().to_string(),
            message: self.to_string(),
            errors: self.field_errors().to_vec(),
            preflight: None,
        };
        (status, Json(body)).into_response()
    }
}

/// Every route of the API with its handler; the method, path and access
/// of each are `knit_api::routes::Route`'s (roles as in docs/security.md).
/// A test holds this list to `Route::ALL`: every route added once.
pub(crate) fn routes() -> auth::Routes<Cp> {
    use knit_api::routes::Route;
    auth::Routes::default()
        .api(Route::Healthz, || async { "ok\n" })
        .api(Route::OpenApi, || async {
            Json(crate::http::openapi::document())
        })
        .api(Route::Mirror, mirror::mirror_file)
        .api(Route::RegistryBase, registry::base)
        .api(Route::RegistryObject, registry::serve)
        .api(Route::Bootstrap, node_api::bootstrap)
        .api(Route::AttachManual, attach::manual)
        .api(Route::AttachFailed, attach::manual_failed)
        .api(Route::Report, node_api::report)
        .api(Route::Metrics, metrics::metrics)
        .api(Route::GetCluster, pools::get_cluster)
        .api(Route::PutCluster, pools::put_cluster)
        .api(Route::ListPools, pools::list)
        .api(Route::CreatePool, pools::create)
        .api(Route::GetPool, pools::get)
        .api(Route::ApplyPool, pools::apply)
        .api(Route::DeletePool, pools::delete)
        .api(Route::ScalePool, pools::scale)
        .api(Route::RolloutUndo, pools::rollout_undo)
        .api(Route::Rollout, pools::rollout)
        .api(Route::PoolRevisions, pools::revisions)
        .api(Route::Attach, attach::attach)
        .api(Route::AttachScript, attach::script)
        .api(Route::ListInstances, nodes::list_instances)
        .api(Route::ListNodes, nodes::list)
        .api(Route::GetNode, nodes::get)
        .api(Route::DeleteNode, nodes::delete)
        .api(Route::NodeLogs, nodes::logs)
        .api(Route::Events, events::list)
        .api(Route::ListSnapshots, snapshots::list)
        .api(Route::BuildSnapshot, snapshots::create)
        .api(Route::DeleteSnapshot, snapshots::delete)
        .api(Route::SnapshotBuilds, snapshots::builds)
        .api(Route::SnapshotBuild, snapshots::build_status)
        .api(Route::JoinTokens, tokens::list)
        .api(Route::Servers, servers::list)
        .api(Route::Exec, exec::exec)
        .api(
            Route::AutoscalerClientCertificate,
            autoscaler::client_certificate,
        )
        .api(Route::ListTokens, api_tokens::list)
        .api(Route::CreateToken, api_tokens::create)
        .api(Route::RevokeToken, api_tokens::revoke)
}

pub fn router(cp: Cp) -> Router {
    let (routes, table) = routes().finish();
    routes
        // Every matched route passes the gate; unknown paths do not need it.
        .route_layer(middleware::from_fn_with_state(
            (cp.clone(), auth::Table::new(&table)),
            auth::authorize,
        ))
        .fallback(no_route)
        // The body limit is ours (413 with the limit, body drained), not the
        // extractors' (which drop the connection mid-upload).
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(cp.clone(), limit_body))
        .with_state(cp)
}

/// Unknown paths: a JSON error like every other, never an empty 404.
async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> ServerError {
    ServerError::NotFound {
        kind: "route",
        name: format!("{method} {}", uri.path()),
    }
}

/// How much of an over-limit body is read (and dropped) so that the client,
/// still sending, receives the 413 instead of a reset connection.
const DRAIN_LIMIT_BYTES: u64 = 64 * 1024 * 1024;
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Reads every request body up to the limit; a larger one is answered 413
/// naming the limit (after the rest is drained, up to `DRAIN_LIMIT_BYTES`).
async fn limit_body(State(cp): State<Cp>, request: Request, next: Next) -> Response {
    use http_body_util::BodyExt;
    let limit = cp.settings.limits.max_body_bytes;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (parts, mut body) = request.into_parts();
    let mut read: u64 = 0;
    let mut kept = Vec::new();
    let mut over = declared.is_some_and(|n| n > limit as u64);
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                return false;
            };
            if let Some(data) = frame.data_ref() {
                read += data.len() as u64;
                if read > limit as u64 {
                    over = true;
                    kept = Vec::new();
                }
                if !over {
                    kept.extend_from_slice(data);
                } else if read > DRAIN_LIMIT_BYTES {
                    return false;
                }
            }
        }
        true
    })
    .await
    .unwrap_or(false);
    if over {
        let mut response = ServerError::PayloadTooLarge {
            size: declared.unwrap_or(read),
            limit,
        }
        .into_response();
        if !drained {
            response.headers_mut().insert(
                header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        return response;
    }
    if !drained {
        return ServerError::BadRequest("the request body could not be read".into())
            .into_response();
    }
    next.run(Request::from_parts(parts, Body::from(kept))).await
}

/// The trimmed token of an `Authorization: Bearer …` header.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Bytes read from a served file at a time. tokio's file reads each go
/// through the blocking pool, and `ReaderStream`'s default is 4 KiB: a
/// 9 MB binary was 2,300 thread hand-offs and as many tiny writes, and a
/// thousand nodes fetching the agent at once got 41 MiB/s out of most of a
/// core. 256 KiB chunks make that about 40 per file.
const FILE_CHUNK: usize = 256 * 1024;

/// A response body streaming `file` (mirror files, registry blobs).
pub(crate) fn file_body(file: tokio::fs::File) -> Body {
    Body::from_stream(tokio_util::io::ReaderStream::with_capacity(
        file, FILE_CHUNK,
    ))
}
