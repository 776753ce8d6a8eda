//! The REST API's wire types: what the control plane answers under
//! `/api/v1/*` and what it takes there, shared by the server (which builds
//! them) and the client (which reads them).
//!
//! Their JSON is the API: field names, casing, and whether an unknown value
//! is sent as `null` or left out are pinned by the tests below. Views the
//! client reads ignore fields they do not know (a newer server may add
//! some); requests the server takes refuse unknown fields (a typo is an
//! error, not a silently ignored option).

use crate::error::FieldError;
use crate::events::PhaseOutcome;
use crate::phase::{ErrorCode, PhaseName};
use crate::pool::{NodePool, NodePoolSpec, ObjectMeta};
use crate::state::{BuildStatus, DrainState, EventType, InstanceState, NodeStatus};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;

/// A list answer: `{"items": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Items<T> {
    pub items: Vec<T>,
}

impl<T> Items<T> {
    pub fn new(items: Vec<T>) -> Items<T> {
        Items { items }
    }
}

/// Every error answer: a stable code, the message, the invalid fields (an
/// empty list unless the request was invalid) and, for an attach refused
/// by its preflight, the reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorView {
    pub code: String,
    pub message: String,
    #[serde(default)]
    pub errors: Vec<FieldError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight: Option<Vec<PreflightReport>>,
}

// ---- pools

/// `?strict=true` on pool create and apply: refuse a pool whose snapshot is
/// stale (else a warning). `?dryRun=All`: every check of the write is made
/// and its answer given, nothing is stored (Kubernetes' server-side dry run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolWriteQuery {
    #[serde(default)]
    pub strict: bool,
    #[serde(default, rename = "dryRun", skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<DryRun>,
}

/// The one value of `?dryRun=` (as in Kubernetes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DryRun {
    All,
}

/// A pool as the API shows it: its document with the login password
/// hidden, when it was created, and its status. `warnings` only in the
/// answer to a create or apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolView {
    pub api_version: String,
    pub kind: String,
    pub metadata: PoolMetaView,
    pub spec: PoolSpecView,
    pub status: PoolStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warnings: Option<Vec<String>>,
}

impl PoolView {
    /// The view of `pool`: its password, if any, never leaves the server.
    pub fn new(pool: NodePool, creation_timestamp_ms: i64, status: PoolStatus) -> PoolView {
        let NodePool {
            api_version,
            kind,
            metadata: ObjectMeta { name, labels },
            spec,
        } = pool;
        PoolView {
            api_version,
            kind,
            metadata: PoolMetaView {
                name,
                labels,
                creation_timestamp_ms,
                generation: 0,
            },
            spec: PoolSpecView::new(spec),
            status,
            warnings: None,
        }
    }
}

/// `metadata` of a pool view: the document's, plus its creation time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolMetaView {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub creation_timestamp_ms: i64,
    /// Raised by every change of the spec (as a Kubernetes object's).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// A pool's spec as shown: `login` says whether a password is set
/// (`passwordSet`) instead of carrying it. `spec.login` here always has
/// no password.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSpecView {
    pub spec: NodePoolSpec,
    pub login: LoginView,
}

impl PoolSpecView {
    pub fn new(mut spec: NodePoolSpec) -> PoolSpecView {
        let login = LoginView {
            key_pair: spec.login.key_pair.clone(),
            password_set: spec.login.password.take().is_some(),
        };
        PoolSpecView { spec, login }
    }
}

/// `spec.login` of a pool view.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoginView {
    #[serde(default)]
    pub key_pair: Option<String>,
    #[serde(default)]
    pub password_set: bool,
}

// By hand: the spec's own `login` (which holds the password) is replaced by
// the view's, in place, so every other spec field keeps its one definition.
impl Serialize for PoolSpecView {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let mut spec = serde_json::to_value(&self.spec).map_err(S::Error::custom)?;
        let login = serde_json::to_value(&self.login).map_err(S::Error::custom)?;
        match spec.as_object_mut() {
            Some(fields) => {
                fields.insert("login".into(), login);
            }
            None => return Err(S::Error::custom("a pool spec is not a JSON object")),
        }
        spec.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for PoolSpecView {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut spec = Value::deserialize(deserializer)?;
        let login = match spec.as_object_mut() {
            Some(fields) => fields.remove("login"),
            None => return Err(D::Error::custom("a pool spec must be a JSON object")),
        };
        let login = match login {
            Some(login) => serde_json::from_value(login).map_err(D::Error::custom)?,
            None => LoginView::default(),
        };
        let mut spec: NodePoolSpec = serde_json::from_value(spec).map_err(D::Error::custom)?;
        spec.login.key_pair = login.key_pair.clone();
        Ok(PoolSpecView { spec, login })
    }
}

/// `status` of a pool view: its instances by state and its nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PoolStatus {
    /// Why the pool's instances are not being made, when they are not:
    /// the last error of a create being retried (with its attempt), else
    /// of an instance whose create failed for good. Absent when creates
    /// succeed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_error: Option<String>,
    /// `spec.replicas`.
    pub desired: i64,
    /// Instances that count toward the pool (not deleting, failed or detached).
    pub instances: i64,
    /// Pending or being created.
    pub pending: i64,
    pub running: i64,
    pub failed: i64,
    pub deleting_instances: i64,
    /// Nodes whose agent finished its phases.
    pub initialized: i64,
    pub ready: i64,
    /// Nodes being drained before their machine goes (cordoned, pods being
    /// evicted or a PodDisruptionBudget waited for).
    pub draining: i64,
    /// The pool itself is being deleted.
    pub deleting: bool,
    pub cluster_attached: bool,
    /// The generation the reconciler last planned (`metadata.generation`
    /// once it caught up).
    #[serde(skip_serializing_if = "is_zero")]
    pub observed_generation: i64,
    /// Instances counting toward the pool made from its current template
    /// (a Deployment's `updatedReplicas`): `knit get pools` UP-TO-DATE.
    #[serde(skip_serializing_if = "is_zero")]
    pub updated_replicas: i64,
    /// The hash of the pool's current template (what new machines are made
    /// from; a node with another is out of date).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutView>,
}

