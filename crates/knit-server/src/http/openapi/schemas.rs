//! The OpenAPI document's schemas of the documents users write, NodePool
//! and Cluster, generated from the wire types through knit-api's JSON
//! Schemas (`knit_api::schema`, themselves made from the reference that a
//! test holds to the types), put in OpenAPI 3.0's dialect; and the request
//! and response bodies of the routes that carry them.

use knit_api::routes::Route;
use serde_json::{json, Map, Value};

/// The document kinds, as (knit-api's kind, component name).
const KINDS: &[(&str, &str)] = &[("nodepool", "NodePool"), ("cluster", "Cluster")];

/// Which routes carry which document: (route, request body, answer body).
/// The answers of pool routes are the pool's view (the document, its
/// status and the write's warnings).
const BODIES: &[(Route, Option<&str>, Option<&str>)] = &[
    (Route::GetCluster, None, Some("Cluster")),
    (Route::PutCluster, Some("Cluster"), Some("Cluster")),
    (Route::CreatePool, Some("NodePool"), Some("PoolView")),
    (Route::GetPool, None, Some("PoolView")),
    (Route::ApplyPool, Some("NodePool"), Some("PoolView")),
    (Route::ScalePool, Some("ScaleRequest"), Some("PoolView")),
];

/// A JSON Schema (2020-12, as knit-api makes it) in OpenAPI 3.0's subset:
/// no `$schema`/`$id`, `const` as a one-word `enum`, a type list with
/// `null` as `nullable`.
pub fn openapi30(schema: &Value) -> Value {
    match schema {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                match k.as_str() {
                    "$schema" | "$id" => {}
                    "const" => {
                        out.insert("enum".into(), json!([v]));
                    }
                    "type" => match v {
                        Value::Array(types) => {
                            let real: Vec<&Value> = types.iter().filter(|t| *t != "null").collect();
                            if let Some(t) = real.first() {
                                out.insert("type".into(), (*t).clone());
                            }
                            if real.len() < types.len() {
                                out.insert("nullable".into(), json!(true));
                            }
                        }
                        other => {
                            out.insert("type".into(), other.clone());
                        }
                    },
                    // Defaults and examples are data, not schemas.
                    "default" => {
                        out.insert(k.clone(), v.clone());
                    }
                    _ => {
                        out.insert(k.clone(), openapi30(v));
                    }
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(openapi30).collect()),
        other => other.clone(),
    }
}

