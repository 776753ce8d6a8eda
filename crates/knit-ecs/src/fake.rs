//! A stateful fake of the ECS and STS OpenAPI on 127.0.0.1, for tests: an
//! HTTP server that refuses any request whose ACS3-HMAC-SHA256 signature,
//! date, nonce or body hash is wrong, and answers the actions knit uses with
//! the JSON shapes and error codes of the real API.
//!
//! What it models: instances moving Pending → Starting → Running (and
//! Stopping → Stopped, reboots) over several DescribeInstances polls;
//! ClientToken de-duplication and IdempotentParameterMismatch; state rules
//! (IncorrectInstanceStatus: start a running instance, change user data of a
//! running one, replace the system disk of a running one …); a new system
//! disk that is Creating for a few polls; snapshots progressing →
//! accomplished; disks made from snapshots; Cloud Assistant commands run for
//! real on this host (`sh -c`, in a scratch directory) with the 24 KB output
//! limit and `Dropped`; an instance quota (QuotaExceed.ElasticQuota); faults
//! injected per action (Throttling.User, InternalError, an answer lost after
//! the action was carried out).
//!
//! What it cannot prove: that real ECS accepts every parameter as sent
//! (names come from the API reference, not from a live answer), billing,
//! real boot times and capacity errors, RAM permission errors, the exact
//! text of real messages, and anything inside a real instance (its Cloud
//! Assistant runs commands on the test host).

use crate::sign::{self, SignInput};
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Cloud Assistant's output limit.
pub const OUTPUT_LIMIT: usize = 24 * 1024;
/// ECS's limit on user data (before base64).
pub const USER_DATA_LIMIT: usize = 32 * 1024;

/// A fault the next calls of one action meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// 400 Throttling.User; the action is not carried out.
    Throttling,
    /// 500 InternalError; the action is not carried out.
    ServerError,
    /// The action is carried out, then the connection closes without an
    /// answer (a lost response).
    LoseAnswer,
    /// 503 with an HTML page instead of JSON, as a gateway in front of the
    /// API may answer; the request id only in `x-acs-request-id`. The
    /// action is not carried out.
    GatewayPage,
}

/// What the fake account holds before the test starts.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    pub region: String,
    pub account_id: String,
    pub access_key_id: String,
    pub access_key_secret: String,
    /// An STS key's token, required on every request when set.
    pub security_token: Option<String>,
    /// DescribeInstances polls an instance stays in each passing state.
    pub polls_per_state: u32,
    pub images: Vec<String>,
    /// vSwitch → (VPC, zone).
    pub v_switches: BTreeMap<String, (String, String)>,
    /// Security group → (type, VPC, rules).
    pub security_groups: BTreeMap<String, (String, String, Vec<Value>)>,
    /// Instance type → (ENIs, IPs per ENI).
    pub instance_types: BTreeMap<String, (u64, u64)>,
    /// Most instances the account may hold.
    pub instance_quota: usize,
}

