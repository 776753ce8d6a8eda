//! The join timeout covers only the way to a node's first Ready; node
//! repair (a pool's `spec.repair`) acts after that, step by step, within its
//! safety limits; a scale keeps its release choice; one instance whose
//! files cannot be read holds up no other.
//!
//! The control plane runs for real (SQLite store, reconciler, planner);
//! the provider and the cluster are test doubles behind their traits: a
//! fake cloud that records every call and a cluster whose node statuses the
//! test sets. Time is passed in (`plan_all_at`, `repair_all_at`), so no
//! test sleeps or asserts on timing.

use async_trait::async_trait;
use knit_api::state::InstanceState;
use knit_api::{NodePool, NodePoolSpec, PhaseEvent, PhaseName, PhaseOutcome};
use knit_server::provider::{InstanceTemplate, Provider, ProviderInstance, ProviderSnapshot};
use knit_server::store::{Enrollment, Store};
use knit_server::{ClusterJoin, ControlPlane, JoinMaterial, ServerError, Settings};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

type Result<T> = std::result::Result<T, ServerError>;

const MIN: i64 = 60_000;

/// Running fake instances; every call recorded as `"<call> <id>"`.
/// `read_file` of a path listed in `hang` never answers; of one listed in
/// `endless` it answers more than any limit.
#[derive(Default)]
struct Cloud {
    calls: Mutex<Vec<String>>,
    instances: Mutex<BTreeMap<String, String>>,
    files: Mutex<HashMap<String, Vec<u8>>>,
    hang: Mutex<Vec<String>>,
    endless: Mutex<Vec<String>>,
}

impl Cloud {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }
}

fn refuse<T>(what: &str) -> Result<T> {
    Err(ServerError::from(
        knit_server::provider::ProviderError::failed(
            "fake",
            format!("{what} is not part of this test"),
        ),
    ))
}

#[async_trait]
impl Provider for Cloud {
    fn name(&self) -> &str {
        "fake"
    }
    async fn create(&self, _t: &InstanceTemplate) -> Result<ProviderInstance> {
        refuse("create")
    }
    async fn get(&self, id: &str) -> Result<Option<ProviderInstance>> {
        Ok(self
            .instances
            .lock()
            .unwrap()
            .get(id)
            .map(|state| ProviderInstance {
                id: id.to_string(),
                name: None,
                state: state.clone(),
                ip: None,
                tags: BTreeMap::new(),
            }))
    }
    async fn list(&self) -> Result<Vec<ProviderInstance>> {
        Ok(Vec::new())
    }
    async fn start(&self, id: &str) -> Result<()> {
        self.record(format!("start {id}"));
        Ok(())
    }
    async fn stop(&self, id: &str) -> Result<()> {
        self.record(format!("stop {id}"));
        Ok(())
    }
    async fn reimage(&self, _id: &str, _image: &str, _user_data: &str) -> Result<()> {
        refuse("reimage")
    }
    async fn check_image(&self, _image: &str) -> Result<()> {
        Ok(())
    }
    async fn rename(&self, _id: &str, _name: &str) -> Result<()> {
        refuse("rename")
    }
    async fn set_password(&self, _id: &str, _password: &str) -> Result<()> {
        refuse("set_password")
    }
    async fn delete(&self, id: &str) -> Result<()> {
        self.record(format!("delete {id}"));
        self.instances.lock().unwrap().remove(id);
        Ok(())
    }
    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>> {
        self.record(format!("read {id} {path}"));
        if self.hang.lock().unwrap().iter().any(|h| h == id) {
            // A reader stuck in open(2) on a FIFO: never answers.
            std::future::pending::<()>().await;
        }
        if self.endless.lock().unwrap().iter().any(|h| h == id) {
            return Ok(vec![0; knit_server::USER_DATA_RESULT_MAX_BYTES + 1]);
        }
        self.files
            .lock()
            .unwrap()
            .get(&format!("{id}:{path}"))
            .cloned()
            .ok_or_else(|| {
                ServerError::from(knit_server::provider::ProviderError::failed(
                    "fake",
                    format!("{path}: No such file or directory"),
                ))
            })
    }
    async fn snapshot_create(&self, _id: &str, _i: usize, _n: &str) -> Result<ProviderSnapshot> {
        refuse("snapshot_create")
    }
    async fn snapshot_delete(&self, _id: &str) -> Result<()> {
        refuse("snapshot_delete")
    }
    async fn exec(&self, id: &str, argv: &[String]) -> Result<(i32, Vec<u8>, Vec<u8>)> {
        self.record(format!("exec {id} {}", argv.join(" ")));
        Ok((
            0,
            b"restarted containerd\nrestarted kubelet\n".to_vec(),
            Vec::new(),
        ))
    }
}

