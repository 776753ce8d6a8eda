//! knit's node events published as Kubernetes Events (core/v1), so that
//! `kubectl get events` and `kubectl describe node` show them beside the
//! kubelet's: on the embedded API, or on an external cluster through the
//! same [`ClusterJoin`] seam the drain uses.
//!
//! The store records every event and counts repeats on one row
//! (`store::events`); each write of an event about a node (kind `Node`, or
//! `Instance` once the instance has a node), an instance before its node
//! exists, or a pool (as knit's own kinds `Instance` and `NodePool` of
//! `knit.dev/v1alpha1`, cluster-scoped) is handed to a bounded queue and
//! written by one task, never by the writer: a full queue drops the event
//! (counted in `/metrics`), a failed write is logged, neither blocks nor
//! fails the reconciler. One stored row is one Kubernetes Event named from
//! the row (`<node>.<first ms in hex><id in hex>`), so its repeats update
//! its `count` and `lastTimestamp` as kube's event recorder does.

// Written through the cluster seam, which owns how (`cluster/seam.rs`).
pub use crate::cluster::seam::NAMESPACE;
use crate::control::ControlPlane;
use crate::store::{EventRecord, EventSink};
use serde_json::{json, Value};
use std::sync::{Arc, Weak};
use tokio::sync::{mpsc, watch};

/// Events waiting to be written at most; more are dropped (and counted).
pub const QUEUE: usize = 1024;
/// `source.component` and `reportingComponent` of knit's events.
pub const COMPONENT: &str = "knit";

/// Whether an event of this kind is published: about a node, an instance
/// (its node's once it has one, else the instance's own) or a pool.
fn published(kind: &str) -> bool {
    matches!(kind, "Node" | "Instance" | "NodePool")
}

