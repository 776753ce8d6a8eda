//! What the server's integration tests share: [`TestServer`], a real server
//! on loopback (TLS, SQLite, an ephemeral port, a temporary state
//! directory) shut down on drop, and [`FakeCloud`], fake instances behind
//! the real `Provider` trait that record every call made to them.

#![allow(dead_code)] // each test binary uses its own part

use async_trait::async_trait;
use knit_client::{Client, ClientConfig};
use knit_server::preflight::{DiskFacts, InstanceFacts, SecurityGroupFacts};
use knit_server::provider::{InstanceTemplate, Provider, ProviderInstance, ProviderSnapshot};
use knit_server::{NoCluster, Server, ServerError, Settings};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

type Result<T> = std::result::Result<T, ServerError>;

/// A server on its own runtime. [`TestServer::new`] only prepares its
/// settings (so a test can change them, or leave state behind, before
/// [`TestServer::start`]); dropping it shuts the server down.
pub struct TestServer {
    rt: tokio::runtime::Runtime,
    server: Option<Server>,
    client: Option<Client>,
    pub settings: Settings,
    pub dir: tempfile::TempDir,
}

impl TestServer {
    pub fn new() -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut settings = Settings::new(dir.path().join("state"));
        settings.listen = "127.0.0.1:0".parse().unwrap();
        TestServer {
            rt,
            server: None,
            client: None,
            settings,
            dir,
        }
    }

    /// Starts the server over `provider` and an admin client for it.
    pub fn start(&mut self, provider: Option<Arc<dyn Provider>>) {
        let server = self
            .rt
            .block_on(knit_server::start(
                self.settings.clone(),
                provider,
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

    /// Shuts the server down (the state stays, for a `start` again).
    pub fn stop(&mut self) {
        self.client = None;
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.shutdown());
        }
    }

    pub fn server(&self) -> &Server {
        self.server.as_ref().expect("the server runs")
    }

    pub fn client(&self) -> &Client {
        self.client.as_ref().expect("the server runs")
    }

    /// The agent's checksum in the mirror: attach refuses without it.
    pub fn write_agent_checksum(&self) {
        let bin = self.settings.mirror_dir().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(
            bin.join("knit-agent.sha256"),
            format!("{}\n", "ab".repeat(32)),
        )
        .unwrap();
    }

    pub fn replicas(&self, pool: &str) -> i64 {
        self.client().get(&format!("/api/v1/pools/{pool}")).unwrap()["spec"]["replicas"]
            .as_i64()
            .unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.shutdown());
        }
    }
}

/// A running Debian instance in the local region, one data disk
/// (`d-<id>`), no password login; tests change what they need.
pub fn instance(id: &str, name: &str, ip: &str) -> InstanceFacts {
    InstanceFacts {
        id: id.into(),
        name: name.into(),
        state: "running".into(),
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
    }
}

/// Fake instances that record every call made about them, in order
/// (`"<call> <id> [<argument>]"`); `fail_reimage` makes every re-image
/// fail, `fail_exec` every command run inside an instance. Creating
/// instances and snapshots is refused.
#[derive(Default)]
pub struct FakeCloud {
    calls: Mutex<Vec<String>>,
    instances: Mutex<BTreeMap<String, InstanceFacts>>,
    /// Passwords given to `set_password`, to check the right one arrived.
    pub passwords: Mutex<Vec<String>>,
    fail_reimage: bool,
    fail_exec: bool,
}

/// What a failing command inside an instance prints on stderr.
pub const EXEC_FAILURE: &str = "not undone: unmount /var/lib/kubelet: busy";

impl FakeCloud {
    /// A cloud whose every re-image fails.
    pub fn failing_reimage() -> FakeCloud {
        FakeCloud {
            fail_reimage: true,
            ..FakeCloud::default()
        }
    }

    /// A cloud where every command run inside an instance exits 1 with
    /// [`EXEC_FAILURE`] on stderr.
    pub fn failing_exec() -> FakeCloud {
        FakeCloud {
            fail_exec: true,
            ..FakeCloud::default()
        }
    }

