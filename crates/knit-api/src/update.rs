//! What a change to a pool means for the nodes it already has: one table
//! of every `spec` field and how its change reaches them, the template
//! hash that tells an up-to-date node from a drifted one, and the update
//! strategy (a Deployment's `maxSurge`/`maxUnavailable`).

use crate::pool::{IntOrPercent, NodePoolSpec};
use crate::validate::Errors;
use serde::{Deserialize, Serialize};

/// How a change of a field reaches the nodes a pool already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpdateMode {
    /// A setting of knit's own (repair, drain, timeouts, the strategy):
    /// applies at the next pass, nothing on a node changes.
    Immediate,
    /// The pool's size: scaling, not an update.
    Scaling,
    /// Written onto the existing Node objects within seconds, no new
    /// machine (labels and taints).
    InPlace,
    /// A kubelet setting its pods do not notice: the agent on each node
    /// re-renders the kubelet's configuration and restarts the kubelet,
    /// one node at a time, the node kept and not drained (its pods keep
    /// running through a kubelet restart).
    RestartKubelet,
    /// A kubelet setting the pods running on the node are checked against:
    /// a restarted kubelet admits the pods it runs again against the new
    /// value (allocatable, the pod count, sysctls, feature gates, its
    /// flags), so the node is cordoned and drained around the restart,
    /// then uncordoned.
    RestartKubeletDrained,
    /// Needs a new machine: a rollout replaces every node made from the
    /// old template (drained first).
    Replace,
    /// Used when a machine is made; nodes already there keep what they
    /// ran (the seeds: user data runs once, at creation).
    NewMachinesOnly,
    /// Fixed at creation; a change is refused.
    Fixed,
}

impl UpdateMode {
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateMode::Immediate => "immediate",
            UpdateMode::Scaling => "scaling",
            UpdateMode::InPlace => "in-place",
            UpdateMode::RestartKubelet => "restart-kubelet",
            UpdateMode::RestartKubeletDrained => "restart-kubelet-drained",
            UpdateMode::Replace => "replace",
            UpdateMode::NewMachinesOnly => "new-machines-only",
            UpdateMode::Fixed => "fixed",
        }
    }

    /// Whether the field is part of the template hash: a node made or
    /// updated with another value is out of date.
    pub fn hashed(self) -> bool {
        matches!(
            self,
            UpdateMode::Replace | UpdateMode::RestartKubelet | UpdateMode::RestartKubeletDrained
        )
    }
}

