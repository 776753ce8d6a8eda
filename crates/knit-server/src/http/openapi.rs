//! The OpenAPI 3 document served at `/openapi.json`. A test checks that
//! every route the router serves is described here.

use serde_json::{json, Value};

/// NodePool and Cluster schemas from the wire types, and the bodies of the
/// routes that carry them.
pub mod schemas;

/// Every path and method of the API, as (path, method, summary, auth).
pub const OPERATIONS: &[(&str, &str, &str, &str)] = &[
    ("/healthz", "get", "Liveness", "none"),
    ("/openapi.json", "get", "This document", "none"),
    ("/metrics", "get", "Prometheus metrics", "admin"),
    (
        "/api/v1/exec",
        "post",
        "Run a command on a machine through its provider: {\"kind\": \"node\"|\"instance\", \"name\", \"argv\": [..], \"timeoutSeconds\"}; exit code, base64 stdout/stderr (each cut at 4 MiB); audited as an event without the output",
        "admin",
    ),
    ("/api/v1/cluster", "get", "The cluster spec", "admin"),
    (
        "/api/v1/cluster",
        "put",
        "Replace the cluster spec (YAML or JSON body)",
        "admin",
    ),
    (
        "/api/v1/pools",
        "get",
        "List node pools with status",
        "admin",
    ),
    (
        "/api/v1/pools",
        "post",
        "Create a node pool (YAML or JSON NodePool, or what GET answered: server-set fields ignored); 409 if it exists; ?strict=true refuses a stale snapshot; ?dryRun=All checks everything and stores nothing",
        "admin",
    ),
    (
        "/api/v1/pools/{name}",
        "get",
        "One node pool with status",
        "admin",
    ),
    (
        "/api/v1/pools/{name}",
        "put",
        "Create or replace a node pool (apply; what GET answered is taken, server-set fields ignored); ?strict=true refuses a stale snapshot; ?dryRun=All checks everything and stores nothing",
        "admin",
    ),
    (
        "/api/v1/pools/{name}",
        "delete",
        "Scale a pool to 0, then remove it",
        "admin",
    ),
    (
        "/api/v1/pools/{name}/scale",
        "post",
        "Set the desired count: {\"replicas\": N, \"release\": true}",
        "admin",
    ),
    (
        "/api/v1/pools/{name}/attach",
        "post",
        "Add existing instances (automatic mode): {\"instances\": [ids], \"formatDataDisk\", \"keepInstanceName\", \"password\", \"dryRun\"}; every preflight result",
        "admin",
    ),
    (
        "/api/v1/pools/{name}/attach-script",
        "post",
        "The command that adds one machine (manual mode): one-time attach token, CA pin, agent sha256",
        "admin",
    ),
    (
        "/attach/v1/manual",
        "post",
        "Redeem an attach token (the command's server-side preflight); answers a join token",
        "attachToken",
    ),
    (
        "/attach/v1/failed",
        "post",
        "The attach command reports that its join failed and the machine was rolled back (body: the reason, text); the add is undone; answers the diagnosis",
        "reportToken",
    ),
    (
        "/api/v1/autoscaler/client-certificate",
        "post",
        "A new client certificate and key from knit's CA for cluster-autoscaler's externalgrpc client, the CA and the service's address (knit autoscaler cloud-config)",
        "admin",
    ),
    ("/api/v1/instances", "get", "List instances", "admin"),
    ("/api/v1/nodes", "get", "List nodes", "admin"),
    (
        "/api/v1/nodes/{name}",
        "get",
        "One node with its phase timeline",
        "admin",
    ),
    (
        "/api/v1/nodes/{name}",
        "delete",
        "Remove a node from its pool (?release=false keeps the instance; one added by attach is kept unless ?release=true)",
        "admin",
    ),
    (
        "/api/v1/nodes/{name}/logs",
        "get",
        "A node's log file (?file=init|user-data|error-code|error-msg)",
        "admin",
    ),
    ("/api/v1/events", "get", "Recent events (?limit=N)", "admin"),
    (
        "/api/v1/snapshots",
        "get",
        "Data-disk snapshots (stale, used by)",
        "admin",
    ),
    (
        "/api/v1/snapshots",
        "post",
        "Build a snapshot from a pool (returns a build id)",
        "admin",
    ),
    (
        "/api/v1/snapshots/{id}",
        "delete",
        "Delete a snapshot (refused while a pool uses it)",
        "admin",
    ),
    (
        "/api/v1/snapshot-builds",
        "get",
        "Snapshot builds, stored (status, current step, builder, snapshot id)",
        "admin",
    ),
    (
        "/api/v1/snapshot-builds/{id}",
        "get",
        "One snapshot build with its steps (kept across server restarts)",
        "admin",
    ),
    (
        "/api/v1/jointokens",
        "get",
        "Join tokens (ids and state, never the secret)",
        "admin",
    ),
    ("/mirror/{path}", "get", "Package mirror file", "none"),
    (
        "/bootstrap/v1/config",
        "post",
        "Exchange a one-time join token for the instance's NodeConfig (YAML)",
        "joinToken",
    ),
    (
        "/report/v1/events",
        "post",
        "Receive one agent PhaseEvent",
        "reportToken",
    ),
];

pub fn document() -> Value {
    let mut paths = serde_json::Map::new();
    for (path, method, summary, auth) in OPERATIONS {
        let security = match *auth {
            "none" => json!([]),
            other => json!([{ (*other): [] }]),
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
    }
    let mut doc = json!({
        "openapi": "3.0.3",
        "info": { "title": "knit control plane", "version": env!("CARGO_PKG_VERSION") },
        "paths": paths,
        "components": {
            "securitySchemes": {
                "admin": { "type": "http", "scheme": "bearer", "description": "The admin token (state dir file admin-token, mode 0600)" },
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
