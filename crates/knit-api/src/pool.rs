//! The documents the control plane manages: `kind: NodePool` (docs/spec.md §4, the
//! template nodes are made from plus a desired count) and `kind: Cluster`
//! (one per server: version, region, VPC, quota, network).
//!
//! They reuse the node-level parts of [`NodeConfig`] (kubelet, containerd, OS
//! parameters, labels, taints, custom node name) and their validators, so a
//! pool that validates here yields NodeConfigs that validate on the node.
//! Enumerations are kept as strings so that a wrong value is reported with its
//! field and rule (HTTP 422) instead of a parse error.

use crate::config::*;
use crate::error::{ApiError, FieldError};
use crate::update::UpdateStrategy;
use crate::validate::{parse_kube_version, validate_labels, validate_taints, Errors};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Largest composed user data a provider accepts (ECS: 32 KB raw).
pub const USER_DATA_LIMIT_BYTES: usize = 32 * 1024;
/// Node quota of the "basic" edition (docs/spec.md §2.3).
pub const BASIC_NODE_QUOTA: i64 = 10;
/// Node quota of the "pro" edition.
pub const PRO_NODE_QUOTA: i64 = 5000;
pub const DEFAULT_JOIN_TIMEOUT_SECONDS: i64 = 900;
pub const MAX_DATA_DISKS: usize = 64;
/// A pool's default `image`: the node OS image `knit image build` makes.
pub const DEFAULT_IMAGE: &str = "debian-12";

/// Whether `image` has the shape of a cloud's image id (an ECS image id:
/// `aliyun_3_x64_20G_alibase_20240819.vhd`, `m-bp1…`): letters, digits,
/// '.', '_', '-', at most 128, starting with a letter or digit. Whether
/// the pool's provider knows it is the provider's to say (the server asks
/// it when the pool is written).
pub fn is_cloud_image_id(image: &str) -> bool {
    image.len() <= 128
        && image
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && image
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn quoted(s: &str) -> String {
    format!("{s:?}")
}

/// `metadata` of a managed object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ObjectMeta {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodePool {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: NodePoolSpec,
}

impl NodePool {
    pub fn new(name: &str, spec: NodePoolSpec) -> NodePool {
        NodePool {
            api_version: API_VERSION.to_string(),
            kind: "NodePool".to_string(),
            metadata: ObjectMeta {
                name: name.to_string(),
                labels: BTreeMap::new(),
            },
            spec,
        }
    }

    /// Parse YAML or JSON and validate; every invalid field at once.
    /// The fields the server sets (see [`NodePool::from_input`]) are
    /// accepted and ignored.
    pub fn from_yaml(text: &str) -> Result<NodePool, ApiError> {
        NodePool::from_input(text).map(|(pool, _)| pool)
    }

    /// Parse YAML or JSON and validate, as kubectl's apply does a document
    /// that `get -o yaml|json` printed: the fields only the server sets —
    /// `status`, `warnings`, `metadata.creationTimestampMs` and Kubernetes'
    /// read-only metadata (`creationTimestamp`, `generation`,
    /// `resourceVersion`, `uid`, `selfLink`, `managedFields`), and
    /// `spec.login.passwordSet` — are accepted and ignored; any other
    /// unknown field is still an error. Also returns what the view said
    /// that the pool cannot hold: whether a password was set.
    pub fn from_input(text: &str) -> Result<(NodePool, InputFacts), ApiError> {
        let parse = |e: serde_yaml_ng::Error| ApiError::Parse {
            what: "NodePool".to_string(),
            message: e.to_string(),
        };
        let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(parse)?;
        let (stripped, facts) = strip_server_fields(&mut doc);
        // Parsed from the text when nothing was taken out, so that an
        // error keeps its line and column.
        let pool: NodePool = if stripped {
            serde_yaml_ng::from_value(doc).map_err(parse)?
        } else {
            serde_yaml_ng::from_str(text).map_err(parse)?
        };
        pool.validate()?;
        Ok((pool, facts))
    }

    pub fn validate(&self) -> Result<(), ApiError> {
        let mut e = Errors::default();
        check_header(&self.api_version, &self.kind, "NodePool", &mut e);
        check_object_name("metadata.name", &self.metadata.name, &mut e);
        validate_labels("metadata.labels", &self.metadata.labels, &mut e);
        self.spec.validate("spec", &mut e);
        e.into_result()
    }

    /// Rules for replacing `old` by `self` (same name): hardening is fixed at
    /// creation (docs/spec.md §1.3.7), and so is the pool type.
    pub fn validate_update(&self, old: &NodePool) -> Result<(), ApiError> {
        let mut e = Errors::default();
        if self.spec.hardening != old.spec.hardening {
            e.add(
                "spec.hardening.profile",
                quoted(hardening_name(self.spec.hardening.profile)),
                format!(
                    "cannot be changed after the pool is created (it is {:?})",
                    hardening_name(old.spec.hardening.profile)
                ),
            );
        }
        if self.spec.pool_type != old.spec.pool_type {
            e.add(
                "spec.type",
                quoted(&self.spec.pool_type),
                format!(
                    "cannot be changed after the pool is created (it is {:?})",
                    old.spec.pool_type
                ),
            );
        }
        e.into_result()
    }
}

/// What a pool document said that the pool itself does not hold (fields
/// of the view `get` prints, read by `apply`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InputFacts {
    /// `spec.login.passwordSet: true`: the pool had a password, which the
    /// view never shows. Without `spec.login.password`, an apply keeps the
    /// stored one.
    pub password_set: bool,
}

/// Fields of `metadata` only the server sets (knit's, then Kubernetes').
const SERVER_METADATA: &[&str] = &[
    "creationTimestampMs",
    "creationTimestamp",
    "generation",
    "resourceVersion",
    "uid",
    "selfLink",
    "managedFields",
];

/// Takes the server-set fields out of a pool document: whether any was
/// there, and what they said.
fn strip_server_fields(doc: &mut serde_yaml_ng::Value) -> (bool, InputFacts) {
    use serde_yaml_ng::Value;
    let mut stripped = false;
    let mut facts = InputFacts::default();
    let Value::Mapping(top) = doc else {
        return (false, facts);
    };
    for key in ["status", "warnings"] {
        stripped |= top.remove(key).is_some();
    }
    if let Some(Value::Mapping(meta)) = top.get_mut("metadata") {
        for key in SERVER_METADATA {
            stripped |= meta.remove(*key).is_some();
        }
    }
    let login = top
        .get_mut("spec")
        .and_then(|spec| spec.get_mut("login"))
        .and_then(Value::as_mapping_mut);
    if let Some(login) = login {
        if let Some(set) = login.remove("passwordSet") {
            stripped = true;
            facts.password_set = set.as_bool().unwrap_or(false);
        }
    }
    (stripped, facts)
}

