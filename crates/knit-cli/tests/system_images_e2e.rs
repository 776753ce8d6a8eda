//! The main job's system images: the main job's pool (`examples/pool.yaml`,
//! 3 nodes, no registry mirror named) on a server started by `knit up`
//! gets its nodes' system images (`images.txt`: pause, kube-proxy,
//! flannel) from the control plane's own registry, built with no network.
//! Each node's real containerd pulls them (nothing here can reach
//! registry.k8s.io or docker.io); every node's kubelet stand-in reports
//! every image present and none failed, with the digests the server
//! serves; `knit describe node` and the console's node page show the same
//! counts. Root (namespaces, a bridge) and the workspace's binaries.

mod common;

use common::browser::{self, answer};
use common::Env;
use serde_json::Value;
use std::time::{Duration, Instant};

const COOKIE: &str = "__Host-knit-console";

#[test]
fn nodes_pull_every_system_image_from_the_control_plane() {
    let console_port = common::free_port();
    let mut env = Env::builder()
        .cluster(true)
        .env("KNIT_CONSOLE_LISTEN", format!("127.0.0.1:{console_port}"))
        .build();
    env.build_package(true);
    env.up();
    let ca = std::fs::read_to_string(env.state_dir().join("pki/ca.pem")).unwrap();
    let https = browser::https_agent(&ca);
    let api = format!("https://127.0.0.1:{}", env.port);

    // The registry, as containerd asks a mirror: HEAD resolves the tag.
    let head = answer(
        https
            .head(&format!("{api}/v2/pause/manifests/3.10?ns=registry.k8s.io"))
            .call(),
    );
    assert_eq!(head.status, 200, "{}", head.body);
    let r = https
        .get(&format!("{api}/v2/pause/manifests/3.10?ns=registry.k8s.io"))
        .call()
        .unwrap();
    assert_eq!(
        r.header("content-type"),
        Some("application/vnd.oci.image.manifest.v1+json")
    );
    let pause_digest = r.header("docker-content-digest").unwrap().to_string();
    let manifest: Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
    let layer = manifest["layers"][0]["digest"].as_str().unwrap();
    let blob = answer(
        https
            .get(&format!("{api}/v2/pause/blobs/{layer}?ns=registry.k8s.io"))
            .call(),
    );
    assert_eq!(blob.status, 200);
    // Another registry's name, an unknown tag, a push: refused.
    for (path, status) in [
        ("/v2/pause/manifests/3.10?ns=docker.io", 404),
        ("/v2/pause/manifests/9.9?ns=registry.k8s.io", 404),
    ] {
        assert_eq!(
            answer(https.get(&format!("{api}{path}")).call()).status,
            status,
            "{path}"
        );
    }
    let put = answer(
        https
            .put(&format!("{api}/v2/pause/manifests/3.10"))
            .send_string("{}"),
    );
    assert_eq!(put.status, 405, "{}", put.body);

    // The main job's pool, as up.sh applies it: 3 nodes, no mirror named.
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/pool.yaml");
    let yaml = std::fs::read_to_string(&example).unwrap();
    assert!(!yaml.contains("registryMirrors"), "{yaml}");
    env.create("pool", &yaml);
    let out = env.scale_wait("workers", 3);
    assert!(out.contains("3/3 initialized and Ready"), "{out}");
    let nodes = env.nodes_of("workers");
    assert_eq!(nodes.len(), 3);
    let mut first = None;
    for n in &nodes {
        let node = n["name"].as_str().unwrap().to_string();
        let instance = n["instance"].as_str().unwrap().to_string();
        let images = image_report(&env, &node);
        let report: Value =
            serde_json::from_str(&env.node_file(&instance, "/var/lib/kubelet/knit-images.json"))
                .unwrap();
        assert_eq!(
            images["failed"], 0,
            "{node}: {images}\nreport on the node: {report}"
        );
        assert_eq!(report["failed"], 0, "{report}");
        let outcomes = report["images"].as_array().unwrap();
        assert_eq!(outcomes.len(), 3, "{report}");
        for o in outcomes {
            assert!(o["error"].is_null(), "{o}");
            assert!(o["sizeBytes"].as_u64().unwrap() > 0, "{o}");
        }
        // The pause image the node holds is the one the server serves.
        let pause = outcomes
            .iter()
            .find(|o| o["image"] == "registry.k8s.io/pause:3.10")
            .unwrap();
        assert!(
            pause["repoDigests"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d.as_str().unwrap().ends_with(&pause_digest)),
            "{pause} vs {pause_digest}"
        );
        // containerd was pointed at the control plane, verified by its CA.
        let hosts = env.node_file(
            &instance,
            "/etc/containerd/certs.d/registry.k8s.io/hosts.toml",
        );
        assert!(
            hosts.contains(&format!("[host.\"https://{}:{}\"]", env.gateway, env.port))
                && hosts.contains("ca = \"/etc/containerd/knit-control-plane-ca.crt\""),
            "{hosts}"
        );
        eprintln!("{node}: {images}");
        first.get_or_insert((node, images));
    }
    let (node, images) = first.unwrap();

    // One report, two readers: the CLI and the console say the same.
    let (hit, miss) = (
        images["hit"].as_u64().unwrap(),
        images["miss"].as_u64().unwrap(),
    );
    let described = env.knit_ok(&["describe", "node", &node]);
    let line = format!("Images:        cache hit {hit}, miss {miss}, failed 0,");
    assert!(described.contains(&line), "{line:?} not in\n{described}");
    let token = std::fs::read_to_string(env.state_dir().join("admin-token")).unwrap();
    let console = format!("https://127.0.0.1:{console_port}");
    let signed = answer(
        https
            .post(&format!("{console}/ui/sign-in"))
            .set("Origin", &console)
            .send_form(&[("token", token.trim())]),
    );
    assert_eq!(signed.status, 303, "{}", signed.body);
    let session = signed
        .set_cookie
        .as_deref()
        .and_then(|c| c.strip_prefix(&format!("{COOKIE}=")))
        .and_then(|v| v.split(';').next())
        .expect("a session cookie")
        .to_string();
    let page = answer(
        https
            .get(&format!("{console}/ui/nodes/{node}"))
            .set("Cookie", &format!("{COOKIE}={session}"))
            .call(),
    );
    assert_eq!(page.status, 200);
    let shown = format!("<dt>System images</dt><dd>{hit} hit, {miss} miss, 0 failed;");
    assert!(
        page.body.contains(&shown),
        "{shown:?} not in the console's node page"
    );
}

/// The node's image report as `knit describe node -o json` gives it, once
/// every image is accounted for (or one failed): 180 s at most.
fn image_report(env: &Env, node: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let n: Value = env.json(&["describe", "node", node, "-o", "json"]);
        let images = n["cache"]["images"].clone();
        let count = |k: &str| images[k].as_u64().unwrap_or(0);
        if count("hit") + count("miss") == 3 || count("failed") > 0 {
            return images;
        }
        assert!(
            Instant::now() < deadline,
            "no image report from {node} within 180 s: {n}\n{}",
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}
