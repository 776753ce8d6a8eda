//! Built-in controllers: the kubelet-client CSR approver and signer, the
//! bootstrap signer of `cluster-info` with the token cleaner, and the node
//! lifecycle controller (stale Lease → Ready=Unknown + unreachable taints).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

use crate::error::{ApiStatus, ClusterError};
use crate::pki::Ca;
use crate::store::{Change, EventType, Store, NODE_LEASE_NAMESPACE};
use crate::{auth, ipam, pod_controllers, tokens, util};

pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
const CSRS: &str = "certificatesigningrequests";
/// How often expired tokens are removed and cluster-info re-signed.
const TOKEN_SWEEP: Duration = Duration::from_secs(30);
/// Budget status work, and cluster-info's signatures, are batched over
/// this long after a change: a burst of changes is one pass (1,000 tokens
/// minted for a scale-out were 1,000 passes, each signing every token).
const BATCH: Duration = Duration::from_millis(200);
/// A removed token's signature is taken out of cluster-info within this
/// long: 1,000 nodes registering retire their tokens one by one, and each
/// batch signed every token left and wrote the whole ConfigMap again (on
/// PostgreSQL three copies of it). The token itself is gone at once; its
/// signature only lets its holder check the CA a little longer.
const RETIRED_SIGNATURES_WITHIN: Duration = Duration::from_secs(2);
/// Every budget is computed again this often (evictions whose pod was not
/// deleted expire), and pods bound to missing nodes are looked for.
const BUDGET_RECHECK: Duration = Duration::from_secs(10);

pub struct Controllers {
    pub store: Arc<Store>,
    pub ca: Arc<Ca>,
    pub endpoint: String,
    pub cert_ttl: Duration,
    pub grace: Duration,
    pub pod_cidrs: crate::ipam::PodCidrs,
}

/// The store work a change asks of the controllers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChangeStep {
    /// A CSR added or changed: approve and sign, or deny.
    Csr,
    /// A Node registered: its bootstrap tokens retired, a pod CIDR given.
    NodeAdded,
    /// A Node without a pod CIDR: one given.
    PodCidr,
    /// A namespace being deleted: its objects removed, then itself.
    FinishNamespace,
    /// A Node deleted: its Lease and its pods collected.
    NodeDeleted,
}

/// What `c` asks of the store, if anything. Pure: the caller only hands its
/// worker off (block_in_place) when there is work.
/// With `cidrs_full` (the pod CIDR range had none left at the last try,
/// and no Node was deleted since), a Node without one is not tried again
/// on each of its changes (each try reads every Node).
fn change_step(c: &Change, cidrs_full: bool) -> Option<ChangeStep> {
    match (c.resource.as_str(), c.kind) {
        (CSRS, EventType::Added | EventType::Modified) => Some(ChangeStep::Csr),
        ("nodes", EventType::Added) => Some(ChangeStep::NodeAdded),
        ("nodes", EventType::Modified) if !cidrs_full && !ipam::has_pod_cidr(&c.object) => {
            Some(ChangeStep::PodCidr)
        }
        ("namespaces", EventType::Added | EventType::Modified)
            if !c.object["metadata"]["deletionTimestamp"].is_null() =>
        {
            Some(ChangeStep::FinishNamespace)
        }
        ("nodes", EventType::Deleted) => Some(ChangeStep::NodeDeleted),
        _ => None,
    }
}

/// How soon cluster-info is signed again after `c`, if `c` may change
/// which tokens sign it (a kube-system Secret added, changed or removed):
/// in the next batch, or for a removal within
/// [`RETIRED_SIGNATURES_WITHIN`]. A token bound to its node (only its
/// annotations changed) signs as before.
fn cluster_info_due(c: &Change) -> Option<Duration> {
    if c.resource != "secrets" || c.namespace != "kube-system" {
        return None;
    }
    let same_data = |p: &Value| p["type"] == c.object["type"] && p["data"] == c.object["data"];
    match c.kind {
        EventType::Deleted => Some(RETIRED_SIGNATURES_WITHIN),
        EventType::Modified if c.previous.as_deref().is_some_and(same_data) => None,
        EventType::Added | EventType::Modified => Some(BATCH),
    }
}