/// A cluster whose nodes' Ready conditions the test sets.
#[derive(Default)]
struct Cluster {
    statuses: Mutex<BTreeMap<String, String>>,
}

impl Cluster {
    fn set(&self, node: &str, status: &str) {
        self.statuses
            .lock()
            .unwrap()
            .insert(node.to_string(), status.to_string());
    }
}

#[async_trait]
impl ClusterJoin for Cluster {
    async fn join_material(&self, _pool: &str, _node_hint: &str) -> Result<Option<JoinMaterial>> {
        Ok(None)
    }
    async fn remove_node(&self, node: &str) -> Result<()> {
        self.statuses.lock().unwrap().remove(node);
        Ok(())
    }
    async fn node_status(&self, node: &str) -> Result<Option<String>> {
        Ok(self.statuses.lock().unwrap().get(node).cloned())
    }
    async fn node_statuses(&self) -> Result<Vec<(String, String)>> {
        Ok(self
            .statuses
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
    fn attached(&self) -> bool {
        true
    }
    async fn remove_taint(&self, _node: &str, _key: &str) -> Result<bool> {
        Ok(true)
    }
}

struct Env {
    cp: Arc<ControlPlane>,
    cloud: Arc<Cloud>,
    cluster: Arc<Cluster>,
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        Env::open(
            dir,
            Arc::new(Cloud::default()),
            Arc::new(Cluster::default()),
        )
    }

    /// A control plane over the state in `dir` (again after a "restart").
    fn open(dir: tempfile::TempDir, cloud: Arc<Cloud>, cluster: Arc<Cluster>) -> Env {
        let store = Store::open(&dir.path().join("knit.db")).unwrap();
        let cp = Arc::new(ControlPlane::new(
            store,
            Some(cloud.clone() as Arc<dyn Provider>),
            cluster.clone(),
            Settings::new(dir.path().to_path_buf()),
            String::new(),
            String::new(),
            String::new(),
        ));
        Env {
            cp,
            cloud,
            cluster,
            dir,
        }
    }

    fn restart(self) -> Env {
        let Env {
            cp,
            cloud,
            cluster,
            dir,
        } = self;
        drop(cp);
        Env::open(dir, cloud, cluster)
    }

    fn pool(&self, name: &str, replicas: i64, edit: impl FnOnce(&mut NodePoolSpec)) -> NodePool {
        let mut spec = NodePoolSpec {
            replicas,
            join_timeout_seconds: 60,
            auto_replace: true,
            ..NodePoolSpec::default()
        };
        edit(&mut spec);
        let pool = NodePool::new(name, spec);
        pool.validate().unwrap();
        self.cp.store().insert_pool(&pool).unwrap();
        pool
    }

    /// A running instance `name` (provider id `i-<name>`) of `pool`; its
    /// node, also `name`, reports every phase done.
    fn running(&self, pool: &str, name: &str) {
        let store = &self.cp.store();
        store
            .add_create_intents(pool, &[(name.to_string(), "t".to_string())])
            .unwrap();
        let id = format!("i-{name}");
        store.set_instance_created(name, &id, None).unwrap();
        for intent in store.pending_intents().unwrap() {
            store
                .finish_intent(intent.id, knit_api::state::IntentStatus::Done, None)
                .unwrap();
        }
        self.cloud
            .instances
            .lock()
            .unwrap()
            .insert(id, "Running".into());
        self.report_initialized(name);
    }

    fn report_initialized(&self, name: &str) {
        let instance = self.cp.store().instance(name).unwrap().unwrap();
        self.cp
            .store()
            .record_phase_event(
                &instance,
                &PhaseEvent {
                    node: name.to_string(),
                    instance_id: format!("i-{name}"),
                    phase: PhaseName::Hardening,
                    outcome: PhaseOutcome::Done,
                    reason: None,
                    error_code: None,
                    at_ms: 0,
                    duration_ms: Some(1),
                },
            )
            .unwrap();
    }

    /// The cluster says `status` for `node`; the control plane reads it
    /// and plans (and repairs) as at `now`.
    async fn observe(&self, node: &str, status: &str, now: i64) {
        self.cluster.set(node, status);
        self.pass(now).await;
    }

    async fn all_ready(&self, nodes: &[&str], now: i64) {
        for n in nodes {
            self.cluster.set(n, "Ready");
        }
        self.pass(now).await;
    }

    async fn pass(&self, now: i64) {
        self.cp.sync_node_statuses().await.unwrap();
        self.cp.plan_all_at(now).await.unwrap();
        for handle in self.cp.repair_all_at(now).await.unwrap() {
            handle.await.unwrap();
        }
    }

    fn state(&self, name: &str) -> InstanceState {
        self.cp.store().instance(name).unwrap().unwrap().state
    }

    fn deletes(&self) -> Vec<(String, bool)> {
        self.cp
            .store()
            .pending_intents()
            .unwrap()
            .into_iter()
            .filter(|i| i.action == knit_api::state::IntentAction::Delete)
            .map(|i| (i.instance, i.release))
            .collect()
    }

    /// (reason, object, message) of every event, oldest first.
    fn events(&self) -> Vec<(String, String, String)> {
        let mut all = self.cp.store().events(1000).unwrap();
        all.sort_by_key(|e| e.id);
        all.into_iter()
            .map(|e| (e.reason, e.object_name, e.message))
            .collect()
    }

    fn reasons_for(&self, object: &str) -> Vec<String> {
        self.events()
            .into_iter()
            .filter(|(_, o, _)| o == object)
            .map(|(r, _, _)| r)
            .collect()
    }
}

/// Created at real time `t0`; every time below is relative to it.
fn t0(env: &Env, name: &str) -> i64 {
    env.cp.store().instance(name).unwrap().unwrap().created_ms
}

#[tokio::test]
async fn a_node_ready_once_is_never_failed_by_the_join_timeout() {
    let env = Env::new();
    env.pool("p", 1, |_| {});
    env.running("p", "p-a");
    let t = t0(&env, "p-a");
    env.observe("p-a", "Ready", t + 10_000).await;
    // Ready for 3 minutes, then kubelet stops: NotReady well past the
    // pool's 60 s join timeout.
    env.observe("p-a", "NotReady", t + 3 * MIN).await;
    env.observe("p-a", "NotReady", t + 4 * MIN).await;
    env.observe("p-a", "Unknown", t + 30 * MIN).await;
    assert_eq!(env.state("p-a"), InstanceState::Running);
    assert_eq!(env.deletes(), vec![], "nothing released");
    assert!(
        !env.reasons_for("p-a").iter().any(|r| r == "JoinTimeout"),
        "{:?}",
        env.events()
    );
    assert!(env.cloud.calls().is_empty(), "{:?}", env.cloud.calls());
    // Across a restart too: the first join is stored.
    let env = env.restart();
    env.pass(t + 60 * MIN).await;
    assert_eq!(env.state("p-a"), InstanceState::Running);
    assert_eq!(env.deletes(), vec![]);
}

#[tokio::test]
async fn the_join_timeout_still_fails_a_node_that_never_became_ready() {
    let env = Env::new();
    env.pool("p", 1, |_| {});
    env.running("p", "p-a");
    let t = t0(&env, "p-a");
    env.observe("p-a", "NotReady", t + 30_000).await;
    assert_eq!(
        env.state("p-a"),
        InstanceState::Running,
        "within the timeout"
    );
    env.observe("p-a", "NotReady", t + 61_000).await;
    assert_eq!(
        env.deletes(),
        vec![("p-a".to_string(), true)],
        "autoReplace"
    );
    assert!(env.reasons_for("p-a").contains(&"JoinTimeout".to_string()));
}

#[tokio::test]
async fn a_node_failed_by_the_join_timeout_that_becomes_ready_recovers() {
    let env = Env::new();
    env.pool("p", 1, |s| s.auto_replace = false);
    env.running("p", "p-a");
    let t = t0(&env, "p-a");
    env.observe("p-a", "NotReady", t + 61_000).await;
    assert_eq!(env.state("p-a"), InstanceState::Failed);
    env.observe("p-a", "Ready", t + 70_000).await;
    assert_eq!(
        env.state("p-a"),
        InstanceState::Running,
        "not Failed for good"
    );
    let reasons = env.reasons_for("p-a");
    assert!(reasons.contains(&"Recovered".to_string()), "{reasons:?}");
    // And it is joined now: NotReady later is not a join timeout.
    env.observe("p-a", "NotReady", t + 10 * MIN).await;
    assert_eq!(env.state("p-a"), InstanceState::Running);
}

#[tokio::test]
async fn an_instance_failed_by_the_join_timeout_before_the_upgrade_recovers_too() {
    let env = Env::new();
    env.pool("p", 2, |s| s.auto_replace = false);
    env.running("p", "p-a");
    env.running("p", "p-b");
    // Failed by an older server: no stored time, only its message.
    env.cp
        .store()
        .set_instance_state(
            "p-a",
            InstanceState::Failed,
            Some("not initialized 60 s after creation; last phase join started"),
        )
        .unwrap();
    // A failure of another kind stays.
    env.cp
        .store()
        .set_instance_state(
            "p-b",
            InstanceState::Failed,
            Some("gave up after 5 attempt(s)"),
        )
        .unwrap();
    let t = t0(&env, "p-a");
    env.observe("p-a", "Ready", t + 20 * MIN).await;
    assert_eq!(env.state("p-a"), InstanceState::Running);
    env.observe("p-b", "Ready", t + 21 * MIN).await;
    assert_eq!(env.state("p-b"), InstanceState::Failed);
}

fn repair(spec: &mut NodePoolSpec) {
    spec.repair.enabled = true;
    spec.repair.not_ready_after_seconds = 600;
    spec.repair.wait_after_action_seconds = 300;
}

#[tokio::test]
async fn repair_restarts_then_reboots_then_replaces_and_survives_a_restart() {
    let env = Env::new();
    env.pool("p", 3, repair);
    for n in ["p-a", "p-b", "p-c"] {
        env.running("p", n);
    }
    let t = t0(&env, "p-c");
    env.all_ready(&["p-a", "p-b", "p-c"], t + 30_000).await;
    env.observe("p-a", "NotReady", t + 10 * MIN).await;
    // Not Ready 9 min < notReadyAfterSeconds: untouched.
    env.pass(t + 19 * MIN).await;
    assert!(env.cloud.calls().is_empty(), "{:?}", env.cloud.calls());

    env.pass(t + 20 * MIN).await;
    let calls = env.cloud.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        calls[0].starts_with(
            "exec i-p-a /bin/sh -c exec /var/lib/knit/bootstrap/knit-agent restart-services"
        ),
        "{calls:?}"
    );
    // Within the wait after the restart: nothing more.
    env.pass(t + 24 * MIN).await;
    assert_eq!(env.cloud.calls().len(), 1);

