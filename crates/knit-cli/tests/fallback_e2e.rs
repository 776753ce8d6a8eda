//! Instance-type fallback for a booted machine (issue 25): the local
//! cloud's capacity for a pool's first type is 0 (`knit local capacity
//! TYPE 0`, as a zone sold out), the pool is scaled to 1, and the machine
//! is made with the pool's next type, boots, and its Node joins the
//! embedded cluster Ready with `node.kubernetes.io/instance-type` the
//! fallback type (read with the real kubectl); knit's record says the same
//! and an InstanceTypeFallback event names both types and why.
//!
//! Needs root and the workspace's binaries (see local_e2e.rs); kubectl is
//! required (installed by scripts/setup.sh --tests).

mod common;

use common::Env;
use serde_json::Value;
use std::process::Command;

const POOL: &str = "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: workers}
spec:
  replicas: 0
  systemDisk: {sizeGiB: 20}
  instanceTypes: [ecs.g7.large, ecs.c7.large]
";

#[test]
fn a_sold_out_type_falls_back_and_the_node_joins_with_the_next() {
    assert!(
        common::on_path("kubectl"),
        "kubectl is needed (scripts/setup.sh --tests installs it)"
    );
    let mut env = Env::builder().cluster(true).parallelism(1).build();
    // The documented command, run through `knit local` on this test's own
    // local cloud.
    let local = env.local_config();
    let local_args = |rest: &[&str]| -> Vec<String> {
        let mut args = vec![
            "local".to_string(),
            "--state-dir".to_string(),
            local.state_dir.to_string_lossy().into_owned(),
            "--bridge".to_string(),
            local.bridge.clone(),
            "--subnet".to_string(),
            local.subnet.clone(),
        ];
        args.extend(rest.iter().map(|s| s.to_string()));
        args
    };
    let set = local_args(&["capacity", "ecs.g7.large", "0"]);
    env.knit_ok(&set.iter().map(String::as_str).collect::<Vec<_>>());
    let printed = env.knit_ok(
        &local_args(&["capacity"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let printed: Value = serde_json::from_str(&printed).unwrap();
    assert_eq!(printed["ecs.g7.large"], 0, "{printed}");

    env.start(true);
    env.create("pool", POOL);
    let out = env.scale_wait("workers", 1);
    assert!(out.contains("1/1 initialized and Ready"), "{out}");

    // knit's record and the local cloud: the one machine is of the
    // fallback type, and the sold-out type made nothing.
    let instances = env.store_instances();
    assert_eq!(instances.len(), 1, "{instances:?}");
    assert_eq!(
        instances[0]["instanceType"], "ecs.c7.large",
        "{instances:?}"
    );
    let machines = env.cloud().list().unwrap();
    assert_eq!(machines.len(), 1);
    assert_eq!(machines[0].record.template.instance_type, "ecs.c7.large");

    // The Node, through the real kubectl.
    let nodes = env.json(&["get", "nodes", "-o", "json"]);
    let node = nodes["items"][0]["name"].as_str().unwrap().to_string();
    let kubeconfig = env.state_dir().join("cluster/admin.kubeconfig");
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--request-timeout=20s")
        .args(["get", "node", &node, "-o", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let k8s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        k8s["metadata"]["labels"]["node.kubernetes.io/instance-type"], "ecs.c7.large",
        "{k8s}"
    );
    let ready = k8s["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    assert!(ready, "{k8s}");

    // The event: which type had no capacity, why, and which was tried.
    let events = env.knit_ok(&["get", "events"]);
    let fallback: Vec<&str> = events
        .lines()
        .filter(|l| l.contains("InstanceTypeFallback"))
        .collect();
    assert_eq!(fallback.len(), 1, "{events}");
    assert!(
        fallback[0].contains("ecs.g7.large has no capacity")
            && fallback[0].contains("OutOfCapacity")
            && fallback[0].contains("trying ecs.c7.large"),
        "{events}"
    );

    env.scale_wait("workers", 0);
}
