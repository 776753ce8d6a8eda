//! `knit server --provider qemu` end to end: a pool of one QEMU VM — its own
//! kernel, systemd as PID 1, the image's cloud-init, an NVMe data disk —
//! joins the embedded cluster through the real agent and reaches Ready and
//! initialized; scaling to 0 removes the VM, its node and its QEMU process.
//!
//! Needs root and `qemu-system-x86_64` (scripts/setup.sh installs it). This
//! host has no nested virtualization, so the VM runs under TCG: several
//! minutes. Everything (the VM's state, its tap, the bridge) lives under the
//! test's own directory and subnet and is released by the guard on success,
//! failure and panic.

mod common;

use common::Env;
use std::time::{Duration, Instant};

const POOL: &str = "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: vms}
spec:
  replicas: 0
  joinTimeoutSeconds: 1800
  dataDisks: [{sizeGiB: 40, interface: nvme}]
";

#[test]
fn a_pool_of_one_vm_joins_and_is_released() {
    assert!(
        common::on_path("qemu-system-x86_64"),
        "qemu-system-x86_64 is missing: scripts/setup.sh installs it"
    );
    let mut env = Env::builder().cluster(true).provider("qemu").build();
    env.start(false);
    env.create("vms", POOL);
    env.knit_ok(&["scale", "pool", "vms", "--replicas", "1"]);

    // `--wait` would stop at its own limit; poll with a clear failure.
    let deadline = Instant::now() + Duration::from_secs(1500);
    let node = loop {
        let nodes = env.nodes_of("vms");
        if let Some(n) = nodes
            .iter()
            .find(|n| n["status"] == "Ready" && n["initialized"] == true)
        {
            break n.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no VM node Ready and initialized: {nodes:?}\n{}",
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_secs(5));
    };
    let name = node["name"].as_str().unwrap().to_string();
    let described = env.json(&["describe", "node", &name, "-o", "json"]);
    let timeline = described["timeline"].as_array().unwrap();
    // Each phase reports `started`, then how it ended: the last one counts.
    let phase = |p: &str| {
        timeline
            .iter()
            .rev()
            .find(|e| e["phase"] == p)
            .unwrap_or_else(|| panic!("no {p} in {timeline:?}"))
            .clone()
    };
    // Under systemd the image's own chrony unit keeps the clock.
    let time_sync = phase("time-sync");
    assert_eq!(time_sync["outcome"], "done", "{time_sync}");
    assert!(
        time_sync["reason"]
            .as_str()
            .is_some_and(|r| r.contains("the system's chrony service")),
        "{time_sync}"
    );
    // The data disk is the VM's NVMe controller, formatted by the agent.
    let data_disk = phase("data-disk");
    assert!(
        data_disk["reason"]
            .as_str()
            .is_some_and(|r| r.contains("/dev/nvme0n1")),
        "{data_disk}"
    );
    assert_eq!(phase("join")["outcome"], "done");
    assert!(
        env.processes_here()
            .iter()
            .any(|(_, cmd)| cmd.contains("qemu-system-x86_64")),
        "no QEMU process under the test's directory"
    );

    env.knit_ok(&[
        "scale",
        "pool",
        "vms",
        "--replicas",
        "0",
        "--wait",
        "--timeout",
        "600",
    ]);
    assert!(env.nodes_of("vms").is_empty(), "the node stays registered");
    let left: Vec<_> = env
        .processes_here()
        .into_iter()
        .filter(|(_, cmd)| cmd.contains("qemu-system-x86_64"))
        .collect();
    assert!(left.is_empty(), "QEMU still runs: {left:?}");
}
