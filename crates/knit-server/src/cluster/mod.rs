//! The embedded cluster (knit-cluster) behind the [`ClusterJoin`] seam: a
//! bootstrap token per node (bound to its node name), the cluster CA and
//! pin, and Node status and removal through the cluster's own HTTPS API with
//! the admin client certificate, as any Kubernetes client would.

#[cfg(feature = "external-cluster")]
pub mod external;
/// Without the `external-cluster` feature: the embedded cluster, and an
/// external one refused naming the feature.
#[cfg(not(feature = "external-cluster"))]
pub mod external {
    use crate::cluster::seam::ClusterJoin;
    use crate::error::Result;
    use crate::features::{require, Feature};
    use std::sync::Arc;
    use std::time::Duration;

    /// The cluster nodes join: `started_with`; a stored spec with
    /// `apiServer: external` is a [`crate::features::FeatureMissing`].
    pub async fn select(
        spec: &knit_api::Cluster,
        started_with: Arc<dyn ClusterJoin>,
        _token_ttl: Duration,
    ) -> Result<Arc<dyn ClusterJoin>> {
        if spec.spec.api_server == "external" {
            require(
                Feature::ExternalCluster,
                "the Cluster's spec.apiServer: external",
            )?;
        }
        Ok(started_with)
    }
}
pub mod node_meta;
pub mod pods;
pub mod seam;

use crate::error::{Result, ServerError};
use async_trait::async_trait;
use base64::Engine;
use knit_cluster::EmbeddedCluster;
use pods::{BudgetFacts, Eviction, PodFacts};
use seam::{ClusterJoin, JoinMaterial};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

fn cluster_err(e: impl std::fmt::Display) -> ServerError {
    ServerError::Internal(format!("embedded cluster: {e}"))
}

pub struct EmbeddedJoin {
    cluster: EmbeddedCluster,
    admin: ureq::Agent,
    /// Where the control plane itself reaches the API (loopback).
    local_endpoint: String,
    token_ttl: Duration,
}

/// An HTTPS client holding the admin kubeconfig's client certificate.
fn admin_agent(kubeconfig: &str) -> Result<ureq::Agent> {
    let doc: Value = serde_yaml_ng::from_str(kubeconfig).map_err(cluster_err)?;
    // Base64 of PEM text: the kubeconfig's `*-data` fields.
    let pem = |v: &Value| -> Result<String> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .map_err(cluster_err)?;
        String::from_utf8(bytes).map_err(cluster_err)
    };
    let ca = pem(&doc["clusters"][0]["cluster"]["certificate-authority-data"])?;
    let cert = pem(&doc["users"][0]["user"]["client-certificate-data"])?;
    let key = pem(&doc["users"][0]["user"]["client-key-data"])?;
    let tls = knit_cluster::tls::client_config(&ca, Some((&cert, &key))).map_err(cluster_err)?;
    Ok(ureq::AgentBuilder::new()
        .tls_config(Arc::new(tls))
        .timeout(Duration::from_secs(10))
        .build())
}

