//! Two embedded API servers on one PostgreSQL database (as `knit` servers
//! sharing a datastore run them), over real HTTPS: what one writes, the
//! other lists and watches, in order and once; a stale write through one
//! after a write through the other is 409; both start at once.

mod common;

use std::time::Duration;

use common::{blocking, Client};
use knit_cluster::{ClusterConfig, EmbeddedCluster};
use knit_db::testing::TestPostgres;
use serde_json::{json, Value};

const CMS: &str = "/api/v1/namespaces/default/configmaps";

fn config(dir: &std::path::Path, url: &str) -> ClusterConfig {
    let mut cfg = ClusterConfig::new(dir, "127.0.0.1:0".parse().unwrap());
    cfg.bookmark_interval = Duration::from_millis(300);
    cfg.datastore = Some(knit_db::Datastore::Postgres(url.to_string()));
    cfg
}

fn rv_of(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Two servers on a database of their own on a PostgreSQL server of
/// their own, with one CA (as `knit up --ha` copies it: made by a first
/// start on A's directory alone, without the database), started at once.
struct TwoServers {
    a: EmbeddedCluster,
    b: EmbeddedCluster,
    _dir: tempfile::TempDir,
    _pg: TestPostgres,
}

impl TwoServers {
    async fn start(database: &str) -> TwoServers {
        let pg = TestPostgres::start().expect("a PostgreSQL server for the test");
        let url = pg.create_database(database).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = start_two(dir.path(), &url).await;
        TwoServers {
            a,
            b,
            _dir: dir,
            _pg: pg,
        }
    }

    fn admins(&self) -> (Client, Client) {
        (Client::admin(&self.a), Client::admin(&self.b))
    }

    /// Both servers ended before their database.
    async fn shutdown(self) {
        self.a.shutdown().await;
        self.b.shutdown().await;
    }
}

async fn start_two(dir: &std::path::Path, url: &str) -> (EmbeddedCluster, EmbeddedCluster) {
    let (dir_a, dir_b) = (dir.join("a"), dir.join("b"));
    drop(
        EmbeddedCluster::start(ClusterConfig::new(&dir_a, "127.0.0.1:0".parse().unwrap()))
            .await
            .unwrap(),
    );
    std::fs::create_dir_all(dir_b.join("pki")).unwrap();
    for f in ["ca.crt", "ca.key"] {
        std::fs::copy(dir_a.join("pki").join(f), dir_b.join("pki").join(f)).unwrap();
    }
    let (a, b) = tokio::join!(
        EmbeddedCluster::start(config(&dir_a, url)),
        EmbeddedCluster::start(config(&dir_b, url))
    );
    (a.unwrap(), b.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_postgres_serve_the_same_cluster() {
    // Both start at once on the empty database (both create the namespaces).
    let ha = TwoServers::start("cluster_ha").await;
    assert_eq!(ha.a.ca_pem(), ha.b.ca_pem());
    let (admin_a, admin_b) = ha.admins();

    blocking(move || {
        let (code, list) = admin_b.get(CMS);
        assert_eq!(code, 200, "{list}");
        let rv0 = rv_of(&list);
        // A live watch on B, opened before A writes.
        let watcher = admin_b.clone();
        let live = std::thread::spawn(move || {
            watcher.watch_lines(
                &format!("{CMS}?watch=1&resourceVersion={rv0}&timeoutSeconds=20"),
                |e| e["type"] == "DELETED",
            )
        });
        let (code, created) = admin_a.post(
            CMS,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared"}, "data": {"k": "1"}}),
        );
        assert_eq!(code, 201, "{created}");
        // B reads what A wrote at once (same database).
        let (code, seen_by_b) = admin_b.get(&format!("{CMS}/shared"));
        assert_eq!(code, 200, "{seen_by_b}");
        assert_eq!(seen_by_b["data"]["k"], "1");
        // A changes it; a write through B from the older version is 409.
        let (code, patched) = admin_a.patch(
            &format!("{CMS}/shared"),
            "application/merge-patch+json",
            &json!({"data": {"k": "2"}}),
        );
        assert_eq!(code, 200, "{patched}");
        let mut stale = seen_by_b.clone();
        stale["data"]["k"] = json!("from-b");
        let (code, status) = admin_b.put(&format!("{CMS}/shared"), &stale);
        assert_eq!(code, 409, "{status}");
        assert_eq!(status["reason"], "Conflict");
        let (code, gone) = admin_b.call("DELETE", &format!("{CMS}/shared"), None, None);
        assert_eq!(code, 200, "{gone}");

        let events = live.join().unwrap();
        let seen: Vec<(String, String, u64)> = events
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap().to_string(),
                    e["object"]["data"]["k"].as_str().unwrap_or("").to_string(),
                    rv_of(&e["object"]),
                )
            })
            .collect();
        let kinds: Vec<(&str, &str)> = seen.iter().map(|(t, k, _)| (t.as_str(), k.as_str())).collect();
        assert_eq!(
            kinds,
            vec![("ADDED", "1"), ("MODIFIED", "2"), ("DELETED", "2")],
            "B's watch has A's changes and its own, once each: {events:?}"
        );
        assert!(seen.windows(2).all(|w| w[1].2 > w[0].2), "in resourceVersion order: {seen:?}");
        assert_eq!(seen[0].2, rv_of(&created));
        assert_eq!(seen[1].2, rv_of(&patched));

        // The same history from A, from the same resourceVersion.
        let from_a = admin_a.watch_lines(
            &format!("{CMS}?watch=1&resourceVersion={rv0}&timeoutSeconds=20"),
            |e| e["type"] == "DELETED",
        );
        assert_eq!(from_a.len(), 3, "{from_a:?}");
        assert_eq!(from_a[2]["object"], events[2]["object"]);
    })
    .await;
    ha.shutdown().await;
}

