//! Drains and rollouts carried through a change of leader, and the update
//! strategies, on real control planes: `knit_server::start` servers (TLS,
//! reconciler, lease, fencing) sharing one real PostgreSQL of the test's
//! own (`knit_db::testing::TestPostgres`), each with its embedded
//! Kubernetes API on that database (so both serve one cluster, as `knit
//! up --ha` runs them). Every drain is knit's real one: cordon and
//! evictions through the embedded API's `pods/eviction`, checked there
//! against the PodDisruptionBudget by its disruption controller.
//!
//! What is not real, and stands in for it:
//! - the cloud: [`Cloud`], machines behind the real `Provider` trait that
//!   keep what they were made with (instance type, user data) and record,
//!   at every create, the most machines of a pool alive at once, and at
//!   every release, any pod still bound to the machine's node;
//! - the node agent and kubelet: [`Sim`] redeems each machine's one-time
//!   join token from its user data (`join::bootstrap`, as the bootstrap
//!   endpoint does), reports every phase done with the report token it got
//!   (`join::record_report`, as the report endpoint does), registers the
//!   Node Ready, reports the pods bound to it Running and Ready, and ends a
//!   pod's graceful deletion at once, as a kubelet would.
//!
//! "Killed": a server's runtime is dropped with its tasks mid-work, its
//! embedded API stopped, without the clean stop's hand-over: its lease is
//! left to lapse (5 s here), as after `kill -9`, and the other server takes
//! it over by the lease's rules.
//!
//! The tests:
//! - [`a_new_leader_resumes_a_drain_a_budget_blocks`] and
//!   [`a_fenced_out_leader_leaves_the_drain_to_the_new_one`] (issue 23)
//! - [`a_new_leader_carries_on_a_rollout_without_a_second_surge`] (issue 24)
//! - [`on_delete_replaces_only_a_removed_node_from_the_new_template`] (issue 24)
//! - [`a_replacement_that_never_joins_stops_the_rollout`] (issue 24)
//! - [`a_drain_a_budget_holds_past_its_timeout_stops_the_rollout`] (issue 24)
//!
//! Every resource (PostgreSQL, state directories, servers, their APIs on
//! loopback ports of their own) belongs to the test and goes with it, on
//! success, failure and panic.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use knit_api::state::{DrainState, InstanceState};
use knit_api::{NodeConfig, PhaseEvent, PhaseName, PhaseOutcome};
use knit_client::{Client, ClientConfig};
use knit_db::testing::TestPostgres;
use knit_server::preflight::InstanceFacts;
use knit_server::provider::{InstanceTemplate, Provider, ProviderInstance, ProviderSnapshot};
use knit_server::provider::{TAG_NAME, TAG_POOL};
use knit_server::{ControlPlane, Server, ServerError, Settings};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, ServerError>;

const OLD_TYPE: &str = "ecs.g7.large";
const NEW_TYPE: &str = "ecs.g7.xlarge";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------- the cloud

#[derive(Debug, Clone)]
struct Machine {
    id: String,
    name: String,
    pool: String,
    instance_type: String,
    user_data: String,
    ip: String,
}

/// Machines that exist from `create` until `delete`.
#[derive(Default)]
struct Cloud {
    machines: Mutex<BTreeMap<String, Machine>>,
    next: AtomicU64,
    /// Every machine ever made, in order.
    created: Mutex<Vec<Machine>>,
    /// Ids of the machines released, in order.
    released: Mutex<Vec<String>>,
    /// The leader lease each release ran under (`ha::current_fence`).
    released_under: Mutex<HashMap<String, Option<knit_server::store::Fence>>>,
    /// Per pool: the most machines alive at once.
    peak: Mutex<HashMap<String, usize>>,
    /// The node of each joined machine (by id), as the kubelet named it.
    nodes: Mutex<HashMap<String, String>>,
    /// Pods found bound to a machine's node when it was released.
    violations: Mutex<Vec<String>>,
    /// For the release check: the cluster's API, as an admin.
    kube: OnceLock<kube::Client>,
}

impl Cloud {
    fn machines(&self, pool: &str) -> Vec<Machine> {
        lock(&self.machines)
            .values()
            .filter(|m| m.pool == pool)
            .cloned()
            .collect()
    }
    fn created(&self, pool: &str, instance_type: &str) -> usize {
        lock(&self.created)
            .iter()
            .filter(|m| m.pool == pool && m.instance_type == instance_type)
            .count()
    }
    fn peak(&self, pool: &str) -> usize {
        lock(&self.peak).get(pool).copied().unwrap_or(0)
    }
    fn released(&self) -> Vec<String> {
        lock(&self.released).clone()
    }
    fn node_of(&self, id: &str) -> Option<String> {
        lock(&self.nodes).get(id).cloned()
    }
    fn machine_of_node(&self, node: &str) -> Option<String> {
        lock(&self.nodes)
            .iter()
            .find(|(_, n)| n.as_str() == node)
            .map(|(id, _)| id.clone())
    }
}

