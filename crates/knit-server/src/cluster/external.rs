//! A cluster knit does not serve (`apiServer: external`) behind the
//! [`ClusterJoin`] seam, through the `kube` crate with an admin kubeconfig:
//! join material from the kubeconfig's server and CA, bootstrap tokens as
//! `bootstrap.kubernetes.io/token` Secrets in `kube-system`, Node status,
//! taint removal and deletion through the Nodes API.
//!
//! Each token carries knit's `knit.dev/node-name` annotation, which the
//! embedded cluster's CSR approver honours; a real cluster ignores it and
//! its own approver (kube-controller-manager's csrapproving, or whatever
//! the cluster runs) decides which node certificates are signed.

use crate::cluster::pods::{self, BudgetFacts, Eviction, PodFacts};
use crate::cluster::seam::{self, ClusterJoin, JoinMaterial};
use crate::error::{Result, ServerError};
use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The annotation binding a token to one node name (as knit-cluster reads it).
pub const NODE_ANNOTATION: &str = "knit.dev/node-name";

fn external_err(e: impl std::fmt::Display) -> ServerError {
    ServerError::Internal(format!("external cluster: {e}"))
}

/// Ready condition of a Node → NotReady | Ready | Unknown (as
/// [`crate::cluster::node_ready_status`] maps it for the embedded cluster).
pub fn node_status_of(node: &Node) -> String {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str());
    match ready {
        Some("True") => "Ready",
        Some("Unknown") => "Unknown",
        _ => "NotReady",
    }
    .to_string()
}

pub struct ExternalJoin {
    client: kube::Client,
    endpoint: String,
    ca_pem: String,
    ca_pin: String,
    token_ttl: Duration,
}

