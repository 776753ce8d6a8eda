//! join: real containerd and a kubelet stand-in started by the supervisor,
//! an HTTPS API server on loopback that checks the kubelet's client
//! certificate, the failure when it is unreachable and the resume after it,
//! and the cluster CA pin (given CA and cluster-info discovery).

mod components_support;

use components_support::*;
use knit_agent::services;
use knit_agent::tls;
use knit_api::{ErrorCode, NodeConfig, PhaseName, PhaseOutcome};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &str = "abcdef.0123456789abcdef";

/// A node tree with the package (kubelet stand-in) in a local directory
/// and the host's containerd linked in.
fn prepared_node() -> Node {
    let node = Node::new();
    node.link_host_containerd();
    let dir = node.path("/opt/knit-packages");
    std::fs::create_dir_all(&dir).unwrap();
    build_package(&dir, VERSION, &[("bin/kubelet", KUBELET_SCRIPT)]);
    node
}

fn join_config(endpoint: &str, pki: &Pki) -> NodeConfig {
    let mut config = base_config();
    config.kubernetes.dir = Some("/opt/knit-packages".into());
    config.cluster.endpoint = Some(endpoint.to_string());
    config.cluster.ca_cert = Some(pki.ca_pem.clone());
    config.cluster.bootstrap_token = Some(TOKEN.into());
    config.join.timeout_seconds = 2;
    config.user_data.scheduling_gate = true;
    config.node.labels.insert("pool".into(), "a".into());
    config.node.taints.push(knit_api::Taint {
        key: "dedicated".into(),
        value: "gpu".into(),
        effect: "NoExecute".into(),
    });
    config
        .kubelet
        .customized_args
        .insert("v".into(), "2".into());
    config
}