/// Every field of a pool's `spec` (its name in the document; `kubelet`'s
/// fields one by one, as `kubelet.NAME`) and how a change of it reaches
/// existing nodes. docs/control-plane.md ("Updating a pool") prints this
/// table; a test checks that it lists every field.
pub const SPEC_FIELDS: &[(&str, UpdateMode)] = &[
    ("type", UpdateMode::Fixed),
    ("hardening", UpdateMode::Fixed),
    ("replicas", UpdateMode::Scaling),
    ("scaling", UpdateMode::Scaling),
    ("labels", UpdateMode::InPlace),
    ("taints", UpdateMode::InPlace),
    ("instanceTypes", UpdateMode::Replace),
    ("image", UpdateMode::Replace),
    ("zone", UpdateMode::Replace),
    ("securityGroupType", UpdateMode::Replace),
    ("systemDisk", UpdateMode::Replace),
    ("dataDisks", UpdateMode::Replace),
    ("customNodeName", UpdateMode::Replace),
    // Read by the kubelet at start, noticed by no running pod.
    ("kubelet.eventRecordQPS", UpdateMode::RestartKubelet),
    ("kubelet.eventBurst", UpdateMode::RestartKubelet),
    ("kubelet.kubeAPIQPS", UpdateMode::RestartKubelet),
    ("kubelet.kubeAPIBurst", UpdateMode::RestartKubelet),
    ("kubelet.registryPullQPS", UpdateMode::RestartKubelet),
    ("kubelet.registryBurst", UpdateMode::RestartKubelet),
    (
        "kubelet.imageGCHighThresholdPercent",
        UpdateMode::RestartKubelet,
    ),
    (
        "kubelet.imageGCLowThresholdPercent",
        UpdateMode::RestartKubelet,
    ),
    ("kubelet.containerLogMaxFiles", UpdateMode::RestartKubelet),
    ("kubelet.containerLogMaxSize", UpdateMode::RestartKubelet),
    ("kubelet.serializeImagePulls", UpdateMode::RestartKubelet),
    ("kubelet.readOnlyPort", UpdateMode::RestartKubelet),
    ("kubelet.address", UpdateMode::RestartKubelet),
    ("kubelet.port", UpdateMode::RestartKubelet),
    // Applied to a pod's cgroup when the pod starts: running pods keep theirs.
    ("kubelet.podPidsLimit", UpdateMode::RestartKubelet),
    ("kubelet.cpuCFSQuota", UpdateMode::RestartKubelet),
    ("kubelet.cpuCFSQuotaPeriod", UpdateMode::RestartKubelet),
    // Decide later evictions only (no part of allocatable).
    ("kubelet.evictionSoft", UpdateMode::RestartKubelet),
    (
        "kubelet.evictionSoftGracePeriod",
        UpdateMode::RestartKubelet,
    ),
    // The kubelet admits its running pods again at start against these:
    // drained around the restart.
    ("kubelet.evictionHard", UpdateMode::RestartKubeletDrained),
    ("kubelet.kubeReserved", UpdateMode::RestartKubeletDrained),
    ("kubelet.systemReserved", UpdateMode::RestartKubeletDrained),
    ("kubelet.maxPods", UpdateMode::RestartKubeletDrained),
    (
        "kubelet.allowedUnsafeSysctls",
        UpdateMode::RestartKubeletDrained,
    ),
    ("kubelet.featureGates", UpdateMode::RestartKubeletDrained),
    ("kubelet.customizedArgs", UpdateMode::RestartKubeletDrained),
    // A resource manager's state on the node belongs to its policy
    // (Kubernetes asks for a drain and the state file removed): a new
    // machine.
    ("kubelet.cpuManagerPolicy", UpdateMode::Replace),
    ("kubelet.memoryManagerPolicy", UpdateMode::Replace),
    ("kubelet.topologyManagerPolicy", UpdateMode::Replace),
    ("kubelet.reservedMemory", UpdateMode::Replace),
    ("containerd", UpdateMode::Replace),
    ("runtime", UpdateMode::Replace),
    ("os", UpdateMode::Replace),
    ("components", UpdateMode::Replace),
    ("kubernetesVersion", UpdateMode::Replace),
    ("login", UpdateMode::NewMachinesOnly),
    ("preUserData", UpdateMode::NewMachinesOnly),
    ("userData", UpdateMode::NewMachinesOnly),
    ("userDataSchedulingGate", UpdateMode::NewMachinesOnly),
    ("joinTimeoutSeconds", UpdateMode::Immediate),
    ("autoReplace", UpdateMode::Immediate),
    ("repair", UpdateMode::Immediate),
    ("drain", UpdateMode::Immediate),
    ("updateStrategy", UpdateMode::Immediate),
    ("paused", UpdateMode::Immediate),
    ("restartedAt", UpdateMode::Replace),
];

/// How a change of `field` (a key of `SPEC_FIELDS`) reaches existing
/// nodes; an unknown field counts as needing a new machine.
pub fn mode_of(field: &str) -> UpdateMode {
    SPEC_FIELDS
        .iter()
        .find(|(name, _)| *name == field)
        .map(|(_, mode)| *mode)
        .unwrap_or(UpdateMode::Replace)
}

/// The top-level key of a table field (`kubelet.maxPods` → `kubelet`).
fn top_level(field: &str) -> &str {
    field.split_once('.').map_or(field, |(top, _)| top)
}

/// Whether the top-level `key` of a spec is in the template hash: it is,
/// or one of its fields is, hashed.
fn top_level_hashed(key: &str) -> bool {
    let listed: Vec<UpdateMode> = SPEC_FIELDS
        .iter()
        .filter(|(f, _)| top_level(f) == key)
        .map(|(_, m)| *m)
        .collect();
    // Unknown: counts as needing a new machine.
    listed.is_empty() || listed.iter().any(|m| m.hashed())
}

/// The value of a table field in a spec's document.
fn field_value<'a>(
    map: &'a serde_json::Map<String, serde_json::Value>,
    field: &str,
) -> Option<&'a serde_json::Value> {
    match field.split_once('.') {
        Some((top, rest)) => map.get(top)?.get(rest),
        None => map.get(field),
    }
}

