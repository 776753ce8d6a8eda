//! Pods as kube-apiserver serves them: defaults on create, graceful
//! deletion (`deletionTimestamp`, `deletionGracePeriodSeconds`), and the
//! `pods/eviction` subresource checked against PodDisruptionBudgets.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::disruption::{self, IntOrPercent};
use crate::error::ApiStatus;
use crate::store::Store;
use crate::util;

pub const PODS: &str = "pods";
pub const PDBS: &str = "poddisruptionbudgets";
/// kube-apiserver's default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE: i64 = 30;
const EVICTION_ATTEMPTS: usize = 20;
pub const BUDGET_MESSAGE: &str =
    "Cannot evict pod as it would violate the pod's disruption budget.";

/// `meta/v1 DeleteOptions`, from the query and the body (the body wins).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeleteOptions {
    pub grace: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<u64>,
    pub dry_run: bool,
}

impl DeleteOptions {
    pub fn parse(query: &HashMap<String, String>, body: &[u8]) -> Result<DeleteOptions, ApiStatus> {
        let mut o = DeleteOptions::default();
        if let Some(g) = query.get("gracePeriodSeconds").filter(|g| !g.is_empty()) {
            o.grace = Some(g.parse().map_err(|_| {
                ApiStatus::bad_request(format!("invalid gracePeriodSeconds {g:?}"))
            })?);
        }
        if query.get("dryRun").is_some_and(|d| d == "All") {
            o.dry_run = true;
        }
        let body = body
            .iter()
            .copied()
            .skip_while(u8::is_ascii_whitespace)
            .collect::<Vec<_>>();
        if body.is_empty() {
            return Ok(o);
        }
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiStatus::bad_request(format!("DeleteOptions is not valid JSON: {e}")))?;
        o.merge(&v)?;
        Ok(o)
    }

    /// Fields of a `DeleteOptions` object (also an Eviction's `deleteOptions`).
    pub fn merge(&mut self, v: &Value) -> Result<(), ApiStatus> {
        match &v["gracePeriodSeconds"] {
            Value::Null => {}
            g => {
                self.grace = Some(g.as_i64().ok_or_else(|| {
                    ApiStatus::bad_request(format!("invalid gracePeriodSeconds {g}"))
                })?)
            }
        }
        if let Some(uid) = v["preconditions"]["uid"].as_str() {
            self.uid = Some(uid.to_string());
        }
        if let Some(rv) = v["preconditions"]["resourceVersion"].as_str() {
            self.resource_version = Some(rv.parse().map_err(|_| {
                ApiStatus::bad_request(format!("invalid preconditions.resourceVersion {rv:?}"))
            })?);
        }
        if v["dryRun"]
            .as_array()
            .is_some_and(|d| d.iter().any(|x| x == "All"))
        {
            self.dry_run = true;
        }
        Ok(())
    }

    /// 409 when the object is not the one the preconditions name.
    pub fn check(&self, resource: &str, obj: &Value) -> Result<(), ApiStatus> {
        let name = util::name_of(obj);
        let precondition = |what: &str, want: &str, have: &str| {
            ApiStatus::conflict(format!(
                "Operation cannot be fulfilled on {resource} \"{name}\": Precondition failed: {what} in precondition: {want}, {what} in object meta: {have}"
            ))
        };
        if let Some(uid) = &self.uid {
            let have = obj["metadata"]["uid"].as_str().unwrap_or("");
            if uid != have {
                return Err(precondition("UID", uid, have));
            }
        }
        if let Some(rv) = self.resource_version {
            if util::rv_of(obj) != Some(rv) {
                let have = util::rv_of(obj).map(|r| r.to_string()).unwrap_or_default();
                return Err(precondition("ResourceVersion", &rv.to_string(), &have));
            }
        }
        Ok(())
    }
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or("")
}

fn terminal(pod: &Value) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

pub fn not_found(name: &str) -> ApiStatus {
    ApiStatus::not_found(format!("pods \"{name}\" not found"))
        .with_details(json!({"name": name, "kind": "pods"}))
}

