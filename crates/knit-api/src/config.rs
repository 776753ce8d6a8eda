//! The node configuration document (`kind: NodeConfig`) and the parts of it a
//! node pool shares (kubelet, containerd, OS parameters, labels, taints …).
//!
//! Every field has a default, so a document holding only `apiVersion` and
//! `kind` is valid. Numbers are read as `i64` so that an out-of-range value is
//! reported by validation with its rule, not as a type error.

use crate::error::ApiError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const API_VERSION: &str = "knit.dev/v1alpha1";
pub const DEFAULT_KUBERNETES_VERSION: &str = "1.31.4";
pub const DEFAULT_DATA_DISK_MOUNT: &str = "/var/lib/container";
/// The startup taint used by the optional user-data scheduling gate.
pub const USER_DATA_GATE_TAINT: &str = "knit.dev/user-data-pending";
/// A node's container runtime: containerd (the default), or none — a
/// machine for scale runs whose kubelet (the stand-in, `--lightweight`)
/// runs no containers; a real kubelet cannot start without a runtime.
pub const RUNTIME_CONTAINERD: &str = "containerd";
pub const RUNTIME_NONE: &str = "none";
pub const RUNTIMES: &[&str] = &[RUNTIME_CONTAINERD, RUNTIME_NONE];

/// `runtime`'s default, left out when written (so that documents and
/// template hashes from before the field are unchanged).
pub fn default_runtime() -> String {
    RUNTIME_CONTAINERD.to_string()
}

pub fn is_default_runtime(runtime: &str) -> bool {
    runtime == RUNTIME_CONTAINERD
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub cluster: ClusterAccess,
    #[serde(default)]
    pub node: NodeIdentity,
    #[serde(default)]
    pub kubernetes: KubernetesPackage,
    #[serde(default)]
    pub kubelet: KubeletConfig,
    #[serde(default)]
    pub containerd: ContainerdConfig,
    /// containerd | none ([`RUNTIMES`]).
    #[serde(
        default = "default_runtime",
        skip_serializing_if = "is_default_runtime"
    )]
    pub runtime: String,
    #[serde(default)]
    pub os: OsConfig,
    #[serde(default)]
    pub data_disk: DataDiskConfig,
    #[serde(default)]
    pub components: OptionalComponents,
    #[serde(default)]
    pub base_packages: BasePackages,
    #[serde(default)]
    pub hardening: Hardening,
    #[serde(default)]
    pub time_sync: TimeSync,
    #[serde(default)]
    pub user_data: UserDataGate,
    #[serde(default)]
    pub join: JoinSettings,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            api_version: API_VERSION.to_string(),
            kind: "NodeConfig".to_string(),
            cluster: ClusterAccess::default(),
            node: NodeIdentity::default(),
            kubernetes: KubernetesPackage::default(),
            kubelet: KubeletConfig::default(),
            containerd: ContainerdConfig::default(),
            runtime: default_runtime(),
            os: OsConfig::default(),
            data_disk: DataDiskConfig::default(),
            components: OptionalComponents::default(),
            base_packages: BasePackages::default(),
            hardening: Hardening::default(),
            time_sync: TimeSync::default(),
            user_data: UserDataGate::default(),
            join: JoinSettings::default(),
        }
    }
}