/// One changed field of a pool's spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldChange {
    pub field: &'static str,
    pub mode: UpdateMode,
}

fn spec_value(spec: &NodePoolSpec) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(spec) {
        Ok(serde_json::Value::Object(map)) => map,
        // A spec is plain data: it always serializes to an object.
        _ => serde_json::Map::new(),
    }
}

/// The fields that differ between `old` and `new`, in table order.
pub fn changed_fields(old: &NodePoolSpec, new: &NodePoolSpec) -> Vec<FieldChange> {
    let (a, b) = (spec_value(old), spec_value(new));
    SPEC_FIELDS
        .iter()
        .filter(|(field, _)| field_value(&a, field) != field_value(&b, field))
        .map(|&(field, mode)| FieldChange { field, mode })
        .collect()
}

/// How a node made from one template reaches another without a new
/// machine, when it can ([`in_place_update`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InPlaceUpdate {
    /// Cordon and drain around the restart (uncordoned after).
    pub drain: bool,
    /// The kubelet's settings change (re-rendered, restarted).
    pub kubelet: bool,
    /// The Kubernetes version the node goes to, when it changes (the
    /// kubelet package swapped on the same machine).
    pub kubernetes_version: Option<String>,
    /// The changed fields, in table order (`kubernetesVersion` included).
    pub fields: Vec<&'static str>,
}

/// Whether a node made from `old` (running `old_version`) reaches `new`
/// (running `new_version`) in place: every hashed field that changed is a
/// kubelet restart's, and a changed Kubernetes version only when `new`'s
/// `updateStrategy.inPlace` is set. `None`: a new machine is needed (or
/// nothing hashed changed). Pure.
pub fn in_place_update(
    old: &NodePoolSpec,
    old_version: &str,
    new: &NodePoolSpec,
    new_version: &str,
) -> Option<InPlaceUpdate> {
    let mut update = InPlaceUpdate {
        drain: false,
        kubelet: false,
        kubernetes_version: None,
        fields: Vec::new(),
    };
    for change in changed_fields(old, new) {
        match change.mode {
            // The versions are compared below (the effective ones).
            _ if change.field == "kubernetesVersion" => {}
            UpdateMode::RestartKubelet => update.kubelet = true,
            UpdateMode::RestartKubeletDrained => {
                update.kubelet = true;
                update.drain = true;
            }
            mode if mode.hashed() => return None,
            _ => continue,
        }
        if change.field != "kubernetesVersion" {
            update.fields.push(change.field);
        }
    }
    if old_version != new_version {
        if !new.update_strategy.in_place {
            return None;
        }
        update.kubernetes_version = Some(new_version.to_string());
        update.drain = true;
        update.fields.push("kubernetesVersion");
    }
    (!update.fields.is_empty()).then_some(update)
}

/// The hash of what a machine of the pool is made from: every `Replace`
/// field and every kubelet setting (`kubelet` whole, as before its fields
/// were told apart, so that no hash changed), with the Kubernetes version the pool's nodes run (the pool's, or
/// the cluster's when the pool names none). A node whose hash is not its
/// pool's current one is out of date. FNV-1a over the fields' canonical
/// JSON (sorted keys), as Kubernetes' `pod-template-hash` is FNV-based;
/// ten hex digits.
pub fn template_hash(spec: &NodePoolSpec, kubernetes_version: &str) -> String {
    let mut fields = spec_value(spec);
    fields.retain(|k, _| top_level_hashed(k));
    fields.insert(
        "kubernetesVersion".to_string(),
        serde_json::Value::String(kubernetes_version.to_string()),
    );
    let canonical = serde_json::Value::Object(fields).to_string();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in canonical.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{:010x}", hash & 0xff_ffff_ffff)
}

/// The Kubernetes version a pool's nodes run: the pool's own
/// `spec.kubernetesVersion`, else the cluster's.
pub fn effective_kubernetes_version<'a>(
    spec: &'a NodePoolSpec,
    cluster_version: &'a str,
) -> &'a str {
    spec.kubernetes_version
        .as_deref()
        .unwrap_or(cluster_version)
}

/// [`template_hash`] of a pool in a cluster whose version is
/// `cluster_version`: the hash its new machines are made with.
pub fn pool_template_hash(spec: &NodePoolSpec, cluster_version: &str) -> String {
    template_hash(spec, effective_kubernetes_version(spec, cluster_version))
}

