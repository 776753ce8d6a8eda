//! The controllers of kube-controller-manager that pods need here: the
//! disruption controller (PodDisruptionBudget status) and pod garbage
//! collection (pods bound to a Node that no longer exists).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::disruption::{self, Workloads};
use crate::error::ClusterError;
use crate::pods::{PDBS, PODS};
use crate::store::Store;
use crate::util;

/// A pod whose node is missing is collected only after this long, so that
/// a pod bound to a node that is just registering is not (kube's podgc
/// quarantine).
pub const ORPHAN_QUARANTINE: Duration = Duration::from_secs(40);

/// Resources whose changes can change a budget's status.
pub fn affects_budgets(resource: &str) -> bool {
    matches!(
        resource,
        "pods" | "poddisruptionbudgets" | "replicasets" | "deployments" | "statefulsets"
    )
}

/// Recompute the status of every budget of `ns`. A budget written by
/// someone else meanwhile (an eviction) is left for the next pass: the
/// namespace is returned dirty again.
pub fn sync_budgets(store: &Store, ns: &str) -> Result<bool, ClusterError> {
    let (pdbs, _) = store.list(PDBS, Some(ns))?;
    if pdbs.is_empty() {
        return Ok(false);
    }
    let (pods, _) = store.list(PODS, Some(ns))?;
    let workloads = Workloads {
        replicasets: store.list("replicasets", Some(ns))?.0,
        deployments: store.list("deployments", Some(ns))?.0,
        statefulsets: store.list("statefulsets", Some(ns))?.0,
    };
    let now = util::now();
    let mut again = false;
    for pdb in pdbs {
        let name = util::name_of(&pdb).to_string();
        let next = match disruption::compute(&pdb, &pods, &workloads, now) {
            Ok(c) => disruption::with_status(&pdb, &c, now),
            Err(why) => {
                tracing::warn!(namespace = ns, pdb = %name, error = %why, "PodDisruptionBudget sync failed: no disruption allowed");
                disruption::fail_safe(&pdb, &why, now)
            }
        };
        let Some(next) = next else {
            continue;
        };
        match store.replace(PDBS, ns, &name, &pdb, next) {
            Ok(_) => {}
            Err(e) if e.code == 409 => again = true,
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(ClusterError::Api(e)),
        }
    }
    Ok(again)
}

/// Namespaces that hold budgets (for the periodic recheck: evictions whose
/// pod was not deleted expire from `disruptedPods`).
pub fn budget_namespaces(store: &Store) -> Result<HashSet<String>, ClusterError> {
    Ok(store
        .list(PDBS, None)?
        .0
        .iter()
        .map(|p| util::namespace_of(p).to_string())
        .collect())
}

/// The namespace controller's work for a namespace being deleted: every
/// namespaced object in it goes (pods at once), then the namespace.
pub fn finish_namespace(store: &Store, ns: &str) -> Result<(), ClusterError> {
    let Some(namespace) = store.get("namespaces", "", ns)? else {
        return Ok(());
    };
    if namespace["metadata"]["deletionTimestamp"].is_null() {
        return Ok(());
    }
    for def in crate::resources::RESOURCES.iter().filter(|d| d.namespaced) {
        for obj in store.list(def.plural, Some(ns))?.0 {
            match store.delete(def.plural, ns, util::name_of(&obj)) {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(ClusterError::Api(e)),
            }
        }
    }
    match store.delete("namespaces", "", ns) {
        Ok(_) => {
            tracing::info!(namespace = ns, "namespace deleted with its content");
            Ok(())
        }
        Err(e) if e.code == 404 => Ok(()),
        Err(e) => Err(ClusterError::Api(e)),
    }
}