/// Ready condition of a Node object → NotReady | Ready | Unknown.
pub fn node_ready_status(node: &Value) -> String {
    let ready = node["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str());
    match ready {
        Some("True") => "Ready",
        Some("Unknown") => "Unknown",
        _ => "NotReady",
    }
    .to_string()
}

/// Tells `tx` when a Node's Ready status changes or a Node goes (one it
/// saw before: a new Node registers NotReady, and the periodic pass finds
/// it), until every receiver is gone.
async fn follow_readiness(
    mut changes: knit_cluster::NodeChanges,
    tx: tokio::sync::watch::Sender<()>,
) {
    use knit_cluster::NodeChange;
    let mut seen: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    loop {
        let change = tokio::select! {
            _ = tx.closed() => return,
            c = changes.next() => c,
        };
        match change {
            NodeChange::Changed(name, node) => {
                let status = node_ready_status(&node);
                if let Some(before) = seen.insert(name, status.clone()) {
                    if before != status {
                        tx.send_replace(());
                    }
                }
            }
            NodeChange::Deleted(name) => {
                if seen.remove(&name).is_some() {
                    tx.send_replace(());
                }
            }
            // What was seen may be stale: a pass reads every status.
            NodeChange::Missed => {
                seen.clear();
                tx.send_replace(());
            }
        }
    }
}

/// Where the control plane itself reaches the API: loopback when it listens
/// everywhere, else the one address it listens on (the local cloud's
/// gateway by default, where 127.0.0.1 is refused).
fn local_endpoint(listen: std::net::SocketAddr) -> String {
    let ip = match listen.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("https://{}", std::net::SocketAddr::new(ip, listen.port()))
}

impl EmbeddedJoin {
    pub fn new(cluster: EmbeddedCluster, token_ttl: Duration) -> Result<EmbeddedJoin> {
        let path = cluster.admin_kubeconfig_path();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ServerError::io(format!("read {}", path.display()), e))?;
        let admin = admin_agent(&text)?;
        let local_endpoint = local_endpoint(cluster.local_addr());
        Ok(EmbeddedJoin {
            cluster,
            admin,
            local_endpoint,
            token_ttl,
        })
    }

    pub fn endpoint(&self) -> &str {
        self.cluster.endpoint()
    }

    pub fn admin_kubeconfig_path(&self) -> &std::path::Path {
        self.cluster.admin_kubeconfig_path()
    }

    /// Stops the cluster's server and controllers (they end on their own).
    pub fn stop(&self) {
        self.cluster.shutdown_handle().shutdown();
    }

    /// One API call: its status and JSON body (at most
    /// [`MAX_ANSWER_BYTES`]). A body is sent as a JSON merge patch with
    /// PATCH, as JSON otherwise.
    pub(crate) async fn request(
        &self,
        method: &'static str,
        path: String,
        body: Option<Value>,
    ) -> Result<(u16, Value)> {
        let agent = self.admin.clone();
        let url = format!("{}{path}", self.local_endpoint);
        tokio::task::spawn_blocking(move || {
            let request = agent.request(method, &url);
            let content_type = if method == "PATCH" {
                "application/merge-patch+json"
            } else {
                "application/json"
            };
            let outcome = match body {
                Some(b) => request
                    .set("Content-Type", content_type)
                    .send_string(&b.to_string()),
                None => request.call(),
            };
            let response = match outcome {
                Ok(r) => r,
                Err(ureq::Error::Status(_, r)) => r,
                Err(e) => return Err(cluster_err(format!("{method} {url}: {e}"))),
            };
            let status = response.status();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(
                &mut std::io::Read::take(response.into_reader(), MAX_ANSWER_BYTES + 1),
                &mut bytes,
            )
            .map_err(|e| cluster_err(format!("{method} {url}: reading the answer: {e}")))?;
            if bytes.len() as u64 > MAX_ANSWER_BYTES {
                return Err(cluster_err(format!(
                    "{method} {url}: the answer is larger than {MAX_ANSWER_BYTES} bytes"
                )));
            }
            let value = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).unwrap_or(Value::Null)
            };
            Ok((status, value))
        })
        .await
        .map_err(cluster_err)?
    }

    /// One API call; `None` for 404, an error for any other status past 299.
    pub(crate) async fn call_with(
        &self,
        method: &'static str,
        path: String,
        body: Option<Value>,
    ) -> Result<Option<Value>> {
        let (status, value) = self.request(method, path.clone(), body).await?;
        match status {
            200..=299 => Ok(Some(value)),
            404 => Ok(None),
            _ => Err(cluster_err(format!(
                "{method} {path}: {status} {}",
                status_message(&value)
            ))),
        }
    }

    async fn call(&self, method: &'static str, path: String) -> Result<Option<Value>> {
        self.call_with(method, path, None).await
    }
}

/// The largest answer the control plane reads from the API (a list of
/// every pod of a big cluster fits).
pub(crate) const MAX_ANSWER_BYTES: u64 = 64 * 1024 * 1024;