/// A rollout with nothing left to replace.
pub const ROLLOUT_COMPLETE: &str = "Complete";
/// Replacing out-of-date nodes.
pub const ROLLOUT_PROGRESSING: &str = "Progressing";
/// `spec.paused`: nothing replaced until `knit rollout resume`.
pub const ROLLOUT_PAUSED: &str = "Paused";
/// A replacement did not come up: the old nodes are left alone.
pub const ROLLOUT_STOPPED: &str = "Stopped";
/// `OnDelete`: out-of-date nodes are replaced only when removed.
pub const ROLLOUT_WAITING: &str = "Waiting";

/// Where a pool's rollout stands (`knit rollout status`, the console).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RolloutView {
    /// Complete, Progressing, Paused, Stopped or Waiting.
    pub state: String,
    /// Up-to-date instances, of them available (Ready and initialized),
    /// and out-of-date ones left.
    pub updated: i64,
    pub updated_available: i64,
    pub outdated: i64,
    /// Every instance counting toward the pool, and available ones.
    pub total: i64,
    pub available: i64,
    /// The pool's newest revision (`knit rollout undo --to-revision`).
    pub revision: i64,
    /// Why it stopped (`ProgressDeadlineExceeded`), and the whole story.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One revision of a pool (`GET /api/v1/pools/{name}/revisions`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRevisionView {
    pub revision: i64,
    pub generation: i64,
    pub template_hash: String,
    pub created_ms: i64,
    /// What changed from the revision before (`spec.` fields), if known.
    #[serde(default)]
    pub change: String,
}

/// `POST /api/v1/pools/{name}/rollout/undo`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RolloutUndoRequest {
    /// The revision to go back to; the one before the newest when absent.
    pub to_revision: Option<i64>,
}

/// The answer to `DELETE /api/v1/pools/{name}` (202).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolDeleting {
    pub name: String,
    pub deleting: bool,
}

/// `POST /api/v1/pools/{name}/scale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleRequest {
    pub replicas: i64,
    /// On scale-in, release the removed instances (else keep them,
    /// detached). Default: release.
    #[serde(default = "release_by_default")]
    pub release: bool,
}

fn release_by_default() -> bool {
    true
}

// ---- instances and nodes

/// One instance (`GET /api/v1/instances`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceView {
    pub name: String,
    pub pool: String,
    #[serde(default)]
    pub provider_id: Option<String>,
    pub state: InstanceState,
    #[serde(default)]
    pub ip: Option<String>,
    pub instance_type: String,
    #[serde(default)]
    pub last_error: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// Added to its pool by attach: knit never releases it on its own.
    #[serde(default)]
    pub added: bool,
    /// The hash of the pool template it was made from (none: added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
}

/// One node (`GET /api/v1/nodes`, `GET /api/v1/nodes/{name}`). `timeline`
/// and `cache` only in the answer about one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub name: String,
    pub instance: String,
    pub pool: String,
    pub status: NodeStatus,
    /// The agent's latest phase and its outcome.
    #[serde(default)]
    pub phase: Option<PhaseName>,
    #[serde(default)]
    pub phase_outcome: Option<PhaseOutcome>,
    #[serde(default)]
    pub error_code: Option<ErrorCode>,
    #[serde(default)]
    pub error: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// Once the user-data runner finished, every part counted (pre-user
    /// data, knit's stub, user data): `succeeded`, `failed: <which, why>`,
    /// `not run: <which, why>`, or `none: …` for a pool without any.
    #[serde(default)]
    pub user_data: Option<String>,
    /// The agent finished its last phase.
    #[serde(default)]
    pub initialized: bool,
    #[serde(default)]
    pub provider_id: Option<String>,
    #[serde(default)]
    pub ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<TimelineEntryView>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<NodeCacheView>,
    /// The drain of a node being removed (or drained for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainView>,
    /// The hash of the pool template its instance was made from (none:
    /// added by attach).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    /// Whether that is its pool's current template (`knit get nodes`
    /// UP-TO-DATE); absent when not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_date: Option<bool>,
}

/// A node's drain: where it stands, what blocks it, and (describing one
/// node) its steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainView {
    pub state: DrainState,
    pub started_ms: i64,
    pub updated_ms: i64,
    /// Why it has not ended, in a sentence (the pods left, the refusal).
    #[serde(default)]
    pub reason: Option<String>,
    /// The PodDisruptionBudget(s) that refused an eviction: `ns/name (what
    /// it asks, disruptions allowed)`, several separated by `; `.
    #[serde(default)]
    pub blocking_budget: Option<String>,
    #[serde(default)]
    pub pods_left: i64,
    #[serde(default)]
    pub evicted: i64,
    /// When the pool's `drain.timeoutSeconds` passed, if it did.
    #[serde(default)]
    pub timed_out_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<DrainStepView>>,
}

/// One step of a drain's timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainStepView {
    pub at_ms: i64,
    pub state: DrainState,
    pub message: String,
}