    // A restart of the server keeps the step taken.
    let env = env.restart();
    env.pass(t + 25 * MIN).await;
    assert_eq!(
        env.cloud.calls()[1..],
        [
            "stop i-p-a".to_string(),
            "start i-p-a".to_string(),
            "exec i-p-a /bin/sh -c exec /var/lib/knit/bootstrap/knit-agent init --config /var/lib/knit/bootstrap/node-config.yaml".to_string()
        ],
        "rebooted next (and the agent's services started again), restart-services not taken twice"
    );
    env.pass(t + 29 * MIN).await;
    assert_eq!(env.deletes(), vec![]);
    env.pass(t + 30 * MIN).await;
    assert_eq!(env.deletes(), vec![("p-a".to_string(), true)], "replaced");
    let steps: Vec<String> = env
        .reasons_for("p-a")
        .into_iter()
        .filter(|r| r.starts_with("Repair"))
        .collect();
    assert_eq!(
        steps,
        vec![
            "Repairing",
            "RepairActionDone",
            "Repairing",
            "RepairActionDone",
            "Repairing",
            "RepairReplacing"
        ]
    );
    let messages: Vec<String> = env
        .events()
        .into_iter()
        .filter(|(r, o, _)| o == "p-a" && r == "Repairing")
        .map(|(_, _, m)| m)
        .collect();
    assert!(
        messages[0].contains("1/3: restart-services"),
        "{messages:?}"
    );
    assert!(messages[1].contains("2/3: reboot"), "{messages:?}");
    assert!(messages[2].contains("3/3: replace"), "{messages:?}");
    // The healthy ones were never touched.
    assert!(
        env.cloud.calls().iter().all(|c| c.contains("i-p-a")),
        "{:?}",
        env.cloud.calls()
    );
}