fn hardening_name(p: HardeningProfile) -> &'static str {
    match p {
        HardeningProfile::None => "none",
        HardeningProfile::Os => "os",
        HardeningProfile::MlpsL3 => "mlps-l3",
    }
}

fn check_header(api_version: &str, kind: &str, want_kind: &str, e: &mut Errors) {
    if api_version != API_VERSION {
        e.add(
            "apiVersion",
            quoted(api_version),
            format!("must be {API_VERSION}"),
        );
    }
    if kind != want_kind {
        e.add("kind", quoted(kind), format!("must be {want_kind}"));
    }
}

/// Object names are DNS-1123 labels: they appear in instance and node names.
fn check_object_name(field: &str, name: &str, e: &mut Errors) {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !ok {
        e.add(
            field,
            quoted(name),
            "must be 1 to 63 lowercase letters, digits or '-', alphanumeric at both ends",
        );
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodePoolSpec {
    /// regular | auto-scaling | auto-mode.
    #[serde(rename = "type")]
    pub pool_type: String,
    /// Desired node count.
    pub replicas: i64,
    /// Bounds for an auto-scaling pool.
    pub scaling: Option<ScalingSpec>,
    /// Instance types, in order of preference.
    pub instance_types: Vec<String>,
    /// Base OS image. On the local cloud: `debian-12` (default: the node
    /// image `knit image build` makes), `debian-12-preloaded` (that image
    /// with the package and agent preloaded, `knit image preload`), `host`
    /// (the host's root, read only: an explicit opt-in, instances see the
    /// host's files) or an absolute path to an image directory.
    pub image: String,
    pub zone: Option<String>,
    /// normal | enterprise.
    pub security_group_type: String,
    pub system_disk: SystemDisk,
    pub data_disks: Vec<PoolDataDisk>,
    pub login: Login,
    pub custom_node_name: Option<CustomNodeName>,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// Runs before knit's initialization (docs/spec.md §1.2).
    pub pre_user_data: String,
    /// Runs after initialization, in parallel with readiness (step 4).
    pub user_data: String,
    pub kubelet: KubeletConfig,
    pub containerd: ContainerdConfig,
    /// containerd (default) | none: a machine without a container runtime,
    /// for scale runs with the kubelet stand-in (docs/local-cloud.md).
    /// Left out when containerd, so that no template hash changed.
    #[serde(
        default = "crate::config::default_runtime",
        skip_serializing_if = "crate::config::is_default_runtime"
    )]
    pub runtime: String,
    pub os: OsConfig,
    pub components: OptionalComponents,
    /// Fixed at creation.
    pub hardening: Hardening,
    /// Register nodes with the `knit.dev/user-data-pending:NoSchedule` taint
    /// until user data succeeds.
    pub user_data_scheduling_gate: bool,
    /// A node not yet Ready this long after its instance was created is
    /// failed. Only the way to the first Ready: after that, `repair` applies.
    pub join_timeout_seconds: i64,
    /// Replace a node that failed to initialize.
    pub auto_replace: bool,
    /// What knit does to a node that was Ready once and is not any more.
    pub repair: RepairSpec,
    /// How a node of the pool is drained before its machine goes.
    pub drain: DrainSpec,
    /// The Kubernetes version the pool's nodes run: the cluster's when the
    /// pool is made without one; never newer than the cluster's nor more
    /// than three minors older (the kubelet's skew policy).
    pub kubernetes_version: Option<String>,
    /// How nodes a change left out of date are replaced
    /// (`crate::update`).
    pub update_strategy: UpdateStrategy,
    /// A paused pool's rollout stands still (`knit rollout pause`);
    /// scaling still works.
    pub paused: bool,
    /// When `knit rollout restart` asked for every node to be replaced
    /// (RFC 3339, as kubectl's `restartedAt` annotation): part of the
    /// template hash. Absent until the first restart (so no hash changes
    /// when knit is upgraded); an apply without it keeps the stored one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restarted_at: Option<String>,
}

pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: i64 = 600;
/// What a drain does when its timeout passes with pods left.
pub const DRAIN_ON_TIMEOUT: &[&str] = &["wait", "force"];

/// The drain every removal of a node runs first (scale-in, `knit delete
/// node`, pool delete, repair's replace, the snapshot builder): cordon, then
/// every pod but mirror and DaemonSet pods evicted through the Eviction API,
/// which honours PodDisruptionBudgets. After `timeoutSeconds` with pods
/// left, `wait` keeps the node cordoned and the removal pending (the
/// evictions go on being retried), `force` deletes the pods left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DrainSpec {
    pub timeout_seconds: i64,
    /// wait | force.
    pub on_timeout: String,
}

impl Default for DrainSpec {
    fn default() -> Self {
        DrainSpec {
            timeout_seconds: DEFAULT_DRAIN_TIMEOUT_SECONDS,
            on_timeout: "wait".to_string(),
        }
    }
}

impl DrainSpec {
    pub fn validate(&self, at: &str, e: &mut Errors) {
        e.range(
            &format!("{at}.timeoutSeconds"),
            self.timeout_seconds,
            1,
            86_400,
        );
        e.one_of(
            &format!("{at}.onTimeout"),
            &self.on_timeout,
            DRAIN_ON_TIMEOUT,
        );
    }

    /// Whether pods left after the timeout are deleted.
    pub fn forces(&self) -> bool {
        self.on_timeout == "force"
    }
}

/// Actions of node repair, in the order a default policy takes them.
pub const REPAIR_ACTIONS: &[&str] = &["restart-services", "reboot", "replace"];
pub const DEFAULT_REPAIR_NOT_READY_AFTER_SECONDS: i64 = 600;
pub const DEFAULT_REPAIR_WAIT_AFTER_ACTION_SECONDS: i64 = 300;
pub const DEFAULT_REPAIR_MAX_UNHEALTHY: &str = "33%";