/// One phase event of a node, as the agent reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEntryView {
    pub phase: PhaseName,
    pub outcome: PhaseOutcome,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub error_code: Option<ErrorCode>,
    pub at_ms: i64,
    #[serde(default)]
    pub duration_ms: Option<i64>,
}

/// What a node took from caches (`knit describe node`); each part only
/// when known.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCacheView {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<PackageCacheView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<ImageCacheView>,
}

/// The Kubernetes package: from the data disk's cache, preloaded in the
/// node image, or downloaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PackageCacheView {
    pub cache_hit: bool,
    /// Taken from the node image (`knit image preload`): nothing downloaded.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub preloaded: bool,
    pub bytes_downloaded: u64,
}

/// The system images: counts from the node's published report, each
/// image's outcome when the report file inside the node could be read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageCacheView {
    #[serde(default)]
    pub hit: u64,
    #[serde(default)]
    pub miss: u64,
    #[serde(default)]
    pub bytes_pulled: u64,
    #[serde(default)]
    pub failed: u64,
    /// `node annotation` or `report file`.
    #[serde(default)]
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<ImageOutcomeView>>,
    /// Anything else the node's report file holds (e.g. `totalMillis`),
    /// passed through as the node wrote it.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// One image of the node's report file: its reference and, when every
/// pull failed, why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageOutcomeView {
    #[serde(default)]
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The rest of the image's entry (`cached`, `sizeBytes`, `bytesPulled`,
    /// `repoDigests`, `pullMillis`), passed through as the node wrote it.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `DELETE /api/v1/nodes/{name}`'s query.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteNodeQuery {
    /// Absent: release an instance knit created, keep one added by attach.
    #[serde(default)]
    pub release: Option<bool>,
}

/// The answer to `DELETE /api/v1/nodes/{name}` (202).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRemoving {
    /// The instance being removed.
    pub instance: String,
    /// Whether it is released (else kept, detached).
    pub release: bool,
    /// Added to its pool by attach.
    pub added: bool,
}

/// `GET /api/v1/nodes/{name}/logs`'s query; the answer is the file's text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLogsQuery {
    /// One of [`LOG_FILES`]' names; default `init`.
    #[serde(default)]
    pub file: Option<String>,
}

/// A node's log files the API reads: the name asked for and its path on
/// the node.
pub const LOG_FILES: &[(&str, &str)] = &[
    ("init", "/var/log/ack-deploy.log"),
    ("user-data", "/var/log/cloud-init-output.log"),
    ("error-code", "/var/log/ack-deploy-error-code.log"),
    ("error-msg", "/var/log/ack-deploy-error-msg.log"),
];

// ---- events and join tokens

/// `GET /api/v1/events`'s query: the newest `limit` events (default 500).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventsQuery {
    #[serde(default)]
    pub limit: Option<i64>,
}

/// One event (aggregated: `count` times between `atMs` and `lastMs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    pub id: i64,
    /// When it first happened.
    pub at_ms: i64,
    #[serde(default = "one")]
    pub count: i64,
    /// When it last happened.
    #[serde(default)]
    pub last_ms: i64,
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub object_kind: String,
    pub object_name: String,
    pub reason: String,
    pub message: String,
}

fn one() -> i64 {
    1
}

/// One join token (`GET /api/v1/jointokens`): never the token itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenView {
    pub token_id: String,
    pub instance: String,
    pub pool: String,
    pub created_ms: i64,
    pub expires_ms: i64,
    #[serde(default)]
    pub used_ms: Option<i64>,
}

// ---- API tokens

/// One API token (`GET /api/v1/tokens`): never the secret, nor its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiTokenView {
    /// `tok-` and 12 hex digits: what `knit token revoke` takes.
    pub id: String,
    pub role: crate::state::TokenRole,
    #[serde(default)]
    pub description: String,
    pub created_ms: i64,
    /// When it stops working; absent: never (until revoked).
    #[serde(default)]
    pub expires_ms: Option<i64>,
    /// Last request made with it, to within a minute; absent: never used.
    #[serde(default)]
    pub last_used_ms: Option<i64>,
    /// The request carrying it is this token (`knit token list` marks it).
    #[serde(default)]
    pub current: bool,
}

/// `POST /api/v1/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenCreateRequest {
    pub role: crate::state::TokenRole,
    /// Lifetime in seconds; absent: until revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    #[serde(default)]
    pub description: String,
}

/// The answer to `POST /api/v1/tokens`: the only time the secret is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenCreated {
    pub token: ApiTokenView,
    pub secret: String,
}

/// The answer to `DELETE /api/v1/tokens/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRevoked {
    pub id: String,
    pub revoked_ms: i64,
}

// ---- exec

/// `knit exec`'s default time limit for the command.
pub const EXEC_DEFAULT_TIMEOUT_SECONDS: u64 = 60;
/// The longest `timeoutSeconds` an exec request may ask for: `knit exec`
/// is for short commands; a request holds its connection that long.
pub const EXEC_MAX_TIMEOUT_SECONDS: u64 = 300;
/// Largest stdout, and largest stderr, `POST /api/v1/exec` answers: a
/// longer stream is cut there (`stdoutCut`/`stderrCut`). Smaller than the
/// provider's cap: it travels base64-encoded in one JSON answer.
pub const EXEC_API_OUTPUT_MAX_BYTES: usize = 4 << 20;

