//! PodDisruptionBudgets as kube-controller-manager's disruption controller
//! and kube-apiserver's eviction see them: `metav1.LabelSelector`
//! matching, integer-or-percent arithmetic (percentages rounded up), the
//! expected scale of the pods' controllers, and the status the controller
//! keeps (`currentHealthy`, `desiredHealthy`, `expectedPods`,
//! `disruptionsAllowed`, `disruptedPods`, `observedGeneration`, the
//! `DisruptionAllowed` condition).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Map, Value};
use time::OffsetDateTime;

use crate::util;

/// An eviction the API approved but whose pod was not deleted within this
/// long no longer counts as disrupted (kube-controller-manager's
/// `DeletionTimeout`).
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);
/// More approved-but-unconfirmed evictions than this and the eviction API
/// refuses (kube-apiserver's `MaxDisruptedPodSize`).
pub const MAX_DISRUPTED_PODS: usize = 2000;
pub const CONDITION: &str = "DisruptionAllowed";

#[derive(Debug, Clone, PartialEq)]
enum Op {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
}

/// A `metav1.LabelSelector` (`matchLabels` and `matchExpressions`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    labels: Vec<(String, String)>,
    exprs: Vec<(String, Op)>,
}

impl LabelSelector {
    /// `None` for a null selector (matches nothing); an error names what
    /// is invalid, as `LabelSelectorAsSelector` does.
    pub fn parse(v: &Value) -> Result<Option<LabelSelector>, String> {
        if v.is_null() {
            return Ok(None);
        }
        let mut s = LabelSelector::default();
        if let Some(m) = v.get("matchLabels").filter(|m| !m.is_null()) {
            let m = m
                .as_object()
                .ok_or("matchLabels must be a map of strings")?;
            for (k, val) in m {
                let val = val
                    .as_str()
                    .ok_or_else(|| format!("matchLabels[{k}] must be a string"))?;
                s.labels.push((k.clone(), val.to_string()));
            }
        }
        if let Some(list) = v.get("matchExpressions").filter(|m| !m.is_null()) {
            let list = list.as_array().ok_or("matchExpressions must be a list")?;
            for e in list {
                let key = e["key"].as_str().unwrap_or("").to_string();
                if key.is_empty() {
                    return Err("matchExpressions: key is required".into());
                }
                let values: Vec<String> = match &e["values"] {
                    Value::Null => Vec::new(),
                    Value::Array(a) => a
                        .iter()
                        .map(|x| x.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()
                        .ok_or("matchExpressions: values must be strings")?,
                    _ => return Err("matchExpressions: values must be a list".into()),
                };
                let op = e["operator"].as_str().unwrap_or("");
                let op = match op {
                    "In" | "NotIn" if values.is_empty() => {
                        return Err(format!(
                            "for 'in', 'notin' operators, values set can't be empty (key {key:?})"
                        ))
                    }
                    "Exists" | "DoesNotExist" if !values.is_empty() => {
                        return Err(format!(
                            "values set must be empty for exists and does not exist (key {key:?})"
                        ))
                    }
                    "In" => Op::In(values),
                    "NotIn" => Op::NotIn(values),
                    "Exists" => Op::Exists,
                    "DoesNotExist" => Op::DoesNotExist,
                    other => {
                        return Err(format!("{other:?} is not a valid label selector operator"))
                    }
                };
                s.exprs.push((key, op));
            }
        }
        Ok(Some(s))
    }

    /// No terms: matches everything.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.exprs.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.labels.iter().all(|(k, v)| get(k) == Some(v.as_str()))
            && self.exprs.iter().all(|(k, op)| match op {
                Op::In(vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
                Op::NotIn(vs) => get(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
                Op::Exists => get(k).is_some(),
                Op::DoesNotExist => get(k).is_none(),
            })
    }
}

/// Whether this budget covers this pod, as the eviction API decides: a
/// null, empty or invalid selector covers nothing.
pub fn covers(pdb: &Value, pod: &Value) -> bool {
    match LabelSelector::parse(&pdb["spec"]["selector"]) {
        Ok(Some(s)) => !s.is_empty() && s.matches(pod),
        _ => false,
    }
}

/// An `IntOrString` budget field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOrPercent {
    Int(i64),
    Percent(i64),
}

impl IntOrPercent {
    pub fn parse(v: &Value) -> Result<Option<IntOrPercent>, String> {
        match v {
            Value::Null => Ok(None),
            Value::Number(n) => n
                .as_i64()
                .map(|i| Some(IntOrPercent::Int(i)))
                .ok_or_else(|| format!("invalid value for IntOrString: {n}")),
            Value::String(s) => s
                .strip_suffix('%')
                .and_then(|p| p.parse::<i64>().ok())
                .map(|p| Some(IntOrPercent::Percent(p)))
                .ok_or_else(|| {
                    format!("invalid value for IntOrString: invalid type: string is not a percentage: {s:?}")
                }),
            other => Err(format!("invalid value for IntOrString: {other}")),
        }
    }