fn view(m: &Machine) -> ProviderInstance {
    let mut tags = BTreeMap::new();
    tags.insert(TAG_POOL.to_string(), m.pool.clone());
    tags.insert(TAG_NAME.to_string(), m.name.clone());
    ProviderInstance {
        id: m.id.clone(),
        name: Some(m.name.clone()),
        state: "Running".into(),
        ip: Some(m.ip.clone()),
        tags,
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
    async fn create(&self, t: &InstanceTemplate) -> Result<ProviderInstance> {
        let n = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let m = Machine {
            id: format!("i-{n:06}"),
            name: t.name.clone(),
            pool: t.tags.get(TAG_POOL).cloned().unwrap_or_default(),
            instance_type: t.instance_type.clone(),
            user_data: t.user_data.clone(),
            ip: format!("10.77.{}.{}", n / 200, n % 200 + 10),
        };
        let mut machines = lock(&self.machines);
        machines.insert(m.id.clone(), m.clone());
        let alive = machines.values().filter(|x| x.pool == m.pool).count();
        drop(machines);
        let mut peak = lock(&self.peak);
        let p = peak.entry(m.pool.clone()).or_default();
        *p = (*p).max(alive);
        drop(peak);
        lock(&self.created).push(m.clone());
        Ok(view(&m))
    }
    async fn get(&self, id: &str) -> Result<Option<ProviderInstance>> {
        Ok(lock(&self.machines).get(id).map(view))
    }
    async fn list(&self) -> Result<Vec<ProviderInstance>> {
        Ok(lock(&self.machines).values().map(view).collect())
    }
    async fn start(&self, _id: &str) -> Result<()> {
        Ok(())
    }
    async fn stop(&self, _id: &str) -> Result<()> {
        refuse("stop")
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
    /// Releases the machine; first looks, as an admin, for pods still bound
    /// to its node: a release with one left is recorded as a violation.
    async fn delete(&self, id: &str) -> Result<()> {
        if let (Some(node), Some(kube)) = (self.node_of(id), self.kube.get()) {
            let pods: Api<Pod> = Api::all(kube.clone());
            let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
            match pods.list(&on_node).await {
                Ok(list) => {
                    for p in list.items {
                        let name = p.metadata.name.unwrap_or_default();
                        lock(&self.violations)
                            .push(format!("{id} released with pod {name} on node {node}"));
                    }
                }
                Err(e) => {
                    // Not known: the release waits for the next pass.
                    return Err(ServerError::from(
                        knit_server::provider::ProviderError::failed(
                            "fake",
                            format!("listing pods on {node} before the release: {e}"),
                        ),
                    ));
                }
            }
        }
        if lock(&self.machines).remove(id).is_some() {
            lock(&self.released).push(id.to_string());
            lock(&self.released_under).insert(id.to_string(), knit_server::store::current_fence());
        }
        Ok(())
    }
    /// cloud-init's result record: every part ran.
    async fn read_file(&self, _id: &str, path: &str) -> Result<Vec<u8>> {
        if path == knit_server::USER_DATA_RESULT {
            return Ok(br#"{"v1": {"errors": []}}"#.to_vec());
        }
        refuse("read_file")
    }
    async fn snapshot_create(&self, _id: &str, _i: usize, _n: &str) -> Result<ProviderSnapshot> {
        refuse("snapshot_create")
    }
    async fn snapshot_delete(&self, _id: &str) -> Result<()> {
        refuse("snapshot_delete")
    }
    async fn exec(&self, _id: &str, _argv: &[String]) -> Result<(i32, Vec<u8>, Vec<u8>)> {
        refuse("exec")
    }
    async fn facts(&self, _id: &str) -> Result<InstanceFacts> {
        refuse("facts")
    }
}

// ------------------------------------------------- the agent and kubelet

/// The join token in knit's stub (`join_token=…`, shell-quoted when needed).
fn join_token(user_data: &str) -> Option<String> {
    user_data.lines().find_map(|l| {
        l.strip_prefix("join_token=")
            .map(|v| v.trim().trim_matches('\'').to_string())
    })
}

/// Agents and kubelets of every machine of the cloud, on one task.
struct Sim {
    cloud: Arc<Cloud>,
    /// The control plane whose bootstrap and report code the agents use
    /// (a server that stays up).
    cp: Arc<ControlPlane>,
    kube: kube::Client,
    /// Instance types whose machines do not join (yet).
    held: Mutex<BTreeSet<String>>,
    /// Machines that redeemed their token (joined or failed).
    tried: Mutex<BTreeSet<String>>,
    errors: Mutex<Vec<String>>,
    /// Per pool being watched: the fewest schedulable Ready nodes seen.
    low: Mutex<HashMap<String, usize>>,
    stop: AtomicBool,
}

impl Sim {
    fn hold(&self, instance_type: &str, held: bool) {
        let mut h = lock(&self.held);
        if held {
            h.insert(instance_type.to_string());
        } else {
            h.remove(instance_type);
        }
    }

    fn watch(&self, pool: &str) {
        lock(&self.low).insert(pool.to_string(), usize::MAX);
    }

    fn lowest(&self, pool: &str) -> usize {
        lock(&self.low).get(pool).copied().unwrap_or(usize::MAX)
    }

    fn errors(&self) -> Vec<String> {
        lock(&self.errors).clone()
    }

    async fn run(self: Arc<Self>) {
        while !self.stop.load(Ordering::SeqCst) {
            if let Err(e) = self.tick().await {
                eprintln!("sim: {e}");
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    async fn tick(&self) -> std::result::Result<(), String> {
        let machines: Vec<Machine> = lock(&self.cloud.machines).values().cloned().collect();
        for m in &machines {
            let held = lock(&self.held).contains(&m.instance_type);
            if held || lock(&self.tried).contains(&m.id) {
                continue;
            }
            match self.join(m).await {
                Ok(node) => {
                    lock(&self.cloud.nodes).insert(m.id.clone(), node);
                }
                // Not bound yet (its id not recorded): tried again.
                Err((false, e)) => eprintln!("sim: {} not joined yet: {e}", m.name),
                Err((true, e)) => {
                    lock(&self.errors).push(format!("{}: {e}", m.name));
                }
            }
        }
        self.kubelet().await?;
        self.sample(&machines).await
    }

    /// Redeems the token, reports every phase, registers the Node Ready.
    /// `Err((spent, why))`: `spent` once the token was redeemed.
    async fn join(&self, m: &Machine) -> std::result::Result<String, (bool, String)> {
        let token = join_token(&m.user_data).ok_or((true, "no join token".to_string()))?;
        let yaml = knit_server::join::bootstrap(&self.cp, Some(&token), None)
            .await
            .map_err(|e| (false, e.to_string()))?;
        lock(&self.tried).insert(m.id.clone());
        let spent = |e: String| (true, e);
        let config = NodeConfig::from_yaml(&yaml).map_err(|e| spent(e.to_string()))?;
        let report = config
            .cluster
            .report_token
            .ok_or_else(|| spent("no report token".into()))?;
        let node = report
            .split_once('.')
            .map(|(_, n)| n.to_string())
            .ok_or_else(|| spent("the report token names no node".into()))?;
        let instance = knit_server::join::reporter(&self.cp, Some(&report))
            .map_err(|e| spent(e.to_string()))?;
        for &phase in PhaseName::ALL {
            let event = PhaseEvent {
                node: node.clone(),
                instance_id: m.id.clone(),
                phase,
                outcome: PhaseOutcome::Done,
                reason: None,
                error_code: None,
                at_ms: knit_server::store::now_ms() as u64,
                duration_ms: Some(1),
            };
            knit_server::join::record_report(&self.cp, &instance, &report, &event)
                .map_err(|e| spent(e.to_string()))?;
        }
        let nodes: Api<Node> = Api::all(self.kube.clone());
        let object: Node = serde_json::from_value(json!({"metadata": {"name": node,
            "labels": {"kubernetes.io/hostname": node}}}))
        .map_err(|e| spent(e.to_string()))?;
        nodes
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| spent(format!("register node {node}: {e}")))?;
        let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
            "reason": "KubeletReady"}]}});
        nodes
            .patch_status(&node, &PatchParams::default(), &Patch::Merge(&ready))
            .await
            .map_err(|e| spent(format!("node {node} Ready: {e}")))?;
        Ok(node)
    }

    /// Pods bound to a node: reported Running and Ready; a deletion begun
    /// (an eviction) ended at once.
    async fn kubelet(&self) -> std::result::Result<(), String> {
        let pods: Api<Pod> = Api::all(self.kube.clone());
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("list pods: {e}"))?;
        for p in list.items {
            let (Some(ns), Some(name)) = (p.metadata.namespace.clone(), p.metadata.name.clone())
            else {
                continue;
            };
            let bound = p.spec.as_ref().and_then(|s| s.node_name.clone()).is_some();
            let api: Api<Pod> = Api::namespaced(self.kube.clone(), &ns);
            if p.metadata.deletion_timestamp.is_some() {
                let now = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                let _ = api.delete(&name, &now).await;
            } else if bound && p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running")
            {
                let running = json!({"status": {"phase": "Running", "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Initialized", "status": "True"},
                    {"type": "ContainersReady", "status": "True"},
                    {"type": "Ready", "status": "True"}]}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&running))
                    .await
                    .map_err(|e| format!("pod {ns}/{name} Running: {e}"))?;
            }
        }
        Ok(())
    }

    /// For each watched pool: Ready, schedulable Nodes of its live machines.
    async fn sample(&self, machines: &[Machine]) -> std::result::Result<(), String> {
        let watched: Vec<String> = lock(&self.low).keys().cloned().collect();
        if watched.is_empty() {
            return Ok(());
        }
        let nodes: Api<Node> = Api::all(self.kube.clone());
        let list = nodes
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("list nodes: {e}"))?;
        let serving: BTreeSet<String> = list
            .items
            .into_iter()
            .filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true))
            .filter_map(|n| n.metadata.name)
            .collect();
        for pool in watched {
            let count = machines
                .iter()
                .filter(|m| m.pool == pool)
                .filter_map(|m| self.cloud.node_of(&m.id))
                .filter(|n| serving.contains(n))
                .count();
            let mut low = lock(&self.low);
            let l = low.entry(pool).or_insert(usize::MAX);
            *l = (*l).min(count);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- servers

/// One knit server with its embedded Kubernetes API, on a runtime of its own.
struct Srv {
    rt: Option<tokio::runtime::Runtime>,
    server: Option<Server>,
    join: Arc<knit_server::EmbeddedJoin>,
    client: Arc<Client>,
    kubeconfig: PathBuf,
}

impl Srv {
    fn cp(&self) -> Arc<ControlPlane> {
        self.server.as_ref().expect("running").control.clone()
    }

    fn leads(&self) -> bool {
        self.server
            .as_ref()
            .is_some_and(|s| s.control.leadership().is_leader())
    }

    /// Reconcile passes this server has run (as leader).
    fn passes(&self) -> u64 {
        let text = self.cp().metrics().render(&[]);
        text.lines()
            .find_map(|l| l.strip_prefix("knit_reconcile_duration_seconds_count "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Ends the server as a crash would: its tasks dropped mid-work, its
    /// API stopped, its lease not given up. A worker caught mid-poll may
    /// print a panic ("A Tokio 1.x context was found, but it is being
    /// shutdown") as it goes: that is the kill, not a failure.
    fn kill(&mut self) {
        self.join.stop();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
        // The runtime is gone: dropping the server now signals no task.
        drop(self.server.take());
    }
}

impl Drop for Srv {
    fn drop(&mut self) {
        if let (Some(rt), Some(server)) = (self.rt.take(), self.server.take()) {
            rt.block_on(server.shutdown());
        }
        self.join.stop();
    }
}

/// PostgreSQL, the cloud, up to two servers and the agents' task.
struct World {
    servers: Vec<Srv>,
    cloud: Arc<Cloud>,
    sim: Option<Arc<Sim>>,
    rt: tokio::runtime::Runtime,
    url: String,
    dir: tempfile::TempDir,
    // Last: the database outlives the servers using it.
    _pg: TestPostgres,
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(sim) = &self.sim {
            sim.stop.store(true, Ordering::SeqCst);
        }
        self.servers.clear();
    }
}

fn wait_for<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl World {
    fn new() -> World {
        let pg = TestPostgres::start().unwrap_or_else(|e| panic!("PostgreSQL for the test: {e}"));
        let url = pg
            .create_database("knit")
            .unwrap_or_else(|e| panic!("a database for the test: {e}"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        World {
            servers: Vec::new(),
            cloud: Arc::new(Cloud::default()),
            sim: None,
            rt,
            url,
            dir: tempfile::tempdir().unwrap(),
            _pg: pg,
        }
    }

    /// The deployment's key that seals the shared secrets (one for all
    /// servers, as `knit up --ha` makes it).
    fn secrets_key(&self) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.path().join("secrets.key");
        if !path.exists() {
            std::fs::write(&path, knit_server::sealed::new_key_text().unwrap()).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        path
    }

    /// Starts one more server on the database; the first one's cluster CA
    /// is copied to the others (as `knit up --ha` does).
    fn start_server(&mut self) -> usize {
        let i = self.servers.len();
        let state = self.dir.path().join(format!("server-{i}"));
        let cluster_dir = state.join("cluster");
        if i > 0 {
            let first = self.dir.path().join("server-0/cluster/pki");
            std::fs::create_dir_all(cluster_dir.join("pki")).unwrap();
            for f in ["ca.crt", "ca.key"] {
                std::fs::copy(first.join(f), cluster_dir.join("pki").join(f)).unwrap();
            }
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let datastore = knit_db::Datastore::Postgres(self.url.clone());
        let mut cfg =
            knit_cluster::ClusterConfig::new(&cluster_dir, "127.0.0.1:0".parse().unwrap());
        cfg.datastore = Some(datastore.clone());
        // The kubelets here renew no Lease: no node goes Unknown meanwhile.
        cfg.node_grace_period = Duration::from_secs(3600);
        let cluster = rt
            .block_on(knit_cluster::EmbeddedCluster::start(cfg))
            .unwrap_or_else(|e| panic!("embedded API of server {i}: {e}"));
        let kubeconfig = cluster.admin_kubeconfig_path().to_path_buf();
        let join =
            Arc::new(knit_server::EmbeddedJoin::new(cluster, Duration::from_secs(600)).unwrap());
        let mut settings = Settings::new(state);
        settings.listen = "127.0.0.1:0".parse().unwrap();
        settings.console = None;
        settings.datastore = datastore;
        settings.secrets_key_file = Some(self.secrets_key());
        settings.lease_ttl = Duration::from_secs(5);
        settings.reconcile_interval = Duration::from_millis(300);
        // The stub's download is checked against this (no agent runs here).
        let bin = settings.mirror_dir().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(
            bin.join("knit-agent.sha256"),
            format!("{}\n", "ab".repeat(32)),
        )
        .unwrap();
        let provider: Arc<dyn Provider> = self.cloud.clone();
        let server = rt
            .block_on(knit_server::start(settings, Some(provider), join.clone()))
            .unwrap_or_else(|e| panic!("server {i}: {e}"));
        let client = Arc::new(
            Client::new(&ClientConfig {
                server: server.local_url.clone(),
                token: server.admin_token().to_string(),
                ca_cert: server.ca_pem().to_string(),
                state_dir: None,
                pid: None,
            })
            .unwrap(),
        );
        self.servers.push(Srv {
            rt: Some(rt),
            server: Some(server),
            join,
            client,
            kubeconfig,
        });
        i
    }

    /// The agents and kubelets, using server `i` (one that stays up) and
    /// its embedded API.
    fn start_sim(&mut self, i: usize) -> Arc<Sim> {
        let path = self.servers[i].kubeconfig.clone();
        let kube = self.rt.block_on(async move {
            let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap();
            kube::Client::try_from(cfg).unwrap()
        });
        let _ = self.cloud.kube.set(kube.clone());
        let sim = Arc::new(Sim {
            cloud: self.cloud.clone(),
            cp: self.servers[i].cp(),
            kube,
            held: Mutex::new(BTreeSet::new()),
            tried: Mutex::new(BTreeSet::new()),
            errors: Mutex::new(Vec::new()),
            low: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
        });
        self.rt.spawn(sim.clone().run());
        self.sim = Some(sim.clone());
        sim
    }

    fn sim(&self) -> &Sim {
        self.sim.as_deref().expect("the sim runs")
    }

    fn kube(&self) -> kube::Client {
        self.sim().kube.clone()
    }

    fn check_sim(&self) {
        let errors = self.sim().errors();
        assert!(errors.is_empty(), "agents or kubelets failed: {errors:?}");
        let violations = lock(&self.cloud.violations).clone();
        assert!(
            violations.is_empty(),
            "machines released with pods on them: {violations:?}"
        );
    }

    /// Waits until pool `name`'s machines all joined and their nodes are
    /// Ready and initialized in knit's view (through server `via`).
    fn wait_ready(&self, via: usize, name: &str, n: usize, secs: u64) {
        wait_for(&format!("{n} Ready nodes in pool {name}"), secs, || {
            self.check_sim();
            let v = self.servers[via]
                .client
                .get(&format!("/api/v1/pools/{name}"))
                .ok()?;
            let s = &v["status"];
            (s["ready"] == json!(n)
                && s["initialized"] == json!(n)
                && s["instances"] == json!(n)
                && self.cloud.machines(name).len() == n)
                .then_some(())
        });
    }

    fn pool(&self, via: usize, name: &str) -> Value {
        self.servers[via]
            .client
            .get(&format!("/api/v1/pools/{name}"))
            .unwrap()
    }

    fn kube_do<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }
}

fn pool_yaml(name: &str, replicas: usize, instance_type: &str, extra: &str) -> String {
    let drain = "{timeoutSeconds: 3600, onTimeout: wait}";
    pool_yaml_drain(name, replicas, instance_type, drain, extra)
}

fn pool_yaml_drain(
    name: &str,
    replicas: usize,
    instance_type: &str,
    drain: &str,
    extra: &str,
) -> String {
    format!(
        "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  instanceTypes: [{instance_type}]
  drain: {drain}
{extra}"
    )
}

/// A pod of `app: LABEL` bound to `node` (the kubelet stand-in runs it).
async fn pod(kube: &kube::Client, name: &str, app: &str, node: &str) {
    let pods: Api<Pod> = Api::namespaced(kube.clone(), "default");
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.local/app:1"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
}

async fn budget_allows(kube: &kube::Client, name: &str) -> Option<i32> {
    let api: Api<PodDisruptionBudget> = Api::namespaced(kube.clone(), "default");
    let b = api.get(name).await.ok()?;
    b.status.map(|s| s.disruptions_allowed)
}

async fn unschedulable(kube: &kube::Client, node: &str) -> Option<bool> {
    let nodes: Api<Node> = Api::all(kube.clone());
    let n = nodes.get_opt(node).await.unwrap()?;
    Some(n.spec.and_then(|s| s.unschedulable) == Some(true))
}

/// How the leader of the drain test loses the lead.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// Killed: gone, its lease left to lapse.
    Kill,
    /// Fenced out: still running, the lease taken over under it with a
    /// new epoch (as after it was paused past its lease).
    Fence,
}

/// Issue 23, "an HA leader change mid-drain": two servers on one
/// PostgreSQL; a pool of two nodes, a pod on each and a
/// PodDisruptionBudget (`minAvailable: 2`) over both. Scale-in to 1
/// starts the drain of one node on the leader, which the budget blocks.
/// The leader is killed mid-drain; the other server takes the lease and
/// resumes the same drain (same start, same intent; its own passes
/// recorded), the node stays cordoned and its machine is not released
/// while the protected pod runs. The budget relaxed (`minAvailable: 1`),
/// the new leader evicts the pod, releases the machine (under its own
/// lease; no pod left on the node at that moment) and the Node is
/// deleted; the other node and its pod are untouched.
#[test]
fn a_new_leader_resumes_a_drain_a_budget_blocks() {
    drain_through_a_leader_change(Loss::Kill);
}

/// [`a_new_leader_resumes_a_drain_a_budget_blocks`] with the leader fenced
/// out instead of killed: it keeps running, sees another server holding the
/// lease and leads no more; the new leader resumes and ends the drain, and
/// the release runs under the new leader's lease, never the old one's.
#[test]
fn a_fenced_out_leader_leaves_the_drain_to_the_new_one() {
    drain_through_a_leader_change(Loss::Fence);
}

fn drain_through_a_leader_change(loss: Loss) {
    let mut w = World::new();
    let a = w.start_server();
    wait_for("server A to lead", 60, || {
        w.servers[a].leads().then_some(())
    });
    let b = w.start_server();
    w.start_sim(b);
    let client = w.servers[b].client.clone();
    client
        .call(
            "POST",
            "/api/v1/pools",
            Some(&pool_yaml("web", 2, OLD_TYPE, "")),
        )
        .unwrap();
    w.wait_ready(b, "web", 2, 120);
    assert!(w.servers[a].leads() && !w.servers[b].leads());

    // A pod on each node, a budget that allows no disruption.
    let kube = w.kube();
    let machines = w.cloud.machines("web");
    let nodes: Vec<String> = machines
        .iter()
        .map(|m| w.cloud.node_of(&m.id).unwrap())
        .collect();
    w.kube_do(async {
        for (i, node) in nodes.iter().enumerate() {
            pod(&kube, &format!("web-{i}"), "web", node).await;
        }
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(kube.clone(), "default");
        let pdb = serde_json::from_value(json!({"metadata": {"name": "web"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}))
        .unwrap();
        pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    });
    wait_for("the budget to count both pods healthy", 60, || {
        (w.kube_do(budget_allows(&kube, "web")) == Some(0)
            && w.kube_do(async {
                let pdbs: Api<PodDisruptionBudget> = Api::namespaced(kube.clone(), "default");
                pdbs.get("web")
                    .await
                    .ok()?
                    .status
                    .map(|s| s.current_healthy)
            }) == Some(2))
        .then_some(())
    });

    // Scale-in: the leader (A) drains one node; the budget blocks it.
    client
        .call(
            "POST",
            "/api/v1/pools/web/scale",
            Some(r#"{"replicas": 1}"#),
        )
        .unwrap();
    let cp = w.servers[b].cp();
    let blocked = wait_for("the drain blocked by the budget", 60, || {
        cp.store()
            .drains()
            .unwrap()
            .into_iter()
            .find(|d| d.pool == "web" && d.state == DrainState::Blocked)
    });
    assert!(
        blocked
            .budget
            .as_deref()
            .unwrap_or("")
            .contains("default/web"),
        "{blocked:?}"
    );
    let node = blocked.node.clone();
    let machine = w.cloud.machine_of_node(&node).unwrap();
    let kept_node = nodes.iter().find(|n| **n != node).unwrap().clone();
    let pod_on = |n: &str| if *n == nodes[0] { "web-0" } else { "web-1" };
    let (blocked_pod, kept_pod) = (pod_on(&node), pod_on(&kept_node));
    assert_eq!(w.kube_do(unschedulable(&kube, &node)), Some(true));

    // The leader is lost mid-drain; B takes the lease.
    assert!(w.servers[a].leads(), "A led the drain");
    let before = cp.store().lease().unwrap().unwrap();
    let (a_id, b_id) = (
        w.servers[a].cp().leadership().id.clone(),
        w.servers[b].cp().leadership().id.clone(),
    );
    assert_eq!(before.holder, a_id);
    match loss {
        Loss::Kill => w.servers[a].kill(),
        // B's store takes the lease whoever holds it, a new epoch.
        Loss::Fence => {
            let now = knit_server::store::now_ms();
            let taken = cp.store().try_lead(&b_id, now, 5_000, true).unwrap();
            assert!(taken.is_some_and(|l| l.holder == b_id));
        }
    }
    wait_for("server B to take the lead", 60, || {
        w.servers[b].leads().then_some(())
    });
    let taken = cp.store().lease().unwrap().unwrap();
    assert_eq!(taken.holder, b_id);
    assert!(taken.epoch > before.epoch, "{before:?} {taken:?}");
    if loss == Loss::Kill {
        // Taken over once A's lease lapsed: A did not hand it over.
        assert!(
            taken.acquired_ms >= before.expires_ms,
            "{before:?} {taken:?}"
        );
    } else {
        wait_for("A to see that it leads no more", 60, || {
            (!w.servers[a].leads()).then_some(())
        });
    }
    // A pass of B on the drain: the blocked passes go on from where A left them.
    let at_takeover = cp.store().drain(&blocked.instance).unwrap().unwrap();
    let resumed = wait_for("B's pass over the blocked drain", 120, || {
        cp.store()
            .drain(&blocked.instance)
            .unwrap()
            .filter(|d| d.blocked_passes > at_takeover.blocked_passes)
    });
    assert_eq!(resumed.state, DrainState::Blocked, "{resumed:?}");
    assert_eq!(resumed.started_ms, blocked.started_ms, "the same drain");
    assert_eq!(resumed.intent_id, blocked.intent_id, "the same intent");
    assert_eq!(resumed.node, node);
    // Still cordoned, the machine still there, the protected pod running.
    assert_eq!(w.kube_do(unschedulable(&kube, &node)), Some(true));
    assert!(w.cloud.machines("web").iter().any(|m| m.id == machine));
    assert!(w.cloud.released().is_empty(), "{:?}", w.cloud.released());
    let pods: Api<Pod> = Api::namespaced(kube.clone(), "default");
    let p = w.kube_do(pods.get(blocked_pod)).unwrap();
    assert!(p.metadata.deletion_timestamp.is_none(), "not evicted yet");
    let view = w.pool(b, "web");
    assert_eq!(view["status"]["draining"], 1, "{view}");

    // The budget relaxed: B evicts the pod, releases the machine, and the
    // Node goes.
    w.kube_do(async {
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(kube.clone(), "default");
        let relax = json!({"spec": {"minAvailable": 1}});
        pdbs.patch("web", &PatchParams::default(), &Patch::Merge(&relax))
            .await
            .unwrap();
    });
    wait_for("the machine released", 120, || {
        w.check_sim();
        w.cloud.released().contains(&machine).then_some(())
    });
    wait_for("the Node deleted", 60, || {
        w.kube_do(unschedulable(&kube, &node))
            .is_none()
            .then_some(())
    });
    w.check_sim();
    assert_eq!(w.cloud.released(), vec![machine.clone()]);
    let under = lock(&w.cloud.released_under)
        .get(&machine)
        .cloned()
        .flatten();
    assert_eq!(
        under.map(|f| (f.holder, f.epoch)),
        Some((b_id.clone(), taken.epoch)),
        "released under the new leader's lease"
    );
    if loss == Loss::Fence {
        assert!(!w.servers[a].leads(), "A does not lead again");
    }
    assert!(w.kube_do(pods.get_opt(blocked_pod)).unwrap().is_none());
    let kept = w.kube_do(pods.get(kept_pod)).unwrap();
    assert!(kept.metadata.deletion_timestamp.is_none());
    assert_eq!(w.kube_do(unschedulable(&kube, &kept_node)), Some(false));
    let left = w.cloud.machines("web");
    assert_eq!(left.len(), 1);
    assert_eq!(
        w.cloud.node_of(&left[0].id).as_deref(),
        Some(kept_node.as_str())
    );
    let events = cp.store().events(500).unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.reason == "LeaderElected" && e.object_name == b_id),
        "B's election is recorded"
    );
    wait_for("the pool at one instance", 60, || {
        let v = w.pool(b, "web");
        (v["status"]["instances"] == 1 && v["status"]["deletingInstances"] == 0).then_some(())
    });
}

/// Issue 24, "an HA leader change mid-rollout": two servers on one
/// PostgreSQL; a pool of 3 (`maxSurge: 1, maxUnavailable: 0`) changes its
/// instance type. The leader makes the surge machine; while it has not
/// joined, the leader is killed. The new leader plans again and again
/// (several passes) without a second surge machine, then, once the surge
/// node is Ready, carries the rollout to its end: every machine of the
/// new type, 3 of them, each made once (none lost, none extra), at most 4
/// machines alive at any moment, and never fewer than 3 Ready nodes
/// serving (schedulable) at any sample.
#[test]
fn a_new_leader_carries_on_a_rollout_without_a_second_surge() {
    let mut w = World::new();
    let a = w.start_server();
    wait_for("server A to lead", 60, || {
        w.servers[a].leads().then_some(())
    });
    let b = w.start_server();
    let sim = w.start_sim(b);
    let client = w.servers[b].client.clone();
    let strategy = "  updateStrategy: {type: RollingUpdate, maxSurge: 1, maxUnavailable: 0}\n";
    client
        .call(
            "POST",
            "/api/v1/pools",
            Some(&pool_yaml("web", 3, OLD_TYPE, strategy)),
        )
        .unwrap();
    w.wait_ready(b, "web", 3, 120);
    assert!(w.servers[a].leads());

    sim.watch("web");
    sim.hold(NEW_TYPE, true);
    client
        .call(
            "PUT",
            "/api/v1/pools/web",
            Some(&pool_yaml("web", 3, NEW_TYPE, strategy)),
        )
        .unwrap();
    wait_for("the surge machine made by A", 60, || {
        (w.cloud.created("web", NEW_TYPE) == 1).then_some(())
    });
    w.servers[a].kill();
    wait_for("server B to take the lead", 60, || {
        w.servers[b].leads().then_some(())
    });
    // B plans several times while the surge node has not joined: no second
    // surge machine, no old node removed (none may be unavailable).
    let passes = w.servers[b].passes();
    wait_for("three passes of B", 60, || {
        (w.servers[b].passes() >= passes + 3).then_some(())
    });
    assert_eq!(w.cloud.created("web", NEW_TYPE), 1, "a second surge");
    assert_eq!(w.cloud.machines("web").len(), 4);
    assert!(w.cloud.released().is_empty());
    let cp = w.servers[b].cp();
    assert!(
        cp.store().drains().unwrap().is_empty(),
        "no old node drained yet"
    );

    sim.hold(NEW_TYPE, false);
    wait_for("the rollout complete", 240, || {
        w.check_sim();
        let v = w.pool(b, "web");
        let r = &v["status"]["rollout"];
        (r["state"] == "Complete"
            && r["updatedAvailable"] == 3
            && w.cloud.machines("web").len() == 3
            && w.cloud.released().len() == 3)
            .then_some(())
    });
    w.check_sim();
    // The cloud releases a machine before the next pass forgets its record:
    // wait for knit's records to settle before comparing them.
    wait_for("knit's records of the pool all Running", 60, || {
        let records = cp.store().instances(Some("web")).unwrap();
        (records.len() == 3 && records.iter().all(|i| i.state == InstanceState::Running))
            .then_some(())
    });
    let left = w.cloud.machines("web");
    assert!(left.iter().all(|m| m.instance_type == NEW_TYPE), "{left:?}");
    assert_eq!(
        w.cloud.created("web", NEW_TYPE),
        3,
        "each replacement made once"
    );
    assert_eq!(w.cloud.created("web", OLD_TYPE), 3);
    assert!(
        w.cloud.peak("web") <= 4,
        "surge exceeded: {}",
        w.cloud.peak("web")
    );
    assert!(
        sim.lowest("web") >= 3,
        "fewer than 3 nodes serving: {}",
        sim.lowest("web")
    );
    // knit's records match the cloud's: no instance lost or left over.
    let recorded: BTreeSet<String> = cp
        .store()
        .instances(Some("web"))
        .unwrap()
        .into_iter()
        .map(|i| {
            assert_eq!(i.state, InstanceState::Running, "{i:?}");
            i.provider_id.unwrap_or_default()
        })
        .collect();
    let live: BTreeSet<String> = left.iter().map(|m| m.id.clone()).collect();
    assert_eq!(recorded, live);
}

/// Issue 24, `updateStrategy: {type: OnDelete}`: a pool of 2 changes its
/// instance type; over several passes nothing is replaced (the rollout
/// says Waiting, 2 out of date). `knit delete node` of one node (`DELETE
/// /api/v1/nodes/NAME`) drains it and releases its machine, and the
/// replacement is made from the new template; the other node is left as
/// it was and the pool keeps its 2 replicas.
#[test]
fn on_delete_replaces_only_a_removed_node_from_the_new_template() {
    let mut w = World::new();
    let a = w.start_server();
    w.start_sim(a);
    let client = w.servers[a].client.clone();
    let strategy = "  updateStrategy: {type: OnDelete}\n";
    client
        .call(
            "POST",
            "/api/v1/pools",
            Some(&pool_yaml("web", 2, OLD_TYPE, strategy)),
        )
        .unwrap();
    w.wait_ready(a, "web", 2, 120);
    let applied = client
        .call(
            "PUT",
            "/api/v1/pools/web",
            Some(&pool_yaml("web", 2, NEW_TYPE, strategy)),
        )
        .unwrap();
    let generation = applied["metadata"]["generation"].as_i64().unwrap();
    let passes = w.servers[a].passes();
    wait_for("the change planned, three passes", 60, || {
        let v = w.pool(a, "web");
        (v["status"]["observedGeneration"] == generation && w.servers[a].passes() >= passes + 3)
            .then_some(())
    });
    let v = w.pool(a, "web");
    let r = &v["status"]["rollout"];
    assert_eq!(r["state"], "Waiting", "{v}");
    assert_eq!(r["outdated"], 2, "{v}");
    assert_eq!(
        w.cloud.created("web", NEW_TYPE),
        0,
        "OnDelete replaced a node"
    );
    assert!(w.cloud.released().is_empty());

    let machines = w.cloud.machines("web");
    let (gone, stays) = (&machines[0], &machines[1]);
    let node = w.cloud.node_of(&gone.id).unwrap();
    client
        .call("DELETE", &format!("/api/v1/nodes/{node}"), None)
        .unwrap();
    wait_for("the node replaced from the new template", 120, || {
        w.check_sim();
        let v = w.pool(a, "web");
        (w.cloud.released() == vec![gone.id.clone()]
            && w.cloud.created("web", NEW_TYPE) == 1
            && v["status"]["ready"] == 2
            && v["status"]["instances"] == 2)
            .then_some(())
    });
    let v = w.pool(a, "web");
    assert_eq!(v["spec"]["replicas"], 2, "{v}");
    assert_eq!(v["status"]["rollout"]["outdated"], 1, "{v}");
    assert_eq!(v["status"]["rollout"]["state"], "Waiting", "{v}");
    let left = w.cloud.machines("web");
    assert_eq!(left.len(), 2);
    assert!(left
        .iter()
        .any(|m| m.id == stays.id && m.instance_type == OLD_TYPE));
    assert!(left.iter().any(|m| m.instance_type == NEW_TYPE));
    let kube = w.kube();
    let stays_node = w.cloud.node_of(&stays.id).unwrap();
    assert_eq!(w.kube_do(unschedulable(&kube, &stays_node)), Some(false));
    assert_eq!(w.kube_do(unschedulable(&kube, &node)), None, "Node deleted");
    w.check_sim();
}

/// Issue 24, the progress deadline: a pool of 2 (`maxSurge: 1,
/// maxUnavailable: 0`, `joinTimeoutSeconds: 60`) changes its instance
/// type, and the new machines never join. Past the join timeout the
/// rollout stops: the pool's status says Stopped with
/// `ProgressDeadlineExceeded` and names the replacement (what `knit
/// rollout status` prints and exits 1 on), an event says so, and the old
/// nodes are left alone (none cordoned, drained or released); it stays
/// stopped (no other replacement made over further passes).
#[test]
fn a_replacement_that_never_joins_stops_the_rollout() {
    let mut w = World::new();
    let a = w.start_server();
    let sim = w.start_sim(a);
    let client = w.servers[a].client.clone();
    let extra = "  joinTimeoutSeconds: 60
  updateStrategy: {type: RollingUpdate, maxSurge: 1, maxUnavailable: 0}\n";
    client
        .call(
            "POST",
            "/api/v1/pools",
            Some(&pool_yaml("web", 2, OLD_TYPE, extra)),
        )
        .unwrap();
    w.wait_ready(a, "web", 2, 120);
    sim.hold(NEW_TYPE, true);
    client
        .call(
            "PUT",
            "/api/v1/pools/web",
            Some(&pool_yaml("web", 2, NEW_TYPE, extra)),
        )
        .unwrap();
    let surge = wait_for("the surge machine", 60, || {
        w.cloud
            .machines("web")
            .into_iter()
            .find(|m| m.instance_type == NEW_TYPE)
    });
    let stopped = wait_for("the rollout stopped", 150, || {
        let v = w.pool(a, "web");
        (v["status"]["rollout"]["state"] == "Stopped").then_some(v)
    });
    let r = &stopped["status"]["rollout"];
    assert_eq!(r["reason"], "ProgressDeadlineExceeded", "{stopped}");
    let message = r["message"].as_str().unwrap_or("");
    assert!(message.contains(&surge.name), "{message}");
    let cp = w.servers[a].cp();
    assert!(
        cp.store()
            .events(500)
            .unwrap()
            .iter()
            .any(|e| e.reason == "ProgressDeadlineExceeded" && e.object_name == "web"),
        "an event says so"
    );
    // It stays stopped: more passes, no other replacement, the old nodes
    // untouched.
    let passes = w.servers[a].passes();
    wait_for("three more passes", 60, || {
        (w.servers[a].passes() >= passes + 3).then_some(())
    });
    assert_eq!(
        w.cloud.created("web", NEW_TYPE),
        1,
        "{:?}",
        w.cloud.machines("web")
    );
    let v = w.pool(a, "web");
    assert_eq!(v["status"]["rollout"]["state"], "Stopped", "{v}");
    assert!(
        cp.store().drains().unwrap().is_empty(),
        "an old node was drained"
    );
    let kube = w.kube();
    let old: Vec<Machine> = w
        .cloud
        .machines("web")
        .into_iter()
        .filter(|m| m.instance_type == OLD_TYPE)
        .collect();
    assert_eq!(old.len(), 2, "the old machines stay");
    for m in &old {
        let node = w.cloud.node_of(&m.id).unwrap();
        assert_eq!(
            w.kube_do(unschedulable(&kube, &node)),
            Some(false),
            "{node}"
        );
    }
    assert!(
        w.cloud.released().iter().all(|id| *id == surge.id),
        "only the failed replacement may go: {:?}",
        w.cloud.released()
    );
    w.check_sim();
}

/// Issue 24, the progress deadline when a PodDisruptionBudget holds the
/// rollout: a pool of 2 (`maxSurge: 1, maxUnavailable: 0`, `drain:
/// {timeoutSeconds: 5, onTimeout: wait}`), a pod on each node and a budget
/// over both that allows no disruption. The instance type changes: the
/// surge node joins, the drain of an old node is blocked by the budget and
/// passes its timeout, and the rollout stops: Stopped,
/// `ProgressDeadlineExceeded`, the node and the budget named, an event;
/// over further passes no other node is drained or made, the blocked node
/// stays cordoned and its machine kept. `knit rollout resume` while the
/// budget still blocks: the rollout is not stopped again by the same drain
/// and makes no extra machine. The budget gone, the rollout ends: both
/// machines of the new type, never more than 3 alive.
#[test]
fn a_drain_a_budget_holds_past_its_timeout_stops_the_rollout() {
    let mut w = World::new();
    let a = w.start_server();
    w.start_sim(a);
    let client = w.servers[a].client.clone();
    let drain = "{timeoutSeconds: 5, onTimeout: wait}";
    let extra = "  updateStrategy: {type: RollingUpdate, maxSurge: 1, maxUnavailable: 0}\n";
    client
        .call(
            "POST",
            "/api/v1/pools",
            Some(&pool_yaml_drain("web", 2, OLD_TYPE, drain, extra)),
        )
        .unwrap();
    w.wait_ready(a, "web", 2, 120);
    let kube = w.kube();
    let old: Vec<Machine> = w.cloud.machines("web");
    w.kube_do(async {
        for (i, m) in old.iter().enumerate() {
            let node = w.cloud.node_of(&m.id).unwrap();
            pod(&kube, &format!("web-{i}"), "web", &node).await;
        }
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(kube.clone(), "default");
        let pdb = serde_json::from_value(json!({"metadata": {"name": "web"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}))
        .unwrap();
        pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    });
    wait_for("the budget to count both pods healthy", 60, || {
        w.kube_do(async {
            let pdbs: Api<PodDisruptionBudget> = Api::namespaced(kube.clone(), "default");
            pdbs.get("web")
                .await
                .ok()?
                .status
                .map(|s| s.current_healthy)
        })
        .filter(|h| *h == 2)
    });

    client
        .call(
            "PUT",
            "/api/v1/pools/web",
            Some(&pool_yaml_drain("web", 2, NEW_TYPE, drain, extra)),
        )
        .unwrap();
    let stopped = wait_for("the rollout stopped", 120, || {
        w.check_sim();
        let v = w.pool(a, "web");
        (v["status"]["rollout"]["state"] == "Stopped").then_some(v)
    });
    let r = &stopped["status"]["rollout"];
    assert_eq!(r["reason"], "ProgressDeadlineExceeded", "{stopped}");
    let cp = w.servers[a].cp();
    let drains = cp.store().drains().unwrap();
    assert_eq!(drains.len(), 1, "{drains:?}");
    let blocked = drains[0].clone();
    assert_eq!(blocked.state, DrainState::Blocked, "{blocked:?}");
    let message = r["message"].as_str().unwrap_or("");
    assert!(
        message.contains(&blocked.node) && message.contains("default/web"),
        "{message}"
    );
    assert!(
        cp.store()
            .events(500)
            .unwrap()
            .iter()
            .any(|e| e.reason == "ProgressDeadlineExceeded" && e.object_name == "web"),
        "an event says so"
    );

    // Stopped: more passes, nothing else drained or made.
    let held = |w: &World| {
        let passes = w.servers[a].passes();
        wait_for("three more passes", 60, || {
            (w.servers[a].passes() >= passes + 3).then_some(())
        });
        assert_eq!(w.cloud.created("web", NEW_TYPE), 1);
        assert_eq!(w.cloud.machines("web").len(), 3);
        assert!(w.cloud.released().is_empty(), "{:?}", w.cloud.released());
        assert_eq!(cp.store().drains().unwrap().len(), 1);
        assert_eq!(w.kube_do(unschedulable(&kube, &blocked.node)), Some(true));
    };
    held(&w);
    assert_eq!(w.pool(a, "web")["status"]["rollout"]["state"], "Stopped");

    // Resumed while the budget still blocks: not stopped again by the same
    // drain, no extra machine (the node being removed holds the surge).
    client
        .call("POST", "/api/v1/pools/web/rollout/resume", None)
        .unwrap();
    held(&w);
    let v = w.pool(a, "web");
    assert_eq!(v["status"]["rollout"]["state"], "Progressing", "{v}");

    // The budget goes: the rollout ends.
    w.kube_do(async {
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(kube.clone(), "default");
        pdbs.delete("web", &DeleteParams::default()).await.unwrap();
    });
    wait_for("the rollout complete", 180, || {
        w.check_sim();
        let v = w.pool(a, "web");
        (v["status"]["rollout"]["state"] == "Complete"
            && w.cloud.machines("web").len() == 2
            && w.cloud.released().len() == 2)
            .then_some(())
    });
    w.check_sim();
    let left = w.cloud.machines("web");
    assert!(left.iter().all(|m| m.instance_type == NEW_TYPE), "{left:?}");
    assert_eq!(w.cloud.created("web", NEW_TYPE), 2);
    assert!(
        w.cloud.peak("web") <= 3,
        "surge exceeded: {}",
        w.cloud.peak("web")
    );
}