/// `POST /api/v1/exec`: run a command on one machine through its provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRequest {
    /// `node` (a node's name) or `instance` (knit's instance name).
    pub kind: String,
    pub name: String,
    /// The command and its arguments, run as given (no shell, no quoting).
    pub argv: Vec<String>,
    /// 1 ..= [`EXEC_MAX_TIMEOUT_SECONDS`]; default
    /// [`EXEC_DEFAULT_TIMEOUT_SECONDS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

/// The answer to an [`ExecRequest`]: the command's exit code and output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecResponse {
    /// knit's instance name and the provider's id of the machine.
    pub instance: String,
    pub provider_id: String,
    /// The command's exit status; -1 when it ended by a signal.
    pub exit_code: i32,
    /// base64 (standard alphabet) of the bytes the command wrote.
    pub stdout: String,
    pub stderr: String,
    /// The stream was longer than [`EXEC_API_OUTPUT_MAX_BYTES`] and was cut.
    pub stdout_cut: bool,
    pub stderr_cut: bool,
}

// ---- snapshots

/// A data-disk snapshot knit built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub id: String,
    /// The pool it was built from.
    pub pool: String,
    pub kubernetes_version: String,
    pub containerd_version: String,
    pub images: Vec<String>,
    pub size_bytes: i64,
    pub created_ms: i64,
}

/// One snapshot in `GET /api/v1/snapshots`: with whether it holds another
/// Kubernetes version than the cluster's, and the pools that use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotView {
    #[serde(flatten)]
    pub snapshot: Snapshot,
    pub stale: bool,
    pub cluster_kubernetes_version: String,
    pub used_by: Vec<String>,
}

/// The answer to `DELETE /api/v1/snapshots/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotDeleted {
    pub id: String,
    pub deleted: bool,
}

/// `POST /api/v1/snapshots`: build a snapshot of a pool's data disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotBuildRequest {
    pub pool: String,
    /// Business images to pull besides the system images.
    #[serde(default)]
    pub images: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default)]
    pub keep_builder: bool,
    /// Deadline of the `images` step (default 600 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images_timeout_seconds: Option<u64>,
}

/// One snapshot build (`GET /api/v1/snapshot-builds`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotBuildView {
    pub id: String,
    /// The snapshot's name at the provider.
    pub name: String,
    /// The source pool.
    pub pool: String,
    pub builder_pool: String,
    #[serde(default)]
    pub builder_instance: Option<String>,
    pub images: Vec<String>,
    pub keep_builder: bool,
    pub status: BuildStatus,
    /// Where the build is, or where it stopped.
    pub step: String,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub snapshot_id: Option<String>,
    pub started_ms: i64,
    #[serde(default)]
    pub finished_ms: Option<i64>,
}

/// One progress message of a build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildStepView {
    pub at_ms: i64,
    pub step: String,
    pub message: String,
}

/// A build with its messages and, once made, its snapshot
/// (`POST /api/v1/snapshots`, `GET /api/v1/snapshot-builds/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotBuildStatus {
    #[serde(flatten)]
    pub build: SnapshotBuildView,
    pub steps: Vec<BuildStepView>,
    /// No longer running (succeeded or failed).
    pub done: bool,
    #[serde(default)]
    pub snapshot: Option<Snapshot>,
}

// ---- attach

/// `POST /api/v1/pools/{pool}/attach`: add existing instances to a pool.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttachRequest {
    /// The provider's ids of the instances.
    pub instances: Vec<String>,
    #[serde(default)]
    pub format_data_disk: bool,
    #[serde(default)]
    pub keep_instance_name: bool,
    /// New login password (password pools); never stored, never shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default)]
    pub dry_run: bool,
}

// By hand: a request logged with `{:?}` must not show the password.
impl fmt::Debug for AttachRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttachRequest")
            .field("instances", &self.instances)
            .field("format_data_disk", &self.format_data_disk)
            .field("keep_instance_name", &self.keep_instance_name)
            .field("password", &self.password.as_ref().map(|_| "(redacted)"))
            .field("dry_run", &self.dry_run)
            .finish()
    }
}

/// The answer to an [`AttachRequest`]: the preflight of every instance
/// and, unless a dry run or refused, what became of each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachResponse {
    pub pool: String,
    /// `automatic`.
    pub mode: String,
    pub dry_run: bool,
    pub passed: bool,
    pub preflight: Vec<PreflightReport>,
    pub attached: Vec<AttachOutcome>,
}

/// One instance of an attach: added, or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AttachOutcome {
    Attached(AttachedInstance),
    Failed(AttachFailure),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachedInstance {
    pub provider_id: String,
    /// knit's instance name.
    pub instance: String,
    #[serde(default)]
    pub ip: Option<String>,
    /// Kept, or renamed to the pool rule's node name.
    pub node_name: String,
    pub old_disks: Vec<String>,
    pub new_disks: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachFailure {
    pub provider_id: String,
    pub error: String,
    /// The error's stable code.
    pub code: String,
}

/// `POST /api/v1/pools/{pool}/attach-script`: an attach command for a
/// machine to run itself (manual mode). The body may be empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttachScriptRequest {
    #[serde(default)]
    pub format_data_disk: bool,
    #[serde(default)]
    pub keep_instance_name: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_seconds: Option<i64>,
}

/// The answer to an [`AttachScriptRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachScriptResponse {
    pub pool: String,
    pub token_id: String,
    pub expires_ms: i64,
    /// `sha256:<hex>` of the control-plane CA the command trusts.
    pub ca_pin: String,
    /// The one line to paste on the machine.
    pub command: String,
    /// The script that line runs.
    pub script: String,
}

