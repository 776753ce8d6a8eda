//! Labels and taints in place: a pool's `spec.labels` and `spec.taints`,
//! and the labels knit itself sets (the pool, the instance type, region and
//! zone), written onto the Node objects its nodes already have, within a
//! pass or two and with no new machine (ACK's "update labels and taints of
//! existing nodes").
//!
//! knit adds, changes and removes only the keys it set. Which those are is
//! written on the Node itself, in the same PATCH as the change:
//! [`MANAGED_LABELS`] lists the pool label keys, [`MANAGED_TAINTS`] the pool
//! taints as `key:Effect`. A label or taint a user put on the node by hand
//! is never in those lists, so it is never changed or removed (unless the
//! pool takes its key over); knit's own labels and the user-data gate taint
//! are never removed by the sync.
//!
//! Cheap at scale: one list of the Nodes when something changed (a pool, a
//! node's status, the cluster) or every [`RESYNC_EVERY`] otherwise; a PATCH
//! only for a Node that differs, [`PARALLEL_PATCHES`] at a time, each
//! bounded in time, so one misbehaving node never holds up the others.

use crate::bootstrap::{knit_labels, POOL_LABEL, ZONE_LABEL};
use crate::cluster::node_meta::{NodeMeta, NodePatched};
use crate::control::ControlPlane;
use crate::error::Result;
use crate::store::PoolRecord;
use futures_util::StreamExt;
use knit_api::state::EventType;
use knit_api::{Taint, USER_DATA_GATE_TAINT};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::cluster::seam::CLUSTER_CALL_TIMEOUT;

/// The annotation listing the label keys knit set from the pool
/// (comma-separated, sorted).
pub const MANAGED_LABELS: &str = "knit.dev/managed-labels";
/// The annotation listing the taints knit set from the pool, as
/// `key:Effect` (comma-separated, sorted).
pub const MANAGED_TAINTS: &str = "knit.dev/managed-taints";
/// How often the Nodes are compared when nothing seems to have changed (a
/// managed label removed by hand comes back).
pub const RESYNC_EVERY: Duration = Duration::from_secs(15);
/// Node patches in flight at once.
pub const PARALLEL_PATCHES: usize = 16;
/// How long one Node's patch (with its re-reads on conflict) may take.
const PATCH_TIMEOUT: Duration = Duration::from_secs(15);
/// Reads again after a conflict (the kubelet writes its Node too).
const CONFLICT_RETRIES: usize = 3;

/// What a node of a pool should carry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wanted {
    /// The pool's `spec.labels`.
    pub pool_labels: BTreeMap<String, String>,
    /// knit's own labels ([`knit_labels`]): set, never removed; they win
    /// over a pool label of the same key.
    pub knit_labels: BTreeMap<String, String>,
    /// The pool's `spec.taints`.
    pub taints: Vec<Taint>,
}

/// What one Node needs, from [`diff`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Change {
    /// Labels to set (added or changed), with their old value if any.
    pub set_labels: BTreeMap<String, (Option<String>, String)>,
    /// Label keys to remove (knit set them, the pool no longer has them).
    pub remove_labels: BTreeSet<String>,
    /// The whole new taint list, when it differs from the Node's.
    pub taints: Option<Vec<Value>>,
    pub added_taints: Vec<String>,
    pub removed_taints: Vec<String>,
    /// The managed-keys annotations to write (new values).
    pub annotations: BTreeMap<String, String>,
}

fn split_list(v: &str) -> BTreeSet<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn taint_id(key: &str, effect: &str) -> String {
    format!("{key}:{effect}")
}

fn value_taint_id(t: &Value) -> String {
    taint_id(
        t["key"].as_str().unwrap_or_default(),
        t["effect"].as_str().unwrap_or_default(),
    )
}

/// `key=value:Effect` (or `key:Effect`), as kubectl prints a taint.
fn value_taint_text(t: &Value) -> String {
    let key = t["key"].as_str().unwrap_or_default();
    let value = t["value"].as_str().unwrap_or_default();
    let effect = t["effect"].as_str().unwrap_or_default();
    if value.is_empty() {
        format!("{key}:{effect}")
    } else {
        format!("{key}={value}:{effect}")
    }
}

