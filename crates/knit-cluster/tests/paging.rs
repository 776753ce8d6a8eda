//! Paged lists (`limit`, `continue`) as kube-apiserver serves them: every
//! page of a run is one snapshot, an expired token is 410, a bad one 400,
//! selectors apply before the limit; and the real kubectl and the official
//! Python client page through them (each skips, saying so, when absent).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{blocking, Client};
use knit_cluster::{ClusterConfig, EmbeddedCluster};
use serde_json::{json, Value};

const INCONSISTENT: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

async fn start(dir: &Path, change_history: Option<usize>) -> EmbeddedCluster {
    let mut cfg = ClusterConfig::new(dir, "127.0.0.1:0".parse().unwrap());
    cfg.node_grace_period = Duration::from_secs(3600);
    if let Some(n) = change_history {
        cfg.change_history = n;
    }
    EmbeddedCluster::start(cfg).await.unwrap()
}

/// A namespace of the test's own (unique name), created.
fn namespace(admin: &Client, prefix: &str) -> String {
    let name = format!("{prefix}-{}", std::process::id());
    let (code, body) = admin.post(
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    );
    assert_eq!(code, 201, "{body}");
    name
}

fn config_map(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "labels": labels}, "data": {"v": "0"}})
}

/// Creates `names` in `ns` from 4 clients at once.
fn create_all(admin: &Client, ns: &str, names: &[String], labels: impl Fn(usize) -> Value) {
    let chunks: Vec<Vec<(String, Value)>> = (0..4)
        .map(|k| {
            names
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 4 == k)
                .map(|(i, n)| (n.clone(), labels(i)))
                .collect()
        })
        .collect();
    std::thread::scope(|s| {
        for chunk in chunks {
            let c = admin.clone();
            let path = format!("/api/v1/namespaces/{ns}/configmaps");
            s.spawn(move || {
                for (name, labels) in chunk {
                    let (code, body) = c.post(&path, &config_map(&name, labels));
                    assert_eq!(code, 201, "{body}");
                }
            });
        }
    });
}

fn names_of(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn token(list: &Value) -> Option<String> {
    list["metadata"]["continue"].as_str().map(str::to_string)
}

/// Every page of `base` with `limit`, calling `between(page number)` after
/// each page but the last.
fn page_all(
    admin: &Client,
    base: &str,
    limit: usize,
    mut between: impl FnMut(usize),
) -> Vec<Value> {
    let sep = if base.contains('?') { '&' } else { '?' };
    let mut pages = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let path = match &next {
            None => format!("{base}{sep}limit={limit}"),
            Some(t) => format!("{base}{sep}limit={limit}&continue={t}"),
        };
        let (code, page) = admin.get(&path);
        assert_eq!(code, 200, "{path}: {page}");
        next = token(&page);
        pages.push(page);
        match next {
            Some(_) => between(pages.len()),
            None => return pages,
        }
    }
}

