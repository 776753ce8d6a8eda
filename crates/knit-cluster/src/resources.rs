//! The resources this API serves, and the discovery documents built from
//! them.

use serde_json::{json, Value};

pub struct ResourceDef {
    /// API group; empty for the core (`/api/v1`) group.
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub verbs: &'static [&'static str],
    pub short_names: &'static [&'static str],
    /// Subresources with their verbs.
    pub subresources: &'static [(&'static str, &'static [&'static str])],
}

const ALL: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];
const STATUS: &[&str] = &["get", "patch", "update"];
const CREATE: &[&str] = &["create"];

pub static RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        verbs: ALL,
        short_names: &["no"],
        subresources: &[("status", STATUS)],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        verbs: ALL,
        short_names: &["ns"],
        subresources: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        namespaced: true,
        verbs: ALL,
        short_names: &[],
        subresources: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        verbs: ALL,
        short_names: &["cm"],
        subresources: &[],
    },
    // Pods as the workloads of the stand-in nodes: graceful deletion, the
    // status subresource (the kubelet stand-in's) and eviction (checked
    // against PodDisruptionBudgets).
    ResourceDef {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        verbs: ALL,
        short_names: &["po"],
        subresources: &[("status", STATUS), ("eviction", CREATE)],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        // Written by the control plane (knit's node events, as a kubelet's
        // event recorder writes them) and read by `kubectl get events`.
        verbs: ALL,
        short_names: &["ev"],
        subresources: &[],
    },
    ResourceDef {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        verbs: ALL,
        short_names: &[],
        subresources: &[],
    },
    ResourceDef {
        group: "certificates.k8s.io",
        version: "v1",
        plural: "certificatesigningrequests",
        singular: "certificatesigningrequest",
        kind: "CertificateSigningRequest",
        namespaced: false,
        verbs: ALL,
        short_names: &["csr"],
        subresources: &[("approval", STATUS), ("status", STATUS)],
    },
    ResourceDef {
        group: "policy",
        version: "v1",
        plural: "poddisruptionbudgets",
        singular: "poddisruptionbudget",
        kind: "PodDisruptionBudget",
        namespaced: true,
        verbs: ALL,
        short_names: &["pdb"],
        subresources: &[("status", STATUS)],
    },
    // Workload objects, stored only (no controller runs them): pods'
    // owner references resolve (`kubectl drain` reads a pod's DaemonSet;
    // the disruption controller reads the scale of a pod's ReplicaSet,
    // Deployment or StatefulSet for percentage budgets).
    ResourceDef {
        group: "apps",
        version: "v1",
        plural: "daemonsets",
        singular: "daemonset",
        kind: "DaemonSet",
        namespaced: true,
        verbs: ALL,
        short_names: &["ds"],
        subresources: &[("status", STATUS)],
    },
    ResourceDef {
        group: "apps",
        version: "v1",
        plural: "replicasets",
        singular: "replicaset",
        kind: "ReplicaSet",
        namespaced: true,
        verbs: ALL,
        short_names: &["rs"],
        subresources: &[("status", STATUS)],
    },
    ResourceDef {
        group: "apps",
        version: "v1",
        plural: "deployments",
        singular: "deployment",
        kind: "Deployment",
        namespaced: true,
        verbs: ALL,
        short_names: &["deploy"],
        subresources: &[("status", STATUS)],
    },
    ResourceDef {
        group: "apps",
        version: "v1",
        plural: "statefulsets",
        singular: "statefulset",
        kind: "StatefulSet",
        namespaced: true,
        verbs: ALL,
        short_names: &["sts"],
        subresources: &[("status", STATUS)],
    },
];

/// Namespaces that always exist.
pub const NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

#[cfg(test)]
pub fn by_kind(kind: &str) -> Option<&'static ResourceDef> {
    RESOURCES.iter().find(|r| r.kind == kind)
}

fn groups() -> Vec<&'static str> {
    let mut g: Vec<&str> = RESOURCES
        .iter()
        .map(|r| r.group)
        .filter(|g| !g.is_empty())
        .collect();
    let mut seen = Vec::new();
    g.retain(|x| {
        let new = !seen.contains(x);
        seen.push(*x);
        new
    });
    g
}

pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_doc(group: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/v1"), "version": "v1"});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

pub fn api_group_list() -> Value {
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups().into_iter().map(group_doc).collect::<Vec<_>>(),
    })
}

pub fn api_group(group: &str) -> Option<Value> {
    groups().contains(&group).then(|| {
        let mut g = group_doc(group);
        g["kind"] = json!("APIGroup");
        g["apiVersion"] = json!("v1");
        g
    })
}

pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let defs: Vec<&ResourceDef> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if defs.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for r in defs {
        resources.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs,
            "shortNames": r.short_names,
        }));
        for (sub, verbs) in r.subresources {
            let mut doc = json!({
                "name": format!("{}/{}", r.plural, sub),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": verbs,
            });
            if *sub == "eviction" {
                // As kube-apiserver lists it: `kubectl drain` looks for
                // `pods/eviction` of kind Eviction before it evicts.
                doc["group"] = json!("policy");
                doc["version"] = json!("v1");
                doc["kind"] = json!("Eviction");
            }
            resources.push(doc);
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// The Kubernetes version the API reports (`/version`): the Cluster
/// spec's `kubernetesVersion`, set by the control plane at start and
/// whenever it changes; knit's default until then.
static SERVED_VERSION: std::sync::RwLock<Option<String>> = std::sync::RwLock::new(None);

/// Sets the version `/version` reports (a `MAJOR.MINOR.PATCH`; anything
/// else is ignored).
pub fn set_served_version(version: &str) {
    if knit_api::validate::parse_kube_version(version).is_none() {
        return;
    }
    if let Ok(mut served) = SERVED_VERSION.write() {
        if served.as_deref() != Some(version) {
            *served = Some(version.to_string());
        }
    }
}

/// The version `/version` reports.
pub fn served_version() -> String {
    SERVED_VERSION
        .read()
        .ok()
        .and_then(|v| v.clone())
        .unwrap_or_else(|| knit_api::DEFAULT_KUBERNETES_VERSION.to_string())
}

pub fn version_doc() -> Value {
    let v = served_version();
    let v = v.as_str();
    let mut parts = v.split('.');
    let major = parts.next().unwrap_or("1");
    let minor = parts.next().unwrap_or("0");
    json!({
        "major": major,
        "minor": minor,
        // Build metadata says who serves this API: knit, not kube-apiserver.
        "gitVersion": format!("v{v}+knit"),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, go_arch()),
    })
}

/// Go's name for this architecture, as Kubernetes reports it.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_lists_subresources_and_groups() {
        let core = resource_list("", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"nodes/status"));
        assert!(names.contains(&"secrets"));
        let eviction = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods/eviction")
            .unwrap();
        assert_eq!(
            (&eviction["group"], &eviction["version"], &eviction["kind"]),
            (&json!("policy"), &json!("v1"), &json!("Eviction"))
        );
        let groups = api_group_list();
        let names: Vec<&str> = groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "coordination.k8s.io",
                "certificates.k8s.io",
                "policy",
                "apps"
            ]
        );
        assert!(
            resource_list("certificates.k8s.io", "v1").unwrap()["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["name"] == "certificatesigningrequests/approval")
        );
        assert!(resource_list("apps", "v1").is_some());
        assert!(resource_list("batch", "v1").is_none());
    }
}