/// Server-owned fields and defaults of a new pod.
pub fn prepare_create(pod: &mut Value) {
    let spec = util::field_mut(pod, "spec");
    spec.entry("terminationGracePeriodSeconds")
        .or_insert(json!(DEFAULT_GRACE));
    spec.entry("restartPolicy").or_insert(json!("Always"));
    spec.entry("dnsPolicy").or_insert(json!("ClusterFirst"));
    spec.entry("schedulerName")
        .or_insert(json!("default-scheduler"));
    let has_resources = pod["spec"]["containers"].as_array().is_some_and(|cs| {
        cs.iter().any(|c| {
            c["resources"].as_object().is_some_and(|r| {
                r.values()
                    .any(|v| v.as_object().is_some_and(|m| !m.is_empty()))
            })
        })
    });
    let qos = if has_resources {
        "Burstable"
    } else {
        "BestEffort"
    };
    pod["status"] = json!({"phase": "Pending", "qosClass": qos});
}

/// 422 causes of a pod (the few rules that keep it meaningful).
pub fn validate(pod: &Value, bad: &mut impl FnMut(&str, String)) {
    match pod["spec"]["containers"].as_array() {
        Some(cs) if !cs.is_empty() => {
            let mut names = std::collections::HashSet::new();
            for (i, c) in cs.iter().enumerate() {
                let name = c["name"].as_str().unwrap_or("");
                if name.is_empty() {
                    bad(
                        &format!("spec.containers[{i}].name"),
                        "Required value".into(),
                    );
                } else if !names.insert(name) {
                    bad(
                        &format!("spec.containers[{i}].name"),
                        format!("Duplicate value: {name:?}"),
                    );
                }
                if c["image"].as_str().is_none_or(str::is_empty) {
                    bad(
                        &format!("spec.containers[{i}].image"),
                        "Required value".into(),
                    );
                }
            }
        }
        _ => bad("spec.containers", "Required value".into()),
    }
    let g = &pod["spec"]["terminationGracePeriodSeconds"];
    if !g.is_null() && g.as_i64().is_none_or(|g| g < 0) {
        bad(
            "spec.terminationGracePeriodSeconds",
            format!("Invalid value: {g}: must be greater than or equal to 0"),
        );
    }
    let n = &pod["spec"]["nodeName"];
    if !n.is_null()
        && n.as_str()
            .is_none_or(|n| !n.is_empty() && !knit_api::validate::is_dns_subdomain(n))
    {
        bad(
            "spec.nodeName",
            format!("Invalid value: {n}: must be a node name"),
        );
    }
}

/// What a DELETE does to a pod (kube-apiserver's `BeforeDelete` and the
/// pod strategy's `CheckGracefulDelete`).
#[derive(Debug, Clone, PartialEq)]
pub enum Deletion {
    /// Remove the object now.
    Now,
    /// Already being deleted as soon or sooner: nothing changes.
    Pending,
    /// Set (or shorten) `deletionTimestamp` to this and the grace period.
    Graceful { at: String, grace: i64 },
}

pub fn plan_deletion(pod: &Value, grace: Option<i64>, now: time::OffsetDateTime) -> Deletion {
    let meta = &pod["metadata"];
    if let Some(ts) = meta["deletionTimestamp"].as_str() {
        let existing = meta["deletionGracePeriodSeconds"].as_i64().unwrap_or(0);
        if existing == 0 {
            return Deletion::Now;
        }
        return match grace {
            Some(g) if g < existing => {
                if g <= 0 {
                    return Deletion::Now;
                }
                let base = util::parse_time(ts).unwrap_or(now);
                Deletion::Graceful {
                    at: util::rfc3339(base - time::Duration::seconds(existing - g)),
                    grace: g,
                }
            }
            _ => Deletion::Pending,
        };
    }
    let mut period = grace
        .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(0);
    if pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty) || terminal(pod) {
        period = 0;
    }
    if period < 0 {
        period = 1;
    }
    if period == 0 {
        return Deletion::Now;
    }
    Deletion::Graceful {
        at: util::rfc3339(now + time::Duration::seconds(period)),
        grace: period,
    }
}

