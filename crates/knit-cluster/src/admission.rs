//! What the server sets and checks on writes: server-owned fields on
//! create, and per-kind validation (422 with every invalid field listed).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use knit_api::validate::{check_label_key, check_label_value, is_dns_subdomain};
use knit_api::USER_DATA_GATE_TAINT;
use serde_json::{json, Value};

use crate::auth::Identity;
use crate::error::ApiStatus;
use crate::resources::ResourceDef;
use crate::{pki, tokens, util};

const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];
const CONDITION_STATUSES: &[&str] = &["True", "False", "Unknown"];

/// Server-owned fields on create.
pub fn prepare_create(def: &ResourceDef, obj: &mut Value, who: &Identity) {
    match def.kind {
        "CertificateSigningRequest" => {
            // Who asked is recorded by the server, never taken from the body.
            let spec = util::field_mut(obj, "spec");
            spec.insert("username".into(), json!(who.user));
            spec.insert("groups".into(), json!(who.groups));
            spec.remove("uid");
            obj["status"] = json!({});
        }
        "Secret" => fold_string_data(obj),
        "Pod" => crate::pods::prepare_create(obj),
        "PodDisruptionBudget" => {
            obj["status"] = json!({"currentHealthy": 0, "desiredHealthy": 0, "disruptionsAllowed": 0, "expectedPods": 0});
        }
        "ReplicaSet" | "Deployment" | "StatefulSet" => {
            util::field_mut(obj, "spec")
                .entry("replicas")
                .or_insert(json!(1));
            obj["status"] = json!({});
        }
        "DaemonSet" => obj["status"] = json!({}),
        "Namespace" => {
            util::field_mut(obj, "spec").insert("finalizers".into(), json!(["kubernetes"]));
            obj["status"] = json!({"phase": "Active"});
        }
        _ => {}
    }
    if has_generation(def) {
        util::meta_mut(obj).insert("generation".into(), json!(1));
    }
}

/// Kinds whose `metadata.generation` counts spec changes.
fn has_generation(def: &ResourceDef) -> bool {
    matches!(
        def.kind,
        "PodDisruptionBudget" | "DaemonSet" | "ReplicaSet" | "Deployment" | "StatefulSet"
    )
}

/// Server-owned metadata on an update of the main resource: the deletion
/// marks stay the server's, and `generation` grows when the spec changes.
pub fn prepare_update(def: &ResourceDef, current: &Value, next: &mut Value) {
    let meta = util::meta_mut(next);
    for key in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match current["metadata"].get(key) {
            Some(v) => meta.insert(key.into(), v.clone()),
            None => meta.remove(key),
        };
    }
    if def.kind == "Node" {
        crate::ipam::keep_pod_cidr(current, next);
    }
    if has_generation(def) && current.get("spec") != next.get("spec") {
        let g = current["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        util::meta_mut(next).insert("generation".into(), json!(g));
    }
}

/// `stringData` is a write-only convenience: fold it into `data`.
pub fn fold_string_data(obj: &mut Value) {
    if let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|o| o.remove("stringData")) {
        let data = util::field_mut(obj, "data");
        for (k, v) in sd {
            if let Some(s) = v.as_str() {
                data.insert(k, Value::String(STANDARD.encode(s)));
            }
        }
    }
}