    /// `intstr.GetScaledValueFromIntOrPercent(v, total, roundUp)`.
    pub fn scaled(self, total: i64, round_up: bool) -> i64 {
        match self {
            IntOrPercent::Int(i) => i,
            IntOrPercent::Percent(p) if round_up => (p * total + 99).div_euclid(100),
            IntOrPercent::Percent(p) => (p * total).div_euclid(100),
        }
    }
}

pub fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn deleting(obj: &Value) -> bool {
    !obj["metadata"]["deletionTimestamp"].is_null()
}

/// The owner reference with `controller: true`, if any.
pub fn controller_of(obj: &Value) -> Option<&Value> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)
}

fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("")
}

/// The workload objects of one namespace the scale of a pod's controller
/// is read from.
#[derive(Default)]
pub struct Workloads {
    pub replicasets: Vec<Value>,
    pub deployments: Vec<Value>,
    pub statefulsets: Vec<Value>,
}

fn by_ref<'a>(items: &'a [Value], r: &Value) -> Option<&'a Value> {
    let name = r["name"].as_str()?;
    items
        .iter()
        .find(|o| util::name_of(o) == name && o["metadata"]["uid"] == r["uid"])
}

fn replicas(obj: &Value) -> i64 {
    obj["spec"]["replicas"].as_i64().unwrap_or(1)
}

impl Workloads {
    /// (controller uid, scale) of the controller of a pod's controller
    /// reference, as the controller's finders look it up; `Ok(None)` when
    /// no controller is found.
    fn scale_of(&self, r: &Value) -> Result<Option<(String, i64)>, String> {
        let kind = r["kind"].as_str().unwrap_or("");
        let api_version = r["apiVersion"].as_str().unwrap_or("");
        let group = group_of(api_version);
        let uid = |o: &Value| o["metadata"]["uid"].as_str().unwrap_or("").to_string();
        match (kind, group) {
            ("ReplicaSet", "apps" | "extensions") => {
                let Some(rs) = by_ref(&self.replicasets, r) else {
                    return Ok(None);
                };
                match controller_of(rs) {
                    Some(d) if d["kind"] == "Deployment" => {
                        if !matches!(
                            group_of(d["apiVersion"].as_str().unwrap_or("")),
                            "apps" | "extensions"
                        ) {
                            return Ok(None);
                        }
                        Ok(by_ref(&self.deployments, d).map(|d| (uid(d), replicas(d))))
                    }
                    _ => Ok(Some((uid(rs), replicas(rs)))),
                }
            }
            ("StatefulSet", "apps") => {
                Ok(by_ref(&self.statefulsets, r).map(|s| (uid(s), replicas(s))))
            }
            ("Deployment", "apps") => {
                Ok(by_ref(&self.deployments, r).map(|d| (uid(d), replicas(d))))
            }
            ("DaemonSet", "apps") => {
                Err("daemonsets.apps does not implement the scale subresource".into())
            }
            ("ReplicationController", "") => Ok(None),
            _ => Err(format!(
                "no matches for kind {kind:?} in version {api_version:?}"
            )),
        }
    }