/// A write through one server just after another server's write of the
/// same object: the first server's memory may lag (a node Lease renewal
/// announces nothing), and an update starts from memory. It is made on
/// the newest version all the same (nothing of the other write lost), a
/// client's resourceVersion that memory has not seen yet is no conflict,
/// and an older one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_through_a_server_whose_memory_lags_starts_from_the_newest() {
    let ha = TwoServers::start("cluster_ha_lag").await;
    let (admin_a, admin_b) = ha.admins();
    blocking(move || {
        const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
        let lease = format!("{LEASES}/lagging");
        let (code, created) = admin_a.post(
            LEASES,
            &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": "lagging"},
                    "spec": {"holderIdentity": "lagging", "leaseDurationSeconds": 40}}),
        );
        assert_eq!(code, 201, "{created}");
        // Through B at once, with A's resourceVersion.
        let mut next = created.clone();
        next["spec"]["leaseDurationSeconds"] = json!(41);
        let (code, by_b) = admin_b.put(&lease, &next);
        assert_eq!(code, 200, "{by_b}");
        assert!(rv_of(&by_b) > rv_of(&created));
        for round in 0..5 {
            // A changes one field, B at once another, without a version:
            // B's change is made on top of A's.
            let holder = format!("a-{round}");
            let (code, by_a) = admin_a.patch(
                &lease,
                "application/merge-patch+json",
                &json!({"spec": {"holderIdentity": holder}}),
            );
            assert_eq!(code, 200, "{by_a}");
            let (code, by_b) = admin_b.patch(
                &lease,
                "application/merge-patch+json",
                &json!({"spec": {"leaseTransitions": round}}),
            );
            assert_eq!(code, 200, "{by_b}");
            assert_eq!(by_b["spec"]["holderIdentity"], holder.as_str(), "{by_b}");
            assert_eq!(by_b["spec"]["leaseTransitions"], round, "{by_b}");
            assert!(rv_of(&by_b) > rv_of(&by_a));
            // A's newest version through B: no conflict; then the version
            // before it: 409.
            let (code, by_a) = admin_a.patch(
                &lease,
                "application/merge-patch+json",
                &json!({"spec": {"leaseDurationSeconds": 40 + round}}),
            );
            assert_eq!(code, 200, "{by_a}");
            let mut next = by_a.clone();
            next["spec"]["renewTime"] = json!(format!("2026-12-04T00:00:0{round}.000000Z"));
            let (code, put) = admin_b.put(&lease, &next);
            assert_eq!(code, 200, "{put}");
            let (code, stale) = admin_b.put(&lease, &next);
            assert_eq!(code, 409, "{stale}");
        }
        let (code, gone) = admin_b.call("DELETE", &lease, None, None);
        assert_eq!(code, 200, "{gone}");
        // Through A at once: a patch of a deleted object is 404.
        let (code, missing) = admin_a.patch(
            &lease,
            "application/merge-patch+json",
            &json!({"spec": {"leaseTransitions": 9}}),
        );
        assert_eq!(code, 404, "{missing}");
    })
    .await;
    ha.shutdown().await;
}

