//! The drain's decisions without a cluster, and one pass against a fake
//! API that answers as kube-apiserver does.

use super::*;
use crate::bootstrap::JoinMaterial;
use crate::control::DEFAULT_SKIP_WAIT;
use async_trait::async_trait;
use std::sync::{Arc, Mutex};

const NOW: i64 = 1_000_000_000;
const SKIP: i64 = DEFAULT_SKIP_WAIT.as_millis() as i64;

fn pod(name: &str) -> PodFacts {
    PodFacts {
        namespace: "shop".into(),
        name: name.into(),
        node: "n1".into(),
        labels: [("app".to_string(), "web".to_string())].into(),
        ..PodFacts::default()
    }
}

#[test]
fn mirror_and_daemonset_pods_are_skipped_and_the_rest_evicted() {
    let mirror = PodFacts {
        mirror: true,
        ..pod("etcd")
    };
    let daemon = PodFacts {
        daemon_set: true,
        ..pod("fluentd")
    };
    assert_eq!(classify(&mirror, NOW, true, false, SKIP), PodClass::Mirror);
    assert_eq!(
        classify(&daemon, NOW, true, false, SKIP),
        PodClass::DaemonSet
    );
    assert_eq!(
        classify(&pod("web-1"), NOW, true, false, SKIP),
        PodClass::Evict
    );
}

#[test]
fn a_terminating_pod_blocks_unless_its_node_cannot_confirm_for_60_s() {
    let terminating = |due: i64| PodFacts {
        deletion_ms: Some(due),
        ..pod("web-1")
    };
    // Ready node: waited for however long it takes.
    assert_eq!(
        classify(&terminating(NOW - 3_600_000), NOW, true, false, SKIP),
        PodClass::Terminating
    );
    // NotReady node: blocks until 60 s past its due time.
    assert_eq!(
        classify(&terminating(NOW - 60_000), NOW, false, false, SKIP),
        PodClass::Terminating
    );
    assert_eq!(
        classify(&terminating(NOW - 60_001), NOW, false, false, SKIP),
        PodClass::Abandoned
    );
    // Forced: the same allowance on a Ready node.
    assert_eq!(
        classify(&terminating(NOW - 60_001), NOW, true, true, SKIP),
        PodClass::Abandoned
    );
}

#[test]
fn refused_evictions_back_off_to_30_s() {
    assert_eq!(backoff_ms(0), 1000);
    assert_eq!(backoff_ms(1), 2000);
    assert_eq!(backoff_ms(4), 16_000);
    assert_eq!(backoff_ms(5), 30_000);
    assert_eq!(backoff_ms(500), 30_000);
    assert_eq!(backoff_ms(-3), 1000);
}

fn record(state: DrainState) -> DrainRecord {
    DrainRecord {
        instance: "p-a".into(),
        intent_id: 1,
        node: "n1".into(),
        pool: "p".into(),
        state,
        started_ms: NOW - 1000,
        updated_ms: NOW - 1000,
        timed_out_ms: None,
        reason: None,
        budget: None,
        pods_left: 0,
        evicted: 0,
        blocked_passes: 0,
    }
}

fn refused(pod: &str) -> Refusal {
    Refusal {
        pod: format!("shop/{pod}"),
        message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        budgets: vec!["shop/web (minAvailable 2, 0 disruption(s) allowed)".into()],
    }
}

