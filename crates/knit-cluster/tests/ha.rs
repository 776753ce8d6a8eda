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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_postgres_serve_the_same_cluster() {
    let pg = TestPostgres::start().expect("a PostgreSQL server for the test");
    let url = pg.create_database("cluster_ha").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (dir_a, dir_b) = (dir.path().join("a"), dir.path().join("b"));
    // One CA for both (as `knit up --ha` copies it): made by a first start
    // on A's directory alone, without the database.
    drop(
        EmbeddedCluster::start(ClusterConfig::new(&dir_a, "127.0.0.1:0".parse().unwrap()))
            .await
            .unwrap(),
    );
    std::fs::create_dir_all(dir_b.join("pki")).unwrap();
    for f in ["ca.crt", "ca.key"] {
        std::fs::copy(dir_a.join("pki").join(f), dir_b.join("pki").join(f)).unwrap();
    }
    // Both start at once on the empty database (both create the namespaces).
    let (a, b) = tokio::join!(
        EmbeddedCluster::start(config(&dir_a, &url)),
        EmbeddedCluster::start(config(&dir_b, &url))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.ca_pem(), b.ca_pem());
    let (admin_a, admin_b) = (Client::admin(&a), Client::admin(&b));

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
    a.shutdown().await;
    b.shutdown().await;
}
