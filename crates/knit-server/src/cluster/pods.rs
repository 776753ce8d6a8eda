//! Pods and PodDisruptionBudgets as a drain needs them, read from the
//! Kubernetes API's JSON (the embedded API answers it; an external
//! cluster's objects are turned into it), and the answer to one eviction.

use serde_json::Value;
use std::collections::BTreeMap;

/// The annotation the kubelet puts on the API's mirror of a static pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// One pod, as a drain sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    /// `spec.nodeName`.
    pub node: String,
    pub labels: BTreeMap<String, String>,
    /// A static pod's mirror: the kubelet owns it, eviction cannot move it.
    pub mirror: bool,
    /// Owned by a DaemonSet: it would come back on the node at once.
    pub daemon_set: bool,
    /// `status.phase`.
    pub phase: Option<String>,
    /// `metadata.deletionTimestamp` (ms): when a graceful deletion is due
    /// to end.
    pub deletion_ms: Option<i64>,
}

impl PodFacts {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A label selector requirement (`matchExpressions[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    /// In | NotIn | Exists | DoesNotExist.
    pub operator: String,
    pub values: Vec<String>,
}

/// One PodDisruptionBudget, as a drain names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetFacts {
    pub namespace: String,
    pub name: String,
    /// `spec.selector` absent: policy/v1 selects no pod then.
    pub has_selector: bool,
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<Requirement>,
    /// `spec.minAvailable` or `spec.maxUnavailable`, as written
    /// (`minAvailable 2`, `maxUnavailable 10%`).
    pub rule: Option<String>,
    /// `status.disruptionsAllowed`, when the disruption controller set it.
    pub disruptions_allowed: Option<i64>,
}

impl BudgetFacts {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the budget's selector selects a pod with `labels` (of its
    /// own namespace): `matchLabels` and every `matchExpressions` entry, as
    /// the API server's label selectors do; an empty selector selects every
    /// pod (policy/v1), an absent one none.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        if !self.has_selector {
            return false;
        }
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator.as_str() {
                    "In" => value.is_some_and(|v| r.values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !r.values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    // An operator the API would have refused: selects nothing.
                    _ => false,
                }
            })
    }
}

/// The answer to one eviction (`POST …/pods/NAME/eviction`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// Accepted: the pod is being deleted gracefully.
    Evicted,
    /// The pod is gone already (404).
    Gone,
    /// Refused for now, with the API's message: 429 (a
    /// PodDisruptionBudget does not allow it), or 500 for a pod that more
    /// than one budget selects (the API says it "has more than one
    /// PodDisruptionBudget").
    Refused(String),
}

/// Whether an eviction's error answer is a refusal by the pod's budgets
/// (the drain waits and names them) rather than a failure of the API: 429,
/// or 500 for a pod that more than one PodDisruptionBudget selects (no
/// eviction of it can succeed while both select it).
pub fn is_budget_refusal(status: u16, message: &str) -> bool {
    status == 429 || (status == 500 && message.contains("more than one PodDisruptionBudget"))
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
        .collect()
}

/// RFC 3339 (as the API writes timestamps) → ms since the epoch.
pub fn rfc3339_ms(text: &str) -> Option<i64> {
    knit_os::time::parse_rfc3339(text)
        .ok()
        .map(knit_os::time::unix_ms)
}

/// A pod object's facts; `None` when it has no name.
pub fn pod_facts(pod: &Value) -> Option<PodFacts> {
    let meta = &pod["metadata"];
    let name = meta["name"].as_str()?.to_string();
    let daemon_set = meta["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|o| o["kind"] == "DaemonSet");
    Some(PodFacts {
        namespace: meta["namespace"].as_str().unwrap_or("default").to_string(),
        name,
        node: pod["spec"]["nodeName"].as_str().unwrap_or("").to_string(),
        labels: string_map(&meta["labels"]),
        mirror: meta["annotations"].get(MIRROR_ANNOTATION).is_some(),
        daemon_set,
        phase: pod["status"]["phase"].as_str().map(str::to_string),
        deletion_ms: meta["deletionTimestamp"].as_str().and_then(rfc3339_ms),
    })
}

/// The pods of a list answer (`{"items": [...]}`).
pub fn pod_list(list: &Value) -> Vec<PodFacts> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(pod_facts)
        .collect()
}

/// A PodDisruptionBudget object's facts; `None` when it has no name.
pub fn budget_facts(pdb: &Value) -> Option<BudgetFacts> {
    let meta = &pdb["metadata"];
    let spec = &pdb["spec"];
    let selector = &spec["selector"];
    let rule = [
        ("minAvailable", "minAvailable"),
        ("maxUnavailable", "maxUnavailable"),
    ]
    .iter()
    .find_map(|(field, word)| match &spec[*field] {
        Value::Number(n) => Some(format!("{word} {n}")),
        Value::String(s) => Some(format!("{word} {s}")),
        _ => None,
    });
    Some(BudgetFacts {
        namespace: meta["namespace"].as_str().unwrap_or("default").to_string(),
        name: meta["name"].as_str()?.to_string(),
        has_selector: selector.is_object(),
        match_labels: string_map(&selector["matchLabels"]),
        match_expressions: selector["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| Requirement {
                key: r["key"].as_str().unwrap_or("").to_string(),
                operator: r["operator"].as_str().unwrap_or("").to_string(),
                values: r["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect(),
            })
            .collect(),
        rule,
        disruptions_allowed: pdb["status"]["disruptionsAllowed"].as_i64(),
    })
}

/// The budgets of a list answer.
pub fn budget_list(list: &Value) -> Vec<BudgetFacts> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(budget_facts)
        .collect()
}

/// The policy/v1 Eviction body for one pod.
pub fn eviction_body(namespace: &str, name: &str) -> Value {
    serde_json::json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// kube-apiserver's message (with status 500) for the eviction of a pod
    /// that more than one PodDisruptionBudget selects.
    const MULTIPLE_BUDGETS: &str =
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.";

    #[test]
    fn rfc3339_reads_as_milliseconds_since_the_epoch() {
        assert_eq!(rfc3339_ms("1970-01-01T00:00:01.5Z"), Some(1_500));
        assert_eq!(
            rfc3339_ms("2026-12-03T13:45:00.123+01:00"),
            Some(1_796_301_900_123)
        );
        assert_eq!(rfc3339_ms("2026-12-03"), None);
    }

    #[test]
    fn a_pod_object_reads_as_its_facts() {
        let pod = json!({
            "metadata": {
                "name": "web-1", "namespace": "shop",
                "labels": {"app": "web"},
                "annotations": {"kubernetes.io/config.mirror": "abc"},
                "ownerReferences": [{"kind": "DaemonSet", "name": "ds"}],
                "deletionTimestamp": "2026-01-01T00:00:10Z",
            },
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running"},
        });
        let f = pod_facts(&pod).unwrap();
        assert_eq!(f.key(), "shop/web-1");
        assert_eq!(f.node, "n1");
        assert!(f.mirror && f.daemon_set);
        assert_eq!(f.phase.as_deref(), Some("Running"));
        assert_eq!(f.deletion_ms, Some(1_767_225_610_000));
        assert_eq!(f.labels["app"], "web");
        let plain = pod_facts(&json!({"metadata": {"name": "p"}})).unwrap();
        assert_eq!(plain.namespace, "default");
        assert!(!plain.mirror && !plain.daemon_set && plain.deletion_ms.is_none());
        assert!(pod_facts(&json!({"metadata": {}})).is_none());
        let owned_by_rs =
            json!({"metadata": {"name": "p", "ownerReferences": [{"kind": "ReplicaSet"}]}});
        assert!(!pod_facts(&owned_by_rs).unwrap().daemon_set);
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn budget_selectors_select_as_the_api_server_does() {
        let pdb = json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {
                "minAvailable": 2,
                "selector": {
                    "matchLabels": {"app": "web"},
                    "matchExpressions": [
                        {"key": "tier", "operator": "In", "values": ["a", "b"]},
                        {"key": "canary", "operator": "DoesNotExist"},
                    ],
                },
            },
            "status": {"disruptionsAllowed": 0},
        });
        let b = budget_facts(&pdb).unwrap();
        assert_eq!(b.key(), "shop/web");
        assert_eq!(b.rule.as_deref(), Some("minAvailable 2"));
        assert_eq!(b.disruptions_allowed, Some(0));
        assert!(b.selects(&labels(&[("app", "web"), ("tier", "a")])));
        assert!(!b.selects(&labels(&[("app", "web"), ("tier", "c")])));
        assert!(!b.selects(&labels(&[("app", "web")])), "In needs the key");
        assert!(!b.selects(&labels(&[("app", "web"), ("tier", "a"), ("canary", "1")])));
        assert!(!b.selects(&labels(&[("app", "db"), ("tier", "a")])));

        let other = |op: &str, values: &[&str]| BudgetFacts {
            has_selector: true,
            match_expressions: vec![Requirement {
                key: "k".into(),
                operator: op.into(),
                values: values.iter().map(|v| v.to_string()).collect(),
            }],
            ..BudgetFacts::default()
        };
        assert!(
            other("NotIn", &["x"]).selects(&labels(&[])),
            "NotIn: absent key"
        );
        assert!(!other("NotIn", &["x"]).selects(&labels(&[("k", "x")])));
        assert!(other("Exists", &[]).selects(&labels(&[("k", "")])));
        assert!(!other("Exists", &[]).selects(&labels(&[])));
        assert!(!other("Sometimes", &[]).selects(&labels(&[("k", "x")])));

        // policy/v1: an empty selector selects every pod, none selects none.
        let empty = budget_facts(&json!({"metadata": {"name": "all"}, "spec": {"selector": {}, "maxUnavailable": "10%"}})).unwrap();
        assert!(empty.selects(&labels(&[("any", "thing")])));
        assert_eq!(empty.rule.as_deref(), Some("maxUnavailable 10%"));
        assert_eq!(empty.disruptions_allowed, None);
        let none = budget_facts(&json!({"metadata": {"name": "none"}, "spec": {}})).unwrap();
        assert!(!none.selects(&labels(&[])));
    }

    #[test]
    fn a_pod_under_two_budgets_is_a_refusal_not_a_failure() {
        assert!(is_budget_refusal(
            429,
            "Cannot evict pod as it would violate the pod's disruption budget."
        ));
        assert!(is_budget_refusal(500, MULTIPLE_BUDGETS));
        assert!(!is_budget_refusal(500, "etcdserver: request timed out"));
        assert!(!is_budget_refusal(403, MULTIPLE_BUDGETS));
    }

    #[test]
    fn the_eviction_body_is_policy_v1() {
        assert_eq!(
            eviction_body("shop", "web-1"),
            json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-1", "namespace": "shop"}})
        );
    }
}
