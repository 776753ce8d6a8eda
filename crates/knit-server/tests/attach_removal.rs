//! An added instance leaving its pool, through a real server on loopback
//! over a fake provider that records its calls: a manual-mode machine (its
//! own OS and services) is put back as before the attach by the agent's undo
//! run inside it and left running; when the undo cannot run it is stopped,
//! with an event saying why (also when it is stopped already); an
//! automatic-mode instance (re-imaged) is stopped; a removal a server left
//! half way is finished by the next one.

mod support;

use knit_api::state::InstanceState;
use knit_api::{NodePool, NodePoolSpec};
use knit_client::Client;
use knit_server::preflight::Mode;
use knit_server::store::{AttachRecord, Enrollment, Store};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{instance, FakeCloud, TestServer, EXEC_FAILURE};

const ID: &str = "i-0000000000a1";
const NAME: &str = "workers-abcde";

struct Harness {
    srv: TestServer,
    cloud: Arc<FakeCloud>,
}

impl Harness {
    /// A running instance `ID`, added to pool `workers` (count 1) in `mode`
    /// and running as a node, written to the store before the server starts.
    fn new(cloud: FakeCloud, mode: Mode) -> Harness {
        let mut srv = TestServer::new();
        srv.settings.reconcile_interval = Duration::from_millis(200);
        srv.write_agent_checksum();
        cloud.add(instance(ID, "own-db", "10.213.0.9"));
        let h = Harness {
            srv,
            cloud: Arc::new(cloud),
        };
        h.enroll(mode);
        h
    }

    fn store(&self) -> Store {
        std::fs::create_dir_all(&self.srv.settings.state_dir).unwrap();
        Store::open(&self.srv.settings.db_path()).unwrap()
    }

    fn enroll(&self, mode: Mode) {
        let store = self.store();
        let mut pool = NodePool::new("workers", NodePoolSpec::default());
        store.insert_pool(&pool).unwrap();
        let record = AttachRecord {
            instance: NAME.into(),
            provider_id: ID.into(),
            pool: "workers".into(),
            mode,
            instance_name: "own-db".into(),
            keep_instance_name: true,
            format_data_disk: false,
            old_disks: vec![format!("d-{ID}")],
            new_disks: vec![format!("d-{ID}")],
            at_ms: 1,
            reimaged_ms: None,
            new_password: false,
        };
        store.put_attach_record(&record).unwrap();
        pool.spec.replicas = 1;
        store
            .enroll_attached(
                &Enrollment {
                    name: NAME,
                    pool: &pool,
                    provider_id: ID,
                    ip: Some("10.213.0.9"),
                    instance_type: "ecs.g7.large",
                    state: InstanceState::Running,
                    record: None,
                },
                false,
            )
            .unwrap();
    }

    fn start(&mut self) {
        self.srv.start(Some(self.cloud.clone()));
    }

    fn client(&self) -> &Client {
        self.srv.client()
    }

    /// `knit delete node NAME` (no `--release`: the instance is kept).
    fn delete_node(&self) {
        let answer = self
            .client()
            .call("DELETE", &format!("/api/v1/nodes/{NAME}"), None)
            .unwrap();
        assert_eq!(answer["release"], false, "{answer}");
    }

