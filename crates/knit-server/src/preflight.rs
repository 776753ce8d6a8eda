//! Preflight for adding existing instances to a pool (docs/spec.md §2.3): one named
//! check each, with a stable code, a message and the fix. A pure function of
//! (cluster, pool, instance facts, context): every check is evaluated and
//! every result returned, so a user sees all problems at once.
//!
//! On the local cloud the instance facts are knit-local's simulated
//! attributes (account, VPC, security groups, ENIs, RAM role …); on a real
//! cloud they would come from its API.

use knit_api::views::{PreflightReport, PreflightResult, PreflightStatus};
use knit_api::{parse_cidr, Cluster, NodePool};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;

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

/// `MAJOR.MINOR` of a version string, `(0, 0)` when unreadable.
fn minor(version: &str) -> (u32, u32) {
    let mut it = version
        .trim_start_matches('v')
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// Port range `a/b` contains `port`; none or `-1/-1` is every port.
fn port_in(range: Option<&str>, port: u16) -> bool {
    let Some(r) = range else { return true };
    let Some((a, b)) = r.split_once('/') else {
        return false;
    };
    match (a.trim().parse::<i64>(), b.trim().parse::<i64>()) {
        (Ok(-1), Ok(-1)) => true,
        (Ok(a), Ok(b)) => (a..=b).contains(&i64::from(port)),
        _ => false,
    }
}

fn cidr_has(cidr: Option<&str>, ip: Option<IpAddr>) -> bool {
    match (cidr, ip) {
        (None, _) => true,
        (Some(c), Some(ip)) => parse_cidr(c).is_some_and(|c| c.contains(ip)),
        (Some(c), None) => c == "0.0.0.0/0",
    }
}

/// The first rule (accept or drop) of the instance's groups that matches
/// traffic `direction` / tcp / `port` / `peer`. Drop wins over accept for
/// the same match, as in ECS at equal priority.
fn matching<'a>(
    groups: &'a [SecurityGroupFacts],
    direction: &str,
    port: u16,
    peer: Option<IpAddr>,
) -> (Option<&'a RuleFacts>, Option<&'a RuleFacts>) {
    let rules = groups.iter().flat_map(|g| g.rules.iter()).filter(|r| {
        r.direction == direction
            && (r.protocol == "tcp" || r.protocol == "all")
            && port_in(r.port_range.as_deref(), port)
            && cidr_has(r.cidr.as_deref(), peer)
    });
    let (mut accept, mut drop) = (None, None);
    for r in rules {
        if r.policy == "drop" {
            drop.get_or_insert(r);
        } else {
            accept.get_or_insert(r);
        }
    }
    (accept, drop)
}

fn rule_text(r: &RuleFacts) -> String {
    format!(
        "{} {} {} {} {}",
        r.direction,
        r.protocol,
        r.port_range.as_deref().unwrap_or("all ports"),
        r.cidr.as_deref().unwrap_or("anywhere"),
        r.policy
    )
}