impl Default for FakeConfig {
    fn default() -> Self {
        let rule = |dir: &str, proto: &str, ports: &str, cidr: &str| {
            json!({"Direction": dir, "IpProtocol": proto, "PortRange": ports,
                   "SourceCidrIp": if dir == "ingress" { cidr } else { "" },
                   "DestCidrIp": if dir == "egress" { cidr } else { "" },
                   "Policy": "Accept", "Priority": "1"})
        };
        FakeConfig {
            region: "cn-shanghai".into(),
            account_id: "1234567890123456".into(),
            access_key_id: "LTAI5tFakeKeyId0000000".into(),
            access_key_secret: "fake-secret-0f9e8d7c6b5a".into(),
            security_token: None,
            polls_per_state: 2,
            images: vec![
                "aliyun_3_x64_20G_alibase_20240819.vhd".into(),
                "ubuntu_22_04_x64_20G_alibase_20240710.vhd".into(),
            ],
            v_switches: [(
                "vsw-fake0001".to_string(),
                ("vpc-fake0001".to_string(), "cn-shanghai-b".to_string()),
            )]
            .into_iter()
            .collect(),
            security_groups: [(
                "sg-fake0001".to_string(),
                (
                    "normal".to_string(),
                    "vpc-fake0001".to_string(),
                    vec![
                        rule("ingress", "ALL", "-1/-1", "192.168.0.0/16"),
                        rule("egress", "ALL", "-1/-1", "0.0.0.0/0"),
                    ],
                ),
            )]
            .into_iter()
            .collect(),
            instance_types: [
                ("ecs.g7.large".to_string(), (3, 6)),
                ("ecs.g7.xlarge".to_string(), (4, 15)),
                // The others knit's tests name (fallback lists, the attach
                // preflight's cases), so that pool writes asking
                // DescribeInstanceTypes accept them.
                ("ecs.g7.2xlarge".to_string(), (4, 15)),
                ("ecs.c7.large".to_string(), (3, 6)),
                ("ecs.c7.xlarge".to_string(), (4, 15)),
                ("ecs.r7.large".to_string(), (3, 6)),
                ("ecs.t1.small".to_string(), (1, 1)),
                ("ecs.ebmgn7e.32xlarge".to_string(), (32, 15)),
            ]
            .into_iter()
            .collect(),
            instance_quota: 50,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Step {
    status: &'static str,
    polls: u32,
}

/// One instance as the fake keeps it.
#[derive(Debug, Clone, Default)]
pub struct FakeInstance {
    pub id: String,
    pub name: String,
    pub host_name: String,
    pub status: String,
    pub instance_type: String,
    pub zone: String,
    pub image: String,
    pub v_switch: String,
    pub vpc: String,
    pub security_groups: Vec<String>,
    pub tags: BTreeMap<String, String>,
    /// Plain text.
    pub user_data: String,
    /// The password in effect (applied at a start or reboot).
    pub password: Option<String>,
    pub pending_password: Option<String>,
    pub ram_role: Option<String>,
    pub key_pair: String,
    pub ip: String,
    pub enis: u32,
    pub system_disk: String,
    /// Times the instance went through a start (create, start, reboot).
    pub boots: u32,
    steps: Vec<Step>,
}

#[derive(Debug, Clone, Default)]
pub struct FakeDisk {
    pub id: String,
    pub kind: String,
    pub status: String,
    pub size_gib: u64,
    pub device: String,
    pub instance_id: String,
    pub source_snapshot: String,
    pub delete_with_instance: bool,
    creating_polls: u32,
}

#[derive(Debug, Clone, Default)]
pub struct FakeSnapshot {
    pub id: String,
    pub name: String,
    pub status: String,
    pub progress: u32,
    pub disk_id: String,
    pub size_gib: u64,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
struct Run {
    instance_id: String,
    done: Option<(i32, Vec<u8>, bool)>,
}

struct State {
    config: FakeConfig,
    instances: BTreeMap<String, FakeInstance>,
    disks: BTreeMap<String, FakeDisk>,
    snapshots: BTreeMap<String, FakeSnapshot>,
    /// (action, ClientToken) → (parameters without the token, answer).
    tokens: HashMap<(String, String), (BTreeMap<String, String>, Value)>,
    nonces: HashSet<String>,
    faults: HashMap<String, Vec<Fault>>,
    calls: Vec<String>,
    runs: HashMap<String, Arc<Mutex<Run>>>,
    /// RunCommand's Timeout of every command, in order.
    command_timeouts: Vec<u64>,
    /// Instance types sold out: RunInstances of one answers
    /// `OperationDenied.NoStock`.
    sold_out: BTreeSet<String>,
    next: u64,
    scratch: std::path::PathBuf,
}

struct ApiError {
    status: u16,
    code: String,
    message: String,
}

fn fail(status: u16, code: &str, message: impl Into<String>) -> ApiError {
    ApiError {
        status,
        code: code.into(),
        message: message.into(),
    }
}

type Answer = Result<Value, ApiError>;

/// A running fake. Dropping it stops the server and removes its scratch
/// directory.
pub struct FakeEcs {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    scratch: Option<tempfile_dir::Dir>,
}

mod tempfile_dir {
    /// A scratch directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl FakeEcs {
    pub fn start() -> FakeEcs {
        FakeEcs::start_with(FakeConfig::default())
    }

    /// Starts the server on its own thread and runtime, so that blocking
    /// and async tests alike can use it.
    pub fn start_with(config: FakeConfig) -> FakeEcs {
        let scratch = std::env::temp_dir().join(format!(
            "knit-fake-ecs-{}-{}",
            std::process::id(),
            crate::client::acs_date().replace(':', "") + &format!("{:x}", rand_u64())
        ));
        std::fs::create_dir_all(&scratch).expect("fake ECS scratch directory");
        let state = Arc::new(Mutex::new(State {
            config,
            instances: BTreeMap::new(),
            disks: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            tokens: HashMap::new(),
            nonces: HashSet::new(),
            faults: HashMap::new(),
            calls: Vec::new(),
            runs: HashMap::new(),
            command_timeouts: Vec::new(),
            sold_out: BTreeSet::new(),
            next: 0,
            scratch: scratch.clone(),
        }));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let addr = listener.local_addr().expect("listener address");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let shared = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("fake ECS runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                let app = axum::Router::new().fallback(handle).with_state(shared);
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stop_rx.await;
                    })
                    .await;
            });
        });
        FakeEcs {
            addr,
            state,
            stop: Some(stop_tx),
            thread: Some(thread),
            scratch: Some(tempfile_dir::Dir(scratch)),
        }
    }

    /// `http://127.0.0.1:<port>`: the endpoint to give the client.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn region(&self) -> String {
        self.lock().config.region.clone()
    }

    /// The key the fake accepts.
    pub fn credentials(&self) -> crate::Credentials {
        let s = self.lock();
        crate::Credentials::new(
            &s.config.access_key_id,
            &s.config.access_key_secret,
            s.config.security_token.as_deref(),
        )
        .expect("fake credentials")
    }

    pub fn config(&self) -> FakeConfig {
        self.lock().config.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next `times` calls of `action` meet `fault`.
    pub fn inject(&self, action: &str, fault: Fault, times: usize) {
        let mut s = self.lock();
        let list = s.faults.entry(action.to_string()).or_default();
        list.extend(std::iter::repeat_n(fault, times));
    }

    /// Makes `instance_type` sold out (`true`) or available again: while it
    /// is, RunInstances of it answers ECS's `OperationDenied.NoStock`.
    pub fn set_sold_out(&self, instance_type: &str, sold_out: bool) {
        let mut s = self.lock();
        if sold_out {
            s.sold_out.insert(instance_type.to_string());
        } else {
            s.sold_out.remove(instance_type);
        }
    }

    pub fn set_instance_quota(&self, quota: usize) {
        self.lock().config.instance_quota = quota;
    }

    /// How many signed calls of `action` reached the fake (faults included).
    pub fn calls(&self, action: &str) -> usize {
        self.lock().calls.iter().filter(|a| *a == action).count()
    }

    /// The Timeout (seconds) of every RunCommand carried out, in order.
    pub fn command_timeouts(&self) -> Vec<u64> {
        self.lock().command_timeouts.clone()
    }

    pub fn instance(&self, id: &str) -> Option<FakeInstance> {
        self.lock().instances.get(id).cloned()
    }

    pub fn instances(&self) -> Vec<FakeInstance> {
        self.lock().instances.values().cloned().collect()
    }

    pub fn disks(&self) -> Vec<FakeDisk> {
        self.lock().disks.values().cloned().collect()
    }

    pub fn snapshots(&self) -> Vec<FakeSnapshot> {
        self.lock().snapshots.values().cloned().collect()
    }

    /// Puts a file inside an instance, at `path` under its /tmp, /var/tmp
    /// or /root (the places an instance of the fake has of its own).
    pub fn put_file(&self, id: &str, path: &str, data: &[u8]) -> std::io::Result<()> {
        let s = self.lock();
        let g = s.guest(id)?;
        let (dir, rest) = [
            ("/tmp/", "tmp"),
            ("/var/tmp/", "vartmp"),
            ("/root/", "root"),
        ]
        .iter()
        .find_map(|(p, d)| path.strip_prefix(p).map(|r| (*d, r)))
        .ok_or_else(|| {
            std::io::Error::other(format!(
                "path {path:?}: must be under /tmp/, /var/tmp/ or /root/ of the instance"
            ))
        })?;
        if rest.is_empty() || rest.split('/').any(|c| c == ".." || c.is_empty()) {
            return Err(std::io::Error::other(format!(
                "path {path:?}: must name a file, without '..' or empty components"
            )));
        }
        let target = g.join(dir).join(rest);
        std::fs::write(&target, data)?;
        use std::os::unix::fs::MetadataExt;
        if std::fs::metadata(&g)?.uid() == NOBODY {
            std::os::unix::fs::chown(&target, Some(NOBODY), Some(NOBODY))?;
        }
        Ok(())
    }

    /// The host name the instance's OS has (its /etc/hostname): ECS's
    /// HostName as of its last start, or what a command inside set.
    pub fn guest_hostname(&self, id: &str) -> Option<String> {
        let g = self.lock().guest(id).ok()?;
        std::fs::read_to_string(g.join("hostname"))
            .ok()
            .map(|h| h.trim().to_string())
    }

    /// An instance knit did not make (for add-existing): Running, in the
    /// first vSwitch, with the first security group.
    pub fn add_existing(&self, name: &str, instance_type: &str, ram_role: Option<&str>) -> String {
        let mut s = self.lock();
        let (vsw, (vpc, zone)) = s
            .config
            .v_switches
            .iter()
            .next()
            .map(|(k, v)| (k.clone(), v.clone()))
            .unwrap_or_default();
        let sg = s
            .config
            .security_groups
            .keys()
            .next()
            .cloned()
            .unwrap_or_default();
        let image = s.config.images.first().cloned().unwrap_or_default();
        let id = s.new_id("i-");
        let ip = s.new_ip();
        let sys = s.new_disk("system", 40, &id, "", true);
        let data = s.new_disk("data", 20, &id, "", false);
        let _ = data;
        s.instances.insert(
            id.clone(),
            FakeInstance {
                id: id.clone(),
                name: name.into(),
                host_name: name.into(),
                status: "Running".into(),
                instance_type: instance_type.into(),
                zone,
                image,
                v_switch: vsw,
                vpc,
                security_groups: vec![sg],
                ram_role: ram_role.map(str::to_string),
                key_pair: String::new(),
                ip,
                enis: 1,
                system_disk: sys,
                boots: 1,
                ..Default::default()
            },
        );
        id
    }
}

impl Drop for FakeEcs {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.scratch.take();
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::getrandom(&mut b);
    u64::from_le_bytes(b)
}

/// A request id in the real API's form: an upper-case UUID.
fn request_id() -> String {
    let mut b = [0u8; 16];
    let _ = getrandom::getrandom(&mut b);
    uuid::Builder::from_random_bytes(b)
        .into_uuid()
        .hyphenated()
        .encode_upper(&mut uuid::Uuid::encode_buffer())
        .to_string()
}

/// Strict, as the real API: a `%` not followed by two hex digits, or bytes
/// that are not UTF-8, make the request unreadable.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let escapes_ok = b.iter().enumerate().all(|(i, c)| {
        *c != b'%'
            || b.get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if !escapes_ok {
        return None;
    }
    let spaced = s.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .ok()
        .map(|d| d.into_owned())
}

fn parse_pairs(s: &str) -> Option<BTreeMap<String, String>> {
    let mut m = BTreeMap::new();
    for pair in s.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        m.insert(percent_decode(k)?, percent_decode(v)?);
    }
    Some(m)
}

