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
//! `delete_node_repair_and_pool_delete_drain_first`, one pool of two nodes
//! and its replacement, on a server whose skip-wait for nodes that cannot
//! confirm is lowered to 5 s (`KNIT_DRAIN_SKIP_WAIT_SECONDS`; default 60):
//!
//! 0. The Cluster's `spec.network.podCidr` (applied, read at the next
//!    start) is where the nodes' podCIDRs and the pods' IPs come from.
//! 1. `knit delete node` while the budget forbids: blocked, named, nothing
//!    released; the budget allows: the pod evicted, then the machine goes.
//! 2. The other node's kubelet stand-in is frozen (SIGSTOP to the PID its
//!    supervisor recorded): the Node goes Ready=Unknown and repair's
//!    replace starts, through the drain: blocked by the budget, nothing
//!    released. The budget allows: the evictions are accepted but no
//!    kubelet confirms; 5 s past their due time the pods no longer block,
//!    the node is drained, the machine released and replaced.
//! 3. Pool delete with a pod the budget protects: blocked, the pool and its
//!    machine kept; the budget allows: evicted, released, the pool gone.
//!
//! `the_snapshot_builder_drains_its_node_before_the_kubelet_stops`: a pod
//! a budget protects on the builder's node holds the build at `detach`
//! until the budget goes; the running kubelet ends the evicted pod, then
//! the kubelet stops (needs containerd, runc and docker-registry too).
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

