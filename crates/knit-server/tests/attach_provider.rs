//! Adding existing instances through the `Provider` seam: a real server on
//! loopback (TLS, SQLite, a temporary state directory) over a provider that
//! records every call. Checks what attach asks of the cloud: the pool's
//! image for the re-image (checked before anything is touched), the rename
//! to the node name when the instance does not keep its own (automatic and
//! manual mode), and the new password set after the re-image and never kept.

use async_trait::async_trait;
use knit_server::bootstrap::NoCluster;
use knit_server::client::{Client, ClientConfig};
use knit_server::preflight::{DiskFacts, InstanceFacts, SecurityGroupFacts};
use knit_server::provider::{InstanceTemplate, Provider, ProviderInstance, ProviderSnapshot};
use knit_server::{Server, ServerError, Settings};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

type Result<T> = std::result::Result<T, ServerError>;

/// A cloud of fake instances that records what it was asked, in order.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
    instances: Mutex<BTreeMap<String, InstanceFacts>>,
    /// Passwords given to `set_password`, to check the right one arrived.
    passwords: Mutex<Vec<String>>,
}

impl Recorder {
    fn add(&self, id: &str, name: &str, ip: &str, password_login: bool) {
        let facts = InstanceFacts {
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
            password_login,
            data_disks: vec![DiskFacts {
                id: format!("d-{id}"),
                device: Some("vdb".into()),
                size_bytes: 1 << 30,
            }],
            ..InstanceFacts::default()
        };
        self.instances.lock().unwrap().insert(id.into(), facts);
    }

    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn with<T>(&self, id: &str, f: impl FnOnce(&mut InstanceFacts) -> T) -> Result<T> {
        let mut all = self.instances.lock().unwrap();
        let i = all.get_mut(id).ok_or_else(|| ServerError::Provider {
            provider: "recording".into(),
            message: format!("no instance {id}"),
        })?;
        Ok(f(i))
    }
}

fn refuse<T>(what: &str) -> Result<T> {
    Err(ServerError::Provider {
        provider: "recording".into(),
        message: format!("{what} is not part of this test"),
    })
}

#[async_trait]
impl Provider for Recorder {
    fn name(&self) -> &str {
        "recording"
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
        self.record(format!("reimage {id} {image}"));
        self.with(id, |i| {
            i.state = "running".into();
            for d in &mut i.data_disks {
                d.id.push_str("-new");
            }
        })
    }
    async fn check_image(&self, image: &str) -> Result<()> {
        self.record(format!("check-image {image}"));
        let root = if image == "host" { "/" } else { image };
        knit_local::check_base_root(Path::new(root)).map_err(|rule| ServerError::Provider {
            provider: "recording".into(),
            message: format!("image {image:?} {rule}"),
        })
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
        Ok(())
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
        self.with(id, |i| i.clone())
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

struct Harness {
    rt: tokio::runtime::Runtime,
    server: Option<Server>,
    client: Client,
    cloud: Arc<Recorder>,
    dir: tempfile::TempDir,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut settings = Settings::new(dir.path().join("state"));
        settings.listen = "127.0.0.1:0".parse().unwrap();
        let cloud = Arc::new(Recorder::default());
        let provider: Arc<dyn Provider> = cloud.clone();
        let server = rt
            .block_on(knit_server::start(
                settings.clone(),
                Some(provider),
                Arc::new(NoCluster),
            ))
            .unwrap();
        // The agent's checksum in the mirror: attach refuses without it.
        let bin = settings.mirror_dir().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(
            bin.join("knit-agent.sha256"),
            format!("{}\n", "ab".repeat(32)),
        )
        .unwrap();
        let client = Client::new(&ClientConfig {
            server: server.local_url.clone(),
            token: server.admin_token().to_string(),
            ca_cert: server.ca_pem().to_string(),
            state_dir: None,
            pid: None,
        })
        .unwrap();
        Harness {
            rt,
            server: Some(server),
            client,
            cloud,
            dir,
        }
    }

    fn pool(&self, name: &str, extra: &str) {
        let yaml = format!(
            "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: {name}\nspec:\n  replicas: 0\n{extra}"
        );
        self.client
            .call("POST", "/api/v1/pools", Some(&yaml))
            .unwrap();
    }

    fn attach(&self, pool: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        let (status, text) = self
            .client
            .raw(
                "POST",
                &format!("/api/v1/pools/{pool}/attach"),
                Some(&body.to_string()),
            )
            .unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    }

    fn replicas(&self, pool: &str) -> i64 {
        self.client.get(&format!("/api/v1/pools/{pool}")).unwrap()["spec"]["replicas"]
            .as_i64()
            .unwrap()
    }

    /// Every file the server keeps (database, attach records, logs …).
    fn state_files(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![self.dir.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let ft = e.file_type().unwrap();
                if ft.is_dir() {
                    stack.push(e.path());
                } else if ft.is_file() {
                    out.push((e.path(), std::fs::read(e.path()).unwrap()));
                }
            }
        }
        out
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.shutdown());
        }
    }
}

/// Index of the first call starting with `prefix`.
fn at(calls: &[String], prefix: &str) -> usize {
    calls
        .iter()
        .position(|c| c.starts_with(prefix))
        .unwrap_or_else(|| panic!("no call {prefix:?} in {calls:#?}"))
}

fn image_dir(h: &Harness) -> PathBuf {
    let image = h.dir.path().join("pool-image");
    std::fs::create_dir_all(image.join("usr/bin")).unwrap();
    image
}

