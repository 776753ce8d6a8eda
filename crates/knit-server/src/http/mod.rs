//! The REST API. `/api/v1/*` and `/metrics` need the admin token; the
//! bootstrap and report endpoints take their own per-instance tokens; the
//! package mirror, `/healthz` and `/openapi.json` are public (they hold no
//! secret: the mirror serves the same binaries to every node).

pub mod openapi;

use crate::bootstrap::{expected_node_name, node_config, NodeConfigInput, PackageRef};
use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::metrics::PoolGauge;
use crate::names;
use crate::pki;
use crate::reconcile::counts_toward_pool;
use crate::store::{now_ms, state, InstanceRecord, NodeRecord, PoolRecord, Redeem};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use knit_api::{ApiError, Cluster, FieldError, NodePool, PhaseEvent, PhaseOutcome};
use serde::Deserialize;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;

type Cp = Arc<ControlPlane>;

/// The TCP peer of a request, set by the connection loop.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl IntoResponse for ServerError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = json!({
            "code": self.code(),
            "message": self.to_string(),
            "errors": self.field_errors(),
        });
        (status, Json(body)).into_response()
    }
}

pub fn router(cp: Cp) -> Router {
    let admin = Router::new()
        .route("/metrics", get(metrics))
        .route("/api/v1/cluster", get(get_cluster).put(put_cluster))
        .route("/api/v1/pools", get(list_pools).post(create_pool))
        .route(
            "/api/v1/pools/:name",
            get(get_pool).put(apply_pool).delete(delete_pool),
        )
        .route("/api/v1/pools/:name/scale", post(scale_pool))
        .route("/api/v1/pools/:name/attach", post(crate::attach::attach))
        .route(
            "/api/v1/pools/:name/attach-script",
            post(crate::attach::script),
        )
        .route("/api/v1/instances", get(list_instances))
        .route("/api/v1/nodes", get(list_nodes))
        .route("/api/v1/nodes/:name", get(get_node).delete(delete_node))
        .route("/api/v1/nodes/:name/logs", get(node_logs))
        .route("/api/v1/events", get(list_events))
        .route(
            "/api/v1/snapshots",
            get(crate::snapshot::list).post(crate::snapshot::create),
        )
        .route(
            "/api/v1/snapshots/:id",
            axum::routing::delete(crate::snapshot::delete),
        )
        .route("/api/v1/snapshot-builds", get(crate::snapshot::builds))
        .route(
            "/api/v1/snapshot-builds/:id",
            get(crate::snapshot::build_status),
        )
        .route("/api/v1/jointokens", get(list_join_tokens))
        .route("/api/v1/exec", post(exec_command))
        .route_layer(middleware::from_fn_with_state(cp.clone(), require_admin));
    Router::new()
        .merge(admin)
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/openapi.json",
            get(|| async { Json(crate::http::openapi::document()) }),
        )
        .route("/mirror/*path", get(mirror_file))
        .route("/bootstrap/v1/config", post(bootstrap))
        .route("/attach/v1/manual", post(crate::attach::manual))
        .route("/attach/v1/failed", post(crate::attach::manual_failed))
        .route("/report/v1/events", post(report))
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

