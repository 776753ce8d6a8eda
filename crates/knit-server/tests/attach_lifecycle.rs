//! The lifecycle of an automatic attach around failures, through a real
//! server on loopback over a fake provider: an attach left half way by a
//! server that stopped (its intent in the store) is resumed by the next
//! server — rolled forward, or undone when it cannot be — and a re-image
//! that fails undoes the add, once.

use async_trait::async_trait;
use knit_api::{NodePool, NodePoolSpec};
use knit_server::attach::AttachRecord;
use knit_server::bootstrap::NoCluster;
use knit_server::client::{Client, ClientConfig};
use knit_server::preflight::{DiskFacts, InstanceFacts, Mode, SecurityGroupFacts};
use knit_server::provider::{InstanceTemplate, Provider, ProviderInstance, ProviderSnapshot};
use knit_server::store::{state, Enrollment, Store};
use knit_server::{Server, ServerError, Settings};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, ServerError>;

/// Fake instances; records the calls that change one; `fail_reimage`
/// makes every re-image fail.
#[derive(Default)]
struct Cloud {
    calls: Mutex<Vec<String>>,
    instances: Mutex<BTreeMap<String, InstanceFacts>>,
    fail_reimage: bool,
}

fn refuse<T>(what: &str) -> Result<T> {
    Err(ServerError::Provider {
        provider: "fake".into(),
        message: format!("{what} is not part of this test"),
    })
}

impl Cloud {
    fn add(&self, id: &str, ip: &str, state: &str) {
        let facts = InstanceFacts {
            id: id.into(),
            name: format!("own-{id}"),
            state: state.into(),
            ip: Some(ip.into()),
            instance_type: "ecs.g7.large".into(),
            account_id: "local-account".into(),
            region_id: "local".into(),
            zone_id: "local-a".into(),
            vpc_id: "vpc-local".into(),
            v_switch_id: "vsw-local".into(),
            security_groups: vec![SecurityGroupFacts {
                id: "sg-local".into(),
                kind: "normal".into(),
                rules: Vec::new(),
            }],
            eni_count: 1,
            max_enis: 3,
            max_ips_per_eni: 10,
            os_id: "debian".into(),
            os_version: "12".into(),
            os_name: "Debian GNU/Linux 12".into(),
            data_disks: vec![DiskFacts {
                id: format!("d-{id}"),
                device: Some("vdb".into()),
                size_bytes: 1 << 30,
            }],
            ..InstanceFacts::default()
        };
        self.instances.lock().unwrap().insert(id.into(), facts);
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn with<T>(
        &self,
        id: &str,
        call: String,
        f: impl FnOnce(&mut InstanceFacts) -> T,
    ) -> Result<T> {
        self.calls.lock().unwrap().push(call);
        let mut all = self.instances.lock().unwrap();
        let i = all.get_mut(id).ok_or_else(|| ServerError::Provider {
            provider: "fake".into(),
            message: format!("no instance {id}"),
        })?;
        Ok(f(i))
    }
}

fn view(i: &InstanceFacts) -> ProviderInstance {
    ProviderInstance {
        id: i.id.clone(),
        name: Some(i.name.clone()),
        state: i.state.clone(),
        ip: i.ip.clone(),
        tags: BTreeMap::new(),
    }
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
        Ok(self.instances.lock().unwrap().get(id).map(view))
    }
    async fn list(&self) -> Result<Vec<ProviderInstance>> {
        Ok(self.instances.lock().unwrap().values().map(view).collect())
    }
    async fn start(&self, id: &str) -> Result<()> {
        self.with(id, format!("start {id}"), |i| i.state = "running".into())
    }
    async fn stop(&self, id: &str) -> Result<()> {
        self.with(id, format!("stop {id}"), |i| i.state = "stopped".into())
    }
    async fn reimage(&self, id: &str, _image: &str, _user_data: &str) -> Result<()> {
        if self.fail_reimage {
            self.calls
                .lock()
                .unwrap()
                .push(format!("reimage {id} (fails)"));
            return Err(ServerError::Provider {
                provider: "fake".into(),
                message: "the re-image broke".into(),
            });
        }
        self.with(id, format!("reimage {id}"), |i| {
            i.state = "running".into();
            for d in &mut i.data_disks {
                d.id.push_str("-new");
            }
        })
    }
    async fn check_image(&self, _image: &str) -> Result<()> {
        Ok(())
    }
    async fn rename(&self, id: &str, name: &str) -> Result<()> {
        self.with(id, format!("rename {id} {name}"), |i| i.name = name.into())
    }
    async fn set_password(&self, _id: &str, _password: &str) -> Result<()> {
        refuse("set_password")
    }
    async fn delete(&self, id: &str) -> Result<()> {
        self.with(id, format!("delete {id}"), |_| ())
    }
    async fn read_file(&self, _id: &str, _path: &str) -> Result<Vec<u8>> {
        refuse("read_file")
    }
    async fn snapshot_create(&self, _id: &str, _i: usize, _n: &str) -> Result<ProviderSnapshot> {
        refuse("snapshot_create")
    }
    async fn snapshot_delete(&self, _id: &str) -> Result<()> {
        refuse("snapshot_delete")
    }
    async fn facts(&self, id: &str) -> Result<InstanceFacts> {
        self.instances
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| ServerError::Provider {
                provider: "fake".into(),
                message: format!("no instance {id}"),
            })
    }
}

