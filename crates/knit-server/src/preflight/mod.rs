//! Preflight for adding existing instances to a pool (docs/spec.md §2.3): one named
//! check each, with a stable code, a message and the fix. A pure function of
//! (cluster, pool, instance facts, context): every check is evaluated and
//! every result returned, so a user sees all problems at once.
//!
//! On the local cloud the instance facts are knit-local's simulated
//! attributes (account, VPC, security groups, ENIs, RAM role …); on a real
//! cloud they would come from its API.
//!
//! One file per check group, each adding its results in report order
//! (`ALL_CHECKS`): `membership` (quota, account, region, VPC, other
//! cluster, scaling group), `pool` (pool type, login), `machine` (swap,
//! OS, instance type), `access` (API server whitelist, security groups),
//! `network` (Terway, IPv6, Flannel) and `node_name`.

mod access;
mod machine;
mod membership;
mod network;
mod node_name;
mod pool;

use knit_api::views::{PreflightReport, PreflightResult, PreflightStatus};
use knit_api::{Cluster, NodePool};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The API server's port instances must reach.
pub const API_SERVER_PORT: u16 = 6443;
/// The kubelet's port the API server reaches on the node.
pub const KUBELET_PORT: u16 = 10250;
/// ECS: an instance may belong to at most 5 security groups (default quota).
pub const SECURITY_GROUP_QUOTA: usize = 5;
/// ECS: custom entries per VPC route table (default quota).
pub const ROUTE_ENTRY_QUOTA: u32 = 200;
/// Terway: minimum max-pods per node (shared ENI: > 10, exclusive: > 5).
pub const TERWAY_MIN_PODS_SHARED: u32 = 10;
pub const TERWAY_MIN_PODS_EXCLUSIVE: u32 = 5;
/// Tag a managed cluster puts on its nodes (ACK's); knit's own is `knit.dev/cluster`.
pub const TAG_ACK_CLUSTER: &str = "ack.aliyun.com";
pub const TAG_CLUSTER: &str = "knit.dev/cluster";
/// Tag an auto-scaling group puts on its instances.
pub const TAG_SCALING_GROUP: &str = "scaling-group";
/// The worker RAM role a Terway node needs (the local cloud's default name).
pub const DEFAULT_WORKER_RAM_ROLE: &str = "KnitWorkerRole";
/// Instance type families knit refuses (burstable and retired shared types:
/// too small or too old for a Kubernetes node).
pub const UNSUPPORTED_FAMILIES: &[&str] = &["ecs.t1", "ecs.t5", "ecs.s1", "ecs.n1", "ecs.xn4"];
/// Bare-metal GPU families with MIG: knit does not configure or reset MIG
/// (the agent installs no GPU driver and runs no nvidia-smi), but MIG GPU
/// and compute instances do not survive the reboot a re-image is.
pub const MIG_RESET_FAMILIES: &[&str] = &["ecs.ebmgn7", "ecs.ebmgn7e", "ecs.ebmgn7ex"];

/// How the instance is added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The system disk is replaced by the pool's image.
    #[default]
    Automatic,
    /// The instance keeps its OS; the user runs a command on it.
    Manual,
}

/// A security group rule as the cloud reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RuleFacts {
    /// ingress | egress.
    pub direction: String,
    /// tcp | udp | icmp | all.
    pub protocol: String,
    /// `80/80`, `1/65535`, `-1/-1`; none = every port.
    pub port_range: Option<String>,
    /// none = everywhere.
    pub cidr: Option<String>,
    /// accept | drop.
    pub policy: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SecurityGroupFacts {
    pub id: String,
    /// normal | enterprise.
    #[serde(rename = "type")]
    pub kind: String,
    pub rules: Vec<RuleFacts>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DiskFacts {
    pub id: String,
    /// Cloud device name inside the instance (`vdb`, `nvme0n1`).
    pub device: Option<String>,
    pub size_bytes: u64,
}

/// Everything the checks read about one instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct InstanceFacts {
    pub id: String,
    pub name: String,
    /// running | stopped …
    pub state: String,
    pub ip: Option<String>,
    pub instance_type: String,
    pub account_id: String,
    pub region_id: String,
    pub zone_id: String,
    pub vpc_id: String,
    pub v_switch_id: String,
    pub security_groups: Vec<SecurityGroupFacts>,
    /// Network interfaces attached now (1 = only the primary NIC).
    pub eni_count: u32,
    /// The instance type's ENI limits.
    pub max_enis: u32,
    pub max_ips_per_eni: u32,
    pub ram_role: Option<String>,
    pub ipv6: bool,
    pub swap: bool,
    /// os-release `ID`, `VERSION_ID`, `PRETTY_NAME`.
    pub os_id: String,
    pub os_version: String,
    pub os_name: String,
    pub tags: BTreeMap<String, String>,
    /// The instance logs in by password.
    pub password_login: bool,
    pub data_disks: Vec<DiskFacts>,
}

