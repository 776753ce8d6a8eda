//! knit's drain end to end on the local cloud: a pool of two nodes joined
//! to the embedded cluster, a pod on each (the kubelet stand-in runs them:
//! Running and Ready, no container), a PodDisruptionBudget over both, made
//! with the real `kubectl`.
//!
//! 1. Scale-in to 1 is blocked by the budget: the node leaving is cordoned
//!    and shown draining with the budget (`knit get nodes`, `get pools`,
//!    `describe node`), its instance not released.
//! 2. The server is killed with SIGKILL mid-drain and started again: the
//!    drain resumes where it stood (same start), still nothing released.
//! 3. The budget is relaxed: the pod is evicted, the node drained, then
//!    the instance released and the Node deleted.
//! 4. Pool delete with `spec.drain: {timeoutSeconds: 5, onTimeout: force}`
//!    while the budget forbids the last pod's eviction: after the timeout
//!    the pod is deleted, then the machine released and the pool gone.
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

fn pool_yaml(replicas: u32, drain: &str) -> String {
    format!(
        "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {{name: workers}}
spec:
  replicas: {replicas}
  systemDisk: {{sizeGiB: 20}}
  dataDisks: [{{sizeGiB: 40, interface: nvme}}]
  preUserData: touch /var/.skip-yum
  drain: {drain}
"
    )
}

struct Kubectl(PathBuf);

