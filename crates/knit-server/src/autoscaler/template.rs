//! The template node of a pool: what a new node of it will look like, for
//! cluster-autoscaler's scale-up simulation (`NodeGroupTemplateNodeInfo`).
//! Pure: cluster and pool in, a v1.Node out.
//!
//! Labels are the pool's own and the ones knit puts on every node
//! (`crate::bootstrap::knit_labels`: pool, instance type, region, zone)
//! plus the kubelet's (`kubernetes.io/os`, `kubernetes.io/arch`,
//! `kubernetes.io/hostname`); taints are the pool's; capacity is the first
//! instance type's (the catalog, `knit_api::instance_types`): CPU, memory,
//! pods = `kubelet.maxPods`, ephemeral storage = the system disk, GPUs;
//! allocatable is capacity less `kubeReserved`, `systemReserved` and the
//! hard eviction thresholds, as the kubelet computes it.

use super::proto::k8s::io::api::core::v1 as core;
use super::proto::k8s::io::apimachinery::pkg::api::resource::Quantity;
use super::proto::k8s::io::apimachinery::pkg::apis::meta::v1 as meta;
use knit_api::instance_types::{self, InstanceType};
use knit_api::{Cluster, NodePool};
use std::collections::BTreeMap;

/// The label a node with a GPU carries, its value the GPU model (ACK's).
pub const GPU_LABEL: &str = "aliyun.accelerator/nvidia_name";
/// The extended resource a GPU is counted in.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Every instance type of the catalog runs x86-64.
pub const ARCH: &str = "amd64";

/// Why a pool has no template node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateError {
    /// The pool's first instance type is not in the catalog.
    UnknownInstanceType(String),
}

impl std::fmt::Display for TemplateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateError::UnknownInstanceType(t) => write!(
                f,
                "spec.instanceTypes[0] {t:?} is not in knit's instance type catalog: its size is not known"
            ),
        }
    }
}