/// 2,500 ConfigMaps paged 500 at a time while others are created, changed
/// and deleted between pages: the pages are one snapshot, the first page's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_one_list_are_one_snapshot_while_objects_change() {
    const N: usize = 2_500;
    let dir = tempfile::tempdir().unwrap();
    let cluster = start(&dir.path().join("cluster"), None).await;
    let admin = Client::admin(&cluster);
    blocking(move || {
        let ns = namespace(&admin, "paging-snapshot");
        let names: Vec<String> = (0..N).map(|i| format!("cm-{i:05}")).collect();
        let started = Instant::now();
        create_all(&admin, &ns, &names, |_| json!({}));
        eprintln!("created {N} ConfigMaps in {:?}", started.elapsed());
        let base = format!("/api/v1/namespaces/{ns}/configmaps");
        let mut round = 0;
        let pages = page_all(&admin, &base, 500, |page| {
            // Between pages: a new object, a change and a deletion of
            // objects the next pages hold, and one the first page held.
            round += 1;
            for i in 0..10 {
                let new = format!("cm-{:05}-new-{round}-{i}", page * 500 + i);
                let (code, body) = admin.post(&base, &config_map(&new, json!({})));
                assert_eq!(code, 201, "{body}");
                let later = &names[page * 500 + 50 + i];
                let (code, body) = admin.patch(
                    &format!("{base}/{later}"),
                    "application/merge-patch+json",
                    &json!({"data": {"v": "changed"}}),
                );
                assert_eq!(code, 200, "{body}");
                let gone = &names[page * 500 + 100 + i];
                let (code, body) = admin.call("DELETE", &format!("{base}/{gone}"), None, None);
                assert_eq!(code, 200, "{body}");
                let earlier = &names[(page - 1) * 500 + i];
                let (code, body) = admin.call("DELETE", &format!("{base}/{earlier}"), None, None);
                assert_eq!(code, 200, "{body}");
            }
        });
        assert_eq!(pages.len(), N / 500, "5 pages of 500");
        let snapshot = rv(&pages[0]);
        let mut seen = Vec::new();
        for (i, p) in pages.iter().enumerate() {
            assert_eq!(
                rv(p),
                snapshot,
                "page {i} is read at the first page's version"
            );
            assert_eq!(p["items"].as_array().unwrap().len(), 500);
            let remaining = &p["metadata"]["remainingItemCount"];
            if i + 1 < pages.len() {
                assert_eq!(remaining, &json!(N - 500 * (i + 1)), "page {i}");
            } else {
                assert!(
                    remaining.is_null() && token(p).is_none(),
                    "last page: {}",
                    p["metadata"]
                );
            }
            for o in p["items"].as_array().unwrap() {
                assert!(
                    rv(o) <= snapshot,
                    "{} is newer than the snapshot",
                    o["metadata"]["name"]
                );
                assert_eq!(o["data"]["v"], "0", "{} as it was", o["metadata"]["name"]);
            }
            seen.extend(names_of(p));
        }
        assert_eq!(seen, names, "every object once, in key order, none added");
        // A new list sees the changes.
        let (code, now) = admin.get(&base);
        assert_eq!(code, 200);
        assert!(rv(&now) > snapshot);
        // 4 rounds: 10 created, 20 deleted each.
        assert_eq!(now["items"].as_array().unwrap().len(), N + 40 - 80);
        assert!(now["metadata"]["continue"].is_null());
        let (code, _) = admin.call("DELETE", &format!("/api/v1/namespaces/{ns}"), None, None);
        assert_eq!(code, 200);
    })
    .await;
    cluster.shutdown().await;
}