    fn wait_detached(&self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let i = self.client().get("/api/v1/instances").unwrap()["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|i| i["providerId"] == ID)
                .cloned()
                .unwrap_or_else(|| panic!("{ID} not in the store"));
            if i["state"] == InstanceState::Detached.as_str() {
                return i;
            }
            assert!(Instant::now() < deadline, "never Detached: {i}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn events(&self) -> Vec<Value> {
        self.client().get("/api/v1/events?limit=200").unwrap()["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn event(&self, reason: &str) -> Option<String> {
        self.events()
            .into_iter()
            .find(|e| e["reason"] == reason)
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
    }

    /// The one call made: the undo run inside the instance by the shell.
    fn assert_undo_ran_once(&self, calls: &[String]) {
        let exec = &calls[0];
        assert!(
            exec.starts_with(&format!("exec {ID} /bin/sh -c "))
                && exec.contains("/var/lib/knit/bootstrap/knit-agent")
                && exec.contains("reset --undo"),
            "{exec}"
        );
    }
}

#[test]
fn a_manual_mode_instance_is_undone_inside_and_left_running() {
    let mut h = Harness::new(FakeCloud::default(), Mode::Manual);
    h.start();
    h.delete_node();
    let i = h.wait_detached();
    assert_eq!(i["added"], true, "{i}");
    let calls = h.cloud.changes();
    assert_eq!(calls.len(), 1, "the undo only, no stop: {calls:?}");
    h.assert_undo_ran_once(&calls);
    assert_eq!(h.cloud.state(ID), "running");
    assert_eq!(h.srv.replicas("workers"), 0);
    let detached = h.event("Detached").expect("a Detached event");
    assert!(
        detached.contains("keeps it running") && detached.contains("reset --undo"),
        "{detached}"
    );
    assert!(h.event("UndoFailed").is_none());
    // Nothing more on later passes, and it can be attached again.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(h.cloud.changes().len(), 1, "{:?}", h.cloud.changes());
    let body = serde_json::json!({"instances": [ID], "keepInstanceName": true, "dryRun": true});
    let answer = h
        .client()
        .call(
            "POST",
            "/api/v1/pools/workers/attach",
            Some(&body.to_string()),
        )
        .unwrap();
    assert_eq!(answer["passed"], true, "{answer}");
}

#[test]
fn when_the_undo_fails_the_instance_is_stopped_and_an_event_says_why() {
    let mut h = Harness::new(FakeCloud::failing_exec(), Mode::Manual);
    h.start();
    h.delete_node();
    h.wait_detached();
    let calls = h.cloud.changes();
    assert_eq!(calls.len(), 2, "{calls:?}");
    h.assert_undo_ran_once(&calls);
    assert_eq!(calls[1], format!("stop {ID}"));
    assert_eq!(h.cloud.state(ID), "stopped");
    let why = h.event("UndoFailed").expect("an UndoFailed event");
    assert!(
        why.contains(ID)
            && why.contains("exited with 1")
            && why.contains(EXEC_FAILURE)
            && why.contains("stopping it instead"),
        "{why}"
    );
    let detached = h.event("Detached").expect("a Detached event");
    assert!(detached.contains("stopped, not released"), "{detached}");
}

#[test]
fn an_automatic_mode_instance_is_stopped_without_an_undo() {
    let mut h = Harness::new(FakeCloud::default(), Mode::Automatic);
    h.start();
    h.delete_node();
    h.wait_detached();
    assert_eq!(h.cloud.changes(), vec![format!("stop {ID}")]);
    assert!(h.event("UndoFailed").is_none());
}

#[test]
fn a_removal_left_by_a_stopped_server_is_finished_by_the_next_one() {
    let mut h = Harness::new(FakeCloud::default(), Mode::Manual);
    // What a server that died mid-removal left: the instance Deleting, the
    // pool's count lowered, a pending delete intent that keeps it.
    let store = h.store();
    let mut pool = store.pool("workers").unwrap().unwrap().pool;
    pool.spec.replicas = 0;
    store.update_pool(&pool).unwrap();
    assert_eq!(
        store
            .add_delete_intents("workers", &[NAME.to_string()], false)
            .unwrap(),
        1
    );
    drop(store);
    h.start();
    h.wait_detached();
    let calls = h.cloud.changes();
    assert_eq!(calls.len(), 1, "the undo only, no stop: {calls:?}");
    h.assert_undo_ran_once(&calls);
    assert_eq!(h.cloud.state(ID), "running");
    assert_eq!(h.srv.replicas("workers"), 0);
}

#[test]
fn a_stopped_manual_mode_instance_stays_stopped_and_an_event_says_so() {
    let mut h = Harness::new(FakeCloud::default(), Mode::Manual);
    h.cloud.stop_now(ID);
    h.start();
    h.delete_node();
    h.wait_detached();
    assert!(h.cloud.changes().is_empty(), "{:?}", h.cloud.changes());
    assert_eq!(h.cloud.state(ID), "stopped");
    let why = h.event("UndoFailed").expect("an UndoFailed event");
    assert!(
        why.contains("nothing can run inside it")
            && why.contains("it stays stopped")
            && why.contains("reset --undo"),
        "{why}"
    );
}
