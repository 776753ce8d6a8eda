//! System images through CRI, for real: the embedded cluster on 127.0.0.1,
//! a real `docker-registry` on 127.0.0.1 seeded with images built here, a
//! real containerd (own root and socket; its registry configuration sends
//! `registry.k8s.io` and `docker.io` to that registry over plain HTTP, as
//! the agent renders `certs.d/<host>/hosts.toml`), and the stand-in.
//!
//! First start: every image is pulled (`pulled image` lines, blob GETs in
//! the registry's access log, annotation `miss=3`). Second start on the same
//! containerd: no `pulled image` line, no new blob GET, `hit=3 miss=0`.

#[path = "../../knit-cluster/tests/common/mod.rs"]
mod common;
mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{blocking, Client};
use knit_cluster::{ClusterConfig, EmbeddedCluster};
use serde_json::Value;
use support::{
    bootstrap_kubeconfig, free_port, spawn, start_containerd, wait_node, which, Proc, CNI_CONFLIST,
    SIM,
};

const IMAGES: &[(&str, u64)] = &[
    ("registry.k8s.io/pause:3.10", 32 << 10),
    ("registry.k8s.io/kube-proxy:v1.31.4", 2 << 20),
    ("docker.io/flannel/flannel:v0.26.1", 3 << 20),
];