/// A token older than the kept history is 410 Expired with kube-apiserver's
/// message and a token that continues at the newest version; a malformed
/// token is 400; resourceVersion with continue is 400, resourceVersionMatch
/// with it 422; a list at an exact, kept version shows that version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_bad_tokens_and_resource_versions() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start(&dir.path().join("cluster"), Some(200)).await;
    let admin = Client::admin(&cluster);
    blocking(move || {
        let ns = namespace(&admin, "paging-expiry");
        let names: Vec<String> = (0..20).map(|i| format!("cm-{i:02}")).collect();
        create_all(&admin, &ns, &names, |_| json!({}));
        let base = format!("/api/v1/namespaces/{ns}/configmaps");
        let (code, first) = admin.get(&format!("{base}?limit=5"));
        assert_eq!(code, 200, "{first}");
        let t = token(&first).expect("a continue token");
        let at = rv(&first);

        // Exact lists at the first page's version, while it is kept.
        let (code, body) = admin.patch(
            &format!("{base}/cm-00"),
            "application/merge-patch+json",
            &json!({"data": {"v": "1"}}),
        );
        assert_eq!(code, 200, "{body}");
        let (code, exact) = admin.get(&format!(
            "{base}?resourceVersion={at}&resourceVersionMatch=Exact"
        ));
        assert_eq!(code, 200, "{exact}");
        assert_eq!(rv(&exact), at);
        assert_eq!(exact["items"][0]["data"]["v"], "0");
        let (code, legacy) = admin.get(&format!("{base}?resourceVersion={at}&limit=3"));
        assert_eq!(code, 200, "{legacy}");
        assert_eq!(
            (rv(&legacy), legacy["items"][0]["data"]["v"].clone()),
            (at, json!("0"))
        );
        let (code, newest) = admin.get(&format!(
            "{base}?resourceVersion={at}&resourceVersionMatch=NotOlderThan"
        ));
        assert_eq!(code, 200);
        assert_eq!(newest["items"][0]["data"]["v"], "1");
        let future = at + 1_000_000;
        let (code, body) = admin.get(&format!(
            "{base}?resourceVersion={future}&resourceVersionMatch=Exact"
        ));
        assert_eq!(code, 504, "{body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("Too large resource version"),
            "{body}"
        );
        let (code, body) = admin.get(&format!("{base}?resourceVersion={future}"));
        assert_eq!(code, 504, "{body}");

        // What kube-apiserver refuses.
        let (code, body) = admin.get(&format!("{base}?limit=5&continue={t}&resourceVersion={at}"));
        assert_eq!(code, 400, "{body}");
        assert_eq!(
            body["message"],
            "specifying resource version is not allowed when using continue"
        );
        let (code, body) = admin.get(&format!(
            "{base}?limit=5&continue={t}&resourceVersion={at}&resourceVersionMatch=Exact"
        ));
        assert_eq!(code, 422, "{body}");
        assert!(body["message"]
            .as_str()
            .unwrap()
            .contains("resourceVersionMatch is forbidden when continue is provided"));
        let (code, body) = admin.get(&format!("{base}?resourceVersionMatch=Exact"));
        assert_eq!(code, 422, "{body}");
        for bad in [
            "not-a-token",
            "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MCwic3RhcnQiOiJhIn0",
        ] {
            let (code, body) = admin.get(&format!("{base}?limit=5&continue={bad}"));
            assert_eq!(code, 400, "{body}");
            assert_eq!(body["reason"], "BadRequest");
            assert!(
                body["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("invalid continue token: continue key is not valid"),
                "{body}"
            );
        }

        // 200 more changes: the first page's version leaves the history.
        for i in 0..200 {
            let (code, body) = admin.patch(
                &format!("{base}/cm-19"),
                "application/merge-patch+json",
                &json!({"data": {"v": format!("{}", i + 2)}}),
            );
            assert_eq!(code, 200, "{body}");
        }
        let (code, gone) = admin.get(&format!("{base}?limit=5&continue={t}"));
        assert_eq!(code, 410, "{gone}");
        assert_eq!(gone["reason"], "Expired");
        assert_eq!(gone["message"], INCONSISTENT);
        let (code, body) = admin.get(&format!(
            "{base}?resourceVersion={at}&resourceVersionMatch=Exact"
        ));
        assert_eq!(code, 410, "{body}");
        assert_eq!(
            body["message"],
            "The resourceVersion for the provided list is too old."
        );
        // The token in the 410 continues (from the newest version) where
        // the expired one would have.
        let again = token(&gone).expect("the 410 carries a token");
        let rest = page_all(&admin, &format!("{base}?continue={again}"), 5, |_| {});
        let rest_names: Vec<String> = rest.iter().flat_map(names_of).collect();
        assert_eq!(rest_names, names[5..].to_vec());
        assert!(rv(&rest[0]) > at);
        assert_eq!(
            rest.last().unwrap()["items"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()["data"]["v"],
            "201"
        );
    })
    .await;
    cluster.shutdown().await;
}

/// Label and field selectors apply before the limit: every page but the
/// last is full of matching objects; no count when some objects are left
/// out; a list across namespaces pages by namespace/name; the Table
/// `kubectl get` asks for carries the token too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_apply_before_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start(&dir.path().join("cluster"), None).await;
    let admin = Client::admin(&cluster);
    blocking(move || {
        let a = namespace(&admin, "paging-sel-a");
        let b = namespace(&admin, "paging-sel-b");
        let names: Vec<String> = (0..30).map(|i| format!("cm-{i:02}")).collect();
        let tier = |i: usize| json!({"tier": if i.is_multiple_of(3) { "front" } else { "back" }, "run": "paging"});
        create_all(&admin, &a, &names, tier);
        create_all(&admin, &b, &names, tier);
        let base = format!("/api/v1/namespaces/{a}/configmaps?labelSelector=tier%3Dfront");
        let pages = page_all(&admin, &base, 4, |_| {});
        let sizes: Vec<usize> = pages.iter().map(|p| p["items"].as_array().unwrap().len()).collect();
        assert_eq!(sizes, [4, 4, 2], "10 matching objects, 4 a page");
        assert!(pages.iter().all(|p| p["metadata"]["remainingItemCount"].is_null()));
        let got: Vec<String> = pages.iter().flat_map(names_of).collect();
        let want: Vec<String> = names.iter().step_by(3).cloned().collect();
        assert_eq!(got, want);

        let base = format!("/api/v1/namespaces/{a}/configmaps?fieldSelector=metadata.name%21%3Dcm-01&labelSelector=tier%3Dback");
        let got: Vec<String> = page_all(&admin, &base, 7, |_| {}).iter().flat_map(names_of).collect();
        assert_eq!(got.len(), 19);
        assert!(!got.contains(&"cm-01".to_string()));

        // Across namespaces: keys are namespace/name, in that order.
        let pages = page_all(&admin, "/api/v1/configmaps?labelSelector=run%3Dpaging", 7, |_| {});
        let keys: Vec<String> = pages
            .iter()
            .flat_map(|p| p["items"].as_array().unwrap().clone())
            .map(|o| format!("{}/{}", o["metadata"]["namespace"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap()))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys.len(), 60);
        assert_eq!(keys, sorted);
        assert_eq!(keys.iter().collect::<BTreeSet<_>>().len(), 60);
        let (code, first) = admin.get("/api/v1/configmaps?labelSelector=run%3Dpaging&limit=7");
        assert_eq!(code, 200);
        let decoded = base64_url(token(&first).unwrap().as_str());
        assert!(decoded.contains(&format!("\"start\":\"{a}/cm-06\\u0000\"")), "{decoded}");

        // Cluster-scoped: namespaces, every one once.
        let (code, all) = admin.get("/api/v1/namespaces");
        assert_eq!(code, 200);
        let paged: Vec<String> = page_all(&admin, "/api/v1/namespaces", 1, |_| {}).iter().flat_map(names_of).collect();
        assert_eq!(paged, names_of(&all));
        for ns in [&a, &b] {
            admin.call("DELETE", &format!("/api/v1/namespaces/{ns}"), None, None);
        }
    })
    .await;
    cluster.shutdown().await;
}

