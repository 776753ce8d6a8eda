//! Who this node is: its name, IP, instance id and provider id (docs/spec.md §1.3.1).

use crate::error::{AgentError, Result};
use crate::host::Host;
use knit_api::{CustomNodeName, ErrorCode, NodeConfig};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// The Kubernetes node name (`--hostname-override`).
    pub name: String,
    pub ip: String,
    pub region: String,
    pub instance_id: String,
    /// `<region>.<instance-id>`: the node ID and provider ID.
    pub node_id: String,
    /// Set when the pool's custom-name rule also renames the machine.
    pub hostname: Option<String>,
}

impl NodeFacts {
    pub fn compute(host: &Host, config: &NodeConfig) -> Result<NodeFacts> {
        let node = &config.node;
        let region = node.region.clone().unwrap_or_else(|| "local".to_string());
        let instance_id = match &node.instance_id {
            Some(id) => id.clone(),
            None => machine_hostname(host),
        };
        let ip = match &node.ip {
            Some(ip) => ip.clone(),
            None => detect_ip().unwrap_or_else(|| "127.0.0.1".to_string()),
        };
        let node_id = knit_api::agent::node_id(&region, &instance_id);
        // The pool's rule, the same the control plane expects.
        let by_rule = knit_api::agent::node_name_by_rule(
            node.custom_name.as_ref(),
            Some(&ip),
            &region,
            Some(&instance_id),
        )
        .unwrap_or_else(|| node_id.clone());
        let (name, hostname) = if let Some(name) = &node.name {
            (name.clone(), None)
        } else if node.custom_name.is_some() {
            CustomNodeName::check_rendered(&by_rule).map_err(|rule| {
                AgentError::new(
                    ErrorCode::FailSetNodeIdentity,
                    format!("custom node name {by_rule:?} (prefix + IP {ip} + suffix) {rule}"),
                )
            })?;
            (by_rule.clone(), Some(by_rule))
        } else {
            (by_rule, None)
        };
        if !knit_api::validate::is_dns_subdomain(&name) {
            return Err(AgentError::new(
                ErrorCode::FailSetNodeIdentity,
                format!("node name {name:?} is not a valid Kubernetes node name (lowercase DNS subdomain)"),
            ));
        }
        Ok(NodeFacts {
            name,
            ip,
            region,
            instance_id,
            node_id,
            hostname,
        })
    }
}

fn machine_hostname(host: &Host) -> String {
    host.read("/etc/hostname")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .map(|h| h.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "localhost".to_string())
}

/// The IPv4 address of the interface holding the default route.
fn detect_ip() -> Option<String> {
    let routes = std::fs::read_to_string("/proc/net/route").ok()?;
    let iface = routes.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&"00000000")).then(|| fields[0].to_string())
    })?;
    let addrs = nix::ifaddrs::getifaddrs().ok()?;
    for addr in addrs {
        if addr.interface_name != iface {
            continue;
        }
        if let Some(sin) = addr.address.as_ref().and_then(|a| a.as_sockaddr_in()) {
            return Some(sin.ip().to_string());
        }
    }
    None
}