/// What the attach command tells of its machine (`POST /attach/v1/manual`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MachineFacts {
    pub os_id: String,
    pub os_version: String,
    pub os_name: String,
    pub swap: bool,
}

/// Every preflight check's result for one instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreflightReport {
    /// The provider's id of the instance.
    pub instance: String,
    pub results: Vec<PreflightResult>,
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreflightResult {
    /// Stable name, e.g. `same-vpc`.
    pub check: String,
    /// Stable code, e.g. `PreflightVpcMismatch` (also on a pass).
    pub code: String,
    pub status: PreflightStatus,
    pub message: String,
    /// What to do; empty on a pass.
    pub fix: String,
}

impl PreflightReport {
    /// The checks that failed and block.
    pub fn errors(&self) -> impl Iterator<Item = &PreflightResult> {
        self.results
            .iter()
            .filter(|r| r.status == PreflightStatus::Error)
    }

    /// No check blocks.
    pub fn passed(&self) -> bool {
        self.errors().next().is_none()
    }
}

/// The reports as a table, one line per check (what `knit attach` prints
/// and what a refused manual attach says).
pub fn preflight_table(reports: &[PreflightReport]) -> String {
    let mut out = String::new();
    for r in reports {
        out.push_str(&format!("instance {}\n", r.instance));
        out.push_str(&format!(
            "  {:<8} {:<28} {:<40} MESSAGE\n",
            "STATUS", "CHECK", "CODE"
        ));
        for c in &r.results {
            let status = match c.status {
                PreflightStatus::Pass => "pass",
                PreflightStatus::Error => "ERROR",
                PreflightStatus::Warning => "warning",
                PreflightStatus::Skipped => "skipped",
            };
            out.push_str(&format!(
                "  {status:<8} {:<28} {:<40} {}\n",
                c.check, c.code, c.message
            ));
            if !c.fix.is_empty() {
                out.push_str(&format!(
                    "  {:<8} {:<28} {:<40} fix: {}\n",
                    "", "", "", c.fix
                ));
            }
        }
    }
    out
}

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PreflightStatus {
    Pass,
    /// A failed check that blocks.
    Error,
    /// A failed check that does not block.
    Warning,
    /// Not applicable.
    Skipped,
}

// ---- servers