#[tokio::test]
async fn a_node_that_recovers_on_its_own_is_never_touched() {
    let env = Env::new();
    env.pool("p", 2, repair);
    env.running("p", "p-a");
    env.running("p", "p-b");
    let t = t0(&env, "p-b");
    env.all_ready(&["p-a", "p-b"], t + 30_000).await;
    env.observe("p-a", "NotReady", t + 2 * MIN).await;
    env.pass(t + 11 * MIN).await;
    env.observe("p-a", "Ready", t + 12 * MIN).await;
    // Hours later, Ready all along: nothing was done.
    env.pass(t + 300 * MIN).await;
    assert!(env.cloud.calls().is_empty(), "{:?}", env.cloud.calls());
    assert!(!env
        .reasons_for("p-a")
        .iter()
        .any(|r| r.starts_with("Repair")));

    // A node that comes back after the first action ends the repair there.
    env.observe("p-a", "NotReady", t + 301 * MIN).await;
    env.pass(t + 312 * MIN).await;
    assert_eq!(env.cloud.calls().len(), 1, "restart-services");
    env.observe("p-a", "Ready", t + 313 * MIN).await;
    env.pass(t + 400 * MIN).await;
    assert_eq!(env.cloud.calls().len(), 1, "no reboot after it recovered");
    assert!(env.reasons_for("p-a").contains(&"Repaired".to_string()));
}