impl Kubectl {
    fn run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.0)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl (Debian's kubernetes-client) must be installed");
        if let Some(text) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out) = self.run(args, stdin);
        assert!(ok, "kubectl {args:?}: {out}");
        out
    }

    /// A pod of `app: web` bound to `node`, gone 1 s after its deletion.
    fn web_pod(&self, name: &str, node: &str) {
        self.ok(
            &["create", "--validate=false", "-f", "-"],
            Some(&format!(
                "apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: web}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers: [{{name: app, image: registry.local/web:1}}]
"
            )),
        );
    }

    fn budget(&self) -> Value {
        serde_json::from_str(&self.ok(&["get", "pdb", "web", "-o", "json"], None)).unwrap()
    }

    fn pods(&self) -> Vec<String> {
        self.ok(&["get", "pods", "-o", "name"], None)
            .lines()
            .map(|l| l.trim_start_matches("pod/").to_string())
            .collect()
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

/// The node of pool `workers` whose drain is in `state`, if any.
fn draining(env: &Env, state: &str) -> Option<Value> {
    env.nodes_of("workers")
        .into_iter()
        .find(|n| n["drain"]["state"] == state)
}

fn event_reasons(env: &Env) -> Vec<String> {
    env.json(&["get", "events", "-o", "json"])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["reason"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn removals_drain_first_and_honour_disruption_budgets() {
    let mut env = Env::builder().cluster(true).parallelism(2).build();
    env.start(true);
    env.create(
        "pool",
        &pool_yaml(0, "{timeoutSeconds: 600, onTimeout: wait}"),
    );
    let out = env.scale_wait("workers", 2);
    assert!(out.contains("2/2 initialized and Ready"), "{out}");
    let nodes: Vec<String> = env
        .nodes_of("workers")
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(nodes.len(), 2);

    let k = Kubectl(env.path("server/cluster/admin.kubeconfig"));
    k.web_pod("web-0", &nodes[0]);
    k.web_pod("web-1", &nodes[1]);
    k.ok(
        &["create", "--validate=false", "-f", "-"],
        Some(
            "apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web}
spec: {minAvailable: 2, selector: {matchLabels: {app: web}}}
",
        ),
    );
    until(&env, "both pods Running and the budget at 0", 60, || {
        let b = k.budget();
        (b["status"]["currentHealthy"] == 2 && b["status"]["disruptionsAllowed"] == 0).then_some(())
    });

    // 1. Scale-in blocked by the budget.
    env.knit_ok(&["scale", "pool", "workers", "--replicas", "1"]);
    let blocked = until(&env, "a node blocked by the budget", 90, || {
        draining(&env, "Blocked")
    });
    let leaving = blocked["name"].as_str().unwrap().to_string();
    let started = blocked["drain"]["startedMs"].as_i64().unwrap();
    assert!(
        blocked["drain"]["blockingBudget"]
            .as_str()
            .unwrap()
            .starts_with("default/web (minAvailable 2"),
        "{blocked}"
    );
    let table = env.knit_ok(&["get", "nodes"]);
    let row = table
        .lines()
        .find(|l| l.starts_with(&leaving))
        .unwrap_or_default();
    assert!(row.contains("Ready,Draining(default/web)"), "{table}");
    assert_eq!(env.pool()["status"]["draining"], 1);
    assert!(env.knit_ok(&["get", "pools"]).contains("DRAINING"));
    let described = env.knit_ok(&["describe", "node", &leaving]);
    assert!(
        described.contains("Blocked by:  PodDisruptionBudget default/web")
            && described.contains("Drain timeline:")
            && described.contains("would violate the pod's disruption budget"),
        "{described}"
    );
    let (_, node_doc) = k.run(&["get", "node", &leaving, "-o", "json"], None);
    let node_doc: Value = serde_json::from_str(&node_doc).unwrap();
    assert_eq!(node_doc["spec"]["unschedulable"], true, "cordoned");
    assert_eq!(env.provider_names().len(), 2, "nothing released yet");
    assert!(event_reasons(&env).iter().any(|r| r == "DrainBlocked"));

    // 2. Killed mid-drain, started again: the same drain resumes.
    env.kill_server();
    env.start_server();
    std::thread::sleep(Duration::from_secs(6));
    let again = draining(&env, "Blocked").expect("still blocked after the restart");
    assert_eq!(again["name"], leaving.as_str());
    assert_eq!(again["drain"]["startedMs"].as_i64().unwrap(), started);
    assert_eq!(
        env.provider_names().len(),
        2,
        "nothing released while blocked"
    );
    assert_eq!(k.pods().len(), 2);

    // 3. The budget allows one: evicted, drained, released, Node gone.
    k.ok(
        &[
            "patch",
            "pdb",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"minAvailable":1}}"#,
        ],
        None,
    );
    until(&env, "the drained instance released", 120, || {
        (env.provider_names().len() == 1 && env.nodes_of("workers").len() == 1).then_some(())
    });
    let (gone, _) = k.run(&["get", "node", &leaving], None);
    assert!(!gone, "the Node of {leaving} is deleted");
    let pods = k.pods();
    assert_eq!(pods.len(), 1, "{pods:?}");
    assert!(event_reasons(&env).iter().any(|r| r == "Drained"));

    // 4. Pool delete with onTimeout force while the budget forbids.
    until(&env, "the budget at 0 with one pod", 60, || {
        let b = k.budget();
        (b["status"]["currentHealthy"] == 1 && b["status"]["disruptionsAllowed"] == 0).then_some(())
    });
    let file = env.path("forced.yaml");
    std::fs::write(&file, pool_yaml(1, "{timeoutSeconds: 5, onTimeout: force}")).unwrap();
    env.knit_ok(&["apply", "-f", file.to_str().unwrap()]);
    let t = Instant::now();
    env.knit_ok(&["delete", "pool", "workers"]);
    until(&env, "the pool deleted", 180, || {
        (!env.knit(&["get", "pools", "workers"]).0).then_some(())
    });
    let reasons = event_reasons(&env);
    for want in ["DrainBlocked", "DrainTimeout", "DrainForced"] {
        assert!(reasons.iter().any(|r| r == want), "{want} in {reasons:?}");
    }
    assert!(
        t.elapsed() >= Duration::from_secs(5),
        "forced before the timeout"
    );
    assert!(env.provider_names().is_empty());
    assert!(k.pods().is_empty(), "the last pod deleted");
}
