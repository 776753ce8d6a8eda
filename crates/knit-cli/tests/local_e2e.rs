//! The control plane against the real local cloud, driven through the `knit`
//! binary: a pool scaled 0 → 3 → 1, then a server killed with SIGKILL in the
//! middle of a scale-out and restarted, which must end with exactly the
//! desired instances (none lost, none duplicated).
//!
//! Needs root (namespaces, loop devices, a bridge) and the workspace's
//! binaries beside `knit` (knit-agent, knit-local, knit-kubelet-sim), which
//! `cargo nextest run --workspace` builds. Everything lives in a temporary
//! directory, on a bridge and subnet of its own, and is released by a guard
//! on success, failure and panic.

mod common;

use common::Env;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const POOL: &str = "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: workers}
spec:
  replicas: 0
  systemDisk: {sizeGiB: 20}
  dataDisks: [{sizeGiB: 40, interface: nvme}]
  preUserData: touch /var/.skip-yum
  userData: echo user-data ran > /root/user-data-ran
";

fn running_names(instances: &[Value]) -> Vec<String> {
    let mut names: Vec<String> = instances
        .iter()
        .filter(|i| i["state"] == "Running")
        .map(|i| i["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// A file planted on the host for one test, removed on drop.
struct Planted(std::path::PathBuf);

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Pools run on the node image by default (`image: debian-12`): a node
/// reads neither a file under the host's /var/lib nor the server's CA key.
fn nodes_see_nothing_of_the_host(env: &Env) {
    let planted = Planted(std::path::PathBuf::from(format!(
        "/var/lib/knit-e2e-secret-{}",
        std::process::id()
    )));
    std::fs::create_dir_all(&planted.0).unwrap();
    let secret = planted.0.join("token");
    std::fs::write(&secret, "planted-on-the-host\n").unwrap();
    let ca_key = env.state_dir().join("pki/ca.key");
    assert!(ca_key.exists(), "{} not on the host", ca_key.display());
    let image = knit_local::image::current(&knit_local::image::images_dir())
        .unwrap()
        .expect("the node image");
    let instances = env.cloud().list().unwrap();
    assert!(!instances.is_empty());
    for i in instances {
        assert_eq!(i.record.template.base_root, image.root);
        let (ok, text) = env.exec(
            &i.record.id,
            &format!(
                "cat {} {} /root/.knit/config 2>&1; . /etc/os-release; echo $ID-$VERSION_ID",
                secret.display(),
                ca_key.display()
            ),
        );
        assert!(
            ok && !text.contains("planted-on-the-host") && !text.contains("BEGIN"),
            "{text}"
        );
        assert!(
            text.contains("No such file") && text.ends_with("debian-12\n"),
            "{text}"
        );
    }
}

#[test]
fn scale_with_the_real_local_cloud_and_survive_kill_9() {
    // The reconciler is under test here: nodes join no cluster.
    let mut env = Env::builder().cluster(false).parallelism(2).build();
    let out = env.knit_ok(&[
        "package",
        "build",
        "--no-runtime",
        "--state-dir",
        env.path("server").to_str().unwrap(),
    ]);
    assert!(
        out.contains("kubernetes-1.31.4-linux-amd64.tar.gz"),
        "{out}"
    );
    env.start_server();
    // Without the skip marker: base-packages runs against the mirror's
    // Debian repository (checked below).
    env.create(
        "pool",
        &POOL.replace("  preUserData: touch /var/.skip-yum\n", ""),
    );

    // 0 -> 3: every node initialized by the real agent, reported back.
    env.scale_wait("workers", 3);
    let instances = env.store_instances();
    assert_eq!(running_names(&instances).len(), 3);
    assert_eq!(env.provider_names(), running_names(&instances));
    let nodes: Value = serde_json::from_str(&env.knit_ok(&["get", "nodes", "-o", "json"])).unwrap();
    let nodes = nodes["items"].as_array().unwrap().clone();
    assert_eq!(nodes.len(), 3);
    assert!(nodes.iter().all(|n| n["initialized"] == true), "{nodes:?}");
    let node = nodes[0]["name"].as_str().unwrap();
    let described = env.knit_ok(&["describe", "node", node]);
    assert!(
        described.contains("data-disk") && described.contains("hardening"),
        "{described}"
    );
    let log = env.knit_ok(&["logs", "node", node]);
    assert!(log.contains("[data-disk]"), "{log}");
    // base-packages took its packages and updates from the mirror's Debian
    // repository (knit package build made it from the node image).
    let doc: Value =
        serde_json::from_str(&env.knit_ok(&["describe", "node", node, "-o", "json"])).unwrap();
    let base = doc["timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["phase"] == "base-packages" && t["outcome"] == "done")
        .unwrap_or_else(|| panic!("{doc}"));
    let reason = base["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(" the knit repository https://")
            && (reason.contains("updates applied from it")
                || reason.contains("no updates available in it")),
        "{reason}"
    );
    // `knit exec` runs on the node's own machine (its hostname is its
    // instance's name), through the server's API.
    let hostname = env.knit_ok(&["exec", "node", node, "--", "cat", "/etc/hostname"]);
    assert_eq!(hostname.trim(), nodes[0]["instance"].as_str().unwrap());
    nodes_see_nothing_of_the_host(&env);

    // 3 -> 1: newest first, released at the provider.
    env.scale_wait("workers", 1);
    let instances = env.store_instances();
    assert_eq!(running_names(&instances).len(), 1);
    assert_eq!(env.provider_names(), running_names(&instances));

    // SIGKILL while instances are being created, then restart.
    env.knit_ok(&["scale", "pool", "workers", "--replicas", "4"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let creating = env
            .store_instances()
            .iter()
            .any(|i| i["state"] == "Creating" || i["state"] == "Pending");
        if creating {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no instance was ever seen in creation"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    env.kill_server();
    env.start_server();
    env.scale_wait("workers", 4);
    let instances = env.store_instances();
    let names = running_names(&instances);
    assert_eq!(names.len(), 4, "{instances:?}");
    assert_eq!(
        env.provider_names(),
        names,
        "the provider holds exactly the store's instances"
    );

    // Remove one node but keep its instance: stopped, Detached, the pool
    // one smaller and not refilled.
    let kept = names[0].clone();
    env.knit_ok(&["delete", "node", &kept, "--release=false"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let instances = env.store_instances();
        let detached = instances
            .iter()
            .any(|i| i["name"] == kept.as_str() && i["state"] == "Detached");
        if detached && running_names(&instances).len() == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "not detached: {instances:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let cloud = env.cloud();
    let kept_state = cloud
        .list()
        .unwrap()
        .into_iter()
        .find(|i| i.record.template.name.as_deref() == Some(kept.as_str()))
        .map(|i| i.record.state.to_string());
    assert_eq!(kept_state.as_deref(), Some("stopped"));
    let pool: Value =
        serde_json::from_str(&env.knit_ok(&["get", "pools", "workers", "-o", "json"])).unwrap();
    assert_eq!(pool["spec"]["replicas"], 3);

    // Delete the pool: every instance it holds is released; the detached
    // one is no longer the pool's and stays (the guard's `down` removes it).
    env.knit_ok(&["delete", "pool", "workers"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while env.provider_names() != vec![kept.clone()] {
        assert!(
            Instant::now() < deadline,
            "instances left: {:?}",
            env.provider_names()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(Path::new(&env.path("server/knit.db")).exists());
}

/// Through the control plane into the embedded cluster: nodes get join
/// material, the real agent starts real containerd and the kubelet stand-in,
/// the Node registers, and `--wait` ends only when every node is Ready (read
/// from the cluster API). Scale-in deletes the Node from the cluster.
#[test]
fn nodes_join_the_embedded_cluster_and_leave_it() {
    let mut env = Env::builder().cluster(true).parallelism(2).build();
    let (ok, out, err) = env.knit(&[
        "package",
        "build",
        "--state-dir",
        env.path("server").to_str().unwrap(),
    ]);
    assert!(
        ok,
        "package build needs containerd and runc (scripts/setup.sh installs them): {out}{err}"
    );
    env.start_server();
    // The kubelet stand-in reports Ready once the runtime answers and a CNI
    // configuration exists: the package set's own (knit package build).
    // With the scheduling gate: the taint goes once user data succeeded.
    let pool = POOL.replace(
        "  replicas: 0\n",
        "  replicas: 0\n  userDataSchedulingGate: true\n",
    );
    // A second pool whose user data fails: its node is Ready all the same,
    // and keeps the gate taint.
    let failing = pool.replace("name: workers", "name: failing").replace(
        "  userData: echo user-data ran > /root/user-data-ran\n",
        "  userData: exit 3\n",
    );
    assert!(failing.contains("exit 3") && pool.contains("userDataSchedulingGate"));
    env.create("pool", &pool);
    let out = env.scale_wait("workers", 2);
    assert!(out.contains("2/2 initialized and Ready"), "{out}");
    let nodes: Value = serde_json::from_str(&env.knit_ok(&["get", "nodes", "-o", "json"])).unwrap();
    let nodes = nodes["items"].as_array().unwrap().clone();
    assert_eq!(nodes.len(), 2);
    assert!(
        nodes
            .iter()
            .all(|n| n["status"] == "Ready" && n["phase"] == "hardening"),
        "{nodes:?}"
    );
    let pool: Value =
        serde_json::from_str(&env.knit_ok(&["get", "pools", "workers", "-o", "json"])).unwrap();
    assert_eq!(pool["status"]["ready"], 2);

    // The cluster's own view, through kubectl when this machine has one.
    let kubeconfig = env.path("server/cluster/admin.kubeconfig");
    let kubectl = |args: &[&str]| {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()
    };
    let names: Vec<String> = nodes
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect();
    match kubectl(&["get", "nodes", "-o", "name"]) {
        Ok(out) => {
            let listed = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(
                out.status.success(),
                "kubectl: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            for n in &names {
                assert!(listed.contains(&format!("node/{n}")), "{n} not in {listed}");
            }
            // Each Node is the size of its instance type (the pool's
            // default, ecs.g7.large: 2 vCPUs capped at the host's, 8 GiB),
            // as its machine's cgroup says (issue 29).
            let out = kubectl(&["get", "nodes", "-o", "json"]).unwrap();
            let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
            let cpus = std::thread::available_parallelism().unwrap().get().min(2);
            for n in listed["items"].as_array().unwrap() {
                let cap = &n["status"]["capacity"];
                assert_eq!(cap["cpu"], cpus.to_string(), "{n}");
                assert_eq!(cap["memory"], "8388608Ki", "{n}");
                assert_eq!(n["status"]["allocatable"]["memory"], "8388608Ki", "{n}");
            }
        }
        Err(_) => knit_test_support::not_provided(
            "kubectl is not installed: the cluster's view is checked through knit only",
        ),
    }

    // User data outcomes and the gate, as the control plane records them.
    env.create("failing", &failing);
    env.scale_wait("failing", 1);
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut removed, mut failed) = (0, 0);
    while (removed < 2 || failed < 1) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        let events: Value =
            serde_json::from_str(&env.knit_ok(&["get", "events", "-o", "json"])).unwrap();
        let reasons: Vec<&str> = events["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["reason"].as_str())
            .collect();
        removed = reasons
            .iter()
            .filter(|r| **r == "SchedulingGateRemoved")
            .count();
        failed = reasons.iter().filter(|r| **r == "UserDataFailed").count();
    }
    assert_eq!((removed, failed), (2, 1), "gate events");
    let all: Value = serde_json::from_str(&env.knit_ok(&["get", "nodes", "-o", "json"])).unwrap();
    let failing_node = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["pool"] == "failing")
        .unwrap()
        .clone();
    assert_eq!(
        failing_node["status"], "Ready",
        "user data does not block Ready"
    );
    assert!(failing_node["userData"]
        .as_str()
        .unwrap()
        .starts_with("failed: user data exited with code 3"));
    if let Ok(out) = kubectl(&["get", "nodes", "-o", "json"]) {
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        for n in v["items"].as_array().unwrap() {
            let tainted = n["spec"]["taints"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| t["key"] == "knit.dev/user-data-pending");
            let name = n["metadata"]["name"].as_str().unwrap();
            assert_eq!(
                tainted,
                name == failing_node["name"].as_str().unwrap(),
                "{name}: gate taint"
            );
        }
    }
    // User data runs in parallel with readiness: a node whose user data
    // sleeps is Ready while its user data is still running.
    let slow = POOL.replace("name: workers", "name: slow").replace(
        "  userData: echo user-data ran > /root/user-data-ran\n",
        "  userData: sleep 30\n",
    );
    assert!(slow.contains("sleep 30"));
    env.create("slow", &slow);
    let out = env.scale_wait("slow", 1);
    assert!(out.contains("1/1 initialized and Ready"), "{out}");
    let all: Value = serde_json::from_str(&env.knit_ok(&["get", "nodes", "-o", "json"])).unwrap();
    let slow_node = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["pool"] == "slow")
        .unwrap()
        .clone();
    assert_eq!(slow_node["status"], "Ready", "{slow_node}");
    let user_data = slow_node["userData"].as_str().unwrap_or("");
    assert!(
        !user_data.starts_with("succeeded") && !user_data.starts_with("failed"),
        "Ready came before the user data ended: {slow_node}"
    );
    env.knit_ok(&["delete", "pool", "slow"]);
    env.knit_ok(&["delete", "pool", "failing"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while env.knit_ok(&["get", "pools"]).contains("failing")
        || env.knit_ok(&["get", "pools"]).contains("slow")
    {
        assert!(Instant::now() < deadline, "pools failing/slow not deleted");
        std::thread::sleep(Duration::from_millis(300));
    }

    // Scale-in: the newest node leaves the cluster and its instance goes.
    env.scale_wait("workers", 1);
    let nodes: Value = serde_json::from_str(&env.knit_ok(&["get", "nodes", "-o", "json"])).unwrap();
    let left: Vec<String> = nodes["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(left.len(), 1);
    let gone = names.iter().find(|n| !left.contains(n)).unwrap();
    if let Ok(out) = kubectl(&["get", "nodes", "-o", "name"]) {
        let listed = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            !listed.contains(&format!("node/{gone}")),
            "{gone} still in the cluster: {listed}"
        );
        assert!(listed.contains(&format!("node/{}", left[0])), "{listed}");
    }
    assert_eq!(env.provider_names().len(), 1);
}

/// What `knit up` started, `knit down` takes down: pools deleted, the
/// server stopped, then the local cloud — no process of ours left, the
/// bridge gone, nothing mounted or attached under the state directories.
/// With `--keep-cloud` the cloud stays, and `knit local down` alone
/// removes it.
/// `runtime: none` (issue 31's light machines for scale runs): the node
/// has no container runtime at all — containerd neither configured nor
/// started — its kubelet (the stand-in) runs `--lightweight`, and it is
/// Ready and initialized all the same.
#[test]
fn a_pool_without_a_runtime_starts_no_containerd_and_is_ready() {
    let mut env = Env::builder().cluster(true).parallelism(2).build();
    env.knit_ok(&[
        "package",
        "build",
        "--no-runtime",
        "--state-dir",
        env.path("server").to_str().unwrap(),
    ]);
    env.start_server();
    let pool = POOL
        .replace("  replicas: 0\n", "  replicas: 0\n  runtime: none\n")
        .replace("  dataDisks: [{sizeGiB: 40, interface: nvme}]\n", "");
    assert!(pool.contains("runtime: none") && !pool.contains("dataDisks"));
    env.create("pool", &pool);
    let out = env.scale_wait("workers", 1);
    assert!(out.contains("1/1 initialized and Ready"), "{out}");
    let shown = env.knit_ok(&["get", "pools", "workers", "-o", "yaml"]);
    assert!(shown.contains("runtime: none"), "{shown}");

    let machines = env.cloud().list().unwrap();
    assert_eq!(machines.len(), 1, "one machine");
    let id = &machines[0].record.id;
    // Every process's command line inside the machine, and whether the
    // agent wrote containerd's configuration (the node image's containerd
    // package has one of its own).
    let (ok, text) = env.exec(
        id,
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done; \
         grep -qs \"Managed by knit-agent\" /etc/containerd/config.toml && echo CONTAINERD-CONFIG-WRITTEN; true",
    );
    assert!(ok, "{text}");
    let kubelet: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("--kubeconfig="))
        .collect();
    assert_eq!(kubelet.len(), 1, "one kubelet: {text}");
    assert!(kubelet[0].contains("--lightweight"), "{}", kubelet[0]);
    assert!(
        !kubelet[0].contains("--container-runtime-endpoint"),
        "{}",
        kubelet[0]
    );
    assert!(
        !text.lines().any(|l| l
            .split(' ')
            .next()
            .is_some_and(|bin| bin.ends_with("/containerd"))),
        "containerd runs on a node without a runtime: {text}"
    );
    // A line of its own (the script's command line holds the word too).
    assert!(
        !text.lines().any(|l| l == "CONTAINERD-CONFIG-WRITTEN"),
        "{text}"
    );
}

/// `knit image preload`: the node image with the mirror's package and
/// agent in it; a node on it runs that agent where it lies and installs
/// nothing it has to download or write: the stub links the agent, the
/// components phase takes the preloaded package, every binary is found in
/// place.
#[test]
fn a_preloaded_image_starts_a_node_without_downloading_or_writing_components() {
    let mut env = Env::builder().cluster(true).parallelism(2).build();
    let server_dir = env.path("server");
    env.knit_ok(&[
        "package",
        "build",
        "--no-runtime",
        "--state-dir",
        server_dir.to_str().unwrap(),
    ]);
    // A images directory of the test's own, its current image the host's.
    let images = env.path("images");
    std::fs::create_dir_all(&images).unwrap();
    let base = std::fs::canonicalize(knit_local::image::images_dir().join("debian-12"))
        .expect("the node image (knit image build; scripts/setup.sh --tests builds it)");
    std::os::unix::fs::symlink(&base, images.join("debian-12")).unwrap();
    let preload = |env: &Env| {
        env.knit_ok(&[
            "image",
            "preload",
            "--out",
            images.to_str().unwrap(),
            "--state-dir",
            server_dir.to_str().unwrap(),
        ])
    };
    let out = preload(&env);
    assert!(out.contains("preloaded;"), "{out}");
    let out = preload(&env);
    assert!(out.contains("(already made)"), "{out}");
    let root = images.join("debian-12-preloaded/root");
    for file in [
        "usr/local/bin/knit-agent",
        "usr/local/bin/kubelet",
        "opt/knit/kubernetes/knit-cache.json",
    ] {
        assert!(root.join(file).is_file(), "{file} not preloaded");
    }
    // The base image gained nothing.
    assert!(!base.join("root/usr/local/bin/kubelet").exists());

    env.start_server();
    let pool = POOL
        .replace(
            "  replicas: 0\n",
            &format!(
                "  replicas: 0\n  runtime: none\n  image: {}\n",
                root.display()
            ),
        )
        .replace("  dataDisks: [{sizeGiB: 40, interface: nvme}]\n", "");
    assert!(pool.contains("image: /"), "{pool}");
    env.create("pool", &pool);
    let out = env.scale_wait("workers", 1);
    assert!(out.contains("1/1 initialized and Ready"), "{out}");
    let machines = env.cloud().list().unwrap();
    let id = &machines[0].record.id;
    let (ok, text) = env.exec(
        id,
        "readlink /var/lib/knit/bootstrap/knit-agent; cat /var/log/knit-deploy.log; cat /var/lib/knit/journal.json",
    );
    assert!(ok, "{text}");
    assert_eq!(
        text.lines().next(),
        Some("/usr/local/bin/knit-agent"),
        "the stub runs the preloaded agent: {text}"
    );
    assert!(
        text.contains("preloaded in the image (/opt/knit/kubernetes)"),
        "{text}"
    );
    assert!(
        text.contains("\"packageBytesDownloaded\": 0"),
        "nothing downloaded: {text}"
    );
    // Nothing of the package was written on the machine's disk: all the
    // machine wrote (`df` of an overlay is its upper layer's filesystem)
    // is less than the kubelet alone.
    let (ok, text) = env.exec(
        id,
        "df -B1 --output=used / | tail -n 1; stat -L -c %s /usr/local/bin/kubelet",
    );
    assert!(ok, "{text}");
    let numbers: Vec<u64> = text
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(numbers.len(), 2, "{text}");
    let (written, kubelet) = (numbers[0], numbers[1]);
    assert!(
        written < kubelet,
        "the machine wrote {written} bytes, the kubelet is {kubelet}: was it copied?"
    );
}

#[test]
fn knit_down_takes_the_whole_local_setup_down() {
    let mut env = Env::builder().cluster(false).parallelism(2).build();
    env.build_package(false);

    // --keep-cloud: the server stops, the cloud (an instance in it) stays.
    env.up();
    let id = env.instance("name: stays-up\n");
    assert!(Env::link_exists(&env.bridge));
    let out = env.knit_ok(&["down", "--keep-cloud"]);
    assert!(
        out.contains("stopped") && out.contains("--keep-cloud"),
        "{out}"
    );
    assert!(Env::link_exists(&env.bridge), "the bridge stays");
    assert_eq!(env.cloud().describe(&id).unwrap().record.id, id);
    let out = env.knit_ok(&[
        "local",
        "--state-dir",
        env.path("local").to_str().unwrap(),
        "--bridge",
        &env.bridge,
        "--subnet",
        &env.subnet,
        "down",
    ]);
    assert!(!Env::link_exists(&env.bridge), "knit local down: {out}");
    assert!(!env.path("local").exists(), "{out}");

    // Plain down: everything.
    env.up();
    env.create("pool", POOL);
    env.scale_wait("workers", 1);

    // A crashed server: `knit down` removes nothing (it cannot tell which
    // instances were added by attach) and says how to go on.
    let crashed = env.up_pid().unwrap();
    let killed = Command::new("kill")
        .args(["-9", &crashed.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.runs_here(crashed) {
        assert!(Instant::now() < deadline, "the killed server still runs");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (ok, out, err) = env.knit(&["down"]);
    assert!(!ok, "down with a dead server must fail:\n{out}");
    for needle in [
        format!("knit server (pid {crashed}) is not running"),
        "knit up".to_string(),
        "knit local down".to_string(),
    ] {
        assert!(err.contains(&needle), "{needle:?} missing in:\n{err}");
    }
    assert!(
        Env::link_exists(&env.bridge),
        "a refused down removed the bridge"
    );
    assert!(
        !env.loop_devices_here().is_empty(),
        "a refused down removed disks"
    );
    // Started again over the same state, then down: everything goes.
    env.up();
    let server = env.up_pid().unwrap();
    assert!(Env::link_exists(&env.bridge));
    assert!(!env.loop_devices_here().is_empty());
    let out = env.knit_ok(&["down"]);
    eprintln!("knit down:\n{out}");
    for needle in [
        "nodepool/workers deleted".to_string(),
        format!("knit server (pid {server}) stopped"),
        "local cloud in".to_string(),
        format!("bridge {} removed", env.bridge),
    ] {
        assert!(out.contains(&needle), "{needle:?} missing in:\n{out}");
    }
    assert!(!env.runs_here(server), "the server still runs");
    assert_eq!(env.processes_here(), vec![], "processes left");
    assert!(!Env::link_exists(&env.bridge), "the bridge is left");
    assert_eq!(env.mounts_under_dir(), Vec::<String>::new(), "mounts left");
    assert_eq!(
        env.loop_devices_here(),
        Vec::<String>::new(),
        "loop devices left"
    );
    assert!(!env.path("local").exists(), "the local state is left");
}