#[tokio::test]
async fn max_unhealthy_stops_mass_remediation() {
    let env = Env::new();
    env.pool("p", 6, repair); // maxUnhealthy 33% of 6 = 2
    let names: Vec<String> = (0..6).map(|i| format!("p-{i}")).collect();
    for n in &names {
        env.running("p", n);
    }
    let t = t0(&env, "p-5");
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    env.all_ready(&all, t + 30_000).await;
    // An outage: every node's lease lapses at once.
    for n in &names {
        env.cluster.set(n, "Unknown");
    }
    env.pass(t + 2 * MIN).await;
    env.pass(t + 60 * MIN).await;
    env.pass(t + 120 * MIN).await;
    assert!(env.cloud.calls().is_empty(), "{:?}", env.cloud.calls());
    assert_eq!(env.deletes(), vec![]);
    let paused: Vec<(String, String, String)> = env
        .events()
        .into_iter()
        .filter(|(r, _, _)| r == "RepairPaused")
        .collect();
    assert_eq!(paused.len(), 1, "one event, not one per node and pass");
    assert!(
        paused[0]
            .2
            .contains("6 of the pool's 6 nodes are unhealthy")
            && paused[0].2.contains("maxUnhealthy \"33%\" (2)"),
        "{}",
        paused[0].2
    );
    // Four come back: two left, within the limit, one at a time.
    for n in &names[2..] {
        env.cluster.set(n, "Ready");
    }
    env.pass(t + 121 * MIN).await;
    let calls = env.cloud.calls();
    assert_eq!(calls.len(), 1, "maxParallel 1: {calls:?}");
    assert!(calls[0].starts_with("exec i-p-0 "), "{calls:?}");
}