#[test]
fn a_refusal_names_the_budget_and_backs_off_then_the_drain_ends() {
    let spec = DrainSpec::default();
    let start = record(DrainState::Draining);
    // Pass 1: one evicted, one refused.
    let facts = PassFacts {
        registered: true,
        node_ready: true,
        blocking: vec!["shop/web-1".into(), "shop/web-2".into()],
        evicted: vec!["shop/web-1".into()],
        refused: vec![refused("web-2")],
        ..PassFacts::default()
    };
    let a = advance(&start, &facts, &spec, NOW);
    assert_eq!(a.record.state, DrainState::Blocked);
    assert_eq!(
        a.record.budget.as_deref(),
        Some("shop/web (minAvailable 2, 0 disruption(s) allowed)")
    );
    let reason = a.record.reason.clone().unwrap();
    assert!(
        reason.contains("eviction of shop/web-2 refused by PodDisruptionBudget shop/web"),
        "{reason}"
    );
    assert!(reason.contains("would violate"), "{reason}");
    assert_eq!(a.record.evicted, 1);
    assert_eq!(a.record.pods_left, 2);
    assert_eq!(a.delay_ms, POLL_MS, "something moved: look again soon");
    assert_eq!(a.events.len(), 1);
    assert_eq!(a.events[0].reason, "DrainBlocked");
    assert!(a.events[0].message.contains("shop/web"));
    let step = a.step.clone().unwrap();
    assert!(
        step.contains("evicted shop/web-1") && step.contains("blocked"),
        "{step}"
    );

    // Passes 2 and 3: only refusals: the wait doubles; no new event or step.
    let stuck = PassFacts {
        registered: true,
        node_ready: true,
        blocking: vec!["shop/web-2".into()],
        refused: vec![refused("web-2")],
        ..PassFacts::default()
    };
    let b = advance(&a.record, &stuck, &spec, NOW + 2000);
    assert_eq!((b.record.blocked_passes, b.delay_ms), (1, 2000));
    assert!(b.events.is_empty() && b.step.is_none());
    let c = advance(&b.record, &stuck, &spec, NOW + 4000);
    assert_eq!((c.record.blocked_passes, c.delay_ms), (2, 4000));

    // The budget allows it: evicted, then gone.
    let moving = PassFacts {
        registered: true,
        node_ready: true,
        blocking: vec!["shop/web-2".into()],
        evicted: vec!["shop/web-2".into()],
        ..PassFacts::default()
    };
    let d = advance(&c.record, &moving, &spec, NOW + 8000);
    assert_eq!(d.record.state, DrainState::Draining);
    assert_eq!(d.record.blocked_passes, 0);
    assert_eq!(d.record.budget, None);
    let gone = PassFacts {
        registered: true,
        node_ready: true,
        skipped: [("DaemonSet", 1)].into(),
        ..PassFacts::default()
    };
    let e = advance(&d.record, &gone, &spec, NOW + 10_000);
    assert_eq!(e.record.state, DrainState::Drained);
    assert_eq!(e.delay_ms, 0);
    assert_eq!(e.record.evicted, 2);
    assert_eq!(e.events[0].reason, "Drained");
    assert!(
        e.events[0]
            .message
            .contains("2 pod(s) evicted; skipped 1 DaemonSet"),
        "{}",
        e.events[0].message
    );
}

#[test]
fn wait_keeps_the_removal_pending_after_the_timeout() {
    let spec = DrainSpec {
        timeout_seconds: 5,
        on_timeout: "wait".into(),
    };
    let start = record(DrainState::Blocked);
    let stuck = PassFacts {
        registered: true,
        node_ready: true,
        blocking: vec!["shop/web-2".into()],
        refused: vec![refused("web-2")],
        ..PassFacts::default()
    };
    let late = start.started_ms + 5000;
    assert!(timed_out(&spec, start.started_ms, late));
    assert!(!timed_out(&spec, start.started_ms, late - 1));
    let a = advance(&start, &stuck, &spec, late);
    assert_eq!(a.record.state, DrainState::Blocked, "still waiting");
    assert_eq!(a.record.timed_out_ms, Some(late));
    assert!(a.events.iter().any(|e| e.reason == "DrainTimeout"
        && e.message.contains("onTimeout wait")
        && e.message.contains("5 s")));
    assert!(a
        .record
        .reason
        .as_deref()
        .unwrap()
        .contains("onTimeout: wait"));
    // The timeout event once.
    let b = advance(&a.record, &stuck, &spec, late + 1000);
    assert!(b.events.iter().all(|e| e.reason != "DrainTimeout"));
}

#[test]
fn force_deletes_what_is_left_after_the_timeout() {
    let spec = DrainSpec {
        timeout_seconds: 5,
        on_timeout: "force".into(),
    };
    let start = record(DrainState::Blocked);
    let late = start.started_ms + 6000;
    let forced = PassFacts {
        registered: true,
        node_ready: true,
        blocking: vec!["shop/web-2".into()],
        deleted: vec!["shop/web-2".into()],
        ..PassFacts::default()
    };
    let a = advance(&start, &forced, &spec, late);
    assert_eq!(a.record.state, DrainState::Forcing);
    let reasons: Vec<&str> = a.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, vec!["DrainTimeout", "DrainForced"]);
    assert!(a
        .step
        .unwrap()
        .contains("deleted shop/web-2 (onTimeout: force)"));
}

#[test]
fn a_node_not_registered_is_drained_at_once() {
    let a = advance(
        &record(DrainState::Draining),
        &PassFacts::default(),
        &DrainSpec::default(),
        NOW,
    );
    assert_eq!(a.record.state, DrainState::Drained);
    assert!(a.events[0].message.contains("not registered"));
}

/// An API that answers as kube-apiserver does: evictions of pods a budget
/// protects are refused with 429 while `allow` is false.
#[derive(Default)]
struct FakeApi {
    pods: Mutex<Vec<PodFacts>>,
    /// The node's Ready condition is not True (its kubelet is gone).
    not_ready: Mutex<bool>,
    allow: Mutex<bool>,
    calls: Mutex<Vec<String>>,
}