fn taint_value(t: &Taint) -> Value {
    let mut v = json!({"key": t.key, "effect": t.effect});
    if !t.value.is_empty() {
        v["value"] = json!(t.value);
    }
    v
}

/// Keys the sync never removes: knit's own labels (pool, well-known) and
/// what the kubelet registers of itself.
fn protected_label(key: &str) -> bool {
    key == POOL_LABEL
        || knit_api::validate::KUBELET_WELL_KNOWN_LABELS.contains(&key)
        || key.starts_with("kubernetes.io/")
        || key.starts_with("beta.kubernetes.io/")
}

/// What must change on `node` for it to carry `wanted`; `None` when it
/// already does. Pure: the labels, taints and managed-keys annotations of
/// the Node as read decide it.
///
/// A Node without the annotations (registered before knit recorded them)
/// counts as managing exactly what the pool wants now: nothing is removed
/// from it, and the annotations are written.
pub fn diff(wanted: &Wanted, node: &NodeMeta) -> Option<Change> {
    let mut change = Change::default();

    // Labels: the pool's, then knit's over them.
    let mut labels = wanted.pool_labels.clone();
    labels.extend(wanted.knit_labels.clone());
    let managed_now: BTreeSet<String> = wanted
        .pool_labels
        .keys()
        .filter(|k| !wanted.knit_labels.contains_key(*k) && !protected_label(k))
        .cloned()
        .collect();
    let managed_before = match node.annotations.get(MANAGED_LABELS) {
        Some(list) => split_list(list),
        None => managed_now.clone(),
    };
    for (key, value) in &labels {
        let current = node.labels.get(key);
        if current != Some(value) {
            change
                .set_labels
                .insert(key.clone(), (current.cloned(), value.clone()));
        }
    }
    for key in managed_before.difference(&managed_now) {
        if !labels.contains_key(key) && !protected_label(key) && node.labels.contains_key(key) {
            change.remove_labels.insert(key.clone());
        }
    }

    // Taints, by key and effect (as Kubernetes tells them apart).
    let wanted_taints: Vec<&Taint> = wanted
        .taints
        .iter()
        .filter(|t| t.key != USER_DATA_GATE_TAINT)
        .collect();
    let taints_now: BTreeSet<String> = wanted_taints
        .iter()
        .map(|t| taint_id(&t.key, &t.effect))
        .collect();
    let taints_before = match node.annotations.get(MANAGED_TAINTS) {
        Some(list) => split_list(list),
        None => taints_now.clone(),
    };
    // The Node's own taints first, as they were (timeAdded kept), less the
    // managed ones; then the pool's, each kept as it was when unchanged.
    let mut target: Vec<Value> = node
        .taints
        .iter()
        .filter(|t| {
            let id = value_taint_id(t);
            t["key"] == USER_DATA_GATE_TAINT
                || !(taints_before.contains(&id) || taints_now.contains(&id))
        })
        .cloned()
        .collect();
    for t in &wanted_taints {
        let want = taint_value(t);
        let same = node.taints.iter().find(|have| {
            value_taint_id(have) == taint_id(&t.key, &t.effect)
                && have["value"].as_str().unwrap_or_default() == t.value
        });
        target.push(same.cloned().unwrap_or(want));
    }
    let texts = |list: &[Value]| -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for t in list {
            *m.entry(value_taint_text(t)).or_insert(0) += 1;
        }
        m
    };
    let (before, after) = (texts(&node.taints), texts(&target));
    if before != after {
        change.added_taints = after
            .keys()
            .filter(|k| !before.contains_key(*k))
            .cloned()
            .collect();
        change.removed_taints = before
            .keys()
            .filter(|k| !after.contains_key(*k))
            .cloned()
            .collect();
        change.taints = Some(target);
    }

    // The record of what knit manages, when it differs.
    let join = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>().join(",");
    for (key, value) in [
        (MANAGED_LABELS, join(&managed_now)),
        (MANAGED_TAINTS, join(&taints_now)),
    ] {
        if node.annotations.get(key) != Some(&value) {
            change.annotations.insert(key.to_string(), value);
        }
    }

    let empty = change.set_labels.is_empty()
        && change.remove_labels.is_empty()
        && change.taints.is_none()
        && change.annotations.is_empty();
    (!empty).then_some(change)
}