/// The components and bodies added to `doc` (the document
/// [`super::document`] makes).
pub fn add(doc: &mut Value) {
    let schemas = &mut doc["components"]["schemas"];
    for (kind, name) in KINDS {
        schemas[*name] = openapi30(&knit_api::schema::json_schema(kind));
    }
    schemas["PoolView"] = json!({
        "description": "A pool as the API answers it: the NodePool (its password never shown), when it was created, its status and, after a write, the write's warnings",
        "allOf": [
            { "$ref": "#/components/schemas/NodePool" },
            {
                "type": "object",
                "properties": {
                    "status": { "type": "object", "description": "Desired, current, ready, initialized and failed counts, the rollout's progress and why creates fail" },
                    "warnings": { "type": "array", "items": { "type": "string" }, "description": "What the write let through but names (a stale snapshot, instance types the provider could not be asked about)" }
                }
            }
        ]
    });
    let body = |name: &str| {
        let schema = json!({ "$ref": format!("#/components/schemas/{name}") });
        json!({
            "application/json": { "schema": schema },
            "application/yaml": { "schema": schema },
        })
    };
    for &(route, request, answer) in BODIES {
        let op = &mut doc["paths"][route.openapi_path()][route.method().as_str().to_lowercase()];
        if let Some(name) = request {
            op["requestBody"] = json!({ "required": true, "content": body(name) });
        }
        if let Some(name) = answer {
            let code = if route == Route::CreatePool {
                "201"
            } else {
                "200"
            };
            let mut content = body(name);
            if let Value::Object(m) = &mut content {
                m.remove("application/yaml");
            }
            op["responses"][code]["content"] = content;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `$ref` under `v`.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("$ref", Value::String(r)) => out.push(r.clone()),
                        _ => refs(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    /// Keywords of JSON Schema that OpenAPI 3.0 does not have, anywhere
    /// outside default values.
    fn not_openapi30(v: &Value, at: &str, out: &mut Vec<String>) {
        if let Value::Object(m) = v {
            for (k, v) in m {
                if k == "default" {
                    continue;
                }
                if k == "properties" {
                    // Field names (a field may be called `type`), each
                    // naming a schema.
                    for (name, s) in v.as_object().into_iter().flatten() {
                        not_openapi30(s, &format!("{at}/properties/{name}"), out);
                    }
                    continue;
                }
                if ["$schema", "$id", "const"].contains(&k.as_str())
                    || (k == "type" && !v.is_string())
                {
                    out.push(format!("{at}/{k}"));
                }
                not_openapi30(v, &format!("{at}/{k}"), out);
            }
        } else if let Value::Array(a) = v {
            for (i, v) in a.iter().enumerate() {
                not_openapi30(v, &format!("{at}/{i}"), out);
            }
        }
    }

    #[test]
    fn the_documents_schemas_are_knit_apis_and_every_ref_resolves() {
        let doc = super::super::document();
        let schemas = &doc["components"]["schemas"];
        for (kind, name) in KINDS {
            let want = openapi30(&knit_api::schema::json_schema(kind));
            assert_eq!(schemas[*name], want, "{name}");
            // The generated schema, not a stub: every spec field is there.
            let props = schemas[*name]["properties"]["spec"]["properties"]
                .as_object()
                .unwrap_or_else(|| panic!("{name} has no spec properties"));
            for f in knit_api::reference::fields(kind) {
                let top = f.path.trim_start_matches("spec.").split('.').next();
                assert!(
                    top.is_some_and(|t| props.contains_key(t)),
                    "{name}: {}",
                    f.path
                );
            }
        }
        let mut all = Vec::new();
        refs(&doc, &mut all);
        assert!(all.iter().any(|r| r.ends_with("/NodePool")), "{all:?}");
        for r in all {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("{r} is not a component"));
            assert!(schemas.get(name).is_some(), "{r} resolves to nothing");
        }
        let mut wrong = Vec::new();
        for (name, s) in schemas.as_object().into_iter().flatten() {
            not_openapi30(s, &format!("#/components/schemas/{name}"), &mut wrong);
        }
        assert!(wrong.is_empty(), "not OpenAPI 3.0: {wrong:?}");
    }

    #[test]
    fn document_routes_carry_their_bodies() {
        let doc = super::super::document();
        for (route, request, answer) in BODIES {
            let (path, method) = (route.openapi_path(), route.method().as_str());
            let op = &doc["paths"][&path][method.to_lowercase()];
            assert!(!op.is_null(), "{method} {path} is not in the document");
            if let Some(name) = request {
                assert_eq!(
                    op["requestBody"]["content"]["application/yaml"]["schema"]["$ref"],
                    format!("#/components/schemas/{name}"),
                    "{method} {path}"
                );
            }
            if let Some(name) = answer {
                let answered = op["responses"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .any(|(_, r)| {
                        r["content"]["application/json"]["schema"]["$ref"]
                            == format!("#/components/schemas/{name}")
                    });
                assert!(answered, "{method} {path} answers no {name}");
            }
        }
    }

    #[test]
    fn a_nullable_type_list_and_const_become_openapi30() {
        let s = json!({
            "$schema": "x", "const": "v",
            "properties": { "z": { "type": ["string", "null"], "default": { "type": ["kept"] } } }
        });
        assert_eq!(
            openapi30(&s),
            json!({
                "enum": ["v"],
                "properties": { "z": { "type": "string", "nullable": true, "default": { "type": ["kept"] } } }
            })
        );
    }
}