fn bearer(headers: &HeaderMap) -> Option<&str> {
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

// ---- views

fn pool_view(cp: &ControlPlane, record: &PoolRecord) -> Result<Value> {
    let name = &record.pool.metadata.name;
    let c = cp.store.pool_counts(name)?;
    let count = |s: &str| c.instances.get(s).copied().unwrap_or(0);
    let mut view =
        serde_json::to_value(&record.pool).map_err(|e| ServerError::Internal(e.to_string()))?;
    hide_password(&mut view);
    view["metadata"]["creationTimestampMs"] = json!(record.created_ms);
    view["status"] = json!({
        "desired": record.pool.spec.replicas,
        "instances": c.instances.iter().filter(|(s, _)| counts_toward_pool(s)).map(|(_, n)| n).sum::<i64>(),
        "pending": count(state::PENDING) + count(state::CREATING),
        "running": count(state::RUNNING),
        "failed": count(state::FAILED),
        "deletingInstances": count(state::DELETING),
        "initialized": c.initialized,
        "ready": c.ready,
        "deleting": record.deleting,
        "clusterAttached": cp.cluster.attached(),
    });
    Ok(view)
}

/// A pool's login password is never answered: the view says whether one is
/// set (`spec.login.passwordSet`).
pub fn hide_password(view: &mut Value) {
    if let Some(login) = view
        .get_mut("spec")
        .and_then(|s| s.get_mut("login"))
        .and_then(Value::as_object_mut)
    {
        let set = login.remove("password").is_some_and(|p| !p.is_null());
        login.insert("passwordSet".into(), json!(set));
    }
}

fn node_view(
    cp: &ControlPlane,
    node: &NodeRecord,
    instance: Option<&InstanceRecord>,
    with_timeline: bool,
) -> Result<Value> {
    let mut view = serde_json::to_value(node).map_err(|e| ServerError::Internal(e.to_string()))?;
    view["initialized"] = json!(node.initialized());
    view["providerId"] = json!(instance.and_then(|i| i.provider_id.clone()));
    view["ip"] = json!(instance.and_then(|i| i.ip.clone()));
    if with_timeline {
        view["timeline"] = serde_json::to_value(cp.store.timeline(&node.name)?)
            .map_err(|e| ServerError::Internal(e.to_string()))?;
    }
    Ok(view)
}

// ---- cluster

async fn get_cluster(State(cp): State<Cp>) -> Result<Json<Cluster>> {
    Ok(Json(cp.cluster_doc()?))
}

async fn put_cluster(State(cp): State<Cp>, body: String) -> Result<Json<Cluster>> {
    let cluster = Cluster::from_yaml(&body)?;
    let used: i64 = cp
        .store
        .pools()?
        .iter()
        .filter(|p| !p.deleting)
        .map(|p| p.pool.spec.max_nodes())
        .sum();
    if used > cluster.spec.effective_node_quota() {
        return Err(ServerError::quota_exceeded(used, &cluster.spec));
    }
    cp.store.put_cluster(&cluster)?;
    cp.store.add_event(
        "Normal",
        "Cluster",
        &cluster.metadata.name,
        "Updated",
        "cluster spec replaced",
    )?;
    Ok(Json(cluster))
}

// ---- pools

/// Sum of every pool's node count with `pool` replaced, against the quota.
fn check_quota(cp: &ControlPlane, pool: &NodePool) -> Result<()> {
    let cluster = cp.cluster_doc()?.spec;
    let quota = cluster.effective_node_quota();
    let others: i64 = cp
        .store
        .pools()?
        .iter()
        .filter(|p| !p.deleting && p.pool.metadata.name != pool.metadata.name)
        .map(|p| p.pool.spec.max_nodes())
        .sum();
    let requested = others + pool.spec.max_nodes();
    if requested > quota {
        return Err(ServerError::quota_exceeded(requested, &cluster));
    }
    Ok(())
}

async fn list_pools(State(cp): State<Cp>) -> Result<Json<Value>> {
    let items = cp
        .store
        .pools()?
        .iter()
        .map(|r| pool_view(&cp, r))
        .collect::<Result<Vec<_>>>()?;
    Ok(Json(json!({ "items": items })))
}

async fn get_pool(State(cp): State<Cp>, Path(name): Path<String>) -> Result<Json<Value>> {
    names::check_pool("metadata.name", &name)?;
    let record = cp
        .store
        .pool(&name)?
        .ok_or(ServerError::NotFound { kind: "pool", name })?;
    Ok(Json(pool_view(&cp, &record)?))
}

/// `?strict=true`: refuse a pool whose snapshot is stale (else a warning).
#[derive(Debug, Deserialize)]
struct PoolWriteQuery {
    #[serde(default)]
    strict: bool,
}

async fn create_pool(
    State(cp): State<Cp>,
    Query(q): Query<PoolWriteQuery>,
    body: String,
) -> Result<(StatusCode, Json<Value>)> {
    let pool = NodePool::from_yaml(&body)?;
    check_quota(&cp, &pool)?;
    let warnings = crate::snapshot::check_pool(&cp, &pool, q.strict)?;
    cp.store.insert_pool(&pool)?;
    let name = pool.metadata.name.clone();
    cp.store.add_event(
        "Normal",
        "NodePool",
        &name,
        "Created",
        &format!("pool created with {} replica(s)", pool.spec.replicas),
    )?;
    cp.wake();
    let record = cp
        .store
        .pool(&name)?
        .ok_or(ServerError::NotFound { kind: "pool", name })?;
    let mut view = pool_view(&cp, &record)?;
    view["warnings"] = json!(warnings);
    Ok((StatusCode::CREATED, Json(view)))
}

/// Create or replace (`knit apply`).
async fn apply_pool(
    State(cp): State<Cp>,
    Path(name): Path<String>,
    Query(q): Query<PoolWriteQuery>,
    body: String,
) -> Result<(StatusCode, Json<Value>)> {
    names::check_pool("metadata.name", &name)?;
    let mut pool = NodePool::from_yaml(&body)?;
    if pool.metadata.name != name {
        return Err(ApiError::Invalid(vec![FieldError {
            field: "metadata.name".into(),
            value: format!("{:?}", pool.metadata.name),
            rule: format!("must match the name in the URL ({name:?})"),
        }])
        .into());
    }
    check_quota(&cp, &pool)?;
    let warnings = crate::snapshot::check_pool(&cp, &pool, q.strict)?;
    let status = match cp.store.pool(&name)? {
        Some(old) if old.deleting => {
            return Err(ServerError::Conflict(format!(
                "pool {name:?} is being deleted"
            )))
        }
        Some(old) => {
            crate::attach::check_pool_update(&old.pool, &mut pool)?;
            pool.validate_update(&old.pool)?;
            cp.store.update_pool(&pool)?;
            cp.store
                .add_event("Normal", "NodePool", &name, "Updated", "pool spec replaced")?;
            StatusCode::OK
        }
        None => {
            cp.store.insert_pool(&pool)?;
            cp.store.add_event(
                "Normal",
                "NodePool",
                &name,
                "Created",
                &format!("pool created with {} replica(s)", pool.spec.replicas),
            )?;
            StatusCode::CREATED
        }
    };
    cp.wake();
    let record = cp
        .store
        .pool(&name)?
        .ok_or(ServerError::NotFound { kind: "pool", name })?;
    let mut view = pool_view(&cp, &record)?;
    view["warnings"] = json!(warnings);
    Ok((status, Json(view)))
}

async fn delete_pool(
    State(cp): State<Cp>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<Value>)> {
    names::check_pool("metadata.name", &name)?;
    cp.store.mark_pool_deleting(&name)?;
    cp.store.add_event(
        "Normal",
        "NodePool",
        &name,
        "Deleting",
        "scaling to 0, then removing the pool",
    )?;
    cp.wake();
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "name": name, "deleting": true })),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScaleRequest {
    replicas: i64,
    #[serde(default = "yes")]
    release: bool,
}

