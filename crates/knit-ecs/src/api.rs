//! Typed requests and answers for the actions knit uses, named as in the
//! ECS OpenAPI 2014-05-26 (and STS 2015-04-01). Lists of simple values go
//! either as `Name.N` pairs or as a JSON array string, as each action's
//! metadata says.

use crate::client::{Client, Params, Service};
use crate::error::EcsError;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

/// Largest page DescribeInstances / DescribeDisks / DescribeSnapshots give.
pub const PAGE_SIZE: usize = 100;
/// Pages read at most by one listing (10 000 items).
pub const MAX_PAGES: usize = 100;

fn decode<T: DeserializeOwned>(action: &str, v: serde_json::Value) -> Result<T, EcsError> {
    serde_json::from_value(v).map_err(|e| EcsError::Decode {
        action: action.to_string(),
        reason: e.to_string(),
    })
}

/// A number ECS sends as a number or as a string (`"40"`, `"100%"`).
fn lenient_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(match v {
        serde_json::Value::Number(n) => n.as_u64().unwrap_or(0),
        serde_json::Value::String(s) => s.trim_end_matches('%').trim().parse().unwrap_or(0),
        _ => 0,
    })
}

fn lenient_i64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(match v {
        serde_json::Value::Number(n) => n.as_i64().unwrap_or(0),
        serde_json::Value::String(s) => s.trim().parse().unwrap_or(0),
        _ => 0,
    })
}

fn put(p: &mut Params, k: &str, v: impl ToString) {
    p.insert(k.to_string(), v.to_string());
}

fn put_opt(p: &mut Params, k: &str, v: &Option<String>) {
    if let Some(v) = v {
        p.insert(k.to_string(), v.clone());
    }
}

fn json_list(ids: &[String]) -> String {
    serde_json::Value::from(ids.to_vec()).to_string()
}