impl Controllers {
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut feed = self.store.subscribe();
        // Store work (SQLite) blocks: block_in_place hands this worker's
        // other tasks to another thread meanwhile.
        let mut view = tokio::task::block_in_place(|| self.resync());
        let monitor = (self.grace / 8).clamp(Duration::from_millis(100), Duration::from_secs(5));
        let mut node_tick = tokio::time::interval(monitor);
        node_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut token_tick = tokio::time::interval(TOKEN_SWEEP);
        let mut last_check = Instant::now();
        // Namespaces whose budgets need their status computed again,
        // batched: a burst of pod changes is one pass.
        let mut dirty: HashSet<String> = HashSet::new();
        let mut budget_tick = tokio::time::interval(BATCH);
        budget_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A token was added or removed since cluster-info was last signed:
        // when to sign it again (the timer is armed only then).
        let mut sign_at: Option<tokio::time::Instant> = None;
        let sign_timer = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(sign_timer);
        let mut recheck_tick = tokio::time::interval(BUDGET_RECHECK);
        recheck_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut orphans = HashMap::new();
        // The pod CIDR range had none left (see `change_step`).
        let mut cidrs_full = false;
        loop {
            let result = tokio::select! {
                _ = shutdown.changed() => return,
                _ = budget_tick.tick(), if !dirty.is_empty() => {
                    let namespaces: Vec<String> = dirty.drain().collect();
                    tokio::task::block_in_place(|| {
                        for ns in namespaces {
                            match pod_controllers::sync_budgets(&self.store, &ns) {
                                Ok(false) => {}
                                Ok(true) => {
                                    dirty.insert(ns);
                                }
                                Err(e) => {
                                    dirty.insert(ns);
                                    return Err(e);
                                }
                            }
                        }
                        Ok(())
                    })
                }
                _ = &mut sign_timer, if sign_at.is_some() => {
                    let r = tokio::task::block_in_place(|| self.sync_cluster_info());
                    // Failed: tried again in the next batch.
                    sign_at = r.is_err().then(|| tokio::time::Instant::now() + BATCH);
                    if let Some(at) = sign_at {
                        sign_timer.as_mut().reset(at);
                    }
                    r
                }
                _ = recheck_tick.tick() => tokio::task::block_in_place(|| {
                    dirty.extend(pod_controllers::budget_namespaces(&self.store)?);
                    for ns in self.store.list("namespaces", None)?.0 {
                        if !ns["metadata"]["deletionTimestamp"].is_null() {
                            pod_controllers::finish_namespace(&self.store, util::name_of(&ns))?;
                        }
                    }
                    let known = |n: &str| view.nodes.contains_key(n);
                    pod_controllers::sweep_orphans(&self.store, &known, &mut orphans)
                }),
                _ = node_tick.tick() => {
                    // A check far later than its interval means this process
                    // could not run (frozen, starved): the API could not take
                    // renewals either, so that time is nobody's fault and
                    // every node gets its grace period afresh.
                    let late = last_check.elapsed();
                    if late > monitor + self.grace / 2 {
                        tracing::warn!(late_ms = late.as_millis() as u64, "node lifecycle check ran late (the control plane was stalled): every node gets a fresh grace period");
                        view.refresh_all();
                    }
                    let r = tokio::task::block_in_place(|| {
                        view.observe_leases(&self.store)?;
                        self.check_nodes(&view)
                    });
                    last_check = Instant::now();
                    r
                }
                _ = token_tick.tick() => tokio::task::block_in_place(|| self.sweep_tokens()),
                r = feed.recv() => match r {
                    Ok(c) => {
                        view.apply(&c);
                        if pod_controllers::affects_budgets(&c.resource) {
                            dirty.insert(c.namespace.clone());
                        }
                        if let Some(due) = cluster_info_due(&c) {
                            let at = tokio::time::Instant::now() + due;
                            if sign_at.is_none_or(|t| at < t) {
                                sign_at = Some(at);
                                sign_timer.as_mut().reset(at);
                            }
                        }
                        // Most changes (a Lease renewed, a pod's status)
                        // need no store work: no hand-off of this worker
                        // for them (100 a second at 1,000 nodes).
                        match change_step(&c, cidrs_full) {
                            Some(step) => tokio::task::block_in_place(|| {
                                self.run_step(step, &c, cidrs_full)
                            })
                            .map(|allocated| {
                                cidrs_full = self.cidrs_full_after(cidrs_full, step, allocated, &c.name);
                            }),
                            None => Ok(()),
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        view = tokio::task::block_in_place(|| self.resync());
                        Ok(())
                    }
                    // The store restarted its feed: it missed changes (a
                    // server far behind the others on PostgreSQL).
                    Err(broadcast::error::RecvError::Closed) => {
                        feed = self.store.subscribe();
                        view = tokio::task::block_in_place(|| self.resync());
                        Ok(())
                    }
                },
            };
            if let Err(e) = result {
                tracing::warn!(code = e.code(), error = %e, "controller step failed; retried on the next change or tick");
            }
        }
    }

    /// Does the store work of one change (see [`change_step`]); what a
    /// pod CIDR allocation found, if one was tried.
    fn run_step(
        &self,
        step: ChangeStep,
        c: &Change,
        cidrs_full: bool,
    ) -> Result<Option<ipam::Allocated>, ClusterError> {
        let none = |r: Result<(), ClusterError>| r.map(|()| None);
        match step {
            ChangeStep::Csr => none(self.reconcile_csr(&c.name)),
            ChangeStep::NodeAdded => {
                self.retire_tokens_of(&c.name)?;
                if ipam::has_pod_cidr(&c.object) || cidrs_full {
                    Ok(None)
                } else {
                    ipam::allocate(&self.store, &self.pod_cidrs, &c.name).map(Some)
                }
            }
            ChangeStep::PodCidr => ipam::allocate(&self.store, &self.pod_cidrs, &c.name).map(Some),
            ChangeStep::FinishNamespace => {
                none(pod_controllers::finish_namespace(&self.store, &c.name))
            }
            ChangeStep::NodeDeleted => none(
                self.collect_lease(&c.name)
                    .and_then(|()| pod_controllers::collect_node_pods(&self.store, &c.name)),
            ),
        }
    }