impl NodeConfig {
    /// Parse YAML or JSON (JSON is YAML) and validate. All errors at once.
    pub fn from_yaml(text: &str) -> Result<NodeConfig, ApiError> {
        let config: NodeConfig = serde_yaml_ng::from_str(text).map_err(|e| ApiError::Parse {
            what: "NodeConfig".to_string(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    pub fn to_yaml(&self) -> Result<String, crate::ser::SerializeError> {
        crate::ser::yaml("NodeConfig", self)
    }

    /// Whether the node runs a container runtime (`runtime` is not none).
    pub fn has_runtime(&self) -> bool {
        self.runtime != RUNTIME_NONE
    }
}

/// How the node reaches the cluster and the control plane.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClusterAccess {
    /// API server URL, e.g. `https://10.0.0.1:6443`.
    pub endpoint: Option<String>,
    /// Cluster CA certificate (PEM). If absent, it is discovered from the
    /// `cluster-info` ConfigMap and checked against `caPin`.
    pub ca_cert: Option<String>,
    /// `sha256:<hex of the CA's SubjectPublicKeyInfo>`.
    pub ca_pin: Option<String>,
    /// Bootstrap token `[a-z0-9]{6}.[a-z0-9]{16}`.
    pub bootstrap_token: Option<String>,
    /// Control-plane URL that receives phase events.
    pub report_url: Option<String>,
    pub report_token: Option<String>,
    /// CA (PEM) of the control plane, trusted for `reportUrl` and an https
    /// package URL. Distinct from the cluster CA.
    pub control_plane_ca_cert: Option<String>,
}

/// Who the node is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodeIdentity {
    /// Region id; with the instance id it forms the node ID `<region>.<instance-id>`.
    pub region: Option<String>,
    pub instance_id: Option<String>,
    /// Node IP; detected from the default route when absent.
    pub ip: Option<String>,
    /// Use this exact node name (e.g. "keep instance name" when adding an
    /// existing instance). Wins over `customName`.
    pub name: Option<String>,
    pub custom_name: Option<CustomNodeName>,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
}

/// Custom node name = prefix + node IP + suffix (docs/spec.md §1.3.1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CustomNodeName {
    pub prefix: String,
    pub suffix: String,
}

impl CustomNodeName {
    pub fn render(&self, ip: &str) -> String {
        format!("{}{}{}", self.prefix, ip, self.suffix)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Taint {
    pub key: String,
    #[serde(default)]
    pub value: String,
    pub effect: String,
}

/// Which Kubernetes version to install and where its package comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubernetesPackage {
    pub version: String,
    /// Base URL of a package mirror serving `kubernetes-<version>-linux-amd64.tar.gz`,
    /// or the full URL of the tarball.
    pub url: Option<String>,
    /// A directory holding the tarball (or an unpacked `pkg/kubernetes`).
    pub dir: Option<String>,
    /// Expected sha256 of the tarball (hex).
    pub sha256: Option<String>,
    /// Download attempts before giving up.
    pub download_attempts: i64,
}

impl Default for KubernetesPackage {
    fn default() -> Self {
        KubernetesPackage {
            version: DEFAULT_KUBERNETES_VERSION.to_string(),
            url: None,
            dir: None,
            sha256: None,
            download_attempts: 3,
        }
    }
}

impl KubernetesPackage {
    pub fn tarball_name(&self) -> String {
        format!("kubernetes-{}-linux-amd64.tar.gz", self.version)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ReservedMemory {
    pub numa_node: i64,
    pub limits: BTreeMap<String, String>,
}

/// kubelet parameters, named as in `KubeletConfiguration` (docs/spec.md §4.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeletConfig {
    #[serde(rename = "eventRecordQPS")]
    pub event_record_qps: i64,
    pub event_burst: i64,
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: i64,
    #[serde(rename = "kubeAPIBurst")]
    pub kube_api_burst: i64,
    #[serde(rename = "registryPullQPS")]
    pub registry_pull_qps: i64,
    pub registry_burst: i64,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: i64,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: i64,
    pub container_log_max_files: i64,
    pub container_log_max_size: String,
    pub cpu_manager_policy: String,
    pub memory_manager_policy: String,
    pub topology_manager_policy: String,
    pub pod_pids_limit: i64,
    pub read_only_port: i64,
    pub serialize_image_pulls: bool,
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: bool,
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub cpu_cfs_quota_period: String,
    pub allowed_unsafe_sysctls: Vec<String>,
    pub eviction_hard: BTreeMap<String, String>,
    pub eviction_soft: BTreeMap<String, String>,
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    pub kube_reserved: BTreeMap<String, String>,
    pub system_reserved: BTreeMap<String, String>,
    pub max_pods: i64,
    pub feature_gates: BTreeMap<String, bool>,
    pub reserved_memory: Vec<ReservedMemory>,
    /// Address and port the kubelet serves on.
    pub address: String,
    pub port: i64,
    /// Extra flags written to `kubelet-customized-args.conf` as `--k=v`.
    pub customized_args: BTreeMap<String, String>,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        let eviction_hard = [
            ("imagefs.available", "15%"),
            ("memory.available", "300Mi"),
            ("nodefs.available", "10%"),
            ("nodefs.inodesFree", "5%"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        KubeletConfig {
            event_record_qps: 5,
            event_burst: 10,
            kube_api_qps: 5,
            kube_api_burst: 10,
            registry_pull_qps: 5,
            registry_burst: 10,
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            container_log_max_files: 10,
            container_log_max_size: "100Mi".to_string(),
            cpu_manager_policy: "none".to_string(),
            memory_manager_policy: "None".to_string(),
            topology_manager_policy: "none".to_string(),
            pod_pids_limit: 16384,
            read_only_port: 0,
            serialize_image_pulls: false,
            cpu_cfs_quota: true,
            cpu_cfs_quota_period: "100ms".to_string(),
            allowed_unsafe_sysctls: Vec::new(),
            eviction_hard,
            eviction_soft: BTreeMap::new(),
            eviction_soft_grace_period: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            system_reserved: BTreeMap::new(),
            max_pods: 110,
            feature_gates: BTreeMap::new(),
            reserved_memory: Vec::new(),
            address: "0.0.0.0".to_string(),
            port: 10250,
            customized_args: BTreeMap::new(),
        }
    }
}

/// A systemd-style resource limit: a number or `infinity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Limit {
    Number(i64),
    Text(String),
}

impl Limit {
    pub fn infinity() -> Limit {
        Limit::Text("infinity".to_string())
    }