/// The answer with the gateway's `x-acs-request-id` header.
fn with_request_id(id: &str, mut r: Response) -> Response {
    if let Ok(v) = axum::http::HeaderValue::from_str(id) {
        r.headers_mut().insert("x-acs-request-id", v);
    }
    r
}

fn error_response(e: ApiError) -> Response {
    let id = request_id();
    let body = json!({
        "RequestId": id,
        "HostId": "ecs.fake.aliyuncs.com",
        "Code": e.code,
        "Message": e.message,
        "Recommend": "https://api.aliyun.com/troubleshoot",
    });
    let r = (
        StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
        axum::Json(body),
    )
        .into_response();
    with_request_id(&id, r)
}

async fn handle(
    axum::extract::State(state): axum::extract::State<Arc<Mutex<State>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let outcome = {
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        s.serve(&method, &uri, &headers, &body)
    };
    match outcome {
        Served::Answer(Ok(mut v)) => {
            let id = request_id();
            if let Some(o) = v.as_object_mut() {
                o.insert("RequestId".into(), Value::String(id.clone()));
            }
            with_request_id(&id, (StatusCode::OK, axum::Json(v)).into_response())
        }
        Served::GatewayPage => with_request_id(
            &request_id(),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [("content-type", "text/html")],
                "<html><body><h1>503 Service Temporarily Unavailable</h1></body></html>",
            )
                .into_response(),
        ),
        Served::Answer(Err(e)) => error_response(e),
        // Unwinding out of the handler makes the server close the
        // connection without an answer; resume_unwind skips the panic hook.
        Served::Lost => std::panic::resume_unwind(Box::new("answer lost on purpose")),
    }
}

enum Served {
    Answer(Answer),
    Lost,
    GatewayPage,
}

fn param<'a>(p: &'a BTreeMap<String, String>, k: &str) -> Result<&'a str, ApiError> {
    p.get(k)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            fail(
                400,
                &format!("Missing{k}"),
                format!("{k} is mandatory for this action."),
            )
        })
}

fn indexed(p: &BTreeMap<String, String>, prefix: &str, field: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = p
        .iter()
        .filter_map(|(k, v)| {
            let rest = k.strip_prefix(prefix)?.strip_prefix('.')?;
            let (n, f) = match rest.split_once('.') {
                Some((n, f)) => (n, f),
                None => (rest, ""),
            };
            if f != field {
                return None;
            }
            Some((n.parse().ok()?, v.clone()))
        })
        .collect();
    out.sort();
    out
}

fn json_ids(p: &BTreeMap<String, String>, k: &str) -> Result<Option<Vec<String>>, ApiError> {
    match p.get(k) {
        None => Ok(None),
        Some(v) => serde_json::from_str::<Vec<String>>(v)
            .map(Some)
            .map_err(|_| {
                fail(
                    400,
                    &format!("Invalid{k}.Malformed"),
                    format!("The specified parameter {k} is not valid."),
                )
            }),
    }
}

fn tags_json(tags: &BTreeMap<String, String>) -> Value {
    json!({"Tag": tags.iter().map(|(k, v)| json!({"TagKey": k, "TagValue": v})).collect::<Vec<_>>()})
}

fn page(p: &BTreeMap<String, String>) -> (usize, usize) {
    let n = p
        .get("PageNumber")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1usize)
        .max(1);
    let s = p
        .get("PageSize")
        .and_then(|v| v.parse().ok())
        .unwrap_or(10usize)
        .clamp(1, 100);
    (n, s)
}

