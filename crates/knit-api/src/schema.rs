//! JSON Schemas (draft 2020-12) of the documents users write, NodePool and
//! Cluster, made from the reference ([`crate::reference`]): each field's
//! type, default and description come from there, so the schema, `knit
//! explain` and docs/reference.md say the same. docs/schema/*.json are
//! these, checked in; the OpenAPI document embeds them. A test fails when
//! a checked-in file is out of date (`KNIT_UPDATE_REFERENCE=1 cargo test -p
//! knit-api schema` writes them).
//!
//! Objects whose every key the reference is proven to list (the spec, and
//! the non-optional objects whose fields it lists: its test walks their
//! defaults) are closed (`additionalProperties: false`), so an editor flags
//! a misspelt field; the others (`kubelet`, `login`, `scaling`'s options,
//! …) are open, their fields described in docs/control-plane.md.

use crate::reference::{fields, FieldRef, KINDS};
use serde_json::{json, Map, Value};

/// The `$id` base of the checked-in schemas.
pub const SCHEMA_ID_BASE: &str = "https://knit.dev/schema/";

/// The kind's name as documents spell it (`NodePool`).
pub fn kind_name(kind: &str) -> &'static str {
    match kind {
        "nodepool" => "NodePool",
        _ => "Cluster",
    }
}

/// The file name of the kind's schema under docs/schema/.
pub fn file_name(kind: &str) -> String {
    format!("{kind}.json")
}

/// `a | b | c.` (a description that is a list of words) as the words.
fn enum_words(description: &str) -> Option<Vec<&str>> {
    let words: Vec<&str> = description
        .strip_suffix('.')?
        .split(" | ")
        .map(str::trim)
        .collect();
    let word = |w: &&str| {
        !w.is_empty()
            && w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    (words.len() > 1 && words.iter().all(word)).then_some(words)
}

/// The schema of one field's own type (children are added by the caller).
fn type_schema(f: &FieldRef) -> Value {
    let base = f.type_name.trim_end_matches(" (optional)");
    let mut s = match base {
        "string" => json!({ "type": "string" }),
        "integer" => json!({ "type": "integer" }),
        "boolean" => json!({ "type": "boolean" }),
        "object" => json!({ "type": "object" }),
        "[]string" => json!({ "type": "array", "items": { "type": "string" } }),
        "[]object" => json!({ "type": "array", "items": { "type": "object" } }),
        "map[string]string" => {
            json!({ "type": "object", "additionalProperties": { "type": "string" } })
        }
        t if t.starts_with("int-or-percent") => json!({
            "anyOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "pattern": "^[0-9]+%$" }
            ]
        }),
        // A type the reference gains without a mapping here fails the
        // tests (every field must map).
        _ => json!({}),
    };
    if let (Some(words), Value::Object(m)) = (enum_words(f.description), &mut s) {
        m.insert("enum".into(), json!(words));
    }
    if f.type_name.ends_with("(optional)") {
        // Absent or null: the API stores null for an unset option.
        if let Some(Value::String(t)) = s.get("type").cloned() {
            s["type"] = json!([t, "null"]);
        }
    }
    let m = s.as_object_mut().expect("a schema is an object");
    m.insert("description".into(), json!(f.description));
    if !f.default.is_null() {
        m.insert("default".into(), f.default.clone());
    }
    s
}

/// The schema of the object at `path` (`spec`, `spec.drain`): its
/// documented children, closed when the reference lists them all.
fn object_schema(all: &[FieldRef], path: &str, closed: bool) -> Map<String, Value> {
    let prefix = format!("{path}.");
    let mut properties = Map::new();
    for f in all.iter().filter(|f| {
        f.path
            .strip_prefix(&prefix)
            .is_some_and(|rest| !rest.contains('.'))
    }) {
        let mut s = type_schema(f);
        let has_children = all
            .iter()
            .any(|c| c.path.starts_with(&format!("{}.", f.path)));
        if has_children {
            // Optional objects (`scaling`) carry options the reference does
            // not list: left open.
            let closed = !f.type_name.ends_with("(optional)");
            let inner = object_schema(all, f.path, closed);
            if let Value::Object(m) = &mut s {
                m.extend(inner);
            }
        }
        properties.insert(f.path[prefix.len()..].to_string(), s);
    }
    let mut m = Map::new();
    m.insert("properties".into(), Value::Object(properties));
    if closed {
        m.insert("additionalProperties".into(), json!(false));
    }
    m
}

