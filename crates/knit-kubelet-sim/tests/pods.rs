//! Pods on the stand-in's nodes, end to end: the embedded cluster on
//! 127.0.0.1 and the real `knit-kubelet-sim` binary (`--lightweight`: no
//! container runtime needed, and no container runs either way). Pods
//! bound to a node go Running with an IP from the node's podCIDR, are
//! finished after their grace period and deleted; the real `kubectl drain`
//! is refused while a PodDisruptionBudget forbids and done when it allows.

#[path = "../../knit-cluster/tests/common/mod.rs"]
mod common;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{blocking, wait_for, Client};
use knit_cluster::{ClusterConfig, EmbeddedCluster};
use serde_json::{json, Value};
use support::{bootstrap_kubeconfig, spawn, Proc, SIM};

const PODS: &str = "/api/v1/namespaces/default/pods";
const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";

async fn cluster(dir: &Path) -> EmbeddedCluster {
    let cfg = ClusterConfig::new(dir, "127.0.0.1:0".parse().unwrap());
    EmbeddedCluster::start(cfg).await.unwrap()
}

/// A lightweight stand-in for `node` under `root`, joined with `token`.
fn stand_in(root: &Path, c: (&str, &str), token: &str, node: &str) -> Proc {
    let dir = root.join(node);
    let boot = dir.join("bootstrap-kubelet.conf");
    bootstrap_kubeconfig(&boot, c.0, c.1, token);
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         kubeAPIQPS: 50\nkubeAPIBurst: 100\nnodeLeaseDurationSeconds: 10\nnodeStatusUpdateFrequency: 2s\n",
    )
    .unwrap();
    let args: Vec<String> = vec![
        format!("--bootstrap-kubeconfig={}", boot.display()),
        format!("--kubeconfig={}", dir.join("kubelet.conf").display()),
        format!("--config={}", config.display()),
        format!("--hostname-override={node}"),
        "--node-ip=127.0.0.1".into(),
        format!("--cert-dir={}", dir.join("pki").display()),
        format!("--root-dir={}", dir.display()),
        format!(
            "--container-runtime-endpoint=unix://{}",
            dir.join("none.sock").display()
        ),
        "--lightweight".into(),
    ];
    spawn(SIM, &args, root.join(format!("{node}.log")))
}

fn pod(name: &str, node: &str, grace: i64, labels: Value, owner: Option<Value>) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": grace,
                 "containers": [{"name": "app", "image": "registry.local/app:1"}]}});
    if let Some(o) = owner {
        p["metadata"]["ownerReferences"] = json!([o]);
    }
    p
}

fn owner(kind: &str, obj: &Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": kind, "name": obj["metadata"]["name"],
           "uid": obj["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true})
}

fn create(admin: &Client, path: &str, obj: &Value) -> Value {
    let (code, body) = admin.post(path, obj);
    assert_eq!(code, 201, "POST {path}: {body}");
    body
}

fn ready_node(admin: &Client, name: &str, sim: &Proc) -> Value {
    support::wait_node(
        admin,
        name,
        "Ready with a podCIDR",
        sim,
        Duration::from_secs(60),
        |n| {
            n["spec"]["podCIDR"].is_string()
                && n["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
        },
    )
}

/// The pod once `f` holds, with the stand-ins' logs on timeout.
fn wait_pod(
    admin: &Client,
    name: &str,
    what: &str,
    sims: &[&Proc],
    f: impl Fn(&Value) -> bool,
) -> Value {
    let last = std::cell::RefCell::new(Value::Null);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(what, Duration::from_secs(30), || {
            let (code, p) = admin.get(&format!("{PODS}/{name}"));
            *last.borrow_mut() = p.clone();
            (code == 200 && f(&p)).then_some(p)
        })
    }));
    r.unwrap_or_else(|_| {
        let logs: Vec<String> = sims.iter().map(|s| s.log()).collect();
        panic!(
            "{what}: last {}\nlogs:\n{}",
            last.borrow(),
            logs.join("\n----\n")
        )
    })
}

fn running(p: &Value) -> bool {
    p["status"]["phase"] == "Running"
}