/// Runs every check; never stops at the first failure.
pub fn check(
    cluster: &Cluster,
    pool: &NodePool,
    i: &InstanceFacts,
    ctx: &Context,
) -> PreflightReport {
    let mut o = Out(Vec::new());
    let spec = &cluster.spec;
    let ps = &pool.spec;
    let pool_name = &pool.metadata.name;
    let ip: Option<IpAddr> = i.ip.as_deref().and_then(|s| s.parse().ok());

    // Cluster node quota.
    let quota = spec.effective_node_quota();
    let total = ctx.cluster_nodes + ctx.adding;
    o.require(
        NODE_QUOTA,
        total <= quota,
        format!("{total} of {quota} nodes after adding"),
        failure(
            format!("adding {} instance(s) makes {total} nodes; the cluster's node quota is {quota}", ctx.adding),
            "remove nodes from other pools, add fewer instances, or raise the cluster's nodeQuota (edition pro allows 5000)",
        ),
    );

    // Same account, region and VPC.
    o.require(
        SAME_ACCOUNT,
        i.account_id == ctx.account_id,
        format!("account {}", i.account_id),
        failure(
            format!(
                "instance {} belongs to account {:?}, the cluster to {:?}",
                i.id, i.account_id, ctx.account_id
            ),
            "only instances of the cluster's own account can be added",
        ),
    );
    o.require(
        SAME_REGION,
        i.region_id == spec.region,
        format!("region {}", i.region_id),
        failure(
            format!(
                "instance {} is in region {:?}, the cluster in {:?}",
                i.id, i.region_id, spec.region
            ),
            "add an instance of the cluster's region",
        ),
    );
    // A peered VPC is reachable but refused.
    if ctx.peered_vpcs.contains(&i.vpc_id) && i.vpc_id != spec.vpc {
        o.fail(SAME_VPC_PEERED, failure(
            format!("instance {} is in VPC {:?}, peered with the cluster's VPC {:?}: instances across a VPC peering cannot be added", i.id, i.vpc_id, spec.vpc),
            "use an instance in the cluster's own VPC",
        ));
    } else {
        o.require(
            SAME_VPC,
            i.vpc_id == spec.vpc,
            format!("VPC {}", i.vpc_id),
            failure(
                format!(
                    "instance {} is in VPC {:?}, the cluster in {:?}",
                    i.id, i.vpc_id, spec.vpc
                ),
                "use an instance in the cluster's VPC",
            ),
        );
    }

    // Not in another cluster (or already a node of this one).
    let other = [TAG_ACK_CLUSTER, TAG_CLUSTER].iter().find_map(|t| {
        i.tags
            .get(*t)
            .filter(|v| **v != cluster.metadata.name)
            .map(|v| (*t, v))
    });
    match (other, &ctx.member_of_pool) {
        (Some((tag, v)), _) => o.fail(NOT_IN_OTHER_CLUSTER, failure(
            format!("instance {} belongs to cluster {v:?} (tag {tag})", i.id),
            "remove it from that cluster first (drain it and remove the node, keeping the instance)",
        )),
        (None, Some(p)) => o.fail(ALREADY_IN_CLUSTER, failure(
            format!("instance {} is already a node of pool {p:?} of this cluster", i.id),
            format!("remove it from pool {p:?} first: knit delete node NAME --release=false"),
        )),
        (None, None) => o.pass(NOT_IN_OTHER_CLUSTER, "in no other cluster"),
    }

    // Not in an auto-scaling group.
    match i.tags.get(TAG_SCALING_GROUP) {
        Some(g) => o.fail(
            NOT_IN_SCALING_GROUP,
            failure(
                format!("instance {} belongs to auto-scaling group {g:?}", i.id),
                "remove it from the scaling group first",
            ),
        ),
        None => o.pass(NOT_IN_SCALING_GROUP, "in no auto-scaling group"),
    }

    // Pool type.
    o.require(
        POOL_NOT_AUTO_MODE,
        ps.pool_type != "auto-mode",
        format!("pool type {}", ps.pool_type),
        failure(
            format!("pool {pool_name:?} is an auto-mode pool: its nodes are managed for you"),
            "add the instance to a regular pool",
        ),
    );
    o.require(
        POOL_NO_AUTO_SCALING,
        ps.pool_type != "auto-scaling",
        "no auto-scaling",
        failure(
            format!(
                "pool {pool_name:?} has auto-scaling: the autoscaler would remove added instances"
            ),
            "add the instance to a pool without auto-scaling",
        ),
    );

    // Login: automatic mode resets the system disk, so a password pool needs a new password.
    let password_lost = ctx.mode == Mode::Automatic
        && (ps.login.password.is_some() || i.password_login)
        && !ctx.new_password;
    o.require(
        NEW_PASSWORD,
        !password_lost,
        "no new password needed, or one given",
        failure(
            "the instance is re-imaged and logs in by password: a new password is required",
            "give --password with the new login password",
        ),
    );

    // Swap off.
    o.require(
        SWAP_OFF,
        !i.swap,
        "swap is off",
        failure(
            format!(
                "instance {} has swap enabled: the kubelet refuses to run with swap",
                i.id
            ),
            "turn swap off (swapoff -a and remove it from /etc/fstab)",
        ),
    );

    // OS.
    check_os(&mut o, spec.kubernetes_version.as_str(), i, ctx.mode);

    // Instance type.
    let family = |list: &[&str]| {
        list.iter().any(|f| {
            i.instance_type == *f
                || i.instance_type
                    .strip_prefix(f)
                    .is_some_and(|r| r.starts_with('.'))
        })
    };
    let unsupported = family(UNSUPPORTED_FAMILIES);
    if family(MIG_RESET_FAMILIES) && !unsupported {
        let what = match ctx.mode {
            Mode::Automatic => "the re-image replaces the system disk and reboots the machine, and MIG GPU and compute instances do not survive a reboot: they are gone once it joins",
            Mode::Manual => "the MIG layout stays as long as the machine does not reboot (MIG GPU and compute instances do not survive one)",
        };
        o.warn(INSTANCE_TYPE_MIG, failure(
            format!("instance type {} is a bare-metal GPU family with MIG: knit does not configure or reset MIG (its agent installs no GPU driver and runs no nvidia-smi), but {what}; a bare-metal boot is also slow enough to hit the join timeout", i.instance_type),
            "raise the pool's joinTimeoutSeconds, and create the MIG instances again after the node joins (nvidia-smi mig, e.g. from the pool's userData)",
        ));
    } else {
        o.require(
            INSTANCE_TYPE,
            !unsupported,
            format!("instance type {}", i.instance_type),
            failure(
                format!(
                    "instance type {} is not supported for nodes",
                    i.instance_type
                ),
                "change the instance type, or use another instance",
            ),
        );
    }

    // The pool manages several instance types; an added instance's type
    // must be one of them (the add-existing seed's precondition).
    o.require(
        INSTANCE_TYPE_IN_POOL,
        ps.instance_types.contains(&i.instance_type),
        format!("instance type {} is in pool {pool_name}'s instance types", i.instance_type),
        failure(
            format!(
                "instance type {} is not in pool {pool_name}'s instance types ({})",
                i.instance_type,
                ps.instance_types.join(", ")
            ),
            format!(
                "add {} to the pool's spec.instanceTypes (knit apply -f), or add an instance of one of the listed types",
                i.instance_type
            ),
        ),
    );

    // API server whitelist.
    match ip {
        Some(a) => o.require(
            API_WHITELIST,
            spec.whitelist_allows(a),
            format!("{a} is in the API server whitelist"),
            failure(
                format!(
                    "instance address {a} is not in the API server whitelist ({})",
                    spec.api_server_whitelist.join(", ")
                ),
                format!("add {a}/32 (or its subnet) to the cluster's apiServerWhitelist"),
            ),
        ),
        None => o.fail(
            API_WHITELIST,
            failure(
                format!("instance {} has no private IP address", i.id),
                "start the instance so it gets an address",
            ),
        ),
    }

    // Security groups: type, access to the API server, conflicts, count.
    check_security_groups(&mut o, ps.security_group_type.as_str(), i, ctx, ip);

    // Terway.
    if spec.network.plugin == "terway" {
        check_terway(&mut o, cluster, pool, i, ctx);
    } else {
        for c in [
            TERWAY_MAX_PODS,
            TERWAY_ZONE,
            TERWAY_PRIMARY_NIC,
            TERWAY_RAM_ROLE,
        ] {
            o.skip(c, "the cluster's network plugin is not Terway");
        }
    }

    // IPv6 dual stack.
    if spec.network.ipv6 {
        o.require(
            IPV6,
            i.ipv6,
            "the primary NIC has an IPv6 address",
            failure(
                format!(
                    "the cluster is dual-stack but instance {}'s primary NIC has no IPv6 address",
                    i.id
                ),
                "assign an IPv6 address to the primary NIC",
            ),
        );
    } else {
        o.skip(IPV6, "the cluster is not dual-stack");
    }

    // Flannel: one custom route entry per node.
    if spec.network.plugin == "flannel" {
        let after = ctx.route_entries_used + 1;
        o.require(
            FLANNEL_ROUTE_QUOTA,
            after <= ctx.route_entry_quota,
            format!("{after} of {} route entries", ctx.route_entry_quota),
            failure(
                format!("the VPC route table holds {} custom entries, its quota is {}: Flannel needs one more for this node", ctx.route_entries_used, ctx.route_entry_quota),
                "raise the route table's entry quota or remove unused entries",
            ),
        );
    } else {
        o.skip(
            FLANNEL_ROUTE_QUOTA,
            "the cluster's network plugin is not Flannel",
        );
    }

    check_node_name(&mut o, cluster, pool, i, ctx);

    PreflightReport {
        instance: i.id.clone(),
        results: o.0,
    }
}