#[async_trait]
impl ClusterJoin for FakeApi {
    async fn join_material(&self, _: &str, _: &str) -> Result<Option<JoinMaterial>> {
        Ok(None)
    }
    async fn remove_node(&self, node: &str) -> Result<()> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("delete node {node}"));
        Ok(())
    }
    async fn node_status(&self, _: &str) -> Result<Option<String>> {
        Ok(Some(
            if *self.not_ready.lock().unwrap() {
                "Unknown"
            } else {
                "Ready"
            }
            .into(),
        ))
    }
    async fn node_statuses(&self) -> Result<Vec<(String, String)>> {
        Ok(Vec::new())
    }
    fn attached(&self) -> bool {
        true
    }
    async fn remove_taint(&self, _: &str, _: &str) -> Result<bool> {
        Ok(false)
    }
    async fn cordon(&self, node: &str) -> Result<bool> {
        self.calls.lock().unwrap().push(format!("cordon {node}"));
        Ok(true)
    }
    async fn node_pods(&self, node: &str) -> Result<Vec<PodFacts>> {
        Ok(self
            .pods
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.node == node)
            .cloned()
            .collect())
    }
    async fn evict_pod(&self, namespace: &str, name: &str) -> Result<Eviction> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("evict {namespace}/{name}"));
        let protected = name.starts_with("web");
        if protected && !*self.allow.lock().unwrap() {
            return Ok(Eviction::Refused(
                "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            ));
        }
        let mut pods = self.pods.lock().unwrap();
        match pods.iter_mut().find(|p| p.name == name) {
            Some(p) => {
                p.deletion_ms = Some(NOW);
                Ok(Eviction::Evicted)
            }
            None => Ok(Eviction::Gone),
        }
    }
    async fn delete_pod(&self, namespace: &str, name: &str) -> Result<()> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("delete {namespace}/{name}"));
        Ok(())
    }
    async fn budgets(&self, namespace: &str) -> Result<Vec<BudgetFacts>> {
        Ok(vec![BudgetFacts {
            namespace: namespace.into(),
            name: "web".into(),
            has_selector: true,
            match_labels: [("app".to_string(), "web".to_string())].into(),
            rule: Some("minAvailable 2".into()),
            disruptions_allowed: Some(0),
            ..BudgetFacts::default()
        }])
    }
}

#[tokio::test]
async fn a_pass_cordons_evicts_and_never_deletes_unless_forced() {
    let api = FakeApi::default();
    *api.pods.lock().unwrap() = vec![
        pod("web-1"),
        PodFacts {
            labels: BTreeMap::new(),
            ..pod("batch-1")
        },
        PodFacts {
            daemon_set: true,
            ..pod("fluentd")
        },
        PodFacts {
            mirror: true,
            ..pod("etcd")
        },
        PodFacts {
            node: "n2".into(),
            ..pod("elsewhere")
        },
    ];
    let facts = pass(&api, "n1", false, NOW, SKIP).await.unwrap();
    assert_eq!(facts.blocking, vec!["shop/web-1", "shop/batch-1"]);
    assert_eq!(facts.evicted, vec!["shop/batch-1"]);
    assert_eq!(facts.refused.len(), 1);
    assert_eq!(
        facts.refused[0].budgets,
        vec!["shop/web (minAvailable 2, 0 disruption(s) allowed)"]
    );
    assert_eq!(facts.skipped["DaemonSet"], 1);
    assert_eq!(facts.skipped["mirror"], 1);
    let calls = api.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec!["cordon n1", "evict shop/web-1", "evict shop/batch-1"],
        "cordon first, evictions only, never a delete"
    );
    // The budget allows it now.
    *api.allow.lock().unwrap() = true;
    let facts = pass(&api, "n1", false, NOW, SKIP).await.unwrap();
    assert_eq!(facts.evicted, vec!["shop/web-1"]);
    assert!(facts.refused.is_empty());
    // Both terminating: they still block until gone.
    let facts = pass(&api, "n1", false, NOW, SKIP).await.unwrap();
    assert_eq!(facts.blocking.len(), 2);
    assert!(facts.evicted.is_empty());

    // Forced: a pod left is deleted, not evicted.
    api.calls.lock().unwrap().clear();
    *api.pods.lock().unwrap() = vec![pod("web-9")];
    let facts = pass(&api, "n1", true, NOW, SKIP).await.unwrap();
    assert_eq!(facts.deleted, vec!["shop/web-9"]);
    assert_eq!(
        api.calls.lock().unwrap().clone(),
        vec!["cordon n1", "delete shop/web-9"]
    );
}

fn control_plane(store: crate::store::Store, api: Arc<FakeApi>) -> Arc<ControlPlane> {
    let dir = std::env::temp_dir();
    Arc::new(ControlPlane::new(
        store,
        None,
        api,
        crate::control::Settings::new(dir),
        String::new(),
        String::new(),
        String::new(),
    ))
}