impl Change {
    /// Whether anything a user sees changes (not only knit's record).
    pub fn visible(&self) -> bool {
        !self.set_labels.is_empty() || !self.remove_labels.is_empty() || self.taints.is_some()
    }

    /// The JSON merge patch: labels and annotations key by key (a removed
    /// key is `null`); the taint list whole, with the resourceVersion it
    /// was read at, so that a taint added meanwhile is a conflict rather
    /// than lost.
    pub fn patch(&self, resource_version: Option<&str>) -> Value {
        let mut metadata = Map::new();
        let mut labels = Map::new();
        for (key, (_, value)) in &self.set_labels {
            labels.insert(key.clone(), json!(value));
        }
        for key in &self.remove_labels {
            labels.insert(key.clone(), Value::Null);
        }
        if !labels.is_empty() {
            metadata.insert("labels".into(), Value::Object(labels));
        }
        if !self.annotations.is_empty() {
            metadata.insert("annotations".into(), json!(self.annotations));
        }
        let mut patch = Map::new();
        if let Some(taints) = &self.taints {
            if let Some(rv) = resource_version {
                metadata.insert("resourceVersion".into(), json!(rv));
            }
            patch.insert("spec".into(), json!({ "taints": taints }));
        }
        patch.insert("metadata".into(), Value::Object(metadata));
        Value::Object(patch)
    }

    /// One line for the node's event: `labels: +a=1 ~b=2 -c; taints: +x:NoSchedule -y:NoExecute`.
    pub fn summary(&self) -> String {
        let mut labels: Vec<String> = self
            .set_labels
            .iter()
            .map(|(k, (old, v))| match old {
                None => format!("+{k}={v}"),
                Some(_) => format!("~{k}={v}"),
            })
            .collect();
        labels.extend(self.remove_labels.iter().map(|k| format!("-{k}")));
        let mut taints: Vec<String> = self.added_taints.iter().map(|t| format!("+{t}")).collect();
        taints.extend(self.removed_taints.iter().map(|t| format!("-{t}")));
        let mut parts = Vec::new();
        if !labels.is_empty() {
            parts.push(format!("labels: {}", labels.join(" ")));
        }
        if !taints.is_empty() {
            parts.push(format!("taints: {}", taints.join(" ")));
        }
        parts.join("; ")
    }
}

/// When the Nodes were last compared, per server (its state directory),
/// and what the store looked like then.
static LAST_SYNC: Mutex<Option<HashMap<PathBuf, (u64, Instant)>>> = Mutex::new(None);

fn due(state_dir: &Path, fingerprint: u64, now: Instant) -> bool {
    let Ok(guard) = LAST_SYNC.lock() else {
        return true;
    };
    match guard.as_ref().and_then(|m| m.get(state_dir)) {
        Some((seen, at)) => *seen != fingerprint || now.duration_since(*at) >= RESYNC_EVERY,
        None => true,
    }
}

fn synced(state_dir: &Path, fingerprint: u64, now: Instant) {
    if let Ok(mut guard) = LAST_SYNC.lock() {
        guard
            .get_or_insert_with(HashMap::new)
            .insert(state_dir.to_path_buf(), (fingerprint, now));
    }
}

fn fnv(hash: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *hash ^= u64::from(*b);
        *hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
}

/// How one Node's sync ended.
enum Outcome {
    Unchanged,
    /// Only knit's record of its keys was written.
    Recorded,
    Changed(String),
}

