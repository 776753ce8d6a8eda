//! Pods, PodDisruptionBudgets and eviction over real HTTPS, as
//! kube-apiserver and kube-controller-manager serve them: field selectors,
//! graceful deletion, the eviction subresource (201, 429, 500), budget
//! status from the disruption controller, pod garbage collection.

mod common;

use std::time::Duration;

use common::{blocking, wait_for, Client};
use serde_json::{json, Value};

const PODS: &str = "/api/v1/namespaces/default/pods";
const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";
const RSS: &str = "/apis/apps/v1/namespaces/default/replicasets";
const BUDGET_MESSAGE: &str = "Cannot evict pod as it would violate the pod's disruption budget.";

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
}

fn pod(name: &str, node: &str, labels: Value, owner: Option<(&str, &str)>) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "registry.local/app:1"}]}});
    if !node.is_empty() {
        p["spec"]["nodeName"] = json!(node);
    }
    if let Some((rs, uid)) = owner {
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "name": rs, "uid": uid, "controller": true, "blockOwnerDeletion": true}]);
    }
    p
}

/// What a kubelet reports for a running pod (ready or not).
fn run(admin: &Client, name: &str, ready: bool) {
    let s = if ready { "True" } else { "False" };
    let (code, body) = admin.patch(
        &format!("{PODS}/{name}/status"),
        "application/merge-patch+json",
        &json!({"status": {"phase": "Running", "conditions": [
            {"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": s}, {"type": "Ready", "status": s}]}}),
    );
    assert_eq!(code, 200, "{body}");
}

fn create(admin: &Client, path: &str, obj: &Value) -> Value {
    let (code, body) = admin.post(path, obj);
    assert_eq!(code, 201, "POST {path}: {body}");
    body
}

fn delete(admin: &Client, path: &str, opts: Option<Value>) -> (u16, Value) {
    admin.call("DELETE", path, Some("application/json"), opts.as_ref())
}

fn evict(admin: &Client, name: &str) -> (u16, Value) {
    admin.post(
        &format!("{PODS}/{name}/eviction"),
        &json!({"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": name, "namespace": "default"}}),
    )
}

