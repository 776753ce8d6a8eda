//! The OpenAPI 3 document served at `/openapi.json`. A test checks that
//! every route the router serves is described here.

use serde_json::{json, Value};

/// NodePool and Cluster schemas from the wire types, and the bodies of the
/// routes that carry them.
pub mod schemas;

/// Every path and method of the API, as (path, method, summary, access):
/// access is what the route declares (`http::auth::Access::word`: none, a
/// node token's name, metrics, or the role viewer|operator|admin); a test
/// holds this list and the router's route table equal.
pub const OPERATIONS: &[(&str, &str, &str, &str)] = &[
    ("/healthz", "get", "Liveness", "none"),
    ("/openapi.json", "get", "This document", "none"),
    ("/metrics", "get", "Prometheus metrics", "metrics"),
    ("/api/v1/exec", "post", "Run a command on a machine through its provider: {\"kind\": \"node\"|\"instance\", \"name\", \"argv\": [..], \"timeoutSeconds\"}; exit code, base64 stdout/stderr (each cut at 4 MiB); audited as an event without the output", "admin"),
    ("/api/v1/cluster", "get", "The cluster spec", "viewer"),
    ("/api/v1/cluster", "put", "Replace the cluster spec (YAML or JSON body)", "operator"),
    ("/api/v1/pools", "get", "List node pools with status", "viewer"),
    ("/api/v1/pools", "post", "Create a node pool (YAML or JSON NodePool, or what GET answered: server-set fields ignored); 409 if it exists; ?strict=true refuses a stale snapshot; ?dryRun=All checks everything and stores nothing", "operator"),
    ("/api/v1/pools/{name}", "get", "One node pool with status", "viewer"),
    ("/api/v1/pools/{name}", "put", "Create or replace a node pool (apply; what GET answered is taken, server-set fields ignored); ?strict=true refuses a stale snapshot; ?dryRun=All checks everything and stores nothing", "operator"),
    ("/api/v1/pools/{name}", "delete", "Scale a pool to 0, then remove it", "operator"),
    ("/api/v1/pools/{name}/scale", "post", "Set the desired count: {\"replicas\": N, \"release\": true}", "operator"),
    ("/api/v1/pools/{name}/attach", "post", "Add existing instances (automatic mode): {\"instances\": [ids], \"formatDataDisk\", \"keepInstanceName\", \"password\", \"dryRun\"}; every preflight result", "operator"),
    ("/api/v1/pools/{name}/attach-script", "post", "The command that adds one machine (manual mode): one-time attach token, CA pin, agent sha256", "operator"),
    ("/attach/v1/manual", "post", "Redeem an attach token (the command's server-side preflight); answers a join token", "attachToken"),
    ("/attach/v1/failed", "post", "The attach command reports that its join failed and the machine was rolled back (body: the reason, text); the add is undone; answers the diagnosis", "reportToken"),
    ("/api/v1/autoscaler/client-certificate", "post", "A new client certificate and key from knit's CA for cluster-autoscaler's externalgrpc client, the CA and the service's address (knit autoscaler cloud-config)", "admin"),
    ("/api/v1/instances", "get", "List instances", "viewer"),
    ("/api/v1/nodes", "get", "List nodes", "viewer"),
    ("/api/v1/nodes/{name}", "get", "One node with its phase timeline", "viewer"),
    ("/api/v1/nodes/{name}", "delete", "Remove a node from its pool (?release=false keeps the instance; one added by attach is kept unless ?release=true)", "operator"),
    ("/api/v1/nodes/{name}/logs", "get", "A node's log file (?file=init|user-data|error-code|error-msg)", "admin"),
    ("/api/v1/events", "get", "Recent events (?limit=N)", "viewer"),
    ("/api/v1/snapshots", "get", "Data-disk snapshots (stale, used by)", "viewer"),
    ("/api/v1/snapshots", "post", "Build a snapshot from a pool (returns a build id)", "operator"),
    ("/api/v1/snapshots/{id}", "delete", "Delete a snapshot (refused while a pool uses it)", "operator"),
    ("/api/v1/snapshot-builds", "get", "Snapshot builds, stored (status, current step, builder, snapshot id)", "viewer"),
    ("/api/v1/snapshot-builds/{id}", "get", "One snapshot build with its steps (kept across server restarts)", "viewer"),
    ("/api/v1/jointokens", "get", "Join tokens (ids and state, never the secret)", "viewer"),
    ("/mirror/{path}", "get", "Package mirror file", "none"),
    ("/bootstrap/v1/config", "post", "Exchange a one-time join token for the instance's NodeConfig (YAML)", "joinToken"),
    ("/report/v1/events", "post", "Receive one agent PhaseEvent", "reportToken"),
    ("/api/v1/pools/{name}/rollout/undo", "post", "Roll a pool back to a kept revision: {\"toRevision\": N} (absent: the one before)", "operator"),
    ("/api/v1/pools/{name}/rollout/{verb}", "post", "Pause, resume or restart a pool's rollout (verb: pause|resume|restart)", "operator"),
    ("/api/v1/pools/{name}/revisions", "get", "A pool's kept revisions", "viewer"),
    ("/api/v1/servers", "get", "The servers sharing the datastore, the leader marked", "viewer"),
    ("/v2/", "get", "The system images' registry: API version check", "none"),
    ("/v2/{path}", "get", "The system images' registry: manifests and blobs (read-only)", "none"),
    ("/api/v1/tokens", "get", "API tokens: id, role, description, created, expires, last used (never the secret)", "admin"),
    ("/api/v1/tokens", "post", "Create an API token: {\"role\": \"viewer\"|\"operator\"|\"admin\", \"ttlSeconds\", \"description\"}; answers its secret, once", "admin"),
    ("/api/v1/tokens/{id}", "delete", "Revoke an API token (the last live admin token is refused: LastAdminToken)", "admin"),
];