fn cmdline(pid: i32) -> Vec<String> {
    knit_os::proc::cmdline(pid)
        .unwrap_or_else(|| panic!("no process {pid}"))
        .iter()
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

fn node_path() -> String {
    format!("/api/v1/nodes/{NODE}")
}

#[test]
fn unreachable_api_server_fails_the_join_and_a_rerun_resumes() {
    let node = prepared_node();
    let pki = Pki::new("test-cluster-ca");
    // Reserve a loopback port and close it: nothing listens there yet.
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let endpoint = format!("https://{addr}");
    let config = join_config(&endpoint, &pki);

    let err = node.init(&config).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailJoin, "{err}");
    assert!(err.message.contains(&endpoint), "{err}");
    assert!(err.message.contains("security-group"), "{err}");
    assert!(
        err.message.contains(&format!("TCP {}", addr.port())),
        "{err}"
    );
    let record = &node.journal().phases[&PhaseName::Join];
    assert_eq!(record.outcome, PhaseOutcome::Failed);
    assert_eq!(record.error_code, Some(ErrorCode::FailJoin));

    // The services were started: a real containerd answering on its socket …
    let socket = node.host.host_path("/run/containerd/containerd.sock");
    let out = std::process::Command::new("ctr")
        .args(["--address", &socket, "version"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // … and the kubelet with the contracted command line.
    let kubelet = services::main_pid(&node.host, "kubelet").expect("kubelet runs");
    let root = node.root().display().to_string();
    let expected: Vec<String> = [
        format!("{root}/usr/local/bin/kubelet"),
        format!("--bootstrap-kubeconfig={root}/etc/kubernetes/bootstrap-kubelet.conf"),
        format!("--kubeconfig={root}/etc/kubernetes/kubelet.conf"),
        format!("--config={root}/var/lib/kubelet/config.yaml"),
        format!("--hostname-override={NODE}"),
        "--node-ip=10.0.0.7".to_string(),
        "--provider-id=cn-test.i-0001".to_string(),
        "--node-labels=pool=a".to_string(),
        "--register-with-taints=dedicated=gpu:NoExecute,knit.dev/user-data-pending=:NoSchedule"
            .to_string(),
        format!("--container-runtime-endpoint=unix://{root}/run/containerd/containerd.sock"),
        format!("--cert-dir={root}/var/lib/kubelet/pki"),
        format!("--root-dir={root}/var/lib/kubelet"),
        "--v=2".to_string(),
    ]
    .to_vec();
    // The stand-in is a script: the kernel runs it as `/bin/sh <script> …`.
    assert_eq!(cmdline(kubelet)[1..], expected[..]);
    let bootstrap: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(node.path("/etc/kubernetes/bootstrap-kubelet.conf")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        bootstrap["clusters"][0]["cluster"]["server"].as_str(),
        Some(endpoint.as_str())
    );
    assert_eq!(bootstrap["users"][0]["user"]["token"].as_str(), Some(TOKEN));
    use base64::Engine;
    let ca_data = bootstrap["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(ca_data)
            .unwrap(),
        pki.ca_pem.as_bytes()
    );
    assert_eq!(
        std::fs::read_to_string(node.path("/etc/kubernetes/pki/ca.crt")).unwrap(),
        pki.ca_pem
    );
    let containerd_supervisor = node.supervisor_pid("containerd").unwrap();
    let kubelet_supervisor = node.supervisor_pid("kubelet").unwrap();

    // The API server comes up; it knows the node from its second query on,
    // and only when asked with the kubelet's client certificate.
    let node_queries = Arc::new(AtomicUsize::new(0));
    let seen = node_queries.clone();
    let server = Server::start(
        TcpListener::bind(addr).expect("rebind the reserved port"),
        Some(pki.server_config()),
        move |req| {
            if req.path == node_path() {
                if req.client_cn.as_deref() != Some(&format!("system:node:{NODE}")) {
                    return Response::status(401);
                }
                if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Response::status(404);
                }
                return Response::ok(format!(
                    "{{\"kind\":\"Node\",\"metadata\":{{\"name\":\"{NODE}\"}}}}"
                ));
            }
            if req.path == "/healthz" {
                return Response::ok("ok");
            }
            Response::status(404)
        },
    );
    // What TLS bootstrap leaves behind; the stand-in then writes kubelet.conf.
    std::fs::write(
        node.path("/var/lib/kubelet/pki/kubelet-client-current.pem"),
        pki.client_pem(&format!("system:node:{NODE}")),
    )
    .unwrap();
    let mut config = config;
    config.join.timeout_seconds = 60;
    node.init(&config).expect("the rerun joins");
    let record = &node.journal().phases[&PhaseName::Join];
    assert_eq!(record.outcome, PhaseOutcome::Done);
    assert!(
        record.reason.as_deref().unwrap().contains("registered"),
        "{record:?}"
    );
    assert!(node_queries.load(Ordering::SeqCst) >= 2);
    // Resumed, not restarted.
    assert_eq!(
        node.supervisor_pid("containerd"),
        Some(containerd_supervisor)
    );
    assert_eq!(node.supervisor_pid("kubelet"), Some(kubelet_supervisor));
    assert_eq!(services::main_pid(&node.host, "kubelet"), Some(kubelet));

    // Once joined, a rerun only verifies.
    node.init(&config).expect("third run");
    let record = &node.journal().phases[&PhaseName::Join];
    assert!(
        record.reason.as_deref().unwrap().contains("is registered"),
        "{record:?}"
    );

    // A kubelet setting changes: the kubelet restarts, containerd does not.
    config.kubelet.max_pods = 50;
    node.init(&config)
        .expect("rerun with a new kubelet setting");
    assert_eq!(
        node.supervisor_pid("containerd"),
        Some(containerd_supervisor)
    );
    let new_kubelet = node.supervisor_pid("kubelet").unwrap();
    assert_ne!(new_kubelet, kubelet_supervisor);
    assert!(!pid_alive(kubelet_supervisor));
    assert_eq!(
        node.journal().phases[&PhaseName::Join].outcome,
        PhaseOutcome::Done
    );
    drop(server);
}

/// kubeadm's detached JWS of `content` for a bootstrap token, computed here
/// independently of the agent (HS256 over header.payload).
fn jws_for(content: &str, token: &str) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let (id, secret) = token.split_once('.').unwrap();
    let header = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"HS256","kid":"{id}"}}"#));
    let signed = format!("{header}.{}", URL_SAFE_NO_PAD.encode(content));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let sig = ring::hmac::sign(&key, signed.as_bytes());
    format!("{header}..{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
}

/// An HTTPS server serving `cluster-info` with `ca_pem` in its kubeconfig,
/// signed for TOKEN.
fn cluster_info_server(pki: &Pki, advertised_ca: &str) -> Server {
    cluster_info_server_signed(pki, advertised_ca, Some(TOKEN))
}

