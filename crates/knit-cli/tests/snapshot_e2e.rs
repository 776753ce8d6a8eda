//! Data-disk snapshots end to end, all real: the control plane with the
//! embedded cluster, the local cloud (namespaces, loop disks, a bridge of
//! this test's own), the real agent, real containerd in each instance, the
//! kubelet stand-in ensuring system images through CRI, and a real
//! `docker-registry` seeded with images built here (none from the internet),
//! reached by containerd through the pool's registry mirrors over HTTP.
//!
//! 1. `knit snapshot create` from a pool: recorded with versions and digests.
//! 2. A pool from the snapshot reaches Ready with zero package downloads and
//!    zero image pulls: no `check cached kubernetes failed`, no
//!    `pulled image` in the kubelet log, no blob GET in the registry's
//!    access log; the disk was mounted as is (never reformatted).
//! 3. Deleting the snapshot while the pool uses it is refused.
//! 4. The cluster moves to another Kubernetes version: the snapshot is
//!    listed stale, a pool from it gets a warning (`--strict`: refused), and
//!    its node downloads the package and still gets Ready.
//!
//! Needs root and the workspace's binaries beside `knit` (knit-agent,
//! knit-local, knit-kubelet-sim), containerd, runc and docker-registry.

mod common;

use common::{is_root, on_path, tail, Env};
use serde_json::Value;
use std::time::{Duration, Instant};

/// The local package set's system images (images.txt) and one business image.
const SYSTEM: &[&str] = &[
    "registry.k8s.io/pause:3.10",
    "registry.k8s.io/kube-proxy:v1.31.4",
    "docker.io/flannel/flannel:v0.26.1",
];
const APP: &str = "docker.io/knit/app:1";