    /// The value as systemd and `setrlimit` take it; `None` means infinity.
    pub fn value(&self) -> Option<i64> {
        match self {
            Limit::Number(n) => Some(*n),
            Limit::Text(_) => None,
        }
    }

    pub fn render(&self) -> String {
        match self {
            Limit::Number(n) => n.to_string(),
            Limit::Text(t) => t.clone(),
        }
    }
}

/// containerd parameters (docs/spec.md §4.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ContainerdConfig {
    pub max_concurrent_downloads: i64,
    pub ignore_image_defined_volumes: bool,
    pub limit_core: Limit,
    pub limit_no_file: Limit,
    pub limit_mem_lock: Limit,
    /// registry host → mirror endpoints (http or https URLs), tried in order.
    pub registry_mirrors: BTreeMap<String, Vec<String>>,
    /// Registries reached over plain HTTP or with unverified TLS.
    pub insecure_registries: Vec<String>,
    /// The pod sandbox ("pause") image.
    pub sandbox_image: String,
}

impl Default for ContainerdConfig {
    fn default() -> Self {
        ContainerdConfig {
            max_concurrent_downloads: 3,
            ignore_image_defined_volumes: true,
            limit_core: Limit::infinity(),
            limit_no_file: Limit::Number(1_048_576),
            limit_mem_lock: Limit::infinity(),
            registry_mirrors: BTreeMap::new(),
            insecure_registries: Vec::new(),
            sandbox_image: "registry.k8s.io/pause:3.10".to_string(),
        }
    }
}

/// OS parameters applied by `os-config` (and re-applied after packages).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OsConfig {
    /// Overrides and additions to the default sysctls (docs/spec.md §4.3).
    pub sysctl: BTreeMap<String, String>,
    pub transparent_huge_page: TransparentHugePage,
}

/// The sysctls every node gets unless the pool overrides them (docs/spec.md §4.3).
pub const DEFAULT_SYSCTLS: &[(&str, &str)] = &[
    ("fs.file-max", "2097152"),
    ("fs.nr_open", "1048576"),
    ("fs.inotify.max_user_watches", "524288"),
    ("fs.inotify.max_user_instances", "16384"),
    ("kernel.pid_max", "4194303"),
    ("vm.max_map_count", "262144"),
    ("net.core.somaxconn", "32768"),
    ("net.core.netdev_max_backlog", "16384"),
    ("net.core.rmem_max", "16777216"),
    ("net.core.wmem_max", "16777216"),
    ("net.ipv4.tcp_max_syn_backlog", "8096"),
    ("net.ipv4.tcp_slow_start_after_idle", "0"),
    ("net.ipv4.ip_forward", "1"),
    ("net.bridge.bridge-nf-call-iptables", "1"),
    ("net.ipv4.neigh.default.gc_thresh2", "1024"),
    ("net.ipv4.neigh.default.gc_thresh3", "8192"),
];

impl OsConfig {
    /// Defaults merged with the pool's overrides, overrides winning.
    pub fn effective_sysctls(&self) -> BTreeMap<String, String> {
        let mut all: BTreeMap<String, String> = DEFAULT_SYSCTLS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        all.extend(self.sysctl.clone());
        all
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TransparentHugePage {
    /// always | never | madvise; unset leaves the kernel's setting.
    pub enabled: Option<String>,
    /// always | defer | madvise | defer+madvise | never.
    pub defrag: Option<String>,
}

/// What `data-disk` does when the chosen disk already holds something.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FormatPolicy {
    /// Format a blank disk, mount a supported filesystem as is, refuse anything else.
    #[default]
    Auto,
    /// Format even over a partition table or an unknown filesystem.
    Force,
    /// Never format: mount a supported filesystem, refuse a blank disk.
    Never,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsType {
    #[default]
    Ext4,
    Xfs,
}

impl FsType {
    pub fn as_str(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DataDiskConfig {
    /// Off by default: the agent never touches a disk unless asked.
    pub enabled: bool,
    pub fs_type: FsType,
    pub mount_target: String,
    pub format: FormatPolicy,
    /// Use this device (e.g. `/dev/vdc`) instead of the selection rule.
    pub device: Option<String>,
    /// Use the disk with this serial instead of the selection rule.
    pub serial: Option<String>,
    /// ext4 lazy inode table / journal init (fast mkfs on large disks).
    pub lazy_init: bool,
}

impl Default for DataDiskConfig {
    fn default() -> Self {
        DataDiskConfig {
            enabled: false,
            fs_type: FsType::Ext4,
            mount_target: DEFAULT_DATA_DISK_MOUNT.to_string(),
            format: FormatPolicy::Auto,
            device: None,
            serial: None,
            lazy_init: true,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Toggle {
    pub enabled: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OptionalComponents {
    pub gpu: Toggle,
    pub image_acceleration: Toggle,
    pub sgx: Toggle,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct BasePackages {
    pub enabled: bool,
    /// Apply security fixes (subject to the `/var/.skip-security-fix` marker).
    pub security_updates: bool,
    /// Extra packages to install beside the standard tools.
    pub extra: Vec<String>,
    /// URL of a flat Debian repository (the control plane's mirror,
    /// `<mirror>/debian/`): base packages and updates come from it, not from
    /// the image's own sources. Absent in older configs.
    pub repository: Option<String>,
}

impl Default for BasePackages {
    fn default() -> Self {
        BasePackages {
            enabled: true,
            security_updates: true,
            extra: Vec::new(),
            repository: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HardeningProfile {
    #[default]
    None,
    Os,
    MlpsL3,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Hardening {
    pub profile: HardeningProfile,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TimeSync {
    pub enabled: bool,
    /// NTP servers; empty keeps the distribution's chrony configuration.
    pub servers: Vec<String>,
}

impl Default for TimeSync {
    fn default() -> Self {
        TimeSync {
            enabled: true,
            servers: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct UserDataGate {
    /// Register with the `knit.dev/user-data-pending:NoSchedule` taint, removed
    /// when user data succeeds.
    pub scheduling_gate: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct JoinSettings {
    /// How long `join` waits for the Node to be registered.
    pub timeout_seconds: i64,
}

impl Default for JoinSettings {
    fn default() -> Self {
        JoinSettings {
            timeout_seconds: 300,
        }
    }
}
