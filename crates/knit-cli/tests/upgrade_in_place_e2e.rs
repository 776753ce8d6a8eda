//! A rollout that needs no new machine, on the local cloud with the
//! embedded cluster and the real `kubectl` (issue 24):
//!
//! 1. A pool of two nodes (the default strategy: maxSurge 1,
//!    maxUnavailable 0). `knit apply` with `kubelet.eventRecordQPS`
//!    changed (a restart-kubelet field): each node's agent re-renders the
//!    kubelet's configuration and restarts the kubelet, one node at a
//!    time, never cordoned; sampled all along: never more than the two
//!    instances, none cordoned. After: the same
//!    instances (names and provider ids), each node's
//!    `/var/lib/kubelet/config.yaml` carries the new value, both nodes up
//!    to date, an `UpdatedInPlace` event per node, a `RolloutComplete`
//!    event for the pool, `knit rollout status` exits 0.
//! 2. `updateStrategy.inPlace` with maxUnavailable 0 is refused naming the
//!    field. With a 1.32.0 package built and the cluster raised to it, the
//!    pool goes to 1.32.0 with `inPlace: true, maxSurge: 0,
//!    maxUnavailable: 1`: each node drained (cordoned), the agent installs
//!    the 1.32.0 kubelet from the mirror and restarts it, uncordoned; at
//!    most one node unschedulable at any sample, never a third instance;
//!    after: the same instances, every Node's kubeletVersion v1.32.0, none
//!    left unschedulable, the rollout complete.
//!
//! Needs root, the node image and the workspace's binaries (as local_e2e);
//! kubectl (Debian's, at /usr/bin/kubectl). Everything is released by the
//! `Env` guard on success, failure and panic.

mod common;

use common::Env;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn pool_yaml(extra: &str) -> String {
    format!(
        "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {{name: workers}}
spec:
  replicas: 2
  systemDisk: {{sizeGiB: 20}}
  dataDisks: [{{sizeGiB: 40, interface: nvme}}]
  preUserData: touch /var/.skip-yum
{extra}"
    )
}

struct Kubectl(PathBuf);

impl Kubectl {
    fn ok(&self, args: &[&str]) -> String {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.0)
            .args(args)
            .output()
            .expect("kubectl (Debian's kubernetes-client) must be installed");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "kubectl {args:?}: {text}");
        text
    }

    fn nodes(&self) -> Vec<Value> {
        let list: Value = serde_json::from_str(&self.ok(&["get", "nodes", "-o", "json"])).unwrap();
        list["items"].as_array().cloned().unwrap_or_default()
    }
}

