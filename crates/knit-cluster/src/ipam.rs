//! Node IPAM as kube-controller-manager's range allocator does it: every
//! Node gets `spec.podCIDR` (and `spec.podCIDRs`), the lowest free subnet
//! of the cluster's pod CIDR with the per-node mask size.

use std::net::Ipv4Addr;

use serde_json::{json, Value};

use crate::error::ClusterError;
use crate::store::Store;
use crate::util;

/// The cluster's pod CIDR cut into per-node subnets (IPv4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodCidrs {
    base: u32,
    prefix: u8,
    node_prefix: u8,
}

pub fn parse_cidr(s: &str) -> Option<(u32, u8)> {
    let (ip, len) = s.trim().split_once('/')?;
    let ip: Ipv4Addr = ip.parse().ok()?;
    let len: u8 = len.parse().ok().filter(|l| *l <= 32)?;
    Some((u32::from(ip), len))
}

fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - len as u32)
    }
}

/// The range and each node's size, as `172.20.0.0/16 (/24 each)`.
impl std::fmt::Display for PodCidrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} (/{} each)",
            Ipv4Addr::from(self.base),
            self.prefix,
            self.node_prefix
        )
    }
}

impl PodCidrs {
    /// `cidr` such as `172.20.0.0/16`, each node a `/node_mask`.
    pub fn new(cidr: &str, node_mask: u8) -> Result<PodCidrs, ClusterError> {
        let (ip, prefix) = parse_cidr(cidr).ok_or_else(|| {
            ClusterError::Config(format!(
                "pod CIDR {cidr:?} is not an IPv4 CIDR (such as 172.20.0.0/16)"
            ))
        })?;
        if node_mask < prefix || node_mask > 30 {
            return Err(ClusterError::Config(format!(
                "node CIDR mask size /{node_mask} must be between the pod CIDR's /{prefix} and /30"
            )));
        }
        Ok(PodCidrs {
            base: ip & mask(prefix),
            prefix,
            node_prefix: node_mask,
        })
    }

    fn count(&self) -> u64 {
        1u64 << (self.node_prefix - self.prefix)
    }

    fn subnet(&self, i: u64) -> String {
        let ip = self.base + ((i as u32) << (32 - self.node_prefix as u32));
        format!("{}/{}", Ipv4Addr::from(ip), self.node_prefix)
    }

    /// The lowest subnet no node holds, if any is left.
    pub fn next_free<'a>(&self, nodes: impl IntoIterator<Item = &'a Value>) -> Option<String> {
        let taken: std::collections::HashSet<&str> = nodes
            .into_iter()
            .filter_map(|n| n["spec"]["podCIDR"].as_str())
            .collect();
        (0..self.count())
            .map(|i| self.subnet(i))
            .find(|c| !taken.contains(c.as_str()))
    }
}

pub fn has_pod_cidr(node: &Value) -> bool {
    node["spec"]["podCIDR"]
        .as_str()
        .is_some_and(|c| !c.is_empty())
}

/// What [`allocate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocated {
    /// The node got a pod CIDR (or had one, or is gone).
    Done,
    /// Every pod CIDR of the range is taken (kube-controller-manager's
    /// `CIDRNotAvailable`): the node has none.
    RangeFull,
}

/// Give `node` a pod CIDR unless it has one (another server may have just
/// given it one: the choice is made in the write transaction).
pub fn allocate(store: &Store, cidrs: &PodCidrs, node: &str) -> Result<Allocated, ClusterError> {
    let mut full = false;
    let result = store.update_seeing("nodes", "", node, "nodes", |cur, all| {
        full = false;
        if has_pod_cidr(cur) {
            return Ok(cur.clone());
        }
        let Some(cidr) = cidrs.next_free(all.iter().map(|n| &**n)) else {
            full = true;
            return Ok(cur.clone());
        };
        let mut next = cur.clone();
        let spec = util::field_mut(&mut next, "spec");
        spec.insert("podCIDR".into(), json!(cidr));
        spec.insert("podCIDRs".into(), json!([cidr]));
        Ok(next)
    });
    match result {
        Ok(_) if full => Ok(Allocated::RangeFull),
        Ok(n) => {
            if let Some(c) = n["spec"]["podCIDR"].as_str() {
                tracing::debug!(node, pod_cidr = c, "pod CIDR allocated");
            }
            Ok(Allocated::Done)
        }
        Err(e) if e.code == 404 => Ok(Allocated::Done),
        Err(e) => Err(ClusterError::Api(e)),
    }
}