// ---------- shapes shared by several answers ----------

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Tag {
    pub tag_key: String,
    pub tag_value: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Tags {
    #[serde(rename = "Tag")]
    pub tag: Vec<Tag>,
}

impl Tags {
    pub fn map(&self) -> BTreeMap<String, String> {
        self.tag
            .iter()
            .map(|t| (t.tag_key.clone(), t.tag_value.clone()))
            .collect()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct IpAddresses {
    pub ip_address: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SecurityGroupIds {
    pub security_group_id: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct VpcAttributes {
    pub vpc_id: String,
    #[serde(rename = "VSwitchId")]
    pub v_switch_id: String,
    pub private_ip_address: IpAddresses,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Ipv6Set {
    pub ipv6_address: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Ipv6Sets {
    pub ipv6_set: Vec<Ipv6Set>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NetworkInterface {
    pub network_interface_id: String,
    /// Primary | Secondary.
    #[serde(rename = "Type")]
    pub kind: String,
    pub primary_ip_address: String,
    pub ipv6_sets: Ipv6Sets,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NetworkInterfaces {
    pub network_interface: Vec<NetworkInterface>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct LockReason {
    pub lock_reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct OperationLocks {
    pub lock_reason: Vec<LockReason>,
}

/// One instance as DescribeInstances tells it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Instance {
    pub instance_id: String,
    pub instance_name: String,
    pub host_name: String,
    /// Pending | Starting | Running | Stopping | Stopped.
    pub status: String,
    pub instance_type: String,
    pub region_id: String,
    pub zone_id: String,
    pub image_id: String,
    #[serde(rename = "OSName")]
    pub os_name: String,
    #[serde(rename = "OSNameEn")]
    pub os_name_en: String,
    #[serde(rename = "OSType")]
    pub os_type: String,
    pub key_pair_name: String,
    pub vpc_attributes: VpcAttributes,
    pub security_group_ids: SecurityGroupIds,
    pub network_interfaces: NetworkInterfaces,
    pub tags: Tags,
    pub operation_locks: OperationLocks,
}

impl Instance {
    pub fn private_ip(&self) -> Option<String> {
        self.vpc_attributes
            .private_ip_address
            .ip_address
            .first()
            .cloned()
            .or_else(|| {
                self.network_interfaces
                    .network_interface
                    .iter()
                    .find(|n| n.kind == "Primary")
                    .map(|n| n.primary_ip_address.clone())
            })
            .filter(|ip| !ip.is_empty())
    }
}

// ---------- RunInstances ----------

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataDisk {
    /// GiB; ignored by ECS when the disk is made from a snapshot larger.
    pub size_gib: Option<i64>,
    pub snapshot_id: Option<String>,
    pub category: Option<String>,
    pub delete_with_instance: bool,
}

/// RunInstances: one instance (`Amount=1`), idempotent by `client_token`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RunInstances {
    pub zone_id: Option<String>,
    pub image_id: String,
    pub instance_type: String,
    pub v_switch_id: Option<String>,
    pub security_group_ids: Vec<String>,
    pub instance_name: String,
    pub host_name: Option<String>,
    /// Plain text; sent base64-encoded as ECS wants.
    pub user_data: String,
    pub system_disk_gib: Option<i64>,
    pub system_disk_category: Option<String>,
    pub data_disks: Vec<DataDisk>,
    pub tags: BTreeMap<String, String>,
    pub client_token: String,
}

impl std::fmt::Debug for RunInstances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // User data can hold a bootstrap token: shown by size only.
        f.debug_struct("RunInstances")
            .field("zone_id", &self.zone_id)
            .field("image_id", &self.image_id)
            .field("instance_type", &self.instance_type)
            .field("instance_name", &self.instance_name)
            .field("user_data_bytes", &self.user_data.len())
            .field("data_disks", &self.data_disks)
            .field("tags", &self.tags)
            .field("client_token", &self.client_token)
            .finish()
    }
}

impl RunInstances {
    pub fn params(&self) -> Params {
        use base64::Engine;
        let mut p = Params::new();
        put(&mut p, "Amount", 1);
        put_opt(&mut p, "ZoneId", &self.zone_id);
        put(&mut p, "ImageId", &self.image_id);
        put(&mut p, "InstanceType", &self.instance_type);
        put_opt(&mut p, "VSwitchId", &self.v_switch_id);
        for (i, g) in self.security_group_ids.iter().enumerate() {
            put(&mut p, &format!("SecurityGroupIds.{}", i + 1), g);
        }
        put(&mut p, "InstanceName", &self.instance_name);
        put_opt(&mut p, "HostName", &self.host_name);
        if !self.user_data.is_empty() {
            put(
                &mut p,
                "UserData",
                base64::engine::general_purpose::STANDARD.encode(&self.user_data),
            );
        }
        if let Some(s) = self.system_disk_gib {
            put(&mut p, "SystemDisk.Size", s);
        }
        put_opt(&mut p, "SystemDisk.Category", &self.system_disk_category);
        for (i, d) in self.data_disks.iter().enumerate() {
            let k = |f: &str| format!("DataDisk.{}.{f}", i + 1);
            if let Some(s) = d.size_gib {
                put(&mut p, &k("Size"), s);
            }
            put_opt(&mut p, &k("SnapshotId"), &d.snapshot_id);
            put_opt(&mut p, &k("Category"), &d.category);
            put(&mut p, &k("DeleteWithInstance"), d.delete_with_instance);
        }
        for (i, (key, value)) in self.tags.iter().enumerate() {
            put(&mut p, &format!("Tag.{}.Key", i + 1), key);
            put(&mut p, &format!("Tag.{}.Value", i + 1), value);
        }
        put(&mut p, "ClientToken", &self.client_token);
        p
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct InstanceIdSets {
    instance_id_set: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct RunInstancesAnswer {
    instance_id_sets: InstanceIdSets,
}

// ---------- DescribeInstances ----------

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DescribeInstances {
    pub instance_ids: Vec<String>,
    pub instance_name: Option<String>,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct InstanceList {
    instance: Vec<Instance>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct DescribeInstancesAnswer {
    #[serde(deserialize_with = "lenient_u64")]
    total_count: u64,
    instances: InstanceList,
}

// ---------- disks ----------

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Disk {
    pub disk_id: String,
    /// system | data.
    #[serde(rename = "Type")]
    pub kind: String,
    /// In_use | Available | Attaching | Detaching | Creating | ReIniting.
    pub status: String,
    /// GiB.
    #[serde(deserialize_with = "lenient_u64")]
    pub size: u64,
    /// `/dev/xvdb` as ECS names it.
    pub device: String,
    pub instance_id: String,
    pub source_snapshot_id: String,
    pub delete_with_instance: bool,
    pub operation_locks: OperationLocks,
    pub creation_time: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct DiskList {
    disk: Vec<Disk>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct DescribeDisksAnswer {
    #[serde(deserialize_with = "lenient_u64")]
    total_count: u64,
    disks: DiskList,
}

// ---------- snapshots ----------

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Snapshot {
    pub snapshot_id: String,
    pub snapshot_name: String,
    /// progressing | accomplished | failed.
    pub status: String,
    /// `"45%"`.
    pub progress: String,
    pub source_disk_id: String,
    /// GiB, sent as a string.
    #[serde(deserialize_with = "lenient_u64")]
    pub source_disk_size: u64,
    pub tags: Tags,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct SnapshotList {
    snapshot: Vec<Snapshot>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct DescribeSnapshotsAnswer {
    #[serde(deserialize_with = "lenient_u64")]
    total_count: u64,
    snapshots: SnapshotList,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DescribeSnapshots {
    pub snapshot_ids: Vec<String>,
    pub snapshot_name: Option<String>,
    pub disk_id: Option<String>,
}

// ---------- Cloud Assistant ----------

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct InvocationResult {
    pub instance_id: String,
    pub invoke_id: String,
    /// Pending | Running | Success | Failed | Timeout | Stopped | Error …
    pub invocation_status: String,
    /// Running | Finished | Failed | Stopped …
    pub invoke_record_status: String,
    #[serde(deserialize_with = "lenient_i64")]
    pub exit_code: i64,
    /// Base64 (ContentEncoding=Base64), at most 24 KB of the output.
    pub output: String,
    /// Bytes of output cut off beyond the limit.
    #[serde(deserialize_with = "lenient_u64")]
    pub dropped: u64,
    pub error_code: String,
    pub error_info: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct InvocationResults {
    invocation_result: Vec<InvocationResult>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct Invocation {
    invocation_results: InvocationResults,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct DescribeInvocationResultsAnswer {
    invocation: Invocation,
}

// ---------- instance types, security groups, RAM role, STS ----------

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct InstanceType {
    pub instance_type_id: String,
    #[serde(deserialize_with = "lenient_u64")]
    pub cpu_core_count: u64,
    /// ENIs the type takes.
    #[serde(deserialize_with = "lenient_u64")]
    pub eni_quantity: u64,
    #[serde(deserialize_with = "lenient_u64")]
    pub eni_private_ip_address_quantity: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct InstanceTypeList {
    instance_type: Vec<InstanceType>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct DescribeInstanceTypesAnswer {
    instance_types: InstanceTypeList,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Permission {
    /// ingress | egress.
    pub direction: String,
    /// TCP | UDP | ICMP | GRE | ALL.
    pub ip_protocol: String,
    /// `22/22`, `-1/-1`.
    pub port_range: String,
    pub source_cidr_ip: String,
    pub dest_cidr_ip: String,
    /// Accept | Drop.
    pub policy: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Permissions {
    pub permission: Vec<Permission>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SecurityGroupAttribute {
    pub security_group_id: String,
    pub vpc_id: String,
    pub permissions: Permissions,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SecurityGroup {
    pub security_group_id: String,
    /// normal | enterprise.
    pub security_group_type: String,
    pub vpc_id: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct SecurityGroupList {
    security_group: Vec<SecurityGroup>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct DescribeSecurityGroupsAnswer {
    security_groups: SecurityGroupList,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct InstanceRamRoleSet {
    pub instance_id: String,
    pub ram_role_name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct InstanceRamRoleSets {
    instance_ram_role_set: Vec<InstanceRamRoleSet>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct DescribeInstanceRamRoleAnswer {
    instance_ram_role_sets: InstanceRamRoleSets,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CallerIdentity {
    pub account_id: String,
    pub arn: String,
    pub identity_type: String,
    pub principal_id: String,
}

/// StopInstance's StoppedMode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoppedMode {
    /// Resources kept, billing goes on: the instance comes back as it was.
    KeepCharging,
    /// Pay-as-you-go in a VPC: vCPU and memory released until started.
    StopCharging,
}

/// ModifyInstanceAttribute: only the fields that are set change.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ModifyInstanceAttribute {
    pub instance_id: String,
    pub instance_name: Option<String>,
    pub host_name: Option<String>,
    pub password: Option<String>,
    /// Plain text; sent base64-encoded.
    pub user_data: Option<String>,
}

impl std::fmt::Debug for ModifyInstanceAttribute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModifyInstanceAttribute")
            .field("instance_id", &self.instance_id)
            .field("instance_name", &self.instance_name)
            .field("host_name", &self.host_name)
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("user_data_bytes", &self.user_data.as_ref().map(String::len))
            .finish()
    }
}

impl Client {
    fn typed<T: DeserializeOwned>(&self, action: &str, params: Params) -> Result<T, EcsError> {
        let v = self.call(action, params)?;
        decode(action, v)
    }

    /// The new instance's id (the same one again for the same ClientToken).
    pub fn run_instances(&self, req: &RunInstances) -> Result<String, EcsError> {
        if req.client_token.is_empty() || req.client_token.len() > 64 {
            return Err(EcsError::Invalid(format!(
                "ClientToken {:?}: must be 1 to 64 ASCII characters",
                req.client_token
            )));
        }
        let a: RunInstancesAnswer = self.typed("RunInstances", req.params())?;
        a.instance_id_sets
            .instance_id_set
            .into_iter()
            .next()
            .ok_or_else(|| EcsError::Decode {
                action: "RunInstances".into(),
                reason: "no instance id in InstanceIdSets".into(),
            })
    }

    /// Every matching instance, page by page.
    pub fn describe_instances(&self, f: &DescribeInstances) -> Result<Vec<Instance>, EcsError> {
        let mut all = Vec::new();
        for page in 1..=MAX_PAGES {
            let mut p = Params::new();
            if !f.instance_ids.is_empty() {
                put(&mut p, "InstanceIds", json_list(&f.instance_ids));
            }
            put_opt(&mut p, "InstanceName", &f.instance_name);
            for (i, (k, v)) in f.tags.iter().enumerate() {
                put(&mut p, &format!("Tag.{}.Key", i + 1), k);
                put(&mut p, &format!("Tag.{}.Value", i + 1), v);
            }
            put(&mut p, "PageNumber", page);
            put(&mut p, "PageSize", PAGE_SIZE);
            let a: DescribeInstancesAnswer = self.typed("DescribeInstances", p)?;
            let got = a.instances.instance.len();
            all.extend(a.instances.instance);
            if got < PAGE_SIZE || all.len() as u64 >= a.total_count {
                break;
            }
        }
        Ok(all)
    }

    pub fn describe_instance(&self, id: &str) -> Result<Option<Instance>, EcsError> {
        let found = self.describe_instances(&DescribeInstances {
            instance_ids: vec![id.to_string()],
            ..Default::default()
        })?;
        Ok(found.into_iter().find(|i| i.instance_id == id))
    }

    pub fn start_instance(&self, id: &str) -> Result<(), EcsError> {
        let mut p = Params::new();
        put(&mut p, "InstanceId", id);
        self.call("StartInstance", p).map(|_| ())
    }

    pub fn stop_instance(&self, id: &str, mode: StoppedMode, force: bool) -> Result<(), EcsError> {
        let mut p = Params::new();
        put(&mut p, "InstanceId", id);
        put(&mut p, "ForceStop", force);
        put(
            &mut p,
            "StoppedMode",
            match mode {
                StoppedMode::KeepCharging => "KeepCharging",
                StoppedMode::StopCharging => "StopCharging",
            },
        );
        self.call("StopInstance", p).map(|_| ())
    }

    pub fn reboot_instance(&self, id: &str, force: bool) -> Result<(), EcsError> {
        let mut p = Params::new();
        put(&mut p, "InstanceId", id);
        put(&mut p, "ForceStop", force);
        self.call("RebootInstance", p).map(|_| ())
    }

    pub fn delete_instance(&self, id: &str, force: bool) -> Result<(), EcsError> {
        let mut p = Params::new();
        put(&mut p, "InstanceId", id);
        put(&mut p, "Force", force);
        self.call("DeleteInstance", p).map(|_| ())
    }

    pub fn delete_instances(&self, ids: &[String], force: bool) -> Result<(), EcsError> {
        let mut p = Params::new();
        for (i, id) in ids.iter().enumerate() {
            put(&mut p, &format!("InstanceId.{}", i + 1), id);
        }
        put(&mut p, "Force", force);
        self.call("DeleteInstances", p).map(|_| ())
    }

    pub fn modify_instance_attribute(&self, m: &ModifyInstanceAttribute) -> Result<(), EcsError> {
        use base64::Engine;
        let mut p = Params::new();
        put(&mut p, "InstanceId", &m.instance_id);
        put_opt(&mut p, "InstanceName", &m.instance_name);
        put_opt(&mut p, "HostName", &m.host_name);
        put_opt(&mut p, "Password", &m.password);
        if let Some(u) = &m.user_data {
            put(
                &mut p,
                "UserData",
                base64::engine::general_purpose::STANDARD.encode(u),
            );
        }
        self.call("ModifyInstanceAttribute", p).map(|_| ())
    }

    /// The new system disk's id.
    pub fn replace_system_disk(
        &self,
        id: &str,
        image_id: &str,
        size_gib: Option<i64>,
        client_token: &str,
    ) -> Result<String, EcsError> {
        let mut p = Params::new();
        put(&mut p, "InstanceId", id);
        put(&mut p, "ImageId", image_id);
        if let Some(s) = size_gib {
            put(&mut p, "SystemDisk.Size", s);
        }
        put(&mut p, "ClientToken", client_token);
        let v = self.call("ReplaceSystemDisk", p)?;
        Ok(v.get("DiskId")
            .and_then(|d| d.as_str())
            .unwrap_or("")
            .to_string())
    }

    /// The instance's disks (`kind`: all | system | data), page by page.
    pub fn describe_disks(&self, instance_id: &str, kind: &str) -> Result<Vec<Disk>, EcsError> {
        let mut all = Vec::new();
        for page in 1..=MAX_PAGES {
            let mut p = Params::new();
            put(&mut p, "InstanceId", instance_id);
            put(&mut p, "DiskType", kind);
            put(&mut p, "PageNumber", page);
            put(&mut p, "PageSize", PAGE_SIZE);
            let a: DescribeDisksAnswer = self.typed("DescribeDisks", p)?;
            let got = a.disks.disk.len();
            all.extend(a.disks.disk);
            if got < PAGE_SIZE || all.len() as u64 >= a.total_count {
                break;
            }
        }
        Ok(all)
    }

    /// The snapshot's id; `client_token` makes a repeat return the same one.
    pub fn create_snapshot(
        &self,
        disk_id: &str,
        name: &str,
        tags: &BTreeMap<String, String>,
        client_token: &str,
    ) -> Result<String, EcsError> {
        let mut p = Params::new();
        put(&mut p, "DiskId", disk_id);
        put(&mut p, "SnapshotName", name);
        for (i, (k, v)) in tags.iter().enumerate() {
            put(&mut p, &format!("Tag.{}.Key", i + 1), k);
            put(&mut p, &format!("Tag.{}.Value", i + 1), v);
        }
        put(&mut p, "ClientToken", client_token);
        let v = self.call("CreateSnapshot", p)?;
        v.get("SnapshotId")
            .and_then(|d| d.as_str())
            .map(str::to_string)
            .ok_or_else(|| EcsError::Decode {
                action: "CreateSnapshot".into(),
                reason: "no SnapshotId".into(),
            })
    }

    pub fn describe_snapshots(&self, f: &DescribeSnapshots) -> Result<Vec<Snapshot>, EcsError> {
        let mut all = Vec::new();
        for page in 1..=MAX_PAGES {
            let mut p = Params::new();
            if !f.snapshot_ids.is_empty() {
                put(&mut p, "SnapshotIds", json_list(&f.snapshot_ids));
            }
            put_opt(&mut p, "SnapshotName", &f.snapshot_name);
            put_opt(&mut p, "DiskId", &f.disk_id);
            put(&mut p, "PageNumber", page);
            put(&mut p, "PageSize", PAGE_SIZE);
            let a: DescribeSnapshotsAnswer = self.typed("DescribeSnapshots", p)?;
            let got = a.snapshots.snapshot.len();
            all.extend(a.snapshots.snapshot);
            if got < PAGE_SIZE || all.len() as u64 >= a.total_count {
                break;
            }
        }
        Ok(all)
    }

    pub fn delete_snapshot(&self, id: &str) -> Result<(), EcsError> {
        let mut p = Params::new();
        put(&mut p, "SnapshotId", id);
        put(&mut p, "Force", false);
        self.call("DeleteSnapshot", p).map(|_| ())
    }

    /// Starts a shell script through Cloud Assistant: its InvokeId.
    pub fn run_command(
        &self,
        instance_id: &str,
        script: &str,
        timeout_secs: u64,
        client_token: &str,
    ) -> Result<String, EcsError> {
        use base64::Engine;
        let mut p = Params::new();
        put(&mut p, "Type", "RunShellScript");
        put(&mut p, "ContentEncoding", "Base64");
        put(
            &mut p,
            "CommandContent",
            base64::engine::general_purpose::STANDARD.encode(script),
        );
        put(&mut p, "InstanceId.1", instance_id);
        put(&mut p, "Timeout", timeout_secs.max(10));
        put(&mut p, "RepeatMode", "Once");
        // At its Timeout Cloud Assistant ends the command's whole process
        // tree, not only its first process (the default, `Process`).
        put(&mut p, "TerminationMode", "ProcessTree");
        put(&mut p, "ClientToken", client_token);
        let v = self.call("RunCommand", p)?;
        v.get("InvokeId")
            .and_then(|d| d.as_str())
            .map(str::to_string)
            .ok_or_else(|| EcsError::Decode {
                action: "RunCommand".into(),
                reason: "no InvokeId".into(),
            })
    }

    pub fn describe_invocation_result(
        &self,
        invoke_id: &str,
        instance_id: &str,
    ) -> Result<Option<InvocationResult>, EcsError> {
        let mut p = Params::new();
        put(&mut p, "InvokeId", invoke_id);
        put(&mut p, "InstanceId", instance_id);
        put(&mut p, "ContentEncoding", "Base64");
        let a: DescribeInvocationResultsAnswer = self.typed("DescribeInvocationResults", p)?;
        Ok(a.invocation
            .invocation_results
            .invocation_result
            .into_iter()
            .find(|r| r.instance_id == instance_id))
    }

    pub fn describe_instance_types(&self, types: &[String]) -> Result<Vec<InstanceType>, EcsError> {
        let mut p = Params::new();
        for (i, t) in types.iter().enumerate() {
            put(&mut p, &format!("InstanceTypes.{}", i + 1), t);
        }
        let a: DescribeInstanceTypesAnswer = self.typed("DescribeInstanceTypes", p)?;
        Ok(a.instance_types.instance_type)
    }

    /// The types of one family (`ecs.g7`), as many as one page holds.
    pub fn describe_instance_types_of_family(
        &self,
        family: &str,
    ) -> Result<Vec<InstanceType>, EcsError> {
        let mut p = Params::new();
        put(&mut p, "InstanceTypeFamily", family);
        let a: DescribeInstanceTypesAnswer = self.typed("DescribeInstanceTypes", p)?;
        Ok(a.instance_types.instance_type)
    }

    pub fn describe_security_group_attribute(
        &self,
        id: &str,
    ) -> Result<SecurityGroupAttribute, EcsError> {
        let mut p = Params::new();
        put(&mut p, "SecurityGroupId", id);
        put(&mut p, "Direction", "all");
        self.typed("DescribeSecurityGroupAttribute", p)
    }

    pub fn describe_security_groups(&self, ids: &[String]) -> Result<Vec<SecurityGroup>, EcsError> {
        let mut p = Params::new();
        put(&mut p, "SecurityGroupIds", json_list(ids));
        put(&mut p, "PageSize", PAGE_SIZE);
        let a: DescribeSecurityGroupsAnswer = self.typed("DescribeSecurityGroups", p)?;
        Ok(a.security_groups.security_group)
    }

    /// The RAM role attached to the instance, if any.
    pub fn describe_instance_ram_role(&self, id: &str) -> Result<Option<String>, EcsError> {
        let mut p = Params::new();
        put(&mut p, "InstanceIds", json_list(&[id.to_string()]));
        let a: DescribeInstanceRamRoleAnswer = self.typed("DescribeInstanceRamRole", p)?;
        Ok(a.instance_ram_role_sets
            .instance_ram_role_set
            .into_iter()
            .find(|r| r.instance_id == id && !r.ram_role_name.is_empty())
            .map(|r| r.ram_role_name))
    }

    /// Whose key this is (STS).
    pub fn get_caller_identity(&self) -> Result<CallerIdentity, EcsError> {
        let v = self.call_service(Service::Sts, "GetCallerIdentity", Params::new())?;
        decode("GetCallerIdentity", v)
    }
}
