//! Data-disk snapshots end to end, all real: the control plane with the
//! embedded cluster, the local cloud (namespaces, loop disks, a bridge of
//! this test's own), the real agent, real containerd in each instance, the
//! kubelet stand-in ensuring system images through CRI, and a real
//! `docker-registry` seeded with images built here (none from the internet),
//! reached by containerd through the pool's registry mirrors over HTTP.
//!
//! 1. `knit snapshot create` from a pool: recorded with versions and digests;
//!    the snapshot's filesystem, mounted read-only, holds only the agent's
//!    keep-list (`knit_api::agent::SNAPSHOT_KEEP`).
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
    // Two data disks: the runtime disk (the one the agent mounts, and the
    // one snapshotted) is the last; the first stays empty.
    let disk = match snapshot {
        Some(s) => {
            format!("[{{sizeGiB: 40, interface: nvme}}, {{snapshotId: {s}, interface: nvme}}]")
        }
        None => "[{sizeGiB: 40, interface: nvme}, {sizeGiB: 40, interface: nvme}]".to_string(),
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

    // The registry (started with the server, after the local cloud's
    // network) listens on the bridge's address alone: where instances
    // reach it, and the test pushes.
    let reg = env.registry();
    let port = reg.addr().rsplit_once(':').unwrap().1.to_string();
    assert_eq!(
        common::listeners(&port),
        vec![reg.addr().to_string()],
        "the registry listens elsewhere than {}",
        reg.addr()
    );
    assert!(reg.addr().starts_with(&format!("{}:", env.gateway)));
    let push = env.registry_push_url();
    for r in SYSTEM {
        knit_registry::seed(&push, &env.path("work"), r, 1, 256 << 10).unwrap();
    }
    knit_registry::seed(&push, &env.path("work"), APP, 2, 4 << 20).unwrap();
    let mirror = env.registry_mirror();

    // A registry that takes connections and never answers (a listener on
    // the bridge's address that is never accepted from): pulls from it
    // hang. Plain HTTP, so that nothing but our deadline ends them.
    let hanging = std::net::TcpListener::bind((env.gateway.as_str(), 0)).unwrap();
    let hanging_addr = hanging.local_addr().unwrap().to_string();
    let workers = pool_yaml("workers", &mirror, None).replace(
        &format!("insecureRegistries: [\"{mirror}\"]"),
        &format!("insecureRegistries: [\"{mirror}\", \"{hanging_addr}\"]"),
    );
    assert!(workers.contains(&hanging_addr), "{workers}");
    env.create("workers", &workers);

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
    // docs/spec.md §3.2's order: the node leaves the cluster (instance kept) before
    // the package and the images; the instance stops before the snapshot.
    let order = [
        "builder", "ready", "detach", "package", "images", "clean", "stop", "snapshot", "release",
    ];
    let printed = step_order(&out);
    assert_eq!(printed, [&order[..], &["done"]].concat(), "{out}");
    let id = out
        .split_whitespace()
        .find(|w| w.starts_with("build-"))
        .unwrap()
        .to_string();
    let build = env.json(&["snapshot", "builds", &id, "-o", "json"]);
    assert_eq!(build["status"], "Succeeded", "{build}");
    assert_eq!(build["step"], "release", "{build}");
    let stored: Vec<&str> = build["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap())
        .collect();
    let mut dedup = stored.clone();
    dedup.dedup();
    assert_eq!(dedup, [&order[..], &["done"]].concat(), "{build}");
    assert!(
        env.knit_ok(&["snapshot", "builds"]).contains("Succeeded"),
        "builds table"
    );
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
    // 1a. The snapshot holds the keep-list and nothing else: no kubelet
    // directory (credentials, pods), no containers, no runtime state.
    let clean: Vec<&str> = build["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step"] == "clean")
        .map(|s| s["message"].as_str().unwrap_or(""))
        .collect();
    assert!(
        clean.iter().any(|m| m.contains("scrubbed to the keep-list")
            && m.contains("kubelet")
            && m.contains("freed blocks discarded")),
        "{clean:?}"
    );
    let paths = snapshot_paths(&env, &sid);
    let stray: Vec<&String> = paths
        .iter()
        .filter(|p| !knit_api::agent::snapshot_keeps(p))
        .collect();
    assert!(stray.is_empty(), "off the keep-list in {sid}: {stray:?}");
    for kept in [
        "ack/kubernetes/knit-cache.json",
        "containerd/io.containerd.metadata.v1.bolt/meta.db",
        "containerd/io.containerd.content.v1.content/blobs/sha256",
    ] {
        assert!(paths.iter().any(|p| p == kept), "{kept}: {paths:?}");
    }

    // 1b. An unreachable registry (a closed port) fails the build at
    // `images` with the registry's error and the fix, instead of waiting
    // forever; the builder is cleaned up.
    let (ok, out, err) = env.knit(&[
        "snapshot",
        "create",
        "--pool",
        "workers",
        "--images",
        "127.0.0.1:1/acme/unreachable:1",
        "--images-timeout",
        "300",
        "--timeout",
        "900",
    ]);
    assert!(!ok, "{out}{err}");
    let failed_id = out
        .split_whitespace()
        .find(|w| w.starts_with("build-"))
        .unwrap()
        .to_string();
    let failed = env.json(&["snapshot", "builds", &failed_id, "-o", "json"]);
    assert_eq!(failed["status"], "Failed", "{failed}");
    assert_eq!(failed["step"], "images", "{failed}");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("127.0.0.1:1/acme/unreachable:1")
            && error.contains("registryMirrors")
            && error.contains("knit registry up"),
        "{failed}"
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    while !cloud.list().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "failed builder not released");
        std::thread::sleep(Duration::from_secs(1));
    }

    // 1c. A registry that never answers: the pull is ended by the images
    // step's deadline (before: the build sat at `images` indefinitely),
    // with progress on the way and the fix in the error.
    let hang_image = format!("{hanging_addr}/acme/hang:1");
    let (ok, out, err) = env.knit(&[
        "snapshot",
        "create",
        "--pool",
        "workers",
        "--images",
        &hang_image,
        "--images-timeout",
        "40",
        "--timeout",
        "900",
    ]);
    assert!(!ok, "{out}{err}");
    let hung_id = out
        .split_whitespace()
        .find(|w| w.starts_with("build-"))
        .unwrap()
        .to_string();
    let hung = env.json(&["snapshot", "builds", &hung_id, "-o", "json"]);
    assert_eq!(hung["status"], "Failed", "{hung}");
    assert_eq!(hung["step"], "images", "{hung}");
    let error = hung["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("within the deadline of 40s") && error.contains("knit registry up"),
        "{hung}"
    );
    assert!(
        hung["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["message"]
                .as_str()
                .unwrap_or("")
                .contains("still pulling after")),
        "{hung}"
    );
    drop(hanging);
    let deadline = Instant::now() + Duration::from_secs(300);
    while !cloud.list().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "failed builder not released");
        std::thread::sleep(Duration::from_secs(1));
    }

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
    // The stand-in publishes its report shortly after start; until then
    // describe reads the report file it writes first (a node done sooner
    // than that, `knit scale --wait` returning at once, saw the file).
    let deadline = Instant::now() + Duration::from_secs(120);
    let described = loop {
        let d = env.knit_ok(&["describe", "node", &node]);
        let published = env.json(&["describe", "node", &node, "-o", "json"])["cache"]["images"]
            ["source"]
            == "node annotation";
        if (published && d.contains("Images:        cache hit")) || Instant::now() > deadline {
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
    // The same details as one document (`describe -o json`).
    let doc = env.json(&["describe", "node", &node, "-o", "json"]);
    assert_eq!(doc["name"], node.as_str(), "{doc}");
    assert_eq!(doc["cache"]["images"]["hit"], 3, "{doc}");
    assert_eq!(doc["cache"]["images"]["source"], "node annotation", "{doc}");
    assert_eq!(doc["cache"]["package"]["cacheHit"], true, "{doc}");
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

/// The steps of `knit snapshot create`'s progress lines (`[  1.0s] step …`),
/// each once, in order.
/// Every path on snapshot `sid`'s filesystem (relative), read from its
/// file in the local cloud's block store mounted read-only on a loop device
/// in a mount namespace of its own (both go when `unshare` ends).
fn snapshot_paths(env: &Env, sid: &str) -> Vec<String> {
    let file = env.path(&format!("local/snapshots/{sid}/snapshot.img"));
    let view = env.path("work/snapshot-view");
    std::fs::create_dir_all(&view).unwrap();
    let out = std::process::Command::new("timeout")
        .args([
            "120",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
        ])
        .arg("mount -o ro,loop,noload \"$1\" \"$2\" && find \"$2\" -mindepth 1 -printf '%P\\n'")
        .arg("sh")
        .arg(&file)
        .arg(&view)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "list {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn step_order(out: &str) -> Vec<String> {
    let mut steps: Vec<String> = out
        .lines()
        .filter(|l| l.starts_with('['))
        .filter_map(|l| {
            l.split_once(']')
                .and_then(|(_, r)| r.split_whitespace().next())
        })
        .map(str::to_string)
        .collect();
    steps.dedup();
    steps
}

/// `knit registry down` for this test's state directory when dropped (also
/// on panic): the registry `knit registry up` started is no child of ours.
struct RegistryDown(String);

impl Drop for RegistryDown {
    fn drop(&mut self) {
        let _ = std::process::Command::new(common::knit())
            .args(["registry", "down", "--state-dir", &self.0])
            .status();
    }
}

/// A build cut off by the server's end: SIGKILL while paused after its
/// `images` step (`KNIT_SERVER_PAUSE_AT=snapshot-images`), when the builder
/// is out of the cluster and of its pool (Detached) but running with its
/// images pulled — only the build knows it. After the restart the build is
/// reported failed at step `images` (API and CLI), and nothing is left: no
/// instance at the provider or in the store, no builder pool, no snapshot.
/// Then a second build is cut off right after its snapshot was recorded
/// (`snapshot-snapshot`): after the restart it only lacked its release,
/// which is done, and it succeeds with its snapshot listed and usable,
/// its builder gone.
/// The registry is the one `knit registry up --seed` starts once
/// `knit local network-up` made the bridge: on the bridge address alone,
/// pulled from through the mirror it prints; `knit down` stops it.
#[test]
fn snapshot_build_interrupted_by_a_restart_fails_at_its_step_and_leaks_nothing() {
    assert!(is_root(), "this test needs root");
    for bin in ["containerd", "runc", "docker-registry"] {
        assert!(on_path(bin), "{bin} is not installed (scripts/setup.sh)");
    }
    let mut env = Env::builder()
        .cluster(true)
        .env("KNIT_SERVER_PAUSE_AT", "snapshot-images")
        .build();
    env.build_package(true);
    env.start_server();
    // The local cloud's network first (`knit local network-up`): `knit
    // registry up` then listens on the bridge's address alone.
    env.network_up();
    let state = env.state_dir().to_str().unwrap().to_string();
    let reg_port = common::free_port().to_string();
    let up = env.knit_ok(&[
        "registry",
        "up",
        "--state-dir",
        &state,
        "--local-subnet",
        &env.subnet,
        "--port",
        &reg_port,
        "--seed",
        "--image",
        &format!("{APP}=1M"),
    ]);
    let _registry = RegistryDown(state.clone());
    let mirror = format!("{}:{reg_port}", env.gateway);
    assert!(
        up.contains(&format!("registry.k8s.io: [\"http://{mirror}\"]")),
        "{up}"
    );
    assert!(!up.contains("every address"), "{up}");
    assert!(up.contains(&format!(" on {mirror};")), "{up}");
    assert_eq!(common::listeners(&reg_port), vec![mirror.clone()]);
    for r in SYSTEM {
        assert!(up.contains(&format!("pushed {r} ")), "{up}");
    }
    let status = env.json(&["registry", "status", "--state-dir", &state, "-o", "json"]);
    assert_eq!(status["running"], true, "{status}");
    assert_eq!(status["answers"], true, "{status}");
    assert_eq!(status["mirror"], mirror.as_str(), "{status}");
    assert_eq!(status["listen"], mirror.as_str(), "{status}");
    assert_eq!(
        status["repositories"].as_array().unwrap().len(),
        4,
        "{status}"
    );
    let reg_pid = status["pid"].as_u64().unwrap();
    // A second `up` finds it running.
    let again = env.knit_ok(&["registry", "up", "--state-dir", &state, "--port", &reg_port]);
    assert!(again.contains("already running"), "{again}");
    env.create("workers", &pool_yaml("workers", &mirror, None));
    // Paused after the images step.
    let (id, b) = build_paused_at(&env, "images");
    assert_eq!(b["step"], "images", "{b}");
    let builder = b["builderInstance"].as_str().unwrap().to_string();
    let builder_pool = b["builderPool"].as_str().unwrap().to_string();
    assert!(env.provider_names().contains(&builder), "{b}");
    let rec = env
        .store_instances()
        .into_iter()
        .find(|i| i["name"] == builder.as_str())
        .unwrap();
    assert_eq!(rec["state"], "Detached", "{rec}");

    env.kill_server();
    env.start_server();

    // Failed at its step, at once (before the clean-up ends).
    let b = env.json(&["snapshot", "builds", &id, "-o", "json"]);
    assert_eq!(b["status"], "Failed", "{b}");
    assert_eq!(b["done"], true, "{b}");
    assert_eq!(b["step"], "images", "{b}");
    let error = b["error"].as_str().unwrap();
    assert!(error.contains("interrupted at step images"), "{error}");
    let table = env.knit_ok(&["snapshot", "builds"]);
    let row = table.lines().find(|l| l.starts_with(&id)).unwrap();
    assert!(row.contains("Failed") && row.contains("images"), "{table}");
    let shown = env.knit_ok(&["snapshot", "builds", &id]);
    assert!(
        shown.contains("Error:") && shown.contains("interrupted at step images"),
        "{shown}"
    );

    // Nothing leaked: the builder released at the provider and gone from
    // the store, the builder pool removed, no snapshot made.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let at_provider = env.provider_names();
        let in_store: Vec<Value> = env
            .store_instances()
            .into_iter()
            .filter(|i| i["name"] == builder.as_str())
            .collect();
        let pool_left = env.knit(&["get", "pools", &builder_pool]).0;
        if at_provider.is_empty() && in_store.is_empty() && !pool_left {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left: provider {at_provider:?}, store {in_store:?}, pool {pool_left}\n{}",
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(env.cloud().snapshots().unwrap().is_empty());
    let list = env.json(&["snapshot", "list", "-o", "json"]);
    assert_eq!(list["items"].as_array().unwrap().len(), 0, "{list}");
    let b = env.json(&["snapshot", "builds", &id, "-o", "json"]);
    let cleanup: Vec<&str> = b["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step"] == "cleanup")
        .map(|s| s["message"].as_str().unwrap())
        .collect();
    assert!(
        cleanup
            .iter()
            .any(|m| m.contains(&format!("builder instance {builder} released"))),
        "{b}"
    );
    assert!(cleanup.contains(&"clean-up complete"), "{b}");
    assert_eq!(b["step"], "images", "clean-up does not move the step: {b}");
    // The images were pulled through the registry `knit registry up` made.
    let log = std::fs::read_to_string(env.state_dir().join("registry/registry.log")).unwrap();
    assert!(
        knit_registry::count_blob_gets(&log) >= 4,
        "{}",
        tail(&log, 20)
    );

    // A build cut off right after its snapshot was recorded only lacks
    // the release: the restart releases the builder and the build succeeds.
    env.kill_server();
    env.set_env("KNIT_SERVER_PAUSE_AT", Some("snapshot-snapshot"));
    env.start_server();
    let (id, b) = build_paused_at(&env, "snapshot");
    assert_eq!(b["status"], "Running", "{b}");
    assert_eq!(b["step"], "snapshot", "{b}");
    let sid = b["snapshotId"].as_str().unwrap().to_string();
    let builder = b["builderInstance"].as_str().unwrap().to_string();
    let builder_pool = b["builderPool"].as_str().unwrap().to_string();
    assert!(env.provider_names().contains(&builder), "{b}");

    env.kill_server();
    env.set_env("KNIT_SERVER_PAUSE_AT", None);
    env.start_server();
    let deadline = Instant::now() + Duration::from_secs(180);
    let b = loop {
        let b = env.json(&["snapshot", "builds", &id, "-o", "json"]);
        if b["done"] == true {
            break b;
        }
        assert!(Instant::now() < deadline, "{b}\n{}", env.server_log_tail());
        std::thread::sleep(Duration::from_secs(1));
    };
    assert_eq!(b["status"], "Succeeded", "{b}");
    assert_eq!(b["step"], "release", "{b}");
    assert_eq!(b["snapshotId"], sid.as_str(), "{b}");
    assert!(b["error"].is_null(), "{b}");
    let messages: Vec<&str> = b["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["message"].as_str().unwrap())
        .collect();
    assert!(
        messages.contains(
            &format!("builder instance {builder} released (after a server restart)").as_str()
        ),
        "{b}"
    );
    // Listed with what it holds, and usable: a disk made from it at the
    // provider (deleted again).
    let list = env.json(&["snapshot", "list", "-o", "json"]);
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{list}");
    assert_eq!(items[0]["id"], sid.as_str(), "{list}");
    assert_eq!(items[0]["kubernetesVersion"], "1.31.4", "{list}");
    assert!(
        items[0]["images"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i.as_str().unwrap().starts_with(&format!("{APP}@sha256:"))),
        "{list}"
    );
    let cloud = env.cloud();
    let snaps = cloud.snapshots().unwrap();
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    assert_eq!(snaps[0].id, sid);
    assert_eq!(snaps[0].name.as_deref(), Some(id.as_str()));
    let disk = cloud
        .disk_create(&knit_local::DiskSpec {
            name: "from-snapshot".into(),
            size: None,
            interface: knit_local::DiskInterface::Nvme,
            snapshot: Some(sid.clone()),
            format: None,
        })
        .unwrap();
    assert_eq!(disk.from_snapshot.as_deref(), Some(sid.as_str()));
    cloud.disk_delete(&disk.id).unwrap();
    // Nothing leaked: builder gone at the provider and in the store, the
    // builder pool removed.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let at_provider = env.provider_names();
        let in_store: Vec<Value> = env
            .store_instances()
            .into_iter()
            .filter(|i| i["name"] == builder.as_str())
            .collect();
        let pool_left = env.knit(&["get", "pools", &builder_pool]).0;
        if at_provider.is_empty() && in_store.is_empty() && !pool_left {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left: provider {at_provider:?}, store {in_store:?}, pool {pool_left}\n{}",
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    env.knit_ok(&["snapshot", "delete", &sid]);
    assert!(env.cloud().snapshots().unwrap().is_empty());

    // `knit down` stops it too.
    let down = env.knit_ok(&["down", "--timeout", "120"]);
    assert!(
        down.contains(&format!("registry (pid {reg_pid}) stopped")),
        "{down}"
    );
    // Gone, or a zombie its new parent has not reaped (empty cmdline).
    let cmdline = std::fs::read(format!("/proc/{reg_pid}/cmdline")).unwrap_or_default();
    assert!(cmdline.is_empty(), "registry pid {reg_pid} still runs");
    let status = env.json(&["registry", "status", "--state-dir", &state, "-o", "json"]);
    assert_eq!(status["running"], false, "{status}");
}

/// Starts a build of APP from the workers pool on a server started with
/// `KNIT_SERVER_PAUSE_AT=snapshot-<step>` and waits until it pauses there:
/// the build's id and its record at that point.
fn build_paused_at(env: &Env, step: &str) -> (String, Value) {
    let out = env.knit_ok(&[
        "snapshot",
        "create",
        "--pool",
        "workers",
        "--images",
        APP,
        "--no-wait",
    ]);
    let id = out
        .split_whitespace()
        .find(|w| w.starts_with("build-"))
        .unwrap_or_else(|| panic!("no build id in {out:?}"))
        .to_string();
    let paused = format!("paused at snapshot-{step}");
    let deadline = Instant::now() + Duration::from_secs(900);
    while !env.server_log().contains(&paused) {
        let b = env.json(&["snapshot", "builds", &id, "-o", "json"]);
        assert_eq!(b["status"], "Running", "{b}\n{}", env.server_log_tail());
        assert!(Instant::now() < deadline, "{b}");
        std::thread::sleep(Duration::from_secs(1));
    }
    let b = env.json(&["snapshot", "builds", &id, "-o", "json"]);
    (id, b)
}