/// Keep a node's pod CIDR once it has one (kube-apiserver refuses to
/// change it; here an update that drops it keeps it).
pub fn keep_pod_cidr(current: &Value, next: &mut Value) {
    if !has_pod_cidr(current) {
        return;
    }
    let spec = util::field_mut(next, "spec");
    for k in ["podCIDR", "podCIDRs"] {
        if let Some(v) = current["spec"].get(k) {
            spec.insert(k.into(), v.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full range says so (no CIDR written), and a CIDR freed by a
    /// deleted Node is given to the next.
    #[test]
    fn a_full_range_is_reported_and_a_freed_cidr_reused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let cidrs = PodCidrs::new("10.9.0.0/23", 24).unwrap();
        assert_eq!(cidrs.to_string(), "10.9.0.0/23 (/24 each)");
        for n in ["a", "b", "c"] {
            store
                .create(
                    "nodes",
                    "",
                    json!({"kind": "Node", "metadata": {"name": n}}),
                )
                .unwrap();
        }
        assert_eq!(allocate(&store, &cidrs, "a").unwrap(), Allocated::Done);
        assert_eq!(allocate(&store, &cidrs, "b").unwrap(), Allocated::Done);
        let rv = store.current_rv();
        assert_eq!(allocate(&store, &cidrs, "c").unwrap(), Allocated::RangeFull);
        assert_eq!(store.current_rv(), rv, "nothing written for a full range");
        let c = store.get("nodes", "", "c").unwrap().unwrap();
        assert!(!has_pod_cidr(&c));
        store.delete("nodes", "", "a").unwrap();
        assert_eq!(allocate(&store, &cidrs, "c").unwrap(), Allocated::Done);
        let c = store.get("nodes", "", "c").unwrap().unwrap();
        assert_eq!(c["spec"]["podCIDR"], json!("10.9.0.0/24"));
        assert_eq!(allocate(&store, &cidrs, "gone").unwrap(), Allocated::Done);
    }

    #[test]
    fn node_subnets_are_handed_out_lowest_first() {
        let c = PodCidrs::new("172.20.0.0/16", 24).unwrap();
        assert_eq!(c.next_free(&[]).as_deref(), Some("172.20.0.0/24"));
        let nodes = vec![
            json!({"spec": {"podCIDR": "172.20.0.0/24"}}),
            json!({"spec": {"podCIDR": "172.20.2.0/24"}}),
        ];
        assert_eq!(c.next_free(&nodes).as_deref(), Some("172.20.1.0/24"));
        let small = PodCidrs::new("10.0.0.0/23", 24).unwrap();
        let full = vec![
            json!({"spec": {"podCIDR": "10.0.0.0/24"}}),
            json!({"spec": {"podCIDR": "10.0.1.0/24"}}),
        ];
        assert_eq!(small.next_free(&full), None);
        assert!(PodCidrs::new("172.20.0.0/16", 8).is_err());
        assert!(PodCidrs::new("fd00::/48", 64).is_err());
        // Host bits in the CIDR are ignored, as net.ParseCIDR's network.
        assert_eq!(
            PodCidrs::new("172.20.9.9/16", 24)
                .unwrap()
                .next_free(&[])
                .as_deref(),
            Some("172.20.0.0/24")
        );
    }
}