/// Node repair, as managed node pools' auto-repair and Cluster API's
/// MachineHealthCheck: a node that was Ready once and has been NotReady or
/// Unknown for `notReadyAfterSeconds` is unhealthy; knit takes `actions` in
/// order, waiting `waitAfterActionSeconds` after each for the node to come
/// back, at most `maxParallel` nodes at a time, and not at all while more
/// than `maxUnhealthy` of the pool's nodes are unhealthy. Off unless asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RepairSpec {
    pub enabled: bool,
    pub not_ready_after_seconds: i64,
    /// A count (`2`) or a percentage of the pool's nodes (`"33%"`, rounded up).
    pub max_unhealthy: IntOrPercent,
    pub max_parallel: i64,
    pub wait_after_action_seconds: i64,
    /// Each of restart-services | reboot | replace, at most once, in the
    /// order taken.
    pub actions: Vec<String>,
}

impl Default for RepairSpec {
    fn default() -> Self {
        RepairSpec {
            enabled: false,
            not_ready_after_seconds: DEFAULT_REPAIR_NOT_READY_AFTER_SECONDS,
            max_unhealthy: IntOrPercent::Text(DEFAULT_REPAIR_MAX_UNHEALTHY.to_string()),
            max_parallel: 1,
            wait_after_action_seconds: DEFAULT_REPAIR_WAIT_AFTER_ACTION_SECONDS,
            actions: REPAIR_ACTIONS.iter().map(|a| a.to_string()).collect(),
        }
    }
}

/// A count or a percentage (`"33%"`), like Kubernetes' IntOrString.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IntOrPercent {
    Count(i64),
    Text(String),
}

impl std::fmt::Display for IntOrPercent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IntOrPercent::Count(n) => write!(f, "{n}"),
            IntOrPercent::Text(t) => write!(f, "{t:?}"),
        }
    }
}

impl IntOrPercent {
    /// The number it stands for out of `total`; a percentage rounds up, so
    /// that "33%" of a pool of 1 or 2 still allows one. `Err` is the rule
    /// a malformed value breaks.
    pub fn resolve(&self, total: usize) -> Result<usize, &'static str> {
        const RULE: &str = "must be a count >= 0 or a percentage from \"0%\" to \"100%\"";
        match self {
            IntOrPercent::Count(n) if *n >= 0 => Ok(*n as usize),
            IntOrPercent::Count(_) => Err(RULE),
            IntOrPercent::Text(t) => {
                let digits = t.strip_suffix('%').ok_or(RULE)?;
                if digits.is_empty()
                    || digits.len() > 3
                    || !digits.bytes().all(|b| b.is_ascii_digit())
                {
                    return Err(RULE);
                }
                let pct: usize = digits.parse().map_err(|_| RULE)?;
                if pct > 100 {
                    return Err(RULE);
                }
                Ok((total * pct).div_ceil(100))
            }
        }
    }
}

impl RepairSpec {
    pub fn validate(&self, at: &str, e: &mut Errors) {
        let f = |name: &str| format!("{at}.{name}");
        e.range(
            &f("notReadyAfterSeconds"),
            self.not_ready_after_seconds,
            60,
            86_400,
        );
        if let Err(rule) = self.max_unhealthy.resolve(0) {
            e.add(f("maxUnhealthy"), &self.max_unhealthy, rule);
        }
        e.range(&f("maxParallel"), self.max_parallel, 1, 100);
        e.range(
            &f("waitAfterActionSeconds"),
            self.wait_after_action_seconds,
            30,
            3600,
        );
        if self.enabled && self.actions.is_empty() {
            e.add(
                f("actions"),
                "[]",
                format!(
                    "must list at least one of {} when repair is enabled",
                    REPAIR_ACTIONS.join("|")
                ),
            );
        }
        let mut seen = BTreeSet::new();
        for (i, action) in self.actions.iter().enumerate() {
            let field = format!("{at}.actions[{i}]");
            e.one_of(&field, action, REPAIR_ACTIONS);
            if !seen.insert(action) {
                e.add(field, quoted(action), "is listed twice");
            }
        }
    }
}

impl Default for NodePoolSpec {
    fn default() -> Self {
        NodePoolSpec {
            pool_type: "regular".to_string(),
            replicas: 0,
            scaling: None,
            instance_types: vec!["ecs.g7.large".to_string()],
            image: DEFAULT_IMAGE.to_string(),
            zone: None,
            security_group_type: "normal".to_string(),
            system_disk: SystemDisk::default(),
            data_disks: Vec::new(),
            login: Login::default(),
            custom_node_name: None,
            labels: BTreeMap::new(),
            taints: Vec::new(),
            pre_user_data: String::new(),
            user_data: String::new(),
            kubelet: KubeletConfig::default(),
            containerd: ContainerdConfig::default(),
            runtime: crate::config::default_runtime(),
            os: OsConfig::default(),
            components: OptionalComponents::default(),
            hardening: Hardening::default(),
            user_data_scheduling_gate: false,
            join_timeout_seconds: DEFAULT_JOIN_TIMEOUT_SECONDS,
            auto_replace: false,
            repair: RepairSpec::default(),
            drain: DrainSpec::default(),
            kubernetes_version: None,
            update_strategy: UpdateStrategy::default(),
            paused: false,
            restarted_at: None,
        }
    }
}

/// An auto-scaling pool's bounds, and the cluster-autoscaler options of
/// this pool alone (its `NodeGroupGetOptions`, docs/autoscaling.md): each
/// one unset is the autoscaler's own flag.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ScalingSpec {
    pub min: i64,
    pub max: i64,
    /// A node below this utilization (requests / allocatable, 0 to 1) may
    /// be removed (`--scale-down-utilization-threshold`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_down_utilization_threshold: Option<f64>,
    /// The same for a node with a GPU, by GPU utilization.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_down_gpu_utilization_threshold: Option<f64>,
    /// How long a node must be unneeded before it is removed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_down_unneeded_seconds: Option<i64>,
    /// How long an unready node must be unneeded before it is removed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_down_unready_seconds: Option<i64>,
    /// How long the autoscaler waits for a new node to register.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_node_provision_seconds: Option<i64>,
    /// Scale to max or to zero all at once, never one node at a time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zero_or_max_node_scaling: Option<bool>,
    /// Leave DaemonSet pods out of a node's utilization.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignore_daemon_sets_utilization: Option<bool>,
}