impl ControlPlane {
    /// Writes each pool's labels and taints (and knit's own labels) onto
    /// the Nodes of its nodes that differ; an event per node changed, a
    /// warning per node that could not be.
    pub async fn sync_node_labels(&self) -> Result<()> {
        crate::pools::versions::fill_pool_versions(self)?;
        if !self.cluster.attached() {
            return Ok(());
        }
        let nodes = self.store.nodes()?;
        if nodes.is_empty() {
            return Ok(());
        }
        let pools: HashMap<String, PoolRecord> = self
            .store
            .pools()?
            .into_iter()
            .filter(|p| !p.deleting)
            .map(|p| (p.pool.metadata.name.clone(), p))
            .collect();
        let cluster = self.cluster_doc()?;
        let zone = self.provider.as_ref().and_then(|p| p.default_zone());

        let mut fingerprint = 0xcbf2_9ce4_8422_2325_u64;
        fnv(&mut fingerprint, cluster.spec.region.as_bytes());
        for p in pools.values() {
            fnv(&mut fingerprint, &p.updated_ms.to_le_bytes());
            fnv(&mut fingerprint, p.pool.metadata.name.as_bytes());
        }
        for n in &nodes {
            fnv(&mut fingerprint, n.name.as_bytes());
            fnv(&mut fingerprint, n.status.as_str().as_bytes());
        }
        let now = Instant::now();
        let state_dir = self.settings.state_dir.clone();
        if !due(&state_dir, fingerprint, now) {
            return Ok(());
        }
        // Read only when due: every instance, for its type.
        let instance_types: HashMap<String, String> = self
            .store
            .instances(None)?
            .into_iter()
            .map(|i| (i.name, i.instance_type))
            .collect();

        let metas: HashMap<String, NodeMeta> = crate::provider::within(
            "cluster",
            "listing nodes",
            CLUSTER_CALL_TIMEOUT,
            self.cluster.node_metas(),
        )
        .await?
        .into_iter()
        .map(|m| (m.name.clone(), m))
        .collect();
        let mut work = Vec::new();
        for node in &nodes {
            let (Some(pool), Some(meta)) = (pools.get(&node.pool), metas.get(&node.name)) else {
                continue;
            };
            let spec = &pool.pool.spec;
            let mut own = knit_labels(
                &cluster,
                &pool.pool,
                instance_types
                    .get(&node.instance)
                    .map(String::as_str)
                    .unwrap_or_default(),
                zone.as_deref(),
            );
            // The zone is where the machine is: a pool's new `zone` is a
            // new machine's (by replacement), never a relabel of this one.
            if meta.labels.contains_key(ZONE_LABEL) {
                own.remove(ZONE_LABEL);
            }
            let wanted = Wanted {
                pool_labels: spec.labels.clone(),
                knit_labels: own,
                taints: spec.taints.clone(),
            };
            if diff(&wanted, meta).is_some() {
                work.push((node.name.clone(), node.pool.clone(), wanted, meta.clone()));
            }
        }
        let outcomes: Vec<(String, String, Result<Outcome>)> = futures_util::stream::iter(work)
            .map(|(name, pool, wanted, meta)| async move {
                let outcome = crate::provider::within(
                    "cluster",
                    &format!("updating the labels and taints of node {name}"),
                    PATCH_TIMEOUT,
                    self.sync_one(&name, &wanted, meta),
                )
                .await;
                (name, pool, outcome)
            })
            .buffer_unordered(PARALLEL_PATCHES)
            .collect()
            .await;
        let mut all_done = true;
        for (name, pool, outcome) in outcomes {
            match outcome {
                Ok(Outcome::Changed(summary)) => {
                    tracing::info!(node = %name, pool = %pool, change = %summary, "node labels and taints updated in place");
                    self.store.add_event(
                        EventType::Normal,
                        "Node",
                        &name,
                        "LabelsTaintsUpdated",
                        &format!("{summary} (pool {pool})"),
                    )?;
                }
                Ok(Outcome::Unchanged | Outcome::Recorded) => {}
                Err(e) => {
                    all_done = false;
                    tracing::warn!(node = %name, error = %e, "updating node labels and taints failed");
                    self.store.add_event(
                        EventType::Warning,
                        "Node",
                        &name,
                        "LabelsTaintsUpdateFailed",
                        &format!("pool {pool}: {e}; tried again at the next pass"),
                    )?;
                }
            }
        }
        if all_done {
            synced(&state_dir, fingerprint, now);
        }
        Ok(())
    }

