//! What a new instance receives: its NodeConfig (from cluster + pool +
//! instance), and the seam to the cluster that supplies endpoint, CA, pin
//! and a bootstrap token per node.

// The seam to the cluster is the cluster's (`cluster/seam.rs`); its names
// stay reachable here, where the rooms above find them.
pub use crate::cluster::seam::{ClusterJoin, JoinMaterial};
use crate::store::InstanceRecord;
use knit_api::{
    BasePackages, Cluster, ClusterAccess, DataDiskConfig, FsType, JoinSettings, KubernetesPackage,
    NodeConfig, NodeIdentity, NodePool, UserDataGate, DEFAULT_DATA_DISK_MOUNT,
};

/// Label every node gets: the pool it came from.
pub const POOL_LABEL: &str = "knit.dev/pool";
/// The well-known labels a cloud controller manager sets on every Node.
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The labels knit itself puts on a node of `pool` (beside the pool's own
/// `spec.labels`, and winning over them): the pool, the instance's type,
/// the cluster's region and the zone (the pool's, else the provider's;
/// left out when neither is known). Set at registration and kept by the
/// label sync (`crate::reconcile::node_sync`).
pub fn knit_labels(
    cluster: &Cluster,
    pool: &NodePool,
    instance_type: &str,
    zone: Option<&str>,
) -> std::collections::BTreeMap<String, String> {
    let mut labels = std::collections::BTreeMap::new();
    labels.insert(POOL_LABEL.to_string(), pool.metadata.name.clone());
    let valid = |v: &str| !v.is_empty() && knit_api::validate::check_label_value(v).is_ok();
    if valid(instance_type) {
        labels.insert(INSTANCE_TYPE_LABEL.to_string(), instance_type.to_string());
    }
    if valid(&cluster.spec.region) {
        labels.insert(REGION_LABEL.to_string(), cluster.spec.region.clone());
    }
    if let Some(zone) = pool.spec.zone.as_deref().or(zone).filter(|z| valid(z)) {
        labels.insert(ZONE_LABEL.to_string(), zone.to_string());
    }
    labels
}

/// The Kubernetes version a node of `pool` runs: the pool's own
/// `spec.kubernetesVersion`, else (a pool stored before the field
/// existed, until it is filled) the cluster's.
pub fn node_kubernetes_version(cluster: &Cluster, pool: &NodePool) -> String {
    pool.spec
        .kubernetes_version
        .clone()
        .unwrap_or_else(|| cluster.spec.kubernetes_version.clone())
}

/// The node name the agent will compute (knit-agent's identity rule): the
/// pool's custom name from the IP, else `<region>.<instance-id>` lowercased.
pub fn expected_node_name(
    region: &str,
    instance: &InstanceRecord,
    pool: &NodePool,
) -> Option<String> {
    knit_api::agent::node_name_by_rule(
        pool.spec.custom_node_name.as_ref(),
        instance.ip.as_deref(),
        region,
        instance.provider_id.as_deref(),
    )
}

/// The package the node installs from the mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageRef {
    pub url: String,
    pub sha256: Option<String>,
}

/// Everything the NodeConfig is made from.
pub struct NodeConfigInput<'a> {
    pub cluster: &'a Cluster,
    pub pool: &'a NodePool,
    pub instance: &'a InstanceRecord,
    pub join: Option<JoinMaterial>,
    pub package: PackageRef,
    pub report_url: String,
    pub report_token: String,
    pub control_plane_ca_pem: String,
    /// The zone the provider puts an instance in when the pool names none.
    pub default_zone: Option<String>,
}

