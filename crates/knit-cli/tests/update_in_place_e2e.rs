//! A changed pool reaches the nodes it already has, in place, on the local
//! cloud with the embedded cluster and the real `kubectl`:
//!
//! 1. A pool of two nodes with labels and a taint: every Node carries them,
//!    the pool label and the well-known labels a cloud controller manager
//!    sets (`kubectl get nodes -L node.kubernetes.io/instance-type,…`), and
//!    its kubelet reports the pool's Kubernetes version.
//! 2. A label and a taint put on a Node by hand (`kubectl label`, `kubectl
//!    taint`), then `knit apply` of the pool with a label changed, one
//!    added, one removed and the taint changed: the Nodes change within a
//!    few passes, the same instances (names and provider ids), the hand-set
//!    label and taint kept, the removed pool label gone, an event per node.
//! 3. The Kubernetes version rules through `knit apply`, each refusal with a
//!    non-zero exit and the field named: a pool newer than the cluster, a
//!    pool more than three minors older, a cluster lowered, a cluster raised
//!    two minors, a version with no package in the mirror (naming `knit
//!    package build --kubernetes-version`). With a 1.32.0 package built the
//!    cluster is raised: `/version` reports it, the existing pool keeps its
//!    version and its instances, and a pool made now gets 1.32.0, whose new
//!    node's kubelet reports v1.32.0.
//!
//! Needs root, the node image and the workspace's binaries (as local_e2e);
//! kubectl (Debian's, at /usr/bin/kubectl). Everything is released by the
//! `Env` guard on success, failure and panic.

mod common;

use common::Env;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn pool_yaml(name: &str, replicas: u32, labels: &str, taints: &str, extra: &str) -> String {
    format!(
        "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  systemDisk: {{sizeGiB: 20}}
  dataDisks: [{{sizeGiB: 40, interface: nvme}}]
  preUserData: touch /var/.skip-yum
  labels: {labels}
  taints: {taints}
{extra}"
    )
}

struct Kubectl(PathBuf);

impl Kubectl {
    fn run(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.0)
            .args(args)
            .output()
            .expect("kubectl (Debian's kubernetes-client) must be installed");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out) = self.run(args);
        assert!(ok, "kubectl {args:?}: {out}");
        out
    }

    fn node(&self, name: &str) -> Value {
        serde_json::from_str(&self.ok(&["get", "node", name, "-o", "json"])).unwrap()
    }
}

