//! Faults and trust on the embedded API over real HTTPS: healthy nodes keep
//! their leases while others stop, are deleted, or the embedding process
//! stalls its own async workers; a node cannot edit its taints; sizes are
//! limited; a removed node's certificate stops working; names in paths
//! cannot address another object.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use common::{blocking, csr, csr_object, wait_for, Client, Who};
use knit_cluster::EmbeddedCluster;
use serde_json::{json, Value};

const KUBELET: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";

fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

fn ready_node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
           "spec": {"taints": [{"key": "knit.dev/user-data-pending", "effect": "NoSchedule"}]},
           "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}})
}

fn ready_of(n: &Value) -> String {
    n["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_string()
}

/// A node's client certificate and key, through the real CSR flow with a
/// bootstrap token bound to the node.
async fn node_credential(cluster: &EmbeddedCluster, name: &str) -> (String, String) {
    let token = cluster
        .create_bootstrap_token(Some(name), Duration::from_secs(600), &[])
        .unwrap()
        .token();
    let admin = Client::admin(cluster);
    let (ep, ca, name) = (
        cluster.endpoint().to_string(),
        cluster.ca_pem().to_string(),
        name.to_string(),
    );
    blocking(move || {
        let boot = Client::new(&ep, &ca, Who::Token(&token));
        let (pem, key) = csr(&format!("system:node:{name}"), &["system:nodes"]);
        let (code, created) = boot.post(
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            &csr_object(&pem, KUBELET),
        );
        assert_eq!(code, 201, "{created}");
        let csr_name = created["metadata"]["name"].as_str().unwrap().to_string();
        let cert = wait_for("certificate", Duration::from_secs(30), || {
            let (_, c) = admin.get(&format!(
                "/apis/certificates.k8s.io/v1/certificatesigningrequests/{csr_name}"
            ));
            c["status"]["certificate"].as_str().map(str::to_string)
        });
        (
            String::from_utf8(STANDARD.decode(cert).unwrap()).unwrap(),
            key,
        )
    })
    .await
}

/// Several nodes renew their leases while one stops renewing, one is
/// deleted, and the process that embeds the cluster blocks all of its own
/// async workers for several grace periods (as a blocking call in the
/// embedding server would). The stopped node goes Unknown; no other node
/// ever does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_nodes_stay_ready_while_others_stop_are_deleted_and_the_host_runtime_stalls() {
    let dir = tempfile::tempdir().unwrap();
    let grace = Duration::from_secs(2);
    let cluster = common::start(dir.path(), grace).await;
    let admin = Client::admin(&cluster);
    let healthy: Vec<String> = (0..4).map(|i| format!("healthy-{i}")).collect();
    let (stopped, deleted) = ("stopped-0".to_string(), "deleted-0".to_string());
    let all: Vec<String> = healthy
        .iter()
        .chain([&stopped, &deleted])
        .cloned()
        .collect();
    {
        let (admin, all) = (admin.clone(), all.clone());
        blocking(move || {
            for n in &all {
                assert_eq!(admin.post("/api/v1/nodes", &ready_node(n)).0, 201);
                let lease = json!({"metadata": {"name": n}, "spec": {"holderIdentity": n, "leaseDurationSeconds": 2, "renewTime": now()}});
                assert_eq!(admin.post(LEASES, &lease).0, 201);
            }
        })
        .await;
    }

    // Every Ready transition of every node, from a watch.
    let transitions: Arc<Mutex<HashMap<String, Vec<String>>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (admin, transitions, done) = (admin.clone(), transitions.clone(), done.clone());
        std::thread::spawn(move || {
            let mut last: HashMap<String, String> = HashMap::new();
            while !done.load(Ordering::SeqCst) {
                admin.watch_lines("/api/v1/nodes?watch=1&timeoutSeconds=2", |e| {
                    let name = e["object"]["metadata"]["name"]
                        .as_str()
                        .unwrap_or("")
                        .to_string();
                    let ready = ready_of(&e["object"]);
                    if last.get(&name) != Some(&ready) {
                        transitions
                            .lock()
                            .unwrap()
                            .entry(name.clone())
                            .or_default()
                            .push(ready.clone());
                        last.insert(name, ready);
                    }
                    done.load(Ordering::SeqCst)
                });
            }
        })
    };

    // kubelets: renew every 200 ms; count successful renewals.
    let renewals: Arc<HashMap<String, AtomicU64>> =
        Arc::new(all.iter().map(|n| (n.clone(), AtomicU64::new(0))).collect());
    let stop_one = Arc::new(AtomicBool::new(false));
    let renewers: Vec<_> = all
        .iter()
        .map(|n| {
            let (admin, n, renewals, done) =
                (admin.clone(), n.clone(), renewals.clone(), done.clone());
            let stop_me =
                (n.starts_with("stopped") || n.starts_with("deleted")).then(|| stop_one.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::SeqCst)
                    && !stop_me.as_ref().is_some_and(|s| s.load(Ordering::SeqCst))
                {
                    let (code, _) = admin.patch(
                        &format!("{LEASES}/{n}"),
                        "application/merge-patch+json",
                        &json!({"spec": {"renewTime": now()}}),
                    );
                    if code == 200 {
                        renewals[&n].fetch_add(1, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        })
        .collect();
    let renewed_at_least = |count: u64| {
        let renewals = renewals.clone();
        let healthy = healthy.clone();
        move || {
            healthy
                .iter()
                .all(|n| renewals[n].load(Ordering::SeqCst) >= count)
                .then_some(())
        }
    };
    blocking(wait_for_fn("first renewals", renewed_at_least(3))).await;

    // One node stops, one is deleted (its lease is collected with it).
    stop_one.store(true, Ordering::SeqCst);
    {
        let (admin, deleted) = (admin.clone(), deleted.clone());
        blocking(move || {
            assert_eq!(
                admin
                    .call("DELETE", &format!("/api/v1/nodes/{deleted}"), None, None)
                    .0,
                200
            )
        })
        .await;
    }

    // The embedding process blocks both of its async workers for three
    // grace periods.
    let before: u64 = healthy
        .iter()
        .map(|n| renewals[n].load(Ordering::SeqCst))
        .min()
        .unwrap();
    let stalls: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { std::thread::sleep(grace * 3) }))
        .collect();
    for s in stalls {
        s.await.unwrap();
    }
    // Afterwards: the stopped node went Unknown, and every healthy node
    // renewed many times more (the controller ran meanwhile).
    {
        let admin = admin.clone();
        let stopped = stopped.clone();
        blocking(move || {
            wait_for("the stopped node Unknown", Duration::from_secs(30), || {
                (ready_of(&admin.get(&format!("/api/v1/nodes/{stopped}")).1) == "Unknown")
                    .then_some(())
            })
        })
        .await;
    }
    blocking(wait_for_fn("later renewals", renewed_at_least(before + 20))).await;
    done.store(true, Ordering::SeqCst);
    for r in renewers {
        r.join().unwrap();
    }
    watcher.join().unwrap();

    let t = transitions.lock().unwrap().clone();
    for n in &healthy {
        assert_eq!(t.get(n), Some(&vec!["True".to_string()]), "{n}: {t:?}");
    }
    assert!(t[&stopped].contains(&"Unknown".to_string()), "{t:?}");
    let (_, node) = {
        let admin = admin.clone();
        blocking(move || admin.get(&format!("/api/v1/nodes/{deleted}"))).await
    };
    assert_eq!(node["reason"], "NotFound");
    // The request metrics carry per verb/resource latency histograms.
    let text = cluster.metrics_text();
    assert!(
        text.contains(r#"knit_cluster_request_duration_seconds_bucket{verb="patch",resource="leases",le="+Inf"}"#),
        "{text}"
    );
    cluster.shutdown().await;
}

fn wait_for_fn(
    what: &'static str,
    mut f: impl FnMut() -> Option<()> + Send + 'static,
) -> impl FnOnce() + Send + 'static {
    move || wait_for(what, Duration::from_secs(60), &mut f)
}

