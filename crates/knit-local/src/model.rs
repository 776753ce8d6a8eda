//! Documents of the local cloud: the template an instance is created from,
//! and the records kept in the state directory.

use crate::error::{LocalError, Result};
use knit_api::validate::{is_dns_subdomain, parse_quantity_bytes, Errors};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// What to build; YAML or JSON, unknown fields are rejected.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Template {
    /// Instance name (an attribute, also the default hostname).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default = "default_instance_type")]
    pub instance_type: String,
    /// Read-only lower layer of the root filesystem. Default: the node
    /// image's root (`knit image build`); `/` is the host's root, an
    /// explicit opt-in.
    #[serde(default = "default_base_root")]
    pub base_root: PathBuf,
    #[serde(default = "default_system_disk_size")]
    pub system_disk_size: Quantity,
    #[serde(default)]
    pub disks: Vec<DiskSpec>,
    /// Per-instance link shaping (tc tbf on both ends of the veth).
    #[serde(default)]
    pub bandwidth_mbit: Option<u32>,
    /// A fixed address in the cloud's subnet; the next free one otherwise.
    #[serde(default)]
    pub private_ip: Option<String>,
    #[serde(default)]
    pub user_data: Option<String>,
    #[serde(default)]
    pub user_data_runner: UserDataRunner,
    #[serde(default)]
    pub attributes: Attributes,
    /// Idempotency key, as a cloud's client token: a create with the token
    /// of an instance that exists returns that instance instead of making
    /// another (a create repeated by a server that was paused, or by the
    /// next leader, must not make two machines).
    #[serde(default)]
    pub client_token: Option<String>,
    /// The machine will run no container runtime (a pool's `runtime:
    /// none`): it holds none of root's inotify instances, which the host
    /// limits count per machine otherwise (`host_limits`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub light: bool,
}

impl Default for Template {
    fn default() -> Self {
        Template {
            name: None,
            hostname: None,
            instance_type: default_instance_type(),
            base_root: default_base_root(),
            system_disk_size: default_system_disk_size(),
            disks: Vec::new(),
            bandwidth_mbit: None,
            private_ip: None,
            user_data: None,
            user_data_runner: UserDataRunner::Knit,
            attributes: Attributes::default(),
            client_token: None,
            light: false,
        }
    }
}

// Where the node OS images live (their builder is image.rs).
/// The name of the current image's link in the images directory.
pub const NAME: &str = "debian-12";
/// The link of the current image with a Kubernetes package preloaded
/// (`knit image preload`); a pool's `image` may name it.
pub const PRELOADED_NAME: &str = "debian-12-preloaded";
/// Default images directory; `KNIT_IMAGES_DIR` overrides it.
pub const DEFAULT_DIR: &str = "/var/lib/knit/images";
pub const DIR_ENV: &str = "KNIT_IMAGES_DIR";
/// The images directory: `KNIT_IMAGES_DIR`, else `/var/lib/knit/images`.
pub fn images_dir() -> PathBuf {
    std::env::var_os(DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR))
}

/// The current image's root directory (through the `debian-12` link):
/// the local cloud's default base root.
pub fn default_root() -> PathBuf {
    images_dir().join(NAME).join("root")
}

/// The preloaded image's root directory (through its link).
pub fn preloaded_root() -> PathBuf {
    images_dir().join(PRELOADED_NAME).join("root")
}

fn default_instance_type() -> String {
    "local.small".into()
}
fn default_base_root() -> PathBuf {
    default_root()
}
fn default_system_disk_size() -> Quantity {
    Quantity::Text("20Gi".into())
}

/// A size: bytes as a number, or a quantity string (`10Gi`, `500M`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Quantity {
    Bytes(u64),
    Text(String),
}

impl Quantity {
    pub fn bytes(&self) -> Option<u64> {
        match self {
            Quantity::Bytes(b) => Some(*b),
            Quantity::Text(t) => parse_quantity_bytes(t),
        }
    }
}