fn write_node_files(root: &Path, server: &str, ca_pem: &str, token: &str) {
    std::fs::create_dir_all(root.join("etc/cni/net.d")).unwrap();
    std::fs::create_dir_all(root.join("var/lib/kubelet")).unwrap();
    bootstrap_kubeconfig(
        &root.join("etc/kubernetes/bootstrap-kubelet.conf"),
        server,
        ca_pem,
        token,
    );
    std::fs::write(
        root.join("var/lib/kubelet/config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeStatusUpdateFrequency: 1s\n",
    )
    .unwrap();
    let list: String = IMAGES.iter().map(|(r, _)| format!("{r}\n")).collect();
    std::fs::write(
        root.join("etc/kubernetes/images.txt"),
        format!("# system images\n{list}"),
    )
    .unwrap();
    std::fs::write(root.join("etc/cni/net.d/10-knit.conflist"), CNI_CONFLIST).unwrap();
}

fn args(root: &Path, sock: &Path) -> Vec<String> {
    let p = |r: &str| root.join(r).display().to_string();
    vec![
        format!(
            "--bootstrap-kubeconfig={}",
            p("etc/kubernetes/bootstrap-kubelet.conf")
        ),
        format!("--kubeconfig={}", p("etc/kubernetes/kubelet.conf")),
        format!("--config={}", p("var/lib/kubelet/config.yaml")),
        "--hostname-override=img-1".into(),
        "--node-ip=127.0.0.1".into(),
        format!("--container-runtime-endpoint=unix://{}", sock.display()),
        format!("--cert-dir={}", p("var/lib/kubelet/pki")),
        format!("--root-dir={}", p("var/lib/kubelet")),
        format!("--cni-conf-dir={}", p("etc/cni/net.d")),
        format!("--image-list={}", p("etc/kubernetes/images.txt")),
    ]
}

fn pulled_lines(log: &str) -> usize {
    log.lines().filter(|l| l.contains("pulled image")).count()
}

fn wait_annotation(admin: &Client, sim: &Proc, want_prefix: &str) -> Value {
    wait_node(
        admin,
        "img-1",
        &format!("image annotation {want_prefix:?}"),
        sim,
        Duration::from_secs(180),
        // The annotation and `status.images` are two requests: wait for
        // both, so the images are never read before they are published.
        |n| {
            n["metadata"]["annotations"]["knit.dev/image-cache"]
                .as_str()
                .is_some_and(|a| a.starts_with(want_prefix))
                && n["status"]["images"]
                    .as_array()
                    .is_some_and(|i| i.len() == IMAGES.len())
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_pulled_once_then_found_in_the_runtime() {
    for bin in ["containerd", "docker-registry"] {
        if which(bin).is_none() {
            return knit_test_support::missing(format!(
                "{bin} is not installed (scripts/setup.sh installs it)"
            ));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let c = EmbeddedCluster::start(ClusterConfig::new(
        dir.path().join("cluster"),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .await
    .unwrap();
    let token = c
        .create_bootstrap_token(None, Duration::from_secs(600), &[])
        .unwrap();
    let (ep, ca) = (c.endpoint().to_string(), c.ca_pem().to_string());
    let admin = Client::admin(&c);
    let root = dir.path().to_path_buf();
    blocking(move || {
        let reg = knit_registry::Registry::start(
            &root.join("registry"),
            &format!("127.0.0.1:{}", free_port()),
        )
        .unwrap();
        let mut transfer = 0;
        for (r, size) in IMAGES {
            let img =
                knit_registry::seed(&reg.push_url(), &root.join("work"), r, 1, *size).unwrap();
            transfer += img.transfer_bytes();
        }
        let blob_gets_before = reg.blob_gets();
        assert_eq!(blob_gets_before, 0, "seeding only pushes");

        let node = root.join("node");
        write_node_files(&node, &ep, &ca, &token.token());
        let ctd_dir = root.join("ctd");
        std::fs::create_dir_all(&ctd_dir).unwrap();
        let _ctd = start_containerd(&ctd_dir, &node.join("etc/cni/net.d"), Some(reg.addr()));
        let sock = ctd_dir.join("containerd.sock");

        // First start: nothing cached, all three pulled through the mirror.
        let mut sim = spawn(SIM, &args(&node, &sock), root.join("sim-1.log"));
        let n = wait_annotation(&admin, &sim, "hit=0 miss=3");
        let log = sim.log();
        assert_eq!(pulled_lines(&log), 3, "{log}");
        let ann = n["metadata"]["annotations"]["knit.dev/image-cache"]
            .as_str()
            .unwrap();
        let bytes: u64 = ann.split("bytes=").nth(1).unwrap().parse().unwrap();
        // The runtime's size counts the same compressed blobs + manifest.
        assert!(bytes >= transfer, "{ann} vs {transfer} pushed");
        assert_eq!(n["status"]["images"].as_array().unwrap().len(), 3, "{n}");
        let gets = reg.blob_gets();
        // Each image: its config and its one layer.
        assert_eq!(gets, 6, "{}", reg.log_text());
        let report: Value = serde_json::from_str(
            &std::fs::read_to_string(node.join("var/lib/kubelet/knit-images.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(report["miss"], 3);
        assert!(report["images"][0]["repoDigests"][0]
            .as_str()
            .unwrap()
            .contains("@sha256:"));
        sim.kill();

        // Second start, same runtime: all cached, nothing fetched.
        admin.patch(
            "/api/v1/nodes/img-1",
            "application/merge-patch+json",
            &serde_json::json!({"metadata": {"annotations": {"knit.dev/image-cache": null}}}),
        );
        let sim = spawn(SIM, &args(&node, &sock), root.join("sim-2.log"));
        wait_annotation(&admin, &sim, "hit=3 miss=0 bytes=0");
        let log = sim.log();
        assert_eq!(pulled_lines(&log), 0, "{log}");
        assert_eq!(
            log.matches("already present on machine").count(),
            3,
            "{log}"
        );
        assert_eq!(reg.blob_gets(), gets, "no blob fetched on the second start");

        // --ensure-images (the snapshot builder's business images): pulls
        // what is missing, prints the report, fails on an unknown image.
        knit_registry::seed(
            &reg.push_url(),
            &root.join("work"),
            "docker.io/knit/app:1",
            2,
            1 << 20,
        )
        .unwrap();
        let sock_flag = format!("--container-runtime-endpoint=unix://{}", sock.display());
        let out = Command::new(SIM)
            .args([
                &sock_flag,
                "--ensure-images=registry.k8s.io/pause:3.10,docker.io/knit/app:1",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (report["hit"].as_u64(), report["miss"].as_u64()),
            (Some(1), Some(1)),
            "{report}"
        );
        let out = Command::new(SIM)
            .args([&sock_flag, "--ensure-images=docker.io/knit/absent:1"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("not present") && err.contains("not found"),
            "{err}"
        );
    })
    .await;
    c.shutdown().await;
}
