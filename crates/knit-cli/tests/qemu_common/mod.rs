//! What the QEMU pool suites (`qemu_e2e`, `qemu_snapshot_e2e`) share: the
//! pool document, commands inside a node through `knit exec`, waiting for
//! Ready nodes, and the check that a teardown left no QEMU process, tap
//! device or file of the VMs it made.

#![allow(dead_code)] // each suite uses its own part

use crate::common::Env;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The local package set's system images (images.txt): seeded into the
/// test's registry, so the kubelet stand-in's pulls are real and logged.
pub const SYSTEM: &[&str] = &[
    "registry.k8s.io/pause:3.10",
    "registry.k8s.io/kube-proxy:v1.31.4",
    "docker.io/flannel/flannel:v0.26.1",
];

/// The file the pools' `#cloud-config` user data writes, and its content.
pub const CLOUD_CONFIG_FILE: &str = "/etc/knit-e2e/from-cloud-config";
pub const CLOUD_CONFIG_TEXT: &str = "written by cloud-init's write_files";

/// A VM pool: `disks` is the `dataDisks` flow list; containerd pulls
/// through the test's registry (`mirror`, plain HTTP); the user data is a
/// `#cloud-config` document with one `write_files` entry.
pub fn pool_yaml(name: &str, mirror: &str, disks: &str) -> String {
    format!(
        "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {{name: {name}}}
spec:
  replicas: 0
  joinTimeoutSeconds: 1800
  dataDisks: {disks}
  containerd:
    registryMirrors:
      registry.k8s.io: [\"http://{mirror}\"]
      docker.io: [\"http://{mirror}\"]
    insecureRegistries: [\"{mirror}\"]
  userData: |
    #cloud-config
    write_files:
    - path: {CLOUD_CONFIG_FILE}
      content: \"{CLOUD_CONFIG_TEXT}\\n\"
      permissions: '0644'
"
    )
}

/// Seeds `images` (small, built here) into the environment's registry.
pub fn seed(env: &Env, images: &[&str]) {
    let push = env.registry_push_url();
    for r in images {
        knit_registry::seed(&push, &env.path("work"), r, 1, 256 << 10)
            .unwrap_or_else(|e| panic!("seeding {r}: {e}"));
    }
}

/// `sh -c script` on node `node` through `knit exec` (the server's API,
/// the provider's guest agent): exit code (`None`: knit itself failed,
/// e.g. the VM is rebooting) and stdout + stderr.
pub fn node_sh(env: &Env, node: &str, script: &str) -> (Option<i32>, String) {
    let out = env
        .cmd()
        .args([
            "exec",
            "node",
            node,
            "--timeout",
            "120",
            "--",
            "sh",
            "-c",
            script,
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// `node_sh` that must exit 0: its output.
pub fn node_ok(env: &Env, node: &str, script: &str) -> String {
    let (code, out) = node_sh(env, node, script);
    assert_eq!(code, Some(0), "on {node}: {script}\n{out}");
    out
}

/// Polls `script` on `node` until its output satisfies `done` (commands
/// that fail meanwhile are retried): the last output.
pub fn node_until(
    env: &Env,
    node: &str,
    script: &str,
    limit: Duration,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let (code, out) = node_sh(env, node, script);
        if code == Some(0) && done(&out) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "on {node} after {} s: {script}\n{out}",
            limit.as_secs()
        );
        std::thread::sleep(Duration::from_secs(3));
    }
}

/// Waits until `pool` has `n` nodes Ready and initialized: them, sorted by name.
pub fn wait_ready(env: &Env, pool: &str, n: usize, limit: Duration) -> Vec<Value> {
    let deadline = Instant::now() + limit;
    loop {
        let nodes = env.nodes_of(pool);
        let mut ready: Vec<Value> = nodes
            .iter()
            .filter(|n| n["status"] == "Ready" && n["initialized"] == true)
            .cloned()
            .collect();
        if ready.len() >= n {
            ready.sort_by_key(|n| n["name"].as_str().unwrap_or("").to_string());
            return ready;
        }
        assert!(
            Instant::now() < deadline,
            "pool {pool}: {} of {n} nodes Ready and initialized after {} s: {nodes:?}\n{}",
            ready.len(),
            limit.as_secs(),
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_secs(5));
    }
}

/// The last report of phase `p` in a `knit describe node -o json` document.
pub fn phase(described: &Value, p: &str) -> Value {
    let timeline = described["timeline"].as_array().unwrap();
    timeline
        .iter()
        .rev()
        .find(|e| e["phase"] == p)
        .unwrap_or_else(|| panic!("no {p} in {timeline:?}"))
        .clone()
}

/// knit-qemu's view of the server's VMs (the state directory the test
/// environment gives the server).
pub fn machines(env: &Env) -> knit_qemu::Machines {
    let local = env.local_config();
    knit_qemu::Machines::open(knit_qemu::Config {
        state_dir: env.path("qemu"),
        bridge: local.bridge,
        subnet: local.subnet,
        ..knit_qemu::Config::default()
    })
    .unwrap()
}

/// What one VM holds on the host: its QEMU processes, its tap, its directory.
#[derive(Debug, Clone)]
pub struct Held {
    pub id: String,
    pub pids: Vec<i32>,
    pub tap: String,
    pub dir: PathBuf,
}

/// What every VM of the server holds now.
pub fn held(env: &Env) -> Vec<Held> {
    let m = machines(env);
    m.list()
        .unwrap()
        .into_iter()
        .map(|vm| Held {
            pids: m.qemu_pids(&vm.record.id),
            id: vm.record.id.clone(),
            tap: vm.record.tap.clone(),
            dir: vm.dir.clone(),
        })
        .collect()
}

/// Whether `pid` is gone (a zombie awaiting its reaper counts as gone).
fn gone(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.contains(") Z "))
        .unwrap_or(true)
}

/// Asserts that none of `vms` left a QEMU process, a tap device or a file,
/// and that no QEMU process names the environment's directory.
pub fn assert_released(env: &Env, vms: &[Held]) {
    for vm in vms {
        for pid in &vm.pids {
            assert!(gone(*pid), "QEMU of {} (pid {pid}) still runs", vm.id);
        }
        assert!(
            !Path::new("/sys/class/net").join(&vm.tap).exists(),
            "tap {} of {} left",
            vm.tap,
            vm.id
        );
        assert!(!vm.dir.exists(), "{} left", vm.dir.display());
        // The tap's anti-spoofing guard goes with it (the kernel keeps a
        // port's set elements when its device goes).
        let bridge = env.local_config().bridge;
        let guarded = knit_local::net::guarded_ports(&bridge);
        assert!(
            !guarded.iter().any(|(port, _)| *port == vm.tap),
            "the guard of {} ({}) left on {bridge}: {guarded:?}",
            vm.tap,
            vm.id
        );
    }
    let qemu: Vec<_> = env
        .processes_here()
        .into_iter()
        .filter(|(_, cmd)| cmd.contains("qemu-system-x86_64"))
        .collect();
    assert!(qemu.is_empty(), "QEMU still runs: {qemu:?}");
    let vms_dir = env.path("qemu").join("vms");
    let left: Vec<_> = std::fs::read_dir(&vms_dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "left under {}: {left:?}",
        vms_dir.display()
    );
}
