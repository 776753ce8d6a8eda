//! JSON patch (RFC 6902) and JSON merge patch (RFC 7386), by the
//! `json-patch` crate, with kube-apiserver's limits; Kubernetes strategic
//! merge patch for the fields nodes and clients patch: lists of conditions and addresses merge
//! by `type`, owner references by `uid`; other lists (taints) are replaced,
//! as in the Kubernetes Go types.

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::ApiStatus;

/// JSON merge patch (RFC 7386).
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" | "addresses" => Some("type"),
        "ownerReferences" => Some("uid"),
        "volumesAttached" => Some("name"),
        _ => None,
    }
}

pub fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), ApiStatus> {
    let Value::Object(p) = patch else {
        return Err(ApiStatus::bad_request(
            "strategic merge patch must be a JSON object",
        ));
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return Ok(());
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = p.clone();
            replaced.remove("$patch");
            *t = replaced;
            return Ok(());
        }
        Some("delete") => {
            t.clear();
            return Ok(());
        }
        Some(other) => {
            return Err(ApiStatus::bad_request(format!(
                "unknown patch directive $patch: {other}"
            )))
        }
        None => {}
    }
    for (k, v) in p {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(gone)) = (t.get_mut(field), v) {
                list.retain(|x| !gone.contains(x));
            }
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), v, merge_key(k)) {
            (Some(Value::Array(cur)), Value::Array(items), Some(key)) => {
                merge_list(cur, items, key)?
            }
            (Some(cur @ Value::Object(_)), Value::Object(_), _) => strategic_merge_patch(cur, v)?,
            (_, Value::Array(items), Some(key)) => {
                let mut fresh = Vec::new();
                merge_list(&mut fresh, items, key)?;
                t.insert(k.clone(), Value::Array(fresh));
            }
            _ => {
                let mut fresh = Value::Null;
                if v.is_object() {
                    strategic_merge_patch(&mut fresh, v)?;
                } else {
                    fresh = v.clone();
                }
                t.insert(k.clone(), fresh);
            }
        }
    }
    Ok(())
}

fn merge_list(cur: &mut Vec<Value>, items: &[Value], key: &str) -> Result<(), ApiStatus> {
    for item in items {
        let Some(id) = item.get(key).cloned() else {
            return Err(ApiStatus::bad_request(format!(
                "list element without merge key {key:?}"
            )));
        };
        let pos = cur.iter().position(|c| c.get(key) == Some(&id));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                cur.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge_patch(&mut cur[i], item)?,
            (None, false) => {
                let mut fresh = Value::Null;
                strategic_merge_patch(&mut fresh, item)?;
                cur.push(fresh);
            }
        }
    }
    Ok(())
}

/// Most operations one JSON patch may have (kube-apiserver's limit).
pub const MAX_JSON_PATCH_OPS: usize = 10_000;

fn too_large(message: String) -> ApiStatus {
    ApiStatus::new(
        axum::http::StatusCode::PAYLOAD_TOO_LARGE,
        "RequestEntityTooLarge",
        message,
    )
}