pub fn validate(def: &ResourceDef, obj: &Value) -> Result<(), ApiStatus> {
    let mut errs: Vec<(String, String)> = Vec::new();
    let mut bad = |f: &str, m: String| errs.push((f.to_string(), m));
    let name = util::name_of(obj);
    if name.is_empty() {
        bad(
            "metadata.name",
            "Required value: name or generateName is required".into(),
        );
    } else if !is_dns_subdomain(name) {
        bad(
            "metadata.name",
            format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"),
        );
    }
    if let Some(labels) = obj["metadata"].get("labels") {
        match labels.as_object() {
            Some(m) => {
                for (k, v) in m {
                    if let Err(e) = check_label_key(k) {
                        bad("metadata.labels", format!("Invalid value: {k:?}: {e}"));
                    }
                    match v.as_str() {
                        Some(s) => {
                            if let Err(e) = check_label_value(s) {
                                bad(
                                    &format!("metadata.labels.{k}"),
                                    format!("Invalid value: {s:?}: {e}"),
                                );
                            }
                        }
                        None => bad(&format!("metadata.labels.{k}"), "must be a string".into()),
                    }
                }
            }
            None if labels.is_null() => {}
            None => bad("metadata.labels", "must be a map of strings".into()),
        }
    }
    match def.kind {
        "Node" => validate_node(obj, &mut bad),
        "Lease" => {
            let d = &obj["spec"]["leaseDurationSeconds"];
            if !d.is_null() && d.as_i64().is_none_or(|s| s <= 0) {
                bad(
                    "spec.leaseDurationSeconds",
                    format!("Invalid value: {d}: must be greater than 0"),
                );
            }
            for f in ["renewTime", "acquireTime"] {
                let t = &obj["spec"][f];
                if !t.is_null() && t.as_str().and_then(util::parse_time).is_none() {
                    bad(
                        &format!("spec.{f}"),
                        format!("Invalid value: {t}: must be an RFC 3339 time"),
                    );
                }
            }
        }
        "CertificateSigningRequest" => validate_csr(obj, &mut bad),
        "Secret" => validate_secret(obj, &mut bad),
        "Pod" => crate::pods::validate(obj, &mut bad),
        "PodDisruptionBudget" => crate::disruption::validate(obj, &mut bad),
        _ => {}
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiStatus::invalid(def.kind, name, errs))
    }
}

fn validate_node(obj: &Value, bad: &mut impl FnMut(&str, String)) {
    let taints = &obj["spec"]["taints"];
    if let Some(list) = taints.as_array() {
        let mut seen = std::collections::HashSet::new();
        for (i, t) in list.iter().enumerate() {
            let at = format!("spec.taints[{i}]");
            let key = t["key"].as_str().unwrap_or("");
            if let Err(e) = check_label_key(key) {
                bad(&format!("{at}.key"), format!("Invalid value: {key:?}: {e}"));
            }
            if let Some(v) = t.get("value").and_then(Value::as_str) {
                if let Err(e) = check_label_value(v) {
                    bad(&format!("{at}.value"), format!("Invalid value: {v:?}: {e}"));
                }
            }
            let effect = t["effect"].as_str().unwrap_or("");
            if !TAINT_EFFECTS.contains(&effect) {
                bad(
                    &format!("{at}.effect"),
                    format!("Unsupported value: {effect:?}: supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\""),
                );
            }
            if !seen.insert((key.to_string(), effect.to_string())) {
                bad(&at, format!("Duplicate value: taint {key}:{effect}"));
            }
        }
    } else if !taints.is_null() {
        bad("spec.taints", "must be a list".into());
    }
    let u = &obj["spec"]["unschedulable"];
    if !u.is_null() && !u.is_boolean() {
        bad(
            "spec.unschedulable",
            format!("Invalid value: {u}: must be a boolean"),
        );
    }
    if let Some(conds) = obj["status"]["conditions"].as_array() {
        for (i, c) in conds.iter().enumerate() {
            if c["type"].as_str().is_none_or(str::is_empty) {
                bad(
                    &format!("status.conditions[{i}].type"),
                    "Required value".into(),
                );
            }
            let s = c["status"].as_str().unwrap_or("");
            if !CONDITION_STATUSES.contains(&s) {
                bad(
                    &format!("status.conditions[{i}].status"),
                    format!("Unsupported value: {s:?}: supported values: \"True\", \"False\", \"Unknown\""),
                );
            }
        }
    }
}