/// What the checks need besides cluster, pool and instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Context {
    pub mode: Mode,
    /// The cluster's cloud account.
    pub account_id: String,
    /// VPCs peered with the cluster's (reachable, but refused).
    pub peered_vpcs: Vec<String>,
    /// Nodes the cluster holds or has asked for (all pools' desired counts).
    pub cluster_nodes: i64,
    /// Instances being added in this request.
    pub adding: i64,
    /// Address instances use for the API server.
    pub api_server_ip: String,
    pub worker_ram_role: String,
    /// Custom route entries used in the VPC's route table (Flannel: one per node).
    pub route_entries_used: u32,
    pub route_entry_quota: u32,
    /// A new login password was given (automatic mode, password pools).
    pub new_password: bool,
    /// The instance is an active member of a pool of this cluster (its name).
    pub member_of_pool: Option<String>,
    /// The node is to be named after the instance (`--keep-instance-name`)
    /// rather than by the pool's rule.
    #[serde(default)]
    pub keep_instance_name: bool,
}

impl Default for Context {
    fn default() -> Self {
        Context {
            mode: Mode::Automatic,
            account_id: "local-account".into(),
            peered_vpcs: Vec::new(),
            cluster_nodes: 0,
            adding: 1,
            // Every real check sets the advertised host (attach::context);
            // this default (the default local subnet's gateway) is for tests.
            api_server_ip: "10.213.0.1".into(),
            worker_ram_role: DEFAULT_WORKER_RAM_ROLE.into(),
            route_entries_used: 0,
            route_entry_quota: ROUTE_ENTRY_QUOTA,
            new_password: false,
            member_of_pool: None,
            keep_instance_name: false,
        }
    }
}

/// A check's stable name and the code its result carries (on a pass too).
/// A check that fails in more than one way has one entry per code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Check {
    name: &'static str,
    code: &'static str,
}

const fn c(name: &'static str, code: &'static str) -> Check {
    Check { name, code }
}

// Every check and code, in report order: the stable API of preflight
// (docs/add-existing.md lists each with its fix).
const NODE_QUOTA: Check = c("node-quota", "PreflightNodeQuota");
const SAME_ACCOUNT: Check = c("same-account", "PreflightAccountMismatch");
const SAME_REGION: Check = c("same-region", "PreflightRegionMismatch");
const SAME_VPC: Check = c("same-vpc", "PreflightVpcMismatch");
const SAME_VPC_PEERED: Check = c("same-vpc", "PreflightVpcPeered");
const NOT_IN_OTHER_CLUSTER: Check = c("not-in-other-cluster", "PreflightInOtherCluster");
const ALREADY_IN_CLUSTER: Check = c("not-in-other-cluster", "PreflightAlreadyInCluster");
const NOT_IN_SCALING_GROUP: Check = c("not-in-scaling-group", "PreflightInScalingGroup");
const POOL_NOT_AUTO_MODE: Check = c("pool-not-auto-mode", "PreflightAutoModePool");
const POOL_NO_AUTO_SCALING: Check = c("pool-no-auto-scaling", "PreflightAutoScalingPool");
const NEW_PASSWORD: Check = c("new-password", "PreflightPasswordRequired");
const SWAP_OFF: Check = c("swap-off", "PreflightSwapOn");
const OS_ALLOWED: Check = c("os-allowed", "PreflightOsNotAllowed");
const OS_UNLISTED: Check = c("os-allowed", "PreflightOsUnlisted");
const INSTANCE_TYPE: Check = c("instance-type", "PreflightInstanceTypeUnsupported");
const INSTANCE_TYPE_MIG: Check = c("instance-type", "PreflightMigReset");
const INSTANCE_TYPE_IN_POOL: Check = c("instance-type-in-pool", "PreflightInstanceTypeNotInPool");
const API_WHITELIST: Check = c("api-whitelist", "PreflightNotWhitelisted");
const SG_TYPE: Check = c("security-group-type", "PreflightSecurityGroupType");
const SG_API_ACCESS: Check = c(
    "security-group-api-access",
    "PreflightSecurityGroupBlocksApiServer",
);
const SG_CONFLICT: Check = c("security-group-conflict", "PreflightSecurityGroupConflict");
const SG_QUOTA: Check = c("security-group-quota", "PreflightSecurityGroupQuota");
const TERWAY_MAX_PODS: Check = c("terway-max-pods", "PreflightTerwayMaxPods");
const TERWAY_ZONE: Check = c("terway-zone", "PreflightTerwayOtherZone");
const TERWAY_PRIMARY_NIC: Check = c("terway-primary-nic-only", "PreflightTerwaySecondaryEni");
const TERWAY_RAM_ROLE: Check = c("terway-ram-role", "PreflightRamRole");
const IPV6: Check = c("ipv6", "PreflightNoIpv6");
const FLANNEL_ROUTE_QUOTA: Check = c("flannel-route-quota", "PreflightRouteQuota");
const NODE_NAME: Check = c("node-name", "PreflightNodeNameInvalid");