impl State {
    /// The instance's own files (its /tmp, /var/tmp, /root, /run and
    /// /etc/hostname), made on first use. When the fake runs as root they
    /// belong to `nobody`, the user its commands run as on this host.
    fn guest(&self, id: &str) -> std::io::Result<std::path::PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let g = self.scratch.join("guests").join(id);
        if g.join("hostname").exists() {
            return Ok(g);
        }
        for sub in ["tmp", "vartmp", "root", "run"] {
            std::fs::create_dir_all(g.join(sub))?;
        }
        let host = self
            .instances
            .get(id)
            .map(|i| i.host_name.clone())
            .unwrap_or_else(|| id.to_string());
        std::fs::write(g.join("hostname"), format!("{host}\n"))?;
        if std::fs::metadata(&g)?.uid() == 0 {
            for sub in ["", "tmp", "vartmp", "root", "run", "hostname"] {
                std::os::unix::fs::chown(g.join(sub), Some(NOBODY), Some(NOBODY))?;
            }
            let mut perm = std::fs::metadata(g.join("tmp"))?.permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o1777);
            std::fs::set_permissions(g.join("tmp"), perm)?;
        }
        Ok(g)
    }

    fn new_id(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}fake{:012x}", self.next)
    }

    fn new_ip(&mut self) -> String {
        self.next += 1;
        format!(
            "192.168.{}.{}",
            (self.next / 250) % 250,
            self.next % 250 + 2
        )
    }

    fn new_disk(
        &mut self,
        kind: &str,
        size: u64,
        instance: &str,
        snapshot: &str,
        dwi: bool,
    ) -> String {
        let id = self.new_id("d-");
        let n = self
            .disks
            .values()
            .filter(|d| d.instance_id == instance && d.kind == "data")
            .count();
        let device = if kind == "system" {
            "/dev/xvda".to_string()
        } else {
            format!("/dev/xvd{}", (b'b' + n as u8) as char)
        };
        self.disks.insert(
            id.clone(),
            FakeDisk {
                id: id.clone(),
                kind: kind.into(),
                status: "In_use".into(),
                size_gib: size,
                device,
                instance_id: instance.into(),
                source_snapshot: snapshot.into(),
                delete_with_instance: dwi,
                creating_polls: 0,
            },
        );
        id
    }

    fn serve(&mut self, method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Served {
        let (action, params) = match self.verify(method, uri, headers, body) {
            Ok(x) => x,
            Err(e) => return Served::Answer(Err(e)),
        };
        self.calls.push(action.clone());
        let fault = self.faults.get_mut(&action).and_then(|l| {
            if l.is_empty() {
                None
            } else {
                Some(l.remove(0))
            }
        });
        match fault {
            Some(Fault::Throttling) => {
                return Served::Answer(Err(fail(
                    400,
                    "Throttling.User",
                    "Request was denied due to user flow control.",
                )))
            }
            Some(Fault::GatewayPage) => return Served::GatewayPage,
            Some(Fault::ServerError) => {
                return Served::Answer(Err(fail(
                    500,
                    "InternalError",
                    "The request processing has failed due to some unknown error.",
                )))
            }
            _ => {}
        }
        let answer = self.dispatch(&action, &params);
        if fault == Some(Fault::LoseAnswer) {
            return Served::Lost;
        }
        Served::Answer(answer)
    }

    /// Checks the V3 signature the way the gateway does; the action and
    /// its parameters (the query string; the body must be empty).
    fn verify(
        &mut self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(String, BTreeMap<String, String>), ApiError> {
        let header = |k: &str| {
            headers
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().to_string())
        };
        let auth = header("authorization")
            .ok_or_else(|| fail(400, "MissingAuthorization", "Authorization is mandatory."))?;
        let parsed = sign::parse_authorization(&auth).ok_or_else(|| {
            fail(
                400,
                "InvalidAuthorization",
                "The Authorization header is malformed.",
            )
        })?;
        if parsed.access_key_id != self.config.access_key_id {
            return Err(fail(
                404,
                "InvalidAccessKeyId.NotFound",
                "Specified access key is not found.",
            ));
        }
        for required in [
            "host",
            "x-acs-action",
            "x-acs-content-sha256",
            "x-acs-date",
            "x-acs-signature-nonce",
            "x-acs-version",
        ] {
            if !parsed.signed_headers.iter().any(|h| h == required) {
                return Err(fail(
                    400,
                    "IncompleteSignature",
                    format!("The request signature does not conform to Aliyun standards: {required} is not signed."),
                ));
            }
        }
        if let Some(token) = &self.config.security_token {
            let sent = header("x-acs-security-token");
            let signed = parsed
                .signed_headers
                .iter()
                .any(|h| h == "x-acs-security-token");
            if sent.as_deref() != Some(token.as_str()) || !signed {
                return Err(fail(
                    400,
                    "InvalidSecurityToken.Mismatch",
                    "Specified SecurityToken is missing, unsigned or does not match the AccessKey.",
                ));
            }
        }
        let hashed = sign::sha256_hex(body);
        if header("x-acs-content-sha256").as_deref() != Some(hashed.as_str()) {
            return Err(fail(
                400,
                "InvalidContentSha256",
                "x-acs-content-sha256 does not match the request body.",
            ));
        }
        let date = header("x-acs-date").unwrap_or_default();
        let now = knit_os::time::now_secs() as i64;
        match crate::client::parse_iso8601(&date) {
            Some(t) if (now - t).abs() <= 15 * 60 => {}
            Some(_) => {
                return Err(fail(
                    400,
                    "InvalidTimeStamp.Expired",
                    "Specified time stamp or date value is expired.",
                ))
            }
            None => {
                return Err(fail(
                    400,
                    "InvalidTimeStamp.Format",
                    "Specified time stamp or date value is not well formatted.",
                ))
            }
        }
        let mut signed = BTreeMap::new();
        for name in &parsed.signed_headers {
            signed.insert(name.clone(), header(name).unwrap_or_default());
        }
        let query = parse_pairs(uri.query().unwrap_or(""))
            .ok_or_else(|| fail(400, "InvalidParameter", "The query string is malformed."))?;
        let input = SignInput {
            method: method.as_str(),
            path: uri.path(),
            query: &query,
            headers: &signed,
            hashed_payload: &hashed,
        };
        let (expected, _) = sign::signature(&input, self.config.access_key_secret.as_bytes());
        if !sign::same_signature(&expected, &parsed.signature) {
            return Err(fail(
                400,
                "SignatureDoesNotMatch",
                "Specified signature does not match our calculation.",
            ));
        }
        // Checked after the signature, as a replayed request is a valid one.
        let nonce = header("x-acs-signature-nonce").unwrap_or_default();
        if !self.nonces.insert(nonce) {
            return Err(fail(
                400,
                "SignatureNonceUsed",
                "Specified signature nonce was used already.",
            ));
        }
        let action = header("x-acs-action").unwrap_or_default();
        let version = header("x-acs-version").unwrap_or_default();
        let want = if action == "GetCallerIdentity" {
            crate::client::STS_VERSION
        } else {
            crate::client::ECS_VERSION
        };
        if version != want {
            return Err(fail(
                400,
                "InvalidVersion",
                format!("Specified parameter Version is not valid: {version}."),
            ));
        }
        // ECS's and STS's parameters are all `in: query` in the API
        // metadata, and the official SDKs send them so with an empty body:
        // the fake holds the client to that form rather than guess what
        // the gateway makes of a body.
        if !body.is_empty() {
            return Err(fail(
                400,
                "InvalidParameter",
                "The parameters of this RPC action go in the query string; the body must be empty.",
            ));
        }
        let params = query;
        if action != "GetCallerIdentity" {
            let region = params.get("RegionId").cloned().unwrap_or_default();
            if region != self.config.region {
                return Err(fail(
                    400,
                    "InvalidRegionId.NotFound",
                    format!("The specified RegionId {region:?} does not exist."),
                ));
            }
        }
        Ok((action, params))
    }

    /// Carries out an action, or repeats the first answer for a
    /// ClientToken seen before with the same parameters.
    fn dispatch(&mut self, action: &str, p: &BTreeMap<String, String>) -> Answer {
        let token = p.get("ClientToken").cloned();
        let mut fingerprint = p.clone();
        fingerprint.remove("ClientToken");
        if let Some(t) = &token {
            if let Some((seen, answer)) = self.tokens.get(&(action.to_string(), t.clone())) {
                if *seen != fingerprint {
                    return Err(fail(
                        400,
                        "IdempotentParameterMismatch",
                        "The specified parameters are different from before with the same ClientToken.",
                    ));
                }
                return Ok(answer.clone());
            }
        }
        let answer = match action {
            "RunInstances" => self.run_instances(p),
            "DescribeInstances" => self.describe_instances(p),
            "StartInstance" => self.start_instance(p),
            "StopInstance" => self.stop_instance(p),
            "RebootInstance" => self.reboot_instance(p),
            "DeleteInstance" => self.delete_instance(p),
            "DeleteInstances" => self.delete_instances(p),
            "ModifyInstanceAttribute" => self.modify_instance_attribute(p),
            "ReplaceSystemDisk" => self.replace_system_disk(p),
            "DescribeDisks" => self.describe_disks(p),
            "CreateSnapshot" => self.create_snapshot(p),
            "DescribeSnapshots" => self.describe_snapshots(p),
            "DeleteSnapshot" => self.delete_snapshot(p),
            "RunCommand" => self.run_command(p),
            "DescribeInvocationResults" => self.describe_invocation_results(p),
            "DescribeInstanceTypes" => self.describe_instance_types(p),
            "DescribeSecurityGroupAttribute" => self.describe_security_group_attribute(p),
            "DescribeSecurityGroups" => self.describe_security_groups(p),
            "DescribeInstanceRamRole" => self.describe_instance_ram_role(p),
            "GetCallerIdentity" => Ok(json!({
                "AccountId": self.config.account_id,
                "Arn": format!("acs:ram::{}:user/knit-test", self.config.account_id),
                "IdentityType": "RAMUser",
                "PrincipalId": "200000000000000001",
                "UserId": "200000000000000001",
            })),
            other => Err(fail(
                404,
                "InvalidAction.NotFound",
                format!("Specified api {other} is not found, please check your url and method."),
            )),
        }?;
        if let Some(t) = token {
            self.tokens
                .insert((action.to_string(), t), (fingerprint, answer.clone()));
        }
        Ok(answer)
    }

    fn instance_mut(
        &mut self,
        p: &BTreeMap<String, String>,
    ) -> Result<&mut FakeInstance, ApiError> {
        let id = param(p, "InstanceId")?.to_string();
        self.instances.get_mut(&id).ok_or_else(|| {
            fail(
                404,
                "InvalidInstanceId.NotFound",
                format!("The specified InstanceId {id} does not exist."),
            )
        })
    }

    fn run_instances(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let image = param(p, "ImageId")?.to_string();
        if !self.config.images.contains(&image) {
            return Err(fail(
                404,
                "InvalidImageId.NotFound",
                "The specified ImageId does not exist.",
            ));
        }
        let itype = param(p, "InstanceType")?.to_string();
        if !self.config.instance_types.contains_key(&itype) {
            return Err(fail(
                404,
                "InvalidInstanceType.NotFound",
                "The specified InstanceType does not exist.",
            ));
        }
        if self.sold_out.contains(&itype) {
            return Err(fail(
                400,
                "OperationDenied.NoStock",
                "The requested resource is sold out in the specified zone; try other types of resources or other regions and zones.",
            ));
        }
        let vsw = param(p, "VSwitchId")?.to_string();
        let Some((vpc, vsw_zone)) = self.config.v_switches.get(&vsw).cloned() else {
            return Err(fail(
                404,
                "InvalidVSwitchId.NotFound",
                "The specified VSwitchId does not exist.",
            ));
        };
        let zone = p.get("ZoneId").cloned().unwrap_or(vsw_zone.clone());
        if zone != vsw_zone {
            return Err(fail(
                400,
                "InvalidVSwitchId.Mismatch",
                "The specified VSwitchId is not in ZoneId.",
            ));
        }
        let mut groups: Vec<String> = indexed(p, "SecurityGroupIds", "")
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        if let Some(g) = p.get("SecurityGroupId") {
            groups.push(g.clone());
        }
        if groups.is_empty() {
            return Err(fail(
                400,
                "MissingSecurityGroupId",
                "SecurityGroupId is mandatory for this action.",
            ));
        }
        for g in &groups {
            match self.config.security_groups.get(g) {
                None => {
                    return Err(fail(
                        404,
                        "InvalidSecurityGroupId.NotFound",
                        "The specified SecurityGroupId does not exist.",
                    ))
                }
                Some((_, gvpc, _)) if *gvpc != vpc => {
                    return Err(fail(
                        400,
                        "InvalidSecurityGroup.NotInSameVpc",
                        "The security group and vSwitch are not in the same VPC.",
                    ))
                }
                _ => {}
            }
        }
        let user_data = match p.get("UserData") {
            None => String::new(),
            Some(b) => {
                let bytes = B64.decode(b).map_err(|_| {
                    fail(
                        400,
                        "InvalidUserData.Base64FormatInvalid",
                        "The specified UserData is not Base64-encoded.",
                    )
                })?;
                if bytes.len() > USER_DATA_LIMIT {
                    return Err(fail(
                        400,
                        "InvalidUserData.SizeExceeded",
                        "The specified UserData exceeds the size limit.",
                    ));
                }
                String::from_utf8_lossy(&bytes).into_owned()
            }
        };
        let amount: usize = p.get("Amount").and_then(|a| a.parse().ok()).unwrap_or(1);
        if self.instances.len() + amount > self.config.instance_quota {
            return Err(fail(
                403,
                "QuotaExceed.ElasticQuota",
                format!(
                    "The number of instances exceeds the quota of {}.",
                    self.config.instance_quota
                ),
            ));
        }
        // Data disks: checked before anything is made.
        let mut data: Vec<(usize, u64, String, bool)> = Vec::new();
        for (n, _) in indexed(p, "DataDisk", "DeleteWithInstance")
            .into_iter()
            .chain(indexed(p, "DataDisk", "Size"))
            .chain(indexed(p, "DataDisk", "SnapshotId"))
        {
            if data.iter().any(|(m, ..)| *m == n) {
                continue;
            }
            let key = |f: &str| p.get(&format!("DataDisk.{n}.{f}")).cloned();
            let mut size: u64 = key("Size").and_then(|s| s.parse().ok()).unwrap_or(0);
            let snap = key("SnapshotId").unwrap_or_default();
            if !snap.is_empty() {
                match self.snapshots.get(&snap) {
                    None => {
                        return Err(fail(
                            404,
                            "InvalidSnapshotId.NotFound",
                            "The specified SnapshotId does not exist.",
                        ))
                    }
                    Some(s) if s.status != "accomplished" => {
                        return Err(fail(
                            403,
                            "InvalidSnapshotId.NotReady",
                            "The specified snapshot has not completed yet.",
                        ))
                    }
                    Some(s) => size = size.max(s.size_gib),
                }
            }
            if size == 0 {
                return Err(fail(
                    400,
                    "InvalidDataDiskSize.ValueNotSupported",
                    format!("DataDisk.{n}.Size is not valid."),
                ));
            }
            let dwi = key("DeleteWithInstance")
                .map(|v| v == "true")
                .unwrap_or(true);
            data.push((n, size, snap, dwi));
        }
        data.sort_by_key(|d| d.0);
        let id = self.new_id("i-");
        let ip = self.new_ip();
        let sys_size = p
            .get("SystemDisk.Size")
            .and_then(|s| s.parse().ok())
            .unwrap_or(40);
        let sys = self.new_disk("system", sys_size, &id, "", true);
        for (_, size, snap, dwi) in data {
            self.new_disk("data", size, &id, &snap, dwi);
        }
        let tags: BTreeMap<String, String> = indexed(p, "Tag", "Key")
            .into_iter()
            .map(|(n, k)| {
                (
                    k,
                    p.get(&format!("Tag.{n}.Value"))
                        .cloned()
                        .unwrap_or_default(),
                )
            })
            .collect();
        let name = p.get("InstanceName").cloned().unwrap_or_else(|| id.clone());
        let polls = self.config.polls_per_state;
        self.instances.insert(
            id.clone(),
            FakeInstance {
                id: id.clone(),
                name: name.clone(),
                host_name: p.get("HostName").cloned().unwrap_or(name),
                status: "Pending".into(),
                instance_type: itype,
                zone,
                image,
                v_switch: vsw,
                vpc,
                security_groups: groups,
                tags,
                user_data,
                password: p.get("Password").cloned(),
                ip,
                enis: 1,
                system_disk: sys,
                steps: vec![
                    Step {
                        status: "Pending",
                        polls,
                    },
                    Step {
                        status: "Starting",
                        polls,
                    },
                    Step {
                        status: "Running",
                        polls: 0,
                    },
                ],
                ..Default::default()
            },
        );
        Ok(json!({
            "InstanceIdSets": {"InstanceIdSet": [id]},
            "OrderId": format!("{}", self.next + 200000000000),
            "TradePrice": 0.0,
        }))
    }

    /// One poll: every instance on its way somewhere moves on.
    fn advance(&mut self, id: &str) {
        let mut booted = None;
        self.advance_steps(id, &mut booted);
        // A start applies the instance's HostName to its OS, as ECS does.
        if let Some(host) = booted {
            if let Ok(g) = self.guest(id) {
                let _ = std::fs::write(g.join("hostname"), format!("{host}\n"));
            }
        }
    }

    fn advance_steps(&mut self, id: &str, booted: &mut Option<String>) {
        let Some(i) = self.instances.get_mut(id) else {
            return;
        };
        while let Some(first) = i.steps.first_mut() {
            i.status = first.status.to_string();
            if first.polls > 0 {
                first.polls -= 1;
                break;
            }
            let reached = i.steps.remove(0);
            if reached.status == "Running" {
                i.boots += 1;
                if let Some(pw) = i.pending_password.take() {
                    i.password = Some(pw);
                }
                *booted = Some(i.host_name.clone());
            }
            if i.steps.is_empty() {
                i.status = reached.status.to_string();
                break;
            }
        }
    }

    fn view(&self, i: &FakeInstance) -> Value {
        json!({
            "InstanceId": i.id,
            "InstanceName": i.name,
            "HostName": i.host_name,
            "Status": i.status,
            "InstanceType": i.instance_type,
            "RegionId": self.config.region,
            "ZoneId": i.zone,
            "ImageId": i.image,
            "OSName": "Alibaba Cloud Linux  3.2104 LTS 64位",
            "OSNameEn": "Alibaba Cloud Linux  3.2104 LTS 64 bit",
            "OSType": "linux",
            "KeyPairName": i.key_pair,
            "InstanceChargeType": "PostPaid",
            "VpcAttributes": {"VpcId": i.vpc, "VSwitchId": i.v_switch,
                              "PrivateIpAddress": {"IpAddress": [i.ip]}},
            "SecurityGroupIds": {"SecurityGroupId": i.security_groups},
            "NetworkInterfaces": {"NetworkInterface": (0..i.enis).map(|n| json!({
                "NetworkInterfaceId": format!("eni-{}{n}", &i.id[2..]),
                "Type": if n == 0 { "Primary" } else { "Secondary" },
                "PrimaryIpAddress": if n == 0 { i.ip.clone() } else { String::new() },
                "Ipv6Sets": {"Ipv6Set": []},
            })).collect::<Vec<_>>()},
            "Tags": tags_json(&i.tags),
            "OperationLocks": {"LockReason": []},
        })
    }

    fn describe_instances(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let ids = json_ids(p, "InstanceIds")?;
        let name = p.get("InstanceName").cloned();
        let tags: Vec<(String, Option<String>)> = indexed(p, "Tag", "Key")
            .into_iter()
            .map(|(n, k)| (k, p.get(&format!("Tag.{n}.Value")).cloned()))
            .collect();
        let matching: Vec<String> = self
            .instances
            .values()
            .filter(|i| ids.as_ref().map(|l| l.contains(&i.id)).unwrap_or(true))
            .filter(|i| name.as_ref().map(|n| *n == i.name).unwrap_or(true))
            .filter(|i| {
                tags.iter().all(|(k, v)| match v {
                    Some(v) => i.tags.get(k) == Some(v),
                    None => i.tags.contains_key(k),
                })
            })
            .map(|i| i.id.clone())
            .collect();
        let (number, size) = page(p);
        let shown: Vec<String> = matching
            .iter()
            .skip((number - 1) * size)
            .take(size)
            .cloned()
            .collect();
        for id in &shown {
            self.advance(id);
        }
        let list: Vec<Value> = shown
            .iter()
            .filter_map(|id| self.instances.get(id))
            .map(|i| self.view(i))
            .collect();
        Ok(json!({
            "TotalCount": matching.len(),
            "PageNumber": number,
            "PageSize": size,
            "Instances": {"Instance": list},
        }))
    }

    fn wrong_status(i: &FakeInstance) -> ApiError {
        fail(
            403,
            "IncorrectInstanceStatus",
            format!(
                "The current status of the resource does not support this operation ({}).",
                i.status
            ),
        )
    }

    fn start_instance(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let polls = self.config.polls_per_state;
        let i = self.instance_mut(p)?;
        if i.status != "Stopped" || !i.steps.is_empty() {
            return Err(State::wrong_status(i));
        }
        let sys = i.system_disk.clone();
        if self
            .disks
            .get(&sys)
            .map(|d| d.status != "In_use")
            .unwrap_or(false)
        {
            return Err(fail(
                403,
                "IncorrectDiskStatus",
                "The current status of the system disk does not support this operation.",
            ));
        }
        let i = self.instance_mut(p)?;
        i.status = "Starting".into();
        i.steps = vec![
            Step {
                status: "Starting",
                polls,
            },
            Step {
                status: "Running",
                polls: 0,
            },
        ];
        Ok(json!({}))
    }

    fn stop_instance(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let polls = self.config.polls_per_state;
        let i = self.instance_mut(p)?;
        if i.status != "Running" || !i.steps.is_empty() {
            return Err(State::wrong_status(i));
        }
        match p.get("StoppedMode").map(String::as_str) {
            None | Some("KeepCharging") | Some("StopCharging") | Some("Not-applicable") => {}
            Some(_) => {
                return Err(fail(
                    400,
                    "InvalidStoppedMode",
                    "The specified StoppedMode is not valid.",
                ))
            }
        }
        i.status = "Stopping".into();
        i.steps = vec![
            Step {
                status: "Stopping",
                polls,
            },
            Step {
                status: "Stopped",
                polls: 0,
            },
        ];
        Ok(json!({}))
    }

    fn reboot_instance(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let polls = self.config.polls_per_state;
        let i = self.instance_mut(p)?;
        if i.status != "Running" || !i.steps.is_empty() {
            return Err(State::wrong_status(i));
        }
        i.status = "Stopping".into();
        i.steps = vec![
            Step {
                status: "Stopping",
                polls,
            },
            Step {
                status: "Starting",
                polls,
            },
            Step {
                status: "Running",
                polls: 0,
            },
        ];
        Ok(json!({}))
    }

    fn remove_instance(&mut self, id: &str, force: bool) -> Result<(), ApiError> {
        let Some(i) = self.instances.get(id) else {
            return Err(fail(
                404,
                "InvalidInstanceId.NotFound",
                format!("The specified InstanceId {id} does not exist."),
            ));
        };
        if !force && i.status != "Stopped" {
            return Err(State::wrong_status(i));
        }
        if i.status == "Pending" {
            return Err(State::wrong_status(i));
        }
        self.instances.remove(id);
        let _ = std::fs::remove_dir_all(self.scratch.join("guests").join(id));
        self.disks
            .retain(|_, d| d.instance_id != id || !d.delete_with_instance);
        for d in self.disks.values_mut().filter(|d| d.instance_id == id) {
            d.instance_id.clear();
            d.status = "Available".into();
        }
        Ok(())
    }

    fn delete_instance(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let id = param(p, "InstanceId")?.to_string();
        let force = p.get("Force").map(|f| f == "true").unwrap_or(false);
        self.remove_instance(&id, force)?;
        Ok(json!({}))
    }

    fn delete_instances(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let force = p.get("Force").map(|f| f == "true").unwrap_or(false);
        let ids: Vec<String> = indexed(p, "InstanceId", "")
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        if ids.is_empty() {
            return Err(fail(
                400,
                "MissingInstanceId",
                "InstanceId is mandatory for this action.",
            ));
        }
        // All or nothing, as ECS checks every instance first.
        for id in &ids {
            match self.instances.get(id) {
                None => {
                    return Err(fail(
                        404,
                        "InvalidInstanceId.NotFound",
                        format!("The specified InstanceId {id} does not exist."),
                    ))
                }
                Some(i) if !force && i.status != "Stopped" => return Err(State::wrong_status(i)),
                _ => {}
            }
        }
        for id in &ids {
            self.remove_instance(id, force)?;
        }
        Ok(json!({}))
    }

    fn modify_instance_attribute(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let i = self.instance_mut(p)?;
        if p.contains_key("UserData") && i.status != "Stopped" {
            return Err(State::wrong_status(i));
        }
        if let Some(pw) = p.get("Password") {
            let ok = (8..=30).contains(&pw.len())
                && [
                    pw.chars().any(|c| c.is_ascii_lowercase()),
                    pw.chars().any(|c| c.is_ascii_uppercase()),
                    pw.chars().any(|c| c.is_ascii_digit()),
                    pw.chars().any(|c| c.is_ascii_punctuation()),
                ]
                .iter()
                .filter(|b| **b)
                .count()
                    >= 3;
            if !ok {
                return Err(fail(
                    400,
                    "InvalidPassword.Malformed",
                    "The specified password format is invalid.",
                ));
            }
        }
        let user_data = match p.get("UserData") {
            None => None,
            Some(b) => {
                let bytes = B64.decode(b).map_err(|_| {
                    fail(
                        400,
                        "InvalidUserData.Base64FormatInvalid",
                        "The specified UserData is not Base64-encoded.",
                    )
                })?;
                if bytes.len() > USER_DATA_LIMIT {
                    return Err(fail(
                        400,
                        "InvalidUserData.SizeExceeded",
                        "The specified UserData exceeds the size limit.",
                    ));
                }
                Some(String::from_utf8_lossy(&bytes).into_owned())
            }
        };
        if let Some(n) = p.get("InstanceName") {
            i.name = n.clone();
        }
        if let Some(h) = p.get("HostName") {
            i.host_name = h.clone();
        }
        if let Some(pw) = p.get("Password") {
            // Takes effect at the next start, as on ECS.
            if i.status == "Stopped" {
                i.password = Some(pw.clone());
            } else {
                i.pending_password = Some(pw.clone());
            }
        }
        if let Some(u) = user_data {
            i.user_data = u;
        }
        Ok(json!({}))
    }

    fn replace_system_disk(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let image = param(p, "ImageId")?.to_string();
        if !self.config.images.contains(&image) {
            return Err(fail(
                404,
                "InvalidImageId.NotFound",
                "The specified ImageId does not exist.",
            ));
        }
        let id = param(p, "InstanceId")?.to_string();
        let i = self.instance_mut(p)?;
        if i.status != "Stopped" || !i.steps.is_empty() {
            return Err(State::wrong_status(i));
        }
        let old = i.system_disk.clone();
        let size = p
            .get("SystemDisk.Size")
            .and_then(|s| s.parse().ok())
            .or_else(|| self.disks.get(&old).map(|d| d.size_gib))
            .unwrap_or(40);
        self.disks.remove(&old);
        let new = self.new_disk("system", size, &id, "", true);
        if let Some(d) = self.disks.get_mut(&new) {
            d.status = "Creating".into();
            d.creating_polls = self.config.polls_per_state;
        }
        if let Some(i) = self.instances.get_mut(&id) {
            i.system_disk = new.clone();
            i.image = image;
        }
        Ok(json!({"DiskId": new}))
    }

    fn describe_disks(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let instance = p.get("InstanceId").cloned();
        let ids = json_ids(p, "DiskIds")?;
        let kind = p.get("DiskType").cloned().unwrap_or_else(|| "all".into());
        let mut list: Vec<String> = self
            .disks
            .values()
            .filter(|d| {
                instance
                    .as_ref()
                    .map(|i| *i == d.instance_id)
                    .unwrap_or(true)
            })
            .filter(|d| ids.as_ref().map(|l| l.contains(&d.id)).unwrap_or(true))
            .filter(|d| kind == "all" || d.kind == kind)
            .map(|d| d.id.clone())
            .collect();
        // Device order, as an instance sees its disks.
        list.sort_by_key(|id| self.disks.get(id).map(|d| d.device.clone()));
        let (number, size) = page(p);
        let mut out = Vec::new();
        for id in list.iter().skip((number - 1) * size).take(size) {
            if let Some(d) = self.disks.get_mut(id) {
                if d.status == "Creating" {
                    if d.creating_polls == 0 {
                        d.status = "In_use".into();
                    } else {
                        d.creating_polls -= 1;
                    }
                }
                out.push(json!({
                    "DiskId": d.id, "Type": d.kind, "Status": d.status, "Size": d.size_gib,
                    "Device": d.device, "InstanceId": d.instance_id,
                    "SourceSnapshotId": d.source_snapshot,
                    "DeleteWithInstance": d.delete_with_instance,
                    "Category": "cloud_essd",
                    "OperationLocks": {"OperationLock": []},
                }));
            }
        }
        Ok(
            json!({"TotalCount": list.len(), "PageNumber": number, "PageSize": size,
                  "Disks": {"Disk": out}}),
        )
    }

    fn create_snapshot(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let disk = param(p, "DiskId")?.to_string();
        let Some(d) = self.disks.get(&disk) else {
            return Err(fail(
                404,
                "InvalidDiskId.NotFound",
                "The specified disk does not exist.",
            ));
        };
        if d.status != "In_use" && d.status != "Available" {
            return Err(fail(
                403,
                "IncorrectDiskStatus",
                "The current disk status does not support this operation.",
            ));
        }
        let size = d.size_gib;
        let id = self.new_id("s-");
        let tags: BTreeMap<String, String> = indexed(p, "Tag", "Key")
            .into_iter()
            .map(|(n, k)| {
                (
                    k,
                    p.get(&format!("Tag.{n}.Value"))
                        .cloned()
                        .unwrap_or_default(),
                )
            })
            .collect();
        self.snapshots.insert(
            id.clone(),
            FakeSnapshot {
                id: id.clone(),
                name: p.get("SnapshotName").cloned().unwrap_or_default(),
                status: "progressing".into(),
                progress: 0,
                disk_id: disk,
                size_gib: size,
                tags,
            },
        );
        Ok(json!({"SnapshotId": id}))
    }

    fn describe_snapshots(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let ids = json_ids(p, "SnapshotIds")?;
        let name = p.get("SnapshotName").cloned();
        let disk = p.get("DiskId").cloned();
        let list: Vec<String> = self
            .snapshots
            .values()
            .filter(|s| ids.as_ref().map(|l| l.contains(&s.id)).unwrap_or(true))
            .filter(|s| name.as_ref().map(|n| *n == s.name).unwrap_or(true))
            .filter(|s| disk.as_ref().map(|d| *d == s.disk_id).unwrap_or(true))
            .map(|s| s.id.clone())
            .collect();
        let (number, size) = page(p);
        let mut out = Vec::new();
        for id in list.iter().skip((number - 1) * size).take(size) {
            if let Some(s) = self.snapshots.get_mut(id) {
                if s.status == "progressing" {
                    s.progress = (s.progress + 50).min(100);
                    if s.progress == 100 {
                        s.status = "accomplished".into();
                    }
                }
                out.push(json!({
                    "SnapshotId": s.id, "SnapshotName": s.name, "Status": s.status,
                    "Progress": format!("{}%", s.progress), "SourceDiskId": s.disk_id,
                    "SourceDiskSize": s.size_gib.to_string(), "SourceDiskType": "data",
                    "Tags": tags_json(&s.tags),
                }));
            }
        }
        Ok(
            json!({"TotalCount": list.len(), "PageNumber": number, "PageSize": size,
                  "Snapshots": {"Snapshot": out}}),
        )
    }

    fn delete_snapshot(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let id = param(p, "SnapshotId")?.to_string();
        if self.snapshots.remove(&id).is_none() {
            return Err(fail(
                404,
                "InvalidSnapshotId.NotFound",
                "The specified SnapshotId does not exist.",
            ));
        }
        Ok(json!({}))
    }

    fn run_command(&mut self, p: &BTreeMap<String, String>) -> Answer {
        if param(p, "Type")? != "RunShellScript" {
            return Err(fail(
                400,
                "InvalidCommandType",
                "The specified command type is not supported.",
            ));
        }
        let content = param(p, "CommandContent")?;
        // RunCommand's limit without KeepCommand: 24 KB of encoded content.
        if content.len() > 24 * 1024 {
            return Err(fail(
                400,
                "InvalidCommandContent.LengthExceeded",
                "The command content exceeds the size limit.",
            ));
        }
        match p.get("TerminationMode").map(String::as_str) {
            None | Some("Process") | Some("ProcessTree") => {}
            Some(_) => {
                return Err(fail(
                    400,
                    "InvalidTerminationMode",
                    "The specified TerminationMode is not valid.",
                ))
            }
        }
        let script = match p.get("ContentEncoding").map(String::as_str) {
            Some("Base64") => B64.decode(content).map_err(|_| {
                fail(
                    400,
                    "InvalidCommandContent.Base64",
                    "CommandContent is not Base64-encoded.",
                )
            })?,
            _ => content.as_bytes().to_vec(),
        };
        let timeout: u64 = p.get("Timeout").and_then(|t| t.parse().ok()).unwrap_or(60);
        if !(10..=86_400).contains(&timeout) {
            return Err(fail(
                400,
                "InvalidTimeout.ExceedLimit",
                "Timeout must be 10 to 86400 seconds.",
            ));
        }
        self.command_timeouts.push(timeout);
        let ids: Vec<String> = indexed(p, "InstanceId", "")
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        let Some(instance) = ids.first().cloned() else {
            return Err(fail(
                400,
                "MissingInstanceId",
                "InstanceId is mandatory for this action.",
            ));
        };
        match self.instances.get(&instance) {
            None => {
                return Err(fail(
                    404,
                    "InvalidInstance.NotFound",
                    "The specified instance does not exist.",
                ))
            }
            Some(i) if i.status != "Running" => {
                return Err(fail(
                    403,
                    "InstanceNotRunning",
                    "The specified instance is not running.",
                ))
            }
            _ => {}
        }
        let invoke = self.new_id("t-");
        let instance_id = instance.clone();
        let run = Arc::new(Mutex::new(Run {
            instance_id: instance,
            done: None,
        }));
        self.runs.insert(invoke.clone(), run.clone());
        let dir = self.scratch.join(&invoke);
        let guest = match self.guest(&instance_id) {
            Ok(g) => g,
            Err(e) => {
                return Err(fail(
                    500,
                    "InternalError",
                    format!("fake ECS: the instance's files: {e}"),
                ))
            }
        };
        std::thread::spawn(move || {
            let result = run_script(&script, &dir, &guest, Duration::from_secs(timeout));
            let _ = std::fs::remove_dir_all(&dir);
            run.lock().unwrap_or_else(|p| p.into_inner()).done = Some(result);
        });
        Ok(json!({"CommandId": format!("c-{}", &invoke[2..]), "InvokeId": invoke}))
    }

    fn describe_invocation_results(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let invoke = param(p, "InvokeId")?.to_string();
        let Some(run) = self.runs.get(&invoke) else {
            return Ok(
                json!({"Invocation": {"InvocationResults": {"InvocationResult": []},
                             "TotalCount": 0, "PageNumber": 1, "PageSize": 10}}),
            );
        };
        let run = run.lock().unwrap_or_else(|p| p.into_inner());
        let encode_b64 = p
            .get("ContentEncoding")
            .map(|e| e == "Base64")
            .unwrap_or(false);
        let result = match &run.done {
            None => json!({"InstanceId": run.instance_id, "InvokeId": invoke,
                           "InvocationStatus": "Running", "InvokeRecordStatus": "Running",
                           "Output": "", "Dropped": 0}),
            Some((code, output, timed_out)) => {
                let kept = &output[..output.len().min(OUTPUT_LIMIT)];
                let dropped = output.len() - kept.len();
                let text = if encode_b64 {
                    B64.encode(kept)
                } else {
                    String::from_utf8_lossy(kept).into_owned()
                };
                let status = if *timed_out {
                    "Timeout"
                } else if *code == 0 {
                    "Success"
                } else {
                    "Failed"
                };
                json!({"InstanceId": run.instance_id, "InvokeId": invoke,
                       "InvocationStatus": status, "InvokeRecordStatus": "Finished",
                       "ExitCode": code, "Output": text, "Dropped": dropped,
                       "ErrorCode": if *timed_out { "InvocationTimeout" } else { "" },
                       "ErrorInfo": ""})
            }
        };
        Ok(
            json!({"Invocation": {"InvocationResults": {"InvocationResult": [result]},
                  "TotalCount": 1, "PageNumber": 1, "PageSize": 10}}),
        )
    }

    fn describe_instance_types(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let wanted: Vec<String> = indexed(p, "InstanceTypes", "")
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        // ECS's family is the name without its size: `ecs.g7`.
        let family = p.get("InstanceTypeFamily");
        let list: Vec<Value> = self
            .config
            .instance_types
            .iter()
            .filter(|(k, _)| wanted.is_empty() || wanted.contains(k))
            .filter(|(k, _)| {
                family.is_none_or(|f| k.rsplit_once('.').is_some_and(|(fam, _)| fam == f))
            })
            .map(|(k, (enis, ips))| {
                json!({"InstanceTypeId": k, "CpuCoreCount": 2,
                "MemorySize": 8.0, "EniQuantity": enis, "EniPrivateIpAddressQuantity": ips,
                "EniIpv6AddressQuantity": 1})
            })
            .collect();
        Ok(json!({"InstanceTypes": {"InstanceType": list}}))
    }

    fn describe_security_group_attribute(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let id = param(p, "SecurityGroupId")?;
        let Some((_, vpc, rules)) = self.config.security_groups.get(id) else {
            return Err(fail(
                404,
                "InvalidSecurityGroupId.NotFound",
                "The specified SecurityGroupId does not exist.",
            ));
        };
        Ok(
            json!({"SecurityGroupId": id, "VpcId": vpc, "InnerAccessPolicy": "Accept",
                  "RegionId": self.config.region, "Permissions": {"Permission": rules}}),
        )
    }

    fn describe_security_groups(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let ids = json_ids(p, "SecurityGroupIds")?;
        let list: Vec<Value> = self
            .config
            .security_groups
            .iter()
            .filter(|(k, _)| ids.as_ref().map(|l| l.contains(k)).unwrap_or(true))
            .map(|(k, (kind, vpc, _))| json!({"SecurityGroupId": k, "SecurityGroupType": kind, "VpcId": vpc}))
            .collect();
        Ok(json!({"TotalCount": list.len(), "SecurityGroups": {"SecurityGroup": list}}))
    }

    fn describe_instance_ram_role(&mut self, p: &BTreeMap<String, String>) -> Answer {
        let ids = json_ids(p, "InstanceIds")?.unwrap_or_default();
        let list: Vec<Value> = ids
            .iter()
            .filter_map(|id| self.instances.get(id))
            .filter_map(|i| {
                i.ram_role
                    .as_ref()
                    .map(|r| json!({"InstanceId": i.id, "RamRoleName": r}))
            })
            .collect();
        Ok(
            json!({"TotalCount": list.len(), "RegionId": self.config.region,
                  "InstanceRamRoleSets": {"InstanceRamRoleSet": list}}),
        )
    }
}