    /// `getExpectedScale`: the sum of the scales of the pods' controllers
    /// (each once); pods without a controller are left out.
    fn expected_scale(&self, pods: &[&Value]) -> Result<i64, String> {
        let mut scales: BTreeMap<String, i64> = BTreeMap::new();
        for pod in pods {
            let Some(r) = controller_of(pod) else {
                continue;
            };
            if let Some(uid) = r["uid"].as_str() {
                if scales.contains_key(uid) {
                    continue;
                }
            }
            match self.scale_of(r)? {
                Some((uid, scale)) => {
                    scales.insert(uid, scale);
                }
                None => {
                    return Err(format!(
                        "found no controllers for pod {:?}",
                        util::name_of(pod)
                    ))
                }
            }
        }
        Ok(scales.values().sum())
    }
}

/// What the disruption controller computes for one budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Computed {
    pub current_healthy: i64,
    pub desired_healthy: i64,
    pub expected_pods: i64,
    pub disruptions_allowed: i64,
    pub disrupted_pods: Map<String, Value>,
}

/// `(expectedCount, desiredHealthy)` of a budget over these pods.
pub fn expected_and_desired(
    spec: &Value,
    pods: &[&Value],
    workloads: &Workloads,
) -> Result<(i64, i64), String> {
    let max_unavailable = IntOrPercent::parse(&spec["maxUnavailable"])?;
    let min_available = IntOrPercent::parse(&spec["minAvailable"])?;
    if let Some(mu) = max_unavailable {
        let expected = workloads.expected_scale(pods)?;
        let desired = (expected - mu.scaled(expected, true)).max(0);
        return Ok((expected, desired));
    }
    match min_available {
        Some(IntOrPercent::Int(i)) => Ok((pods.len() as i64, i)),
        Some(p @ IntOrPercent::Percent(_)) => {
            let expected = workloads.expected_scale(pods)?;
            Ok((expected, p.scaled(expected, true)))
        }
        None => Ok((0, 0)),
    }
}

fn parse_time(v: &Value) -> Option<OffsetDateTime> {
    v.as_str().and_then(util::parse_time)
}

/// The budget's status numbers over `pods_in_ns` (every pod of its
/// namespace) at `now`; an error is what `failSafe` records.
pub fn compute(
    pdb: &Value,
    pods_in_ns: &[Value],
    workloads: &Workloads,
    now: OffsetDateTime,
) -> Result<Computed, String> {
    let selector = LabelSelector::parse(&pdb["spec"]["selector"])?;
    let pods: Vec<&Value> = match &selector {
        None => Vec::new(),
        Some(s) => pods_in_ns.iter().filter(|p| s.matches(p)).collect(),
    };
    let (expected, desired) = expected_and_desired(&pdb["spec"], &pods, workloads)?;
    // buildDisruptedPodMap: kept only for pods that exist, are not being
    // deleted yet and whose eviction is younger than DELETION_TIMEOUT.
    let timeout = time::Duration::try_from(DELETION_TIMEOUT).unwrap_or(time::Duration::MINUTE);
    let mut disrupted = Map::new();
    if let Some(old) = pdb["status"]["disruptedPods"].as_object() {
        for pod in &pods {
            if deleting(pod) {
                continue;
            }
            let name = util::name_of(pod);
            if let Some(at) = old.get(name) {
                if parse_time(at).is_some_and(|t| t + timeout >= now) {
                    disrupted.insert(name.to_string(), at.clone());
                }
            }
        }
    }
    let current = pods
        .iter()
        .filter(|p| !deleting(p) && !disrupted.contains_key(util::name_of(p)) && is_ready(p))
        .count() as i64;
    let mut allowed = current - desired;
    if expected <= 0 || allowed <= 0 {
        allowed = 0;
    }
    Ok(Computed {
        current_healthy: current,
        desired_healthy: desired,
        expected_pods: expected,
        disruptions_allowed: allowed,
        disrupted_pods: disrupted,
    })
}