/// NodeRestriction for taints: set when the node registers, never changed
/// by the node afterwards (the user-data gate in particular).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_may_not_change_its_own_taints() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start(dir.path(), Duration::from_secs(40)).await;
    let admin = Client::admin(&cluster);
    let (cert, key) = node_credential(&cluster, "n1").await;
    let node = Client::new(
        cluster.endpoint(),
        cluster.ca_pem(),
        Who::Cert {
            cert_pem: &cert,
            key_pem: &key,
        },
    );
    blocking(move || {
        let (code, created) = node.post("/api/v1/nodes", &ready_node("n1"));
        assert_eq!(code, 201, "{created}");
        for (ct, body) in [
            ("application/merge-patch+json", json!({"spec": {"taints": []}})),
            ("application/strategic-merge-patch+json", json!({"spec": {"taints": [{"key": "knit.dev/user-data-pending", "effect": "NoSchedule", "$patch": "delete"}]}})),
            ("application/json-patch+json", json!([{"op": "remove", "path": "/spec/taints/0"}])),
            ("application/merge-patch+json", json!({"spec": {"taints": [{"key": "knit.dev/user-data-pending", "effect": "NoSchedule"}, {"key": "extra", "effect": "NoSchedule"}]}})),
        ] {
            let (code, st) = node.patch("/api/v1/nodes/n1", ct, &body);
            assert_eq!(code, 403, "{ct} {body}: {st}");
            let msg = st["message"].as_str().unwrap();
            assert!(msg.contains("not allowed to modify taints"), "{msg}");
        }
        let (_, st) = node.patch("/api/v1/nodes/n1", "application/merge-patch+json", &json!({"spec": {"taints": []}}));
        assert!(st["message"].as_str().unwrap().contains("knit.dev/user-data-pending"), "{st}");
        let (_, cur) = node.get("/api/v1/nodes/n1");
        let mut put = cur.clone();
        put["spec"]["taints"] = json!([]);
        assert_eq!(node.put("/api/v1/nodes/n1", &put).0, 403);
        // Anything else stays the node's to change; an admin changes taints.
        let (code, st) = node.patch("/api/v1/nodes/n1", "application/merge-patch+json", &json!({"metadata": {"annotations": {"a": "b"}}}));
        assert_eq!(code, 200, "{st}");
        let (code, st) = admin.patch("/api/v1/nodes/n1", "application/merge-patch+json", &json!({"spec": {"taints": []}}));
        assert_eq!(code, 200, "{st}");
        let (_, after) = node.get("/api/v1/nodes/n1");
        assert!(after["spec"]["taints"].as_array().is_none_or(|t| t.is_empty()), "{after}");
    })
    .await;
    cluster.shutdown().await;
}

