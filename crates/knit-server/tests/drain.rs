//! knit's drain against a Kubernetes API over HTTPS: the embedded cluster
//! through `EmbeddedJoin`, and the same cluster reached as an external one
//! through `ExternalJoin` (the kube crate with its admin kubeconfig). Pods,
//! a DaemonSet's pod, a static pod's mirror and a PodDisruptionBudget are
//! made through the API; what a kubelet would do (report pods Running and
//! Ready, end a graceful deletion) is done by the test with the admin
//! client.
//!
//! Checked: the node is cordoned; pods are evicted through the Eviction
//! API, the one a budget protects refused and the budget named in the
//! drain's state and an event; the DaemonSet and mirror pods are left
//! alone; the drain ends once the budget allows and the pods are gone;
//! past the timeout, `onTimeout: force` deletes what is left.

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use knit_api::state::DrainState;
use knit_server::store::Store;
use knit_server::{ClusterJoin, ControlPlane, DrainProgress, EmbeddedJoin, ExternalJoin, Settings};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn object<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

struct Admin {
    client: kube::Client,
    ns: String,
}

impl Admin {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn node(&self, name: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .create(
                &PostParams::default(),
                &object(json!({"metadata": {"name": name}})),
            )
            .await
            .unwrap();
        let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&ready))
            .await
            .unwrap();
    }

    /// A pod bound to `node`, reported Running and Ready as its kubelet would.
    async fn pod(&self, name: &str, node: &str, labels: Value, meta: Value) {
        let mut p = json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.local/app:1"}]},
        });
        if let (Some(m), Value::Object(extra)) = (p["metadata"].as_object_mut(), meta) {
            m.extend(extra);
        }
        self.pods()
            .create(&PostParams::default(), &object(p))
            .await
            .unwrap();
        let running = json!({"status": {"phase": "Running", "conditions": [
            {"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "True"}]}});
        self.pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&running))
            .await
            .unwrap();
    }

    /// What a kubelet does once a pod's deletion started: ends it.
    async fn finish_deletions(&self) -> Vec<String> {
        let mut ended = Vec::new();
        for p in self.pods().list(&Default::default()).await.unwrap().items {
            if p.metadata.deletion_timestamp.is_some() {
                let name = p.metadata.name.unwrap();
                let now = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                let _ = self.pods().delete(&name, &now).await;
                ended.push(name);
            }
        }
        ended.sort();
        ended
    }

    async fn budget_allows(&self, name: &str, allowed: i32) {
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), &self.ns);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let b = api.get(name).await.unwrap();
            if b.status.as_ref().map(|s| s.disruptions_allowed) == Some(allowed) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "budget {name} never allowed {allowed}: {:?}",
                b.status
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn control_plane(dir: &std::path::Path, cluster: Arc<dyn ClusterJoin>) -> Arc<ControlPlane> {
    let store = Store::open(&dir.join("knit.db")).unwrap();
    Arc::new(ControlPlane::new(
        store,
        None,
        cluster,
        Settings::new(dir.to_path_buf()),
        String::new(),
        String::new(),
        String::new(),
    ))
}

fn pool(cp: &ControlPlane, name: &str, timeout: i64, on_timeout: &str) {
    let mut p = knit_api::NodePool::new(name, knit_api::NodePoolSpec::default());
    p.spec.drain = knit_api::DrainSpec {
        timeout_seconds: timeout,
        on_timeout: on_timeout.into(),
    };
    cp.store().insert_pool(&p).unwrap();
}

/// The whole story on one seam; names carry `tag` so that both seams can
/// run on one cluster.
async fn drain_story(cp: &ControlPlane, admin: &Admin, tag: &str) {
    let (n1, n2, n3) = (
        format!("{tag}-n1"),
        format!("{tag}-n2"),
        format!("{tag}-n3"),
    );
    for n in [&n1, &n2, &n3] {
        admin.node(n).await;
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(admin.client.clone(), &admin.ns);
    let web = json!({"app": format!("{tag}-web")});
    pdbs.create(
        &PostParams::default(),
        &object(json!({"metadata": {"name": format!("{tag}-web")},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": web.clone()}}})),
    )
    .await
    .unwrap();
    admin
        .pod(&format!("{tag}-web-0"), &n1, web.clone(), json!({}))
        .await;
    admin
        .pod(&format!("{tag}-web-1"), &n1, web.clone(), json!({}))
        .await;
    admin
        .pod(&format!("{tag}-web-2"), &n2, web.clone(), json!({}))
        .await;
    admin
        .pod(&format!("{tag}-batch"), &n1, json!({}), json!({}))
        .await;
    admin
        .pod(
            &format!("{tag}-ds"),
            &n1,
            json!({}),
            json!({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                "name": "agent", "uid": "d5-1", "controller": true}]}),
        )
        .await;
    admin
        .pod(
            &format!("{tag}-static"),
            &n1,
            json!({}),
            json!({"annotations": {"kubernetes.io/config.mirror": "0123"}}),
        )
        .await;
    admin.budget_allows(&format!("{tag}-web"), 1).await;

    let pool_name = format!("{tag}-p");
    pool(cp, &pool_name, 3600, "wait");
    let instance = format!("{tag}-p-a");
    let step = || cp.drain_step(1, &instance, &n1, &pool_name);

    // Pass 1: cordoned; one web pod and the batch pod evicted, the other
    // web pod refused: the budget is named.
    assert!(matches!(step().await.unwrap(), DrainProgress::Wait(_)));
    let nodes: Api<Node> = Api::all(admin.client.clone());
    let cordoned = nodes.get(&n1).await.unwrap();
    assert_eq!(cordoned.spec.and_then(|s| s.unschedulable), Some(true));
    let d = cp.store().drain(&instance).unwrap().unwrap();
    assert_eq!(d.state, DrainState::Blocked, "{d:?}");
    let budget = d.budget.clone().unwrap();
    assert!(
        budget.starts_with(&format!("{}/{tag}-web (minAvailable 2", admin.ns)),
        "{budget}"
    );
    assert!(
        d.reason.as_deref().unwrap().contains("would violate"),
        "{d:?}"
    );
    assert_eq!(d.evicted, 2);
    let events = cp.store().events(50).unwrap();
    assert!(
        events.iter().any(|e| e.reason == "DrainBlocked"
            && e.object_name == n1
            && e.message.contains(&format!("{tag}-web"))),
        "{events:?}"
    );
    // Evicted, not deleted outright: graceful deletion started.
    let ended = admin.finish_deletions().await;
    assert_eq!(ended.len(), 2, "{ended:?}");

    // Still refused while the budget allows nothing.
    admin.budget_allows(&format!("{tag}-web"), 0).await;
    assert!(matches!(step().await.unwrap(), DrainProgress::Wait(_)));
    assert_eq!(
        cp.store().drain(&instance).unwrap().unwrap().state,
        DrainState::Blocked
    );

    // Another replica elsewhere: the budget allows one; the drain goes on.
    admin
        .pod(&format!("{tag}-web-3"), &n2, web.clone(), json!({}))
        .await;
    admin.budget_allows(&format!("{tag}-web"), 1).await;
    assert!(matches!(step().await.unwrap(), DrainProgress::Wait(_)));
    let d = cp.store().drain(&instance).unwrap().unwrap();
    assert_eq!(d.state, DrainState::Draining, "{d:?}");
    assert_eq!(d.budget, None);
    assert_eq!(admin.finish_deletions().await.len(), 1);
    assert_eq!(step().await.unwrap(), DrainProgress::Done);
    let d = cp.store().drain(&instance).unwrap().unwrap();
    assert_eq!(d.state, DrainState::Drained);
    assert_eq!(d.evicted, 3);
    // The DaemonSet's and the static pod's stay, untouched.
    for name in [format!("{tag}-ds"), format!("{tag}-static")] {
        let p = admin.pods().get(&name).await.unwrap();
        assert!(
            p.metadata.deletion_timestamp.is_none(),
            "{name} was evicted"
        );
    }
    let steps = cp.store().drain_steps(&instance).unwrap();
    let last = &steps.last().unwrap().message;
    assert!(
        last.contains("3 pod(s) evicted")
            && last.contains("1 DaemonSet")
            && last.contains("1 mirror"),
        "{steps:?}"
    );
    // Done is done: a resumed intent does not drain again.
    assert_eq!(step().await.unwrap(), DrainProgress::Done);

    // onTimeout: force, past a 1 s timeout: the protected pod is deleted.
    let forced_pool = format!("{tag}-f");
    pool(cp, &forced_pool, 1, "force");
    admin
        .pod(&format!("{tag}-web-9"), &n3, web.clone(), json!({}))
        .await;
    admin.budget_allows(&format!("{tag}-web"), 1).await;
    // Two of three may not go: take the one allowed disruption first.
    admin
        .pods()
        .evict(&format!("{tag}-web-2"), &Default::default())
        .await
        .unwrap();
    admin.finish_deletions().await;
    admin.budget_allows(&format!("{tag}-web"), 0).await;
    let forced_instance = format!("{tag}-f-a");
    let forced = || cp.drain_step(2, &forced_instance, &n3, &forced_pool);
    assert!(matches!(forced().await.unwrap(), DrainProgress::Wait(_)));
    assert_eq!(
        cp.store().drain(&forced_instance).unwrap().unwrap().state,
        DrainState::Blocked
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(matches!(forced().await.unwrap(), DrainProgress::Wait(_)));
    let d = cp.store().drain(&forced_instance).unwrap().unwrap();
    assert_eq!(d.state, DrainState::Forcing, "{d:?}");
    assert!(d.timed_out_ms.is_some());
    assert_eq!(admin.finish_deletions().await, vec![format!("{tag}-web-9")]);
    assert_eq!(forced().await.unwrap(), DrainProgress::Done);
    let reasons: Vec<String> = cp
        .store()
        .events(100)
        .unwrap()
        .into_iter()
        .filter(|e| e.object_name == n3)
        .map(|e| e.reason)
        .collect();
    for want in ["DrainBlocked", "DrainTimeout", "DrainForced", "Drained"] {
        assert!(reasons.iter().any(|r| r == want), "{want} in {reasons:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_against_the_embedded_and_an_external_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = knit_cluster::ClusterConfig::new(
        dir.path().join("cluster"),
        "127.0.0.1:0".parse().unwrap(),
    );
    let cluster = knit_cluster::EmbeddedCluster::start(cfg).await.unwrap();
    let kubeconfig = cluster.admin_kubeconfig_path().to_path_buf();
    let external = ExternalJoin::from_kubeconfig(&kubeconfig, Duration::from_secs(600))
        .await
        .unwrap();
    let client = {
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(cfg).unwrap()
    };
    let admin = Admin {
        client,
        ns: "default".into(),
    };
    let embedded = EmbeddedJoin::new(cluster, Duration::from_secs(600)).unwrap();
    let embedded = Arc::new(embedded);

    let state = dir.path().join("embedded");
    std::fs::create_dir_all(&state).unwrap();
    let cp = control_plane(&state, embedded.clone());
    drain_story(&cp, &admin, "emb").await;

    let state = dir.path().join("external");
    std::fs::create_dir_all(&state).unwrap();
    let cp = control_plane(&state, Arc::new(external));
    drain_story(&cp, &admin, "ext").await;
    embedded.stop();
}

/// A pod that two budgets select: kube-apiserver answers its eviction 500
/// ("This pod has more than one PodDisruptionBudget…"). The drain is
/// blocked by both budgets, named, not failed; past the timeout `wait`
/// keeps waiting, and once the pool says `force` the pod is deleted.
async fn two_budgets_story(cp: &ControlPlane, admin: &Admin, tag: &str) {
    let node = format!("{tag}-n2b");
    admin.node(&node).await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(admin.client.clone(), &admin.ns);
    let db = json!({"app": format!("{tag}-db")});
    // Two budgets over one pod, by matchLabels and by matchExpressions.
    for (name, selector) in [
        ("a", json!({"matchLabels": db.clone()})),
        (
            "b",
            json!({"matchExpressions": [{"key": "app", "operator": "In", "values": [format!("{tag}-db")]}]}),
        ),
    ] {
        let spec = json!({"minAvailable": 0, "selector": selector});
        pdbs.create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": format!("{tag}-db-{name}")}, "spec": spec})),
        )
        .await
        .unwrap();
    }
    let pod = format!("{tag}-db-0");
    admin.pod(&pod, &node, db.clone(), json!({})).await;
    // Each budget alone would allow the eviction.
    admin.budget_allows(&format!("{tag}-db-a"), 1).await;
    admin.budget_allows(&format!("{tag}-db-b"), 1).await;

    let pool_name = format!("{tag}-two");
    pool(cp, &pool_name, 1, "wait");
    let instance = format!("{tag}-two-a");
    let step = || cp.drain_step(3, &instance, &node, &pool_name);
    assert!(matches!(step().await.unwrap(), DrainProgress::Wait(_)));
    let d = cp.store().drain(&instance).unwrap().unwrap();
    assert_eq!(d.state, DrainState::Blocked, "{d:?}");
    let budget = d.budget.clone().unwrap_or_default();
    let ns = &admin.ns;
    assert!(
        budget.contains(&format!("{ns}/{tag}-db-a (minAvailable 0,"))
            && budget.contains(&format!("{ns}/{tag}-db-b (minAvailable 0,")),
        "{budget}"
    );
    let reason = d.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("refused by PodDisruptionBudgets")
            && reason.contains("more than one PodDisruptionBudget")
            && !reason.contains("API failed"),
        "{reason}"
    );
    let events = cp.store().events(100).unwrap();
    assert!(
        events.iter().any(|e| e.reason == "DrainBlocked"
            && e.object_name == node
            && e.message.contains(&format!("{tag}-db-a"))
            && e.message.contains(&format!("{tag}-db-b"))),
        "{events:?}"
    );
    let p = admin.pods().get(&pod).await.unwrap();
    assert!(p.metadata.deletion_timestamp.is_none(), "not evicted");

    // Past the 1 s timeout, onTimeout wait: still blocked, still there.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(matches!(step().await.unwrap(), DrainProgress::Wait(_)));
    let d = cp.store().drain(&instance).unwrap().unwrap();
    assert_eq!(d.state, DrainState::Blocked, "{d:?}");
    assert!(d.timed_out_ms.is_some());
    assert!(admin
        .pods()
        .get(&pod)
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_none());

    // The pool says force now: the pod is deleted, then the drain ends.
    let mut p = cp.store().pool(&pool_name).unwrap().unwrap().pool;
    p.spec.drain.on_timeout = "force".into();
    cp.store().update_pool(&p).unwrap();
    assert!(matches!(step().await.unwrap(), DrainProgress::Wait(_)));
    let d = cp.store().drain(&instance).unwrap().unwrap();
    assert_eq!(d.state, DrainState::Forcing, "{d:?}");
    assert_eq!(admin.finish_deletions().await, vec![pod.clone()]);
    assert_eq!(step().await.unwrap(), DrainProgress::Done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_under_two_budgets_blocks_the_drain_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = knit_cluster::ClusterConfig::new(
        dir.path().join("cluster"),
        "127.0.0.1:0".parse().unwrap(),
    );
    let cluster = knit_cluster::EmbeddedCluster::start(cfg).await.unwrap();
    let kubeconfig = cluster.admin_kubeconfig_path().to_path_buf();
    let external = ExternalJoin::from_kubeconfig(&kubeconfig, Duration::from_secs(600))
        .await
        .unwrap();
    let client = {
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(cfg).unwrap()
    };
    let admin = Admin {
        client,
        ns: "default".into(),
    };
    let embedded = Arc::new(EmbeddedJoin::new(cluster, Duration::from_secs(600)).unwrap());
    for (tag, join) in [
        ("emb", embedded.clone() as Arc<dyn ClusterJoin>),
        ("ext", Arc::new(external) as Arc<dyn ClusterJoin>),
    ] {
        let state = dir.path().join(tag);
        std::fs::create_dir_all(&state).unwrap();
        let cp = control_plane(&state, join);
        two_budgets_story(&cp, &admin, tag).await;
    }
    embedded.stop();
}