/// Polls `f` every 500 ms until it gives a value, at most `secs`.
fn until<T>(env: &Env, what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not within {secs} s\n{}",
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn labels(node: &Value) -> BTreeMap<String, String> {
    node["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

/// `key=value:Effect` of each taint.
fn taints(node: &Value) -> Vec<String> {
    let mut list: Vec<String> = node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let (k, v, e) = (
                t["key"].as_str().unwrap_or_default(),
                t["value"].as_str().unwrap_or_default(),
                t["effect"].as_str().unwrap_or_default(),
            );
            if v.is_empty() {
                format!("{k}:{e}")
            } else {
                format!("{k}={v}:{e}")
            }
        })
        .collect();
    list.sort();
    list
}

/// (name, provider id) of the instances of `pool`, sorted.
fn instances(env: &Env, pool: &str) -> Vec<(String, String)> {
    let mut list: Vec<(String, String)> = env
        .store_instances()
        .into_iter()
        .filter(|i| i["pool"] == pool)
        .map(|i| {
            (
                i["name"].as_str().unwrap_or_default().to_string(),
                i["providerId"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    list.sort();
    list
}

/// `knit apply -f` of `doc` (written to `file`): (ok, stderr).
fn apply(env: &Env, file: &str, doc: &str) -> (bool, String) {
    let path = env.path(file);
    std::fs::write(&path, doc).unwrap();
    let (ok, out, err) = env.knit(&["apply", "-f", path.to_str().unwrap()]);
    (ok, format!("{out}{err}"))
}

/// The cluster document with `kubernetesVersion` set to `version`.
fn cluster_doc(env: &Env, version: &str) -> String {
    let got = env.json(&["get", "clusters", "-o", "json"]);
    let mut cluster = got["items"].get(0).cloned().unwrap_or(got);
    cluster["spec"]["kubernetesVersion"] = version.into();
    if let Some(o) = cluster.as_object_mut() {
        o.remove("status");
    }
    serde_json::to_string(&cluster).unwrap()
}

fn refused(env: &Env, file: &str, doc: &str, wanted: &[&str]) {
    let (ok, out) = apply(env, file, doc);
    assert!(!ok, "applied, should be refused: {out}");
    for w in wanted {
        assert!(out.contains(w), "{w:?} not in: {out}");
    }
}

#[test]
fn labels_and_taints_in_place_and_kubernetes_versions() {
    let mut env = Env::builder().cluster(true).parallelism(2).build();
    env.start(true);
    let k = Kubectl(env.path("server/cluster/admin.kubeconfig"));

    // 1. Two nodes with the pool's labels and taint.
    env.create(
        "pool",
        &pool_yaml(
            "workers",
            0,
            "{env: prod, team: a}",
            "[{key: dedicated, value: a, effect: NoSchedule}]",
            "",
        ),
    );
    let out = env.scale_wait("workers", 2);
    assert!(out.contains("2/2 initialized and Ready"), "{out}");
    let pool = env.pool();
    assert_eq!(pool["spec"]["kubernetesVersion"], "1.31.4", "{pool}");
    let names: Vec<String> = env
        .nodes_of("workers")
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 2);
    let before = instances(&env, "workers");
    assert_eq!(before.len(), 2);

    for name in &names {
        let node = k.node(name);
        let l = labels(&node);
        assert_eq!(l["env"], "prod", "{l:?}");
        assert_eq!(l["team"], "a", "{l:?}");
        assert_eq!(l["knit.dev/pool"], "workers", "{l:?}");
        assert_eq!(l["node.kubernetes.io/instance-type"], "ecs.g7.large");
        assert_eq!(l["topology.kubernetes.io/region"], "local");
        assert_eq!(l["topology.kubernetes.io/zone"], "local-a");
        assert!(taints(&node).contains(&"dedicated=a:NoSchedule".to_string()));
        let kubelet = node["status"]["nodeInfo"]["kubeletVersion"]
            .as_str()
            .unwrap_or_default();
        assert!(kubelet.starts_with("v1.31.4"), "{kubelet}");
    }
    let wide = k.ok(&[
        "get",
        "nodes",
        "-L",
        "node.kubernetes.io/instance-type,topology.kubernetes.io/region,topology.kubernetes.io/zone",
    ]);
    let header = wide.lines().next().unwrap_or_default();
    assert!(
        header.contains("INSTANCE-TYPE") && header.contains("REGION") && header.contains("ZONE"),
        "{wide}"
    );
    for name in &names {
        let line = wide.lines().find(|l| l.starts_with(name.as_str())).unwrap();
        assert!(
            line.contains("ecs.g7.large") && line.contains("local-a"),
            "{wide}"
        );
    }
    // knit records which keys it set, once the sync has passed.
    until(&env, "the managed-keys annotations", 60, || {
        names
            .iter()
            .all(|n| {
                let node = k.node(n);
                node["metadata"]["annotations"]["knit.dev/managed-labels"] == "env,team"
                    && node["metadata"]["annotations"]["knit.dev/managed-taints"]
                        == "dedicated:NoSchedule"
            })
            .then_some(())
    });

    // 2. By hand on the first node, then the pool changed.
    k.ok(&["label", "node", &names[0], "by-hand=yes"]);
    k.ok(&["taint", "node", &names[0], "hand=x:NoExecute"]);
    let (ok, out) = apply(
        &env,
        "pool.yaml",
        &pool_yaml(
            "workers",
            2,
            "{env: staging, new: \"1\"}",
            "[{key: dedicated, value: b, effect: NoSchedule}]",
            "",
        ),
    );
    assert!(ok, "{out}");
    until(
        &env,
        "the pool's labels and taints on both Nodes",
        60,
        || {
            names
                .iter()
                .all(|n| {
                    let node = k.node(n);
                    let l = labels(&node);
                    l.get("env").map(String::as_str) == Some("staging")
                        && l.get("new").map(String::as_str) == Some("1")
                        && !l.contains_key("team")
                        && taints(&node).contains(&"dedicated=b:NoSchedule".to_string())
                        && !taints(&node).contains(&"dedicated=a:NoSchedule".to_string())
                })
                .then_some(())
        },
    );
    let first = k.node(&names[0]);
    assert_eq!(labels(&first)["by-hand"], "yes", "the hand-set label kept");
    assert!(
        taints(&first).contains(&"hand=x:NoExecute".to_string()),
        "the hand-set taint kept: {:?}",
        taints(&first)
    );
    assert_eq!(labels(&first)["knit.dev/pool"], "workers");
    assert_eq!(
        first["metadata"]["annotations"]["knit.dev/managed-labels"],
        "env,new"
    );
    // The same machines: nothing was replaced.
    assert_eq!(instances(&env, "workers"), before);
    let events = env.json(&["get", "events", "-o", "json"]);
    for name in &names {
        let found = events["items"].as_array().into_iter().flatten().any(|e| {
            e["reason"] == "LabelsTaintsUpdated"
                && e["objectName"] == name.as_str()
                && e["message"].as_str().unwrap_or_default().contains("-team")
        });
        assert!(found, "no LabelsTaintsUpdated event for {name}: {events}");
    }

    // 3. Versions. The pool may not be newer than the cluster, nor more
    // than three minors older; the cluster goes up one minor at a time;
    // a version needs its package.
    let version = |v: &str| format!("  kubernetesVersion: \"{v}\"\n");
    let changed = |v: &str| {
        pool_yaml(
            "workers",
            2,
            "{env: staging, new: \"1\"}",
            "[{key: dedicated, value: b, effect: NoSchedule}]",
            &version(v),
        )
    };
    refused(
        &env,
        "pool.yaml",
        &changed("1.32.0"),
        &["spec.kubernetesVersion", "newer than the cluster's"],
    );
    refused(
        &env,
        "pool.yaml",
        &changed("1.27.3"),
        &["spec.kubernetesVersion", "more than 3 minors older"],
    );
    refused(
        &env,
        "pool.yaml",
        &changed("1.30.2"),
        &[
            "spec.kubernetesVersion",
            "no Kubernetes 1.30.2 package",
            "knit package build --kubernetes-version 1.30.2",
        ],
    );
    refused(
        &env,
        "cluster.yaml",
        &cluster_doc(&env, "1.30.2"),
        &["spec.kubernetesVersion", "may not be lowered"],
    );
    refused(
        &env,
        "cluster.yaml",
        &cluster_doc(&env, "1.33.0"),
        &["spec.kubernetesVersion", "one minor at a time"],
    );
    refused(
        &env,
        "cluster.yaml",
        &cluster_doc(&env, "1.32.0"),
        &[
            "spec.kubernetesVersion",
            "knit package build --kubernetes-version 1.32.0",
        ],
    );
    assert_eq!(env.pool()["spec"]["kubernetesVersion"], "1.31.4");

    // A 1.32.0 package: the cluster goes up, the pool stays.
    let state = env.state_dir();
    env.knit_ok(&[
        "package",
        "build",
        "--state-dir",
        state.to_str().unwrap(),
        "--kubernetes-version",
        "1.32.0",
    ]);
    let (ok, out) = apply(&env, "cluster.yaml", &cluster_doc(&env, "1.32.0"));
    assert!(ok, "{out}");
    let served: Value = serde_json::from_str(&k.ok(&["version", "-o", "json"])).unwrap();
    assert_eq!(
        served["serverVersion"]["gitVersion"], "v1.32.0+knit",
        "{served}"
    );
    assert_eq!(env.pool()["spec"]["kubernetesVersion"], "1.31.4");
    // Applying the pool without the field keeps its version.
    let (ok, out) = apply(
        &env,
        "pool.yaml",
        &pool_yaml(
            "workers",
            2,
            "{env: staging, new: \"1\"}",
            "[{key: dedicated, value: b, effect: NoSchedule}]",
            "",
        ),
    );
    assert!(ok, "{out}");
    assert_eq!(env.pool()["spec"]["kubernetesVersion"], "1.31.4");
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(instances(&env, "workers"), before, "nothing rolled");

    // A pool made now runs the cluster's version, and says so.
    env.create("fresh", &pool_yaml("fresh", 0, "{}", "[]", ""));
    assert_eq!(
        env.json(&["get", "pools", "fresh", "-o", "json"])["spec"]["kubernetesVersion"],
        "1.32.0"
    );
    let out = env.scale_wait("fresh", 1);
    assert!(out.contains("1/1 initialized and Ready"), "{out}");
    let fresh = env.nodes_of("fresh")[0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let node = k.node(&fresh);
    let kubelet = node["status"]["nodeInfo"]["kubeletVersion"]
        .as_str()
        .unwrap_or_default();
    assert!(kubelet.starts_with("v1.32.0"), "{kubelet}");
    assert_eq!(labels(&node)["topology.kubernetes.io/zone"], "local-a");
}