#[test]
fn automatic_attach_renames_reimages_with_the_pools_image_and_sets_the_password() {
    let h = Harness::new();
    let image = image_dir(&h);
    h.pool(
        "workers",
        &format!(
            "  image: {}\n  customNodeName: {{prefix: worker, suffix: a}}\n",
            image.display()
        ),
    );
    h.cloud.add("i-aaaa00000001", "old-web", "10.213.0.7", true);
    h.cloud.add("i-aaaa00000002", "old-db", "10.213.0.8", true);
    let password = "N3w-pass!x7";

    // Password login and no new password: refused by the preflight, nothing
    // asked of the cloud but the image check.
    let (status, body) = h.attach(
        "workers",
        &serde_json::json!({"instances": ["i-aaaa00000001"]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["passed"], false, "{body}");
    assert!(
        body.to_string().contains("PreflightPasswordRequired"),
        "{body}"
    );
    assert!(
        h.cloud.calls().iter().all(|c| c.starts_with("check-image")),
        "{:#?}",
        h.cloud.calls()
    );

    let (status, body) = h.attach(
        "workers",
        &serde_json::json!({"instances": ["i-aaaa00000001"], "password": password}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["passed"], true, "{body}");
    let node = "worker10.213.0.7a";
    assert_eq!(body["attached"][0]["nodeName"], node, "{body}");
    let calls = h.cloud.calls();
    let image_s = image.display().to_string();
    // Renamed to its node name before anything is stopped, re-imaged with
    // the pool's image, then the password set in the new system.
    let rename = at(&calls, &format!("rename i-aaaa00000001 {node}"));
    let stop = at(&calls, "stop i-aaaa00000001");
    let reimage = at(&calls, &format!("reimage i-aaaa00000001 {image_s}"));
    let password_set = at(&calls, "set-password i-aaaa00000001");
    assert!(
        rename < stop && stop < reimage && reimage < password_set,
        "{calls:#?}"
    );
    assert_eq!(
        *h.cloud.passwords.lock().unwrap(),
        vec![password.to_string()]
    );
    assert_eq!(h.replicas("workers"), 1);

    // Keeping its name: no rename; its node name is its own.
    let (status, body) = h.attach(
        "workers",
        &serde_json::json!({"instances": ["i-aaaa00000002"], "password": password, "keepInstanceName": true}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["attached"][0]["nodeName"], "old-db", "{body}");
    let calls = h.cloud.calls();
    assert!(
        !calls.iter().any(|c| c.starts_with("rename i-aaaa00000002")),
        "{calls:#?}"
    );
    at(&calls, &format!("reimage i-aaaa00000002 {image_s}"));
    at(&calls, "set-password i-aaaa00000002");
    assert_eq!(h.replicas("workers"), 2);

    // The password is in no event, answer or file of the server.
    let events = h.client.get("/api/v1/events").unwrap().to_string();
    assert!(!events.contains(password), "an event holds the password");
    assert!(!body.to_string().contains(password));
    for (path, bytes) in h.state_files() {
        assert!(
            !String::from_utf8_lossy(&bytes).contains(password),
            "{} holds the password",
            path.display()
        );
    }
}

#[test]
fn a_pool_image_that_does_not_exist_is_refused_before_anything_is_touched() {
    let h = Harness::new();
    h.pool("gone", "  image: /nonexistent-knit-pool-image\n");
    h.cloud.add("i-bbbb00000001", "web", "10.213.0.9", false);
    for dry_run in [false, true] {
        let (status, body) = h.attach(
            "gone",
            &serde_json::json!({"instances": ["i-bbbb00000001"], "dryRun": dry_run}),
        );
        assert_eq!(status, 422, "{body}");
        let text = body.to_string();
        assert!(
            text.contains("pool.spec.image")
                && text.contains("/nonexistent-knit-pool-image")
                && text.contains("must be a root filesystem directory"),
            "{text}"
        );
    }
    let calls = h.cloud.calls();
    assert!(
        calls.iter().all(|c| c.starts_with("check-image")),
        "{calls:#?}"
    );
    assert_eq!(h.replicas("gone"), 0);
    assert_eq!(h.cloud.facts_state("i-bbbb00000001"), "running");
}

impl Recorder {
    fn facts_state(&self, id: &str) -> String {
        self.instances.lock().unwrap()[id].state.clone()
    }
}

/// The attach token inside a printed manual-mode script.
fn attach_token(script: &str) -> String {
    let start = script.find("knitattach.").expect("token in script");
    script[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
        .collect()
}

#[test]
fn manual_attach_renames_the_instance_unless_it_keeps_its_name() {
    let facts = r#"{"osId":"debian","osVersion":"12","osName":"Debian GNU/Linux 12","swap":false}"#;
    for keep in [false, true] {
        // A server each: the machine is found by the caller's address, and
        // here every call comes from loopback.
        let h = Harness::new();
        h.pool("hand", "");
        h.cloud.add("i-cccc00000001", "my-box", "127.0.0.1", false);
        let script = h
            .client
            .call(
                "POST",
                "/api/v1/pools/hand/attach-script",
                Some(&serde_json::json!({"keepInstanceName": keep}).to_string()),
            )
            .unwrap();
        let token = attach_token(script["script"].as_str().unwrap());
        let (status, text) = h
            .client
            .with_token(&token)
            .raw("POST", "/attach/v1/manual", Some(facts))
            .unwrap();
        assert_eq!(status, 200, "{text}");
        assert_eq!(h.replicas("hand"), 1);
        let calls = h.cloud.calls();
        if keep {
            assert!(!calls.iter().any(|c| c.starts_with("rename")), "{calls:#?}");
        } else {
            // The pool's default rule: <region>.<instance id>.
            at(&calls, "rename i-cccc00000001 local.i-cccc00000001");
        }
        assert!(
            !calls
                .iter()
                .any(|c| c.starts_with("stop") || c.starts_with("reimage")),
            "manual mode keeps the OS: {calls:#?}"
        );
    }
}