fn yes() -> bool {
    true
}

async fn scale_pool(
    State(cp): State<Cp>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<Value>> {
    names::check_pool("metadata.name", &name)?;
    let request: ScaleRequest = serde_json::from_slice(&body).map_err(|e| ApiError::Parse {
        what: "scale request".into(),
        message: e.to_string(),
    })?;
    // The count and the release choice change under the plan lock at once.
    cp.scale_pool(&name, request.replicas, request.release, |pool| {
        check_quota(&cp, pool)
    })
    .await?;
    let record = cp
        .store
        .pool(&name)?
        .ok_or(ServerError::NotFound { kind: "pool", name })?;
    Ok(Json(pool_view(&cp, &record)?))
}

// ---- instances, nodes, events, snapshots, tokens

async fn list_instances(State(cp): State<Cp>) -> Result<Json<Value>> {
    Ok(Json(json!({ "items": cp.store.instances(None)? })))
}

async fn list_nodes(State(cp): State<Cp>) -> Result<Json<Value>> {
    // One read of each table, joined here: no query per node.
    let instances: std::collections::HashMap<String, InstanceRecord> = cp
        .store
        .instances(None)?
        .into_iter()
        .map(|i| (i.name.clone(), i))
        .collect();
    let items = cp
        .store
        .nodes()?
        .iter()
        .map(|n| node_view(&cp, n, instances.get(&n.instance), false))
        .collect::<Result<Vec<_>>>()?;
    Ok(Json(json!({ "items": items })))
}

async fn get_node(State(cp): State<Cp>, Path(name): Path<String>) -> Result<Json<Value>> {
    names::check_node("metadata.name", &name)?;
    let node = cp
        .store
        .node(&name)?
        .ok_or(ServerError::NotFound { kind: "node", name })?;
    let instance = cp.store.instance(&node.instance)?;
    let mut view = node_view(&cp, &node, instance.as_ref(), true)?;
    view["cache"] = crate::snapshot::node_cache(&cp, &node, instance.as_ref()).await;
    Ok(Json(view))
}

#[derive(Debug, Deserialize)]
struct DeleteNodeQuery {
    /// Absent: release an instance knit created, keep one added by attach.
    #[serde(default)]
    release: Option<bool>,
}

/// Removes one node (by node or instance name) from its pool; the pool's
/// desired count drops by one so it is not replaced. An instance added by
/// attach is released only when the caller says so (`?release=true`).
async fn delete_node(
    State(cp): State<Cp>,
    Path(name): Path<String>,
    Query(q): Query<DeleteNodeQuery>,
) -> Result<(StatusCode, Json<Value>)> {
    names::check_node("metadata.name", &name)?;
    let instance_name = match cp.store.node(&name)? {
        Some(node) => node.instance,
        None => match cp.store.instance(&name)? {
            Some(i) => i.name,
            None => return Err(ServerError::NotFound { kind: "node", name }),
        },
    };
    let instance = cp
        .store
        .instance(&instance_name)?
        .ok_or_else(|| ServerError::NotFound {
            kind: "instance",
            name: instance_name.clone(),
        })?;
    if !counts_toward_pool(&instance.state) {
        return Err(ServerError::Conflict(format!(
            "{name:?} is already {}",
            instance.state
        )));
    }
    let release = q.release.unwrap_or(!instance.added);
    {
        let _guard = cp.plan_lock.lock().await;
        if let Some(record) = cp.store.pool(&instance.pool)? {
            let mut pool = record.pool;
            pool.spec.replicas = (pool.spec.replicas - 1).max(0);
            cp.store.update_pool(&pool)?;
        }
        cp.store.add_delete_intents(
            &instance.pool,
            std::slice::from_ref(&instance.name),
            release,
        )?;
    }
    cp.store.add_event(
        "Normal",
        "Node",
        &name,
        "Removing",
        &format!(
            "removing {} from pool {} ({})",
            instance.name,
            instance.pool,
            match (release, instance.added) {
                (true, true) => "release, asked for explicitly: added by attach",
                (true, false) => "release",
                (false, true) =>
                    "keep instance: added by attach, knit does not release it unless asked",
                (false, false) => "keep instance",
            }
        ),
    )?;
    cp.wake();
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "instance": instance.name, "release": release, "added": instance.added })),
    ))
}