pub fn document() -> Value {
    let mut paths = serde_json::Map::new();
    for (path, method, summary, auth) in OPERATIONS {
        let (security, role) = match *auth {
            "none" => (json!([]), None),
            "metrics" => (
                json!([{ "apiToken": [] }, { "metricsToken": [] }]),
                Some("viewer"),
            ),
            r @ ("viewer" | "operator" | "admin") => (json!([{ "apiToken": [] }]), Some(r)),
            other => (json!([{ (*other): [] }]), None),
        };
        let mut responses = json!({
            "200": { "description": "OK" },
            "400": { "description": "Unparsable body", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } },
            "401": { "description": "Missing or wrong token" },
            "404": { "description": "Not found" },
            "422": { "description": "Invalid fields, every one listed", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } },
        });
        if *path == "/api/v1/pools" && *method == "post" {
            responses["201"] = json!({ "description": "Created" });
            responses["409"] = json!({ "description": "Already exists" });
        }
        let parameters: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string" } }))
            .collect();
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[*method] = json!({
            "summary": summary,
            "security": security,
            "parameters": parameters,
            "responses": responses,
        });
        if let Some(role) = role {
            // The least role of an API token that may call it.
            entry[*method]["x-knit-role"] = json!(role);
            entry[*method]["responses"]["403"] = json!({ "description": "The token's role is below the one needed (InsufficientRole)" });
        }
    }
    let mut doc = json!({
        "openapi": "3.0.3",
        "info": { "title": "knit control plane", "version": env!("CARGO_PKG_VERSION") },
        "paths": paths,
        "components": {
            "securitySchemes": {
                "apiToken": { "type": "http", "scheme": "bearer", "description": "An API token (knit token create) of the role x-knit-role names or higher; the first admin token is the state dir file admin-token (mode 0600)" },
                "metricsToken": { "type": "http", "scheme": "bearer", "description": "The metrics reader token (state dir file metrics-token): /metrics only" },
                "joinToken": { "type": "http", "scheme": "bearer", "description": "One-time token from the instance's user data" },
                "reportToken": { "type": "http", "scheme": "bearer", "description": "Per-instance token from its NodeConfig" },
                "attachToken": { "type": "http", "scheme": "bearer", "description": "One-time, pool-bound token carried by the command of knit attach-script" }
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {
                        "code": { "type": "string" },
                        "message": { "type": "string" },
                        "errors": { "type": "array", "items": { "$ref": "#/components/schemas/FieldError" } }
                    }
                },
                "FieldError": {
                    "type": "object",
                    "properties": { "field": { "type": "string" }, "value": { "type": "string" }, "rule": { "type": "string" } }
                },
                "ScaleRequest": {
                    "type": "object",
                    "required": ["replicas"],
                    "properties": { "replicas": { "type": "integer", "minimum": 0 }, "release": { "type": "boolean", "default": true } }
                }
            }
        }
    });
    schemas::add(&mut doc);
    doc
}

#[cfg(test)]
mod tests {
    use super::OPERATIONS;
    use crate::http::auth::{route_table, Access};

    /// The router's path form (`:name`, `*path`) in OpenAPI's (`{name}`).
    fn openapi_path(path: &str) -> String {
        path.split('/')
            .map(
                |seg| match seg.strip_prefix(':').or(seg.strip_prefix('*')) {
                    Some(name) => format!("{{{name}}}"),
                    None => seg.to_string(),
                },
            )
            .collect::<Vec<_>>()
            .join("/")
    }

    /// Walks every route the router serves: each declares its access (the
    /// route table is the router's only source), every `/api/` route a
    /// role, and this document lists exactly those routes with the same
    /// access.
    #[test]
    fn every_route_declares_its_access_and_is_documented_with_it() {
        let table = route_table();
        let mut served: Vec<(String, String, &str)> = Vec::new();
        for spec in &table {
            if spec.path.starts_with("/api/") {
                assert!(
                    matches!(spec.access, Access::Role(_)),
                    "{} {} must need a role, declares {:?}",
                    spec.method,
                    spec.path,
                    spec.access
                );
            }
            served.push((
                openapi_path(spec.path),
                spec.method.as_str().to_lowercase(),
                spec.access.word(),
            ));
        }
        let mut documented: Vec<(String, String, &str)> = OPERATIONS
            .iter()
            .map(|(p, m, _, a)| (p.to_string(), m.to_string(), *a))
            .collect();
        served.sort();
        documented.sort();
        let before = served.len();
        served.dedup();
        assert_eq!(before, served.len(), "a route is declared twice");
        assert_eq!(
            served, documented,
            "the router (left) and OPERATIONS (right) differ"
        );
    }
}