/// A leader change mid-drain, on SQLite and PostgreSQL: leader A starts
/// the drain (blocked by a budget) and stalls past its lease; B takes the
/// lead. A's next pass is refused at its first write (before any call to
/// the cluster); B resumes the same drain (same start, same state) and
/// ends it once the budget allows.
#[test]
fn a_new_leader_resumes_the_drain_and_the_old_one_is_fenced() {
    use crate::ha::fenced;
    use crate::store::Fence;
    crate::store::testing::on_both_backends(|backend| {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let api = Arc::new(FakeApi::default());
        *api.pods.lock().unwrap() = vec![pod("web-1")];
        let a = control_plane(backend.open(), api.clone());
        let b = control_plane(backend.open(), api.clone());
        a.store
            .insert_pool(&knit_api::NodePool::new(
                "p",
                knit_api::NodePoolSpec::default(),
            ))
            .unwrap();
        let lease_a = a
            .store
            .try_lead("a", now_ms(), 400, false)
            .unwrap()
            .unwrap();
        let fence_a = Fence {
            holder: "a".into(),
            epoch: lease_a.epoch,
        };
        let first = rt
            .block_on(fenced(fence_a.clone(), a.drain_step(5, "p-a", "n1", "p")))
            .unwrap();
        assert!(matches!(first, Progress::Wait(_)));
        let started = a.store.drain("p-a").unwrap().unwrap();
        assert_eq!(started.state, DrainState::Blocked);

        // A stalls past its lease; B leads.
        std::thread::sleep(std::time::Duration::from_millis(500));
        let lease_b = b
            .store
            .try_lead("b", now_ms(), 60_000, false)
            .unwrap()
            .expect("the lapsed lease is taken");
        let fence_b = Fence {
            holder: "b".into(),
            epoch: lease_b.epoch,
        };
        let calls_before = api.calls.lock().unwrap().len();
        let err = rt
            .block_on(fenced(fence_a, a.drain_step(5, "p-a", "n1", "p")))
            .unwrap_err();
        assert_eq!(err.code(), "NotLeader", "{}: {err}", backend.name);
        assert_eq!(
            api.calls.lock().unwrap().len(),
            calls_before,
            "a fenced leader calls the cluster no more"
        );

        // B resumes the drain A started.
        *api.allow.lock().unwrap() = true;
        let resumed = rt
            .block_on(fenced(fence_b.clone(), b.drain_step(5, "p-a", "n1", "p")))
            .unwrap();
        assert!(matches!(resumed, Progress::Wait(_)), "evicted, terminating");
        let d = b.store.drain("p-a").unwrap().unwrap();
        assert_eq!(d.started_ms, started.started_ms, "{}", backend.name);
        assert_eq!(d.evicted, 1);
        api.pods.lock().unwrap().clear();
        let done = rt
            .block_on(fenced(fence_b, b.drain_step(5, "p-a", "n1", "p")))
            .unwrap();
        assert_eq!(done, Progress::Done);
        assert_eq!(
            b.store.drain("p-a").unwrap().unwrap().state,
            DrainState::Drained
        );
    });
}

/// A node whose kubelet is gone: an evicted pod never finishes; 60 s past
/// its due time it no longer blocks, and the drain ends (a Ready node's
/// pod blocks however long it takes).
#[tokio::test]
async fn a_node_that_cannot_confirm_is_drained_60_s_after_the_deletion_was_due() {
    let api = FakeApi::default();
    let stuck = PodFacts {
        deletion_ms: Some(NOW - 61_000),
        ..pod("web-1")
    };
    *api.pods.lock().unwrap() = vec![stuck];
    let ready = pass(&api, "n1", false, NOW, SKIP).await.unwrap();
    assert_eq!(ready.blocking, vec!["shop/web-1"], "a Ready node confirms");
    *api.not_ready.lock().unwrap() = true;
    let gone = pass(&api, "n1", false, NOW, SKIP).await.unwrap();
    assert!(!gone.node_ready);
    assert!(gone.blocking.is_empty(), "{gone:?}");
    assert_eq!(gone.skipped["terminating on a node that cannot confirm"], 1);
    let a = advance(
        &record(DrainState::Draining),
        &gone,
        &DrainSpec::default(),
        NOW,
    );
    assert_eq!(a.record.state, DrainState::Drained);
    // 59 s past: still waited for.
    api.pods.lock().unwrap()[0].deletion_ms = Some(NOW - 59_000);
    let waiting = pass(&api, "n1", false, NOW, SKIP).await.unwrap();
    assert_eq!(waiting.blocking.len(), 1);
    assert!(
        waiting.evicted.is_empty(),
        "a terminating pod is not evicted again"
    );
}