#[derive(Debug, Deserialize)]
struct LogsQuery {
    #[serde(default)]
    file: Option<String>,
}

/// Log files of a node, read through the provider.
pub const LOG_FILES: &[(&str, &str)] = &[
    ("init", "/var/log/ack-deploy.log"),
    ("user-data", "/var/log/cloud-init-output.log"),
    ("error-code", "/var/log/ack-deploy-error-code.log"),
    ("error-msg", "/var/log/ack-deploy-error-msg.log"),
];

async fn node_logs(
    State(cp): State<Cp>,
    Path(name): Path<String>,
    Query(q): Query<LogsQuery>,
) -> Result<Response> {
    names::check_node("metadata.name", &name)?;
    let which = q.file.unwrap_or_else(|| "init".to_string());
    let Some((_, path)) = LOG_FILES.iter().find(|(k, _)| *k == which) else {
        return Err(ApiError::Invalid(vec![FieldError {
            field: "file".into(),
            value: format!("{which:?}"),
            rule: format!(
                "must be one of {}",
                LOG_FILES
                    .iter()
                    .map(|(k, _)| *k)
                    .collect::<Vec<_>>()
                    .join("|")
            ),
        }])
        .into());
    };
    let instance_name = match cp.store.node(&name)? {
        Some(node) => node.instance,
        None => name.clone(),
    };
    let instance = cp
        .store
        .instance(&instance_name)?
        .ok_or(ServerError::NotFound { kind: "node", name })?;
    let id = instance.provider_id.ok_or_else(|| {
        ServerError::Conflict(format!("instance {} is not created yet", instance.name))
    })?;
    let bytes = cp.provider()?.read_file(&id, path).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], bytes).into_response())
}