impl ExternalJoin {
    /// Reads the admin kubeconfig (its current context) and builds a client.
    /// The kubeconfig must name the cluster's CA: nodes pin it.
    pub async fn from_kubeconfig(path: &Path, token_ttl: Duration) -> Result<ExternalJoin> {
        let kubeconfig = Kubeconfig::read_from(path)
            .map_err(|e| external_err(format!("read kubeconfig {}: {e}", path.display())))?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| external_err(format!("kubeconfig {}: {e}", path.display())))?;
        let ca_der = config
            .root_cert
            .as_ref()
            .and_then(|certs| certs.first())
            .ok_or_else(|| {
                external_err(format!(
                    "kubeconfig {} names no certificate authority; nodes need one to pin",
                    path.display()
                ))
            })?;
        // PEM is the form nodes receive and the pin is computed on.
        let ca_pem = knit_os::pem::encode("CERTIFICATE", ca_der);
        let ca_pin = knit_cluster::spki_pin(&ca_pem).map_err(external_err)?;
        let endpoint = config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string();
        let client = capped_client(config)?;
        Ok(ExternalJoin {
            client,
            endpoint,
            ca_pem,
            ca_pin,
            token_ttl,
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }
}

/// The largest answer read from an external cluster's API, as from the
/// embedded one (a list of every pod of a big cluster fits): a larger body
/// fails the call instead of filling the server's memory.
pub const MAX_ANSWER_BYTES: usize = super::MAX_ANSWER_BYTES as usize;

/// A kube client whose every answer body is read through a cap of `max`
/// bytes (kube's own client reads whatever the server sends). Timeouts are
/// kube's (connect 30 s, read and write 295 s) and each call of the drain
/// is bounded again by its caller.
fn capped_client_of(config: kube::Config, max: usize) -> Result<kube::Client> {
    let cap = tower::util::MapResponseLayer::new(
        move |answer: hyper::Response<Box<kube::client::DynBody>>| {
            answer.map(|body| http_body_util::Limited::new(body, max))
        },
    );
    Ok(kube::client::ClientBuilder::try_from(config)
        .map_err(external_err)?
        .with_layer(&cap)
        .build())
}

fn capped_client(config: kube::Config) -> Result<kube::Client> {
    capped_client_of(config, MAX_ANSWER_BYTES)
}

fn pod_facts_of(pod: &Pod) -> Option<PodFacts> {
    serde_json::to_value(pod)
        .ok()
        .as_ref()
        .and_then(pods::pod_facts)
}

impl ExternalJoin {
    fn pods_in(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

/// The cluster nodes join, from the stored Cluster spec: `apiServer:
/// external` with a kubeconfig → an [`ExternalJoin`] on it; otherwise the
/// join the server was started with (embedded or none). Read once at start:
/// a changed spec takes effect at the next start.
pub async fn select(
    spec: &knit_api::Cluster,
    started_with: Arc<dyn ClusterJoin>,
    token_ttl: Duration,
) -> Result<Arc<dyn ClusterJoin>> {
    match (spec.spec.api_server.as_str(), &spec.spec.kubeconfig) {
        ("external", Some(path)) => {
            let join = ExternalJoin::from_kubeconfig(Path::new(path), token_ttl).await?;
            tracing::info!(
                endpoint = join.endpoint(),
                "nodes join the external cluster"
            );
            Ok(Arc::new(join))
        }
        _ => Ok(started_with),
    }
}

/// The token Secret kubeadm and kube-apiserver's bootstrap authenticator read.
fn token_secret(
    id: &str,
    secret: &str,
    expires: &str,
    pool: &str,
    node_name: Option<&str>,
) -> Secret {
    let mut data = BTreeMap::new();
    let mut put = |k: &str, v: &str| {
        data.insert(k.to_string(), ByteString(v.as_bytes().to_vec()));
    };
    put("token-id", id);
    put("token-secret", secret);
    put("expiration", expires);
    put("usage-bootstrap-authentication", "true");
    put("usage-bootstrap-signing", "true");
    put("description", "knit node bootstrap token");
    // kubeadm's rule for extra groups: [a-z0-9:-], ending alphanumeric.
    let group_ok = pool
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && pool
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    if group_ok {
        put(
            "auth-extra-groups",
            &format!("system:bootstrappers:knit:{pool}"),
        );
    }
    let annotations =
        node_name.map(|n| BTreeMap::from([(NODE_ANNOTATION.to_string(), n.to_string())]));
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("bootstrap-token-{id}")),
            namespace: Some("kube-system".to_string()),
            annotations,
            ..Default::default()
        },
        type_: Some("bootstrap.kubernetes.io/token".to_string()),
        data: Some(data),
        ..Default::default()
    }
}