/// Two servers on one PostgreSQL database: a paging run started on one
/// continues on the other (which reads the first one's changes from the
/// change log) as the same snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_one_server_continues_on_another_sharing_postgres() {
    let pg = knit_db::testing::TestPostgres::start().expect("a PostgreSQL server for the test");
    let url = pg.create_database("cluster_paging").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (dir_a, dir_b) = (dir.path().join("a"), dir.path().join("b"));
    // One CA for both, made by a first start on A's directory alone.
    drop(
        EmbeddedCluster::start(ClusterConfig::new(&dir_a, "127.0.0.1:0".parse().unwrap()))
            .await
            .unwrap(),
    );
    std::fs::create_dir_all(dir_b.join("pki")).unwrap();
    for f in ["ca.crt", "ca.key"] {
        std::fs::copy(dir_a.join("pki").join(f), dir_b.join("pki").join(f)).unwrap();
    }
    let config = |d: &Path| {
        let mut cfg = ClusterConfig::new(d, "127.0.0.1:0".parse().unwrap());
        cfg.datastore = Some(knit_db::Datastore::Postgres(url.clone()));
        cfg
    };
    let a = EmbeddedCluster::start(config(&dir_a)).await.unwrap();
    let b = EmbeddedCluster::start(config(&dir_b)).await.unwrap();
    let (admin_a, admin_b) = (Client::admin(&a), Client::admin(&b));
    blocking(move || {
        let ns = namespace(&admin_a, "paging-ha");
        let names: Vec<String> = (0..30).map(|i| format!("cm-{i:02}")).collect();
        create_all(&admin_a, &ns, &names, |_| json!({}));
        let base = format!("/api/v1/namespaces/{ns}/configmaps");
        let (code, first) = admin_a.get(&format!("{base}?limit=10"));
        assert_eq!(code, 200, "{first}");
        // Through A, right before B is asked (B's follower may not have
        // read them yet): a change, a deletion and a creation on later pages.
        admin_a.patch(
            &format!("{base}/cm-15"),
            "application/merge-patch+json",
            &json!({"data": {"v": "changed"}}),
        );
        admin_a.call("DELETE", &format!("{base}/cm-25"), None, None);
        admin_a.post(&base, &config_map("cm-20-new", json!({})));
        let mut pages = vec![first];
        while let Some(t) = token(pages.last().unwrap()) {
            let (code, page) = admin_b.get(&format!("{base}?limit=10&continue={t}"));
            assert_eq!(code, 200, "{page}");
            pages.push(page);
        }
        assert_eq!(pages.len(), 3);
        let at = rv(&pages[0]);
        assert!(pages.iter().all(|p| rv(p) == at));
        let listed: Vec<String> = pages.iter().flat_map(names_of).collect();
        assert_eq!(listed, names);
        assert!(pages
            .iter()
            .flat_map(|p| p["items"].as_array().unwrap().clone())
            .all(|o| o["data"]["v"] == "0"));
    })
    .await;
    b.shutdown().await;
    a.shutdown().await;
}