/// Runs a command on one machine through its provider (`knit exec`).
/// Admin only (under `require_admin`); each run is an event naming the
/// command, the instance and the exit code or error, never the output.
async fn exec_command(
    State(cp): State<Cp>,
    body: Bytes,
) -> Result<Json<crate::client::ExecResponse>> {
    use crate::client::{
        ExecRequest, ExecResponse, EXEC_API_OUTPUT_MAX_BYTES, EXEC_DEFAULT_TIMEOUT_SECONDS,
        EXEC_MAX_TIMEOUT_SECONDS,
    };
    use base64::Engine;
    let req: ExecRequest = serde_json::from_slice(&body)
        .map_err(|e| ServerError::BadRequest(format!("exec request (JSON): {e}")))?;
    let invalid = |field: &str, value: String, rule: String| -> ServerError {
        ApiError::Invalid(vec![FieldError {
            field: field.into(),
            value,
            rule,
        }])
        .into()
    };
    names::check_node("name", &req.name)?;
    let instance_name = match req.kind.as_str() {
        "node" => {
            let node = cp.store.node(&req.name)?;
            node.ok_or_else(|| ServerError::NotFound {
                kind: "node",
                name: req.name.clone(),
            })?
            .instance
        }
        "instance" => req.name.clone(),
        other => {
            let rule = "must be node or instance".to_string();
            return Err(invalid("kind", format!("{other:?}"), rule));
        }
    };
    if req.argv.first().is_none_or(|c| c.is_empty()) {
        let rule = "must start with a command (a non-empty first element)".to_string();
        return Err(invalid("argv", format!("{:?}", req.argv), rule));
    }
    let secs = req.timeout_seconds.unwrap_or(EXEC_DEFAULT_TIMEOUT_SECONDS);
    if !(1..=EXEC_MAX_TIMEOUT_SECONDS).contains(&secs) {
        let rule = format!("must be 1 to {EXEC_MAX_TIMEOUT_SECONDS} (seconds)");
        return Err(invalid("timeoutSeconds", secs.to_string(), rule));
    }
    let instance = cp
        .store
        .instance(&instance_name)?
        .ok_or_else(|| ServerError::NotFound {
            kind: "instance",
            name: instance_name.clone(),
        })?;
    let id = instance.provider_id.clone().ok_or_else(|| {
        ServerError::Conflict(format!("instance {} is not created yet", instance.name))
    })?;
    let limit = std::time::Duration::from_secs(secs);
    let outcome = cp
        .provider()?
        .exec_limited(&id, &req.argv, limit, EXEC_API_OUTPUT_MAX_BYTES)
        .await;
    // The command as run (cut: an event is a line), never its output.
    let command: String = format!("{:?}", req.argv).chars().take(300).collect();
    let ran = format!("admin ran {command} on {} ({id})", instance.name);
    match &outcome {
        Ok(out) => cp.store.add_event(
            "Normal",
            "Instance",
            &instance.name,
            "Exec",
            &format!("{ran}: exit code {}", out.code),
        )?,
        Err(e) => cp.store.add_event(
            "Warning",
            "Instance",
            &instance.name,
            "ExecFailed",
            &format!("{ran}: {e}"),
        )?,
    };
    let out = outcome?;
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(Json(ExecResponse {
        instance: instance.name,
        provider_id: id,
        exit_code: out.code,
        stdout: b64.encode(&out.stdout),
        stderr: b64.encode(&out.stderr),
        stdout_cut: out.stdout_cut,
        stderr_cut: out.stderr_cut,
    }))
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    #[serde(default)]
    limit: Option<i64>,
}