/// One knit server sharing the datastore (`GET /api/v1/servers`): on
/// SQLite there is one, always the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerView {
    /// Unique per process start (`<hostname>-<pid>-<random>`).
    pub id: String,
    /// The URL the server advertises to nodes and clients.
    pub address: String,
    pub hostname: String,
    pub pid: u32,
    pub version: String,
    /// This server holds the leader lease: it alone runs the reconciler,
    /// repair, attach roll-forward and snapshot recovery.
    pub leader: bool,
    /// Leader since (epoch milliseconds), when `leader`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_since_ms: Option<i64>,
    /// The lease's epoch: each new leader has a higher one, and a write of
    /// a leader's work carries it (an older epoch's write is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    pub started_ms: i64,
    pub heartbeat_ms: i64,
    /// No heartbeat within the lease time: probably gone.
    pub stale: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;
    use serde_json::json;

    /// `value` serializes to `wire` exactly, and `wire` reads back as `value`.
    fn pinned<T>(value: &T, wire: Value)
    where
        T: Serialize + DeserializeOwned + PartialEq + fmt::Debug,
    {
        assert_eq!(serde_json::to_value(value).unwrap(), wire);
        assert_eq!(&serde_json::from_value::<T>(wire).unwrap(), value);
    }

    fn pool_status() -> PoolStatus {
        PoolStatus {
            desired: 2,
            instances: 2,
            pending: 1,
            running: 1,
            failed: 0,
            deleting_instances: 0,
            initialized: 1,
            ready: 1,
            draining: 0,
            deleting: false,
            cluster_attached: true,
            create_error: None,
            ..PoolStatus::default()
        }
    }

    #[test]
    fn pool_view_hides_the_password_and_says_it_is_set() {
        let mut pool = NodePool::new("workers", NodePoolSpec::default());
        pool.spec.replicas = 2;
        pool.spec.login.password = Some("Secret-123".into());
        let mut view = PoolView::new(pool.clone(), 1_700_000_000_000, pool_status());
        let mut wire = serde_json::to_value(&pool).unwrap();
        wire["spec"]["login"] = json!({"keyPair": null, "passwordSet": true});
        wire["metadata"]["creationTimestampMs"] = json!(1_700_000_000_000i64);
        wire["status"] = json!({
            "desired": 2, "instances": 2, "pending": 1, "running": 1, "failed": 0,
            "deletingInstances": 0, "initialized": 1, "ready": 1, "draining": 0,
            "deleting": false, "clusterAttached": true,
        });
        assert!(!wire.to_string().contains("Secret-123"));
        pinned(&view, wire.clone());
        view.warnings = Some(vec!["spec.userData: late marker".into()]);
        wire["warnings"] = json!(["spec.userData: late marker"]);
        pinned(&view, wire);
    }

    #[test]
    fn pool_view_without_a_password_says_so() {
        let mut pool = NodePool::new("plain", NodePoolSpec::default());
        pool.spec.login.key_pair = Some("ops".into());
        let view = PoolView::new(pool, 1, PoolStatus::default());
        let wire = serde_json::to_value(&view).unwrap();
        assert_eq!(
            wire["spec"]["login"],
            json!({"keyPair": "ops", "passwordSet": false})
        );
        assert_eq!(wire["metadata"]["labels"], json!({}));
    }

    #[test]
    fn pool_deleting_and_scale() {
        pinned(
            &PoolDeleting {
                name: "workers".into(),
                deleting: true,
            },
            json!({"name": "workers", "deleting": true}),
        );
        let scale: ScaleRequest = serde_json::from_value(json!({"replicas": 3})).unwrap();
        assert_eq!(
            scale,
            ScaleRequest {
                replicas: 3,
                release: true
            }
        );
        pinned(
            &ScaleRequest {
                replicas: 0,
                release: false,
            },
            json!({"replicas": 0, "release": false}),
        );
        assert!(serde_json::from_value::<ScaleRequest>(json!({"replicas": 1, "x": 1})).is_err());
    }

    #[test]
    fn instance_view_sends_unknowns_as_null() {
        pinned(
            &Items::new(vec![InstanceView {
                name: "workers-abcde".into(),
                pool: "workers".into(),
                provider_id: None,
                state: InstanceState::Pending,
                ip: None,
                instance_type: "ecs.g7.large".into(),
                last_error: None,
                created_ms: 10,
                updated_ms: 20,
                added: false,
                template_hash: None,
            }]),
            json!({"items": [{
                "name": "workers-abcde", "pool": "workers", "providerId": null,
                "state": "Pending", "ip": null, "instanceType": "ecs.g7.large",
                "lastError": null, "createdMs": 10, "updatedMs": 20, "added": false,
            }]}),
        );
    }

    fn node() -> NodeView {
        NodeView {
            name: "cn-local.10.88.0.2".into(),
            instance: "workers-abcde".into(),
            pool: "workers".into(),
            status: NodeStatus::Ready,
            phase: Some(PhaseName::Join),
            phase_outcome: Some(PhaseOutcome::Failed),
            error_code: Some(ErrorCode::FailJoin),
            error: Some("kubelet did not register".into()),
            created_ms: 1,
            updated_ms: 2,
            user_data: None,
            initialized: false,
            provider_id: Some("i-1".into()),
            ip: None,
            timeline: None,
            cache: None,
            drain: None,
            template_hash: None,
            up_to_date: None,
        }
    }

    fn node_wire() -> Value {
        json!({
            "name": "cn-local.10.88.0.2", "instance": "workers-abcde", "pool": "workers",
            "status": "Ready", "phase": "join", "phaseOutcome": "failed",
            "errorCode": "FailJoin", "error": "kubelet did not register",
            "createdMs": 1, "updatedMs": 2, "userData": null,
            "initialized": false, "providerId": "i-1", "ip": null,
        })
    }

    #[test]
    fn node_view_in_a_list_has_no_timeline_or_cache() {
        pinned(&node(), node_wire());
    }

    #[test]
    fn node_view_of_a_node_being_drained() {
        let mut view = node();
        view.drain = Some(DrainView {
            state: DrainState::Blocked,
            started_ms: 10,
            updated_ms: 20,
            reason: Some("eviction refused".into()),
            blocking_budget: Some("default/web".into()),
            pods_left: 2,
            evicted: 1,
            timed_out_ms: None,
            steps: Some(vec![DrainStepView {
                at_ms: 10,
                state: DrainState::Draining,
                message: "cordoned".into(),
            }]),
        });
        let mut wire = node_wire();
        wire["drain"] = json!({
            "state": "Blocked", "startedMs": 10, "updatedMs": 20,
            "reason": "eviction refused", "blockingBudget": "default/web",
            "podsLeft": 2, "evicted": 1, "timedOutMs": null,
            "steps": [{"atMs": 10, "state": "Draining", "message": "cordoned"}],
        });
        pinned(&view, wire);
    }

    #[test]
    fn node_view_of_one_node_has_its_timeline_and_cache() {
        let mut view = node();
        view.timeline = Some(vec![
            TimelineEntryView {
                phase: PhaseName::TimeSync,
                outcome: PhaseOutcome::Started,
                reason: None,
                error_code: None,
                at_ms: 5,
                duration_ms: None,
            },
            TimelineEntryView {
                phase: PhaseName::Join,
                outcome: PhaseOutcome::Failed,
                reason: Some("timeout".into()),
                error_code: Some(ErrorCode::FailJoin),
                at_ms: 9,
                duration_ms: Some(4),
            },
        ]);
        view.cache = Some(NodeCacheView {
            package: Some(PackageCacheView {
                cache_hit: false,
                preloaded: false,
                bytes_downloaded: 1024,
            }),
            images: Some(ImageCacheView {
                hit: 2,
                miss: 1,
                bytes_pulled: 42,
                failed: 0,
                source: "report file".into(),
                images: Some(vec![
                    ImageOutcomeView {
                        image: "pause:3.9".into(),
                        error: None,
                        other: BTreeMap::from([("cached".to_string(), json!(true))]),
                    },
                    ImageOutcomeView {
                        image: "coredns:1.11".into(),
                        error: Some("not found".into()),
                        other: BTreeMap::from([("cached".to_string(), json!(false))]),
                    },
                ]),
                other: BTreeMap::from([("totalMillis".to_string(), json!(77))]),
            }),
        });
        let mut wire = node_wire();
        wire["timeline"] = json!([
            {"phase": "time-sync", "outcome": "started", "reason": null,
             "errorCode": null, "atMs": 5, "durationMs": null},
            {"phase": "join", "outcome": "failed", "reason": "timeout",
             "errorCode": "FailJoin", "atMs": 9, "durationMs": 4},
        ]);
        wire["cache"] = json!({
            "package": {"cacheHit": false, "bytesDownloaded": 1024},
            "images": {"hit": 2, "miss": 1, "bytesPulled": 42, "failed": 0,
                       "source": "report file", "totalMillis": 77,
                       "images": [{"image": "pause:3.9", "cached": true},
                                  {"image": "coredns:1.11", "cached": false,
                                   "error": "not found"}]},
        });
        pinned(&view, wire);
        pinned(&NodeCacheView::default(), json!({}));
    }

    /// An image entry as the kubelet stand-in writes it (knit-images.json)
    /// goes through the view unchanged.
    #[test]
    fn an_image_report_entry_keeps_its_json() {
        let entry = json!({
            "image": "registry.k8s.io/pause:3.10", "cached": false,
            "sizeBytes": 321, "bytesPulled": 321,
            "repoDigests": ["registry.k8s.io/pause@sha256:ab"], "pullMillis": 12,
            "error": "pull failed"
        });
        let view: ImageOutcomeView = serde_json::from_value(entry.clone()).unwrap();
        assert_eq!(view.image, "registry.k8s.io/pause:3.10");
        assert_eq!(view.error.as_deref(), Some("pull failed"));
        assert_eq!(serde_json::to_value(&view).unwrap(), entry);
    }

    #[test]
    fn node_removing() {
        pinned(
            &NodeRemoving {
                instance: "workers-abcde".into(),
                release: false,
                added: true,
            },
            json!({"instance": "workers-abcde", "release": false, "added": true}),
        );
    }

    #[test]
    fn event_and_join_token_views() {
        pinned(
            &EventView {
                id: 7,
                at_ms: 100,
                count: 3,
                last_ms: 300,
                event_type: EventType::Warning,
                object_kind: "Instance".into(),
                object_name: "-".into(),
                reason: "BootstrapRefused".into(),
                message: "unknown token (from 10.0.0.9)".into(),
            },
            json!({"id": 7, "atMs": 100, "count": 3, "lastMs": 300, "type": "Warning",
                   "objectKind": "Instance", "objectName": "-",
                   "reason": "BootstrapRefused", "message": "unknown token (from 10.0.0.9)"}),
        );
        pinned(
            &JoinTokenView {
                token_id: "abc123".into(),
                instance: "workers-abcde".into(),
                pool: "workers".into(),
                created_ms: 1,
                expires_ms: 2,
                used_ms: None,
            },
            json!({"tokenId": "abc123", "instance": "workers-abcde", "pool": "workers",
                   "createdMs": 1, "expiresMs": 2, "usedMs": null}),
        );
    }

    #[test]
    fn api_token_views() {
        use crate::state::TokenRole;
        pinned(
            &ApiTokenView {
                id: "tok-0123456789ab".into(),
                role: TokenRole::Operator,
                description: "ci".into(),
                created_ms: 1,
                expires_ms: Some(2),
                last_used_ms: None,
                current: false,
            },
            json!({"id": "tok-0123456789ab", "role": "operator", "description": "ci",
                   "createdMs": 1, "expiresMs": 2, "lastUsedMs": null, "current": false}),
        );
        pinned(
            &TokenCreateRequest {
                role: TokenRole::Viewer,
                ttl_seconds: Some(86400),
                description: String::new(),
            },
            json!({"role": "viewer", "ttlSeconds": 86400, "description": ""}),
        );
        // A role that is not one is refused naming the words allowed.
        let err = serde_json::from_value::<TokenCreateRequest>(json!({"role": "root"}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("viewer") && err.contains("admin"), "{err}");
    }

    #[test]
    fn exec_request_and_response() {
        pinned(
            &ExecRequest {
                kind: "node".into(),
                name: "n1".into(),
                argv: vec!["cat".into(), "/etc/hostname".into()],
                timeout_seconds: None,
            },
            json!({"kind": "node", "name": "n1", "argv": ["cat", "/etc/hostname"]}),
        );
        pinned(
            &ExecResponse {
                instance: "workers-abcde".into(),
                provider_id: "i-1".into(),
                exit_code: 0,
                stdout: "aGk=".into(),
                stderr: String::new(),
                stdout_cut: false,
                stderr_cut: false,
            },
            json!({"instance": "workers-abcde", "providerId": "i-1", "exitCode": 0,
                   "stdout": "aGk=", "stderr": "", "stdoutCut": false, "stderrCut": false}),
        );
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            id: "snap-1".into(),
            pool: "workers".into(),
            kubernetes_version: "1.31.1".into(),
            containerd_version: "1.7.20".into(),
            images: vec!["nginx:1".into()],
            size_bytes: 4096,
            created_ms: 3,
        }
    }

    #[test]
    fn snapshot_views() {
        let wire = json!({"id": "snap-1", "pool": "workers", "kubernetesVersion": "1.31.1",
                          "containerdVersion": "1.7.20", "images": ["nginx:1"],
                          "sizeBytes": 4096, "createdMs": 3});
        pinned(&snapshot(), wire.clone());
        let mut listed = wire.clone();
        listed["stale"] = json!(true);
        listed["clusterKubernetesVersion"] = json!("1.32.0");
        listed["usedBy"] = json!(["workers"]);
        pinned(
            &SnapshotView {
                snapshot: snapshot(),
                stale: true,
                cluster_kubernetes_version: "1.32.0".into(),
                used_by: vec!["workers".into()],
            },
            listed,
        );
        pinned(
            &SnapshotDeleted {
                id: "snap-1".into(),
                deleted: true,
            },
            json!({"id": "snap-1", "deleted": true}),
        );
        let build = SnapshotBuildView {
            id: "b-1".into(),
            name: "knit-b-1".into(),
            pool: "workers".into(),
            builder_pool: "workers-builder-a1b2c3".into(),
            builder_instance: None,
            images: vec![],
            keep_builder: false,
            status: BuildStatus::Succeeded,
            step: "done".into(),
            error: None,
            snapshot_id: Some("snap-1".into()),
            started_ms: 1,
            finished_ms: Some(9),
        };
        let build_wire = json!({"id": "b-1", "name": "knit-b-1", "pool": "workers",
            "builderPool": "workers-builder-a1b2c3", "builderInstance": null, "images": [],
            "keepBuilder": false, "status": "Succeeded", "step": "done", "error": null,
            "snapshotId": "snap-1", "startedMs": 1, "finishedMs": 9});
        pinned(&build, build_wire.clone());
        let mut status_wire = build_wire;
        status_wire["steps"] = json!([{"atMs": 2, "step": "images", "message": "pulled"}]);
        status_wire["done"] = json!(true);
        status_wire["snapshot"] = wire;
        pinned(
            &SnapshotBuildStatus {
                build,
                steps: vec![BuildStepView {
                    at_ms: 2,
                    step: "images".into(),
                    message: "pulled".into(),
                }],
                done: true,
                snapshot: Some(snapshot()),
            },
            status_wire,
        );
        let request: SnapshotBuildRequest =
            serde_json::from_value(json!({"pool": "workers"})).unwrap();
        assert_eq!(request.images, Vec::<String>::new());
        assert!(!request.keep_builder);
        assert!(
            serde_json::from_value::<SnapshotBuildRequest>(json!({"pool": "w", "x": 1})).is_err()
        );
    }

    fn report() -> PreflightReport {
        PreflightReport {
            instance: "i-1".into(),
            results: vec![PreflightResult {
                check: "same-vpc".into(),
                code: "PreflightVpcMismatch".into(),
                status: PreflightStatus::Error,
                message: "other VPC".into(),
                fix: "use the cluster's VPC".into(),
            }],
        }
    }

    #[test]
    fn attach_views() {
        let report_wire = json!({"instance": "i-1", "results": [{
            "check": "same-vpc", "code": "PreflightVpcMismatch", "status": "error",
            "message": "other VPC", "fix": "use the cluster's VPC"}]});
        pinned(&report(), report_wire.clone());
        pinned(
            &AttachResponse {
                pool: "workers".into(),
                mode: "automatic".into(),
                dry_run: false,
                passed: false,
                preflight: vec![report()],
                attached: vec![
                    AttachOutcome::Attached(AttachedInstance {
                        provider_id: "i-2".into(),
                        instance: "workers-x1y2z".into(),
                        ip: Some("10.0.0.2".into()),
                        node_name: "cn-local.10.0.0.2".into(),
                        old_disks: vec!["d-1".into()],
                        new_disks: vec![],
                    }),
                    AttachOutcome::Failed(AttachFailure {
                        provider_id: "i-3".into(),
                        error: "re-image failed".into(),
                        code: "Provider".into(),
                    }),
                ],
            },
            json!({"pool": "workers", "mode": "automatic", "dryRun": false, "passed": false,
            "preflight": [report_wire],
            "attached": [
                {"providerId": "i-2", "instance": "workers-x1y2z", "ip": "10.0.0.2",
                 "nodeName": "cn-local.10.0.0.2", "oldDisks": ["d-1"], "newDisks": []},
                {"providerId": "i-3", "error": "re-image failed", "code": "Provider"},
            ]}),
        );
        let request: AttachRequest =
            serde_json::from_value(json!({"instances": ["i-1"], "password": "Secret-123"}))
                .unwrap();
        assert!(!format!("{request:?}").contains("Secret-123"));
        assert!(serde_json::from_value::<AttachRequest>(json!({"instance": ["i-1"]})).is_err());
        pinned(
            &AttachScriptResponse {
                pool: "workers".into(),
                token_id: "abc123".into(),
                expires_ms: 5,
                ca_pin: "sha256:00".into(),
                command: "echo x | base64 -d | bash".into(),
                script: "#!/bin/bash\n".into(),
            },
            json!({"pool": "workers", "tokenId": "abc123", "expiresMs": 5, "caPin": "sha256:00",
                   "command": "echo x | base64 -d | bash", "script": "#!/bin/bash\n"}),
        );
        assert_eq!(
            serde_json::from_value::<AttachScriptRequest>(json!({})).unwrap(),
            AttachScriptRequest::default()
        );
        let facts: MachineFacts = serde_json::from_value(json!({"osId": "debian"})).unwrap();
        assert_eq!(facts.os_id, "debian");
    }

    #[test]
    fn error_view() {
        pinned(
            &ErrorView {
                code: "NotFound".into(),
                message: "pool \"x\" not found".into(),
                errors: vec![],
                preflight: None,
            },
            json!({"code": "NotFound", "message": "pool \"x\" not found", "errors": []}),
        );
        pinned(
            &ErrorView {
                code: "PreflightFailed".into(),
                message: "preflight failed for i-1".into(),
                errors: vec![],
                preflight: Some(vec![report()]),
            },
            json!({"code": "PreflightFailed", "message": "preflight failed for i-1",
                   "errors": [], "preflight": [serde_json::to_value(report()).unwrap()]}),
        );
    }

    #[test]
    fn views_read_by_the_client_ignore_unknown_fields() {
        let mut wire = node_wire();
        wire["addedLater"] = json!(1);
        assert_eq!(serde_json::from_value::<NodeView>(wire).unwrap(), node());
    }
}