    /// Whether the pod CIDR range is full after `step`: found full by an
    /// allocation (said once, as kube-controller-manager's
    /// `CIDRNotAvailable`), free again once a Node is deleted (its CIDR is
    /// free: the next change of a Node without one tries again).
    fn cidrs_full_after(
        &self,
        full: bool,
        step: ChangeStep,
        allocated: Option<ipam::Allocated>,
        node: &str,
    ) -> bool {
        match (step, allocated) {
            (_, Some(ipam::Allocated::RangeFull)) => {
                if !full {
                    tracing::warn!(
                        node,
                        range = %self.pod_cidrs,
                        "CIDRNotAvailable: no pod CIDR left in the range for the node; nodes without one are given one after a node is deleted"
                    );
                }
                true
            }
            (ChangeStep::NodeDeleted, _) => false,
            _ => full,
        }
    }

    /// Reconcile every CSR and cluster-info, and rebuild the node view.
    fn resync(&self) -> NodeView {
        let view = NodeView::load(&self.store).unwrap_or_else(|e| {
            tracing::warn!(code = e.code(), error = %e, "reading nodes and leases failed; the next changes fill the view");
            NodeView::default()
        });
        let csrs = self.store.list(CSRS, None).map(|(items, _)| items);
        let result = csrs.and_then(|items| {
            for c in items {
                self.reconcile_csr(util::name_of(&c))?;
            }
            for ns in self.store.list("namespaces", None)?.0 {
                pod_controllers::finish_namespace(&self.store, util::name_of(&ns))?;
            }
            for n in self.store.list_shared("nodes", None)?.0 {
                if !ipam::has_pod_cidr(&n)
                    && ipam::allocate(&self.store, &self.pod_cidrs, util::name_of(&n))?
                        == ipam::Allocated::RangeFull
                {
                    tracing::warn!(range = %self.pod_cidrs, "CIDRNotAvailable: no pod CIDR left in the range for the nodes without one");
                    break;
                }
            }
            self.sync_cluster_info()
        });
        if let Err(e) = result {
            tracing::warn!(code = e.code(), error = %e, "controller resync failed");
        }
        view
    }

    // ---- CSR approver and signer ----