fn in_cidr(ip: &str, cidr: &str) -> bool {
    // /24 subnets: the first three octets.
    let prefix = cidr.rsplit_once('.').unwrap().0;
    ip.starts_with(&format!("{prefix}.")) && cidr.ends_with("/24")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_and_finish_on_the_stand_in() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(&dir.path().join("cluster")).await;
    // An unbound token is bound to the first node it joins (issue 30):
    // one each.
    let token = c
        .create_bootstrap_token(None, Duration::from_secs(600), &[])
        .unwrap();
    let token2 = c
        .create_bootstrap_token(None, Duration::from_secs(600), &[])
        .unwrap();
    let (ep, ca) = (c.endpoint().to_string(), c.ca_pem().to_string());
    let admin = Client::admin(&c);
    let root = dir.path().to_path_buf();
    blocking(move || {
        let mut sim1 = stand_in(&root, (&ep, &ca), &token.token(), "pods-1");
        let mut sim2 = stand_in(&root, (&ep, &ca), &token2.token(), "pods-2");
        let n1 = ready_node(&admin, "pods-1", &sim1);
        let n2 = ready_node(&admin, "pods-2", &sim2);
        let (cidr1, cidr2) = (
            n1["spec"]["podCIDR"].as_str().unwrap().to_string(),
            n2["spec"]["podCIDR"].as_str().unwrap().to_string(),
        );
        assert_ne!(cidr1, cidr2);
        for (name, node) in [
            ("a-0", "pods-1"),
            ("a-1", "pods-1"),
            ("a-2", "pods-1"),
            ("b-0", "pods-2"),
        ] {
            create(&admin, PODS, &pod(name, node, 3, json!({"app": "a"}), None));
        }
        // Running with what a kubelet reports, an IP from the node's podCIDR.
        let mut ips = std::collections::HashSet::new();
        for (name, cidr) in [
            ("a-0", &cidr1),
            ("a-1", &cidr1),
            ("a-2", &cidr1),
            ("b-0", &cidr2),
        ] {
            let p = wait_pod(
                &admin,
                name,
                &format!("{name} Running"),
                &[&sim1, &sim2],
                running,
            );
            let st = &p["status"];
            let ip = st["podIP"].as_str().unwrap();
            assert!(in_cidr(ip, cidr), "{ip} not in {cidr}");
            assert!(ips.insert(ip.to_string()), "{ip} given twice");
            assert_eq!(st["podIPs"][0]["ip"], ip);
            assert_eq!(st["hostIP"], "127.0.0.1");
            for t in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
                assert!(
                    st["conditions"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|c| c["type"] == t && c["status"] == "True"),
                    "{t} in {st}"
                );
            }
            let cs = &st["containerStatuses"][0];
            assert_eq!(
                (cs["name"].as_str(), cs["ready"].as_bool()),
                (Some("app"), Some(true))
            );
            assert!(cs["state"]["running"]["startedAt"].is_string(), "{cs}");
            assert!(st["startTime"].is_string());
        }
        // Graceful deletion: the pod stays for its grace period, then the
        // stand-in finishes it and deletes it with grace 0.
        let asked = Instant::now();
        let (code, del) = admin.call(
            "DELETE",
            &format!("{PODS}/a-0"),
            Some("application/json"),
            Some(&json!({"gracePeriodSeconds": 3})),
        );
        assert_eq!(code, 200, "{del}");
        let uid = del["metadata"]["uid"].as_str().unwrap().to_string();
        wait_pod(
            &admin,
            "a-0",
            "a-0 still there, terminating",
            &[&sim1],
            |p| p["metadata"]["deletionTimestamp"].is_string(),
        );
        wait_for("a-0 gone", Duration::from_secs(20), || {
            (admin.get(&format!("{PODS}/a-0")).0 == 404).then_some(())
        });
        let took = asked.elapsed();
        assert!(
            took >= Duration::from_secs(2),
            "a-0 went after {took:?}, before its grace period of 3 s"
        );
        assert!(
            sim1.log()
                .contains("pod finished and deleted after its grace period"),
            "{}",
            sim1.log()
        );
        // Its IP is free again: a new pod may get it.
        create(
            &admin,
            PODS,
            &pod("a-3", "pods-1", 3, json!({"app": "a"}), None),
        );
        wait_pod(&admin, "a-3", "a-3 Running", &[&sim1], running);
        let (_, again) = admin.get(&format!("{PODS}/a-3"));
        assert_ne!(again["metadata"]["uid"].as_str(), Some(uid.as_str()));

        // A stand-in restarted finds its pods as they were and keeps them.
        sim1.kill();
        let sim1 = stand_in(&root, (&ep, &ca), &token.token(), "pods-1");
        ready_node(&admin, "pods-1", &sim1);
        let (code, gone) = admin.call(
            "DELETE",
            &format!("{PODS}/a-1"),
            Some("application/json"),
            Some(&json!({"gracePeriodSeconds": 1})),
        );
        assert_eq!(code, 200, "{gone}");
        wait_for(
            "a-1 gone after the restart",
            Duration::from_secs(20),
            || (admin.get(&format!("{PODS}/a-1")).0 == 404).then_some(()),
        );
        assert!(running(&admin.get(&format!("{PODS}/a-2")).1));

        // Pod GC: the Node of pods-2 deleted (its stand-in stopped first):
        // its pod goes with it.
        sim2.kill();
        assert_eq!(
            admin.call("DELETE", "/api/v1/nodes/pods-2", None, None).0,
            200
        );
        wait_for("b-0 collected", Duration::from_secs(15), || {
            (admin.get(&format!("{PODS}/b-0")).0 == 404).then_some(())
        });
        drop(sim1);
    })
    .await;
    c.shutdown().await;
}

fn find_kubectl() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join("kubectl"))
        .find(|p| p.is_file())
}

