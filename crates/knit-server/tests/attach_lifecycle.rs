//! The lifecycle of an automatic attach around failures, through a real
//! server on loopback over a fake provider: an attach left half way by a
//! server that stopped (its intent in the store) is resumed by the next
//! server — rolled forward, or undone when it cannot be — and a re-image
//! that fails undoes the add, once.

mod support;

use knit_api::state::InstanceState;
use knit_api::{NodePool, NodePoolSpec};
use knit_client::Client;
use knit_server::preflight::{InstanceFacts, Mode};
use knit_server::store::{AttachRecord, Enrollment, Store};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{instance, FakeCloud, TestServer};

struct Harness {
    srv: TestServer,
    cloud: Arc<FakeCloud>,
}

impl Harness {
    fn new(cloud: FakeCloud) -> Harness {
        let mut srv = TestServer::new();
        srv.settings.reconcile_interval = Duration::from_millis(200);
        srv.write_agent_checksum();
        Harness {
            srv,
            cloud: Arc::new(cloud),
        }
    }

    fn start(&mut self) {
        self.srv.start(Some(self.cloud.clone()));
    }

    fn client(&self) -> &Client {
        self.srv.client()
    }

    /// An instance named `own-<id>` in `state`.
    fn add(&self, id: &str, ip: &str, state: &str) {
        self.cloud.add(InstanceFacts {
            state: state.into(),
            ..instance(id, &format!("own-{id}"), ip)
        });
    }

    /// What a server that stopped after enrolling `id` and stopping it
    /// left behind: the attach record, the instance `Creating` with the
    /// pool's count raised once, and a pending attach intent.
    fn leave_an_interrupted_attach(&self, id: &str) {
        std::fs::create_dir_all(&self.srv.settings.state_dir).unwrap();
        let store = Store::open(&self.srv.settings.db_path()).unwrap();
        let mut pool = NodePool::new("workers", NodePoolSpec::default());
        store.insert_pool(&pool).unwrap();
        let record = AttachRecord {
            instance: "workers-abcde".into(),
            provider_id: id.into(),
            pool: "workers".into(),
            mode: Mode::Automatic,
            instance_name: format!("own-{id}"),
            keep_instance_name: true,
            format_data_disk: false,
            old_disks: vec![format!("d-{id}")],
            new_disks: Vec::new(),
            at_ms: 1,
            reimaged_ms: None,
            new_password: false,
        };
        store.put_attach_record(&record).unwrap();
        pool.spec.replicas = 1;
        store
            .enroll_attached(
                &Enrollment {
                    name: "workers-abcde",
                    pool: &pool,
                    provider_id: id,
                    ip: Some("10.213.0.7"),
                    instance_type: "ecs.g7.large",
                    state: InstanceState::Creating,
                    record: None,
                },
                true,
            )
            .unwrap();
    }

    fn instance(&self, provider_id: &str) -> Value {
        self.client().get("/api/v1/instances").unwrap()["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["providerId"] == provider_id)
            .cloned()
            .unwrap_or_else(|| panic!("{provider_id} not in the store"))
    }

    fn wait_state(&self, provider_id: &str, want: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let i = self.instance(provider_id);
            if i["state"] == want {
                return i;
            }
            assert!(Instant::now() < deadline, "never {want}: {i}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn replicas(&self) -> i64 {
        self.srv.replicas("workers")
    }

    fn events(&self) -> String {
        self.client()
            .get("/api/v1/events?limit=200")
            .unwrap()
            .to_string()
    }
}

#[test]
fn an_interrupted_attach_is_rolled_forward_by_the_next_server() {
    let mut h = Harness::new(FakeCloud::default());
    h.add("i-000000000001", "10.213.0.7", "stopped");
    h.leave_an_interrupted_attach("i-000000000001");
    h.start();
    let i = h.wait_state("i-000000000001", InstanceState::Running.as_str());
    assert_eq!(i["added"], true, "{i}");
    assert_eq!(
        h.cloud.changes(),
        vec![format!(
            "reimage i-000000000001 {}",
            knit_api::DEFAULT_IMAGE
        )],
        "stopped already: re-imaged once, nothing else"
    );
    assert_eq!(
        h.replicas(),
        1,
        "the count was raised once, by the enrollment"
    );
    let events = h.events();
    assert!(events.contains("AttachResuming"), "{events}");
    assert!(
        events.contains("d-i-000000000001 -> d-i-000000000001-new"),
        "{events}"
    );
    // Nothing is left to resume: another pass changes nothing.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(h.cloud.changes().len(), 1, "{:?}", h.cloud.changes());
}

#[test]
fn an_interrupted_attach_whose_instance_is_gone_is_undone() {
    let mut h = Harness::new(FakeCloud::default());
    h.leave_an_interrupted_attach("i-00000000dead");
    h.start();
    let i = h.wait_state("i-00000000dead", InstanceState::Detached.as_str());
    let why = i["lastError"].as_str().unwrap_or_default();
    assert!(
        why.contains("no longer exists") && why.contains("the add was undone"),
        "{why}"
    );
    assert_eq!(h.replicas(), 0, "the count is back");
    assert!(h.events().contains("AttachFailed"));
    assert!(h.cloud.changes().is_empty(), "{:?}", h.cloud.changes());
}

#[test]
fn a_failed_reimage_undoes_the_add_and_the_instance_can_be_attached_again() {
    let mut h = Harness::new(FakeCloud::failing_reimage());
    h.add("i-000000000002", "10.213.0.8", "running");
    h.start();
    h.client()
        .call(
            "POST",
            "/api/v1/pools",
            Some("apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {name: workers}\nspec: {replicas: 0}\n"),
        )
        .unwrap();
    let body = serde_json::json!({"instances": ["i-000000000002"], "keepInstanceName": true});
    let answer = h
        .client()
        .call(
            "POST",
            "/api/v1/pools/workers/attach",
            Some(&body.to_string()),
        )
        .unwrap();
    assert_eq!(answer["passed"], false, "{answer}");
    assert!(
        answer["attached"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("the re-image broke")),
        "{answer}"
    );
    let i = h.wait_state("i-000000000002", InstanceState::Detached.as_str());
    assert!(
        i["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("the re-image broke")),
        "{i}"
    );
    assert_eq!(h.replicas(), 0, "the count is back, once");
    assert!(h.events().contains("AttachFailed"));
    // Not counted in the pool any more: the preflight lets it in again.
    let dry = serde_json::json!({"instances": ["i-000000000002"], "dryRun": true});
    let answer = h
        .client()
        .call(
            "POST",
            "/api/v1/pools/workers/attach",
            Some(&dry.to_string()),
        )
        .unwrap();
    assert_eq!(answer["passed"], true, "{answer}");
}