    pub fn reconcile_csr(&self, name: &str) -> Result<(), ClusterError> {
        // As this server has it (at least the change that woke this
        // pass): every write below checks the stored object again.
        let Some(csr) = self.store.get_seen(CSRS, "", name)? else {
            return Ok(());
        };
        let signer = csr["spec"]["signerName"].as_str().unwrap_or("");
        let has = |t: &str| {
            csr["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == t && c["status"] != "False"))
        };
        let issued = csr["status"]["certificate"]
            .as_str()
            .is_some_and(|c| !c.is_empty());
        if has("Denied")
            || has("Failed")
            || issued
            || (signer != KUBELET_CLIENT_SIGNER && signer != CLIENT_SIGNER)
        {
            return Ok(());
        }
        let pem = STANDARD
            .decode(csr["spec"]["request"].as_str().unwrap_or(""))
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        let subject_problem = if signer == KUBELET_CLIENT_SIGNER {
            kubelet_subject_problem(&csr, &pem)
        } else {
            None
        };
        // Approved by this pass: recorded with the certificate, in one
        // write (one round trip on PostgreSQL, one change for watchers).
        let mut approved_now = None;
        if !has("Approved") {
            if signer != KUBELET_CLIENT_SIGNER {
                return Ok(()); // an admin approves these by hand
            }
            match self.approval(&csr, subject_problem.as_deref()) {
                Decision::Pending => return Ok(()),
                Decision::Deny(why) => {
                    return self.add_condition(name, "Denied", "KnitDenied", &why)
                }
                Decision::Approve(why) => approved_now = Some(why),
            }
        }
        let fail = |why: &str| -> Result<(), ClusterError> {
            if let Some(approved) = &approved_now {
                self.add_condition(name, "Approved", "AutoApproved", approved)?;
            }
            self.add_condition(name, "Failed", "SignerValidationFailure", why)
        };
        if let Some(problem) = subject_problem {
            return fail(&problem);
        }
        let mut ttl = self.cert_ttl;
        if let Some(s) = csr["spec"]["expirationSeconds"].as_u64() {
            ttl = ttl.min(Duration::from_secs(s));
        }
        let cert = match self.ca.sign_client_csr(&pem, ttl) {
            Ok(c) => c,
            Err(e) => return fail(&e.to_string()),
        };
        // Recorded before it is handed out: deleting the Node revokes it.
        if let Some(c) = crate::pki::pem_cert_identity(&cert) {
            if let Some(node) = c.common_name.strip_prefix(auth::NODE_PREFIX) {
                self.store.record_node_cert(&c.serial, node, c.not_after)?;
            }
        }
        let now = util::now_rfc3339();
        // Whether this pass's certificate was written (not another's kept).
        let mut ours = false;
        self.store
            .update(CSRS, "", name, None, |cur| {
                // Another server sharing the datastore may have signed it
                // first: its certificate stays (the kubelet may hold it).
                ours = cur["status"]["certificate"]
                    .as_str()
                    .is_none_or(str::is_empty);
                if !ours {
                    return Ok(cur.clone());
                }
                let mut next = match &approved_now {
                    Some(why) => with_condition(cur, "Approved", "AutoApproved", why, &now)
                        .unwrap_or_else(|| cur.clone()),
                    None => cur.clone(),
                };
                util::field_mut(&mut next, "status")
                    .insert("certificate".into(), json!(STANDARD.encode(&cert)));
                Ok(next)
            })
            .map_err(ClusterError::Api)?;
        if !ours {
            tracing::debug!(
                csr = name,
                "another server issued its certificate first: that one is kept"
            );
            return Ok(());
        }
        if let Some(why) = &approved_now {
            tracing::info!(
                csr = name,
                condition = "Approved",
                message = why,
                "CSR decision"
            );
        }
        tracing::info!(csr = name, signer, "issued certificate");
        Ok(())
    }

    fn approval(&self, csr: &Value, subject_problem: Option<&str>) -> Decision {
        let user = csr["spec"]["username"].as_str().unwrap_or("");
        let groups: Vec<&str> = csr["spec"]["groups"]
            .as_array()
            .map(|g| g.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let cn = util_cn(csr);
        let node = cn.strip_prefix(auth::NODE_PREFIX).unwrap_or("");
        if let Some(token_id) = user.strip_prefix("system:bootstrap:") {
            if !groups.contains(&tokens::BOOTSTRAPPERS) {
                return Decision::Pending;
            }
            if let Some(p) = subject_problem {
                return Decision::Deny(p.to_string());
            }
            // As this server has it: the CSR's creator was authenticated
            // with the token read from the datastore.
            let secret =
                match self
                    .store
                    .get_seen("secrets", "kube-system", &tokens::secret_name(token_id))
                {
                    Ok(Some(s)) => s,
                    Ok(None) => {
                        return Decision::Deny(format!(
                            "bootstrap token {token_id} no longer exists"
                        ))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reading bootstrap token for CSR approval");
                        return Decision::Pending;
                    }
                };
            if let Err(why) = tokens::check_usable(&secret, "usage-bootstrap-authentication") {
                return Decision::Deny(format!("bootstrap token {token_id}: {why}"));
            }
            // An unbound token (a manual attach's) is bound to the first
            // node name it is approved for, in one write: whichever CSR
            // binds it first, every other name is refused afterwards.
            let bound = match tokens::bound_node(&secret) {
                Some(b) => b.to_string(),
                None => match self.bind_token(token_id, node) {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(error = %e, "binding bootstrap token {token_id} to node {node:?}");
                        return Decision::Pending;
                    }
                },
            };
            return if bound != node {
                Decision::Deny(format!(
                    "bootstrap token {token_id} was issued for node {bound:?}, not {node:?}"
                ))
            } else {
                Decision::Approve(format!("knit approved: kubelet client certificate for node {node:?} requested with bootstrap token {token_id}"))
            };
        }
        if user == cn && groups.contains(&auth::NODES) && subject_problem.is_none() {
            return Decision::Approve(format!(
                "knit approved: node {node:?} renewing its own client certificate"
            ));
        }
        Decision::Pending
    }

    fn add_condition(
        &self,
        name: &str,
        kind: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), ClusterError> {
        let now = util::now_rfc3339();
        self.store
            .update(CSRS, "", name, None, |cur| {
                Ok(with_condition(cur, kind, reason, message, &now).unwrap_or_else(|| cur.clone()))
            })
            .map_err(ClusterError::Api)?;
        tracing::info!(csr = name, condition = kind, message, "CSR decision");
        Ok(())
    }

    /// Binds the token `token_id` to `node` unless it is bound already;
    /// the node name it is bound to after the write.
    fn bind_token(&self, token_id: &str, node: &str) -> Result<String, ApiStatus> {
        let secret = self.store.update(
            "secrets",
            "kube-system",
            &tokens::secret_name(token_id),
            None,
            |cur| {
                if tokens::bound_node(cur).is_some() {
                    return Ok(cur.clone());
                }
                let mut next = cur.clone();
                let meta = util::field_mut(&mut next, "metadata");
                let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
                if let Some(a) = annotations.as_object_mut() {
                    a.insert(tokens::NODE_ANNOTATION.into(), json!(node));
                } else {
                    *annotations = json!({ tokens::NODE_ANNOTATION: node });
                }
                Ok(next)
            },
        )?;
        tokens::bound_node(&secret)
            .map(str::to_string)
            .ok_or_else(|| {
                ApiStatus::conflict(format!("bootstrap token {token_id} stayed unbound"))
            })
    }

    /// Deletes the bootstrap tokens bound to `node`: its Node registered
    /// (the kubelet holds its own certificate) and the token has no more
    /// use; kept, it would let a removed node get a fresh certificate.
    fn retire_tokens_of(&self, node: &str) -> Result<(), ClusterError> {
        crate::delete_tokens_bound_to(&self.store, node).map(|_| ())
    }

    // ---- bootstrap signer and token cleaner ----

    pub fn sync_cluster_info(&self) -> Result<(), ClusterError> {
        sync_cluster_info(&self.store, &self.ca, &self.endpoint)
    }

    fn sweep_tokens(&self) -> Result<(), ClusterError> {
        let (secrets, _) = self.store.list_shared("secrets", Some("kube-system"))?;
        for s in secrets {
            if s["type"].as_str() != Some(tokens::SECRET_TYPE) {
                continue;
            }
            let expired = tokens::data_field(&s, "expiration")
                .and_then(|e| util::parse_time(&e))
                .is_some_and(|t| t <= util::now());
            // A token whose node has registered is spent (a missed change,
            // or a Node registered through another server).
            let joined = match tokens::bound_node(&s) {
                // Memory is enough: a Node it has not seen yet, the next
                // sweep sees.
                Some(node) => self.store.get_served("nodes", "", node, Some(0))?.is_some(),
                None => false,
            };
            if expired || joined {
                let name = util::name_of(&s);
                match self.store.delete("secrets", "kube-system", name) {
                    Ok(_) if expired => {
                        tracing::info!(secret = name, "deleted expired bootstrap token")
                    }
                    Ok(_) => tracing::info!(
                        secret = name,
                        "deleted the bootstrap token of a joined node"
                    ),
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(ClusterError::Api(e)),
                }
            }
        }
        Ok(())
    }

    // ---- node lifecycle ----

    /// Node leases are owned by their Node: delete follows.
    fn collect_lease(&self, node: &str) -> Result<(), ClusterError> {
        match self.store.delete("leases", NODE_LEASE_NAMESPACE, node) {
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 => Ok(()),
            Err(e) => Err(ClusterError::Api(e)),
        }
    }

    fn check_nodes(&self, view: &NodeView) -> Result<(), ClusterError> {
        for (name, facts) in &view.nodes {
            // When this server last saw the node's lease renewed (or the
            // node appear): its own clock, as kube-controller-manager's
            // probe time, so the nodes' clocks do not matter.
            let last = view
                .renewed
                .get(name)
                .map(|r| r.seen)
                .unwrap_or(facts.seen)
                .max(facts.seen);
            let stale = last.elapsed() > self.grace;
            if stale == facts.unknown && facts.taints_ok {
                continue;
            }
            let result = self.store.update("nodes", "", name, None, |cur| {
                let mut next = cur.clone();
                if stale && ready_of(&next) != Some("Unknown") {
                    mark_unknown(&mut next);
                    tracing::warn!(node = %name, grace = ?self.grace, "node lease not renewed within the grace period: Ready=Unknown");
                }
                set_condition_taints(&mut next);
                Ok(next)
            });
            match result {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(ClusterError::Api(e)),
            }
        }
        Ok(())
    }
}

/// What the node lifecycle check needs: the Nodes kept up to date from the
/// change feed so that a check does not re-read and parse every Node, the
/// Lease renewals observed on the check's tick (they are not in the feed).
#[derive(Default)]
struct NodeView {
    nodes: HashMap<String, NodeFacts>,
    /// Lease renewals per node name (kube-node-lease).
    renewed: HashMap<String, Renewal>,
}

struct Renewal {
    /// The lease's renewTime as the node wrote it.
    renew_time: time::OffsetDateTime,
    /// When this server saw that renewTime first (up to a check's interval
    /// after it was written: a node gets that much more grace).
    seen: Instant,
}

struct NodeFacts {
    unknown: bool,
    taints_ok: bool,
    /// When this server first saw the node (or last gave it a fresh grace).
    seen: Instant,
}

impl NodeFacts {
    fn of(node: &Value, seen: Instant) -> NodeFacts {
        NodeFacts {
            unknown: ready_of(node) == Some("Unknown"),
            taints_ok: taints_match(node),
            seen,
        }
    }
}

fn renew_time(lease: &Value) -> Option<time::OffsetDateTime> {
    lease["spec"]["renewTime"]
        .as_str()
        .and_then(util::parse_time)
}

impl NodeView {
    /// At start (and after a resync) every node gets a full grace period,
    /// as kube-controller-manager gives after its own restart.
    fn load(store: &Store) -> Result<NodeView, ClusterError> {
        let now = Instant::now();
        let mut v = NodeView::default();
        for n in store.list("nodes", None)?.0 {
            v.nodes
                .insert(util::name_of(&n).to_string(), NodeFacts::of(&n, now));
        }
        v.observe_leases(store)?;
        Ok(v)
    }