fn pool_yaml(name: &str, mirror: &str, snapshot: Option<&str>) -> String {
    let disk = match snapshot {
        Some(s) => format!("[{{snapshotId: {s}, interface: nvme}}]"),
        None => "[{sizeGiB: 40, interface: nvme}]".to_string(),
    };
    format!(
        "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {{name: {name}}}
spec:
  replicas: 0
  systemDisk: {{sizeGiB: 20}}
  dataDisks: {disk}
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

fn scale(env: &Env, pool: &str, n: &str) -> String {
    env.knit_ok(&[
        "scale",
        "pool",
        pool,
        "--replicas",
        n,
        "--wait",
        "--timeout",
        "600",
    ])
}

#[test]
fn snapshot_build_use_stale_and_delete() {
    assert!(is_root(), "this test needs root");
    for bin in ["containerd", "runc", "docker-registry"] {
        assert!(on_path(bin), "{bin} is not installed (scripts/setup.sh)");
    }
    let mut env = Env::builder()
        .cluster(true)
        .parallelism(2)
        .registry(true)
        .build();
    let state = env.path("server");
    let state = state.to_str().unwrap();
    env.knit_ok(&["package", "build", "--state-dir", state]);
    // A second version in the mirror, for the stale case.
    env.knit_ok(&[
        "package",
        "build",
        "--state-dir",
        state,
        "--kubernetes-version",
        "1.31.5",
    ]);
    env.start_server();

    // The registry (started with the server) listens on every address, so
    // that instances reach it at the bridge gateway (made by the first
    // instance).
    let reg = env.registry();
    let push = env.registry_push_url();
    for r in SYSTEM {
        knit_registry::seed(&push, &env.path("work"), r, 1, 256 << 10).unwrap();
    }
    knit_registry::seed(&push, &env.path("work"), APP, 2, 4 << 20).unwrap();
    let mirror = env.registry_mirror();

    std::fs::write(
        env.path("workers.yaml"),
        pool_yaml("workers", &mirror, None),
    )
    .unwrap();
    env.knit_ok(&["create", "-f", env.path("workers.yaml").to_str().unwrap()]);

    // 1. Build.
    let out = env.knit_ok(&[
        "snapshot",
        "create",
        "--pool",
        "workers",
        "--images",
        APP,
        "--timeout",
        "900",
    ]);
    for step in [
        "builder", "ready", "package", "images", "detach", "snapshot", "release",
    ] {
        assert!(out.contains(step), "step {step} missing:\n{out}");
    }
    let list: Value =
        serde_json::from_str(&env.knit_ok(&["snapshot", "list", "-o", "json"])).unwrap();
    let snap = list["items"][0].clone();
    let sid = snap["id"].as_str().unwrap().to_string();
    assert_eq!(snap["kubernetesVersion"], "1.31.4", "{snap}");
    assert_eq!(snap["stale"], false);
    assert!(
        snap["containerdVersion"].as_str().unwrap().starts_with('1'),
        "{snap}"
    );
    let images: Vec<String> = snap["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap().to_string())
        .collect();
    assert_eq!(images.len(), 4, "{images:?}");
    assert!(images.iter().all(|i| i.contains("@sha256:")), "{images:?}");
    assert!(images.iter().any(|i| i.starts_with(APP)), "{images:?}");
    // The builder is released: only the snapshot remains at the provider.
    let cloud = env.cloud();
    assert!(cloud.list().unwrap().is_empty(), "builder not released");
    assert_eq!(cloud.snapshots().unwrap().len(), 1);

    // 2. A pool from the snapshot: nothing downloaded, nothing pulled.
    let gets_before = knit_registry::count_blob_gets(&reg.log_text());
    let manifests_before = knit_registry::count_manifest_gets(&reg.log_text());
    std::fs::write(
        env.path("fast.yaml"),
        pool_yaml("fast", &mirror, Some(&sid)),
    )
    .unwrap();
    let (ok, _, err) = env.knit(&["create", "-f", env.path("fast.yaml").to_str().unwrap()]);
    assert!(ok && !err.contains("Warning"), "{err}");
    scale(&env, "fast", "1");
    let node = env.nodes_of("fast")[0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let instance = env.nodes_of("fast")[0]["instance"]
        .as_str()
        .unwrap()
        .to_string();
    // The stand-in publishes its report shortly after start.
    let deadline = Instant::now() + Duration::from_secs(120);
    let described = loop {
        let d = env.knit_ok(&["describe", "node", &node]);
        if d.contains("Images:        cache hit") || Instant::now() > deadline {
            break d;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        described.contains("Package:       data-disk cache hit"),
        "{described}"
    );
    assert!(
        described.contains("Images:        cache hit 3, miss 0, failed 0, 0 bytes pulled"),
        "{described}"
    );
    let init = env.knit_ok(&["logs", "node", &node]);
    assert!(!init.contains("check cached kubernetes failed"), "{init}");
    assert!(init.contains("using cached kubernetes 1.31.4"), "{init}");
    assert!(init.contains("mount as is, never wipe"), "{init}");
    assert!(!init.contains("mkfs"), "{init}");
    let kubelet = env.node_file(&instance, "/var/log/knit/kubelet.log");
    assert_eq!(kubelet.matches("pulled image").count(), 0, "{kubelet}");
    assert_eq!(
        kubelet.matches("already present on machine").count(),
        3,
        "{kubelet}"
    );
    let log = reg.log_text();
    assert_eq!(
        knit_registry::count_blob_gets(&log),
        gets_before,
        "{}",
        tail(&log, 20)
    );
    assert_eq!(knit_registry::count_manifest_gets(&log), manifests_before);
    // The business image is on the node too.
    let report: Value =
        serde_json::from_str(&env.node_file(&instance, "/var/lib/kubelet/knit-images.json"))
            .unwrap();
    assert_eq!(report["hit"], 3, "{report}");

    // 3. In use: deletion refused.
    let (ok, _, err) = env.knit(&["snapshot", "delete", &sid]);
    assert!(!ok && err.contains("used by pool(s) fast"), "{err}");

    // 4. The cluster moves to 1.31.5: stale.
    let cluster: Value =
        serde_json::from_str(&env.knit_ok(&["get", "clusters", "-o", "json"])).unwrap();
    let cluster = cluster["items"].get(0).cloned().unwrap_or(cluster);
    let mut cluster = cluster.clone();
    cluster["spec"]["kubernetesVersion"] = "1.31.5".into();
    cluster.as_object_mut().unwrap().remove("status");
    std::fs::write(
        env.path("cluster.yaml"),
        serde_json::to_string(&cluster).unwrap(),
    )
    .unwrap();
    env.knit_ok(&["apply", "-f", env.path("cluster.yaml").to_str().unwrap()]);
    let list: Value =
        serde_json::from_str(&env.knit_ok(&["snapshot", "list", "-o", "json"])).unwrap();
    assert_eq!(list["items"][0]["stale"], true);
    assert!(env
        .knit_ok(&["snapshot", "list"])
        .contains("yes (cluster 1.31.5)"));
    std::fs::write(
        env.path("stale.yaml"),
        pool_yaml("stale", &mirror, Some(&sid)),
    )
    .unwrap();
    let (ok, _, err) = env.knit(&[
        "create",
        "--strict",
        "-f",
        env.path("stale.yaml").to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("1.31.4") && err.contains("1.31.5"),
        "{err}"
    );
    let (ok, _, err) = env.knit(&["create", "-f", env.path("stale.yaml").to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        err.contains("Warning") && err.contains("holds Kubernetes 1.31.4, the cluster runs 1.31.5"),
        "{err}"
    );
    scale(&env, "stale", "1");
    let node = env.nodes_of("stale")[0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let init = env.knit_ok(&["logs", "node", &node]);
    assert!(
        init.contains(
            "check cached kubernetes failed: cache holds version 1.31.4, this node wants 1.31.5"
        ),
        "{init}"
    );
    assert!(init.contains("mount as is, never wipe"), "{init}");
    assert_eq!(env.nodes_of("stale")[0]["status"], "Ready");
    let described = env.knit_ok(&["describe", "node", &node]);
    assert!(
        described.contains("Package:       cache miss"),
        "{described}"
    );

    // Pools gone: the snapshot can be deleted.
    for p in ["fast", "stale", "workers"] {
        env.knit_ok(&["delete", "pool", p]);
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (ok, _, err) = env.knit(&["snapshot", "delete", &sid]);
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "{err}");
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(cloud.snapshots().unwrap().is_empty());
}