fn validate_csr(obj: &Value, bad: &mut impl FnMut(&str, String)) {
    let spec = &obj["spec"];
    match spec["request"].as_str().map(|r| STANDARD.decode(r)) {
        None => bad("spec.request", "Required value".into()),
        Some(Err(e)) => bad("spec.request", format!("Invalid value: not base64: {e}")),
        Some(Ok(pem)) => {
            let parsed = String::from_utf8(pem)
                .map_err(|e| e.to_string())
                .and_then(|p| pki::parse_csr(&p).map_err(|e| e.to_string()));
            if let Err(e) = parsed {
                bad("spec.request", format!("Invalid value: {e}"));
            }
        }
    }
    let signer = spec["signerName"].as_str().unwrap_or("");
    if signer.is_empty() {
        bad("spec.signerName", "Required value".into());
    } else if !signer.contains('/') {
        bad("spec.signerName", format!("Invalid value: {signer:?}: must be a fully qualified domain and path of the form 'example.com/signer-name'"));
    }
    if spec["usages"]
        .as_array()
        .is_none_or(|u| u.is_empty() || u.iter().any(|x| !x.is_string()))
    {
        bad("spec.usages", "Required value: a list of key usages".into());
    }
    let exp = &spec["expirationSeconds"];
    if !exp.is_null() && exp.as_i64().is_none_or(|s| s < 600) {
        bad("spec.expirationSeconds", format!("Invalid value: {exp}: may not specify a duration less than 600 seconds (10 minutes)"));
    }
    if let Some(conds) = obj["status"]["conditions"].as_array() {
        let has = |t: &str| conds.iter().any(|c| c["type"] == t);
        if has("Approved") && has("Denied") {
            bad(
                "status.conditions",
                "Forbidden: Approved and Denied conditions are mutually exclusive".into(),
            );
        }
        for (i, c) in conds.iter().enumerate() {
            let t = c["type"].as_str().unwrap_or("");
            if !["Approved", "Denied", "Failed"].contains(&t) {
                bad(
                    &format!("status.conditions[{i}].type"),
                    format!("Unsupported value: {t:?}"),
                );
            }
        }
    }
}

fn validate_secret(obj: &Value, bad: &mut impl FnMut(&str, String)) {
    if let Some(data) = obj["data"].as_object() {
        for (k, v) in data {
            if v.as_str().is_none_or(|s| STANDARD.decode(s).is_err()) {
                bad(
                    &format!("data[{k}]"),
                    "Invalid value: must be base64-encoded bytes".into(),
                );
            }
        }
    }
    if obj["type"].as_str() != Some(tokens::SECRET_TYPE) {
        return;
    }
    let ns = util::namespace_of(obj);
    if ns != "kube-system" {
        bad(
            "metadata.namespace",
            format!("Invalid value: {ns:?}: bootstrap tokens live in kube-system"),
        );
    }
    let id = tokens::data_field(obj, "token-id").unwrap_or_default();
    let secret = tokens::data_field(obj, "token-secret").unwrap_or_default();
    if !knit_api::validate::is_bootstrap_token(&format!("{id}.{secret}")) {
        bad(
            "data",
            "Invalid value: token-id must match [a-z0-9]{6} and token-secret [a-z0-9]{16}".into(),
        );
    } else if util::name_of(obj) != tokens::secret_name(&id) {
        bad(
            "metadata.name",
            format!(
                "Invalid value: must be {:?} for token-id {id:?}",
                tokens::secret_name(&id)
            ),
        );
    }
    if let Some(groups) = tokens::data_field(obj, "auth-extra-groups") {
        for g in groups.split(',') {
            if !tokens::valid_extra_group(g.trim()) {
                bad(
                    "data[auth-extra-groups]",
                    format!("Invalid value: {g:?}: must start with \"system:bootstrappers:\""),
                );
            }
        }
    }
}

/// Labels kubelet may set on its own Node (Kubernetes' NodeRestriction):
/// outside `kubernetes.io`/`k8s.io` anything goes; inside, only these keys
/// and the `kubelet.kubernetes.io` and `node.kubernetes.io` prefixes.
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
];

pub fn kubelet_may_set_label(key: &str) -> bool {
    let Some((prefix, _)) = key.rsplit_once('/') else {
        return true;
    };
    let in_domain = |d: &str| prefix == d || prefix.ends_with(&format!(".{d}"));
    if prefix == "node-restriction.kubernetes.io"
        || prefix.ends_with(".node-restriction.kubernetes.io")
    {
        return false;
    }
    if !in_domain("kubernetes.io") && !in_domain("k8s.io") {
        return true;
    }
    KUBELET_LABELS.contains(&key)
        || in_domain("kubelet.kubernetes.io")
        || in_domain("node.kubernetes.io")
}