    /// Reads the node Leases kept in memory: a renewTime not seen before
    /// is a renewal, seen now (kube-controller-manager's probe time); a
    /// Lease gone is forgotten.
    fn observe_leases(&mut self, store: &Store) -> Result<(), ClusterError> {
        let now = Instant::now();
        let mut renewed = HashMap::with_capacity(self.renewed.len());
        for lease in store.list_shared("leases", Some(NODE_LEASE_NAMESPACE))?.0 {
            let Some(t) = renew_time(&lease) else {
                continue;
            };
            let name = util::name_of(&lease);
            let seen = match self.renewed.get(name) {
                Some(r) if r.renew_time == t => r.seen,
                _ => now,
            };
            renewed.insert(
                name.to_string(),
                Renewal {
                    renew_time: t,
                    seen,
                },
            );
        }
        self.renewed = renewed;
        Ok(())
    }

    /// Every node's grace period starts again now.
    fn refresh_all(&mut self) {
        let now = Instant::now();
        for f in self.nodes.values_mut() {
            f.seen = now;
        }
        for r in self.renewed.values_mut() {
            r.seen = now;
        }
    }

    fn apply(&mut self, c: &Change) {
        if c.resource != "nodes" {
            return;
        }
        if c.kind == EventType::Deleted {
            self.nodes.remove(&c.name);
        } else {
            let seen = self
                .nodes
                .get(&c.name)
                .map_or_else(Instant::now, |f| f.seen);
            self.nodes
                .insert(c.name.clone(), NodeFacts::of(&c.object, seen));
        }
    }
}

/// Adds `token`'s signature to cluster-info, so that its holder can
/// discover the cluster at once: one entry written, not every token signed
/// again (the controllers' next batch makes the whole set, the token's
/// Secret being a change). Without a cluster-info yet, the whole is made.
pub fn sign_cluster_info_for(
    store: &Store,
    ca: &Ca,
    endpoint: &str,
    token: &tokens::BootstrapToken,
) -> Result<(), ClusterError> {
    let kubeconfig = tokens::cluster_info_kubeconfig(endpoint, ca.cert_pem());
    let jws = tokens::jws_detached(&kubeconfig, &token.id, &token.secret);
    let signed = store.update("configmaps", "kube-public", "cluster-info", None, |cur| {
        let mut next = cur.clone();
        let data = util::field_mut(&mut next, "data");
        data.insert("kubeconfig".into(), json!(kubeconfig));
        data.insert(format!("jws-kubeconfig-{}", token.id), json!(jws));
        Ok(next)
    });
    match signed {
        Ok(_) => Ok(()),
        Err(e) if e.code == 404 => sync_cluster_info(store, ca, endpoint),
        Err(e) => Err(ClusterError::Api(e)),
    }
}

/// Rewrite `kube-public/cluster-info`: the kubeconfig and one JWS per
/// signing-enabled token.
pub fn sync_cluster_info(store: &Store, ca: &Ca, endpoint: &str) -> Result<(), ClusterError> {
    let kubeconfig = tokens::cluster_info_kubeconfig(endpoint, ca.cert_pem());
    let mut data = serde_json::Map::new();
    data.insert("kubeconfig".into(), json!(kubeconfig));
    let (secrets, listed_at) = store.list_shared("secrets", Some("kube-system"))?;
    for s in &secrets {
        if tokens::check_usable(s, "usage-bootstrap-signing").is_err() {
            continue;
        }
        if let (Some(id), Some(secret)) = (
            tokens::data_field(s, "token-id"),
            tokens::data_field(s, "token-secret"),
        ) {
            data.insert(
                format!("jws-kubeconfig-{id}"),
                json!(tokens::jws_detached(&kubeconfig, &id, &secret)),
            );
        }
    }
    let data = Value::Object(data);
    let cm = json!({
        "kind": "ConfigMap", "apiVersion": "v1",
        "metadata": {"name": "cluster-info", "namespace": "kube-public"},
        "data": data,
    });
    match store.update("configmaps", "kube-public", "cluster-info", None, |cur| {
        Ok(next_cluster_info(cur, &data, listed_at))
    }) {
        Ok(_) => Ok(()),
        Err(e) if e.code == 404 => match store.create("configmaps", "kube-public", cm) {
            // Another server sharing the datastore created it meanwhile:
            // its next sync (every token change) brings the data.
            Ok(_) => Ok(()),
            Err(e) if e.code == 409 => Ok(()),
            Err(e) => Err(ClusterError::Api(e)),
        },
        Err(e) => Err(ClusterError::Api(e)),
    }
}

/// cluster-info `cur` with the `data` signed from the token Secrets
/// listed at `listed_at`.
fn next_cluster_info(cur: &Value, data: &Value, listed_at: u64) -> Value {
    let mut next = cur.clone();
    next["data"] = data.clone();
    // Written since the Secrets were listed: a token made meanwhile signed
    // it (`sign_cluster_info_for`), and its holder may be reading it now.
    // Its signature stays; the batch its Secret starts makes the whole set
    // again.
    if util::rv_of(cur).is_some_and(|rv| rv > listed_at) {
        if let (Some(kept), Some(new)) = (cur["data"].as_object(), next["data"].as_object_mut()) {
            for (key, jws) in kept {
                if key.starts_with("jws-kubeconfig-") {
                    new.entry(key.clone()).or_insert_with(|| jws.clone());
                }
            }
        }
    }
    next
}

enum Decision {
    Approve(String),
    Deny(String),
    Pending,
}

/// `csr` with a condition of type `kind` added (status True), or None when
/// it has one of that type already: added once, whichever server sharing
/// the datastore decided first.
fn with_condition(
    csr: &Value,
    kind: &str,
    reason: &str,
    message: &str,
    now: &str,
) -> Option<Value> {
    let mut next = csr.clone();
    let status = util::field_mut(&mut next, "status");
    let conds = status.entry("conditions").or_insert_with(|| json!([]));
    let list = conds.as_array_mut()?;
    if list.iter().any(|c| c["type"] == kind) {
        return None;
    }
    list.push(json!({
        "type": kind, "status": "True", "reason": reason, "message": message,
        "lastUpdateTime": now, "lastTransitionTime": now,
    }));
    Some(next)
}

fn util_cn(csr: &Value) -> String {
    let pem = STANDARD
        .decode(csr["spec"]["request"].as_str().unwrap_or(""))
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default();
    crate::pki::parse_csr(&pem)
        .map(|s| s.common_name)
        .unwrap_or_default()
}

/// Why a CSR does not qualify for the kubelet client signer, if it does not.
fn kubelet_subject_problem(csr: &Value, pem: &str) -> Option<String> {
    let subject = match crate::pki::parse_csr(pem) {
        Ok(s) => s,
        Err(e) => return Some(e.to_string()),
    };
    if !subject.common_name.starts_with(auth::NODE_PREFIX)
        || subject.common_name.len() == auth::NODE_PREFIX.len()
    {
        return Some(format!(
            "subject CN {:?} must be system:node:<name>",
            subject.common_name
        ));
    }
    let node = &subject.common_name[auth::NODE_PREFIX.len()..];
    if !knit_api::validate::is_dns_subdomain(node) {
        return Some(format!(
            "node name {node:?} in the subject CN is not a lowercase RFC 1123 subdomain"
        ));
    }
    if subject.organizations != [auth::NODES] {
        return Some(format!(
            "subject O {:?} must be exactly [\"system:nodes\"]",
            subject.organizations
        ));
    }
    if subject.has_sans {
        return Some(
            "kubelet client certificates may not request subject alternative names".into(),
        );
    }
    let allowed = ["digital signature", "key encipherment", "client auth"];
    let usages: Vec<&str> = csr["spec"]["usages"]
        .as_array()
        .map(|u| u.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !usages.contains(&"client auth") || usages.iter().any(|u| !allowed.contains(u)) {
        return Some(format!(
            "usages {usages:?} must include \"client auth\" and only {allowed:?}"
        ));
    }
    None
}

fn ready_of(node: &Value) -> Option<&str> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?["status"]
        .as_str()
}

fn mark_unknown(node: &mut Value) {
    let now = util::now_rfc3339();
    let status = util::field_mut(node, "status");
    let conds = status.entry("conditions").or_insert_with(|| json!([]));
    let Some(list) = conds.as_array_mut() else {
        return;
    };
    if !list.iter().any(|c| c["type"] == "Ready") {
        list.push(json!({"type": "Ready"}));
    }
    for c in list.iter_mut() {
        if c["status"] != "Unknown" {
            c["lastTransitionTime"] = json!(now);
        }
        c["status"] = json!("Unknown");
        c["reason"] = json!("NodeStatusUnknown");
        c["message"] = json!("Kubelet stopped posting node status.");
    }
}

/// The taints the Ready condition implies: unreachable for Unknown,
/// not-ready for False, none for True.
fn wanted_taint(node: &Value) -> Option<&'static str> {
    match ready_of(node) {
        Some("True") => None,
        Some("False") => Some(NOT_READY_TAINT),
        _ => Some(UNREACHABLE_TAINT),
    }
}