/// Like `cluster_info_server`, signed with `signer` (None: no signature).
fn cluster_info_server_signed(pki: &Pki, advertised_ca: &str, signer: Option<&str>) -> Server {
    use base64::Engine;
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    server: https://127.0.0.1\n    certificate-authority-data: {}\n",
        base64::engine::general_purpose::STANDARD.encode(advertised_ca)
    );
    let mut data = serde_json::json!({"kubeconfig": kubeconfig});
    if let Some(token) = signer {
        // Keyed under TOKEN's id whoever signed: a wrong secret must fail.
        let id = TOKEN.split_once('.').unwrap().0;
        data[format!("jws-kubeconfig-{id}")] = serde_json::json!(jws_for(&kubeconfig, token));
    }
    let body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cluster-info", "namespace": "kube-public"},
        "data": data,
    })
    .to_string();
    Server::start(
        TcpListener::bind("127.0.0.1:0").unwrap(),
        Some(pki.server_config()),
        move |req| {
            if req.path == tls::CLUSTER_INFO_PATH {
                Response::ok(body.clone())
            } else {
                Response::status(404)
            }
        },
    )
}

/// Only the pinned certificate of a CA bundle is trusted: a bundle that
/// also holds another CA does not make a server of that CA trusted; and
/// cluster-info's kubeconfig is trusted only with a valid JWS for the
/// node's bootstrap token.
#[test]
fn only_the_pinned_ca_is_trusted_and_cluster_info_must_be_signed() {
    let work = tempfile::tempdir().unwrap();
    let pki = Pki::new("test-cluster-ca");
    let pin = openssl_pin(&pki.ca_pem, work.path());
    let other = Pki::new("unpinned-ca");
    let timeout = Duration::from_secs(5);

    // A bundle with an extra CA: only the pinned one comes back.
    let bundle = format!("{}{}", other.ca_pem, pki.ca_pem);
    let pinned = tls::check_ca_pin(&bundle, &pin, "bundle").unwrap();
    assert_eq!(
        knit_os::pem::certificates(pinned.as_bytes(), "pinned")
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        knit_os::pem::certificates(pinned.as_bytes(), "pinned").unwrap()[0].as_ref(),
        pki.ca_der.as_slice()
    );

    // cluster-info advertising that bundle, served with a certificate of
    // the unpinned CA: refused (before, the whole bundle was trusted).
    let lying = cluster_info_server(&other, &bundle);
    let err = tls::discover_ca(&lying.url("https"), &pin, TOKEN, timeout).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailJoin);
    assert!(
        err.message
            .contains("does not present a certificate of the pinned CA"),
        "{err}"
    );
    // Served by the pinned CA: only the pinned certificate is returned.
    let honest = cluster_info_server(&pki, &bundle);
    let ca = tls::discover_ca(&honest.url("https"), &pin, TOKEN, timeout).unwrap();
    assert_eq!(
        knit_os::pem::certificates(ca.as_bytes(), "ca")
            .unwrap()
            .len(),
        1,
        "{ca}"
    );

    // Signed with another secret, or not signed: refused.
    let forged = cluster_info_server_signed(&pki, &pki.ca_pem, Some("abcdef.ffffffffffffffff"));
    let err = tls::discover_ca(&forged.url("https"), &pin, TOKEN, timeout).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailJoin);
    assert!(err.message.contains("does not verify"), "{err}");
    let unsigned = cluster_info_server_signed(&pki, &pki.ca_pem, None);
    let err = tls::discover_ca(&unsigned.url("https"), &pin, TOKEN, timeout).unwrap_err();
    assert!(err.message.contains("jws-kubeconfig-abcdef"), "{err}");

    // Through init, with a given bundle: only the pinned CA is written for
    // the kubelet.
    let node = prepared_node();
    let mut config = join_config(&honest.url("https"), &pki);
    config.cluster.ca_cert = Some(bundle.clone());
    config.cluster.ca_pin = Some(pin.clone());
    config.join.timeout_seconds = 1;
    let _ = node.init(&config);
    let written = std::fs::read_to_string(node.path("/etc/kubernetes/pki/ca.crt")).unwrap();
    assert_eq!(
        knit_os::pem::certificates(written.as_bytes(), "written")
            .unwrap()
            .len(),
        1,
        "{written}"
    );
    assert_eq!(
        knit_os::pem::certificates(written.as_bytes(), "written").unwrap()[0].as_ref(),
        pki.ca_der.as_slice()
    );
}