/// Builds one instance's NodeConfig. Pure: the result is validated by the
/// caller with the same validator the agent runs.
pub fn node_config(input: NodeConfigInput<'_>) -> NodeConfig {
    let spec = &input.pool.spec;
    let mut labels = spec.labels.clone();
    labels.extend(knit_labels(
        input.cluster,
        input.pool,
        &input.instance.instance_type,
        input.default_zone.as_deref(),
    ));
    // The gate taint is not added here: the agent registers it itself from
    // `userData.schedulingGate` (adding it twice makes the Node invalid).
    let taints = spec.taints.clone();
    // docs/spec.md §1.3.1: the runtime disk (knit_api::disk: the last NVMe data
    // disk, else the last one, as the agent picks it); its settings decide
    // the filesystem and the mount target.
    let data_disk = match knit_api::disk::runtime_data_disk(&spec.data_disks) {
        Some((_, disk)) => DataDiskConfig {
            enabled: disk.auto_format || disk.snapshot_id.is_some(),
            fs_type: if disk.fs_type == "xfs" {
                FsType::Xfs
            } else {
                FsType::Ext4
            },
            mount_target: disk
                .mount_target
                .clone()
                .unwrap_or_else(|| DEFAULT_DATA_DISK_MOUNT.to_string()),
            ..DataDiskConfig::default()
        },
        None => DataDiskConfig::default(),
    };
    let join = input.join;
    // The mirror's Debian repository sits beside the Kubernetes package
    // (`<base>/mirror/debian/`); the agent checks it holds an index before
    // using it, so a mirror built without one costs nothing.
    let debian_repository = input
        .package
        .url
        .find("/mirror/")
        .map(|at| format!("{}/mirror/debian/", &input.package.url[..at]));
    NodeConfig {
        cluster: ClusterAccess {
            endpoint: join.as_ref().map(|j| j.endpoint.clone()),
            ca_cert: join.as_ref().map(|j| j.ca_pem.clone()),
            ca_pin: join.as_ref().map(|j| j.ca_pin.clone()),
            bootstrap_token: join.as_ref().map(|j| j.bootstrap_token.clone()),
            report_url: Some(input.report_url),
            report_token: Some(input.report_token),
            control_plane_ca_cert: Some(input.control_plane_ca_pem),
        },
        node: NodeIdentity {
            region: Some(input.cluster.spec.region.clone()),
            instance_id: input.instance.provider_id.clone(),
            ip: input.instance.ip.clone(),
            name: None,
            custom_name: spec.custom_node_name.clone(),
            labels,
            taints,
        },
        kubernetes: KubernetesPackage {
            version: node_kubernetes_version(input.cluster, input.pool),
            url: Some(input.package.url),
            sha256: input.package.sha256,
            ..KubernetesPackage::default()
        },
        kubelet: spec.kubelet.clone(),
        containerd: spec.containerd.clone(),
        runtime: spec.runtime.clone(),
        os: spec.os.clone(),
        data_disk,
        components: spec.components.clone(),
        base_packages: BasePackages {
            repository: debian_repository,
            ..BasePackages::default()
        },
        hardening: spec.hardening.clone(),
        user_data: UserDataGate {
            scheduling_gate: spec.user_data_scheduling_gate,
        },
        // The agent's own join wait is bounded at one hour; the pool's
        // timeout (instance creation to Ready) is enforced by the server.
        join: JoinSettings {
            timeout_seconds: spec.join_timeout_seconds.clamp(1, 3600),
        },
        ..NodeConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::{NodePoolSpec, PoolDataDisk};

    #[test]
    fn node_config_from_pool_validates_and_carries_the_pool() {
        let mut spec = NodePoolSpec {
            user_data_scheduling_gate: true,
            join_timeout_seconds: 7200,
            kubernetes_version: Some("1.30.2".into()),
            ..Default::default()
        };
        spec.data_disks = vec![
            PoolDataDisk::default(),
            PoolDataDisk {
                fs_type: "xfs".into(),
                ..Default::default()
            },
        ];
        let pool = NodePool::new("workers", spec);
        let cluster = Cluster::default();
        let instance = InstanceRecord {
            name: "workers-abcde".into(),
            pool: "workers".into(),
            provider_id: Some("i-123".into()),
            state: knit_api::state::InstanceState::Running,
            ip: Some("10.213.0.7".into()),
            instance_type: "ecs.g7.large".into(),
            report_token_hash: None,
            last_error: None,
            last_error_kind: None,
            created_ms: 0,
            updated_ms: 0,
            added: false,
        };
        let config = node_config(NodeConfigInput {
            cluster: &cluster,
            pool: &pool,
            instance: &instance,
            join: None,
            package: PackageRef {
                url: "https://10.213.0.1:7443/mirror/pkg/kubernetes/".into(),
                sha256: Some("ab".repeat(32)),
            },
            report_url: "https://10.213.0.1:7443/report/v1/events".into(),
            report_token: "t".into(),
            control_plane_ca_pem: "pem".into(),
            default_zone: Some("local-a".into()),
        });
        config.validate().unwrap();
        assert_eq!(config.node.labels[POOL_LABEL], "workers");
        // The well-known labels, as a cloud controller manager sets them.
        assert_eq!(config.node.labels[INSTANCE_TYPE_LABEL], "ecs.g7.large");
        assert_eq!(config.node.labels[REGION_LABEL], "local");
        assert_eq!(config.node.labels[ZONE_LABEL], "local-a");
        // The pool's version, not the cluster's.
        assert_eq!(config.kubernetes.version, "1.30.2");
        assert!(config.user_data.scheduling_gate);
        assert!(
            config.node.taints.is_empty(),
            "the agent adds the gate taint itself"
        );
        assert_eq!(config.data_disk.fs_type, FsType::Xfs);
        assert!(config.data_disk.enabled);
        assert_eq!(config.join.timeout_seconds, 3600);
        assert_eq!(config.node.instance_id.as_deref(), Some("i-123"));
        assert_eq!(
            config.base_packages.repository.as_deref(),
            Some("https://10.213.0.1:7443/mirror/debian/")
        );
    }
}