/// Delete a pod as kube-apiserver does: gracefully (the kubelet finishes
/// it and deletes it with grace 0), or at once when unscheduled, finished,
/// or asked with grace 0. `allowed` is the caller's authorization of the
/// current object. Returns the object as the answer's body.
pub fn delete(
    store: &Store,
    ns: &str,
    name: &str,
    opts: &DeleteOptions,
    allowed: &dyn Fn(&Value) -> Result<(), ApiStatus>,
) -> Result<Value, ApiStatus> {
    for _ in 0..8 {
        let current = store.get(PODS, ns, name)?.ok_or_else(|| not_found(name))?;
        allowed(&current)?;
        opts.check(PODS, &current)?;
        let rv = util::rv_of(&current);
        let result = match plan_deletion(&current, opts.grace, util::now()) {
            Deletion::Pending => return Ok(current),
            _ if opts.dry_run => return Ok(current),
            Deletion::Now => store.delete_if(PODS, ns, name, rv),
            Deletion::Graceful { at, grace } => {
                let mut next = current.clone();
                let meta = util::meta_mut(&mut next);
                meta.insert("deletionTimestamp".into(), json!(at));
                meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
                store.replace(PODS, ns, name, &current, next)
            }
        };
        match result {
            Err(e) if e.code == 409 => continue,
            Err(e) if e.code == 404 => return Err(not_found(name)),
            other => return other,
        }
    }
    Err(ApiStatus::conflict(format!(
        "Operation cannot be fulfilled on pods \"{name}\": the object kept changing; please try again"
    )))
}

fn success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

/// `can evict without consulting budgets`: finished, not started, or
/// already being deleted.
fn can_ignore_budget(pod: &Value) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed" | "Pending")
        || !pod["metadata"]["deletionTimestamp"].is_null()
}

fn still_processing(pdb: &str) -> ApiStatus {
    ApiStatus::too_many_requests(
        BUDGET_MESSAGE,
        10,
        Some((
            "DisruptionBudget",
            format!("The disruption budget {pdb} is still being processed by the server."),
        )),
    )
}

/// POST `pods/<name>/eviction`: kube-apiserver's EvictionREST.Create.
/// Answers 201 with a Success `Status`, 429 when a budget forbids, 500
/// when more than one budget covers the pod.
pub fn evict(store: &Store, ns: &str, name: &str, body: &Value) -> Result<(u16, Value), ApiStatus> {
    let kind = body["kind"].as_str().unwrap_or("Eviction");
    let api_version = body["apiVersion"].as_str().unwrap_or("policy/v1");
    if kind != "Eviction" || !matches!(api_version, "policy/v1" | "policy/v1beta1") {
        return Err(ApiStatus::bad_request(format!(
            "not an Eviction object: {api_version}, Kind={kind} (policy/v1 or policy/v1beta1 Eviction expected)"
        )));
    }
    if body["metadata"]["name"].as_str() != Some(name) {
        return Err(ApiStatus::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let mut opts = DeleteOptions::default();
    if let Some(d) = body.get("deleteOptions").filter(|d| d.is_object()) {
        opts.merge(d)?;
    }
    let client_rv = opts.resource_version.is_some();
    // Pods that can go without consulting a budget go at once.
    let mut pod = None;
    for _ in 0..EVICTION_ATTEMPTS {
        let current = store.get(PODS, ns, name)?.ok_or_else(|| not_found(name))?;
        if !can_ignore_budget(&current) {
            pod = Some(current);
            break;
        }
        let mut o = opts.clone();
        let enforce = !terminal(&current) && current["metadata"]["deletionTimestamp"].is_null();
        if enforce && !client_rv {
            o.resource_version = util::rv_of(&current);
        }
        match evict_delete(store, ns, name, &o) {
            Ok(_) => return Ok((201, success())),
            Err(e) if e.code == 409 && !client_rv => continue,
            Err(e) => return Err(e),
        }
    }
    let Some(pod) = pod else {
        return Err(ApiStatus::conflict(format!(
            "Operation cannot be fulfilled on pods \"{name}\": the object kept changing; please try again"
        )));
    };
    let (pdbs, _) = store.list(PDBS, Some(ns))?;
    let matching: Vec<Value> = pdbs
        .into_iter()
        .filter(|b| disruption::covers(b, &pod))
        .collect();
    if matching.len() > 1 {
        return Ok((
            500,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                   "code": 500}),
        ));
    }
    let mut precondition_added = false;
    if let Some(pdb) = matching.into_iter().next() {
        let pdb_name = util::name_of(&pdb).to_string();
        let st = &pdb["status"];
        let current = st["currentHealthy"].as_i64().unwrap_or(0);
        let desired = st["desiredHealthy"].as_i64().unwrap_or(0);
        let always = pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow";
        if !disruption::is_ready(&pod) && (always || (current >= desired && desired > 0)) {
            // An unready pod costs no budget; it must still be the pod
            // that was judged (not one that became ready since).
            precondition_added = !client_rv;
        } else {
            check_and_decrement(store, ns, name, pdb, opts.dry_run)?;
        }
        if precondition_added {
            let mut o = opts.clone();
            o.resource_version = util::rv_of(&pod);
            return match evict_delete(store, ns, name, &o) {
                Ok(_) => Ok((201, success())),
                Err(e) if e.code == 409 => Err(still_processing(&pdb_name)),
                Err(e) => Err(e),
            };
        }
    }
    evict_delete(store, ns, name, &opts)?;
    Ok((201, success()))
}

