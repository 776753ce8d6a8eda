//! The OpenAPI 3 document served at `/openapi.json`, built from the API's
//! one list of routes (`knit_api::routes::Route`: path, method, summary,
//! access). A test checks that the router serves exactly those routes.

use knit_api::routes::Route;
use serde_json::{json, Value};

/// NodePool and Cluster schemas from the wire types, and the bodies of the
/// routes that carry them.
pub mod schemas;

pub fn document() -> Value {
    let mut paths = serde_json::Map::new();
    for &route in Route::ALL {
        let path = &route.openapi_path();
        let method = &route.method().as_str().to_lowercase();
        let summary = route.summary();
        let (security, role) = match route.access().word() {
            "none" => (json!([]), None),
            "metrics" => (
                json!([{ "apiToken": [] }, { "metricsToken": [] }]),
                Some("viewer"),
            ),
            r @ ("viewer" | "operator" | "admin") => (json!([{ "apiToken": [] }]), Some(r)),
            other => (json!([{ other: [] }]), None),
        };
        let mut responses = json!({
            "200": { "description": "OK" },
            "400": { "description": "Unparsable body", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } },
            "401": { "description": "Missing or wrong token" },
            "404": { "description": "Not found" },
            "422": { "description": "Invalid fields, every one listed", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } },
        });
        if route == Route::CreatePool {
            responses["201"] = json!({ "description": "Created" });
            responses["409"] = json!({ "description": "Already exists" });
        }
        let parameters: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string" } }))
            .collect();
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[method] = json!({
            "summary": summary,
            "security": security,
            "parameters": parameters,
            "responses": responses,
        });
        if let Some(role) = role {
            // The least role of an API token that may call it.
            entry[method]["x-knit-role"] = json!(role);
            entry[method]["responses"]["403"] = json!({ "description": "The token's role is below the one needed (InsufficientRole)" });
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
    use super::document;
    use crate::http::auth::route_table;
    use knit_api::routes::Route;

    /// Walks every route the router serves: each is one of
    /// `knit_api::routes::Route`, added once, with that route's access
    /// (so every `/api/` route needs a role: knit-api's test), and every
    /// route is served; the document describes each with its role.
    #[test]
    fn the_router_serves_exactly_the_declared_routes() {
        let table = route_table();
        let mut served: Vec<(String, &str, &str)> = table
            .iter()
            .map(|spec| {
                (
                    spec.method.as_str().to_string(),
                    spec.path,
                    spec.access.word(),
                )
            })
            .collect();
        let mut declared: Vec<(String, &str, &str)> = Route::ALL
            .iter()
            .map(|r| (r.method().as_str().to_string(), r.path(), r.access().word()))
            .collect();
        served.sort();
        declared.sort();
        let before = served.len();
        served.dedup();
        assert_eq!(before, served.len(), "a route is added twice");
        assert_eq!(
            served, declared,
            "the router (left) and knit_api::routes::Route::ALL (right) differ"
        );
        let doc = document();
        for &route in Route::ALL {
            let op = &doc["paths"][route.openapi_path()][route.method().as_str().to_lowercase()];
            assert_eq!(op["summary"], route.summary(), "{route:?}");
            if let knit_api::routes::Access::Role(role) = route.access() {
                assert_eq!(op["x-knit-role"], role.as_str(), "{route:?}");
            }
        }
    }
}
