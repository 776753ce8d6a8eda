//! The embedded API over real HTTPS: TLS bootstrap with a bootstrap token,
//! node authorization, errors with Status bodies, watch, persistence.

mod common;

use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use common::{blocking, csr, csr_object, wait_for, Client, Who};
use serde_json::{json, Value};

const KUBELET: &str = "kubernetes.io/kube-apiserver-client-kubelet";

fn issued_cert(admin: &Client, name: &str) -> Option<Value> {
    let (code, c) = admin.get(&format!(
        "/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}"
    ));
    assert_eq!(code, 200, "{c}");
    let conds = c["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let decided = conds
        .iter()
        .any(|x| x["type"] == "Denied" || x["type"] == "Failed");
    (decided || c["status"]["certificate"].is_string()).then_some(c)
}

fn node_obj(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"pool": "a"}},
           "spec": {"taints": [{"key": "knit.dev/user-data-pending", "effect": "NoSchedule"}]},
           "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_bootstrap_node_authorization_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start(dir.path(), Duration::from_secs(40)).await;
    let token = cluster
        .create_bootstrap_token(
            Some("n1"),
            Duration::from_secs(600),
            &["system:bootstrappers:knit:pool-a".into()],
        )
        .unwrap();
    let expired = cluster
        .create_bootstrap_token(None, Duration::from_millis(1), &[])
        .unwrap();
    assert!(cluster
        .create_bootstrap_token(None, Duration::from_secs(60), &["system:masters".into()])
        .is_err());
    let (ep, ca, pin) = (
        cluster.endpoint().to_string(),
        cluster.ca_pem().to_string(),
        cluster.ca_pin().to_string(),
    );
    let admin = Client::admin(&cluster);

    blocking(move || {
        // Anonymous: cluster-info only, signed for the token (kubeadm discovery).
        let anon = Client::new(&ep, &ca, Who::Anonymous);
        let (code, ci) = anon.get("/api/v1/namespaces/kube-public/configmaps/cluster-info");
        assert_eq!(code, 200, "{ci}");
        let kc = ci["data"]["kubeconfig"].as_str().unwrap();
        assert!(kc.contains(&ep));
        let jws = ci["data"][format!("jws-kubeconfig-{}", token.id)].as_str().unwrap();
        assert!(jws.contains(".."), "detached JWS: {jws}");
        let (code, st) = anon.get("/api/v1/nodes");
        assert_eq!((code, st["kind"].as_str(), st["reason"].as_str()), (401, Some("Status"), Some("Unauthorized")));
        assert_eq!(anon.get("/version").0, 200);
        assert!(knit_api::validate::is_ca_pin(&pin));

        // Wrong and expired tokens are refused with 401.
        let wrong = Client::new(&ep, &ca, Who::Token(&format!("{}.0123456789abcdef", token.id)));
        assert_eq!(wrong.get("/api/v1/nodes").0, 401);
        std::thread::sleep(Duration::from_millis(20));
        let (code, st) = Client::new(&ep, &ca, Who::Token(&expired.token())).get("/apis");
        assert_eq!(code, 401, "{st}");

        // The bootstrapper may create CSRs and read its own, nothing else.
        let boot = Client::new(&ep, &ca, Who::Token(&token.token()));
        assert_eq!(boot.get("/api/v1/nodes").0, 403);
        let (code, st) = boot.get("/api/v1/namespaces/kube-system/secrets");
        assert_eq!(code, 403, "{st}");
        assert!(st["message"].as_str().unwrap().contains("system:bootstrap:"), "{st}");
        let (pem, key) = csr("system:node:n1", &["system:nodes"]);
        let (code, created) = boot.post("/apis/certificates.k8s.io/v1/certificatesigningrequests", &csr_object(&pem, KUBELET));
        assert_eq!(code, 201, "{created}");
        assert_eq!(created["spec"]["username"], format!("system:bootstrap:{}", token.id));
        assert!(created["spec"]["groups"].as_array().unwrap().contains(&json!("system:bootstrappers:knit:pool-a")));
        let name = created["metadata"]["name"].as_str().unwrap().to_string();
        assert!(name.starts_with("csr-"));
        let (code, mine) = boot.get("/apis/certificates.k8s.io/v1/certificatesigningrequests");
        assert_eq!((code, mine["items"].as_array().unwrap().len()), (200, 1));
        let done = wait_for("certificate", Duration::from_secs(20), || issued_cert(&admin, &name));
        assert_eq!(done["status"]["conditions"][0]["type"], "Approved", "{done}");
        let cert = String::from_utf8(STANDARD.decode(done["status"]["certificate"].as_str().unwrap()).unwrap()).unwrap();

        // The same n1-bound token asking for n2 is denied.
        let (pem2, _) = csr("system:node:n2", &["system:nodes"]);
        let (_, other) = boot.post("/apis/certificates.k8s.io/v1/certificatesigningrequests", &csr_object(&pem2, KUBELET));
        let other = other["metadata"]["name"].as_str().unwrap().to_string();
        let denied = wait_for("denial", Duration::from_secs(20), || issued_cert(&admin, &other));
        assert_eq!(denied["status"]["conditions"][0]["type"], "Denied", "{denied}");
        assert!(denied["status"]["certificate"].is_null());

        // The node identity: its own Node and Lease only.
        let node = Client::new(&ep, &ca, Who::Cert { cert_pem: &cert, key_pem: &key });
        let (code, n1) = node.post("/api/v1/nodes", &node_obj("n1"));
        assert_eq!(code, 201, "{n1}");
        assert_eq!(node.post("/api/v1/nodes", &node_obj("n2")).0, 403);
        assert_eq!(admin.post("/api/v1/nodes", &node_obj("n2")).0, 201);
        assert_eq!(node.get("/api/v1/nodes/n2").0, 403);
        // A kubelet's read of its Node at any version (answered from memory,
        // in place): authorized as any other read.
        let (code, own) = node.get("/api/v1/nodes/n1?resourceVersion=0");
        assert_eq!((code, &own["metadata"]["uid"]), (200, &n1["metadata"]["uid"]), "{own}");
        assert_eq!(node.get("/api/v1/nodes/n2?resourceVersion=0").0, 403);
        let (code, st) = admin.get("/api/v1/nodes/n1?resourceVersion=latest");
        assert_eq!((code, st["reason"].as_str()), (400, Some("BadRequest")), "{st}");
        let (_, listed) = node.get("/api/v1/nodes");
        let names: Vec<&str> = listed["items"].as_array().unwrap().iter().map(|n| n["metadata"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, vec!["n1"]);
        assert_eq!(node.call("DELETE", "/api/v1/nodes/n1", None, None).0, 403);
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "n1"},
                           "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40, "renewTime": "2026-01-01T00:00:00.000000Z"}});
        assert_eq!(node.post("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", &lease).0, 201);
        let mut other_lease = lease.clone();
        other_lease["metadata"]["name"] = json!("n2");
        assert_eq!(node.post("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", &other_lease).0, 403);

        // Pods: a node sees, reports and deletes only the pods bound to it.
        let pod = |name: &str, node: &str| json!({"metadata": {"name": name}, "spec": {"nodeName": node,
            "containers": [{"name": "c", "image": "i:1"}]}});
        const PODS: &str = "/api/v1/namespaces/default/pods";
        assert_eq!(admin.post(PODS, &pod("on-n1", "n1")).0, 201);
        assert_eq!(admin.post(PODS, &pod("on-n2", "n2")).0, 201);
        assert_eq!(node.post(PODS, &pod("mine", "n1")).0, 403);
        let (code, listed) = node.get("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1");
        assert_eq!(code, 200, "{listed}");
        assert_eq!(listed["items"].as_array().unwrap().len(), 1);
        let (_, all) = node.get(PODS);
        assert_eq!(all["items"].as_array().unwrap().len(), 1, "a node's list holds only its pods: {all}");
        assert_eq!(node.get(&format!("{PODS}/on-n2")).0, 404);
        let running = json!({"status": {"phase": "Running"}});
        assert_eq!(node.patch(&format!("{PODS}/on-n1/status"), "application/merge-patch+json", &running).0, 200);
        let (code, st) = node.patch(&format!("{PODS}/on-n2/status"), "application/merge-patch+json", &running);
        assert_eq!(code, 403, "{st}");
        assert_eq!(node.patch(&format!("{PODS}/on-n1"), "application/merge-patch+json", &json!({"metadata": {"labels": {"a": "b"}}})).0, 403);
        let evict = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "on-n1"}});
        assert_eq!(node.post(&format!("{PODS}/on-n1/eviction"), &evict).0, 403);
        assert_eq!(node.call("DELETE", &format!("{PODS}/on-n2"), None, None).0, 403);
        assert_eq!(node.call("DELETE", &format!("{PODS}/on-n1"), None, None).0, 200);

        // status subresource changes status only; main resource never status.
        let (code, p) = node.patch(
            "/api/v1/nodes/n1/status",
            "application/strategic-merge-patch+json",
            &json!({"metadata": {"labels": {"evil": "x"}}, "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}),
        );
        assert_eq!(code, 200, "{p}");
        assert_eq!(p["status"]["conditions"][0]["status"], "True");
        assert!(p["metadata"]["labels"].get("evil").is_none());
        let (_, p) = node.patch("/api/v1/nodes/n1", "application/merge-patch+json",
            &json!({"status": {"conditions": []}, "metadata": {"labels": {"zone": "z1"}}}));
        assert_eq!(p["status"]["conditions"][0]["status"], "True");
        assert_eq!(p["metadata"]["labels"]["zone"], "z1");

        // NodeRestriction: a node may not give itself a role.
        let (code, st) = node.patch(
            "/api/v1/nodes/n1",
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
        );
        assert_eq!(code, 403, "{st}");
        assert!(st["message"].as_str().unwrap().contains("not allowed to modify labels"), "{st}");

        // Errors: 409 stale update, 422 invalid, 404 unknown, 415 patch type, 400 bad body.
        let mut stale = n1.clone();
        stale["spec"]["unschedulable"] = json!(true);
        let (code, st) = node.put("/api/v1/nodes/n1", &stale);
        assert_eq!((code, st["reason"].as_str()), (409, Some("Conflict")), "{st}");
        let (code, st) = admin.patch("/api/v1/nodes/n1", "application/merge-patch+json",
            &json!({"spec": {"taints": [{"key": "k", "effect": "Sometimes"}]}}));
        assert_eq!((code, st["reason"].as_str()), (422, Some("Invalid")), "{st}");
        assert_eq!(st["details"]["causes"][0]["field"], "spec.taints[0].effect");
        let (code, st) = admin.get("/api/v1/nodes/nope");
        assert_eq!((code, st["reason"].as_str()), (404, Some("NotFound")));
        assert_eq!(admin.get("/apis/batch/v1/jobs").0, 404);
        assert_eq!(admin.patch("/api/v1/nodes/n1", "application/yaml", &json!({})).0, 415);
        assert_eq!(admin.call("POST", "/api/v1/nodes", Some("application/json"), None).0, 400);
        let (code, _) = admin.post("/api/v1/nodes", &node_obj("n2"));
        assert_eq!(code, 409);
        let yaml = Value::String("apiVersion: v1\nkind: Node\nmetadata:\n  name: from-yaml\n".into());
        let (code, st) = admin.call("POST", "/api/v1/nodes", Some("application/yaml"), Some(&yaml));
        assert_eq!(code, 201, "{st}");
        let (code, st) = admin.post("/api/v1/nodes", &json!({"metadata": {"name": "Bad_Name"}}));
        assert_eq!(code, 422, "{st}");

        // Metrics: admins only; counts by verb, resource and code.
        let (code, text) = admin.get("/metrics");
        let text = text.as_str().unwrap().to_string();
        assert_eq!(code, 200, "{text}");
        assert!(text.contains(r#"knit_cluster_requests_total{verb="create",resource="nodes",code="422"} 1"#), "{text}");
        assert!(text.contains(r#"knit_cluster_requests_total{verb="patch",resource="nodes/status",code="200"}"#), "{text}");
        assert_eq!(node.get("/metrics").0, 403);
        assert_eq!(Client::new(&ep, &ca, Who::Anonymous).get("/metrics").0, 401);
    })
    .await;
    cluster.shutdown().await;
}

/// Join credentials with an end (issue 30): an unbound token is bound to
/// the first node name it is approved for and refused for any other; a
/// token is deleted once its node has registered, and then refused; the
/// tokens of a node whose instance is gone are revoked on request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_tokens_are_bound_once_and_end_when_their_node_joins() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start(dir.path(), Duration::from_secs(40)).await;
    let unbound = cluster
        .create_bootstrap_token(None, Duration::from_secs(600), &[])
        .unwrap();
    let gone = cluster
        .create_bootstrap_token(Some("m9"), Duration::from_secs(600), &[])
        .unwrap();
    // As knit mints a node's token (the node is given the CA): cluster-info
    // is signed for it in the controllers' batch, not in the call.
    let batched = cluster
        .create_bootstrap_token_signed_in_batch(Some("m8"), Duration::from_secs(600))
        .unwrap();
    let (ep, ca) = (cluster.endpoint().to_string(), cluster.ca_pem().to_string());
    let admin = Client::admin(&cluster);
    // The instance of m9 is gone before it joined: its token is revoked.
    assert_eq!(cluster.delete_bootstrap_tokens_of("m9").unwrap(), 1);
    assert_eq!(cluster.delete_bootstrap_tokens_of("m9").unwrap(), 0);

    blocking(move || {
        let secret =
            |id: &str| format!("/api/v1/namespaces/kube-system/secrets/bootstrap-token-{id}");
        assert_eq!(admin.get(&secret(&gone.id)).0, 404);
        // cluster-info is signed for the tokens there are (made again in
        // the controllers' next batch after a token is added or removed).
        let anon = Client::new(&ep, &ca, Who::Anonymous);
        let signed_for = |id: &str| {
            let (code, ci) = anon.get("/api/v1/namespaces/kube-public/configmaps/cluster-info");
            assert_eq!(code, 200, "{ci}");
            ci["data"][format!("jws-kubeconfig-{id}")].is_string()
        };
        assert!(signed_for(&unbound.id));
        wait_for(
            "the revoked token's signature removed",
            Duration::from_secs(20),
            || (!signed_for(&gone.id)).then_some(()),
        );
        wait_for(
            "the batch-signed token's signature made",
            Duration::from_secs(20),
            || signed_for(&batched.id).then_some(()),
        );
        let (code, st) = Client::new(&ep, &ca, Who::Token(&gone.token()))
            .get("/apis/certificates.k8s.io/v1/certificatesigningrequests");
        assert_eq!(code, 401, "a revoked token: {st}");

        // The unbound token's first certificate binds it to m1.
        let boot = Client::new(&ep, &ca, Who::Token(&unbound.token()));
        const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
        let (pem, key) = csr("system:node:m1", &["system:nodes"]);
        let (code, created) = boot.post(CSRS, &csr_object(&pem, KUBELET));
        assert_eq!(code, 201, "{created}");
        let name = created["metadata"]["name"].as_str().unwrap().to_string();
        let done = wait_for("certificate", Duration::from_secs(20), || {
            issued_cert(&admin, &name)
        });
        assert_eq!(
            done["status"]["conditions"][0]["type"], "Approved",
            "{done}"
        );
        let (_, s) = admin.get(&secret(&unbound.id));
        assert_eq!(
            s["metadata"]["annotations"]["knit.dev/node-name"], "m1",
            "{s}"
        );

        // A second node name with the same token is refused.
        let (pem2, _) = csr("system:node:m2", &["system:nodes"]);
        let (code, other) = boot.post(CSRS, &csr_object(&pem2, KUBELET));
        assert_eq!(code, 201, "{other}");
        let other = other["metadata"]["name"].as_str().unwrap().to_string();
        let denied = wait_for("denial", Duration::from_secs(20), || {
            issued_cert(&admin, &other)
        });
        assert_eq!(
            denied["status"]["conditions"][0]["type"], "Denied",
            "{denied}"
        );
        assert!(
            denied["status"]["conditions"][0]["message"]
                .as_str()
                .unwrap()
                .contains("\"m1\""),
            "{denied}"
        );
        assert!(denied["status"]["certificate"].is_null());

        // m1 registers its Node: the token is deleted and refused after.
        assert_eq!(admin.get(&secret(&unbound.id)).0, 200);
        let cert = String::from_utf8(
            STANDARD
                .decode(done["status"]["certificate"].as_str().unwrap())
                .unwrap(),
        )
        .unwrap();
        let node = Client::new(
            &ep,
            &ca,
            Who::Cert {
                cert_pem: &cert,
                key_pem: &key,
            },
        );
        assert_eq!(node.post("/api/v1/nodes", &node_obj("m1")).0, 201);
        wait_for(
            "the joined node's token deleted",
            Duration::from_secs(20),
            || (admin.get(&secret(&unbound.id)).0 == 404).then_some(()),
        );
        wait_for(
            "the spent token's signature removed",
            Duration::from_secs(20),
            || (!signed_for(&unbound.id)).then_some(()),
        );
        let (pem3, _) = csr("system:node:m1", &["system:nodes"]);
        let (code, st) = boot.post(CSRS, &csr_object(&pem3, KUBELET));
        assert_eq!(code, 401, "a joined node's bootstrap token: {st}");
        assert!(
            st["message"].as_str().unwrap().contains("unknown token id"),
            "{st}"
        );
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_from_resource_version_with_bookmarks_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start(dir.path(), Duration::from_secs(40)).await;
    let admin = Client::admin(&cluster);
    let pin = cluster.ca_pin().to_string();
    let rv = blocking(move || {
        let (_, a) = admin.post("/api/v1/nodes", &node_obj("a"));
        let rv_a: u64 = a["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
        admin.post("/api/v1/nodes", &node_obj("b"));
        let (_, l) = admin.post("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            &json!({"metadata": {"name": "a"}, "spec": {"holderIdentity": "a"}}));
        assert_eq!(l["metadata"]["namespace"], "kube-node-lease");
        admin.call("DELETE", "/api/v1/nodes/a", None, None);
        // From rv_a: b added, a deleted (leases not included), then bookmarks.
        let events = admin.watch_lines(
            &format!("/api/v1/nodes?watch=true&resourceVersion={rv_a}&allowWatchBookmarks=true&timeoutSeconds=20"),
            |e| e["type"] == "BOOKMARK",
        );
        // (The node IPAM's podCIDR writes are MODIFIED events in between.)
        let kinds: Vec<(String, String)> = events.iter()
            .filter(|e| e["type"] != "MODIFIED")
            .map(|e| (e["type"].as_str().unwrap().to_string(), e["object"]["metadata"]["name"].as_str().unwrap_or("").to_string()))
            .collect();
        assert_eq!(kinds[..2], [("ADDED".into(), "b".into()), ("DELETED".into(), "a".into())], "{events:?}");
        let bookmark_rv: u64 = events.last().unwrap()["object"]["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
        assert!(bookmark_rv > rv_a);
        // Label-selected list and a field-selected watch from "now".
        let (_, l) = admin.get("/api/v1/nodes?labelSelector=pool%3Da");
        assert_eq!(l["items"].as_array().unwrap().len(), 1);
        let (_, l) = admin.get("/api/v1/nodes?labelSelector=pool%3Dz");
        assert_eq!(l["items"].as_array().unwrap().len(), 0);
        let initial = admin.watch_lines("/api/v1/nodes?watch=1&fieldSelector=metadata.name%3Db&timeoutSeconds=1", |_| false);
        assert_eq!(initial.len(), 1);
        assert_eq!(initial[0]["type"], "ADDED");
        // A label-selected watch sees b leave the selection (DELETED) and return (ADDED).
        let rv_b = admin.get("/api/v1/nodes").1["metadata"]["resourceVersion"].as_str().unwrap().to_string();
        admin.patch("/api/v1/nodes/b", "application/merge-patch+json", &json!({"metadata": {"labels": {"pool": "z"}}}));
        admin.patch("/api/v1/nodes/b", "application/merge-patch+json", &json!({"metadata": {"labels": {"pool": "a"}}}));
        let moves = admin.watch_lines(
            &format!("/api/v1/nodes?watch=1&labelSelector=pool%3Da&resourceVersion={rv_b}&timeoutSeconds=10"),
            |e| e["type"] == "ADDED",
        );
        let kinds: Vec<&str> = moves.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, vec!["DELETED", "ADDED"], "{moves:?}");
        l["metadata"]["resourceVersion"].as_str().unwrap().parse::<u64>().unwrap()
    })
    .await;
    cluster.shutdown().await;

    // Restart on the same data dir: same CA, objects kept, versions keep growing.
    let cluster = common::start(dir.path(), Duration::from_secs(40)).await;
    assert_eq!(cluster.ca_pin(), pin);
    let admin = Client::admin(&cluster);
    blocking(move || {
        let (_, b) = admin.get("/api/v1/nodes/b");
        assert_eq!(b["metadata"]["name"], "b");
        let (_, c) = admin.post("/api/v1/nodes", &node_obj("c"));
        let rv_c: u64 = c["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(rv_c > rv);
        // History from before the restart is gone: 410, so clients relist.
        let (code, st) = admin.get(&format!(
            "/api/v1/nodes?watch=true&resourceVersion={}",
            rv - 1
        ));
        assert_eq!(
            (code, st["reason"].as_str()),
            (410, Some("Expired")),
            "{st}"
        );
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_lease_makes_node_unknown_and_tainted_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start(dir.path(), Duration::from_secs(2)).await;
    let admin = Client::admin(&cluster);
    blocking(move || {
        let now = || time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap();
        admin.post("/api/v1/nodes", &node_obj("n1"));
        let lease_path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
        admin.post(lease_path, &json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1", "renewTime": now()}}));
        let ready = |n: &Value| n["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap()["status"].as_str().unwrap().to_string();
        let taint_keys = |n: &Value| -> Vec<String> {
            n["spec"]["taints"].as_array().map(|t| t.iter().map(|t| format!("{}:{}", t["key"].as_str().unwrap(), t["effect"].as_str().unwrap())).collect()).unwrap_or_default()
        };
        // NotReady and fresh: not-ready taints next to the node's own.
        let n = wait_for("not-ready taint", Duration::from_secs(20), || {
            // Keep the lease fresh meanwhile, however slow this machine is.
            admin.patch(&format!("{lease_path}/n1"), "application/merge-patch+json", &json!({"spec": {"renewTime": now()}}));
            let (_, n) = admin.get("/api/v1/nodes/n1");
            taint_keys(&n).contains(&"node.kubernetes.io/not-ready:NoSchedule".to_string()).then_some(n)
        });
        assert!(taint_keys(&n).contains(&"knit.dev/user-data-pending:NoSchedule".to_string()));
        // No renewals: Unknown + unreachable.
        let n = wait_for("Ready=Unknown", Duration::from_secs(30), || {
            let (_, n) = admin.get("/api/v1/nodes/n1");
            (ready(&n) == "Unknown").then_some(n)
        });
        let keys = taint_keys(&n);
        assert!(keys.contains(&"node.kubernetes.io/unreachable:NoSchedule".to_string()), "{keys:?}");
        assert!(keys.contains(&"node.kubernetes.io/unreachable:NoExecute".to_string()), "{keys:?}");
        assert!(!keys.iter().any(|k| k.starts_with("node.kubernetes.io/not-ready")), "{keys:?}");
        // Heartbeats return and the kubelet posts Ready: taints go.
        // (Acting as the kubelet: renew, and post Ready whenever it is not.)
        let n = wait_for("recovery", Duration::from_secs(20), || {
            admin.patch(&format!("{lease_path}/n1"), "application/merge-patch+json", &json!({"spec": {"renewTime": now()}}));
            if ready(&admin.get("/api/v1/nodes/n1").1) != "True" {
                admin.patch("/api/v1/nodes/n1/status", "application/strategic-merge-patch+json",
                    &json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}));
            }
            let (_, n) = admin.get("/api/v1/nodes/n1");
            (!taint_keys(&n).iter().any(|k| k.starts_with("node.kubernetes.io/"))).then_some(n)
        });
        assert_eq!(ready(&n), "True");
        assert_eq!(taint_keys(&n), vec!["knit.dev/user-data-pending:NoSchedule".to_string()]);
        // Deleting the node collects its lease.
        assert_eq!(admin.call("DELETE", "/api/v1/nodes/n1", None, None).0, 200);
        wait_for("lease collected", Duration::from_secs(20), || (admin.get(&format!("{lease_path}/n1")).0 == 404).then_some(()));
    })
    .await;
    cluster.shutdown().await;
}

async fn next_change(changes: &mut knit_cluster::NodeChanges) -> knit_cluster::NodeChange {
    tokio::time::timeout(Duration::from_secs(10), changes.next())
        .await
        .expect("a Node change within 10 s")
}

/// The embedding process follows Node changes as they are stored: a new
/// Node, its status changed, its deletion; other resources are not told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_changes_follow_nodes_only() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start(dir.path(), Duration::from_secs(40)).await;
    let mut changes = cluster.node_changes();
    let admin = Client::admin(&cluster);
    let a = admin.clone();
    blocking(move || {
        let (code, body) = a.post(
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "not-a-node"}}),
        );
        assert_eq!(code, 201, "{body}");
        let (code, body) = a.post("/api/v1/nodes", &node_obj("n1"));
        assert_eq!(code, 201, "{body}");
    })
    .await;
    let change = next_change(&mut changes).await;
    // The Namespace made first is not told: the Node is the first change.
    match change {
        knit_cluster::NodeChange::Changed(name, node) => {
            assert_eq!(name, "n1");
            assert_eq!(node["status"]["conditions"][0]["status"], "False");
        }
        other => panic!("expected n1 created, got {other:?}"),
    }
    let a = admin.clone();
    blocking(move || {
        let (code, body) = a.patch(
            "/api/v1/nodes/n1/status",
            "application/merge-patch+json",
            &json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}),
        );
        assert_eq!(code, 200, "{body}");
    })
    .await;
    // The controllers may write the Node too (its pod CIDR): the first
    // change showing it Ready comes.
    loop {
        let change = next_change(&mut changes).await;
        match change {
            knit_cluster::NodeChange::Changed(name, node) => {
                assert_eq!(name, "n1");
                if node["status"]["conditions"][0]["status"] == "True" {
                    break;
                }
            }
            other => panic!("expected n1 changed, got {other:?}"),
        }
    }
    let a = admin.clone();
    blocking(move || {
        let (code, body) = a.call("DELETE", "/api/v1/nodes/n1", None, None);
        assert_eq!(code, 200, "{body}");
    })
    .await;
    loop {
        let change = next_change(&mut changes).await;
        match change {
            knit_cluster::NodeChange::Deleted(name) => {
                assert_eq!(name, "n1");
                break;
            }
            knit_cluster::NodeChange::Changed(name, _) => assert_eq!(name, "n1"),
            other => panic!("expected n1 deleted, got {other:?}"),
        }
    }
    cluster.shutdown().await;
}