/// Two servers on one database, both running the controllers: every Node
/// gets its own pod CIDR whichever server allocates it, and evictions
/// through both servers together take a budget's one disruption once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_share_pod_cidrs_and_disruption_budgets() {
    let ha = TwoServers::start("cluster_ha_pods").await;
    let (admin_a, admin_b) = ha.admins();
    blocking(move || {
        const PODS: &str = "/api/v1/namespaces/default/pods";
        const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";
        // Nodes created through both servers at once.
        let mut makers = Vec::new();
        for (i, c) in [admin_a.clone(), admin_b.clone()].into_iter().enumerate() {
            makers.push(std::thread::spawn(move || {
                for j in 0..6 {
                    let name = format!("ha-n{i}-{j}");
                    let (code, body) = c.post("/api/v1/nodes", &json!({"metadata": {"name": name}}));
                    assert_eq!(code, 201, "{body}");
                }
            }));
        }
        for m in makers {
            m.join().unwrap();
        }
        let cidrs = common::wait_for("12 pod CIDRs", Duration::from_secs(20), || {
            let (_, l) = admin_a.get("/api/v1/nodes");
            let c: Vec<String> = l["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|n| n["spec"]["podCIDR"].as_str().map(str::to_string))
                .collect();
            (c.len() == 12).then_some(c)
        });
        let distinct: std::collections::HashSet<&String> = cidrs.iter().collect();
        assert_eq!(distinct.len(), 12, "one subnet given twice: {cidrs:?}");

        // A budget allowing exactly one disruption; evictions through both.
        let (_, rs) = admin_a.post(
            "/apis/apps/v1/namespaces/default/replicasets",
            &json!({"metadata": {"name": "web"}, "spec": {"replicas": 3}}),
        );
        for i in 0..3 {
            let pod = json!({"metadata": {"name": format!("web-{i}"), "labels": {"app": "web"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                                     "uid": rs["metadata"]["uid"], "controller": true}]},
                "spec": {"nodeName": "ha-n0-0", "containers": [{"name": "c", "image": "i:1"}]}});
            assert_eq!(admin_a.post(PODS, &pod).0, 201);
            let (code, _) = admin_b.patch(
                &format!("{PODS}/web-{i}/status"),
                "application/merge-patch+json",
                &json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
            );
            assert_eq!(code, 200);
        }
        admin_a.post(
            PDBS,
            &json!({"metadata": {"name": "web"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}}),
        );
        common::wait_for("budget on B", Duration::from_secs(20), || {
            let (_, p) = admin_b.get(&format!("{PDBS}/web"));
            (p["status"]["disruptionsAllowed"] == 1 && p["status"]["observedGeneration"] == 1)
                .then_some(())
        });
        let evict = |c: Client, name: &'static str| {
            std::thread::spawn(move || {
                c.post(
                    &format!("{PODS}/{name}/eviction"),
                    &json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}),
                )
                .0
            })
        };
        let (ta, tb) = (evict(admin_a.clone(), "web-0"), evict(admin_b.clone(), "web-1"));
        let mut codes = vec![ta.join().unwrap(), tb.join().unwrap()];
        codes.sort();
        assert_eq!(codes, vec![201, 429], "one disruption, taken once");
        let (_, p) = admin_a.get(&format!("{PDBS}/web"));
        assert_eq!(p["status"]["disruptionsAllowed"], 0, "{p}");
    })
    .await;
    ha.shutdown().await;
}