/// The fields a rollout undo takes from an earlier revision: what a
/// machine is made from (every `Replace` and `NewMachinesOnly` field) and
/// the labels and taints it carried then (and its `restartedAt`, so that
/// undoing a rollout halfway keeps the nodes not yet replaced). Scaling, knit's own settings
/// and `paused` stay as they are now.
pub fn with_template_of(current: &NodePoolSpec, revision: &NodePoolSpec) -> NodePoolSpec {
    let (mut now, then) = (spec_value(current), spec_value(revision));
    for (field, mode) in SPEC_FIELDS {
        let template =
            mode.hashed() || matches!(mode, UpdateMode::NewMachinesOnly | UpdateMode::InPlace);
        if !template {
            continue;
        }
        // A kubelet field: the revision's kubelet settings, whole.
        let key = top_level(field);
        match then.get(key) {
            Some(v) => now.insert(key.to_string(), v.clone()),
            None => now.remove(key),
        };
    }
    // Both are specs: the merge of two is one.
    serde_json::from_value(serde_json::Value::Object(now)).unwrap_or_else(|_| current.clone())
}

pub const UPDATE_STRATEGY_TYPES: &[&str] = &["RollingUpdate", "OnDelete"];

/// How a pool replaces the nodes a change left out of date.
/// `RollingUpdate` with a Deployment's meanings: `maxSurge` nodes above the
/// desired count may exist during a rollout, `maxUnavailable` of the
/// desired count may be unavailable (counts or percentages of the desired
/// count; surge rounds up, unavailable rounds down, as a Deployment's do;
/// both zero is refused). `OnDelete` replaces nothing until a node is
/// removed. `inPlace` upgrades the Kubernetes version on the same machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct UpdateStrategy {
    #[serde(rename = "type")]
    pub strategy_type: String,
    pub max_surge: IntOrPercent,
    pub max_unavailable: IntOrPercent,
    pub in_place: bool,
}

impl Default for UpdateStrategy {
    fn default() -> Self {
        UpdateStrategy {
            strategy_type: "RollingUpdate".to_string(),
            max_surge: IntOrPercent::Count(1),
            max_unavailable: IntOrPercent::Count(0),
            in_place: false,
        }
    }
}

impl UpdateStrategy {
    pub fn validate(&self, at: &str, e: &mut Errors) {
        e.one_of(
            &format!("{at}.type"),
            &self.strategy_type,
            UPDATE_STRATEGY_TYPES,
        );
        let surge = self.max_surge.resolve(100);
        let unavailable = self.max_unavailable.resolve(100);
        if let Err(rule) = surge {
            e.add(format!("{at}.maxSurge"), &self.max_surge, rule);
        }
        if let Err(rule) = unavailable {
            e.add(format!("{at}.maxUnavailable"), &self.max_unavailable, rule);
        }
        if surge == Ok(0) && unavailable == Ok(0) {
            e.add(
                format!("{at}.maxUnavailable"),
                &self.max_unavailable,
                "may not be 0 when maxSurge is 0 too (nothing could be replaced)",
            );
        }
        if self.in_place && unavailable == Ok(0) {
            e.add(
                format!("{at}.inPlace"),
                true,
                "needs maxUnavailable of at least 1 (an in-place upgrade drains the node it upgrades: it is unavailable meanwhile)",
            );
        }
    }

    pub fn on_delete(&self) -> bool {
        self.strategy_type == "OnDelete"
    }