    pub fn add(&self, facts: InstanceFacts) {
        self.instances
            .lock()
            .unwrap()
            .insert(facts.id.clone(), facts);
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    /// The calls that change an instance: all but the image checks.
    pub fn changes(&self) -> Vec<String> {
        let mut calls = self.calls();
        calls.retain(|c| !c.starts_with("check-image"));
        calls
    }

    /// Stops an instance behind the server's back (no call recorded).
    pub fn stop_now(&self, id: &str) {
        self.instances.lock().unwrap().get_mut(id).unwrap().state = "stopped".into();
    }

    pub fn state(&self, id: &str) -> String {
        self.instances.lock().unwrap()[id].state.clone()
    }

    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn with<T>(&self, id: &str, f: impl FnOnce(&mut InstanceFacts) -> T) -> Result<T> {
        let mut all = self.instances.lock().unwrap();
        let i = all
            .get_mut(id)
            .ok_or_else(|| fail(format!("no instance {id}")))?;
        Ok(f(i))
    }
}

fn fail(message: String) -> ServerError {
    ServerError::from(knit_server::provider::ProviderError::failed(
        "fake", message,
    ))
}

fn refuse<T>(what: &str) -> Result<T> {
    Err(fail(format!("{what} is not part of this test")))
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
impl Provider for FakeCloud {
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
        self.record(format!("start {id}"));
        self.with(id, |i| i.state = "running".into())
    }
    async fn stop(&self, id: &str) -> Result<()> {
        self.record(format!("stop {id}"));
        self.with(id, |i| i.state = "stopped".into())
    }
    async fn reimage(&self, id: &str, image: &str, _user_data: &str) -> Result<()> {
        if self.fail_reimage {
            self.record(format!("reimage {id} {image} (fails)"));
            return Err(fail("the re-image broke".into()));
        }
        self.record(format!("reimage {id} {image}"));
        self.with(id, |i| {
            i.state = "running".into();
            for d in &mut i.data_disks {
                d.id.push_str("-new");
            }
        })
    }
    /// The local cloud's rule: `host` or a root filesystem directory.
    async fn check_image(&self, image: &str) -> Result<()> {
        self.record(format!("check-image {image}"));
        let root = match image {
            // The fake has no files: the node image is taken as built.
            knit_api::DEFAULT_IMAGE => return Ok(()),
            "host" => "/",
            dir => dir,
        };
        knit_local::check_base_root(Path::new(root))
            .map_err(|rule| fail(format!("image {image:?} {rule}")))
    }
    async fn rename(&self, id: &str, name: &str) -> Result<()> {
        self.record(format!("rename {id} {name}"));
        self.with(id, |i| i.name = name.into())
    }
    async fn set_password(&self, id: &str, password: &str) -> Result<()> {
        self.record(format!("set-password {id}"));
        self.passwords.lock().unwrap().push(password.into());
        Ok(())
    }
    async fn delete(&self, id: &str) -> Result<()> {
        self.record(format!("delete {id}"));
        self.with(id, |_| ())
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
    /// Recorded as `exec <id> <argv joined by spaces>`; only a running
    /// instance runs anything.
    async fn exec(&self, id: &str, argv: &[String]) -> Result<(i32, Vec<u8>, Vec<u8>)> {
        self.record(format!("exec {id} {}", argv.join(" ")));
        let running = self.with(id, |i| i.state == "running")?;
        if !running {
            return Err(fail(format!("{id} is not running")));
        }
        if self.fail_exec {
            return Ok((1, Vec::new(), EXEC_FAILURE.as_bytes().to_vec()));
        }
        Ok((0, b"undone: service kubelet stopped\n".to_vec(), Vec::new()))
    }
    async fn facts(&self, id: &str) -> Result<InstanceFacts> {
        self.with(id, |i| i.clone())
    }
}