/// The `involvedObject` of an event about `kind` `name`: a Node as the
/// kubelet names it; a pool, or an instance that has no node yet, as
/// knit's own cluster-scoped kinds (`knit.dev/v1alpha1`), which kubectl
/// shows as `nodepool/NAME` and `instance/NAME`.
pub fn involved_object(kind: &str, name: &str) -> Value {
    match kind {
        // As the kubelet names its Node: the uid is the node's name
        // (kubectl describe node looks for both).
        "Node" => json!({"apiVersion": "v1", "kind": "Node", "name": name, "uid": name}),
        other => json!({"apiVersion": knit_api::API_VERSION, "kind": other, "name": name}),
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` of milliseconds since the epoch (metav1.Time).
pub use knit_os::time::rfc3339_ms as rfc3339;

/// The Event object of one stored event about `kind` `object` (a Node,
/// an Instance without a node, a NodePool); `None` when its name would not
/// be a valid object name.
pub fn event_object_about(kind: &str, object: &str, e: &EventRecord) -> Option<Value> {
    let name = format!("{object}.{:x}{:x}", e.at_ms.max(0), e.id.max(0));
    if name.len() > 253 || crate::names::check_node("object", object).is_err() {
        return None;
    }
    let last = e.last_ms.max(e.at_ms);
    Some(json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "involvedObject": involved_object(kind, object),
        "reason": e.reason,
        "message": e.message,
        "type": e.event_type.as_str(),
        "count": e.count.max(1),
        "firstTimestamp": rfc3339(e.at_ms),
        "lastTimestamp": rfc3339(last),
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": "",
    }))
}

/// Starts the publisher: the store's events about nodes go to a queue of
/// [`QUEUE`] and one task writes them into the cluster until `shutdown`.
pub fn start(
    cp: &Arc<ControlPlane>,
    shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let weak: Weak<ControlPlane> = Arc::downgrade(cp);
    let sink: EventSink = Box::new(move |e: &EventRecord| {
        if !published(&e.object_kind) {
            return;
        }
        if tx.try_send(e.clone()).is_err() {
            if let Some(cp) = weak.upgrade() {
                cp.metrics.kube_event("dropped");
            }
        }
    });
    if !cp.store.set_event_sink(sink) {
        tracing::warn!("the store's events already go elsewhere: not published to the cluster");
    }
    tokio::spawn(run(cp.clone(), rx, shutdown))
}

async fn run(
    cp: Arc<ControlPlane>,
    mut rx: mpsc::Receiver<EventRecord>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let e = tokio::select! {
            e = rx.recv() => match e {
                Some(e) => e,
                None => return,
            },
            _ = shutdown.changed() => return,
        };
        let outcome = publish(&cp, &e).await;
        cp.metrics.kube_event(outcome);
    }
}

/// Writes one event; the outcome's word for `/metrics`.
async fn publish(cp: &ControlPlane, e: &EventRecord) -> &'static str {
    if !cp.cluster.attached() {
        return "skipped";
    }
    // An instance's event is its node's once it has one (kubectl describe
    // node shows it); before, the instance's own (created, failed, retried).
    let node = if e.object_kind == "Instance" {
        match cp.store.node_of_instance(&e.object_name) {
            Ok(n) => n,
            Err(err) => {
                tracing::warn!(instance = %e.object_name, error = %err, "publishing an event: its node could not be read");
                return "failed";
            }
        }
    } else {
        None
    };
    let (kind, name) = match &node {
        Some(n) => ("Node", n.as_str()),
        None => (e.object_kind.as_str(), e.object_name.as_str()),
    };
    let Some(object) = event_object_about(kind, name, e) else {
        return "skipped";
    };
    match cp.cluster.publish_event(&object).await {
        Ok(()) => "published",
        Err(err) => {
            tracing::warn!(reason = %e.reason, kind, name, error = %err, "publishing an event to the cluster failed");
            "failed"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::state::EventType;

    fn record(kind: &str, count: i64) -> EventRecord {
        EventRecord {
            id: 42,
            at_ms: 1_764_693_924_123,
            count,
            last_ms: 1_764_693_984_000,
            event_type: EventType::Warning,
            object_kind: kind.into(),
            object_name: "local.i-1".into(),
            reason: "PhaseFailed".into(),
            message: "join failed".into(),
        }
    }

    #[test]
    fn timestamps_are_rfc3339_seconds() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_764_693_924_999), "2025-12-02T16:45:24Z");
    }

    #[test]
    fn an_event_is_about_the_node_with_its_count() {
        let o = event_object_about("Node", "local.i-1", &record("Node", 3)).unwrap();
        assert_eq!(o["metadata"]["name"], "local.i-1.19adff4591b2a");
        assert_eq!(o["involvedObject"]["kind"], "Node");
        assert_eq!(o["involvedObject"]["uid"], "local.i-1");
        assert_eq!(o["type"], "Warning");
        assert_eq!(o["count"], 3);
        assert_eq!(o["firstTimestamp"], "2025-12-02T16:45:24Z");
        assert_eq!(o["lastTimestamp"], "2025-12-02T16:46:24Z");
        assert_eq!(o["source"]["component"], "knit");
        assert!(event_object_about("Node", "x/../y", &record("Node", 1)).is_none());
        assert!(published("Instance") && published("NodePool") && !published("Cluster"));
    }

    #[test]
    fn a_pool_or_a_nodeless_instance_is_knits_own_kind() {
        let o = event_object_about("NodePool", "workers", &record("NodePool", 1)).unwrap();
        assert_eq!(o["metadata"]["name"], "workers.19adff4591b2a");
        assert_eq!(
            o["involvedObject"],
            json!({"apiVersion": "knit.dev/v1alpha1", "kind": "NodePool", "name": "workers"})
        );
        let o = event_object_about("Instance", "workers-b", &record("Instance", 1)).unwrap();
        assert_eq!(o["involvedObject"]["kind"], "Instance");
        assert_eq!(o["involvedObject"]["name"], "workers-b");
        assert!(event_object_about("NodePool", "a/../b", &record("NodePool", 1)).is_none());
    }
}