/// (name, provider id) of the pool's instances that count (not being
/// removed), sorted.
fn instances(env: &Env) -> Vec<(String, String)> {
    let mut list: Vec<(String, String)> = env
        .store_instances()
        .into_iter()
        .filter(|i| i["pool"] == "workers")
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

fn apply(env: &Env, file: &str, doc: &str) -> (bool, String) {
    let path = env.path(file);
    std::fs::write(&path, doc).unwrap();
    let (ok, out, err) = env.knit(&["apply", "-f", path.to_str().unwrap()]);
    (ok, format!("{out}{err}"))
}

fn cluster_doc(env: &Env, version: &str) -> String {
    let got = env.json(&["get", "clusters", "-o", "json"]);
    let mut cluster = got["items"].get(0).cloned().unwrap_or(got);
    cluster["spec"]["kubernetesVersion"] = version.into();
    if let Some(o) = cluster.as_object_mut() {
        o.remove("status");
    }
    serde_json::to_string(&cluster).unwrap()
}

/// Events with `reason` about `object`.
fn events(env: &Env, reason: &str, object: &str) -> Vec<String> {
    env.json(&["get", "events", "-o", "json"])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"] == reason && e["objectName"] == object)
        .map(|e| e["message"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Samples the pool until its rollout is complete (at most `secs`):
/// `check` sees each sample; the number of samples taken.
fn until_complete(env: &Env, secs: u64, mut check: impl FnMut(&Value)) -> usize {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut samples = 0;
    loop {
        let pool = env.pool();
        samples += 1;
        check(&pool);
        let rollout = &pool["status"]["rollout"];
        if rollout["state"] == "Complete" && rollout["updated"] == 2 {
            return samples;
        }
        assert_ne!(
            rollout["state"],
            "Stopped",
            "the rollout stopped: {rollout}\n{}",
            env.server_log_tail()
        );
        assert!(
            Instant::now() < deadline,
            "the rollout did not complete within {secs} s: {rollout}\n{}",
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The node's rendered kubelet configuration, whitespace and quotes gone.
fn kubelet_config(env: &Env, provider_id: &str) -> String {
    let (ok, out) = env.exec(provider_id, "cat /var/lib/kubelet/config.yaml");
    assert!(ok, "{out}");
    out.chars()
        .filter(|c| !c.is_whitespace() && *c != '"')
        .collect()
}

#[test]
fn kubelet_settings_and_kubernetes_version_in_place() {
    let mut env = Env::builder().cluster(true).parallelism(2).build();
    env.start(true);
    let k = Kubectl(env.path("server/cluster/admin.kubeconfig"));

    // 1. A kubelet setting: restarted in place, one node at a time.
    env.create("pool", &pool_yaml("").replace("replicas: 2", "replicas: 0"));
    let out = env.scale_wait("workers", 2);
    assert!(out.contains("2/2 initialized and Ready"), "{out}");
    let before = instances(&env);
    assert_eq!(before.len(), 2);
    for (_, id) in &before {
        assert!(
            kubelet_config(&env, id).contains("eventRecordQPS:5"),
            "the default first"
        );
    }
    let hash_before = env.pool()["status"]["templateHash"].clone();
    let (ok, out) = apply(
        &env,
        "pool.yaml",
        &pool_yaml("  kubelet: {eventRecordQPS: 8}\n"),
    );
    assert!(ok, "{out}");
    assert_ne!(env.pool()["status"]["templateHash"], hash_before);
    let samples = until_complete(&env, 180, |pool| {
        let n = instances(&env).len();
        assert!(n <= 2, "a machine was made: {n} instances\n{pool}");
        let unschedulable = k
            .nodes()
            .iter()
            .filter(|n| n["spec"]["unschedulable"] == true)
            .count();
        assert_eq!(unschedulable, 0, "a kubelet restart cordons nothing");
        let r = &pool["status"]["rollout"];
        let total = r["total"].as_i64().unwrap_or(0);
        let updated = r["updated"].as_i64().unwrap_or(0);
        let outdated = r["outdated"].as_i64().unwrap_or(0);
        assert_eq!(total, 2, "{r}");
        assert_eq!(updated + outdated, 2, "{r}");
    });
    eprintln!("kubelet restart rollout: {samples} samples");
    assert_eq!(instances(&env), before, "the same machines");
    for (_, id) in &before {
        assert!(
            kubelet_config(&env, id).contains("eventRecordQPS:8"),
            "re-rendered on {id}"
        );
    }
    let names: Vec<String> = env
        .nodes_of("workers")
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 2);
    for name in &names {
        let updated = events(&env, "UpdatedInPlace", name);
        assert!(
            updated
                .iter()
                .any(|m| m.contains("kubelet.eventRecordQPS") && m.contains("up to date")),
            "no UpdatedInPlace event for {name}: {updated:?}"
        );
        assert!(
            events(&env, "UpdatingInPlace", name)
                .iter()
                .any(|m| m.contains("not drained")),
            "{name}"
        );
    }
    assert!(
        !events(&env, "RolloutComplete", "workers").is_empty(),
        "no RolloutComplete event"
    );
    let (ok, out, err) = env.knit(&["rollout", "status", "pool", "workers", "--timeout", "30"]);
    assert!(ok, "{out}{err}");
    let describe = env.knit_ok(&["describe", "pool", "workers"]);
    assert!(describe.contains("RolloutComplete"), "{describe}");

    // 2. The Kubernetes version in place.
    let strategy = |unavailable: u32| {
        format!(
            "  kubelet: {{eventRecordQPS: 8}}\n  kubernetesVersion: \"1.32.0\"\n  updateStrategy: {{inPlace: true, maxSurge: 0, maxUnavailable: {unavailable}}}\n"
        )
    };
    let (ok, out) = apply(
        &env,
        "pool.yaml",
        &pool_yaml(
            "  kubelet: {eventRecordQPS: 8}\n  updateStrategy: {inPlace: true, maxSurge: 1, maxUnavailable: 0}\n",
        ),
    );
    assert!(!ok, "inPlace with maxUnavailable 0 applied: {out}");
    assert!(out.contains("spec.updateStrategy.inPlace"), "{out}");
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
    let (ok, out) = apply(&env, "pool.yaml", &pool_yaml(&strategy(1)));
    assert!(ok, "{out}");
    let mut most_cordoned = 0;
    let samples = until_complete(&env, 240, |pool| {
        let n = instances(&env).len();
        assert!(n <= 2, "a machine was made: {n} instances\n{pool}");
        let cordoned = k
            .nodes()
            .iter()
            .filter(|n| n["spec"]["unschedulable"] == true)
            .count();
        assert!(cordoned <= 1, "{cordoned} nodes cordoned at once");
        most_cordoned = most_cordoned.max(cordoned);
    });
    eprintln!("in-place upgrade rollout: {samples} samples, at most {most_cordoned} cordoned");
    assert_eq!(instances(&env), before, "the same machines");
    // The restarted kubelet reports its version with its next status.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let versions: Vec<(String, String, bool)> = k
            .nodes()
            .iter()
            .filter(|n| names.iter().any(|m| n["metadata"]["name"] == m.as_str()))
            .map(|n| {
                (
                    n["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    n["status"]["nodeInfo"]["kubeletVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    n["spec"]["unschedulable"] == true,
                )
            })
            .collect();
        assert_eq!(versions.len(), 2, "{versions:?}");
        assert!(
            versions.iter().all(|(_, _, cordoned)| !cordoned),
            "left cordoned: {versions:?}"
        );
        if versions.iter().all(|(_, v, _)| v.starts_with("v1.32.0")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the kubelets do not report v1.32.0: {versions:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    for name in &names {
        let updated = events(&env, "UpdatedInPlace", name);
        assert!(
            updated
                .iter()
                .any(|m| m.contains("Kubernetes 1.32.0") && m.contains("drained")),
            "no in-place upgrade event for {name}: {updated:?}"
        );
    }
    let (ok, out, err) = env.knit(&["rollout", "status", "pool", "workers", "--timeout", "30"]);
    assert!(ok, "{out}{err}");
}