/// A node may not add, change or remove labels it is not allowed to set
/// (e.g. `node-role.kubernetes.io/*`), nor change its taints after it
/// registered: 403, as NodeRestriction does.
pub fn node_restriction(
    who: &Identity,
    def: &ResourceDef,
    current: Option<&Value>,
    next: &Value,
) -> Result<(), ApiStatus> {
    let Some(node) = who.node_name() else {
        return Ok(());
    };
    if def.kind != "Node" {
        return Ok(());
    }
    let labels = |o: Option<&Value>| -> std::collections::BTreeMap<String, Value> {
        o.and_then(|o| o["metadata"]["labels"].as_object())
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    };
    let (before, after) = (labels(current), labels(Some(next)));
    let mut touched: Vec<&String> = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .chain(before.keys().filter(|k| !after.contains_key(*k)))
        .filter(|k| !kubelet_may_set_label(k))
        .collect();
    touched.sort();
    touched.dedup();
    if let Some(current) = current {
        // Taints are the node's at registration only (NodeRestriction): a
        // node that could edit them later could lift what keeps workloads
        // off it, such as the user-data scheduling gate.
        let taints = |o: &Value| o["spec"]["taints"].as_array().cloned().unwrap_or_default();
        let (before, after) = (taints(current), taints(next));
        if before != after {
            let gate_lifted = before.iter().any(|t| t["key"] == USER_DATA_GATE_TAINT)
                && !after.iter().any(|t| t["key"] == USER_DATA_GATE_TAINT);
            let why = if gate_lifted {
                format!(" (it may not remove the scheduling gate taint {USER_DATA_GATE_TAINT}; knit removes it when the node's user data has run)")
            } else {
                String::new()
            };
            return Err(ApiStatus::forbidden(format!(
                "nodes \"{node}\" is forbidden: node \"{node}\" is not allowed to modify taints: spec.taints may be set only when the node registers{why}"
            )));
        }
    }
    if touched.is_empty() {
        return Ok(());
    }
    Err(ApiStatus::forbidden(format!(
        "nodes \"{node}\" is forbidden: node \"{node}\" is not allowed to modify labels: {}",
        touched
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::by_kind;

    #[test]
    fn nodes_may_not_set_restricted_labels() {
        let node = by_kind("Node").unwrap();
        let who = Identity {
            user: "system:node:n1".into(),
            groups: vec!["system:nodes".into()],
        };
        let mk = |labels: Value| json!({"metadata": {"name": "n1", "labels": labels}});
        let ok = mk(
            json!({"kubernetes.io/hostname": "n1", "node.kubernetes.io/instance-type": "x", "pool": "a"}),
        );
        node_restriction(&who, node, None, &ok).unwrap();
        let role = mk(json!({"node-role.kubernetes.io/master": ""}));
        let err = node_restriction(&who, node, Some(&ok), &role).unwrap_err();
        assert_eq!(err.code, 403);
        assert!(
            err.message.contains("node-role.kubernetes.io/master"),
            "{}",
            err.message
        );
        // Unchanged restricted labels (set by an admin) do not block the node.
        node_restriction(&who, node, Some(&role), &role).unwrap();
        assert!(!kubelet_may_set_label("node-restriction.kubernetes.io/x"));
        assert!(kubelet_may_set_label("example.com/x"));
        let admin = Identity {
            user: "admin".into(),
            groups: vec!["system:masters".into()],
        };
        node_restriction(&admin, node, None, &role).unwrap();
    }

    #[test]
    fn node_taints_and_labels_are_checked() {
        let node = by_kind("Node").unwrap();
        let ok = json!({"metadata": {"name": "n1", "labels": {"pool": "a"}}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}});
        validate(node, &ok).unwrap();
        let bad = json!({"metadata": {"name": "N_1", "labels": {"-x": "a"}}, "spec": {"taints": [{"key": "k", "effect": "Sometimes"}]}});
        let err = validate(node, &bad).unwrap_err();
        assert_eq!(err.code, 422);
        let causes = err.details.unwrap()["causes"].as_array().unwrap().len();
        assert_eq!(causes, 3, "{}", err.message);
    }

    #[test]
    fn csr_request_must_verify_and_usernames_come_from_the_server() {
        let csr = by_kind("CertificateSigningRequest").unwrap();
        let mut obj = json!({"metadata": {"name": "c"}, "spec": {"request": STANDARD.encode("junk"), "signerName": "kubernetes.io/kube-apiserver-client-kubelet", "usages": ["client auth"], "username": "system:masters"}});
        let who = Identity {
            user: "system:bootstrap:abcdef".into(),
            groups: vec!["system:bootstrappers".into()],
        };
        prepare_create(csr, &mut obj, &who);
        assert_eq!(obj["spec"]["username"], "system:bootstrap:abcdef");
        let err = validate(csr, &obj).unwrap_err();
        assert!(err.message.contains("spec.request"), "{}", err.message);
    }
}