/// The name the node will get must be a Kubernetes node name, checked here
/// so that a bad one is refused before anything is changed (automatic
/// mode re-images the machine; the agent would refuse the name after it).
fn check_node_name(
    o: &mut Out,
    cluster: &Cluster,
    pool: &NodePool,
    i: &InstanceFacts,
    ctx: &Context,
) {
    const RULE: &str = "a node name must be a DNS-1123 subdomain: at most 253 characters, lowercase letters, digits, '-' and '.', every dot-separated part starting and ending with a letter or digit";
    if ctx.keep_instance_name {
        // What attach::node_name gives the node.
        let name = i.name.to_lowercase();
        let suggestion = dns_name_like(&name);
        o.require(
            NODE_NAME,
            knit_api::validate::is_dns_subdomain(&name),
            format!("node name {name:?} (the instance's name, lowercased)"),
            failure(
                format!(
                    "instance {}'s name {:?} cannot be its node name ({RULE}; upper case is lowercased): it holds {}",
                    i.id,
                    i.name,
                    offending(&name)
                ),
                match suggestion {
                    Some(s) => format!("rename the instance (e.g. to {s:?}), or add it without --keep-instance-name so that the pool's naming rule names the node"),
                    None => "rename the instance, or add it without --keep-instance-name so that the pool's naming rule names the node".to_string(),
                },
            ),
        );
        return;
    }
    let by_rule = knit_api::agent::node_name_by_rule(
        pool.spec.custom_node_name.as_ref(),
        i.ip.as_deref(),
        &cluster.spec.region,
        Some(&i.id),
    );
    let checked = match (&pool.spec.custom_node_name, &by_rule) {
        (Some(_), Some(name)) => knit_api::CustomNodeName::check_rendered(name),
        (None, Some(name)) if !knit_api::validate::is_dns_subdomain(name) => Err(RULE.to_string()),
        _ => Ok(()),
    };
    match (by_rule, checked) {
        (None, _) => o.pass(NODE_NAME, "named by the pool's rule once its address is known"),
        (Some(name), Ok(())) => o.pass(NODE_NAME, format!("node name {name:?} (the pool's rule)")),
        (Some(name), Err(rule)) => o.fail(
            NODE_NAME,
            failure(
                format!("the pool's naming rule names instance {}'s node {name:?}, which {rule}", i.id),
                "add it with --keep-instance-name (an instance name that is a valid node name), or change the pool's customNodeName",
            ),
        ),
    }
}