/// Serialized size of `v`, counted up to `cap` bytes: `None` when larger.
/// Counting stops at the cap, so measuring a huge value costs no more.
fn size_within(v: &Value, cap: usize) -> Option<usize> {
    struct Count(usize, usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            if self.0 > self.1 {
                return Err(std::io::Error::other("over the cap"));
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0, cap);
    serde_json::to_writer(&mut c, v).ok().map(|_| c.0)
}

/// JSON patch (RFC 6902): add, remove, replace, test, move, copy. At most
/// `MAX_JSON_PATCH_OPS` operations, and the object may not grow past
/// `max_bytes` on the way (counted before each value is added or copied,
/// so a `copy` of an object into its own child, doubling it per
/// operation, is refused before the memory is spent): 413.
pub fn json_patch(target: &mut Value, ops: &Value, max_bytes: usize) -> Result<(), ApiStatus> {
    let ops = ops
        .as_array()
        .ok_or_else(|| ApiStatus::bad_request("JSON patch must be an array of operations"))?;
    if ops.len() > MAX_JSON_PATCH_OPS {
        return Err(too_large(format!(
            "the allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPS}, got {}",
            ops.len()
        )));
    }
    let over = |size: &str| {
        too_large(format!(
            "the JSON patch would make the object {size} bytes; the limit for a stored object is {max_bytes} bytes (1.5 MiB)"
        ))
    };
    // An upper bound of the object's size as the operations apply: what
    // they add counts, what they remove does not.
    let mut size = size_within(target, max_bytes).ok_or_else(|| over("over"))?;
    for op in ops {
        let kind = op["op"].as_str().unwrap_or("");
        let added = match kind {
            "add" | "replace" => Some(&op["value"]),
            "copy" => op["from"].as_str().and_then(|f| target.pointer(f)),
            _ => None,
        };
        if let Some(v) = added {
            let room = max_bytes.saturating_sub(size);
            size += size_within(v, room).ok_or_else(|| over(&format!("more than {max_bytes}")))?;
        }
        let path = op["path"]
            .as_str()
            .ok_or_else(|| ApiStatus::bad_request("JSON patch operation without path"))?;
        let fail = |why: &str| {
            ApiStatus::new(
                axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!("JSON patch {kind} {path}: {why}"),
            )
        };
        match kind {
            "add" | "replace" | "remove" | "test" => {}
            "move" | "copy" if op["from"].is_string() => {}
            "move" | "copy" => return Err(fail("missing from")),
            other => {
                return Err(ApiStatus::bad_request(format!(
                    "unknown JSON patch op {other:?}"
                )))
            }
        }
        let parsed =
            json_patch::PatchOperation::deserialize(op).map_err(|e| fail(&e.to_string()))?;
        // One operation at a time, so the size bound above sees each one;
        // the caller patches a copy, so a failure needs no undo.
        json_patch::patch_unsafe(target, std::slice::from_ref(&parsed)).map_err(|e| {
            fail(match e.kind {
                json_patch::PatchErrorKind::TestFailed => "test failed",
                json_patch::PatchErrorKind::InvalidFromPointer => "from does not exist",
                json_patch::PatchErrorKind::CannotMoveInsideItself => {
                    "cannot move a value into itself"
                }
                _ => "path does not exist",
            })
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_sets_and_removes() {
        let mut n = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}});
        merge_patch(
            &mut n,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"unschedulable": true}}),
        );
        assert_eq!(n["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        assert_eq!(n["spec"]["unschedulable"], json!(true));
        assert_eq!(n["spec"]["taints"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn strategic_merges_conditions_by_type_and_replaces_taints() {
        let mut n = json!({
            "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]},
            "status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "KubeletNotReady"},
                {"type": "DiskPressure", "status": "False"}
            ]}
        });
        strategic_merge_patch(
            &mut n,
            &json!({
                "spec": {"taints": [{"key": "b", "effect": "NoExecute"}]},
                "status": {
                    "$setElementOrder/conditions": [{"type": "DiskPressure"}, {"type": "Ready"}],
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"},
                                   {"type": "DiskPressure", "$patch": "delete"}]
                }
            }),
        )
        .unwrap();
        assert_eq!(
            n["spec"]["taints"],
            json!([{"key": "b", "effect": "NoExecute"}])
        );
        assert_eq!(
            n["status"]["conditions"],
            json!([{"type": "Ready", "status": "True", "reason": "KubeletReady"}])
        );
        assert!(strategic_merge_patch(
            &mut n,
            &json!({"status": {"conditions": [{"status": "x"}]}})
        )
        .is_err());
    }

    #[test]
    fn json_patch_ops() {
        let mut n = json!({"metadata": {"labels": {"a/b": "1"}}, "spec": {"taints": []}});
        json_patch(&mut n, &json!([
            {"op": "add", "path": "/spec/taints/-", "value": {"key": "k", "effect": "NoSchedule"}},
            {"op": "remove", "path": "/metadata/labels/a~1b"},
            {"op": "test", "path": "/spec/taints/0/key", "value": "k"}
        ]), 1 << 20).unwrap();
        assert_eq!(n["metadata"]["labels"], json!({}));
        assert_eq!(n["spec"]["taints"][0]["key"], "k");
        let err = json_patch(
            &mut n,
            &json!([{"op": "replace", "path": "/nope", "value": 1}]),
            1 << 20,
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
    }

    #[test]
    fn json_patch_failures_keep_their_statuses_and_messages() {
        let doc = json!({"a": {"b": [1, 2]}, "c": "x"});
        let cases = [
            (
                json!({"op": "test", "path": "/c", "value": "y"}),
                422,
                "JSON patch test /c: test failed",
            ),
            (
                json!({"op": "remove", "path": "/nope"}),
                422,
                "JSON patch remove /nope: path does not exist",
            ),
            (
                json!({"op": "add", "path": "/a/b/9", "value": 3}),
                422,
                "JSON patch add /a/b/9: path does not exist",
            ),
            (
                json!({"op": "copy", "from": "/gone", "path": "/d"}),
                422,
                "JSON patch copy /d: from does not exist",
            ),
            (
                json!({"op": "move", "from": "/a", "path": "/a/e"}),
                422,
                "JSON patch move /a/e: cannot move a value into itself",
            ),
            (
                json!({"op": "copy", "path": "/d"}),
                422,
                "JSON patch copy /d: missing from",
            ),
            (
                json!({"op": "frob", "path": "/c"}),
                400,
                "unknown JSON patch op \"frob\"",
            ),
            (
                json!({"op": "add", "value": 1}),
                400,
                "JSON patch operation without path",
            ),
        ];
        for (op, code, message) in cases {
            let mut n = doc.clone();
            let err = json_patch(&mut n, &json!([op]), 1 << 20).unwrap_err();
            assert_eq!((err.code, err.message.as_str()), (code, message), "{op}");
        }
        let err = json_patch(&mut doc.clone(), &json!({"op": "add"}), 1 << 20).unwrap_err();
        assert_eq!(err.code, 400);
        let mut n = doc.clone();
        json_patch(
            &mut n,
            &json!([
                {"op": "move", "from": "/c", "path": "/a/b/0"},
                {"op": "replace", "path": "/a/b/-", "value": 0},
            ]),
            1 << 20,
        )
        .unwrap_err();
        json_patch(
            &mut n,
            &json!([{"op": "copy", "from": "/a/b", "path": "/f"}, {"op": "add", "path": "/f/-", "value": 9}]),
            1 << 20,
        )
        .unwrap();
        assert_eq!(n["f"], json!(["x", 1, 2, 9]));
        assert_eq!(n.get("c"), None);
    }

    #[test]
    fn json_patch_copy_doubling_is_refused_before_the_memory_is_spent() {
        let mut n = json!({"data": {"a": "x".repeat(1000)}});
        // 40 doublings would be a terabyte.
        let ops: Vec<Value> = (0..40)
            .map(|i| json!({"op": "copy", "from": "/data", "path": format!("/data/c{i}")}))
            .collect();
        let err = json_patch(&mut n, &Value::Array(ops), 64 * 1024).unwrap_err();
        assert_eq!(err.code, 413, "{}", err.message);
        assert!(err.message.contains("65536"), "{}", err.message);
        let many = Value::Array(vec![
            json!({"op": "test", "path": "/data/a", "value": null});
            MAX_JSON_PATCH_OPS + 1
        ]);
        let err = json_patch(&mut json!({}), &many, 1 << 20).unwrap_err();
        assert_eq!(err.code, 413);
        assert!(err.message.contains("10000"), "{}", err.message);
    }
}