/// The `message` of a Kubernetes Status body, or the body itself.
fn status_message(body: &Value) -> String {
    body["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| body.to_string())
}

/// The API path of one pod. Namespace and name are checked first (DNS-1123
/// names), so that neither addresses another path.
fn pod_path(namespace: &str, name: &str) -> Result<String> {
    crate::names::check_node("metadata.namespace", namespace)?;
    crate::names::check_node("metadata.name", name)?;
    Ok(format!("/api/v1/namespaces/{namespace}/pods/{name}"))
}

#[async_trait]
impl ClusterJoin for EmbeddedJoin {
    async fn join_material(&self, _pool: &str, node_name: &str) -> Result<Option<JoinMaterial>> {
        // Bound to the node name: the CSR approver signs only for that node.
        // The node is given the CA below and discovers nothing: its token
        // signs cluster-info in the cluster's next batch.
        let bound = knit_api::validate::is_dns_subdomain(node_name).then_some(node_name);
        let token = self
            .cluster
            .create_bootstrap_token_signed_in_batch(bound, self.token_ttl)
            .map_err(cluster_err)?;
        Ok(Some(JoinMaterial {
            endpoint: self.cluster.endpoint().to_string(),
            ca_pem: self.cluster.ca_pem().to_string(),
            ca_pin: self.cluster.ca_pin().to_string(),
            bootstrap_token: token.token(),
        }))
    }

    async fn remove_node(&self, node: &str) -> Result<()> {
        // The drain ran before (crate::drain): only the Node goes here.
        self.call("DELETE", node_path(node)?).await.map(|_| ())
    }

    async fn revoke_join(&self, node: &str) -> Result<()> {
        // One list and a few deletes in the store, as join_material's create.
        self.cluster
            .delete_bootstrap_tokens_of(node)
            .map(|_| ())
            .map_err(cluster_err)
    }

    async fn cordon(&self, node: &str) -> Result<bool> {
        let cordon = serde_json::json!({"spec": {"unschedulable": true}});
        Ok(self
            .call_with("PATCH", node_path(node)?, Some(cordon))
            .await?
            .is_some())
    }

    async fn node_pods(&self, node: &str) -> Result<Vec<PodFacts>> {
        node_path(node)?;
        let list = self
            .call(
                "GET",
                format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
            )
            .await?
            .unwrap_or_default();
        // The field selector is the server's to apply; one that ignored
        // it must not make another node's pods this node's.
        Ok(pods::pod_list(&list)
            .into_iter()
            .filter(|p| p.node == node)
            .collect())
    }

    async fn pods(&self) -> Result<Vec<PodFacts>> {
        let list = self
            .call("GET", "/api/v1/pods".to_string())
            .await?
            .unwrap_or_default();
        Ok(pods::pod_list(&list))
    }

    async fn evict_pod(&self, namespace: &str, name: &str) -> Result<Eviction> {
        let path = format!("{}/eviction", pod_path(namespace, name)?);
        let (status, body) = self
            .request(
                "POST",
                path.clone(),
                Some(pods::eviction_body(namespace, name)),
            )
            .await?;
        match status {
            200..=299 => Ok(Eviction::Evicted),
            404 => Ok(Eviction::Gone),
            _ if pods::is_budget_refusal(status, &status_message(&body)) => {
                Ok(Eviction::Refused(status_message(&body)))
            }
            _ => Err(cluster_err(format!(
                "POST {path}: {status} {}",
                status_message(&body)
            ))),
        }
    }

    async fn delete_pod(&self, namespace: &str, name: &str) -> Result<()> {
        self.call("DELETE", pod_path(namespace, name)?)
            .await
            .map(|_| ())
    }

    async fn budgets(&self, namespace: &str) -> Result<Vec<BudgetFacts>> {
        crate::names::check_node("metadata.namespace", namespace)?;
        let list = self
            .call(
                "GET",
                format!("/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"),
            )
            .await?
            .unwrap_or_default();
        Ok(pods::budget_list(&list))
    }

    async fn node_status(&self, node: &str) -> Result<Option<String>> {
        Ok(self
            .call("GET", node_path(node)?)
            .await?
            .map(|n| node_ready_status(&n)))
    }

    fn attached(&self) -> bool {
        true
    }

    fn readiness_changes(&self) -> Option<tokio::sync::watch::Receiver<()>> {
        let (tx, rx) = tokio::sync::watch::channel(());
        let changes = self.cluster.node_changes();
        tokio::spawn(follow_readiness(changes, tx));
        Some(rx)
    }

    fn api_endpoint(&self) -> Option<String> {
        Some(self.endpoint().to_string())
    }

    async fn remove_taint(&self, node: &str, key: &str) -> Result<bool> {
        let Some(current) = self.call("GET", node_path(node)?).await? else {
            return Ok(false);
        };
        let taints: Vec<Value> = current["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["key"] != key)
            .cloned()
            .collect();
        // A merge patch replaces the list: the other taints are kept as read.
        let patch = serde_json::json!({ "spec": { "taints": taints } });
        Ok(self
            .call_with("PATCH", node_path(node)?, Some(patch))
            .await?
            .is_some())
    }

    async fn node_annotation(&self, node: &str, key: &str) -> Result<Option<String>> {
        Ok(self.call("GET", node_path(node)?).await?.and_then(|n| {
            n["metadata"]["annotations"][key]
                .as_str()
                .map(str::to_string)
        }))
    }

    async fn node_statuses(&self) -> Result<Vec<(String, String)>> {
        // In process, from the cluster's memory: the same Nodes the API's
        // list answers, without serializing and parsing them every pass.
        let reader = self.cluster.node_reader();
        let nodes = tokio::task::spawn_blocking(move || reader.nodes())
            .await
            .map_err(cluster_err)?
            .map_err(cluster_err)?;
        Ok(nodes
            .iter()
            .filter_map(|n| {
                n["metadata"]["name"]
                    .as_str()
                    .map(|name| (name.to_string(), node_ready_status(n)))
            })
            .collect())
    }

    async fn node_metas(&self) -> Result<Vec<node_meta::NodeMeta>> {
        let list = self.call("GET", "/api/v1/nodes".to_string()).await?;
        Ok(node_meta::NodeMeta::from_list(&list.unwrap_or_default()))
    }

    async fn node_meta(&self, node: &str) -> Result<Option<node_meta::NodeMeta>> {
        let found = self.call("GET", node_path(node)?).await?;
        Ok(found.as_ref().and_then(node_meta::NodeMeta::from_node))
    }

    async fn publish_event(&self, event: &Value) -> Result<()> {
        seam::upsert(event, |method, path, body| {
            self.request(method, path, Some(body))
        })
        .await
    }

    async fn patch_node(&self, node: &str, patch: &Value) -> Result<node_meta::NodePatched> {
        let path = node_path(node)?;
        let (status, body) = self
            .request("PATCH", path.clone(), Some(patch.clone()))
            .await?;
        match status {
            200..=299 => Ok(node_meta::NodePatched::Patched),
            404 => Ok(node_meta::NodePatched::NotFound),
            409 => Ok(node_meta::NodePatched::Conflict),
            _ => Err(cluster_err(format!(
                "PATCH {path}: {status} {}",
                status_message(&body)
            ))),
        }
    }
}

/// The cluster API path of one Node. The name is checked first (a DNS-1123
/// subdomain): a name like `x/../victim` never addresses another object.
fn node_path(node: &str) -> Result<String> {
    crate::names::check_node("node", node)?;
    Ok(format!("/api/v1/nodes/{node}"))
}

/// An embedded cluster of a test's own in `dir`, on a free loopback port.
#[cfg(test)]
pub(crate) async fn test_cluster(dir: &std::path::Path) -> knit_cluster::EmbeddedCluster {
    let cfg = knit_cluster::ClusterConfig::new(dir.join("cluster"), "127.0.0.1:0".parse().unwrap());
    knit_cluster::EmbeddedCluster::start(cfg).await.unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ready_condition_maps_to_status() {
        let node = |s: &str| json!({"status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": s}]}});
        assert_eq!(node_ready_status(&node("True")), "Ready");
        assert_eq!(node_ready_status(&node("False")), "NotReady");
        assert_eq!(node_ready_status(&node("Unknown")), "Unknown");
        assert_eq!(node_ready_status(&json!({})), "NotReady");
    }

    #[test]
    fn embedded_cluster_gives_join_material_and_node_status() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let cluster = test_cluster(dir.path()).await;
            let join = EmbeddedJoin::new(cluster, Duration::from_secs(600)).unwrap();
            let m = join.join_material("p", "local.i-1").await.unwrap().unwrap();
            assert!(knit_api::validate::is_bootstrap_token(&m.bootstrap_token));
            assert!(knit_api::validate::is_ca_pin(&m.ca_pin));
            assert!(m.ca_pem.contains("BEGIN CERTIFICATE"));
            // Its instance gone before it joined: the token bound to its
            // node is revoked (issue 30), another node's is kept.
            let other = join.join_material("p", "local.i-9").await.unwrap().unwrap();
            let secret = |token: &str| {
                let id = token.split_once('.').map(|(id, _)| id).unwrap_or_default();
                format!("/api/v1/namespaces/kube-system/secrets/bootstrap-token-{id}")
            };
            let get = |path: String| join.call_with("GET", path, None);
            assert!(get(secret(&m.bootstrap_token)).await.unwrap().is_some());
            join.revoke_join("local.i-1").await.unwrap();
            assert!(get(secret(&m.bootstrap_token)).await.unwrap().is_none());
            assert!(get(secret(&other.bootstrap_token)).await.unwrap().is_some());
            join.revoke_join("local.i-1").await.unwrap();
            // Through the real API: no such node yet; removal of an absent
            // node is not an error.
            assert_eq!(join.node_status("local.i-1").await.unwrap(), None);
            join.remove_node("local.i-1").await.unwrap();
            // A registered node: cordoned, its (zero) pods listed, deleted.
            let node = serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "local.i-2"}});
            join.call_with("POST", "/api/v1/nodes".into(), Some(node)).await.unwrap();
            join.remove_node("local.i-2").await.unwrap();
            assert_eq!(join.node_status("local.i-2").await.unwrap(), None);
            // A name that would address another path is refused unsent.
            let e = join.remove_node("x/../victim").await.unwrap_err();
            assert_eq!(e.http_status(), 422, "{e}");
            assert!(join.node_statuses().await.unwrap().is_empty());
            join.stop();
        });
    }

    /// The reconciler is told when a registered Node's Ready changes or
    /// the Node is deleted (not when a Node appears, nor on a change that
    /// keeps it), and the follower ends with its receiver.
    #[test]
    fn readiness_changes_tell_ready_transitions_and_deletions_only() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let cluster = test_cluster(dir.path()).await;
            let join = EmbeddedJoin::new(cluster, Duration::from_secs(600)).unwrap();
            let mut rx = join.readiness_changes().expect("the embedded cluster tells");
            let told = |rx: &mut tokio::sync::watch::Receiver<()>| {
                let mut rx = rx.clone();
                async move {
                    tokio::time::timeout(Duration::from_millis(500), rx.changed())
                        .await
                        .is_ok()
                }
            };
            let status = |ready: &str| {
                json!({"status": {"conditions": [{"type": "Ready", "status": ready}]}})
            };
            let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n-1"},
                              "status": status("False")["status"]});
            join.call_with("POST", "/api/v1/nodes".into(), Some(node))
                .await
                .unwrap();
            assert!(!told(&mut rx).await, "a new Node is not a transition");
            let patch = |s: Value| {
                join.call_with("PATCH", "/api/v1/nodes/n-1/status".into(), Some(s))
            };
            patch(json!({"metadata": {"labels": {"a": "b"}}})).await.unwrap();
            assert!(!told(&mut rx).await, "still NotReady");
            // The statuses a pass reads (from the cluster's memory) are
            // the ones the API has just stored.
            let statuses = || join.node_statuses();
            assert_eq!(statuses().await.unwrap(), [("n-1".into(), "NotReady".into())]);
            patch(status("True")).await.unwrap();
            assert!(told(&mut rx).await, "NotReady -> Ready");
            assert_eq!(statuses().await.unwrap(), [("n-1".into(), "Ready".into())]);
            rx.borrow_and_update();
            patch(status("Unknown")).await.unwrap();
            assert!(told(&mut rx).await, "Ready -> Unknown");
            assert_eq!(statuses().await.unwrap(), [("n-1".into(), "Unknown".into())]);
            rx.borrow_and_update();
            // A settled reconciler waits longer between passes: a Node
            // deleted must wake it as a Ready change does.
            join.call_with("DELETE", "/api/v1/nodes/n-1".into(), None)
                .await
                .unwrap();
            assert!(told(&mut rx).await, "deleted");
            drop(rx);
            join.stop();
        });
    }

    /// `knit up` listens on loopback and the local cloud's gateway and puts
    /// the API on the gateway only: the control plane must reach it there
    /// (127.0.0.1 was refused, so node statuses and removals failed).
    #[test]
    fn the_control_plane_reaches_an_api_that_listens_on_one_address() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let mut cfg = knit_cluster::ClusterConfig::new(
                dir.path().join("cluster"),
                "127.0.0.2:0".parse().unwrap(),
            );
            cfg.advertise_address = Some("127.0.0.3".into());
            let cluster = EmbeddedCluster::start(cfg).await.unwrap();
            let join = EmbeddedJoin::new(cluster, Duration::from_secs(600)).unwrap();
            assert!(join.local_endpoint.starts_with("https://127.0.0.2:"));
            assert!(join.node_statuses().await.unwrap().is_empty());
            join.stop();
        });
        assert_eq!(
            local_endpoint("0.0.0.0:6443".parse().unwrap()),
            "https://127.0.0.1:6443"
        );
        assert_eq!(
            local_endpoint("[::]:6443".parse().unwrap()),
            "https://[::1]:6443"
        );
    }
}