/// (success, stdout, stderr) of the real kubectl.
fn kubectl(bin: &Path, kubeconfig: &Path, cache: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--cache-dir={}", cache.display()))
        .arg("--request-timeout=20s")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drain_is_refused_while_a_budget_forbids_and_done_when_it_allows() {
    let Some(bin) = find_kubectl() else {
        return knit_test_support::not_provided(
            "kubectl is not installed; the drain test did not run",
        );
    };
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(&dir.path().join("cluster")).await;
    let token = c
        .create_bootstrap_token(None, Duration::from_secs(600), &[])
        .unwrap();
    let (ep, ca) = (c.endpoint().to_string(), c.ca_pem().to_string());
    let kubeconfig = c.admin_kubeconfig_path().to_path_buf();
    let admin = Client::admin(&c);
    let root = dir.path().to_path_buf();
    blocking(move || {
        let cache = root.join("kube-cache");
        let sim = stand_in(&root, (&ep, &ca), &token.token(), "drain-1");
        ready_node(&admin, "drain-1", &sim);
        let rs = create(&admin, "/apis/apps/v1/namespaces/default/replicasets",
            &json!({"metadata": {"name": "web"}, "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "app", "image": "registry.local/app:1"}]}}}}));
        let ds = create(&admin, "/apis/apps/v1/namespaces/default/daemonsets",
            &json!({"metadata": {"name": "agent"}, "spec": {"selector": {"matchLabels": {"app": "agent"}},
                    "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "a", "image": "registry.local/agent:1"}]}}}}));
        for name in ["web-0", "web-1"] {
            create(&admin, PODS, &pod(name, "drain-1", 1, json!({"app": "web"}), Some(owner("ReplicaSet", &rs))));
        }
        create(&admin, PODS, &pod("agent-drain-1", "drain-1", 1, json!({"app": "agent"}), Some(owner("DaemonSet", &ds))));
        for name in ["web-0", "web-1", "agent-drain-1"] {
            wait_pod(&admin, name, &format!("{name} Running"), &[&sim], running);
        }
        create(&admin, PDBS, &json!({"metadata": {"name": "web-pdb"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}));
        wait_for("web-pdb computed", Duration::from_secs(20), || {
            let (_, b) = admin.get(&format!("{PDBS}/web-pdb"));
            (b["status"]["currentHealthy"] == 2 && b["status"]["observedGeneration"] == 1).then_some(())
        });
        // `kubectl get pdb` and `get pods -o wide` print as kube-apiserver's tables.
        let (ok, out, err) = kubectl(&bin, &kubeconfig, &cache, &["get", "pdb"]);
        assert!(ok, "{out}{err}");
        assert!(out.contains("web-pdb") && out.contains("ALLOWED DISRUPTIONS"), "{out}");
        let (ok, out, err) = kubectl(&bin, &kubeconfig, &cache, &["get", "pods", "-o", "wide"]);
        assert!(ok && out.contains("Running") && out.contains("drain-1"), "{out}{err}");

        // Refused: kubectl retries the 429 until its timeout and says why.
        let (ok, out, err) = kubectl(&bin, &kubeconfig, &cache,
            &["drain", "drain-1", "--ignore-daemonsets", "--timeout=8s"]);
        assert!(!ok, "drain should have failed:\n{out}\n{err}");
        assert!(err.contains("Cannot evict pod as it would violate the pod's disruption budget."), "{err}");
        assert!(err.contains("will retry after 5s"), "{err}");
        assert!(out.contains("cordoned"), "{out}");
        let (_, n) = admin.get("/api/v1/nodes/drain-1");
        assert_eq!(n["spec"]["unschedulable"], true);
        for name in ["web-0", "web-1"] {
            let (code, p) = admin.get(&format!("{PODS}/{name}"));
            assert!(code == 200 && p["metadata"]["deletionTimestamp"].is_null(), "{name}: {p}");
        }

        // The budget allows both (maxUnavailable 2 of the ReplicaSet's 2):
        // the drain evicts them, the stand-in finishes them, done.
        let (code, b) = admin.patch(&format!("{PDBS}/web-pdb"), "application/merge-patch+json",
            &json!({"spec": {"minAvailable": null, "maxUnavailable": 2}}));
        assert_eq!(code, 200, "{b}");
        wait_for("web-pdb allows 2", Duration::from_secs(20), || {
            let (_, b) = admin.get(&format!("{PDBS}/web-pdb"));
            (b["status"]["disruptionsAllowed"] == 2 && b["status"]["observedGeneration"] == 2).then_some(())
        });
        let (ok, out, err) = kubectl(&bin, &kubeconfig, &cache,
            &["drain", "drain-1", "--ignore-daemonsets", "--timeout=60s"]);
        assert!(ok, "drain failed:\n{out}\n{err}\nstand-in log:\n{}", sim.log());
        assert!(out.contains("pod/web-0 evicted") && out.contains("pod/web-1 evicted"), "{out}");
        assert!(out.contains("node/drain-1 drained"), "{out}");
        assert!(err.contains("ignoring DaemonSet-managed Pods: default/agent-drain-1"), "{err}");
        for name in ["web-0", "web-1"] {
            assert_eq!(admin.get(&format!("{PODS}/{name}")).0, 404);
        }
        // The DaemonSet's pod stays, as on a real node.
        assert!(running(&admin.get(&format!("{PODS}/agent-drain-1")).1));
    })
    .await;
    c.shutdown().await;
}