/// A body over the limit is answered 413 naming the limit (the connection
/// is not just dropped); stored objects are limited to 1.5 MiB, however
/// they are made (a JSON Patch `copy` into its own child doubles an object
/// per operation); a JSON Patch has at most 10,000 operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_are_limited_with_413() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start(dir.path(), Duration::from_secs(40)).await;
    let admin = Client::admin(&cluster);
    let (ep, ca) = (cluster.endpoint().to_string(), cluster.ca_pem().to_string());
    let (cert, key) = admin_pems(&cluster);
    let _keep = dir.path().to_path_buf();
    blocking(move || {
        // 5 MB body.
        let big = "x".repeat(5_000_000);
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"a": big}});
        let (code, st) = admin.post("/api/v1/namespaces/default/configmaps", &body);
        assert_eq!(code, 413, "{st}");
        assert_eq!(st["reason"], "RequestEntityTooLarge", "{st}");
        assert!(st["message"].as_str().unwrap().contains("3145728"), "{st}");
        // The server still serves (and this client's next request works).
        assert_eq!(admin.get("/api/v1/nodes").0, 200);
        // curl too (it sends `Expect: 100-continue`), with a length and chunked.
        if let Some(out) = curl_post_5mb(&ep, &ca, &cert, &key, false) {
            assert!(out.starts_with("413 "), "{out}");
            assert!(out.contains("3145728"), "{out}");
            let out = curl_post_5mb(&ep, &ca, &cert, &key, true).unwrap();
            assert!(out.starts_with("413 "), "{out}");
        }

        // 2 MB object in a body under the request limit.
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"a": "y".repeat(2_000_000)}});
        let (code, st) = admin.post("/api/v1/namespaces/default/configmaps", &body);
        assert_eq!(code, 413, "{st}");
        assert!(st["message"].as_str().unwrap().contains("1572864"), "{st}");
        assert_eq!(admin.get("/api/v1/namespaces/default/configmaps/big").0, 404);

        // Doubling by copy: 1 KiB → 4 MiB in 12 operations.
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "small"}, "data": {"a": "z".repeat(1024)}});
        assert_eq!(admin.post("/api/v1/namespaces/default/configmaps", &cm).0, 201);
        let ops: Vec<Value> = (0..12)
            .map(|i| json!({"op": "copy", "from": "/data", "path": format!("/data/d{i}")}))
            .collect();
        let (code, st) = admin.patch("/api/v1/namespaces/default/configmaps/small", "application/json-patch+json", &Value::Array(ops));
        assert_eq!(code, 413, "{st}");
        assert!(st["message"].as_str().unwrap().contains("1572864"), "{st}");
        let (_, stored) = admin.get("/api/v1/namespaces/default/configmaps/small");
        assert_eq!(stored["data"].as_object().unwrap().len(), 1, "unchanged");

        // Too many operations.
        let ops: Vec<Value> = (0..10_001).map(|_| json!({"op": "test", "path": "/kind", "value": "ConfigMap"})).collect();
        let (code, st) = admin.patch("/api/v1/namespaces/default/configmaps/small", "application/json-patch+json", &Value::Array(ops));
        assert_eq!(code, 413, "{st}");
        assert!(st["message"].as_str().unwrap().contains("10000"), "{st}");
    })
    .await;
    cluster.shutdown().await;
}