/// A label value made of a GPU model ("NVIDIA A10" → "NVIDIA-A10").
pub fn gpu_label_value(model: &str) -> String {
    model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

fn quantity(s: String) -> Quantity {
    Quantity { string: Some(s) }
}

/// Bytes in the largest binary unit that divides them (`8Gi`, `7892Mi`).
pub fn bytes_quantity(bytes: u64) -> String {
    for (unit, size) in [("Gi", 1u64 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
        if bytes > 0 && bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

/// Millicores in the form the kubelet writes (`2`, `1900m`).
pub fn cpu_quantity(millis: u64) -> String {
    if millis.is_multiple_of(1000) {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

/// A CPU quantity as millicores (`100m`, `1`, `0.5`).
pub fn parse_cpu_millis(s: &str) -> Option<u64> {
    if let Some(m) = s.strip_suffix('m') {
        return m.parse().ok();
    }
    let v: f64 = s.parse().ok()?;
    (v >= 0.0).then(|| (v * 1000.0).round() as u64)
}

/// What `reserved` (kubeReserved and systemReserved, added) and the hard
/// eviction threshold `signal` take from `capacity` bytes of `resource`.
fn withheld(
    capacity: u64,
    resource: &str,
    reserved: &[&BTreeMap<String, String>],
    eviction: &BTreeMap<String, String>,
    signal: &str,
) -> u64 {
    let mut total: u64 = reserved
        .iter()
        .filter_map(|r| r.get(resource))
        .filter_map(|v| knit_api::validate::parse_quantity_bytes(v))
        .sum();
    if let Some(v) = eviction.get(signal) {
        total += match v.strip_suffix('%') {
            Some(p) => p
                .parse::<f64>()
                .map(|p| (capacity as f64 * p / 100.0).ceil() as u64)
                .unwrap_or(0),
            None => knit_api::validate::parse_quantity_bytes(v).unwrap_or(0),
        };
    }
    total
}

/// Capacity and allocatable of a node of `spec` on `itype`.
pub fn resources(
    pool: &NodePool,
    itype: &InstanceType,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let kubelet = &pool.spec.kubelet;
    let reserved = [&kubelet.kube_reserved, &kubelet.system_reserved];
    let cpu = u64::from(itype.vcpus) * 1000;
    let memory = itype.memory_bytes();
    let disk = (pool.spec.system_disk.size_gib.max(0) as u64) << 30;
    let pods = kubelet.max_pods.max(0).to_string();
    let mut capacity = BTreeMap::new();
    capacity.insert("cpu".to_string(), cpu_quantity(cpu));
    capacity.insert("memory".to_string(), bytes_quantity(memory));
    capacity.insert("ephemeral-storage".to_string(), bytes_quantity(disk));
    capacity.insert("pods".to_string(), pods.clone());
    if itype.gpus > 0 {
        capacity.insert(GPU_RESOURCE.to_string(), itype.gpus.to_string());
    }
    let cpu_reserved: u64 = reserved
        .iter()
        .filter_map(|r| r.get("cpu"))
        .filter_map(|v| parse_cpu_millis(v))
        .sum();
    let mut allocatable = capacity.clone();
    allocatable.insert(
        "cpu".to_string(),
        cpu_quantity(cpu.saturating_sub(cpu_reserved)),
    );
    allocatable.insert(
        "memory".to_string(),
        bytes_quantity(memory.saturating_sub(withheld(
            memory,
            "memory",
            &reserved,
            &kubelet.eviction_hard,
            "memory.available",
        ))),
    );
    allocatable.insert(
        "ephemeral-storage".to_string(),
        bytes_quantity(disk.saturating_sub(withheld(
            disk,
            "ephemeral-storage",
            &reserved,
            &kubelet.eviction_hard,
            "nodefs.available",
        ))),
    );
    (capacity, allocatable)
}

/// The template node of `pool` in `cluster`: its first instance type's.
pub fn node(cluster: &Cluster, pool: &NodePool) -> Result<core::Node, TemplateError> {
    let first = pool
        .spec
        .instance_types
        .first()
        .cloned()
        .unwrap_or_default();
    let itype = instance_types::lookup(&first)
        .ok_or_else(|| TemplateError::UnknownInstanceType(first.clone()))?;
    let name = format!("template-node-for-{}", pool.metadata.name);
    let mut labels = pool.spec.labels.clone();
    labels.extend(crate::bootstrap::knit_labels(
        cluster, pool, itype.name, None,
    ));
    labels.insert("kubernetes.io/os".to_string(), "linux".to_string());
    labels.insert("kubernetes.io/arch".to_string(), ARCH.to_string());
    labels.insert("kubernetes.io/hostname".to_string(), name.clone());
    if let Some(model) = itype.gpu_type {
        labels.insert(GPU_LABEL.to_string(), gpu_label_value(model));
    }
    let (capacity, allocatable) = resources(pool, itype);
    let as_quantities = |m: BTreeMap<String, String>| {
        m.into_iter()
            .map(|(k, v)| (k, quantity(v)))
            .collect::<BTreeMap<_, _>>()
    };
    Ok(core::Node {
        metadata: Some(meta::ObjectMeta {
            name: Some(name),
            labels,
            ..Default::default()
        }),
        spec: Some(core::NodeSpec {
            taints: pool
                .spec
                .taints
                .iter()
                .map(|t| core::Taint {
                    key: Some(t.key.clone()),
                    value: Some(t.value.clone()),
                    effect: Some(t.effect.clone()),
                    time_added: None,
                })
                .collect(),
            ..Default::default()
        }),
        status: Some(core::NodeStatus {
            capacity: as_quantities(capacity),
            allocatable: as_quantities(allocatable),
            conditions: vec![core::NodeCondition {
                r#type: Some("Ready".to_string()),
                status: Some("True".to_string()),
                reason: Some("KubeletReady".to_string()),
                message: Some("template node: a new node of the pool".to_string()),
                ..Default::default()
            }],
            node_info: Some(core::NodeSystemInfo {
                kubelet_version: Some(format!(
                    "v{}",
                    crate::bootstrap::node_kubernetes_version(cluster, pool)
                        .trim_start_matches('v')
                )),
                operating_system: Some("linux".to_string()),
                architecture: Some(ARCH.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::NodePoolSpec;
    use prost::Message;

    fn pool(types: &[&str]) -> NodePool {
        let mut spec = NodePoolSpec {
            instance_types: types.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        };
        spec.labels.insert("tier".into(), "web".into());
        spec.taints.push(knit_api::Taint {
            key: "dedicated".into(),
            value: "web".into(),
            effect: "NoSchedule".into(),
        });
        spec.zone = Some("cn-hangzhou-k".into());
        NodePool::new("web", spec)
    }

    #[test]
    fn quantities_in_the_kubelet_form() {
        assert_eq!(bytes_quantity(8 << 30), "8Gi");
        assert_eq!(bytes_quantity((8 << 30) - (300 << 20)), "7892Mi");
        assert_eq!(bytes_quantity(1536), "1536");
        assert_eq!(cpu_quantity(2000), "2");
        assert_eq!(cpu_quantity(1900), "1900m");
        assert_eq!(parse_cpu_millis("100m"), Some(100));
        assert_eq!(parse_cpu_millis("0.5"), Some(500));
        assert_eq!(parse_cpu_millis("x"), None);
    }

    #[test]
    fn allocatable_is_capacity_less_reservations_and_eviction() {
        let mut p = pool(&["ecs.g7.large"]);
        p.spec
            .kubelet
            .kube_reserved
            .insert("cpu".into(), "100m".into());
        p.spec
            .kubelet
            .system_reserved
            .insert("cpu".into(), "100m".into());
        p.spec
            .kubelet
            .kube_reserved
            .insert("memory".into(), "512Mi".into());
        p.spec.kubelet.max_pods = 64;
        let itype = instance_types::lookup("ecs.g7.large").unwrap();
        let (cap, alloc) = resources(&p, itype);
        assert_eq!(cap["cpu"], "2");
        assert_eq!(cap["memory"], "8Gi");
        assert_eq!(cap["pods"], "64");
        assert_eq!(cap["ephemeral-storage"], "40Gi");
        assert_eq!(alloc["cpu"], "1800m");
        // 8 GiB less 512 MiB reserved and the default 300Mi hard eviction.
        assert_eq!(alloc["memory"], "7380Mi");
        // 40 GiB less 10 % (nodefs.available).
        assert_eq!(
            alloc["ephemeral-storage"],
            bytes_quantity((40u64 << 30) - (4u64 << 30))
        );
        assert!(!cap.contains_key(GPU_RESOURCE));
    }

    #[test]
    fn the_template_node_round_trips_as_a_v1_node() {
        let cluster = Cluster::default();
        let node = node(&cluster, &pool(&["ecs.gn7i-c8g1.2xlarge", "ecs.g7.large"])).unwrap();
        let bytes = node.encode_to_vec();
        let back = core::Node::decode(bytes.as_slice()).unwrap();
        assert_eq!(back, node);
        let labels = &back.metadata.as_ref().unwrap().labels;
        assert_eq!(
            labels["node.kubernetes.io/instance-type"],
            "ecs.gn7i-c8g1.2xlarge"
        );
        assert_eq!(labels["topology.kubernetes.io/zone"], "cn-hangzhou-k");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(labels["kubernetes.io/arch"], "amd64");
        assert_eq!(labels["tier"], "web");
        assert_eq!(labels[GPU_LABEL], "NVIDIA-A10");
        let status = back.status.unwrap();
        assert_eq!(status.capacity["cpu"].string.as_deref(), Some("8"));
        assert_eq!(status.capacity["memory"].string.as_deref(), Some("30Gi"));
        assert_eq!(status.capacity[GPU_RESOURCE].string.as_deref(), Some("1"));
        let taints = back.spec.unwrap().taints;
        assert_eq!(taints.len(), 1);
        assert_eq!(taints[0].key.as_deref(), Some("dedicated"));
    }

    #[test]
    fn an_unknown_first_type_has_no_template() {
        let e = node(&Cluster::default(), &pool(&["ecs.nope.large"])).unwrap_err();
        assert!(e.to_string().contains("spec.instanceTypes[0]"), "{e}");
    }
}
