//! knit's node events in the embedded Kubernetes API, read by the real
//! kubectl: `kubectl get events` lists them (Warning and Normal, the node
//! as `node/NAME`, a pool as `nodepool/NAME`, an instance without a node as
//! `instance/NAME`, repeats counted on one Event as kube's event recorder
//! does), `kubectl describe node` shows them from `knit`, and a cluster that
//! cannot be written to costs a logged, counted failure, never the event in
//! knit's own store. Skips (saying so) when kubectl is not installed.

use knit_api::state::EventType;
use knit_server::store::Store;
use knit_server::{ControlPlane, EmbeddedJoin, Settings};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn kubectl_bin() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join("kubectl"))
        .find(|p| p.is_file())
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    fn ok(&self, args: &[&str]) -> String {
        let out = Command::new(&self.bin)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--cache-dir={}", self.cache.display()))
            .arg("--request-timeout=20s")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn events(&self, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["get", "events", "-o", "json"];
        all.extend_from_slice(args);
        let list: Value = serde_json::from_str(&self.ok(&all)).unwrap();
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// Waits (at most a minute) until `done` holds for the events listed.
    fn wait_events(&self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let events = self.events(&[]);
            if done(&events) {
                return events;
            }
            assert!(Instant::now() < deadline, "{what}: {events:#?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Waits (at most a minute) until the metrics text holds `line`.
fn wait_metric(cp: &ControlPlane, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cp.metrics().render(&[]).contains(line) {
        assert!(
            Instant::now() < deadline,
            "{line} in {}",
            cp.metrics().render(&[])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn find<'a>(events: &'a [Value], reason: &str) -> Option<&'a Value> {
    events.iter().find(|e| e["reason"] == reason)
}

#[test]
fn node_events_reach_kubectl_counted_once_per_repeat() {
    let Some(bin) = kubectl_bin() else {
        return knit_test_support::not_provided(
            "kubectl is not installed; the events test did not run",
        );
    };
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let join = rt.block_on(async {
        let cfg = knit_cluster::ClusterConfig::new(
            dir.path().join("cluster"),
            "127.0.0.1:0".parse().unwrap(),
        );
        let cluster = knit_cluster::EmbeddedCluster::start(cfg).await.unwrap();
        Arc::new(EmbeddedJoin::new(cluster, Duration::from_secs(600)).unwrap())
    });
    let kubectl = Kubectl {
        bin,
        kubeconfig: join.admin_kubeconfig_path().to_path_buf(),
        cache: dir.path().join("kube-cache"),
    };
    let store = Store::open(&dir.path().join("knit.db")).unwrap();
    let cp = Arc::new(ControlPlane::new(
        store,
        None,
        join.clone(),
        Settings::new(dir.path().join("state")),
        String::new(),
        String::new(),
        String::new(),
    ));
    let (stop, rx) = tokio::sync::watch::channel(false);
    let publisher = {
        let _runtime = rt.enter();
        knit_server::start_kube_events(&cp, rx)
    };

    // The node, as its kubelet registers it.
    let node_file = dir.path().join("node.json");
    std::fs::write(
        &node_file,
        r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cn-local.i-7"}}"#,
    )
    .unwrap();
    kubectl.ok(&[
        "create",
        "--validate=false",
        "-f",
        node_file.to_str().unwrap(),
    ]);

    // Three failures of one phase, then the node initialized; a pool's
    // event is about the pool, as knit's own kind.
    for _ in 0..3 {
        cp.store()
            .add_event(
                EventType::Warning,
                "Node",
                "cn-local.i-7",
                "PhaseFailed",
                "kubernetes-components failed (E_PACKAGE_FETCH): mirror unreachable",
            )
            .unwrap();
    }
    cp.store()
        .add_event(
            EventType::Normal,
            "Node",
            "cn-local.i-7",
            "Initialized",
            "every phase finished",
        )
        .unwrap();
    cp.store()
        .add_event(
            EventType::Normal,
            "NodePool",
            "workers",
            "Scaled",
            "replicas 1 -> 2",
        )
        .unwrap();

    let events = kubectl.wait_events(
        "the failure counted 3 times, the initialization, the pool's",
        |e| {
            find(e, "PhaseFailed").is_some_and(|f| f["count"] == 3)
                && find(e, "Initialized").is_some()
                && find(e, "Scaled").is_some()
        },
    );
    let failed = find(&events, "PhaseFailed").unwrap();
    assert_eq!(failed["type"], "Warning");
    assert_eq!(failed["involvedObject"]["kind"], "Node");
    assert_eq!(failed["involvedObject"]["name"], "cn-local.i-7");
    assert_eq!(failed["source"]["component"], "knit");
    assert_eq!(failed["metadata"]["namespace"], "default");
    assert!(failed["firstTimestamp"].as_str().unwrap().ends_with('Z'));
    assert!(failed["lastTimestamp"].as_str() >= failed["firstTimestamp"].as_str());
    // One Event per stored event: the repeats did not make more.
    assert_eq!(
        events
            .iter()
            .filter(|e| e["reason"] == "PhaseFailed")
            .count(),
        1,
        "{events:#?}"
    );
    assert_eq!(
        find(&events, "Scaled").unwrap()["involvedObject"],
        serde_json::json!({"apiVersion": "knit.dev/v1alpha1", "kind": "NodePool", "name": "workers"})
    );

    // kubectl's own table, and the wide columns.
    let table = kubectl.ok(&["get", "events"]);
    let header = table.lines().next().unwrap();
    assert!(
        header.starts_with("LAST SEEN")
            && header.contains("TYPE")
            && header.contains("REASON")
            && header.contains("OBJECT")
            && header.contains("MESSAGE"),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.contains("PhaseFailed"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("(x3 over") && row.contains("Warning") && row.contains("node/cn-local.i-7"),
        "{row}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.contains("Scaled") && l.contains("nodepool/workers")),
        "{table}"
    );
    let wide = kubectl.ok(&["get", "events", "-o", "wide"]);
    assert!(
        wide.lines().next().unwrap().contains("SOURCE") && wide.contains("knit"),
        "{wide}"
    );
    // kubectl's field selectors, and describe node's Events.
    let warnings = kubectl.events(&["--field-selector", "type=Warning,involvedObject.kind=Node"]);
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    let described = kubectl.ok(&["describe", "node", "cn-local.i-7"]);
    let events_part = described
        .split("Events:")
        .nth(1)
        .unwrap_or_else(|| panic!("{described}"));
    assert!(
        events_part.contains("PhaseFailed")
            && events_part.contains("Initialized")
            && events_part.contains("knit"),
        "{described}"
    );
    // Five writes (a create, two count updates, a create, the pool's).
    wait_metric(&cp, "knit_kube_events_total{outcome=\"published\"} 5\n");

    // An instance's event is about its node once the node reported; before
    // that (created, failed, retried) about the instance, as knit's kind.
    let pool = knit_api::NodePool::new(
        "workers",
        knit_api::NodePoolSpec {
            replicas: 2,
            ..knit_api::NodePoolSpec::default()
        },
    );
    cp.store().insert_pool(&pool).unwrap();
    cp.store()
        .add_create_intents(
            "workers",
            &[
                ("workers-a".to_string(), "t".to_string()),
                ("workers-b".to_string(), "t".to_string()),
            ],
        )
        .unwrap();
    cp.store()
        .set_instance_created("workers-a", "i-7", None)
        .unwrap();
    let instance = cp.store().instance("workers-a").unwrap().unwrap();
    cp.store()
        .record_phase_event(
            &instance,
            &knit_api::PhaseEvent {
                node: "cn-local.i-7".into(),
                instance_id: "i-7".into(),
                phase: knit_api::PhaseName::Hardening,
                outcome: knit_api::PhaseOutcome::Done,
                reason: None,
                error_code: None,
                at_ms: 0,
                duration_ms: Some(1),
            },
        )
        .unwrap();
    cp.store()
        .add_event(
            EventType::Warning,
            "Instance",
            "workers-b",
            "CreateRetry",
            "quota",
        )
        .unwrap();
    cp.store()
        .add_event(
            EventType::Warning,
            "Instance",
            "workers-a",
            "Repairing",
            "node not Ready for 300 s: repair action 1/3: restart-services",
        )
        .unwrap();
    let events = kubectl.wait_events("the instances' events", |e| {
        find(e, "Repairing").is_some() && find(e, "CreateRetry").is_some()
    });
    assert_eq!(
        find(&events, "Repairing").unwrap()["involvedObject"]["name"],
        "cn-local.i-7"
    );
    assert_eq!(
        find(&events, "CreateRetry").unwrap()["involvedObject"],
        serde_json::json!({"apiVersion": "knit.dev/v1alpha1", "kind": "Instance", "name": "workers-b"})
    );
    let table = kubectl.ok(&["get", "events"]);
    assert!(
        table
            .lines()
            .any(|l| l.contains("CreateRetry") && l.contains("instance/workers-b")),
        "{table}"
    );

    // The cluster gone: knit's event is stored all the same, the failed
    // write only counted (and logged).
    join.stop();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut attempt = 0;
    while !cp
        .metrics()
        .render(&[])
        .contains("knit_kube_events_total{outcome=\"failed\"}")
    {
        assert!(Instant::now() < deadline, "{}", cp.metrics().render(&[]));
        attempt += 1;
        cp.store()
            .add_event(
                EventType::Warning,
                "Node",
                "cn-local.i-7",
                "DrainBlocked",
                &format!("attempt {attempt}"),
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(cp
        .store()
        .events(100)
        .unwrap()
        .iter()
        .any(|e| e.reason == "DrainBlocked"));
    stop.send(true).unwrap();
    rt.block_on(publisher).unwrap();
}