fn admin_pems(cluster: &EmbeddedCluster) -> (String, String) {
    let kc: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(cluster.admin_kubeconfig_path()).unwrap())
            .unwrap();
    let user = &kc["users"][0]["user"];
    let dec =
        |k: &str| String::from_utf8(STANDARD.decode(user[k].as_str().unwrap()).unwrap()).unwrap();
    (dec("client-certificate-data"), dec("client-key-data"))
}

/// "<code> <body>" of a 5 MB POST with curl, or None without curl.
fn curl_post_5mb(ep: &str, ca: &str, cert: &str, key: &str, chunked: bool) -> Option<String> {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        knit_test_support::missing(
            "curl is not installed (scripts/setup.sh installs it): the curl part of this test did not run",
        );
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let write = |n: &str, c: &[u8]| {
        let p = dir.path().join(n);
        std::fs::write(&p, c).unwrap();
        p
    };
    let (ca, cert, key) = (
        write("ca", ca.as_bytes()),
        write("cert", cert.as_bytes()),
        write("key", key.as_bytes()),
    );
    let body = write("body", &vec![b'x'; 5_000_000]);
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sS", "--max-time", "60", "-o", "-", "-w", "\n%{http_code}"])
        .arg("--cacert")
        .arg(&ca)
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .args(["-H", "Content-Type: application/json"])
        .arg("--data-binary")
        .arg(format!("@{}", body.display()));
    if chunked {
        cmd.args(["-H", "Transfer-Encoding: chunked"]);
    }
    let out = cmd
        .arg(format!("{ep}/api/v1/namespaces/default/configmaps"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    Some(format!(
        "{code} {body} {}",
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// A node knit removed keeps no working credential: once its Node is
/// deleted, its client certificate is refused (also after a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_nodes_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start(dir.path(), Duration::from_secs(40)).await;
    let admin = Client::admin(&cluster);
    let (cert, key) = node_credential(&cluster, "gone").await;
    let (ep, ca) = (cluster.endpoint().to_string(), cluster.ca_pem().to_string());
    let (cert2, key2) = (cert.clone(), key.clone());
    blocking(move || {
        let node = Client::new(
            &ep,
            &ca,
            Who::Cert {
                cert_pem: &cert2,
                key_pem: &key2,
            },
        );
        assert_eq!(node.post("/api/v1/nodes", &ready_node("gone")).0, 201);
        assert_eq!(node.get("/api/v1/nodes/gone").0, 200);
        assert_eq!(
            admin.call("DELETE", "/api/v1/nodes/gone", None, None).0,
            200
        );
        let (code, st) = node.get("/api/v1/nodes/gone");
        assert_eq!(code, 401, "{st}");
        assert!(st["message"].as_str().unwrap().contains("revoked"), "{st}");
        // Nor may it register itself again.
        assert_eq!(node.post("/api/v1/nodes", &ready_node("gone")).0, 401);
        assert_eq!(admin.get("/api/v1/nodes/gone").0, 404);
    })
    .await;
    cluster.shutdown().await;
    // Kept across a restart.
    let cluster = common::start(dir.path(), Duration::from_secs(40)).await;
    let (ep, ca) = (cluster.endpoint().to_string(), cluster.ca_pem().to_string());
    let admin = Client::admin(&cluster);
    blocking(move || {
        let node = Client::new(
            &ep,
            &ca,
            Who::Cert {
                cert_pem: &cert,
                key_pem: &key,
            },
        );
        assert_eq!(node.get("/api/v1/nodes/gone").0, 401);
        assert_eq!(admin.get("/api/v1/nodes").0, 200);
    })
    .await;
    // A new credential for the same name (the machine joins again) works.
    let (cert, key) = node_credential(&cluster, "gone").await;
    let (ep, ca) = (cluster.endpoint().to_string(), cluster.ca_pem().to_string());
    blocking(move || {
        let node = Client::new(
            &ep,
            &ca,
            Who::Cert {
                cert_pem: &cert,
                key_pem: &key,
            },
        );
        assert_eq!(node.post("/api/v1/nodes", &ready_node("gone")).0, 201);
    })
    .await;
    cluster.shutdown().await;
}

/// A name in a path is one object's name: an encoded `/` or `..` cannot
/// address another object, and is refused naming the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_in_paths_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start(dir.path(), Duration::from_secs(40)).await;
    let admin = Client::admin(&cluster);
    blocking(move || {
        assert_eq!(admin.post("/api/v1/nodes", &ready_node("victim")).0, 201);
        for path in [
            "/api/v1/nodes/x%2F..%2Fvictim",
            "/api/v1/nodes/victim%00",
            "/api/v1/nodes/Victim",
        ] {
            let (code, st) = admin.call("DELETE", path, None, None);
            assert_eq!(code, 400, "{path}: {st}");
            assert!(
                st["message"].as_str().unwrap().contains("RFC 1123"),
                "{path}: {st}"
            );
        }
        assert_eq!(admin.get("/api/v1/nodes/victim").0, 200);
    })
    .await;
    // Nor is a client certificate issued for a node name that is not one.
    let token = cluster
        .create_bootstrap_token(None, Duration::from_secs(600), &[])
        .unwrap()
        .token();
    let (ep, ca) = (cluster.endpoint().to_string(), cluster.ca_pem().to_string());
    let admin = Client::admin(&cluster);
    blocking(move || {
        let boot = Client::new(&ep, &ca, Who::Token(&token));
        let (pem, _) = csr("system:node:x/../victim", &["system:nodes"]);
        let (code, created) = boot.post(
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            &csr_object(&pem, KUBELET),
        );
        assert_eq!(code, 201, "{created}");
        let name = created["metadata"]["name"].as_str().unwrap().to_string();
        let decided = wait_for("CSR decision", Duration::from_secs(30), || {
            let (_, c) = admin.get(&format!(
                "/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}"
            ));
            c["status"]["conditions"]
                .as_array()
                .filter(|c| !c.is_empty())
                .map(|_| c.clone())
        });
        assert_eq!(
            decided["status"]["conditions"][0]["type"], "Denied",
            "{decided}"
        );
        assert!(decided["status"]["certificate"].is_null(), "{decided}");
    })
    .await;
    cluster.shutdown().await;
}

/// A client that stops half-way through a request head does not hold its
/// connection: the server closes it after the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_head_is_closed_after_the_header_timeout() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = knit_cluster::ClusterConfig::new(dir.path(), "127.0.0.1:0".parse().unwrap());
    cfg.http.header_timeout = Duration::from_secs(1);
    let cluster = EmbeddedCluster::start(cfg).await.unwrap();
    let (addr, ca) = (cluster.local_addr(), cluster.ca_pem().to_string());
    blocking(move || {
        let mut tls = knit_cluster::tls::client_config(&ca, None).unwrap();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let tls = Arc::new(tls);
        for partial in [&b"GET /version HTTP/1.1\r\nHost: x\r\n"[..]] {
            let tcp = std::net::TcpStream::connect(addr).unwrap();
            // A bound for the test only: the server must close well before.
            tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let conn = rustls::ClientConnection::new(tls.clone(), "127.0.0.1".try_into().unwrap())
                .unwrap();
            let mut s = rustls::StreamOwned::new(conn, tcp);
            s.write_all(partial).unwrap();
            s.flush().unwrap();
            let mut buf = [0u8; 1024];
            let got = loop {
                match s.read(&mut buf) {
                    Ok(0) => break Ok(()),
                    Ok(_) => continue,
                    Err(e)
                        if e.kind() == std::io::ErrorKind::WouldBlock
                            || e.kind() == std::io::ErrorKind::TimedOut =>
                    {
                        break Err(e)
                    }
                    // Closed without close_notify, or reset: closed all the same.
                    Err(_) => break Ok(()),
                }
            };
            assert!(
                got.is_ok(),
                "the server kept an idle connection ({partial:?}) open: {got:?}"
            );
        }
    })
    .await;
    cluster.shutdown().await;
}