impl std::fmt::Display for Quantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Quantity::Bytes(b) => write!(f, "{b}"),
            Quantity::Text(t) => write!(f, "{t:?}"),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum UserDataRunner {
    /// knit's own runner: starts in milliseconds.
    #[default]
    Knit,
    /// Debian's cloud-init from the base root, NoCloud datasource.
    CloudInit,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DiskInterface {
    #[default]
    Virtio,
    Nvme,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiskSpec {
    pub name: String,
    /// Required unless `snapshot` is given (then defaults to the snapshot's size).
    #[serde(default)]
    pub size: Option<Quantity>,
    #[serde(default)]
    pub interface: DiskInterface,
    #[serde(default)]
    pub snapshot: Option<String>,
    /// Make a filesystem on the new disk (otherwise it is blank, like a cloud disk).
    #[serde(default)]
    pub format: Option<String>,
}

/// What the add-existing preflight checks look at; settable for tests.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Attributes {
    pub account_id: String,
    pub region_id: String,
    pub zone_id: String,
    pub vpc_id: String,
    pub v_switch_id: String,
    pub security_groups: Vec<SecurityGroup>,
    pub enis: Enis,
    pub ram_role: Option<String>,
    pub ipv6: bool,
    /// Shown to the instance as its `/proc/swaps` (simulated view).
    pub swap: bool,
    /// Overrides the base root's os-release (written into the instance's `/etc/os-release`).
    pub os: Option<OsInfo>,
    pub instance_type_limits: InstanceTypeLimits,
    pub tags: BTreeMap<String, String>,
    pub login: Login,
}

impl Default for Attributes {
    fn default() -> Self {
        Attributes {
            account_id: "local-account".into(),
            region_id: "local".into(),
            zone_id: "local-a".into(),
            vpc_id: "vpc-local".into(),
            v_switch_id: "vsw-local".into(),
            security_groups: vec![SecurityGroup {
                id: "sg-local".into(),
                kind: SecurityGroupType::Normal,
                rules: Vec::new(),
            }],
            enis: Enis::default(),
            ram_role: None,
            ipv6: false,
            swap: false,
            os: None,
            instance_type_limits: InstanceTypeLimits::default(),
            tags: BTreeMap::new(),
            login: Login::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecurityGroup {
    pub id: String,
    #[serde(rename = "type", default)]
    pub kind: SecurityGroupType,
    #[serde(default)]
    pub rules: Vec<SecurityGroupRule>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SecurityGroupType {
    #[default]
    Normal,
    Enterprise,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecurityGroupRule {
    /// `ingress` or `egress`.
    pub direction: String,
    /// `tcp`, `udp`, `icmp` or `all`.
    pub protocol: String,
    /// `80/80`, `1/65535`, `-1/-1`.
    #[serde(default)]
    pub port_range: Option<String>,
    #[serde(default)]
    pub cidr: Option<String>,
    /// `accept` or `drop`.
    #[serde(default = "default_policy")]
    pub policy: String,
}

fn default_policy() -> String {
    "accept".into()
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Enis {
    pub count: u32,
    pub ips_per_eni: u32,
}

impl Default for Enis {
    fn default() -> Self {
        Enis {
            count: 1,
            ips_per_eni: 1,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct InstanceTypeLimits {
    pub max_enis: u32,
    pub max_ips_per_eni: u32,
}

impl Default for InstanceTypeLimits {
    fn default() -> Self {
        InstanceTypeLimits {
            max_enis: 3,
            max_ips_per_eni: 10,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Login {
    pub key_pair_name: Option<String>,
    pub password: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OsInfo {
    pub id: String,
    pub version_id: String,
    pub pretty_name: String,
}

impl OsInfo {
    /// Reads `etc/os-release` (or `usr/lib/os-release`) under `root`.
    pub fn from_root(root: &std::path::Path) -> OsInfo {
        let text = std::fs::read_to_string(root.join("etc/os-release"))
            .or_else(|_| std::fs::read_to_string(root.join("usr/lib/os-release")))
            .unwrap_or_default();
        let mut os = OsInfo::default();
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=') {
                let v = v.trim().trim_matches('"').to_string();
                match k.trim() {
                    "ID" => os.id = v,
                    "VERSION_ID" => os.version_id = v,
                    "PRETTY_NAME" => os.pretty_name = v,
                    _ => {}
                }
            }
        }
        os
    }

    pub fn render(&self) -> String {
        format!(
            "PRETTY_NAME=\"{}\"\nNAME=\"{}\"\nID={}\nVERSION_ID=\"{}\"\n",
            self.pretty_name, self.pretty_name, self.id, self.version_id
        )
    }
}

impl Template {
    /// Parses YAML or JSON; unknown fields are errors naming the field.
    pub fn parse(text: &str) -> Result<Template> {
        serde_yaml_ng::from_str(text).map_err(|e| LocalError::Parse {
            what: "instance template".into(),
            message: e.to_string(),
        })
    }

    /// Structural checks that need no state; every problem is listed.
    pub fn validate(&self) -> Result<()> {
        let mut e = Errors::default();
        for (field, v) in [("name", &self.name), ("hostname", &self.hostname)] {
            if let Some(v) = v {
                if let Err(rule) = check_instance_name(v) {
                    e.add(field, format!("{v:?}"), rule);
                }
            }
        }
        if crate::bounds::type_size(&self.instance_type).is_none() {
            e.add(
                "instanceType",
                format!("{:?}", self.instance_type),
                crate::bounds::unknown_type_rule(),
            );
        }
        if let Some(t) = &self.client_token {
            if t.is_empty() || t.len() > 64 || !t.is_ascii() {
                e.add(
                    "clientToken",
                    format!("{t:?}"),
                    "must be 1 to 64 ASCII characters",
                );
            }
        }
        if let Err(rule) = check_base_root(&self.base_root) {
            e.add("baseRoot", format!("{:?}", self.base_root), rule);
        }
        check_size(
            &mut e,
            "systemDiskSize",
            Some(&self.system_disk_size),
            64 << 20,
        );
        let mut names = BTreeSet::new();
        for (i, d) in self.disks.iter().enumerate() {
            let at = format!("disks[{i}]");
            if d.name.is_empty()
                || !d
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                e.add(
                    format!("{at}.name"),
                    format!("{:?}", d.name),
                    "must be non-empty letters, digits, '-' or '_'",
                );
            } else if !names.insert(d.name.as_str()) {
                e.add(
                    format!("{at}.name"),
                    format!("{:?}", d.name),
                    "must be unique: another disk already has this name",
                );
            }
            if d.snapshot.is_none() || d.size.is_some() {
                if d.size.is_none() {
                    e.add(
                        format!("{at}.size"),
                        "null",
                        "is required unless snapshot is given",
                    );
                } else {
                    check_size(&mut e, &format!("{at}.size"), d.size.as_ref(), 1 << 20);
                }
            }
            if let Some(fs) = &d.format {
                e.one_of(&format!("{at}.format"), fs, &["ext4", "xfs"]);
            }
        }
        if self.disks.len() > 24 {
            e.add("disks", self.disks.len(), "must hold at most 24 disks");
        }
        if let Some(ip) = &self.private_ip {
            if ip.parse::<std::net::Ipv4Addr>().is_err() {
                e.add("privateIp", format!("{ip:?}"), "must be an IPv4 address");
            }
        }
        if self.bandwidth_mbit == Some(0) {
            e.add(
                "bandwidthMbit",
                0,
                "must be > 0 (omit it for an unshaped link)",
            );
        }
        if self.attributes.enis.count == 0 {
            e.add("attributes.enis.count", 0, "must be >= 1");
        }
        for (i, sg) in self.attributes.security_groups.iter().enumerate() {
            for (j, r) in sg.rules.iter().enumerate() {
                let at = format!("attributes.securityGroups[{i}].rules[{j}]");
                e.one_of(
                    &format!("{at}.direction"),
                    &r.direction,
                    &["ingress", "egress"],
                );
                e.one_of(
                    &format!("{at}.protocol"),
                    &r.protocol,
                    &["tcp", "udp", "icmp", "all"],
                );
                e.one_of(&format!("{at}.policy"), &r.policy, &["accept", "drop"]);
            }
        }
        if self.user_data_runner == UserDataRunner::CloudInit
            && !self.base_root.join("usr/bin/cloud-init").exists()
        {
            e.add(
                "userDataRunner",
                "\"cloud-init\"",
                format!(
                    "needs cloud-init installed in the base root ({}usr/bin/cloud-init is missing)",
                    with_slash(&self.base_root)
                ),
            );
        }
        e.into_result().map_err(|err| match err {
            knit_api::ApiError::Invalid(list) => LocalError::Invalid(list),
            other => LocalError::Parse {
                what: "instance template".into(),
                message: other.to_string(),
            },
        })
    }
}

/// The rule for an instance name or hostname: a DNS-style name the kernel
/// takes as a hostname (at most 64 characters, HOST_NAME_MAX), so that a
/// node name from a pool's custom rule (up to 64) fits too.
pub fn check_instance_name(name: &str) -> std::result::Result<(), &'static str> {
    if is_dns_subdomain(name) && name.len() <= 64 {
        Ok(())
    } else {
        Err("must be a DNS label-style name: lower-case letters, digits, '-' and '.', at most 64 characters")
    }
}

/// The rule for a base root (the overlay's read-only lower layer): an
/// absolute root filesystem directory whose path fits in overlayfs options.
pub fn check_base_root(root: &std::path::Path) -> std::result::Result<(), &'static str> {
    if root.to_string_lossy().contains([',', ':', '\n']) {
        Err("must not contain ',', ':' or a newline (overlayfs options)")
    } else if !root.is_absolute() {
        Err("must be an absolute path")
    } else if !root.exists() && root.starts_with(images_dir()) {
        Err("is not built yet: run `knit image build` (or name another root directory; `/` is the host's root)")
    } else if !root.join("bin").exists() && !root.join("usr/bin").exists() {
        Err("must be a root filesystem directory (no bin/ or usr/bin/ in it)")
    } else {
        Ok(())
    }
}

fn with_slash(p: &std::path::Path) -> String {
    let s = p.display().to_string();
    if s.ends_with('/') {
        s
    } else {
        s + "/"
    }
}

fn check_size(e: &mut Errors, field: &str, q: Option<&Quantity>, min: u64) {
    let Some(q) = q else { return };
    match q.bytes() {
        None => e.add(
            field,
            q,
            "must be a size: bytes or a quantity like 512Mi, 10Gi",
        ),
        Some(0) => e.add(field, q, "must be > 0"),
        Some(b) if b < min => e.add(field, q, format!("must be at least {} MiB", min >> 20)),
        Some(b) if b > (16u64 << 40) => e.add(field, q, "must be at most 16Ti"),
        Some(_) => {}
    }
}

/// Lifecycle state of an instance as recorded.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    Creating,
    Running,
    Stopped,
}

impl std::fmt::Display for InstanceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            InstanceState::Creating => "creating",
            InstanceState::Running => "running",
            InstanceState::Stopped => "stopped",
        })
    }
}

/// A process we started, identified so a reused PID is never signalled
/// (PID + start time, recorded as `{"pid": …, "startTime": …}`).
pub use knit_os::proc::ProcRef;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRecord {
    pub id: String,
    pub hostname: String,
    pub state: InstanceState,
    pub template: Template,
    pub os: OsInfo,
    pub private_ip: String,
    pub mac: String,
    /// Host end of the veth pair.
    pub veth: String,
    /// Name under /run/netns.
    pub netns: String,
    /// The bridge its veth joins (the main one or an overflow bridge of
    /// the cloud): chosen when it boots, cleared when it halts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<String>,
    pub system_disk_size: u64,
    /// Data disks attached, in attach order.
    pub disks: Vec<String>,
    /// PID 1 of the instance, as seen from the host.
    pub init: Option<ProcRef>,
    /// Host-side parent of PID 1 (waits for it, records its exit).
    pub shim: Option<ProcRef>,
    pub created_at: u64,
    pub boots: u32,
    /// Milliseconds from spawn to "ready to run user data", last boot.
    pub last_boot_ms: Option<u64>,
    /// When root's password was last set inside (`set_password`), seconds
    /// since the epoch; cleared by reimage (new system layer). The password
    /// itself is never recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_set_at: Option<u64>,
    /// The machine's cgroups (`…/knit-local-<id>`, one per hierarchy) while
    /// it runs: recorded before they are made, removed when it halts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cgroups: Vec<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DiskRecord {
    pub id: String,
    pub serial: String,
    pub name: String,
    pub size: u64,
    pub interface: DiskInterface,
    pub attached_to: Option<String>,
    /// Cloud device name inside the instance (`vdb`, `nvme0n1`), while attached.
    pub device: Option<String>,
    pub from_snapshot: Option<String>,
    pub created_at: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    pub id: String,
    /// The caller's name for it (knit: the build's), recorded before the
    /// clone starts, so a caller killed mid-way finds it by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub source_disk: String,
    pub size: u64,
    /// `reflink` or `sparse-copy`.
    pub method: String,
    pub created_at: u64,
}

/// The host network of one state directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRecord {
    pub bridge: String,
    pub subnet: String,
    pub gateway: String,
    pub metadata_port: u16,
    pub metadata: Option<ProcRef>,
    /// Overflow bridges made for machines the main bridge has no port
    /// for (`net::Overflow`), recorded before they are made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overflow: Vec<String>,
}

/// Everything `describe` shows: the record plus its disks and live state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    #[serde(flatten)]
    pub record: InstanceRecord,
    pub data_disks: Vec<DiskRecord>,
    /// PID 1 alive right now (the record may say running after a host crash).
    pub alive: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_field_is_named() {
        let err = Template::parse("instanceType: a\nsytemDiskSize: 1Gi\n").unwrap_err();
        assert_eq!(err.code(), "LocalParse");
        assert!(err.to_string().contains("sytemDiskSize"), "{err}");
        let err = Template::parse("disks:\n- name: a\n  size: 1Gi\n  iface: nvme\n").unwrap_err();
        assert!(err.to_string().contains("iface"), "{err}");
    }

    #[test]
    fn zero_size_and_duplicate_names_are_listed() {
        let t = Template::parse(
            "disks:\n- {name: data, size: 0}\n- {name: data, size: 1Gi}\n- {name: x, size: lots}\n",
        )
        .unwrap();
        let err = t.validate().unwrap_err();
        let s = err.to_string();
        assert!(s.contains("disks[0].size: value 0 must be > 0"), "{s}");
        assert!(
            s.contains("disks[1].name: value \"data\" must be unique"),
            "{s}"
        );
        assert!(
            s.contains("disks[2].size: value \"lots\" must be a size"),
            "{s}"
        );
        let t = Template::parse("baseRoot: /srv/a,b\n").unwrap();
        let s = t.validate().unwrap_err().to_string();
        assert!(
            s.contains("baseRoot: value \"/srv/a,b\" must not contain"),
            "{s}"
        );
    }

    #[test]
    fn defaults_validate() {
        let t = Template::parse("{}").unwrap();
        t.validate().unwrap();
        assert_eq!(t.system_disk_size.bytes(), Some(20 << 30));
        assert_eq!(t.attributes.region_id, "local");
    }

    #[test]
    fn cloud_init_runner_needs_cloud_init() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        let t = Template {
            base_root: dir.path().to_path_buf(),
            user_data_runner: UserDataRunner::CloudInit,
            ..Template::default()
        };
        let s = t.validate().unwrap_err().to_string();
        assert!(
            s.contains("userDataRunner") && s.contains("cloud-init"),
            "{s}"
        );
    }

    #[test]
    fn os_release_is_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/os-release"),
            "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n",
        )
        .unwrap();
        let os = OsInfo::from_root(dir.path());
        assert_eq!((os.id.as_str(), os.version_id.as_str()), ("debian", "12"));
    }
}