struct Harness {
    rt: tokio::runtime::Runtime,
    server: Option<Server>,
    client: Option<Client>,
    cloud: Arc<Cloud>,
    settings: Settings,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn new(cloud: Cloud) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut settings = Settings::new(dir.path().join("state"));
        settings.listen = "127.0.0.1:0".parse().unwrap();
        settings.reconcile_interval = Duration::from_millis(200);
        // The agent's checksum in the mirror: attach refuses without it.
        let bin = settings.mirror_dir().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(
            bin.join("knit-agent.sha256"),
            format!("{}\n", "ab".repeat(32)),
        )
        .unwrap();
        Harness {
            rt,
            server: None,
            client: None,
            cloud: Arc::new(cloud),
            settings,
            _dir: dir,
        }
    }

    fn start(&mut self) {
        let provider: Arc<dyn Provider> = self.cloud.clone();
        let server = self
            .rt
            .block_on(knit_server::start(
                self.settings.clone(),
                Some(provider),
                Arc::new(NoCluster),
            ))
            .unwrap();
        self.client = Some(
            Client::new(&ClientConfig {
                server: server.local_url.clone(),
                token: server.admin_token().to_string(),
                ca_cert: server.ca_pem().to_string(),
                state_dir: None,
                pid: None,
            })
            .unwrap(),
        );
        self.server = Some(server);
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("the server runs")
    }

    /// What a server that stopped after enrolling `id` and stopping it
    /// left behind: the attach record, the instance `Creating` with the
    /// pool's count raised once, and a pending attach intent.
    fn leave_an_interrupted_attach(&self, id: &str) {
        std::fs::create_dir_all(&self.settings.state_dir).unwrap();
        let store = Store::open(&self.settings.db_path()).unwrap();
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
        let dir = self.settings.state_dir.join("attach");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("workers-abcde.json"),
            serde_json::to_vec(&record).unwrap(),
        )
        .unwrap();
        pool.spec.replicas = 1;
        store
            .enroll_attached(
                &Enrollment {
                    name: "workers-abcde",
                    pool: &pool,
                    provider_id: id,
                    ip: Some("10.213.0.7"),
                    instance_type: "ecs.g7.large",
                    state: state::CREATING,
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
        self.client().get("/api/v1/pools/workers").unwrap()["spec"]["replicas"]
            .as_i64()
            .unwrap()
    }

    fn events(&self) -> String {
        self.client()
            .get("/api/v1/events?limit=200")
            .unwrap()
            .to_string()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.shutdown());
        }
    }
}

#[test]
fn an_interrupted_attach_is_rolled_forward_by_the_next_server() {
    let mut h = Harness::new(Cloud::default());
    h.cloud.add("i-000000000001", "10.213.0.7", "stopped");
    h.leave_an_interrupted_attach("i-000000000001");
    h.start();
    let i = h.wait_state("i-000000000001", state::RUNNING);
    assert_eq!(i["added"], true, "{i}");
    assert_eq!(
        h.cloud.calls(),
        vec!["reimage i-000000000001".to_string()],
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
    assert_eq!(h.cloud.calls().len(), 1, "{:?}", h.cloud.calls());
}

#[test]
fn an_interrupted_attach_whose_instance_is_gone_is_undone() {
    let mut h = Harness::new(Cloud::default());
    h.leave_an_interrupted_attach("i-00000000dead");
    h.start();
    let i = h.wait_state("i-00000000dead", state::DETACHED);
    let why = i["lastError"].as_str().unwrap_or_default();
    assert!(
        why.contains("no longer exists") && why.contains("the add was undone"),
        "{why}"
    );
    assert_eq!(h.replicas(), 0, "the count is back");
    assert!(h.events().contains("AttachFailed"));
    assert!(h.cloud.calls().is_empty(), "{:?}", h.cloud.calls());
}

#[test]
fn a_failed_reimage_undoes_the_add_and_the_instance_can_be_attached_again() {
    let mut h = Harness::new(Cloud {
        fail_reimage: true,
        ..Cloud::default()
    });
    h.cloud.add("i-000000000002", "10.213.0.8", "running");
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
    let i = h.wait_state("i-000000000002", state::DETACHED);
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