    /// `(maxSurge, maxUnavailable)` as node counts for `desired` nodes, as
    /// a Deployment resolves them: surge rounds up, unavailable rounds
    /// down, and when both come to 0 unavailable is 1 so that a rollout
    /// can move. Valid strategies only (an invalid value counts as 0).
    pub fn limits(&self, desired: usize) -> (usize, usize) {
        let surge = self.max_surge.resolve(desired).unwrap_or(0);
        let unavailable = match &self.max_unavailable {
            IntOrPercent::Text(t) => t
                .strip_suffix('%')
                .and_then(|d| d.parse::<usize>().ok())
                .map(|pct| desired * pct.min(100) / 100)
                .unwrap_or(0),
            count => count.resolve(desired).unwrap_or(0),
        };
        if surge == 0 && unavailable == 0 {
            (0, 1)
        } else {
            (surge, unavailable)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Taint;

    #[test]
    fn the_table_lists_every_spec_field_once() {
        let fields = spec_value(&NodePoolSpec {
            scaling: Some(Default::default()),
            zone: Some("z".into()),
            custom_node_name: Some(Default::default()),
            kubernetes_version: Some("1.31.0".into()),
            restarted_at: Some("2026-01-01T00:00:00Z".into()),
            runtime: crate::config::RUNTIME_NONE.into(),
            ..NodePoolSpec::default()
        });
        for key in fields.keys() {
            assert!(
                SPEC_FIELDS.iter().any(|(f, _)| top_level(f) == key),
                "spec.{key} is missing from SPEC_FIELDS"
            );
        }
        // The kubelet's fields one by one, every one of them.
        let kubelet = fields["kubelet"].as_object().expect("an object");
        for key in kubelet.keys() {
            let name = format!("kubelet.{key}");
            assert!(
                SPEC_FIELDS.iter().any(|(f, _)| *f == name),
                "spec.{name} is missing from SPEC_FIELDS"
            );
        }
        assert!(
            SPEC_FIELDS.iter().all(|(f, _)| *f != "kubelet"),
            "kubelet is listed field by field"
        );
        for (i, (f, _)) in SPEC_FIELDS.iter().enumerate() {
            assert!(
                field_value(&fields, f).is_some(),
                "SPEC_FIELDS names no field {f}"
            );
            assert!(
                SPEC_FIELDS[..i].iter().all(|(g, _)| g != f),
                "{f} is listed twice"
            );
        }
    }

    #[test]
    fn only_fields_that_need_a_machine_change_the_hash() {
        let base = NodePoolSpec::default();
        let h = template_hash(&base, "1.31.0");
        assert_eq!(h.len(), 10);
        assert_eq!(h, template_hash(&base.clone(), "1.31.0"));
        let mut labelled = base.clone();
        labelled.labels.insert("tier".into(), "web".into());
        labelled.taints.push(Taint {
            key: "k".into(),
            value: "v".into(),
            effect: "NoSchedule".into(),
        });
        labelled.replicas = 9;
        labelled.user_data = "#!/bin/sh\ntrue\n".into();
        labelled.drain.timeout_seconds = 5;
        assert_eq!(template_hash(&labelled, "1.31.0"), h);
        let mut bigger = base.clone();
        bigger.instance_types = vec!["ecs.g7.xlarge".into()];
        assert_ne!(template_hash(&bigger, "1.31.0"), h);
        assert_ne!(template_hash(&base, "1.32.0"), h);
        // The pool's own version and the same version inherited hash alike.
        let mut pinned = base.clone();
        pinned.kubernetes_version = Some("1.31.0".into());
        assert_eq!(template_hash(&pinned, "1.31.0"), h);
    }

    #[test]
    fn a_restart_changes_the_hash_and_none_leaves_it_as_before() {
        let base = NodePoolSpec::default();
        let h = pool_template_hash(&base, "1.31.0");
        let value = serde_json::to_value(&base).unwrap();
        assert!(value.get("restartedAt").is_none(), "absent until a restart");
        let mut restarted = base.clone();
        restarted.restarted_at = Some("2026-01-01T00:00:00Z".into());
        assert_ne!(pool_template_hash(&restarted, "1.31.0"), h);
        let mut pinned = base.clone();
        pinned.kubernetes_version = Some("1.30.2".into());
        assert_eq!(
            pool_template_hash(&pinned, "1.31.0"),
            template_hash(&base, "1.30.2")
        );
    }

    /// `runtime` came after pools existed: containerd, its default, is not
    /// written, so no stored pool's hash changed (no rollout on upgrade);
    /// none is a new machine.
    #[test]
    fn the_default_runtime_leaves_the_hash_as_before_and_none_changes_it() {
        let base = NodePoolSpec::default();
        let value = serde_json::to_value(&base).unwrap();
        assert!(value.get("runtime").is_none(), "containerd is not written");
        let stored: NodePoolSpec = serde_json::from_value(value).unwrap();
        assert_eq!(stored.runtime, "containerd");
        let h = pool_template_hash(&base, "1.31.0");
        let light = NodePoolSpec {
            runtime: crate::config::RUNTIME_NONE.into(),
            ..base.clone()
        };
        assert_ne!(pool_template_hash(&light, "1.31.0"), h);
        assert_eq!(mode_of("runtime"), UpdateMode::Replace);
    }

    #[test]
    fn undo_takes_the_template_and_keeps_the_size_and_settings() {
        let mut old = NodePoolSpec {
            instance_types: vec!["small".into()],
            replicas: 2,
            ..NodePoolSpec::default()
        };
        old.labels.insert("tier".into(), "a".into());
        let mut now = old.clone();
        now.instance_types = vec!["big".into()];
        now.labels.insert("tier".into(), "b".into());
        now.replicas = 5;
        now.join_timeout_seconds = 77;
        now.restarted_at = Some("t".into());
        let back = with_template_of(&now, &old);
        assert_eq!(back.instance_types, vec!["small".to_string()]);
        assert_eq!(back.labels.get("tier").map(String::as_str), Some("a"));
        assert_eq!((back.replicas, back.join_timeout_seconds), (5, 77));
        assert_eq!(back.restarted_at, None, "the revision's restart, none");
    }

    /// docs/control-plane.md ("Updating a pool") prints `SPEC_FIELDS`
    /// between its `spec-fields` markers, row for row.
    #[test]
    fn the_docs_table_is_spec_fields() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/control-plane.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let start = doc.find("<!-- spec-fields -->\n").expect("start marker");
        let end = doc.find("<!-- /spec-fields -->").expect("end marker");
        let table = &doc[start + "<!-- spec-fields -->\n".len()..end];
        let mut want = String::from("| field | change |\n|---|---|\n");
        for (field, mode) in SPEC_FIELDS {
            want.push_str(&format!("| `{field}` | {} |\n", mode.as_str()));
        }
        assert_eq!(table, want, "docs/control-plane.md's field table");
    }

    #[test]
    fn kubelet_fields_are_told_apart_and_kubelet_stays_in_the_hash() {
        let base = NodePoolSpec::default();
        let h = pool_template_hash(&base, "1.31.0");
        let mut qps = base.clone();
        qps.kubelet.event_record_qps = 50;
        // In the hash (a node is out of date until restarted) ...
        assert_ne!(pool_template_hash(&qps, "1.31.0"), h);
        assert_eq!(
            changed_fields(&base, &qps),
            vec![FieldChange {
                field: "kubelet.eventRecordQPS",
                mode: UpdateMode::RestartKubelet
            }]
        );
        // ... and reached by a restart, not drained.
        let u = in_place_update(&base, "1.31.0", &qps, "1.31.0").expect("in place");
        assert_eq!(
            (u.drain, u.kubelet, u.kubernetes_version.as_deref()),
            (false, true, None)
        );
        assert_eq!(u.fields, vec!["kubelet.eventRecordQPS"]);
        // maxPods: the running pods are admitted again: drained.
        let mut pods = qps.clone();
        pods.kubelet.max_pods = 50;
        let u = in_place_update(&base, "1.31.0", &pods, "1.31.0").expect("in place");
        assert!(u.drain && u.kubelet, "{u:?}");
        assert_eq!(u.fields, vec!["kubelet.eventRecordQPS", "kubelet.maxPods"]);
        // A resource manager's policy, or any field a machine is made
        // from, with it: a new machine.
        let mut cpu = qps.clone();
        cpu.kubelet.cpu_manager_policy = "static".into();
        assert_eq!(in_place_update(&base, "1.31.0", &cpu, "1.31.0"), None);
        let mut bigger = qps.clone();
        bigger.instance_types = vec!["big".into()];
        assert_eq!(in_place_update(&base, "1.31.0", &bigger, "1.31.0"), None);
        // Labels alone are no kubelet restart (the label sync's).
        let mut labelled = base.clone();
        labelled.labels.insert("a".into(), "b".into());
        assert_eq!(in_place_update(&base, "1.31.0", &labelled, "1.31.0"), None);
        // Labels beside a kubelet change do not stop it.
        labelled.kubelet.event_burst = 99;
        assert!(in_place_update(&base, "1.31.0", &labelled, "1.31.0").is_some());
    }

    #[test]
    fn a_version_goes_in_place_only_with_in_place_set() {
        let old = NodePoolSpec {
            kubernetes_version: Some("1.31.4".into()),
            ..NodePoolSpec::default()
        };
        let mut new = old.clone();
        new.kubernetes_version = Some("1.32.0".into());
        assert_eq!(
            in_place_update(&old, "1.31.4", &new, "1.32.0"),
            None,
            "by replacement unless inPlace"
        );
        new.update_strategy.in_place = true;
        new.update_strategy.max_unavailable = IntOrPercent::Count(1);
        let u = in_place_update(&old, "1.31.4", &new, "1.32.0").expect("in place");
        assert_eq!(u.kubernetes_version.as_deref(), Some("1.32.0"));
        assert!(u.drain && !u.kubelet, "{u:?}");
        assert_eq!(u.fields, vec!["kubernetesVersion"]);
        // With a kubelet setting beside it: both, drained.
        new.kubelet.kube_api_qps = 20;
        let u = in_place_update(&old, "1.31.4", &new, "1.32.0").expect("in place");
        assert!(u.drain && u.kubelet, "{u:?}");
        // A restart asked for (knit rollout restart) replaces every node.
        new.restarted_at = Some("t".into());
        assert_eq!(in_place_update(&old, "1.31.4", &new, "1.32.0"), None);
        // inPlace with nothing unavailable is refused, naming the field.
        let mut e = Errors::default();
        UpdateStrategy {
            in_place: true,
            ..UpdateStrategy::default()
        }
        .validate("spec.updateStrategy", &mut e);
        let msg = format!("{:?}", e.into_result());
        assert!(msg.contains("spec.updateStrategy.inPlace"), "{msg}");
        assert!(msg.contains("maxUnavailable of at least 1"), "{msg}");
    }

    #[test]
    fn undo_takes_the_revisions_kubelet_settings() {
        let old = NodePoolSpec::default();
        let mut now = old.clone();
        now.kubelet.event_record_qps = 77;
        now.kubelet.max_pods = 30;
        let back = with_template_of(&now, &old);
        assert_eq!(back.kubelet, old.kubelet);
    }

    #[test]
    fn changed_fields_name_each_change_with_its_mode() {
        let old = NodePoolSpec::default();
        let mut new = old.clone();
        new.labels.insert("a".into(), "b".into());
        new.image = "/srv/img".into();
        new.replicas = 4;
        assert_eq!(
            changed_fields(&old, &new),
            vec![
                FieldChange {
                    field: "replicas",
                    mode: UpdateMode::Scaling
                },
                FieldChange {
                    field: "labels",
                    mode: UpdateMode::InPlace
                },
                FieldChange {
                    field: "image",
                    mode: UpdateMode::Replace
                },
            ]
        );
    }

    #[test]
    fn limits_round_as_a_deployment_does() {
        let s = |surge: IntOrPercent, unavailable: IntOrPercent| UpdateStrategy {
            max_surge: surge,
            max_unavailable: unavailable,
            ..UpdateStrategy::default()
        };
        use IntOrPercent::{Count, Text};
        assert_eq!(UpdateStrategy::default().limits(10), (1, 0));
        assert_eq!(s(Text("25%".into()), Text("25%".into())).limits(10), (3, 2));
        assert_eq!(s(Text("10%".into()), Count(0)).limits(3), (1, 0));
        assert_eq!(s(Count(0), Text("10%".into())).limits(3), (0, 1));
        assert_eq!(s(Count(2), Count(1)).limits(10), (2, 1));
    }

    #[test]
    fn both_zero_and_bad_values_are_refused_naming_the_field() {
        let mut e = Errors::default();
        UpdateStrategy {
            max_surge: IntOrPercent::Count(0),
            max_unavailable: IntOrPercent::Text("0%".into()),
            ..UpdateStrategy::default()
        }
        .validate("spec.updateStrategy", &mut e);
        let msg = format!("{:?}", e.into_result());
        assert!(msg.contains("spec.updateStrategy.maxUnavailable"), "{msg}");
        let mut e = Errors::default();
        UpdateStrategy {
            strategy_type: "Recreate".into(),
            max_surge: IntOrPercent::Text("150%".into()),
            ..UpdateStrategy::default()
        }
        .validate("spec.updateStrategy", &mut e);
        let msg = format!("{:?}", e.into_result());
        assert!(msg.contains("spec.updateStrategy.type"), "{msg}");
        assert!(msg.contains("spec.updateStrategy.maxSurge"), "{msg}");
    }
}
