//! The real kubectl against the embedded API. Skips (with a message) when no
//! kubectl is installed; never fakes it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{blocking, csr, csr_object, wait_for, Client};
use serde_json::{json, Value};

fn find_kubectl() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join("kubectl"))
        .find(|p| p.is_file())
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    /// (success, stdout, stderr)
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(&self.bin)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--cache-dir={}", self.cache.display()))
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
    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args);
        assert!(ok, "kubectl {args:?} failed:\n{out}\n{err}");
        out
    }
}

fn node(name: &str, ip: &str, ready: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
           "status": {
               "conditions": [{"type": "Ready", "status": ready, "reason": "KubeletReady", "message": "test"}],
               "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
               "nodeInfo": {"kubeletVersion": "v1.31.4+knit-kubelet-sim", "osImage": "Debian GNU/Linux 12 (bookworm)",
                            "kernelVersion": "6.1.0", "containerRuntimeVersion": "containerd://1.6.20"}}})
}

/// First row of `kubectl get` output whose first column is `name`.
fn row<'a>(out: &'a str, name: &str) -> Vec<&'a str> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.first() == Some(&name))
        .unwrap_or_else(|| panic!("no row {name} in:\n{out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_works_against_the_embedded_api() {
    let Some(bin) = find_kubectl() else {
        return knit_test_support::not_provided(
            "kubectl is not installed on this machine; the kubectl test did not run",
        );
    };
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start(&dir.path().join("cluster"), Duration::from_secs(3600)).await;
    let admin = Client::admin(&cluster);
    let k = Kubectl {
        bin,
        kubeconfig: cluster.admin_kubeconfig_path().to_path_buf(),
        cache: dir.path().join("kubectl-cache"),
    };
    blocking(move || {
        for (n, ip, ready) in [("n1", "10.1.0.1", "True"), ("n2", "10.1.0.2", "False")] {
            let (code, body) = admin.post("/api/v1/nodes", &node(n, ip, ready));
            assert_eq!(code, 201, "{body}");
            let (code, body) = admin.patch(&format!("/api/v1/nodes/{n}/status"), "application/merge-patch+json", &node(n, ip, ready));
            assert_eq!(code, 200, "{body}");
        }
        admin.post("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            &json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40}}));

        // get nodes (server-side table), -o wide, -o yaml
        let out = k.ok(&["get", "nodes"]);
        assert!(out.starts_with("NAME"), "{out}");
        for col in ["STATUS", "ROLES", "AGE", "VERSION"] {
            assert!(out.lines().next().unwrap().contains(col), "{out}");
        }
        assert_eq!(row(&out, "n1")[1], "Ready");
        assert_eq!(row(&out, "n2")[1], "NotReady");
        let wide = k.ok(&["get", "nodes", "-o", "wide"]);
        eprintln!("kubectl get nodes -o wide:\n{wide}");
        assert!(wide.contains("INTERNAL-IP") && wide.contains("CONTAINER-RUNTIME"), "{wide}");
        assert!(row(&wide, "n2").contains(&"10.1.0.2"), "{wide}");
        let yaml: Value = serde_yaml_ng::from_str(&k.ok(&["get", "node", "n1", "-o", "yaml"])).unwrap();
        assert_eq!((yaml["kind"].as_str(), yaml["metadata"]["name"].as_str()), (Some("Node"), Some("n1")));
        let (ok, _, err) = k.run(&["get", "node", "nope"]);
        assert!(!ok && err.contains("nodes \"nope\" not found"), "{err}");

        // describe (reads the node, its lease, and the pods and events on it)
        let out = k.ok(&["describe", "node", "n1"]);
        eprintln!("kubectl describe node n1:\n{out}");
        assert_eq!(row(&out, "Name:").last(), Some(&"n1"), "{out}");
        assert!(out.contains("KubeletReady") && out.contains("10.1.0.1"), "{out}");

        // cordon / uncordon
        k.ok(&["cordon", "n1"]);
        assert_eq!(admin.get("/api/v1/nodes/n1").1["spec"]["unschedulable"], true);
        assert_eq!(row(&k.ok(&["get", "nodes"]), "n1")[1], "Ready,SchedulingDisabled");
        k.ok(&["uncordon", "n1"]);
        assert!(admin.get("/api/v1/nodes/n1").1["spec"]["unschedulable"].as_bool() != Some(true));

        // drain: cordons, finds no pods to evict (none run here)
        let out = k.ok(&["drain", "n1", "--ignore-daemonsets", "--timeout=20s"]);
        assert!(out.contains("drained"), "{out}");
        assert_eq!(admin.get("/api/v1/nodes/n1").1["spec"]["unschedulable"], true);
        k.ok(&["uncordon", "n1"]);

        // label / taint, set and removed
        k.ok(&["label", "node", "n1", "env=prod"]);
        assert_eq!(admin.get("/api/v1/nodes/n1").1["metadata"]["labels"]["env"], "prod");
        assert_eq!(row(&k.ok(&["get", "nodes", "-l", "env=prod"]), "n1")[0], "n1");
        k.ok(&["label", "node", "n1", "env-"]);
        assert!(admin.get("/api/v1/nodes/n1").1["metadata"]["labels"].get("env").is_none());
        k.ok(&["taint", "node", "n1", "dedicated=gpu:NoSchedule"]);
        let taints = admin.get("/api/v1/nodes/n1").1["spec"]["taints"].clone();
        assert!(taints.as_array().unwrap().iter().any(|t| t["key"] == "dedicated" && t["value"] == "gpu"), "{taints}");
        let (ok, _, err) = k.run(&["taint", "node", "n1", "bad=x:Sometimes"]);
        assert!(!ok, "invalid effect accepted: {err}");
        k.ok(&["taint", "node", "n1", "dedicated:NoSchedule-"]);
        let taints = admin.get("/api/v1/nodes/n1").1["spec"]["taints"].clone();
        assert!(!taints.as_array().is_some_and(|t| t.iter().any(|t| t["key"] == "dedicated")), "{taints}");

        // leases
        let out = k.ok(&["get", "leases", "-n", "kube-node-lease"]);
        assert_eq!(row(&out, "n1")[1], "n1", "{out}");

        // get csr / certificate approve (an admin-made request stays Pending)
        let (pem, _) = csr("system:node:n3", &["system:nodes"]);
        let (code, c) = admin.post("/apis/certificates.k8s.io/v1/certificatesigningrequests",
            &csr_object(&pem, "kubernetes.io/kube-apiserver-client-kubelet"));
        assert_eq!(code, 201, "{c}");
        let name = c["metadata"]["name"].as_str().unwrap().to_string();
        let out = k.ok(&["get", "csr"]);
        assert_eq!(row(&out, &name).last(), Some(&"Pending"), "{out}");
        assert!(row(&out, &name).contains(&"kubernetes-admin"), "{out}");
        k.ok(&["certificate", "approve", &name]);
        let out = wait_for("issued", Duration::from_secs(20), || {
            let out = k.ok(&["get", "csr", &name]);
            out.contains("Approved,Issued").then_some(out)
        });
        eprintln!("kubectl get csr:\n{out}");
        assert_eq!(row(&out, &name).last(), Some(&"Approved,Issued"), "{out}");

        // get -w: watch printed as table rows (server-side Table events)
        let out = Command::new("timeout")
            .args(["15", k.bin.to_str().unwrap()])
            .arg(format!("--kubeconfig={}", k.kubeconfig.display()))
            .arg(format!("--cache-dir={}", k.cache.display()))
            .args(["get", "nodes", "-w"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        eprintln!("kubectl get nodes -w:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(row(&text, "n1")[1], "Ready", "{text}");
        assert!(text.lines().filter(|l| l.starts_with("NAME")).all(|l| l.contains("STATUS")), "{text}");

        // delete node
        k.ok(&["delete", "node", "n2"]);
        assert_eq!(admin.get("/api/v1/nodes/n2").0, 404);
        let out = k.ok(&["get", "nodes"]);
        assert!(!out.contains("n2"), "{out}");
    })
    .await;
    cluster.shutdown().await;
}
