//! The seam between the control plane and a cluster (embedded or
//! external): what the control plane asks of it, typed with the cluster's
//! own facts (`node_meta`, `pods`), and how an Event is written through
//! plain API calls. Below `bootstrap`, `drain`, `kube_events` and
//! `control`, which use it; the clusters in this room implement it.

use super::node_meta::{NodeMeta, NodePatched};
use super::pods::{BudgetFacts, Eviction, PodFacts};
use crate::error::Result;
use async_trait::async_trait;
use serde_json::{json, Value};

/// The namespace of node events (where the kubelet writes them too).
pub const NAMESPACE: &str = "default";

/// How long a call to the cluster's API through the seam may take (the
/// reconciler's and the drain's calls).
pub const CLUSTER_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How a node joins the cluster (docs/spec.md §4.6, join protocol).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinMaterial {
    pub endpoint: String,
    pub ca_pem: String,
    /// `sha256:<hex of the CA's SPKI>`.
    pub ca_pin: String,
    pub bootstrap_token: String,
}

/// The cluster side, as the control plane needs it. The embedded cluster
/// (knit-cluster) or a real cluster implement it.
#[async_trait]
pub trait ClusterJoin: Send + Sync {
    /// Join material for one node of `pool`; `None` when no cluster is attached.
    async fn join_material(&self, pool: &str, node_hint: &str) -> Result<Option<JoinMaterial>>;
    /// Deletes the Node object (absent is not an error). Callers drain the
    /// node first (`crate::drain`), so that its pods were evicted.
    async fn remove_node(&self, node: &str) -> Result<()>;
    /// Revokes the bootstrap tokens bound to `node` (its instance is gone:
    /// a token left would let the machine get a fresh certificate within
    /// its life); none is not an error.
    async fn revoke_join(&self, _node: &str) -> Result<()> {
        Ok(())
    }
    /// NotReady | Ready | Unknown, when the cluster knows the node.
    async fn node_status(&self, node: &str) -> Result<Option<String>>;
    /// Every registered node with its status.
    async fn node_statuses(&self) -> Result<Vec<(String, String)>>;
    /// Whether nodes join a cluster: then a node is done when Ready, not
    /// merely initialized.
    fn attached(&self) -> bool;
    /// The API server's URL nodes join (`https://host:port`), for messages.
    fn api_endpoint(&self) -> Option<String> {
        None
    }
    /// Told each time a registered Node's Ready status changes or it is
    /// deleted, when the cluster can tell (the embedded one follows its
    /// store): the control plane reads the node statuses then, not at its
    /// next periodic pass (five intervals apart when all is settled).
    /// Called from within the runtime; `None`: the periodic pass only.
    fn readiness_changes(&self) -> Option<tokio::sync::watch::Receiver<()>> {
        None
    }
    /// Removes the taint with `key` from a node; `false` when the node is
    /// not registered (yet).
    async fn remove_taint(&self, node: &str, key: &str) -> Result<bool>;
    /// One annotation of a registered Node, as the node published it (e.g.
    /// the kubelet's image report); `None` when the node or the annotation
    /// is not there, or no cluster is attached.
    async fn node_annotation(&self, _node: &str, _key: &str) -> Result<Option<String>> {
        Ok(None)
    }

    // The drain's calls (`crate::drain`), each one Kubernetes API request.

    /// Marks the node unschedulable (`spec.unschedulable: true`); `false`
    /// when it is not registered.
    async fn cordon(&self, _node: &str) -> Result<bool> {
        Ok(false)
    }
    /// The pods bound to `node` (`fieldSelector=spec.nodeName=NODE`).
    async fn node_pods(&self, _node: &str) -> Result<Vec<PodFacts>> {
        Ok(Vec::new())
    }
    /// Every pod of the cluster (each names its node).
    async fn pods(&self) -> Result<Vec<PodFacts>> {
        Ok(Vec::new())
    }
    /// Evicts one pod through the Eviction API (policy/v1), which honours
    /// PodDisruptionBudgets; never a direct delete.
    async fn evict_pod(&self, _namespace: &str, _name: &str) -> Result<Eviction> {
        Ok(Eviction::Gone)
    }
    /// Deletes one pod (with its own grace period): only a drain past its
    /// timeout with `onTimeout: force` does this.
    async fn delete_pod(&self, _namespace: &str, _name: &str) -> Result<()> {
        Ok(())
    }
    /// The PodDisruptionBudgets of one namespace.
    async fn budgets(&self, _namespace: &str) -> Result<Vec<BudgetFacts>> {
        Ok(Vec::new())
    }