fn events(env: &Env) -> Vec<Value> {
    env.json(&["get", "events", "-o", "json"])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The first event of `reason` about `object`, if any.
fn event(env: &Env, reason: &str, object: &str) -> Option<Value> {
    events(env)
        .into_iter()
        .find(|e| e["reason"] == reason && e["objectName"] == object)
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

fn repaired_pool_yaml(replicas: u32) -> String {
    format!(
        "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {{name: workers}}
spec:
  replicas: {replicas}
  systemDisk: {{sizeGiB: 20}}
  dataDisks: [{{sizeGiB: 40, interface: nvme}}]
  preUserData: touch /var/.skip-yum
  repair:
    enabled: true
    notReadyAfterSeconds: 60
    waitAfterActionSeconds: 30
    maxUnhealthy: \"100%\"
    actions: [replace]
  drain: {{timeoutSeconds: 3600, onTimeout: wait}}
"
    )
}

impl Kubectl {
    /// A pod of label `app` bound to `node`, gone 1 s after its deletion.
    fn pod(&self, name: &str, app: &str, node: &str) {
        self.ok(
            &["create", "--validate=false", "-f", "-"],
            Some(&format!(
                "apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: {app}}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers: [{{name: app, image: registry.local/{app}:1}}]
"
            )),
        );
    }

    fn min_available(&self, n: u32) {
        let patch = format!(r#"{{"spec":{{"minAvailable":{n}}}}}"#);
        self.ok(&["patch", "pdb", "web", "--type=merge", "-p", &patch], None);
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&all, None)).unwrap()
    }

    /// Waits until the budget counts `healthy` pods and allows `allowed`.
    fn budget_at(&self, env: &Env, healthy: i64, allowed: i64) {
        until(
            env,
            &format!("the budget at {healthy} healthy, {allowed} allowed"),
            60,
            || {
                let b = self.budget();
                (b["status"]["currentHealthy"] == healthy
                    && b["status"]["disruptionsAllowed"] == allowed
                    && b["status"]["observedGeneration"] == b["metadata"]["generation"])
                    .then_some(())
            },
        );
    }
}

fn node_row(env: &Env, node: &str) -> String {
    let table = env.knit_ok(&["get", "nodes"]);
    table
        .lines()
        .find(|l| l.starts_with(node))
        .unwrap_or_else(|| panic!("no row for {node}:\n{table}"))
        .to_string()
}

#[test]
fn delete_node_repair_and_pool_delete_drain_first() {
    let mut env = Env::builder()
        .cluster(true)
        .parallelism(2)
        .env("KNIT_DRAIN_SKIP_WAIT_SECONDS", "5")
        .build();
    env.start(true);

    // 0. The pod CIDR of the Cluster document, read at the next start.
    let cluster = env.path("cluster.yaml");
    std::fs::write(
        &cluster,
        "apiVersion: knit.dev/v1alpha1\nkind: Cluster\nmetadata: {name: knit}\nspec: {network: {podCidr: 10.244.0.0/16}}\n",
    )
    .unwrap();
    env.knit_ok(&["apply", "-f", cluster.to_str().unwrap()]);
    env.kill_server();
    env.start_server();

    env.create("pool", &repaired_pool_yaml(0));
    let out = env.scale_wait("workers", 2);
    assert!(out.contains("2/2 initialized and Ready"), "{out}");
    let nodes = env.nodes_of("workers");
    let names: Vec<String> = nodes
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect();
    let k = Kubectl(env.path("server/cluster/admin.kubeconfig"));
    for n in &names {
        let cidr = k.json(&["get", "node", n])["spec"]["podCIDR"].clone();
        assert!(
            cidr.as_str().is_some_and(|c| c.starts_with("10.244.")),
            "node {n}'s podCIDR {cidr} is not from the Cluster's podCidr"
        );
    }
    let (first, second) = (names[0].clone(), names[1].clone());
    k.pod("web-0", "web", &first);
    k.pod("web-1", "web", &second);
    k.pod("batch-1", "batch", &second);
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
    k.budget_at(&env, 2, 0);
    let ip = until(&env, "web-0's pod IP", 60, || {
        k.json(&["get", "pod", "web-0"])["status"]["podIP"]
            .as_str()
            .map(str::to_string)
    });
    assert!(ip.starts_with("10.244."), "pod IP {ip}");

    // 1. knit delete node: blocked by the budget, then done.
    env.knit_ok(&["delete", "node", &first]);
    let blocked = until(&env, "the deleted node blocked by the budget", 90, || {
        draining(&env, "Blocked")
    });
    assert_eq!(blocked["name"], first.as_str());
    assert!(
        blocked["drain"]["blockingBudget"]
            .as_str()
            .is_some_and(|b| b.starts_with("default/web (minAvailable 2")),
        "{blocked}"
    );
    assert!(node_row(&env, &first).contains("Draining(default/web)"));
    assert_eq!(
        env.provider_names().len(),
        2,
        "nothing released while blocked"
    );
    assert_eq!(env.pool()["spec"]["replicas"], 1);
    k.min_available(1);
    until(&env, "the deleted node's machine released", 120, || {
        (env.provider_names().len() == 1 && env.nodes_of("workers").len() == 1).then_some(())
    });
    assert!(
        !k.run(&["get", "node", &first], None).0,
        "Node {first} deleted"
    );
    assert!(!k.pods().contains(&"web-0".to_string()), "web-0 evicted");
    let drained = event(&env, "Drained", &first).expect("a Drained event");
    assert!(
        drained["message"]
            .as_str()
            .unwrap()
            .contains("1 pod(s) evicted"),
        "{drained}"
    );

    // 2. The second node's kubelet frozen: repair replaces it, draining first.
    k.budget_at(&env, 1, 0);
    let id = env.nodes_of("workers")[0]["providerId"]
        .as_str()
        .expect("the node's provider id")
        .to_string();
    let (ok, out) = env.exec(
        &id,
        // SIGSTOP takes effect when the target next enters the kernel: on a loaded
        // host it can still read R just after kill returns, so wait for T.
        "pid=$(cut -d' ' -f1 /run/knit/kubelet.main.pid) && kill -STOP \"$pid\" && \
         for _ in $(seq 100); do grep -q '^State:.*stopped' /proc/$pid/status && break; sleep 0.1; done; \
         grep '^State' /proc/$pid/status",
    );
    assert!(ok && out.contains("stopped"), "freezing the kubelet: {out}");
    let blocked = until(&env, "repair's replace blocked by the budget", 300, || {
        draining(&env, "Blocked")
    });
    assert_eq!(blocked["name"], second.as_str());
    assert!(
        event(
            &env,
            "RepairReplacing",
            blocked["instance"].as_str().unwrap()
        )
        .is_some(),
        "{:?}",
        events(&env)
    );
    assert_ne!(
        k.json(&["get", "node", &second])["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .map(|c| c["status"].clone()),
        Some(Value::from("True")),
        "the node cannot confirm"
    );
    // The replacement may come up meanwhile; the old machine stays.
    let leaving = blocked["instance"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        env.provider_names().contains(&leaving),
        "{leaving} released while the replace's drain is blocked"
    );
    assert!(draining(&env, "Blocked").is_some(), "still blocked");
    k.min_available(0);
    let t = Instant::now();
    let drained = until(&env, "the frozen node drained", 60, || {
        event(&env, "Drained", &second)
    });
    let message = drained["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("skipped 2 terminating on a node that cannot confirm"),
        "{message}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(45),
        "drained after {:?}: the skip-wait is 5 s",
        t.elapsed()
    );
    let replacement = until(&env, "the replacement Ready", 300, || {
        let nodes = env.nodes_of("workers");
        nodes
            .iter()
            .find(|n| n["name"] != second.as_str() && n["status"] == "Ready")
            .and_then(|n| n["name"].as_str().map(str::to_string))
            .filter(|_| !env.provider_names().contains(&leaving))
    });
    until(
        &env,
        "the frozen node's pods gone with its Node",
        60,
        || {
            let pods = k.pods();
            (!pods.contains(&"web-1".to_string()) && !pods.contains(&"batch-1".to_string()))
                .then_some(())
        },
    );

    // 3. Pool delete with a pod the budget protects.
    k.pod("web-2", "web", &replacement);
    k.min_available(1);
    k.budget_at(&env, 1, 0);
    env.knit_ok(&["delete", "pool", "workers"]);
    let blocked = until(&env, "pool delete blocked by the budget", 90, || {
        draining(&env, "Blocked")
    });
    assert_eq!(blocked["name"], replacement.as_str());
    std::thread::sleep(Duration::from_secs(3));
    assert!(env.knit(&["get", "pools", "workers"]).0, "the pool stays");
    assert_eq!(env.provider_names().len(), 1, "its machine stays");
    k.min_available(0);
    until(&env, "the pool deleted", 180, || {
        (!env.knit(&["get", "pools", "workers"]).0).then_some(())
    });
    assert!(env.provider_names().is_empty());
    assert!(k.pods().is_empty(), "{:?}", k.pods());
}

/// The local package set's system images and one business image, in the
/// test's registry (as snapshot_e2e seeds them).
const SYSTEM_IMAGES: &[&str] = &[
    "registry.k8s.io/pause:3.10",
    "registry.k8s.io/kube-proxy:v1.31.4",
    "docker.io/flannel/flannel:v0.26.1",
];
const APP_IMAGE: &str = "docker.io/knit/app:1";

fn builder_pool_yaml(mirror: &str) -> String {
    format!(
        "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {{name: workers}}
spec:
  replicas: 0
  systemDisk: {{sizeGiB: 20}}
  dataDisks: [{{sizeGiB: 40, interface: nvme}}]
  containerd:
    registryMirrors:
      registry.k8s.io: [\"http://{mirror}\"]
      docker.io: [\"http://{mirror}\"]
    insecureRegistries: [\"{mirror}\"]
  preUserData: |
    touch /var/.skip-yum
    mkdir -p /etc/cni/net.d
    echo '{{\"cniVersion\":\"1.0.0\",\"name\":\"knit\",\"plugins\":[{{\"type\":\"loopback\"}}]}}' > /etc/cni/net.d/10-knit.conflist
"
    )
}

/// The snapshot builder's node, with a pod a budget protects, is drained
/// before its kubelet stops: the build waits at `detach` with the drain
/// blocked by the budget; once the budget allows, the pod is evicted and
/// ended by the (still running) kubelet stand-in, then the kubelet stops
/// and the build goes on to the snapshot.
#[test]
fn the_snapshot_builder_drains_its_node_before_the_kubelet_stops() {
    for bin in ["containerd", "runc", "docker-registry"] {
        assert!(
            common::on_path(bin),
            "{bin} is not installed (scripts/setup.sh)"
        );
    }
    let mut env = Env::builder()
        .cluster(true)
        .parallelism(2)
        .registry(true)
        .build();
    let state = env.path("server");
    env.knit_ok(&["package", "build", "--state-dir", state.to_str().unwrap()]);
    env.start_server();
    let push = env.registry_push_url();
    for r in SYSTEM_IMAGES {
        knit_registry::seed(&push, &env.path("work"), r, 1, 256 << 10).unwrap();
    }
    knit_registry::seed(&push, &env.path("work"), APP_IMAGE, 1, 1 << 20).unwrap();
    env.create("workers", &builder_pool_yaml(&env.registry_mirror()));
    let k = Kubectl(env.path("server/cluster/admin.kubeconfig"));
    k.ok(
        &["create", "--validate=false", "-f", "-"],
        Some(
            "apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: pinned}
spec: {minAvailable: 1, selector: {matchLabels: {app: pinned}}}
",
        ),
    );

    let out = env.knit_ok(&[
        "snapshot",
        "create",
        "--pool",
        "workers",
        "--images",
        APP_IMAGE,
        "--no-wait",
    ]);
    let id = out
        .split_whitespace()
        .find(|w| w.starts_with("build-"))
        .unwrap_or_else(|| panic!("no build id in {out:?}"))
        .to_string();
    let build = || env.json(&["snapshot", "builds", &id, "-o", "json"]);
    let builder_pool = build()["builderPool"].as_str().unwrap().to_string();
    // The builder registers and is drained within a second of it: the pod
    // is bound to its node before that, as soon as the machine exists
    // (node name `<region>.<instance id>`, region `local`; a pod bound to
    // a node that does not exist is kept 40 s). Pending or Running, the
    // budget allows no disruption of its one pod.
    let cloud = env.cloud();
    let deadline = Instant::now() + Duration::from_secs(300);
    let node = loop {
        if let Some(i) = cloud.list().ok().and_then(|l| l.into_iter().next()) {
            break format!("local.{}", i.record.id).to_lowercase();
        }
        assert!(
            Instant::now() < deadline,
            "no builder instance\n{}",
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    k.pod("pinned-0", "pinned", &node);
    assert!(
        !k.run(&["get", "node", &node], None).0,
        "{node} registered before its pod was made: the test lost the race"
    );
    let blocked = until(
        &env,
        "the builder's drain blocked by the budget",
        300,
        || {
            env.nodes_of(&builder_pool)
                .into_iter()
                .find(|n| n["drain"]["state"] == "Blocked")
        },
    );
    assert!(
        blocked["drain"]["blockingBudget"]
            .as_str()
            .is_some_and(|b| b.starts_with("default/pinned (minAvailable 1")),
        "{blocked}"
    );
    let b = build();
    assert_eq!(b["step"], "detach", "{b}");
    let steps = b["steps"].to_string();
    assert!(steps.contains("draining node"), "{steps}");
    assert!(!steps.contains("stopping the kubelet"), "{steps}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(build()["step"], "detach", "the build waits for the drain");

    // The budget allows: evicted, ended by the kubelet, then it stops.
    k.ok(&["delete", "pdb", "pinned"], None);
    let done = until(&env, "the build done", 900, || {
        let b = build();
        (b["done"] == true).then_some(b)
    });
    assert_eq!(done["status"], "Succeeded", "{done}");
    let messages: Vec<String> = done["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["message"].as_str().unwrap_or("").to_string())
        .collect();
    let drained_at = messages.iter().position(|m| m.contains("draining node"));
    let stopped_at = messages
        .iter()
        .position(|m| m.contains("stopping the kubelet"));
    assert!(
        drained_at.is_some() && stopped_at.is_some() && drained_at < stopped_at,
        "{messages:?}"
    );
    let drained = event(&env, "Drained", &node).expect("a Drained event for the builder");
    let message = drained["message"].as_str().unwrap();
    assert!(
        message.contains("1 pod(s) evicted") && !message.contains("cannot confirm"),
        "confirmed by the running kubelet: {message}"
    );
    assert!(k.pods().is_empty(), "{:?}", k.pods());
}