/// What in `name` breaks the node-name rule, in words.
fn offending(name: &str) -> String {
    let mut what: Vec<String> = Vec::new();
    let bad: Vec<char> = name
        .chars()
        .filter(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
        .collect();
    if bad.contains(&'_') {
        what.push("'_'".into());
    }
    if bad.iter().any(|c| c.is_whitespace()) {
        what.push("spaces".into());
    }
    if bad.iter().any(|c| !c.is_ascii()) {
        what.push("non-ASCII characters".into());
    }
    let others: String = bad
        .iter()
        .filter(|c| **c != '_' && !c.is_whitespace() && c.is_ascii())
        .collect();
    if !others.is_empty() {
        what.push(format!("{others:?}"));
    }
    if name.is_empty() {
        what.push("nothing (it is empty)".into());
    } else if name.len() > 253 {
        what.push(format!("{} characters", name.len()));
    }
    if what.is_empty() {
        what.push("a part that starts or ends with '-' or '.', or an empty part".into());
    }
    what.join(", ")
}

/// A node name close to `name` (other characters as '-'), if one is left.
fn dns_name_like(name: &str) -> Option<String> {
    let mapped: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let parts: Vec<String> = mapped
        .split('.')
        .map(|p| {
            let mut squeezed = String::new();
            for c in p.chars() {
                if !(c == '-' && squeezed.ends_with('-')) {
                    squeezed.push(c);
                }
            }
            squeezed
                .trim_matches('-')
                .chars()
                .take(63)
                .collect::<String>()
        })
        .filter(|p| !p.is_empty())
        .collect();
    let out = parts.join(".");
    knit_api::validate::is_dns_subdomain(&out).then_some(out)
}

fn check_terway(o: &mut Out, cluster: &Cluster, pool: &NodePool, i: &InstanceFacts, ctx: &Context) {
    let spec = &cluster.spec;
    let pool_name = &pool.metadata.name;
    let exclusive = spec.network.terway_eni_mode == "exclusive";
    let extra = i.max_enis.saturating_sub(1);
    let (pods, min, formula) = if exclusive {
        (
            extra,
            TERWAY_MIN_PODS_EXCLUSIVE,
            format!("EniQuantity − 1 = {} − 1", i.max_enis),
        )
    } else {
        (
            extra * i.max_ips_per_eni,
            TERWAY_MIN_PODS_SHARED,
            format!(
                "(EniQuantity − 1) × EniPrivateIpAddressQuantity = ({} − 1) × {}",
                i.max_enis, i.max_ips_per_eni
            ),
        )
    };
    o.require(
        TERWAY_MAX_PODS,
        pods > min,
        format!("max pods {pods} ({formula})"),
        failure(
            format!("instance type {} gives Terway ({} ENI) at most {pods} pods ({formula}); more than {min} are needed", i.instance_type, spec.network.terway_eni_mode),
            "use an instance type with more ENIs / IPs per ENI",
        ),
    );
    match &pool.spec.zone {
        Some(z) if *z != i.zone_id => o.warn(TERWAY_ZONE, failure(
            format!("instance is in zone {:?}, pool {pool_name:?} in {z:?}: without a vSwitch of that zone in Terway's config, pods get addresses from the wrong vSwitch", i.zone_id),
            format!("add a vSwitch of zone {:?} to Terway's configuration (eni-config)", i.zone_id),
        )),
        _ => o.pass(TERWAY_ZONE, format!("zone {}", i.zone_id)),
    }
    o.require(
        TERWAY_PRIMARY_NIC,
        i.eni_count <= 1,
        "only the primary NIC",
        failure(
            format!(
                "instance {} has {} network interfaces; Terway needs only the primary NIC attached",
                i.id, i.eni_count
            ),
            "detach the secondary ENIs (existing ones are kept otherwise and confuse Terway)",
        ),
    );
    let role = ctx.worker_ram_role.as_str();
    o.require(
        TERWAY_RAM_ROLE,
        i.ram_role.as_deref() == Some(role),
        format!("RAM role {role}"),
        failure(
            format!(
                "instance {} carries RAM role {:?}, Terway needs the worker role {:?}",
                i.id,
                i.ram_role.as_deref().unwrap_or("(none)"),
                role
            ),
            format!("attach the RAM role {role} to the instance"),
        ),
    );
}

/// One supported OS release and the Kubernetes minors it runs (inclusive;
/// `None`: no bound). Used for instances added in manual mode (their OS is
/// kept).
struct OsSupport {
    /// os-release `ID` values of the distribution.
    ids: &'static [&'static str],
    /// os-release `VERSION_ID`: equal, or this followed by `.` (`2` takes
    /// `2.1903`).
    version: &'static str,
    name: &'static str,
    oldest: Option<(u32, u32)>,
    newest: Option<(u32, u32)>,
}

const fn os(
    ids: &'static [&'static str],
    version: &'static str,
    name: &'static str,
    oldest: Option<(u32, u32)>,
    newest: Option<(u32, u32)>,
) -> OsSupport {
    OsSupport {
        ids,
        version,
        name,
        oldest,
        newest,
    }
}

const ALINUX: &[&str] = &["alinux", "aliyun"];
const RHEL_LIKE: &[&str] = &["rhel", "rocky", "almalinux"];

/// Supported OS releases per Kubernetes version, in one place
/// (docs/add-existing.md shows it). CentOS 7 and Alibaba Cloud Linux 2 end
/// at 1.30 (the add-existing seed); the other bounds are knit's, from each
/// release's kernel, cgroup and glibc support and its end of life.
const OS_SUPPORT: &[OsSupport] = &[
    os(&["centos"], "7", "CentOS 7", None, Some((1, 30))),
    os(ALINUX, "2", "Alibaba Cloud Linux 2", None, Some((1, 30))),
    os(ALINUX, "3", "Alibaba Cloud Linux 3", Some((1, 20)), None),
    os(
        RHEL_LIKE,
        "8",
        "Red Hat Enterprise Linux 8 family",
        Some((1, 22)),
        None,
    ),
    os(
        RHEL_LIKE,
        "9",
        "Red Hat Enterprise Linux 9 family",
        Some((1, 26)),
        None,
    ),
    os(&["anolis"], "8", "Anolis OS 8", Some((1, 22)), None),
    os(&["kylin"], "v10", "Kylin V10", Some((1, 22)), None),
    os(&["ubuntu"], "20.04", "Ubuntu 20.04", None, Some((1, 30))),
    os(&["ubuntu"], "22.04", "Ubuntu 22.04", Some((1, 24)), None),
    os(&["ubuntu"], "24.04", "Ubuntu 24.04", Some((1, 30)), None),
    os(&["debian"], "11", "Debian 11", Some((1, 22)), Some((1, 32))),
    os(&["debian"], "12", "Debian 12", Some((1, 26)), None),
];

fn os_row(id: &str, version: &str) -> Option<&'static OsSupport> {
    OS_SUPPORT.iter().find(|r| {
        r.ids.contains(&id)
            && version
                .strip_prefix(r.version)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    })
}

fn range_text(r: &OsSupport) -> String {
    match (r.oldest, r.newest) {
        (Some((a, b)), Some((c, d))) => format!("Kubernetes {a}.{b} to {c}.{d}"),
        (Some((a, b)), None) => format!("Kubernetes {a}.{b} and newer"),
        (None, Some((c, d))) => format!("Kubernetes up to {c}.{d}"),
        (None, None) => "every Kubernetes version".into(),
    }
}