#[async_trait]
impl ClusterJoin for ExternalJoin {
    async fn join_material(&self, pool: &str, node_name: &str) -> Result<Option<JoinMaterial>> {
        let id = crate::pki::random_lower_alnum(6)?;
        let secret = crate::pki::random_lower_alnum(16)?;
        let ttl_ms = i64::try_from(self.token_ttl.as_millis()).map_err(external_err)?;
        let expires = knit_os::time::rfc3339_ms(knit_os::time::now_ms().saturating_add(ttl_ms));
        let bound = knit_api::validate::is_dns_subdomain(node_name).then_some(node_name);
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), "kube-system");
        secrets
            .create(
                &PostParams::default(),
                &token_secret(&id, &secret, &expires, pool, bound),
            )
            .await
            .map_err(|e| external_err(format!("create bootstrap token Secret: {e}")))?;
        Ok(Some(JoinMaterial {
            endpoint: self.endpoint.clone(),
            ca_pem: self.ca_pem.clone(),
            ca_pin: self.ca_pin.clone(),
            bootstrap_token: format!("{id}.{secret}"),
        }))
    }

    async fn revoke_join(&self, node: &str) -> Result<()> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), "kube-system");
        let tokens = ListParams::default().fields("type=bootstrap.kubernetes.io/token");
        let list = secrets
            .list(&tokens)
            .await
            .map_err(|e| external_err(format!("list bootstrap token Secrets: {e}")))?;
        for s in list.items {
            let bound = s
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(NODE_ANNOTATION));
            let (Some(name), Some(true)) = (s.metadata.name.as_deref(), bound.map(|b| b == node))
            else {
                continue;
            };
            match secrets.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(external_err(format!("delete Secret {name}: {e}"))),
            }
        }
        Ok(())
    }

    async fn remove_node(&self, node: &str) -> Result<()> {
        // The drain ran before (crate::drain): only the Node goes here.
        match self.nodes().delete(node, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(external_err(format!("delete node {node}: {e}"))),
        }
    }

    async fn cordon(&self, node: &str) -> Result<bool> {
        let cordon = serde_json::json!({"spec": {"unschedulable": true}});
        match self
            .nodes()
            .patch(node, &PatchParams::default(), &Patch::Merge(&cordon))
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(external_err(format!("cordon node {node}: {e}"))),
        }
    }

    async fn node_pods(&self, node: &str) -> Result<Vec<PodFacts>> {
        let all: Api<Pod> = Api::all(self.client.clone());
        let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = all
            .list(&on_node)
            .await
            .map_err(|e| external_err(format!("list the pods of node {node}: {e}")))?;
        Ok(list
            .items
            .iter()
            .filter_map(pod_facts_of)
            .filter(|p| p.node == node)
            .collect())
    }

    async fn pods(&self) -> Result<Vec<PodFacts>> {
        let all: Api<Pod> = Api::all(self.client.clone());
        let list = all
            .list(&ListParams::default())
            .await
            .map_err(|e| external_err(format!("list pods: {e}")))?;
        Ok(list.items.iter().filter_map(pod_facts_of).collect())
    }

    async fn evict_pod(&self, namespace: &str, name: &str) -> Result<Eviction> {
        match self
            .pods_in(namespace)
            .evict(name, &EvictParams::default())
            .await
        {
            Ok(_) => Ok(Eviction::Evicted),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Eviction::Gone),
            Err(kube::Error::Api(s)) if pods::is_budget_refusal(s.code, &s.message) => {
                Ok(Eviction::Refused(s.message))
            }
            Err(e) => Err(external_err(format!("evict pod {namespace}/{name}: {e}"))),
        }
    }

    async fn delete_pod(&self, namespace: &str, name: &str) -> Result<()> {
        match self
            .pods_in(namespace)
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(external_err(format!("delete pod {namespace}/{name}: {e}"))),
        }
    }

    async fn budgets(&self, namespace: &str) -> Result<Vec<BudgetFacts>> {
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), namespace);
        let list = api.list(&ListParams::default()).await.map_err(|e| {
            external_err(format!(
                "list the PodDisruptionBudgets of namespace {namespace}: {e}"
            ))
        })?;
        // A budget that cannot be read back is an error, never skipped: a
        // skipped budget would let a drain evict what it protects.
        let mut budgets = Vec::new();
        for b in &list.items {
            let v = serde_json::to_value(b).map_err(|e| {
                external_err(format!(
                    "a PodDisruptionBudget of namespace {namespace} as JSON: {e}"
                ))
            })?;
            budgets.extend(pods::budget_facts(&v));
        }
        Ok(budgets)
    }

    async fn node_annotation(&self, node: &str, key: &str) -> Result<Option<String>> {
        let found = self
            .nodes()
            .get_opt(node)
            .await
            .map_err(|e| external_err(format!("get node {node}: {e}")))?;
        Ok(found.and_then(|n| n.metadata.annotations.and_then(|mut a| a.remove(key))))
    }

    async fn node_status(&self, node: &str) -> Result<Option<String>> {
        let found = self
            .nodes()
            .get_opt(node)
            .await
            .map_err(|e| external_err(format!("get node {node}: {e}")))?;
        Ok(found.as_ref().map(node_status_of))
    }

    async fn node_statuses(&self) -> Result<Vec<(String, String)>> {
        let list = self
            .nodes()
            .list(&ListParams::default())
            .await
            .map_err(|e| external_err(format!("list nodes: {e}")))?;
        Ok(list
            .items
            .iter()
            .filter_map(|n| {
                n.metadata
                    .name
                    .clone()
                    .map(|name| (name, node_status_of(n)))
            })
            .collect())
    }

    fn attached(&self) -> bool {
        true
    }

    fn api_endpoint(&self) -> Option<String> {
        Some(self.endpoint.clone())
    }

    async fn remove_taint(&self, node: &str, key: &str) -> Result<bool> {
        let nodes = self.nodes();
        // The kubelet updates its Node too: a conflict is read again and
        // retried, a few times.
        for _ in 0..5 {
            let Some(current) = nodes
                .get_opt(node)
                .await
                .map_err(|e| external_err(format!("get node {node}: {e}")))?
            else {
                return Ok(false);
            };
            let taints: Vec<_> = current
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .into_iter()
                .filter(|t| t.key != key)
                .collect();
            // A merge patch replaces the list: the other taints are kept as
            // read; the resourceVersion makes a concurrent change a
            // conflict rather than a lost update.
            let patch = serde_json::json!({
                "metadata": { "resourceVersion": current.metadata.resource_version },
                "spec": { "taints": taints },
            });
            match nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(external_err(format!("remove taint {key} from {node}: {e}"))),
            }
        }
        Err(external_err(format!(
            "remove taint {key} from {node}: the Node kept changing (5 conflicts)"
        )))
    }

    async fn node_metas(&self) -> Result<Vec<super::node_meta::NodeMeta>> {
        let list = self
            .nodes()
            .list(&ListParams::default())
            .await
            .map_err(|e| external_err(format!("list nodes: {e}")))?;
        let mut nodes = Vec::new();
        for n in &list.items {
            let v = serde_json::to_value(n)
                .map_err(|e| external_err(format!("a Node as JSON: {e}")))?;
            nodes.extend(super::node_meta::NodeMeta::from_node(&v));
        }
        Ok(nodes)
    }

    async fn node_meta(&self, node: &str) -> Result<Option<super::node_meta::NodeMeta>> {
        let found = self
            .nodes()
            .get_opt(node)
            .await
            .map_err(|e| external_err(format!("get node {node}: {e}")))?;
        let Some(n) = found else { return Ok(None) };
        let v = serde_json::to_value(n)
            .map_err(|e| external_err(format!("node {node} as JSON: {e}")))?;
        Ok(super::node_meta::NodeMeta::from_node(&v))
    }

    async fn patch_node(
        &self,
        node: &str,
        patch: &serde_json::Value,
    ) -> Result<super::node_meta::NodePatched> {
        use super::node_meta::NodePatched;
        match self
            .nodes()
            .patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => Ok(NodePatched::Patched),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(NodePatched::NotFound),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(NodePatched::Conflict),
            Err(e) => Err(external_err(format!("patch node {node}: {e}"))),
        }
    }

    async fn publish_event(&self, event: &serde_json::Value) -> Result<()> {
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.client.clone(), seam::NAMESPACE);
        seam::upsert(event, |method, path, body| {
            let events = events.clone();
            async move {
                let name = path.rsplit('/').next().unwrap_or_default().to_string();
                let answer = if method == "POST" {
                    let object = serde_json::from_value(body)
                        .map_err(|e| external_err(format!("event {name}: {e}")))?;
                    events.create(&PostParams::default(), &object).await
                } else {
                    events
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
                        .await
                };
                match answer {
                    Ok(_) => Ok((200, serde_json::Value::Null)),
                    Err(kube::Error::Api(s)) => {
                        Ok((s.code, serde_json::json!({"message": s.message})))
                    }
                    Err(e) => Err(external_err(format!("{method} {path}: {e}"))),
                }
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequest, CertificateSigningRequestSpec,
    };
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, Taint};
    use knit_cluster::{ClusterConfig, EmbeddedCluster};

    /// A kube client that authenticates with a bearer token only.
    async fn token_client(endpoint: &str, ca_pem: &str, token: &str) -> kube::Client {
        let b64 = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {endpoint}\n    certificate-authority-data: {b64}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        );
        let kc = Kubeconfig::from_yaml(&yaml).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap();
        kube::Client::try_from(cfg).unwrap()
    }

    /// A kubelet client CSR for `node` (as kubelet's TLS bootstrap sends it).
    fn kubelet_csr(node: &str) -> CertificateSigningRequest {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        CertificateSigningRequest {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("csr-{node}")),
                ..Default::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(pem.into_bytes()),
                signer_name: knit_cluster::KUBELET_CLIENT_SIGNER.to_string(),
                usages: Some(vec!["digital signature".into(), "client auth".into()]),
                ..Default::default()
            },
            status: None,
        }
    }

    /// The approver's decision on a CSR, waited for (it runs in the background).
    async fn decision(csrs: &Api<CertificateSigningRequest>, name: &str) -> String {
        for _ in 0..100 {
            let csr = csrs.get(name).await.unwrap();
            let kinds: Vec<String> = csr
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .map(|c| c.type_)
                .collect();
            if let Some(k) = kinds.into_iter().find(|k| k == "Approved" || k == "Denied") {
                return k;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no decision on CSR {name}");
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            ..Default::default()
        }
    }

    /// A loopback API that answers `/api/v1/nodes` with a small list and
    /// every other call with a valid JSON list larger than
    /// [`MAX_ANSWER_BYTES`], for as many connections as come.
    fn oversized_api() -> u16 {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let big = Arc::new(format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{}},"items":[],"padding":"{}"}}"#,
            "x".repeat(MAX_ANSWER_BYTES + 1024)
        ));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let big = big.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut writer = conn;
                    loop {
                        let mut first = String::new();
                        if reader.read_line(&mut first).unwrap_or(0) == 0 {
                            return;
                        }
                        let mut length = 0usize;
                        loop {
                            let mut line = String::new();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if let Some(v) =
                                line.to_ascii_lowercase().strip_prefix("content-length:")
                            {
                                length = v.trim().parse().unwrap_or(0);
                            }
                            if line == "\r\n" {
                                break;
                            }
                        }
                        let mut body = vec![0u8; length];
                        if std::io::Read::read_exact(&mut reader, &mut body).is_err() {
                            return;
                        }
                        let answer: &str = if first.starts_with("GET /api/v1/nodes ")
                            || first.starts_with("GET /api/v1/nodes?")
                        {
                            r#"{"apiVersion":"v1","kind":"NodeList","metadata":{},"items":[]}"#
                        } else {
                            big.as_str()
                        };
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                            answer.len()
                        );
                        if writer.write_all(head.as_bytes()).is_err()
                            || writer.write_all(answer.as_bytes()).is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    /// Every answer of an external cluster is read through the cap: the
    /// drain's pod and budget lists, node reads and writes fail when the
    /// API sends more than [`MAX_ANSWER_BYTES`] (kube's client alone read
    /// it all), and a small answer still reads.
    #[test]
    fn an_external_answer_larger_than_the_cap_fails_the_call() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let port = oversized_api();
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(ca.cert.pem());
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\n    certificate-authority-data: {b64}\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
            ),
        )
        .unwrap();
        rt.block_on(async {
            let join = ExternalJoin::from_kubeconfig(&path, Duration::from_secs(600))
                .await
                .unwrap();
            assert!(
                join.node_statuses().await.unwrap().is_empty(),
                "a small answer reads"
            );
            let too_big = |what: &str, r: Result<()>| {
                let e = r.expect_err(what).to_string();
                assert!(e.contains("length limit exceeded"), "{what}: {e}");
            };
            too_big("node pods", join.node_pods("n1").await.map(drop));
            too_big("pods", join.pods().await.map(drop));
            too_big("budgets", join.budgets("default").await.map(drop));
            too_big("node status", join.node_status("n1").await.map(drop));
            too_big("cordon", join.cordon("n1").await.map(drop));
            too_big("evict", join.evict_pod("default", "p").await.map(drop));
        });
    }

    /// knit's node events reach an external cluster through kube as they
    /// reach the embedded one: created, then a repeat updates the same
    /// Event's count and last time (a merge patch), a patch of an Event
    /// the cluster lost creates it again.
    #[test]
    fn node_events_are_written_to_an_external_cluster() {
        use crate::store::EventRecord;
        use k8s_openapi::api::core::v1::Event;
        use knit_api::state::EventType;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let cfg =
                ClusterConfig::new(dir.path().join("cluster"), "127.0.0.1:0".parse().unwrap());
            let cluster = EmbeddedCluster::start(cfg).await.unwrap();
            let join = ExternalJoin::from_kubeconfig(
                cluster.admin_kubeconfig_path(),
                Duration::from_secs(600),
            )
            .await
            .unwrap();
            let mut record = EventRecord {
                id: 9,
                at_ms: 1_764_693_924_000,
                count: 1,
                last_ms: 1_764_693_924_000,
                event_type: EventType::Normal,
                object_kind: "Node".into(),
                object_name: "local.i-1".into(),
                reason: "Drained".into(),
                message: "drained".into(),
            };
            let object =
                crate::kube_events::event_object_about("Node", "local.i-1", &record).unwrap();
            let name = object["metadata"]["name"].as_str().unwrap().to_string();
            join.publish_event(&object).await.unwrap();
            record.count = 4;
            record.last_ms += 60_000;
            let again =
                crate::kube_events::event_object_about("Node", "local.i-1", &record).unwrap();
            join.publish_event(&again).await.unwrap();
            let events: Api<Event> =
                Api::namespaced(join.client.clone(), crate::kube_events::NAMESPACE);
            let e = events.get(&name).await.unwrap();
            assert_eq!(e.count, Some(4));
            assert_eq!(e.reason.as_deref(), Some("Drained"));
            assert_eq!(e.involved_object.kind.as_deref(), Some("Node"));
            assert_eq!(e.source.and_then(|s| s.component).as_deref(), Some("knit"));
            let listed = events.list(&ListParams::default()).await.unwrap();
            assert_eq!(listed.items.len(), 1);
            // Lost by the cluster: the next repeat makes it again.
            events
                .delete(&name, &DeleteParams::default())
                .await
                .unwrap();
            record.count = 5;
            let lost =
                crate::kube_events::event_object_about("Node", "local.i-1", &record).unwrap();
            join.publish_event(&lost).await.unwrap();
            assert_eq!(events.get(&name).await.unwrap().count, Some(5));
            cluster.shutdown_handle().shutdown();
        });
    }

    #[test]
    fn external_join_through_kube_against_the_embedded_api() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let cfg =
                ClusterConfig::new(dir.path().join("cluster"), "127.0.0.1:0".parse().unwrap());
            let cluster = EmbeddedCluster::start(cfg).await.unwrap();
            let join = ExternalJoin::from_kubeconfig(
                cluster.admin_kubeconfig_path(),
                Duration::from_secs(600),
            )
            .await
            .unwrap();
            assert!(join.attached());

            // Join material: the kubeconfig's server and CA, the cluster's pin.
            let m = join
                .join_material("workers", "local.i-1")
                .await
                .unwrap()
                .unwrap();
            assert_eq!(m.endpoint, cluster.endpoint());
            assert_eq!(m.ca_pin, cluster.ca_pin());
            assert_eq!(
                knit_cluster::spki_pin(&m.ca_pem).unwrap(),
                knit_cluster::spki_pin(cluster.ca_pem()).unwrap()
            );
            assert!(knit_api::validate::is_bootstrap_token(&m.bootstrap_token));

            // The token is a real bootstrap-token Secret in kube-system.
            let (id, secret) = m.bootstrap_token.split_once('.').unwrap();
            let admin = join.client.clone();
            let secrets: Api<Secret> = Api::namespaced(admin.clone(), "kube-system");
            let s = secrets.get(&format!("bootstrap-token-{id}")).await.unwrap();
            assert_eq!(s.type_.as_deref(), Some("bootstrap.kubernetes.io/token"));
            let data = s.data.unwrap();
            let field = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
            assert_eq!(field("token-id"), id);
            assert_eq!(field("token-secret"), secret);
            assert_eq!(field("usage-bootstrap-authentication"), "true");
            assert_eq!(field("usage-bootstrap-signing"), "true");
            assert_eq!(
                field("auth-extra-groups"),
                "system:bootstrappers:knit:workers"
            );
            assert!(field("expiration").ends_with('Z'));
            assert_eq!(
                s.metadata.annotations.unwrap()[NODE_ANNOTATION],
                "local.i-1"
            );

            // The bootstrap signer (here the embedded cluster's; on a real
            // cluster kube-controller-manager's) signs cluster-info for it,
            // which the agent verifies on discovery.
            let infos: Api<k8s_openapi::api::core::v1::ConfigMap> =
                Api::namespaced(admin.clone(), "kube-public");
            let jws_key = format!("jws-kubeconfig-{id}");
            let mut signed = false;
            for _ in 0..100 {
                let info = infos.get("cluster-info").await.unwrap();
                if info.data.unwrap_or_default().contains_key(&jws_key) {
                    signed = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(signed, "cluster-info has no {jws_key}");

            // The token authenticates; a wrong secret does not.
            let bootstrapper = token_client(&m.endpoint, &m.ca_pem, &m.bootstrap_token).await;
            let csrs: Api<CertificateSigningRequest> = Api::all(bootstrapper);
            csrs.list(&ListParams::default()).await.unwrap();
            let wrong =
                token_client(&m.endpoint, &m.ca_pem, &format!("{id}.0000000000000000")).await;
            match Api::<CertificateSigningRequest>::all(wrong)
                .list(&ListParams::default())
                .await
            {
                Err(kube::Error::Api(s)) => assert_eq!(s.code, 401),
                other => panic!("a wrong token secret was not refused: {other:?}"),
            }
            // The embedded approver honours the node-name binding.
            let pp = PostParams::default();
            csrs.create(&pp, &kubelet_csr("local.i-1")).await.unwrap();
            csrs.create(&pp, &kubelet_csr("local.i-2")).await.unwrap();
            assert_eq!(decision(&csrs, "csr-local.i-1").await, "Approved");
            assert_eq!(decision(&csrs, "csr-local.i-2").await, "Denied");

            // Node status, taint removal and removal through the Nodes API.
            assert_eq!(join.node_status("local.i-1").await.unwrap(), None);
            let nodes: Api<Node> = Api::all(admin);
            let node = Node {
                metadata: kube::api::ObjectMeta {
                    name: Some("local.i-1".into()),
                    ..Default::default()
                },
                spec: Some(NodeSpec {
                    taints: Some(vec![
                        taint("knit.dev/user-data-pending", "NoSchedule"),
                        taint("example.com/keep", "NoExecute"),
                    ]),
                    ..Default::default()
                }),
                status: None,
            };
            nodes.create(&pp, &node).await.unwrap();
            assert_eq!(
                join.node_status("local.i-1").await.unwrap().as_deref(),
                Some("NotReady")
            );
            let ready = NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            };
            nodes
                .patch_status(
                    "local.i-1",
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({ "status": ready })),
                )
                .await
                .unwrap();
            assert_eq!(
                join.node_status("local.i-1").await.unwrap().as_deref(),
                Some("Ready")
            );
            assert_eq!(
                join.node_statuses().await.unwrap(),
                vec![("local.i-1".to_string(), "Ready".to_string())]
            );

            assert!(join
                .remove_taint("local.i-1", "knit.dev/user-data-pending")
                .await
                .unwrap());
            let keys: Vec<String> = nodes
                .get("local.i-1")
                .await
                .unwrap()
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .into_iter()
                .map(|t| t.key)
                .collect();
            assert!(keys.contains(&"example.com/keep".to_string()), "{keys:?}");
            assert!(
                !keys.contains(&"knit.dev/user-data-pending".to_string()),
                "{keys:?}"
            );
            assert!(!join.remove_taint("local.i-9", "x").await.unwrap());
            // The precondition remove_taint relies on: a stale
            // resourceVersion in a merge patch is a conflict.
            let stale = serde_json::json!({
                "metadata": { "resourceVersion": "1" },
                "spec": { "taints": [] },
            });
            match nodes
                .patch("local.i-1", &PatchParams::default(), &Patch::Merge(&stale))
                .await
            {
                Err(kube::Error::Api(s)) => assert_eq!(s.code, 409),
                other => panic!("a stale patch was not a conflict: {other:?}"),
            }

            // The drain's calls: cordon, the node's pods, budgets.
            assert!(join.cordon("local.i-1").await.unwrap());
            let cordoned = nodes.get("local.i-1").await.unwrap();
            assert_eq!(cordoned.spec.and_then(|s| s.unschedulable), Some(true));
            assert!(!join.cordon("local.i-9").await.unwrap(), "not registered");
            assert!(join.node_pods("local.i-1").await.unwrap().is_empty());
            join.remove_node("local.i-1").await.unwrap();
            assert_eq!(join.node_status("local.i-1").await.unwrap(), None);
            // Removing an absent node is not an error.
            join.remove_node("local.i-1").await.unwrap();
            assert!(join.node_statuses().await.unwrap().is_empty());
            cluster.shutdown().await;
        });
    }

    #[test]
    fn the_cluster_spec_selects_the_external_join() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let cfg =
                ClusterConfig::new(dir.path().join("cluster"), "127.0.0.1:0".parse().unwrap());
            let cluster = EmbeddedCluster::start(cfg).await.unwrap();
            let none: Arc<dyn ClusterJoin> = Arc::new(crate::cluster::seam::NoCluster);
            let ttl = Duration::from_secs(60);

            let embedded = knit_api::Cluster::default();
            let chosen = select(&embedded, none.clone(), ttl).await.unwrap();
            assert!(!chosen.attached());

            let mut external = knit_api::Cluster::default();
            external.spec.api_server = "external".into();
            external.spec.kubeconfig = Some(cluster.admin_kubeconfig_path().display().to_string());
            let chosen = select(&external, none.clone(), ttl).await.unwrap();
            assert!(chosen.attached());
            let m = chosen.join_material("p", "n1").await.unwrap().unwrap();
            assert_eq!(m.ca_pin, cluster.ca_pin());

            // A kubeconfig that cannot be read is an error, not a silent fallback.
            external.spec.kubeconfig = Some(dir.path().join("absent").display().to_string());
            let err = select(&external, none, ttl).await.err().unwrap();
            assert!(err.to_string().contains("absent"), "{err}");
            cluster.shutdown().await;
        });
    }

    #[test]
    fn a_server_whose_cluster_spec_is_external_joins_nodes_there() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let cfg =
                ClusterConfig::new(dir.path().join("cluster"), "127.0.0.1:0".parse().unwrap());
            let cluster = EmbeddedCluster::start(cfg).await.unwrap();
            let mut settings = crate::Settings::new(dir.path().join("state"));
            settings.listen = "127.0.0.1:0".parse().unwrap();
            // The spec as `knit apply` would have stored it before a restart.
            std::fs::create_dir_all(&settings.state_dir).unwrap();
            let mut spec = knit_api::Cluster::default();
            spec.spec.api_server = "external".into();
            spec.spec.kubeconfig = Some(cluster.admin_kubeconfig_path().display().to_string());
            crate::store::Store::open(&settings.db_path())
                .unwrap()
                .put_cluster(&spec)
                .unwrap();

            // Started with no cluster, the server still joins nodes there.
            let server = crate::start(settings, None, Arc::new(crate::cluster::seam::NoCluster))
                .await
                .unwrap();
            assert!(server.control.cluster.attached());
            let m = server
                .control
                .cluster
                .join_material("p", "n1")
                .await
                .unwrap()
                .unwrap();
            assert_eq!(m.endpoint, cluster.endpoint());
            assert_eq!(m.ca_pin, cluster.ca_pin());
            server.shutdown().await;
            cluster.shutdown().await;
        });
    }
}