/// `apimeta.SetStatusCondition`: the transition time changes only with
/// the status.
fn set_condition(status: &mut Map<String, Value>, mut cond: Value, now: OffsetDateTime) {
    let conds = status.entry("conditions").or_insert_with(|| json!([]));
    if !conds.is_array() {
        *conds = json!([]);
    }
    let Some(list) = conds.as_array_mut() else {
        return;
    };
    match list.iter_mut().find(|c| c["type"] == cond["type"]) {
        Some(existing) => {
            if existing["status"] != cond["status"] || existing["lastTransitionTime"].is_null() {
                existing["lastTransitionTime"] = json!(util::rfc3339(now));
            }
            for k in ["status", "reason", "message", "observedGeneration"] {
                existing[k] = cond[k].take();
            }
        }
        None => {
            cond["lastTransitionTime"] = json!(util::rfc3339(now));
            list.push(cond);
        }
    }
}

/// `pdbhelper.UpdateDisruptionAllowedCondition` on a budget object.
pub fn update_allowed_condition(pdb: &mut Value, now: OffsetDateTime) {
    let allowed = pdb["status"]["disruptionsAllowed"].as_i64().unwrap_or(0);
    let observed = pdb["status"]["observedGeneration"].as_i64().unwrap_or(0);
    let (status, reason) = if allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    let cond = json!({"type": CONDITION, "status": status, "reason": reason, "message": "", "observedGeneration": observed});
    set_condition(util::field_mut(pdb, "status"), cond, now);
}

fn conditions_up_to_date(pdb: &Value) -> bool {
    let allowed = pdb["status"]["disruptionsAllowed"].as_i64().unwrap_or(0);
    let observed = &pdb["status"]["observedGeneration"];
    pdb["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter().any(|c| {
            c["type"] == CONDITION
                && c["status"] == if allowed > 0 { "True" } else { "False" }
                && c["observedGeneration"] == *observed
        })
    })
}

pub fn generation(obj: &Value) -> i64 {
    obj["metadata"]["generation"].as_i64().unwrap_or(0)
}

/// The budget with its status set from `c` (`updatePdbStatus`), or `None`
/// when it is already current.
pub fn with_status(pdb: &Value, c: &Computed, now: OffsetDateTime) -> Option<Value> {
    let st = &pdb["status"];
    let same = st["currentHealthy"].as_i64() == Some(c.current_healthy)
        && st["desiredHealthy"].as_i64() == Some(c.desired_healthy)
        && st["expectedPods"].as_i64() == Some(c.expected_pods)
        && st["disruptionsAllowed"].as_i64() == Some(c.disruptions_allowed)
        && st["disruptedPods"].as_object().cloned().unwrap_or_default() == c.disrupted_pods
        && st["observedGeneration"].as_i64() == Some(generation(pdb))
        && conditions_up_to_date(pdb);
    if same {
        return None;
    }
    let mut next = pdb.clone();
    let mut status = json!({
        "currentHealthy": c.current_healthy,
        "desiredHealthy": c.desired_healthy,
        "disruptionsAllowed": c.disruptions_allowed,
        "expectedPods": c.expected_pods,
        "observedGeneration": generation(pdb),
    });
    if !c.disrupted_pods.is_empty() {
        status["disruptedPods"] = Value::Object(c.disrupted_pods.clone());
    }
    if let Some(conds) = st.get("conditions").filter(|c| c.is_array()) {
        status["conditions"] = conds.clone();
    }
    next["status"] = status;
    update_allowed_condition(&mut next, now);
    Some(next)
}