#[test]
fn ca_pin_is_checked_and_mismatches_refused() {
    let work = tempfile::tempdir().unwrap();
    let pki = Pki::new("test-cluster-ca");
    let pin = openssl_pin(&pki.ca_pem, work.path());
    assert_eq!(
        tls::spki_pin(&pki.ca_der).unwrap(),
        pin,
        "agrees with openssl"
    );
    let wrong_pin = format!("sha256:{}", "ab".repeat(32));

    // Discovery: the CA from cluster-info is accepted only with the right pin.
    let server = cluster_info_server(&pki, &pki.ca_pem);
    let endpoint = server.url("https");
    let timeout = Duration::from_secs(5);
    assert_eq!(
        tls::discover_ca(&endpoint, &pin, TOKEN, timeout).unwrap(),
        pki.ca_pem
    );
    let err = tls::discover_ca(&endpoint, &wrong_pin, TOKEN, timeout).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailJoin);
    assert!(err.message.contains("refusing"), "{err}");
    assert!(err.message.contains(&wrong_pin), "{err}");

    // A server advertising the pinned CA while presenting another CA's
    // certificate is refused too.
    let impostor = Pki::new("impostor-ca");
    let lying = cluster_info_server(&impostor, &pki.ca_pem);
    let err = tls::discover_ca(&lying.url("https"), &pin, TOKEN, timeout).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailJoin);
    assert!(
        err.message
            .contains("does not present a certificate of the pinned CA"),
        "{err}"
    );

    // Through init: a given CA that does not match the pin, then a
    // discovered one that does not; nothing is started either time.
    for (ca_cert, case) in [(Some(pki.ca_pem.clone()), "given"), (None, "discovered")] {
        let node = prepared_node();
        let mut config = join_config(&endpoint, &pki);
        config.cluster.ca_cert = ca_cert;
        config.cluster.ca_pin = Some(wrong_pin.clone());
        let err = node.init(&config).unwrap_err();
        assert_eq!(err.code, ErrorCode::FailJoin, "{case}: {err}");
        assert!(err.message.contains("cluster.caPin"), "{case}: {err}");
        assert!(!services::is_running(&node.host, "containerd"), "{case}");
        assert!(
            !node.path("/etc/kubernetes/bootstrap-kubelet.conf").exists(),
            "{case}"
        );
    }

    // A discovered CA that matches is written for the kubelet.
    let node = prepared_node();
    let mut config = join_config(&endpoint, &pki);
    config.cluster.ca_cert = None;
    config.cluster.ca_pin = Some(pin);
    config.join.timeout_seconds = 1;
    let err = node.init(&config).unwrap_err();
    // cluster-info is all this server serves: the node never registers.
    assert!(err.message.contains("did not register"), "{err}");
    assert_eq!(
        std::fs::read_to_string(node.path("/etc/kubernetes/pki/ca.crt")).unwrap(),
        pki.ca_pem
    );
    // A rerun reuses the discovered CA (it still has the pin): with the
    // server gone, the join fails on reachability, not on discovery.
    drop(server);
    let err = node.init(&config).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailJoin);
    assert!(err.message.contains("cannot reach the API server"), "{err}");
    assert!(!err.message.contains("cluster-info"), "{err}");
}

#[test]
fn no_endpoint_skips_the_join() {
    let node = Node::new();
    let dir = node.path("/opt/knit-packages");
    std::fs::create_dir_all(&dir).unwrap();
    build_package(
        &dir,
        VERSION,
        &[
            ("bin/kubelet", KUBELET_SCRIPT),
            ("bin/containerd", b"#!/bin/sh\n"),
        ],
    );
    let mut config = base_config();
    config.kubernetes.dir = Some("/opt/knit-packages".into());
    node.init(&config).expect("init");
    let record = &node.journal().phases[&PhaseName::Join];
    assert_eq!(record.outcome, PhaseOutcome::Skipped);
    assert!(record
        .reason
        .as_deref()
        .unwrap()
        .contains("cluster.endpoint is not set"));
    assert!(!services::is_running(&node.host, "kubelet"));
}