#[cfg(test)]
const ALL_CHECKS: &[Check] = &[
    NODE_QUOTA,
    SAME_ACCOUNT,
    SAME_REGION,
    SAME_VPC,
    SAME_VPC_PEERED,
    NOT_IN_OTHER_CLUSTER,
    ALREADY_IN_CLUSTER,
    NOT_IN_SCALING_GROUP,
    POOL_NOT_AUTO_MODE,
    POOL_NO_AUTO_SCALING,
    NEW_PASSWORD,
    SWAP_OFF,
    OS_ALLOWED,
    OS_UNLISTED,
    INSTANCE_TYPE,
    INSTANCE_TYPE_MIG,
    INSTANCE_TYPE_IN_POOL,
    API_WHITELIST,
    SG_TYPE,
    SG_API_ACCESS,
    SG_CONFLICT,
    SG_QUOTA,
    TERWAY_MAX_PODS,
    TERWAY_ZONE,
    TERWAY_PRIMARY_NIC,
    TERWAY_RAM_ROLE,
    IPV6,
    FLANNEL_ROUTE_QUOTA,
    NODE_NAME,
];

/// Why a check failed, and what to do about it.
struct Failure {
    message: String,
    fix: String,
}

fn failure(message: impl Into<String>, fix: impl Into<String>) -> Failure {
    Failure {
        message: message.into(),
        fix: fix.into(),
    }
}

struct Out(Vec<PreflightResult>);

impl Out {
    fn pass(&mut self, c: Check, message: impl Into<String>) {
        self.push(c, PreflightStatus::Pass, message.into(), String::new());
    }
    fn skip(&mut self, c: Check, message: &str) {
        self.push(c, PreflightStatus::Skipped, message.into(), String::new());
    }
    fn fail(&mut self, c: Check, f: Failure) {
        self.push(c, PreflightStatus::Error, f.message, f.fix);
    }
    fn warn(&mut self, c: Check, f: Failure) {
        self.push(c, PreflightStatus::Warning, f.message, f.fix);
    }
    /// The shape most checks have: a pass when `ok`, else an error.
    fn require(&mut self, c: Check, ok: bool, pass: impl Into<String>, fail: Failure) {
        if ok {
            self.pass(c, pass);
        } else {
            self.fail(c, fail);
        }
    }
    fn push(&mut self, c: Check, status: PreflightStatus, message: String, fix: String) {
        self.0.push(PreflightResult {
            check: c.name.into(),
            code: c.code.into(),
            status,
            message,
            fix,
        });
    }
}