/// kube-apiserver's `addConditionAndDeletePod`: the pod gets the
/// `DisruptionTarget` condition (`EvictionByEvictionAPI`), then is deleted
/// with the eviction's options (a resourceVersion precondition moves to
/// the version that write made).
fn evict_delete(
    store: &Store,
    ns: &str,
    name: &str,
    opts: &DeleteOptions,
) -> Result<Value, ApiStatus> {
    let mut opts = opts.clone();
    if !opts.dry_run {
        let now = util::now_rfc3339();
        let marked = store.update(PODS, ns, name, opts.resource_version, |cur| {
            opts.check(PODS, cur)?;
            let mut next = cur.clone();
            let status = util::field_mut(&mut next, "status");
            let conds = status.entry("conditions").or_insert_with(|| json!([]));
            if !conds.is_array() {
                *conds = json!([]);
            }
            if let Some(list) = conds.as_array_mut() {
                let cond = json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                                  "message": "Eviction API: evicting", "lastProbeTime": null, "lastTransitionTime": now});
                match list.iter_mut().find(|c| c["type"] == "DisruptionTarget") {
                    Some(c) if c["status"] == "True" && c["reason"] == "EvictionByEvictionAPI" => {}
                    Some(c) => *c = cond,
                    None => list.push(cond),
                }
            }
            Ok(next)
        });
        let marked = match marked {
            Err(e) if e.code == 404 => return Err(not_found(name)),
            other => other?,
        };
        if opts.resource_version.is_some() {
            opts.resource_version = util::rv_of(&marked);
        }
    }
    delete(store, ns, name, &opts, &|_| Ok(()))
}

/// Verify the budget allows a disruption and take one (recording the pod
/// in `disruptedPods`), retrying on conflicting writes with a fresh copy.
fn check_and_decrement(
    store: &Store,
    ns: &str,
    pod: &str,
    mut pdb: Value,
    dry_run: bool,
) -> Result<(), ApiStatus> {
    let pdb_name = util::name_of(&pdb).to_string();
    for attempt in 0..EVICTION_ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(50));
            pdb = store
                .get(PDBS, ns, &pdb_name)?
                .ok_or_else(|| still_processing(&pdb_name))?;
        }
        let st = &pdb["status"];
        let observed = st["observedGeneration"].as_i64().unwrap_or(0);
        if observed < disruption::generation(&pdb) {
            return Err(still_processing(&pdb_name));
        }
        let allowed = st["disruptionsAllowed"].as_i64().unwrap_or(0);
        if allowed < 0 {
            return Err(ApiStatus::forbidden(format!(
                "poddisruptionbudgets.policy \"{pdb_name}\" is forbidden: pdb disruptions allowed is negative"
            )));
        }
        if st["disruptedPods"]
            .as_object()
            .is_some_and(|m| m.len() > disruption::MAX_DISRUPTED_PODS)
        {
            return Err(ApiStatus::forbidden(format!(
                "poddisruptionbudgets.policy \"{pdb_name}\" is forbidden: DisruptedPods map too big - too many evictions not confirmed by PDB controller"
            )));
        }
        if allowed == 0 {
            return Err(ApiStatus::too_many_requests(
                BUDGET_MESSAGE,
                0,
                Some((
                    "DisruptionBudget",
                    format!(
                        "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                        st["desiredHealthy"].as_i64().unwrap_or(0),
                        st["currentHealthy"].as_i64().unwrap_or(0)
                    ),
                )),
            ));
        }
        if dry_run {
            return Ok(());
        }
        let now = util::now();
        let mut next = pdb.clone();
        let status = util::field_mut(&mut next, "status");
        status.insert("disruptionsAllowed".into(), json!(allowed - 1));
        let disrupted = status.entry("disruptedPods").or_insert_with(|| json!({}));
        if !disrupted.is_object() {
            *disrupted = json!({});
        }
        disrupted[pod] = json!(util::rfc3339(now));
        if allowed - 1 == 0 {
            disruption::update_allowed_condition(&mut next, now);
        }
        match store.replace(PDBS, ns, &pdb_name, &pdb, next) {
            Ok(_) => return Ok(()),
            Err(e) if e.code == 409 => continue,
            Err(e) if e.code == 404 => return Err(still_processing(&pdb_name)),
            Err(e) => return Err(e),
        }
    }
    Err(ApiStatus::new(
        axum::http::StatusCode::GATEWAY_TIMEOUT,
        "Timeout",
        format!("couldn't update PodDisruptionBudget {pdb_name:?} due to conflicts"),
    )
    .with_details(json!({"retryAfterSeconds": 10})))
}