fn names(list: &Value) -> Vec<String> {
    let mut v: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

fn list(admin: &Client, query: &str) -> Vec<String> {
    let (code, body) = admin.get(&format!("/api/v1/pods?fieldSelector={query}"));
    assert_eq!(code, 200, "{body}");
    names(&body)
}

/// The budget once the disruption controller has caught up with `want`.
fn budget_when(admin: &Client, name: &str, want: impl Fn(&Value) -> bool) -> Value {
    wait_for(&format!("budget {name}"), Duration::from_secs(20), || {
        let (code, b) = admin.get(&format!("{PDBS}/{name}"));
        assert_eq!(code, 200, "{b}");
        want(&b["status"]).then_some(b)
    })
}

fn counts(st: &Value) -> (i64, i64, i64, i64) {
    (
        st["currentHealthy"].as_i64().unwrap_or(-1),
        st["desiredHealthy"].as_i64().unwrap_or(-1),
        st["expectedPods"].as_i64().unwrap_or(-1),
        st["disruptionsAllowed"].as_i64().unwrap_or(-1),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_selectors_graceful_deletion_and_pod_gc() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start(dir.path(), Duration::from_secs(40)).await;
    let admin = Client::admin(&cluster);
    blocking(move || {
        create(&admin, "/api/v1/nodes", &node("fs-n1"));
        create(&admin, "/api/v1/nodes", &node("fs-n2"));
        // Node IPAM: each Node gets its own /24 of the cluster's pod CIDR.
        let cidr = |n: &str| {
            wait_for(&format!("{n} podCIDR"), Duration::from_secs(10), || {
                let (_, node) = admin.get(&format!("/api/v1/nodes/{n}"));
                node["spec"]["podCIDR"].as_str().map(str::to_string)
            })
        };
        let (c1, c2) = (cidr("fs-n1"), cidr("fs-n2"));
        assert_ne!(c1, c2);
        for c in [&c1, &c2] {
            assert!(c.starts_with("172.20.") && c.ends_with(".0/24"), "{c}");
        }
        let (_, n1) = admin.get("/api/v1/nodes/fs-n1");
        assert_eq!(n1["spec"]["podCIDRs"], json!([c1]));
        // An update that drops it keeps it.
        let mut put = n1.clone();
        put["spec"] = json!({"unschedulable": false});
        let (code, body) = admin.put("/api/v1/nodes/fs-n1", &put);
        assert_eq!(
            (code, body["spec"]["podCIDR"].as_str()),
            (200, Some(c1.as_str())),
            "{body}"
        );
        for (name, n) in [
            ("a-0", "fs-n1"),
            ("a-1", "fs-n1"),
            ("b-0", "fs-n2"),
            ("loose", ""),
        ] {
            let created = create(&admin, PODS, &pod(name, n, json!({"app": "a"}), None));
            // Server defaults, as kube-apiserver's.
            assert_eq!(created["status"]["phase"], "Pending");
            assert_eq!(created["spec"]["terminationGracePeriodSeconds"], 30);
        }
        run(&admin, "a-0", true);
        // spec.nodeName, status.phase, metadata.name/namespace, and !=.
        assert_eq!(list(&admin, "spec.nodeName=fs-n1"), ["a-0", "a-1"]);
        assert_eq!(list(&admin, "spec.nodeName%21%3Dfs-n1"), ["b-0", "loose"]);
        assert_eq!(
            list(&admin, "spec.nodeName=fs-n1,status.phase=Running"),
            ["a-0"]
        );
        assert_eq!(
            list(&admin, "status.phase=Pending"),
            ["a-1", "b-0", "loose"]
        );
        assert_eq!(
            list(
                &admin,
                "status.phase%21%3DPending,status.phase%21%3DRunning"
            ),
            Vec::<String>::new()
        );
        assert_eq!(list(&admin, "metadata.name=b-0"), ["b-0"]);
        assert_eq!(
            list(&admin, "metadata.namespace=default,spec.nodeName="),
            ["loose"]
        );
        // A pod without containers is 422.
        let (code, body) = admin.post(PODS, &json!({"metadata": {"name": "empty"}, "spec": {}}));
        assert_eq!(code, 422, "{body}");

        // Graceful deletion: deletionTimestamp = now + grace, the object stays.
        let (code, gone) = delete(
            &admin,
            &format!("{PODS}/a-0"),
            Some(json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 20})),
        );
        assert_eq!(code, 200, "{gone}");
        assert_eq!(gone["metadata"]["deletionGracePeriodSeconds"], 20);
        let ts = gone["metadata"]["deletionTimestamp"]
            .as_str()
            .unwrap()
            .to_string();
        let (code, still) = admin.get(&format!("{PODS}/a-0"));
        assert_eq!(
            (code, &still["metadata"]["deletionTimestamp"]),
            (200, &json!(ts))
        );
        // A longer grace changes nothing; a shorter one moves the deadline.
        let (_, again) = delete(&admin, &format!("{PODS}/a-0?gracePeriodSeconds=60"), None);
        assert_eq!(again["metadata"]["deletionTimestamp"], json!(ts));
        let (_, shorter) = delete(&admin, &format!("{PODS}/a-0?gracePeriodSeconds=5"), None);
        assert_eq!(shorter["metadata"]["deletionGracePeriodSeconds"], 5);
        assert_ne!(shorter["metadata"]["deletionTimestamp"], json!(ts));
        // A client cannot clear the deletion mark with an update.
        let (code, upd) = admin.patch(
            &format!("{PODS}/a-0"),
            "application/merge-patch+json",
            &json!({"metadata": {"deletionTimestamp": null, "labels": {"x": "y"}}}),
        );
        assert_eq!(code, 200, "{upd}");
        assert!(upd["metadata"]["deletionTimestamp"].is_string(), "{upd}");
        // The kubelet's final delete: grace 0 with the UID precondition.
        let uid = still["metadata"]["uid"].as_str().unwrap();
        let (code, body) = delete(
            &admin,
            &format!("{PODS}/a-0"),
            Some(json!({"gracePeriodSeconds": 0, "preconditions": {"uid": "not-it"}})),
        );
        assert_eq!(code, 409, "{body}");
        let (code, _) = delete(
            &admin,
            &format!("{PODS}/a-0"),
            Some(json!({"gracePeriodSeconds": 0, "preconditions": {"uid": uid}})),
        );
        assert_eq!(code, 200);
        assert_eq!(admin.get(&format!("{PODS}/a-0")).0, 404);
        // Unscheduled or never-started-and-unbound pods go at once.
        let (code, _) = delete(&admin, &format!("{PODS}/loose"), None);
        assert_eq!(code, 200);
        assert_eq!(admin.get(&format!("{PODS}/loose")).0, 404);

        // Pod GC: a deleted Node's pods go.
        let (code, _) = delete(&admin, "/api/v1/nodes/fs-n2", None);
        assert_eq!(code, 200);
        wait_for("b-0 collected", Duration::from_secs(15), || {
            (admin.get(&format!("{PODS}/b-0")).0 == 404).then_some(())
        });
        // Pods of nodes that still exist stay.
        assert_eq!(admin.get(&format!("{PODS}/a-1")).0, 200);

        // A namespace of a test's own: created, and deleted with its content.
        let (code, ns) = admin.post("/api/v1/namespaces", &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t-pods"}}));
        assert_eq!((code, ns["status"]["phase"].as_str()), (201, Some("Active")), "{ns}");
        create(&admin, "/api/v1/namespaces/t-pods/pods", &pod("p", "fs-n1", json!({"app": "p"}), None));
        create(&admin, "/apis/policy/v1/namespaces/t-pods/poddisruptionbudgets",
            &json!({"metadata": {"name": "b"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "p"}}}}));
        let (code, gone) = delete(&admin, "/api/v1/namespaces/t-pods", None);
        assert_eq!((code, gone["status"]["phase"].as_str()), (200, Some("Terminating")), "{gone}");
        wait_for("t-pods gone", Duration::from_secs(15), || {
            (admin.get("/api/v1/namespaces/t-pods").0 == 404).then_some(())
        });
        assert_eq!(admin.get("/api/v1/namespaces/t-pods/pods/p").0, 404);
        assert_eq!(admin.post("/api/v1/namespaces/t-pods/pods", &pod("q", "fs-n1", json!({}), None)).0, 404);
        let (code, st) = delete(&admin, "/api/v1/namespaces/default", None);
        assert_eq!(code, 403, "{st}");

        // A quiet pod watch's bookmark names the cluster's newest version
        // (here a Node's), so watching again from it stays in the history.
        let (_, l) = admin.get(PODS);
        let rv0 = l["metadata"]["resourceVersion"].as_str().unwrap().to_string();
        let (_, n) = admin.patch("/api/v1/nodes/fs-n1", "application/merge-patch+json", &json!({"metadata": {"labels": {"touched": "yes"}}}));
        let rv_node: u64 = n["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
        let events = admin.watch_lines(
            &format!("{PODS}?watch=1&allowWatchBookmarks=true&resourceVersion={rv0}&timeoutSeconds=10"),
            |e| e["type"] == "BOOKMARK",
        );
        let last = events.last().unwrap();
        assert_eq!(last["type"], "BOOKMARK", "{events:?}");
        let rv_bookmark: u64 = last["object"]["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
        assert!(rv_bookmark >= rv_node, "bookmark {rv_bookmark} < {rv_node}");
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_honours_disruption_budgets() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start(dir.path(), Duration::from_secs(40)).await;
    let admin = Client::admin(&cluster);
    blocking(move || {
        // Discovery says where eviction is, as kubectl drain checks.
        let (_, core) = admin.get("/api/v1");
        let ev = core["resources"].as_array().unwrap().iter().find(|r| r["name"] == "pods/eviction").unwrap().clone();
        assert_eq!((ev["group"].as_str(), ev["version"].as_str(), ev["kind"].as_str()), (Some("policy"), Some("v1"), Some("Eviction")));
        let (_, groups) = admin.get("/apis");
        assert!(groups["groups"].as_array().unwrap().iter().any(|g| g["name"] == "policy" && g["preferredVersion"]["groupVersion"] == "policy/v1"));

        create(&admin, "/api/v1/nodes", &node("ev-n1"));
        let rs = create(&admin, RSS, &json!({"metadata": {"name": "web"}, "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}}}));
        let uid = rs["metadata"]["uid"].as_str().unwrap().to_string();
        for i in 0..3 {
            let name = format!("web-{i}");
            create(&admin, PODS, &pod(&name, "ev-n1", json!({"app": "web", "tier": "front"}), Some(("web", &uid))));
            run(&admin, &name, true);
        }
        // minAvailable 3 of 3: nothing may go.
        let pdb = create(&admin, PDBS, &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web-pdb"},
            "spec": {"minAvailable": 3, "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}}}));
        assert_eq!(pdb["metadata"]["generation"], 1);
        let b = budget_when(&admin, "web-pdb", |s| s["observedGeneration"] == 1 && s["currentHealthy"] == 3);
        assert_eq!(counts(&b["status"]), (3, 3, 3, 0));
        let cond = &b["status"]["conditions"][0];
        assert_eq!((cond["type"].as_str(), cond["status"].as_str(), cond["reason"].as_str()),
                   (Some("DisruptionAllowed"), Some("False"), Some("InsufficientPods")));

        // Refused: 429 with kube-apiserver's message and cause.
        let (code, st) = evict(&admin, "web-0");
        assert_eq!(code, 429, "{st}");
        assert_eq!(st["reason"], "TooManyRequests");
        assert_eq!(st["message"], BUDGET_MESSAGE);
        assert_eq!(st["details"]["causes"][0]["reason"], "DisruptionBudget");
        assert_eq!(st["details"]["causes"][0]["message"], "The disruption budget web-pdb needs 3 healthy pods and has 3 currently");
        assert!(admin.get(&format!("{PODS}/web-0")).1["metadata"]["deletionTimestamp"].is_null());

        // maxUnavailable 34% of 3 rounds up to 2: one must stay healthy.
        let (code, p) = admin.patch(&format!("{PDBS}/web-pdb"), "application/merge-patch+json",
            &json!({"spec": {"minAvailable": null, "maxUnavailable": "34%"}}));
        assert_eq!(code, 200, "{p}");
        assert_eq!(p["metadata"]["generation"], 2);
        let b = budget_when(&admin, "web-pdb", |s| s["observedGeneration"] == 2);
        assert_eq!(counts(&b["status"]), (3, 1, 3, 2));
        assert_eq!(b["status"]["conditions"][0]["status"], "True");
        assert_eq!(b["status"]["conditions"][0]["reason"], "SufficientPods");

        // A dry run answers as the eviction would and changes nothing.
        let (code, st) = admin.post(&format!("{PODS}/web-0/eviction?dryRun=All"),
            &json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-0"}}));
        assert_eq!(code, 201, "{st}");
        assert!(admin.get(&format!("{PODS}/web-0")).1["metadata"]["deletionTimestamp"].is_null());
        assert_eq!(admin.get(&format!("{PDBS}/web-pdb")).1["status"]["disruptionsAllowed"], 2);
        // Allowed: 201 Success, the pod deleted gracefully, the budget taken.
        for name in ["web-0", "web-1"] {
            let (code, st) = evict(&admin, name);
            assert_eq!((code, st["status"].as_str()), (201, Some("Success")), "{st}");
            let (_, p) = admin.get(&format!("{PODS}/{name}"));
            assert_eq!(p["metadata"]["deletionGracePeriodSeconds"], 30, "{p}");
            // Marked as kube-apiserver marks an evicted pod.
            let target = p["status"]["conditions"].as_array().unwrap().iter()
                .find(|c| c["type"] == "DisruptionTarget").cloned().unwrap_or_default();
            assert_eq!((target["status"].as_str(), target["reason"].as_str()), (Some("True"), Some("EvictionByEvictionAPI")), "{p}");
        }
        let (_, b) = admin.get(&format!("{PDBS}/web-pdb"));
        assert_eq!(b["status"]["disruptionsAllowed"], 0, "{b}");
        let (code, st) = evict(&admin, "web-2");
        assert_eq!(code, 429, "{st}");
        let b = budget_when(&admin, "web-pdb", |s| s["currentHealthy"] == 1);
        assert_eq!(counts(&b["status"]), (1, 1, 3, 0));

        // Two budgets over one pod: 500, as kube-apiserver answers.
        create(&admin, PDBS, &json!({"metadata": {"name": "web-pdb-2"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"tier": "front"}}}}));
        let (code, st) = evict(&admin, "web-2");
        assert_eq!(code, 500, "{st}");
        assert_eq!(st["message"], "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.");
        assert_eq!(delete(&admin, &format!("{PDBS}/web-pdb-2"), None).0, 200);

        // An unready pod goes without taking budget when the budget is met.
        let rs2 = create(&admin, RSS, &json!({"metadata": {"name": "db"}, "spec": {"replicas": 2}}));
        let uid2 = rs2["metadata"]["uid"].as_str().unwrap().to_string();
        for (name, ready) in [("db-0", true), ("db-1", false)] {
            create(&admin, PODS, &pod(name, "ev-n1", json!({"app": "db"}), Some(("db", &uid2))));
            run(&admin, name, ready);
        }
        create(&admin, PDBS, &json!({"metadata": {"name": "db-pdb"}, "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "db"}}}}));
        let b = budget_when(&admin, "db-pdb", |s| s["expectedPods"] == 2);
        assert_eq!(counts(&b["status"]), (1, 1, 2, 0));
        let (code, st) = evict(&admin, "db-1");
        assert_eq!(code, 201, "{st}");
        let (_, b) = admin.get(&format!("{PDBS}/db-pdb"));
        assert!(b["status"]["disruptedPods"].is_null(), "{b}");
        assert_eq!(evict(&admin, "db-0").0, 429);
        // A pending pod is evicted whatever the budget (it never ran); bound
        // to a node, it is deleted gracefully (its kubelet confirms).
        create(&admin, PODS, &pod("db-2", "ev-n1", json!({"app": "db"}), Some(("db", &uid2))));
        assert_eq!(evict(&admin, "db-2").0, 201);
        assert!(admin.get(&format!("{PODS}/db-2")).1["metadata"]["deletionTimestamp"].is_string());

        // Errors: no such pod, a name that does not match, not an Eviction.
        assert_eq!(evict(&admin, "nope").0, 404);
        let (code, st) = admin.post(&format!("{PODS}/web-2/eviction"), &json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "other"}}));
        assert_eq!(code, 400, "{st}");
        let (code, _) = admin.post(&format!("{PODS}/web-2/eviction"), &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-2"}}));
        assert_eq!(code, 400);
        // v1beta1 Evictions are accepted too.
        let (code, st) = admin.post(&format!("{PODS}/web-2/eviction"), &json!({"apiVersion": "policy/v1beta1", "kind": "Eviction", "metadata": {"name": "web-2"}}));
        assert_eq!(code, 429, "{st}");
        // An invalid budget is 422.
        let (code, st) = admin.post(PDBS, &json!({"metadata": {"name": "bad"}, "spec": {"minAvailable": 1, "maxUnavailable": 1}}));
        assert_eq!(code, 422, "{st}");
    })
    .await;
    cluster.shutdown().await;
}