impl ScalingSpec {
    fn validate_options(&self, at: &str, e: &mut Errors) {
        for (name, value) in [
            (
                "scaleDownUtilizationThreshold",
                self.scale_down_utilization_threshold,
            ),
            (
                "scaleDownGpuUtilizationThreshold",
                self.scale_down_gpu_utilization_threshold,
            ),
        ] {
            if let Some(v) = value.filter(|v| !(0.0..=1.0).contains(v)) {
                e.add(format!("{at}.{name}"), v, "must be from 0 to 1");
            }
        }
        for (name, value) in [
            ("scaleDownUnneededSeconds", self.scale_down_unneeded_seconds),
            ("scaleDownUnreadySeconds", self.scale_down_unready_seconds),
            ("maxNodeProvisionSeconds", self.max_node_provision_seconds),
        ] {
            if let Some(v) = value {
                e.range(&format!("{at}.{name}"), v, 0, 7 * 86_400);
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SystemDisk {
    pub category: String,
    #[serde(rename = "sizeGiB")]
    pub size_gib: i64,
}

impl Default for SystemDisk {
    fn default() -> Self {
        SystemDisk {
            category: "cloud_essd".to_string(),
            size_gib: 40,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PoolDataDisk {
    pub category: String,
    /// Ignored when the disk comes from a snapshot.
    #[serde(rename = "sizeGiB")]
    pub size_gib: i64,
    /// virtio (`vdb` …) | nvme (`nvme1n1` …).
    pub interface: String,
    /// ext4 | xfs.
    pub fs_type: String,
    pub snapshot_id: Option<String>,
    /// Let the agent format a blank disk and mount it as the runtime home.
    pub auto_format: bool,
    pub mount_target: Option<String>,
}

impl Default for PoolDataDisk {
    fn default() -> Self {
        PoolDataDisk {
            category: "cloud_essd".to_string(),
            size_gib: 40,
            interface: "virtio".to_string(),
            fs_type: "ext4".to_string(),
            snapshot_id: None,
            auto_format: true,
            mount_target: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Login {
    pub key_pair: Option<String>,
    pub password: Option<String>,
}

const DISK_CATEGORIES: &[&str] = &[
    "cloud",
    "cloud_efficiency",
    "cloud_ssd",
    "cloud_essd",
    "cloud_essd_entry",
    "cloud_auto",
];

impl NodePoolSpec {
    pub fn validate(&self, at: &str, e: &mut Errors) {
        let f = |name: &str| format!("{at}.{name}");
        e.one_of(
            &f("type"),
            &self.pool_type,
            &["regular", "auto-scaling", "auto-mode"],
        );
        if self.replicas < 0 || self.replicas > PRO_NODE_QUOTA {
            e.add(
                f("replicas"),
                self.replicas,
                format!("must be in [0, {PRO_NODE_QUOTA}]"),
            );
        }
        match (&self.scaling, self.pool_type.as_str()) {
            (Some(s), "auto-scaling") => {
                s.validate_options(&f("scaling"), e);
                if s.min < 0 || s.max > PRO_NODE_QUOTA {
                    e.add(
                        f("scaling"),
                        format!("{}..{}", s.min, s.max),
                        format!("min and max must be in [0, {PRO_NODE_QUOTA}]"),
                    );
                }
                if s.min > s.max {
                    e.add(
                        f("scaling.min"),
                        s.min,
                        format!("must be <= scaling.max ({})", s.max),
                    );
                }
                if self.replicas < s.min || self.replicas > s.max {
                    e.add(
                        f("replicas"),
                        self.replicas,
                        format!(
                            "must be in [scaling.min, scaling.max] = [{}, {}]",
                            s.min, s.max
                        ),
                    );
                }
            }
            (None, "auto-scaling") => e.add(
                f("scaling"),
                "null",
                "is required when type is auto-scaling",
            ),
            (Some(_), _) => e.add(
                f("scaling"),
                "set",
                "is allowed only when type is auto-scaling",
            ),
            (None, _) => {}
        }
        if self.instance_types.is_empty() || self.instance_types.len() > 10 {
            e.add(
                f("instanceTypes"),
                self.instance_types.len(),
                "must list 1 to 10 instance types",
            );
        }
        let mut seen = BTreeSet::new();
        for (i, t) in self.instance_types.iter().enumerate() {
            let ok = !t.is_empty()
                && t.len() <= 64
                && t.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-'
                });
            if !ok {
                e.add(
                    format!("{at}.instanceTypes[{i}]"),
                    quoted(t),
                    "must be an instance type name like ecs.g7.large",
                );
            }
            if !seen.insert(t) {
                e.add(
                    format!("{at}.instanceTypes[{i}]"),
                    quoted(t),
                    "is listed twice",
                );
            }
        }
        if !(self.image == DEFAULT_IMAGE
            || self.image == "host"
            || self.image.starts_with('/')
            || is_cloud_image_id(&self.image))
            || self.image.contains("..")
        {
            e.add(
                f("image"),
                quoted(&self.image),
                "must be \"debian-12\", \"host\", an absolute path without '..', or a cloud image id (letters, digits, '.', '_', '-'; e.g. an ECS image id, which only the ECS provider accepts)",
            );
        }
        if let Some(zone) = &self.zone {
            if zone.is_empty() || zone.contains(char::is_whitespace) {
                e.add(f("zone"), quoted(zone), "must be a zone id without spaces");
            }
        }
        e.one_of(
            &f("securityGroupType"),
            &self.security_group_type,
            &["normal", "enterprise"],
        );
        e.one_of(
            &f("systemDisk.category"),
            &self.system_disk.category,
            DISK_CATEGORIES,
        );
        e.range(
            &f("systemDisk.sizeGiB"),
            self.system_disk.size_gib,
            20,
            2048,
        );
        self.validate_data_disks(at, e);
        self.validate_login(at, e);
        if let Some(rule) = &self.custom_node_name {
            rule.validate(&f("customNodeName"), e);
        }
        validate_labels(&f("labels"), &self.labels, e);
        validate_taints(&f("taints"), &self.taints, e);
        for (name, script) in [
            ("preUserData", &self.pre_user_data),
            ("userData", &self.user_data),
        ] {
            if script.len() > USER_DATA_LIMIT_BYTES {
                e.add(
                    f(name),
                    format!("<{} bytes>", script.len()),
                    format!("must be at most {USER_DATA_LIMIT_BYTES} bytes"),
                );
            }
            if script.contains('\0') {
                e.add(f(name), "<binary>", "must be text without NUL bytes");
            }
        }
        self.kubelet.validate(&f("kubelet"), e);
        self.containerd.validate(&f("containerd"), e);
        e.one_of(&f("runtime"), &self.runtime, crate::config::RUNTIMES);
        self.os.validate(&f("os"), e);
        e.range(
            &f("joinTimeoutSeconds"),
            self.join_timeout_seconds,
            60,
            7200,
        );
        self.repair.validate(&f("repair"), e);
        self.drain.validate(&f("drain"), e);
        self.update_strategy.validate(&f("updateStrategy"), e);
        if let Some(v) = &self.kubernetes_version {
            if parse_kube_version(v).is_none() {
                e.add(
                    f("kubernetesVersion"),
                    quoted(v),
                    "must be a Kubernetes version like \"1.31.4\"",
                );
            }
        }
    }

    fn validate_data_disks(&self, at: &str, e: &mut Errors) {
        if self.data_disks.len() > MAX_DATA_DISKS {
            e.add(
                format!("{at}.dataDisks"),
                self.data_disks.len(),
                format!("must hold at most {MAX_DATA_DISKS} disks"),
            );
        }
        let runtime = crate::disk::runtime_data_disk(&self.data_disks).map(|(i, _)| i);
        for (i, d) in self.data_disks.iter().enumerate() {
            let f = |name: &str| format!("{at}.dataDisks[{i}].{name}");
            // The agent mounts only the runtime's disk: a target on another
            // would be silently ignored, so it is refused instead.
            if let (Some(t), Some(r)) = (&d.mount_target, runtime) {
                if i != r {
                    e.add(
                        f("mountTarget"),
                        quoted(t),
                        format!(
                            "is honoured only on the container runtime's data disk \
                             ({at}.dataDisks[{r}]: the last NVMe disk, else the last): knit \
                             does not mount the others; mount them from user data"
                        ),
                    );
                }
            }
            e.one_of(&f("category"), &d.category, DISK_CATEGORIES);
            if d.snapshot_id.is_none() {
                e.range(&f("sizeGiB"), d.size_gib, 40, 32768);
            }
            e.one_of(&f("interface"), &d.interface, &["virtio", "nvme"]);
            e.one_of(&f("fsType"), &d.fs_type, &["ext4", "xfs"]);
            if let Some(id) = &d.snapshot_id {
                let ok = !id.is_empty()
                    && id.len() <= 128
                    && id
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !ok {
                    e.add(
                        f("snapshotId"),
                        quoted(id),
                        "must be a snapshot id of letters, digits, '-' or '_'",
                    );
                }
            }
            if let Some(t) = &d.mount_target {
                if !t.starts_with('/') || t == "/" || t.contains("..") {
                    e.add(
                        f("mountTarget"),
                        quoted(t),
                        "must be an absolute path other than / without '..'",
                    );
                }
            }
        }
    }

    fn validate_login(&self, at: &str, e: &mut Errors) {
        match (&self.login.key_pair, &self.login.password) {
            (Some(_), Some(_)) => e.add(
                format!("{at}.login"),
                "keyPair and password",
                "give either keyPair or password, not both",
            ),
            (Some(k), None) => {
                let ok = !k.is_empty() && k.len() <= 128 && !k.contains(char::is_whitespace);
                if !ok {
                    e.add(
                        format!("{at}.login.keyPair"),
                        quoted(k),
                        "must be a key pair name (1-128 chars, no spaces)",
                    );
                }
            }
            (None, Some(p)) => {
                if let Err(rule) = check_password(p) {
                    // Never echo a secret back.
                    e.add(
                        format!("{at}.login.password"),
                        format!("<{} chars>", p.chars().count()),
                        rule,
                    );
                }
            }
            (None, None) => {}
        }
    }

    /// Node quota use of this pool: the most nodes it may hold.
    pub fn max_nodes(&self) -> i64 {
        match &self.scaling {
            Some(s) if self.pool_type == "auto-scaling" => s.max.max(self.replicas),
            _ => self.replicas,
        }
    }
}

/// ECS password rule: 8–30 characters, at least three of: lowercase,
/// uppercase, digits, special characters.
pub fn check_password(p: &str) -> Result<(), String> {
    let n = p.chars().count();
    if !(8..=30).contains(&n) {
        return Err("must be 8 to 30 characters".to_string());
    }
    const SPECIAL: &str = "()`~!@#$%^&*-_+=|{}[]:;'<>,.?/";
    if let Some(c) = p
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || SPECIAL.contains(*c)))
    {
        return Err(format!(
            "holds a character that is not allowed ({:?})",
            c.escape_debug().to_string()
        ));
    }
    let classes = [
        p.chars().any(|c| c.is_ascii_lowercase()),
        p.chars().any(|c| c.is_ascii_uppercase()),
        p.chars().any(|c| c.is_ascii_digit()),
        p.chars().any(|c| SPECIAL.contains(c)),
    ];
    if classes.iter().filter(|x| **x).count() < 3 {
        return Err(
            "must hold at least 3 of: lowercase, uppercase, digits, special characters".to_string(),
        );
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cluster {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ClusterSpec,
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster {
            api_version: API_VERSION.to_string(),
            kind: "Cluster".to_string(),
            metadata: ObjectMeta {
                name: "knit".to_string(),
                labels: BTreeMap::new(),
            },
            spec: ClusterSpec::default(),
        }
    }
}

impl Cluster {
    pub fn from_yaml(text: &str) -> Result<Cluster, ApiError> {
        let cluster: Cluster = serde_yaml_ng::from_str(text).map_err(|e| ApiError::Parse {
            what: "Cluster".to_string(),
            message: e.to_string(),
        })?;
        cluster.validate()?;
        Ok(cluster)
    }

    pub fn validate(&self) -> Result<(), ApiError> {
        let mut e = Errors::default();
        check_header(&self.api_version, &self.kind, "Cluster", &mut e);
        check_object_name("metadata.name", &self.metadata.name, &mut e);
        validate_labels("metadata.labels", &self.metadata.labels, &mut e);
        self.spec.validate("spec", &mut e);
        e.into_result()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClusterSpec {
    pub kubernetes_version: String,
    pub region: String,
    pub vpc: String,
    /// basic | pro.
    pub edition: String,
    /// Overrides the edition's node quota.
    pub node_quota: Option<i64>,
    /// CIDRs allowed to reach the API server.
    pub api_server_whitelist: Vec<String>,
    pub network: ClusterNetwork,
    /// embedded (served by knit) | external (a real cluster via kubeconfig).
    pub api_server: String,
    /// Path of the kubeconfig for an external API server.
    pub kubeconfig: Option<String>,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            kubernetes_version: DEFAULT_KUBERNETES_VERSION.to_string(),
            region: "local".to_string(),
            vpc: "vpc-local".to_string(),
            edition: "basic".to_string(),
            node_quota: None,
            api_server_whitelist: vec!["0.0.0.0/0".to_string()],
            network: ClusterNetwork::default(),
            api_server: "embedded".to_string(),
            kubeconfig: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClusterNetwork {
    /// terway | flannel.
    pub plugin: String,
    /// Terway: shared | exclusive ENI mode.
    pub terway_eni_mode: String,
    pub pod_cidr: String,
    pub service_cidr: String,
    pub ipv6: bool,
}

impl Default for ClusterNetwork {
    fn default() -> Self {
        ClusterNetwork {
            plugin: "flannel".to_string(),
            terway_eni_mode: "shared".to_string(),
            pod_cidr: "172.20.0.0/16".to_string(),
            service_cidr: "192.168.0.0/16".to_string(),
            ipv6: false,
        }
    }
}

impl ClusterSpec {
    pub fn validate(&self, at: &str, e: &mut Errors) {
        let f = |name: &str| format!("{at}.{name}");
        let pkg = KubernetesPackage {
            version: self.kubernetes_version.clone(),
            ..KubernetesPackage::default()
        };
        let mut pkg_errors = Errors::default();
        pkg.validate("x", &mut pkg_errors);
        if !pkg_errors.list.is_empty() {
            e.add(
                f("kubernetesVersion"),
                quoted(&self.kubernetes_version),
                "must be a Kubernetes version 1.20.0 or later, written MAJOR.MINOR.PATCH",
            );
        }
        for (name, value) in [("region", &self.region), ("vpc", &self.vpc)] {
            let ok = !value.is_empty()
                && value.len() <= 64
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !ok {
                e.add(
                    f(name),
                    quoted(value),
                    "must be 1 to 64 letters, digits, '-' or '_'",
                );
            }
        }
        e.one_of(&f("edition"), &self.edition, &["basic", "pro"]);
        if let Some(q) = self.node_quota {
            e.range(&f("nodeQuota"), q, 1, PRO_NODE_QUOTA);
        }
        for (i, cidr) in self.api_server_whitelist.iter().enumerate() {
            if parse_cidr(cidr).is_none() {
                e.add(
                    format!("{at}.apiServerWhitelist[{i}]"),
                    quoted(cidr),
                    "must be a CIDR such as 10.0.0.0/8",
                );
            }
        }
        e.one_of(
            &f("network.plugin"),
            &self.network.plugin,
            &["terway", "flannel"],
        );
        e.one_of(
            &f("network.terwayEniMode"),
            &self.network.terway_eni_mode,
            &["shared", "exclusive"],
        );
        for (name, cidr) in [
            ("network.podCidr", &self.network.pod_cidr),
            ("network.serviceCidr", &self.network.service_cidr),
        ] {
            if parse_cidr(cidr).is_none() {
                e.add(
                    f(name),
                    quoted(cidr),
                    "must be a CIDR such as 172.20.0.0/16",
                );
            }
        }
        if let (Some(a), Some(b)) = (
            parse_cidr(&self.network.pod_cidr),
            parse_cidr(&self.network.service_cidr),
        ) {
            if a.overlaps(&b) {
                e.add(
                    f("network.serviceCidr"),
                    quoted(&self.network.service_cidr),
                    format!(
                        "must not overlap network.podCidr ({})",
                        self.network.pod_cidr
                    ),
                );
            }
        }
        e.one_of(&f("apiServer"), &self.api_server, &["embedded", "external"]);
        match (self.api_server.as_str(), &self.kubeconfig) {
            ("external", None) => e.add(
                f("kubeconfig"),
                "null",
                "is required when apiServer is external",
            ),
            (_, Some(k)) if !k.starts_with('/') => {
                e.add(f("kubeconfig"), quoted(k), "must be an absolute path")
            }
            _ => {}
        }
    }

    /// The node quota in force: the explicit one, else the edition's.
    pub fn effective_node_quota(&self) -> i64 {
        self.node_quota.unwrap_or(if self.edition == "pro" {
            PRO_NODE_QUOTA
        } else {
            BASIC_NODE_QUOTA
        })
    }

    /// Whether `ip` is inside one of the API-server whitelist's CIDRs.
    pub fn whitelist_allows(&self, ip: std::net::IpAddr) -> bool {
        self.api_server_whitelist
            .iter()
            .filter_map(|c| parse_cidr(c))
            .any(|c| c.contains(ip))
    }
}

/// An IPv4 or IPv6 network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: std::net::IpAddr,
    pub prefix: u8,
}

impl Cidr {
    fn bits(ip: std::net::IpAddr) -> (u128, u8) {
        match ip {
            std::net::IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
            std::net::IpAddr::V6(v6) => (u128::from(v6), 128),
        }
    }

    fn mask(width: u8, prefix: u8) -> u128 {
        if prefix == 0 {
            0
        } else {
            (u128::MAX << (128 - u32::from(prefix))) >> (128 - u32::from(width))
        }
    }

    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        let (net, width) = Cidr::bits(self.addr);
        let (other, other_width) = Cidr::bits(ip);
        width == other_width
            && (net & Cidr::mask(width, self.prefix)) == (other & Cidr::mask(width, self.prefix))
    }

    pub fn overlaps(&self, other: &Cidr) -> bool {
        let shorter = if self.prefix <= other.prefix {
            self
        } else {
            other
        };
        let longer = if self.prefix <= other.prefix {
            other
        } else {
            self
        };
        shorter.contains(longer.addr)
    }
}

pub fn parse_cidr(s: &str) -> Option<Cidr> {
    let (addr, prefix) = s.split_once('/')?;
    let addr: std::net::IpAddr = addr.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    let width = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= width).then_some(Cidr { addr, prefix })
}

/// Renders a list of field errors as one line each; used by CLIs.
pub fn render_field_errors(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| format!("  - {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors_of(pool: &NodePool) -> Vec<FieldError> {
        match pool.validate() {
            Err(ApiError::Invalid(list)) => list,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    /// Issue 28 (5): what `knit get pool X -o yaml|json` prints is taken
    /// back by apply: the server-set fields are ignored, a genuinely
    /// unknown field is still refused.
    #[test]
    fn a_view_round_trips_and_unknown_fields_are_still_refused() {
        let mut pool = NodePool::new("workers", NodePoolSpec::default());
        pool.metadata.labels.insert("tier".into(), "web".into());
        pool.spec.replicas = 2;
        pool.spec.login.password = Some("Secret-123".into());
        let status = crate::views::PoolStatus {
            desired: 2,
            ready: 1,
            ..Default::default()
        };
        let view = crate::views::PoolView::new(pool.clone(), 1_700_000_000_000, status);
        let mut json = serde_json::to_value(&view).unwrap();
        json["metadata"]["generation"] = serde_json::json!(3);
        json["metadata"]["resourceVersion"] = serde_json::json!("42");
        for text in [
            serde_json::to_string_pretty(&json).unwrap(),
            serde_yaml_ng::to_string(&json).unwrap(),
        ] {
            let (back, facts) = NodePool::from_input(&text).unwrap_or_else(|e| panic!("{e}"));
            assert!(facts.password_set, "the view said a password was set");
            let mut want = pool.clone();
            want.spec.login.password = None;
            assert_eq!(back, want);
        }
        // Not a server field: still an error, with its name.
        json["metadata"]["nmae"] = serde_json::json!("x");
        let e = NodePool::from_input(&json.to_string()).unwrap_err();
        assert!(e.to_string().contains("unknown field `nmae`"), "{e}");
        let e = NodePool::from_yaml(
            "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {name: w}\nspec: {replicaz: 1}\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown field `replicaz`"), "{e}");
        assert!(
            e.to_string().contains("line 4"),
            "the position is kept: {e}"
        );
    }

    #[test]
    fn minimal_pool_is_valid() {
        let pool = NodePool::from_yaml("apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {name: workers}\nspec: {replicas: 3}\n").unwrap();
        assert_eq!(pool.spec.replicas, 3);
        assert_eq!(pool.spec.join_timeout_seconds, DEFAULT_JOIN_TIMEOUT_SECONDS);
    }

    #[test]
    fn runtime_is_containerd_or_none() {
        let mut pool = NodePool::new("light", NodePoolSpec::default());
        pool.spec.runtime = "none".into();
        assert!(pool.validate().is_ok());
        pool.spec.runtime = "docker".into();
        let errors = errors_of(&pool);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "spec.runtime");
        assert_eq!(errors[0].value, "\"docker\"");
        assert!(errors[0].rule.contains("containerd") && errors[0].rule.contains("none"));
        // The node's configuration is checked by the same rule.
        let config = crate::config::NodeConfig {
            runtime: "docker".into(),
            ..Default::default()
        };
        let Err(ApiError::Invalid(list)) = config.validate() else {
            panic!("a NodeConfig with runtime docker validated");
        };
        assert_eq!(list[0].field, "runtime");
    }

    #[test]
    fn every_invalid_field_is_listed() {
        let mut pool = NodePool::new("Bad_Name", NodePoolSpec::default());
        pool.spec.replicas = -1;
        pool.spec.pool_type = "spot".to_string();
        pool.spec.data_disks = vec![PoolDataDisk {
            size_gib: 10,
            fs_type: "btrfs".into(),
            ..Default::default()
        }];
        pool.spec.login.password = Some("short".to_string());
        pool.spec.kubelet.event_burst = 1000;
        pool.spec.taints = vec![Taint {
            key: "a".into(),
            value: String::new(),
            effect: "Never".into(),
        }];
        let errors = errors_of(&pool);
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        for want in [
            "metadata.name",
            "spec.replicas",
            "spec.type",
            "spec.dataDisks[0].sizeGiB",
            "spec.dataDisks[0].fsType",
            "spec.login.password",
            "spec.kubelet.eventBurst",
            "spec.taints[0].effect",
        ] {
            assert!(fields.contains(&want), "{want} missing from {fields:?}");
        }
        let password = errors
            .iter()
            .find(|e| e.field == "spec.login.password")
            .unwrap();
        assert!(
            !password.value.contains("short"),
            "password echoed: {password:?}"
        );
    }

    /// Only the runtime's disk is mounted by knit: a mountTarget on
    /// another is refused naming both disks, not silently ignored.
    #[test]
    fn a_mount_target_off_the_runtime_disk_is_refused() {
        let mut pool = NodePool::new("p", NodePoolSpec::default());
        pool.spec.data_disks = vec![
            PoolDataDisk {
                mount_target: Some("/mnt/logs".into()),
                ..Default::default()
            },
            PoolDataDisk {
                mount_target: Some("/var/lib/container".into()),
                ..Default::default()
            },
        ];
        let errors = errors_of(&pool);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "spec.dataDisks[0].mountTarget");
        assert!(errors[0].rule.contains("spec.dataDisks[1]"), "{errors:?}");
        pool.spec.data_disks[0].mount_target = None;
        assert!(pool.validate().is_ok());
        // An NVMe disk is the runtime's wherever it stands.
        pool.spec.data_disks[0].interface = "nvme".into();
        let errors = errors_of(&pool);
        assert_eq!(
            errors[0].field, "spec.dataDisks[1].mountTarget",
            "{errors:?}"
        );
    }

    #[test]
    fn snapshot_disk_ignores_size_and_scaling_rules_hold() {
        let mut spec = NodePoolSpec {
            data_disks: vec![PoolDataDisk {
                size_gib: 0,
                snapshot_id: Some("snap-1".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut e = Errors::default();
        spec.validate("spec", &mut e);
        assert!(e.list.is_empty(), "{:?}", e.list);

        spec.pool_type = "auto-scaling".to_string();
        spec.scaling = Some(ScalingSpec {
            min: 2,
            max: 1,
            scale_down_utilization_threshold: Some(1.5),
            ..Default::default()
        });
        let mut e = Errors::default();
        spec.validate("spec", &mut e);
        let fields: Vec<&str> = e.list.iter().map(|e| e.field.as_str()).collect();
        assert!(fields.contains(&"spec.scaling.min"), "{fields:?}");
        assert!(fields.contains(&"spec.replicas"), "{fields:?}");
        assert!(
            fields.contains(&"spec.scaling.scaleDownUtilizationThreshold"),
            "{fields:?}"
        );
    }

    #[test]
    fn hardening_and_type_are_immutable() {
        let old = NodePool::new("p", NodePoolSpec::default());
        let mut new = old.clone();
        new.spec.hardening.profile = HardeningProfile::MlpsL3;
        new.spec.pool_type = "auto-mode".to_string();
        match new.validate_update(&old) {
            Err(ApiError::Invalid(list)) => {
                assert_eq!(list.len(), 2);
                assert_eq!(list[0].field, "spec.hardening.profile");
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
        assert!(old.validate_update(&old).is_ok());
    }

    #[test]
    fn repair_policy_defaults_and_errors() {
        let pool = NodePool::from_yaml(
            "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {name: p}\nspec:\n  repair: {enabled: true, maxUnhealthy: 2}\n",
        )
        .unwrap();
        let r = &pool.spec.repair;
        assert!(r.enabled);
        assert_eq!(r.max_unhealthy, IntOrPercent::Count(2));
        assert_eq!(r.not_ready_after_seconds, 600);
        assert_eq!(r.max_parallel, 1);
        assert_eq!(r.actions, vec!["restart-services", "reboot", "replace"]);
        assert!(!RepairSpec::default().enabled, "repair is off unless asked");

        let pct = |t: &str| IntOrPercent::Text(t.to_string());
        assert_eq!(pct("33%").resolve(3), Ok(1));
        assert_eq!(pct("33%").resolve(1), Ok(1), "rounds up");
        assert_eq!(pct("33%").resolve(10), Ok(4));
        assert_eq!(pct("0%").resolve(10), Ok(0));
        assert_eq!(pct("100%").resolve(7), Ok(7));
        assert!(pct("101%").resolve(1).is_err());
        assert!(pct("33").resolve(1).is_err());
        assert!(pct("-1%").resolve(1).is_err());
        assert!(IntOrPercent::Count(-1).resolve(1).is_err());

        let mut bad = NodePool::new("p", NodePoolSpec::default());
        bad.spec.repair = RepairSpec {
            enabled: true,
            not_ready_after_seconds: 5,
            max_unhealthy: pct("half"),
            max_parallel: 0,
            wait_after_action_seconds: 1,
            actions: vec!["reboot".into(), "reboot".into(), "pray".into()],
        };
        match bad.validate() {
            Err(ApiError::Invalid(list)) => {
                let got: Vec<(&str, &str)> = list
                    .iter()
                    .map(|e| (e.field.as_str(), e.value.as_str()))
                    .collect();
                assert_eq!(
                    got,
                    vec![
                        ("spec.repair.notReadyAfterSeconds", "5"),
                        ("spec.repair.maxUnhealthy", "\"half\""),
                        ("spec.repair.maxParallel", "0"),
                        ("spec.repair.waitAfterActionSeconds", "1"),
                        ("spec.repair.actions[1]", "\"reboot\""),
                        ("spec.repair.actions[2]", "\"pray\""),
                    ]
                );
                assert!(list[1].rule.contains("percentage"), "{}", list[1].rule);
                assert!(list[5].rule.contains("restart-services|reboot|replace"));
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
        bad.spec.repair = RepairSpec {
            enabled: true,
            actions: Vec::new(),
            ..RepairSpec::default()
        };
        match bad.validate() {
            Err(ApiError::Invalid(list)) => assert_eq!(list[0].field, "spec.repair.actions"),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn drain_settings_default_and_errors() {
        let pool = NodePool::from_yaml(
            "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {name: p}\nspec:\n  drain: {onTimeout: force}\n",
        )
        .unwrap();
        assert_eq!(pool.spec.drain.timeout_seconds, 600);
        assert!(pool.spec.drain.forces());
        assert!(!DrainSpec::default().forces(), "wait by default");
        assert_eq!(DrainSpec::default().timeout_seconds, 600);

        let mut bad = NodePool::new("p", NodePoolSpec::default());
        bad.spec.drain = DrainSpec {
            timeout_seconds: -1,
            on_timeout: "evict-harder".into(),
        };
        match bad.validate() {
            Err(ApiError::Invalid(list)) => {
                let got: Vec<(&str, &str)> = list
                    .iter()
                    .map(|e| (e.field.as_str(), e.value.as_str()))
                    .collect();
                assert_eq!(
                    got,
                    vec![
                        ("spec.drain.timeoutSeconds", "-1"),
                        ("spec.drain.onTimeout", "\"evict-harder\""),
                    ]
                );
                assert!(list[1].rule.contains("wait"), "{}", list[1].rule);
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
        // An unknown field under drain is a parse error naming it.
        let err = NodePool::from_yaml(
            "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {name: p}\nspec:\n  drain: {timeout: 5}\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("timeout"), "{err}");
    }

    #[test]
    fn passwords() {
        assert!(check_password("Abcdef12").is_ok());
        assert!(check_password("abcdefgh").is_err());
        assert!(check_password("Ab1").is_err());
        assert!(check_password("abcdef1!").is_ok());
        assert!(check_password("abc def1!A").is_err());
    }

    #[test]
    fn cluster_defaults_and_errors() {
        let c = Cluster::default();
        assert!(c.validate().is_ok());
        assert_eq!(c.spec.effective_node_quota(), BASIC_NODE_QUOTA);
        assert!(c.spec.whitelist_allows("10.213.0.5".parse().unwrap()));

        let mut bad = Cluster::default();
        bad.spec.kubernetes_version = "1.19.0".into();
        bad.spec.api_server_whitelist = vec!["10.0.0.0/33".into()];
        bad.spec.network.plugin = "calico".into();
        bad.spec.network.service_cidr = "172.20.5.0/24".into();
        match bad.validate() {
            Err(ApiError::Invalid(list)) => {
                let fields: Vec<&str> = list.iter().map(|e| e.field.as_str()).collect();
                assert_eq!(
                    fields,
                    vec![
                        "spec.kubernetesVersion",
                        "spec.apiServerWhitelist[0]",
                        "spec.network.plugin",
                        "spec.network.serviceCidr"
                    ]
                );
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn cidr_math() {
        let c = parse_cidr("10.213.0.0/24").unwrap();
        assert!(c.contains("10.213.0.200".parse().unwrap()));
        assert!(!c.contains("10.213.1.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        assert!(parse_cidr("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        assert!(parse_cidr("10.0.0.0/8").unwrap().overlaps(&c));
        assert!(parse_cidr("fd00::/8")
            .unwrap()
            .contains("fd12::1".parse().unwrap()));
    }
}