async fn list_events(State(cp): State<Cp>, Query(q): Query<EventsQuery>) -> Result<Json<Value>> {
    Ok(Json(
        json!({ "items": cp.store.events(q.limit.unwrap_or(500).clamp(1, 10_000))? }),
    ))
}

async fn list_join_tokens(State(cp): State<Cp>) -> Result<Json<Value>> {
    Ok(Json(json!({ "items": cp.store.join_tokens()? })))
}

async fn metrics(State(cp): State<Cp>) -> Result<Response> {
    let nodes = cp.store.nodes()?;
    let mut gauges = Vec::new();
    for record in cp.store.pools()? {
        let name = record.pool.metadata.name.clone();
        let actual = cp
            .store
            .instances(Some(&name))?
            .iter()
            .filter(|i| counts_toward_pool(&i.state))
            .count() as i64;
        let ready = nodes
            .iter()
            .filter(|n| n.pool == name && n.status == "Ready")
            .count() as i64;
        gauges.push(PoolGauge {
            pool: name,
            desired: record.pool.spec.replicas,
            actual,
            ready,
        });
    }
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        cp.metrics.render(&gauges),
    )
        .into_response())
}

// ---- package mirror

async fn mirror_file(State(cp): State<Cp>, Path(path): Path<String>) -> Result<Response> {
    // Only plain relative components: nothing outside the mirror is served.
    let clean = path
        .split('/')
        .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\\'));
    let not_found = || ServerError::NotFound {
        kind: "mirror file",
        name: path.clone(),
    };
    if !clean {
        return Err(not_found());
    }
    let full = cp.mirror_dir.join(&path);
    let file = match tokio::fs::File::open(&full).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found()),
        Err(e) => return Err(ServerError::io(format!("open {}", full.display()), e)),
    };
    let meta = file
        .metadata()
        .await
        .map_err(|e| ServerError::io(format!("stat {}", full.display()), e))?;
    if !meta.is_file() {
        return Err(not_found());
    }
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(file));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, meta.len().to_string()),
        ],
        body,
    )
        .into_response())
}

// ---- bootstrap and reports