#[tokio::test]
async fn an_added_instance_is_never_released_by_repair() {
    let env = Env::new();
    let pool = env.pool("p", 1, repair);
    env.running("p", "p-ours");
    let mut pool = pool;
    pool.spec.replicas = 2;
    env.cp
        .store()
        .enroll_attached(
            &Enrollment {
                name: "p-mine",
                pool: &pool,
                provider_id: "i-p-mine",
                ip: None,
                instance_type: "t",
                state: InstanceState::Running,
                record: None,
            },
            false,
        )
        .unwrap();
    env.report_initialized("p-mine");
    let t = t0(&env, "p-mine");
    env.all_ready(&["p-ours", "p-mine"], t + 30_000).await;
    env.observe("p-mine", "NotReady", t + 2 * MIN).await;
    for minutes in [12, 17, 22, 27, 32, 60] {
        env.pass(t + minutes * MIN).await;
    }
    assert_eq!(
        env.cloud.calls().len(),
        4,
        "restart-services and reboot (stop, start, init): {:?}",
        env.cloud.calls()
    );
    assert_eq!(env.deletes(), vec![], "never released");
    assert_eq!(env.state("p-mine"), InstanceState::Running);
    let reasons = env.reasons_for("p-mine");
    assert_eq!(
        reasons.iter().filter(|r| *r == "NotReplacing").count(),
        1,
        "{reasons:?}"
    );
}

#[tokio::test]
async fn a_stuck_or_endless_result_file_holds_up_no_other_instance() {
    let env = Env::new();
    // With user data: a pool without any shows "none", not "succeeded".
    env.pool("p", 3, |s| s.user_data = "echo hi".into());
    for n in ["p-fifo", "p-zero", "p-fine"] {
        env.running("p", n);
    }
    env.cloud.hang.lock().unwrap().push("i-p-fifo".into());
    env.cloud.endless.lock().unwrap().push("i-p-zero".into());
    env.cloud.files.lock().unwrap().insert(
        format!("i-p-fine:{}", knit_server::USER_DATA_RESULT),
        br#"{"v1": {"errors": []}}"#.to_vec(),
    );
    env.cp.check_user_data().await.unwrap();
    let node = |n: &str| env.cp.store().node(n).unwrap().unwrap().user_data;
    assert_eq!(node("p-fine").as_deref(), Some("succeeded"));
    assert_eq!(node("p-fifo"), None);
    assert_eq!(node("p-zero"), None);
    let unreadable: Vec<(String, String)> = env
        .events()
        .into_iter()
        .filter(|(r, _, _)| r == "UserDataUnreadable")
        .map(|(_, o, m)| (o, m))
        .collect();
    assert_eq!(unreadable.len(), 2, "{unreadable:?}");
    let about = |n: &str| &unreadable.iter().find(|(o, _)| o == n).unwrap().1;
    assert!(
        about("p-fifo").contains("did not finish within 10 s"),
        "{}",
        about("p-fifo")
    );
    assert!(
        about("p-zero").contains("larger than"),
        "{}",
        about("p-zero")
    );
    // Not read again on the next pass: tried later, with backoff.
    let reads = env.cloud.calls().len();
    env.cp.check_user_data().await.unwrap();
    assert_eq!(env.cloud.calls().len(), reads);
}