/// A budget field as `kubectl get pdb` prints it (`N/A` when unset).
pub fn budget_cell(v: &Value) -> String {
    match IntOrPercent::parse(v) {
        Ok(Some(IntOrPercent::Int(i))) => i.to_string(),
        Ok(Some(IntOrPercent::Percent(p))) => format!("{p}%"),
        _ => "N/A".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletion_plans_follow_the_pod_strategy() {
        let now = util::now();
        let pod = |node: &str, phase: &str| json!({"metadata": {"name": "p"}, "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30}, "status": {"phase": phase}});
        // Scheduled and running: graceful with the pod's grace period.
        match plan_deletion(&pod("n1", "Running"), None, now) {
            Deletion::Graceful { grace, .. } => assert_eq!(grace, 30),
            other => panic!("{other:?}"),
        }
        match plan_deletion(&pod("n1", "Running"), Some(5), now) {
            Deletion::Graceful { grace, at } => {
                assert_eq!(grace, 5);
                assert_eq!(at, util::rfc3339(now + time::Duration::seconds(5)));
            }
            other => panic!("{other:?}"),
        }
        // Unscheduled, finished, or grace 0: at once.
        assert_eq!(plan_deletion(&pod("", "Pending"), None, now), Deletion::Now);
        assert_eq!(
            plan_deletion(&pod("n1", "Succeeded"), None, now),
            Deletion::Now
        );
        assert_eq!(
            plan_deletion(&pod("n1", "Running"), Some(0), now),
            Deletion::Now
        );
        // Negative means 1 second.
        assert!(matches!(
            plan_deletion(&pod("n1", "Running"), Some(-1), now),
            Deletion::Graceful { grace: 1, .. }
        ));
        // Already deleting: only a shorter grace changes anything.
        let mut d = pod("n1", "Running");
        d["metadata"]["deletionTimestamp"] =
            json!(util::rfc3339(now + time::Duration::seconds(30)));
        d["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        assert_eq!(plan_deletion(&d, None, now), Deletion::Pending);
        assert_eq!(plan_deletion(&d, Some(60), now), Deletion::Pending);
        assert_eq!(plan_deletion(&d, Some(0), now), Deletion::Now);
        match plan_deletion(&d, Some(10), now) {
            Deletion::Graceful { grace, at } => {
                assert_eq!(grace, 10);
                assert_eq!(at, util::rfc3339(now + time::Duration::seconds(10)));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn delete_options_from_query_and_body() {
        let mut q = HashMap::new();
        q.insert("gracePeriodSeconds".to_string(), "7".to_string());
        let o = DeleteOptions::parse(&q, b"").unwrap();
        assert_eq!(o.grace, Some(7));
        let body = br#"{"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":0,"preconditions":{"uid":"u"}}"#;
        let o = DeleteOptions::parse(&q, body).unwrap();
        assert_eq!((o.grace, o.uid.as_deref()), (Some(0), Some("u")));
        let pod = json!({"metadata": {"name": "p", "uid": "v", "resourceVersion": "3"}});
        assert_eq!(o.check("pods", &pod).unwrap_err().code, 409);
        assert!(DeleteOptions::parse(&HashMap::new(), b"{nope").is_err());
    }
}