async fn bootstrap(
    State(cp): State<Cp>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    // Unused, but read so the connection can serve the next request.
    _body: Bytes,
) -> Result<Response> {
    // The address without the port: refusals from one machine read alike
    // (and aggregate into one event).
    let peer_addr = peer.map(|Extension(Peer(p))| p);
    let peer = peer_addr
        .map(|p| p.ip().to_string())
        .unwrap_or_else(|| "unknown".into());
    let Some(token) = bearer(&headers) else {
        cp.metrics.bootstrap_refused();
        tracing::warn!(%peer, "bootstrap refused: no token");
        return Err(ServerError::TokenRefused("no bearer token".into()));
    };
    let refuse = |instance: Option<&str>, why: String| -> Result<Response> {
        cp.metrics.bootstrap_refused();
        tracing::warn!(%peer, reason = %why, "bootstrap refused");
        cp.store.add_event(
            "Warning",
            "Instance",
            instance.unwrap_or("-"),
            "BootstrapRefused",
            &format!("{why} (from {peer})"),
        )?;
        Err(ServerError::TokenRefused(why))
    };
    let now = now_ms();
    let hash = pki::token_hash(token);
    // The token's kind before anything is spent: an attach token presented
    // here is refused and stays usable for its own command.
    if token.starts_with(crate::attach::ATTACH_TOKEN_PREFIX)
        || cp
            .store
            .live_join_token(&hash, now)?
            .is_some_and(|(instance, _)| instance == crate::attach::ATTACH_SENTINEL)
    {
        return refuse(
            None,
            "an attach token cannot bootstrap a node: run the attach command it came with (knit attach-script)".into(),
        );
    }
    // The node the instance will be, before the token is spent: a token
    // that cannot be bound to a node name is never minted.
    if let Some((instance_name, pool_name)) = cp.store.live_join_token(&hash, now)? {
        if let (Some(instance), Some(pool)) = (
            cp.store.instance(&instance_name)?,
            cp.store.pool(&pool_name)?,
        ) {
            let mut instance = instance;
            fill_peer_ip(&mut instance, peer_addr);
            bound_node_name(&cp, &instance, &pool.pool)?;
        }
    }
    let (instance_name, pool_name) = match cp.store.redeem_join_token(&hash, now)? {
        Redeem::Ok { instance, pool } => (instance, pool),
        Redeem::Unknown => return refuse(None, "unknown token".into()),
        Redeem::Used { instance, used_ms } => {
            return refuse(
                Some(&instance),
                format!("token already used {} s ago", (now - used_ms) / 1000),
            )
        }
        Redeem::Expired {
            instance,
            expires_ms,
        } => {
            return refuse(
                Some(&instance),
                format!("token expired {} s ago", (now - expires_ms) / 1000),
            )
        }
    };
    let mut instance = cp
        .store
        .instance(&instance_name)?
        .ok_or_else(|| ServerError::Conflict(format!("instance {instance_name} was removed")))?;
    let pool = cp
        .store
        .pool(&pool_name)?
        .ok_or_else(|| ServerError::Conflict(format!("pool {pool_name} was removed")))?;
    let cluster = cp.cluster_doc()?;
    fill_peer_ip(&mut instance, peer_addr);
    let node_name = bound_node_name(&cp, &instance, &pool.pool)?;
    // The report token names its node; only its hash is stored, against
    // its instance, so the name in it cannot be changed by the holder.
    let report_token = format!("{}.{node_name}", pki::random_hex(32)?);
    cp.store
        .set_report_token_hash(&instance.name, &pki::token_hash(&report_token))?;
    let join = cp.cluster.join_material(&pool_name, &node_name).await?;
    let version = cluster.spec.kubernetes_version.clone();
    let tarball = format!("pkg/kubernetes/kubernetes-{version}-linux-amd64.tar.gz");
    let mut config = node_config(NodeConfigInput {
        cluster: &cluster,
        pool: &pool.pool,
        instance: &instance,
        join,
        package: PackageRef {
            url: format!("{}/mirror/{tarball}", cp.advertise_url),
            sha256: cp.mirror_sha256(&tarball)?,
        },
        report_url: format!("{}/report/v1/events", cp.advertise_url),
        report_token,
        control_plane_ca_pem: cp.ca_pem.clone(),
    });
    crate::attach::adjust_config(&cp, &instance, &mut config)?;
    config.validate().map_err(|e| {
        ServerError::Internal(format!(
            "the NodeConfig made for {instance_name} does not validate: {e}"
        ))
    })?;
    cp.store.add_event(
        "Normal",
        "Instance",
        &instance_name,
        "Bootstrapped",
        &format!("NodeConfig sent to {peer}"),
    )?;
    Ok((
        [(header::CONTENT_TYPE, "application/yaml")],
        config.to_yaml(),
    )
        .into_response())
}