fn base64_url(s: &str) -> String {
    use base64::Engine;
    String::from_utf8(
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s)
            .unwrap(),
    )
    .unwrap()
}

fn find_on_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.is_file())
}

/// The real kubectl pages with `--chunk-size`: its requests (-v=6) carry
/// limit and then continue, and it prints every pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_pages_with_chunk_size() {
    let Some(kubectl) = find_on_path("kubectl") else {
        return knit_test_support::not_provided(
            "kubectl is not installed on this machine; the kubectl paging test did not run",
        );
    };
    let dir = tempfile::tempdir().unwrap();
    let cluster = start(&dir.path().join("cluster"), None).await;
    let admin = Client::admin(&cluster);
    let kubeconfig = cluster.admin_kubeconfig_path().to_path_buf();
    let cache = dir.path().join("kube-cache");
    blocking(move || {
        let ns = namespace(&admin, "paging-kubectl");
        let names: Vec<String> = (0..35).map(|i| format!("web-{i:02}")).collect();
        for n in &names {
            let (code, body) = admin.post(
                &format!("/api/v1/namespaces/{ns}/pods"),
                &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n},
                        "spec": {"containers": [{"name": "app", "image": "registry.local/app:1"}]}}),
            );
            assert_eq!(code, 201, "{body}");
        }
        let run = |args: &[&str]| {
            let out = Command::new(&kubectl)
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!("--cache-dir={}", cache.display()))
                .arg("--request-timeout=20s")
                .args(args)
                .output()
                .unwrap();
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
            assert!(out.status.success(), "kubectl {args:?}:\n{stdout}\n{stderr}");
            (stdout, stderr)
        };
        for output in [None, Some("-o=name"), Some("-o=json")] {
            let mut args = vec!["get", "pods", "-n", &ns, "--chunk-size=10", "-v=6"];
            args.extend(output);
            let (stdout, stderr) = run(&args);
            let requests: Vec<&str> = stderr
                .lines()
                .filter(|l| l.contains(&format!("/namespaces/{ns}/pods?")))
                .collect();
            assert_eq!(requests.len(), 4, "35 pods in chunks of 10: {stderr}");
            assert!(requests.iter().all(|l| l.contains("limit=10") && l.contains("200 OK")), "{stderr}");
            assert_eq!(requests.iter().filter(|l| l.contains("continue=")).count(), 3, "{stderr}");
            let printed: Vec<String> = match output {
                Some("-o=json") => names_of(&serde_json::from_str::<Value>(&stdout).unwrap()),
                Some(_) => stdout.lines().map(|l| l.trim_start_matches("pod/").to_string()).collect(),
                None => stdout
                    .lines()
                    .skip(1)
                    .map(|l| l.split_whitespace().next().unwrap().to_string())
                    .collect(),
            };
            assert_eq!(printed, names, "{output:?}: every pod once, in order");
            if output.is_none() {
                assert_eq!(stdout.lines().filter(|l| l.starts_with("NAME")).count(), 1, "one header:\n{stdout}");
            }
        }
        admin.call("DELETE", &format!("/api/v1/namespaces/{ns}"), None, None);
    })
    .await;
    cluster.shutdown().await;
}