/// Pod GC of one pod: marked Failed with the `DisruptionTarget` condition
/// kube-controller-manager adds, then deleted at once.
fn collect(store: &Store, pod: &Value, why: &str) -> Result<(), ClusterError> {
    let (ns, name) = (util::namespace_of(pod), util::name_of(pod));
    let finished = matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    );
    if !finished {
        let now = util::now_rfc3339();
        let result = store.update(PODS, ns, name, None, |cur| {
            let mut next = cur.clone();
            let status = util::field_mut(&mut next, "status");
            status.insert("phase".into(), json!("Failed"));
            let conds = status.entry("conditions").or_insert_with(|| json!([]));
            if let Some(list) = conds.as_array_mut() {
                list.retain(|c| c["type"] != "DisruptionTarget");
                list.push(json!({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                                 "message": why, "lastTransitionTime": now}));
            }
            Ok(next)
        });
        match result {
            Ok(_) => {}
            Err(e) if e.code == 404 => return Ok(()),
            Err(e) => return Err(ClusterError::Api(e)),
        }
    }
    match store.delete(PODS, ns, name) {
        Ok(_) => {
            tracing::info!(
                namespace = ns,
                pod = name,
                reason = why,
                "pod garbage-collected"
            );
            Ok(())
        }
        Err(e) if e.code == 404 => Ok(()),
        Err(e) => Err(ClusterError::Api(e)),
    }
}

/// The pods bound to a Node that was just deleted.
pub fn collect_node_pods(store: &Store, node: &str) -> Result<(), ClusterError> {
    let (pods, _) = store.list(PODS, None)?;
    for pod in pods.iter().filter(|p| p["spec"]["nodeName"] == node) {
        collect(store, pod, "PodGC: node no longer exists")?;
    }
    Ok(())
}

/// Pods bound to nodes that do not exist, collected once they have been
/// seen so for [`ORPHAN_QUARANTINE`]. `known` is the node names the
/// controllers' view holds (kept from the change feed: no Node is read
/// here while every pod's node is known); a node it does not hold is
/// looked up before its pods are collected. `seen` remembers since when.
pub fn sweep_orphans(
    store: &Store,
    known: &dyn Fn(&str) -> bool,
    seen: &mut HashMap<(String, String), Instant>,
) -> Result<(), ClusterError> {
    let (pods, _) = store.list(PODS, None)?;
    let now = Instant::now();
    let mut orphans = HashMap::new();
    let mut missing: HashMap<String, bool> = HashMap::new();
    for pod in &pods {
        let node = pod["spec"]["nodeName"].as_str().unwrap_or("");
        if node.is_empty() || known(node) {
            continue;
        }
        let gone = match missing.get(node) {
            Some(g) => *g,
            None => {
                let g = store.get("nodes", "", node)?.is_none();
                missing.insert(node.to_string(), g);
                g
            }
        };
        if !gone {
            continue;
        }
        let key = (
            util::namespace_of(pod).to_string(),
            util::name_of(pod).to_string(),
        );
        let since = seen.get(&key).copied().unwrap_or(now);
        if now.duration_since(since) >= ORPHAN_QUARANTINE {
            collect(store, pod, "PodGC: node no longer exists")?;
        } else {
            orphans.insert(key, since);
        }
    }
    *seen = orphans;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: &str) -> Value {
        json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "namespace": "default"},
               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
               "status": {"phase": "Running"}})
    }

    #[test]
    fn orphans_are_collected_after_the_quarantine_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        store
            .create(
                "nodes",
                "",
                json!({"kind": "Node", "metadata": {"name": "real"}}),
            )
            .unwrap();
        store.create(PODS, "default", pod("kept", "real")).unwrap();
        store
            .create(PODS, "default", pod("orphan", "ghost"))
            .unwrap();
        // The view does not know "real" either: it is looked up and found.
        let known = |_: &str| false;
        let mut seen = HashMap::new();
        sweep_orphans(&store, &known, &mut seen).unwrap();
        assert_eq!(seen.len(), 1);
        assert!(store.get(PODS, "default", "orphan").unwrap().is_some());
        // Seen long enough ago: collected, marked Failed first.
        let long_ago = Instant::now()
            .checked_sub(ORPHAN_QUARANTINE + Duration::from_secs(1))
            .unwrap();
        for v in seen.values_mut() {
            *v = long_ago;
        }
        let mut feed = store.subscribe();
        sweep_orphans(&store, &known, &mut seen).unwrap();
        assert!(store.get(PODS, "default", "orphan").unwrap().is_none());
        assert!(store.get(PODS, "default", "kept").unwrap().is_some());
        let failed = feed.try_recv().unwrap();
        assert_eq!(failed.object["status"]["phase"], "Failed");
        assert_eq!(
            failed.object["status"]["conditions"][0]["reason"],
            "DeletionByPodGC"
        );
        assert!(seen.is_empty());
    }
}