/// Runs every check; never stops at the first failure.
pub fn check(
    cluster: &Cluster,
    pool: &NodePool,
    i: &InstanceFacts,
    ctx: &Context,
) -> PreflightReport {
    let mut o = Out(Vec::new());
    membership::run(&mut o, cluster, i, ctx);
    pool::run(&mut o, pool, i, ctx);
    machine::run(&mut o, cluster, pool, i, ctx);
    access::run(&mut o, cluster, pool, i, ctx);
    network::run(&mut o, cluster, pool, i, ctx);
    node_name::run(&mut o, cluster, pool, i, ctx);
    PreflightReport {
        instance: i.id.clone(),
        results: o.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::NodePoolSpec;

    pub(super) fn good() -> InstanceFacts {
        InstanceFacts {
            id: "i-good".into(),
            name: "old-web".into(),
            state: "running".into(),
            ip: Some("10.213.0.50".into()),
            instance_type: "ecs.g7.large".into(),
            account_id: "local-account".into(),
            region_id: "local".into(),
            zone_id: "local-a".into(),
            vpc_id: "vpc-local".into(),
            v_switch_id: "vsw-local".into(),
            security_groups: vec![SecurityGroupFacts {
                id: "sg-1".into(),
                kind: "normal".into(),
                rules: vec![],
            }],
            eni_count: 1,
            max_enis: 3,
            max_ips_per_eni: 10,
            ram_role: Some(DEFAULT_WORKER_RAM_ROLE.into()),
            ipv6: true,
            swap: false,
            os_id: "debian".into(),
            os_version: "12".into(),
            os_name: "Debian 12".into(),
            tags: BTreeMap::new(),
            password_login: false,
            data_disks: vec![],
        }
    }

    pub(super) fn terway() -> Cluster {
        let mut c = Cluster::default();
        c.spec.network.plugin = "terway".into();
        c
    }

    pub(super) fn pool() -> NodePool {
        NodePool::new("workers", NodePoolSpec::default())
    }

    /// Runs `check` and returns the one result named `name`.
    pub(super) fn result(
        c: &Cluster,
        p: &NodePool,
        i: &InstanceFacts,
        ctx: &Context,
        name: &str,
    ) -> PreflightResult {
        let r = check(c, p, i, ctx);
        r.results
            .iter()
            .find(|x| x.check == name)
            .cloned()
            .unwrap_or_else(|| panic!("no check {name}"))
    }

    /// One passing and one failing case of `name`; the failure's code is `code`.
    pub(super) fn pair(
        name: &str,
        status: PreflightStatus,
        code: &str,
        mutate: impl Fn(&mut Cluster, &mut NodePool, &mut InstanceFacts, &mut Context),
    ) {
        let (c, p, i, ctx) = (terway(), pool(), good(), Context::default());
        let ok = result(&c, &p, &i, &ctx, name);
        assert_eq!(
            ok.status,
            PreflightStatus::Pass,
            "{name} on a good instance: {ok:?}"
        );
        assert!(check(&c, &p, &i, &ctx).passed());
        let (mut c, mut p, mut i, mut ctx) = (c, p, i, ctx);
        mutate(&mut c, &mut p, &mut i, &mut ctx);
        let bad = result(&c, &p, &i, &ctx, name);
        assert_eq!(bad.status, status, "{name}: {bad:?}");
        assert_eq!(bad.code, code, "{name}: {bad:?}");
        assert!(!bad.message.is_empty() && !bad.fix.is_empty(), "{bad:?}");
        // Only this check changed: every other one still passes or is skipped.
        let all = check(&c, &p, &i, &ctx);
        let others: Vec<_> = all
            .results
            .iter()
            .filter(|r| {
                r.check != name
                    && matches!(r.status, PreflightStatus::Error | PreflightStatus::Warning)
            })
            .collect();
        assert!(
            others.is_empty(),
            "{name}: other checks failed too: {others:?}"
        );
        assert_eq!(all.passed(), status != PreflightStatus::Error);
    }

    #[test]
    pub(super) fn a_good_instance_passes_every_check() {
        let r = check(&terway(), &pool(), &good(), &Context::default());
        assert!(r.passed(), "{r:?}");
        assert_eq!(r.results.len(), 25);
    }

    #[test]
    pub(super) fn every_result_is_a_listed_check_and_every_code_is_documented() {
        let mut dual = terway();
        dual.spec.network.ipv6 = true;
        for c in [terway(), Cluster::default(), dual] {
            for r in check(&c, &pool(), &good(), &Context::default()).results {
                assert!(
                    ALL_CHECKS
                        .iter()
                        .any(|k| k.name == r.check && k.code == r.code),
                    "{r:?} is not in ALL_CHECKS"
                );
            }
        }
        let doc = include_str!("../../../../docs/add-existing.md");
        for k in ALL_CHECKS {
            assert!(
                doc.contains(k.code),
                "{} is not in docs/add-existing.md",
                k.code
            );
        }
    }
    #[test]
    fn every_failure_is_reported_not_just_the_first() {
        let mut i = good();
        i.swap = true;
        i.vpc_id = "vpc-2".into();
        i.eni_count = 3;
        let r = check(&terway(), &pool(), &i, &Context::default());
        let codes: Vec<_> = r.errors().map(|e| e.code.as_str()).collect();
        assert_eq!(
            codes,
            [
                "PreflightVpcMismatch",
                "PreflightSwapOn",
                "PreflightTerwaySecondaryEni"
            ]
        );
        assert!(knit_api::views::preflight_table(&[r]).contains("fix: turn swap off"));
    }
}
