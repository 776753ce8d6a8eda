//! The REST API. `/api/v1/*` needs the admin token, `/metrics` the admin
//! token or the metrics reader token (`metrics.rs`); the
//! bootstrap and report endpoints take their own per-instance tokens; the
//! package mirror, the system images' registry (`/v2/`), `/healthz` and
//! `/openapi.json` are public (they hold no secret: the mirror serves the
//! same binaries and images to every node).

pub mod attach;
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
use crate::pki;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
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

pub fn router(cp: Cp) -> Router {
    let reader = Router::new()
        .route("/metrics", get(metrics::metrics))
        .route_layer(middleware::from_fn_with_state(
            cp.clone(),
            metrics::require_reader,
        ));
    let admin = Router::new()
        .route(
            "/api/v1/cluster",
            get(pools::get_cluster).put(pools::put_cluster),
        )
        .route("/api/v1/pools", get(pools::list).post(pools::create))
        .route(
            "/api/v1/pools/:name",
            get(pools::get).put(pools::apply).delete(pools::delete),
        )
        .route("/api/v1/pools/:name/scale", post(pools::scale))
        .route(
            "/api/v1/pools/:name/rollout/undo",
            post(pools::rollout_undo),
        )
        .route("/api/v1/pools/:name/rollout/:verb", post(pools::rollout))
        .route("/api/v1/pools/:name/revisions", get(pools::revisions))
        .route("/api/v1/pools/:name/attach", post(attach::attach))
        .route("/api/v1/pools/:name/attach-script", post(attach::script))
        .route("/api/v1/instances", get(nodes::list_instances))
        .route("/api/v1/nodes", get(nodes::list))
        .route("/api/v1/nodes/:name", get(nodes::get).delete(nodes::delete))
        .route("/api/v1/nodes/:name/logs", get(nodes::logs))
        .route("/api/v1/events", get(events::list))
        .route(
            "/api/v1/snapshots",
            get(snapshots::list).post(snapshots::create),
        )
        .route(
            "/api/v1/snapshots/:id",
            axum::routing::delete(snapshots::delete),
        )
        .route("/api/v1/snapshot-builds", get(snapshots::builds))
        .route("/api/v1/snapshot-builds/:id", get(snapshots::build_status))
        .route("/api/v1/jointokens", get(tokens::list))
        .route("/api/v1/exec", post(exec::exec))
        .route("/api/v1/servers", get(servers::list))
        .route(
            "/api/v1/autoscaler/client-certificate",
            post(autoscaler::client_certificate),
        )
        .route_layer(middleware::from_fn_with_state(cp.clone(), require_admin));
    Router::new()
        .merge(admin)
        .merge(reader)
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/openapi.json",
            get(|| async { Json(crate::http::openapi::document()) }),
        )
        .route("/mirror/*path", get(mirror::mirror_file))
        // The system images nodes pull (read-only; HEAD too, through get).
        .route("/v2/", get(registry::base))
        .route("/v2/*path", get(registry::serve))
        .route("/bootstrap/v1/config", post(node_api::bootstrap))
        .route("/attach/v1/manual", post(attach::manual))
        .route("/attach/v1/failed", post(attach::manual_failed))
        .route("/report/v1/events", post(node_api::report))
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

async fn require_admin(State(cp): State<Cp>, request: Request, next: Next) -> Response {
    let why = match bearer(request.headers()) {
        Some(token) if pki::secrets_equal(token, &cp.admin_token) => {
            return next.run(request).await
        }
        Some(_) => "the bearer token is not this server's admin token",
        None => "send the admin token as `Authorization: Bearer <token>`",
    };
    // Read (and drop) a small body so the connection stays usable for the
    // client's next request; a large one just closes it.
    let _ = axum::body::to_bytes(request.into_body(), 64 * 1024).await;
    ServerError::Unauthorized(why.into()).into_response()
}