fn check_os(o: &mut Out, version: &str, i: &InstanceFacts, mode: Mode) {
    let id = i.os_id.to_ascii_lowercase();
    let name = if i.os_name.is_empty() {
        format!("{} {}", i.os_id, i.os_version)
    } else {
        i.os_name.clone()
    };
    if mode == Mode::Automatic {
        // The system disk is replaced by the pool's image: the OS is the pool's.
        o.pass(
            OS_ALLOWED,
            format!("{name} is replaced by the pool's image"),
        );
        return;
    }
    let windows = id.contains("windows");
    let container_os = id == "lifsea" || id.contains("containeros");
    if windows || container_os {
        o.fail(
            OS_ALLOWED,
            failure(
                format!("{name} cannot be added manually (Windows and ContainerOS are refused)"),
                "use automatic mode (the pool's image replaces the OS) or another instance",
            ),
        );
        return;
    }
    let Some(row) = os_row(&id, i.os_version.trim()) else {
        o.warn(OS_UNLISTED, failure(
            format!("{name} (ID {}, VERSION_ID {}) is not in knit's table of supported OS releases; it may work with Kubernetes {version}, untested", i.os_id, i.os_version),
            "use automatic mode (the pool's image replaces the OS), or an OS release listed in docs/add-existing.md",
        ));
        return;
    };
    let cluster = minor(version);
    let too_old = row.oldest.is_some_and(|m| cluster < m);
    let too_new = row.newest.is_some_and(|m| cluster > m);
    if too_old || too_new {
        o.fail(OS_ALLOWED, failure(
            format!("{} is supported with {}; the cluster runs {version}", row.name, range_text(row)),
            "use automatic mode (the pool's image replaces the OS) or an OS release that supports the cluster's version",
        ));
    } else {
        o.pass(
            OS_ALLOWED,
            format!("{name}: {} supports {}", row.name, range_text(row)),
        );
    }
}