    // The label and taint sync's calls (`crate::reconcile::node_sync`).

    /// Labels, annotations and taints of every registered Node (one list).
    async fn node_metas(&self) -> Result<Vec<NodeMeta>> {
        Ok(Vec::new())
    }
    /// The same of one Node; `None` when it is not registered.
    async fn node_meta(&self, _node: &str) -> Result<Option<NodeMeta>> {
        Ok(None)
    }
    /// One JSON merge patch of a Node (`metadata.labels`,
    /// `metadata.annotations`, `spec.taints`; with `metadata.resourceVersion`
    /// a stale read is a conflict).
    async fn patch_node(&self, _node: &str, _patch: &serde_json::Value) -> Result<NodePatched> {
        Ok(NodePatched::NotFound)
    }

    /// Writes one core/v1 Event (`crate::kube_events::event_object_about`):
    /// created, or its count and last time updated when it exists.
    async fn publish_event(&self, _event: &serde_json::Value) -> Result<()> {
        Ok(())
    }
}

/// No cluster attached: nodes get no join material (their `join` phase
/// fails with its own error), removal and status are no-ops. Used until the
/// embedded cluster is wired in; the server says so at start.
pub struct NoCluster;

#[async_trait]
impl ClusterJoin for NoCluster {
    async fn join_material(&self, _pool: &str, _node_hint: &str) -> Result<Option<JoinMaterial>> {
        Ok(None)
    }
    async fn remove_node(&self, _node: &str) -> Result<()> {
        Ok(())
    }
    async fn node_status(&self, _node: &str) -> Result<Option<String>> {
        Ok(None)
    }
    async fn node_statuses(&self) -> Result<Vec<(String, String)>> {
        Ok(Vec::new())
    }
    fn attached(&self) -> bool {
        false
    }
    async fn remove_taint(&self, _node: &str, _key: &str) -> Result<bool> {
        Ok(false)
    }
}

/// How [`ClusterJoin::publish_event`] writes an Event through plain API
/// calls: a first occurrence is created, a repeat merge-patched (count,
/// lastTimestamp, message); a create that finds the object patches it, a
/// patch that does not creates it.
pub async fn upsert<F, Fut>(object: &Value, mut call: F) -> crate::error::Result<()>
where
    F: FnMut(&'static str, String, Value) -> Fut,
    Fut: std::future::Future<Output = crate::error::Result<(u16, Value)>>,
{
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let collection = format!("/api/v1/namespaces/{NAMESPACE}/events");
    let one = format!("{collection}/{name}");
    let patch = json!({
        "count": object["count"],
        "lastTimestamp": object["lastTimestamp"],
        "message": object["message"],
    });
    let first = object["count"].as_i64().unwrap_or(1) <= 1;
    let (status, body) = if first {
        match call("POST", collection.clone(), object.clone()).await? {
            (409, _) => call("PATCH", one.clone(), patch.clone()).await?,
            answer => answer,
        }
    } else {
        match call("PATCH", one.clone(), patch.clone()).await? {
            (404, _) => call("POST", collection.clone(), object.clone()).await?,
            answer => answer,
        }
    };
    match status {
        200..=299 => Ok(()),
        _ => Err(crate::error::ServerError::Internal(format!(
            "writing event {name}: {status} {}",
            body["message"].as_str().unwrap_or("")
        ))),
    }
}
