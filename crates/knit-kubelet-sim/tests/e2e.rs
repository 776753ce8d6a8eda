//! End to end: the embedded cluster on 127.0.0.1, the real
//! `knit-kubelet-sim` binary, and a real containerd started by the test
//! (own root, state and socket in a temp dir; killed by PID).

#[path = "../../knit-cluster/tests/common/mod.rs"]
mod common;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{blocking, wait_for, Client};
use knit_cluster::{ClusterConfig, EmbeddedCluster};
use serde_json::Value;
use support::{
    bootstrap_kubeconfig, lease_renew_time, spawn, start_containerd, which, Proc, CNI_CONFLIST, SIM,
};

/// The files and flags the node agent would lay out, under `root`.
struct NodeFiles {
    root: PathBuf,
    cni: PathBuf,
}

impl NodeFiles {
    fn new(root: &Path, server: &str, ca_pem: &str, token: &str) -> NodeFiles {
        let f = NodeFiles {
            root: root.to_path_buf(),
            cni: root.join("etc/cni/net.d"),
        };
        std::fs::create_dir_all(&f.cni).unwrap();
        bootstrap_kubeconfig(
            &f.path("etc/kubernetes/bootstrap-kubelet.conf"),
            server,
            ca_pem,
            token,
        );
        std::fs::create_dir_all(f.path("var/lib/kubelet")).unwrap();
        std::fs::write(
            f.path("var/lib/kubelet/config.yaml"),
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\naddress: 0.0.0.0\nport: 10250\n\
             kubeAPIQPS: 5\nkubeAPIBurst: 10\nnodeLeaseDurationSeconds: 4\nnodeStatusUpdateFrequency: 1s\n\
             registerWithTaints:\n- key: knit.dev/user-data-pending\n  effect: NoSchedule\n",
        )
        .unwrap();
        f
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
    fn args(&self, node: &str, runtime_sock: &Path, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = vec![
            format!(
                "--bootstrap-kubeconfig={}",
                self.path("etc/kubernetes/bootstrap-kubelet.conf").display()
            ),
            format!(
                "--kubeconfig={}",
                self.path("etc/kubernetes/kubelet.conf").display()
            ),
            format!(
                "--config={}",
                self.path("var/lib/kubelet/config.yaml").display()
            ),
            format!("--hostname-override={node}"),
            "--node-ip=127.0.0.1".into(),
            format!("--provider-id=knit-local://{node}"),
            "--node-labels=knit.dev/pool=pool-a,node.kubernetes.io/instance-type=local".into(),
            format!(
                "--container-runtime-endpoint=unix://{}",
                runtime_sock.display()
            ),
            format!("--cert-dir={}", self.path("var/lib/kubelet/pki").display()),
            format!("--root-dir={}", self.path("var/lib/kubelet").display()),
            format!("--cni-conf-dir={}", self.cni.display()),
            "--max-pods=110".into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }
}

async fn cluster(dir: &Path, grace: Duration, cert_ttl: Duration) -> EmbeddedCluster {
    let mut cfg = ClusterConfig::new(dir, "127.0.0.1:0".parse().unwrap());
    cfg.node_grace_period = grace;
    cfg.cert_ttl = cert_ttl;
    EmbeddedCluster::start(cfg).await.unwrap()
}

fn ready(n: &Value) -> (String, String) {
    let c = n["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
        .unwrap_or(Value::Null);
    (
        c["status"].as_str().unwrap_or("").to_string(),
        c["message"].as_str().unwrap_or("").to_string(),
    )
}

fn taints(n: &Value) -> Vec<String> {
    n["spec"]["taints"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| {
                    format!(
                        "{}:{}",
                        t["key"].as_str().unwrap_or(""),
                        t["effect"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Wait (90 s at most) until node `name` satisfies `f`.
fn wait_node(
    admin: &Client,
    name: &str,
    what: &str,
    sim: &Proc,
    f: impl Fn(&Value) -> bool,
) -> Value {
    support::wait_node(admin, name, what, sim, Duration::from_secs(90), f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_joins_not_ready_then_ready_follows_containerd_and_lease() {
    if which("containerd").is_none() {
        return knit_test_support::missing(
            "containerd is not installed (scripts/setup.sh installs it); the CRI end-to-end test did not run",
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(
        &dir.path().join("cluster"),
        Duration::from_secs(3),
        Duration::from_secs(3600),
    )
    .await;
    let token = c
        .create_bootstrap_token(
            Some("sim-1"),
            Duration::from_secs(600),
            &["system:bootstrappers:knit:pool-a".into()],
        )
        .unwrap();
    let (ep, ca) = (c.endpoint().to_string(), c.ca_pem().to_string());
    let admin = Client::admin(&c);
    let root = dir.path().to_path_buf();
    blocking(move || {
        let files = NodeFiles::new(&root.join("node"), &ep, &ca, &token.token());
        let ctd_dir = root.join("ctd");
        std::fs::create_dir_all(&ctd_dir).unwrap();
        let mut ctd = start_containerd(&ctd_dir, &files.cni, None);
        let sock = ctd_dir.join("containerd.sock");
        let sim = spawn(
            SIM,
            &files.args("sim-1", &sock, &["--unknown-flag=1"]),
            root.join("sim.log"),
        );

        // Registered NotReady: the runtime answers but there is no CNI config.
        let n = wait_node(
            &admin,
            "sim-1",
            "registered NotReady without CNI",
            &sim,
            |n| {
                let (s, m) = ready(n);
                s == "False" && m.contains("cni config uninitialized")
            },
        );
        assert_eq!(n["metadata"]["labels"]["knit.dev/pool"], "pool-a");
        assert_eq!(n["metadata"]["labels"]["kubernetes.io/hostname"], "sim-1");
        assert_eq!(n["spec"]["providerID"], "knit-local://sim-1");
        assert!(
            taints(&n).contains(&"knit.dev/user-data-pending:NoSchedule".to_string()),
            "{n}"
        );
        assert_eq!(
            n["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
            10250
        );
        assert!(n["status"]["nodeInfo"]["kubeletVersion"]
            .as_str()
            .unwrap()
            .contains("knit-kubelet-sim"));
        // TLS bootstrap left kubelet's files.
        let conf = std::fs::read_to_string(files.path("etc/kubernetes/kubelet.conf")).unwrap();
        assert!(conf.contains("kubelet-client-current.pem"), "{conf}");
        assert!(files
            .path("var/lib/kubelet/pki/kubelet-client-current.pem")
            .exists());
        assert!(
            sim.log().contains("unknown-flag"),
            "unknown flags are warned about"
        );
        // The certificate came through the CSR's watch, not the
        // fallback's read after a failed watch.
        assert!(
            sim.log().contains("client certificate issued")
                && !sim
                    .log()
                    .contains("watching the certificate signing request failed"),
            "{}",
            sim.log()
        );
        let (_, csrs) = admin.get("/apis/certificates.k8s.io/v1/certificatesigningrequests");
        let csr = &csrs["items"][0];
        assert_eq!(
            csr["spec"]["username"],
            format!("system:bootstrap:{}", token.id)
        );
        assert_eq!(csr["status"]["conditions"][0]["type"], "Approved");

        // A CNI config appears: containerd reports NetworkReady and the node is Ready.
        std::fs::write(files.cni.join("10-knit.conflist"), CNI_CONFLIST).unwrap();
        let n = wait_node(&admin, "sim-1", "Ready with runtime and CNI", &sim, |n| {
            ready(n).0 == "True"
        });
        assert!(
            n["status"]["nodeInfo"]["containerRuntimeVersion"]
                .as_str()
                .unwrap()
                .starts_with("containerd://"),
            "{n}"
        );
        let (_, lease) =
            admin.get("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/sim-1");
        assert_eq!(lease["spec"]["holderIdentity"], "sim-1");
        assert_eq!(
            lease["metadata"]["ownerReferences"][0]["uid"],
            n["metadata"]["uid"]
        );

        // containerd stops: NotReady with the runtime's reason; back: Ready.
        ctd.kill();
        let n = wait_node(
            &admin,
            "sim-1",
            "NotReady after containerd stops",
            &sim,
            |n| ready(n).0 == "False",
        );
        assert!(ready(&n).1.contains("container runtime is down"), "{n}");
        let _ctd = start_containerd(&ctd_dir, &files.cni, None);
        wait_node(
            &admin,
            "sim-1",
            "Ready after containerd restarts",
            &sim,
            |n| ready(n).0 == "True",
        );

        // The stand-in hangs (SIGSTOP): lease not renewed → Unknown + unreachable; SIGCONT → recovers.
        sim.signal(libc::SIGSTOP);
        let n = wait_node(&admin, "sim-1", "Unknown after lease stops", &sim, |n| {
            ready(n).0 == "Unknown"
        });
        assert!(
            taints(&n).contains(&"node.kubernetes.io/unreachable:NoExecute".to_string()),
            "{n}"
        );
        sim.signal(libc::SIGCONT);
        let n = wait_node(&admin, "sim-1", "recovered", &sim, |n| {
            ready(n).0 == "True"
                && !taints(n)
                    .iter()
                    .any(|t| t.starts_with("node.kubernetes.io/"))
        });
        assert!(taints(&n).contains(&"knit.dev/user-data-pending:NoSchedule".to_string()));
        eprintln!("stand-in log:\n{}", sim.log());
    })
    .await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_and_expired_token_are_refused_and_lightweight_rotates() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(
        &dir.path().join("cluster"),
        Duration::from_secs(40),
        Duration::from_secs(16),
    )
    .await;
    let (ep, ca) = (c.endpoint().to_string(), c.ca_pem().to_string());
    let good = c
        .create_bootstrap_token(Some("light-1"), Duration::from_secs(600), &[])
        .unwrap();
    let expired = c
        .create_bootstrap_token(None, Duration::from_millis(1), &[])
        .unwrap();
    let admin = Client::admin(&c);
    let root = dir.path().to_path_buf();
    blocking(move || {
        let nowhere = root.join("no-runtime.sock");

        // A bootstrap kubeconfig whose CA is not the cluster's: TLS refuses the server.
        let other_ca = {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            p.self_signed(&key).unwrap().pem()
        };
        let f = NodeFiles::new(&root.join("wrong-ca"), &ep, &other_ca, &good.token());
        let mut sim = spawn(
            SIM,
            &f.args("light-1", &nowhere, &["--lightweight"]),
            root.join("wrong-ca.log"),
        );
        let (st, log) = sim.wait_exit(Duration::from_secs(60));
        assert!(!st.success(), "{log}");
        assert!(
            log.contains("SimApiUnreachable") && log.to_lowercase().contains("certificate"),
            "{log}"
        );
        assert_eq!(admin.get("/api/v1/nodes/light-1").0, 404);

        // An expired token: 401 from the API server, no node.
        std::thread::sleep(Duration::from_millis(50));
        let f = NodeFiles::new(&root.join("expired"), &ep, &ca, &expired.token());
        let mut sim = spawn(
            SIM,
            &f.args("light-2", &nowhere, &["--lightweight"]),
            root.join("expired.log"),
        );
        let (st, log) = sim.wait_exit(Duration::from_secs(60));
        assert!(!st.success(), "{log}");
        assert!(log.contains("HTTP 401"), "{log}");
        assert_eq!(admin.get("/api/v1/nodes/light-2").0, 404);

        // The token bound to light-1 used by a node calling itself light-3:
        // the CSR is denied and the stand-in stops with the reason.
        let f = NodeFiles::new(&root.join("other-name"), &ep, &ca, &good.token());
        let mut sim = spawn(
            SIM,
            &f.args("light-3", &nowhere, &["--lightweight"]),
            root.join("other-name.log"),
        );
        let (st, log) = sim.wait_exit(Duration::from_secs(60));
        assert!(!st.success(), "{log}");
        assert!(
            log.contains("SimCsrRejected") && log.contains("was issued for node \"light-1\""),
            "{log}"
        );
        assert_eq!(admin.get("/api/v1/nodes/light-3").0, 404);

        // Lightweight mode: Ready without a runtime; the 16 s client
        // certificate is rotated before it expires and heartbeats go on.
        let f = NodeFiles::new(&root.join("light"), &ep, &ca, &good.token());
        let sim = spawn(
            SIM,
            &f.args("light-1", &nowhere, &["--lightweight"]),
            root.join("light.log"),
        );
        wait_node(&admin, "light-1", "lightweight Ready", &sim, |n| {
            ready(n).0 == "True"
        });
        let current = f.path("var/lib/kubelet/pki/kubelet-client-current.pem");
        let first = std::fs::read_link(&current).unwrap();
        let second = wait_for("rotated certificate", Duration::from_secs(60), || {
            std::fs::read_link(&current).ok().filter(|p| *p != first)
        });
        assert!(second.exists());
        // Past the first certificate's expiry, the lease is still renewed.
        std::thread::sleep(Duration::from_secs(4));
        let before = lease_renew_time(&admin, "light-1");
        wait_for(
            "lease renewed with the rotated certificate",
            Duration::from_secs(30),
            || (lease_renew_time(&admin, "light-1") != before).then_some(()),
        );
        let (_, csrs) = admin.get("/apis/certificates.k8s.io/v1/certificatesigningrequests");
        let by_node = csrs["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["spec"]["username"] == "system:node:light-1")
            .count();
        assert!(
            by_node >= 1,
            "the renewal CSR is made with the node's own identity: {csrs}"
        );
        drop(sim);
    })
    .await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_survive_a_control_plane_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cluster");
    let c = cluster(&data, Duration::from_secs(40), Duration::from_secs(3600)).await;
    let addr = c.local_addr();
    let token = c
        .create_bootstrap_token(Some("keep-1"), Duration::from_secs(600), &[])
        .unwrap();
    let f = NodeFiles::new(
        &dir.path().join("node"),
        c.endpoint(),
        c.ca_pem(),
        &token.token(),
    );
    let nowhere = dir.path().join("no-runtime.sock");
    let sim = spawn(
        SIM,
        &f.args("keep-1", &nowhere, &["--lightweight"]),
        dir.path().join("sim.log"),
    );
    let admin = Client::admin(&c);
    let (sim, before) = blocking(move || {
        let n = wait_node(&admin, "keep-1", "Ready", &sim, |n| ready(n).0 == "True");
        (sim, n["metadata"]["uid"].as_str().unwrap().to_string())
    })
    .await;
    c.shutdown().await;

    // Same data dir and port: same CA, the node's certificate still works.
    let mut cfg = ClusterConfig::new(&data, addr);
    cfg.node_grace_period = Duration::from_secs(40);
    let c = EmbeddedCluster::start(cfg).await.unwrap();
    let admin = Client::admin(&c);
    blocking(move || {
        let first = lease_renew_time(&admin, "keep-1");
        wait_for(
            "lease renewed after the restart",
            Duration::from_secs(60),
            || (lease_renew_time(&admin, "keep-1") != first).then_some(()),
        );
        let n = wait_node(&admin, "keep-1", "still Ready", &sim, |n| {
            ready(n).0 == "True"
        });
        assert_eq!(
            n["metadata"]["uid"],
            before.as_str(),
            "same Node object, not a new registration"
        );
        // One TLS bootstrap in all: the restart did not force a new one.
        assert_eq!(
            sim.log()
                .matches("certificate signing request sent")
                .count(),
            1,
            "{}",
            sim.log()
        );
    })
    .await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_falls_back_to_a_bootstrap_token_that_ended_at_join() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(
        &dir.path().join("cluster"),
        Duration::from_secs(3600),
        Duration::from_secs(8),
    )
    .await;
    let token = c
        .create_bootstrap_token(Some("late-1"), Duration::from_secs(600), &[])
        .unwrap();
    let f = NodeFiles::new(
        &dir.path().join("node"),
        c.endpoint(),
        c.ca_pem(),
        &token.token(),
    );
    let nowhere = dir.path().join("no-runtime.sock");
    let admin = Client::admin(&c);
    let log = dir.path().join("sim.log");
    blocking(move || {
        let sim = spawn(SIM, &f.args("late-1", &nowhere, &["--lightweight"]), log);
        wait_node(&admin, "late-1", "Ready", &sim, |n| ready(n).0 == "True");
        // Hung past the 8 s certificate's expiry: no chance to rotate in time.
        sim.signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_secs(10));
        sim.signal(libc::SIGCONT);
        wait_for("bootstrap again", Duration::from_secs(60), || {
            sim.log().contains("bootstrapping again").then_some(())
        });
        // The bootstrap token ended when the node joined (issue 30): the
        // fallback is refused: a node whose certificate lapsed is replaced
        // (repair), not re-admitted with an old credential.
        wait_for("the ended token refused", Duration::from_secs(60), || {
            sim.log().contains("unknown token id").then_some(())
        });
        // Nothing else signed for it: the only certificate is the first.
        let csrs = sim.log().matches("client certificate issued").count();
        assert_eq!(csrs, 1, "{}", sim.log());
    })
    .await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_two_nodes_goes_ready_and_kubectl_lists_them() {
    if which("containerd").is_none() {
        return knit_test_support::missing(
            "containerd is not installed (scripts/setup.sh installs it); the two-node test did not run",
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(
        &dir.path().join("cluster"),
        Duration::from_secs(40),
        Duration::from_secs(3600),
    )
    .await;
    // Unbound tokens of the pool's group: each is bound to the first node
    // name it gets a certificate for (issue 30), so each node has its own.
    let tokens: Vec<String> = (0..2)
        .map(|_| {
            c.create_bootstrap_token(
                None,
                Duration::from_secs(600),
                &["system:bootstrappers:knit:pool-b".into()],
            )
            .unwrap()
            .token()
        })
        .collect();
    let (ep, ca) = (c.endpoint().to_string(), c.ca_pem().to_string());
    let kubeconfig = c.admin_kubeconfig_path().to_path_buf();
    let admin = Client::admin(&c);
    let root = dir.path().to_path_buf();
    blocking(move || {
        let ctd_dir = root.join("ctd");
        let cni = root.join("cni");
        std::fs::create_dir_all(&ctd_dir).unwrap();
        std::fs::create_dir_all(&cni).unwrap();
        std::fs::write(cni.join("10-knit.conflist"), CNI_CONFLIST).unwrap();
        let _ctd = start_containerd(&ctd_dir, &cni, None);
        let sock = ctd_dir.join("containerd.sock");
        let sims: Vec<Proc> = ["pool-b-1", "pool-b-2"]
            .iter()
            .zip(&tokens)
            .map(|(name, token)| {
                let f = NodeFiles::new(&root.join(name), &ep, &ca, token);
                let mut args = f.args(name, &sock, &[]);
                args.push(format!("--cni-conf-dir={}", cni.display()));
                spawn(SIM, &args, root.join(format!("{name}.log")))
            })
            .collect();
        for (name, sim) in ["pool-b-1", "pool-b-2"].iter().zip(&sims) {
            wait_node(&admin, name, "Ready", sim, |n| ready(n).0 == "True");
        }
        let Some(kubectl) = which("kubectl") else {
            return knit_test_support::not_provided(
                "kubectl is not installed; the kubectl part of the two-node test did not run",
            );
        };
        let out = Command::new(kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!(
                "--cache-dir={}",
                root.join("kubectl-cache").display()
            ))
            .args(["get", "nodes", "-o", "wide"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        eprintln!("kubectl get nodes -o wide:\n{text}");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for name in ["pool-b-1", "pool-b-2"] {
            let row: Vec<&str> = text
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|c| c.first() == Some(&name))
                .unwrap_or_else(|| panic!("{name} not listed:\n{text}"));
            assert_eq!(row[1], "Ready", "{text}");
            assert!(row.iter().any(|c| c.starts_with("containerd://")), "{text}");
        }
    })
    .await;
    c.shutdown().await;
}

/// A node removed from the cluster (its Node deleted, which revokes its
/// client certificate) and joined again with a new bootstrap token, with
/// the old kubelet files still on disk: the stand-in finds the old
/// certificate refused (401) and bootstraps again instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joined_again_after_removal_bootstraps_a_new_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(
        &dir.path().join("cluster"),
        Duration::from_secs(40),
        Duration::from_secs(3600),
    )
    .await;
    let token = c
        .create_bootstrap_token(Some("again-1"), Duration::from_secs(600), &[])
        .unwrap();
    let f = NodeFiles::new(
        &dir.path().join("node"),
        c.endpoint(),
        c.ca_pem(),
        &token.token(),
    );
    let nowhere = dir.path().join("no-runtime.sock");
    let args = f.args("again-1", &nowhere, &["--lightweight"]);
    let sim = spawn(SIM, &args, dir.path().join("sim.log"));
    let admin = Client::admin(&c);
    let admin2 = admin.clone();
    let mut sim = blocking(move || {
        wait_node(&admin2, "again-1", "Ready", &sim, |n| ready(n).0 == "True");
        sim
    })
    .await;
    sim.kill();
    let admin2 = admin.clone();
    blocking(move || {
        assert_eq!(
            admin2.call("DELETE", "/api/v1/nodes/again-1", None, None).0,
            200
        );
    })
    .await;
    // Joined again: a new token in the bootstrap kubeconfig, old files kept.
    let token = c
        .create_bootstrap_token(Some("again-1"), Duration::from_secs(600), &[])
        .unwrap();
    bootstrap_kubeconfig(
        &f.path("etc/kubernetes/bootstrap-kubelet.conf"),
        c.endpoint(),
        c.ca_pem(),
        &token.token(),
    );
    assert!(f
        .path("var/lib/kubelet/pki/kubelet-client-current.pem")
        .exists());
    let sim = spawn(SIM, &args, dir.path().join("sim2.log"));
    blocking(move || {
        wait_node(&admin, "again-1", "Ready again", &sim, |n| {
            ready(n).0 == "True"
        });
        assert!(sim.log().contains("bootstrapping again"), "{}", sim.log());
    })
    .await;
    c.shutdown().await;
}