fn check_security_groups(
    o: &mut Out,
    pool_type: &str,
    i: &InstanceFacts,
    ctx: &Context,
    node_ip: Option<IpAddr>,
) {
    let groups = &i.security_groups;
    let wrong: Vec<String> = groups
        .iter()
        .filter(|g| g.kind != pool_type)
        .map(|g| format!("{} ({})", g.id, g.kind))
        .collect();
    if groups.is_empty() {
        o.fail(
            SG_TYPE,
            failure(
                format!("instance {} is in no security group", i.id),
                format!("put it in a {pool_type} security group"),
            ),
        );
    } else {
        o.require(
            SG_TYPE,
            wrong.is_empty(),
            format!("{pool_type} security group(s)"),
            failure(
                format!(
                    "security group(s) {} are not of the pool's type {pool_type}",
                    wrong.join(", ")
                ),
                format!("move the instance into {pool_type} security groups only"),
            ),
        );
    }

    let api_ip = &ctx.api_server_ip;
    let api: Option<IpAddr> = api_ip.parse().ok();
    let (accept, drop) = matching(groups, "egress", API_SERVER_PORT, api);
    // Normal groups allow all egress unless a rule drops it; enterprise
    // groups deny egress unless a rule accepts it.
    let enterprise = groups.iter().any(|g| g.kind == "enterprise");
    match (drop, accept) {
        (Some(d), _) => o.fail(SG_API_ACCESS, failure(
            format!("rule \"{}\" blocks the API server {api_ip}:{API_SERVER_PORT}", rule_text(d)),
            format!("remove the rule, or accept egress tcp {API_SERVER_PORT}/{API_SERVER_PORT} to {api_ip}/32"),
        )),
        (None, None) if enterprise => o.fail(SG_API_ACCESS, failure(
            format!("enterprise security groups deny egress by default and no rule accepts the API server {api_ip}:{API_SERVER_PORT}"),
            format!("add an egress rule: tcp {API_SERVER_PORT}/{API_SERVER_PORT} to {api_ip}/32 accept"),
        )),
        _ => o.pass(SG_API_ACCESS, format!("egress to {api_ip}:{API_SERVER_PORT} allowed")),
    }
    // A conflict: the cluster's rule that lets the API server reach the
    // kubelet is overridden by a drop rule of the instance's groups.
    let (_, drop) = matching(groups, "ingress", KUBELET_PORT, api);
    match drop {
        Some(d) => o.fail(SG_CONFLICT, failure(
            format!("rule \"{}\" conflicts with the cluster's rules: it drops the API server's traffic to the kubelet ({}:{KUBELET_PORT} from {api_ip})", rule_text(d), node_ip.map(|a| a.to_string()).unwrap_or_default()),
            "remove the drop rule or narrow it so it does not cover the API server's address",
        )),
        None => o.pass(SG_CONFLICT, "no rule conflicts with the cluster's"),
    }
    o.require(
        SG_QUOTA,
        groups.len() <= SECURITY_GROUP_QUOTA,
        format!("{} of {SECURITY_GROUP_QUOTA} security groups", groups.len()),
        failure(
            format!("instance {} is in {} security groups; at most {SECURITY_GROUP_QUOTA} are allowed, and joining adds the cluster's", i.id, groups.len()),
            "remove the instance from security groups it does not need",
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::NodePoolSpec;

    fn good() -> InstanceFacts {
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

    fn terway() -> Cluster {
        let mut c = Cluster::default();
        c.spec.network.plugin = "terway".into();
        c
    }

    fn pool() -> NodePool {
        NodePool::new("workers", NodePoolSpec::default())
    }

    /// Runs `check` and returns the one result named `name`.
    fn result(
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
    fn pair(
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
    fn a_good_instance_passes_every_check() {
        let r = check(&terway(), &pool(), &good(), &Context::default());
        assert!(r.passed(), "{r:?}");
        assert_eq!(r.results.len(), 25);
    }

    #[test]
    fn every_result_is_a_listed_check_and_every_code_is_documented() {
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
        let doc = include_str!("../../../docs/add-existing.md");
        for k in ALL_CHECKS {
            assert!(
                doc.contains(k.code),
                "{} is not in docs/add-existing.md",
                k.code
            );
        }
    }

    /// Issue 27 (2): with --keep-instance-name an instance name that is no
    /// node name ('_', spaces, non-ASCII) is refused by the preflight — so
    /// before the re-image — with the rule and how to fix it.
    #[test]
    fn a_kept_instance_name_must_be_a_node_name() {
        for (bad, like) in [
            ("web_01", "web-01"),
            ("web 01", "web-01"),
            ("wéb-01", "w-b-01"),
        ] {
            pair(
                "node-name",
                PreflightStatus::Error,
                "PreflightNodeNameInvalid",
                |_, _, i, ctx| {
                    ctx.keep_instance_name = true;
                    i.name = bad.into();
                },
            );
            let ctx = Context {
                keep_instance_name: true,
                ..Context::default()
            };
            let mut i = good();
            i.name = bad.into();
            let r = result(&terway(), &pool(), &i, &ctx, "node-name");
            assert!(r.message.contains("DNS-1123"), "{r:?}");
            assert!(r.fix.contains(&format!("{like:?}")), "a name to use: {r:?}");
            assert!(r.fix.contains("--keep-instance-name"), "{r:?}");
        }
        let ctx = Context {
            keep_instance_name: true,
            ..Context::default()
        };
        let mut i = good();
        i.name = "Web-01".into();
        let r = result(&terway(), &pool(), &i, &ctx, "node-name");
        assert_eq!(
            r.status,
            PreflightStatus::Pass,
            "upper case is lowercased: {r:?}"
        );
        assert!(r.message.contains("\"web-01\""), "{r:?}");
        // Without it, the pool's rule names the node: its name is checked.
        let mut v6 = good();
        v6.ip = Some("fd00::5".into());
        let mut p = pool();
        p.spec.custom_node_name = Some(knit_api::CustomNodeName {
            prefix: "node".into(),
            suffix: String::new(),
        });
        let r = result(&terway(), &p, &v6, &Context::default(), "node-name");
        assert_eq!(r.status, PreflightStatus::Error, "{r:?}");
        assert!(r.message.contains("IPv6"), "{r:?}");
    }

    #[test]
    fn node_quota() {
        pair(
            "node-quota",
            PreflightStatus::Error,
            "PreflightNodeQuota",
            |_, _, _, ctx| ctx.cluster_nodes = 10,
        );
    }
    #[test]
    fn same_account() {
        pair(
            "same-account",
            PreflightStatus::Error,
            "PreflightAccountMismatch",
            |_, _, i, _| i.account_id = "other".into(),
        );
    }
    #[test]
    fn same_region() {
        pair(
            "same-region",
            PreflightStatus::Error,
            "PreflightRegionMismatch",
            |_, _, i, _| i.region_id = "cn-x".into(),
        );
    }
    #[test]
    fn same_vpc_and_peered_vpc() {
        pair(
            "same-vpc",
            PreflightStatus::Error,
            "PreflightVpcMismatch",
            |_, _, i, _| i.vpc_id = "vpc-2".into(),
        );
        pair(
            "same-vpc",
            PreflightStatus::Error,
            "PreflightVpcPeered",
            |_, _, i, ctx| {
                i.vpc_id = "vpc-peer".into();
                ctx.peered_vpcs = vec!["vpc-peer".into()];
            },
        );
    }
    #[test]
    fn not_in_other_cluster() {
        pair(
            "not-in-other-cluster",
            PreflightStatus::Error,
            "PreflightInOtherCluster",
            |_, _, i, _| {
                i.tags.insert(TAG_ACK_CLUSTER.into(), "c-123".into());
            },
        );
        pair(
            "not-in-other-cluster",
            PreflightStatus::Error,
            "PreflightAlreadyInCluster",
            |_, _, _, ctx| ctx.member_of_pool = Some("workers".into()),
        );
    }
    #[test]
    fn not_in_scaling_group() {
        pair(
            "not-in-scaling-group",
            PreflightStatus::Error,
            "PreflightInScalingGroup",
            |_, _, i, _| {
                i.tags.insert(TAG_SCALING_GROUP.into(), "asg-1".into());
            },
        );
    }
    #[test]
    fn pool_type() {
        pair(
            "pool-not-auto-mode",
            PreflightStatus::Error,
            "PreflightAutoModePool",
            |_, p, _, _| p.spec.pool_type = "auto-mode".into(),
        );
        pair(
            "pool-no-auto-scaling",
            PreflightStatus::Error,
            "PreflightAutoScalingPool",
            |_, p, _, _| p.spec.pool_type = "auto-scaling".into(),
        );
    }
    #[test]
    fn new_password() {
        pair(
            "new-password",
            PreflightStatus::Error,
            "PreflightPasswordRequired",
            |_, p, _, _| p.spec.login.password = Some("Secret-123".into()),
        );
        let mut p = pool();
        p.spec.login.password = Some("Secret-123".into());
        let ctx = Context {
            new_password: true,
            ..Context::default()
        };
        assert_eq!(
            result(&terway(), &p, &good(), &ctx, "new-password").status,
            PreflightStatus::Pass
        );
    }
    #[test]
    fn swap_off() {
        pair(
            "swap-off",
            PreflightStatus::Error,
            "PreflightSwapOn",
            |_, _, i, _| i.swap = true,
        );
    }
    #[test]
    fn os_allowed_in_manual_mode() {
        let manual = |ctx: &mut Context| ctx.mode = Mode::Manual;
        pair(
            "os-allowed",
            PreflightStatus::Error,
            "PreflightOsNotAllowed",
            |_, _, i, ctx| {
                manual(ctx);
                i.os_id = "windows".into();
            },
        );
        pair(
            "os-allowed",
            PreflightStatus::Error,
            "PreflightOsNotAllowed",
            |_, _, i, ctx| {
                manual(ctx);
                i.os_id = "lifsea".into();
            },
        );
        // CentOS 7: refused on 1.31, allowed on 1.30.
        pair(
            "os-allowed",
            PreflightStatus::Error,
            "PreflightOsNotAllowed",
            |_, _, i, ctx| {
                manual(ctx);
                i.os_id = "centos".into();
                i.os_version = "7".into();
            },
        );
        let mut c = terway();
        c.spec.kubernetes_version = "1.30.7".into();
        let i = InstanceFacts {
            os_id: "aliyun".into(),
            os_version: "2.1903".into(),
            ..good()
        };
        let ctx = Context {
            mode: Mode::Manual,
            ..Context::default()
        };
        assert_eq!(
            result(&c, &pool(), &i, &ctx, "os-allowed").status,
            PreflightStatus::Pass
        );
        // Automatic mode replaces the OS: Windows is fine there.
        let i = InstanceFacts {
            os_id: "windows".into(),
            ..good()
        };
        assert_eq!(
            result(&terway(), &pool(), &i, &Context::default(), "os-allowed").status,
            PreflightStatus::Pass
        );
    }
    #[test]
    fn instance_type() {
        // Each family is listed in the pool: only the family check speaks.
        let set = |p: &mut NodePool, i: &mut InstanceFacts, t: &str| {
            i.instance_type = t.into();
            p.spec.instance_types.push(t.into());
        };
        pair(
            "instance-type",
            PreflightStatus::Error,
            "PreflightInstanceTypeUnsupported",
            |_, p, i, _| set(p, i, "ecs.t5.small"),
        );
        pair(
            "instance-type",
            PreflightStatus::Warning,
            "PreflightMigReset",
            |_, p, i, _| set(p, i, "ecs.ebmgn7e.32xlarge"),
        );
        // Issue 27 (7): the text says what knit really does with MIG.
        let mut p = pool();
        let mut i = good();
        set(&mut p, &mut i, "ecs.ebmgn7.32xlarge");
        let r = result(&terway(), &p, &i, &Context::default(), "instance-type");
        assert!(
            r.message.contains("does not configure or reset MIG"),
            "{r:?}"
        );
        assert!(!r.message.contains("are reset at initialization"), "{r:?}");
        assert!(r.fix.contains("create the MIG instances again"), "{r:?}");
    }
    #[test]
    fn instance_type_in_pool() {
        // The seed's precondition: an instance of a type the pool does not
        // list is refused (before, it was accepted).
        pair(
            "instance-type-in-pool",
            PreflightStatus::Error,
            "PreflightInstanceTypeNotInPool",
            |_, _, i, _| i.instance_type = "ecs.c7.xlarge".into(),
        );
        let mut p = pool();
        p.spec.instance_types = vec!["ecs.g7.large".into(), "ecs.c7.xlarge".into()];
        let i = InstanceFacts {
            instance_type: "ecs.c7.xlarge".into(),
            ..good()
        };
        let r = result(
            &terway(),
            &p,
            &i,
            &Context::default(),
            "instance-type-in-pool",
        );
        assert_eq!(r.status, PreflightStatus::Pass, "{r:?}");
        let bad = result(
            &terway(),
            &pool(),
            &i,
            &Context::default(),
            "instance-type-in-pool",
        );
        assert!(
            bad.message.contains("ecs.c7.xlarge") && bad.fix.contains("spec.instanceTypes"),
            "{bad:?}"
        );
    }
    #[test]
    fn os_table_per_kubernetes_version() {
        let manual = Context {
            mode: Mode::Manual,
            ..Context::default()
        };
        let at = |k8s: &str, id: &str, v: &str| {
            let mut c = terway();
            c.spec.kubernetes_version = k8s.into();
            let i = InstanceFacts {
                os_id: id.into(),
                os_version: v.into(),
                os_name: String::new(),
                ..good()
            };
            result(&c, &pool(), &i, &manual, "os-allowed")
        };
        // Beyond the seed's one example: the table's bounds, both ways.
        let r = at("1.31.5", "ubuntu", "20.04");
        assert_eq!(
            (r.status, r.code.as_str()),
            (PreflightStatus::Error, "PreflightOsNotAllowed"),
            "{r:?}"
        );
        assert!(
            r.message.contains("up to 1.30") && r.message.contains("1.31.5"),
            "{r:?}"
        );
        assert_eq!(
            at("1.30.7", "ubuntu", "20.04").status,
            PreflightStatus::Pass
        );
        let r = at("1.22.3", "debian", "12");
        assert_eq!(r.status, PreflightStatus::Error, "{r:?}");
        assert!(r.message.contains("1.26 and newer"), "{r:?}");
        assert_eq!(at("1.33.1", "debian", "11").status, PreflightStatus::Error);
        assert_eq!(at("1.31.5", "rocky", "9.4").status, PreflightStatus::Pass);
        assert_eq!(at("1.31.5", "alinux", "3").status, PreflightStatus::Pass);
        assert_eq!(
            at("1.31.5", "aliyun", "2.1903").status,
            PreflightStatus::Error
        );
        // A release the table does not list: a warning, not a pass.
        let r = at("1.31.5", "debian", "13");
        assert_eq!(
            (r.status, r.code.as_str()),
            (PreflightStatus::Warning, "PreflightOsUnlisted"),
            "{r:?}"
        );
        let r = at("1.31.5", "gentoo", "2.15");
        assert_eq!(r.status, PreflightStatus::Warning, "{r:?}");
        // Every row's bounds are ordered and its name is in the docs.
        let doc = include_str!("../../../docs/add-existing.md");
        for row in OS_SUPPORT {
            if let (Some(a), Some(b)) = (row.oldest, row.newest) {
                assert!(a <= b, "{}", row.name);
            }
            assert!(
                doc.contains(row.name),
                "{} is not in docs/add-existing.md",
                row.name
            );
        }
    }
    #[test]
    fn api_whitelist() {
        pair(
            "api-whitelist",
            PreflightStatus::Error,
            "PreflightNotWhitelisted",
            |c, _, _, _| c.spec.api_server_whitelist = vec!["192.168.0.0/16".into()],
        );
    }
    #[test]
    fn security_group_type() {
        pair(
            "security-group-type",
            PreflightStatus::Error,
            "PreflightSecurityGroupType",
            |_, p, _, _| p.spec.security_group_type = "enterprise".into(),
        );
    }
    #[test]
    fn security_group_api_access() {
        pair(
            "security-group-api-access",
            PreflightStatus::Error,
            "PreflightSecurityGroupBlocksApiServer",
            |_, _, i, _| {
                i.security_groups[0].rules.push(RuleFacts {
                    direction: "egress".into(),
                    protocol: "tcp".into(),
                    port_range: Some("6000/7000".into()),
                    cidr: Some("10.213.0.0/24".into()),
                    policy: "drop".into(),
                });
            },
        );
        // Enterprise groups need an explicit accept.
        pair(
            "security-group-api-access",
            PreflightStatus::Error,
            "PreflightSecurityGroupBlocksApiServer",
            |_, p, i, _| {
                p.spec.security_group_type = "enterprise".into();
                i.security_groups[0].kind = "enterprise".into();
            },
        );
        let mut p = pool();
        p.spec.security_group_type = "enterprise".into();
        let mut i = good();
        i.security_groups[0].kind = "enterprise".into();
        i.security_groups[0].rules.push(RuleFacts {
            direction: "egress".into(),
            protocol: "tcp".into(),
            port_range: Some("6443/6443".into()),
            cidr: Some("10.213.0.1/32".into()),
            policy: "accept".into(),
        });
        assert_eq!(
            result(
                &terway(),
                &p,
                &i,
                &Context::default(),
                "security-group-api-access"
            )
            .status,
            PreflightStatus::Pass
        );
    }
    #[test]
    fn security_group_conflict() {
        pair(
            "security-group-conflict",
            PreflightStatus::Error,
            "PreflightSecurityGroupConflict",
            |_, _, i, _| {
                i.security_groups[0].rules.push(RuleFacts {
                    direction: "ingress".into(),
                    protocol: "all".into(),
                    port_range: None,
                    cidr: Some("10.213.0.0/16".into()),
                    policy: "drop".into(),
                });
            },
        );
    }
    #[test]
    fn security_group_quota() {
        pair(
            "security-group-quota",
            PreflightStatus::Error,
            "PreflightSecurityGroupQuota",
            |_, _, i, _| {
                let g = i.security_groups[0].clone();
                i.security_groups = vec![g; 6];
            },
        );
    }
    #[test]
    fn terway_max_pods_shared_and_exclusive() {
        // Shared: (3 − 1) × 5 = 10, not > 10.
        pair(
            "terway-max-pods",
            PreflightStatus::Error,
            "PreflightTerwayMaxPods",
            |_, _, i, _| i.max_ips_per_eni = 5,
        );
        // Exclusive: 6 − 1 = 5, not > 5; 7 − 1 = 6 passes.
        pair(
            "terway-max-pods",
            PreflightStatus::Error,
            "PreflightTerwayMaxPods",
            |c, _, i, _| {
                c.spec.network.terway_eni_mode = "exclusive".into();
                i.max_enis = 6;
            },
        );
        let mut c = terway();
        c.spec.network.terway_eni_mode = "exclusive".into();
        let i = InstanceFacts {
            max_enis: 7,
            ..good()
        };
        assert_eq!(
            result(&c, &pool(), &i, &Context::default(), "terway-max-pods").status,
            PreflightStatus::Pass
        );
    }
    #[test]
    fn terway_other_zone_warns() {
        pair(
            "terway-zone",
            PreflightStatus::Warning,
            "PreflightTerwayOtherZone",
            |_, p, _, _| p.spec.zone = Some("local-b".into()),
        );
    }
    #[test]
    fn terway_primary_nic_only() {
        pair(
            "terway-primary-nic-only",
            PreflightStatus::Error,
            "PreflightTerwaySecondaryEni",
            |_, _, i, _| i.eni_count = 2,
        );
    }
    #[test]
    fn terway_ram_role() {
        pair(
            "terway-ram-role",
            PreflightStatus::Error,
            "PreflightRamRole",
            |_, _, i, _| i.ram_role = None,
        );
    }
    #[test]
    fn ipv6_when_dual_stack() {
        let mut c = terway();
        c.spec.network.ipv6 = true;
        assert_eq!(
            result(&c, &pool(), &good(), &Context::default(), "ipv6").status,
            PreflightStatus::Pass
        );
        let i = InstanceFacts {
            ipv6: false,
            ..good()
        };
        let bad = result(&c, &pool(), &i, &Context::default(), "ipv6");
        assert_eq!(
            (bad.status, bad.code.as_str()),
            (PreflightStatus::Error, "PreflightNoIpv6")
        );
        assert!(!check(&c, &pool(), &i, &Context::default()).passed());
    }
    #[test]
    fn flannel_route_quota() {
        let flannel = Cluster::default();
        let ctx = Context {
            route_entries_used: 10,
            ..Context::default()
        };
        let ok = result(&flannel, &pool(), &good(), &ctx, "flannel-route-quota");
        assert_eq!(ok.status, PreflightStatus::Pass);
        // Terway checks do not apply on Flannel.
        assert_eq!(
            result(&flannel, &pool(), &good(), &ctx, "terway-ram-role").status,
            PreflightStatus::Skipped
        );
        let ctx = Context {
            route_entries_used: ROUTE_ENTRY_QUOTA,
            ..Context::default()
        };
        let bad = result(&flannel, &pool(), &good(), &ctx, "flannel-route-quota");
        assert_eq!(
            (bad.status, bad.code.as_str()),
            (PreflightStatus::Error, "PreflightRouteQuota")
        );
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