/// The JSON Schema of a kind's document (`nodepool`, `cluster`).
pub fn json_schema(kind: &str) -> Value {
    let all = fields(kind);
    let mut spec = Map::new();
    spec.insert("type".into(), json!("object"));
    spec.insert(
        "description".into(),
        json!(format!(
            "The {} as the user writes it; every field has a default",
            kind_name(kind)
        )),
    );
    spec.extend(object_schema(&all, "spec", true));
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": format!("{SCHEMA_ID_BASE}{}", file_name(kind)),
        "title": format!("{} ({})", kind_name(kind), crate::API_VERSION),
        "description": "Generated from knit-api's reference (crates/knit-api/src/schema.rs); do not edit. Fields the server sets (metadata timestamps, status) are accepted and ignored on input.",
        "type": "object",
        "required": ["apiVersion", "kind", "metadata"],
        "properties": {
            "apiVersion": { "const": crate::API_VERSION },
            "kind": { "const": kind_name(kind) },
            "metadata": {
                "type": "object",
                "required": ["name"],
                "properties": { "name": { "type": "string", "minLength": 1, "maxLength": 63 } }
            },
            "spec": Value::Object(spec)
        }
    })
}

/// Every kind's schema: (file name under docs/schema/, pretty JSON with a
/// final newline).
pub fn files() -> Vec<(String, String)> {
    KINDS
        .iter()
        .map(|(kind, _)| {
            let text =
                serde_json::to_string_pretty(&json_schema(kind)).expect("a schema serializes");
            (file_name(kind), format!("{text}\n"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the schema says of `value` at `at`: every mismatch of type,
    /// enum, const, required key and closed object, as messages. Only the
    /// keywords [`json_schema`] uses.
    fn check(schema: &Value, value: &Value, at: &str, out: &mut Vec<String>) {
        if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
            let fits = any.iter().any(|s| {
                let mut inner = Vec::new();
                check(s, value, at, &mut inner);
                inner.is_empty()
            });
            if !fits {
                out.push(format!("{at}: {value} fits no alternative"));
            }
        }
        if let Some(t) = schema.get("type") {
            let types: Vec<&str> = match t {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => vec![],
            };
            let is = match value {
                Value::Null => "null",
                Value::Bool(_) => "boolean",
                Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
                Value::Number(_) => "number",
                Value::String(_) => "string",
                Value::Array(_) => "array",
                Value::Object(_) => "object",
            };
            let fits = types.contains(&is) || (is == "integer" && types.contains(&"number"));
            if !fits {
                out.push(format!("{at}: {is} where the schema says {types:?}"));
                return;
            }
        }
        if let Some(c) = schema.get("const") {
            if c != value {
                out.push(format!("{at}: {value} is not {c}"));
            }
        }
        if let Some(e) = schema.get("enum").and_then(Value::as_array) {
            if !e.contains(value) {
                out.push(format!("{at}: {value} is not one of {e:?}"));
            }
        }
        if let Some(Value::String(p)) = schema.get("pattern") {
            // The one pattern used: digits then %.
            let s = value.as_str().unwrap_or_default();
            let ok = p == "^[0-9]+%$"
                && s.len() > 1
                && s.ends_with('%')
                && s[..s.len() - 1].bytes().all(|b| b.is_ascii_digit());
            if !ok {
                out.push(format!("{at}: {value} does not match {p}"));
            }
        }
        if let (Some(items), Value::Array(a)) = (schema.get("items"), value) {
            for (i, v) in a.iter().enumerate() {
                check(items, v, &format!("{at}[{i}]"), out);
            }
        }
        if let Value::Object(map) = value {
            let props = schema.get("properties").and_then(Value::as_object);
            for r in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if !map.contains_key(r.as_str().unwrap_or_default()) {
                    out.push(format!("{at}: {r} is required"));
                }
            }
            for (k, v) in map {
                match props.and_then(|p| p.get(k)) {
                    Some(s) => check(s, v, &format!("{at}.{k}"), out),
                    None => match schema.get("additionalProperties") {
                        Some(Value::Bool(false)) => out.push(format!("{at}: {k} is not a field")),
                        Some(s @ Value::Object(_)) => check(s, v, &format!("{at}.{k}"), out),
                        _ => {}
                    },
                }
            }
        }
    }

    fn problems(kind: &str, doc: &Value) -> Vec<String> {
        let mut out = Vec::new();
        check(&json_schema(kind), doc, "", &mut out);
        out
    }

    /// Every field of the reference maps to a schema type.
    #[test]
    fn every_reference_type_maps() {
        for (kind, _) in KINDS {
            for f in fields(kind) {
                let s = type_schema(&f);
                assert!(
                    s.get("type").is_some() || s.get("anyOf").is_some(),
                    "{kind}: {} has type {:?}, which the schema does not map",
                    f.path,
                    f.type_name
                );
            }
        }
    }

    /// The documents the API stores, defaults and every option set, fit;
    /// a misspelt field, a wrong type or a word outside an enum does not.
    #[test]
    fn stored_documents_fit_and_mistakes_do_not() {
        let pool = crate::NodePool::new("web", crate::NodePoolSpec::default());
        let mut pool = serde_json::to_value(&pool).unwrap();
        assert!(
            problems("nodepool", &pool).is_empty(),
            "{:?}",
            problems("nodepool", &pool)
        );
        pool["spec"]["type"] = json!("auto-scaling");
        pool["spec"]["scaling"] = json!({"min": 0, "max": 3, "scaleDownUnneededSeconds": 300});
        pool["spec"]["zone"] = json!("cn-shanghai-b");
        pool["spec"]["updateStrategy"]["maxSurge"] = json!("25%");
        pool["spec"]["restartedAt"] = json!("2026-12-02T00:00:00Z");
        assert!(
            problems("nodepool", &pool).is_empty(),
            "{:?}",
            problems("nodepool", &pool)
        );

        let mut bad = pool.clone();
        bad["spec"]["replicaz"] = json!(2);
        bad["spec"]["drain"]["onTimeout"] = json!("later");
        bad["spec"]["updateStrategy"]["maxSurge"] = json!("many");
        bad["spec"]["drain"]["timeoutSecond"] = json!(1);
        bad["spec"]["replicas"] = json!("two");
        bad["kind"] = json!("Cluster");
        let found = problems("nodepool", &bad);
        for want in [
            ".spec: replicaz is not a field",
            ".spec.drain: timeoutSecond is not a field",
            ".spec.drain.onTimeout: \"later\" is not one of",
            ".spec.updateStrategy.maxSurge: \"many\" fits no alternative",
            ".spec.replicas: string where the schema says [\"integer\"]",
            ".kind: \"Cluster\" is not \"NodePool\"",
        ] {
            assert!(
                found.iter().any(|p| p.starts_with(want)),
                "{want} not in {found:?}"
            );
        }

        let cluster = serde_json::to_value(crate::Cluster::default()).unwrap();
        assert!(
            problems("cluster", &cluster).is_empty(),
            "{:?}",
            problems("cluster", &cluster)
        );
        let mut bad = cluster.clone();
        bad["spec"]["network"]["plugin"] = json!("calico");
        assert!(!problems("cluster", &bad).is_empty());
    }

    /// docs/schema/*.json are what [`files`] makes.
    #[test]
    fn schema_files_are_current() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/schema");
        for (name, want) in files() {
            let path = dir.join(&name);
            if std::env::var_os("KNIT_UPDATE_REFERENCE").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &want).unwrap();
            }
            let have = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                have == want,
                "docs/schema/{name} is out of date: KNIT_UPDATE_REFERENCE=1 cargo test -p knit-api schema"
            );
        }
    }
}