/// `failSafe`: no disruption allowed, the condition saying why.
pub fn fail_safe(pdb: &Value, why: &str, now: OffsetDateTime) -> Option<Value> {
    let mut next = pdb.clone();
    let observed = pdb["status"]["observedGeneration"].as_i64().unwrap_or(0);
    let status = util::field_mut(&mut next, "status");
    status.insert("disruptionsAllowed".into(), json!(0));
    let cond = json!({"type": CONDITION, "status": "False", "reason": "SyncFailed", "message": why, "observedGeneration": observed});
    set_condition(status, cond, now);
    (next != *pdb).then_some(next)
}

/// 422 causes of a budget's spec (kube-apiserver's validation).
pub fn validate(obj: &Value, bad: &mut impl FnMut(&str, String)) {
    let spec = &obj["spec"];
    let mut both = 0;
    for f in ["minAvailable", "maxUnavailable"] {
        match IntOrPercent::parse(&spec[f]) {
            Ok(None) => {}
            Ok(Some(v)) => {
                both += 1;
                match v {
                    IntOrPercent::Int(i) if i < 0 => bad(
                        &format!("spec.{f}"),
                        format!("Invalid value: {i}: must be greater than or equal to 0"),
                    ),
                    IntOrPercent::Percent(p) if !(0..=100).contains(&p) => bad(
                        &format!("spec.{f}"),
                        format!("Invalid value: \"{p}%\": must be no more than 100%"),
                    ),
                    _ => {}
                }
            }
            Err(e) => bad(
                &format!("spec.{f}"),
                format!("Invalid value: {}: {e}", spec[f]),
            ),
        }
    }
    if both == 2 {
        bad(
            "spec",
            "Invalid value: minAvailable and maxUnavailable cannot be both set".into(),
        );
    }
    if let Err(e) = LabelSelector::parse(&spec["selector"]) {
        bad("spec.selector", format!("Invalid value: {e}"));
    }
    let policy = &spec["unhealthyPodEvictionPolicy"];
    if !policy.is_null() && !matches!(policy.as_str(), Some("IfHealthyBudget" | "AlwaysAllow")) {
        bad(
            "spec.unhealthyPodEvictionPolicy",
            format!("Unsupported value: {policy}: supported values: \"AlwaysAllow\", \"IfHealthyBudget\""),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, labels: Value, ready: bool) -> Value {
        json!({"metadata": {"name": name, "labels": labels},
               "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}})
    }

    #[test]
    fn percentages_round_up_as_kubernetes_does() {
        let p = |s: &str| IntOrPercent::parse(&json!(s)).unwrap().unwrap();
        // minAvailable 50% of 3 = 1.5 -> 2; maxUnavailable 50% of 3 -> 2.
        assert_eq!(p("50%").scaled(3, true), 2);
        assert_eq!(p("33%").scaled(10, true), 4);
        assert_eq!(p("10%").scaled(5, true), 1);
        assert_eq!(p("0%").scaled(7, true), 0);
        assert_eq!(p("100%").scaled(7, true), 7);
        assert_eq!(p("50%").scaled(3, false), 1);
        assert_eq!(
            IntOrPercent::parse(&json!(2)).unwrap(),
            Some(IntOrPercent::Int(2))
        );
        assert!(IntOrPercent::parse(&json!("2")).is_err());
        assert!(IntOrPercent::parse(&json!("x%")).is_err());
        assert_eq!(IntOrPercent::parse(&Value::Null).unwrap(), None);
    }

    fn rs(name: &str, uid: &str, replicas: i64) -> Value {
        json!({"metadata": {"name": name, "uid": uid}, "spec": {"replicas": replicas}})
    }

    fn owned(mut p: Value, kind: &str, name: &str, uid: &str) -> Value {
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": true}]);
        p
    }

    #[test]
    fn budget_arithmetic() {
        let now = util::now();
        let l = json!({"app": "web"});
        let pods: Vec<Value> = (0..3)
            .map(|i| {
                owned(
                    pod(&format!("p{i}"), l.clone(), true),
                    "ReplicaSet",
                    "web",
                    "u1",
                )
            })
            .collect();
        let w = Workloads {
            replicasets: vec![rs("web", "u1", 3)],
            ..Default::default()
        };
        let budget = |spec: Value| {
            let mut spec = spec;
            spec["selector"] = json!({"matchLabels": {"app": "web"}});
            json!({"metadata": {"name": "b", "generation": 1}, "spec": spec})
        };
        let c = |spec: Value| compute(&budget(spec), &pods, &w, now).unwrap();
        // minAvailable 2 of 3 healthy: one disruption.
        let r = c(json!({"minAvailable": 2}));
        assert_eq!(
            (
                r.current_healthy,
                r.desired_healthy,
                r.expected_pods,
                r.disruptions_allowed
            ),
            (3, 2, 3, 1)
        );
        // minAvailable 50% of 3 rounds up to 2.
        assert_eq!(c(json!({"minAvailable": "50%"})).desired_healthy, 2);
        // maxUnavailable 50% of 3 rounds up to 2 unavailable: 1 desired.
        let r = c(json!({"maxUnavailable": "50%"}));
        assert_eq!((r.desired_healthy, r.disruptions_allowed), (1, 2));
        // maxUnavailable 0: nothing may go.
        assert_eq!(c(json!({"maxUnavailable": 0})).disruptions_allowed, 0);
        // minAvailable 100%: nothing may go.
        assert_eq!(c(json!({"minAvailable": "100%"})).disruptions_allowed, 0);
        // An unready pod does not count as healthy.
        let mut unready = pods.clone();
        unready[0] = owned(pod("p0", l.clone(), false), "ReplicaSet", "web", "u1");
        let r = compute(&budget(json!({"minAvailable": 2})), &unready, &w, now).unwrap();
        assert_eq!((r.current_healthy, r.disruptions_allowed), (2, 0));
        // A recent eviction counts as disrupted; an old one is dropped.
        let mut b = budget(json!({"minAvailable": 1}));
        let old = util::rfc3339(now - time::Duration::minutes(5));
        b["status"] = json!({"disruptedPods": {"p1": util::rfc3339(now), "p2": old}});
        let r = compute(&b, &pods, &w, now).unwrap();
        assert_eq!(r.current_healthy, 2);
        assert_eq!(r.disrupted_pods.keys().collect::<Vec<_>>(), ["p1"]);
        // Scale from the Deployment that owns the ReplicaSet.
        let mut owned_rs = rs("web", "u1", 3);
        owned_rs["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "d1", "controller": true}]);
        let wd = Workloads {
            replicasets: vec![owned_rs],
            deployments: vec![rs("d", "d1", 5)],
            ..Default::default()
        };
        let r = compute(&budget(json!({"maxUnavailable": 1})), &pods, &wd, now).unwrap();
        assert_eq!(
            (r.expected_pods, r.desired_healthy, r.disruptions_allowed),
            (5, 4, 0)
        );
        // A controller that cannot be found: the sync fails (fail safe).
        let err = compute(
            &budget(json!({"maxUnavailable": 1})),
            &pods,
            &Workloads::default(),
            now,
        )
        .unwrap_err();
        assert!(err.contains("found no controllers"), "{err}");
        // DaemonSet pods with a percentage: no scale.
        let ds: Vec<Value> = vec![owned(pod("d0", l.clone(), true), "DaemonSet", "ds", "x")];
        let err = compute(&budget(json!({"maxUnavailable": "10%"})), &ds, &w, now).unwrap_err();
        assert!(err.contains("scale subresource"), "{err}");
        // Unmanaged pods are left out of a percentage's expected count...
        let bare: Vec<Value> = vec![pod("b0", l.clone(), true)];
        assert_eq!(
            compute(&budget(json!({"minAvailable": "50%"})), &bare, &w, now)
                .unwrap()
                .expected_pods,
            0
        );
        // ...but an integer minAvailable counts them.
        let r = compute(&budget(json!({"minAvailable": 0})), &bare, &w, now).unwrap();
        assert_eq!((r.expected_pods, r.disruptions_allowed), (1, 1));
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let p = pod("p", json!({"app": "web", "tier": "front"}), true);
        let sel = |v: Value| LabelSelector::parse(&v).unwrap().unwrap();
        assert!(sel(json!({"matchLabels": {"app": "web"}})).matches(&p));
        assert!(!sel(json!({"matchLabels": {"app": "db"}})).matches(&p));
        let e = |op: &str, vals: Value| {
            sel(json!({"matchExpressions": [{"key": "tier", "operator": op, "values": vals}]}))
                .matches(&p)
        };
        assert!(e("In", json!(["front", "back"])));
        assert!(!e("NotIn", json!(["front"])));
        assert!(e("NotIn", json!(["back"])));
        assert!(e("Exists", Value::Null));
        assert!(!e("DoesNotExist", Value::Null));
        let absent = sel(
            json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}),
        );
        assert!(absent.matches(&p));
        assert!(LabelSelector::parse(
            &json!({"matchExpressions": [{"key": "a", "operator": "In"}]})
        )
        .is_err());
        assert!(LabelSelector::parse(
            &json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]})
        )
        .is_err());
        assert!(LabelSelector::parse(
            &json!({"matchExpressions": [{"key": "a", "operator": "Near", "values": ["x"]}]})
        )
        .is_err());
        // Eviction: a null or empty selector covers nothing.
        assert!(!covers(&json!({"spec": {}}), &p));
        assert!(!covers(&json!({"spec": {"selector": {}}}), &p));
        assert!(covers(
            &json!({"spec": {"selector": {"matchLabels": {"app": "web"}}}}),
            &p
        ));
        // The controller: an empty selector selects every pod of the namespace.
        let b = json!({"metadata": {"name": "b"}, "spec": {"selector": {}, "minAvailable": 1}});
        let r = compute(
            &b,
            std::slice::from_ref(&p),
            &Workloads::default(),
            util::now(),
        )
        .unwrap();
        assert_eq!(r.current_healthy, 1);
    }

    #[test]
    fn status_and_condition_follow_the_numbers() {
        let now = util::now();
        let b = json!({"metadata": {"name": "b", "generation": 2}, "spec": {}, "status": {}});
        let c = Computed {
            current_healthy: 3,
            desired_healthy: 2,
            expected_pods: 3,
            disruptions_allowed: 1,
            disrupted_pods: Map::new(),
        };
        let next = with_status(&b, &c, now).unwrap();
        assert_eq!(next["status"]["observedGeneration"], 2);
        let cond = &next["status"]["conditions"][0];
        assert_eq!(
            (
                cond["type"].as_str(),
                cond["status"].as_str(),
                cond["reason"].as_str()
            ),
            (Some(CONDITION), Some("True"), Some("SufficientPods"))
        );
        // Already current: nothing to write.
        assert!(with_status(&next, &c, now).is_none());
        let failed = fail_safe(&next, "boom", now).unwrap();
        assert_eq!(failed["status"]["disruptionsAllowed"], 0);
        assert_eq!(failed["status"]["conditions"][0]["reason"], "SyncFailed");
        let mut errs = Vec::new();
        validate(
            &json!({"spec": {"minAvailable": 1, "maxUnavailable": "150%", "selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}}),
            &mut |f: &str, m: String| errs.push((f.to_string(), m)),
        );
        let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(fields, ["spec.maxUnavailable", "spec", "spec.selector"]);
    }
}