fn taints_match(node: &Value) -> bool {
    let want = wanted_taint(node);
    let empty = Vec::new();
    let taints = node["spec"]["taints"].as_array().unwrap_or(&empty);
    [UNREACHABLE_TAINT, NOT_READY_TAINT].iter().all(|k| {
        let present = taints.iter().filter(|t| t["key"] == *k).count();
        if want == Some(k) {
            present == 2
        } else {
            present == 0
        }
    })
}

fn set_condition_taints(node: &mut Value) {
    let want = wanted_taint(node);
    let now = util::now_rfc3339();
    let spec = util::field_mut(node, "spec");
    let taints = spec.entry("taints").or_insert_with(|| json!([]));
    let Some(list) = taints.as_array_mut() else {
        return;
    };
    list.retain(|t| {
        let k = t["key"].as_str().unwrap_or("");
        !((k == UNREACHABLE_TAINT || k == NOT_READY_TAINT) && Some(k) != want)
    });
    if let Some(k) = want {
        for effect in ["NoSchedule", "NoExecute"] {
            if !list.iter().any(|t| t["key"] == k && t["effect"] == effect) {
                let mut t = json!({"key": k, "effect": effect});
                if effect == "NoExecute" {
                    t["timeAdded"] = json!(now);
                }
                list.push(t);
            }
        }
    }
    if list.is_empty() {
        spec.remove("taints");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(resource: &str, namespace: &str, kind: EventType, object: Value) -> Change {
        Change {
            kind,
            resource: resource.into(),
            namespace: namespace.into(),
            name: "n1".into(),
            rv: 7,
            object: Arc::new(object),
            previous: None,
        }
    }

    /// A signature written after the token Secrets were listed (a token
    /// made meanwhile) stays; one written before them is replaced by the
    /// set signed from the list.
    #[test]
    fn cluster_info_keeps_a_signature_newer_than_the_list() {
        let info = |rv: u64, data: Value| {
            json!({"metadata": {"name": "cluster-info", "namespace": "kube-public",
                                "resourceVersion": rv.to_string()}, "data": data})
        };
        let signed = json!({"kubeconfig": "k", "jws-kubeconfig-aaaaaa": "a2"});
        let cur = info(
            12,
            json!({"kubeconfig": "k", "jws-kubeconfig-aaaaaa": "a1",
                                  "jws-kubeconfig-bbbbbb": "b1", "other": "x"}),
        );
        let next = next_cluster_info(&cur, &signed, 10);
        assert_eq!(
            next["data"],
            json!({"kubeconfig": "k", "jws-kubeconfig-aaaaaa": "a2", "jws-kubeconfig-bbbbbb": "b1"}),
            "the new token's signature stays, the listed ones are signed anew"
        );
        let next = next_cluster_info(&cur, &signed, 12);
        assert_eq!(
            next["data"], signed,
            "written before the list: the list's set alone (a retired token's signature goes)"
        );
    }

    #[test]
    fn only_changes_with_store_work_get_a_step() {
        let lease = json!({"spec": {"renewTime": "2026-12-04T09:00:00.000000Z"}});
        let renewed = change("leases", NODE_LEASE_NAMESPACE, EventType::Modified, lease);
        assert_eq!(
            change_step(&renewed, false),
            None,
            "a Lease renewal needs no store work"
        );
        let with_cidr = json!({"spec": {"podCIDR": "10.0.1.0/24"}});
        let without = json!({"spec": {}});
        let modified = change("nodes", "", EventType::Modified, with_cidr.clone());
        assert_eq!(
            change_step(&modified, false),
            None,
            "a status update of a Node with its CIDR"
        );
        let needs_cidr = change("nodes", "", EventType::Modified, without);
        assert_eq!(change_step(&needs_cidr, false), Some(ChangeStep::PodCidr));
        assert_eq!(
            change_step(&needs_cidr, true),
            None,
            "not tried on each change while the pod CIDR range is full"
        );
        let added = change("nodes", "", EventType::Added, with_cidr.clone());
        assert_eq!(change_step(&added, false), Some(ChangeStep::NodeAdded));
        let deleted = change("nodes", "", EventType::Deleted, with_cidr);
        assert_eq!(change_step(&deleted, false), Some(ChangeStep::NodeDeleted));
        assert_eq!(change_step(&deleted, true), Some(ChangeStep::NodeDeleted));
        let csr = change(CSRS, "", EventType::Added, json!({}));
        assert_eq!(change_step(&csr, false), Some(ChangeStep::Csr));
        let token = change("secrets", "kube-system", EventType::Added, json!({}));
        assert_eq!(
            change_step(&token, false),
            None,
            "a token's cluster-info signature is made in a batch"
        );
        assert_eq!(cluster_info_due(&token), Some(BATCH));
        let other_secret = change("secrets", "default", EventType::Added, json!({}));
        assert_eq!(change_step(&other_secret, false), None);
        assert_eq!(cluster_info_due(&other_secret), None);
        let going = json!({"metadata": {"deletionTimestamp": "2026-12-04T09:00:00Z"}});
        let ns = change("namespaces", "", EventType::Modified, going);
        assert_eq!(change_step(&ns, false), Some(ChangeStep::FinishNamespace));
        let pod = change("pods", "default", EventType::Modified, json!({}));
        assert_eq!(change_step(&pod, false), None);
    }

    /// A token added or changed is signed in the next batch, a removed
    /// one unsigned within a longer wait, and binding a token to its node
    /// (an annotation) signs nothing again.
    #[test]
    fn cluster_info_is_signed_again_only_when_a_tokens_data_changes() {
        let data = json!({"type": tokens::SECRET_TYPE, "data": {"token-id": "YWJjZGVm"}});
        let mut bound = data.clone();
        bound["metadata"] = json!({"annotations": {tokens::NODE_ANNOTATION: "n1"}});
        let modified = |previous: Option<&Value>, object: &Value| Change {
            previous: previous.cloned().map(Arc::new),
            ..change(
                "secrets",
                "kube-system",
                EventType::Modified,
                object.clone(),
            )
        };
        assert_eq!(cluster_info_due(&modified(Some(&data), &bound)), None);
        let mut expiring = bound.clone();
        expiring["data"]["expiration"] = json!("MjAyNi0xMi0wNVQwMDowMDowMFo=");
        assert_eq!(
            cluster_info_due(&modified(Some(&bound), &expiring)),
            Some(BATCH)
        );
        assert_eq!(
            cluster_info_due(&modified(None, &bound)),
            Some(BATCH),
            "without the object before, it may have changed"
        );
        let removed = change("secrets", "kube-system", EventType::Deleted, bound);
        assert_eq!(cluster_info_due(&removed), Some(RETIRED_SIGNATURES_WITHIN));
    }

    #[test]
    fn lease_renewals_are_observed_on_the_tick_not_fed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        let mut feed = store.subscribe();
        let lease = |t: &str| json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1", "renewTime": t}});
        store
            .create(
                "leases",
                NODE_LEASE_NAMESPACE,
                lease("2026-12-04T09:00:00Z"),
            )
            .unwrap();
        assert!(feed.try_recv().is_err(), "a node Lease wakes no controller");
        let mut view = NodeView::load(&store).unwrap();
        let first = view.renewed["n1"].seen;
        std::thread::sleep(Duration::from_millis(5));
        view.observe_leases(&store).unwrap();
        assert_eq!(
            view.renewed["n1"].seen, first,
            "the same renewTime is no renewal"
        );
        store
            .update("leases", NODE_LEASE_NAMESPACE, "n1", None, |_| {
                Ok(lease("2026-12-04T09:00:10Z"))
            })
            .unwrap();
        view.observe_leases(&store).unwrap();
        assert!(
            view.renewed["n1"].seen > first,
            "a new renewTime is a renewal"
        );
        store.delete("leases", NODE_LEASE_NAMESPACE, "n1").unwrap();
        view.observe_leases(&store).unwrap();
        assert!(view.renewed.is_empty(), "a Lease gone is forgotten");
        store.create("leases", "default", lease("x")).unwrap();
        assert_eq!(
            feed.try_recv().unwrap().resource,
            "leases",
            "other Leases are fed"
        );
    }

    #[test]
    fn condition_taints_follow_ready() {
        let mut n = json!({"spec": {"taints": [{"key": "pool", "effect": "NoSchedule"}]},
                           "status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        assert!(!taints_match(&n));
        set_condition_taints(&mut n);
        assert!(taints_match(&n));
        assert_eq!(n["spec"]["taints"].as_array().unwrap().len(), 3);
        mark_unknown(&mut n);
        assert_eq!(ready_of(&n), Some("Unknown"));
        set_condition_taints(&mut n);
        let keys: Vec<&str> = n["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap())
            .collect();
        assert_eq!(keys, vec!["pool", UNREACHABLE_TAINT, UNREACHABLE_TAINT]);
        n["status"]["conditions"][0]["status"] = json!("True");
        set_condition_taints(&mut n);
        assert_eq!(
            n["spec"]["taints"],
            json!([{"key": "pool", "effect": "NoSchedule"}])
        );
    }
}