/// The `kubernetes` Python package, if importable (directly, or from
/// KNIT_TEST_PYTHONPATH): the python3 to run and its PYTHONPATH.
fn python_client() -> Option<(PathBuf, Option<String>)> {
    let python = find_on_path("python3")?;
    let path = std::env::var("KNIT_TEST_PYTHONPATH").ok();
    let mut cmd = Command::new(&python);
    cmd.args(["-c", "import kubernetes"]);
    if let Some(p) = &path {
        cmd.env("PYTHONPATH", p);
    }
    let ok = cmd.output().ok()?.status.success();
    ok.then_some((python, path))
}

/// The official Python client's `limit` / `_continue`: it pages through
/// every object, gets one snapshot, and sees the 400 of a bad token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_pages() {
    let Some((python, pythonpath)) = python_client() else {
        return knit_test_support::not_provided("python3 with the kubernetes package is not installed (pip install kubernetes, or set KNIT_TEST_PYTHONPATH); the Python client paging test did not run");
    };
    let dir = tempfile::tempdir().unwrap();
    let cluster = start(&dir.path().join("cluster"), None).await;
    let admin = Client::admin(&cluster);
    let kubeconfig = cluster.admin_kubeconfig_path().to_path_buf();
    blocking(move || {
        let ns = namespace(&admin, "paging-python");
        let names: Vec<String> = (0..23).map(|i| format!("cm-{i:02}")).collect();
        create_all(
            &admin,
            &ns,
            &names,
            |i| json!({"half": if i.is_multiple_of(2) { "even" } else { "odd" }}),
        );
        let script = r#"
import json, sys
from kubernetes import client, config
from kubernetes.client.rest import ApiException
config.load_kube_config(config_file=sys.argv[1])
v1 = client.CoreV1Api()
ns = sys.argv[2]
out = {"pages": [], "selected": [], "snapshot_values": []}
token = None
first_rv = None
while True:
    page = v1.list_namespaced_config_map(ns, limit=5, _continue=token)
    if first_rv is None:
        first_rv = page.metadata.resource_version
        # Changed after the first page: later pages show it as it was.
        v1.patch_namespaced_config_map("cm-22", ns, {"data": {"v": "changed"}})
    out["pages"].append({"rv": page.metadata.resource_version,
                         "names": [o.metadata.name for o in page.items],
                         "remaining": page.metadata.remaining_item_count,
                         "continue": page.metadata._continue})
    out["snapshot_values"] += [o.data["v"] for o in page.items]
    token = page.metadata._continue
    if not token:
        break
token = None
while True:
    page = v1.list_namespaced_config_map(ns, limit=4, _continue=token, label_selector="half=even")
    out["selected"] += [o.metadata.name for o in page.items]
    token = page.metadata._continue
    if not token:
        break
try:
    v1.list_namespaced_config_map(ns, limit=5, _continue="bogus")
    out["bad"] = None
except ApiException as e:
    out["bad"] = {"status": e.status, "message": json.loads(e.body)["message"]}
print(json.dumps(out))
"#;
        let mut cmd = Command::new(&python);
        cmd.arg("-c").arg(script).arg(&kubeconfig).arg(&ns);
        if let Some(p) = &pythonpath {
            cmd.env("PYTHONPATH", p);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "python:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Value = serde_json::from_str(stdout.trim()).unwrap();
        let pages = got["pages"].as_array().unwrap();
        assert_eq!(pages.len(), 5, "23 objects, 5 a page: {got}");
        let listed: Vec<String> = pages
            .iter()
            .flat_map(|p| {
                p["names"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_str().unwrap().to_string())
            })
            .collect();
        assert_eq!(listed, names);
        let rvs: BTreeSet<&str> = pages.iter().map(|p| p["rv"].as_str().unwrap()).collect();
        assert_eq!(rvs.len(), 1, "one snapshot: {got}");
        assert_eq!(pages[0]["remaining"], 18);
        assert!(pages[4]["continue"].is_null());
        assert!(
            got["snapshot_values"]
                .as_array()
                .unwrap()
                .iter()
                .all(|v| v == "0"),
            "{got}"
        );
        let even: Vec<String> = names.iter().step_by(2).cloned().collect();
        assert_eq!(got["selected"], json!(even));
        assert_eq!(got["bad"]["status"], 400, "{got}");
        eprintln!("the Python client paged through {} pages", pages.len());
        admin.call("DELETE", &format!("/api/v1/namespaces/{ns}"), None, None);
    })
    .await;
    cluster.shutdown().await;
}