/// Instances reach the server directly over the bridge: the peer is the
/// instance's own address when the provider has not said it.
fn fill_peer_ip(instance: &mut InstanceRecord, peer: Option<SocketAddr>) {
    if instance.ip.is_none() {
        instance.ip = peer.map(|p| p.ip().to_string());
    }
}

/// The node name an instance's credentials are bound to: the kept name of
/// an added instance, else the pool's rule. Refused when it cannot be
/// computed yet (no instance id or IP known) or is no valid node name:
/// a credential is never minted unbound.
fn bound_node_name(
    cp: &ControlPlane,
    instance: &InstanceRecord,
    pool: &NodePool,
) -> Result<String> {
    let name = match crate::attach::node_name(cp, instance)? {
        Some(kept) => Some(kept),
        None => expected_node_name(&cp.cluster_doc()?.spec.region, instance, pool),
    };
    let Some(name) = name else {
        return Err(ServerError::Conflict(format!(
            "instance {}'s node name cannot be computed yet (its provider id or address is not recorded): retry in a few seconds",
            instance.name
        )));
    };
    names::check_node("node name", &name)?;
    Ok(name)
}

/// The node a report token is bound to (the part after its first `.`).
fn report_token_node(token: &str) -> Option<&str> {
    token
        .split_once('.')
        .map(|(_, node)| node)
        .filter(|n| !n.is_empty())
}

async fn report(State(cp): State<Cp>, headers: HeaderMap, body: Bytes) -> Result<StatusCode> {
    let token =
        bearer(&headers).ok_or_else(|| ServerError::Unauthorized("no bearer token".into()))?;
    let instance = cp
        .store
        .instance_by_report_token(&pki::token_hash(token))?
        .ok_or_else(|| ServerError::Unauthorized("unknown report token".into()))?;
    let event: PhaseEvent = serde_json::from_slice(&body).map_err(|e| ApiError::Parse {
        what: "PhaseEvent".into(),
        message: e.to_string(),
    })?;
    let Some(bound) = report_token_node(token) else {
        return Err(ServerError::Forbidden(format!(
            "this report token of instance {} names no node (issued before reports were bound to nodes): re-bootstrap the instance",
            instance.name
        )));
    };
    if event.node != bound {
        return Err(ServerError::Forbidden(format!(
            "this report token belongs to node {bound} (instance {}): a report about node {:?} is refused",
            instance.name, event.node
        )));
    }
    if let Some(id) = &instance.provider_id {
        if &event.instance_id != id {
            return Err(ServerError::Forbidden(format!(
                "this report token belongs to instance {id} (node {bound}), not {:?}",
                event.instance_id
            )));
        }
    }
    cp.store.record_phase_event(&instance, &event)?;
    if let Some(ms) = event.duration_ms {
        if event.outcome != PhaseOutcome::Started {
            cp.metrics.phase_duration(event.phase.as_str(), ms);
        }
    }
    match event.outcome {
        PhaseOutcome::Failed => cp.store.add_event(
            "Warning",
            "Node",
            &event.node,
            "PhaseFailed",
            &format!(
                "{} failed{}: {}",
                event.phase,
                event
                    .error_code
                    .map(|c| format!(" ({c})"))
                    .unwrap_or_default(),
                event.reason.as_deref().unwrap_or("no reason given")
            ),
        )?,
        PhaseOutcome::Done | PhaseOutcome::Skipped
            if event.phase == knit_api::PhaseName::Hardening =>
        {
            cp.store.add_event(
                "Normal",
                "Node",
                &event.node,
                "Initialized",
                "every phase finished",
            )?
        }
        _ => {}
    }
    Ok(StatusCode::NO_CONTENT)
}