/// The host user a command of the fake's Cloud Assistant runs as when the
/// fake runs as root.
const NOBODY: u32 = 65534;

/// Sets up an instance's namespaces and runs its command: `$1` the
/// instance's files, `$2` the script (opened before its /tmp hides the
/// scratch directory), `$3` `drop` to become `nobody` on the host.
const SANDBOX: &str = include_str!("scripts/sandbox.sh");

/// Runs a Cloud Assistant script the way the fake models an instance:
/// `unshare` gives it its own mount, PID, network (loopback only), UTS
/// and IPC namespaces; the instance's own /tmp, /var/tmp, /root, /run and
/// /etc/hostname (kept between its commands) are bound over the host's;
/// the rest of the host's file system is seen as it is. As root the fake
/// runs the script as `nobody` on the host (setpriv, no capabilities, no
/// new privileges); as another user, as that user mapped to root in a new
/// user namespace. Output is stdout and stderr together, as Cloud
/// Assistant reports it; the whole namespace is killed after `limit`.
fn run_script(
    script: &[u8],
    dir: &std::path::Path,
    guest: &std::path::Path,
    limit: Duration,
) -> (i32, Vec<u8>, bool) {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    if std::fs::create_dir_all(dir).is_err() {
        return (-1, b"cannot make a scratch directory".to_vec(), false);
    }
    let path = dir.join("script.sh");
    if std::fs::write(&path, script).is_err() {
        return (-1, b"cannot write the script".to_vec(), false);
    }
    let out_path = dir.join("output");
    let Ok(out) = std::fs::File::create(&out_path) else {
        return (-1, b"cannot make the output file".to_vec(), false);
    };
    let Ok(err) = out.try_clone() else {
        return (-1, b"cannot share the output file".to_vec(), false);
    };
    let as_root = std::fs::metadata(dir)
        .map(|m| m.uid() == 0)
        .unwrap_or(false);
    let mut command = std::process::Command::new("unshare");
    if !as_root {
        command.arg("--user").arg("--map-root-user");
    }
    command
        .args([
            "--mount",
            "--pid",
            "--net",
            "--uts",
            "--ipc",
            "--fork",
            "--kill-child",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            SANDBOX,
            "sh",
        ])
        .arg(guest)
        .arg(&path)
        .arg(if as_root { "drop" } else { "keep" })
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    let Ok(mut child) = command.spawn() else {
        return (
            -1,
            b"the fake's Cloud Assistant needs unshare (util-linux) to give a command its namespaces"
                .to_vec(),
            false,
        );
    };
    let started = std::time::Instant::now();
    let (code, timed_out) = loop {
        match child.try_wait() {
            Ok(Some(status)) => break (status.code().unwrap_or(-1), false),
            // Killing unshare kills its child, the namespace's first
            // process, and with it every process of the command.
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break (-1, true);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break (-1, false),
        }
    };
    let mut output = Vec::new();
    if let Ok(f) = std::fs::File::open(&out_path) {
        let _ = f.take(64 << 20).read_to_end(&mut output);
    }
    (code, output, timed_out)
}

#[cfg(test)]
mod tests {
    /// The sandbox script parses; it takes its values as arguments, run for
    /// real by the fake_client tests.
    #[test]
    fn sandbox_script_parses() {
        let out = std::process::Command::new("/bin/sh")
            .args(["-n", "-c", super::SANDBOX, "sh", "/g 'x' $y", "/s", "drop"])
            .output()
            .expect("sh runs");
        assert!(out.status.success(), "{out:?}");
    }
}