    /// One Node: patched from what was read; on a conflict read again and
    /// compared again, a few times.
    async fn sync_one(&self, name: &str, wanted: &Wanted, mut meta: NodeMeta) -> Result<Outcome> {
        for _ in 0..=CONFLICT_RETRIES {
            let Some(change) = diff(wanted, &meta) else {
                return Ok(Outcome::Unchanged);
            };
            let patch = change.patch(meta.resource_version.as_deref());
            match self.cluster.patch_node(name, &patch).await? {
                NodePatched::Patched if change.visible() => {
                    return Ok(Outcome::Changed(change.summary()))
                }
                NodePatched::Patched => return Ok(Outcome::Recorded),
                NodePatched::NotFound => return Ok(Outcome::Unchanged),
                NodePatched::Conflict => match self.cluster.node_meta(name).await? {
                    Some(fresh) => meta = fresh,
                    None => return Ok(Outcome::Unchanged),
                },
            }
        }
        Err(crate::error::ServerError::Conflict(format!(
            "node {name} kept changing while its taints were written ({} conflicts)",
            CONFLICT_RETRIES + 1
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: &[(&str, &str)], annotations: &[(&str, &str)], taints: Vec<Value>) -> NodeMeta {
        NodeMeta {
            name: "n1".into(),
            resource_version: Some("7".into()),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            taints,
        }
    }

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.into(),
            effect: effect.into(),
        }
    }

    fn wanted(labels: &[(&str, &str)], taints: Vec<Taint>) -> Wanted {
        Wanted {
            pool_labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            knit_labels: [(POOL_LABEL.to_string(), "workers".to_string())].into(),
            taints,
        }
    }

    /// The seam's calls on the embedded API and, through kube, on an
    /// "external" cluster (the embedded one again, by its admin
    /// kubeconfig): read, a stale taint list refused (409), patched, the
    /// hand-set label and taint kept, an absent Node not found.
    #[cfg(feature = "external-cluster")]
    #[test]
    fn both_seams_read_and_patch_nodes_and_refuse_a_stale_taint_list() {
        use crate::bootstrap::ClusterJoin;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let cluster = crate::cluster::test_cluster(dir.path()).await;
            let external = crate::cluster::external::ExternalJoin::from_kubeconfig(
                cluster.admin_kubeconfig_path(),
                Duration::from_secs(600),
            )
            .await
            .unwrap();
            let embedded =
                crate::cluster::EmbeddedJoin::new(cluster, Duration::from_secs(600)).unwrap();
            let seams: [(&dyn ClusterJoin, &str); 2] =
                [(&embedded, "local.i-1"), (&external, "local.i-2")];
            for (seam, name) in seams {
                let node = json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name,
                        "labels": {POOL_LABEL: "workers", "env": "prod", "by-hand": "x"},
                        "annotations": {MANAGED_LABELS: "env", MANAGED_TAINTS: ""}},
                    "spec": {"taints": [{"key": "hand", "effect": "NoSchedule"}]}});
                embedded
                    .call_with("POST", "/api/v1/nodes".into(), Some(node))
                    .await
                    .unwrap();
                let meta = seam
                    .node_metas()
                    .await
                    .unwrap()
                    .into_iter()
                    .find(|m| m.name == name)
                    .unwrap();
                let w = wanted(
                    &[("env", "staging")],
                    vec![taint("dedicated", "b", "NoSchedule")],
                );
                let change = diff(&w, &meta).unwrap();
                assert_eq!(
                    seam.patch_node(name, &change.patch(Some("1")))
                        .await
                        .unwrap(),
                    NodePatched::Conflict,
                    "{name}"
                );
                assert_eq!(
                    seam.patch_node(name, &change.patch(meta.resource_version.as_deref()))
                        .await
                        .unwrap(),
                    NodePatched::Patched
                );
                let after = seam.node_meta(name).await.unwrap().unwrap();
                assert_eq!(diff(&w, &after), None, "{after:?}");
                assert_eq!(after.labels["env"], "staging");
                assert_eq!(after.labels["by-hand"], "x");
                let texts: Vec<String> = after.taints.iter().map(value_taint_text).collect();
                assert_eq!(texts, ["hand:NoSchedule", "dedicated=b:NoSchedule"]);
                let absent = json!({"metadata": {"labels": {"a": "b"}}});
                assert_eq!(
                    seam.patch_node("local.i-9", &absent).await.unwrap(),
                    NodePatched::NotFound
                );
                assert!(seam.node_meta("local.i-9").await.unwrap().is_none());
            }
            embedded.stop();
        });
    }

    #[test]
    fn a_node_that_matches_needs_nothing() {
        let w = wanted(&[("env", "prod")], vec![taint("gpu", "yes", "NoSchedule")]);
        let n = node(
            &[("env", "prod"), (POOL_LABEL, "workers"), ("by-hand", "x")],
            &[(MANAGED_LABELS, "env"), (MANAGED_TAINTS, "gpu:NoSchedule")],
            vec![
                json!({"key": "gpu", "value": "yes", "effect": "NoSchedule"}),
                json!({"key": "mine", "effect": "NoExecute", "timeAdded": "t"}),
            ],
        );
        assert_eq!(diff(&w, &n), None);
    }

    #[test]
    fn only_the_keys_knit_set_are_added_changed_and_removed() {
        // The pool had env, team, old; now env (changed), team, new.
        let w = wanted(
            &[("env", "staging"), ("team", "a"), ("new", "1")],
            vec![
                taint("gpu", "no", "NoSchedule"),
                taint("fresh", "", "PreferNoSchedule"),
            ],
        );
        let n = node(
            &[
                ("env", "prod"),
                ("team", "a"),
                ("old", "1"),
                ("by-hand", "x"),
                (POOL_LABEL, "workers"),
                ("kubernetes.io/hostname", "n1"),
            ],
            &[
                (MANAGED_LABELS, "env,old,team"),
                (MANAGED_TAINTS, "gone:NoExecute,gpu:NoSchedule"),
            ],
            vec![
                json!({"key": "gpu", "value": "yes", "effect": "NoSchedule"}),
                json!({"key": "gone", "effect": "NoExecute"}),
                json!({"key": "hand", "value": "v", "effect": "NoSchedule"}),
                json!({"key": USER_DATA_GATE_TAINT, "effect": "NoSchedule"}),
            ],
        );
        let c = diff(&w, &n).unwrap();
        assert_eq!(
            c.set_labels,
            BTreeMap::from([
                (
                    "env".to_string(),
                    (Some("prod".to_string()), "staging".to_string())
                ),
                ("new".to_string(), (None, "1".to_string())),
            ])
        );
        assert_eq!(c.remove_labels, BTreeSet::from(["old".to_string()]));
        let taints: Vec<String> = c
            .taints
            .as_ref()
            .unwrap()
            .iter()
            .map(value_taint_text)
            .collect();
        assert_eq!(
            taints,
            [
                "hand=v:NoSchedule".to_string(),
                format!("{USER_DATA_GATE_TAINT}:NoSchedule"),
                "gpu=no:NoSchedule".to_string(),
                "fresh:PreferNoSchedule".to_string(),
            ]
        );
        assert_eq!(
            c.added_taints,
            ["fresh:PreferNoSchedule", "gpu=no:NoSchedule"]
        );
        assert_eq!(c.removed_taints, ["gone:NoExecute", "gpu=yes:NoSchedule"]);
        assert_eq!(c.annotations[MANAGED_LABELS], "env,new,team");
        assert_eq!(
            c.annotations[MANAGED_TAINTS],
            "fresh:PreferNoSchedule,gpu:NoSchedule"
        );
        assert_eq!(
            c.summary(),
            "labels: ~env=staging +new=1 -old; taints: +fresh:PreferNoSchedule +gpu=no:NoSchedule -gone:NoExecute -gpu=yes:NoSchedule"
        );
        let patch = c.patch(Some("7"));
        assert_eq!(patch["metadata"]["labels"]["old"], Value::Null);
        assert_eq!(patch["metadata"]["labels"]["env"], "staging");
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(patch["spec"]["taints"].as_array().unwrap().len(), 4);
        assert!(patch["metadata"]["labels"].get("by-hand").is_none());
    }

    #[test]
    fn a_node_without_the_record_loses_nothing_and_gets_the_record() {
        let w = wanted(&[("env", "prod")], vec![]);
        let n = node(
            &[("env", "prod"), (POOL_LABEL, "workers"), ("stale", "1")],
            &[],
            vec![json!({"key": "hand", "effect": "NoSchedule"})],
        );
        let c = diff(&w, &n).unwrap();
        assert!(!c.visible(), "{c:?}");
        assert_eq!(c.annotations[MANAGED_LABELS], "env");
        assert_eq!(c.annotations[MANAGED_TAINTS], "");
        // Only the record: labels and taints untouched, no resourceVersion.
        let patch = c.patch(Some("7"));
        assert_eq!(
            patch,
            json!({"metadata": {"annotations": {MANAGED_LABELS: "env", MANAGED_TAINTS: ""}}})
        );
    }

    #[test]
    fn knit_labels_win_and_are_never_removed() {
        let mut w = wanted(&[(POOL_LABEL, "other"), ("a", "1")], vec![]);
        w.knit_labels.insert(
            "node.kubernetes.io/instance-type".into(),
            "ecs.g7.large".into(),
        );
        // A record that (wrongly) lists knit's keys: still never removed.
        let n = node(
            &[("a", "1"), ("topology.kubernetes.io/zone", "z")],
            &[
                (
                    MANAGED_LABELS,
                    "a,topology.kubernetes.io/zone,knit.dev/pool",
                ),
                (MANAGED_TAINTS, ""),
            ],
            vec![],
        );
        let c = diff(&w, &n).unwrap();
        assert_eq!(c.set_labels[POOL_LABEL].1, "workers");
        assert_eq!(
            c.set_labels["node.kubernetes.io/instance-type"].1,
            "ecs.g7.large"
        );
        assert!(c.remove_labels.is_empty(), "{c:?}");
        assert_eq!(c.annotations[MANAGED_LABELS], "a");
    }

    #[test]
    fn a_taint_of_the_same_key_with_another_effect_is_another_taint() {
        let w = wanted(&[], vec![taint("k", "", "NoSchedule")]);
        let n = node(
            &[(POOL_LABEL, "workers")],
            &[(MANAGED_LABELS, ""), (MANAGED_TAINTS, "k:NoSchedule")],
            vec![
                json!({"key": "k", "effect": "NoSchedule"}),
                json!({"key": "k", "effect": "NoExecute", "timeAdded": "t"}),
            ],
        );
        assert_eq!(diff(&w, &n), None);
        // The pool drops its taint: the hand-set NoExecute one stays.
        let c = diff(&wanted(&[], vec![]), &n).unwrap();
        assert_eq!(
            c.taints.unwrap(),
            vec![json!({"key": "k", "effect": "NoExecute", "timeAdded": "t"})]
        );
        assert_eq!(c.removed_taints, ["k:NoSchedule"]);
    }

    #[test]
    fn the_pool_takes_over_a_key_set_by_hand() {
        let w = wanted(&[("team", "a")], vec![taint("hand", "new", "NoSchedule")]);
        let n = node(
            &[(POOL_LABEL, "workers"), ("team", "b")],
            &[(MANAGED_LABELS, ""), (MANAGED_TAINTS, "")],
            vec![json!({"key": "hand", "value": "old", "effect": "NoSchedule"})],
        );
        let c = diff(&w, &n).unwrap();
        assert_eq!(c.set_labels["team"], (Some("b".into()), "a".into()));
        assert_eq!(
            c.taints.unwrap(),
            vec![json!({"key": "hand", "value": "new", "effect": "NoSchedule"})]
        );
        assert_eq!(c.annotations[MANAGED_LABELS], "team");
        assert_eq!(c.annotations[MANAGED_TAINTS], "hand:NoSchedule");
    }
}
